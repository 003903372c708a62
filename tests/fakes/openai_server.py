"""A scripted OpenAI-compatible server: a real HTTP server on loopback speaking SSE.

It exists for what real servers cannot be made to do on demand: reasoning in either field,
``<think>`` tags split anywhere, tool-call fragments, an error event mid-stream, a 400 context
overflow, a 429 with Retry-After, a stream cut before ``[DONE]``, a stall with pings. Shapes
follow llama.cpp's server and llama-cpp-python (``data:`` events, ``: ping`` comments,
``data: [DONE]``; errors as ``{"error": {"message", "type", "code", ...}}``).

Each ``POST /v1/chat/completions`` takes the next :class:`Step` (or the default step).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from tests.fakes.http import JsonHandler

AUTO_USAGE: dict[str, Any] = {}  # (by identity) Step.usage counted from the request


@dataclass
class Step:
    """What the server does for one chat call.

    kind: reply | error | mid_error | cut | empty | hang
    """

    kind: str = "reply"
    pieces: list[str] | None = None  # content deltas (default: "Echo: <last user message>")
    reasoning: list[str] = field(default_factory=list)
    reasoning_field: str = "reasoning_content"  # or "reasoning" (Ollama /v1)
    tool_fragments: list[dict[str, Any]] = field(default_factory=list)  # delta.tool_calls items
    finish_reason: str | None = "stop"
    send_done: bool = True
    # the default: counted from the request as a server would (a quarter token a character,
    # 4 a message) and the reply's pieces; a fixed small count would look like a cut prompt
    usage: dict[str, Any] | None = field(default_factory=lambda: AUTO_USAGE)
    timings: dict[str, Any] | None = None
    pings: int = 0  # ": ping" comment lines before each event
    blank_lines: bool = True  # False: events not separated by blank lines
    status: int = 500
    body: dict[str, Any] | None = None  # the error body for kind "error"
    headers: dict[str, str] = field(default_factory=dict)
    error: dict[str, Any] = field(
        default_factory=lambda: {"message": "model crashed", "type": "server_error", "code": 500}
    )
    after: int = 1  # content deltas sent before mid_error / cut / hang
    hang_seconds: float = 60.0
    hang_pings_every: float = 0.0  # keep sending ": ping" while hanging
    delay: float = 0.0  # seconds before each content delta (a reply that takes time)


class FakeOpenAI:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.script: deque[Step] = deque()
        self.default_step = Step()
        self.requests: list[dict[str, Any]] = []
        self.models: list[dict[str, Any]] = [{"id": "fake-model", "object": "model"}]
        self.props: dict[str, Any] | None = None  # GET /props (llama-server's shape) when set
        self.active = 0  # chat calls streaming now
        self.max_active = 0
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> FakeOpenAI:
        threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True).start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def enqueue(self, *steps: Step) -> None:
        with self.lock:
            self.script.extend(steps)

    def reset(self) -> None:
        with self.lock:
            self.script.clear()
            self.requests.clear()
            self.default_step = Step()

    def next_step(self) -> Step:
        with self.lock:
            return self.script.popleft() if self.script else self.default_step

    def chat_requests(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if r["_path"].endswith("/chat/completions")]


class _Handler(JsonHandler):
    server_fake: FakeOpenAI

    def do_GET(self) -> None:
        fake = self.server_fake
        with fake.lock:
            fake.requests.append({"_path": self.path, "_headers": dict(self.headers)})
        if self.path in {"/v1/models", "/models"}:
            self._json(200, {"object": "list", "data": fake.models})
        elif self.path == "/props" and fake.props is not None:
            self._json(200, fake.props)
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        fake = self.server_fake
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"{}")
        with fake.lock:
            fake.requests.append({**body, "_path": self.path, "_headers": dict(self.headers)})
        if self.path != "/v1/chat/completions":
            self._json(404, {"detail": "Not Found"})
            return
        step = fake.next_step()
        if step.kind == "error":
            self._json(step.status, step.body or {"error": step.error}, step.headers)
            return
        if not body.get("stream"):
            self._json(200, _completion(body, step))
            return
        with fake.lock:
            fake.active += 1
            fake.max_active = max(fake.max_active, fake.active)
        try:
            self._stream(body, step)
        except (BrokenPipeError, ConnectionResetError):
            return
        finally:
            with fake.lock:
                fake.active -= 1

    def _stream(self, body: dict[str, Any], step: Step) -> None:
        fake = self.server_fake
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if step.kind == "empty":  # llama-cpp-python after a failure inside its generator
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            self.close_connection = True
            return
        sep = b"\n\n" if step.blank_lines else b"\n"

        def event(obj: Any) -> None:
            for _ in range(step.pings):
                self._write_chunk(b": ping - 2026-11-21 00:00:00\n\n")
            data = obj if isinstance(obj, str) else json.dumps(obj)
            self._write_chunk(b"data: " + data.encode() + sep)

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> None:
            event(
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": body.get("model"),
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                    **extra,
                }
            )

        chunk({"role": "assistant", "content": None})
        for r in step.reasoning:
            chunk({step.reasoning_field: r})
        pieces = step.pieces if step.pieces is not None else _echo(body)
        for i, piece in enumerate(pieces):
            if step.kind in {"mid_error", "cut", "hang"} and i >= step.after:
                break
            if step.delay and fake.stop_event.wait(step.delay):
                return
            chunk({"content": piece})
        if step.kind == "mid_error":
            event({"error": step.error})
            self._write_chunk(b"")  # the terminating chunk: a clean EOF, no [DONE]
            return
        if step.kind == "cut":
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if step.kind == "hang":
            deadline = time.monotonic() + step.hang_seconds
            while time.monotonic() < deadline:
                wait = step.hang_pings_every or step.hang_seconds
                if fake.stop_event.wait(wait):
                    return
                if step.hang_pings_every:
                    self._write_chunk(b": ping - 2026-11-21 00:00:00\n\n")
            return
        for frag in step.tool_fragments:
            chunk({"tool_calls": [frag]})
        if step.finish_reason is not None:
            extra = {"timings": step.timings} if step.timings else {}
            chunk({}, step.finish_reason, **extra)
        include_usage = (body.get("stream_options") or {}).get("include_usage")
        if include_usage and step.usage is not None:
            event(
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "model": body.get("model"),
                    "choices": [],
                    "usage": _usage(body, step),
                }
            )
        if step.send_done:
            event("[DONE]")
        self._write_chunk(b"")


def _usage(body: dict[str, Any], step: Step) -> dict[str, Any] | None:
    if step.usage is not AUTO_USAGE:
        return step.usage
    messages = body.get("messages") or []
    chars = sum(len(json.dumps(m.get("content", ""))) for m in messages)
    prompt = chars // 4 + 4 * len(messages)
    done = len(step.pieces if step.pieces is not None else _echo(body))
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}


def _echo(body: dict[str, Any]) -> list[str]:
    messages = body.get("messages") or []
    last = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")
    if isinstance(last, list):  # content parts: the text ones
        last = "".join(p.get("text", "") for p in last if p.get("type") == "text")
    return ["Echo", ": ", str(last)[:60]]


def _completion(body: dict[str, Any], step: Step) -> dict[str, Any]:
    pieces = step.pieces if step.pieces is not None else _echo(body)
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": body.get("model"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(pieces)},
                "finish_reason": "stop",
            }
        ],
        "usage": _usage(body, step),
    }
