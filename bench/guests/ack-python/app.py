"""The benchmark's Python handler: the Rust fixture's `ack` path (decode the JSON payload,
look at its mode, ack), so `sluice-bench languages` compares what each language costs."""

from sluice_guest import RedisStream, ack, dead_letter, subscriber


@subscriber(RedisStream("bench").group("g"))
def handle(control: dict):
    if control.get("mode") == "ack":
        return ack()
    return dead_letter(f"unexpected mode {control.get('mode')!r}")
