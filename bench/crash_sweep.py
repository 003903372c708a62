"""The whole crash sweep: every crash point each scenario reaches, killed (SIGKILL)
and cut (a simulated power cut: only what was fsynced survives), and each step cut after
each of its durable calls (sync), then a restart and the oracle (tests/crashsweep.py).
Writes the results file the README's table is made from.

    .venv/bin/python bench/crash_sweep.py [--scenario NAME ...] [--mode kill|cut|sync ...]
        [--jobs N] [--out bench/crash_results.json]

--jobs N runs N scenarios at a time, each in a process of its own (its own scripted server and
results file), and merges their results into one: the cases are the same, only the wall time
changes (the whole sweep is ~800 cases of a few seconds each).

Prints each failing case with its one-line replay, then the counts and the wall time of a
case (p50, p95). Exit 1 when anything was lost, duplicated or diverged.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.crashsweep import MODES, SCENARIOS, Case, Outcome, sweep  # noqa: E402

RESULTS = ROOT / "bench" / "crash_results.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    ap.add_argument("--mode", action="append", choices=MODES)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--jobs", type=int, default=1, help="scenarios run at a time (processes)")
    args = ap.parse_args()
    names: list[str] = args.scenario or list(SCENARIOS)
    modes: tuple[str, ...] = tuple(args.mode or MODES)
    if args.jobs > 1 and len(names) > 1:
        sys.exit(in_parallel(names, modes, args.jobs, args.out))
    times: list[float] = []
    last = [time.perf_counter()]

    def report(case: Case, outcome: Outcome) -> None:
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now
        if not outcome.ok:
            print(f"FAIL {case}: {'; '.join(outcome.problems)}\n  replay: {case.replay}")

    start = time.perf_counter()
    result = sweep(names, modes, report=report)
    wall = time.perf_counter() - start
    data = result.as_json()
    git = shutil.which("git") or "git"
    commit = subprocess.run(
        [git, "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    data["commit"] = commit
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    cases = result.kills + result.cuts + result.between
    q = statistics.quantiles(times, n=20) if len(times) >= 2 else [0.0] * 19
    print(
        f"scenarios {len(names)}  crash points {len(result.points)}  kills {result.kills}  "
        f"power cuts {result.cuts}  cuts between fsyncs {result.between}  lost {result.lost}  "
        f"duplicated {result.duplicated}  "
        f"diverged {result.diverged}  (commit {commit})"
    )
    print(
        f"{cases} cases in {wall:.0f} s: a case p50 {statistics.median(times or [0]):.2f} s, "
        f"p95 {q[18]:.2f} s; written to {args.out}"
    )
    sys.exit(1 if result.lost or result.duplicated or result.diverged else 0)


def in_parallel(names: list[str], modes: tuple[str, ...], jobs: int, out: Path) -> int:
    """Each scenario in a process of its own, ``jobs`` at a time; their results merged into
    ``out``. Returns the exit status (1 when any scenario lost, duplicated or diverged)."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="crash-sweep-") as tmp:

        def one(name: str) -> tuple[str, int, str]:
            part = Path(tmp) / f"{name}.json"
            cmd = [sys.executable, __file__, "--scenario", name, "--out", str(part)]
            for mode in modes:
                cmd += ["--mode", mode]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            return name, done.returncode, done.stdout + done.stderr

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            # each scenario's cases said as it ends (a long sweep's failures are read at once)
            for ended in as_completed([pool.submit(one, name) for name in names]):
                name, rc, text = ended.result()
                took = time.perf_counter() - start
                print(f"== {name} (exit {rc}, at {took:.0f} s)\n{text.rstrip()}", flush=True)
        parts = []
        for name in names:
            path = Path(tmp) / f"{name}.json"
            if not path.exists():
                print(f"scenario {name} wrote no results", file=sys.stderr)
                return 2
            parts.append(json.loads(path.read_text()))
    merged = merge(parts)
    out.write_text(json.dumps(merged, indent=2) + "\n")
    print(
        f"scenarios {len(merged['scenarios'])}  crash points {len(merged['crash_points'])}  "
        f"kills {merged['kills']}  power cuts {merged['power_cuts']}  cuts between fsyncs "
        f"{merged['power_cuts_between_fsyncs']}  lost {merged['lost']}  duplicated "
        f"{merged['duplicated']}  diverged {merged['diverged']}  (commit {merged['commit']}); "
        f"{time.perf_counter() - start:.0f} s with {jobs} jobs; written to {out}"
    )
    return 1 if merged["lost"] or merged["duplicated"] or merged["diverged"] else 0


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One results file from several: the scenarios and points united, the counts added."""
    commits = {str(p["commit"]) for p in parts}
    if len(commits) != 1:
        raise SystemExit(f"results of different commits: {sorted(commits)}")
    merged: dict[str, Any] = {
        "scenarios": sorted({s for p in parts for s in p["scenarios"]}),
        "crash_points": sorted({c for p in parts for c in p["crash_points"]}),
    }
    for key in ("kills", "power_cuts", "power_cuts_between_fsyncs", "lost", "duplicated",
                "diverged"):
        merged[key] = sum(int(p.get(key, 0)) for p in parts)
    merged["commit"] = commits.pop()
    return merged


if __name__ == "__main__":
    main()
