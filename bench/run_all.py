"""Run every benchmark and write docs/internals/benchmarks.md.

Usage: .venv/bin/python bench/run_all.py [--quick]

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
    ("Foundation: pickup, turns/s, parse, daemon RSS", "bench/bench_foundation.py", []),
    ("Routing: per-need overhead, context assembly", "bench/bench_routing.py", []),
    (
        "Overhead vs a direct call to the real llama.cpp server",
        "bench/bench_overhead.py",
        [],
    ),
    (
        "Faces: conversation_check, /api/conversations, MCP start",
        "bench/bench_faces.py",
        [],
    ),
    (
        "Embedded model: parallel slots, N conversations at once",
        "bench/bench_local_parallel.py",
        [],
    ),
    (
        "Scale: 2,000 conversations made with `new`, daemon and server as processes",
        "bench/bench_scale.py",
        ["--convs", "2000"],
    ),
    (
        "Scale: 2,000 conversation folders made by hand",
        "bench/bench_scale.py",
        ["--convs", "2000", "--hand"],
    ),
    ("File-system operations per turn", "bench/bench_turn_counts.py", []),
    ("What one streamed reply costs the HTTP client", "bench/bench_http_client.py", []),
    (
        "Pickup as a user runs it: daemon and server as processes, default settings",
        "bench/bench_pickup.py",
        [],
    ),
    (
        "Scale: 1,000 folders made by hand, `run --once`",
        "bench/bench_scale.py",
        ["--convs", "1000", "--hand", "--once"],
    ),
    (
        "Scale: 1,000 folders made with `new`, `run --once`",
        "bench/bench_scale.py",
        ["--convs", "1000", "--once"],
    ),
]


NOTES_HEADING = "## Targets missed, and what limits them"


def kept_notes(path: Path) -> str:
    """The hand-written part of the file (from NOTES_HEADING on: what limits the missed
    targets, and each round's A/B), kept as it is; only the measured sections are rewritten."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    at = text.find("\n" + NOTES_HEADING)
    if at < 0:
        return f"\n{NOTES_HEADING}\n\n(none written yet)\n"
    return text[at:]


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
    ap.add_argument("--out", type=Path, default=ROOT / "docs/internals/benchmarks.md")
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
    notes = kept_notes(args.out)
    args.out.write_text("\n".join(parts) + "\n" + notes)
    print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
