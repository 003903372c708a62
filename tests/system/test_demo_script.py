"""scripts/demo.sh: a new user can look at what the demo did after it ends, and it
leaves nothing else behind.

It printed `CONTEMPLATION_HOME=… contemplation tail -f <id>` for a temporary home its EXIT trap
then removed, so the command it had just given failed. The demo's home is now a named place
(``$XDG_DATA_HOME/contemplation-demo``, ``~/.local/share/contemplation-demo`` by default) that
stays, and the demo says how to remove it; its scratch files (the daemon's log, Ollama's model
list) are still made with mktemp and removed by the trap. A home the user names with
``CONTEMPLATION_HOME`` is used and never offered for removal.

The real script runs against the scripted fake Ollama, with the real CLI and a real daemon;
only its install step (scripts/setup.sh, network and minutes) is swapped for one that does
nothing, and the venv it activates is this one."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from contemplation.store.layout import Home
from tests.conftest import ROOT, base_env, cli
from tests.fakes.ollama_server import FakeOllama

FIXED = Path("/tmp/contemplation-demo-tags.json")  # where the script used to write
FOLLOW = re.compile(r"follow it with: CONTEMPLATION_HOME=(\S+) contemplation tail -f (\S+)\)")


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _demo(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    repo = tmp_path / "repo"
    if not repo.exists():
        (repo / "scripts").mkdir(parents=True)
        shutil.copy(ROOT / "scripts" / "demo.sh", repo / "scripts" / "demo.sh")
        (repo / "scripts" / "setup.sh").write_text("exit 0\n")  # installed already
        (repo / ".venv" / "bin").mkdir(parents=True)
        (repo / ".venv" / "bin" / "activate").write_text(
            f'PATH="{Path(sys.executable).parent}:$PATH"\n'
        )
    proc = subprocess.run(
        ["bash", str(repo / "scripts" / "demo.sh")],
        env=env, capture_output=True, text=True, timeout=300, cwd=repo,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _user_env(home: Home, fake_ollama: FakeOllama, tmp_path: Path) -> dict[str, str]:
    """A user with a home folder of their own (the demo's home goes under it) and a TMPDIR."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    (tmp_path / "user").mkdir(exist_ok=True)
    env = base_env(home, fake_ollama, TMPDIR=str(tmp_path / "tmp"), HOME=str(tmp_path / "user"))
    for name in ("CONTEMPLATION_HOME", "XDG_DATA_HOME"):  # the demo makes its own
        env.pop(name, None)
    return env


def test_the_demo_keeps_its_home_where_it_says_and_removes_its_scratch_files(
    home: Home, fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    env = _user_env(home, fake_ollama, tmp_path)
    kept = tmp_path / "user" / ".local" / "share" / "contemplation-demo"
    before = _stat(FIXED)
    proc = _demo(tmp_path, env)
    assert "backend: ollama" in proc.stdout  # the fake's model list was read
    assert f"== home: {kept} " in proc.stdout
    m = FOLLOW.search(proc.stdout)
    assert m is not None, proc.stdout
    assert Path(m[1]) == kept
    # after the demo, the command it printed still works: the home is there, with the talk
    shown = cli(dict(env, CONTEMPLATION_HOME=m[1]), "tail", m[2])
    assert "why is a folder of plain-text files a good queue" in shown.stdout
    assert f"rm -rf {kept}" in proc.stdout  # and it says how to remove it
    assert sorted(os.listdir(tmp_path / "tmp")) == []  # the daemon's log, the model list: gone
    assert _stat(FIXED) == before  # no fixed path in /tmp is written
    again = _demo(tmp_path, env)  # a second run: the same place, one more conversation
    assert f"== home: {kept} " in again.stdout
    assert len(list((kept / "active").iterdir())) == 2


def test_a_home_the_user_names_is_used_and_never_offered_for_removal(
    home: Home, fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    env = _user_env(home, fake_ollama, tmp_path)
    env["CONTEMPLATION_HOME"] = str(home.root)
    proc = _demo(tmp_path, env)
    assert f"== home: {home.root} " in proc.stdout
    assert "rm -rf" not in proc.stdout
    assert not (tmp_path / "user" / ".local" / "share" / "contemplation-demo").exists()
    assert len(list(home.active.iterdir())) == 1
