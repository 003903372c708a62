"""What "each task is its own question" costs a ``tasks/get``.

Run: .venv/bin/python bench/bench_task_turn.py [--exchanges 400] [--tasks 64] [--runs 50]

One conversation of ``--exchanges`` questions and answers (a log written as a person would,
no daemon), with ``--tasks`` task records, each sent from the same cursor (parallel calls)
on one of the last questions. Measured in-process (``Tasks.get``, the body of ``tasks/get``):

  check (old floor) ``conversation_check`` from the task's cursor to the end (every later
                  answer): what the old ``tasks/get`` read for a completed task, without
                  its own bookkeeping
  first look      the task finds its message (fingerprint, ranked among the tasks sent with
                  it) and its end, then reads only its turn; the record keeps both
  later looks     with the message and the end kept: its turn only

Prints p50 / p95 in ms and the ratio of each to the old way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contemplation.faces import actions  # noqa: E402
from contemplation.faces.mcp.calls import Faces  # noqa: E402
from contemplation.faces.mcp.tasks import Tasks  # noqa: E402
from contemplation.settings import load  # noqa: E402
from contemplation.writer.tasks import read_task, write_task  # noqa: E402

BLOCK = "=== {who} [2026-01-19 10:00:00] ===\n{text}\n\n"


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--exchanges", type=int, default=400)
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--runs", type=int, default=50)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        settings = load(home=Path(tmp) / "home", env={})
        tasks = Tasks(Faces(settings))
        conv, _ = actions.start(settings, "bench", None)
        first = a.exchanges - a.tasks
        log = "".join(
            BLOCK.format(who="CLAUDE -> OLLAMA", text=f"Question {i}: what is in the folder?")
            + BLOCK.format(who="OLLAMA -> CLAUDE", text=f"Answer {i}: " + "words " * 60)
            for i in range(a.exchanges)
        )
        conv.log.write_text(log)
        since = len(
            "".join(
                BLOCK.format(who="CLAUDE -> OLLAMA", text=f"Question {i}: what is in the folder?")
                + BLOCK.format(who="OLLAMA -> CLAUDE", text=f"Answer {i}: " + "words " * 60)
                for i in range(first)
            ).encode()
        )
        made = [
            tasks.create(
                conv.id, since, "conversation_respond", f"{i:04d}.msg",
                f"Question {first + i}: what is in the folder?",
            )["taskId"]
            for i in range(a.tasks)
        ]  # fmt: skip
        probe = made[0]  # the first of the parallel questions: every later answer follows it
        secret = probe.rpartition(".")[2]
        clean = read_task(conv, secret)
        assert clean is not None

        def timed(fresh: bool) -> list[float]:
            out = []
            for _ in range(a.runs):
                if fresh:
                    write_task(conv, secret, dict(clean), durable=False)
                t0 = time.perf_counter()
                got = tasks.get(probe)
                out.append((time.perf_counter() - t0) * 1000)
                blocks = json.loads(got["result"]["content"][0]["text"])["blocks"]
                assert [b["text"].split(":")[0] for b in blocks] == [f"Answer {first}"], blocks
            return out

        def old() -> list[float]:
            out = []
            for _ in range(a.runs):
                t0 = time.perf_counter()
                tasks.faces.check(conv.id, since)
                out.append((time.perf_counter() - t0) * 1000)
            return out

        base = old()
        rows = {"check (old floor)": base, "first look": timed(True), "later looks": timed(False)}
        print(f"{a.exchanges} exchanges, {a.tasks} tasks sent at once, {a.runs} runs each")
        b50 = statistics.median(base)
        for name, xs in rows.items():
            print(
                f"  {name:18s} p50 {statistics.median(xs):7.2f} ms  p95 {pct(xs, 95):7.2f} ms"
                f"  ratio to old p50 {statistics.median(xs) / b50:5.2f}"
            )


if __name__ == "__main__":
    main()
