"""Notifications: configured commands run by a real daemon on reply / need / complete / error,
with the event in environment variables and JSON on stdin, never on a shell line."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contemplation.daemon.notify import Event, derive, run_command
from contemplation.settings import NotificationRule
from contemplation.store.layout import Home
from contemplation.store.templates import load_template
from contemplation.writer import new_conversation, open_writer
from tests.conftest import DaemonProc, base_env, cli_here, wait_for
from tests.fakes.ollama_server import FakeOllama, Step

RECORDER = textwrap.dedent(
    """
    import json, os, sys, time
    out = sys.argv[1]
    data = {
        "argv": sys.argv[1:],
        "env": {k: v for k, v in os.environ.items() if k.startswith("CONTEMPLATION_")},
        "stdin": json.loads(sys.stdin.read()),
    }
    name = f"{time.time_ns()}-{os.getpid()}.json"
    with open(os.path.join(out, "." + name), "w") as f:
        json.dump(data, f)
    os.rename(os.path.join(out, "." + name), os.path.join(out, name))
    """
)
INJECTION = "$(touch PWNED) `touch PWNED2`; touch PWNED3 && echo"


def recorded(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("[0-9]*.json"))]


def events(out: Path) -> list[str]:
    return [r["env"]["CONTEMPLATION_EVENT"] for r in recorded(out)]


def test_a_real_daemon_runs_the_commands_for_each_event(
    home: Home,
    tmp_path: Path,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
) -> None:
    script = tmp_path / "recorder.py"
    script.write_text(RECORDER)
    out = tmp_path / "out"
    out.mkdir()
    config = tmp_path / "config.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            archive_on_complete = false
            [[notifications]]
            on = ["need", "complete", "error"]
            command = [{json.dumps(sys.executable)}, {json.dumps(str(script))}, {json.dumps(str(out))}]
            [[notifications]]
            on = ["reply"]
            command = [{json.dumps(sys.executable)}, {json.dumps(str(script))}, {json.dumps(str(out))}, "reply-rule"]
            """
        )
    )
    env = base_env(home, fake_ollama, CONTEMPLATION_CONFIG=str(config))
    env["CONTEMPLATION_DASHBOARD_ENABLED"] = "false"
    daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(
        Step(text=f"I need one thing.\nNEED: the numbers {INJECTION}"),
        Step(text="All clear.\n=== COMPLETE ==="),
    )
    conv_id = cli_here(env, "new", "Notify me", "--message", "Start").stdout.strip()
    wait_for(
        lambda: events(out).count("need") == 1 and "reply" in events(out),
        timeout=20,
        what="reply and need notifications",
    )
    cli_here(env, "respond", conv_id, "42")
    wait_for(lambda: "complete" in events(out), timeout=20, what="complete notification")
    fake_ollama.enqueue(Step(kind="error", status=400, error="invalid options"))
    cli_here(env, "send", conv_id, "one more")
    wait_for(lambda: "error" in events(out), timeout=20, what="error notification")
    rows = recorded(out)
    assert sorted(events(out)) == ["complete", "error", "need", "reply", "reply"]
    need = next(r for r in rows if r["env"]["CONTEMPLATION_EVENT"] == "need")
    assert need["argv"] == [str(out)]  # exactly the configured argv
    assert need["env"]["CONTEMPLATION_CONVERSATION"] == conv_id
    assert need["env"]["CONTEMPLATION_TOPIC"] == "Notify me"
    assert need["env"]["CONTEMPLATION_STATUS"] == "awaiting_agent"
    assert need["stdin"]["needs"] == [f"the numbers {INJECTION}"]
    assert need["stdin"]["event"] == "need" and need["stdin"]["conversation"] == conv_id
    replies = [r for r in rows if r["env"]["CONTEMPLATION_EVENT"] == "reply"]
    assert all(r["argv"] == [str(out), "reply-rule"] for r in replies)
    assert replies[0]["stdin"]["reply"].startswith("I need one thing.")
    error = next(r for r in rows if r["env"]["CONTEMPLATION_EVENT"] == "error")
    assert "invalid options" in error["stdin"]["error"]
    # model text went to stdin only: never into an environment variable, never to a shell
    for r in rows:
        assert all("touch" not in v for v in r["env"].values())
    for name in ("PWNED", "PWNED2", "PWNED3"):
        assert not (tmp_path / name).exists() and not Path(name).exists()


def test_derive_reads_what_an_event_implies(home: Home) -> None:
    conv = new_conversation(
        home, "derive", template=load_template(home, "default"), model="m", backend="ollama"
    )
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "go", msg_id="m1")
        r = w.reply("OLLAMA", "CLAUDE", "r1")
        r.content("done\n=== COMPLETE ===\n")
        r.finish()
    got = derive(home, conv.id, "reply", {"usage": None})
    assert [e.name for e in got] == ["reply", "complete"]
    assert got[0].payload["reply"] == "done"
    assert derive(home, conv.id, "token", {"text": "x"}) == []
    assert derive(home, "conv_missing", "reply", {}) == []
    assert [e.name for e in derive(home, conv.id, "error", {"error": "boom"})] == ["error"]
    asked = derive(
        home, conv.id, "awaiting_approval", {"requests": [{"need": "file: ~/notes.md", "id": "a"}]}
    )
    assert [(e.name, e.payload["needs"]) for e in asked] == [("need", ["file: ~/notes.md"])]


def test_a_hanging_command_is_killed_after_its_timeout(tmp_path: Path) -> None:
    rule = NotificationRule(
        on=["reply"], command=[sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5
    )
    ev = Event("reply", "conv_x", {"conversation": "conv_x"})
    t0 = time.monotonic()
    assert asyncio.run(run_command(rule, ev)) is None
    assert time.monotonic() - t0 < 5
    ok = NotificationRule(
        on=["reply"], command=[sys.executable, "-c", "import sys; sys.stdin.read()"]
    )
    assert asyncio.run(run_command(ok, ev)) == 0
    missing = NotificationRule(on=["reply"], command=[str(tmp_path / "no-such-program")])
    assert asyncio.run(run_command(missing, ev)) == -1
