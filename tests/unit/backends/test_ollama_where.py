"""Which key an Ollama provider's hints name (its ``where``): OLLAMA_HOST reaches only the
``[ollama]`` section, so only that section's hint names it. Pins the behaviour the section
constant of ollama.py was refactored under (review: the literal was compared three times)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from contemplation import backends
from contemplation import settings as settings_mod
from contemplation.backends.ollama import OllamaBackend


@pytest.mark.parametrize(
    ("overrides", "name", "where", "hint"),
    [
        ({}, "ollama", "ollama.host", "set OLLAMA_HOST (or ollama.host)"),
        ({"ollama": {"url": "http://127.0.0.1:9"}}, "ollama", "ollama.url", "change ollama.url"),
        (
            {"providers": {"box": {"kind": "ollama", "host": "http://127.0.0.1:9"}}},
            "box",
            "providers.box.host",
            "change providers.box.host",
        ),
        (
            {"providers": {"box": {"kind": "ollama", "url": "http://127.0.0.1:9"}}},
            "box",
            "providers.box.url",
            "change providers.box.url",
        ),
    ],
)
def test_the_key_an_ollama_provider_names(
    overrides: dict[str, Any], name: str, where: str, hint: str, tmp_path: Any
) -> None:
    s = settings_mod.load(home=tmp_path, env={}, overrides=overrides, config=None)
    b = backends.build(name, s, fallback=False)
    try:
        assert isinstance(b, OllamaBackend) and b.where == where
        assert b._unreachable_hint().endswith(hint), b._unreachable_hint()
    finally:
        asyncio.run(b.aclose())
