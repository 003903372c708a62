"""Issue 39: models that cannot chat stay out. Ollama's /api/show lists a model's
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
from contemplation.store.layout import Home, read_state
from contemplation.writer import drop_message
from tests.conftest import run_burst
from tests.fakes.ollama_server import FakeOllama
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
    listing = asyncio.run(list_all(make_settings(fake_ollama), ["ollama"]))
    rows = {m["name"].split(":")[0]: m for m in listing[0]["models"]}
    assert rows["nomic-embed-text"]["cannot_chat"] == "embedding"
    assert rows["judge"]["cannot_chat"] == "decision"
    assert rows["gemma"]["cannot_chat"] == ""
    json.dumps(listing)  # the --json face prints it as it is
