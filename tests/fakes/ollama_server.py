"""A scripted fake Ollama server: a real HTTP server on loopback speaking Ollama's wire format.

It exists for behaviour a real Ollama cannot be made to show on demand (mid-stream errors,
cuts, stalls, 503 storms, exact tool-call chunks). Shapes follow Ollama's docs/api.md and
server/routes.go: NDJSON lines, chunked transfer, a final ``done`` line with metrics in ns,
errors as ``{"error": "..."}`` with the documented statuses and texts.

Use in-process (``FakeOllama().start()``) or as a process::

    python -m tests.fakes.ollama_server --port 0 --print-port

and script it over HTTP: ``POST /_script`` with a JSON list of steps, ``GET /_requests``.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer
from typing import Any

from tests.fakes.http import JsonHandler


@dataclass
class Step:
    """What the server does for one /api/chat call.

    kind: reply | error | mid_error | cut_chunked | cut_close | hang | garbage | no_done |
    endless_line (``endless_bytes`` of a JSON string that never ends, in 64 KB chunks)
    """

    kind: str = "reply"
    text: str = ""  # reply text (default: an echo of the last user message)
    thinking: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    chunks: int = 0  # split the text into this many pieces (0: by words)
    first_byte_delay: float = 0.0  # before the response headers (like a cold model load)
    chunk_delay: float = 0.0
    status: int = 500
    error: str = "an error was encountered while running the model"
    retry_after: str | None = None
    after_chunks: int = 1  # for mid_error / cut_* / hang: content chunks sent first
    prompt_eval_count: int | None = None
    # of those, read from the cache: sent only when set, as Ollama since #17943 (2026-08-22,
    # api.Metrics ``PromptEvalCachedCount *int `json:"prompt_eval_cached_count,omitempty"```)
    prompt_eval_cached_count: int | None = None
    hang_seconds: float = 3600.0
    model: str | None = None  # only for calls to this model (None: any)
    endless_bytes: int = 0
    done_reason: str = "stop"  # "length": the reply ran out of num_predict tokens
    no_content: bool = False  # no answer text at all (say, thinking that used every token)
    eval_count: int | None = None  # default: one per piece of text

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Step:
        return cls(**data)


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


# models that cannot chat, as /api/show lists them: no "completion" (an embedding model;
# "decision", as Ollama 0.35 lists such models)
NOT_CHAT: dict[str, dict[str, Any]] = {
    "nomic-embed-text": {"capabilities": ["embedding"], "arch": "nomic-bert", "ctx": 2048},
    "judge": {"capabilities": ["decision"], "arch": "qwen3", "ctx": 8192},
}


class FakeOllama:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.script: deque[Step] = deque()
        self.requests: list[dict[str, Any]] = []
        self.request_times: list[float] = []
        self.gets: list[str] = []  # the paths of GET requests (health and model lists)
        self.aborted = 0  # streams the client closed before their end
        # the window, as Ollama keeps it: a prompt over num_ctx is cut silently (counted after
        # the cut: num_ctx/2 + 2, ollama #17427) unless the request says "truncate": false,
        # which gets HTTP 400 exceed_context_size_error instead (ollama #16712, #16800)
        self.tokens_per_char = 0.25  # the fake's tokenizer: tokens a character of content
        self.digit_tokens = False  # True: a digit is a token of its own
        self.truncated = 0  # prompts cut silently
        self.honours_truncate = True  # False: an older Ollama that ignores "truncate": false
        self.caps_num_ctx = False  # True: a num_ctx over the model's trained context is lowered
        self.refused: list[int] = []  # the token counts of the prompts refused (bounded)
        self.models: dict[str, dict[str, Any]] = {
            "llama3.2": {"capabilities": ["completion", "tools"], "arch": "llama", "ctx": 131072},
            "qwen3": {
                "capabilities": ["completion", "tools", "thinking"],
                "arch": "qwen3",
                "ctx": 40960,
            },
            "gemma": {"capabilities": ["completion"], "arch": "gemma", "ctx": 8192},
        }  # a test adds NOT_CHAT's models where it wants them listed
        self.default_step = Step()
        self.lock = threading.Lock()
        self.active = 0
        self.max_active = 0
        self.stop_event = threading.Event()
        self.chat_arrived = threading.Event()  # set when a /api/chat request has been read
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeOllama:
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def enqueue(self, *steps: Step) -> None:
        with self.lock:
            self.script.extend(steps)

    def next_step(self, model: str) -> Step:
        with self.lock:
            for i, step in enumerate(self.script):
                if step.model is None or step.model == model:
                    del self.script[i]
                    return step
        return self.default_step

    def prompt_tokens(self, messages: list[dict[str, Any]]) -> int:
        """The prompt's tokens, as this fake's tokenizer counts them (a digit a token, as
        real tokenizers count digits, where ``digit_tokens`` says so)."""
        text = "".join(m.get("content") or "" for m in messages)
        digits = sum(c.isdigit() for c in text) if self.digit_tokens else 0
        return int((len(text) - digits) * self.tokens_per_char) + digits + 1

    def chat_requests(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if r.get("_path") == "/api/chat"]


class _Handler(JsonHandler):
    server_fake: FakeOllama
    _generating = False  # this thread's /api/chat counts in FakeOllama.active

    def _chunk(self, obj: Any) -> None:
        self._write_chunk((json.dumps(obj) + "\n").encode() if not isinstance(obj, bytes) else obj)

    def _body(self) -> dict[str, Any]:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {"_invalid": raw[:200].decode(errors="replace")}
        return data if isinstance(data, dict) else {"_invalid": str(data)[:200]}

    # -- routes -------------------------------------------------------------------------

    def do_GET(self) -> None:
        fake = self.server_fake
        with fake.lock:
            fake.gets.append(self.path)
            del fake.gets[:-1000]  # a server polled for hours stays bounded
        if self.path == "/":
            body = b"Ollama is running"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/api/version":
            self._json(200, {"version": "0.33.0-fake"})
        elif self.path == "/api/tags":
            self._json(
                200,
                {"models": [{"name": f"{m}:latest", "model": f"{m}:latest"} for m in fake.models]},
            )
        elif self.path == "/api/ps":
            self._json(200, {"models": []})
        elif self.path == "/_requests":
            with fake.lock:
                self._json(200, {"requests": fake.requests, "max_active": fake.max_active})
        elif self.path.startswith("/_chat_times"):
            # only the arrival times of /api/chat requests after the first ?since=N: a cheap
            # poll for benchmarks (serialising every body under the lock would delay the
            # stamps it measures)
            since = int(self.path.partition("since=")[2] or 0)
            with fake.lock:
                times = [r["_time"] for r in fake.requests if r["_path"] == "/api/chat"]
            self._json(200, {"times": times[since:]})
        else:
            self._json(404, {"error": "404 page not found"})

    def do_POST(self) -> None:
        fake = self.server_fake
        body = self._body()
        if self.path == "/_script":
            steps = body.get("steps", [])
            fake.enqueue(*(Step.from_json(s) for s in steps))
            if "default" in body:
                fake.default_step = Step.from_json(body["default"])
            self._json(200, {"queued": len(fake.script)})
            return
        if self.path == "/_reset":
            with fake.lock:
                fake.requests.clear()
                fake.script.clear()
                fake.max_active = 0
            self._json(200, {})
            return
        arrived = time.time()  # stamped before the lock: a poll holding it must not shift it
        with fake.lock:
            fake.requests.append({**body, "_path": self.path, "_time": arrived})
        if self.path == "/api/chat":
            fake.chat_arrived.set()
        if self.path == "/api/show":
            self._show(body)
        elif self.path == "/api/chat":
            with fake.lock:
                fake.active += 1
                fake.max_active = max(fake.max_active, fake.active)
            self._generating = True
            try:
                self._chat(body)
            finally:
                self._generation_over()
        else:
            self._json(404, {"error": "404 page not found"})

    def _show(self, body: dict[str, Any]) -> None:
        name = str(body.get("model") or body.get("name") or "").split(":")[0]
        info = self.server_fake.models.get(name)
        if info is None:
            self._json(404, {"error": f"model '{body.get('model')}' not found"})
            return
        arch = info["arch"]
        self._json(
            200,
            {
                "modelfile": "",
                "parameters": "",
                "template": "",
                "details": {"format": "gguf", "family": arch, "families": [arch]},
                "model_info": {"general.architecture": arch, f"{arch}.context_length": info["ctx"]},
                "capabilities": info["capabilities"],
                "modified_at": _now(),
            },
        )

    def _generation_over(self) -> None:
        """A chat stops counting as active before its final ``done`` line goes out: a client
        that starts its next request on seeing that line overlaps nothing, even if this
        thread has not run again yet (counting after the last write made such a client look
        like two requests at once)."""
        if self._generating:
            self._generating = False
            with self.server_fake.lock:
                self.server_fake.active -= 1

    def _chat(self, body: dict[str, Any]) -> None:
        fake = self.server_fake
        model = str(body.get("model") or "")
        if not model:
            self._json(400, {"error": "model is required"})
            return
        name = model.split(":", maxsplit=1)[0]
        info = fake.models.get(name)
        if info is None:
            self._json(404, {"error": f"model '{model}' not found"})
            return
        if "completion" not in info["capabilities"]:  # Ollama's ChatHandler, in its words
            self._json(400, {"error": f'"{model}" does not support chat'})
            return
        if body.get("think") not in (None, False) and "thinking" not in info["capabilities"]:
            self._json(400, {"error": f'"{model}" does not support thinking'})
            return
        if body.get("tools") and "tools" not in info["capabilities"]:
            self._json(400, {"error": f"registry.ollama.ai/library/{model} does not support tools"})
            return
        messages = body.get("messages") or []
        n_ctx = int((body.get("options") or {}).get("num_ctx") or info["ctx"])
        if fake.caps_num_ctx:  # Ollama: "requested context size too large for model" (its log)
            n_ctx = min(n_ctx, info["ctx"])
        n_prompt = fake.prompt_tokens(messages)
        if n_prompt > n_ctx and body.get("truncate") is False and fake.honours_truncate:
            with fake.lock:
                fake.refused = [*fake.refused[-99:], n_prompt]
            self._json(400, {"error": _exceeds(n_prompt, n_ctx)})
            return
        if n_prompt > n_ctx:
            with fake.lock:
                fake.truncated += 1
            n_prompt = n_ctx // 2 + 2  # counted after the cut
        step = fake.next_step(name)
        if step.first_byte_delay and fake.stop_event.wait(step.first_byte_delay):
            return
        if step.kind == "error":
            headers = {"Retry-After": step.retry_after} if step.retry_after else None
            self._json(step.status, {"error": step.error}, headers)
            return
        last_user = next(
            (m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), ""
        )
        text = step.text or f"Echo: {last_user[:60]}"
        pieces = [] if step.no_content else _split(text, step.chunks)
        close_delimited = step.kind == "cut_close"
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        if close_delimited:
            self.send_header("Connection", "close")
        else:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def emit(obj: Any) -> None:
            if close_delimited:
                self.wfile.write((json.dumps(obj) + "\n").encode())
                self.wfile.flush()
            else:
                self._chunk(obj)

        def base(content: str = "", **extra: Any) -> dict[str, Any]:
            return {
                "model": model,
                "created_at": _now(),
                "message": {"role": "assistant", "content": content, **extra},
                "done": False,
            }

        try:
            for t in _split(step.thinking, 0) if step.thinking else []:
                emit(base("", thinking=t))
                if step.chunk_delay:
                    time.sleep(step.chunk_delay)
            sent = 0
            for piece in pieces:
                if (
                    step.kind
                    in {"mid_error", "cut_chunked", "cut_close", "hang", "garbage", "endless_line"}
                    and sent >= step.after_chunks
                ):
                    break
                emit(base(piece))
                sent += 1
                if step.chunk_delay and fake.stop_event.wait(step.chunk_delay):
                    return
            if step.kind == "mid_error":
                emit({"error": step.error})
                self._end_chunks()
                return
            if step.kind == "endless_line":
                emit(b'{"message": {"role": "assistant", "content": "')
                block = b"x" * 65536
                for _ in range(step.endless_bytes // len(block)):
                    emit(block)
                self._end_chunks()
                return
            if step.kind == "garbage":
                emit(b"this is not json\n")
                self._end_chunks()
                return
            if step.kind == "cut_chunked":
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            if step.kind == "cut_close":
                self.close_connection = True
                return
            if step.kind == "hang":
                fake.stop_event.wait(step.hang_seconds)
                return
            for i, call in enumerate(step.tool_calls):
                fn = {"index": i, "name": call["name"], "arguments": call.get("arguments", {})}
                tc: dict[str, Any] = {"function": fn}
                if call.get("id", "auto") is not None:
                    tc["id"] = (
                        call.get("id") if call.get("id", "auto") != "auto" else f"call_{i:08d}"
                    )
                emit(base("", tool_calls=[tc]))
            if step.kind == "no_done":
                self._end_chunks()
                return
            self._generation_over()
            emit(
                {
                    "model": model,
                    "created_at": _now(),
                    "message": {"role": "assistant", "content": ""},
                    "done": True,
                    "done_reason": step.done_reason,
                    "total_duration": 4_883_583_458,
                    "load_duration": 1_334_875,
                    "prompt_eval_count": step.prompt_eval_count
                    if step.prompt_eval_count is not None
                    else n_prompt,
                    "prompt_eval_duration": 342_546_000,
                    "eval_count": step.eval_count or max(1, len(pieces)),
                    "eval_duration": 4_535_599_000,
                }
                | (
                    {"prompt_eval_cached_count": step.prompt_eval_cached_count}
                    if step.prompt_eval_cached_count is not None
                    else {}
                )
            )
            self._end_chunks()
        except (BrokenPipeError, ConnectionResetError):
            with self.server_fake.lock:
                self.server_fake.aborted += 1
            return


def _exceeds(n_prompt: int, n_ctx: int) -> str:
    """Ollama's refusal of a prompt over the window: llama-server's error object, as a JSON
    string in Ollama's ``error`` (verbatim shape from ollama #16800)."""
    message = (
        f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), "
        "try increasing it"
    )
    inner = {
        "code": 400,
        "message": message,
        "type": "exceed_context_size_error",
        "n_prompt_tokens": n_prompt,
        "n_ctx": n_ctx,
    }
    return json.dumps({"error": inner}, separators=(",", ":"))


def _split(text: str, n: int) -> list[str]:
    if not text:
        return []
    if n <= 0:
        words = text.split(" ")
        return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]
    size = max(1, -(-len(text) // n))
    return [text[i : i + size] for i in range(0, len(text), size)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--print-port", action="store_true")
    args = ap.parse_args()
    fake = FakeOllama(port=args.port)
    if args.print_port:
        print(fake.port, flush=True)
    try:
        fake.httpd.serve_forever()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
