"""Leaf module: the one exception tree of the package."""

from __future__ import annotations


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


class ParseError(ContemplationError):
    """A log that cannot be read at all (the parser itself is tolerant)."""


class NoRoute(ContemplationError):
    """A NEED that no rule matches."""


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
        kind: str = "backend",
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
        return self.kind in {"unreachable", "connection"} or (self.status_code or 0) >= 500


class ContextOverflow(BackendError):
    """The prompt does not fit the model's context window."""

    def __init__(self, message: str, *, n_prompt: int | None = None, n_ctx: int | None = None):
        super().__init__(message, transient=False, kind="context_overflow", status_code=400)
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx


class LockBusy(ContemplationError):
    """Someone else holds a conversation's lock (a person appending by hand)."""
