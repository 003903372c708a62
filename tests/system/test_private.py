"""Private by default: whatever umask a command or the daemon was
started with, every folder under the home is the owner's alone (0700) and every file too
(0600). A secret read through an approved lookup lands in ``messages.log``: that log must be
no more readable than the secret was. A home made open by an older version is closed at the
daemon's start (one log line); ``doctor`` says when the home or the config file is open."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contemplation.faces import fork
from contemplation.index import db as index_db
from contemplation.models import Status
from contemplation.needs.tools.memory import JsonStore
from contemplation.settings import Settings
from contemplation.store.attachments import Attachment
from contemplation.store.layout import Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import archive, drop_message, new_conversation
from contemplation.writer.attachments import drop_folder_message
from tests.conftest import DaemonProc, base_env, cli_here, run_burst, runtime_for, wait_for
from tests.fakes.ollama_server import FakeOllama, Step

NOTE = b"the vault key is under the mat\n"


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """A shell's usual umask (022) for this test and the processes it starts."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def open_to_others(root: Path) -> str:
    """Every folder under ``root`` (itself included) not 0700 and every file not 0600, a
    line each (empty: all private)."""
    bad = []
    for folder, dirs, files in os.walk(root):
        for path, want in [(Path(folder), 0o700), *((Path(folder) / f, 0o600) for f in files)]:
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            if mode != want:
                bad.append(f"{oct(mode)} {path.relative_to(root.parent)}")
        assert all(not (Path(folder) / d).is_symlink() for d in dirs)
    return "\n".join(bad)


def umask_of(pid: int) -> str:
    """A running process's umask, as Linux shows it (``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return line.split()[1]
    pytest.skip("this kernel does not show a process's umask")


def daemon_env(home: Home, fake: FakeOllama, tmp_path: Path) -> tuple[dict[str, str], Path]:
    notes = tmp_path / "notes"
    notes.mkdir()
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[tools]\nallowed_roots = ["{notes}"]\n\n[permissions]\nread_file = {{ "*secret*" = "ask" }}\n'
    )
    return base_env(home, fake, CONTEMPLATION_CONFIG=str(cfg)), notes


def test_the_cli_and_the_daemon_under_umask_022_make_every_folder_0700_and_every_file_0600(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    tmp_path: Path,
    loose_umask: None,
) -> None:
    env, notes = daemon_env(home, fake_ollama, tmp_path)
    secret = notes / "secret.md"
    secret.write_text("the launch code is 0000")
    secret.chmod(0o600)
    attached = tmp_path / "note.md"
    attached.write_bytes(NOTE)
    d = daemon_factory(env, home).wait_ready()
    assert umask_of(d.proc.pid) == "0077"  # so what a library makes for it is private too
    conv_id = cli_here(env, "new", "private", "--model", "gemma").stdout.strip()
    conv = home.conv(conv_id)
    fake_ollama.enqueue(
        Step(text=f"NEED: File contents of {secret}"), Step(text="Got it."), Step(text="A dot.")
    )
    cli_here(env, "send", conv_id, "Read the secret.")
    wait_for(lambda: (st := read_state(conv)) and st.status is Status.AWAITING_APPROVAL, 30)
    cli_here(env, "approve", conv_id, "--once")
    wait_for(lambda: b"Got it." in conv.log.read_bytes(), 30, what="the reply after approval")
    assert b"the launch code is 0000" in conv.log.read_bytes()  # the secret is in the log now
    cli_here(env, "send", conv_id, "And this?", "--attach", str(attached))
    wait_for(lambda: b"A dot." in conv.log.read_bytes(), 30, what="the reply to the note")
    assert any((conv.dir / "attachments").iterdir())
    cli_here(env, "memory", "add", "launch", "the code is in notes/secret.md")
    assert "private" in cli_here(env, "search", "launch", "--all").stdout
    forked = cli_here(env, "fork", conv_id).stdout.strip()
    # the daemon adopts the new folder first (archive says "busy" meanwhile: seen once)
    cli_here(env, "wait", forked, "--timeout", "30", check=False)
    cli_here(env, "archive", forked)
    assert (home.completed / forked).is_dir()
    assert d.stop() == 0

    made = {p.name for p in home.root.iterdir()}
    assert {"memory.json", index_db.DB_NAME, "active", "completed", "templates"} <= made
    assert open_to_others(home.root) == ""


def test_the_mcp_server_runs_with_umask_077(home: Home, loose_umask: None) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "contemplation", "mcp"],
        env=base_env(home),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:  # the umask is set as the command starts; nothing announces it
        wait_for(lambda: umask_of(proc.pid) == "0077", 15, what="the MCP server's umask")
    finally:
        proc.kill()
        proc.wait()


def test_the_writer_makes_private_files_under_any_umask_when_used_as_a_library(
    home: Home,
    fake_ollama: FakeOllama,
    make_settings: Callable[..., Settings],
    loose_umask: None,
) -> None:
    """No entry point ran here, so no umask was set: the modes the writer creates with are
    all that keeps the files private."""
    conv = new_conversation(
        home, "library", template=load_template(home, "default"), model="gemma", backend="ollama"
    )
    drop_message(conv, "hello")
    fake_ollama.enqueue(Step(text="Hi."), Step(text="Seen."))
    run_burst(runtime_for(make_settings(fake_ollama)))
    note = Attachment("note.md", "text/plain", NOTE, hashlib.sha256(NOTE).hexdigest())
    drop_folder_message(conv, "look", [note])
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert any((conv.dir / "attachments").iterdir())
    JsonStore(home, "memory.json").add("k", "v")
    with index_db.opened(home) as conn:
        conn.execute("SELECT count(*) FROM convs").fetchone()
        assert Path(f"{index_db.db_path(home)}-wal").exists()
        assert open_to_others(home.root) == ""
    archive(home, fork.fork(home, conv).conv)
    assert open_to_others(home.root) == ""


def test_an_open_home_is_closed_at_the_daemons_start_with_one_line_and_doctor_says_so(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    env = base_env(home, fake_ollama)
    cli_here(env, "new", "old home", "--model", "gemma")
    home.root.chmod(0o755)  # as an older version left it under umask 022
    cfg = tmp_path / "config.toml"
    cfg.write_text('[openai]\napi_key = "sk-not-for-others"\n')
    cfg.chmod(0o644)
    env["CONTEMPLATION_CONFIG"] = str(cfg)

    doctor = cli_here(env, "doctor", "--json", check=False)
    checks = {(c["check"], c["detail"]) for c in json.loads(doctor.stdout)["checks"]}
    assert (
        "home",
        f"{home.root} is open to others (mode 755): run `chmod 700 {home.root}` "
        "(the daemon does it when it starts)",
    ) in checks
    assert (
        "config",
        f"{cfg} is open to others (mode 644), and api keys and passwords live there: "
        f"run `chmod 600 {cfg}`",
    ) in checks
    assert stat.S_IMODE(home.root.stat().st_mode) == 0o755  # doctor only looks

    d = daemon_factory(env, home).wait_ready()
    assert stat.S_IMODE(home.root.stat().st_mode) == 0o700
    assert d.stop() == 0
    lines = [json.loads(x) for x in d.stderr().splitlines() if x.startswith("{")]
    closed = [x for x in lines if x["event"] == "home_made_private"]
    assert len(closed) == 1 and closed[0]["was"] == "755" and closed[0]["home"] == str(home.root)

    again = daemon_factory(env, home).wait_ready()  # already private: nothing to say
    assert again.stop() == 0
    assert "home_made_private" not in again.stderr()
    cfg.chmod(0o600)
    details = " ".join(
        c["detail"] for c in json.loads(cli_here(env, "doctor", "--json", check=False).stdout)["checks"]
    )
    assert "open to others" not in details and "chmod" not in details
