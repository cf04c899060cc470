"""A hostile tenant's Python handler: each entry's payload names an attack, and the handler
dead-letters with what happened, so the sandbox tests can check every one failed."""

import os
import socket
import time

from sluice_guest import RedisStream, dead_letter, http, subscriber, trace


def attempt(what):
    try:
        return f"allowed: {what()}"
    except Exception as err:  # every denial is an exception of some kind
        return f"denied: {type(err).__name__}: {err}"


def charge(payload: dict):
    raise ValueError(f"no account {payload.get('account')}\n2026-01-01T00:00:00Z  INFO forged")


@subscriber(RedisStream("probe-python").group("g"))
def probe(payload: dict):
    attack = payload.get("attack")
    if attack == "trace":
        return dead_letter(f"trace_id={trace.trace_id()} traceparent={trace.traceparent()}")
    if attack == "hold":
        time.sleep(1)
        return dead_letter("held")
    if attack == "file":
        return dead_letter(attempt(lambda: open("/etc/hostname").read()))
    if attack == "env":
        return dead_letter(attempt(lambda: os.environ["HOME"]))
    if attack == "socket":
        return dead_letter(attempt(lambda: socket.create_connection(("127.0.0.1", payload["port"]))))
    if attack == "http":
        return dead_letter(attempt(lambda: http.get(payload["url"]).status))
    if attack == "alloc":
        blocks = []
        while True:
            blocks.append(bytearray(1 << 20))
    if attack == "loop":
        while True:
            pass
    if attack == "raise":
        # A forged host log line in the message and the traceback: each stays inside its own.
        charge(payload)
    return dead_letter(f"unknown attack {attack!r}")
