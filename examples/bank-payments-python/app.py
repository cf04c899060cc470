"""The bank-payments handler in Python: it charges each payment at the payment gateway over
HTTP; a payment the gateway timed out on waits in the `bank-payments.delayed` sorted set for 30
seconds, then comes back and is charged again. A declined charge is dead-lettered. It behaves
exactly like the Rust example (`examples/bank-payments`); the example-equivalence test runs both.

Build with: `sluice build` in this directory (componentize-py)
Run with:   `sluice run sluice.toml`
"""

from dataclasses import dataclass
import logging

from sluice_guest import (DelayedRetry, RedisStream, ack, config, dead_letter, downstream_down, http,
                          retry_after, subscriber)

log = logging.getLogger("bank_payments")

#: How long a payment the gateway timed out on waits before it is charged again.
RECHECK_SECONDS = 30


@dataclass
class Payment:
    """A payment to charge, as JSON in the entry's `payload` field."""

    id: str
    account: str
    amount_cents: int
    currency: str
    created_at_ms: int


class GatewayError(Exception):
    def __init__(self, message: str, retryable: bool, down: bool = False):
        super().__init__(message)
        self.retryable = retryable
        # The gateway itself is away: the circuit breaker counts it.
        self.down = down


def charge(payment: Payment) -> None:
    """Charge at the gateway; the payment id is the idempotency key, so a retry never charges
    twice."""
    url = (config.get("gateway_url") or "http://127.0.0.1:7878").rstrip("/")
    timeout = int(config.get("gateway_timeout_ms") or "2000") / 1000
    try:
        response = http.post(f"{url}/charge", json=payment.__dict__, timeout=timeout,
                             headers={"idempotency-key": payment.id})
    except http.HttpError as err:
        if err.is_timeout:
            raise GatewayError("the payment gateway timed out", True)
        raise GatewayError(f"the payment gateway is unavailable: {err}", True, down=True)
    if 200 <= response.status < 300:
        return
    if response.status == 504:
        raise GatewayError("the payment gateway timed out", True)
    if 400 <= response.status < 500:
        raise GatewayError(
            f"the payment gateway declined the charge: {response.status} {response.text}", False)
    raise GatewayError(
        f"the payment gateway is unavailable: {response.status} {response.text}", True, down=True)


@subscriber(
    RedisStream("bank-payments")
    .group("billing")
    .delayed_retry(DelayedRetry.durable_zset("bank-payments.delayed")),
    payload=Payment,
)
def charge_bank(payment: Payment):
    try:
        charge(payment)
    except GatewayError as err:
        if err.down:
            log.warning("gateway down, parked for later: %s (payment %s)", err, payment.id)
            return downstream_down(str(err), RECHECK_SECONDS)
        if err.retryable:
            log.warning("charge failed, parked for later: %s (payment %s)", err, payment.id)
            return retry_after(RECHECK_SECONDS)
        return dead_letter(str(err))
    log.info("payment charged: %s (%d cents)", payment.id, payment.amount_cents)
    return ack()
