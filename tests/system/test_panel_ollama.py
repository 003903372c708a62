"""A panel's round on Ollama: its seats on different models go out together with the
default ``concurrency = "auto"`` (Ollama runs different models side by side by itself, up to
OLLAMA_MAX_LOADED_MODELS, and its own scheduler queues or evicts when memory is short), and
one at a time where the config says one turn at once. Counted at the scripted Ollama (the
most chat requests it served at once), not timed; each seat is still asked once and written
whole, in panel order."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from contemplation.faces.reading import Reader
from contemplation.store.layout import Home
from tests.conftest import DaemonProc, base_env, cli_here
from tests.fakes.ollama_server import FakeOllama, Step

HEADER = re.compile(r"^=== ([A-Z0-9_]+) -> ([A-Z0-9_]+) \[", re.MULTILINE)
MODELS = ("gemma", "llama3.2", "qwen3")


@pytest.mark.parametrize(("concurrency", "together"), [("auto", 3), ("1", 1)])
def test_a_rounds_seats_on_different_ollama_models_go_out_together(
    home: Home,
    tmp_path: Path,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    concurrency: str,
    together: int,
) -> None:
    extra = {}
    if concurrency != "auto":
        cfg = tmp_path / "config.toml"
        cfg.write_text(f"[ollama]\nconcurrency = {concurrency}\n")
        extra["CONTEMPLATION_CONFIG"] = str(cfg)
    env = base_env(home, fake_ollama, CONTEMPLATION_DASHBOARD_ENABLED="false", **extra)
    words = "one two three four five six seven eight nine ten"
    fake_ollama.enqueue(  # each seat streams for 1.5 s: long enough to overlap the others
        *(Step(model=m, text=f"{m}: {words}", chunk_delay=0.15) for m in MODELS)
    )
    daemon_factory(env, home).wait_ready()
    seats = [a for m in MODELS for a in ("--model", m)]
    done = cli_here(env, "new", "Vote", *seats, "--message", "Count?", "--wait", "--timeout", "60")
    assert all(f"{m}: {words}" in done.stdout for m in MODELS), done.stdout
    assert fake_ollama.max_active == together, fake_ollama.max_active
    log = Reader(home).locate(done.stderr.strip().splitlines()[-1]).log.read_text()
    assert [h for h, _ in HEADER.findall(log)] == ["CLAUDE", "GEMMA", "LLAMA3_2", "QWEN3"], log
    asked = [r["model"].split(":")[0] for r in fake_ollama.chat_requests()]
    assert sorted(asked) == sorted(MODELS), asked  # each seat asked once
    assert all(log.count(f"{m}: {words}") == 1 for m in MODELS), log
    assert json.dumps(log).count("INTERRUPTED") == 0
