"""structlog set-up: readable lines on a terminal, JSON lines otherwise (always on stderr);
a command that is not a service (``human``) says its warnings in a plain line instead, with
no log record's shape (``status`` printed ``{"why": "disk I/O error", …}``)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, MutableMapping
from typing import Any, Literal

import structlog

from contemplation.base.redact import redacted

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class RateLimit:
    """A structlog processor: at most ``burst`` lines of one event (same level, name and
    conversation) per ``window`` seconds; the next line that gets through says how many were
    dropped. A storm of one repeated failure costs a few lines, not megabytes of stderr."""

    def __init__(
        self, burst: int = 20, window: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst = burst
        self.window = window
        self.clock = clock
        self._seen: dict[tuple[str, str, str], tuple[float, int, int]] = {}  # start, n, dropped

    def __call__(
        self, _logger: Any, method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        key = (method, str(event.get("event", "")), str(event.get("conv", "")))
        now = self.clock()
        start, count, dropped = self._seen.get(key, (now, 0, 0))
        if now - start >= self.window:
            start, count = now, 0
        if count >= self.burst:
            self._seen[key] = (start, count, dropped + 1)
            raise structlog.DropEvent
        if dropped:
            event["repeats_dropped"] = dropped
        if len(self._seen) > 10_000:  # bounded: forget every event name at once
            self._seen.clear()
        self._seen[key] = (start, count + 1, 0)
        return event


def _clean(value: Any, depth: int = 0) -> Any:
    """``value`` with the credentials of any URL in it masked; unchanged when it has none."""
    if isinstance(value, str):
        return redacted(value)
    if depth < 4 and isinstance(value, dict):
        return {k: _clean(v, depth + 1) for k, v in value.items()}
    if depth < 4 and type(value) in (list, tuple):
        return type(value)(_clean(v, depth + 1) for v in value)
    if isinstance(value, bool | int | float) or value is None:
        return value
    text = str(value)
    shown = redacted(text)
    return value if shown == text else shown


def redact_urls(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A structlog processor: no log line shows a URL's password (``user:***@``), whatever
    value or exception carries it (:func:`contemplation.base.redact.redacted`)."""
    exc_info = event.get("exc_info")
    if exc_info and not isinstance(exc_info, str):  # a console log renders it itself
        text = structlog.processors.format_exc_info(None, "", {"exc_info": exc_info})
        shown = str(text.get("exception", ""))
        if shown != redacted(shown):
            del event["exc_info"]
            event["exception"] = shown
    for key, value in event.items():
        if key != "exc_info":
            event[key] = _clean(value)
    return event


class _StdlibRedact(logging.Filter):
    """The same for standard-library records (a library's error that names a URL)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if redacted(message) != message:
            record.msg, record.args = redacted(message), ()
        if record.exc_info and not record.exc_text:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_text = redacted(text)
        return True


class _StdlibRateLimit(logging.Filter):
    """The same :class:`RateLimit` for standard-library records (asyncio's "accept() out of
    system resource" repeats every few milliseconds while file descriptors run out)."""

    def __init__(self) -> None:
        super().__init__()
        self.limit = RateLimit(burst=5)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            self.limit(None, record.levelname, {"event": f"{record.name}:{record.msg}"})
        except structlog.DropEvent:
            return False
        return True


def human(_logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
    """A structlog renderer for a command's stderr: ``contemplation: warning: index
    unwritable: disk I/O error (reading: the folders, into memory)``."""
    what = str(event.pop("event", "")).replace("_", " ")
    for key in ("level", "timestamp", "repeats_dropped"):
        event.pop(key, None)
    why = event.pop("why", None) or event.pop("error", None)
    line = f"contemplation: {method}: {what}" + (f": {why}" if why else "")
    rest = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in event.items())
    return line + (f" ({rest})" if rest else "")


def configure(
    fmt: Literal["auto", "console", "json"] = "auto",
    level: str = "info",
    *,
    human_lines: bool = False,
) -> None:
    json_out = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        human
        if human_lines
        else structlog.processors.JSONRenderer()
        if json_out
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            RateLimit(),
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=False),
            structlog.processors.format_exc_info
            if json_out
            else structlog.processors.StackInfoRenderer(),
            redact_urls,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # libraries log through the standard library: only their errors, rate-limited too
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr, format="%(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _StdlibRateLimit) for f in handler.filters):
            handler.addFilter(_StdlibRateLimit())
        if not any(isinstance(f, _StdlibRedact) for f in handler.filters):
            handler.addFilter(_StdlibRedact())
