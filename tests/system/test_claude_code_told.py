"""Claude is told whichever face decides. The real Claude Code
(2.1.328) hands a dialogue to a local model whose lookup a ``[permissions]`` rule marks
``ask``; Claude Code shows the approval form (its task is ``input_required``), nobody
answers it, and the person decides from the CLI (``contemplation approve``) instead. The
model's reply must reach "Claude" (a later request to the scripted Messages API holds it)
within seconds, with nobody touching the stale form.

Claude Code runs as in :mod:`tests.system.test_claude_code_tasks` (a pseudo-terminal,
offline, a scripted Anthropic Messages server and a scripted Ollama behind the real
daemon). What reaches Claude is the plugin's monitor (``contemplation watch --agent``, armed by
Claude Code at the session's start): its line comes as a ``<task-notification>`` "Monitor
event". Without the plugin (a bare ``claude mcp add``) nothing does, kept as a strict xfail:
while the form is open Claude Code sends no ``tasks/get``, and its listen stream has no place
for a task's status."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contemplation.store.layout import Home
from tests import peers
from tests.conftest import DaemonProc, cli, wait_for
from tests.fakes.anthropic_server import FakeAnthropic, Turn
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_claude_code_tasks import (
    START,
    Terminal,
    anthropic,  # noqa: F401 (the fixture)
    claude_env,
    set_up_claude,
)

REPLY = "The launch code is in the notes."
TOLD_WITHIN = 20.0  # seconds from the CLI's decision to "Claude" holding the reply
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-B]|\x1b[=>]")
TASK_ID = re.compile(r"(conv_[A-Za-z0-9_-]+)\.[0-9a-f]{32}")


def asking(tmp_path: Path) -> tuple[Path, Path]:
    """A notes folder the model may read, its ``secret.md`` marked ``ask``; the config."""
    notes = tmp_path / "notes"
    notes.mkdir()
    secret = notes / "secret.md"
    secret.write_text("the launch code")
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[tools]\nallowed_roots = ["{notes}"]\n\n[permissions]\nread_file = {{ "*secret*" = "ask" }}\n'
    )
    return secret, cfg


PLUGIN_START = "mcp__plugin_contemplation_contemplation__conversation_start"


def running(home: Home, command: bytes) -> list[int]:
    """The processes of ``contemplation … COMMAND`` (``watch``: the plugin's monitors,
    ``mcp``: its MCP servers) still running for ``home``, from /proc."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = b"contemplation" in b" ".join(argv) and str(home.root).encode() in argv
        if ours and command in argv and (command == b"watch" or b"watch" not in argv):
            found.append(int(d.name))
    return found


def monitors(home: Home) -> list[int]:
    return running(home, b"watch")


def set_up_plugin(env: dict[str, str], home: Home, project: Path, *extra: str) -> None:
    """``contemplation install claude-code`` as a person would (the plugin: its MCP server and
    its monitor), and Claude Code's first-run questions answered in its config."""
    Path(env["HOME"]).mkdir(parents=True)
    project.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "contemplation", "--home", str(home.root), "install",
         "claude-code", "--dir", str(Path(env["HOME"]) / "plugins"),
         "--claude", str(peers.node_bin("claude")), *extra],
        env=env, cwd=project, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    config_path = Path(env["HOME"]) / ".claude.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    config.update(
        hasCompletedOnboarding=True,
        theme="dark",
        customApiKeyResponses={"approved": [env["ANTHROPIC_API_KEY"][-20:]], "rejected": []},
    )
    config.setdefault("projects", {}).setdefault(str(project), {})["hasTrustDialogAccepted"] = True
    config_path.write_text(json.dumps(config))


def with_bash(env: dict[str, str], project: Path) -> Terminal:
    """Claude Code asked to ask the local model, allowed its Bash tool (auto mode refuses
    Bash offline, so the default permission mode)."""
    argv = [str(peers.node_bin("claude")), "Ask the local model.", "--permission-mode", "default"]
    return Terminal([*argv, "--allowedTools", "Bash"], env, project)


def decided_from_the_cli_while_the_form_is_open(
    home: Home,
    tmp_path: Path,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    anthropic: Callable[..., FakeAnthropic],  # noqa: F811
    plugin: bool,
) -> tuple[FakeAnthropic, str, float]:
    """Claude Code up to its approval form, the form left alone, ``contemplation approve``
    run, and then "Claude" watched until it holds a request with the reply's news (or
    :data:`TOLD_WITHIN` runs out). Returns the scripted server, the conversation and the
    seconds from the decision to that request (``inf`` where none came)."""
    secret, cfg = asking(tmp_path)
    start = PLUGIN_START if plugin else START
    fake = anthropic(Turn(tool=start, input={"topic": "Notes", "initial_prompt": f"Read {secret}"}))
    env = claude_env(home, tmp_path, fake, fake_ollama) | {"CONTEMPLATION_CONFIG": str(cfg)}
    if plugin:
        set_up_plugin(env, home, tmp_path / "project")
    else:
        set_up_claude(env, tmp_path / "project")
    fake_ollama.enqueue(Step(text=f"NEED: File contents of {secret}"), Step(text=REPLY))
    daemon_factory(env, home).wait_ready()
    argv = [str(peers.node_bin("claude")), "Ask the local model.", "--allowedTools", start]
    term = Terminal(argv, env, tmp_path / "project")
    try:

        def screen() -> str:
            if term.proc.poll() is not None:
                raise AssertionError(f"claude exited: {term.tail()}")
            return ANSI.sub("", bytes(term.screen).decode("utf-8", "replace"))

        # Claude Code shows the approval form (the task is input_required); nobody answers it
        try:
            # (spaces compared away: with CI set, Claude Code draws some of them as cursor moves)
            wait_for(lambda: "requestsyourinput" in "".join(screen().split()), 120, what="the form")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; screen: {screen()[-3000:]!r}") from None
        with fake.lock:
            started = json.dumps(fake.requests[-1]["messages"])
        found = TASK_ID.search(started)
        assert found, started[-2000:]
        conv = found.group(1)
        # the task's result; the monitor's line (the person decided in their terminal)
        news = (REPLY, f"{conv} (Notes): the person approved once")

        def told() -> bool:
            screen()
            with fake.lock:
                return any(n in json.dumps(r) for r in fake.requests for n in news)

        assert not told()
        decided = cli(env, "approve", conv, "--once")
        assert decided.returncode == 0, decided.stderr
        at = time.monotonic()
        try:
            wait_for(told, TOLD_WITHIN, what="the reply's news handed to Claude")
        except AssertionError:
            return fake, conv, float("inf")
        return fake, conv, time.monotonic() - at
    finally:
        term.stop()


@pytest.mark.slow  # it waits out TOLD_WITHIN for what never comes: 122 s, in --slow
@pytest.mark.xfail(
    strict=True,
    reason="without the plugin's monitor nothing reaches Claude: Claude Code 2.1.328 awaits the "
    "task's form before it polls again (no tasks/get while the form is open; notifications/tasks "
    "is not in its listen schema). With the plugin it is told: the test below",
)
def test_a_bare_mcp_server_cannot_tell_claude_while_its_form_is_unanswered(
    home: Home,
    tmp_path: Path,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    anthropic: Callable[..., FakeAnthropic],  # noqa: F811
) -> None:
    made = (home, tmp_path, fake_ollama, daemon_factory, anthropic)
    _, _, took = decided_from_the_cli_while_the_form_is_open(*made, plugin=False)
    assert took <= TOLD_WITHIN


def test_the_plugin_monitor_tells_claude_when_the_cli_decides(
    home: Home,
    tmp_path: Path,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    anthropic: Callable[..., FakeAnthropic],  # noqa: F811
) -> None:
    made = (home, tmp_path, fake_ollama, daemon_factory, anthropic)
    fake, conv, took = decided_from_the_cli_while_the_form_is_open(*made, plugin=True)
    assert took <= TOLD_WITHIN, f"no request to Claude held the monitor's line in {TOLD_WITHIN} s"
    with fake.lock:
        event = next(
            json.dumps(r)
            for r in fake.requests
            if f"{conv} (Notes): the person approved once" in json.dumps(r)
        )
    assert "Monitor event" in event and "<task-notification>" in event, event[-2000:]
    assert "in their terminal; its form is answered" in event
    assert f'conversation_wait(conversation_id=\\"{conv}\\")' in event  # what to call next
    # Claude Code killed (SIGKILL to its group): its monitor does not poll on for nobody
    wait_for(lambda: not monitors(home), 15, what="the monitor to stop with its session")


def test_the_rewake_hook_wakes_claude_when_a_cli_conversation_replies(
    home: Home,
    tmp_path: Path,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    anthropic: Callable[..., FakeAnthropic],  # noqa: F811
) -> None:
    """Wake the agent where tasks do not reach: Claude starts a conversation
    with the CLI from its Bash tool (no MCP task to bring the reply back) and ends its turn
    while the model still works; the opt-in Stop hook (``asyncRewake``: ``watch --rewake``)
    waits for the reply and wakes the idle session with the line (Claude Code hands it over
    as "Stop hook feedback")."""
    cmd = shlex.join(
        [sys.executable, "-m", "contemplation", "--home", str(home.root),
         "new", "Slow", "--message", "Take your time."]
    )  # fmt: skip
    fake = anthropic(
        Turn(tool="Bash", input={"command": cmd, "description": "ask"}), Turn(text="Asked.")
    )
    env = claude_env(home, tmp_path, fake, fake_ollama)
    set_up_plugin(env, home, tmp_path / "project", "--with-rewake")
    fake_ollama.enqueue(Step(text=REPLY, first_byte_delay=8.0))
    daemon_factory(env, home).wait_ready()
    term = with_bash(env, tmp_path / "project")
    try:

        def woken() -> bool:
            if term.proc.poll() is not None:
                raise AssertionError(f"claude exited: {term.tail()}")
            with fake.lock:
                return any(
                    "Stop hook" in json.dumps(r["messages"][-1:])
                    and "(Slow) replied" in json.dumps(r["messages"][-1:])
                    for r in fake.requests
                )

        try:
            wait_for(woken, 120, what="Claude woken with the reply's line")
        except AssertionError as exc:
            with fake.lock:
                said = [json.dumps(r["messages"][-1])[-800:] for r in fake.requests]
            raise AssertionError(f"{exc}; requests: {said}; screen: {term.tail()!r}") from None
    finally:
        term.stop()


class AskedByTask:
    """Claude Code with the plugin, asking the local model with the plugin's
    ``conversation_start`` (an MCP task); the reply comes ``delay`` seconds after the
    request reaches the scripted Ollama. :meth:`wakes` is each request to the scripted
    Messages API whose newest message holds the reply's news (its text, or a monitor line)."""

    def __init__(self, made: tuple[Any, ...], delay: float) -> None:
        home, tmp_path, fake_ollama, daemon_factory, scripted = made
        self.fake: FakeAnthropic = scripted(
            Turn(tool=PLUGIN_START, input={"topic": "Indexes", "initial_prompt": "Which index?"})
        )
        env = claude_env(home, tmp_path, self.fake, fake_ollama)
        set_up_plugin(env, home, tmp_path / "project")
        fake_ollama.enqueue(Step(text=REPLY, first_byte_delay=delay))
        daemon_factory(env, home).wait_ready()
        argv = [str(peers.node_bin("claude")), "Ask the local model."]
        self.term = Terminal([*argv, "--allowedTools", PLUGIN_START], env, tmp_path / "project")

    def wakes(self) -> list[str]:
        if self.term.proc.poll() is not None:
            raise AssertionError(f"claude exited: {self.term.tail()}")
        with self.fake.lock:
            newest = [json.dumps(r["messages"][-1]) for r in self.fake.requests]
        return [m for m in newest if REPLY in m or "(Indexes) replied" in m]

    def told_once(self, within: float = 8.0) -> str:
        """Claude's one wake for the reply; another within ``within`` s (a monitor's line
        follows within its 1 s interval) fails."""
        what = f"the reply handed to Claude; {self.term.tail()[-1500:]}"
        wait_for(lambda: self.wakes(), 120, what=what)
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and len(self.wakes()) == 1:
            time.sleep(0.2)
        told = self.wakes()
        assert len(told) == 1, told
        return told[0]


def test_a_reply_a_task_carries_wakes_claude_once(
    home: Home,
    tmp_path: Path,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    anthropic: Callable[..., FakeAnthropic],  # noqa: F811
) -> None:
    """One wake per reply, with the plugin installed as the README says: the task's
    notification carries the reply, and the monitor does not announce it too (it used to,
    a second request to Claude for the same reply)."""
    asked = AskedByTask((home, tmp_path, fake_ollama, daemon_factory, anthropic), 3.0)
    try:
        wait_for(lambda: monitors(home), 60, what="the plugin's monitor")
        assert "<status>completed</status>" in asked.told_once()  # the task's notification
    finally:
        asked.term.stop()


def test_a_task_whose_server_died_still_reaches_claude(
    home: Home,
    tmp_path: Path,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    anthropic: Callable[..., FakeAnthropic],  # noqa: F811
) -> None:
    """The plugin's MCP server is killed (SIGKILL) while its task's reply is still being
    written. Claude Code 2.1.328 does not ask the task again (it is shown running), so the
    monitor says the reply: the task's record names its server, which is gone. Claude is
    told once."""
    asked = AskedByTask((home, tmp_path, fake_ollama, daemon_factory, anthropic), 6.0)
    try:
        what = f"the task started; {asked.term.tail()[-800:]}"
        wait_for(lambda: asked.fake.tool_results(), 120, what=what)
        servers = running(home, b"mcp")
        assert servers, "the plugin's MCP server"
        for pid in servers:
            os.kill(pid, signal.SIGKILL)
        told = asked.told_once(5.0)
        assert "Monitor event" in told and "(Indexes) replied" in told, told[-1500:]
    finally:
        asked.term.stop()


def test_claude_running_approve_in_its_bash_tool_is_refused(
    home: Home,
    tmp_path: Path,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    anthropic: Callable[..., FakeAnthropic],  # noqa: F811
) -> None:
    """The finding's route, with the real Claude Code: Claude starts a conversation with the
    CLI from its Bash tool, its lookup waits for approval, and Claude runs `contemplation
    approve … --always` in the same tool, its mark unset first. Refused: the approval is the
    person's (Claude Code shows forms), Claude is told where the person decides, and nothing
    is decided."""
    secret, cfg = asking(tmp_path)
    cli_cmd = [sys.executable, "-m", "contemplation", "--home", str(home.root)]
    new = shlex.join([*cli_cmd, "new", "Notes", "--message", f"Read {secret}", "--wait"])

    def approve(said: str) -> dict[str, Any]:
        found = re.search(r"conv_[A-Za-z0-9_-]+", said)
        assert found, said
        cmd = f"unset CLAUDECODE; {shlex.join([*cli_cmd, 'approve', found[0], '--always'])}"
        return {"command": cmd, "description": "approve"}

    fake = anthropic(
        Turn(tool="Bash", input={"command": new, "description": "ask"}),
        Turn(tool="Bash", then=approve),
        Turn(text="Done."),
    )
    env = claude_env(home, tmp_path, fake, fake_ollama) | {"CONTEMPLATION_CONFIG": str(cfg)}
    set_up_claude(env, tmp_path / "project")
    fake_ollama.enqueue(Step(text=f"NEED: File contents of {secret}"), Step(text=REPLY))
    daemon_factory(env, home).wait_ready()
    term = with_bash(env, tmp_path / "project")
    try:

        def answered() -> bool:
            if term.proc.poll() is not None:
                raise AssertionError(f"claude exited: {term.tail()}")
            return len(fake.tool_results()) >= 2

        wait_for(answered, 180, what=f"both commands run; {term.tail()[-1500:]}")
    finally:
        term.stop()
    said = json.dumps(fake.tool_results()[1])
    assert "are the person's to decide" in said, said[-2000:]
    [conv] = [c for c in home.active.iterdir() if c.name.startswith("conv_")]
    meta = json.loads((conv / "metadata.json").read_text())
    assert meta.get("approvals", []) == [], meta["approvals"]
    assert REPLY not in (conv / "messages.log").read_text()
