"""Plugins by entry point: the example in examples/contemplation-echo installed by
real pip, found by importlib.metadata in fresh CLI processes, listed by ``plugins``, its
``upper`` tool routed by ``routes test`` and answering a model's NEED in a real ``run --once``
(against the fake Ollama, and with its own ``echo`` backend: a conversation through both),
its ``[plugins.echo]`` settings checked by its model at start; a plugin that cannot be
imported is one line in ``plugins`` and ``doctor``, and the daemon runs without it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path

import pytest

from contemplation import backends
from contemplation.backends import Backend, BackendInputs, BackendKind, guard
from contemplation.backends.base import Capabilities, Check
from contemplation.engine.pipeline import Runtime
from contemplation.errors import ErrorKind
from contemplation.models import BackendSession, ChatRequest, StreamEvent
from contemplation.settings import Settings
from contemplation.store.layout import Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests.conftest import ROOT, base_env, cli, run_burst
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


# ------------------------------------------------------------ a plugin's backend held to bounds


class _Misbehaving:
    """A plugin's backend: one piece, then it hangs (``hang``) or raises a bug of its own."""

    label = "MISBEHAVING"
    concurrency = 1

    def __init__(self, name: str, hang: bool) -> None:
        self.name, self.hang, self.closed = name, hang, False

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        yield StreamEvent("content", "a first piece")
        if self.hang:
            await asyncio.Event().wait()  # never set: no more, ever
        raise ValueError("off by one")

    async def capabilities(self, model: str) -> Capabilities:
        await asyncio.Event().wait()  # hangs too: bounded by the guard's CALL_LIMIT
        raise AssertionError("unreachable")

    async def check(self, model: str | None) -> list[Check]:
        raise KeyError("nope")

    async def models(self) -> list[str]:
        return []

    async def forget(self, conversation_id: str, session: BackendSession | None = None) -> None:
        return None

    async def aclose(self) -> None:
        self.closed = True


@pytest.mark.parametrize("hang", [True, False], ids=["hangs", "raises"])
def test_a_plugin_backend_that_hangs_or_raises_costs_its_turn_not_the_daemon(
    home: Home, make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch, hang: bool
) -> None:
    kind_name = f"misbehaving_{'hangs' if hang else 'raises'}"
    made: list[_Misbehaving] = []

    def make(m: BackendInputs) -> Backend:
        made.append(_Misbehaving(m.name, hang))
        return made[-1]

    monkeypatch.setattr(guard, "CALL_LIMIT", 0.3)
    backends.KINDS.register(BackendKind(kind_name, make), "contemplation-test-plugin")
    try:
        s = make_settings(
            providers={"flaky": {"kind": kind_name, "timeouts": {"first_byte": 5, "idle": 0.3}}},
            retry={"base": 60, "cap": 60},
        )
        assert backends.config(s, "flaky")[1] == {}  # timeouts are the guard's, not the kind's
        conv = new_conversation(
            home, "bounded", template=load_template(home, "default"), model="m", backend="flaky"
        )
        drop_message(conv, "hello")
        t0 = time.monotonic()
        run_burst(Runtime(settings=s, home=Home(s.home)))
        took = time.monotonic() - t0
        state = read_state(conv)
        log = conv.log.read_text()
        assert state is not None and state.last_error is not None
        if hang:  # a stall: retried later like any server's, the piece marked cut
            assert state.status.value == "retrying" and state.last_error.kind == ErrorKind.STALL
            assert "sent no more for 0.3 s" in state.last_error.message
        else:  # the plugin's bug: this turn's ERROR, naming the plugin
            assert state.status.value == "error" and state.last_error.kind == ErrorKind.BACKEND
            assert "contemplation-test-plugin" in log and "ValueError: off by one" in log
        assert took < 30 and made and made[-1].closed
        checks = asyncio.run(backends.check_all(s, extra=["flaky"]))
        flaky = [c for c in checks if c.name == "flaky"]
        assert flaky and not flaky[0].ok and "KeyError" in flaky[0].detail
    finally:
        backends.KINDS.forget(kind_name)


def test_a_provider_that_cannot_be_made_is_the_agents_error_not_a_crash_loop(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    """A plugin whose backend cannot be made, a kind no plugin has, a name nothing has: the
    turn writes one ERROR the agent reads and the conversation stops in status error (before,
    each was a traceback in the daemon's log every few seconds, and the agent saw nothing)."""

    def make(m: BackendInputs) -> Backend:
        raise RuntimeError("no licence file")

    backends.KINDS.register(BackendKind("unmakeable", make), "contemplation-test-plugin")
    try:
        s = make_settings(
            providers={"p1": {"kind": "unmakeable"}, "p2": {"kind": "nosuchkind"}},
        )
        tpl = load_template(home, "default")
        convs = {}
        for backend in ("p1", "p2", "nowhere"):
            convs[backend] = new_conversation(home, backend, template=tpl, model="m", backend=backend)
            drop_message(convs[backend], "hello")
        run_burst(Runtime(settings=s, home=Home(s.home)))
        says = {
            "p1": "the plugin unmakeable (contemplation-test-plugin) could not make its backend: "
            "RuntimeError: no licence file",
            "p2": "invalid setting providers.p2.kind in the command line (--providers): no "
            "backend kind 'nosuchkind'; known: ",
            "nowhere": "unknown backend 'nowhere'",
        }
        for backend, conv in convs.items():
            state = read_state(conv)
            assert state is not None and state.status.value == "error"
            assert state.last_error is not None and state.last_error.kind == ErrorKind.CONFIG
            error = [line for line in conv.log.read_text().splitlines() if "=== ERROR" in line]
            assert len(error) == 1 and f"cannot use backend '{backend}'" in error[0]
            assert says[backend] in error[0], error[0]
    finally:
        backends.KINDS.forget("unmakeable")
