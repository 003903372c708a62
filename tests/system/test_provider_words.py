"""Doctor hints named OPENAI_BASE_URL for a named provider: a named provider's hints
and turn errors name the key its URL came from (``providers.<name>.url``), not the environment
variable that only reaches the old ``[ollama]`` / ``[openai]`` sections."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from contemplation import backends
from contemplation.backends.base import Backend
from contemplation.errors import BackendError
from contemplation.settings import Settings
from contemplation.store.layout import Home
from tests.conftest import base_env, cli
from tests.fakes.openai_server import FakeOpenAI, Step
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


def test_refused_credentials_name_the_key_the_provider_reads(
    make_settings: Callable[..., Settings],
) -> None:
    """Review: a 401/403 said "check OPENAI_API_KEY" for a named provider too, which reads
    its key from ``providers.<name>.api_key`` only (the variable reaches ``[openai]`` alone).
    Each provider is made from real settings, as the daemon makes it."""
    server = FakeOpenAI().start()
    try:
        settings = make_settings(
            providers={"lab": {"kind": "openai", "url": server.url, "api_key": "sk-wrong"}},
            openai={"base_url": server.url, "api_key": "sk-wrong"},
        )
        said = {}
        for name in ("lab", "openai"):
            server.enqueue(Step(kind="error", status=401, body={"error": {"message": "bad key"}}))
            said[name] = str(refused(backends.build(name, settings, fallback=False)))
        assert "providers.lab.api_key" in said["lab"], said
        assert "OPENAI_API_KEY" not in said["lab"] and "openai.api_key" not in said["lab"], said
        assert "OPENAI_API_KEY (or openai.api_key in the config)" in said["openai"], said
    finally:
        server.stop()


def refused(backend: Backend) -> BackendError:
    async def go() -> None:
        try:
            [_ async for _ in backend.stream(request())]
        finally:
            await backend.aclose()

    with pytest.raises(BackendError) as info:
        asyncio.run(go())
    assert info.value.kind == "auth"
    return info.value
