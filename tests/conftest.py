"""Shared fixtures: real folders, a real fake-Ollama HTTP server, the real CLI and daemon processes.

Every test, and every process it starts, sees a private empty HOME and none of the person's
settings (tests/hermetic.py); every daemon and server runs in a process group of its own and
is stopped however pytest ends, SIGTERM included (tests/procgroups.py)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

from contemplation import settings as settings_mod
from contemplation.base import acting
from contemplation.engine.pipeline import Runtime, process_pending
from contemplation.models import BlockKind
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, list_conversations
from tests import hermetic, procgroups
from tests.fakes.ollama_server import FakeOllama

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
T = TypeVar("T")


async def within(aw: Awaitable[T], what: str, seconds: float = 5.0) -> T:
    """``await aw``, failing the test after ``seconds``. A task is never cancelled by the
    timeout (that would be a cancel the code under test might handle, and then pass)."""
    fut = asyncio.ensure_future(aw)
    done, _ = await asyncio.wait({fut}, timeout=seconds)
    if not done:
        if fut is not aw:
            fut.cancel()
        raise AssertionError(f"timed out after {seconds} s waiting for {what}")
    return fut.result()


async def poll(pred: Callable[[], bool], what: str, seconds: float = 5.0) -> None:
    """For states no event announces (a turn queued in the scheduler, a reply's first bytes
    in the log): a bounded poll, never a sleep that hopes the state has come."""
    deadline = time.monotonic() + seconds
    while not pred():  # nothing to wait on: the code under test sets no event here
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        await asyncio.sleep(0.005)


def runtime_for(settings: Settings) -> Runtime:
    """The services a step uses, for these settings and their home."""
    return Runtime(settings=settings, home=Home(settings.home))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", help="also run the long variants")
    parser.addoption(
        "--budget",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="fail the run when it takes longer (the default tier's budget; not with --slow)",
    )


# the run's own folder (each test's private HOME is made in it) and what undoes its environment
_RUN = pytest.StashKey[tuple[Path, pytest.MonkeyPatch]]()
_STARTED = pytest.StashKey[float]()  # time.monotonic() when the session started


def over_budget(seconds: float, budget: float) -> str | None:
    """What to say when a run of ``seconds`` passed a ``budget`` of seconds (none: 0), else
    None."""
    if budget <= 0 or seconds <= budget:
        return None
    return (
        f"the tests took {seconds / 60:.1f} min, over their budget of {budget / 60:.1f} min: "
        "see the slowest tests above; a long variant belongs in --slow (docs/internals/testing.md)"
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_STARTED] = time.monotonic()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The default tier over its budget (``--budget``) fails the run, however it went."""
    config = session.config
    if config.getoption("--slow") or _STARTED not in config.stash:
        return
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller judges the run
        return
    said = over_budget(time.monotonic() - config.stash[_STARTED], config.getoption("--budget"))
    if said is None:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", "over budget", red=True)
        reporter.write_line(said)
    else:
        print(said, file=sys.stderr)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    """Before collection and before any fixture, session-scoped ones included: the hermetic
    environment (tests/hermetic.py), and SIGTERM ends the run as Ctrl-C does
    (tests/procgroups.py)."""
    base = Path(tempfile.mkdtemp(prefix="contemplation-tests-"))
    (base / "run").mkdir()
    env = pytest.MonkeyPatch()
    hermetic.isolate(env, base / "run")
    # llama.cpp (xllamacpp's build: OpenMP) makes its threads wait for each other in barriers
    # that spin by default. Beside the other worker's processes the embedded model's threads
    # starved each other: tests/system/test_backend_local.py took 46 s in two workers, 15 s
    # with the waits passive. Read when the library loads: set here, before any test loads it,
    # and inherited by every llama-server the tests start.
    env.setenv("OMP_WAIT_POLICY", "passive")
    config.stash[_RUN] = (base, env)
    procgroups.stop_on_sigterm()


def pytest_unconfigure(config: pytest.Config) -> None:
    procgroups.kill_all()
    base, env = config.stash[_RUN]
    env.undo()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(autouse=True)
def _hermetic(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with a private HOME of its own that holds nothing, and none of the
    person's settings, and so does every process it starts (they inherit ``os.environ``)."""
    base, _ = request.config.stash[_RUN]
    hermetic.isolate(monkeypatch, Path(tempfile.mkdtemp(prefix="test-", dir=base)))
    # who runs the CLI in-process is read from this process's environment alone, never from
    # the machine's own process tree above pytest (contemplation.base.acting)
    monkeypatch.setattr(acting, "parents", lambda pid=None: iter(()))
    procgroups.stop_on_sigterm()
    yield
    procgroups.stop_on_sigterm()  # the daemon run in-process left SIGTERM at its default


@pytest.fixture(autouse=True)
def _logging_as_found() -> Iterator[None]:
    """A command run in this process (click's CliRunner) sets up the logs for its own
    streams: structlog's, and the standard library's root handlers. Put back after each
    test, so a later test's log lines reach its own capture, not an earlier test's."""
    import logging

    import structlog

    saved, root = structlog.get_config(), logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="long variant: run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def wait_for(
    pred: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01, what: str = ""
) -> Any:
    """Poll until ``pred()`` is truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or pred}")
        time.sleep(interval)


@pytest.fixture
def fake_ollama() -> Iterator[FakeOllama]:
    fake = FakeOllama().start()
    yield fake
    fake.stop()


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home(tmp_path / "home")


def base_env(home: Home, fake: FakeOllama | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEMPLATION_", "OLLAMA_"))}
    env.update(
        CONTEMPLATION_HOME=str(home.root),
        XDG_CONFIG_HOME=str(home.root.parent / "xdg-config"),
        CONTEMPLATION_SETTLE_SECONDS="0.2",
        CONTEMPLATION_LOG_FORMAT="json",
        CONTEMPLATION_RETRY__BASE="0.05",
        CONTEMPLATION_RETRY__CAP="0.2",
        CONTEMPLATION_DASHBOARD_PORT="0",
        # the scripted fakes stream filler ("word word word …") that is itself a loop: the
        # loop stop is on in the tests that show it (tests/system/test_reply_cut.py)
        CONTEMPLATION_STOP_REPEATING="false",
        PYTHONUNBUFFERED="1",
    )
    if fake is not None:
        env["OLLAMA_HOST"] = fake.url
    env.update(extra)
    return env


@pytest.fixture
def make_settings(home: Home) -> Callable[..., Settings]:
    def make(fake: FakeOllama | None = None, **overrides: Any) -> Settings:
        env = {"OLLAMA_HOST": fake.url} if fake else {}
        base: dict[str, Any] = {"settle_seconds": 0, "retry": {"base": 0.01, "cap": 0.05}}
        base["stop_repeating"] = False  # filler of the scripted fakes (see base_env)
        base.update(overrides)
        return settings_mod.load(home=home.root, env=env, overrides=base, config=None)

    return make


def run_burst(rt: Runtime) -> dict[str, float | None]:
    """One ``process_pending`` burst in a fresh event loop (backends are closed after it)."""

    async def burst() -> dict[str, float | None]:
        try:
            return await process_pending(rt)
        finally:
            await rt.aclose()

    return asyncio.run(burst())


def cli(
    env: dict[str, str],
    *args: str,
    input: str | None = None,
    timeout: float = 60,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "contemplation", *args],
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"contemplation {' '.join(args)} failed ({proc.returncode}): {proc.stderr}"
        )
    return proc


# what only a process of its own shows: the daemon, the MCP server on stdio
IN_PROCESS_REFUSED = {"run", "mcp"}


def cli_here(
    env: dict[str, str], *args: str, input: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """:func:`cli` in this process (click's CliRunner), ``env`` as its whole environment: for a
    test of a command's words and files (~7 ms, where a new interpreter costs ~0.65 s of
    CPU). Not for what the process itself shows (signals, a crash point's kill, exit codes
    of a dying process, ``-P``, stdout purity, the daemon, the MCP server): :func:`cli`."""
    from click.testing import CliRunner, Result

    from contemplation.faces.cli.root import main

    assert args and args[0] not in IN_PROCESS_REFUSED, f"{args[:1]}: a process of its own (cli)"
    assert "CONTEMPLATION_TESTING" not in env, "crash points are read at start: use cli"
    whole: dict[str, str | None] = {k: None for k in os.environ if k not in env}
    whole.update(env)
    # what every command sets for its process (the umask, the log's stream) is put back: the
    # test process is not the command's, and the tests after this one run in it
    import structlog

    log = structlog.get_config()
    umask = os.umask(0o077)
    os.umask(umask)

    def invoke() -> Result:
        return CliRunner().invoke(
            main, list(args), input=input, env=whole, prog_name="contemplation"
        )

    try:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # none: the usual case
            got = invoke()
        else:  # a test with a loop running in its thread (Playwright's sync API): a command
            # that runs its own (asyncio.run) would fail here, and a process would not
            with ThreadPoolExecutor(1) as pool:
                got = pool.submit(invoke).result()
    finally:
        os.umask(umask)
        structlog.configure(**log)
    err = got.stderr
    if got.exception is not None and not isinstance(got.exception, SystemExit):
        import traceback

        err += "".join(traceback.format_exception(got.exception))
    done = subprocess.CompletedProcess(["contemplation", *args], got.exit_code, got.stdout, err)
    if check and done.returncode != 0:
        raise AssertionError(f"contemplation {' '.join(args)} failed ({done.returncode}): {err}")
    return done


class DaemonProc:
    def __init__(self, env: dict[str, str], home: Home, *args: str) -> None:
        self.env = env
        self.home = home
        self.proc = procgroups.popen(
            [sys.executable, "-m", "contemplation", "run", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )

    def wait_ready(self, timeout: float = 15) -> DaemonProc:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"daemon exited early: {self.proc.stderr.read() if self.proc.stderr else ''}"
                )
            return self.home.daemon_info.exists()

        wait_for(ready, timeout, what="daemon start")
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            procgroups.kill(self.proc)

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.stderr else ""


@pytest.fixture
def daemon_factory() -> Iterator[Callable[..., DaemonProc]]:
    procs: list[DaemonProc] = []

    def start(env: dict[str, str], home: Home, *args: str) -> DaemonProc:
        d = DaemonProc(env, home, *args)
        procs.append(d)
        return d

    yield start
    for d in procs:
        procgroups.kill(d.proc)


def only_conv(home: Home) -> Conv:
    convs = list_conversations(home, include_completed=True)
    assert len(convs) == 1, convs
    return convs[0]


def model_replies(conv: Conv) -> list[str]:
    """The text of each model block that was not cut (none when there is no log yet)."""
    try:
        data = conv.log.read_bytes()
    except FileNotFoundError:
        return []
    return [b.text for b in parse(data).blocks if b.kind is BlockKind.MODEL and not b.interrupted]


def state_of(conv: Conv) -> dict[str, Any]:
    state: dict[str, Any] = json.loads(conv.state.read_text())
    return state
