"""Python's ``logging`` into the host's ``tracing``: records become events inside the
delivery's span. The host bounds and escapes what arrives, so a flood costs the host nothing."""

import logging

from wit_world.imports import log as _wit

_LEVELS = [
    (logging.ERROR, _wit.Level.ERROR),
    (logging.WARNING, _wit.Level.WARN),
    (logging.INFO, _wit.Level.INFO),
    (logging.DEBUG, _wit.Level.DEBUG),
]


class HostHandler(logging.Handler):
    """Sends each record to the host, with its logger name as a field."""

    def emit(self, record: logging.LogRecord) -> None:
        level = next((w for py, w in _LEVELS if record.levelno >= py), _wit.Level.TRACE)
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + self.formatter_for_exc().formatException(record.exc_info)
            _wit.log(level, message, [("logger", record.name)])
        except Exception:  # a broken record must not fail the delivery
            self.handleError(record)

    @staticmethod
    def formatter_for_exc() -> logging.Formatter:
        return logging.Formatter()


_installed = False


def install() -> None:
    """Route the root logger to the host (once per instance)."""
    global _installed
    if not _installed:
        root = logging.getLogger()
        root.handlers = [HostHandler()]
        root.setLevel(logging.INFO)
        _installed = True


def panic(message: str, trace: str = "") -> None:
    """Tell the host why this attempt is about to fail (it names it in the log, the metrics
    and a dead letter): ``message`` in one line, ``trace`` the traceback."""
    fields = [("sluice.panic", "true")]
    if trace:
        fields.append(("sluice.trace", trace))
    _wit.log(_wit.Level.ERROR, message, fields)
