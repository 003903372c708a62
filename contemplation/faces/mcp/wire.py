"""The answer to a stdio line the SDK cannot read.

The SDK's stdio transport hands the server an ``Exception`` for a line that is not a JSON-RPC
message, and the server drops it: the client's request waited for an answer that never came.
A request nested ~200 levels deep is such a line (pydantic's JSON parser stops at its
recursion limit). :class:`Answering` wraps the transport's read stream and answers each such
line with a JSON-RPC error, as the spec asks: -32700 (parse error) for a line that is not
JSON, -32600 (invalid request) for JSON that is not a request, each with the line's ``id``
where one can be read from its top level, else ``null``; then serving goes on. A line that
reads as a notification or as a response gets no answer (neither may be answered).

The id is read without descending into the line
(:func:`contemplation.faces.mcp.jsonline.members`): nested values are skipped by counting
brackets, so the depth that stopped the parser costs nothing here.

The HTTP face needs none of this: the SDK's streamable HTTP transport answers such a body
itself (400, -32700 or -32602, ``id`` null).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import structlog
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError
from pydantic import ValidationError

from contemplation.faces.mcp.jsonline import NESTED, members
from contemplation.faces.mcp.surely import request_id

__all__ = ["NESTED", "Answering", "members", "refusal"]

log = structlog.get_logger("contemplation.mcp")


def _request_id(top: dict[str, object]) -> str | int | None:
    """The id to answer under: a string or an integer, and one that can be written back
    (an escaped lone surrogate cannot: writing it killed the server's writer)."""
    rid = top.get("id")
    return rid if request_id(rid) and isinstance(rid, str | int) else None


def _unanswerable(top: dict[str, object], whole: bool) -> bool:
    """A notification (read whole: no id anywhere in it) or a response: neither is answered."""
    if "method" not in top:
        return "result" in top or "error" in top
    return whole and "id" not in top


def _first_problem(exc: ValidationError) -> str:
    """One line from pydantic's errors: the request's (the union's first member) first."""
    errors = exc.errors(include_url=False)
    ours = [e for e in errors if e["loc"][:1] == ("JSONRPCRequest",)] or errors
    if not ours:
        return "not a JSON-RPC 2.0 message"
    where = ".".join(str(p) for p in ours[0]["loc"][1:])
    return f"{where}: {ours[0]['msg']}" if where else ours[0]["msg"]


def refusal(exc: Exception) -> JSONRPCError | None:
    """The error that answers the line ``exc`` was raised for, or None where none is due."""
    if not isinstance(exc, ValidationError):
        return JSONRPCError(
            jsonrpc="2.0", id=None, error=ErrorData(code=PARSE_ERROR, message="Parse error")
        )
    errors = exc.errors(include_url=False)
    raw = errors[0].get("input") if errors else None
    if errors and errors[0]["type"] == "json_invalid" and isinstance(raw, str):
        said = str(errors[0]["msg"]).removeprefix("Invalid JSON: ")
        if "recursion limit" in said:
            said += " (the JSON is nested too deep)"
        read = members(raw)
        top, whole = read if read is not None else ({}, False)
        if _unanswerable(top, whole):
            return None
        return JSONRPCError(
            jsonrpc="2.0",
            id=_request_id(top),
            error=ErrorData(code=PARSE_ERROR, message=f"Parse error: {said}"),
        )
    # valid JSON that is no message: the union's Response member always misses `result` in a
    # top-level object, so that error's input is the object itself
    top = next(
        (
            e["input"]
            for e in errors
            if len(e["loc"]) == 2 and e["type"] == "missing" and isinstance(e["input"], dict)
        ),
        {},
    )
    if _unanswerable(top, whole=True):
        return None
    return JSONRPCError(
        jsonrpc="2.0",
        id=_request_id(top),
        error=ErrorData(code=INVALID_REQUEST, message=f"Invalid Request: {_first_problem(exc)}"),
    )


class Answering:
    """The transport's read stream, less the lines it could not read: each is answered on
    ``write`` (:func:`refusal`) and the next item is read."""

    def __init__(
        self,
        inner: ReadStream[SessionMessage | Exception],
        write: WriteStream[SessionMessage],
    ) -> None:
        self._inner = inner
        self._write = write

    @property
    def last_context(self) -> Any:
        """The context the transport sent the last item in (the dispatcher reads it)."""
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        while True:
            item = await self._inner.receive()
            if not isinstance(item, Exception):
                return item
            answer = refusal(item)
            log.warning(
                "mcp_line_refused",
                code=answer.error.code if answer else None,
                id=answer.id if answer else None,
            )
            if answer is not None:
                await self._write.send(SessionMessage(answer))

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> Answering:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        import anyio

        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Answering:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()
