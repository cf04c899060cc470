"""The subscription's configuration values: a read-only string table the host passes to the
handler (the ``config`` table of the subscription in the host's TOML). Keys starting with
``sluice.`` are the host's own."""

from typing import Dict, Optional

from wit_world.imports import config as _wit


def get(key: str, default: Optional[str] = None) -> Optional[str]:
    """The value for ``key``, or ``default``."""
    value = _wit.get(key)
    return default if value is None else value


def all() -> Dict[str, str]:  # noqa: A001 - mirrors the WIT's get-all
    """Every key/value pair."""
    return dict(_wit.get_all())
