"""The installed service runs with the settings the user tested with:
``service install`` carries the shell's OPENAI_*, OLLAMA_HOST and CONTEMPLATION_* into the
unit or the plist, secrets only into a 0600 file beside it (never into the unit), says what
it carried with secrets masked, writes no OLLAMA_HOST that was not set, and ``doctor`` says
when the shell's settings differ from the installed service's. ``service reload`` checks the
file first, as ``doctor`` and the daemon do, and a file the daemon would refuse is refused
here with exit 1 and its one line. Recording fake systemctl/launchctl
(tests/system/test_service.py),
the real CLI, a real daemon, real /bin/sh for the LaunchAgent's wrapper."""

from __future__ import annotations

import plistlib
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

from contemplation.store.layout import Home
from tests.conftest import DaemonProc, base_env, cli_here
from tests.system.test_service import calls, fake_managers, verify  # noqa: F401 (a fixture)

SECRET = "sk-test-0123456789abcdef"  # noqa: S105 - a made-up key, for the test
SHELL = {
    "OPENAI_API_KEY": SECRET,
    "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
    "CONTEMPLATION_MAX_TURNS": "7",
}


def _env_file(env: dict[str, str]) -> Path:
    return Path(env["XDG_CONFIG_HOME"]) / "contemplation" / "service.env"


def test_systemd_install_carries_the_shell_and_keeps_secrets_out_of_the_unit(
    home: Home,
    fake_managers: tuple[dict[str, str], Path],  # noqa: F811
) -> None:
    env, log = fake_managers
    env = dict(env, **SHELL)
    env.pop("OLLAMA_HOST", None)
    unit = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user" / "contemplation.service"
    dry = cli_here(env, "service", "install", "--manager", "systemd", "--print").stdout
    assert SECRET not in dry and "OPENAI_API_KEY=***" in dry
    out = cli_here(env, "service", "install", "--manager", "systemd").stdout
    text = unit.read_text()
    assert SECRET not in text and SECRET not in out
    assert "Environment=OPENAI_BASE_URL=http://127.0.0.1:9/v1" in text
    assert "Environment=CONTEMPLATION_MAX_TURNS=7" in text
    assert "OLLAMA_HOST" not in text  # not set in the shell: not written
    secrets = _env_file(env)
    assert f"EnvironmentFile={secrets}" in text
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    assert f"OPENAI_API_KEY='{SECRET}'" in secrets.read_text()
    checked = verify(unit)  # systemd's own reading of the unit, file named
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr
    assert "carried: OPENAI_API_KEY=*** (secret, in " in out
    assert "carried: OPENAI_BASE_URL=http://127.0.0.1:9/v1" in out
    calls(log)

    # the same shell: doctor has nothing to say about the service
    doctor = cli_here(env, "doctor", check=False).stdout
    assert not any(ln.startswith("warn service") for ln in doctor.splitlines()), doctor
    # another key in the shell, one more variable, one gone: doctor names them, masked
    other = dict(env, OPENAI_API_KEY="sk-other", OLLAMA_HOST="http://127.0.0.1:8")
    other.pop("CONTEMPLATION_MAX_TURNS")
    doctor = cli_here(other, "doctor", check=False).stdout
    line = next(ln for ln in doctor.splitlines() if ln.startswith("warn service"))
    assert "OPENAI_API_KEY" in line and "OLLAMA_HOST" in line and "CONTEMPLATION_MAX_TURNS" in line
    assert "sk-other" not in doctor and SECRET not in doctor
    assert "contemplation service install" in line

    # no secret left in the shell: the file goes, and so does the unit's line
    plain = {k: v for k, v in env.items() if k != "OPENAI_API_KEY"}
    cli_here(plain, "service", "install", "--manager", "systemd")
    assert not secrets.exists() and "EnvironmentFile" not in unit.read_text()
    cli_here(env, "service", "install", "--manager", "systemd")
    cli_here(env, "service", "uninstall", "--manager", "systemd")
    assert not unit.exists() and not secrets.exists()


def test_launchd_install_carries_the_shell_and_its_wrapper_reads_the_secrets(
    home: Home,
    fake_managers: tuple[dict[str, str], Path],  # noqa: F811
) -> None:
    env, _ = fake_managers
    env = dict(env, **SHELL, OLLAMA_HOST="http://me:pw@10.0.0.5:11434")  # a password in a URL
    plist = Path(env["HOME"]) / "Library" / "LaunchAgents" / "com.contemplation.daemon.plist"
    out = cli_here(env, "service", "install", "--manager", "launchd").stdout
    raw = plist.read_bytes()
    assert SECRET.encode() not in raw and b"pw@" not in raw and SECRET not in out
    data = plistlib.loads(raw)
    carried = data["EnvironmentVariables"]
    assert carried["OPENAI_BASE_URL"] == "http://127.0.0.1:9/v1"
    assert carried["CONTEMPLATION_MAX_TURNS"] == "7"
    assert "OPENAI_API_KEY" not in carried and "OLLAMA_HOST" not in carried
    secrets = _env_file(env)
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    args = data["ProgramArguments"]
    assert args[0] == "/bin/sh" and args[3] == str(secrets)
    # the wrapper, run by the real sh with `env` in place of the daemon, exports the secrets
    shown = subprocess.run(
        [*args[:4], "env"], capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"}
    ).stdout.splitlines()
    assert f"OPENAI_API_KEY={SECRET}" in shown
    assert "OLLAMA_HOST=http://me:pw@10.0.0.5:11434" in shown
    assert args[4:8] == [args[4], "-P", "-m", "contemplation"] and args[-1] == "run"


def test_no_ollama_host_is_written_when_the_shell_has_none(
    home: Home,
    fake_managers: tuple[dict[str, str], Path],  # noqa: F811
) -> None:
    env, _ = fake_managers
    env.pop("OLLAMA_HOST", None)
    for manager in ("systemd", "launchd"):
        dry = cli_here(env, "service", "install", "--manager", manager, "--print").stdout
        assert "OLLAMA_HOST" not in dry and "11434" not in dry


def test_reload_refuses_a_file_the_daemon_would_refuse_with_exit_1(
    home: Home, tmp_path: Path, daemon_factory: Callable[..., DaemonProc]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text('default_backend = "ollama"\n')
    env = base_env(home, CONTEMPLATION_CONFIG=str(config))
    d = daemon_factory(env, home).wait_ready()
    config.write_text('default_backend = "nosuch"\n')  # TOML, and loads: validate refuses it
    doctor = cli_here(env, "doctor", check=False)
    why = next(ln for ln in doctor.stdout.splitlines() if ln.startswith("FAIL config"))
    refused = cli_here(env, "service", "reload", check=False)
    assert refused.returncode == 1, refused.stdout
    assert refused.stdout == ""
    [line] = refused.stderr.splitlines()
    assert "default_backend" in line and why.split(None, 2)[2] in line
    assert "asked the daemon" not in line
    assert d.stop() == 0
    assert '"reload_refused"' not in d.stderr()  # never signalled: nothing to refuse there
