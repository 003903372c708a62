"""scripts/demo.sh leaves nothing behind (issue 38.8): its temporary home and the file it
keeps Ollama's model list in are made with mktemp and removed by a trap when it ends.

The real script runs against the scripted fake Ollama, with the real CLI and a real daemon;
only its install step (scripts/setup.sh, network and minutes) is swapped for one that does
nothing, and the venv it activates is this one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from contemplation.store.layout import Home
from tests.conftest import ROOT, base_env
from tests.fakes.ollama_server import FakeOllama

FIXED = Path("/tmp/contemplation-demo-tags.json")  # where the script used to write


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def test_the_demo_removes_its_temporary_files(
    home: Home, fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "demo.sh", repo / "scripts" / "demo.sh")
    (repo / "scripts" / "setup.sh").write_text("exit 0\n")  # installed already
    (repo / ".venv" / "bin").mkdir(parents=True)
    (repo / ".venv" / "bin" / "activate").write_text(
        f'PATH="{Path(sys.executable).parent}:$PATH"\n'
    )
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = base_env(home, fake_ollama, TMPDIR=str(tmp))
    del env["CONTEMPLATION_HOME"]  # the demo makes its own
    before = _stat(FIXED)
    proc = subprocess.run(
        ["bash", str(repo / "scripts" / "demo.sh")],
        env=env, capture_output=True, text=True, timeout=300, cwd=repo,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "backend: ollama" in proc.stdout  # the fake's model list was read
    assert sorted(os.listdir(tmp)) == []  # the home, the daemon's log, the model list: gone
    assert _stat(FIXED) == before  # no fixed path in /tmp is written
