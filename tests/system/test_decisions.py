"""Decisions about lookups are final: the first decision about a lookup
wins; a later one, through any face (CLI, MCP, dashboard), is refused with one line naming
what was decided, through which face and when. Of N deciders racing, exactly one is told
"done": the decision is read and written under the conversation's faces lock, so it is
atomic across threads and processes.

The faces are the real ones: the CLI as a process, the MCP server through the SDK's client,
the dashboard over real HTTP on loopback; the racers call the real decision path from 20
threads, and from 20 processes."""

from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from contemplation import settings as settings_mod
from contemplation.engine.runtime import Runtime
from contemplation.errors import InputRejected
from contemplation.faces import actions
from contemplation.faces.reading import Reader
from contemplation.models import DECIDERS, ApprovalDecision, Status
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_metadata
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests.conftest import ROOT, DaemonProc, base_env, cli_here, run_burst, wait_for
from tests.dashboard_served import Served, serve
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_dashboard_actions import asking, auth
from tests.system.test_permissions import state_is

RACERS = 20
VERBS = {"once": "approved once", "always": "approved always", "reject": "rejected"}
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


@pytest.fixture
def settings(home: Home) -> Settings:
    return settings_mod.load(home=home.root, env={}, config=None)


@pytest.fixture
def served(settings: Settings) -> Iterator[Served]:
    with serve(settings) as s:
        yield s


def decided_line(rid: str, d: ApprovalDecision) -> str:
    """The refusal's words (a pattern): what, through which face, when."""
    return (
        rf"lookup {rid} \({re.escape(d.need)}\) was decided already: {VERBS[d.decision]} "
        rf"by {re.escape(DECIDERS[d.face])} at {re.escape(d.time)}; a decision is final"
    )


def decisions(conv: Conv) -> list[ApprovalDecision]:
    meta = read_metadata(conv)
    assert meta is not None
    return meta.approvals()


def mcp_refusal(settings: Settings, conv: Conv, decision: str) -> str:
    """conversation_approve through the real MCP server and the SDK's client, refused: its
    error text (the one lookup that waits is named by leaving ``need`` out)."""
    from mcp import Client

    from contemplation.faces.mcp import server as mcp_server
    from tests.system.test_mcp_server import tool_error

    async def call() -> str:
        async with Client(mcp_server.build_server(settings)) as c:
            return await tool_error(
                c, "conversation_approve", conversation_id=conv.id, decision=decision
            )

    return asyncio.run(call())


def test_the_first_decision_wins_on_every_face(
    home: Home, settings: Settings, served: Served
) -> None:
    """Rejected in the dashboard: approving it once from the CLI, always from MCP, or once
    again in the dashboard is refused, each naming the rejection; the record says which face
    decided and when, and is the only one."""
    conv = asking(home, other=None)
    (item,) = Reader(home).waiting(conv)
    url = f"{served.base}/api/conversations/{conv.id}/approve"
    body = {"need": item.id, "decision": "reject"}
    first = httpx.post(url, content=json.dumps(body), headers=auth(served), timeout=10)
    assert first.status_code == 200, first.text
    (record,) = decisions(conv)
    assert (record.request, record.decision, record.face) == (item.id, "reject", "dashboard")
    assert re.fullmatch(STAMP, record.time)
    line = decided_line(item.id, record)

    env = base_env(home)
    by_cli = cli_here(env, "approve", conv.id, "--once", check=False)
    assert by_cli.returncode == 1
    assert re.fullmatch(f"error: {line}\n", by_cli.stderr), by_cli.stderr
    by_id = cli_here(env, "approve", conv.id, "--need", item.id[:6], "--always", check=False)
    assert re.fullmatch(f"error: {line}\n", by_id.stderr), by_id.stderr
    assert re.search(line, mcp_refusal(settings, conv, "always"))
    again = httpx.post(
        url,
        content=json.dumps({"need": item.id, "decision": "once"}),
        headers=auth(served),
        timeout=10,
    )
    assert again.status_code == 409 and re.fullmatch(line, again.json()["error"])
    assert decisions(conv) == [record]


def _daemon_env(home: Home, fake: FakeOllama, tmp_path: Path) -> tuple[dict[str, str], Path]:
    notes = tmp_path / "notes"
    notes.mkdir()
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[tools]\nallowed_roots = ["{notes}"]\n\n'
        '[permissions]\nread_file = { "*secret*" = "ask" }\n'
    )
    return base_env(home, fake, CONTEMPLATION_CONFIG=str(cfg)), notes


def test_reject_then_once_from_the_cli_never_reads_the_secret(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    """The issue's case: ``approve --reject`` then ``approve --once``. The second is refused,
    before the daemon acts and after; the model is told the lookup was refused and the
    secret is never read."""
    env, notes = _daemon_env(home, fake_ollama, tmp_path)
    secret = notes / "secret.md"
    secret.write_text("the launch code")
    need = f"File contents of {secret}"
    fake_ollama.enqueue(Step(text=f"NEED: {need}"), Step(text="Fine, without it."))
    first = daemon_factory(env, home).wait_ready()
    conv_id = cli_here(env, "new", "final", "--model", "gemma", "--message", "Read it").stdout.strip()
    conv = home.conv(conv_id)
    wait_for(lambda: Reader(home).waiting(conv), 30, what="the lookup to wait for approval")
    assert first.stop() == 0  # both decisions come before a daemon acts on either
    cli_here(env, "approve", conv_id, "--reject")
    refused = cli_here(env, "approve", conv_id, "--once", check=False)
    (record,) = decisions(conv)
    line = decided_line(record.request, record)
    assert refused.returncode == 1 and re.fullmatch(f"error: {line}\n", refused.stderr)
    daemon_factory(env, home).wait_ready()
    wait_for(lambda: b"Fine, without it." in conv.log.read_bytes(), 30, what="the reply")
    # the reply's bytes reach the log before its turn's state write says idle
    wait_for(state_is(conv, Status.IDLE), 30, what="the turn's end")
    late = cli_here(env, "approve", conv_id, "--once", check=False)
    assert late.returncode == 1
    assert late.stderr.startswith(f"error: {conv_id} waits for no approval (status idle); ")
    assert re.search(
        rf"the last decision: lookup {record.request} \({re.escape(need)}\) rejected by "
        r"the person \(the CLI\) at ",
        late.stderr,
    )
    named = cli_here(env, "approve", conv_id, "--need", record.request, "--once", check=False)
    assert named.returncode == 1 and re.fullmatch(f"error: {line}\n", named.stderr)
    log = conv.log.read_text()
    assert "the launch code" not in log
    assert "NOT ANSWERED (refused): the agent did not approve this lookup (files.read)" in log
    assert decisions(conv) == [record]


def _check_race(conv: Conv, rid: str, told: list[dict[str, Any]]) -> ApprovalDecision:
    """Exactly one racer was told done; every other was refused naming that decision; the
    record holds it alone."""
    done = [t for t in told if "done" in t]
    assert len(done) == 1, [t.get("done") for t in told]
    (record,) = decisions(conv)
    assert (record.request, record.decision, record.face) == (
        rid,
        done[0]["decision"],
        done[0]["face"],
    )
    line = decided_line(rid, record)
    refusals = [t["refused"] for t in told if "refused" in t]
    assert len(refusals) == len(told) - 1
    for r in refusals:
        assert re.fullmatch(line, r), r
    return record


def race(
    home: Home, settings: Settings, conv: Conv, rid: str, plans: list[tuple[str, str]]
) -> list[dict[str, Any]]:
    """Each plan (decision, face) from a thread of its own, with a reader of its own as each
    face has; a barrier lets them go together. What each was told."""
    go = threading.Barrier(len(plans))
    told: list[dict[str, Any]] = []

    def decide(decision: str, face: Any) -> None:
        reader = Reader(home)
        go.wait(10)
        try:
            actions.approve(settings, conv, decision, rid, reader=reader, face=face)
        except InputRejected as exc:
            told.append({"refused": str(exc)})
        else:
            told.append({"done": True, "decision": decision, "face": face})

    threads = [threading.Thread(target=decide, args=p) for p in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return told


def test_exactly_one_of_twenty_racing_threads_is_told_done(home: Home, settings: Settings) -> None:
    """Five lookups, each decided by 20 threads at once, with mixed decisions and faces."""
    rng = random.Random(34)
    for n in range(5):
        conv = asking(home, f"race {n}", other=None)
        (item,) = Reader(home).waiting(conv)
        plans = [
            (rng.choice(["once", "always", "reject"]), rng.choice(["cli", "mcp", "dashboard"]))
            for _ in range(RACERS)
        ]
        told = race(home, settings, conv, item.id, plans)
        assert len(told) == RACERS
        _check_race(conv, item.id, told)


RACER = """
import json, sys
from contemplation import settings as settings_mod
from contemplation.faces import actions
from contemplation.errors import InputRejected
from contemplation.store.layout import Conv
from pathlib import Path
home, conv_dir, rid, decision, face = sys.argv[1:6]
s = settings_mod.load(home=Path(home), env={}, config=None)
conv = Conv(Path(conv_dir))
print("ready", flush=True)
sys.stdin.readline()  # everyone goes at once
try:
    actions.approve(s, conv, decision, rid, face=face)
except InputRejected as exc:
    print(json.dumps({"refused": str(exc)}), flush=True)
else:
    print(json.dumps({"done": True, "decision": decision, "face": face}), flush=True)
"""


def test_exactly_one_of_twenty_racing_processes_is_told_done(
    home: Home, fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    """The same across processes (the lock is a flock): 20 processes, started and waiting on
    their stdin, are let go together; then a real daemon pass does what the winner decided."""
    notes = tmp_path / "notes"
    notes.mkdir()
    secret = notes / "secret.md"
    secret.write_text("the launch code")
    conv = new_conversation(
        home, "race", template=load_template(home, "default"), model="gemma", backend="ollama"
    )
    drop_message(conv, "read it")
    need = f"File contents of {secret}"
    fake_ollama.enqueue(Step(text=f"NEED: {need}"), Step(text="Carried on."))
    s = settings_mod.load(
        home=home.root,
        env={"OLLAMA_HOST": fake_ollama.url},
        config=None,
        overrides={
            "settle_seconds": 0,
            "tools": {"allowed_roots": [str(notes)]},
            "permissions": {"read_file": {"*secret*": "ask"}},
        },
    )
    run_burst(Runtime(settings=s, home=home))
    (item,) = Reader(home).waiting(conv)
    rng = random.Random(5)
    env = base_env(home)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RACER,
                str(home.root),
                str(conv.dir),
                item.id,
                rng.choice(["once", "always", "reject"]),
                rng.choice(["cli", "mcp", "dashboard"]),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for _ in range(RACERS)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        told = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    record = _check_race(conv, item.id, told)
    run_burst(Runtime(settings=s, home=home))
    answer = next(b for b in parse(conv.log.read_bytes()).blocks if b.response_to == need)
    if record.decision == "reject":
        assert "the agent did not approve this lookup" in answer.text
    else:
        assert "the launch code" in answer.text
