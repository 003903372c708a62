"""The read commands a person types most, whole-process, as a shell runs them: ``list``,
``status``, ``status CONV``, ``tail CONV``, ``search WORDS --mode words`` and ``approvals``
(and ``--help``, the floor: the interpreter, click and the command table), each a new
interpreter (``.venv/bin/contemplation``), against a home of ``--active`` conversations made by
hand (bench_cli.py's), the index and the settings' verdict warm (one run of each first).

With ``--tree OTHER`` (a checkout of another commit with its own ``.venv``) each command runs
in both, each in its own copy of the home (the two commits' indexes may differ), interleaved (A: OTHER, B: this checkout, A, B, ...), so the load of a busy machine
falls on both alike. Printed per command and tree: wall p50 / p95 / min (ms), CPU p50 (user +
system of the child, less sensitive to a loaded machine than wall time), and the modules
loaded (deterministic: counted once with ``-X importtime``).

Run: .venv/bin/python bench/bench_read_commands.py [--active 300] [--runs 15] [--tree /work/ab]
[--only "status CONV" --only list] (those commands alone: a loaded machine's minutes go further)
Target: each <= 150 ms (wall p50) at 300 active conversations. ``x help``: the p50 as a
multiple of the same tree's ``--help`` (the floor), which carries from one machine to another:
the target was set where ``--help`` took 76 ms, so there it is about 2x.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.bench_cli import build  # noqa: E402

TARGET_MS = 150


def commands(conv: str) -> list[tuple[str, list[str]]]:
    return [
        ("--help", ["--help"]),  # the floor: the interpreter, click and the entry point
        ("list", ["list"]),
        ("status", ["status"]),
        ("status CONV", ["status", conv]),
        ("tail CONV", ["tail", conv]),
        ("search words", ["search", "folder", "--mode", "words"]),
        ("approvals", ["approvals"]),
    ]


def once(exe: str, args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU (user + system) milliseconds of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(
        [exe, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
    )
    wall = (time.perf_counter() - t0) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    return wall, cpu


def modules(tree: Path, args: list[str], env: dict[str, str]) -> int:
    """How many modules the command imports (``-X importtime`` lines)."""
    proc = subprocess.run(
        [str(tree / ".venv" / "bin" / "python"), "-X", "importtime", "-m", "contemplation", *args],
        env=env,
        cwd=tree.parent,  # not a checkout: -m would import the package beside it
        capture_output=True,
        text=True,
        check=True,
    )
    return sum(1 for ln in proc.stderr.splitlines() if ln.startswith("import time:")) - 1


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--active", type=int, default=300)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--tree", type=Path, default=None, help="A: another checkout with its .venv")
    ap.add_argument("--only", action="append", default=[], help="This command alone (its label)")
    a = ap.parse_args()
    trees = {"B": ROOT} if a.tree is None else {"A": a.tree.resolve(), "B": ROOT}
    tmp = Path(tempfile.mkdtemp(prefix="contemplation-reads-"))
    home = tmp / "home"
    build(home, a.active, 0)
    # as a person's shell runs them: the bytecode written once and read after (a shell that
    # set PYTHONDONTWRITEBYTECODE would have every run compile the package again)
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CONTEMPLATION_", "OLLAMA_")) and k != "PYTHONDONTWRITEBYTECODE"
    }
    envs: dict[str, dict[str, str]] = {}
    for name in trees:  # a copy of the home each: two commits' indexes (their schemas) differ,
        own = tmp / name  # and one home shared would be indexed again at every turn
        shutil.copytree(home, own / "home", symlinks=True)
        envs[name] = base | {
            "CONTEMPLATION_HOME": str(own / "home"),
            "XDG_CONFIG_HOME": str(own / "xdg-config"),
            "XDG_CACHE_HOME": str(own / "xdg-cache"),
        }
    exe = {name: str(tree / ".venv" / "bin" / "contemplation") for name, tree in trees.items()}
    conv = sorted(p.name for p in (home / "active").iterdir())[0]
    rows = [r for r in commands(conv) if not a.only or r[0] in a.only]
    if not rows:
        ap.error(f"--only: no such command; one of {[r[0] for r in commands(conv)]}")
    for name in trees:  # warm: the index made (by list), the settings' verdict recorded
        for _, args in commands(conv):  # (every command, whatever --only names)
            once(exe[name], args, envs[name])
    counted = {(n, c): modules(t, args, envs[n]) for n, t in trees.items() for c, args in rows}
    print(f"home: {a.active} active conversations; {a.runs} runs each, interleaved; ms")
    for name, tree in trees.items():
        print(f"  {name}: {tree}")
    print(
        f"{'command':<14} {'':>2} {'p50':>6} {'p95':>6} {'min':>6} {'cpu p50':>8} {'modules':>8}"
        f" {'x help':>7}"
    )
    floor: dict[str, float] = {}  # each tree's --help p50: the interpreter and click
    for label, args in rows:
        wall: dict[str, list[float]] = {n: [] for n in trees}
        cpu: dict[str, list[float]] = {n: [] for n in trees}
        for _ in range(a.runs):
            for name in trees:
                took, spent = once(exe[name], args, envs[name])
                wall[name].append(took)
                cpu[name].append(spent)
        for name in trees:
            w = wall[name]
            p50 = statistics.median(w)
            if label == "--help":
                floor[name] = p50
            times = f"{p50 / floor[name]:>7.2f}" if name in floor else f"{'':>7}"
            verdict = "ok" if p50 <= TARGET_MS or label == "--help" else "MISSED"
            print(
                f"{label:<14} {name:>2} {p50:>6.0f} {p95(w):>6.0f} {min(w):>6.0f} "
                f"{statistics.median(cpu[name]):>8.0f} {counted[name, label]:>8} {times}"
                f"  {'<= ' + str(TARGET_MS) + ' ' + verdict if name == 'B' else ''}"
            )
        if len(trees) == 2:
            ratio = statistics.median(wall["B"]) / statistics.median(wall["A"])
            print(f"{'':<14} B/A wall p50 {ratio:.2f}")
    load = os.getloadavg()
    print(
        f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} ({os.cpu_count()} CPUs)"
    )
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
