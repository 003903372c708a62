"""Leaf module: the one exception tree of the package."""

from __future__ import annotations

import enum


class ErrorKind(enum.StrEnum):
    """What went wrong, in one word: ``state.json``'s ``last_error.kind`` and the faces show
    it; the breakers and the retry policy decide from it (see :attr:`BackendError.server_down`)."""

    AUTH = "auth"
    BACKEND = "backend"
    BAD_REQUEST = "bad_request"
    CANCELLED = "cancelled"
    CIRCUIT_OPEN = "circuit_open"
    CONFIG = "config"
    CONNECTION = "connection"
    CONTEXT_OVERFLOW = "context_overflow"
    CUT = "cut"
    HTTP = "http"
    INTERNAL = "internal"
    LOCAL_ERROR = "local_error"
    MISSING_DEPENDENCY = "missing_dependency"
    MODEL_LOAD = "model_load"
    MODEL_NOT_FOUND = "model_not_found"
    PROTOCOL = "protocol"
    REFUSED = "refused"
    SERVER_BUSY = "server_busy"
    SERVER_ERROR = "server_error"
    SESSION_LOST = "session_lost"
    STALL = "stall"
    STREAM_ERROR = "stream_error"
    TIMEOUT = "timeout"
    TOO_LARGE = "too_large"
    UNREACHABLE = "unreachable"
    UNSUPPORTED = "unsupported"
    UPSTREAM = "upstream"
    WRITE_FAILED = "write_failed"


class ContemplationError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(ContemplationError):
    """Invalid settings: names the key and the file."""


class NotFound(ContemplationError):
    """A conversation, template or model that does not exist."""


class Ambiguous(ContemplationError):
    """A conversation name that matches more than one conversation."""


class AlreadyRunning(ContemplationError):
    """A second daemon on the same home."""


class InputRejected(ContemplationError):
    """A message that cannot become a block (empty, binary, too large)."""


class AlreadyDecided(InputRejected):
    """A second decision about a lookup: the first is final (the message names it)."""


class ToolError(ContemplationError):
    """A tool that failed or timed out."""


class BackendError(ContemplationError):
    """A model server call that failed.

    ``transient`` errors are retried with backoff (refused, 5xx, timeouts, a cut stream);
    permanent ones become a visible error block and ``status: error``.
    """

    def __init__(
        self,
        message: str,
        *,
        transient: bool,
        kind: ErrorKind = ErrorKind.BACKEND,
        status_code: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.kind = kind
        self.status_code = status_code
        self.retry_after = retry_after

    @property
    def server_down(self) -> bool:
        """The failure says the server itself is unwell (not this model or this request)."""
        return (
            self.kind in {ErrorKind.UNREACHABLE, ErrorKind.CONNECTION}
            or (self.status_code or 0) >= 500
        )


class ContextOverflow(BackendError):
    """The prompt does not fit the model's context window."""

    def __init__(self, message: str, *, n_prompt: int | None = None, n_ctx: int | None = None):
        super().__init__(message, transient=False, kind=ErrorKind.CONTEXT_OVERFLOW, status_code=400)
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx


class LockBusy(ContemplationError):
    """Someone else holds a conversation's lock (a person appending by hand)."""
