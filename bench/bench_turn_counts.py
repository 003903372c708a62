"""What one turn costs in file-system operations (issue 11). Run: .venv/bin/python bench/bench_turn_counts.py

N conversations x 1 message through process_pending with an instant in-process backend,
durability = fsync. Every os.replace of state.json, fsync, flock and open of messages.log is
counted, then divided by N, and printed with what each is for.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_foundation import InstantBackend  # noqa: E402
from contemplation import backends  # noqa: E402
from contemplation.layout import Home, load_template  # noqa: E402
from contemplation.pipeline import Runtime, process_pending  # noqa: E402
from contemplation.settings import load  # noqa: E402
from contemplation.writer import drop_message, new_conversation  # noqa: E402

WHAT = {
    "state writes": "the turn's start (status generating, carrying the message's commit and "
    "the reply's intent, its offset before its first byte) and the reply's commit with its "
    "status",
    "fsyncs": "on worker threads while the request goes out: the message block, then the "
    "turn's start (temp file + folder), both before the first text is written; after the "
    "stream: the reply block, the reply's commit (temp file + folder)",
    "locks": "flock of <conv>/.lock, one per step: the step that takes the message runs the "
    "turn under the same lock; the step after it finds nothing due",
    "log opens": "appends (the message; the reply keeps one open for its life), the "
    "message's fsync and reads (the incremental parse, the separator and identity checks)",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--convs", type=int, default=200)
    args = ap.parse_args()
    backends.register("instant", lambda s: InstantBackend())
    home = Home(Path(tempfile.mkdtemp()) / "home")
    tpl = load_template(home, "default")
    for i in range(args.convs):
        conv = new_conversation(home, f"c {i}", template=tpl, model="m", backend="instant")
        drop_message(conv, f"message {i}")
    settings = load(
        home=home.root, env={}, config=None, overrides={"settle_seconds": 0, "log_level": "warning"}
    )
    rt = Runtime(settings=settings, home=home)
    counts: Counter[str] = Counter()

    def wrap(mod: Any, name: str, key: Callable[..., str | None]) -> None:
        real = getattr(mod, name)

        def counted(*a: Any, **kw: Any) -> Any:
            k = key(*a, **kw)
            if k:
                counts[k] += 1
            return real(*a, **kw)

        setattr(mod, name, counted)

    wrap(
        os,
        "replace",
        lambda src, dst, **_: "state writes" if str(dst).endswith("state.json") else None,
    )
    wrap(os, "fsync", lambda fd: "fsyncs")
    wrap(fcntl, "flock", lambda fd, op: "locks" if op & fcntl.LOCK_EX else None)
    wrap(
        os,
        "open",
        lambda path, *a, **kw: "log opens" if str(path).endswith("messages.log") else None,
    )
    asyncio.run(process_pending(rt))
    print(f"per turn ({args.convs} conversations x 1 message, durability = fsync):")
    for k, what in WHAT.items():
        print(f"  {k:<13} {counts[k] / args.convs:5.1f}   {what}")


if __name__ == "__main__":
    main()
