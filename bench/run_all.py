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

* **Pickup p50 ≤ 5 ms** (measured ~8 ms from the rename into `inbox/` to the request reaching
  the server). The path is: inotify event (watchdog reader thread) → claim by rename →
  durable intent in `state.json` (write, fsync, rename, fsync of the folder) → append + fsync
  → commit → build the request from the parsed log → HTTP. fsync is about 1 ms of it
  (`durability = "none"` gives the same p50 within noise); the rest is Python work per step
  (two locked state loads, two JSON state writes, the parse refresh, httpx). Fixed on the way:
  watchdog's 0.5 s move-pairing sleep (was ~400 ms), Nagle stalls in the fake servers, a new
  TCP connection per turn, one redundant decision step and one fsync.
* **≥ 1,000 turns/s with 1,000 conversations** (measured ~420/s with `durability = "none"`,
  ~220/s with fsync, on 2 cores). Each turn is crash safe on its own: claim, intent, append,
  commit, reply intent, reply, commit — five atomic `state.json` replacements and two log
  writes per turn. A rename of `state.json` costs ~0.17 ms on this ext4 volume and the daemon
  is one Python process; batching several conversations' commits into one write would trade
  away the per-conversation journal that makes every crash point recoverable, so it was not
  done. The profile (cProfile of `process_pending`) is dominated by `os.replace`, JSON state
  encoding and pathlib.
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
