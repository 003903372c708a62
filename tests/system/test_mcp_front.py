"""The stdio MCP server lists its tools at once.

Claude Code sends its first model request 1.6 to 2 s after it spawns its MCP servers, with
the tools listed by then; ``contemplation mcp`` answered ``initialize`` only once the MCP SDK
was imported (0.7 to 1.2 s alone on this 2-core machine), so its tools were missing from the
first request. :mod:`contemplation.faces.mcp.front` answers ``initialize`` and ``tools/list``
from the SDK server's own answers, captured in ``manifest.json``, and hands the session to
the server once it is loaded.
"""

from __future__ import annotations

import json
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from contemplation.faces.mcp import front
from contemplation.faces.mcp.manifest import capture
from contemplation.store.layout import Home
from tests.conftest import base_env

HELLO = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


class Server:
    """``python -P -m contemplation mcp``, spawned as Claude Code spawns it."""

    def __init__(self, home: Home, **env: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "contemplation", "mcp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=base_env(home, None, **env),
            cwd="/",
        )
        self.out: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            self.out.put(line)
        self.out.put(b"")

    def send(self, *messages: dict[str, Any] | str) -> None:
        assert self.proc.stdin is not None
        for m in messages:
            self.proc.stdin.write((m if isinstance(m, str) else json.dumps(m)).encode() + b"\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float = 60) -> dict[str, Any]:
        try:
            line = self.out.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no answer in {timeout} s: {self.stderr()}") from None
        assert line, f"the server closed its stdout: {self.stderr()}"
        got: dict[str, Any] = json.loads(line)
        return got

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=60)

    def stderr(self) -> str:
        if self.proc.poll() is None:
            self.proc.kill()
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace")


def test_the_early_answers_are_the_sdk_servers_own() -> None:
    """The manifest is what the SDK server answers now, for every protocol version a client
    may ask for: a changed tool or instruction fails here until the manifest is written
    again (``scripts/mcp_manifest.py``)."""
    on_disk = json.loads(Path(front.MANIFEST).read_text(encoding="utf-8"))
    assert on_disk == capture(), "manifest.json is stale: run scripts/mcp_manifest.py"
    assert front.load_manifest(lambda: on_disk["mcp"]) == on_disk


def test_a_manifest_of_another_sdk_answers_nothing() -> None:
    assert front.load_manifest(lambda: "0.0.1") is None


def _seconds_to_tools(home: Home) -> float:
    started = time.perf_counter()
    server = Server(home)
    try:
        server.send(HELLO, INITIALIZED, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert server.answer()["id"] == 1
        tools = server.answer()
        took = time.perf_counter() - started
        assert tools["id"] == 2 and len(tools["result"]["tools"]) >= 10
    finally:
        assert server.close() == 0, server.stderr()
    return took


def _seconds_to_import_the_sdk() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-P", "-c", "import mcp.server.mcpserver"], check=True, cwd="/")
    return time.perf_counter() - started


def test_the_tools_are_listed_before_the_sdk_could_be_imported(home: Home) -> None:
    """Before: the tools came after the SDK's import (and the settings', and the server's
    making): more than the import alone. Now a fraction of it, measured side by side so
    that the machine's load moves both."""
    ratios = [_seconds_to_tools(home) / _seconds_to_import_the_sdk() for _ in range(3)]
    assert statistics.median(ratios) < 0.5, ratios


#: the first line the real Claude Code (2.1.328) sends an MCP server, captured with a server
#: that only logs its stdin: its client info and elicitation modes are what the SDK takes
CLAUDE_CODE_PROBE = {
    "jsonrpc": "2.0",
    "id": "server-discover-probe-1",
    "method": "server/discover",
    "params": {
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {
                "name": "claude-code",
                "title": "Claude Code",
                "version": "2.1.328",
                "description": "Anthropic's agentic coding tool",
                "websiteUrl": "https://claude.com/claude-code",
            },
            "io.modelcontextprotocol/clientCapabilities": {
                "roots": {"listChanged": True},
                "elicitation": {"form": {}, "url": {}},
            },
        }
    },
}


def test_claude_codes_probe_is_answered_before_the_sdk_could_be_imported(home: Home) -> None:
    """``claude -p`` waits about 2 s for its servers: the front answers its probe itself. A
    stricter reading of client info (no description or website) and elicitation (``{}``
    only) left the real probe to the SDK, and ``claude -p``'s first request went out
    without the tools (test_claude_code_first_request)."""

    def seconds() -> float:
        started = time.perf_counter()
        server = Server(home)
        try:
            server.send(CLAUDE_CODE_PROBE)
            got = server.answer()
            took = time.perf_counter() - started
            assert got["id"] == CLAUDE_CODE_PROBE["id"] and "result" in got, got
        finally:
            server.close()
        return took

    ratios = [seconds() / _seconds_to_import_the_sdk() for _ in range(3)]
    assert statistics.median(ratios) < 0.5, ratios


def test_the_session_goes_on_with_the_sdk_server_after_the_hand_over(home: Home) -> None:
    """Requests sent at once, before the server is loaded, are held and answered in order;
    the server's own answer to the client's initialize never reaches the wire."""
    server = Server(home)
    try:
        server.send(
            HELLO,
            INITIALIZED,
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            {"jsonrpc": "2.0", "id": 3, "method": "ping"},
            {
                "jsonrpc": "2.0",
                "id": 4,
                "method": "tools/call",
                "params": {"name": "conversation_start", "arguments": {"topic": "held"}},
            },
            {"jsonrpc": "2.0", "id": 5, "method": "resources/list"},
            {"jsonrpc": "2.0", "id": 6, "method": "tools/list"},
        )
        answers = [server.answer() for _ in range(6)]
    finally:
        assert server.close() == 0, server.stderr()
    assert [a["id"] for a in answers[:3]] == [1, 2, 3]  # the server may answer 4-6 in any order
    answers.sort(key=lambda a: int(a["id"]))
    assert [a["id"] for a in answers] == [1, 2, 3, 4, 5, 6]
    assert answers[0]["result"]["serverInfo"]["name"] == "contemplation"
    assert answers[0]["result"]["protocolVersion"] == "2025-06-18"
    started = json.loads(answers[3]["result"]["content"][0]["text"])
    assert "resources" in answers[4]["result"]
    assert answers[5]["result"] == answers[1]["result"]  # the server's list is the early one
    assert [p.name for p in (home.root / "active").iterdir()] == [started["conversation_id"]]


def test_what_the_manifest_does_not_answer_is_left_to_the_server(home: Home) -> None:
    """A first message that is not a handshake, or an initialize of another shape, is the
    SDK server's to answer (or refuse), as before."""
    server = Server(home)
    try:
        server.send({"jsonrpc": "2.0", "id": 7, "method": "ping"})
        first = server.answer()
    finally:
        server.close()
    assert first["id"] == 7
    server = Server(home)
    try:
        odd = {**HELLO, "params": {"protocolVersion": "2025-06-18", "capabilities": {}}}
        server.send(odd)
        refused = server.answer()
    finally:
        server.close()
    assert refused["id"] == 1 and "error" in refused, refused


def test_a_server_that_cannot_start_says_why_to_every_request(home: Home) -> None:
    """A config the settings refuse: the handshake was answered before it was read, so each
    request after it gets an error naming the cause, and the exit is not 0."""
    config = home.root.parent / "bad.toml"
    config.write_text("[unclosed\n")
    server = Server(home, CONTEMPLATION_CONFIG=str(config))
    try:
        server.send(
            HELLO,
            INITIALIZED,
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "tools/call",
                "params": {"name": "conversation_list", "arguments": {}},
            },
        )
        answers = [server.answer() for _ in range(3)]
    finally:
        code = server.close()
    assert [a["id"] for a in answers] == [1, 2, 3]
    assert "cannot start" in answers[2]["error"]["message"]
    assert "cannot parse" in answers[2]["error"]["message"]
    assert code != 0


META = {
    "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "claude-code", "version": "2.1.328"},
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {}},
    }
}


def test_the_stateless_protocol_is_answered_at_once_and_the_conversations_follow(
    home: Home,
) -> None:
    """Claude Code 2.1.328 speaks 2026-07-28 first: ``server/discover``, a listen whose
    acknowledgement it waits for, then the lists. All are answered at once (resources/list
    with the server's own resources, none); once the server is loaded, the listen is told
    the resources changed, and the list it then asks for holds the conversations."""
    from contemplation import settings as settings_mod
    from contemplation.faces import actions

    settings = settings_mod.load(home=home.root, env={}, config=None)
    conv = actions.create(settings, "already here")
    server = Server(home)
    notifications = {
        "toolsListChanged": True,
        "promptsListChanged": True,
        "resourcesListChanged": True,
    }
    try:
        server.send(
            {"jsonrpc": "2.0", "id": "probe", "method": "server/discover", "params": META},
            {
                "jsonrpc": "2.0",
                "id": "listen:0",
                "method": "subscriptions/listen",
                "params": {**META, "notifications": notifications},
            },
            *(
                {"jsonrpc": "2.0", "id": n, "method": m, "params": META}
                for n, m in enumerate(
                    ("server/discover", "prompts/list", "resources/list", "tools/list")
                )
            ),
        )
        early = [server.answer() for _ in range(6)]
        changed = server.answer()
        server.send({"jsonrpc": "2.0", "id": 9, "method": "resources/list", "params": META})
        later = server.answer()
    finally:
        assert server.close() == 0, server.stderr()
    methods = [a.get("method") for a in early]
    assert methods.count("notifications/subscriptions/acknowledged") == 1
    answered = {a["id"]: a["result"] for a in early if "id" in a}
    assert set(answered) == {"probe", 0, 1, 2, 3}
    assert answered["probe"]["capabilities"]["tools"] == {"listChanged": True}
    assert len(answered[3]["tools"]) >= 10 and answered[2]["resources"] == []
    assert changed["method"] == "notifications/resources/list_changed"
    assert changed["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "listen:0"
    assert later["id"] == 9 and conv.dir.name in json.dumps(later["result"])


NOTIFICATIONS = {
    "toolsListChanged": True,
    "promptsListChanged": True,
    "resourcesListChanged": True,
}


def test_a_listen_whose_id_is_a_list_or_an_object_wedges_nothing(home: Home) -> None:
    """A listen whose id is a list or an object, sent before the SDK is loaded: the SDK reads
    it as a notification (its envelope ignores the id it cannot take), so it is not answered,
    and the requests after it are. Before: the front's reader thread died on the unhashable
    id and the process never answered again."""
    for bad in ([1], {"a": 1}):
        server = Server(home)
        try:
            server.send(
                {
                    "jsonrpc": "2.0",
                    "id": bad,
                    "method": "subscriptions/listen",
                    "params": {**META, "notifications": NOTIFICATIONS},
                },
                {"jsonrpc": "2.0", "id": "after", "method": "server/discover", "params": META},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": META},
            )
            answers = [server.answer(), server.answer()]
        finally:
            assert server.close() == 0, server.stderr()
        assert sorted(json.dumps(a["id"]) for a in answers) == ['"after"', "2"], answers
        assert all("result" in a for a in answers), answers


def _peak_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmHWM")


def test_a_line_too_long_is_refused_unread_and_serving_goes_on(home: Home) -> None:
    """A line longer than LINE_BYTES is answered -32600 (with its id, read from its start)
    and read past in pieces: the process's peak memory grows by a fraction of the line.
    Before: the line was read whole, then decoded, then parsed (one 300 MB line: 934 MB
    RSS), and held lines were bounded by count, not bytes."""
    server = Server(home)
    try:
        server.send(HELLO, INITIALIZED, {"jsonrpc": "2.0", "id": 2, "method": "resources/list"})
        assert [server.answer()["id"], server.answer()["id"]] == [1, 2]  # the SDK is loaded
        before = _peak_mib(server.proc.pid)
        size = 4 * front.LINE_BYTES
        head = b'{"jsonrpc": "2.0", "id": 3, "method": "ping", "params": {"x": "'
        assert server.proc.stdin is not None
        server.proc.stdin.write(head + b"a" * size + b'"}}\n')
        server.send({"jsonrpc": "2.0", "id": 4, "method": "ping"})
        refused, after = server.answer(), server.answer()
        grew = _peak_mib(server.proc.pid) - before
    finally:
        assert server.close() == 0, server.stderr()
    assert refused["id"] == 3 and refused["error"]["code"] == -32600, refused
    assert str(front.LINE_BYTES) in refused["error"]["message"]
    assert after == {"jsonrpc": "2.0", "id": 4, "result": {}}
    assert grew < 2 * front.LINE_BYTES // 2**20, f"peak RSS grew by {grew} MiB"


def test_a_client_id_like_the_replays_is_answered(home: Home) -> None:
    """The handshake answered early is given to the SDK server again under a private id,
    its answer kept off the wire. That id was a fixed string: a client request under it was
    never answered. Now it is random, never on the wire, and only the replay's one answer is
    kept off."""
    server = Server(home)
    try:
        server.send(
            HELLO,
            INITIALIZED,
            {"jsonrpc": "2.0", "id": "contemplation-front-replayed", "method": "resources/list"},
            {"jsonrpc": "2.0", "id": 5, "method": "resources/list"},
        )
        answers = [server.answer() for _ in range(3)]
    finally:
        assert server.close() == 0, server.stderr()
    assert sorted(json.dumps(a["id"]) for a in answers) == sorted(
        ["1", '"contemplation-front-replayed"', "5"]
    )
    assert all("result" in a for a in answers), answers


def test_the_listens_acknowledged_early_are_fewer_than_the_server_takes() -> None:
    from contemplation.faces.mcp.calls import Limits

    assert Limits().max_listen_streams >= front.EARLY_LISTENS
