"""Peak memory of the commands that read a whole conversation, against its size:
each runs as a process of its own on a home holding one conversation of
``--sizes`` GB, and its peak RSS is what the kernel counted for it (``ru_maxrss`` from
``wait4``).

  search          ``search`` on a home with no index yet: the index is built first
  reindex         ``reindex``
  daemon          ``run`` until it has indexed the home and gone quiet, then SIGTERM (the
                  conversation is archived: the daemon only indexes it)
  fork            ``fork <id>`` at its last block (the fork is removed after)
  daemon, active  (with ``--active``) the same conversation in ``active/``: the daemon also
                  parses it for its next turn (its rotated segments held as bare blocks)
  list, state     (with ``--state-mb``) ``list`` where one conversation's state.json is that big

The log is written fast, a ~1 MB pattern of exchanges again and again, as the daemon leaves
it: 10 MB rotated segments and a live ``messages.log`` (``--shape single``: one file). Its
words are long (one term in ~40 bytes) so that indexing takes seconds, not minutes; what is
held does not depend on it. With ``--tree NAME=PATH`` (repeatable) each command runs with
that tree's code first on PYTHONPATH, the same interpreter: e.g. the code before the change
in a ``git worktree add /tmp/base <commit>``.

Run: .venv/bin/python bench/bench_memory.py [--sizes 1,2] [--tree before=/tmp/base]
     [--tree after=.] [--active] [--state-mb 1024] [--shape segments|single]
Target: search, reindex, daemon and fork each <= ~300 MB whatever the
conversation's size; nothing skipped for its size (the blocks column).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GB = 1 << 30
SEGMENT = 10 << 20  # the daemon's default rotate_bytes
CONV = "conv_20260101-100000_big"
QUIET_S = 3.0  # the daemon used no CPU for this long: it is done
DAEMON_LIMIT_S = 1800.0


def pattern(seed: int = 11) -> bytes:
    """About 1 MB of exchanges: blocks of ~8 KB, agent and model in turn, a NEED answered."""
    rng = random.Random(seed)
    words = [
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(30, 50))) for _ in range(4000)
    ]
    out: list[str] = []
    for i in range(128):
        who = "CLAUDE -> OLLAMA" if i % 2 == 0 else "OLLAMA -> CLAUDE"
        lines = [" ".join(rng.choices(words, k=2)) for _ in range(90)]
        if i % 2:
            lines.append(f"NEED: File contents of notes/{i}.md" if i % 8 == 1 else "done")
        elif i % 8 == 2:
            lines.insert(0, f"RESPONSE TO NEED: File contents of notes/{i - 1}.md")
        out.append(
            f"=== {who} [2026-01-01 10:{i // 60:02d}:{i % 60:02d}] ===\n"
            + "\n".join(lines)
            + "\n\n"
        )
    return "".join(out).encode()


def write_log(folder: Path, size: int, shape: str) -> int:
    """The conversation's log, ``size`` bytes or a little more: rotated segments of SEGMENT
    bytes (messages.N.log, the highest the oldest) and a live messages.log, or one file."""
    chunk = pattern()
    folder.mkdir(parents=True, exist_ok=True)
    per_file = SEGMENT if shape == "segments" else size
    files = max(1, -(-size // per_file))
    written = 0
    for k in range(files):
        name = "messages.log" if k == files - 1 else f"messages.{files - 1 - k}.log"
        with (folder / name).open("wb") as f:
            n = 0
            while n < per_file and written < size:
                f.write(chunk)
                n += len(chunk)
                written += len(chunk)
    return written


def write_meta(folder: Path) -> None:
    meta = {"id": CONV, "topic": "big", "created": "2026-01-01T10:00:00", "backend": "ollama"}
    (folder / "metadata.json").write_text(json.dumps(meta))


def write_state(path: Path, size: int) -> None:
    """A state.json of ``size`` bytes (a padding field)."""
    head = b'{"status": "idle", "padding": "'
    with path.open("wb") as f:
        f.write(head)
        block = b"p" * (1 << 20)
        left = size - len(head) - 2
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)
        f.write(b'"}')


@dataclass
class Run:
    peak_mb: float
    seconds: float
    blocks: int | None = None
    rc: int = 0


Row = tuple[str, str, dict[str, Run]]


def env_for(home: Path, tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEMPLATION_", "OLLAMA_"))}
    env.update(
        CONTEMPLATION_HOME=str(home),
        XDG_CONFIG_HOME=str(home.parent / "xdg"),
        CONTEMPLATION_DASHBOARD_ENABLED="false",
        CONTEMPLATION_LOG_FORMAT="json",
        OLLAMA_HOST="http://127.0.0.1:9",  # nothing answers: no turn is taken anyway
        PYTHONPATH=str(tree),
    )
    return env


def measured(
    argv: list[str], env: dict[str, str], until: Callable[[int], None] | None = None
) -> Run:
    """Run ``argv`` as a child, its peak RSS from wait4 (``until(pid)`` returns when it may
    be stopped with SIGTERM: the daemon)."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err, cwd="/")
        if until is not None:
            until(proc.pid)
            proc.send_signal(signal.SIGTERM)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
        if rc and until is None:
            err.seek(0)
            print(f"    ({' '.join(argv[3:])} exited {rc}: {err.read().decode()[-300:]})")
    return Run(usage.ru_maxrss / 1024, time.monotonic() - t0, rc=rc)


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def quiet(pid: int) -> None:
    """Returns once the process used no CPU for QUIET_S (after its start)."""
    last, since, t0 = -1, time.monotonic(), time.monotonic()
    while time.monotonic() - t0 < DAEMON_LIMIT_S:
        time.sleep(0.25)
        ticks = cpu_ticks(pid)
        if ticks != last:
            last, since = ticks, time.monotonic()
        elif time.monotonic() - since >= QUIET_S and time.monotonic() - t0 > 2:
            return


def indexed(home: Path) -> int | None:
    db = home / ".index.sqlite3"
    if not db.exists():
        return None
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        got = conn.execute("SELECT blocks FROM convs WHERE id = ?", (CONV,)).fetchone()
    finally:
        conn.close()
    return int(got[0]) if got else None


def drop_index(home: Path) -> None:
    for p in home.glob(".index.sqlite3*"):
        p.unlink()


def one_op(op: str, home: Path, tree: Path, conv: Path) -> Run:
    cli = [sys.executable, "-m", "contemplation"]
    env = env_for(home, tree)
    if op == "search":
        drop_index(home)
        run = measured([*cli, "search", "--all", "zebra"], env)
    elif op == "reindex":
        run = measured([*cli, "reindex"], env)
    elif op.startswith("daemon"):
        drop_index(home)
        run = measured([*cli, "run"], env, until=quiet)
    elif op == "fork":
        before = set(os.listdir(home / "active"))
        run = measured([*cli, "fork", CONV], env)
        for name in set(os.listdir(home / "active")) - before:
            shutil.rmtree(home / "active" / name)
        return run
    else:  # list, state
        run = measured([*cli, "list", "--all"], env)
        return run
    run.blocks = indexed(home)
    return run


def measure_size(size: float, args: argparse.Namespace, trees: list[tuple[str, Path]]) -> list[Row]:
    """Every command at one size, with every tree: a home made for it, removed after."""
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-memory-", dir=args.tmp) as tmp:
        home = Path(tmp) / "home"
        conv = home / "completed" / CONV
        (home / "active").mkdir(parents=True)
        t0 = time.monotonic()
        wrote = write_log(conv, int(size * GB), args.shape)
        write_meta(conv)
        took = time.monotonic() - t0
        print(f"{size:g} GB log ({args.shape}): {wrote / GB:.2f} GB written in {took:.1f} s")
        plan = [op for op in args.ops.split(",") if op]
        if args.active:
            plan.append("daemon, active")
        if args.state_mb and args.first:
            plan.append(f"list, {args.state_mb} MB state.json")
        for op in plan:
            results: dict[str, Run] = {}
            for name, tree in trees:
                results[name] = op_with(op, home, tree, conv, args.state_mb)
                r = results[name]
                print(
                    f"  {op:<26} {name:<7} peak {r.peak_mb:8.0f} MB  {r.seconds:7.1f} s"
                    + (f"  blocks indexed {r.blocks}" if r.blocks is not None else ""),
                    flush=True,
                )
            rows.append((f"{size:g} GB", op, results))
    return rows


def op_with(op: str, home: Path, tree: Path, conv: Path, state_mb: int) -> Run:
    """One command, the home arranged for it first and put back after."""
    if op == "daemon, active":
        os.rename(conv, home / "active" / CONV)
    if op.startswith("list"):
        write_state(conv / "state.json", state_mb << 20)
    try:
        return one_op(op, home, tree, conv)
    finally:
        if op == "daemon, active":
            os.rename(home / "active" / CONV, conv)
        if op.startswith("list"):
            (conv / "state.json").unlink()


def table(rows: list[Row], names: list[str]) -> None:
    cols = [f"{n}: peak RSS" for n in names] + [f"{n}: s" for n in names]
    cols += [f"{n}: blocks indexed" for n in names]
    print("| log | command | " + " | ".join(cols) + " |")
    print("|---" * (2 + len(cols)) + "|")
    for size_s, op, results in rows:
        cells = [f"{results[n].peak_mb:.0f} MB" for n in names]
        cells += [f"{results[n].seconds:.1f}" for n in names]
        cells += ["" if results[n].blocks is None else str(results[n].blocks) for n in names]
        print(f"| {size_s} | {op} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="1,2", help="GB, comma-separated")
    ap.add_argument("--tree", action="append", default=[], help="NAME=PATH of the code to run")
    ap.add_argument("--shape", choices=("segments", "single"), default="segments")
    ap.add_argument("--active", action="store_true", help="also the daemon with it active")
    ap.add_argument("--state-mb", type=int, default=0, help="also list with a state.json this big")
    ap.add_argument("--ops", default="search,reindex,daemon,fork")
    ap.add_argument("--tmp", default=tempfile.gettempdir())
    args = ap.parse_args()
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree]
    trees = trees or [("this", ROOT)]
    sizes = [float(s) for s in args.sizes.split(",")]
    free = shutil.disk_usage(args.tmp).free
    need = max(sizes) * GB * 2.5 + args.state_mb * (1 << 20)
    if free < need:
        print(f"{free / GB:.1f} GB free under {args.tmp}, {need / GB:.1f} GB needed: 1 GB only")
        sizes = [1.0]
    print(f"{sys.executable}, {os.cpu_count()} CPUs; " + ", ".join(f"{n}={p}" for n, p in trees))
    rows: list[Row] = []
    for k, size in enumerate(sizes):
        args.first = k == 0
        rows += measure_size(size, args, trees)
    print()
    table(rows, [n for n, _ in trees])


if __name__ == "__main__":
    main()
