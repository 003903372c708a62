"""OpenAI-compatible ``POST /v1/chat/completions``, streamed as server-sent events.

One client for llama.cpp's ``llama-server``, the llama-cpp-python server, vLLM, LM Studio,
Ollama's ``/v1`` and hosted APIs. Wire facts this relies on (docs/backends.md has sources):

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
  and ``n_ctx``), OpenAI-style ``context_length_exceeded``. llama-cpp-python's server only finds
  out after it has answered 200 to a streamed request and then sends an empty stream, so an
  empty stream is diagnosed once with a one-token non-streamed request.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, field_validator

from contemplation.backends import BackendKind, Made, capabilities
from contemplation.backends.base import (
    Capabilities,
    Check,
    PhaseTimeouts,
    Slots,
    TimedLines,
    json_object,
    phase_timeouts,
    retry_after_seconds,
)
from contemplation.backends.http import Http
from contemplation.backends.thinking import ThinkSplitter
from contemplation.errors import BackendError, ContextOverflow, ErrorKind
from contemplation.models import BackendSession, ChatMessage, ChatRequest, StreamEvent, Usage
from contemplation.settings import (
    CapabilityOverride,
    Concurrency,
    Section,
    TimeoutSettings,
    check_url,
)

DEFAULT_BASE_URL = "http://127.0.0.1:8080/v1"

# Ollama option names that have no OpenAI equivalent (num_ctx cannot be set through /v1)
_DROPPED_OPTIONS = frozenset(
    {"num_ctx", "num_batch", "num_gpu", "main_gpu", "use_mmap", "num_thread", "num_keep",
     "repeat_last_n", "keep_alive"}
)  # fmt: skip
_RENAMED_OPTIONS = {"num_predict": "max_tokens"}


def normalize_base_url(value: str | None) -> str:
    """A base URL ending in the API root: a bare ``host:port`` gets ``/v1``; a path is kept."""
    raw = (value or "").strip().rstrip("/")
    if not raw:
        return DEFAULT_BASE_URL
    if "://" not in raw:
        raw = f"http://{raw}"
    parts = urlsplit(raw)
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


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


def classify_status(
    status: int,
    body: bytes,
    headers: Mapping[str, str],
    *,
    model: str,
    url: str,
) -> BackendError:
    """Map an error response to a transient or permanent :class:`BackendError`."""
    text, info = _error_info(body)
    if status in {400, 413}:
        overflow = context_overflow(text, info)
        if overflow is not None:
            return overflow
    if status in {401, 403}:
        return BackendError(
            f"{url} refused the credentials ({status}: {text}); check OPENAI_API_KEY "
            "(or openai.api_key in the config)",
            transient=False,
            kind=ErrorKind.AUTH,
            status_code=status,
        )
    if status == 404:
        what = (
            f"model {model!r} not found"
            if "model" in text.lower()
            else f"{url}/chat/completions not found; check OPENAI_BASE_URL"
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

        usage = Usage(
            prompt_eval_count=count(u.get("prompt_tokens")) or count(tm.get("prompt_n")),
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
    if request.schema is not None:  # structured outputs (llama-server constrains decoding)
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": request.schema, "strict": True},
        }
    return body


async def _sse_payloads(lines: TimedLines) -> AsyncIterator[tuple[str, str]]:
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


class OpenAIBackend:
    name = "openai"
    label = "OPENAI"
    structured_output = True  # request.schema constrains the reply (structured.py)

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str = "",
        timeouts: PhaseTimeouts,
        concurrency: int | str = 1,
        default_concurrency: int = 1,
        stream_usage: bool = True,
        overrides: Mapping[str, CapabilityOverride] | None = None,
        name: str = "openai",
    ) -> None:
        self.name = name
        self.base_url = normalize_base_url(base_url)
        self.timeouts = timeouts
        self.auto = concurrency == "auto"
        self.concurrency = default_concurrency if self.auto else int(concurrency)
        self.stream_usage = stream_usage
        self.overrides = dict(overrides or {})
        headers: dict[str, str] = {}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = Http(self.base_url, connect=timeouts.connect, headers=headers)
        self._caps: dict[str, Capabilities] = {}
        self._props: dict[str, Any] | None = None  # llama-server's GET /props, once asked
        self._props_asked = False

    def request_body(self, request: ChatRequest) -> dict[str, Any]:
        return chat_body(request, stream_usage=self.stream_usage)

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        body = self.request_body(request)
        turn = ChunkTurn(t0=time.monotonic())
        resp = await self._http.stream(
            "chat/completions", body, first_byte=self.timeouts.first_byte, silent=self.base_url
        )
        try:
            if resp.status != 200:
                raise classify_status(
                    resp.status,
                    await resp.read(),
                    resp.headers,
                    model=request.model,
                    url=self.base_url,
                )
            lines = TimedLines(resp, self.timeouts, self.base_url, t0=turn.t0)
            async for name, payload in _sse_payloads(lines):
                turn.events_seen += 1
                if payload.strip() == "[DONE]":
                    for ev in turn.finish(self._known_context(request.model)):
                        yield ev
                    await lines.drain()
                    return
                for ev in self._payload(turn, name, payload):
                    yield ev
            if turn.finish_reason is not None:  # servers that never send [DONE]
                for ev in turn.finish(self._known_context(request.model)):
                    yield ev
                return
            if turn.events_seen == 0:
                await self._diagnose_empty_stream(body, request.model)
            raise BackendError(
                f"{self.base_url}: the stream ended without [DONE] (cut off)",
                transient=True,
                kind=ErrorKind.CUT,
            )
        finally:
            resp.close()

    def _payload(self, turn: ChunkTurn, name: str, payload: str) -> list[StreamEvent]:
        chunk = json_object(payload, self.base_url)
        if "error" in chunk or name == "error":
            raise stream_error(chunk.get("error", chunk))
        return turn.chunk(chunk)

    async def _diagnose_empty_stream(self, body: dict[str, Any], model: str) -> None:
        """An empty 200 stream: ask once without streaming, for the error the stream hid."""
        probe = {k: v for k, v in body.items() if k not in {"stream", "stream_options"}}
        probe.update(stream=False, max_tokens=1)
        try:  # resent if the server dropped the kept-alive connection of the stream
            resp = await self._http.request(
                "POST", "chat/completions", json=probe, within=self.timeouts.first_byte, resend=True
            )
        except BackendError:
            return
        if resp.status != 200:
            err = classify_status(
                resp.status, resp.body, resp.headers, model=model, url=self.base_url
            )
            if isinstance(err, ContextOverflow):
                raise err

    def _known_context(self, model: str) -> int | None:
        caps = self._caps.get(model)
        return caps.context_length if caps else None

    async def _models(self) -> list[dict[str, Any]] | None:
        """``GET /models`` entries, or None when the server has no such list."""
        resp = await self._http.request("GET", "models", within=self.timeouts.connect * 3)
        if resp.status in {401, 403}:
            raise classify_status(resp.status, resp.body, resp.headers, model="", url=self.base_url)
        if resp.status != 200:
            return None
        try:
            data = resp.json()
        except ValueError:
            return None
        entries = data.get("data") if isinstance(data, dict) else None
        return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else None

    async def models(self) -> list[str]:
        """The served model ids (``GET /models``; none when the server has no such list)."""
        return [str(e["id"]) for e in await self._models() or [] if e.get("id")]

    def root(self, path: str) -> str:
        """A URL at the server's root, beside its API (``…/v1`` → ``…/props``)."""
        parts = urlsplit(self.base_url)
        base = parts.path.removesuffix("/v1").rstrip("/")
        return urlunsplit((parts.scheme, parts.netloc, f"{base}/{path}", "", ""))

    async def _server_json(self, path: str) -> Any:
        """``GET <root>/<path>`` as JSON, or None when the server has no such page."""
        resp = await self._http.request("GET", self.root(path), within=self.timeouts.connect * 3)
        if resp.status != 200:
            return None
        try:
            return resp.json()
        except ValueError:
            return None

    async def props(self) -> dict[str, Any] | None:
        """llama-server's ``/props`` (slots, the window per slot), asked once per start."""
        if not self._props_asked:
            data = await self._server_json("props")
            self._props = data if isinstance(data, dict) else None
            self._props_asked = True
        return self._props

    async def slots(self) -> Slots:
        """The server's parallel slots: llama-server's ``/props`` ``total_slots``, else the
        length of its ``/slots``, else ``default_concurrency`` (vLLM, LiteLLM, hosted APIs
        do not say). A number in the config wins."""
        if not self.auto:
            return Slots(self.concurrency, "config")
        total = (await self.props() or {}).get("total_slots")
        if isinstance(total, int) and total > 0:
            return Slots(min(total, 64), "server /props")
        listed = await self._server_json("slots")
        if isinstance(listed, list) and listed:
            return Slots(min(len(listed), 64), "server /slots")
        return Slots(self.concurrency, "default_concurrency (the server does not say)")

    def stale(self) -> None:
        self._caps.clear()
        self._props, self._props_asked = None, False

    async def capabilities(self, model: str) -> Capabilities:
        """The family table and config overrides; the context window the server gives each
        request: llama-server's ``n_ctx`` per slot (``/models`` ``meta``, else ``/props``),
        vLLM's ``max_model_len``, ``context_length``; the trained length only when the server
        says nothing else."""
        if model in self._caps:
            return self._caps[model]
        entries = await self._models() or []
        entry = next((e for e in entries if e.get("id") == model), None)
        if entry is None and len(entries) == 1:
            entry = entries[0]  # a single-model server answers whatever the name
        meta = entry.get("meta") if entry and isinstance(entry.get("meta"), dict) else {}
        found = [
            (meta or {}).get("n_ctx"),  # llama.cpp: per slot, what a request really gets
            (entry or {}).get("max_model_len"),  # vLLM
            (entry or {}).get("context_length"),  # OpenRouter, LM Studio
        ]
        window = next((v for v in found if isinstance(v, int) and v > 0), None)
        if window is None and (props := await self.props()) is not None:
            settings = props.get("default_generation_settings")
            n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
            window = n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None
        trained = (meta or {}).get("n_ctx_train")
        known = window or (trained if isinstance(trained, int) and trained > 0 else None)
        result = capabilities.resolve(model, context_length=known, overrides=self.overrides)
        if window is not None:  # what each request gets: never more than the server gives
            result = replace(result, request_window=min(window, result.context_length or window))
        self._caps[model] = result
        return result

    async def check(self, model: str | None) -> list[Check]:
        try:
            entries = await self._models()
        except BackendError as exc:
            hint = (
                "set OPENAI_API_KEY (or openai.api_key)"
                if exc.kind == "auth"
                else "start the server, or set OPENAI_BASE_URL (or openai.base_url)"
            )
            return [Check(self.name, False, str(exc), (hint,))]
        if entries is None:
            return [
                Check(
                    self.name,
                    True,
                    f"{self.base_url} answers (no model list at {self.base_url}/models)",
                )
            ]
        ids = [str(e.get("id")) for e in entries]
        checks = [Check(self.name, True, f"{self.base_url} serves {', '.join(ids) or 'no models'}")]
        if model:
            if model in ids:
                checks.append(Check("model", True, f"{model} is served"))
            elif len(ids) == 1:
                checks.append(
                    Check("model", True, f"the server has one model ({ids[0]}); it answers")
                )
            else:
                checks.append(
                    Check("model", False, f"{model} is not among the server's models", tuple(ids))
                )
        return checks

    async def forget(self, conversation_id: str, session: BackendSession | None = None) -> None:
        return None  # the API is stateless

    async def aclose(self) -> None:
        await self._http.aclose()


class OpenAISettings(Section):
    """``kind = "openai"``, or the ``[openai]`` section: any OpenAI-compatible
    ``/v1/chat/completions`` server (llama.cpp, vLLM, LM Studio, LiteLLM, ...)."""

    url: str = Field("", description="base URL (…/v1); empty: base_url")
    base_url: str = Field(
        "", description="empty: OPENAI_BASE_URL, else http://127.0.0.1:8080/v1; /v1 is optional"
    )
    api_key: str = Field("", description="empty: OPENAI_API_KEY; none: no Authorization header")
    stream_usage: bool = Field(True, description="send stream_options.include_usage")
    concurrency: Concurrency = Field(
        "auto",
        description="turns at once; auto: the server's slots (llama-server /props or /slots), "
        "else default_concurrency",
    )
    default_concurrency: int = Field(
        1, ge=1, le=64, description="slots of a server that does not say how many it has"
    )
    timeouts: TimeoutSettings = Field(default_factory=TimeoutSettings)

    _urls = field_validator("url", "base_url", mode="after")(check_url)


def _make(m: Made) -> OpenAIBackend:
    s: OpenAISettings = m.own
    return OpenAIBackend(
        s.url or s.base_url,
        api_key=s.api_key,
        timeouts=phase_timeouts(s.timeouts, m.settings.max_reply_bytes),
        concurrency=s.concurrency,
        default_concurrency=s.default_concurrency,
        stream_usage=s.stream_usage,
        overrides=m.settings.capabilities,
        name=m.name,
    )


KIND = BackendKind("openai", _make, OpenAISettings)
