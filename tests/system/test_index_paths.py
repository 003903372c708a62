"""The index's file is never followed, and one bad folder never breaks every list.
``<home>/.index.sqlite3`` that is a folder, a symbolic link to a database outside
the home (or whose -wal is one), an immutable file or a file another user owns: it is refused
in one line (never opened, never written through) and list, status and search read the
folders instead; a conversation whose state.json or metadata.json cannot be read (nested
100,000 deep, a number no float holds) costs its own row, which says so, and nothing else.
Real folders, real SQLite, the real CLI and daemon."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from contemplation.index.db import DB_NAME
from contemplation.store.layout import Conv, Home, read_json
from contemplation.writer import open_writer
from tests import procgroups
from tests.conftest import ROOT, base_env, cli, cli_here, wait_for

DEEP = 100_000


def made(env: dict[str, str], home: Home, *topics: str) -> dict[str, Conv]:
    """Conversations made by the CLI, each with one exchange written by the real writer (so
    search has words to find: the topic's first word, in the question)."""
    out: dict[str, Conv] = {}
    for topic in topics:
        conv = home.conv(cli_here(env, "new", topic).stdout.strip())
        with open_writer(conv) as w:
            w.append_block("CLAUDE", "OLLAMA", f"tell me about {topic.split()[0]}", msg_id="m1")
            r = w.reply("OLLAMA", "CLAUDE", "r1")
            r.content("Here it is.")
            r.finish()
        out[topic.split()[0]] = conv
    return out


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr


def lists_and_finds(env: dict[str, str], convs: dict[str, Conv]) -> str:
    """list, status (of the daemon and of one conversation) and search still answer, every
    conversation in them, from the folders; their stderr joined (processes of their own:
    what each says of the index it says once in a process)."""
    listed = cli(env, "list")
    assert f"active: {len(convs)}" in cli(env, "status").stdout
    one = cli(env, "status", next(iter(convs.values())).id)
    found = cli(env, "search", "tell")  # every question says it
    for proc in (listed, one, found):
        no_traceback(proc)
    for conv in convs.values():
        assert conv.id in listed.stdout, listed
        assert conv.id in found.stdout, found
    return "\n".join([listed.stderr, one.stderr, found.stderr])


@pytest.fixture
def env(home: Home) -> dict[str, str]:
    return base_env(home, CONTEMPLATION_DASHBOARD_ENABLED="false")


def test_an_index_that_is_a_folder_is_refused_and_lists_read_the_folders(
    home: Home, env: dict[str, str]
) -> None:
    convs = made(env, home, "alpha one", "beta two")
    index = home.root / DB_NAME
    for p in home.root.glob(DB_NAME + "*"):
        p.unlink()
    index.mkdir()
    said = lists_and_finds(env, convs)
    assert f"{index} is a folder, not a regular file" in said, said
    refused = cli_here(env, "reindex", check=False)
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"error: the index {index} is a folder"), refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert index.is_dir() and list(index.iterdir()) == []  # left as it was


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A database of the person's own, outside the home, with a table named as the index's."""
    db = tmp_path / "elsewhere" / "mine.sqlite3"
    db.parent.mkdir()
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE convs (precious TEXT)")
    conn.execute("INSERT INTO convs VALUES ('keep me')")
    conn.commit()
    conn.close()
    return db


def start_daemon(env: dict[str, str], logs: Path) -> subprocess.Popen[bytes]:
    with logs.open("w") as out:
        return procgroups.popen(
            [sys.executable, "-m", "contemplation", "run"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )


@contextlib.contextmanager
def daemon(env: dict[str, str], logs: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = start_daemon(env, logs)
    try:
        yield proc
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        procgroups.kill(proc)


@pytest.mark.parametrize("which", ["", "-wal"])
def test_a_symlink_at_the_index_path_is_never_followed(
    home: Home, env: dict[str, str], outside: Path, tmp_path: Path, which: str
) -> None:
    """A symbolic link as the index (or as its -wal): list, search, status, reindex and a
    daemon's start leave the database it points to byte for byte as it was (before, the
    daemon dropped its table ``convs`` and made its own)."""
    convs = made(env, home, "alpha one", "beta two")
    index = home.root / DB_NAME
    for p in home.root.glob(DB_NAME + "*"):
        p.unlink()
    if which:  # a real index, its -wal a link
        cli_here(env, "reindex")
        Path(f"{index}-wal").unlink(missing_ok=True)
    link = Path(f"{index}{which}")
    link.symlink_to(outside)
    before = digest(outside)
    siblings = sorted(os.listdir(outside.parent))

    said = lists_and_finds(env, convs)
    assert f"{link} is a symbolic link" in said, said
    refused = cli_here(env, "reindex", check=False)
    assert refused.returncode == 1 and "is a symbolic link" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    logs = tmp_path / "daemon.log"
    with daemon(env, logs) as proc:
        wait_for(lambda: "index_refresh_failed" in logs.read_text(), 30, what="a refresh")
        assert proc.poll() is None, logs.read_text()
    text = logs.read_text()
    assert "is a symbolic link" in text and "Traceback" not in text, text

    assert digest(outside) == before
    assert sorted(os.listdir(outside.parent)) == siblings  # no -wal, no -shm made there
    assert link.is_symlink()  # left as it was
    conn = sqlite3.connect(f"file:{outside}?mode=ro", uri=True)
    assert conn.execute("SELECT precious FROM convs").fetchall() == [("keep me",)]
    conn.close()


@contextlib.contextmanager
def unwritable(index: Path) -> Iterator[str]:
    """The index made immutable (``chattr +i``, as root on a file system that has it), else
    given to another user and made read-only (as root), else made read-only: what it is."""
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(index)], capture_output=True).returncode == 0:
            try:
                yield "immutable"
            finally:
                subprocess.run(["chattr", "-i", str(index)], check=True)
            return
        os.chown(index, 65534, 65534)
        index.chmod(0o444)
        yield "another's"
        return
    index.chmod(0o444)
    yield "read-only"


def test_an_immutable_or_foreign_index_is_left_alone_and_lists_read_the_folders(
    home: Home, env: dict[str, str]
) -> None:
    convs = made(env, home, "alpha one", "beta two")
    cli_here(env, "reindex")
    index = home.root / DB_NAME
    late = made(env, home, "gamma three")  # after the index was last written
    with unwritable(index) as kind:
        before = digest(index)
        said = lists_and_finds(env, convs | late)
        if kind == "another's":
            assert f"{index} belongs to uid 65534" in said, said
        assert digest(index) == before


def nested(path: Path) -> None:
    """The file replaced (by a rename, as any writer does) with JSON nested DEEP levels."""
    tmp = path.with_name(".nested.tmp")
    tmp.write_text('{"a":' * DEEP + "1" + "}" * DEEP)
    tmp.rename(path)


def test_one_deeply_nested_state_costs_only_its_own_row(home: Home, env: dict[str, str]) -> None:
    """One conversation's state.json nested 100,000 deep, another's metadata.json, a third's
    state.json holding a number no float holds: list shows every conversation, each bad one
    with status 'unreadable' and what is wrong; search and status work; the daemon rebuilds
    the state it cannot read instead of crashing on it."""
    convs = made(env, home, "alpha one", "beta two", "gamma three", "delta four")
    assert read_json(convs["alpha"].state) is not None
    nested(convs["alpha"].state)
    nested(convs["beta"].metadata)
    huge = json.loads(convs["gamma"].state.read_text())
    huge |= {"status": "generating", "generating_since": 10**400}
    tmp = convs["gamma"].dir / ".huge.tmp"
    tmp.write_text(json.dumps(huge))
    tmp.rename(convs["gamma"].state)
    assert read_json(convs["alpha"].state) is None  # not a RecursionError

    lists_and_finds(env, convs)
    rows = {r["id"]: r for r in json.loads(cli_here(env, "list", "--json").stdout)["conversations"]}
    assert rows[convs["delta"].id]["status"] == "pending" and not rows[convs["delta"].id]["problem"]
    for word, file in (("alpha", "state.json"), ("beta", "metadata.json"), ("gamma", "")):
        row = rows[convs[word].id]
        assert row["status"] == "unreadable", row
        assert file in row["problem"], row
    assert "nested too deeply" in rows[convs["alpha"].id]["problem"]
    table = cli_here(env, "list").stdout
    assert any(convs["alpha"].id in ln and "unreadable" in ln for ln in table.splitlines())
    shown = cli_here(env, "status", convs["alpha"].id).stdout
    assert "problem:" in shown and "state.json" in shown, shown

    # rebuilds the state it cannot read (it crashed the turn before); the metadata.json it
    # cannot read is the person's: left as it is, and the run says that conversation waits
    run = cli(env, "run", "--once", check=False)
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert last.startswith(f"run --once: 1 conversation not done ({convs['beta'].id}: "), last
    assert "metadata.json does not read" in last and "nested too deeply" in last, last
    assert read_json(convs["alpha"].state) is not None
    rows = {r["id"]: r for r in json.loads(cli_here(env, "list", "--json").stdout)["conversations"]}
    assert rows[convs["alpha"].id]["status"] != "unreadable", rows[convs["alpha"].id]
