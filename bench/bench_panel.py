"""What a panel of models costs, as a user runs it.
Run: .venv/bin/python bench/bench_panel.py [--rounds 3] [--parallel 1]
     .venv/bin/python bench/bench_panel.py --server ollama [--seat-seconds 3] [--rounds 3]

A real llama-server (xllamacpp's build, SmolLM2-135M, ``--parallel`` slots) and the daemon as
its own process, both started here; the CLI as a person types it:
``contemplation new T --model s1 [--model s2 …] --message Q --wait``. The seats are aliases
of the one server model with their own seeds, each reply exactly 64 tokens (ignore_eos). Prints the
round's wall time (median and max of ``--rounds``) for 1, 2 and 3 seats and its ratio to one
seat. With one slot the seats answer one after another (the ratio is about the number of
seats); with ``--parallel N`` the later seats are asked at once while the first streams
(their replies held in memory, written in turn), as far as the N slots allow.

``--server ollama``: the scripted Ollama (tests/fakes/ollama_server.py, in this process)
with the default ``concurrency = "auto"``, the seats three different models (gemma, llama3.2,
qwen3), each reply streamed over ``--seat-seconds``. The ratio of the 3-seat round to the
1-seat round is the round's cost over its slowest seat (every seat is as slow): Ollama runs
different models side by side by itself, so the seats go out together (at most 1.3x is the
mark; one after another it is about 3x). The most chat requests the server had at once is
printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contemplation.store.layout import Home  # noqa: E402
from tests import peers  # noqa: E402
from tests.conftest import DaemonProc  # noqa: E402
from tests.realpeers import LlamaServer  # noqa: E402

QUESTION = "In two sentences: why write a file to a temporary name and rename it?"
SEATS = ("s1", "s2", "s3")
OLLAMA_SEATS = ("gemma", "llama3.2", "qwen3")  # models the scripted Ollama lists
PIECES = 30  # pieces of each scripted reply


def config(url: str, alias: str) -> str:
    out = f'[providers.box]\nkind = "openai"\nurl = "{url}/v1"\n'
    for i, seat in enumerate(SEATS):
        out += (
            f'\n[aliases.{seat}]\nmodel = "{alias}"\nproviders = ["box"]\n'
            f"options = {{ temperature = 0.7, seed = {i + 1}, num_predict = 64, ignore_eos = true }}\n"
        )
    return out


def round_time(env: dict[str, str], seats: int, n: int, names: tuple[str, ...] = SEATS) -> float:
    models = [a for s in names[:seats] for a in ("--model", s)]
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "contemplation", "new", f"Bench {seats} {n}", *models,
         "--message", QUESTION, "--wait", "--timeout", "300"],
        env=env, capture_output=True, text=True, timeout=360, check=False,
    )  # fmt: skip
    took = time.perf_counter() - t0
    if done.returncode not in (0, 5):  # 5: a reply stopped at its cap
        raise SystemExit(f"round failed ({done.returncode}): {done.stderr}")
    return took


def bench_env(tmp: str, home: Home, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEMPLATION_", "OLLAMA_"))}
    env |= {"CONTEMPLATION_HOME": str(home.root), "CONTEMPLATION_DASHBOARD_ENABLED": "false",
            "XDG_CONFIG_HOME": tmp}  # fmt: skip
    return env | extra


def interleaved(env: dict[str, str], rounds: int, names: tuple[str, ...]) -> dict[int, list[float]]:
    round_time(env, 1, -1, names)  # warm: the daemon's first look at the server
    got: dict[int, list[float]] = {1: [], 2: [], 3: []}
    for n in range(rounds):  # interleaved: the machine's load drifts
        for seats, times in got.items():
            times.append(round_time(env, seats, n, names))
    return got


def table(got: dict[int, list[float]]) -> None:
    base = statistics.median(got[1])
    for seats, times in got.items():
        med = statistics.median(times)
        print(f"{seats} seat(s): round p50 {med:6.2f} s  max {max(times):6.2f} s  "
              f"ratio to one seat {med / base:4.2f}x")  # fmt: skip


def on_ollama(rounds: int, seat_seconds: float) -> None:
    """The scripted Ollama, concurrency auto: every reply streamed over ``seat_seconds``."""
    from tests.fakes.ollama_server import FakeOllama, Step

    fake = FakeOllama().start()
    words = " ".join(f"w{i}" for i in range(PIECES))
    fake.default_step = Step(text=words, chunks=PIECES, chunk_delay=seat_seconds / PIECES)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-panel-") as tmp:
            home = Home(Path(tmp) / "home")
            env = bench_env(tmp, home, OLLAMA_HOST=fake.url)
            daemon = DaemonProc(env, home).wait_ready(60)
            try:
                got = interleaved(env, rounds, OLLAMA_SEATS)
            finally:
                daemon.stop()
    finally:
        fake.stop()
    print(f"scripted Ollama, concurrency auto; rounds: {rounds}; each reply {seat_seconds:g} s")
    table(got)
    print(f"most chat requests at once at the server: {fake.max_active}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=1, help="the server's slots (llama-server)")
    ap.add_argument("--server", choices=("llama", "ollama"), default="llama")
    ap.add_argument("--seat-seconds", type=float, default=3.0, help="each reply (ollama)")
    args = ap.parse_args()
    if args.server == "ollama":
        on_ollama(args.rounds, args.seat_seconds)
        return
    peers.xllamacpp_available()
    server = LlamaServer(peers.smollm2_gguf(), n_ctx=2048 * args.parallel,
                         n_parallel=args.parallel).start()  # fmt: skip
    try:
        with tempfile.TemporaryDirectory(prefix="bench-panel-") as tmp:
            home = Home(Path(tmp) / "home")
            cfg = Path(tmp) / "config.toml"
            cfg.write_text(config(server.url, server.alias))
            env = bench_env(tmp, home, CONTEMPLATION_CONFIG=str(cfg))
            daemon = DaemonProc(env, home).wait_ready(60)
            try:  # the first round warms: the model loaded, the template's prefix cached
                got = interleaved(env, args.rounds, SEATS)
            finally:
                daemon.stop()
            said = daemon.stderr()
    finally:
        server.stop()
    ahead = {w: said.count(f'"prefetch_{w}"') for w in ("used", "not_used", "dropped", "no_slot")}
    used = [json.loads(line) for line in said.splitlines() if '"prefetch_used"' in line]
    print(f"llama-server slots: {args.parallel}; rounds: {args.rounds}; replies of 64 tokens")
    table(got)
    print("seats asked ahead: " + ", ".join(f"{k} {v}" for k, v in ahead.items()))
    if used:  # how much of a later seat's reply was in memory when its turn took it
        held = sorted(u["held"] for u in used)
        print(f"events held when taken: p50 {statistics.median(held)} min {held[0]} "
              f"max {held[-1]}; whole replies held {sum(u['ended'] for u in used)}/{len(used)}")  # fmt: skip


if __name__ == "__main__":
    main()
