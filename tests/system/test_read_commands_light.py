"""Commands a person types often start like native tools: the read commands (list, status,
tail, search by words, approvals) load only what they use. Each runs in a fresh interpreter
(what a process loads is the thing under test) and the modules it loaded are named: none of
the settings model (its verdict on these inputs is known: contemplation.faces.cli.light), the
actions, the backends or an HTTP client; ``list``, ``status``, ``tail``, ``search`` by words
``approvals`` and ``status CONV`` load neither pydantic nor the models, nor structlog and asyncio
(``list`` while the index is up to date: a folder that changed since is read again with the
models; state.json and metadata.json are read by contemplation.store.plain, which hands a
document to the models only where it is unsure). A deterministic check, not a timed one: bench/bench_read_commands.py
measures the time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from contemplation.store.layout import Home
from tests.conftest import ROOT, base_env, cli_here

PROBE = (
    "import sys, json, runpy\n"
    "sys.argv = ['contemplation', *json.loads(sys.argv[1])]\n"
    "try:\n    runpy.run_module('contemplation', run_name='__main__')\n"
    "except SystemExit as exc:\n    code = exc.code\n"
    "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
)
NEVER = (
    "pydantic_settings", "contemplation.settings", "contemplation.faces.actions",
    "contemplation.backends", "httpx", "aiohttp", "mcp", "starlette",
)  # fmt: skip
# the models (pydantic: importing it costs more than a read command's whole work), logging,
# asyncio and urllib's HTTP client: the read commands read the log, the index and the folders' JSON without them
LIGHT = ("pydantic", "contemplation.models", "structlog", "asyncio", "http.client")
# what makes and moves conversations (the writer's folders, with the templates and ladders
# they read) and what makes writes durable (its points, ctypes for syncfs): a reader that
# asks whether the daemon runs loads none of it
MAKING = (
    "contemplation.writer.folders", "contemplation.store.templates",
    "contemplation.writer.durable", "ctypes",
)  # fmt: skip
READS = NEVER + LIGHT + MAKING  # what no read command loads


def _loaded(env: dict[str, str], *args: str) -> tuple[str, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return proc.stdout, json.loads(proc.stderr.strip().splitlines()[-1])


def _heavy(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


@pytest.fixture
def conv_env(home: Home) -> tuple[dict[str, str], str]:
    env = base_env(home)
    conv = cli_here(env, "new", "light reads").stdout.strip()  # loads the model: its verdict
    cli_here(env, "list")  # the index brought up to date (a changed folder is read again)
    return env, conv


def test_list_loads_no_settings_model_no_pydantic_no_logging(
    conv_env: tuple[dict[str, str], str],
) -> None:
    env, conv = conv_env
    out, modules = _loaded(env, "list")
    assert conv in out
    assert _heavy(modules, READS) == []


@pytest.mark.parametrize(
    "args",
    [("status",), ("status", "{conv}"), ("tail", "{conv}"), ("search", "light", "--mode", "words"),
     ("approvals",)],
    ids=["status", "status CONV", "tail", "search words", "approvals"],
)  # fmt: skip
def test_the_read_commands_load_no_settings_model_nor_actions(
    conv_env: tuple[dict[str, str], str], args: tuple[str, ...]
) -> None:
    env, conv = conv_env
    _, modules = _loaded(env, *(a.format(conv=conv) for a in args))  # exit 0 (check=True)
    assert _heavy(modules, READS) == []


def test_without_a_verdict_the_model_is_loaded_and_then_not(home: Home) -> None:
    """A new set of inputs (here a variable never seen) loads the model once, which records
    its verdict; the next run reads it."""
    env = {**base_env(home), "CONTEMPLATION_REPLY_CAP": "0.4"}
    cli_here(base_env(home), "list")  # the index made
    _, first = _loaded(env, "list")
    _, second = _loaded(env, "list")
    assert "contemplation.settings" in first
    assert _heavy(second, NEVER + LIGHT) == []
