"""Commands that start at once, as a user runs them: each command is its own
process (``.venv/bin/contemplation``), cold (the first run after the home is built) and warm
(the median of the next runs), against a home of ``--active`` conversations and
``--archived`` ones in completed/, folders copied by hand (a short two-block log each, no
state.json), as an import or a restore leaves them.

Run: .venv/bin/python bench/bench_cli.py [--active 500] [--archived 10000] [--runs 5]

Prints per command: cold, warm median and min–max (ms), and the target. Also
``mcp initialize``: a stdio session's initialize answered, against importing the MCP SDK alone
(``import mcp.server.lowlevel``) measured in the same run.
Targets: --help ≤ 150 ms; new, send, status CONV, list ≤ 250 ms at 500 active; list --all ≤
500 ms at 10,000 archived; mcp initialize within 200 ms of the SDK's own import.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXE = [str(ROOT / ".venv" / "bin" / "contemplation")]
PY = str(ROOT / ".venv" / "bin" / "python")

LOG = """=== CLAUDE -> OLLAMA [2026-0{m}-{d:02d} 10:00:00] ===
Question {i}: what does the folder hold?

=== OLLAMA -> CLAUDE [2026-0{m}-{d:02d} 10:00:05] ===
Answer {i}: plain text blocks, one per message.
"""


def build(home: Path, active: int, archived: int) -> None:
    for where, count in (("active", active), ("completed", archived)):
        base = home / where
        base.mkdir(parents=True, exist_ok=True)
        for i in range(count):
            d = base / f"conv_20260{1 + i % 9}{1 + i % 28:02d}-1000{i % 60:02d}_{where}-{i}"
            (d / "inbox").mkdir(parents=True)
            (d / "messages.log").write_text(LOG.format(m=1 + i % 9, d=1 + i % 28, i=i))


def timed(args: list[str], env: dict[str, str], runs: int) -> tuple[float, list[float]]:
    def once() -> float:
        t0 = time.perf_counter()
        subprocess.run(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return (time.perf_counter() - t0) * 1000

    cold = once()
    return cold, [once() for _ in range(runs)]


def mcp_initialize(env: dict[str, str]) -> float:
    """Start ``contemplation mcp`` and time its answer to initialize (ms)."""
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"},
        },
    }
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [*EXE, "mcp"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(init) + "\n")
    proc.stdin.flush()
    proc.stdout.readline()
    took = (time.perf_counter() - t0) * 1000
    proc.stdin.close()
    proc.wait(timeout=30)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--active", type=int, default=500)
    ap.add_argument("--archived", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--tree",
        type=Path,
        default=None,
        help="run the CLI of another checkout instead (an A/B: git worktree add /tmp/old REV)",
    )
    a = ap.parse_args()
    if a.tree is not None:
        boot = f"import sys; sys.path.insert(0, {str(a.tree)!r}); from contemplation.faces.cli.root import main"
        EXE[:] = [PY, "-c", boot + "; sys.argv[0] = 'contemplation'; main()"]
    tmp = Path(tempfile.mkdtemp(prefix="contemplation-cli-"))
    home = tmp / "home"
    build(home, a.active, a.archived)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEMPLATION_", "OLLAMA_"))}
    env |= {"CONTEMPLATION_HOME": str(home), "XDG_CONFIG_HOME": str(tmp / "xdg")}
    conv = subprocess.run(
        [*EXE, "new", "bench"], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    rows = [
        ("--help", ["--help"], 150),
        ("new", ["new", "timed"], 250),
        ("send", ["send", conv, "hello"], 250),
        ("status CONV", ["status", conv], 250),
        ("list", ["list"], 250),
        ("list --all", ["list", "--all"], 500),
    ]
    print(f"home: {a.active} active, {a.archived} archived (made by hand); {a.runs} warm runs")
    print(f"{'command':<14} {'cold':>8} {'warm p50':>9} {'min-max':>15}  target")
    for name, args, target in rows:
        cold, warm = timed([*EXE, *args], env, a.runs)
        p50 = statistics.median(warm)
        print(
            f"{name:<14} {cold:>6.0f}ms {p50:>7.0f}ms {min(warm):>6.0f}-{max(warm):<6.0f}ms"
            f"  <= {target} ms {'ok' if p50 <= target else 'MISSED'}"
        )
    sdk = [timed([PY, "-c", "import mcp.server.lowlevel"], env, 1)[1][0] for _ in range(a.runs)]
    init = [mcp_initialize(env) for _ in range(a.runs)]
    gap = statistics.median(init) - statistics.median(sdk)
    print(
        f"mcp initialize: p50 {statistics.median(init):.0f} ms; importing the SDK alone p50 "
        f"{statistics.median(sdk):.0f} ms; ours on top {gap:.0f} ms (target <= 200)"
    )
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
