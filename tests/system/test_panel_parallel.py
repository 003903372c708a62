"""A panel's seats answer in parallel where the server has slots for them.

The real llama-server (xllamacpp's build, SmolLM2) behind two aliases, a real daemon, the
real CLI. While the round runs, the server's own ``GET /slots`` is polled: with two slots
both seats' requests are in flight at once (the second seat's sent before the first seat's
reply was committed), yet each seat's block is whole and written once, one after the other;
with one slot they never overlap and nothing is asked ahead; a cancel mid-round discards the
held stream (its reply never appears and the server stops generating it); a daemon killed
while a seat is held answers each seat exactly once after its restart."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from contemplation.faces.reading import Reader
from contemplation.models import Status
from contemplation.store.layout import Home, read_state
from tests import peers, realpeers
from tests.conftest import DaemonProc, base_env, cli_here, wait_for

pytestmark = pytest.mark.real

HEADER = re.compile(r"^=== ([A-Z0-9_]+) -> ([A-Z0-9_]+) \[", re.MULTILINE)
QUESTION = "Name three colours."


def heads(log: str) -> list[str]:
    return [h for h, _ in HEADER.findall(log)]


def busy(server: realpeers.LlamaServer) -> int:
    """Slots the server is generating in now (its own ``/slots``)."""
    got = httpx.get(f"{server.url}/slots", timeout=10).json()
    assert isinstance(got, list) and got and all("is_processing" in s for s in got), got
    return sum(1 for s in got if s["is_processing"])


class Watch:
    """The most slots seen busy at once, polling ``/slots`` on a thread until stopped."""

    def __init__(self, server: realpeers.LlamaServer) -> None:
        self.server, self.most, self._stop = server, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                self.most = max(self.most, busy(self.server))
            self._stop.wait(0.02)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def config(server: realpeers.LlamaServer, tokens: int) -> str:
    out = f'[providers.box]\nkind = "openai"\nurl = "{server.url}/v1"\n'
    for i, seat in enumerate(("one", "two")):
        out += (
            f'\n[aliases.{seat}]\nmodel = "{server.alias}"\nproviders = ["box"]\n'
            f"options = {{ temperature = 0.7, seed = {i + 1}, num_predict = {tokens}, "
            "ignore_eos = true }\n"
        )
    return out


def serving(n_parallel: int) -> Iterator[realpeers.LlamaServer]:
    peers.xllamacpp_available()
    server = realpeers.LlamaServer(peers.smollm2_gguf(), n_ctx=2048, n_parallel=n_parallel).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def two_slots() -> Iterator[realpeers.LlamaServer]:
    yield from serving(2)


@pytest.fixture
def one_slot() -> Iterator[realpeers.LlamaServer]:
    yield from serving(1)


def start(
    home: Home,
    tmp_path: Path,
    server: realpeers.LlamaServer,
    daemon_factory: Callable[..., DaemonProc],
    tokens: int,
) -> tuple[dict[str, str], DaemonProc]:
    cfg = tmp_path / "config.toml"
    cfg.write_text(config(server, tokens))
    env = base_env(home, CONTEMPLATION_CONFIG=str(cfg), CONTEMPLATION_DASHBOARD_ENABLED="false")
    return env, daemon_factory(env, home).wait_ready(60)


def new_panel(env: dict[str, str], *args: str, timeout: int = 300) -> Any:
    return cli_here(
        env, "new", "Colours", "--model", "one", "--model", "two", "--message", QUESTION,
        *args, check=False,
    )  # fmt: skip


def conv_id(done: Any) -> str:
    found = re.search(r"\b(conv_[0-9]{8}-[0-9]{6}_[a-z0-9_-]+)", done.stderr + done.stdout)
    assert found is not None, done.stderr
    return found.group(1)


def whole_once(log: str) -> None:
    """The round's blocks: the question, then each seat's reply once, none empty."""
    assert heads(log) == ["CLAUDE", "ONE", "TWO"], log
    bodies = [b.split("===\n", 1)[-1].strip() for b in log.split("\n\n=== ")[1:]]
    assert all(bodies), log


def test_two_seats_on_a_two_slot_server_run_at_once_and_write_in_turn(
    home: Home,
    tmp_path: Path,
    two_slots: realpeers.LlamaServer,
    daemon_factory: Callable[..., DaemonProc],
) -> None:
    env, daemon = start(home, tmp_path, two_slots, daemon_factory, tokens=64)
    t0 = time.perf_counter()
    with Watch(two_slots) as watch:
        done = new_panel(env, "--wait", "--timeout", "240")
    took = time.perf_counter() - t0
    assert done.returncode in (0, 5), done.stderr  # 5: a reply stopped at its token cap
    cid = conv_id(done)
    log = Reader(home).locate(cid).log.read_text()
    whole_once(log)
    turns = json.loads(cli_here(env, "ledger", cid, "--json").stdout)["turns"]
    assert len(turns) == 2 and all(t["output"] == 64 for t in turns), turns
    daemon.stop()
    said = daemon.stderr()
    print(f"round {took:.2f} s; most slots busy at once: {watch.most}")
    # the second seat's request was in flight while the first seat's reply was: asked ahead,
    # and its held stream was the one its turn used (not asked a second time)
    assert watch.most == 2, said[-3000:]
    assert "prefetch_started" in said and "prefetch_used" in said, said[-3000:]
    assert "prefetch_not_used" not in said, said[-3000:]


def test_a_one_slot_server_runs_the_seats_one_after_another(
    home: Home,
    tmp_path: Path,
    one_slot: realpeers.LlamaServer,
    daemon_factory: Callable[..., DaemonProc],
) -> None:
    env, daemon = start(home, tmp_path, one_slot, daemon_factory, tokens=48)
    done = new_panel(env, "--wait", "--timeout", "240")
    assert done.returncode in (0, 5), done.stderr
    whole_once(Reader(home).locate(conv_id(done)).log.read_text())
    daemon.stop()
    said = daemon.stderr()
    assert "prefetch_no_slot" in said, said[-3000:]  # never queued behind the first seat
    assert "prefetch_started" not in said, said[-3000:]


def test_a_cancel_mid_round_discards_the_held_stream(
    home: Home,
    tmp_path: Path,
    two_slots: realpeers.LlamaServer,
    daemon_factory: Callable[..., DaemonProc],
) -> None:
    env, daemon = start(home, tmp_path, two_slots, daemon_factory, tokens=1500)
    done = new_panel(env, timeout=60)
    assert done.returncode == 0, done.stderr
    cid = conv_id(done)
    conv = Reader(home).locate(cid)
    wait_for(lambda: busy(two_slots) == 2, 120, interval=0.05, what="both seats generating")
    cli_here(env, "cancel", cid)
    wait_for(
        lambda: (s := read_state(conv)) is not None and s.status is Status.CANCELLED, 60,
        what="the round cancelled",
    )  # fmt: skip
    # the held stream's connection closed: the server stops generating the second seat's
    wait_for(lambda: busy(two_slots) == 0, 30, interval=0.1, what="no slot generating")
    log = conv.log.read_text()
    assert "CANCELLED" in log and "TWO" not in heads(log), log
    assert daemon.stop() == 0  # nothing left running holds the stop up
    assert "prefetch_discarded" in daemon.stderr()


def test_a_daemon_killed_while_a_seat_is_held_answers_each_seat_once(
    home: Home,
    tmp_path: Path,
    two_slots: realpeers.LlamaServer,
    daemon_factory: Callable[..., DaemonProc],
) -> None:
    env, daemon = start(home, tmp_path, two_slots, daemon_factory, tokens=200)
    done = new_panel(env, timeout=60)
    cid = conv_id(done)
    conv = Reader(home).locate(cid)
    wait_for(lambda: busy(two_slots) == 2, 120, interval=0.05, what="both seats generating")
    daemon.stop(signal.SIGKILL)  # the held events are lost with it: nothing was written
    wait_for(lambda: busy(two_slots) == 0, 60, interval=0.1, what="the server idle")
    assert "TWO" not in heads(conv.log.read_text())
    daemon_factory(env, home).wait_ready(60)
    cli_here(env, "wait", cid, "--timeout", "240", check=False)
    log = conv.log.read_text()
    got = [h for h in heads(log) if h != "CLAUDE"]
    assert got.count("TWO") == 1, log  # the held seat: asked again, written once
    assert got[-1] == "TWO" and set(got) == {"ONE", "TWO"}, log  # ONE's cut reply redone
