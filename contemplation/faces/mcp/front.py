"""The stdio MCP server's first second: ``initialize`` and ``tools/list`` answered at once
(issue 44 finding 3).

Claude Code sends its first model request about 1.6 to 2 s after it spawns its MCP servers,
with whatever tools are listed by then; importing the MCP SDK alone takes 0.7 to 1.2 s on a
2-core machine (more under load), so the tools were missing from the first request. This
module, which imports nothing but the standard library, claims the process's stdin and stdout
for the protocol first, answers the client's ``initialize``, ``tools/list`` (first page) and
``ping`` from :data:`MANIFEST` (the answers the SDK server itself gave, captured by
:mod:`contemplation.faces.mcp.manifest` and checked by a test), and holds every other line,
in order, until the SDK server is loaded. Then the server is given the client's
``initialize`` again (under an id of its own, its answer compared with the one sent and kept
off the wire) and every held line, and serves the rest of the session as usual.

Nothing is answered early that the SDK might answer otherwise: an ``initialize`` whose
parameters are not the handshake's shape, a client that begins with anything else, or a
manifest made for another version of the SDK or of contemplation leaves every line to the
SDK server (the answers then come as late as before, and as right).

stdin and stdout are claimed as the SDK's own stdio transport claims them: the protocol goes
through private duplicates, fd 0 reads ``/dev/null`` and fd 1 writes to stderr, so a stray
print or a child's output never corrupts the wire.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import sys
import threading
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, Final, TypeGuard

if TYPE_CHECKING:
    from contemplation.faces.mcp.server import ContemplationServer

MANIFEST: Final = os.path.join(os.path.dirname(__file__), "manifest.json")
REPLAYED: Final = "contemplation-front-initialize"  # the id the SDK's own initialize goes under
HELD_LINES: Final = 256  # lines held for the SDK server; the reader then waits (the pipe fills)
READ_BYTES: Final = 64 * 1024  # longer lines are never answered here: the server reads them
UNKNOWN_VERSION: Final = "*"  # the manifest's answer for a protocol version it does not name


def _private(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)


class Wire:
    """The protocol's two ends: private duplicates of fd 0 and 1, which then point at
    ``/dev/null`` and stderr. One line is written at a time, whole."""

    def __init__(self, inp: IO[bytes], out: IO[bytes]) -> None:
        self.inp = inp
        self.out = out
        self.lock = threading.Lock()

    @classmethod
    def claim(cls) -> Wire:
        sys.stdout.flush()
        inp = os.fdopen(_private(0), "rb")
        out = os.fdopen(_private(1), "wb")
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(2, 1)
        return cls(inp, out)

    def send(self, line: str) -> None:
        with self.lock:
            self.out.write(line.encode() + b"\n")
            self.out.flush()


def load_manifest(mcp_version: Callable[[], str]) -> dict[str, Any] | None:
    """The early answers, if they were captured from this contemplation and this MCP SDK."""
    from contemplation import __version__

    try:
        with open(MANIFEST, encoding="utf-8") as f:
            manifest: dict[str, Any] = json.load(f)
        if manifest.get("contemplation") != __version__ or manifest.get("mcp") != mcp_version():
            return None
    except (OSError, ValueError, LookupError):
        return None
    return manifest


def _sdk_version() -> str:
    from importlib.metadata import version

    return version("mcp")


def _handshake(msg: object) -> TypeGuard[dict[str, Any]]:
    """An ``initialize`` request the SDK would take: its parameters have the handshake's
    shape (anything else is left for the SDK to answer, or refuse)."""
    if not isinstance(msg, dict) or msg.get("method") != "initialize" or "id" not in msg:
        return False
    params = msg.get("params")
    if not isinstance(params, dict):
        return False
    info = params.get("clientInfo")
    return (
        isinstance(params.get("protocolVersion"), str)
        and isinstance(params.get("capabilities"), dict)
        and isinstance(info, dict)
        and isinstance(info.get("name"), str)
        and isinstance(info.get("version"), str)
    )


def _read(line: str) -> object:
    """The message on ``line``, or None where it is not one this module reads: too long, not
    JSON, or nested past the parser's depth (the SDK server answers those)."""
    if len(line) > READ_BYTES:
        return None
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


class Front:
    """Reads the wire on a thread of its own: answers what :data:`MANIFEST` answers while
    the SDK server loads, and holds every other line for it."""

    def __init__(self, wire: Wire, manifest: dict[str, Any] | None) -> None:
        self.wire = wire
        self.early = manifest
        self.lines: queue.Queue[str | None] = queue.Queue(HELD_LINES)
        self.ready = threading.Event()  # set once the SDK server reads the lines itself
        self.gate = threading.Lock()  # a line is answered here, or the server is handed over
        self.first = True
        self.initialize: str | None = None  # the client's initialize, answered here
        self.told: dict[str, Any] | None = None  # and the result it was given
        self.reader = threading.Thread(target=self._read, name="mcp-front", daemon=True)

    def start(self) -> Front:
        self.reader.start()
        return self

    def _read(self) -> None:
        for raw in iter(self.wire.inp.readline, b""):
            line = raw.decode("utf-8", "replace")
            with self.gate:
                if self.early is not None and not self.ready.is_set() and self._answered(line):
                    continue
            self.lines.put(line)
        self.lines.put(None)

    def _answer(self, msg: dict[str, Any], result: object) -> None:
        self.wire.send(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}))

    def _answered(self, line: str) -> bool:
        assert self.early is not None
        msg = _read(line)
        first, self.first = self.first, False
        if first:
            if not _handshake(msg):
                self.early = None  # not a handshake the manifest knows: the SDK answers all
                return False
            answers = self.early["initialize"]
            result = answers.get(msg["params"]["protocolVersion"], answers[UNKNOWN_VERSION])
            self.initialize = json.dumps({**msg, "id": REPLAYED})
            self.told = result
            self._answer(msg, result)
            return True
        if isinstance(msg, dict) and "method" in msg and "id" not in msg:
            return False  # a notification: held, and the answers go on
        if not isinstance(msg, dict) or "id" not in msg:
            self.early = None  # the server answers this one: every later answer waits too,
            return False  # so that none overtakes it
        params = msg.get("params")
        if msg.get("method") == "tools/list" and not (
            isinstance(params, dict) and params.get("cursor")
        ):
            self._answer(msg, self.early["tools/list"])
            return True
        if msg.get("method") == "ping":
            self._answer(msg, {})
            return True
        self.early = None
        return False

    # ------------------------------------------------------------------ the SDK's side

    def hand_over(self) -> str | None:
        """From now on every line goes to the SDK server; the client's initialize, if it
        was answered here (the server must see it first, under :data:`REPLAYED`)."""
        with self.gate:
            self.ready.set()
            return self.initialize

    def replayed(self, line: str) -> bool:
        """Whether ``line`` (written by the SDK server) answers the replayed initialize; a
        result other than the one the client was told is said on stderr."""
        if REPLAYED not in line:
            return False
        try:
            msg = json.loads(line)
        except ValueError:
            return False
        if msg.get("id") != REPLAYED:
            return False
        if msg.get("result") != self.told:
            print(
                "contemplation mcp: the SDK's initialize answer differs from the one sent "
                f"early ({MANIFEST} is stale: run scripts/mcp_manifest.py)",
                file=sys.stderr,
                flush=True,
            )
        return True

    def refuse_all(self, why: str) -> None:
        """The server could not be made: each request, held or still to come, is answered
        with ``why`` until the client closes the wire."""
        self.hand_over()
        while (line := self.lines.get()) is not None:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict) and "id" in msg and "method" in msg:
                error = {"code": -32603, "message": why}
                self.wire.send(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "error": error}))


class Lines:
    """The SDK transport's stdin: the replayed initialize, then the wire's lines in order."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.pending = front.hand_over()

    def __aiter__(self) -> Lines:
        return self

    async def __anext__(self) -> str:
        import anyio.to_thread

        if self.pending is not None:
            line, self.pending = self.pending, None
            return line
        got = await anyio.to_thread.run_sync(self.front.lines.get, abandon_on_cancel=True)
        if got is None:
            raise StopAsyncIteration
        return got


class Out:
    """The SDK transport's stdout: each message onto the wire, but the answer to the
    replayed initialize."""

    def __init__(self, front: Front) -> None:
        self.front = front

    async def write(self, text: str) -> None:
        import anyio.to_thread

        line = text.rstrip("\n")
        if not self.front.replayed(line):
            await anyio.to_thread.run_sync(self.front.wire.send, line)

    async def flush(self) -> None:
        return None


def serve(load: Callable[[], ContemplationServer]) -> None:
    """Serve MCP on stdio: the wire claimed and read at once, the server made by ``load``
    meanwhile (the settings, the SDK's import), then served over the same wire."""
    wire = Wire.claim()
    front = Front(wire, load_manifest(_sdk_version)).start()
    try:
        server = load()
    except Exception as exc:
        why = f"contemplation mcp cannot start: {exc}"
        print(why, file=sys.stderr, flush=True)
        front.refuse_all(why)
        raise
    import anyio

    from contemplation.faces.mcp.server import serve_stdio

    anyio.run(serve_stdio, server, Lines(front), Out(front))
