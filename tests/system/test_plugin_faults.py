"""A plugin takes down its own work, never the daemon.

The faulty plugin (tests/faulty_plugin.py) is installed as a distribution (a dist-info folder
with its entry points, as pip writes one) and found by real processes through
importlib.metadata: what its backend, tool or context kind raises, BaseException included,
is that turn's or that need's failure naming the plugin, and the daemon serves on; a plugin
that calls sys.exit or os._exit at import is one line in ``plugins`` and ``doctor`` (which
exit 1), and ``run`` starts without it; one that kills its process outright is named by
``plugins --probe`` and ``doctor``, which import each plugin in a child process first."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import threading
import time
import urllib.request
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import structlog

from contemplation.backends.base import Capabilities, Check, phase_timeouts
from contemplation.backends.guard import Guarded
from contemplation.daemon import loopwatch
from contemplation.engine.pipeline import Runtime
from contemplation.errors import BackendError
from contemplation.faces.dashboard import cards
from contemplation.models import BackendSession, ChatMessage, ChatRequest, Status, StreamEvent
from contemplation.needs.tools import registry
from contemplation.prompt import context_kinds
from contemplation.settings import Settings, TimeoutSettings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests.conftest import DaemonProc, base_env, cli, model_replies, poll, run_burst, wait_for
from tests.dashboard_served import Served, serve
from tests.fakes.ollama_server import FakeOllama, Step
from tests.faulty_plugin import RAISED, faulty_context, faulty_tool

FAULTY = {
    "contemplation.backends": {"faulty": "tests.faulty_plugin:faulty"},
    "contemplation.tools": {"faulty": "tests.faulty_plugin:faulty_tool"},
    "contemplation.context": {"faulty": "tests.faulty_plugin:faulty_context"},
}


def install(site: Path, dist: str, entry_points: dict[str, dict[str, str]], **modules: str) -> Path:
    """A distribution as pip leaves it in ``site``: its dist-info (name, version, entry
    points) and its top-level modules (``name=source``)."""
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    groups = [
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in named.items())
        for group, named in entry_points.items()
    ]
    (info / "entry_points.txt").write_text("\n".join(groups))
    for name, source in modules.items():
        (site / f"{name}.py").write_text(source)
    return site


def errors_in(conv: Conv) -> list[str]:
    return [line for line in conv.log.read_text().splitlines() if line.startswith("=== ERROR")]


def status_of(conv: Conv) -> Status | None:
    state = read_state(conv)
    return state.status if state is not None else None


# --------------------------------------------------------------------------- backends


def test_a_plugin_backend_that_raises_a_base_exception_errs_its_turn_and_the_daemon_serves_on(
    home: Home, fake_ollama: FakeOllama, tmp_path: Path, daemon_factory: Callable[..., DaemonProc]
) -> None:
    """KeyboardInterrupt, SystemExit, a CancelledError of the plugin's own and a bare
    BaseException raised in a stream: each ends that turn with one ERROR naming the plugin
    (before, the first two ended the daemon, and the turn redone after a restart ended it
    again; the others froze their conversation in 'generating' until a restart)."""
    site = install(tmp_path / "site", "contemplation-faulty", FAULTY)
    env = base_env(home, fake_ollama, PYTHONPATH=str(site))
    tpl = load_template(home, "default")
    faulty = {m: new_conversation(home, m, template=tpl, model=m, backend="faulty") for m in RAISED}
    for conv in faulty.values():
        drop_message(conv, "hello")
    daemon = daemon_factory(env, home).wait_ready()
    for model, conv in faulty.items():
        wait_for(lambda c=conv: status_of(c) is Status.ERROR, 20, what=f"{model}'s ERROR")
        errors = errors_in(conv)
        assert len(errors) == 1, errors
        assert "faulty (contemplation-faulty)" in errors[0], errors[0]
        assert f"{RAISED[model].__name__}: the faulty plugin raised" in errors[0], errors[0]
    after = new_conversation(home, "after", template=tpl, model="llama3.2", backend="ollama")
    drop_message(after, "still there?")
    wait_for(lambda: model_replies(after), 20, what="a reply after the faults")
    assert daemon.proc.poll() is None
    assert daemon.stop() == 0


class _Raises:
    """A plugin's backend whose stream and capabilities raise ``raised`` (or, ``hang``,
    whose stream waits forever after its first piece)."""

    name, label, concurrency = "raises", "RAISES", 1

    def __init__(self, raised: type[BaseException], *, hang: bool = False) -> None:
        self.raised, self.hang = raised, hang

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        yield StreamEvent("content", "one piece")
        if self.hang:
            await asyncio.Event().wait()
        raise self.raised("from the plugin")

    async def capabilities(self, model: str) -> Capabilities:
        raise self.raised("from the plugin")

    async def check(self, model: str | None) -> list[Check]:
        raise self.raised("from the plugin")

    async def models(self) -> list[str]:
        return []

    async def forget(self, conversation_id: str, session: BackendSession | None = None) -> None:
        raise self.raised("from the plugin")

    async def aclose(self) -> None:
        raise self.raised("from the plugin")


REQUEST = ChatRequest("m", (ChatMessage("user", "hi"),))


def _guarded(raised: type[BaseException], *, hang: bool = False) -> Guarded:
    bounds = phase_timeouts(TimeoutSettings())
    return Guarded(_Raises(raised, hang=hang), "raises (a-plugin)", bounds)  # type: ignore[arg-type]


async def _drain(backend: Guarded) -> list[StreamEvent]:
    return [ev async for ev in backend.stream(REQUEST)]


@pytest.mark.parametrize("raised", [SystemExit, asyncio.CancelledError, BaseException])
def test_what_a_plugin_raises_is_its_failure_but_a_cancel_of_our_own_goes_on(
    raised: type[BaseException],
) -> None:
    async def go() -> None:
        backend = _guarded(raised)
        calls = (
            lambda: _drain(backend),
            lambda: backend.capabilities("m"),
            lambda: backend.check(None),
        )
        for call in calls:
            with pytest.raises(BackendError) as caught:
                await call()
            said = str(caught.value)
            assert (
                "plugin raises (a-plugin)" in said and f"{raised.__name__}: from the plugin" in said
            )
            assert caught.value.transient is False
        await backend.forget("c")  # never raises (the contract), whatever the plugin does
        await backend.aclose()
        # the daemon cancels a turn whose plugin is in its stream (an agent's cancel, a stop)
        hanging = _guarded(raised, hang=True)
        task = asyncio.ensure_future(_drain(hanging))
        await asyncio.sleep(0.05)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=5)
        assert done and task.cancelled()

    asyncio.run(go())


# --------------------------------------------------------------------------- tools, context


def test_a_plugin_tool_or_context_kind_that_raises_a_base_exception_fails_that_need(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    """The tool's SystemExit answers its need as failed, naming the plugin, and the model
    goes on; the context kind's KeyboardInterrupt makes its requirement unusable, said in
    the system prompt (before, either ended the daemon)."""
    registry.KINDS.register(faulty_tool, "contemplation-faulty")
    context_kinds.KINDS.register(faulty_context, "contemplation-faulty")
    try:
        conv = new_conversation(
            home, "faulty tool", template=load_template(home, "default"), model="llama3.2",
            backend="ollama", extra={"context_requirements": [{"type": "faulty"}]},
        )  # fmt: skip
        drop_message(conv, "hello")
        fake_ollama.enqueue(Step(text="NEED: Faulty answer for x"), Step(text="carried on"))
        run_burst(Runtime(settings=make_settings(fake_ollama), home=home))
    finally:
        registry.KINDS.forget("faulty")
        context_kinds.KINDS.forget("faulty")
    log = conv.log.read_text()
    assert "RESPONSE TO NEED: Faulty answer for x" in log
    assert (
        "the tool of plugin faulty (contemplation-faulty) failed: SystemExit: the faulty tool"
        in log
    )
    assert model_replies(conv)[-1] == "carried on"
    system = fake_ollama.chat_requests()[0]["messages"][0]["content"]
    assert (
        "the context kind of plugin faulty (contemplation-faulty) failed: KeyboardInterrupt: "
        "the faulty context kind was interrupted" in system
    ), system


# --------------------------------------------------------------------------- at import

AT_IMPORT = {  # what a plugin's module does when it is imported, and the line that names it
    "sys_exit": ("import sys\n\nsys.exit(3)\n", "bye (contemplation-exits): SystemExit: 3"),
    "os_exit": (
        "import os\n\nos._exit(0)\n",
        "bye (contemplation-exits): called os._exit(0) while it was loaded",
    ),
}


@pytest.mark.parametrize("fault", AT_IMPORT)
def test_a_plugin_that_exits_at_import_is_one_line_and_run_starts_without_it(
    home: Home, fake_ollama: FakeOllama, tmp_path: Path, fault: str
) -> None:
    """Before, ``plugins``, ``doctor`` and ``run`` ended there without a word (exit 3, or
    exit 0 for os._exit)."""
    source, line = AT_IMPORT[fault]
    site = install(
        tmp_path / "site", "contemplation-exits", {"contemplation.tools": {"bye": "exits:kind"}},
        exits=source,
    )  # fmt: skip
    env = base_env(home, fake_ollama, PYTHONPATH=str(site))
    listed = cli(env, "plugins", check=False)
    assert listed.returncode == 1, listed
    assert [x for x in listed.stdout.splitlines() if x.startswith("FAILED")] == [f"FAILED {line}"]
    doctor = cli(env, "doctor", check=False)
    assert doctor.returncode == 1, doctor
    named = [x for x in doctor.stdout.splitlines() if x.startswith("FAIL ")]
    assert named == [f"FAIL plugin   {line.replace(': ', ' was not loaded: ', 1)}"], named
    conv = new_conversation(
        home, "without it", template=load_template(home, "default"), model="llama3.2",
        backend="ollama",
    )  # fmt: skip
    drop_message(conv, "hello")
    cli(env, "run", "--once")
    assert model_replies(conv) == ["Echo: hello"]


def test_a_plugin_that_kills_its_process_at_import_or_loads_slowly_is_named_by_a_probe(
    home: Home, fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    """What no guard in the process catches (here a SIGKILL of its own process) ends a plain
    ``plugins``; ``plugins --probe`` and ``doctor`` load each plugin in a child process
    first, name the one that ended it, and go on without it. A load over a second is named."""
    site = tmp_path / "site"
    install(
        site, "contemplation-dies", {"contemplation.tools": {"gone": "dies:kind"}},
        dies="import os\nimport signal\n\nos.kill(os.getpid(), signal.SIGKILL)\n",
    )  # fmt: skip
    install(
        site, "contemplation-slow", {"contemplation.tools": {"slow": "slow:kind"}},
        slow="import time\n\nfrom contemplation.needs.tools.registry import ToolKind\n\n"
        "time.sleep(1.1)\nkind = ToolKind('slow', 'loads slowly', default_arg=None)\n",
    )  # fmt: skip
    env = base_env(home, fake_ollama, PYTHONPATH=str(site))
    assert cli(env, "plugins", check=False).returncode == -signal.SIGKILL  # as before
    gone = "gone (contemplation-dies): ended its process while it was loaded (killed by SIGKILL)"
    probed = cli(env, "plugins", "--probe", check=False)
    assert probed.returncode == 1, probed
    lines = probed.stdout.splitlines()
    assert [x for x in lines if x.startswith("FAILED")] == [f"FAILED {gone}"]
    slow = [x for x in lines if x.startswith("SLOW")]
    assert len(slow) == 1 and re.fullmatch(
        r"SLOW slow \(contemplation-slow\): took \d+\.\d s to load \(a start waits for it\)",
        slow[0],
    ), slow
    assert "slow            contemplation-slow" in probed.stdout  # listed: it did load
    doctor = cli(env, "doctor", check=False)
    assert doctor.returncode == 1, doctor
    rows = [x for x in doctor.stdout.splitlines() if "plugin" in x[:14]]
    assert rows[0] == f"FAIL plugin   {gone.replace(': ', ' was not loaded: ', 1)}", rows
    assert re.fullmatch(
        r"warn plugin   slow \(contemplation-slow\) took \d+\.\d s to load .*", rows[1]
    )
    assert len(rows) == 2, rows


# ---------------------------------------------------------------------------- cards


def _get(served: Served, path: str) -> tuple[float, dict[str, Any]]:
    """GET ``path`` over real HTTP: how long it took, and its JSON."""
    req = urllib.request.Request(
        served.base + path,
        headers={"Authorization": f"Bearer {served.token}", "Host": served.host},
    )
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=30) as resp:
        data = json.loads(resp.read())
    return time.monotonic() - t0, data


def test_a_card_that_sleeps_holds_no_other_read_and_is_cut_at_its_bound(
    home: Home, make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dashboard card runs on a thread of its own, held to CARD_LIMIT: while one sleeps,
    /api/conversations answers at once (before, it waited behind the card, 117 s for a card
    that slept that long), /api/cards answers at the bound with that card unavailable, and a
    second look does not start it again while it still sleeps; the former /api/panels says the
    same under its former key."""
    monkeypatch.setattr(cards, "CARD_LIMIT", 0.5)
    started, release = threading.Event(), threading.Event()

    def sleepy(seen: cards.Seen) -> list[tuple[str, str]]:
        started.set()
        release.wait(60)  # a panel that blocks (time.sleep, a slow disk) until released
        return [("woke", "up")]

    new_conversation(
        home, "listed", template=load_template(home, "default"), model="m", backend="ollama"
    )
    cards.KINDS.replace(cards.Card("sleepy", "sleeps", sleepy))
    try:
        with serve(make_settings()) as served, ThreadPoolExecutor(1) as pool:
            first = pool.submit(_get, served, "/api/cards")
            assert started.wait(10)
            # bounds far under the card's 60 s block, with room for a loaded machine
            took, listed = _get(served, "/api/conversations")
            assert took < 3.0 and [c["topic"] for c in listed["conversations"]] == ["listed"]
            took, shown = first.result(timeout=10)
            assert took < 5.0, took  # cut at 0.5 s, not the 60 s it would sleep
            by_name = {c["name"]: c["rows"] for c in shown["cards"]}
            assert by_name["sleepy"] == [["unavailable", "took longer than 0.5 s"]]
            assert dict(by_name["metrics"])["conversations"] == "1"
            took, again = _get(served, "/api/panels")  # the former name
            assert took < 3.0 and {p["name"]: p["rows"] for p in again["panels"]}["sleepy"] == [
                ["unavailable", "still busy with an earlier look (over 0.5 s)"]
            ]
            release.set()
            wait_for(lambda: _get(served, "/api/cards")[1]["cards"][-1]["rows"] == [["woke", "up"]])
    finally:
        release.set()
        cards.KINDS.forget("sleepy")


# --------------------------------------------------------------------------- crash loop


def test_a_turn_in_flight_when_the_daemon_died_twice_is_not_sent_a_third_time(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    """What cannot be contained in the process (os._exit in a stream, a crash, the OOM
    killer, a watchdog's kill of a blocked loop) ended the daemon during a turn, and the
    restarted daemon sent the same request again, to die again, forever. Now a turn begun
    by two runs that died during it is not begun a third time: one ERROR, and the
    conversation waits for the agent, whose next message is answered."""
    fake_ollama.enqueue(*[Step(first_byte_delay=3600)] * 3)  # a turn always in flight
    env = base_env(home, fake_ollama)
    conv = new_conversation(
        home, "deadly", template=load_template(home, "default"), model="llama3.2",
        backend="ollama",
    )  # fmt: skip
    drop_message(conv, "hello")

    def begun() -> int:
        state = json.loads(conv.state.read_text()) if conv.state.exists() else {}
        return int((state.get("turn_started") or {}).get("starts", 0))

    for n in (1, 2):
        daemon = daemon_factory(env, home).wait_ready()
        wait_for(
            lambda n=n: len(fake_ollama.chat_requests()) == n and begun() == n, 20,
            what=f"request {n} in flight",
        )  # fmt: skip
        assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
    daemon = daemon_factory(env, home).wait_ready()
    wait_for(lambda: status_of(conv) is Status.ERROR, 20, what="the ERROR")
    errors = errors_in(conv)
    assert len(errors) == 1 and "the daemon stopped 2 times while this turn" in errors[0], errors
    assert len(fake_ollama.chat_requests()) == 2  # not sent a third time
    assert begun() == 0
    fake_ollama.script.clear()
    drop_message(conv, "again")
    wait_for(lambda: model_replies(conv)[-1:] == ["Echo: again"], 20, what="the next reply")
    assert len(fake_ollama.chat_requests()) == 3 and len(errors_in(conv)) == 1
    assert daemon.stop() == 0


# --------------------------------------------------------------------------- loop watch


class _Sleeper(_Raises):
    """A plugin's stream that blocks the event loop (time.sleep, not asyncio.sleep)."""

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        yield StreamEvent("content", "one piece")
        time.sleep(0.8)  # noqa: ASYNC251 - the plugin's bug under test
        yield StreamEvent("content", "late")


def test_a_plugin_that_blocks_the_event_loop_is_named_by_the_loop_watch() -> None:
    """No guard on the loop can interrupt a blocking call; the watch (a thread of its own)
    names the plugin whose call holds the loop, once, and says when the loop is back."""

    async def go() -> list[str]:
        watch = loopwatch.LoopWatch(asyncio.get_running_loop(), stall=0.3).start()
        try:
            backend = Guarded(
                _Sleeper(SystemExit), "sleeper (a-plugin)", phase_timeouts(TimeoutSettings())
            )  # type: ignore[arg-type]
            texts = [ev.text async for ev in backend.stream(REQUEST)]
            await poll(lambda: any(e["event"] == "event_loop_resumed" for e in logs), "resumed")
            return texts
        finally:
            watch.stop()

    with structlog.testing.capture_logs() as logs:
        assert asyncio.run(go()) == ["one piece", "late"]
    blocked = [e for e in logs if e["event"] == "event_loop_blocked"]
    assert len(blocked) == 1 and blocked[0]["plugin"] == "sleeper (a-plugin)", blocked
    assert "in stream" in blocked[0]["running"][0], blocked
    resumed = [e for e in logs if e["event"] == "event_loop_resumed"]
    assert len(resumed) == 1 and 0.3 <= resumed[0]["blocked_s"] <= 2.0, resumed
