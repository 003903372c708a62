"""Issue 38, "doctor hints name OPENAI_BASE_URL for a named provider": a named provider's hints
and turn errors name the key its URL came from (``providers.<name>.url``), not the environment
variable that only reaches the old ``[ollama]`` / ``[openai]`` sections."""

from __future__ import annotations

from pathlib import Path

from contemplation.store.layout import Home
from tests.conftest import base_env, cli
from tests.fakes.openai_server import FakeOpenAI
from tests.system.test_backend_openai import fails, request
from tests.system.test_small_words import _free_port


def test_an_unreachable_named_ollama_provider_is_told_its_own_url(
    home: Home, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        f'[providers.box]\nkind = "ollama"\nurl = "http://127.0.0.1:{_free_port()}"\n'
    )
    out = cli(base_env(home, CONTEMPLATION_CONFIG=str(config)), "doctor", check=False).stdout
    box = next(line for line in out.splitlines() if line.split()[1:2] == ["box"])
    hint = out.split(box, 1)[1].splitlines()[1]
    assert "hint:" in hint and "OLLAMA_HOST" not in hint, hint
    assert "providers.box.url" in hint, hint


def test_a_missing_chat_completions_names_the_named_providers_url(tmp_path: Path) -> None:
    server = FakeOpenAI().start()
    try:
        err = fails(f"{server.url}/wrong", request(), where="providers.lab.url")
        assert "OPENAI_BASE_URL" not in str(err) and "providers.lab.url" in str(err), err
        err = fails(f"{server.url}/wrong", request(), where="openai.base_url")  # [openai]
        assert "OPENAI_BASE_URL" in str(err), err
    finally:
        server.stop()
