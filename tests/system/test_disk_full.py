"""A full disk, for real: a 1 MiB tmpfs filled to the last byte, and the real CLI and daemon
run against a home on it. Every command that cannot write says so in one line and exits
non-zero; the read commands read the folders; the index is kept; no temp file is left; the
daemon keeps the message and answers it once there is room.

Mounting needs root (CI runs as root): elsewhere these tests are skipped, in CI they fail.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contemplation import settings as settings_mod
from contemplation.faces.mcp.calls import Faces
from contemplation.index.db import DB_NAME
from contemplation.store.layout import Conv, Home
from tests.conftest import ROOT, base_env, cli, cli_here, model_replies, wait_for
from tests.dashboard_served import serve
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_dashboard_actions import asking

DISK = "1m"
CHUNKS = (1 << 16, 1 << 12, 1)  # the filler is written in smaller and smaller pieces
FULL = "error: the disk is full: "


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A small tmpfs of its own, unmounted whatever the test did."""
    where = tmp_path / "disk"
    where.mkdir()
    why = "mounting a tmpfs needs root"
    if os.geteuid() == 0:
        got = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            check=False,
        )
        why = "" if got.returncode == 0 else f"mount failed: {got.stderr.strip()}"
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"a full-disk test cannot run in CI: {why}")
        pytest.skip(why)
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], check=False).returncode != 0:
            subprocess.run(["umount", "--lazy", str(where)], check=True)


def fill(disk: Path) -> Path:
    """Write a filler file until not one more byte fits (bounded: the disk's size)."""
    filler = disk / "filler"
    st = os.statvfs(disk)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in CHUNKS:
            data = b"\0" * chunk
            for _ in range(st.f_blocks * st.f_frsize // chunk + 1):
                try:
                    os.write(fd, data)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    finally:
        os.close(fd)
    with pytest.raises(OSError, match="No space left"):
        (disk / "probe").write_bytes(b"x")
    return filler


def one_line_full(proc: subprocess.CompletedProcess[str]) -> str:
    """The command failed with the one line that says the disk is full (no traceback)."""
    assert proc.returncode not in (0, 2), (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(FULL), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0].removeprefix(FULL)


def no_log_records(proc: subprocess.CompletedProcess[str]) -> None:
    """A command's stderr is for people: never a structlog record (a JSON object, or the
    console renderer's ``[warning  ] event key=value``)."""
    for line in proc.stderr.splitlines():
        assert not line.lstrip().startswith("{"), proc.stderr
        assert "[warning" not in line and "[error" not in line, proc.stderr
        assert "index_unwritable" not in line, proc.stderr


def convs(home: Home) -> dict[str, Conv]:
    return {p.name.split("_", 2)[2]: Conv(p) for p in sorted(home.active.iterdir())}


def no_temp_files(home: Home) -> None:
    left = [
        str(p.relative_to(home.root))
        for p in home.root.rglob("*")
        if p.name.startswith((".new-", ".doctor.")) or (p.name.startswith(".") and ".tmp" in p.name)
    ]
    assert left == []


def test_a_full_disk_is_one_line_and_reads_come_from_the_folders(
    disk: Path, fake_ollama: FakeOllama
) -> None:
    home = Home(disk / "home")
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    cli_here(env, "new", "alpha")
    cli_here(env, "send", "alpha", "zebra stripes")
    cli(env, "run", "--once")
    assert "alpha" in cli_here(env, "list").stdout  # the index is made
    cli_here(env, "new", "beta")  # made after the index last looked: only its folder knows it
    index = home.root / DB_NAME
    assert index.exists()
    by = convs(home)
    fill(disk)

    listed = cli_here(env, "list")
    assert "_alpha" in listed.stdout and "_beta" in listed.stdout
    assert "Traceback" not in listed.stderr
    st = cli_here(env, "status")
    assert "active: 2" in st.stdout, st.stdout
    assert "disk_full: the disk is full" in st.stdout, st.stdout
    one = cli_here(env, "status", "beta")
    assert "beta" in one.stdout
    found = cli_here(env, "search", "zebra")
    assert "_alpha" in found.stdout, found.stdout
    for read in (listed, st, one, found):  # the index's warning, in words: no log record
        no_log_records(read)

    where = one_line_full(cli_here(env, "send", "alpha", "more", check=False))
    assert where.startswith(str(home.root)), where
    assert list(by["alpha"].inbox.iterdir()) == []  # neither the message nor its temp file
    one_line_full(cli_here(env, "new", "gamma", check=False))
    one_line_full(cli_here(env, "respond", "beta", "an answer", check=False))
    one_line_full(cli_here(env, "reindex", check=False))
    one_line_full(cli(env, "run", check=False, timeout=30))  # the daemon cannot start
    doctor = cli_here(env, "doctor", check=False)
    assert doctor.returncode != 0 and "the disk is full" in doctor.stdout, doctor.stdout

    assert index.exists()  # a write error never throws the index away
    assert sorted(convs(home)) == ["alpha", "beta"]
    no_temp_files(home)
    assert "_beta" in cli_here(env, "list").stdout


def test_a_full_disk_without_an_index_still_lists(disk: Path) -> None:
    """The first read on a full disk: no index can be made; the folders are read instead,
    and no loop throws away and remakes an empty one."""
    home = Home(disk / "home")
    env = base_env(home)
    cli_here(env, "new", "alpha")
    (home.root / DB_NAME).unlink(missing_ok=True)
    fill(disk)
    for _ in range(2):
        listed = cli_here(env, "list")
        assert "_alpha" in listed.stdout, listed.stderr
        assert "Traceback" not in listed.stderr
        assert "active: 1" in cli_here(env, "status").stdout


def test_the_daemon_on_a_full_disk_keeps_the_message_and_answers_once_there_is_room(
    disk: Path, fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    home = Home(disk / "home")
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    env["CONTEMPLATION_RESCAN_INTERVAL"] = "0.2"
    env["CONTEMPLATION_DASHBOARD_ENABLED"] = "false"
    cli_here(env, "new", "alpha")
    conv = convs(home)["alpha"]
    staged = disk / "hello.msg"  # written while there is room, delivered by a rename
    staged.write_text("hello")
    index = home.root / DB_NAME
    logs = tmp_path / "daemon.log"  # not on the full disk
    with logs.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "contemplation", "run"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    try:
        wait_for(lambda: '"started"' in logs.read_text(), 20, what="the daemon's start")
        wait_for(  # the index's first refresh is over: nothing more is written until an event
            lambda: index.exists() and not Path(f"{index}-wal").exists(), 20, what="the index"
        )
        filler = fill(disk)
        staged.rename(conv.inbox / staged.name)  # a rename takes no room
        wait_for(lambda: _failures(logs.read_text()), 20, what="a failed write")
        time.sleep(2.0)  # a window of ten rescans to count the daemon's lines in
        assert proc.poll() is None, logs.read_text()
        said = logs.read_text()
        # said once, retried with backoff: not a spin (the turn's write says write_failed, and
        # the next step, finding the claim still to make durable, conversation_failed: one
        # line each at most, whichever comes first)
        assert said.count("write_failed") <= 1 and said.count("conversation_failed") <= 1, said
        assert "Traceback" not in said, said
        queued = [*conv.inbox.iterdir(), *conv.processing.iterdir()]
        assert queued or b"hello" in conv.log.read_bytes(), queued  # the message is kept
        assert model_replies(conv) == []
        filler.unlink()
        wait_for(lambda: model_replies(conv) == ["Echo: hello"], 30, what="the reply")
        # said once the turn is over, which is a moment after its reply is in the log
        wait_for(lambda: "conversation_resumed" in logs.read_text(), 10, what="the line")
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    no_temp_files(home)


def _failures(said: str) -> int:
    return sum(said.count(what) for what in ("write_failed", "conversation_failed"))


def test_a_reply_cut_by_a_full_disk_is_said_as_such_on_every_face(
    disk: Path, fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    """While the disk is full, status, status --json and wait said
    "generating … tokens so far" (state.json cannot be written, so it still says
    generating), and the redone turn's INTERRUPTED line blamed "a restart"."""
    home = Home(disk / "home")
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    env["CONTEMPLATION_RESCAN_INTERVAL"] = "0.2"
    env["CONTEMPLATION_DASHBOARD_ENABLED"] = "false"
    cli_here(env, "new", "alpha")
    conv = convs(home)["alpha"]
    piece = "a sentence of the long reply that the full disk will cut. " * 2
    fake_ollama.enqueue(Step(text=piece * 200, chunks=200, chunk_delay=0.05))
    logs = tmp_path / "daemon.log"
    with logs.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "contemplation", "run"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    filler: Path | None = None
    try:
        wait_for(lambda: '"started"' in logs.read_text(), 20, what="the daemon's start")
        cli_here(env, "send", "alpha", "hello")
        wait_for(lambda: "tokens so far" in cli_here(env, "status", "alpha").stdout, 20, what="a reply")
        filler = fill(disk)
        wait_for(lambda: "write_failed" in logs.read_text(), 20, what="the failed write")
        for face in (
            cli_here(env, "status", "alpha"),
            cli_here(env, "wait", "alpha", "--timeout", "0.5", check=False),
        ):
            assert "retrying: the disk is full" in face.stdout + face.stderr, face
            assert "generating" not in face.stdout + face.stderr, face
            no_log_records(face)
        said = json.loads(cli_here(env, "status", "alpha", "--json").stdout)
        assert said["activity"].startswith("retrying: the disk is full"), said
        assert said["status"] == "retrying", said
        mcp = Faces(settings_mod.load(home=home.root, env={}, config=None))
        for out in (mcp.snapshot(conv), mcp.check(conv.id)):  # MCP results, tasks' message
            assert out["activity"].startswith("retrying: the disk is full"), out
        assert mcp.snapshot(conv)["status"] == "retrying"
        filler.unlink()
        filler = None
        wait_for(lambda: model_replies(conv) == ["Echo: hello"], 30, what="the redone reply")
        text = conv.log.read_text()
        assert "INTERRUPTED" in text, text[-2000:]
        cut = text[text.index("INTERRUPTED") :][:400]
        assert "restart" not in cut and "writing messages.log failed" in cut, cut
    finally:
        if filler is not None:
            filler.unlink(missing_ok=True)
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_dashboards_approve_on_a_full_disk_says_so_and_loses_nothing(disk: Path) -> None:
    """The person approves a lookup from the dashboard while the disk is full: the answer is
    a 507 that says the disk is full and where (as the CLI's one line does), not a bare 500;
    nothing is recorded, the lookup still waits, no temp file is left, and the same approve
    once there is room is taken."""
    home = Home(disk / "home")
    conv = asking(home, "full", other=None)
    settings = settings_mod.load(home=home.root, env={}, config=None)
    with serve(settings) as served:
        headers = {"Authorization": f"Bearer {served.token}", "Content-Type": "application/json"}
        with httpx.Client(base_url=served.base, timeout=10, headers=headers) as web:
            (item,) = web.get(f"/api/conversations/{conv.id}").json()["waiting"]
            url = f"/api/conversations/{conv.id}/approve"
            body = json.dumps({"need": item["id"], "decision": "once"})
            filler = fill(disk)
            try:
                r = web.post(url, content=body)
                assert r.status_code == 507, (r.status_code, r.text)
                said = r.json()["error"]
                assert said.startswith("the disk is full: "), said
                assert str(home.root) in said, said
                assert r.headers.get("retry-after"), r.headers
                meta = json.loads(conv.metadata.read_text())
                assert not meta.get("approvals"), meta
                assert [p["id"] for p in json.loads(conv.state.read_text())["pending_approvals"]]
                no_temp_files(home)
            finally:
                filler.unlink()
            r = web.post(url, content=body)
            assert r.status_code == 200, r.text
    meta = json.loads(conv.metadata.read_text())
    assert [(a["request"], a["decision"]) for a in meta["approvals"]] == [(item["id"], "once")]
