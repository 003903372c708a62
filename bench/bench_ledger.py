"""The ledger summed over a home of many archived conversations, as a user runs it:
``contemplation ledger`` (and ``--by model``, ``--by provider``, ``status``) each its own
process, against ``--archived`` conversations in completed/, folders made by hand (a two-block
log and a state.json whose ledger holds 3 turns on one of 4 models), as a restore leaves them.

Run: .venv/bin/python bench/bench_ledger.py [--archived 10000] [--runs 5]

Prints per command: cold (the first, which builds the index from every folder) and the warm
median, min–max (ms), and checks the sums: every conversation counted once, each figure the
sum of what the folders say. The ledger's figures against a real server's own counters are
the test ``tests/system/test_ledger.py -k real`` (see docs/internals/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXE = str(ROOT / ".venv" / "bin" / "contemplation")

LOG = """=== CLAUDE -> OLLAMA [2026-01-{d:02d} 10:00:00] ===
Question {i}?

=== OLLAMA -> CLAUDE [2026-01-{d:02d} 10:00:05] ===
Answer {i}.
"""
TURN = {"turns": 1, "sent": 300, "reused": 250, "recomputed": 50, "output": 20,
        "queued_ms": 1.0, "load_ms": None, "prefill_ms": 40.0, "generate_ms": 200.0,
        "context_bytes": 100}  # fmt: skip


def build(home: Path, n: int) -> None:
    base = home / "completed"
    base.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        d = base / f"conv_20260101-10{i % 60:02d}00_ledger-{i}"
        (d / "inbox").mkdir(parents=True)
        (d / "messages.log").write_text(LOG.format(d=1 + i % 28, i=i))
        model = f"model-{i % 4}"
        turns = [TURN | {"turn": t, "provider": "llama", "model": model} for t in (1, 2, 3)]
        by = {f"llama/{model}": {k: (v * 3 if isinstance(v, int | float) else v)
                                 for k, v in TURN.items()}}  # fmt: skip
        state = {"status": "idle", "turns": 3, "ledger": {"turns": turns, "by": by}}
        (d / "state.json").write_text(json.dumps(state))
        meta = {"id": d.name, "topic": f"ledger {i}", "created": "2026-01-01T10:00:00",
                "backend": "llama", "model": model}  # fmt: skip
        (d / "metadata.json").write_text(json.dumps(meta))


def timed(args: list[str], env: dict[str, str], runs: int) -> tuple[float, list[float], str]:
    def once() -> tuple[float, str]:
        t0 = time.perf_counter()
        got = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
        return (time.perf_counter() - t0) * 1000, got.stdout

    cold, out = once()
    return cold, [once()[0] for _ in range(runs)], out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--archived", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        t0 = time.perf_counter()
        build(home, a.archived)
        print(f"home: {a.archived} archived (made by hand) in {time.perf_counter() - t0:.1f} s")
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEMPLATION_")}
        env |= {"CONTEMPLATION_HOME": str(home), "XDG_CONFIG_HOME": str(Path(tmp) / "xdg")}
        n = a.archived
        for args in (
            ["ledger", "--json"],
            ["ledger", "--json", "--by", "model"],
            ["ledger", "--json", "--by", "provider"],
            ["ledger", "--json", "--limit", "500"],
            ["status"],
        ):
            cold, warm, out = timed([EXE, *args], env, a.runs)
            p50 = statistics.median(warm)
            print(
                f"{' '.join(args):<32} cold {cold:7.0f} ms   warm {p50:5.0f} ms "
                f"({min(warm):.0f}-{max(warm):.0f})"
            )
            if args[-1] == "status":
                continue
            got = json.loads(out)
            total = got["total"]
            assert total["turns"] == 3 * n and total["sent"] == 900 * n, total
            assert total["recomputed"] == 150 * n and total["load_ms"] is None, total
            assert got["count"] <= 500 and got["found"] == {"conversation": n, "model": 4,
                                                            "provider": 1}[got["by"]]  # fmt: skip
        print(f"sums checked: {3 * n} turns, {900 * n} prompt tokens, every page bounded")


if __name__ == "__main__":
    main()
