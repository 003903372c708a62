"""``opencode serve`` through its v1 HTTP API: one OpenCode session per conversation.

Wire facts this relies on (verified against OpenCode 1.18.33; docs/guides/backends.md has sources):

* ``GET /global/health`` → ``{"healthy": true, "version": "…"}``;
* ``POST /session`` → a session ``{"id": "ses_…"}``; ``DELETE /session/{id}`` → ``true``
  (404 once it is gone); ``GET /session/{id}/message?limit=1`` → ``[{"info", "parts"}]``, the
  session's last message (404 for an unknown session);
* ``POST /session/{id}/message`` blocks until the turn ends and returns ``{"info", "parts"}``;
  the model is ``{"providerID", "modelID"}``, OpenCode's tools are switched per prompt with a
  ``{"tool": bool}`` map, and ``system`` is appended to OpenCode's own system prompt;
* errors: 404 ``NotFoundError`` (unknown session), 400 ``BadRequest``, 500 ``UnknownError``
  (also for an unknown model), 401 without the Basic credentials; a model failure is a 200
  whose ``info.error`` says what (``APIError`` after OpenCode's own retries,
  ``MessageAbortedError`` after ``POST /session/{id}/abort``, ...).

The session keeps the history, so after the first turn only the new messages are sent. After
each reply the backend reports the session (a ``session`` event: its id, how many messages of the
history it holds, their digest, the id of its last message) and the turn records it in
state.json with the reply's commit (backends never write under the home). The next request
carries it back (``ChatRequest.session``), so a restarted daemon goes on in the same session once
the server confirms it is as it was left (its last message is the recorded one). A session that
is gone, that went on without us (a daemon that stopped before it recorded its reply), or whose
history no longer matches the log (an edit, a failed turn) is replaced: a new session gets the
whole history, flattened. Sessions outlive the daemon; they are deleted when their conversation
is archived (:meth:`OpenCodeBackend.forget`, told the id by the archived state.json), when a turn
fails in them, and at once for a request without a conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import structlog
from pydantic import Field, field_validator

from contemplation.backends import BackendInputs, BackendKind, capabilities, providers
from contemplation.backends.base import Capabilities, Check, Slots, json_object
from contemplation.backends.http import Http, Reply
from contemplation.backends.thinking import ThinkSplitter
from contemplation.base import backend_kinds
from contemplation.base.redact import credentials
from contemplation.errors import BackendError, ConfigError, ContextOverflow, ErrorKind
from contemplation.models import BackendSession, ChatMessage, ChatRequest, StreamEvent, Usage
from contemplation.settings import CapabilityOverride, Concurrency, Section, check_url

# OpenCode 1.18's built-in tools (agent "build"); all off by default: we want a conversation,
# not a coding agent acting on the server's working directory.
OPENCODE_TOOLS = (
    "bash", "edit", "glob", "grep", "question", "read", "skill", "task", "todowrite", "webfetch",
    "write",
)  # fmt: skip


class OpenCodeTimeouts(Section):
    connect: float = Field(10.0, gt=0)
    create: float = Field(30.0, gt=0, description="creating a session")
    prompt: float = Field(1800.0, gt=0, description="one whole turn (OpenCode retries upstream)")
    delete: float = Field(10.0, gt=0, description="deleting or aborting a session")


class OpenCodeSettings(Section):
    """``kind = "opencode"``, or the ``[opencode]`` section: ``opencode serve`` (v1 API),
    one OpenCode session per conversation."""

    url: str = Field("", description="empty: OPENCODE_SERVER_URL, else http://127.0.0.1:4096")
    username: str = Field("", description="empty: OPENCODE_SERVER_USERNAME, else opencode")
    password: str = Field("", description="empty: OPENCODE_SERVER_PASSWORD; none: no auth")
    agent: str = Field("", description="empty: OpenCode's default agent")
    tools: dict[str, bool] = Field(
        default_factory=lambda: dict.fromkeys(OPENCODE_TOOLS, False),
        description="OpenCode's own tools, on or off, sent with every prompt",
    )
    concurrency: Concurrency = Field("auto", description="turns at once; auto: 1")
    timeouts: OpenCodeTimeouts = Field(default_factory=OpenCodeTimeouts)

    _url = field_validator("url", mode="after")(check_url)


log = structlog.get_logger("contemplation.backends.opencode")

DEFAULT_URL = "http://127.0.0.1:4096"
FAMILY = "opencode"


class _SessionGone(Exception):
    """404 NotFoundError for a session we thought existed."""


def split_model(model: str) -> tuple[str, str]:
    """``"local/smollm2"`` → ``("local", "smollm2")``; the model id may hold more slashes."""
    provider, sep, model_id = model.partition("/")
    if not sep or not provider or not model_id:
        raise BackendError(
            f"OpenCode models are named provider/model (e.g. local/qwen3); got {model!r}",
            transient=False,
            kind=ErrorKind.BAD_REQUEST,
        )
    return provider, model_id


def _split_system(messages: Sequence[ChatMessage]) -> tuple[str, list[ChatMessage]]:
    system = "\n\n".join(m.content for m in messages if m.role == "system")
    return system, [m for m in messages if m.role != "system"]


def digest(messages: Iterable[tuple[str, str]]) -> str:
    """What a session holds, as one sha256: each message's role, and its text unless it is a
    reply (what the log keeps of a reply may differ from OpenCode's copy in layout)."""
    h = hashlib.sha256()
    for role, content in messages:
        h.update(json.dumps([role, "" if role == "assistant" else content]).encode())
        h.update(b"\n")
    return h.hexdigest()


def _pairs(messages: Iterable[ChatMessage]) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in messages]


def new_messages(held: BackendSession, history: list[ChatMessage]) -> list[ChatMessage]:
    """The messages after what the session already holds; [] when the two have diverged.

    The first ``held.messages`` of the history must be what the session was given: user text
    exactly, a reply only by position (see :func:`digest`). Only user or tool messages can be
    new.
    """
    n = held.messages
    if n <= 0 or len(history) <= n or digest(_pairs(history[:n])) != held.digest:
        return []
    fresh = history[n:]
    return fresh if all(m.role in {"user", "tool"} for m in fresh) else []


def flatten(history: list[ChatMessage]) -> str:
    """The whole history as one prompt, for a session that has none of it."""
    last_reply = max((i for i, m in enumerate(history) if m.role == "assistant"), default=-1)
    if last_reply < 0:
        return "\n\n".join(m.content for m in history)
    earlier = "\n\n".join(f"[{m.role}]\n{m.content}" for m in history[: last_reply + 1])
    latest = "\n\n".join(m.content for m in history[last_reply + 1 :])
    return (
        "This conversation started earlier; here it is so far (you are the assistant):\n\n"
        f"{earlier}\n\n[the new message]\n{latest}"
    )


def _json_or_text(resp: Reply) -> Any:
    try:
        return resp.json()
    except ValueError:
        return resp.text


def _last_message_id(resp: Reply) -> str | None:
    """The id of the last message in a ``GET /session/{id}/message`` answer."""
    data = _json_or_text(resp)
    last = data[-1] if isinstance(data, list) and data else None
    info = last.get("info") if isinstance(last, dict) else None
    sid = info.get("id") if isinstance(info, dict) else None
    return sid if isinstance(sid, str) else None


def _error_message(data: Any) -> tuple[str, str]:
    """``(name, message)`` of an OpenCode error body (``{"name", "data": {"message"}}``)."""
    if not isinstance(data, dict):
        return "", str(data)[:500]
    inner = data.get("data") if isinstance(data.get("data"), dict) else {}
    name = str(data.get("name") or data.get("_tag") or "")
    message = str((inner or {}).get("message") or data.get("message") or data)[:500]
    return name, message


def info_error(error: Mapping[str, Any]) -> BackendError:
    """A failed turn as OpenCode reports it in ``info.error`` (HTTP 200)."""
    name, message = _error_message(error)
    data = error.get("data") if isinstance(error.get("data"), dict) else {}
    if name == "MessageAbortedError":
        return BackendError(
            f"OpenCode aborted the turn: {message}", transient=False, kind=ErrorKind.CANCELLED
        )
    if name == "ContextOverflowError":
        return ContextOverflow(f"OpenCode: the prompt does not fit the model's context: {message}")
    if name == "ProviderAuthError":
        return BackendError(
            f"OpenCode's provider refused its credentials: {message}",
            transient=False,
            kind=ErrorKind.AUTH,
        )
    if name in {"ContentFilterError", "StructuredOutputError"}:
        return BackendError(f"OpenCode: {name}: {message}", transient=False, kind=ErrorKind.REFUSED)
    status = (data or {}).get("statusCode")
    retryable = (data or {}).get("isRetryable")
    if (
        name == "APIError"
        and retryable is False
        and isinstance(status, int)
        and 400 <= status < 500
        and status not in {408, 429}
    ):
        return BackendError(
            f"OpenCode: the model call was rejected ({status}): {message}",
            transient=False,
            kind=ErrorKind.UPSTREAM,
            status_code=status,
        )
    return BackendError(
        f"OpenCode: the model call failed ({name or 'error'}): {message}",
        transient=True,
        kind=ErrorKind.UPSTREAM,
        status_code=status if isinstance(status, int) else None,
    )


class OpenCodeBackend:
    name = "opencode"
    label = "OPENCODE"

    def __init__(
        self,
        base_url: str,
        *,
        auth: tuple[str, str] | None = None,
        tools: Mapping[str, bool] | None = None,
        agent: str = "",
        timeouts: OpenCodeTimeouts | None = None,
        concurrency: int | str = 1,
        overrides: Mapping[str, CapabilityOverride] | None = None,
        name: str = "opencode",
        where: str = "opencode.url",
    ) -> None:
        self.name = name
        # a password in the URL is the Basic auth, never kept in it (error texts name base_url)
        self.base_url, in_url = credentials((base_url.strip() or DEFAULT_URL).rstrip("/"))
        if in_url is not None and auth is not None:
            raise ConfigError(f"{where} carries a password and password is set: use one")
        auth = auth or in_url
        self.tools = dict(tools or {})
        self.agent = agent
        self.timeouts = timeouts or OpenCodeTimeouts.model_validate({})
        self.configured = concurrency != "auto"
        self.concurrency = int(concurrency) if self.configured else 1
        self.overrides = dict(overrides or {})
        self._http = Http(self.base_url, connect=self.timeouts.connect, auth=auth)
        self._sessions: dict[str, BackendSession] = {}  # what this process knows is held
        self._locks: dict[str, asyncio.Lock] = {}
        self._providers: dict[str, Any] | None = None
        self._caps: dict[str, Capabilities] = {}

    # -- the turn ------------------------------------------------------------------------

    def prompt_body(
        self, request: ChatRequest, text: str, system: str, sent: Sequence[ChatMessage] = ()
    ) -> dict[str, Any]:
        """``sent``: the messages ``text`` holds; their images go as file parts
        (``FilePartInput``: type, mime, url, filename) after the text."""
        provider, model_id = split_model(request.model)
        files = [
            {"type": "file", "mime": i.mime, "url": i.data_uri(), "filename": i.name}
            for m in sent
            for i in m.images
        ]
        body: dict[str, Any] = {
            "parts": [{"type": "text", "text": text}, *files],
            "model": {"providerID": provider, "modelID": model_id},
        }
        if self.tools:
            body["tools"] = dict(self.tools)
        if system:
            body["system"] = system
        if self.agent:
            body["agent"] = self.agent
        return body

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        split_model(request.model)  # a bad name fails before anything is created
        system, history = _split_system(request.messages)
        if not history:
            raise BackendError(
                "nothing to send to OpenCode", transient=False, kind=ErrorKind.BAD_REQUEST
            )
        key = request.conversation_id
        t0 = time.monotonic()
        async with self._locks.setdefault(key, asyncio.Lock()):
            session = self._sessions.get(key)
            recorded = request.session  # what state.json says: known after a restart too
            if session is None and key and recorded is not None and recorded.backend == FAMILY:
                session = await self._resume(key, recorded)
            fresh = new_messages(session, history) if session else []
            if session is None or not fresh:
                if session is not None:  # it holds a history we no longer have
                    await self._discard(key)
                session = await self._create(key)
                text, sent = flatten(history), history
            else:
                text, sent = "\n\n".join(m.content for m in fresh), fresh
            try:
                try:
                    body = self.prompt_body(request, text, system, sent)
                    data = await self._prompt(session.id, body)
                except _SessionGone:  # deleted on the server: once more with a new one
                    self._sessions.pop(key, None)
                    session = await self._create(key)
                    body = self.prompt_body(request, flatten(history), system, history)
                    try:
                        data = await self._prompt(session.id, body)
                    except _SessionGone:
                        raise BackendError(
                            "OpenCode lost a session it had just created",
                            transient=True,
                            kind=ErrorKind.SESSION_LOST,
                        ) from None
                events, reply = self._events(data, t0, request.model)
            except BaseException:
                # the session may hold half a turn: never reuse it
                await self._discard(key)
                raise
            info = data.get("info") if isinstance(data.get("info"), dict) else None
            last = (info or {}).get("id")
            held = self._sessions[key] = BackendSession(
                backend=FAMILY,
                provider=self.name,
                id=session.id,
                messages=len(history) + 1,
                digest=digest([*_pairs(history), ("assistant", reply)]),
                last_message=last if isinstance(last, str) else "",
            )
            if key:  # recorded in state.json with the reply, for the next start
                events.insert(len(events) - 1, StreamEvent("session", session=held.model_copy()))
            else:
                await self._discard(key)  # no conversation to come back to
        for ev in events:
            yield ev

    async def _resume(self, key: str, recorded: BackendSession) -> BackendSession | None:
        """The session state.json names, if the server still has it as it was left: its last
        message is the one recorded. None: gone (a new one is made), or it went on without us
        (a daemon that stopped before recording its reply) and is deleted."""
        resp = await self._http.request(
            "GET",
            f"/session/{quote(recorded.id, safe='')}/message",
            params={"limit": 1},
            within=self.timeouts.create,
            late=f"OpenCode did not list a session's messages within {self.timeouts.create:g} s",
        )
        if resp.status in {400, 404}:  # unknown, or no session id at all (a hand edit)
            log.info("opencode_session_gone", conv=key, session=recorded.id)
            return None
        if resp.status != 200:
            raise await self._status_error(resp, "")
        if recorded.last_message and _last_message_id(resp) != recorded.last_message:
            log.info("opencode_session_moved_on", conv=key, session=recorded.id)
            await self._delete(recorded.id)
            return None
        held = self._sessions[key] = recorded.model_copy()
        return held

    async def _create(self, key: str) -> BackendSession:
        title = f"contemplation {key}" if key else "contemplation"
        resp = await self._http.request(
            "POST",
            "/session",
            json={"title": title},
            within=self.timeouts.create,
            late=f"OpenCode did not create a session within {self.timeouts.create:g} s",
        )
        if resp.status != 200:
            raise await self._status_error(resp, "")
        data = _json_or_text(resp)
        sid = data.get("id") if isinstance(data, dict) else None
        if not isinstance(sid, str) or not sid:
            raise BackendError(
                f"OpenCode created a session without an id: {resp.text[:200]}",
                transient=True,
                kind=ErrorKind.PROTOCOL,
            )
        session = self._sessions[key] = BackendSession(backend=FAMILY, id=sid, provider=self.name)
        return session

    async def _prompt(self, sid: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"/session/{quote(sid, safe='')}/message"
        try:
            resp = await self._http.request(
                "POST",
                url,
                json=body,
                within=self.timeouts.prompt,
                late=f"OpenCode did not finish the turn within {self.timeouts.prompt:g} s",
            )
        except BackendError as exc:
            if exc.kind is ErrorKind.TIMEOUT:
                await self._abort(sid)
            raise
        except asyncio.CancelledError:
            await self._abort(sid)
            raise
        if resp.status == 404:
            raise _SessionGone
        if resp.status != 200:
            model = body["model"]
            raise await self._status_error(resp, f"{model['providerID']}/{model['modelID']}")
        return json_object(resp.text, "OpenCode")

    async def _status_error(self, resp: Reply, model: str) -> BackendError:
        try:
            name, message = _error_message(resp.json())
        except ValueError:
            name, message = "", resp.text[:500]
        status = resp.status
        if status == 401:
            return BackendError(
                f"OpenCode at {self.base_url} wants a password (401); "
                "set OPENCODE_SERVER_PASSWORD (and OPENCODE_SERVER_USERNAME if not opencode)",
                transient=False,
                kind=ErrorKind.AUTH,
                status_code=401,
            )
        if status >= 500 and model and await self._model_missing(model):
            return BackendError(
                f"OpenCode does not know the model {model!r} (see `opencode models`)",
                transient=False,
                kind=ErrorKind.MODEL_NOT_FOUND,
                status_code=status,
            )
        transient = status >= 500 or status in {408, 429}
        return BackendError(
            f"OpenCode answered {status} {name}: {message}".replace("  ", " "),
            transient=transient,
            kind=ErrorKind.SERVER_ERROR if transient else ErrorKind.BAD_REQUEST,
            status_code=status,
        )

    def _events(self, data: dict[str, Any], t0: float, model: str) -> tuple[list[StreamEvent], str]:
        info = data.get("info") if isinstance(data.get("info"), dict) else {}
        info = info or {}
        error = info.get("error")
        if isinstance(error, dict) and error.get("name") != "MessageOutputLengthError":
            raise info_error(error)
        events: list[StreamEvent] = []
        reply: list[str] = []
        splitter = ThinkSplitter()
        for part in data.get("parts") or []:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            text = part.get("text") if isinstance(part.get("text"), str) else ""
            if kind == "reasoning" and text:
                events.append(StreamEvent("thinking", text=text))
            elif kind == "text" and text and not part.get("synthetic") and not part.get("ignored"):
                for k, t in [*splitter.feed(text), *splitter.flush()]:
                    events.append(StreamEvent(k, text=t))
                    if k == "content":
                        reply.append(t)
            elif kind == "tool":
                state = part.get("state") if isinstance(part.get("state"), dict) else {}
                status = (state or {}).get("status", "?")
                events.append(
                    StreamEvent("note", text=f"OpenCode ran its tool {part.get('tool')} ({status})")
                )
            elif kind == "retry":
                _, why = _error_message(part.get("error"))
                events.append(
                    StreamEvent(
                        "note",
                        text=f"OpenCode retried the model (attempt {part.get('attempt')}): {why}",
                    )
                )
        if isinstance(error, dict):
            events.append(
                StreamEvent("note", text="OpenCode stopped the reply at the output limit")
            )
        tokens = info.get("tokens") if isinstance(info.get("tokens"), dict) else {}
        tokens = tokens or {}
        if not any(tokens.get(k) for k in ("input", "output", "total")):
            tokens = {}  # all zero: the upstream server reported no usage (llama-cpp-python)

        def count(v: Any) -> int | None:
            return int(v) if isinstance(v, int | float) else None

        caps = self._caps.get(model)
        # OpenCode's input leaves out what the cache gave (cache.read) and what was written
        # to it (cache.write, computed): its total is input + output + both
        cache = tokens.get("cache") if isinstance(tokens.get("cache"), dict) else None
        sent, read = count(tokens.get("input")), None
        computed = None
        if cache is not None and sent is not None:
            read = count(cache.get("read"))
            computed = sent + (count(cache.get("write")) or 0)
            sent = computed + (read or 0)
        usage = Usage(
            prompt_eval_count=sent,
            cached_tokens=read,
            computed_tokens=computed,
            eval_count=count(tokens.get("output")),
            wall_ms=(time.monotonic() - t0) * 1000,
            done_reason=str(info["finish"]) if info.get("finish") else None,
            context_window=caps.context_length if caps else None,
        )
        events.append(StreamEvent("done", usage=usage))
        return events, "".join(reply)

    # -- session housekeeping ------------------------------------------------------------

    async def _abort(self, sid: str) -> None:
        with contextlib.suppress(BackendError):
            await self._http.request(
                "POST", f"/session/{quote(sid, safe='')}/abort", within=self.timeouts.delete
            )

    async def _delete(self, sid: str) -> bool:
        """Delete a session; a failure is logged, never raised (False). Already gone is done."""
        try:
            resp = await self._http.request(
                "DELETE", f"/session/{quote(sid, safe='')}", within=self.timeouts.delete
            )
        except BackendError as exc:
            log.warning("opencode_delete_failed", session=sid, error=str(exc))
            return False
        if resp.status in {200, 404}:
            return True
        _, message = _error_message(_json_or_text(resp))
        log.warning("opencode_delete_failed", session=sid, status=resp.status, error=message)
        return False

    async def _discard(self, key: str) -> None:
        session = self._sessions.pop(key, None)
        if session is not None:
            await self._delete(session.id)

    def session_id(self, conversation_id: str) -> str | None:
        """The OpenCode session serving a conversation (None: none known to this process)."""
        s = self._sessions.get(conversation_id)
        return s.id if s else None

    async def forget(self, conversation_id: str, session: BackendSession | None = None) -> None:
        """Delete the conversation's session: the one this process used, and the one its
        state.json names (the only one known after a restart). A failure is logged."""
        held = self._sessions.pop(conversation_id, None)
        self._locks.pop(conversation_id, None)
        ids = {s.id for s in (held, session) if s is not None and s.backend == FAMILY}
        for sid in sorted(ids):
            if await self._delete(sid):
                log.info("opencode_session_deleted", conv=conversation_id, session=sid)

    async def aclose(self) -> None:
        """Close the client. The sessions stay: a restarted daemon goes on in them."""
        await self._http.aclose()

    # -- what the server knows -----------------------------------------------------------

    async def _provider_models(self) -> dict[str, Any] | None:
        """``{"provider/model": model info}`` from ``GET /config/providers`` (cached)."""
        if self._providers is not None:
            return self._providers
        try:
            resp = await self._http.request("GET", "/config/providers", within=self.timeouts.create)
            data = resp.json() if resp.status == 200 else None
        except (BackendError, ValueError):
            return None
        if not isinstance(data, dict):
            return None
        found: dict[str, Any] = {}
        for provider in data.get("providers") or []:
            if not isinstance(provider, dict):
                continue
            for mid, info in (provider.get("models") or {}).items():
                found[f"{provider.get('id')}/{mid}"] = info
        self._providers = found
        return found

    async def _model_missing(self, model: str) -> bool:
        models = await self._provider_models()
        return models is not None and model not in models

    async def slots(self) -> Slots:
        """OpenCode does not say how many prompts it runs at once: 1 unless configured."""
        return Slots(self.concurrency, "config" if self.configured else "auto: 1")

    def stale(self) -> None:
        self._caps.clear()

    async def models(self) -> list[str]:
        """``provider/model`` names the server offers (``GET /config/providers``)."""
        found = await self._provider_models()
        if found is None:
            raise BackendError(
                f"cannot list the models of {self.base_url} (GET /config/providers failed)",
                transient=True,
                kind=ErrorKind.UNREACHABLE,
            )
        return sorted(found)

    async def capabilities(self, model: str) -> Capabilities:
        if model in self._caps:
            return self._caps[model]
        info = (await self._provider_models() or {}).get(model)
        server: Capabilities | None = None
        ctx: int | None = None
        if isinstance(info, dict):
            feats = info.get("capabilities") if isinstance(info.get("capabilities"), dict) else {}
            limit = info.get("limit") if isinstance(info.get("limit"), dict) else {}
            raw_ctx = (limit or {}).get("context")
            ctx = int(raw_ctx) if isinstance(raw_ctx, int | float) and raw_ctx > 0 else None
            if feats:
                inputs = feats.get("input") if isinstance(feats.get("input"), dict) else {}
                server = Capabilities(
                    thinking=bool(feats.get("reasoning")),
                    tools=bool(feats.get("toolcall")),
                    vision=bool((inputs or {}).get("image")),
                    context_length=ctx,
                    source="server",
                )
        result = capabilities.resolve(
            model, server=server, context_length=ctx, overrides=self.overrides
        )
        self._caps[model] = result
        return result

    async def check(self, model: str | None) -> list[Check]:
        try:
            resp = await self._http.request("GET", "/global/health", within=self.timeouts.connect)
        except BackendError as exc:
            return [
                Check(
                    self.name,
                    False,
                    f"not reachable at {self.base_url} ({exc.kind})",
                    ("start it with `opencode serve`, or set OPENCODE_SERVER_URL",),
                )
            ]
        if resp.status == 401:
            return [
                Check(
                    self.name,
                    False,
                    f"{self.base_url} wants a password (401)",
                    ("set OPENCODE_SERVER_PASSWORD (and OPENCODE_SERVER_USERNAME)",),
                )
            ]
        try:
            health = resp.json()
        except ValueError:
            health = None
        if resp.status != 200 or not isinstance(health, dict) or not health.get("healthy"):
            return [
                Check(self.name, False, f"{self.base_url}/global/health answered {resp.status}")
            ]
        checks = [
            Check(self.name, True, f"OpenCode {health.get('version', '?')} at {self.base_url}")
        ]
        if model:
            try:
                split_model(model)
            except BackendError as exc:
                return [*checks, Check("model", False, str(exc))]
            models = await self._provider_models()
            if models is None:
                checks.append(Check("model", False, "OpenCode did not list its providers"))
            elif model in models:
                checks.append(Check("model", True, f"OpenCode knows {model}"))
            else:
                checks.append(
                    Check("model", False, f"OpenCode does not know {model}", tuple(sorted(models)))
                )
        return checks


def _make(m: BackendInputs) -> OpenCodeBackend:
    s: OpenCodeSettings = m.own
    return OpenCodeBackend(
        s.url,
        where=f"{'.'.join(providers.table(m.settings, m.name).at)}.url",
        auth=(s.username or "opencode", s.password)
        if s.password and s.password.lower() != "none"  # the documented "none": no auth
        else None,
        tools=s.tools,
        agent=s.agent,
        timeouts=s.timeouts,
        concurrency=s.concurrency,
        overrides=m.settings.capabilities,
        name=m.name,
    )


KIND = BackendKind(backend_kinds.OPENCODE, _make, OpenCodeSettings)
