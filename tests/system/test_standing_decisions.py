"""Every decision listed, an ``always`` revocable: ``contemplation approvals``,
``status CONV`` and the dashboard's conversation view list the decisions made about lookups
(what, for which tool and arguments, by whom on which face, when); ``approvals revoke ID`` (and
the dashboard's token-protected POST) takes an ``always`` back, recorded with who and when, and
the next such lookup is asked again. A real daemon process against the scripted fake Ollama,
the real CLI, the dashboard over real HTTP."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from contemplation import settings as settings_mod
from contemplation.faces import actions
from contemplation.models import ApprovalDecision, Status
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_metadata, read_state
from contemplation.store.templates import load_template
from contemplation.writer import new_conversation
from contemplation.writer.files import atomic_write_json
from tests.conftest import DaemonProc, base_env, cli_here, wait_for
from tests.dashboard_served import Served, serve
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_dashboard_actions import asking, auth
from tests.system.test_permissions import daemon_env, start, state_is

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def test_always_is_listed_revoked_and_then_asked_again(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    env, notes = daemon_env(home, fake_ollama, tmp_path, 'read_file = "ask"')
    (notes / "a.md").write_text("content of a")
    a = f"File contents of {notes / 'a.md'}"
    daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(Step(text=f"NEED: {a}"), Step(text="Read a."))
    conv = home.conv(start(env, "always", "read a"))
    wait_for(state_is(conv, Status.AWAITING_APPROVAL), 30, what="awaiting approval")
    cli_here(env, "approve", conv.id, "--always")
    wait_for(lambda: b"Read a." in conv.log.read_bytes(), 30, what="the first reply")
    meta = read_metadata(conv)
    assert meta is not None
    [made] = meta.approvals()

    listed = cli_here(env, "approvals").stdout
    assert re.fullmatch(
        rf"{made.request[:12]}  {conv.id}  ALWAYS  files\.read "
        rf'\{{"path": "{re.escape(str(notes / "a.md"))}"\}}  by the person \(the CLI\) at '
        rf"{STAMP}  \(standing; revocable\)\n",
        listed,
    ), listed
    data = json.loads(cli_here(env, "approvals", "--json").stdout)
    [d] = data["decisions"]
    assert d["standing"] is True and d["face"] == "cli" and d["rule"] == "read_file"
    assert d["revoke"] == f"contemplation approvals revoke {made.request[:12]}"
    status = cli_here(env, "status", conv.id).stdout
    assert "decisions (contemplation approvals -c" in status and made.request[:12] in status

    # the same lookup again: let through without asking while the always stands
    fake_ollama.enqueue(Step(text=f"NEED: {a}"), Step(text="Again."))
    cli_here(env, "send", conv.id, "again")
    wait_for(lambda: b"Again." in conv.log.read_bytes(), 30, what="the second reply")
    assert conv.log.read_text().count("content of a") == 2

    revoked = cli_here(env, "approvals", "revoke", made.request[:6]).stdout
    assert revoked.startswith(f"revoked: {made.request[:12]}  {conv.id}  ALWAYS  files.read")
    assert re.search(rf"\(revoked by the person \(the CLI\) at {STAMP}\)\n$", revoked), revoked
    meta = read_metadata(conv)
    assert meta is not None
    [after] = meta.approvals()
    assert after.revoked_by == "cli" and after.revoked and not after.grants
    assert json.loads(cli_here(env, "approvals", "--standing", "--json").stdout)["decisions"] == []
    twice = cli_here(env, "approvals", "revoke", made.request, check=False)
    assert twice.returncode == 1
    assert re.fullmatch(
        rf"error: decision {made.request} was revoked already by the person \(the CLI\) at "
        rf"{STAMP}\n",
        twice.stderr,
    ), twice.stderr

    # revoked: the next such lookup is asked again
    fake_ollama.enqueue(Step(text=f"NEED: {a}"), Step(text="Third."))
    cli_here(env, "send", conv.id, "once more")
    wait_for(state_is(conv, Status.AWAITING_APPROVAL), 30, what="asked again after the revoke")
    st = read_state(conv)
    assert st is not None and [r.need for r in st.pending_approvals] == [a]
    assert conv.log.read_text().count("content of a") == 2


def _decisions(n: int) -> list[dict[str, object]]:
    return [
        ApprovalDecision(
            request=f"{i:064x}",
            decision="always" if i % 2 else "once",
            need=f"File contents of /n/{i}.md",
            rule="read_file",
            tool="files.read",
            arguments={"path": f"/n/{i}.md"},
            time=f"2026-11-{1 + i // 100:02d} 10:{(i // 60) % 60:02d}:{i % 60:02d}",
            face="mcp" if i % 3 else "cli",
        ).model_dump(mode="json")
        for i in range(n)
    ]


def _with_decisions(home: Home, topic: str, n: int) -> Conv:
    conv = new_conversation(
        home, topic, template=load_template(home, "default"), model="gemma", backend="ollama"
    )
    raw = json.loads(conv.metadata.read_text())
    raw["approvals"] = _decisions(n)
    atomic_write_json(conv.metadata, raw)
    return conv


def test_many_decisions_come_a_bounded_page_at_a_time(home: Home) -> None:
    env = base_env(home)
    convs = [_with_decisions(home, f"many {k}", 130) for k in range(2)]
    seen: list[tuple[str, str]] = []
    times: list[str] = []
    cursor: list[str] = []
    pages = 0
    while True:
        out = json.loads(cli_here(env, "approvals", "--limit", "100", "--json", *cursor).stdout)
        pages += 1
        assert len(out["decisions"]) <= 100 and out["total"] == 260
        seen += [(d["conversation"], d["id"]) for d in out["decisions"]]
        times += [d["time"] for d in out["decisions"]]
        if out["cursor"] is None:
            break
        cursor = ["--cursor", out["cursor"]]
        assert pages < 10
    assert pages == 3 and len(seen) == len(set(seen)) == 260
    assert times == sorted(times, reverse=True)  # newest first across both conversations
    text = cli_here(env, "approvals", "--limit", "3").stdout.splitlines()
    assert len(text) == 4 and text[-1].startswith("3 of 260 shown; the next page: ")
    assert "by the agent (conversation_approve)" in "\n".join(text[:3])
    one = json.loads(cli_here(env, "approvals", "-c", convs[0].id, "--standing", "--json").stdout)
    assert one["total"] == 65 and {d["conversation"] for d in one["decisions"]} == {convs[0].id}
    bad = cli_here(env, "approvals", "revoke", f"{2:064x}", "-c", convs[0].id, check=False)
    assert bad.returncode == 1 and "only an 'always' stands" in bad.stderr
    unknown = cli_here(env, "approvals", "revoke", "zzzzzz", check=False)
    assert unknown.returncode != 0 and "no decision 'zzzzzz'" in unknown.stderr
    both = cli_here(env, "approvals", "revoke", f"{1:064x}", check=False)
    assert both.returncode == 1 and "names several decisions" in both.stderr


@pytest.fixture
def settings(home: Home) -> Settings:
    return settings_mod.load(home=home.root, env={}, config=None)


@pytest.fixture
def served(settings: Settings) -> Iterator[Served]:
    with serve(settings) as s:
        yield s


def test_the_dashboard_lists_decisions_and_revokes_with_its_token(
    home: Home, settings: Settings, served: Served
) -> None:
    conv = asking(home, other=None)
    actions.approve(settings, conv, "always", face="mcp")
    token = {"Authorization": f"Bearer {served.token}"}  # reads need it too
    with httpx.Client(base_url=served.base, timeout=10) as web:
        detail = web.get(f"/api/conversations/{conv.id}", headers=token).json()
        [d] = detail["decisions"]
        assert d["decision"] == "always" and d["standing"] is True
        assert d["by"] == "the agent (conversation_approve)" and d["tool"] == "files.read"
        url = f"/api/conversations/{conv.id}/revoke"
        refused = web.post(url, json={"id": d["id"]}, headers={"Content-Type": "application/json"})
        assert refused.status_code in {401, 403}
        meta = read_metadata(conv)
        assert meta is not None and meta.approvals()[0].grants  # nothing revoked without it
        done = web.post(url, json={"id": d["id"]}, headers=auth(served))
        assert done.status_code == 200, done.text
        assert done.json()["revoked_by"] == "the person (the dashboard)"
        again = web.get(f"/api/conversations/{conv.id}", headers=token).json()["decisions"]
        assert again[0]["standing"] is False and again[0]["revoked"]
    meta = read_metadata(conv)
    assert meta is not None
    assert [(x.revoked_by, x.grants) for x in meta.approvals()] == [("dashboard", False)]
