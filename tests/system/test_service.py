"""The daemon as a service: the unit and the plist as the real validators see them, install and
uninstall against recording fake systemctl/launchctl, sd_notify on a real datagram socket from a
real daemon, and graceful shutdown on SIGTERM."""

from __future__ import annotations

import getpass
import json
import os
import plistlib
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contemplation import settings as settings_mod
from contemplation.faces import service
from contemplation.models import BlockKind, MarkerKind
from contemplation.protocol.parser import parse
from contemplation.store.layout import Conv, Home
from tests import peers
from tests.conftest import DaemonProc, base_env, cli_here, only_conv, wait_for
from tests.fakes.ollama_server import FakeOllama, Step

# --------------------------------------------------------------------------- the files

STOP_GRACE = settings_mod.Settings().stop_grace  # the default the unit timeouts must exceed
GRACE = 2.0  # what the shutdown tests run with (CONTEMPLATION_STOP_GRACE)


def render_unit(tmp_path: Path, home: Path) -> Path:
    settings = settings_mod.load(home=home, env={}, config=None)
    unit = tmp_path / "units" / "contemplation.service"
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(service.render_systemd(service.context(settings, env={})))
    return unit


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    exe = peers.executable("systemd-analyze")
    # A short runtime folder of its own: systemd refuses socket paths past 108 bytes, and a
    # pytest-xdist worker's tmp_path is long enough to pass that ("File name too long").
    with tempfile.TemporaryDirectory(prefix="xr", dir="/tmp") as runtime:
        env = dict(os.environ, XDG_RUNTIME_DIR=runtime)
        return subprocess.run(
            [str(exe), "--user", "verify", "--man=no", str(unit)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )


@pytest.mark.parametrize("home_name", ["home", "my home 100%$x"])
def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path, home_name: str) -> None:
    home = tmp_path / home_name
    home.mkdir()
    unit = render_unit(tmp_path, home)
    proc = verify(unit)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    text = unit.read_text()
    lines = dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")
    )
    assert lines["Type"] == "notify" and lines["Restart"] == "on-failure"
    assert lines["WantedBy"] == "default.target" and "User" not in lines
    assert int(lines["TimeoutStopSec"]) > STOP_GRACE + 10
    exec_start = lines["ExecStart"]
    assert exec_start.startswith("/") and " -m contemplation --home " in exec_start
    assert exec_start.endswith(" run")
    if " " in home_name:  # quoted and escaped for systemd, and the path survives verify
        assert '"' in exec_start and "%%" in exec_start and "$$" in exec_start
    # the check can fail: a misspelt value is reported on stderr (with exit code 0)
    unit.write_text(text.replace("Type=notify", "Type=notifyy"))
    bad = verify(unit)
    assert bad.stderr != ""


def test_launchd_plist_parses_and_has_every_required_key(tmp_path: Path) -> None:
    home = tmp_path / "a & b <home>"
    settings = settings_mod.load(home=home, env={}, config=None)
    data = plistlib.loads(service.render_launchd(service.context(settings, env={})))
    assert data["Label"] == "com.contemplation.daemon"
    args = data["ProgramArguments"]
    assert all(isinstance(a, str) for a in args) and Path(args[0]).is_absolute()
    assert args[1:] == ["-P", "-m", "contemplation", "--home", str(home.absolute()), "run"]
    assert data["RunAtLoad"] is True
    assert data["KeepAlive"] == {"SuccessfulExit": False}
    assert isinstance(data["ThrottleInterval"], int) and data["ThrottleInterval"] >= 5
    assert isinstance(data["ExitTimeOut"], int) and data["ExitTimeOut"] > STOP_GRACE + 10
    env = data["EnvironmentVariables"]
    assert env["PATH"].startswith(str(Path(args[0]).parent) + ":")
    assert "OLLAMA_HOST" not in env  # none in the shell: the daemon's default, unwritten
    for key in ("StandardOutPath", "StandardErrorPath", "WorkingDirectory"):
        assert Path(data[key]).is_absolute(), key
    assert data["ProcessType"] == "Standard"


# --------------------------------------------------------------------------- install / uninstall

FAKE = """#!/bin/sh
# records its arguments (one JSON array a line); launchctl keeps a "loaded" flag file
python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$FAKE_LOG"
name=$(basename "$0")
if [ "$name" = launchctl ]; then
  case "$1" in
    print) [ -f "$FAKE_STATE" ] || exit 113 ;;
    bootstrap) touch "$FAKE_STATE" ;;
    bootout) rm -f "$FAKE_STATE" ;;
  esac
fi
exit 0
"""


@pytest.fixture
def fake_managers(tmp_path: Path, home: Home) -> Iterator[tuple[dict[str, str], Path]]:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    for name in ("systemctl", "launchctl", "journalctl"):
        p = bin_dir / name
        p.write_text(FAKE)
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "calls.jsonl"
    user_home = tmp_path / "user"
    user_home.mkdir()
    env = base_env(home)
    env.update(
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        HOME=str(user_home),
        XDG_CONFIG_HOME=str(user_home / ".config"),
        FAKE_LOG=str(log),
        FAKE_STATE=str(tmp_path / "loaded"),
    )
    yield env, log


def calls(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    out = [json.loads(line) for line in log.read_text().splitlines()]
    log.unlink()
    return out


def test_systemd_install_is_idempotent_and_uninstall_keeps_conversations(
    home: Home, fake_managers: tuple[dict[str, str], Path]
) -> None:
    env, log = fake_managers
    conv_id = cli_here(env, "new", "keep me", "--message", "hello").stdout.strip()
    before = sorted(p.name for p in (home.active / conv_id).rglob("*"))
    unit = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user" / "contemplation.service"
    dry = cli_here(env, "service", "install", "--manager", "systemd", "--print").stdout
    assert "ExecStart=" in dry and "systemctl --user enable --now contemplation.service" in dry
    assert not unit.exists() and calls(log) == []  # --print changes nothing
    out = cli_here(env, "service", "install", "--manager", "systemd").stdout
    assert unit.is_file() and f"--home {home.root}" in unit.read_text()
    assert calls(log) == [
        ["--user", "show-environment"],  # first: is there a user manager to install into?
        ["--user", "daemon-reload"],
        ["--user", "enable", "--now", "contemplation.service"],
    ]
    assert "enable-linger" in out or "linger" not in out
    cli_here(env, "service", "install", "--manager", "systemd")  # again: same file, same calls
    assert calls(log) == [
        ["--user", "show-environment"],
        ["--user", "daemon-reload"],
        ["--user", "enable", "--now", "contemplation.service"],
    ]
    env2 = dict(env, OLLAMA_HOST="http://10.0.0.5:11434")  # the unit changes: restart it
    cli_here(env2, "service", "install", "--manager", "systemd")
    assert ["--user", "try-restart", "contemplation.service"] in calls(log)
    assert "OLLAMA_HOST=http://10.0.0.5:11434" in unit.read_text()
    cli_here(env, "service", "logs", "--manager", "systemd", "-n", "5")
    assert calls(log) == [["--user", "-u", "contemplation.service", "--no-pager", "-n", "5"]]
    cli_here(env, "service", "uninstall", "--manager", "systemd")
    assert not unit.exists()
    assert calls(log) == [
        ["--user", "disable", "--now", "contemplation.service"],
        ["--user", "daemon-reload"],
    ]
    assert sorted(p.name for p in (home.active / conv_id).rglob("*")) == before
    again = cli_here(env, "service", "uninstall", "--manager", "systemd").stdout
    assert "not installed" in again and calls(log) == []


def test_launchd_install_bootstraps_once_and_bootout_on_uninstall(
    home: Home, fake_managers: tuple[dict[str, str], Path]
) -> None:
    env, log = fake_managers
    uid = str(os.getuid())
    plist = Path(env["HOME"]) / "Library" / "LaunchAgents" / "com.contemplation.daemon.plist"
    target = f"gui/{uid}/com.contemplation.daemon"
    dry = cli_here(env, "service", "install", "--manager", "launchd", "--print").stdout
    assert "<key>KeepAlive</key>" in dry and f"launchctl bootstrap gui/{uid}" in dry
    assert not plist.exists() and calls(log) == []
    cli_here(env, "service", "install", "--manager", "launchd")
    assert plistlib.loads(plist.read_bytes())["Label"] == "com.contemplation.daemon"
    assert (Path(env["HOME"]) / "Library" / "Logs" / "contemplation").is_dir()
    assert calls(log) == [
        ["print", target],
        ["bootstrap", f"gui/{uid}", str(plist)],
        ["enable", target],
    ]
    cli_here(env, "service", "install", "--manager", "launchd")  # loaded, unchanged: no reload
    assert calls(log) == [["print", target], ["enable", target]]
    env2 = dict(env, OLLAMA_HOST="http://10.0.0.5:11434")
    cli_here(env2, "service", "install", "--manager", "launchd")  # changed: bootout, then bootstrap
    seen = calls(log)
    assert seen[:2] == [["print", target], ["bootout", target]]
    assert ["bootstrap", f"gui/{uid}", str(plist)] in seen
    cli_here(env, "service", "uninstall", "--manager", "launchd")
    assert calls(log) == [["print", target], ["bootout", target]]
    assert not plist.exists()


SHOW = """#!/bin/sh
# systemctl: `show` answers in its own key=value lines, as an installed, running unit
python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$FAKE_LOG"
if [ "$2" = show ]; then
  printf 'LoadState=loaded\nActiveState=active\nSubState=running\nMainPID=4242\n'
fi
exit 0
"""


def test_service_status_json_says_what_the_manager_says(
    home: Home, fake_managers: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    """The shell guide says every read command takes --json; service status did not."""
    env, log = fake_managers
    systemctl = tmp_path / "fakebin" / "systemctl"
    systemctl.write_text(SHOW)
    unit = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user" / "contemplation.service"
    before = json.loads(cli_here(env, "service", "status", "--manager", "systemd", "--json").stdout)
    assert before["installed"] is False and before["unit_file"] == str(unit)
    cli_here(env, "service", "install", "--manager", "systemd")
    calls(log)
    got = json.loads(cli_here(env, "service", "status", "--manager", "systemd", "--json").stdout)
    assert got == {
        "manager": "systemd",
        "unit_file": str(unit),
        "installed": True,
        "loaded": True,
        "active": True,
        "state": "running",
        "pid": 4242,
        "daemon_running": False,  # the home's own word: no daemon answers for this home
    }
    [argv] = calls(log)
    assert argv[:3] == ["--user", "show", "contemplation.service"]
    uid = str(os.getuid())
    launchd = json.loads(
        cli_here(env, "service", "status", "--manager", "launchd", "--json").stdout
    )
    assert launchd["manager"] == "launchd" and not launchd["installed"] and not launchd["loaded"]
    assert calls(log) == [["print", f"gui/{uid}/com.contemplation.daemon"]]


NO_BUS = """#!/bin/sh
# systemctl in a shell with no systemd user session (ssh, su, a container): no user bus
python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$FAKE_LOG"
echo "Failed to connect to bus: No medium found" >&2
exit 1
"""

ENABLE_FAILS = """#!/bin/sh
# systemctl with a user manager that refuses to enable the unit
python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$FAKE_LOG"
if [ "$2" = enable ]; then
  echo "Failed to enable unit: Unit file contemplation.service is masked." >&2
  exit 1
fi
exit 0
"""

SECRET_ENV = {"OPENAI_API_KEY": "sk-no-bus-0123456789", "CONTEMPLATION_MAX_TURNS": "7"}


def _unit_and_secrets(env: dict[str, str]) -> tuple[Path, Path]:
    config = Path(env["XDG_CONFIG_HOME"])
    return config / "systemd" / "user" / "contemplation.service", (
        config / "contemplation" / "service.env"
    )


def test_install_with_no_systemd_user_session_says_why_in_one_line_and_writes_nothing(
    home: Home, fake_managers: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    """With no user bus (an ssh or su shell, a container) install ended with
    systemctl's raw "Failed to connect to bus" and left the unit and service.env behind. The
    user manager is asked first; without one: exit 1, one line saying why and what to do,
    and nothing written (a unit installed before stays as it was)."""
    env, log = fake_managers
    env.update(SECRET_ENV)
    (tmp_path / "fakebin" / "systemctl").write_text(NO_BUS)
    unit, secrets = _unit_and_secrets(env)
    got = cli_here(env, "service", "install", "--manager", "systemd", check=False)
    assert got.returncode == 1, got
    [line] = got.stderr.splitlines()
    assert line.startswith("error: cannot install the service: there is no systemd user session")
    assert "(Failed to connect to bus: No medium found)" in line
    user = getpass.getuser()
    assert f"loginctl enable-linger {user}" in line and "`contemplation run`" in line
    assert "Nothing was written" in line
    assert not unit.exists() and not secrets.exists()
    assert not unit.parent.exists()  # not even the folders
    assert calls(log) == [["--user", "show-environment"]]
    # installed before, from a session; now from one without: left exactly as it was
    unit.parent.mkdir(parents=True)
    unit.write_text("# installed before\n")
    got = cli_here(
        dict(env, OLLAMA_HOST="http://10.0.0.5:11434"), "service", "install", check=False
    )
    assert got.returncode == 1 and unit.read_text() == "# installed before\n"
    assert not secrets.exists()


def test_install_with_the_real_systemctl_and_no_user_session_writes_nothing(
    home: Home, fake_managers: tuple[dict[str, str], Path]
) -> None:
    """The real systemctl, in a shell with neither XDG_RUNTIME_DIR nor a session bus (as
    `su` or a container gives): the same one line, nothing written, nothing enabled."""
    real = shutil.which("systemctl")
    if real is None:
        pytest.skip("no systemctl on this machine")
    env, _ = fake_managers
    env.update(SECRET_ENV)
    env["PATH"] = f"{Path(real).parent}:{os.environ['PATH']}"
    for name in ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS"):
        env.pop(name, None)
    unit, secrets = _unit_and_secrets(env)
    got = cli_here(env, "service", "install", "--manager", "systemd", check=False)
    assert got.returncode == 1, got
    [line] = got.stderr.splitlines()
    assert "there is no systemd user session" in line and "enable-linger" in line, line
    assert not unit.exists() and not secrets.exists()


def test_an_install_that_fails_after_writing_puts_the_files_back(
    home: Home, fake_managers: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    """A user manager that refuses the unit (masked): the error is systemctl's, and the unit
    and the file of secrets it wrote are removed (an earlier unit is put back), then the
    manager is reloaded so it forgets what it was shown."""
    env, log = fake_managers
    env.update(SECRET_ENV)
    (tmp_path / "fakebin" / "systemctl").write_text(ENABLE_FAILS)
    unit, secrets = _unit_and_secrets(env)
    got = cli_here(env, "service", "install", "--manager", "systemd", check=False)
    assert got.returncode == 1, got
    assert "masked" in got.stderr and "the files it wrote were removed" in got.stderr
    assert not unit.exists() and not secrets.exists()
    assert calls(log) == [
        ["--user", "show-environment"],
        ["--user", "daemon-reload"],
        ["--user", "enable", "--now", "contemplation.service"],
        ["--user", "daemon-reload"],
    ]
    unit.parent.mkdir(parents=True, exist_ok=True)  # (the empty folder may stay)
    unit.write_text("# installed before\n")
    got = cli_here(env, "service", "install", "--manager", "systemd", check=False)
    assert got.returncode == 1 and "put back as they were" in got.stderr
    assert unit.read_text() == "# installed before\n" and not secrets.exists()


def test_a_launchd_install_that_fails_to_load_removes_the_plist(
    home: Home, fake_managers: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    """A LaunchAgent the first install cannot load (bootstrap refused): no plist is left."""
    env, _ = fake_managers
    launchctl = tmp_path / "fakebin" / "launchctl"
    launchctl.write_text(
        FAKE.replace("bootstrap) touch", "bootstrap) echo refused >&2; exit 5; touch")
    )
    plist = Path(env["HOME"]) / "Library" / "LaunchAgents" / "com.contemplation.daemon.plist"
    got = cli_here(env, "service", "install", "--manager", "launchd", check=False)
    assert got.returncode == 1 and "refused" in got.stderr, got
    assert not plist.exists()


# --------------------------------------------------------------------------- sd_notify


def notify_socket(path: Path | str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(path) if isinstance(path, Path) else "\0" + path)
    s.settimeout(0.2)
    return s


def drain(s: socket.socket, into: list[str]) -> list[str]:
    while True:
        try:
            into.append(s.recv(4096).decode())
        except TimeoutError:
            return into


@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_sd_notify_ready_watchdog_stopping_from_a_real_daemon(
    home: Home, tmp_path: Path, kind: str, daemon_factory: Callable[..., DaemonProc]
) -> None:
    name = f"contemplation-test-{os.getpid()}-{time.monotonic_ns()}"
    sock = notify_socket(tmp_path / "notify" if kind == "path" else name)
    address = str(tmp_path / "notify") if kind == "path" else "@" + name
    got: list[str] = []
    try:
        env = base_env(home, NOTIFY_SOCKET=address, WATCHDOG_USEC="400000")
        d = daemon_factory(env, home, "--no-dashboard")

        def ready() -> bool:
            drain(sock, got)
            return any("READY=1" in m for m in got)

        wait_for(ready, timeout=20, what="READY=1")
        assert home.daemon_info.exists()  # READY only once the home is locked and scanned
        assert "STATUS=watching" in next(m for m in got if "READY=1" in m)
        first_ready = next(i for i, m in enumerate(got) if "READY=1" in m)
        wait_for(
            lambda: drain(sock, got).count("WATCHDOG=1") >= 4,
            timeout=10,
            what="repeated WATCHDOG=1",
        )
        assert all(i > first_ready for i, m in enumerate(got) if m == "WATCHDOG=1")
        assert d.stop(signal.SIGTERM) == 0
        drain(sock, got)
        assert got[-1] == "STOPPING=1"
    finally:
        sock.close()


def test_no_watchdog_pings_for_another_pid(
    home: Home, tmp_path: Path, daemon_factory: Callable[..., DaemonProc]
) -> None:
    sock = notify_socket(tmp_path / "notify")
    got: list[str] = []
    try:
        env = base_env(
            home, NOTIFY_SOCKET=str(tmp_path / "notify"), WATCHDOG_USEC="200000", WATCHDOG_PID="1"
        )
        d = daemon_factory(env, home, "--no-dashboard")
        wait_for(lambda: any("READY=1" in m for m in drain(sock, got)), timeout=20, what="READY=1")
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            drain(sock, got)
        assert "WATCHDOG=1" not in got
        assert d.stop() == 0
    finally:
        sock.close()


# --------------------------------------------------------------------------- graceful shutdown


def model_blocks(conv: Conv) -> list[tuple[str, tuple[MarkerKind, ...]]]:
    data = conv.log.read_bytes() if conv.log.exists() else b""
    return [
        (b.text, tuple(k for k, _ in b.markers))
        for b in parse(data).blocks
        if b.kind is BlockKind.MODEL
    ]


def test_sigterm_lets_an_in_flight_reply_finish(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama, CONTEMPLATION_DASHBOARD_ENABLED="false")
    d = daemon_factory(env, home).wait_ready()
    words = " ".join(f"w{i}" for i in range(10))
    fake_ollama.enqueue(Step(text=words, chunk_delay=0.2))
    cli_here(env, "new", "graceful", "--message", "take your time")
    conv = only_conv(home)
    wait_for(lambda: b"w1" in conv.log.read_bytes(), what="the reply to start streaming")
    t0 = time.monotonic()
    assert d.stop(signal.SIGTERM) == 0
    assert time.monotonic() - t0 < 10
    assert model_blocks(conv) == [(words, ())]  # finished whole, not cut


def test_sigterm_past_the_grace_marks_the_turn_interrupted_and_a_restart_redoes_it(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(
        home,
        fake_ollama,
        CONTEMPLATION_DASHBOARD_ENABLED="false",
        CONTEMPLATION_STOP_GRACE=str(GRACE),
    )
    d = daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(Step(kind="hang", text="never ending story", after_chunks=1))
    cli_here(env, "new", "stuck", "--message", "hang please")
    conv = only_conv(home)
    wait_for(lambda: b"never" in conv.log.read_bytes(), what="the reply to start")
    t0 = time.monotonic()
    assert d.stop(signal.SIGTERM, timeout=GRACE + 20) == 0
    took = time.monotonic() - t0
    assert GRACE - 0.5 < took < GRACE + 8
    [(text, markers)] = model_blocks(conv)
    assert markers == (MarkerKind.INTERRUPTED,) and text.startswith("never")
    d2 = daemon_factory(env, home).wait_ready()
    wait_for(lambda: len(model_blocks(conv)) == 2, timeout=20, what="the turn to be redone")
    assert model_blocks(conv)[1] == ("Echo: hang please", ())
    assert d2.stop() == 0


def test_a_second_signal_stops_at_once(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(
        home,
        fake_ollama,
        CONTEMPLATION_DASHBOARD_ENABLED="false",
        CONTEMPLATION_STOP_GRACE=str(GRACE),
    )
    d = daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(Step(kind="hang", text="still going", after_chunks=1))
    cli_here(env, "new", "forced", "--message", "hang")
    conv = only_conv(home)
    wait_for(lambda: b"still" in conv.log.read_bytes(), what="the reply to start")
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # the second signal must come after the first was handled
    assert d.stop(signal.SIGINT) == 0
    assert time.monotonic() - t0 < 5
    assert model_blocks(conv)[-1][1] == (MarkerKind.INTERRUPTED,)
