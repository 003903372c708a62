"""The stdio front answers every line as the bare MCP SDK does (finding: one line wedged it).

The same lines go to ``contemplation mcp`` (the front, then the SDK server behind it) and to
a bare SDK stdio server of the same tools (``mcp_bare_server.py``), two real processes, all
at once at their start: the front reads them long before its SDK is loaded, so each line
meets the front's early answers. The answers must be the same, but for the front's own
documented additions, listed here (:func:`additions`, :data:`ADDED_NOTES`):

- a line the SDK's transport cannot read as a message (not JSON, not an object, a wrong
  ``jsonrpc``, an id that is not a string or an integer on a line without a method, …) is
  dropped by the bare SDK and answered by the wire (:func:`contemplation.faces.mcp.wire.
  refusal`): -32700 or -32600 with the line's id where one can be read;
- ``notifications/resources/list_changed`` to a listen acknowledged early that follows the
  resources' list, when ``resources/list`` was answered early (without the conversations);
- a line over :data:`contemplation.faces.mcp.front.LINE_BYTES` is refused unread
  (tests/system/test_mcp_front.py; too long to send here).

Lines are drawn around what the front answers itself (the handshake, ``ping``,
``tools/list``, the stateless protocol's discover, lists and listen) with every kind of id
and envelope fault, plus lines that are not JSON-RPC at all.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from mcp_types import jsonrpc_message_adapter

from contemplation.faces.mcp.wire import refusal
from contemplation.store.layout import Home
from tests.conftest import base_env
from tests.system.test_mcp_front import CLAUDE_CODE_PROBE

BARE = Path(__file__).with_name("mcp_bare_server.py")
VERSION = "io.modelcontextprotocol/protocolVersion"
INFO = "io.modelcontextprotocol/clientInfo"
CAPS = "io.modelcontextprotocol/clientCapabilities"
LISTENED = {"toolsListChanged": True, "promptsListChanged": True, "resourcesListChanged": True}
ADDED_NOTES = ("notifications/resources/list_changed",)  # the front's own (see above)
WAIT = 90.0  # seconds for all answers (the SDK's import alone takes seconds under load)

# -- the lines --------------------------------------------------------------------------

IDS = st.one_of(
    st.integers(-2, 3),
    st.sampled_from(["a", "", "contemplation-front-replayed", "0", "listen:0"]),
    st.sampled_from([1.0, 1.5, None, True, False, [1], [], {"a": 1}, {}, 2**53 + 1, 2**70]),
)
CAPABILITIES: st.SearchStrategy[Any] = st.sampled_from(
    [
        {},
        {"extensions": {}},
        {"extensions": {"io.modelcontextprotocol/tasks": {}}},
        {"roots": {"listChanged": True}},
        {"roots": {}},
        {"elicitation": {}},
        {"sampling": {}},
        {"experimental": {"x": {}}},
        {"roots": 5},
        {"elicitation": {"form": 1}},
        {"experimental": {"x": 1}},
        {"extensions": []},
        {"tasks": {}},
        {"unknown": 1},
        None,
        [],
    ]
)
CLIENT_INFO = st.sampled_from(
    [
        {"name": "claude-code", "version": "2.1.328"},
        {"name": "c", "version": "1", "title": "C"},
        {"name": "c"},
        {"name": 1, "version": "1"},
        {"name": "c", "version": "1", "icons": 1},
        None,
        "c",
    ]
)
VERSIONS = st.sampled_from(["2026-07-28", "2025-06-18", "1999-01-01", 2026, None])
HANDSHAKE_VERSIONS = st.sampled_from(["2025-06-18", "2024-11-05", "2026-07-28", "1999-01-01", 5])
METHODS = st.sampled_from(
    [
        "initialize",
        "ping",
        "tools/list",
        "server/discover",
        "prompts/list",
        "resources/list",
        "subscriptions/listen",
        "notifications/initialized",
        "no/such",
    ]
)


@st.composite
def meta(draw: st.DrawFn) -> dict[str, Any]:
    got: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        got[VERSION] = draw(VERSIONS) if draw(st.integers(0, 3)) == 0 else "2026-07-28"
    if draw(st.integers(0, 5)):
        got[CAPS] = draw(CAPABILITIES) if draw(st.integers(0, 2)) == 0 else {"extensions": {}}
    if draw(st.integers(0, 2)):
        got[INFO] = (
            draw(CLIENT_INFO) if draw(st.integers(0, 3)) == 0 else {"name": "c", "version": "1"}
        )
    if draw(st.integers(0, 15)) == 0:
        got["progressToken"] = 1
    return got


@st.composite
def params(draw: st.DrawFn, method: str) -> object:
    shape = draw(st.integers(0, 12))
    if shape == 0:
        return draw(st.sampled_from([None, [], 1, "x"]))
    if shape == 1:
        return {}
    if method == "initialize" and shape < 9:
        got: dict[str, Any] = {
            "protocolVersion": draw(HANDSHAKE_VERSIONS),
            "capabilities": draw(CAPABILITIES) if shape < 4 else {},
            "clientInfo": draw(CLIENT_INFO) if shape < 3 else {"name": "c", "version": "1"},
        }
        if shape == 5:
            del got[draw(st.sampled_from(sorted(got)))]
        if shape == 6:
            got["_meta"] = draw(meta())
        return got
    if shape < 4 and method != "subscriptions/listen":
        return draw(st.sampled_from([{"cursor": "x"}, {"cursor": ""}, {"_meta": {}}]))
    got = {"_meta": draw(meta())}
    if method == "subscriptions/listen" or shape == 4:
        got["notifications"] = (
            LISTENED
            if draw(st.integers(0, 3))
            else draw(st.sampled_from([{}, {"toolsListChanged": True}, 1, LISTENED]))
        )
    if shape == 5:
        got["cursor"] = "x"
    return got


@st.composite
def message(draw: st.DrawFn) -> bytes:
    method = draw(METHODS)
    msg: dict[str, Any] = {}
    if draw(st.integers(0, 12)):
        msg["jsonrpc"] = "2.0"
    elif draw(st.booleans()):
        msg["jsonrpc"] = draw(st.sampled_from(["1.0", 2.0, None]))
    if draw(st.integers(0, 6)):
        msg["id"] = draw(IDS) if draw(st.integers(0, 2)) == 0 else draw(st.integers(0, 99))
    if draw(st.integers(0, 15)):
        msg["method"] = method if draw(st.integers(0, 15)) else 7
    if draw(st.integers(0, 8)):
        msg["params"] = draw(params(method))
    if draw(st.integers(0, 20)) == 0:
        msg[draw(st.sampled_from(["result", "error", "extra"]))] = {}
    text = json.dumps(msg)
    if draw(st.integers(0, 25)) == 0:  # a carriage return: the SDK's stdin ends a line there
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + "\r" + text[cut:]
    return text.encode()


RAW = st.sampled_from(
    [
        b"",
        b"   ",
        b"not json",
        b"[]",
        b"1",
        b'"x"',
        b"null",
        b"{}",
        b'{"jsonrpc": "2.0", "id": 1, "method": "ping"',
        b"[" * 300 + b"]" * 300,
        b'{"jsonrpc": "2.0", "id": 7, "method": "ping", "params": {"a": '
        + b"[" * 300
        + b"]" * 300
        + b"}}",
        b'{"jsonrpc": "2.0", "id": 7, "method": "ping", "params": {"a": NaN}}',
        b'{"jsonrpc": "2.0", "id": 7, "method": "ping", "params": {"a": 1e999}}',
        b'{"jsonrpc": "2.0", "id": 7, "id": 8, "method": "ping"}',
        b'{"jsonrpc": "2.0", "id": "\\ud800", "method": "ping"}',
        b'{"jsonrpc": "2.0", "id": "\xff\xfe", "method": "ping"}',
        b'{"jsonrpc": "2.0", "id": 12345678901234567890, "method": "ping"}',
        b'\xef\xbb\xbf{"jsonrpc": "2.0", "id": 9, "method": "ping"}',
        b'{"jsonrpc": "2.0", "result": {}, "id": 3}',
        b'{"jsonrpc": "2.0", "method": "notifications/initialized"}',
    ]
)
LINE = st.one_of(message(), message(), message(), RAW)


def _handshake(version: str = "2025-06-18") -> bytes:
    hello = {
        "protocolVersion": version,
        "capabilities": {},
        "clientInfo": {"name": "c", "version": "1"},
    }
    return json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}).encode()


def _stateless(rid: object, method: str, **more: object) -> bytes:
    envelope = {VERSION: "2026-07-28", CAPS: {}, INFO: {"name": "c", "version": "1"}}
    return json.dumps(
        {"jsonrpc": "2.0", "id": rid, "method": method, "params": {"_meta": envelope, **more}}
    ).encode()


OPENING = st.one_of(
    st.just(_handshake()),
    st.just(_stateless("d", "server/discover")),
    st.just(_stateless("l", "subscriptions/listen", notifications=LISTENED)),
    message(),
)


@st.composite
def sessions(draw: st.DrawFn) -> list[bytes]:
    """An opening (a handshake, a stateless request, or any line), then lines of all kinds;
    what follows a valid opening is answered early where the front can."""
    first = draw(OPENING)
    follow: list[bytes] = []
    if first == _handshake():
        follow = [b'{"jsonrpc": "2.0", "method": "notifications/initialized"}']
    return [first, *follow, *draw(st.lists(LINE, min_size=5, max_size=40))]


# -- the processes ----------------------------------------------------------------------


class Proc:
    def __init__(self, args: list[str], home: Home) -> None:
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=base_env(home, None),
            cwd="/",
        )
        self.out: queue.Queue[bytes] = queue.Queue()
        self.err = b""
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            self.out.put(line)
        self.out.put(b"")

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        self.err = self.proc.stderr.read()

    def send(self, lines: list[bytes]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"".join(line + b"\n" for line in lines))
        self.proc.stdin.flush()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def next(self) -> Any:
        """The next message written, or None at the end."""
        try:
            line = self.out.get(timeout=WAIT)
        except queue.Empty:
            self.proc.kill()
            raise AssertionError(f"nothing written in {WAIT} s") from None
        return json.loads(line) if line else None

    def end(self) -> list[Any]:
        rest = []
        while (msg := self.next()) is not None:
            rest.append(msg)
        assert self.proc.wait(timeout=WAIT) == 0, self.err.decode(errors="replace")
        return rest


def canon(msg: Any) -> str:
    return json.dumps(msg, sort_keys=True)


def additions(lines: list[bytes]) -> list[Any]:
    """The wire's answers to the lines the bare SDK's transport cannot read (it drops them),
    each line split as the SDK's text stdin splits it."""
    added = []
    text = b"\n".join(lines).decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    for line in (piece + "\n" for piece in text.split("\n")):
        try:
            jsonrpc_message_adapter.validate_json(line, by_name=False)
        except Exception as exc:
            answer = refusal(exc)
            if answer is not None:
                added.append(json.loads(answer.model_dump_json(by_alias=True, exclude_unset=True)))
    return added


def _side_by_side(home: Home, lines: list[bytes]) -> None:
    fronted = Proc([sys.executable, "-P", "-m", "contemplation", "mcp"], home)
    bare = Proc([sys.executable, "-P", str(BARE)], home)
    try:
        fronted.send(lines)
        bare.send(lines)
        bare.close()
        said: list[Any] = []
        while (msg := bare.next()) != {"settled": True}:
            assert msg is not None, f"the bare server did not settle: {bare.err!r}"
            said.append(msg)
        expected = Counter(canon(m) for m in [*said, *additions(lines)])
        got: Counter[str] = Counter()
        notes: list[Any] = []
        while got != expected:  # until the front's answers are all in (or differ: a timeout)
            msg = fronted.next()
            assert msg is not None, (got, expected, fronted.err)
            if msg.get("method") in ADDED_NOTES:
                notes.append(msg)
                continue
            got[canon(msg)] += 1
            assert not (got - expected), (
                f"the front said what the SDK did not: {got - expected}\nlines: {lines}"
            )
        fronted.close()
        at_end = bare.end()  # it ended while the front's answers were read: not waited for first
        for msg in fronted.end():
            if msg.get("method") in ADDED_NOTES:
                notes.append(msg)
            else:
                got[canon(msg)] += 1
        assert got == expected + Counter(canon(m) for m in at_end), lines
    finally:
        for p in (fronted, bare):
            if p.proc.poll() is None:
                p.proc.kill()
    acked = {
        canon(m["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"])
        for m in said
        if m.get("method") == "notifications/subscriptions/acknowledged"
    }
    for note in notes:  # the addition goes to a listen the SDK acknowledged, and to no other
        assert canon(note["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"]) in acked


FUZZ = settings(
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each example is two processes
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# The default tier: the explicit regressions below and one generated session (each example
# is two processes, ~4 s); --slow adds three more generated sessions (the test after), the
# four the fuzz was written with.
@settings(FUZZ, max_examples=1)
@given(lines=sessions())
@example(  # the wedge: a listen whose id is a list, before the SDK is loaded
    lines=[
        json.dumps(
            {
                "jsonrpc": "2.0",
                "id": [1],
                "method": "subscriptions/listen",
                "params": {"_meta": {VERSION: "2026-07-28", CAPS: {}}, "notifications": LISTENED},
            }
        ).encode(),
        _stateless("after", "server/discover"),
    ]
)
@example(  # a discover the SDK refuses (no client capabilities), and one it takes
    lines=[
        json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "server/discover",
                "params": {"_meta": {VERSION: "2026-07-28"}},
            }
        ).encode(),
        _stateless(2, "server/discover"),
        _stateless(3, "tools/list"),
    ]
)
@example(  # the real Claude Code's first line (2.1.328): answered early, as the SDK answers it
    lines=[json.dumps(CLAUDE_CODE_PROBE).encode(), _stateless(2, "tools/list")]
)
@example(  # the old private id of the replayed handshake, used by the client
    lines=[
        _handshake(),
        b'{"jsonrpc": "2.0", "method": "notifications/initialized"}',
        b'{"jsonrpc": "2.0", "id": "contemplation-front-replayed", "method": "resources/list"}',
    ]
)
@example(  # an id the SDK's parser refuses (a lone surrogate): its error killed the writer
    lines=[
        _handshake(),
        b'{"jsonrpc": "2.0", "id": "\\ud800", "method": "ping"}',
        b'{"jsonrpc": "2.0", "id": 5, "method": "resources/list"}',
    ]
)
def test_the_front_answers_every_line_as_the_bare_sdk_does(home: Home, lines: list[bytes]) -> None:
    _side_by_side(home, lines)


@pytest.mark.slow
@settings(FUZZ, max_examples=3, phases=[Phase.generate])
@given(lines=sessions())
def test_the_front_answers_more_generated_lines_as_the_bare_sdk_does(
    home: Home, lines: list[bytes]
) -> None:
    """Under --slow: three generated sessions more than the default tier's one."""
    _side_by_side(home, lines)
