"""Tasks through kill -9. Run: .venv/bin/python bench/bench_task_kills.py [--kills N]

Each round: a real daemon and a real ``contemplation mcp`` process, a task started on a new
conversation whose scripted model streams its reply slowly, then kill -9 of the MCP process
and of the daemon at a random moment while the task works; a new daemon and a new MCP
process, and ``tasks/get`` on the same id until it completes. Counts the rounds whose task
completed with the reply exactly once (lost: never completed or no reply; duplicated: the
reply twice; a draft the kill cut is shown marked ``interrupted`` and is not a reply).
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contemplation.store.layout import Home  # noqa: E402
from tests.conftest import DaemonProc, base_env  # noqa: E402
from tests.fakes.ollama_server import FakeOllama, Step  # noqa: E402
from tests.system.test_mcp_tasks import Wire, text_of  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=50, help="rounds, each kills both processes")
    args = ap.parse_args()
    rng = random.Random(37)
    ok = lost = duplicated = drafts = 0
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        home = Home(Path(tmp) / "home")
        fake = FakeOllama().start()
        env = base_env(home, fake, CONTEMPLATION_DASHBOARD_ENABLED="false")
        for n in range(args.kills):
            reply = f"reply number {n} ends here."
            fake.script.clear()
            fake.enqueue(
                Step(text=reply, chunks=10, chunk_delay=0.05),
                Step(text=reply, chunks=10, chunk_delay=0.05),
                Step(text=reply, chunks=10, chunk_delay=0.05),
            )
            daemon = DaemonProc(env, home).wait_ready()
            wire = Wire(env)
            task_id = wire.call("conversation_start", topic=f"k{n}", initial_prompt="go")["taskId"]
            time.sleep(rng.uniform(0.0, 0.6))  # a random moment of the turn: the kill's point
            wire.kill()
            daemon.stop(signal.SIGKILL)
            daemon = DaemonProc(env, home).wait_ready()
            wire = Wire(env)
            try:
                done = wire.until(task_id, lambda t: t["status"] == "completed", 30)
                out = text_of(done["result"])
                model = [b for b in out["blocks"] if b["kind"] == "model"]
                # a draft cut by the kill is shown marked `interrupted` and redone: not a reply
                whole = [b for b in model if b["text"] == reply and not b.get("interrupted")]
                drafts += sum(1 for b in model if b.get("interrupted"))
                if len(whole) == 1:
                    ok += 1
                elif whole:
                    duplicated += 1
                    print(f"round {n}: the reply {len(whole)} times: {out['blocks']}")
                else:
                    lost += 1
            except AssertionError:
                lost += 1
            wire.close()
            daemon.stop()
        fake.stop()
    took = time.monotonic() - t0
    print(f"{args.kills} rounds ({2 * args.kills} kills -9) in {took:.0f} s: ")
    print(f"  completed with the reply exactly once: {ok}; lost: {lost}; duplicated: {duplicated}")
    print(f"  drafts cut by a kill, shown marked interrupted before the redone reply: {drafts}")


if __name__ == "__main__":
    main()
