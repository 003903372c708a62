"""Providers against real servers: upstream llama-server (xllamacpp, SmolLM2) says its own
slots and window; an alias over two of them survives kill -9 of one mid-burst; LiteLLM's proxy
in front of two of them is an ``openai`` provider like any other. The daemon runs as its own
process with a config file, as a user runs it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contemplation.backends import make as make_backend
from contemplation.backends.base import Capabilities, KnowsLimits, Slots
from contemplation.models import BlockKind, Status
from contemplation.protocol.logformat import header
from contemplation.protocol.parser import parse
from contemplation.settings import load
from contemplation.store.layout import Conv, Home, read_metadata, read_state
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation, write_metadata
from tests import peers
from tests.conftest import DaemonProc, base_env, cli, cli_here, wait_for
from tests.realpeers import LiteLLMProxy, LlamaServer, share_of_the_cores


def _server(n_ctx: int = 2048, n_parallel: int = 2, share: int = 1) -> LlamaServer:
    """``share``: servers running at once (each gets its part of the cores: llama.cpp's
    threads spin while they wait)."""
    peers.xllamacpp_available()
    gguf = peers.smollm2_gguf()
    threads = share_of_the_cores(share)
    return LlamaServer(gguf, n_ctx=n_ctx, n_parallel=n_parallel, threads=threads).start()


@pytest.fixture
def servers() -> Iterator[list[LlamaServer]]:
    started: list[LlamaServer] = []
    try:
        started.extend([_server(share=2), _server(share=2)])
        yield started
    finally:
        for s in started:
            s.stop()


def _config(tmp_path: Path, body: str) -> Path:
    """``body`` with archive_on_complete off: SmolLM2 ends a reply with COMPLETE now and then
    (the protocol teaches it), and the conversation must stay where the test reads it."""
    cfg = tmp_path / "config.toml"
    cfg.write_text("archive_on_complete = false\n" + body)
    return cfg


def _provider(name: str, url: str, extra: str = "") -> str:
    return f'[providers.{name}]\nkind = "openai"\nurl = "{url}/v1"\napi_key = "none"\n{extra}\n'


def _answered_once(conv: Conv) -> bool:
    """The agent's message has exactly one whole reply after it, and the turn has ended."""
    blocks = parse(conv.log.read_bytes()).blocks
    kinds = [b.kind for b in blocks if not (b.kind is BlockKind.MODEL and b.interrupted)]
    state = read_state(conv)
    return (
        kinds == [BlockKind.AGENT, BlockKind.MODEL]
        and state is not None
        and state.status in {Status.IDLE, Status.COMPLETE}  # a reply may end with COMPLETE
    )


def _convs(home: Home, n: int, backend: str, model: str) -> list[Conv]:
    convs = []
    for i in range(n):
        c = new_conversation(
            home, f"burst {i}", template=load_template(home, "default"), model=model,
            backend=backend,
        )  # fmt: skip
        drop_message(c, f"Count from 1 to 20, conversation {i}.")
        convs.append(c)
    return convs


def test_llama_server_says_its_slots_and_its_window(tmp_path: Path) -> None:
    server = _server(n_ctx=2048, n_parallel=3)
    try:
        cfg = _config(tmp_path, _provider("gpu", server.url))
        s = load(config=cfg, home=tmp_path / "home", env={})

        async def ask() -> tuple[Slots, Capabilities]:
            backend = make_backend("gpu", s)
            assert isinstance(backend, KnowsLimits)
            try:
                return await backend.slots(), await backend.capabilities("smollm2")
            finally:
                await backend.aclose()

        slots, caps = asyncio.run(ask())
        assert slots == Slots(3, "server /props")
        assert caps.request_window == 2048  # n_ctx per slot, not n_ctx_train (8192)
        env = base_env(Home(tmp_path / "home"), CONTEMPLATION_CONFIG=str(cfg))
        out = cli_here(env, "models", "-b", "gpu").stdout
        assert "gpu: 3 slot(s), server /props" in out
        row = next(line.split() for line in out.splitlines() if line.startswith("gpu "))
        assert row[5] == "2048" and row[6] == "3"
        listed = json.loads(cli_here(env, "models", "-b", "gpu", "--json").stdout)["backends"][0]
        assert (listed["slots"], listed["slots_from"]) == (3, "server /props")
    finally:
        server.stop()


def test_a_long_dialogue_is_fitted_to_the_servers_window_per_slot(tmp_path: Path) -> None:
    """Measured before: the window was taken as n_ctx_train (8,192) while the server gave
    2,048 per slot, and a long dialogue failed with "the prompt does not fit". (Here 1,024 a
    slot and half the history: the same overflow, half the prompt to read on one core.)"""
    server = _server(n_ctx=1024, n_parallel=2)
    try:
        home = Home(tmp_path / "home")
        cfg = _config(tmp_path, 'default_backend = "gpu"\n' + _provider("gpu", server.url))
        conv = new_conversation(
            home, "long", template=load_template(home, "default"), model="smollm2", backend="gpu"
        )
        meta = read_metadata(conv)
        assert meta is not None  # a short reply: the fitting of the history is what is tested
        write_metadata(conv, meta.model_copy(update={"options": {"num_predict": 32}}))
        turn = "The queue keeps every message as a file; " * 40  # ~400 tokens a block
        with conv.log.open("a") as f:
            for i in range(6):  # ~2,500 tokens of history: more than 1,024
                f.write(header("CLAUDE", "GPU", "2026-11-20 10:00:00") + f"{i}: {turn}\n\n")
                f.write(header("GPU", "CLAUDE", "2026-11-20 10:00:01") + f"{i}: noted.\n\n")
        drop_message(conv, "Say hello.")
        env = base_env(home, CONTEMPLATION_CONFIG=str(cfg))
        cli(env, "run", "--once", "--no-dashboard", timeout=240)
        text = conv.log.read_text()
        assert "does not fit" not in text and "=== ERROR" not in text
        assert "=== NOTE" in text  # the history was fitted (summarised or cut), and says so
        last = parse(conv.log.read_bytes()).blocks[-1]
        assert last.kind is BlockKind.MODEL and not last.interrupted and last.text.strip()
    finally:
        server.stop()


def test_an_alias_over_two_llama_servers_survives_kill_9_of_one_mid_burst(
    tmp_path: Path, servers: list[LlamaServer], daemon_factory: Callable[..., DaemonProc]
) -> None:
    a, b = servers
    home = Home(tmp_path / "home")
    body = (
        _provider("box1", a.url)
        + _provider("box2", b.url)
        + '[aliases.small]\nmodel = "smollm2"\nproviders = ["box1", "box2"]\n'
        + "options = { temperature = 0, num_predict = 48 }\n"
    )
    env = base_env(home, CONTEMPLATION_CONFIG=str(_config(tmp_path, body)))
    daemon = daemon_factory(env, home, "--no-dashboard").wait_ready()
    convs = _convs(home, 12, "small", "small")
    t0 = time.monotonic()

    def some_started() -> bool:
        return sum("=== SMALL -> CLAUDE" in c.log.read_text() for c in convs) >= 3

    wait_for(some_started, 120, what="replies under way")
    a.kill()  # kill -9: the replies streaming from it are cut mid-stream
    wait_for(lambda: all(_answered_once(c) for c in convs), 240, what="every conversation")
    took = time.monotonic() - t0
    for c in convs:
        blocks = parse(c.log.read_bytes()).blocks
        whole = [x for x in blocks if x.kind is BlockKind.MODEL and not x.interrupted]
        assert len(whole) == 1 and whole[0].text.strip(), c.id  # once, never twice
    cut = sum("redone on another provider of small" in c.log.read_text() for c in convs)
    refused = sum("box1 failed (" in c.log.read_text() for c in convs)
    assert cut + refused >= 1  # the kill was seen, and the turns went to box2
    assert daemon.proc.poll() is None
    print(f"12 answered in {took:.1f} s; {cut} cut and redone, {refused} sent on")


def test_litellm_proxy_over_two_llama_servers_is_an_openai_provider(
    tmp_path: Path, servers: list[LlamaServer], daemon_factory: Callable[..., DaemonProc]
) -> None:
    a, b = servers
    proxy = LiteLLMProxy([a.url, b.url]).start()
    try:
        home = Home(tmp_path / "home")
        body = _provider("proxy", proxy.url, "concurrency = 4") + (
            '[aliases.small]\nmodel = "smollm2"\nproviders = ["proxy"]\n'
            "options = { temperature = 0, num_predict = 16 }\n"
        )
        env = base_env(home, CONTEMPLATION_CONFIG=str(_config(tmp_path, body)))
        daemon_factory(env, home, "--no-dashboard").wait_ready()
        # 6 replies of 16 tokens, 4 at once: 2 still to send when the first 2 are in, the same
        # proof as 8 of 32 on 3/8 of the generated tokens (the proxy's own start is ~13 s)
        convs = _convs(home, 6, "small", "small")
        wait_for(lambda: sum(_answered_once(c) for c in convs) >= 2, 180, what="the first replies")
        b.kill()  # one server behind the proxy dies mid-burst: ours retry, the proxy reroutes
        wait_for(lambda: all(_answered_once(c) for c in convs), 300, what="every conversation")
        for c in convs:
            whole = [
                x
                for x in parse(c.log.read_bytes()).blocks
                if x.kind is BlockKind.MODEL and not x.interrupted
            ]
            assert len(whole) == 1 and whole[0].text.strip(), c.id
    finally:
        proxy.stop()
