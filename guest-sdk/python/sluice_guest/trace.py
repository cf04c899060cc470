"""The trace the current attempt runs in: its id for a handler's own logs, its ``traceparent``
for a call made by other means than :mod:`sluice_guest.http` (whose requests the host puts in the
trace by itself). Both are ``None`` while the host exports no traces."""

from typing import Optional

from wit_world.imports import trace as _wit


def traceparent() -> Optional[str]:
    """The attempt span's W3C ``traceparent``: ``00-<trace id>-<span id>-<flags>``."""
    return _wit.traceparent()


def trace_id() -> Optional[str]:
    """The trace id (32 lowercase hex digits): the same for every attempt of the entry."""
    value = traceparent()
    return None if value is None else value.split("-")[1]
