"""One dead provider behind an alias: it rests alone, the turns queued for it go to the live
provider at once, and it is probed in the background (never by a user's turn) until it is
back. A real daemon process, the scripted fake Ollama on loopback for the live provider and a
closed port for the dead one (later a second fake Ollama on that port: the server returns)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from pathlib import Path

from contemplation.engine.pipeline import process_pending
from contemplation.engine.turn.retrying import rest
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation, open_writer
from tests.conftest import DaemonProc, base_env, model_replies, run_burst, runtime_for, wait_for
from tests.fakes.ollama_server import FakeOllama

COOLDOWN = 3.0  # breaker_cooldown: the longest a dead provider waits between two probes
BURST = 6  # conversations at once: more than the two providers' slots, so turns queue


def _closed_port() -> int:
    """A loopback port nothing listens on (bound once to pick it, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(tmp_path: Path, dead_port: int, live: FakeOllama) -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f"archive_on_complete = false\nbreaker_cooldown = {COOLDOWN}\n\n"
        f'[providers.dead]\nkind = "ollama"\nurl = "http://127.0.0.1:{dead_port}"\n'
        "concurrency = 1\n\n"
        f'[providers.live]\nkind = "ollama"\nurl = "{live.url}"\nconcurrency = 1\n\n'
        '[aliases.long]\nmodel = "llama3.2"\nproviders = ["dead", "live"]\n'
    )
    return cfg


def _conv(home: Home, topic: str) -> Conv:
    return new_conversation(
        home, topic, template=load_template(home, "default"), model="long", backend="long"
    )


def test_a_dead_provider_rests_alone_and_a_background_probe_brings_it_back(
    tmp_path: Path,
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
) -> None:
    dead_port = _closed_port()
    env = base_env(home, CONTEMPLATION_CONFIG=str(_config(tmp_path, dead_port, fake_ollama)))
    daemon_factory(env, home, "--no-dashboard").wait_ready()

    # a burst: one turn meets the dead provider, the others queue for either provider
    convs = [_conv(home, f"burst {i}") for i in range(BURST)]
    for c in convs:
        drop_message(c, f"hello {c.id[-7:]}")
    wait_for(lambda: all(model_replies(c) for c in convs), timeout=30, what="the burst answered")
    times = [r["_time"] for r in fake_ollama.chat_requests()]
    assert len(times) == BURST  # every turn answered once, by the live provider
    # none waited out the dead provider's rest: the live one took each turn as its slot freed
    assert times[-1] - times[0] < 1.0, [round(t - times[0], 2) for t in times]
    logs = [c.log.read_text() for c in convs]
    assert sum("=== NOTE: dead failed" in text for text in logs) == 1  # the one that met it
    assert all("(long) failed" not in text for text in logs)

    # past the rest a user's turn used to probe: the dead provider is still resting, so the
    # next turn goes to the live one without a connect failure or a NOTE
    time.sleep(COOLDOWN + 0.5)  # the time that passes is what is tested, not a hand-off
    later = _conv(home, "later")
    drop_message(later, "still there?")
    wait_for(lambda: model_replies(later), timeout=15, what="the later turn answered")
    assert "=== NOTE" not in later.log.read_text()
    assert len(fake_ollama.chat_requests()) == BURST + 1

    # the server comes back on its port: the background probe finds it (its models
    # endpoint, no chat), and the next turn goes to it (the least busy, first in the alias)
    back = FakeOllama(port=dead_port).start()
    try:
        wait_for(lambda: back.gets, timeout=2 * COOLDOWN + 5, what="a background probe")
        assert back.requests == []  # probed (a GET), not by a user's turn
        # the probe's answer is taken as it arrives; a new message settles 0.2 s first
        again = _conv(home, "again")
        drop_message(again, "back?")
        wait_for(lambda: model_replies(again), timeout=15, what="the turn on the returned one")
        assert len(back.chat_requests()) == 1 and "=== NOTE" not in again.log.read_text()
    finally:
        back.stop()


def _alias(make_settings: Callable[..., Settings], dead_port: int, live_url: str) -> Settings:
    return make_settings(
        providers={
            "dead": {"kind": "ollama", "url": f"http://127.0.0.1:{dead_port}"},
            "live": {"kind": "ollama", "url": live_url},
        },
        aliases={"long": {"model": "llama3.2", "providers": ["dead", "live"]}},
        breaker_threshold=3,
        breaker_cooldown=COOLDOWN,
    )


def test_the_rest_names_each_provider_and_why_it_rests(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    """It said "long (long) failed 2 times in a row; resting": the alias, twice, and no
    provider."""
    rt = runtime_for(_alias(make_settings, _closed_port(), "http://127.0.0.1:9"))
    conv = _conv(home, "words")
    rt.breaker("dead").watch(rt.clock() + 5)
    for _ in range(3):
        rt.breaker("live").failure()
    with open_writer(conv) as w:
        rest(rt, w, rt.clock() + 5, rt.target(w.meta))
    st = read_state(conv)
    assert st is not None and st.last_error is not None
    assert st.last_error.message.startswith(
        "long: dead cannot be reached (probed in the background); "
        "live (llama3.2) failed 3 times in a row; resting until "
    )


def test_a_provider_watched_when_the_daemon_stops_rests_as_any_other_after(
    home: Home, make_settings: Callable[..., Settings], fake_ollama: FakeOllama
) -> None:
    """The probe ends with the runtime: the provider it watched must not rest for ever (a
    turn probes it after its rest, as before)."""
    rt = runtime_for(_alias(make_settings, _closed_port(), fake_ollama.url))
    conv = _conv(home, "stops")
    drop_message(conv, "hello")
    run_burst(rt)
    assert model_replies(conv) == ["Echo: hello"]
    dead = rt.breaker("dead")
    assert not dead.watched and rt.provider("dead").health.probe.task is None
    resting = dead.resting()
    assert resting is not None and resting <= rt.clock() + COOLDOWN


def test_when_every_provider_is_dead_the_last_one_is_still_the_turns_to_try(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    """Watching is for a provider whose turns can go elsewhere. When the last live one fails
    too, it rests as before (its turn probes it after the rest, and gives up after
    ``retry.max_attempts`` with an ERROR the agent reads) instead of waiting for ever."""
    rt = runtime_for(_alias(make_settings, _closed_port(), f"http://127.0.0.1:{_closed_port()}"))
    conv = _conv(home, "all dead")
    drop_message(conv, "hello")

    async def burst() -> tuple[bool, bool]:
        try:
            await process_pending(rt)
            return rt.breaker("dead").watched, rt.breaker("live").watched
        finally:
            await rt.aclose()

    assert asyncio.run(burst()) == (True, False)
    assert "=== NOTE: dead failed" in conv.log.read_text()
