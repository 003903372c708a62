"""Ollama's native API: ``POST /api/chat`` streaming NDJSON, ``/api/show`` for capabilities.

Wire facts this relies on (see docs/guides/backends.md for sources):
* one JSON object per line; any line may be ``{"error": "..."}`` even at HTTP 200;
* a whole reply ends with a ``"done": true`` line carrying the metrics (durations in ns);
  EOF without it is a failure, never a reply;
* on a cold load no headers arrive until the model is in memory, hence the long first-byte wait.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, field_validator

from contemplation.backends import BackendInputs, BackendKind, capabilities, providers
from contemplation.backends.base import (
    Capabilities,
    Check,
    Merged,
    PhaseTimeouts,
    Slots,
    TimedLines,
    json_object,
    phase_timeouts,
    retry_after_seconds,
)
from contemplation.backends.chat_completions import context_overflow
from contemplation.backends.http import Http
from contemplation.base import backend_kinds
from contemplation.errors import BackendError, ConfigError, ContextOverflow, ErrorKind
from contemplation.models import BackendSession, ChatMessage, ChatRequest, StreamEvent, Usage
from contemplation.settings import CapabilityOverride, Concurrency, Section, TimeoutSettings

_NS_PER_MS = 1_000_000
#: the old ``[ollama]`` section (the one table OLLAMA_HOST reaches) and the key that sets
SECTION = backend_kinds.OLLAMA
SECTION_HOST = f"{SECTION}.host"


def _message_json(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = list(m.tool_calls)
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.tool_name:
        out["tool_name"] = m.tool_name
    if m.images:  # docs/api.md: "images": a list of base64-encoded images
        out["images"] = [i.b64() for i in m.images]
    return out


def _usage(chunk: dict[str, Any], first_token_ms: float | None, wall_ms: float) -> Usage:
    def ms(key: str) -> float | None:
        v = chunk.get(key)
        return float(v) / _NS_PER_MS if isinstance(v, int | float) else None

    # prompt_eval_count counts every prompt token (its runner's cache_n + prompt_n), and since
    # #17943 (2026-08-22) prompt_eval_cached_count those read from the cache; left out (not 0)
    # by an older server: then what it reused stays unknown
    sent, cached = chunk.get("prompt_eval_count"), chunk.get("prompt_eval_cached_count")
    computed = None
    if isinstance(sent, int) and isinstance(cached, int) and 0 <= cached <= sent:
        computed = sent - cached
    else:
        cached = None
    return Usage(
        prompt_eval_count=sent,
        cached_tokens=cached,
        computed_tokens=computed,
        eval_count=chunk.get("eval_count"),
        total_duration_ms=ms("total_duration"),
        load_duration_ms=ms("load_duration"),
        prompt_eval_duration_ms=ms("prompt_eval_duration"),
        eval_duration_ms=ms("eval_duration"),
        first_token_ms=first_token_ms,
        wall_ms=wall_ms,
        done_reason=chunk.get("done_reason"),
    )


def _error_text(resp_body: bytes) -> str:
    try:
        data = json.loads(resp_body)
    except ValueError:
        return resp_body[:500].decode("utf-8", errors="replace").strip() or "(empty body)"
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return str(data["error"])
    return json.dumps(data)[:500]


def _exceeds(text: str) -> ContextOverflow | None:
    """The refusal of a prompt over the window (sent with ``truncate: false``): llama-server's
    error object as a JSON string in Ollama's ``error`` (ollama #16800), with the server's
    ``n_prompt_tokens`` and ``n_ctx``; None for any other error."""
    if "exceed_context_size_error" not in text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    info = data.get("error") if isinstance(data, dict) else None
    info = info if isinstance(info, dict) else {}
    message = info.get("message")
    found = context_overflow(message if isinstance(message, str) else text, info)
    return (
        None
        if found is None
        else ContextOverflow(f"Ollama: {found}", n_prompt=found.n_prompt, n_ctx=found.n_ctx)
    )


def classify_status(status: int, text: str, retry_after: float | None, model: str) -> BackendError:
    """Map an Ollama error response to a transient or permanent :class:`BackendError`."""
    if status == 404:
        return BackendError(
            f"Ollama: {text} (pull it with `ollama pull {model}`)",
            transient=False,
            kind=ErrorKind.MODEL_NOT_FOUND,
            status_code=404,
        )
    if status == 400 and "longer than the context length" in text:
        return ContextOverflow(f"Ollama: {text}")
    if status == 400 and (overflow := _exceeds(text)) is not None:
        return overflow
    if status == 400:
        kind = ErrorKind.UNSUPPORTED if "does not support" in text else ErrorKind.BAD_REQUEST
        return BackendError(f"Ollama: {text}", transient=False, kind=kind, status_code=400)
    if status in {429, 499, 502, 503, 504} or status >= 500:
        return BackendError(
            f"Ollama answered {status}: {text}",
            transient=True,
            kind=ErrorKind.SERVER_BUSY if status in {429, 503} else ErrorKind.SERVER_ERROR,
            status_code=status,
            retry_after=retry_after,
        )
    return BackendError(
        f"Ollama answered {status}: {text}",
        transient=False,
        kind=ErrorKind.HTTP,
        status_code=status,
    )


class OllamaBackend:
    name = "ollama"
    label = "OLLAMA"
    structured_output = True  # request.schema constrains the reply (structured.py)

    def __init__(
        self,
        base_url: str,
        *,
        auth: tuple[str, str] | None = None,
        num_ctx: int = 8192,
        keep_alive: str | int = "10m",
        timeouts: PhaseTimeouts,
        concurrency: int | str = 1,
        overrides: Mapping[str, CapabilityOverride] | None = None,
        name: str = "ollama",
        where: str = SECTION_HOST,
    ) -> None:
        self.name = name
        self.where = where  # the key its URL came from, for the hint that names it
        self.base_url = base_url.rstrip("/")
        self.overrides = dict(overrides or {})
        self.num_ctx = num_ctx
        self.keep_alive = keep_alive
        self.timeouts = timeouts
        self.auto = concurrency == "auto"
        self.concurrency = 1 if self.auto else int(concurrency)
        self._http = Http(self.base_url, connect=timeouts.connect, auth=auth)
        self._caps: dict[str, Capabilities] = {}

    def request_body(self, request: ChatRequest) -> dict[str, Any]:
        options = {"num_ctx": self.num_ctx, **request.options}
        body: dict[str, Any] = {
            "model": request.model,
            "messages": [_message_json(m) for m in request.messages],
            "stream": True,
            "options": options,
            "keep_alive": self.keep_alive,
            # never cut silently: a prompt over num_ctx is refused with its count (HTTP 400
            # exceed_context_size_error, ollama #16712), and the turn compacts and asks again
            "truncate": False,
        }
        if request.think is not None:
            body["think"] = request.think
        if request.tools:
            body["tools"] = list(request.tools)
        if request.schema is not None:
            body["format"] = request.schema  # structured outputs: the schema object itself
        return body

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        body = self.request_body(request)
        t0 = time.monotonic()
        resp = await self._http.stream(
            "/api/chat",
            body,
            first_byte=self.timeouts.first_byte,
            silent="Ollama (loading the model?)",
        )
        try:
            if resp.status != 200:
                raise classify_status(
                    resp.status,
                    _error_text(await resp.read()),
                    retry_after_seconds(resp.headers.get("retry-after")),
                    request.model,
                )
            lines = TimedLines(resp, self.timeouts, "Ollama", t0=t0)
            merged = Merged()  # the tokens of one read, one event (see Merged)
            first_token_ms: float | None = None
            while True:
                line = await lines.next()
                if line is None:
                    for ev in merged.flush():  # the text before the cut is kept
                        yield ev
                    raise BackendError(
                        "Ollama's stream ended without a final done line (cut off)",
                        transient=True,
                        kind=ErrorKind.CUT,
                    )
                lines.progress()
                if not line.strip():
                    continue
                chunk = json_object(line, "Ollama")
                if "error" in chunk:
                    for ev in merged.flush():  # the text before an error line is kept
                        yield ev
                    raise BackendError(
                        f"Ollama reported an error mid-stream: {chunk['error']}",
                        transient=True,
                        kind=ErrorKind.STREAM_ERROR,
                    )
                events = _events(chunk.get("message") or {})
                if first_token_ms is None and any(ev.text for ev in events):
                    first_token_ms = (time.monotonic() - t0) * 1000
                if chunk.get("done") is True:
                    usage = _usage(chunk, first_token_ms, (time.monotonic() - t0) * 1000)
                    usage.context_window = int(request.options.get("num_ctx", self.num_ctx))
                    for ev in merged.add([*events, StreamEvent("done", usage=usage)]):
                        yield ev
                    await lines.drain()
                    return
                for ev in merged.take(events, more=lines.ready):
                    yield ev
        finally:
            resp.close()

    async def slots(self) -> Slots:
        """Ollama queues and runs requests itself (``OLLAMA_NUM_PARALLEL`` on the server), and
        does not say how many at once: auto is 1, a number in the config wins. Different
        models it runs side by side by itself (``OLLAMA_MAX_LOADED_MODELS``; its scheduler
        queues or evicts when memory is short): with auto, a panel's seats on different
        models go out together."""
        if self.auto:
            return Slots(
                1,
                "auto: 1 a model, different models at once (Ollama's own OLLAMA_NUM_PARALLEL "
                "is not visible)",
                models_at_once=True,
            )
        return Slots(self.concurrency, "config")

    def stale(self) -> None:
        self._caps.clear()

    async def models(self) -> list[str]:
        """The installed models (``/api/tags``), for ``contemplation models``."""
        resp = await self._http.request("GET", "/api/tags", within=self.timeouts.connect * 3)
        if resp.status != 200:
            raise classify_status(resp.status, _error_text(resp.body), None, "")
        try:
            listed = resp.json().get("models") or []
        except (ValueError, AttributeError):
            listed = []
        return [str(m["name"]) for m in listed if isinstance(m, dict) and m.get("name")]

    async def capabilities(self, model: str) -> Capabilities:
        """From ``/api/show`` (cached); the family table when the server lists no capabilities.

        ``context_length`` is what ``/api/ps`` says is allocated when the model is loaded,
        else the trained maximum from ``model_info``.
        """
        if model in self._caps:
            return self._caps[model]
        resp = await self._http.request(
            "POST",
            "/api/show",
            json={"model": model},
            within=self.timeouts.connect * 3,
            resend=True,  # a lookup
        )
        if resp.status != 200:
            raise classify_status(resp.status, _error_text(resp.body), None, model)
        data = json_object(resp.text, "Ollama's /api/show")
        listed = data.get("capabilities")
        server: Capabilities | None = None
        if isinstance(listed, list):  # Ollama < 0.6 does not say; the family table then guesses
            server = Capabilities(
                thinking="thinking" in listed,
                tools="tools" in listed,
                vision="vision" in listed,
                source="server",
                cannot_chat=_not_chat(listed),
            )
        info = data.get("model_info") or {}
        arch = info.get("general.architecture")
        trained = info.get(f"{arch}.context_length") if arch else None
        ctx = await self._allocated_context(model)
        if ctx is None and isinstance(trained, int):
            ctx = trained
        found = capabilities.resolve(
            model, server=server, context_length=ctx, overrides=self.overrides
        )
        result = replace(found, request_window=self.num_ctx)
        self._caps[model] = result
        return result

    async def _allocated_context(self, model: str) -> int | None:
        """``/api/ps`` ``context_length`` of the loaded model (None: not loaded, or no answer)."""
        try:
            resp = await self._http.request("GET", "/api/ps", within=self.timeouts.connect)
            loaded = resp.json().get("models") or [] if resp.status == 200 else []
        except (BackendError, ValueError, AttributeError):
            return None
        wanted = {model, f"{model}:latest"}
        for m in loaded:
            if isinstance(m, dict) and (m.get("name") in wanted or m.get("model") in wanted):
                ctx = m.get("context_length")
                return ctx if isinstance(ctx, int) and ctx > 0 else None
        return None

    async def check(self, model: str | None) -> list[Check]:
        checks: list[Check] = []
        try:
            resp = await self._http.request("GET", "/api/version", within=self.timeouts.connect)
        except BackendError as exc:
            return [
                Check(
                    self.name,
                    False,
                    f"not reachable at {self.base_url} ({exc.kind})",
                    (self._unreachable_hint(),),
                )
            ]
        try:
            version = resp.json().get("version", "?") if resp.status == 200 else None
        except (ValueError, AttributeError):
            version = None
        if version is None:
            return [Check(self.name, False, f"{self.base_url}/api/version answered {resp.status}")]
        checks.append(Check(self.name, True, f"Ollama {version} at {self.base_url}"))
        if model:
            try:
                caps = await self.capabilities(model)
                feats = [n for n in ("thinking", "tools", "vision") if getattr(caps, n)]
                checks.append(
                    Check("model", True, f"{model} is installed ({', '.join(feats) or 'chat'})")
                )
            except BackendError as exc:
                checks.append(Check("model", False, str(exc)))
        return checks

    def _unreachable_hint(self) -> str:
        """OLLAMA_HOST only reaches the ``[ollama]`` section; a named provider has its own url."""
        if self.where == SECTION_HOST:
            return "start it with `ollama serve`, or set OLLAMA_HOST (or ollama.host)"
        return f"start Ollama at {self.base_url}, or change {self.where}"

    async def forget(self, conversation_id: str, session: BackendSession | None = None) -> None:
        return None  # Ollama keeps no per-conversation state

    async def aclose(self) -> None:
        await self._http.aclose()


def parse_ollama_host(value: str | None) -> tuple[str, tuple[str, str] | None]:
    """Normalise ``OLLAMA_HOST`` the way Ollama's own clients do.

    Returns the base URL (no credentials, no trailing slash) and optional basic-auth
    credentials taken from ``user:pass@host``. ``0.0.0.0`` (a bind address) means loopback.
    """
    raw = (value or "").strip()
    if not raw:
        return "http://127.0.0.1:11434", None
    has_scheme = "://" in raw
    scheme, rest = raw.split("://", 1) if has_scheme else ("http", raw)
    if scheme not in {"http", "https"}:
        raise ConfigError(f"invalid OLLAMA_HOST {value!r}: scheme must be http or https")
    try:
        parts = urlsplit(f"{scheme}://{rest}")
    except ValueError as exc:
        raise ConfigError(f"invalid OLLAMA_HOST {value!r}: {exc}") from None
    host = parts.hostname or "127.0.0.1"
    if host in {"0.0.0.0", "::"}:  # noqa: S104 - a bind address, mapped to loopback
        host = "127.0.0.1"
    try:
        explicit_port = parts.port
    except ValueError as exc:
        raise ConfigError(f"invalid OLLAMA_HOST {value!r}: {exc}") from exc
    default_port = (443 if scheme == "https" else 80) if has_scheme else 11434
    port = explicit_port or default_port
    if ":" in host:
        host = f"[{host}]"
    auth = (parts.username or "", parts.password or "") if parts.username else None
    url = urlunsplit((scheme, f"{host}:{port}", parts.path.rstrip("/"), "", ""))
    return url, auth


def _ollama_url(v: str) -> str:
    try:
        parse_ollama_host(v)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return v


class OllamaSettings(Section):
    """``[providers.<name>]`` with ``kind = "ollama"``, or the ``[ollama]`` section."""

    url: str = Field("", description="base URL; empty: host")
    host: str = Field("", description="base URL; empty: OLLAMA_HOST, else http://127.0.0.1:11434")
    num_ctx: int = Field(8192, ge=256)
    keep_alive: str | int = "10m"
    concurrency: Concurrency = Field(
        "auto",
        description="turns at once; auto: 1 a model, and a panel's seats on different models "
        "together (Ollama's parallelism is its own OLLAMA_NUM_PARALLEL)",
    )
    timeouts: TimeoutSettings = Field(default_factory=TimeoutSettings)

    _urls = field_validator("url", "host", mode="after")(_ollama_url)


def _make(m: BackendInputs) -> OllamaBackend:
    s: OllamaSettings = m.own
    url, auth = parse_ollama_host(s.url or s.host)
    at = ".".join(providers.table(m.settings, m.name).at)
    return OllamaBackend(
        url,
        auth=auth,
        num_ctx=s.num_ctx,
        keep_alive=s.keep_alive,
        timeouts=phase_timeouts(s.timeouts, m.settings.max_reply_bytes),
        concurrency=s.concurrency,
        overrides=m.settings.capabilities,
        name=m.name,
        # the key to change: a named provider's url (OLLAMA_HOST reaches [ollama] alone)
        where=f"{at}.{'url' if s.url or (at != SECTION and not s.host) else 'host'}",
    )


KIND = BackendKind(backend_kinds.OLLAMA, _make, OllamaSettings)


def _events(msg: Mapping[str, Any]) -> list[StreamEvent]:
    """One streamed line's message: its thinking, its text, its whole tool calls, in order."""
    events = [StreamEvent("thinking", text=t)] if (t := msg.get("thinking")) else []
    if content := msg.get("content"):
        events.append(StreamEvent("content", text=content))
    calls = msg.get("tool_calls") or []
    return events + [StreamEvent("tool_call", tool_call=c) for c in calls if isinstance(c, dict)]


def _not_chat(listed: list[Any]) -> str:
    """What ``/api/show`` lists for a model that cannot chat (no "completion": an embedding
    model, a ``decision`` one), "" for one that can or a list that says nothing."""
    if not listed or "completion" in listed:
        return ""
    return ", ".join(str(c) for c in listed)
