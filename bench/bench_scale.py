"""Scale as a user runs it: N conversations × 1 message, the daemon as its own process
with default settings, a scripted Ollama-wire server in another process on loopback.

Run: .venv/bin/python bench/bench_scale.py [--convs 2000] [--hand]

Prints: time until every conversation is answered (and turns/s), the daemon's peak and final
RSS, its CPU use while idle afterwards, the bytes it wrote to stderr, and inotify overflows.
``--hand`` makes the folders by hand (only ``inbox/<file>``, no metadata/state) instead of
with ``contemplation new``'s code.
Targets (2,000 conversations): all answered, RSS ≤ 150 MB, idle CPU < 2 %, stderr < 1 MB.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contemplation.store.layout import Home  # noqa: E402
from contemplation.store.templates import load_template  # noqa: E402
from contemplation.writer import drop_message, new_conversation  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _answered(home: Home) -> int:
    n = 0
    for d in home.active.iterdir():
        try:
            if b"=== OLLAMA -> CLAUDE" in (d / "messages.log").read_bytes():
                n += 1
        except OSError:
            continue
    return n


def make_folders(home: Home, n: int, *, by_hand: bool) -> None:
    home.active.mkdir(parents=True, exist_ok=True)
    if by_hand:
        for i in range(n):
            inbox = home.active / f"hand-{i:05d}" / "inbox"
            inbox.mkdir(parents=True)
            (inbox / "q.txt").write_text(f"question {i}\n")
        return
    tpl = load_template(home, "default")
    for i in range(n):
        conv = new_conversation(
            home, f"scale {i}", template=tpl, model="llama3.2", backend="ollama", durable=False
        )
        drop_message(conv, f"question {i}")


def once(n: int, home: Home, env: dict[str, str], err_path: Path) -> None:
    """`run --once` as its own process: wall time from its start (Python start-up, the scan
    and every turn) to its exit. Files written in place are taken once they have settled
    (settle_seconds, 1 s): that is waited out first, so the figure is the daemon's work."""
    time.sleep(1.1)
    with err_path.open("wb") as err:
        t0 = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "contemplation", "run", "--once"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
            check=True,
            timeout=900,
        )
        took = time.monotonic() - t0
    done = _answered(home)
    print(f"run --once          {done}/{n} answered in {took:.2f} s ({done / took:.0f} turns/s)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--convs", type=int, default=2000)
    ap.add_argument("--hand", action="store_true", help="folders made by hand")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measured")
    ap.add_argument(
        "--once", action="store_true", help="`run --once` (answer what is due, then exit)"
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="contemplation-scale-"))
    home = Home(tmp / "home")
    print(f"making {args.convs} conversations ({'by hand' if args.hand else 'with new'}) …")
    make_folders(home, args.convs, by_hand=args.hand)
    fake = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.ollama_server", "--port", "0", "--print-port"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert fake.stdout is not None
    port = int(fake.stdout.readline())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEMPLATION_", "OLLAMA_"))}
    env.update(
        CONTEMPLATION_HOME=str(home.root),
        XDG_CONFIG_HOME=str(tmp / "xdg"),
        OLLAMA_HOST=f"http://127.0.0.1:{port}",
        CONTEMPLATION_DEFAULT_MODEL="llama3.2",
        CONTEMPLATION_DASHBOARD_ENABLED="false",
    )
    err_path = tmp / "daemon.stderr"
    if args.once:
        once(args.convs, home, env, err_path)
        fake.terminate()
        fake.wait(10)
        return
    with err_path.open("wb") as err:
        t0 = time.monotonic()
        daemon = subprocess.Popen(
            [sys.executable, "-m", "contemplation", "run"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            done, deadline = 0, t0 + 900
            while done < args.convs and time.monotonic() < deadline:
                if daemon.poll() is not None:
                    raise SystemExit(f"the daemon exited ({daemon.returncode})")
                time.sleep(0.5)
                done = _answered(home)
            took = time.monotonic() - t0
            time.sleep(2)  # let the last state writes and pokes settle
            cpu0, w0 = _cpu_s(daemon.pid), time.monotonic()
            time.sleep(args.idle)
            idle = (_cpu_s(daemon.pid) - cpu0) / (time.monotonic() - w0) * 100
            peak = _status_kb(daemon.pid, "VmHWM") / 1024
            rss = _status_kb(daemon.pid, "VmRSS") / 1024
        finally:
            daemon.terminate()
            daemon.wait(60)
            fake.terminate()
            fake.wait(10)
    stderr = err_path.read_bytes()
    overflows = stderr.count(b"events_lost")
    print(f"answered            {done}/{args.convs} in {took:.1f} s ({done / took:.0f} turns/s)")
    print(f"daemon RSS          peak {peak:.0f} MB, after {rss:.0f} MB   (target ≤ 150 MB)")
    print(f"idle CPU            {idle:.2f} % over {args.idle:.0f} s   (target < 2 %)")
    print(f"stderr              {len(stderr) / 1e6:.2f} MB   (target < 1 MB)")
    print(f"events lost (inotify overflows, each one rescan)   {overflows}")


if __name__ == "__main__":
    main()
