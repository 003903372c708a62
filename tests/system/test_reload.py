"""Configuration changes without a restart: SIGHUP (``contemplation service
reload``) re-reads the config; the next turn uses it, a bad file is refused and the old
settings kept, a conversation waiting out a backoff for the changed backend retries at once,
and ``doctor`` says when the running daemon's settings differ from the file. A real daemon
process, two scripted Ollama servers on loopback, the real CLI."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from contemplation import settings as settings_mod
from contemplation.config.reload import drift
from contemplation.faces import service
from contemplation.models import Status
from contemplation.store.layout import Conv, Home, read_state
from tests.conftest import DaemonProc, base_env, cli, cli_here, wait_for
from tests.fakes.ollama_server import FakeOllama, Step


def _config(path: Path, url: str, extra: str = "") -> None:
    path.write_text(f'[ollama]\nhost = "{url}"\n{extra}')


@dataclass
class Two:
    """Two scripted servers, a config that names the first, and the environment using it."""

    a: FakeOllama
    b: FakeOllama
    config: Path
    env: dict[str, str]


@pytest.fixture
def two(home: Home, tmp_path: Path) -> Iterator[Two]:
    a, b = FakeOllama().start(), FakeOllama().start()
    config = tmp_path / "config.toml"
    _config(config, a.url)
    env = base_env(
        home,
        CONTEMPLATION_CONFIG=str(config),
        CONTEMPLATION_RETRY__BASE="600",  # a long backoff: only a settings change cuts it short
        CONTEMPLATION_RETRY__CAP="600",
    )
    try:
        yield Two(a, b, config, env)
    finally:
        a.stop()
        b.stop()


def _retrying(home: Home, two: Two, topic: str) -> Conv:
    """A conversation waiting out a long backoff after the first server's 503."""
    two.a.enqueue(Step(kind="error", status=503, error="loading"))
    conv_id = cli_here(two.env, "new", topic, "--message", "hello").stdout.strip()
    conv = Conv(home.active / conv_id)
    wait_for(
        lambda: (st := read_state(conv)) is not None and st.status is Status.RETRYING,
        30,
        what="retrying",
    )
    return conv


def _reloaded(home: Home, config: Path, env: dict[str, str]) -> Callable[[], bool]:
    """The daemon runs what ``config`` (and ``env``) say: its info file's fingerprint matches."""

    def check() -> bool:
        s = settings_mod.load(env=env, config=config)
        return drift(home, s) is None

    return check


def test_reload_switches_the_backend_and_refuses_a_bad_file(
    home: Home, two: Two, daemon_factory: Callable[..., DaemonProc]
) -> None:
    a, b, config, env = two.a, two.b, two.config, two.env
    d = daemon_factory(env, home).wait_ready()
    a.enqueue(Step(text="from A"))
    first = cli_here(env, "new", "r", "--message", "one", "--wait", "--timeout", "30")
    conv_id = first.stderr.splitlines()[0]
    assert first.stdout.rstrip().endswith("from A")

    _config(config, b.url)  # changed on disk: doctor says the daemon runs other settings
    doctor = cli_here(env, "doctor", check=False).stdout
    assert "runs other settings than" in doctor and "contemplation service reload" in doctor
    said = cli_here(env, "service", "reload").stdout
    assert said.startswith("asked the daemon (pid ")
    wait_for(_reloaded(home, config, env), 10, what="the reload")
    assert "runs other settings" not in cli_here(env, "doctor", check=False).stdout
    b.enqueue(Step(text="from B"))
    second = cli_here(env, "send", conv_id, "two", "--wait", "--timeout", "30")
    assert second.stdout.rstrip().endswith("from B")
    assert len(a.chat_requests()) == 1 and len(b.chat_requests()) == 1

    config.write_text("[ollama\nhost = broken")  # not TOML: refused, B stays
    refused = cli_here(env, "service", "reload", check=False)
    assert refused.returncode == 1 and "cannot parse" in refused.stderr
    d.proc.send_signal(signal.SIGHUP)  # the daemon refuses it too, and goes on
    b.enqueue(Step(text="still B"))
    conv = Conv(home.active / conv_id)  # the CLI refuses the broken file: drop by hand
    (conv.inbox / "three.txt").write_text("three")
    wait_for(lambda: b"still B" in conv.log.read_bytes(), 30, what="the reply from B")
    assert len(a.chat_requests()) == 1
    assert d.stop() == 0
    log = d.stderr()
    assert log.count('"reload_refused"') == 1 and log.count('"reloaded"') == 1


def test_a_backoff_for_a_changed_backend_is_cut_short(
    home: Home, two: Two, daemon_factory: Callable[..., DaemonProc]
) -> None:
    d = daemon_factory(two.env, home).wait_ready()
    conv = _retrying(home, two, "backoff")
    state = read_state(conv)
    assert state is not None and state.next_retry_at is not None
    _config(two.config, two.b.url)
    two.b.enqueue(Step(text="back up"))
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: b"back up" in conv.log.read_bytes(), 15, what="the retry after reload")
    assert len(two.b.chat_requests()) == 1


def test_the_unit_reloads_with_sighup(home: Home) -> None:
    s = settings_mod.load(home=home.root, env={}, config=None)
    unit = service.render_systemd(service.context(s, env={}))
    assert "\nExecReload=/bin/kill -HUP $MAINPID\n" in unit


def test_a_turn_in_flight_finishes_through_a_reload(
    home: Home, two: Two, daemon_factory: Callable[..., DaemonProc]
) -> None:
    a, b, config, env = two.a, two.b, two.config, two.env
    d = daemon_factory(env, home).wait_ready()
    words = " ".join(f"w{i}" for i in range(40))
    a.enqueue(Step(text=words, chunk_delay=0.05))
    conv_id = cli_here(env, "new", "flight", "--message", "go").stdout.strip()
    conv = Conv(home.active / conv_id)
    wait_for(lambda: b"w3" in conv.log.read_bytes(), 30, what="the reply streaming")
    _config(config, b.url)
    d.proc.send_signal(signal.SIGHUP)
    wait_for(_reloaded(home, config, env), 10, what="the reload")
    wait_for(
        lambda: (st := read_state(conv)) is not None and st.status is Status.IDLE,
        30,
        what="the reply committed",
    )
    assert b"w39" in conv.log.read_bytes()
    assert a.aborted == 0 and "INTERRUPTED" not in conv.log.read_text()


def test_after_a_restart_a_backoff_is_kept_unless_the_backend_changed(
    home: Home, two: Two, daemon_factory: Callable[..., DaemonProc]
) -> None:
    """A restart with the same settings honours the backoff (a server's Retry-After too); a
    restart after the backend's settings were edited retries at once."""
    d = daemon_factory(two.env, home).wait_ready()
    conv = _retrying(home, two, "restart")
    assert d.stop() == 0
    run = cli(two.env, "run", "--once", check=False)  # the same settings: the backoff stands
    assert run.returncode == 1, run.stderr  # and run --once says the turn is left to retry
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"run --once: 1 conversation not done ({conv.id}: retrying: "), last
    assert len(two.a.chat_requests()) == 1 and b"back up" not in conv.log.read_bytes()
    _config(two.config, two.b.url)  # edited while stopped
    two.b.enqueue(Step(text="back up"))
    daemon_factory(two.env, home).wait_ready()
    wait_for(lambda: b"back up" in conv.log.read_bytes(), 15, what="the retry at start")
