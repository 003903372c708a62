"""Providers and aliases: config, resolution, per-provider slots, least-busy dispatch,
fail-over before and during a reply, 429 per provider (scripted OpenAI-compatible servers
speaking the documented SSE), and the server's own limits from a real llama-server."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contemplation import backends
from contemplation.backends import make as make_backend
from contemplation.backends import providers
from contemplation.backends.base import KnowsLimits, Slots
from contemplation.config.validate import validate
from contemplation.engine.runtime import Runtime
from contemplation.engine.scheduler import ModelScheduler, slot_any
from contemplation.errors import ConfigError
from contemplation.models import BlockKind
from contemplation.protocol.parser import parse
from contemplation.settings import Settings, load
from contemplation.store.layout import Conv, Home, read_metadata
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests.conftest import base_env, cli, model_replies, run_burst, within
from tests.fakes.openai_server import FakeOpenAI, Step

# --------------------------------------------------------------------------- config


def _load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> Settings:
    """Load and check the settings as the daemon does at start (``run``, ``doctor``)."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(text)
    settings = load(config=cfg, home=tmp_path / "home", env=env or {})
    validate(settings)
    return settings


CONFIG = """
[providers.laptop]
kind = "ollama"
url = "http://127.0.0.1:11434"

[providers.box1]
kind = "openai"
url = "http://10.0.0.5:8080/v1"
api_key = "none"

[providers.box2]
kind = "openai"
url = "http://10.0.0.6:8080/v1"
concurrency = 4

[aliases.coder]
model = "qwen2.5-coder:7b"
providers = ["box1", "box2"]
options = { temperature = 0.2, num_ctx = 16384 }
think = false
"""


def test_providers_and_aliases_load_from_the_file_and_the_environment(tmp_path: Path) -> None:
    env = {
        "CONTEMPLATION_PROVIDERS__BOX3__KIND": "openai",
        "CONTEMPLATION_PROVIDERS__BOX3__URL": "http://10.0.0.7:8080/v1",
    }
    s = _load(tmp_path, CONFIG, env)
    assert set(s.providers) == {"laptop", "box1", "box2", "box3"}
    assert backends.config(s, "box1")[1].concurrency == "auto"  # the default: ask the server
    assert backends.config(s, "box2")[1].concurrency == 4
    assert s.providers["box3"].kind == "openai"
    assert backends.config(s, "box3")[1].url == "http://10.0.0.7:8080/v1"
    assert s.aliases["coder"].providers == ["box1", "box2"]
    # the old sections are the providers of their names
    assert providers.table(s, "ollama").kind == "ollama"
    assert backends.config(s, "ollama")[0].name == "ollama"
    assert providers.table(s, "box1").kind == "openai"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[providers.b]\nkind = "openai"\ncolour = "red"\n', "providers.b.colour"),
        ('[providers.b]\nkind = "nope"\n', "providers.b.kind"),
        ('[providers.b]\nkind = "openai"\nurl = "ftp://x"\n', "providers.b.url"),
        ('[providers.b]\nkind = "openai"\nconcurrency = 0\n', "providers.b.concurrency"),
        ('[providers.Box-1]\nkind = "openai"\n', "providers.Box-1"),
        ('[aliases.a]\nmodel = "m"\nproviders = ["nowhere"]\n', "aliases.a.providers"),
        ('[aliases.a]\nmodel = "m"\nproviders = []\n', "aliases.a.providers"),
        ('[aliases.a]\nproviders = ["ollama"]\n', "aliases.a.model"),
        (
            '[providers.a]\nkind = "ollama"\n[aliases.a]\nmodel = "m"\nproviders = ["a"]\n',
            "aliases.a",
        ),
    ],
)
def test_a_bad_provider_or_alias_is_one_line_naming_the_key_and_the_file(
    tmp_path: Path, text: str, says: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text)
    line = str(err.value)
    assert "\n" not in line
    assert f"invalid setting {says} " in line and str(tmp_path / "config.toml") in line


def test_an_alias_resolves_to_its_providers_model_options_and_think(tmp_path: Path) -> None:
    s = _load(tmp_path, CONFIG)
    t = providers.target(s, "coder", "coder", options={"temperature": 0.7})
    assert t.providers == ("box1", "box2") and t.model == "qwen2.5-coder:7b"
    assert t.options == {"temperature": 0.7, "num_ctx": 16384}  # the conversation's own win
    assert t.think is False and t.alias == "coder"
    # named only as the model: the alias lends model and options to the provider named
    t = providers.target(s, "box2", "coder")
    assert t.providers == ("box2",) and t.model == "qwen2.5-coder:7b"
    # no alias: the provider and the model as written
    t = providers.target(s, "laptop", "llama3.2", think=True)
    assert t.providers == ("laptop",) and t.model == "llama3.2" and t.alias is None


def test_new_with_an_alias_records_it_and_aliases_lists_it(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    cfg = tmp_path / "config.toml"
    cfg.write_text(CONFIG)
    env = base_env(home, CONTEMPLATION_CONFIG=str(cfg))
    conv_id = cli(env, "new", "Refactor", "--model", "coder").stdout.strip()
    meta = read_metadata(Conv(home.active / conv_id))
    assert meta is not None and (meta.backend, meta.model) == ("coder", "coder")
    out = cli(env, "aliases").stdout
    assert out.splitlines()[0].split() == ["ALIAS", "MODEL", "PROVIDERS", "OPTIONS", "THINK"]
    assert "coder" in out and "qwen2.5-coder:7b" in out and "box1, box2" in out
    rows = json.loads(cli(env, "aliases", "--json").stdout)["aliases"]
    assert rows == [
        {
            "alias": "coder",
            "model": "qwen2.5-coder:7b",
            "providers": ["box1", "box2"],
            "options": {"temperature": 0.2, "num_ctx": 16384},
            "think": False,
        }
    ]
    bad = cli(env, "new", "x", "--backend", "nowhere", check=False)
    assert bad.returncode != 0 and "unknown backend 'nowhere'" in bad.stderr
    assert "coder" in bad.stderr and "box1" in bad.stderr  # the known names include them


# --------------------------------------------------------------------------- slots


def test_an_alias_turn_takes_the_first_free_slot_least_busy_first() -> None:
    async def go() -> None:
        a, b = ModelScheduler(slots=2), ModelScheduler(slots=2)
        pool = [("a", a), ("b", b)]
        async with slot_any(pool, "m") as (first, _):
            assert first == "a"  # a tie: the configured order
            async with slot_any(pool, "m") as (second, _):
                assert second == "b"  # a is busier now
                async with slot_any(pool, "m") as (third, _):
                    assert third == "a"
                    async with slot_any(pool, "m") as (fourth, held):
                        assert fourth == "b"
                        assert (a.running, b.running) == (2, 2)
                        waiting = asyncio.ensure_future(_take(pool))
                        await asyncio.sleep(0)
                        assert not waiting.done() and a.waiting == b.waiting == 1
                        held.release()  # b frees a slot: the waiter gets it, a's queue forgets it
                        assert await within(waiting, "the freed slot") == "b"
                        assert a.waiting == b.waiting == 0
        assert (a.running, b.running) == (0, 0)

    asyncio.run(go())


async def _take(pool: list[tuple[str, ModelScheduler]]) -> str:
    async with slot_any(pool, "m") as (name, _):
        return name


def test_a_waiter_cancelled_in_several_queues_leaves_none_behind() -> None:
    async def go() -> None:
        a, b = ModelScheduler(slots=1), ModelScheduler(slots=1)
        pool = [("a", a), ("b", b)]
        async with slot_any(pool, "m"), slot_any(pool, "m"):
            task = asyncio.ensure_future(_take(pool))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert a.waiting == b.waiting == 0
        assert (a.running, b.running) == (0, 0)
        a.resize(3)  # the server said 3: more turns at once, the running one keeps its slot
        assert a.slots == 3 and a.running == 0

    asyncio.run(go())


# --------------------------------------------------------------------------- scripted servers


@pytest.fixture
def two_fakes() -> Iterator[tuple[FakeOpenAI, FakeOpenAI]]:
    one, two = FakeOpenAI().start(), FakeOpenAI().start()
    yield one, two
    one.stop()
    two.stop()


def _alias_settings(
    home: Home, make_settings: Callable[..., Settings], urls: list[str], **more: Any
) -> Settings:
    provs = {
        f"box{i + 1}": {"kind": "openai", "url": url + "/v1", "api_key": "none", **more}
        for i, url in enumerate(urls)
    }
    return make_settings(
        providers=provs,
        aliases={"coder": {"model": "fake-model", "providers": list(provs)}},
        breaker_cooldown=30,
    )


def _conv(home: Home, topic: str, backend: str = "coder", model: str = "coder") -> Conv:
    return new_conversation(
        home, topic, template=load_template(home, "default"), model=model, backend=backend
    )


def test_a_burst_over_an_alias_fills_both_providers_slots(
    home: Home, make_settings: Callable[..., Settings], two_fakes: tuple[FakeOpenAI, FakeOpenAI]
) -> None:
    one, two = two_fakes
    for fake in two_fakes:
        fake.props = {"total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}
        fake.default_step = Step(delay=0.05)
    s = _alias_settings(home, make_settings, [one.url, two.url])
    convs = [_conv(home, f"c{i}") for i in range(8)]
    for c in convs:
        drop_message(c, f"hello {c.id[-2:]}")
    rt = Runtime(settings=s, home=Home(s.home))
    run_burst(rt)
    assert all(model_replies(c) == [f"Echo: hello {c.id[-2:]}"] for c in convs)
    assert one.max_active == two.max_active == 2  # the slots /props gave, and no more
    assert len(one.chat_requests()) + len(two.chat_requests()) == 8  # each turn once
    assert rt.provider("box1").slots == Slots(2, "server /props")
    header = parse(convs[0].log.read_bytes()).blocks[-1]
    assert header.sender == "CODER"  # the alias names the model's side of the log


def test_a_provider_that_refuses_sends_the_turn_to_another_with_a_note(
    home: Home, make_settings: Callable[..., Settings], two_fakes: tuple[FakeOpenAI, FakeOpenAI]
) -> None:
    _, two = two_fakes
    dead = "http://127.0.0.1:9"  # nothing listens on the discard port
    s = _alias_settings(home, make_settings, [dead, two.url])
    conv = _conv(home, "refused")
    drop_message(conv, "hello")
    run_burst(Runtime(settings=s, home=Home(s.home)))
    assert model_replies(conv) == ["Echo: hello"]
    log = conv.log.read_text()
    assert "=== NOTE: box1 failed (cannot reach" in log
    assert "the turn goes to another provider of coder (box2) ===" in log
    assert log.count("=== CODER -> CLAUDE") == 1


def test_a_reply_cut_mid_stream_is_redone_once_on_another_provider(
    home: Home, make_settings: Callable[..., Settings], two_fakes: tuple[FakeOpenAI, FakeOpenAI]
) -> None:
    one, two = two_fakes
    one.enqueue(Step(kind="cut", pieces=["Echo: ", "hel", "lo"], after=2))
    s = _alias_settings(home, make_settings, [one.url, two.url], concurrency=1)
    conv = _conv(home, "cut")
    drop_message(conv, "hello")
    run_burst(Runtime(settings=s, home=Home(s.home)))
    blocks = [b for b in parse(conv.log.read_bytes()).blocks if b.kind is BlockKind.MODEL]
    assert [b.interrupted for b in blocks] == [True, False]
    assert model_replies(conv) == ["Echo: hello"]  # the whole reply once, from box2
    assert "redone on another provider of coder (box2)" in conv.log.read_text()
    assert len(two.chat_requests()) == 1


def test_a_429_with_retry_after_pauses_that_provider_only(
    home: Home, make_settings: Callable[..., Settings], two_fakes: tuple[FakeOpenAI, FakeOpenAI]
) -> None:
    one, two = two_fakes
    busy = {"error": {"message": "slow down", "type": "rate_limit", "code": 429}}
    one.enqueue(Step(kind="error", status=429, body=busy, headers={"Retry-After": "30"}))
    s = _alias_settings(home, make_settings, [one.url, two.url], concurrency=1)
    alias_conv = _conv(home, "alias")
    drop_message(alias_conv, "hello")
    rt = Runtime(settings=s, home=Home(s.home))
    t0 = time.time()
    run_burst(rt)
    assert model_replies(alias_conv) == ["Echo: hello"]  # box2 answered at once
    resting = rt.breaker("box1").resting()
    assert resting is not None and resting >= t0 + 29  # Retry-After, for box1 only
    assert rt.breaker("box2").resting() is None
    # a conversation on box1 itself waits out the pause instead of asking again
    direct = _conv(home, "direct", backend="box1", model="fake-model")
    drop_message(direct, "hi")
    wakes = run_burst(rt)
    assert model_replies(direct) == []
    wake = wakes.get(direct.id)
    assert wake is not None and wake >= t0 + 29
    assert len(one.chat_requests()) == 1  # the 429 only


def test_the_window_and_slots_come_from_the_server(
    home: Home, make_settings: Callable[..., Settings], two_fakes: tuple[FakeOpenAI, FakeOpenAI]
) -> None:
    vllm, plain = two_fakes
    vllm.models = [{"id": "fake-model", "object": "model", "max_model_len": 3000}]
    s = _alias_settings(home, make_settings, [vllm.url, plain.url])

    async def go() -> tuple[Any, Slots, Any, Slots]:
        b1, b2 = make_backend("box1", s), make_backend("box2", s)
        assert isinstance(b1, KnowsLimits) and isinstance(b2, KnowsLimits)
        try:
            return (
                await b1.capabilities("fake-model"),
                await b1.slots(),
                await b2.capabilities("fake-model"),
                await b2.slots(),
            )
        finally:
            await b1.aclose()
            await b2.aclose()

    caps1, slots1, caps2, slots2 = asyncio.run(go())
    assert caps1.request_window == 3000  # vLLM's max_model_len
    assert slots1 == Slots(1, "default_concurrency (the server does not say)")
    assert caps2.request_window is None  # says nothing: the family table, else the default
    assert slots2.count == 1


def test_a_conversation_whose_session_a_provider_holds_stays_on_it(tmp_path: Path) -> None:
    """OpenCode keeps the history in its session: the turns go where the session is."""
    from contemplation.engine.runtime import pinned as _pinned
    from contemplation.models import BackendSession

    s = _load(tmp_path, CONFIG)
    target = providers.target(s, "coder", "coder")
    held = BackendSession(backend="opencode", id="ses_1", provider="box2")
    assert _pinned(target, held).providers == ("box2",)
    first = BackendSession(backend="opencode", id="ses_0", provider="box1")
    assert _pinned(target, first).providers == ("box1",)
    assert _pinned(target, None).providers == ("box1", "box2")
    gone = BackendSession(backend="opencode", id="ses_2", provider="elsewhere")
    assert _pinned(target, gone).providers == ("box1", "box2")  # not one of its providers


def test_a_busy_provider_does_not_collect_the_turns_another_took() -> None:
    """Turns an alias's other provider granted are passed over, never searched for, and a
    long queue is swept of them: a provider whose slot stays busy holds a bounded queue."""
    from contemplation.engine.scheduler import SWEEP_AT

    async def go() -> None:
        busy, free = ModelScheduler(slots=1), ModelScheduler(slots=1)
        pool = [("busy", busy), ("free", free)]
        async with busy.slot("m"):  # held all along
            for _ in range(3 * SWEEP_AT):
                assert await _take(pool) == "free"
            assert busy.waiting == 0
            assert len(busy._queues["m"]) <= SWEEP_AT + 1
        assert busy.running == free.running == 0

    asyncio.run(go())
