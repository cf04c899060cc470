"""The component's exports: the glue between componentize-py's generated ``wit_world`` and
the function under ``@subscriber``. ``sluice build`` names this module's ``WitWorld`` as the
component's implementation."""

import os
import re
import traceback

import wit_world
from wit_world.imports import flow as _flow
from wit_world.imports import sluice_handler_types as t

import sluice_guest as sdk
from sluice_guest import _log


def _wit_outcome(outcome: "sdk.Outcome") -> t.Outcome:
    if outcome.kind == "ack":
        return t.Outcome_Ack()
    if outcome.kind == "retry-after":
        return t.Outcome_RetryAfter(outcome.delay_ms)
    if outcome.kind == "downstream-down":
        _flow.downstream_down(outcome.reason)
        return t.Outcome_RetryAfter(outcome.delay_ms)
    return t.Outcome_DeadLetter(outcome.reason)


class WitWorld(wit_world.WitWorld):
    def handle(self, delivery: t.Delivery) -> t.Outcome:
        d = sdk.Delivery(delivery.stream, delivery.group, delivery.id, delivery.fields,
                         delivery.retry_count, delivery.delivery_count, delivery.origin_id)
        try:
            return _wit_outcome(sdk._run(d))
        except Exception as err:
            # The host fails the attempt (and retries with backoff); say why first: the
            # exception and where it was raised on one line, the traceback apart.
            where = ""
            frames = traceback.extract_tb(err.__traceback__)
            if frames:
                last = frames[-1]
                where = f" ({os.path.basename(last.filename)}:{last.lineno} in {last.name})"
            # The build mounts each source directory as /0, /1, ...: name files as the project
            # does.
            trace = re.sub(r'File "/\d+/', 'File "', traceback.format_exc())
            _log.panic(f"raised {type(err).__name__}: {err}{where}", trace)
            raise

    def subscription(self) -> t.Subscription:
        d, _, _, _ = sdk._handler()
        retry = None
        if d._delayed_retry is not None:
            ttl = d._delayed_retry.ttl
            retry = t.DelayedRetry_DurableZset(
                t.DurableZset(d._delayed_retry.key, None if ttl is None else sdk._ms(ttl)))
        backoff = None
        if d._failure_backoff is not None:
            backoff = t.Backoff(sdk._ms(d._failure_backoff.initial), sdk._ms(d._failure_backoff.max))
        return t.Subscription(
            stream=d.stream,
            group=d._group,
            consumer=d._consumer,
            claim_min_idle_ms=d._claim_min_idle_ms,
            block_ms=d._block_ms,
            count=d._count,
            dead_letter=d._dead_letter,
            max_retries=d._max_retries,
            delayed_retry=retry,
            payload_field=d._payload_field,
            max_delay_ms=d._max_delay_ms,
            failure_backoff=backoff,
            partitions=d._partitions,
        )
