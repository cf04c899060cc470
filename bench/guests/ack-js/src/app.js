// The benchmark's JavaScript handler: the Rust fixture's `ack` path (decode the JSON payload,
// look at its mode, ack), so `sluice-bench languages` compares what each language costs.

import { subscriber, RedisStream, ack, deadLetter } from "./sluice_guest.js";

export const { handle, subscription } = subscriber(
  new RedisStream("bench").group("g"),
  (control) => (control.mode === "ack" ? ack() : deadLetter(`unexpected mode ${control.mode}`)),
);
