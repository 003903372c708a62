"""A scripted Anthropic Messages server: what "Claude" says, turn by turn, to the real Claude
Code (``ANTHROPIC_BASE_URL``). Each ``POST /v1/messages`` takes the next scripted turn and
streams it as the documented SSE events (``message_start``, ``content_block_start`` /
``_delta`` / ``_stop``, ``message_delta`` with the stop reason, ``message_stop``); a turn is a
``tool_use`` of one tool with its input, or text that ends the turn. As a real model, it calls
only a tool its request lists: a request without the scripted tool gets a call of Claude
Code's ``WaitForMcpServers`` where it is offered (what its description asks of the model
when a server's tools are not listed yet), else words (``unlisted`` says which), and the
scripted call waits for a request that lists it. Every request body is
kept, so a test asserts on what Claude Code sent back (the ``tool_result`` of each call).
Requests that are not the agent's main loop (a title, a summary: no tools in the body) get a
short text and take no turn."""

from __future__ import annotations

import itertools
import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from tests.fakes.http import JsonHandler

#: Claude Code's tool for MCP servers still connecting (offered while one is)
WAIT_FOR_SERVERS = "WaitForMcpServers"


@dataclass(frozen=True)
class Turn:
    """One answer of "Claude": call ``tool`` with ``input``, else say ``text`` and stop.
    ``then``: the input made from the text of the last ``tool_result`` (a call that names
    what an earlier call returned, such as a conversation id)."""

    text: str = ""
    tool: str = ""
    input: dict[str, Any] = field(default_factory=dict)
    then: Callable[[str], dict[str, Any]] | None = None


class FakeAnthropic:
    def __init__(self, *turns: Turn) -> None:
        self.script: deque[Turn] = deque(turns)
        self.requests: list[dict[str, Any]] = []  # main-loop requests (with tools), in order
        self.unlisted: list[str] = []  # tools the script would have called but were not listed
        self.lock = threading.Lock()
        self.ids = itertools.count(1)
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> FakeAnthropic:
        threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def next_turn(self, body: dict[str, Any]) -> Turn:
        with self.lock:
            if not body.get("tools"):
                return Turn(text="ok")
            if self.script and self.script[0].then is not None and not _results(body):
                return Turn(text="ok")  # a side request: the next call needs a tool's result
            self.requests.append(body)
            head = self.script[0] if self.script else None
            if head is not None and head.tool and head.tool not in (listed := _listed(body)):
                # a model calls only the tools its request lists: the turn waits for a
                # request that lists it; meanwhile it waits for the servers still
                # connecting where Claude Code offers that, else answers with words
                self.unlisted.append(head.tool)
                if WAIT_FOR_SERVERS in listed:
                    return Turn(tool=WAIT_FOR_SERVERS)
                return Turn(text=f"I have no tool named {head.tool}.")
            turn = self.script.popleft() if self.script else Turn(text="Done.")
        if turn.then is not None:
            last = _results(body)
            text = _text(last[-1]["content"]) if last else ""
            turn = Turn(tool=turn.tool, input=turn.then(text))
        return turn

    def _uses(self) -> list[dict[str, Any]]:
        """The scripted ``tool_use`` blocks of the whole history (the last request holds
        it), less this fake's own waits for the servers."""
        with self.lock:
            last = self.requests[-1] if self.requests else {}
        return [
            b
            for m in last.get("messages", [])
            if isinstance(m.get("content"), list)
            for b in m["content"]
            if b.get("type") == "tool_use" and b.get("name") != WAIT_FOR_SERVERS
        ]

    def tool_results(self) -> list[dict[str, Any]]:
        """Every ``tool_result`` block Claude Code sent for a scripted call, in order."""
        ids = {b.get("id") for b in self._uses()}
        with self.lock:
            last = self.requests[-1] if self.requests else {}
        return [r for r in _results(last) if r.get("tool_use_id") in ids]

    def tool_uses(self) -> list[str]:
        return [str(b["name"]) for b in self._uses()]


def _listed(body: dict[str, Any]) -> set[str]:
    return {str(t.get("name")) for t in body.get("tools", []) if isinstance(t, dict)}


def _text(content: Any) -> str:
    """A tool_result's content as text (a string, or text blocks)."""
    if isinstance(content, str):
        return content
    return "".join(str(c.get("text", "")) for c in content if isinstance(c, dict))


def _results(body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for msg in body.get("messages", []):
        content = msg.get("content")
        if isinstance(content, list):
            out.extend(b for b in content if b.get("type") == "tool_result")
    return out


class _Handler(JsonHandler):
    server_fake: FakeAnthropic

    def _event(self, name: str, data: dict[str, Any]) -> None:
        self._write_chunk(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path.startswith("/v1/messages/count_tokens"):
            self._json(200, {"input_tokens": 100})
            return
        if not self.path.startswith("/v1/messages"):
            self._json(404, {"type": "error", "error": {"type": "not_found_error"}})
            return
        fake = self.server_fake
        turn = fake.next_turn(body)
        n = next(fake.ids)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        usage = {"input_tokens": 100, "output_tokens": 1}
        self._event(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": f"msg_{n:04d}",
                    "type": "message",
                    "role": "assistant",
                    "model": body.get("model", "claude"),
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": usage,
                },
            },
        )
        if turn.tool:
            block = {"type": "tool_use", "id": f"toolu_{n:04d}", "name": turn.tool, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(turn.input)}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": turn.text}
            stop = "end_turn"
        self._event(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        )
        self._event(
            "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
        )
        self._event("content_block_stop", {"type": "content_block_stop", "index": 0})
        self._event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 10},
            },
        )
        self._event("message_stop", {"type": "message_stop"})
        self._end_chunks()
