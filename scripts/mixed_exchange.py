"""Capture the README's exchange that mixes an unroutable need, an ``ask`` lookup and a denied
file, as a user runs it: a real daemon process and the real CLI in a temporary home, with the
scripted Ollama of the tests as the model (no real model writes these three NEEDs on cue).

    .venv/bin/python scripts/mixed_exchange.py

Prints each command and its output, as a shell session would show them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fakes.ollama_server import FakeOllama, Step  # noqa: E402


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="contemplation-mixed-"))
    notes = tmp / "notes"
    (notes / "secrets").mkdir(parents=True)
    (notes / "secrets" / "plan.md").write_text("Ship 2.0 on Friday; freeze on Wednesday.\n")
    (notes / ".env").write_text("API_KEY=hunter2\n")
    config = tmp / "config.toml"
    config.write_text(
        f'[tools]\nallowed_roots = ["{notes}"]\n\n[permissions]\n'
        'read_file = { "*secrets*" = "ask" }\n'
    )
    fake = FakeOllama().start()
    fake.enqueue(
        Step(
            text="Before I answer I need three things.\n"
            f"NEED: File contents of {notes}/secrets/plan.md\n"
            f"NEED: File contents of {notes}/.env\n"
            "NEED: The release manager"
        ),
        Step(text="Alice ships 2.0 on Friday, after Wednesday's freeze."),
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEMPLATION_", "OLLAMA_"))}
    env |= {
        "CONTEMPLATION_HOME": str(tmp / "home"),
        "CONTEMPLATION_CONFIG": str(config),
        "OLLAMA_HOST": fake.url,
        "CONTEMPLATION_DASHBOARD_ENABLED": "false",
        "CONTEMPLATION_SETTLE_SECONDS": "0.1",
    }
    exe = [sys.executable, "-m", "contemplation"]
    daemon = subprocess.Popen(
        [*exe, "run"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            if '"daemon_running": true' in run(exe, env, "status", "--json", show=False):
                break
            time.sleep(0.1)
        conv = run(exe, env, "new", "Release", "--model", "qwen3", show=False).strip()
        run(exe, env, "send", conv, "Who ships 2.0, and when?", "--wait", "--timeout", "30")
        run(exe, env, "status", conv)
        run(exe, env, "respond", conv, "ok go ahead", "--need", _id(exe, env, conv, "approval"))
        run(exe, env, "respond", conv, "Alice is the release manager")
        run(exe, env, "approve", conv, "--once", "--wait", "--timeout", "30")
    finally:
        daemon.terminate()
        daemon.wait(timeout=15)
        fake.stop()


def _id(exe: list[str], env: dict[str, str], conv: str, kind: str) -> str:
    import json

    data = json.loads(run(exe, env, "status", conv, "--json", show=False))
    return str(next(i["id"] for i in data["waiting"] if i["kind"] == kind))


def run(exe: list[str], env: dict[str, str], *args: str, show: bool = True) -> str:
    proc = subprocess.run(
        [*exe, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if show else subprocess.DEVNULL,
        text=True,
        check=False,
    )
    if show:  # stdout and stderr as a terminal interleaves them
        shown = " ".join(a if " " not in a else f'"{a}"' for a in args)
        print(f"$ contemplation {shown}")
        sys.stdout.write(proc.stdout)
        if proc.returncode:
            print(f"(exit {proc.returncode})")
    return proc.stdout


if __name__ == "__main__":
    main()
