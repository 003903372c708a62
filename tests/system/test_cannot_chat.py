"""Models that cannot chat stay out. Ollama's /api/show lists a model's
capabilities; one without "completion" (an embedding model, a ``decision`` model) is listed
as such by ``contemplation models`` and a conversation with it ends in one ERROR naming the
capability, with no chat request sent (the scripted Ollama answers as Ollama does)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from contemplation.backends.catalog import list_all
from contemplation.engine.runtime import Runtime
from contemplation.models import MarkerKind, Status
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Home, list_conversations, read_state
from contemplation.writer import drop_message
from tests.conftest import base_env, cli_here, run_burst
from tests.fakes.ollama_server import NOT_CHAT, FakeOllama
from tests.system.test_history import make


@pytest.mark.parametrize(
    ("model", "capability"), [("nomic-embed-text", "embedding"), ("judge", "decision")]
)
def test_a_conversation_with_a_model_that_cannot_chat_ends_in_one_error(
    home: Home,
    fake_ollama: FakeOllama,
    make_settings: Callable[..., Settings],
    model: str,
    capability: str,
) -> None:
    fake_ollama.models.update(NOT_CHAT)
    rt = Runtime(settings=make_settings(fake_ollama), home=home)
    conv = make(home, model=model)
    drop_message(conv, "Hello?")
    run_burst(rt)
    st = read_state(conv)
    assert st is not None and st.status is Status.ERROR, st
    errors = [
        t
        for b in parse(conv.log.read_bytes()).blocks
        for k, t in b.markers
        if k is MarkerKind.ERROR
    ]
    assert len(errors) == 1 and capability in errors[0] and model in errors[0], errors
    assert fake_ollama.chat_requests() == []  # never sent


def test_models_lists_what_cannot_chat(
    fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    fake_ollama.models.update(NOT_CHAT)
    listing = asyncio.run(list_all(make_settings(fake_ollama), ["ollama"]))
    rows = {m["name"].split(":")[0]: m for m in listing[0]["models"]}
    assert rows["nomic-embed-text"]["cannot_chat"] == "embedding"
    assert rows["judge"]["cannot_chat"] == "decision"
    assert rows["gemma"]["cannot_chat"] == ""
    json.dumps(listing)  # the --json face prints it as it is


def test_the_cli_lists_them_and_refuses_a_conversation_with_one(
    home: Home, fake_ollama: FakeOllama
) -> None:
    fake_ollama.models.update(NOT_CHAT)
    env = base_env(home, fake_ollama)
    out = cli_here(env, "models").stdout
    assert "ollama: nomic-embed-text:latest cannot chat (embedding)" in out, out
    assert "ollama: judge:latest cannot chat (decision)" in out, out
    refused = cli_here(env, "new", "Vectors", "--model", "nomic-embed-text", check=False)
    assert refused.returncode == 1, refused
    [line] = refused.stderr.strip().splitlines()  # one line, naming the capability
    assert "nomic-embed-text" in line and "embedding" in line, line
    assert list_conversations(home) == []  # nothing was created
    conv = cli_here(env, "new", "Words", "--model", "gemma").stdout.strip()
    moved = cli_here(env, "set-model", conv, "judge", check=False)
    assert moved.returncode == 1 and "decision" in moved.stderr, moved
    assert len(moved.stderr.strip().splitlines()) == 1, moved.stderr
    assert json.loads((home.active / conv / "metadata.json").read_text())["model"] == "gemma"
