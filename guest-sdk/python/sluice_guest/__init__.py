"""Write Sluice handlers in Python: functions that handle Redis Streams entries, compiled to
WebAssembly components with componentize-py and run by the ``sluice`` host.

A handler is a function under :func:`subscriber`, which names the subscription with a
:class:`RedisStream` descriptor::

    from sluice_guest import subscriber, RedisStream, DelayedRetry, ack, retry_after

    @subscriber(
        RedisStream("bank-payments")
        .group("billing")
        .delayed_retry(DelayedRetry.durable_zset("bank-payments.delayed"))
    )
    def charge_bank(payment: dict, delivery):
        ...
        return ack()

The function gets the entry's payload decoded from JSON (the ``payload`` field unless the host
configures another), and optionally the :class:`Delivery`. It answers :func:`ack`,
:func:`retry_after` or :func:`dead_letter`; returning ``None`` acks. An entry whose payload does
not decode is dead-lettered with a reason naming the field, never acked silently. An exception
fails the attempt (the host logs it and retries with backoff).

What a handler can reach in the host: :mod:`sluice_guest.config` (its subscription's values),
the standard :mod:`logging` module (records go into the host's log inside the delivery's span)
and :mod:`sluice_guest.http` (only the hosts the subscription's ``allowed_outbound_hosts``
grants).

Build with ``sluice build`` (componentize-py against the ``sluice:handler/handler-http`` world).
"""

from dataclasses import MISSING, dataclass, fields as dataclass_fields, is_dataclass
import itertools
import json
import math
import re
from typing import Any, Callable, List, Optional, Tuple

from . import config, trace, _log

__all__ = [
    "subscriber", "RedisStream", "DelayedRetry", "Backoff", "Delivery", "Outcome",
    "ack", "retry_after", "downstream_down", "dead_letter", "config", "http", "trace",
]


def _ms(seconds: float) -> int:
    """Seconds to whole milliseconds, rounded up so a tiny delay is still a delay."""
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {seconds}")
    return math.ceil(seconds * 1000)


@dataclass(frozen=True)
class Outcome:
    """What the handler answers: ``kind`` is ``ack``, ``retry-after``, ``downstream-down`` (a
    retry that counts toward the circuit breaker) or ``dead-letter``."""

    kind: str
    delay_ms: int = 0
    reason: str = ""


def ack() -> Outcome:
    """Done: the host acknowledges the entry."""
    return Outcome("ack")


def retry_after(seconds: float) -> Outcome:
    """Try again after ``seconds``: with a delayed-retry set the entry waits there (surviving
    any crash) and comes back on the stream when due."""
    return Outcome("retry-after", delay_ms=_ms(seconds))


def downstream_down(reason: str, seconds: float) -> Outcome:
    """Try again after ``seconds`` because a downstream is down (a gateway that refuses or times
    out): the attempt counts toward the subscription's circuit breaker, which stops taking
    entries while the downstream is away instead of burning their attempts."""
    return Outcome("downstream-down", delay_ms=_ms(seconds), reason=str(reason))


def dead_letter(reason: str) -> Outcome:
    """Give up: the entry goes to the dead-letter stream with ``reason``."""
    return Outcome("dead-letter", reason=str(reason))


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff after a failed attempt (an exception), in seconds."""

    initial: float
    max: float


class DelayedRetry:
    """Where a retry waits."""

    def __init__(self, key: str, ttl: Optional[float] = None):
        self.key = key
        self.ttl = ttl

    @staticmethod
    def durable_zset(key: str, ttl: Optional[float] = None) -> "DelayedRetry":
        """Park retries in the Redis sorted set ``key``, scored by due time. ``ttl`` (seconds)
        expires a set no retry refreshed for that long."""
        return DelayedRetry(key, ttl)


class RedisStream:
    """The subscription a handler asks for: the stream and, optionally, everything else the
    host's configuration may also set (the configuration wins)."""

    def __init__(self, stream: str):
        self.stream = stream
        self._group: Optional[str] = None
        self._consumer: Optional[str] = None
        self._claim_min_idle_ms: Optional[int] = None
        self._block_ms: Optional[int] = None
        self._count: Optional[int] = None
        self._dead_letter: Optional[str] = None
        self._max_retries: Optional[int] = None
        self._delayed_retry: Optional[DelayedRetry] = None
        self._payload_field: Optional[str] = None
        self._max_delay_ms: Optional[int] = None
        self._failure_backoff: Optional[Backoff] = None
        self._partitions: Optional[int] = None

    def _set(self, name: str, value: Any) -> "RedisStream":
        setattr(self, name, value)
        return self

    def group(self, group: str) -> "RedisStream":
        """The consumer group (default: the stream's name)."""
        return self._set("_group", group)

    def consumer(self, consumer: str) -> "RedisStream":
        """The consumer name within the group (default: host name and pid)."""
        return self._set("_consumer", consumer)

    def claim_min_idle(self, seconds: float) -> "RedisStream":
        """Also take entries other consumers left pending this long."""
        return self._set("_claim_min_idle_ms", _ms(seconds))

    def block(self, seconds: float) -> "RedisStream":
        """How long one read waits for new entries."""
        return self._set("_block_ms", _ms(seconds))

    def count(self, count: int) -> "RedisStream":
        """Entries per read."""
        return self._set("_count", int(count))

    def dead_letter(self, stream: str) -> "RedisStream":
        """The dead-letter stream (default ``<stream>.<group>.dead-letter``)."""
        return self._set("_dead_letter", stream)

    def max_retries(self, retries: int) -> "RedisStream":
        """Dead-letter after this many retries."""
        return self._set("_max_retries", int(retries))

    def delayed_retry(self, retry: DelayedRetry) -> "RedisStream":
        """Where ``retry_after`` waits (without it the entry stays pending and is redelivered)."""
        return self._set("_delayed_retry", retry)

    def payload_field(self, field: str) -> "RedisStream":
        """The entry field that carries the JSON payload (default ``payload``)."""
        return self._set("_payload_field", field)

    def max_delay(self, seconds: float) -> "RedisStream":
        """The longest ``retry_after`` the handler asks for (checked against a set's ttl)."""
        return self._set("_max_delay_ms", _ms(seconds))

    def failure_backoff(self, backoff: Backoff) -> "RedisStream":
        """Backoff after a failed attempt."""
        return self._set("_failure_backoff", backoff)

    def partitions(self, n: int) -> "RedisStream":
        """Read this many partitions of the stream, each with its own hash tag."""
        return self._set("_partitions", int(n))


class Delivery:
    """One Redis Streams entry as delivered: where it came from, all its fields, and how often
    it was tried before."""

    def __init__(self, stream: str, group: str, id: str, fields: List[Tuple[str, bytes]],
                 retry_count: int, delivery_count: int, origin_id: str):
        self.stream = stream
        self.group = group
        self.id = id
        self.fields = fields
        self.retry_count = retry_count
        self.delivery_count = delivery_count
        #: The id the producer's entry first had: the same through every retry and requeue.
        #: Use it as the idempotency key.
        self.origin_id = origin_id

    def field(self, name: str) -> Optional[bytes]:
        """The raw bytes of field ``name``, if the entry has it."""
        for n, v in self.fields:
            if n == name:
                return v
        return None

    @property
    def previous_attempts(self) -> int:
        """Attempts that failed before this one, whatever the retry mechanism."""
        return self.retry_count + max(self.delivery_count - 1, 0)


class DecodeError(Exception):
    """The payload could not become the handler's input; the entry is dead-lettered with this
    message."""


# The deepest nesting of arrays and objects a payload may have: the JSON decoder recurses in C,
# and a payload nested thousands deep exhausts the component's stack (a trap, retried for ever)
# before Python could raise RecursionError.
_MAX_JSON_DEPTH = 256
# A string, or an unterminated one to the end: every match moves past its quote, so the scan
# is linear however the quotes and backslashes fall.
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"?', re.S)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]")


def _nested_too_deeply(raw: bytes) -> bool:
    if raw.count(b"[") + raw.count(b"{") <= _MAX_JSON_DEPTH:
        return False
    brackets = _NOT_BRACKET.sub(b"", _JSON_STRING.sub(b"", raw))
    steps = (1 if b in (0x5B, 0x7B) else -1 for b in brackets)
    return max(itertools.accumulate(steps), default=0) > _MAX_JSON_DEPTH


def _decode(delivery: Delivery, into: Optional[type]) -> Any:
    field = config.get("sluice.payload-field") or "payload"
    raw = delivery.field(field)
    if raw is None:
        raise DecodeError(f"undecodable payload: the entry has no `{field}` field")
    if _nested_too_deeply(bytes(raw)):
        raise DecodeError(
            f"undecodable payload: field `{field}` is not valid JSON: "
            f"nested more than {_MAX_JSON_DEPTH} deep")
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise DecodeError(f"undecodable payload: field `{field}` is not valid JSON: {err}")
    except RecursionError:
        # Nested deeper than the interpreter recurses: no retry can decode it.
        raise DecodeError(
            f"undecodable payload: field `{field}` is not valid JSON: nested too deeply")
    if into is None:
        return value
    name = into.__name__
    if not isinstance(value, dict):
        raise DecodeError(
            f"undecodable payload: field `{field}` is not a valid {name}: expected an object")
    if is_dataclass(into):
        known = {f.name: f for f in dataclass_fields(into)}
        for f in known.values():
            if f.name not in value and f.default is MISSING and f.default_factory is MISSING:
                raise DecodeError(
                    f"undecodable payload: field `{field}` is not a valid {name}: "
                    f"missing field `{f.name}`")
        value = {k: v for k, v in value.items() if k in known}
    try:
        return into(**value)
    except (TypeError, ValueError) as err:
        raise DecodeError(f"undecodable payload: field `{field}` is not a valid {name}: {err}")


_registered: Optional[Tuple[RedisStream, Callable[..., Any], Optional[type], bool]] = None


def subscriber(descriptor: RedisStream, payload: Optional[type] = None):
    """Make the decorated function this component's handler for ``descriptor``.

    ``payload`` is a class (a dataclass, say) to build from the decoded JSON object; without it
    the handler gets the decoded JSON as is. The function takes the payload, or the payload and
    the :class:`Delivery`. Use it once per component.
    """

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        global _registered
        if _registered is not None:
            raise RuntimeError(
                f"@subscriber is used twice in one component ({_registered[1].__name__} and "
                f"{fn.__name__}): a component has one handler")
        takes_delivery = fn.__code__.co_argcount >= 2
        _registered = (descriptor, fn, payload, takes_delivery)
        return fn

    return register


def _handler() -> Tuple[RedisStream, Callable[..., Any], Optional[type], bool]:
    if _registered is None:
        raise RuntimeError("no handler: decorate one function with @subscriber(RedisStream(...))")
    return _registered


def _run(delivery: Delivery) -> Outcome:
    """Decode, call the handler, and turn what it returned into an outcome."""
    _log.install()
    _, fn, into, takes_delivery = _handler()
    try:
        value = _decode(delivery, into)
    except DecodeError as err:
        return dead_letter(str(err))
    result = fn(value, delivery) if takes_delivery else fn(value)
    if result is None:
        return ack()
    if not isinstance(result, Outcome):
        raise TypeError(
            f"{fn.__name__} returned {result!r}: return ack(), retry_after(s) or dead_letter(r)")
    return result
