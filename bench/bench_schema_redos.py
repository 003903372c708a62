"""How long a hostile ``pattern`` takes to check: Python's jsonschema (``re``, what
structured.py used before the fix) against the reply check of now (jsonschema-rs with the
``regex`` crate, contemplation/protocol/replycheck.py), in this process and through the child
process
the daemon uses (its start-up included).

    .venv/bin/python bench/bench_schema_redos.py [--cap SECONDS]

The old engine runs in a child killed at ``--cap`` (default 30 s): the inputs that froze it
backtrack for minutes to hours, so shorter inputs show how the time doubles per character.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

from contemplation.protocol import replycheck

WORDS = "the quick brown fox jumps over the lazy dog again"
CASES = [
    ("^(a+)+$", "a" * 36 + "!", "36 a and !"),
    ("^(a+)+$", "a" * 22 + "!", "22 a and !"),
    ("^(a+)+$", "a" * 24 + "!", "24 a and !"),
    ("^(a+)+$", "a" * 26 + "!", "26 a and !"),
    (r"^(\w+\s?)*$", WORDS + "!", "10 words and !"),
    (r"^(\w+\s?)*$", " ".join(WORDS.split()[:5]) + "!", "5 words and !"),
    (r"^(\w+\s?)*$", " ".join(WORDS.split()[:6]) + "!", "6 words and !"),
    (r"^(\w+\s?)*$", " ".join(WORDS.split()[:7]) + "!", "7 words and !"),
]

OLD = """
import json, sys, time
from jsonschema import validators
schema, text = json.loads(sys.argv[1]), sys.argv[2]
v = validators.validator_for(schema)(schema)
t = time.perf_counter()
list(v.iter_errors(json.loads(text)))
print(time.perf_counter() - t)
"""


def old_engine(schema: dict[str, str], text: str, cap: float) -> str:
    try:
        out = subprocess.run(
            [sys.executable, "-c", OLD, json.dumps(schema), text],
            capture_output=True,
            text=True,
            timeout=cap,
            check=True,
        )
    except subprocess.TimeoutExpired:
        return f"> {cap:g} s (stopped)"
    return f"{float(out.stdout) * 1000:.1f} ms"


def new_engine(schema: dict[str, str], text: str) -> tuple[str, str]:
    t = time.perf_counter()
    why = replycheck.problem(text, schema)
    inproc = time.perf_counter() - t
    assert why is not None and "does not match" in why, why
    t = time.perf_counter()
    assert asyncio.run(replycheck.checked(text, schema)) == why
    child = time.perf_counter() - t
    return f"{inproc * 1000:.3f} ms", f"{child * 1000:.0f} ms"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cap", type=float, default=30.0)
    cap = ap.parse_args().cap
    print(f"{'pattern':14} {'reply':16} {'before (re)':>18} {'now':>10} {'now+child':>10}")
    for pattern, words, label in CASES:
        schema, text = {"type": "string", "pattern": pattern}, json.dumps(words)
        before = old_engine(schema, text, cap)
        now, child = new_engine(schema, text)
        print(f"{pattern:14} {label:16} {before:>18} {now:>10} {child:>10}", flush=True)


if __name__ == "__main__":
    main()
