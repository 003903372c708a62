"""Pickup as a user runs it: the daemon as its own process with default settings,
the scripted Ollama-wire server in another process on loopback (TCP_NODELAY, like Go's
net/http), durability = fsync. Pickup = a message renamed into ``inbox/`` → its request
reaching the server (the server stamps it when the request's body has been read).

Run: .venv/bin/python bench/bench_pickup.py [--rounds 60]
     .venv/bin/python bench/bench_pickup.py --ab base=/tmp/base new=. none=.:none [--rounds 60]

``--ab`` compares daemons side by side in one run: each ``LABEL=TREE[:DURABILITY]`` is a
daemon run from that source tree (a worktree of another commit, or ``.``) with that
durability (fsync unless said), each with its own home and server, all started together;
the drops go round-robin (one to each, the order rotated every round), so a load that comes
and goes falls on all of them alike. Prints each one's pickup p50 / p99, the ratio of each
p50 to the first ``none`` daemon's, and the machine's load average before and after.

Prints, for folders made by ``contemplation new``'s code and for folders made by hand:
  one at a time     p50 / p99 over ``rounds`` drops (after one untimed warm-up turn, whose
                    figure is printed on its own: the first turn also looks up the model)
  ten at once       ten conversations dropped together, ``rounds // 6`` times: p50 / p99, and
                    the gap between consecutive requests, i.e. the daemon's work per turn at
                    the default concurrency of 1 against an instant server
Targets: one at a time p50 ≤ 5 ms, p99 ≤ 20 ms; ten at once p50 ≤ 15 ms (≤ 2 ms per turn).
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.turnbench import percentile  # noqa: E402
from contemplation.store.layout import Conv, Home  # noqa: E402
from contemplation.store.templates import load_template  # noqa: E402
from contemplation.writer import drop_message, new_conversation  # noqa: E402


class Server:
    """The fake Ollama in its own process."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fakes.ollama_server", "--port", "0", "--print-port"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

        self.http = httpx.Client(timeout=10)
        self.times: list[float] = []  # arrival of each /api/chat request, as the server saw it

    def chats(self) -> list[float]:
        """Only the new arrival times (a poll that carried every request body would load the
        server it measures)."""
        got = self.http.get(f"{self.url}/_chat_times?since={len(self.times)}").json()
        self.times.extend(got["times"])
        return self.times

    def wait_chats(self, n: int, timeout: float = 30) -> list[float]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.chats()
            if len(got) >= n:
                return list(got)
            time.sleep(0.002)
        raise SystemExit(f"only {len(self.chats())}/{n} requests reached the server")

    def stop(self) -> None:
        self.http.close()
        self.proc.terminate()
        self.proc.wait(10)


def folders(home: Home, n: int, *, by_hand: bool) -> list[Conv]:
    home.active.mkdir(parents=True, exist_ok=True)
    if by_hand:
        convs = [Conv(home.active / f"hand-{i:04d}") for i in range(n)]
        for c in convs:
            c.inbox.mkdir(parents=True)
        return convs
    tpl = load_template(home, "default")
    return [
        new_conversation(home, f"pickup {i}", template=tpl, model="llama3.2", backend="ollama")
        for i in range(n)
    ]


def start_daemon(
    home: Home, server: Server, tmp: Path, *, tree: Path = ROOT, durability: str = "fsync"
) -> subprocess.Popen[bytes]:
    """The daemon as its own process, its code from ``tree`` (``-m`` puts the working folder
    first on the path, ahead of the editable install)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEMPLATION_", "OLLAMA_"))}
    env.update(
        CONTEMPLATION_HOME=str(home.root),
        XDG_CONFIG_HOME=str(tmp / "xdg"),
        OLLAMA_HOST=server.url,
        CONTEMPLATION_DEFAULT_MODEL="llama3.2",
        CONTEMPLATION_DURABILITY=durability,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "contemplation", "run", "--no-dashboard"],
        env=env,
        cwd=tree,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not home.daemon_info.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("the daemon did not start")
        time.sleep(0.01)
    return proc


def settle(server: Server, n: int) -> None:
    """Let the replies finish before the next drop (a turn's tail is not pickup)."""
    server.wait_chats(n)
    time.sleep(0.03)


def run(by_hand: bool, rounds: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="contemplation-pickup-"))
    home = Home(tmp / "home")
    bursts = max(1, rounds // 6)
    convs = folders(home, 1 + rounds + 10 * bursts, by_hand=by_hand)
    server = Server()
    daemon = start_daemon(home, server, tmp)
    try:
        time.sleep(0.5)  # the start-up scan
        drop_message(convs[0], "warm-up")
        t0 = time.time()
        cold = (server.wait_chats(1)[0] - t0) * 1000
        settle(server, 1)
        one: list[float] = []
        for i, conv in enumerate(convs[1 : 1 + rounds]):
            drop_message(conv, "ping")
            t0 = time.time()
            one.append((server.wait_chats(2 + i)[-1] - t0) * 1000)
            settle(server, 2 + i)
        ten: list[float] = []
        gaps: list[float] = []
        seen = 1 + rounds
        for b in range(bursts):
            group = convs[1 + rounds + 10 * b : 1 + rounds + 10 * (b + 1)]
            drops = []
            for conv in group:
                drop_message(conv, "ping")
                drops.append(time.time())
            arrived = sorted(server.wait_chats(seen + 10)[seen:])
            seen += 10
            ten.extend((a - d) * 1000 for a, d in zip(arrived, sorted(drops), strict=True))
            gaps.extend((b2 - a2) * 1000 for a2, b2 in itertools.pairwise(arrived))
            settle(server, seen)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        server.stop()
    made = "by hand" if by_hand else "with new"
    print(f"folders made {made}:")
    print(f"  first turn (cold)            {cold:7.2f} ms")
    print(
        f"  one at a time  (n={len(one):3})     p50 {percentile(one, 0.5):6.2f} ms   "
        f"p99 {percentile(one, 0.99):6.2f} ms   (targets 5 / 20)"
    )
    print(
        f"  ten at once    (n={len(ten):3})     p50 {percentile(ten, 0.5):6.2f} ms   "
        f"p99 {percentile(ten, 0.99):6.2f} ms   (target p50 15)"
    )
    print(
        f"  daemon work per turn (gap between requests)  p50 {percentile(gaps, 0.5):5.2f} ms"
        "   (target 2)"
    )


class Variant:
    """One daemon of an ``--ab`` run: its code, durability, home, server and figures."""

    def __init__(self, spec: str, rounds: int) -> None:
        self.label, _, rest = spec.partition("=")
        tree, _, durability = rest.partition(":")
        self.tree = Path(tree or ".").resolve()
        self.durability = durability or "fsync"
        if not self.label or not (self.tree / "contemplation").is_dir():
            raise SystemExit(f"--ab {spec!r}: LABEL=TREE[:DURABILITY], TREE a source tree")
        self.tmp = Path(tempfile.mkdtemp(prefix=f"contemplation-pickup-{self.label}-"))
        self.home = Home(self.tmp / "home")
        self.convs = folders(self.home, 1 + rounds, by_hand=False)
        self.server = Server()
        self.daemon = start_daemon(
            self.home, self.server, self.tmp, tree=self.tree, durability=self.durability
        )
        self.times: list[float] = []

    def pickup(self, i: int) -> float:
        """Drop conversation ``i``'s message; ms until its request reached the server."""
        drop_message(self.convs[i], "ping")
        t0 = time.time()
        took = (self.server.wait_chats(1 + i)[-1] - t0) * 1000
        settle(self.server, 1 + i)
        return took

    def stop(self) -> None:
        self.daemon.send_signal(signal.SIGTERM)
        self.daemon.wait(30)
        self.server.stop()


def ab(specs: list[str], rounds: int) -> None:
    load0 = os.getloadavg()
    variants = [Variant(s, rounds) for s in specs]
    try:
        time.sleep(0.5)  # the start-up scans
        for v in variants:
            v.pickup(0)  # untimed: the first turn also looks up the model
        for i in range(1, 1 + rounds):
            k = i % len(variants)
            for v in variants[k:] + variants[:k]:
                v.times.append(v.pickup(i))
    finally:
        for v in variants:
            v.stop()
    load1 = os.getloadavg()
    none = next((v for v in variants if v.durability == "none"), None)
    print(
        f"pickup, one at a time, interleaved (n={rounds} each; {os.cpu_count()} cores, "
        f"load average {load0[0]:.2f} before, {load1[0]:.2f} after)"
    )
    for v in variants:
        p50, p99 = percentile(v.times, 0.5), percentile(v.times, 0.99)
        ratio = f"   {p50 / percentile(none.times, 0.5):4.2f}x none's p50" if none else ""
        print(
            f"  {v.label:10} {v.durability:5} {v.tree!s:28} p50 {p50:7.2f} ms   "
            f"p99 {p99:7.2f} ms{ratio}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--ab", nargs="+", metavar="LABEL=TREE[:DURABILITY]")
    args = ap.parse_args()
    if args.ab:
        ab(args.ab, args.rounds)
        return
    for by_hand in (False, True):
        run(by_hand, args.rounds)


if __name__ == "__main__":
    main()
