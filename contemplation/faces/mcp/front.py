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
REPLAYED: Final = "contemplation-front-replayed"  # the id the server sees the first answered under
VERSION_KEY: Final = "io.modelcontextprotocol/protocolVersion"  # a stateless request's version
LISTEN: Final = "subscriptions/listen"
RESOURCES: Final = "resources/list"
CHANGED: Final = "notifications/resources/list_changed"
ACKNOWLEDGED: Final = "notifications/subscriptions/acknowledged"
SUBSCRIPTION_KEY: Final = "io.modelcontextprotocol/subscriptionId"
#: the listen acknowledged here (Claude Code's: the lists' changes, no resources, no tasks)
LISTENED: Final = {
    "toolsListChanged": True,
    "promptsListChanged": True,
    "resourcesListChanged": True,
}
_NOT_HERE: Final = object()
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


def _era(msg: dict[str, Any]) -> object:
    """The protocol version a stateless request names in its ``_meta`` (None: a session's)."""
    params = msg.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta.get(VERSION_KEY) if isinstance(meta, dict) else None


def _stateless(msg: dict[str, Any]) -> bool:
    """A request of the stateless protocol: it stands alone, so one answered here may
    overtake one the server answers (each answer names its request)."""
    return isinstance(_era(msg), str)


def canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


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
        self.legacy = False  # the client's initialize was answered here
        self.replay: str | None = None  # the first request answered here, for the server
        self.told: object = None  # and the result it was given
        self.acked: dict[object, object] = {}  # subscription id → the acknowledgement sent
        self.listening: list[object] = []  # listens acknowledged here that follow resources
        self.owed = False  # resources/list answered with the server's own resources only
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

    def _answered(self, line: str) -> bool:
        msg = _read(line)
        first, self.first = self.first, False
        if not isinstance(msg, dict) or "id" not in msg:
            if first or not (isinstance(msg, dict) and "method" in msg):
                self.early = None  # the server answers this line: no later answer overtakes it
            return False  # a notification is held, and the answers go on
        if msg.get("method") == LISTEN:
            self._acknowledge(msg)
            return False  # the stream itself is the server's; it is never answered in order
        result = self._result(msg, first)
        if result is _NOT_HERE:
            if not _stateless(msg):  # a session's answers keep their order
                self.early = None
            return False
        if self.replay is None:
            self.replay = json.dumps({**msg, "id": REPLAYED})
            self.told = result
        self.wire.send(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}))
        return True

    def _acknowledge(self, msg: dict[str, Any]) -> None:
        """A listen the manifest knows is acknowledged at once (Claude Code waits for the
        acknowledgement before it lists the tools); the server's own is kept off the wire."""
        assert self.early is not None
        params = msg.get("params")
        era = _era(msg)
        acks = self.early["modern"].get(era, {}).get(LISTEN, {}) if isinstance(era, str) else {}
        ack = acks.get(canonical(params.get("notifications"))) if isinstance(params, dict) else None
        if ack is None:
            return
        self.acked[msg["id"]] = ack
        if isinstance(ack, dict) and ack.get("notifications", {}).get("resourcesListChanged"):
            self.listening.append(msg["id"])
        note = {"_meta": {SUBSCRIPTION_KEY: msg["id"]}, **ack}
        self.wire.send(json.dumps({"jsonrpc": "2.0", "method": ACKNOWLEDGED, "params": note}))

    def _result(self, msg: dict[str, Any], first: bool) -> object:
        """The manifest's answer to ``msg``, or :data:`_NOT_HERE`."""
        assert self.early is not None
        method, params = msg.get("method"), msg.get("params")
        if isinstance(params, dict) and params.get("cursor"):
            return _NOT_HERE  # later pages are the server's
        era = _era(msg)
        if isinstance(era, str):  # the stateless protocol: each request names its version
            table = self.early["modern"].get(era, {})
            if method == RESOURCES:  # the conversations are not read here: the server's own
                if not self.listening:  # resources now, and the client told of the rest
                    return _NOT_HERE  # once the server is loaded (see hand_over)
                self.owed = True
            return table.get(method, _NOT_HERE) if isinstance(method, str) else _NOT_HERE
        if first and _handshake(msg):
            self.legacy = True
            answers = self.early["initialize"]
            return answers.get(msg["params"]["protocolVersion"], answers[UNKNOWN_VERSION])
        if self.legacy and method == "tools/list":
            return self.early["tools/list"]
        if self.legacy and method == "ping":
            return {}
        return _NOT_HERE

    # ------------------------------------------------------------------ the SDK's side

    def hand_over(self) -> str | None:
        """From now on every line goes to the SDK server; the first request answered here
        (the client's initialize or discover), which the server must see first, under
        :data:`REPLAYED`."""
        with self.gate:
            self.ready.set()
            if self.owed:  # the conversations were left out of the early list: list again
                for sid in self.listening:
                    note = {"_meta": {SUBSCRIPTION_KEY: sid}}
                    self.wire.send(
                        json.dumps({"jsonrpc": "2.0", "method": CHANGED, "params": note})
                    )
            return self.replay

    def kept_off(self, line: str) -> bool:
        """Whether ``line`` (written by the SDK server) was said already: the answer to the
        replayed request, or a listen's acknowledgement; one that differs from what the
        client was told is said on stderr."""
        if ACKNOWLEDGED in line and self.acked:
            try:
                note = json.loads(line)["params"]
                sid = note.pop("_meta", {}).get(SUBSCRIPTION_KEY)
            except (ValueError, LookupError, TypeError, AttributeError):
                return False
            if sid not in self.acked:
                return False
            self._compare(note, self.acked.pop(sid))
            return True
        if REPLAYED not in line:
            return False
        try:
            msg = json.loads(line)
        except ValueError:
            return False
        if msg.get("id") != REPLAYED:
            return False
        self._compare(msg.get("result"), self.told)
        return True

    @staticmethod
    def _compare(said: object, told: object) -> None:
        if said != told:
            print(
                "contemplation mcp: the SDK's answer differs from the one sent "
                f"early ({MANIFEST} is stale: run scripts/mcp_manifest.py)",
                file=sys.stderr,
                flush=True,
            )

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
    """The SDK transport's stdin: the replayed request, then the wire's lines in order."""

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
    replayed request."""

    def __init__(self, front: Front) -> None:
        self.front = front

    async def write(self, text: str) -> None:
        import anyio.to_thread

        line = text.rstrip("\n")
        if not self.front.kept_off(line):
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
