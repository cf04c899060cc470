// The bank-payments handler in JavaScript: it charges each payment at the payment gateway over
// HTTP; a payment the gateway timed out on waits in the `bank-payments.delayed` sorted set for
// 30 seconds, then comes back and is charged again. A declined charge is dead-lettered. It
// behaves exactly like the Rust example (`examples/bank-payments`); the example-equivalence test
// runs both.
//
// Build with: `sluice build` in this directory (componentize-js)
// Run with:   `sluice run sluice.toml`

import {
  subscriber, RedisStream, DelayedRetry, ack, retryAfter, downstreamDown, deadLetter, config, log,
  fetchWithTimeout,
} from "./sluice_guest.js";

/** How long a payment the gateway timed out on waits before it is charged again. */
const RECHECK_SECONDS = 30;

class GatewayError extends Error {
  constructor(message, retryable, down = false) {
    super(message);
    this.retryable = retryable;
    // The gateway itself is away: the circuit breaker counts it.
    this.down = down;
  }
}

/** Charge at the gateway; the payment id is the idempotency key, so a retry never charges twice. */
async function charge(payment) {
  const url = config.get("gateway_url", "http://127.0.0.1:7878").replace(/\/+$/, "");
  const timeout = Number(config.get("gateway_timeout_ms", "2000")) / 1000;
  let response;
  try {
    response = await fetchWithTimeout(`${url}/charge`, {
      method: "POST",
      headers: { "content-type": "application/json", "idempotency-key": payment.id },
      body: JSON.stringify(payment),
    }, timeout);
  } catch (err) {
    if (err.timeout) throw new GatewayError("the payment gateway timed out", true);
    throw new GatewayError(`the payment gateway is unavailable: ${err.message}`, true, true);
  }
  const text = await response.text();
  if (response.status >= 200 && response.status < 300) return;
  if (response.status === 504) throw new GatewayError("the payment gateway timed out", true);
  if (response.status >= 400 && response.status < 500) {
    throw new GatewayError(`the payment gateway declined the charge: ${response.status} ${text}`, false);
  }
  throw new GatewayError(`the payment gateway is unavailable: ${response.status} ${text}`, true, true);
}

export const { handle, subscription } = subscriber(
  new RedisStream("bank-payments")
    .group("billing")
    .delayedRetry(DelayedRetry.durableZset("bank-payments.delayed")),
  async (payment) => {
    try {
      await charge(payment);
    } catch (err) {
      if (!(err instanceof GatewayError)) throw err;
      if (err.down) {
        log.warn("gateway down, parked for later", { "payment.id": payment.id, err: err.message });
        return downstreamDown(err.message, RECHECK_SECONDS);
      }
      if (err.retryable) {
        log.warn("charge failed, parked for later", { "payment.id": payment.id, err: err.message });
        return retryAfter(RECHECK_SECONDS);
      }
      return deadLetter(err.message);
    }
    log.info("payment charged", { "payment.id": payment.id, amount_cents: payment.amount_cents });
    return ack();
  },
  {
    payload: {
      name: "Payment",
      required: ["id", "account", "amount_cents", "currency", "created_at_ms"],
    },
  },
);
