// Write Sluice handlers in JavaScript: functions that handle Redis Streams entries, compiled to
// WebAssembly components with componentize-js (StarlingMonkey) and run by the `sluice` host.
//
//   import { subscriber, RedisStream, DelayedRetry, ack, retryAfter } from "./sluice_guest.js";
//
//   export const { handle, subscription } = subscriber(
//     new RedisStream("bank-payments").group("billing")
//       .delayedRetry(DelayedRetry.durableZset("bank-payments.delayed")),
//     async (payment, delivery) => { ...; return ack(); },
//   );
//
// The handler gets the entry's payload decoded from JSON (the `payload` field unless the host
// configures another) and the delivery; it answers ack(), retryAfter(seconds) or
// deadLetter(reason) (returning nothing acks). A payload that does not decode is dead-lettered
// with a reason naming the field; a thrown error fails the attempt (the host logs it and retries
// with backoff). It reaches the host only through `config`, `log` and `fetch`, and `fetch`
// reaches only the hosts the subscription's `allowed_outbound_hosts` grants. `sluice build`
// puts this file next to the project's sources.

import { log as hostLog } from "sluice:handler/log@0.2.0";
import { get as configGet, getAll as configGetAll } from "sluice:handler/config@0.2.0";
import { traceparent as hostTraceparent } from "sluice:handler/trace@0.2.0";
import { downstreamDown as hostDownstreamDown } from "sluice:handler/flow@0.2.0";

function ms(seconds) {
  if (!(seconds >= 0)) throw new RangeError(`a duration must be a number of seconds >= 0: ${seconds}`);
  return BigInt(Math.ceil(seconds * 1000));
}

/** Done: the host acknowledges the entry. */
export function ack() {
  return { tag: "ack" };
}

/** Try again after `seconds` (waiting in the delayed-retry set when the subscription has one). */
export function retryAfter(seconds) {
  return { tag: "retry-after", val: ms(seconds) };
}

/**
 * Try again after `seconds` because a downstream is down (a gateway that refuses or times out):
 * the attempt counts toward the subscription's circuit breaker, which stops taking entries
 * while the downstream is away instead of burning their attempts.
 */
export function downstreamDown(reason, seconds) {
  return { tag: "downstream-down", val: ms(seconds), reason: String(reason) };
}

/** Give up: the entry goes to the dead-letter stream with `reason`. */
export function deadLetter(reason) {
  return { tag: "dead-letter", val: String(reason) };
}

/** Where a retry waits. */
export const DelayedRetry = {
  /** Park retries in the Redis sorted set `key`; `ttl` (seconds) expires an idle set. */
  durableZset(key, { ttl } = {}) {
    return { tag: "durable-zset", val: { key, ttlMs: ttl === undefined ? undefined : ms(ttl) } };
  },
};

/** The subscription a handler asks for; the host's configuration may override any of it. */
export class RedisStream {
  constructor(stream) {
    this.wit = { stream: String(stream) };
  }
  #set(name, value) {
    this.wit[name] = value;
    return this;
  }
  /** The consumer group (default: the stream's name). */
  group(group) { return this.#set("group", group); }
  /** The consumer name within the group. */
  consumer(consumer) { return this.#set("consumer", consumer); }
  /** Also take entries other consumers left pending this long (seconds). */
  claimMinIdle(seconds) { return this.#set("claimMinIdleMs", ms(seconds)); }
  /** How long one read waits for new entries (seconds). */
  block(seconds) { return this.#set("blockMs", ms(seconds)); }
  /** Entries per read. */
  count(n) { return this.#set("count", n); }
  /** The dead-letter stream (default `<stream>.<group>.dead-letter`). */
  deadLetter(stream) { return this.#set("deadLetter", stream); }
  /** Dead-letter after this many retries. */
  maxRetries(n) { return this.#set("maxRetries", n); }
  /** Where retryAfter waits. */
  delayedRetry(retry) { return this.#set("delayedRetry", retry); }
  /** The entry field that carries the JSON payload (default `payload`). */
  payloadField(field) { return this.#set("payloadField", field); }
  /** The longest retryAfter the handler asks for (seconds). */
  maxDelay(seconds) { return this.#set("maxDelayMs", ms(seconds)); }
  /** Backoff after a failed attempt: { initial, max } in seconds. */
  failureBackoff({ initial, max }) {
    return this.#set("failureBackoff", { initialMs: ms(initial), maxMs: ms(max) });
  }
  /** Read this many partitions of the stream. */
  partitions(n) { return this.#set("partitions", n); }
}

/** The subscription's configuration values (read-only strings). */
export const config = {
  get(key, fallback = undefined) {
    const value = configGet(key);
    return value === undefined ? fallback : value;
  },
  all() {
    return Object.fromEntries(configGetAll());
  },
};

function emit(level, message, fields) {
  hostLog(level, String(message), Object.entries(fields ?? {}).map(([k, v]) => [k, String(v)]));
}

/** Logging into the host's log, inside the delivery's span; `fields` is an object. */
/**
 * The trace the current attempt runs in (both undefined while the host exports no traces):
 * `trace.id()` for the handler's own logs, `trace.traceparent()` to pass on by other means
 * than `fetch` (whose requests the host puts in the trace by itself).
 */
export const trace = {
  /** The attempt span's W3C `traceparent`: `00-<trace id>-<span id>-<flags>`. */
  traceparent() {
    return hostTraceparent() ?? undefined;
  },
  /** The trace id (32 lowercase hex digits): the same for every attempt of the entry. */
  id() {
    return this.traceparent()?.split("-")[1];
  },
};

export const log = {
  debug: (message, fields) => emit("debug", message, fields),
  info: (message, fields) => emit("info", message, fields),
  warn: (message, fields) => emit("warn", message, fields),
  error: (message, fields) => emit("error", message, fields),
};

/** One delivered entry. `originId` is the producer's entry id, the same through every retry and
 * requeue: use it as the idempotency key. */
export class Delivery {
  constructor(d) {
    this.stream = d.stream;
    this.group = d.group;
    this.id = d.id;
    this.fields = d.fields;
    this.retryCount = d.retryCount;
    this.deliveryCount = Number(d.deliveryCount);
    this.originId = d.originId;
  }
  /** The raw bytes of field `name`, if present. */
  field(name) {
    const found = this.fields.find(([n]) => n === name);
    return found ? found[1] : undefined;
  }
  /** Attempts that failed before this one, whatever the retry mechanism. */
  get previousAttempts() {
    return this.retryCount + Math.max(this.deliveryCount - 1, 0);
  }
}

class DecodeError extends Error {}

/** The deepest nesting of arrays and objects a payload may have: the engine's parser recurses,
 * and a payload nested thousands deep exhausts the component's stack (a trap, retried for
 * ever) before JSON.parse could throw. */
const MAX_JSON_DEPTH = 256;

function nestedTooDeeply(text) {
  let depth = 0;
  let inString = false;
  let escaped = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (escaped) escaped = false;
      else if (c === 92) escaped = true; // backslash
      else if (c === 34) inString = false; // quote
    } else if (c === 34) {
      inString = true;
    } else if (c === 91 || c === 123) {
      if (++depth > MAX_JSON_DEPTH) return true;
    } else if (c === 93 || c === 125) {
      depth--;
    }
  }
  return false;
}

function decode(delivery, shape) {
  const field = config.get("sluice.payload-field", "payload");
  const raw = delivery.field(field);
  if (raw === undefined) throw new DecodeError(`undecodable payload: the entry has no \`${field}\` field`);
  let value;
  try {
    const text = new TextDecoder().decode(raw);
    if (nestedTooDeeply(text)) throw new Error(`nested more than ${MAX_JSON_DEPTH} deep`);
    value = JSON.parse(text);
  } catch (err) {
    throw new DecodeError(`undecodable payload: field \`${field}\` is not valid JSON: ${err.message}`);
  }
  if (shape) {
    const name = shape.name ?? "payload";
    if (value === null || typeof value !== "object" || Array.isArray(value)) {
      throw new DecodeError(`undecodable payload: field \`${field}\` is not a valid ${name}: expected an object`);
    }
    for (const key of shape.required ?? []) {
      // Own properties only: `in` would take inherited names (`constructor`, `toString`).
      if (!Object.prototype.hasOwnProperty.call(value, key)) {
        throw new DecodeError(`undecodable payload: field \`${field}\` is not a valid ${name}: missing field \`${key}\``);
      }
    }
  }
  return value;
}

/**
 * Make `handler` this component's handler for `descriptor`; export the result's `handle` and
 * `subscription`. `options.payload` = { name, required: [...] } checks the decoded object's shape.
 */
export function subscriber(descriptor, handler, options = {}) {
  return {
    subscription() {
      return descriptor.wit;
    },
    async handle(wit) {
      const delivery = new Delivery(wit);
      let payload;
      try {
        payload = decode(delivery, options.payload);
      } catch (err) {
        if (err instanceof DecodeError) return deadLetter(err.message);
        throw err;
      }
      try {
        const outcome = await handler(payload, delivery);
        if (outcome === undefined || outcome === null) return ack();
        if (outcome.tag === "downstream-down") {
          hostDownstreamDown(outcome.reason);
          return { tag: "retry-after", val: outcome.val };
        }
        if (!["ack", "retry-after", "dead-letter"].includes(outcome.tag)) {
          throw new TypeError(`the handler returned ${JSON.stringify(outcome)}: return ack(), retryAfter(s), downstreamDown(r, s) or deadLetter(r)`);
        }
        return outcome;
      } catch (err) {
        // The host fails the attempt (and retries with backoff); say why first.
        hostLog("error", `threw ${describe(err)}`, [["sluice.panic", "true"], ["sluice.trace", String(err?.stack ?? "")]]);
        throw err;
      }
    },
  };
}

/** What was thrown, in one line: its type and message, and where, when the stack says. */
function describe(err) {
  if (!(err instanceof Error)) return `${typeof err} ${String(err)}`;
  // The first frame is in the first lines: a stack set by hand may be megabytes.
  const where = /([\w.\/-]{1,200}\.m?js):(\d+):(\d+)/.exec(String(err.stack ?? "").slice(0, 4096));
  return `${err.name}: ${err.message}${where ? ` (${where[1]}:${where[2]}:${where[3]})` : ""}`;
}

/**
 * fetch() with a time limit (seconds): rejects with an Error whose `timeout` is true when the
 * limit passes first. The host also caps every request at the subscription's `http_timeout`.
 */
export async function fetchWithTimeout(url, init = {}, seconds) {
  if (seconds === undefined) return fetch(url, init);
  let timer;
  const limit = new Promise((_, reject) => {
    timer = setTimeout(() => {
      const err = new Error(`HTTP ${init.method ?? "GET"} ${url}: timed out`);
      err.timeout = true;
      reject(err);
    }, seconds * 1000);
  });
  try {
    return await Promise.race([fetch(url, init), limit]);
  } finally {
    clearTimeout(timer);
  }
}
