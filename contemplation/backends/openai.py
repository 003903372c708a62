"""OpenAI-compatible ``POST /v1/chat/completions``, streamed as server-sent events.

One client for llama.cpp's ``llama-server``, the llama-cpp-python server, vLLM, LM Studio,
Ollama's ``/v1`` and hosted APIs; the wire format itself (the body, the events, the errors) is
:mod:`contemplation.backends.chat_completions`. What the client adds:

* the API root: a bare ``host:port`` gets ``/v1``;
* the server's own limits: llama-server's ``/props`` and ``/slots`` (its slots and window),
  vLLM's ``max_model_len``;
* llama-cpp-python's server finds a context overflow only after it has answered 200 to a
  streamed request and then sends an empty stream, so an empty stream is diagnosed once with a
  one-token non-streamed request.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import replace
from pathlib import Path
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
)
from contemplation.backends.chat_completions import (
    OPENAI_KEY,
    ChunkTurn,
    chat_body,
    classify_status,
    sse_payloads,
    stream_error,
)
from contemplation.backends.http import Http, is_loopback
from contemplation.base import backend_kinds
from contemplation.base.redact import credentials
from contemplation.errors import BackendError, ConfigError, ContextOverflow, ErrorKind
from contemplation.models import BackendSession, ChatRequest, StreamEvent
from contemplation.settings import (
    CapabilityOverride,
    Concurrency,
    Section,
    Settings,
    TimeoutSettings,
    check_url,
)

DEFAULT_BASE_URL = "http://127.0.0.1:8080/v1"


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


def local_slot_folder(url: str, slot_save_path: str) -> Path | None:
    """The server's ``--slot-save-path`` as a provider's ``slot_save_path`` names it, where
    the daemon may remove files from it: an absolute folder, of a server on this machine
    (its URL's host a loopback one); else None (its files are only written over)."""
    if not slot_save_path or not Path(slot_save_path).is_absolute():
        return None
    host = urlsplit(normalize_base_url(url)).hostname or ""
    return Path(slot_save_path) if is_loopback(host) else None


def slot_folder(settings: Settings, name: str) -> Path | None:
    """:func:`local_slot_folder` of provider ``name`` (None for a provider of another kind)."""
    t = providers.table(settings, name)
    raw = t.raw.get("slot_save_path") if t.kind == backend_kinds.OPENAI else None
    url = str(t.raw.get("url") or t.raw.get("base_url") or "")
    return local_slot_folder(url, raw) if isinstance(raw, str) else None


def slot_folders(settings: Settings) -> dict[str, Path]:
    """Every provider's :func:`slot_folder` that there is, by provider name."""
    names = [*settings.providers, backend_kinds.OPENAI]
    return {n: f for n in dict.fromkeys(names) if (f := slot_folder(settings, n)) is not None}


def _fresh_file(folder: Path, name: str, since: float) -> bool:
    """``folder/name`` is a regular file (not a link) written at ``since`` or later."""
    try:
        st = os.stat(folder / name, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_mtime >= since - 1  # coarse file clocks


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
        where: str = "openai.url",
        slot_save_path: str = "",
    ) -> None:
        self.name = name
        self.where = where  # the key its URL came from, for the hints that name it
        self.slot_save_path = slot_save_path  # the server's --slot-save-path, as configured
        # a password in the URL is sent as Basic auth, never kept in it (every error text and
        # check line names base_url); with an api key as well, which one is meant is unclear
        self.base_url, auth = credentials(normalize_base_url(base_url))
        api_key = "" if api_key.strip().lower() == "none" else api_key  # the documented "none"
        if auth is not None and api_key:
            raise ConfigError(f"{where} carries a password and api_key is set: use one")
        self.timeouts = timeouts
        self.auto = concurrency == "auto"
        self.concurrency = default_concurrency if self.auto else int(concurrency)
        self.stream_usage = stream_usage
        self.overrides = dict(overrides or {})
        headers: dict[str, str] = {}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = Http(self.base_url, connect=timeouts.connect, headers=headers, auth=auth)
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
                    url_key=self._url_key(),
                    key_at=self._key_at(),
                )
            lines = TimedLines(resp, self.timeouts, self.base_url, t0=turn.t0)
            merged = Merged()  # the tokens of one read, one event (see Merged)
            async for name, payload in sse_payloads(lines):
                turn.events_seen += 1
                if payload.strip() == "[DONE]":
                    for ev in merged.flush() + turn.finish(self._known_context(request.model)):
                        yield ev
                    await lines.drain()
                    return
                try:
                    events = self._payload(turn, name, payload)
                except BackendError:
                    for ev in merged.flush():  # the text before an error event is kept
                        yield ev
                    raise
                for ev in merged.take(events, more=lines.ready):
                    yield ev
            for ev in merged.flush():
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
                resp.status,
                resp.body,
                resp.headers,
                model=model,
                url=self.base_url,
                key_at=self._key_at(),
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
            raise classify_status(
                resp.status,
                resp.body,
                resp.headers,
                model="",
                url=self.base_url,
                key_at=self._key_at(),
            )
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

    async def count_tokens(self, text: str, *, within: float) -> int | None:
        """llama-server's ``POST /tokenize`` ``{"content": text}`` → ``{"tokens": [...]}``
        (beside the API, at the server's root); None for a server without it (vLLM asks
        for other fields, hosted APIs have none) or one that fails or is late."""
        try:
            resp = await self._http.request(
                "POST", self.root("tokenize"), json={"content": text}, within=within, resend=True
            )
            tokens = resp.json().get("tokens") if resp.status == 200 else None
        except (BackendError, ValueError, AttributeError):
            return None
        return len(tokens) if isinstance(tokens, list) else None

    async def slot_ids(self) -> int:
        """How many slots a request may name by ``id_slot``: llama-server's ``/props``
        ``total_slots`` (0: another server)."""
        total = (await self.props() or {}).get("total_slots")
        return min(total, 64) if isinstance(total, int) and total > 0 else 0

    async def copies_slots(self, idle: int) -> bool:
        """Whether llama-server copies slots (:meth:`copy_slot`): it saves slot ``idle``
        (no request on it: a few bytes) where it was started with ``--slot-save-path``,
        and answers 501 where not."""
        return await self._slot_action(idle, "save", idle)

    async def copy_slot(self, source: int, target: int) -> bool:
        """Slot ``source``'s cache into slot ``target``: llama-server's ``POST
        /slots/{id}?action=save`` to a file in its ``--slot-save-path`` (one a slot, written
        again each time), then ``restore`` from it, milliseconds; False where the server
        did not. A slot busy on the server queues it."""
        return await self._slot_action(source, "save", source) and await self._slot_action(
            target, "restore", source
        )

    async def served_model(self) -> str:
        """The model file llama-server serves (``/props`` ``model_path``; "": not said):
        slot files are restored only into the model that made them."""
        path = (await self.props() or {}).get("model_path")
        return path if isinstance(path, str) else ""

    async def keep_slot(self, slot: int, action: str, filename: str) -> tuple[int, int] | None:
        """llama-server's ``POST /slots/{slot}?action=save|restore`` with a file of its
        ``--slot-save-path``: the tokens and bytes saved or restored (``n_saved``
        and ``n_written``, ``n_restored`` and ``n_read``), None where the server did not."""
        resp = await self._http.request(
            "POST", self.root(f"slots/{slot}"), params={"action": action},
            json={"filename": filename}, within=self.timeouts.connect * 3,
            resend=True,  # harmless twice (the same slot to the same file): see Http._send
        )  # fmt: skip
        try:
            said = resp.json() if resp.status == 200 else None
        except ValueError:
            return None
        keys = ("n_saved", "n_written") if action == "save" else ("n_restored", "n_read")
        n, size = (said.get(k) for k in keys) if isinstance(said, dict) else (None, None)
        return (n, size if isinstance(size, int) else 0) if isinstance(n, int) else None

    async def _slot_action(self, slot: int, action: str, file_of: int) -> bool:
        resp = await self._http.request(
            "POST", self.root(f"slots/{slot}"), params={"action": action},
            json={"filename": f"contemplation-slot-{file_of}.bin"},
            within=self.timeouts.connect * 3, resend=True,
        )  # fmt: skip
        return resp.status == 200

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
            return [Check(self.name, False, str(exc), (self._hint(exc.kind),))]
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
        if (kept := await self._slot_files_check()) is not None:
            checks.append(kept)
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

    async def _slot_files_check(self) -> Check | None:
        """llama-server: whether it keeps slot files (``--slot-save-path``), which keep a
        conversation's prompt cached across a daemon or server restart, asked by saving an
        idle slot (as the daemon does before its first slot copy); and whether this
        provider's ``slot_save_path`` names that folder, so that the files of conversations
        that are gone are removed: that save is looked for there. None: not llama-server,
        or no slot idle to ask with."""
        try:
            if not isinstance((await self.props() or {}).get("total_slots"), int):
                return None
            listed = await self._server_json("slots")
            idle: list[int] = [
                s["id"] for s in listed or []
                if isinstance(s, dict) and s.get("is_processing") is False
                and isinstance(s.get("id"), int)
            ]  # fmt: skip
            if not idle:
                return None
            asked = time.time()
            kept = await self.copies_slots(idle[0])
        except BackendError:
            return None
        return self._slot_files_line(kept, f"contemplation-slot-{idle[0]}.bin", asked)

    def _slot_files_line(self, kept: bool, probe: str, asked: float) -> Check:
        """doctor's ``slot files`` line, from whether the server saved slot file ``probe``
        (at ``asked``) and this provider's ``slot_save_path``."""
        key = f"{self.where.rpartition('.')[0]}.slot_save_path"
        raw = self.slot_save_path
        if not kept:
            said = f" ({key} is set, but the server was not started with it)" if raw else ""
            return Check(
                "slot files", True, f"off for {self.name}: a conversation resumed after a "
                f"restart prefills its whole prompt again{said}",
                (f'start llama-server with --slot-save-path DIR (a folder only you can read) '
                 f'and set {key} = "DIR"',),
                warn=True,
            )  # fmt: skip
        warm = f"kept by {self.name} (--slot-save-path): conversations stay warm across restarts"
        if not raw:
            return Check(
                "slot files", True, f"{warm}; the files of conversations that are gone are "
                "only written over, never removed",
                (f'set {key} = "<the folder given to --slot-save-path>" to have them removed',),
                warn=True,
            )  # fmt: skip
        if not Path(raw).is_absolute():
            return Check(
                "slot files", True, f"{warm}; {key} = {raw!r} is not an absolute folder: "
                "nothing is removed from it",
                (f"set {key} to the absolute folder given to --slot-save-path",), warn=True,
            )  # fmt: skip
        folder = local_slot_folder(self.base_url, raw)
        if folder is None:
            return Check(
                "slot files", True, f"{warm}; the server is not on this machine, so {key} "
                "is not used: its files are only written over",
                (f"remove {key} (files are removed only from a server on this machine)",),
                warn=True,
            )  # fmt: skip
        if not _fresh_file(folder, probe, asked):
            return Check(
                "slot files", True, f"{warm}, but not in {folder}: the server's save of an "
                f"idle slot ({probe}) is not there, so nothing is removed from it",
                (f"set {key} to the folder given to llama-server's --slot-save-path",),
                warn=True,
            )  # fmt: skip
        return Check(
            "slot files", True, f"kept by {self.name} in {folder} (--slot-save-path): "
            "conversations stay warm across restarts; the files of conversations that are "
            "gone are removed from it",
        )  # fmt: skip

    def _url_key(self) -> str:
        """The key a wrong URL is fixed in: the environment's only for the ``[openai]`` section."""
        if self.where == "openai.base_url":
            return "OPENAI_BASE_URL (or openai.base_url)"
        return self.where

    def _key_at(self) -> str:
        """The setting its API key is read from: OPENAI_API_KEY reaches the ``[openai]``
        section alone; a named provider reads its own ``providers.<name>.api_key``."""
        table = self.where.rpartition(".")[0]
        return OPENAI_KEY if table == "openai" else f"{table}.api_key"

    def _hint(self, kind: str) -> str:
        """What to do when the server cannot be reached or refuses the key: the keys this
        provider reads (the environment's OPENAI_* only reach the ``[openai]`` section)."""
        if kind == "auth":
            return f"set {self._key_at()}"
        if self.where == "openai.base_url":
            return "start the server, or set OPENAI_BASE_URL (or openai.base_url)"
        return f"start the server at {self.base_url}, or change {self.where}"

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
    slot_save_path: str = Field(
        "",
        description="llama-server's --slot-save-path, an absolute folder, when the server runs "
        "on this machine: a conversation archived, pruned or deleted has its slot files "
        "removed from it (only files the daemon's map names for it); empty: written over",
    )
    timeouts: TimeoutSettings = Field(default_factory=TimeoutSettings)

    _urls = field_validator("url", "base_url", mode="after")(check_url)


def _make(m: BackendInputs) -> OpenAIBackend:
    s: OpenAISettings = m.own
    at = ".".join(providers.table(m.settings, m.name).at)
    return OpenAIBackend(
        s.url or s.base_url,
        where=f"{at}.{'url' if s.url else 'base_url'}",
        api_key=s.api_key,
        timeouts=phase_timeouts(s.timeouts, m.settings.max_reply_bytes),
        concurrency=s.concurrency,
        default_concurrency=s.default_concurrency,
        stream_usage=s.stream_usage,
        overrides=m.settings.capabilities,
        name=m.name,
        slot_save_path=s.slot_save_path,
    )


KIND = BackendKind(backend_kinds.OPENAI, _make, OpenAISettings)
