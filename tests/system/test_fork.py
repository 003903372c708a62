"""``contemplation fork``: a new conversation from blocks 1..N of another, on every face (the
CLI as a process, MCP through the SDK's client, the dashboard over HTTP), its refusals, its
crash points, and a fork continued by a real daemon run against the scripted fake Ollama."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client

from contemplation import settings as settings_mod
from contemplation.base.testing import FORK_POINTS
from contemplation.faces import fork as fork_mod
from contemplation.faces.mcp import server as mcp_server
from contemplation.faces.reading import segments
from contemplation.models import (
    APPROVALS_KEY,
    BackendSession,
    Block,
    MarkerKind,
    Status,
)
from contemplation.store.layout import Conv, Home, list_conversations, read_metadata, read_state
from contemplation.store.logview import LogView, log_segments
from contemplation.store.templates import load_template
from contemplation.writer import (
    archive,
    atomic_write_json,
    conv_lock,
    drop_message,
    new_conversation,
    open_writer,
    request_cancel,
)
from tests.conftest import ROOT, base_env, cli, cli_here
from tests.dashboard_served import Served, serve
from tests.fakes.ollama_server import FakeOllama

# --------------------------------------------------------------------------- helpers


def make(home: Home, topic: str = "fork me") -> Conv:
    return new_conversation(
        home, topic, template=load_template(home, "default"), model="llama3.2", backend="ollama"
    )


def say(conv: Conv, question: str, answer: str | None, *, n: int, rotate: bool = False) -> None:
    """One agent block and (unless None) one model reply, written by the real writer; a
    rotation after them with ``rotate``."""
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", question, msg_id=f"m{n}")
        if answer is not None:
            r = w.reply("OLLAMA", "CLAUDE", f"r{n}")
            r.content(answer)
            r.finish()
        if rotate:
            w.rotate()


def exchange_with_need(home: Home) -> Conv:
    """Blocks: 1 question, 2 reply with a NEED, 3 its answer, 4 the reply, 5 question, 6 reply."""
    conv = make(home, "release plan")
    say(conv, "Who signs off the release?", "I need the team.\nNEED: The release manager", n=1)
    say(
        conv,
        "RESPONSE TO NEED: The release manager\n(source: agent, 2026-11-25 10:00:06)\nDana",
        "Dana signs off.",
        n=2,
    )
    say(conv, "And who writes the notes?", "Sam writes them.", n=3)
    return conv


def blocks(conv: Conv) -> tuple[Block, ...]:
    return LogView(conv).refresh().blocks


def shape(bs: tuple[Block, ...]) -> list[tuple[str, str, str]]:
    return [(b.sender, b.timestamp, b.text) for b in bs]


def tree(root: Path) -> dict[str, bytes]:
    """Every file under a folder (dot-files aside), with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def ids(home: Home) -> set[str]:
    return {c.id for c in list_conversations(home, include_completed=True)}


def staging(home: Home) -> list[str]:
    return sorted(n for n in os.listdir(home.active) if n.startswith("."))


def fork_cli(
    env: dict[str, str], *args: str, crash: str | None = None
) -> subprocess.CompletedProcess[str]:
    if crash is None:
        return cli_here(env, "fork", *args, check=False)
    e = dict(env, CONTEMPLATION_TESTING="1", CONTEMPLATION_CRASH_AT=crash)
    return cli(e, "fork", *args, check=False)  # a process of its own: it is killed


@pytest.fixture
def env(home: Home) -> dict[str, str]:
    return base_env(home)


# --------------------------------------------------------------------------- the CLI


def test_fork_takes_every_finished_block_and_rebuilds_its_state(
    home: Home, env: dict[str, str]
) -> None:
    src = exchange_with_need(home)
    before = tree(src.dir)
    done = fork_cli(env, src.id, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["forked_from"] == {"id": src.id, "block": 6} and out["blocks"] == 6
    new = home.conv(out["id"])
    assert out["path"] == str(new.dir) and new.dir.is_dir()
    assert shape(blocks(new)) == shape(blocks(src))
    meta = read_metadata(new)
    assert meta is not None and meta.id == new.id and meta.topic == "release plan"
    assert (meta.model_extra or {})["forked_from"] == {"id": src.id, "block": 6}
    st = read_state(new)
    assert st is not None
    assert (st.status, st.turns, st.messages_processed) == (Status.IDLE, 3, 3)
    assert st.log.ino == new.log.stat().st_ino and st.log.size == new.log.stat().st_size
    assert tree(src.dir) == before  # the source is only read
    # the human form: the id on stdout, where it came from on stderr
    again = cli_here(env, "fork", src.id, "--at", "1", "--topic", "Release plan B")
    assert again.stdout.strip().endswith("_release-plan-b")
    assert again.stderr.strip() == (
        f"forked {src.id} at block 1 of 6; it waits for your next message "
        "(fork --rerun answers block 1 at once)"
    )


def test_fork_at_n_keeps_blocks_1_to_n_and_list_and_status_say_where_it_came_from(
    home: Home, env: dict[str, str]
) -> None:
    src = exchange_with_need(home)
    assert "FORKED FROM" not in cli_here(env, "list").stdout  # a column only when a fork is listed
    new_id = cli_here(env, "fork", src.id, "--at", "4", "--topic", "who signs").stdout.strip()
    new = home.conv(new_id)
    assert shape(blocks(new)) == shape(blocks(src)[:4])
    assert new.log.read_bytes().endswith(b"Dana signs off.\n")  # no trailing blank line
    listed = cli_here(env, "list").stdout.splitlines()
    assert listed[0].split()[-2:] == ["FORKED", "FROM"]
    assert any(line.startswith(new_id) and line.endswith(f"{src.id}#4") for line in listed)
    listed = json.loads(cli_here(env, "list", "--json").stdout)["conversations"]
    row = next(r for r in listed if r["id"] == new_id)
    assert row["forked_from"] == {"id": src.id, "block": 4} and row["topic"] == "who signs"
    status = cli_here(env, "status", new_id).stdout
    assert f"forked from:  {src.id} at block 4" in status
    assert json.loads(cli_here(env, "status", new_id, "--json").stdout)["forked_from"]["block"] == 4


@pytest.mark.parametrize(
    "args,expect",
    [
        (("--at", "7"), "block 7 is past the end: {id} has 6 block(s)"),
        (
            ("--at", "2"),
            "block 2 of {id} ends in the middle of a NEED exchange: block 2 asks 1 need(s) not "
            "answered by then ('The release manager'); fork at block 1 (before it) or 3 (after "
            "its answers)",
        ),
        (("--topic", "  "), "a fork's topic cannot be empty"),
    ],
)
def test_a_refused_fork_is_one_line_and_makes_nothing(
    home: Home, env: dict[str, str], args: tuple[str, ...], expect: str
) -> None:
    src = exchange_with_need(home)
    done = fork_cli(env, src.id, *args)
    assert done.returncode == 1
    assert done.stderr == f"error: {expect.format(id=src.id)}\n"
    assert done.stdout == ""
    assert ids(home) == {src.id} and staging(home) == []


def test_block_zero_is_bad_usage(home: Home, env: dict[str, str]) -> None:
    src = exchange_with_need(home)
    done = fork_cli(env, src.id, "--at", "0")
    assert done.returncode == 2 and "--at" in done.stderr
    assert ids(home) == {src.id}


def test_the_default_never_ends_on_an_unanswered_need(home: Home, env: dict[str, str]) -> None:
    """A conversation waiting for the agent's answer: the default (every finished block)
    would end on the NEED, so it is refused and the error names the block before it."""
    src = make(home, "waits")
    say(src, "Plan the migration.", "I need context.\nNEED: the schema", n=1)
    done = fork_cli(env, src.id)
    assert done.returncode == 1
    assert "block 2 asks 1 need(s) not answered by then ('the schema'); fork at block 1" in (
        done.stderr
    )
    assert ids(home) == {src.id}
    assert fork_cli(env, src.id, "--at", "1").returncode == 0


def test_a_conversation_mid_write_forks_its_finished_blocks_only(
    home: Home, env: dict[str, str]
) -> None:
    """While a writer holds the lock (a turn) the last block may still grow: the default
    leaves it out, and naming it is refused."""
    src = make(home, "busy")
    say(src, "First question", "First answer", n=1)
    say(src, "Second question", None, n=2)
    with conv_lock(src):  # as the daemon holds it for a whole reply
        refused = fork_cli(env, src.id, "--at", "3")
        done = fork_cli(env, src.id, "--json")
    assert refused.returncode == 1
    assert refused.stderr == (
        f"error: block 3 of {src.id} is still being written (a writer holds it: a turn or an "
        "append is in progress); fork at an earlier block, or once it is done\n"
    )
    out = json.loads(done.stdout)
    assert out["blocks"] == 2 and out["source_blocks"] == 3
    # a reply marked as being generated (a crash mid-reply, before recovery): the same
    with open_writer(src) as w:
        w.set_status(Status.GENERATING)
    assert json.loads(fork_cli(env, src.id, "--json").stdout)["blocks"] == 2
    assert fork_cli(env, src.id, "--at", "3").returncode == 1


def test_an_archived_conversation_is_forked_and_stays_archived(
    home: Home, env: dict[str, str]
) -> None:
    src = make(home, "done deal")
    say(src, "Is it done?", "Yes.\n=== COMPLETE ===", n=1)
    old = archive(home, src)
    done = fork_cli(env, old.id, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["source_archived"] is True and (home.completed / old.id).is_dir()
    assert not (home.active / old.id).exists()
    new = home.conv(out["id"])
    assert [b.complete for b in blocks(new)] == [False, True]
    st = read_state(new)
    assert st is not None and st.status is Status.COMPLETE  # so it is not archived at once
    assert f"forked {old.id} (archived) at block 2 of 2" in fork_cli(env, old.id).stderr


def test_a_fork_takes_segments_attachments_and_nothing_in_flight(
    home: Home, env: dict[str, str]
) -> None:
    """Rotated segments whole within 1..N are hard-linked, the one that holds block N is cut
    into the fork's messages.log; attachments/ is linked; pending approvals, queued inbox
    and processing files, the cancel flag, the server session and context/ stay behind."""
    src = make(home, "long one")
    for i in range(1, 6):  # a rotation after exchanges 2, 3 and 4: three segments
        say(src, f"question {i}", f"answer {i}", n=i, rotate=i in (2, 3, 4))
    assert [p.name for p in log_segments(src)] == [
        "messages.3.log", "messages.2.log", "messages.1.log", "messages.log",
    ]  # fmt: skip
    (src.dir / "attachments" / "deep").mkdir(parents=True)
    (src.dir / "attachments" / "plan.pdf").write_bytes(b"%PDF plan")
    (src.dir / "attachments" / "deep" / "n.txt").write_text("note")
    drop_message(src, "queued, not sent")
    (src.processing / "000-claimed.msg").write_text("being taken")
    request_cancel(src)
    (src.context / "assembled.md").write_text("context")
    raw = json.loads(src.metadata.read_text())
    raw[APPROVALS_KEY] = [{"request": "abc", "decision": "always", "tool": "files.read"}]
    atomic_write_json(src.metadata, raw)
    with open_writer(src) as w:
        w.state.backend_session = BackendSession(backend="opencode", id="ses_1", messages=4)
        w.save()
    # block 8 is the second block of messages.1.log (blocks 1-4, 5-6, 7-8, then 9-10)
    # the claimed file in processing/ may be a block half written: the default leaves out 10
    assert json.loads(cli_here(env, "fork", src.id, "--json").stdout)["blocks"] == 9
    out = json.loads(cli_here(env, "fork", src.id, "--at", "8", "--json").stdout)
    assert out["blocks"] == 8
    new = home.conv(out["id"])
    assert shape(blocks(new)) == shape(blocks(src)[:8])
    assert sorted(p.name for p in log_segments(new)) == [
        "messages.1.log", "messages.2.log", "messages.log",
    ]  # fmt: skip
    for mine, theirs in (
        ("messages.2.log", "messages.3.log"),
        ("messages.1.log", "messages.2.log"),
    ):
        assert (new.dir / mine).stat().st_ino == (src.dir / theirs).stat().st_ino
    assert new.log.read_bytes() == (src.dir / "messages.1.log").read_bytes()  # cut at its end
    assert new.log.read_bytes().startswith(f"=== {MarkerKind.CONTINUED.value}".encode())
    assert (new.dir / "attachments" / "plan.pdf").stat().st_ino == (
        src.dir / "attachments" / "plan.pdf"
    ).stat().st_ino
    assert (new.dir / "attachments" / "deep" / "n.txt").read_text() == "note"
    assert list(new.inbox.iterdir()) == [] and list(new.processing.iterdir()) == []
    assert list(new.context.iterdir()) == [] and not new.cancel_flag.exists()
    meta = read_metadata(new)
    assert meta is not None and APPROVALS_KEY not in (meta.model_extra or {})
    st = read_state(new)
    assert st is not None and st.backend_session is None and st.pending_approvals == []
    assert (st.turns, st.messages_processed, st.status) == (4, 4, Status.IDLE)
    # the cursor space: each block's offset is where the source has it
    assert [s.size for s in segments(new)][:2] == [s.size for s in segments(src)][:2]


def test_a_rotation_after_the_fork_read_its_source_is_followed_by_inode(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fork copies the source's files after it read them (it never holds their bytes):
    a rotation in between renames every file of the log and starts a new one. The fork finds
    each file by the inode it read, so it holds the blocks it chose and nothing after them."""
    src = make(home, "rotating")
    for i in range(1, 4):  # messages.1.log: blocks 1-4, messages.log: blocks 5-6
        say(src, f"question {i}", f"answer {i}", n=i, rotate=i == 2)
    before = blocks(src)
    real = fork_mod.choose

    def choose_then_rotate(snap: fork_mod.Snapshot, at: int | None, offset: int | None) -> int:
        n = real(snap, at, offset)
        with open_writer(src) as w:
            w.rotate()
        say(src, "question 4", "answer 4", n=4)  # in the new messages.log
        return n

    monkeypatch.setattr(fork_mod, "choose", choose_then_rotate)
    made = fork_mod.fork(home, src, durable=False)
    assert made.block == len(before) == 6
    assert shape(blocks(made.conv)) == shape(before)
    assert [p.name for p in log_segments(src)][:2] == ["messages.2.log", "messages.1.log"]
    assert (made.conv.dir / "messages.1.log").stat().st_ino == (
        src.dir / "messages.2.log"
    ).stat().st_ino  # the segment it read, linked where the rotation put it
    st = read_state(made.conv)
    assert st is not None and (st.turns, st.messages_processed) == (3, 3)


@pytest.mark.parametrize("point", FORK_POINTS)
def test_kill_during_a_fork_leaves_no_half_made_folder_and_loses_nothing(
    home: Home, env: dict[str, str], point: str
) -> None:
    src = exchange_with_need(home)
    drop_message(src, "queued while forking")
    before = tree(src.dir)
    done = fork_cli(env, src.id, "--at", "4", crash=f"{point}:1")
    assert done.returncode == -9
    assert tree(src.dir) == before  # the source byte for byte: no message lost or moved
    made = ids(home) - {src.id}
    if point == "fork_renamed":  # past the rename: a whole conversation
        [new_id] = made
        new = home.conv(new_id)
        assert shape(blocks(new)) == shape(blocks(src)[:4])
        st, meta = read_state(new), read_metadata(new)
        assert st is not None and meta is not None and meta.id == new_id
        assert st.log.size == new.log.stat().st_size
        assert staging(home) == []
    else:  # before it: nothing any face lists, and the next fork clears the leftover
        assert made == set()
        listed = json.loads(cli_here(env, "list", "--all", "--json").stdout)["conversations"]
        assert [r["id"] for r in listed] == [src.id]
        [left] = staging(home)
        assert left.startswith(".fork-")
        again = cli_here(env, "fork", src.id, "--at", "4").stdout.strip()
        assert shape(blocks(home.conv(again))) == shape(blocks(src)[:4])
        assert staging(home) == []


def test_a_fork_is_never_renamed_over_a_folder_that_exists(home: Home) -> None:
    """A name ``new`` has just reserved (an empty folder) is not taken over: the rename
    refuses, and the fork gets the next free name."""
    from contemplation.writer.forking import _rename_noreplace

    home.active.mkdir(parents=True)
    src, taken = home.active / ".fork-x", home.active / "taken"
    src.mkdir()
    taken.mkdir()
    assert _rename_noreplace(src, taken) is False
    assert src.is_dir() and list(taken.iterdir()) == []
    assert _rename_noreplace(src, home.active / "free") is True
    assert (home.active / "free").is_dir() and not src.exists()


# --------------------------------------------------------------------------- concurrent forks

CONCURRENT_FORKS = 200
CONCURRENT_PROCESSES = 24


def test_forks_made_at_the_same_moment_each_get_every_block(home: Home) -> None:
    """200 forks of one idle conversation at once, each a thread through the real fork path
    (its own descriptor on the lock, as a process has): a fork only reads, so another fork
    reading at the same moment is no writer, and each fork holds every block of the source
    and is idle: none ends on the agent's question, which the daemon would ask the model
    again (31 of 200 dropped the last block)."""
    from contemplation.faces.fork import fork
    from contemplation.protocol.conversation import next_action

    src = make(home, "many forks")
    say(src, "First question?", "First answer.", n=1)
    say(src, "Second question?", "Second answer.", n=2)
    want = src.log.read_bytes()
    gate = threading.Barrier(CONCURRENT_FORKS)

    def one(_: int) -> tuple[str, int]:
        gate.wait(timeout=60)
        done = fork(home, src, durable=False)
        return done.conv.id, done.block

    with ThreadPoolExecutor(CONCURRENT_FORKS) as pool:
        made = list(pool.map(one, range(CONCURRENT_FORKS)))
    short = [(cid, n) for cid, n in made if n != 4]
    assert short == [], f"{len(short)} of {CONCURRENT_FORKS} forks were cut short"
    assert len({cid for cid, _ in made}) == CONCURRENT_FORKS
    for cid, _ in made:
        new = home.conv(cid)
        assert new.log.read_bytes() == want
        st = read_state(new)
        assert st is not None and st.status is Status.IDLE
        assert next_action(blocks(new)).action == "idle"  # no turn due: the model is not asked
    assert src.log.read_bytes() == want


def test_fork_processes_and_a_dashboards_forks_at_the_same_moment_each_get_every_block(
    home: Home, env: dict[str, str]
) -> None:
    """Real ``contemplation fork`` processes started together, while this process forks the
    same conversation through the same function the dashboard calls, over and over until they
    are done: every fork on either side holds every block and is idle."""
    from contemplation.faces.fork import fork

    src = make(home, "many processes")
    say(src, "Only question?", "Only answer.", n=1)
    want = src.log.read_bytes()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "contemplation", "fork", src.id, "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for _ in range(CONCURRENT_PROCESSES)
    ]
    here: list[str] = []
    try:
        for _ in range(10 * CONCURRENT_FORKS):  # bounded; ends when every process has
            if all(p.poll() is not None for p in procs):
                break
            done = fork(home, src, durable=False)
            assert done.block == 2, f"an in-process fork took {done.block} of 2 blocks"
            here.append(done.conv.id)
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * CONCURRENT_PROCESSES, outs[0][1]
    forks = [json.loads(out) for out, _ in outs]
    assert [f["blocks"] for f in forks] == [2] * CONCURRENT_PROCESSES
    for cid in [f["id"] for f in forks] + here:
        new = home.conv(cid)
        assert new.log.read_bytes() == want
        st = read_state(new)
        assert st is not None and st.status is Status.IDLE


# --------------------------------------------------------------------------- MCP


def test_mcp_conversation_fork(home: Home) -> None:
    src = exchange_with_need(home)
    archive(home, src)
    settings = settings_mod.load(home=home.root, env={}, config=None)

    async def script() -> tuple[dict[str, Any], str, str, dict[str, Any]]:
        async with Client(mcp_server.build_server(settings)) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert "conversation_fork" in tools
            assert len(tools["conversation_fork"].description or "") < 220
            made = await c.call_tool(
                "conversation_fork", {"conversation_id": src.id, "at": 4, "topic": "branch"}
            )
            assert not made.is_error, made.content
            bad = await c.call_tool("conversation_fork", {"conversation_id": src.id, "at": 9})
            mid = await c.call_tool("conversation_fork", {"conversation_id": src.id, "at": 2})
            assert bad.is_error and mid.is_error
            out = json.loads(getattr(made.content[0], "text", ""))
            check = await c.call_tool(
                "conversation_check", {"conversation_id": out["conversation_id"]}
            )
            return (
                out,
                getattr(bad.content[0], "text", ""),
                getattr(mid.content[0], "text", ""),
                json.loads(getattr(check.content[0], "text", "")),
            )

    out, bad, mid, check = asyncio.run(script())
    assert out["forked_from"] == {"id": src.id, "block": 4} and out["source_archived"] is True
    new = home.conv(out["conversation_id"])
    assert shape(blocks(new)) == shape(blocks(home.conv(src.id, completed=True))[:4])
    assert out["cursor"] == new.log.stat().st_size
    meta = read_metadata(new)
    assert meta is not None and meta.topic == "branch"
    assert bad.endswith(f": block 9 is past the end: {src.id} has 6 block(s)")
    assert "in the middle of a NEED exchange" in mid
    assert check["status"] == "idle"


# --------------------------------------------------------------------------- the dashboard


@pytest.fixture
def served(home: Home) -> Iterator[Served]:
    with serve(settings_mod.load(home=home.root, env={}, config=None)) as s:
        yield s


def test_the_dashboard_forks_at_a_block_behind_the_token(home: Home, served: Served) -> None:
    src = exchange_with_need(home)
    headers = {"Authorization": f"Bearer {served.token}"}
    with httpx.Client(base_url=served.base, timeout=10, headers=headers) as web:
        shown = web.get(f"/api/conversations/{src.id}/blocks").json()["blocks"]
        url = f"/api/conversations/{src.id}/fork"
        body = json.dumps({"offset": shown[3]["offset"]})
        bare = {"Content-Type": "application/json", "Authorization": ""}
        assert web.post(url, content=body, headers=bare).status_code == 401
        evil = {"Content-Type": "application/json", "Origin": "http://evil.example"}
        assert web.post(url, content=body, headers=evil).status_code == 403
        assert web.get(url).status_code == 405
        assert ids(home) == {src.id}
        ok = web.post(url, content=body, headers={"Content-Type": "application/json"})
        assert ok.status_code == 200, ok.text
        assert ok.json()["forked_from"] == {"id": src.id, "block": 4}
        new = home.conv(ok.json()["id"])
        assert shape(blocks(new)) == shape(blocks(src)[:4])
        mid = web.post(url, json={"offset": shown[1]["offset"]})
        assert mid.status_code == 422 and "middle of a NEED exchange" in mid.json()["error"]
        odd = web.post(url, json={"offset": shown[1]["offset"] + 1})
        assert odd.status_code == 422 and "no block" in odd.json()["error"]
        assert web.post(url, json={"at": "two"}).status_code == 400
        by_number = web.post(url, json={"at": 6, "topic": "whole"})
        assert by_number.status_code == 200 and by_number.json()["blocks"] == 6
    assert len(ids(home)) == 3


# --------------------------------------------------------------------------- the daemon


def test_a_fork_continued_by_the_daemon_sends_blocks_1_to_n_only(
    home: Home, fake_ollama: FakeOllama
) -> None:
    """One fork ends on a reply and gets a new message; another ends on the agent's
    question and is asked to answer it again (``--rerun``), which the daemon does. Each request holds its blocks 1..N
    and nothing after them."""
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    src = make(home, "two questions")
    say(src, "First question?", "First answer.", n=1)
    say(src, "Second question?", "Second answer.", n=2)
    before = src.log.read_bytes()
    new = home.conv(cli_here(env, "fork", src.id, "--at", "2").stdout.strip())
    asked = home.conv(
        cli_here(env, "fork", src.id, "--at", "3", "--topic", "asked", "--rerun").stdout.strip()
    )
    st = read_state(asked)
    assert st is not None and st.status is Status.PENDING  # asked to answer again: a turn is due
    drop_message(new, "A different second question?")
    cli(env, "run", "--once")  # exits 0, or fails with its stderr
    sent = sorted(  # the source had nothing to do: two requests, one per fork
        [(m["role"], m["content"]) for m in r["messages"] if m["role"] != "system"]
        for r in fake_ollama.chat_requests()
    )
    assert sent == [
        [
            ("user", "First question?"),
            ("assistant", "First answer."),
            ("user", "A different second question?"),
        ],
        [("user", "First question?"), ("assistant", "First answer."), ("user", "Second question?")],
    ]
    got = blocks(new)
    assert [b.text for b in got[:3]] == [
        "First question?", "First answer.", "A different second question?",
    ]  # fmt: skip
    assert len(got) == 4 and got[3].sender == "OLLAMA"
    assert len(blocks(asked)) == 4 and blocks(asked)[3].sender == "OLLAMA"
    for conv in (new, asked):
        st = read_state(conv)
        assert st is not None and (st.turns, st.messages_processed) == (2, 2)
    assert src.log.read_bytes() == before  # the source goes on as it was


def runaway(home: Home) -> Conv:
    """Blocks: 1 question, 2 answer, 3 question, 4 a runaway reply the agent cancelled."""
    src = make(home, "runaway")
    say(src, "First question?", "First answer.", n=1)
    with open_writer(src) as w:
        w.append_block("CLAUDE", "OLLAMA", "Count to a billion.", msg_id="m2")
        r = w.reply("OLLAMA", "CLAUDE", "r2")
        r.content("1 2 3 4 5 6 7 8 9 10 11 12")
        r.abort(MarkerKind.CANCELLED, "generation stopped by the agent")
    return src


def sent_history(fake: FakeOllama) -> list[list[tuple[str, str]]]:
    return [
        [(m["role"], m["content"]) for m in r["messages"] if m["role"] != "system"]
        for r in fake.chat_requests()
    ]


def test_a_fork_at_the_agents_own_block_waits_for_the_next_message(
    home: Home, fake_ollama: FakeOllama
) -> None:
    """Forking before a cancelled runaway reply (at the agent's question) runs no turn: the
    fork waits, says so in its log and on stderr, and the next message continues from
    there; ``--rerun`` asks the model to answer the question again at once."""
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    src = runaway(home)
    made = cli_here(env, "fork", src.id, "--at", "3", "--topic", "held")
    held = home.conv(made.stdout.strip())
    assert made.stderr.strip() == (
        f"forked {src.id} at block 3 of 4; it waits for your next message "
        "(fork --rerun answers block 3 at once)"
    )
    st = read_state(held)
    assert st is not None and st.status is Status.IDLE
    [*_, last] = blocks(held)
    assert last.text == "Count to a billion." and last.markers == (
        (MarkerKind.FORKED, f"from {src.id} at block 3; the next message continues from here"),
    )
    cli(env, "run", "--once")
    assert fake_ollama.chat_requests() == []  # no turn: the runaway is not run again
    st = read_state(held)
    assert st is not None and st.status is Status.IDLE
    assert "idle: waiting for your next message" in cli_here(env, "status", held.id).stdout
    drop_message(held, "Count to three instead.")
    cli(env, "run", "--once")
    assert sent_history(fake_ollama) == [
        [
            ("user", "First question?"),
            ("assistant", "First answer."),
            ("user", "Count to a billion."),
            ("user", "Count to three instead."),
        ]
    ]
    again = cli_here(env, "fork", src.id, "--at", "3", "--rerun", "--json")
    out = json.loads(again.stdout)
    assert out["waits_for_message"] is False
    rerun = home.conv(out["id"])
    assert all(not b.markers for b in blocks(rerun))  # nothing added: a turn is due
    st = read_state(rerun)
    assert st is not None and st.status is Status.PENDING
    cli(env, "run", "--once")
    assert sent_history(fake_ollama)[-1] == [
        ("user", "First question?"),
        ("assistant", "First answer."),
        ("user", "Count to a billion."),
    ]
    assert blocks(rerun)[-1].sender == "OLLAMA"
    # a fork that ends on a reply, or on the cancelled reply itself, has nothing to hold
    for at in ("2", "4"):
        plain = json.loads(cli_here(env, "fork", src.id, "--at", at, "--json").stdout)
        assert plain["waits_for_message"] is False
        assert MarkerKind.FORKED not in {
            k for b in blocks(home.conv(plain["id"])) for k, _ in b.markers
        }


def test_mcp_and_dashboard_forks_wait_unless_asked_to_rerun(home: Home, served: Served) -> None:
    src = runaway(home)
    settings = settings_mod.load(home=home.root, env={}, config=None)

    async def script() -> tuple[dict[str, Any], dict[str, Any]]:
        async with Client(mcp_server.build_server(settings)) as c:
            outs = []
            for rerun in (False, True):
                made = await c.call_tool(
                    "conversation_fork", {"conversation_id": src.id, "at": 3, "rerun": rerun}
                )
                assert not made.is_error, made.content
                outs.append(json.loads(getattr(made.content[0], "text", "")))
            return outs[0], outs[1]

    held, rerun = asyncio.run(script())
    assert held["waits_for_message"] is True and rerun["waits_for_message"] is False
    for out, status in ((held, Status.IDLE), (rerun, Status.PENDING)):
        st = read_state(home.conv(out["conversation_id"]))
        assert st is not None and st.status is status
    headers = {"Authorization": f"Bearer {served.token}"}
    with httpx.Client(base_url=served.base, timeout=10, headers=headers) as web:
        url = f"/api/conversations/{src.id}/fork"
        for body, status in (({"at": 3}, Status.IDLE), ({"at": 3, "rerun": True}, Status.PENDING)):
            ok = web.post(url, json=body)
            assert ok.status_code == 200, ok.text
            assert ok.json()["waits_for_message"] is (status is Status.IDLE)
            st = read_state(home.conv(ok.json()["id"]))
            assert st is not None and st.status is status
        assert web.post(url, json={"at": 3, "rerun": "yes"}).status_code == 400
