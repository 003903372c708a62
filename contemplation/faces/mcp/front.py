"""The stdio MCP server's first second: ``initialize`` and ``tools/list`` answered at once.

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

Nothing is answered early that the SDK might answer otherwise: a line is answered here only
where :mod:`contemplation.faces.mcp.surely` reads it as a request the SDK surely takes as it
is (a string or integer id, ``jsonrpc`` "2.0", parameters of the handshake's or of the
stateless envelope's shape, nothing the SDK's parser might read otherwise) and in the
protocol era the SDK would serve it in (the first request decides, as it does there).
Every other line is held for the server, as it is: one whose id the SDK cannot take (a list,
an object, null, a float, a boolean) is a notification to the SDK and is not answered; a
line that is no message at all is answered by the wire's error
(:mod:`contemplation.faces.mcp.wire`). In a handshake session a line left to the server ends
the early answers (a later one must not overtake its answer); stateless requests name their
own answers, so there the early answers go on. A manifest made for another version of the
SDK or of contemplation leaves every line to the SDK server.
``tests/system/test_mcp_front_fuzz.py`` sends the same lines to this front and to a bare SDK
server and compares the answers.

The lines are split as the SDK's text stdin splits them (at ``\\r``, ``\\r\\n`` or ``\\n``)
and held for the server up to :data:`HELD_BYTES` (the reader then waits and the pipe fills).
A line longer than :data:`LINE_BYTES` is read past in pieces, never whole, and answered
-32600 with the id read from its start (an answer the bare SDK does not give: it
reads any line whole, and a 300 MB line took over 900 MB). The first request answered here is
replayed to the server under a random id no client can name (one that names it anyway
waits until the replay is answered), and only that one answer is kept off the wire.

stdin and stdout are claimed as the SDK's own stdio transport claims them: the protocol goes
through private duplicates, fd 0 reads ``/dev/null`` and fd 1 writes to stderr, so a stray
print or a child's output never corrupts the wire.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import re
import secrets
import sys
import threading
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, Final

from contemplation.faces.mcp import surely
from contemplation.faces.mcp.jsonline import members

if TYPE_CHECKING:
    from contemplation.faces.mcp.server import ContemplationServer

MANIFEST: Final = os.path.join(os.path.dirname(__file__), "manifest.json")
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
#: listens acknowledged here at most (the SDK server refuses those past its limit of open
#: streams, Limits.max_listen_streams, 32; Claude Code opens one)
EARLY_LISTENS: Final = 8
LINE_BYTES: Final = 16 * 1024 * 1024  # the longest line read; a longer one is refused unread
HELD_BYTES: Final = 2 * LINE_BYTES  # characters of lines held for the server (at most their
# bytes: an undecodable byte is one character); past it the reader waits and the pipe fills
_PIECE_BYTES: Final = 1024 * 1024  # a line is read in pieces of this size
_PREFIX_BYTES: Final = 64 * 1024  # of an over-long line, what is read for its id
REPLAY_WAIT: Final = 120.0  # seconds a line naming the replay's id waits for its answer
UNKNOWN_VERSION: Final = "*"  # the manifest's answer for a protocol version it does not name
INVALID_REQUEST: Final = -32600
INTERNAL_ERROR: Final = -32603
LEGACY: Final = "legacy"  # the session opened with the handshake (2025 protocols)
MODERN: Final = "modern"  # the session opened with a stateless request (2026-07-28)
_NEWLINE: Final = re.compile(r"\r\n|\r|\n")


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


def canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _error(rid: object, code: int, message: str) -> str:
    error = {"code": code, "message": message}
    return json.dumps({"jsonrpc": "2.0", "id": rid, "error": error})


def lines_of(text: str) -> list[str]:
    """The lines in ``text`` (read up to a newline) as the SDK's stdio transport reads them:
    its text stdin ends a line at ``\\r``, ``\\r\\n`` or ``\\n`` (universal newlines)."""
    if "\r" not in text:
        return [text]
    parts = _NEWLINE.split(text)
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def too_long(prefix: bytes) -> str | None:
    """The answer to a line longer than :data:`LINE_BYTES` (``prefix``: its first bytes),
    as the SDK's wire answers a line it cannot read (:mod:`contemplation.faces.mcp.wire`):
    the id where one is read before the cut, else null; none where it reads as a response."""
    read = members(prefix.decode("utf-8", "replace"))
    top = read[0] if read is not None else {}
    if "method" not in top and ("result" in top or "error" in top):
        return None
    rid = top.get("id")
    said = (
        f"Invalid Request: the line is longer than {LINE_BYTES} bytes, the most this server reads"
    )
    return _error(rid if surely.request_id(rid) else None, INVALID_REQUEST, said)


class Front:
    """Reads the wire on a thread of its own: answers what :data:`MANIFEST` answers while
    the SDK server loads, and holds every other line for it (at most :data:`HELD_BYTES`)."""

    def __init__(self, wire: Wire, manifest: dict[str, Any] | None) -> None:
        self.wire = wire
        self.early = manifest
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.held = 0  # bytes in self.lines
        self.room = threading.Condition()
        self.ready = threading.Event()  # set once the SDK server reads the lines itself
        self.gate = threading.Lock()  # a line is answered here, or the server is handed over
        self.era: str | None = None  # the protocol era the answers here were given in
        # the id the server sees the first request answered here under: random, never on
        # the wire, and a client line naming it waits until the replay is answered
        self.replay_id = f"contemplation-front-{secrets.token_hex(16)}"
        self.replay: str | None = None  # that request, for the server
        self.replied = threading.Event()  # its answer was kept off the wire
        self.told: object = None  # and the result it was given
        self.acked: dict[str | int, list[object]] = {}  # subscription id → acks sent
        self.listening: list[str | int] = []  # listens acknowledged here that follow resources
        self.owed = False  # resources/list answered with the server's own resources only
        self.reader = threading.Thread(target=self._read, name="mcp-front", daemon=True)

    def start(self) -> Front:
        self.reader.start()
        return self

    # ------------------------------------------------------------------ the wire's side

    def _read(self) -> None:
        while (raw := self._line()) is not None:
            for line in lines_of(raw.decode("utf-8", "replace")):
                with self.gate:
                    early = self.early is not None and not self.ready.is_set()
                    if early and self._answered(line):
                        continue
                self._wait_for_replay(line)
                self._hold(line)
        self.lines.put(None)

    def _line(self) -> bytes | None:
        """The next line read whole (None at the end of the wire); one longer than
        :data:`LINE_BYTES` is read past in pieces, unkept, and answered here."""
        parts: list[bytes] = []
        size = 0
        while part := self.wire.inp.readline(_PIECE_BYTES):
            parts.append(part)
            size += len(part)
            if part.endswith(b"\n"):
                break
            if size > LINE_BYTES:
                prefix = parts[0][:_PREFIX_BYTES]
                parts.clear()
                while (rest := self.wire.inp.readline(_PIECE_BYTES)) and not rest.endswith(b"\n"):
                    pass
                self._refuse_long(prefix)
                size = 0
        return b"".join(parts) if parts else None

    def _refuse_long(self, prefix: bytes) -> None:
        """A line over :data:`LINE_BYTES` (``prefix``: its start) is answered with an error."""
        with self.gate:
            if self.era != MODERN:  # an answer held for the server may come after this one
                self.early = None
        answer = too_long(prefix)
        if answer is not None:
            self.wire.send(answer)

    def _hold(self, line: str) -> None:
        with self.room:
            self.room.wait_for(lambda: self.held == 0 or self.held + len(line) <= HELD_BYTES)
            self.held += len(line)
        self.lines.put(line)

    def taken(self, line: str) -> None:
        """The server read ``line``: it is no longer held."""
        with self.room:
            self.held -= len(line)
            self.room.notify_all()

    def _wait_for_replay(self, line: str) -> None:
        """A client's request under the replay's id (it cannot know it, but may guess) goes
        to the server only once the replay is answered, so the one answer kept off the wire
        is the replay's."""
        if self.replay is None or self.replied.is_set() or self.replay_id not in line:
            return
        read = members(line)
        if read is not None and read[0].get("id") == self.replay_id:
            self.replied.wait(REPLAY_WAIT)

    def _answered(self, line: str) -> bool:
        """Whether ``line`` was answered here; one left to the server ends the early answers
        where an answer here could overtake the server's to it (a session's answers keep
        their order; stateless requests each name their own and need not)."""
        msg = surely.parse(line)
        kind = surely.kind(msg)
        if kind != surely.REQUEST or not isinstance(msg, dict):
            if self.era != MODERN and (kind == surely.OTHER or self.era is None):
                self.early = None  # the server answers this line: no later answer overtakes it
            return False  # a notification is held, and the answers go on
        if self.era is None:
            if msg["method"] != "initialize" and surely.enveloped(msg):
                self.era = MODERN  # as the SDK decides it: by the first request
            elif surely.handshake(msg):
                self.era = LEGACY
        if self.era == MODERN:
            result = self._stateless(msg)
        elif self.era == LEGACY:
            result = self._session(msg)
        else:
            result = _NOT_HERE
        if result is _NOT_HERE:
            if self.era != MODERN:
                self.early = None
            return False
        if self.replay is None:
            self.replay = json.dumps({**msg, "id": self.replay_id})
            self.told = result
        self.wire.send(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}))
        return True

    def _session(self, msg: dict[str, Any]) -> object:
        """The manifest's answer to a request of a handshake session, or :data:`_NOT_HERE`."""
        assert self.early is not None
        method = msg["method"]
        if self.replay is None and surely.handshake(msg):
            answers = self.early["initialize"]
            return answers.get(msg["params"]["protocolVersion"], answers[UNKNOWN_VERSION])
        if self.replay is not None and surely.bare(msg):
            if method == "tools/list":
                return self.early["tools/list"]
            if method == "ping":
                return {}
        return _NOT_HERE

    def _stateless(self, msg: dict[str, Any]) -> object:
        """The manifest's answer to a stateless request, or :data:`_NOT_HERE` (a listen is
        acknowledged here and left to the server: its stream is the server's)."""
        assert self.early is not None
        method, params = msg["method"], msg.get("params")
        if method == LISTEN:
            self._acknowledge(msg)
            return _NOT_HERE
        version = surely.envelope(params)
        if version is None or method == "initialize":
            return _NOT_HERE
        table = self.early["modern"].get(version, {})
        if method == RESOURCES and method in table:  # the conversations are not read here:
            if not self.listening:  # the server's own resources now, and the client told of
                return _NOT_HERE  # the rest once the server is loaded (see hand_over)
            self.owed = True
        return table.get(method, _NOT_HERE)

    def _acknowledge(self, msg: dict[str, Any]) -> None:
        """A listen the manifest knows is acknowledged at once (Claude Code waits for the
        acknowledgement before it lists the tools); the server's own is kept off the wire."""
        assert self.early is not None
        params = msg.get("params")
        version = surely.envelope(params, allowed=frozenset({"notifications"}))
        if version is None or not isinstance(params, dict):
            return
        acks = self.early["modern"].get(version, {}).get(LISTEN, {})
        ack = acks.get(canonical(params.get("notifications")))
        if ack is None or sum(map(len, self.acked.values())) >= EARLY_LISTENS:
            return
        sid: str | int = msg["id"]
        self.acked.setdefault(sid, []).append(ack)
        if isinstance(ack, dict) and ack.get("notifications", {}).get("resourcesListChanged"):
            self.listening.append(sid)
        note = {"_meta": {SUBSCRIPTION_KEY: sid}, **ack}
        self.wire.send(json.dumps({"jsonrpc": "2.0", "method": ACKNOWLEDGED, "params": note}))

    # ------------------------------------------------------------------ the SDK's side

    def hand_over(self) -> str | None:
        """From now on every line goes to the SDK server; the first request answered here
        (the client's initialize or discover), which the server must see first, under
        :attr:`replay_id`."""
        with self.gate:
            self.ready.set()
            if self.owed:  # the conversations were left out of the early list: list again
                for sid in self.listening:
                    note = {"_meta": {SUBSCRIPTION_KEY: sid}}
                    self.wire.send(
                        json.dumps({"jsonrpc": "2.0", "method": CHANGED, "params": note})
                    )
            if self.replay is None:
                self.replied.set()
            return self.replay

    def kept_off(self, line: str) -> bool:
        """Whether ``line`` (written by the SDK server) was said already: the answer to the
        replayed request (once), or a listen's acknowledgement (once for each sent here); one
        that differs from what the client was told is said on stderr."""
        if ACKNOWLEDGED in line and self.acked:
            try:
                note = json.loads(line)["params"]
                sid = note.pop("_meta", {}).get(SUBSCRIPTION_KEY)
            except (ValueError, LookupError, TypeError, AttributeError):
                return False
            sent = self.acked.get(sid) if surely.request_id(sid) else None
            if not sent:
                return False
            self._compare(note, sent.pop(0))
            return True
        if self.replied.is_set() or self.replay_id not in line:
            return False
        try:
            msg = json.loads(line)
        except ValueError:
            return False
        if not isinstance(msg, dict) or msg.get("id") != self.replay_id:
            return False
        self.replied.set()
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
            self.taken(line)
            msg = surely.parse(line)
            if surely.kind(msg) == surely.REQUEST and isinstance(msg, dict):
                self.wire.send(_error(msg["id"], INTERNAL_ERROR, why))
                continue
            read = members(line)
            top = read[0] if read is not None else {}
            if "method" in top and "id" in top:
                rid = top["id"]
                self.wire.send(_error(rid if surely.request_id(rid) else None, INTERNAL_ERROR, why))


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
        self.front.taken(got)
        return got


class Out:
    """The SDK transport's stdout: each message onto the wire, but those said already."""

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
