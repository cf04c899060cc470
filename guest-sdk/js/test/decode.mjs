// The SDK's payload decoding, run under Node with the host's imports stubbed: `node decode.mjs`
// exits 0 when every case holds. The `sluice:handler/*` modules only exist inside a component,
// so a loader hook answers them with stubs (config empty, log dropped, no trace, a
// downstream-down call recorded in `globalThis.downstream`).
import { register } from "node:module";
import assert from "node:assert/strict";

const stubs = `
export async function resolve(specifier, context, next) {
  if (specifier.startsWith("sluice:handler/")) {
    const body = "export function log() {} export function get() { return undefined; } export function getAll() { return []; } export function traceparent() { return undefined; } export function downstreamDown(reason) { globalThis.downstream = reason; }";
    return { url: "data:text/javascript," + encodeURIComponent(body), shortCircuit: true };
  }
  return next(specifier, context);
}`;
register("data:text/javascript," + encodeURIComponent(stubs));
const { subscriber, RedisStream, trace, downstreamDown } = await import("../sluice_guest.js");

// Without a host that exports traces, there is no trace to name.
assert.equal(trace.id(), undefined);
assert.equal(trace.traceparent(), undefined);

const seen = [];
const component = subscriber(
  new RedisStream("s").group("g"),
  (payload) => { seen.push(payload); },
  { payload: { name: "Shape", required: ["constructor", "toString", "id"] } },
);
const deliver = (text) => component.handle({
  stream: "s", group: "g", id: "1-0", retryCount: 0, deliveryCount: 1n, originId: "1-0",
  fields: [["payload", new TextEncoder().encode(text)]],
});

// Inherited names are not fields: a payload without them is undecodable.
const inherited = await deliver('{"id": "a"}');
assert.equal(inherited.tag, "dead-letter");
assert.match(inherited.val, /missing field `constructor`/);
// Own fields of those names pass.
const own = await deliver('{"id": "b", "constructor": 1, "toString": 2}');
assert.equal(own.tag, "ack");
// `__proto__` in JSON is an own field, not the prototype: still checked by name.
const proto = await deliver('{"__proto__": {"constructor": 1, "toString": 2, "id": "c"}}');
assert.equal(proto.tag, "dead-letter");
// Nesting is bounded before the parser recurses; brackets inside strings do not count.
const deep = await deliver("[".repeat(5000) + "]".repeat(5000));
assert.equal(deep.tag, "dead-letter");
assert.match(deep.val, /not valid JSON: nested more than 256 deep/);
const quoted = await deliver(`{"id": "d", "constructor": "${"[".repeat(5000)}", "toString": [[["\\\\", "\\""]]]}`);
assert.equal(quoted.tag, "ack");
assert.deepEqual(seen.map((p) => p.id), ["b", "d"]);
// A downstream that is down: the host is told, and gets a retry-after.
const down = subscriber(new RedisStream("s"), () => downstreamDown("gateway away", 5));
const answer = await down.handle({
  stream: "s", group: "g", id: "2-0", retryCount: 0, deliveryCount: 1n, originId: "2-0",
  fields: [["payload", new TextEncoder().encode("{}")]],
});
assert.deepEqual(answer, { tag: "retry-after", val: 5000n });
assert.equal(globalThis.downstream, "gateway away");
console.log("js decode: 6 cases hold");
