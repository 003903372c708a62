"""The OpenAI chat-completions wire format, shared by the ``openai`` backend (over HTTP) and
the ``local`` one (llama.cpp in process, which speaks it too): the request body, server-sent
events decoded, a streamed reply's chunks gathered, and errors classified. No I/O here.
Wire facts this relies on (docs/guides/backends.md has sources):

* SSE: ``data: <json>`` events separated by blank lines, ``: ping`` comments (llama-cpp-python
  sends them while busy), and a final ``data: [DONE]``;
* an error after the stream started is one ``data: {"error": {...}}`` event, then EOF (no
  ``[DONE]``); EOF without ``[DONE]`` and without a ``finish_reason`` is a cut, never a reply;
* reasoning arrives as ``delta.reasoning_content`` (llama.cpp, vLLM), ``delta.reasoning``
  (Ollama ``/v1``) or inline in the content between ``<think>`` tags;
* tool calls arrive as fragments: the first for an ``index`` carries ``id`` and the name, later
  ones carry pieces of the ``arguments`` string to concatenate;
* usage comes in a last chunk when ``stream_options.include_usage`` is honoured; llama.cpp adds
  ``timings``; llama-cpp-python sends neither, so the reply's deltas are counted instead;
* context overflow is a 400: llama.cpp ``exceed_context_size_error`` (with ``n_prompt_tokens``
  and ``n_ctx``), OpenAI-style ``context_length_exceeded``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from contemplation.backends.base import TimedLines, retry_after_seconds
from contemplation.backends.thinking import ThinkSplitter
from contemplation.errors import BackendError, ContextOverflow, ErrorKind
from contemplation.models import ChatMessage, ChatRequest, StreamEvent, Usage

# Ollama option names that have no OpenAI equivalent (num_ctx cannot be set through /v1)
_DROPPED_OPTIONS = frozenset(
    {"num_ctx", "num_batch", "num_gpu", "main_gpu", "use_mmap", "num_thread", "num_keep",
     "repeat_last_n", "keep_alive"}
)  # fmt: skip
_RENAMED_OPTIONS = {"num_predict": "max_tokens"}


# --------------------------------------------------------------------------- errors

_OVERFLOW_PATTERNS = (
    # OpenAI, vLLM, llama-cpp-python's server
    re.compile(
        r"maximum context length is (?P<ctx>\d+) tokens.*?(?:requested|resulted in) "
        r"(?P<total>\d+) tokens(?: \((?P<prompt>\d+) in the messages)?",
        re.S,
    ),
    # llama.cpp server and llama-cpp-python in-process
    re.compile(
        r"request \((?P<prompt>\d+) tokens\) exceeds the available context size "
        r"\((?P<ctx>\d+) tokens\)"
    ),
    re.compile(r"Requested tokens \((?P<prompt>\d+)\) exceed context window of (?P<ctx>\d+)"),
)


def context_overflow(message: str, info: Mapping[str, Any] | None = None) -> ContextOverflow | None:
    """A :class:`ContextOverflow` when an error says the prompt does not fit, else None."""
    info = info or {}
    n_prompt: int | None = None
    n_ctx: int | None = None
    found = info.get("type") == "exceed_context_size_error" or info.get("code") in {
        "context_length_exceeded",
        "exceed_context_size_error",
    }
    if isinstance(info.get("n_prompt_tokens"), int) and isinstance(info.get("n_ctx"), int):
        n_prompt, n_ctx, found = info["n_prompt_tokens"], info["n_ctx"], True
    else:
        for pattern in _OVERFLOW_PATTERNS:
            m = pattern.search(message)
            if m:
                groups = m.groupdict()
                prompt = groups.get("prompt") or groups.get("total")
                n_prompt, n_ctx, found = int(prompt or 0) or None, int(m.group("ctx")), True
                break
    if not found:
        return None
    sizes = f" ({n_prompt} tokens into a window of {n_ctx})" if n_prompt and n_ctx else ""
    return ContextOverflow(
        f"the prompt does not fit the model's context{sizes}: {message}",
        n_prompt=n_prompt,
        n_ctx=n_ctx,
    )


def _error_info(body: bytes) -> tuple[str, dict[str, Any]]:
    """The message and the error object of an error body, whatever its shape."""
    try:
        data = json.loads(body)
    except ValueError:
        return body[:500].decode("utf-8", errors="replace").strip() or "(empty body)", {}
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or json.dumps(err)[:500]), err
        if isinstance(err, str):
            return err, data
        for key in ("detail", "message"):
            if key in data:
                return str(data[key])[:500], data
    return json.dumps(data)[:500], {}


#: where the ``[openai]`` section's key is read from (a named provider reads its own table's)
OPENAI_KEY = "OPENAI_API_KEY (or openai.api_key in the config)"


def classify_status(
    status: int,
    body: bytes,
    headers: Mapping[str, str],
    *,
    model: str,
    url: str,
    url_key: str = "OPENAI_BASE_URL",
    key_at: str = OPENAI_KEY,
) -> BackendError:
    """Map an error response to a transient or permanent :class:`BackendError`; ``url_key``
    names where the URL came from (a named provider's own ``providers.<name>.url``), and
    ``key_at`` where its API key is read from (its own ``providers.<name>.api_key``)."""
    text, info = _error_info(body)
    if status in {400, 413}:
        overflow = context_overflow(text, info)
        if overflow is not None:
            return overflow
    if status in {401, 403}:
        return BackendError(
            f"{url} refused the credentials ({status}: {text}); check {key_at}",
            transient=False,
            kind=ErrorKind.AUTH,
            status_code=status,
        )
    if status == 404:
        what = (
            f"model {model!r} not found"
            if "model" in text.lower()
            else f"{url}/chat/completions not found; check {url_key}"
        )
        return BackendError(
            f"{what} ({text})", transient=False, kind=ErrorKind.MODEL_NOT_FOUND, status_code=404
        )
    if status in {408, 409, 425, 429} or status >= 500:
        if status == 500 and "validation error" in text:  # llama-cpp-python: a bad request
            return BackendError(
                f"the server rejected the request: {text}",
                transient=False,
                kind=ErrorKind.BAD_REQUEST,
                status_code=status,
            )
        retry_after = retry_after_seconds(headers.get("retry-after"))
        ms = headers.get("retry-after-ms")
        if retry_after is None and ms and ms.replace(".", "", 1).isdigit():
            retry_after = float(ms) / 1000
        return BackendError(
            f"the server answered {status}: {text}",
            transient=True,
            kind=ErrorKind.SERVER_BUSY if status in {429, 503} else ErrorKind.SERVER_ERROR,
            status_code=status,
            retry_after=retry_after,
        )
    kind = ErrorKind.BAD_REQUEST if status in {400, 413, 422} else ErrorKind.HTTP
    return BackendError(
        f"the server answered {status}: {text}", transient=False, kind=kind, status_code=status
    )


def stream_error(err: Any) -> BackendError:
    """An error event inside a stream that had started (also the local backend's errors)."""
    info = err if isinstance(err, dict) else {}
    text = str(info.get("message") or err)
    overflow = context_overflow(text, info)
    if overflow is not None:
        return overflow
    code = info.get("code")
    permanent = isinstance(code, int) and 400 <= code < 500 and code not in {408, 429}
    return BackendError(
        f"the server reported an error mid-stream: {text}",
        transient=not permanent,
        kind=ErrorKind.STREAM_ERROR,
        status_code=code if isinstance(code, int) else None,
    )


# --------------------------------------------------------------------------- SSE


@dataclass(slots=True)
class SSEDecoder:
    """Server-sent events from lines: ``data:`` fields joined, comments dropped.

    Not httpx-sse: it reads an httpx response (the backends use aiohttp, see
    backends/http.py), and its public API reads the body's lines itself, with no bound on a
    line and no first-byte/idle phases, which :class:`TimedLines` gives every backend."""

    _data: list[str] = field(default_factory=list)
    _event: str = ""

    def line(self, line: str) -> tuple[str, str] | None:
        """Feed one line; returns ``(event name, data)`` when a blank line ends an event."""
        if not line:
            return self.flush()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def flush(self) -> tuple[str, str] | None:
        if not self._data:
            self._event = ""
            return None
        event = (self._event, "\n".join(self._data))
        self._data.clear()
        self._event = ""
        return event


def _payloads(data: str) -> list[str]:
    """One event's data; servers that omit the blank line between events get split here."""
    if "\n" not in data:
        return [data]
    try:
        json.loads(data)
    except ValueError:
        return [part for part in data.split("\n") if part.strip()]
    return [data]


# --------------------------------------------------------------------------- a turn


@dataclass(slots=True)
class ToolCalls:
    """Tool-call fragments stitched by ``index`` (and told apart by ``id``)."""

    calls: list[dict[str, str]] = field(default_factory=list)
    _by_index: dict[int, int] = field(default_factory=dict)
    _by_id: dict[str, int] = field(default_factory=dict)

    def add(self, frag: Mapping[str, Any]) -> None:
        index = frag.get("index")
        call_id = frag.get("id") or ""
        pos: int | None = None
        if call_id and call_id in self._by_id:
            pos = self._by_id[call_id]
        elif isinstance(index, int) and index in self._by_index:
            known = self.calls[self._by_index[index]]["id"]
            if not (call_id and known and known != call_id):  # a new id at a reused index
                pos = self._by_index[index]
        if pos is None:
            pos = len(self.calls)
            self.calls.append({"id": call_id, "name": "", "arguments": ""})
        if isinstance(index, int):
            self._by_index[index] = pos
        call = self.calls[pos]
        if call_id:
            self._by_id[call_id] = pos
            call["id"] = call["id"] or call_id
        fn = frag.get("function") or {}
        if fn.get("name") and not call["name"]:
            call["name"] = str(fn["name"])
        args = fn.get("arguments")
        if isinstance(args, str):
            call["arguments"] += args
        elif args is not None:  # a whole object (Ollama-style); keep it as the JSON string
            call["arguments"] = json.dumps(args)

    def events(self) -> list[StreamEvent]:
        return [
            StreamEvent(
                "tool_call",
                tool_call={
                    "id": c["id"] or f"call_{i}",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                },
            )
            for i, c in enumerate(self.calls)
        ]


@dataclass(slots=True)
class ChunkTurn:
    """One reply read from OpenAI ``chat.completion.chunk`` objects (over SSE here, in-process
    in the local backend): events as they come, then usage from ``usage`` and ``timings``."""

    t0: float
    splitter: ThinkSplitter = field(default_factory=ThinkSplitter)
    tools: ToolCalls = field(default_factory=ToolCalls)
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)
    first_token_ms: float | None = None
    deltas: int = 0
    events_seen: int = 0

    def chunk(self, chunk: Mapping[str, Any]) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        if isinstance(chunk.get("usage"), dict):
            self.usage.update({k: v for k, v in chunk["usage"].items() if v is not None})
        if isinstance(chunk.get("timings"), dict):
            self.timings = chunk["timings"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or choice.get("message") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
            content = delta.get("content") or ""
            if reasoning or content:
                self.deltas += 1
                if self.first_token_ms is None:
                    self.first_token_ms = (time.monotonic() - self.t0) * 1000
            if isinstance(reasoning, str) and reasoning:
                out.append(StreamEvent("thinking", text=reasoning))
            if isinstance(content, str) and content:
                out.extend(StreamEvent(k, text=t) for k, t in self.splitter.feed(content))
            for frag in delta.get("tool_calls") or []:
                if isinstance(frag, dict):
                    self.tools.add(frag)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return out

    def finish(self, context_window: int | None) -> list[StreamEvent]:
        out = [StreamEvent(k, text=t) for k, t in self.splitter.flush()]
        out.extend(self.tools.events())
        u, tm = self.usage, self.timings

        def num(v: Any) -> float | None:
            return float(v) if isinstance(v, int | float) else None

        def count(v: Any) -> int | None:
            return int(v) if isinstance(v, int | float) else None

        details = u.get("prompt_tokens_details")
        cached = count(tm.get("cache_n"))  # llama-server: prompt tokens reused from its cache
        if cached is None and isinstance(details, dict):
            cached = count(details.get("cached_tokens"))  # OpenAI's own word for it
        computed = count(tm.get("prompt_n"))  # llama-server: prompt tokens evaluated
        sent = count(u.get("prompt_tokens"))
        if computed is None and sent is not None and cached is not None:
            computed = sent - cached
        if sent is None and computed is not None and cached is not None:
            sent = computed + cached
        usage = Usage(
            prompt_eval_count=sent or computed,
            cached_tokens=cached,
            computed_tokens=computed,
            eval_count=count(u.get("completion_tokens"))
            or count(tm.get("predicted_n"))
            or (self.deltas or None),
            prompt_eval_duration_ms=num(tm.get("prompt_ms")),
            eval_duration_ms=num(tm.get("predicted_ms")),
            first_token_ms=self.first_token_ms,
            wall_ms=(time.monotonic() - self.t0) * 1000,
            done_reason=self.finish_reason,
            context_window=context_window,
        )
        out.append(StreamEvent("done", usage=usage))
        return out


def _message_json(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        calls = []
        for i, call in enumerate(m.tool_calls):
            fn = call.get("function") or {}
            args = fn.get("arguments", "")
            calls.append(
                {
                    "id": call.get("id") or f"call_{i}",
                    "type": "function",
                    "function": {
                        "name": fn.get("name", ""),
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
            )
        out["tool_calls"] = calls
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.images:  # content parts: the text, then each image as a data URI
        out["content"] = [
            {"type": "text", "text": m.content},
            *({"type": "image_url", "image_url": {"url": i.data_uri()}} for i in m.images),
        ]
    return out


def chat_body(request: ChatRequest, *, stream_usage: bool = True) -> dict[str, Any]:
    """The streamed ``/v1/chat/completions`` body for a request (also the local backend's)."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": [_message_json(m) for m in request.messages],
        "stream": True,
    }
    if stream_usage:
        body["stream_options"] = {"include_usage": True}
    for key, value in request.options.items():
        if key in _DROPPED_OPTIONS:
            continue
        if key == "num_predict" and isinstance(value, int) and value < 0:
            continue  # Ollama's "unlimited"
        body[_RENAMED_OPTIONS.get(key, key)] = value
    think = request.think
    if think is False:
        body.setdefault("reasoning_effort", "none")
    elif isinstance(think, str):
        body.setdefault("reasoning_effort", "high" if think == "max" else think)
    if request.tools:
        body["tools"] = list(request.tools)
    if request.slot is not None:  # llama-server: the slot that holds this prompt's prefix
        body["id_slot"] = request.slot
    if request.schema is not None:  # structured outputs (llama-server constrains decoding)
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": request.schema, "strict": True},
        }
    return body


async def sse_payloads(lines: TimedLines) -> AsyncIterator[tuple[str, str]]:
    """(event name, data payload) of each SSE event until the body ends; a ping is a line but
    not progress, so only events keep the idle timeout from firing."""
    sse = SSEDecoder()
    while True:
        line = await lines.next()
        event = sse.flush() if line is None else sse.line(line)
        if event is not None:
            lines.progress()
            name, data = event
            for payload in _payloads(data):
                yield name, payload
        if line is None:
            return
