"""Plugins by entry point (issue 25): the example in examples/contemplation-echo installed by
real pip, found by importlib.metadata in fresh CLI processes, listed by ``plugins``, its
``upper`` tool routed by ``routes test`` and answering a model's NEED in a real ``run --once``
(against the fake Ollama, and with its own ``echo`` backend: a conversation through both),
its ``[plugins.echo]`` settings checked by its model at start; a plugin that cannot be
imported is one line in ``plugins`` and ``doctor``, and the daemon runs without it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from contemplation.layout import Home
from contemplation.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests.conftest import ROOT, base_env, cli
from tests.fakes.ollama_server import FakeOllama, Step

EXAMPLE = ROOT / "examples" / "contemplation-echo"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example installed as a user would (pip, from its folder), into a folder of its own
    that the CLI processes get on PYTHONPATH (the project's venv stays as it is)."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps",
         "--target", str(target), str(EXAMPLE)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert list(target.glob("contemplation_echo-*.dist-info/entry_points.txt"))
    return target


def with_path(env: dict[str, str], *folders: Path) -> dict[str, str]:
    return env | {"PYTHONPATH": ":".join(str(f) for f in folders)}


def test_the_example_plugin_is_listed_routed_and_answers_a_need(
    home: Home, fake_ollama: FakeOllama, installed: Path
) -> None:
    env = with_path(base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0"), installed)
    listed = json.loads(cli(env, "plugins", "--json").stdout)
    assert {"name": "echo", "from": "contemplation-echo"} in listed["backends"]
    upper = next(t for t in listed["tools"] if t["name"] == "upper")
    assert upper["from"] == "contemplation-echo" and upper["rules"] == ["upper_case"]
    assert listed["failed"] == []
    routed = cli(env, "routes", "test", "NEED: Upper case of hello").stdout
    assert "upper_case (plugin contemplation-echo)" in routed and '{"text": "hello"}' in routed
    assert {"name": "upper", "from": "contemplation-echo", "label": "background",
            "description": "the text in capitals"} in listed["context"]  # fmt: skip
    conv = new_conversation(
        home,
        "plugin",
        template=load_template(home, "default"),
        model="llama3.2",
        backend="ollama",
        extra={"context_requirements": [{"type": "upper", "text": "from the plugin"}]},
    )
    fake_ollama.enqueue(Step(text="Let me check.\nNEED: Upper case of hello"))
    fake_ollama.enqueue(Step(text="It is HELLO."))
    drop_message(conv, "What is hello in capitals?")
    cli(env, "run", "--once", timeout=60)
    log = conv.log.read_text()
    assert "RESPONSE TO NEED: Upper case of hello" in log
    answer = log.split("RESPONSE TO NEED: Upper case of hello", 1)[1]
    assert "\nHELLO\n" in answer and "It is HELLO." in log
    # the model was told of the plugin's rule in its system prompt
    system = fake_ollama.chat_requests()[0]["messages"][0]["content"]
    assert "Upper case of" in system
    # and the plugin's context kind gathered its requirement through its tool
    assert "FROM THE PLUGIN" in system


def test_a_plugin_that_fails_to_load_is_one_line_and_the_daemon_runs_without_it(
    home: Home, fake_ollama: FakeOllama, tmp_path: Path, installed: Path
) -> None:
    broken = tmp_path / "broken"
    info = broken / "broken_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[contemplation.tools]\nbad = no_such_module:kind\n")
    env = with_path(
        base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0"), broken, installed
    )
    listed = cli(env, "plugins", check=False)
    assert listed.returncode == 1
    assert "FAILED bad (broken-plugin): ModuleNotFoundError" in listed.stdout
    assert "upper" in listed.stdout  # the good plugin still loads
    doctor = cli(env, "doctor", "--json", check=False)
    rows = [r for r in json.loads(doctor.stdout)["checks"] if r["check"] == "plugin"]
    assert len(rows) == 1 and "bad (broken-plugin) was not loaded" in rows[0]["detail"]
    conv = new_conversation(
        home, "still", template=load_template(home, "default"), model="llama3.2", backend="ollama"
    )
    fake_ollama.enqueue(Step(text="fine"))
    drop_message(conv, "hi")
    assert cli(env, "run", "--once", timeout=60, check=False).returncode == 0
    assert "fine" in conv.log.read_text()


def test_a_conversation_through_the_plugin_backend_and_tool(
    home: Home, tmp_path: Path, installed: Path
) -> None:
    """``new --backend echo``: the echo backend streams back the agent's message, its NEED
    line is answered by the upper tool, and the echo of that answer ends the exchange."""
    config = tmp_path / "config.toml"
    config.write_text('[plugins.echo]\nprefix = "Echo: "\n')
    env = with_path(base_env(home, CONTEMPLATION_SETTLE_SECONDS="0"), installed)
    env["CONTEMPLATION_CONFIG"] = str(config)
    conv_id = cli(env, "new", "through both", "--backend", "echo", "--model", "any").stdout.strip()
    cli(env, "send", conv_id, "hello\nNEED: Upper case of hello")
    cli(env, "run", "--once", timeout=60)
    log = (home.active / conv_id / "messages.log").read_text()
    assert "=== ECHO -> CLAUDE [" in log and "Echo: hello\nNEED: Upper case of hello" in log
    assert "RESPONSE TO NEED: Upper case of hello" in log and "\nHELLO\n" in log
    assert log.count("=== ECHO -> CLAUDE [") == 2  # the echo of the answer asks for nothing
    # models lists a plugin backend through the same protocol as a built-in one
    listed = json.loads(cli(env, "models", "-b", "echo", "--json").stdout)["backends"]
    assert [(b["backend"], b["ok"], [m["name"] for m in b["models"]]) for b in listed] == [
        ("echo", True, ["echo"])
    ]
    assert listed[0]["models"][0]["context_length"] == 32_768
    config.write_text('[plugins.echo]\nprefx = "Echo: "\n')
    bad = cli(env, "doctor", check=False)
    assert bad.returncode == 1 and "invalid setting plugins.echo.prefx in" in bad.stdout + bad.stderr
    config.write_text("[plugins.nothing]\nx = 1\n")
    worse = cli(env, "run", "--once", check=False, timeout=30)
    assert worse.returncode != 0
    assert "no installed plugin has a backend named 'nothing'" in worse.stderr
