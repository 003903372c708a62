"""The whole crash sweep: every crash point each scenario reaches, killed (SIGKILL)
and cut (a simulated power cut: only what was fsynced survives), and each step cut after
each of its durable calls (sync), then a restart and the oracle (tests/crashsweep.py).
Writes the results file the README's table is made from.

    .venv/bin/python bench/crash_sweep.py [--scenario NAME ...] [--mode kill|cut|sync ...]
        [--out bench/crash_results.json]

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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.crashsweep import MODES, SCENARIOS, Case, Outcome, sweep  # noqa: E402

RESULTS = ROOT / "bench" / "crash_results.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    ap.add_argument("--mode", action="append", choices=MODES)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    names: list[str] = args.scenario or list(SCENARIOS)
    modes: tuple[str, ...] = tuple(args.mode or MODES)
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


if __name__ == "__main__":
    main()
