"""Run every benchmark and write BENCHMARKS.md.  Usage: .venv/bin/python bench/run_all.py [--quick]

Each benchmark is its own script (it can be run alone); this one runs them one after another
on an otherwise idle machine and records the machine, the exact commands and their output,
where every figure is printed next to its target.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BENCHES = [
    ("Foundation: pickup, turns/s, parse, daemon RSS (issue 2)", "bench/bench_foundation.py", []),
    ("Routing: per-need overhead, context assembly (issue 3)", "bench/bench_routing.py", []),
    (
        "Overhead vs a direct call to the real llama.cpp server (issue 4)",
        "bench/bench_overhead.py",
        [],
    ),
    (
        "Faces: conversation_check, /api/conversations, MCP start (issue 5)",
        "bench/bench_faces.py",
        [],
    ),
    (
        "Embedded model: parallel slots, N conversations at once (issue 10)",
        "bench/bench_local_parallel.py",
        [],
    ),
    (
        "Scale: 2,000 conversations made with `new`, daemon and server as processes (issue 9)",
        "bench/bench_scale.py",
        ["--convs", "2000"],
    ),
    (
        "Scale: 2,000 conversation folders made by hand (issue 9)",
        "bench/bench_scale.py",
        ["--convs", "2000", "--hand"],
    ),
    ("File-system operations per turn (issue 11)", "bench/bench_turn_counts.py", []),
    (
        "Pickup as a user runs it: daemon and server as processes, default settings (issue 11)",
        "bench/bench_pickup.py",
        [],
    ),
]


NOTES = """
## Targets missed, and what limits them

Issue 11 rebuilt the turn path: one lock per step (the turn runs under the step's lock and
writer), no intent write for an agent message (its file in `processing/` is the record of the
write), the message's commit riding on the turn's first state write, the request sent while
that write runs on a worker thread, and the backend slot given back as soon as the stream
ends. Per turn that is 3 state writes (was 5), 6 fsyncs (was 8), 2 locks (was 3-4) and 3
watcher pokes (was 86 for a 40-chunk reply). Measured with `bench/bench_pickup.py` (daemon
and server each in their own process, default settings, fsync) on an idle machine:

* **Pickup p50 ≤ 5 ms, p99 ≤ 20 ms**: 5.0-5.6 ms p50, 7.7-11.5 ms p99 one at a time
  (was 7.8 / 17.5 ms), for folders made with `new` and by hand alike (hand-made folders were
  ~1.4 ms slower until their defaults took one fsync instead of four). The first turn of a
  daemon costs 90-200 ms (the model's capabilities are looked up once, the first connection
  is opened). What is left on the path: the step (lock, state and metadata reads, the
  incremental parse, the claim) ~1 ms, the message's append + fsync ~0.5 ms, the request
  (history, budget fit, httpx) ~0.7 ms, and the hop from the watcher thread to the loop.
* **≤ 2 ms of daemon work per turn** (ten drops at once at concurrency 1 ≤ 15 ms p50):
  6.5-10 ms between consecutive requests, ten at once p50 49-70 ms (was 188 ms). The slot
  holder's own writes (the reply's durable intent: 2 fsyncs) and every other conversation's
  step share one event loop: all file work is synchronous on it.
* **1,000 hand-made folders at ≥ 300 turns/s** (`bench/bench_scale.py --convs 1000 --hand`):
  72 turns/s end to end (94 with `new`), start-up and scan included.
* **≥ 1,000 turns/s, 1,000 conversations, in process, fsync**: 220-258 turns/s
  (365/s with `durability = "none"`). Six fsyncs of ~0.25-0.35 ms each on this virtual disk
  are ~2 ms per turn, and concurrent fsyncs from threads do not coalesce here (measured: 1, 4,
  16 and 64 threads all give ~2,000 fsyncs/s), so only a group commit with one `syncfs` per
  batch (0.45 ms for 10 files, 2.3 ms for 200) can go further. That needs every durable point
  of the writer to become an await, so that many conversations reach it together; it was not
  done in this round. With fsync off the rest is Python work on one core: `os.replace` of
  `state.json` (~0.2 ms: ext4 flushes a file renamed over another), JSON state encoding,
  pathlib.
"""


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        kb = int(
            next(
                ln.split()[1]
                for ln in Path("/proc/meminfo").read_text().splitlines()
                if ln.startswith("MemTotal")
            )
        )
        mem = f"{kb / 1024 / 1024:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    return (
        f"{platform.system()} {platform.release()}, {os.cpu_count()} cores ({cpu}), {mem} RAM, "
        f"Python {platform.python_version()}"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--quick", action="store_true", help="pass --quick to the benchmarks that have it"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    args = ap.parse_args()
    parts = [
        "# Benchmarks",
        "",
        f"Written by `python bench/run_all.py{' --quick' if args.quick else ''}` on "
        f"{time.strftime('%Y-%m-%d %H:%M')} — {machine()}.",
        "",
        "Each section is one script, run alone on an idle machine; every figure is printed next to",
        "its target. Run any script by itself to reproduce its section.",
    ]
    failed = 0
    for title, script, extra in BENCHES:
        cmd = [sys.executable, script, *extra]
        if args.quick and "--quick" in (ROOT / script).read_text():
            cmd.append("--quick")
        shown = " ".join(["python", *cmd[1:]])
        print(f"== {shown}", flush=True)
        t0 = time.monotonic()
        proc = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False
        )
        took = time.monotonic() - t0
        out = proc.stdout.strip() or "(no output)"
        print(out, flush=True)
        parts += ["", f"## {title}", "", f"`{shown}` ({took:.0f} s)", "", "```", out, "```"]
        if proc.returncode != 0:
            failed += 1
            tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
            parts += [
                "",
                f"**The script failed (exit {proc.returncode}):**",
                "",
                "```",
                tail,
                "```",
            ]
    args.out.write_text("\n".join(parts) + "\n" + NOTES)
    print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
