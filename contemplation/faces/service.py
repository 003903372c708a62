"""Run the daemon as a user service: a systemd ``--user`` unit (Linux) or a LaunchAgent (macOS).

The files are rendered from the templates in ``service/`` with absolute paths (the current
interpreter, not resolved through its symlinks so a virtualenv stays a virtualenv, and the
home), then installed with ``systemctl --user`` or ``launchctl``. A :class:`Plan` is what
would be written and run; ``--print`` shows it and changes nothing. Installing again is
idempotent; uninstalling removes only the unit file, never a conversation.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import plistlib
import re
import shlex
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from contemplation.base import child
from contemplation.errors import ConfigError, ContemplationError
from contemplation.faces import service_env
from contemplation.faces.service_env import Carried
from contemplation.settings import Settings
from contemplation.writer import atomic_write_bytes

Manager = Literal["systemd", "launchd"]
UNIT = "contemplation.service"
LABEL = "com.contemplation.daemon"
# a link to service/ in the repo
TEMPLATES = Path(str(resources.files("contemplation").joinpath("service_templates")))
MAC_PATH = "/opt/homebrew/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
BOOTOUT_WAIT = 10.0


def default_manager() -> Manager:
    return "launchd" if sys.platform == "darwin" else "systemd"


# --------------------------------------------------------------------------- rendering


@dataclass(frozen=True, slots=True)
class Context:
    python: Path
    home: Path
    config: Path | None
    carried: Carried  # the shell's settings the service runs with (see service_env)
    env_file: Path  # where its secrets are kept, mode 0600
    path: str
    log_dir: Path

    @property
    def args(self) -> list[str]:
        """The global options the service passes to ``contemplation``."""
        out = ["--home", str(self.home)]
        if self.config is not None:
            out += ["--config", str(self.config)]
        return out


def context(settings: Settings, env: dict[str, str] | None = None) -> Context:
    env = dict(os.environ) if env is None else env
    python = Path(sys.executable).absolute()  # absolute, not resolved: keep the venv
    config = settings.config_file.absolute() if settings.config_file else None
    return Context(
        python=python,
        home=settings.home.absolute(),
        config=config,
        carried=service_env.carried(env),
        env_file=service_env.env_file(),
        path=f"{python.parent}:{MAC_PATH}",
        log_dir=Path.home() / "Library" / "Logs" / "contemplation",
    )


def _template(name: str) -> str:
    path = TEMPLATES / name
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(
            f"service template {path} is missing (is the source tree intact?)"
        ) from exc


def systemd_quote(arg: str, *, expand: bool = True) -> str:
    """One word of an ExecStart= (``expand``: ``$`` is special there) or Environment= line:
    specifiers escaped, quoted when it has blanks, quotes or backslashes (systemd.service(5))."""
    arg = arg.replace("%", "%%")
    if expand:
        arg = arg.replace("$", "$$")
    if arg and not any(c in arg for c in " \t\"'\\;"):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_systemd(ctx: Context) -> str:
    argv = [str(ctx.python), child.SAFE_PATH, "-m", "contemplation", *ctx.args, "run"]
    env = {"PYTHONUNBUFFERED": "1", **ctx.carried.public}
    lines = [f"Environment={systemd_quote(f'{k}={v}', expand=False)}" for k, v in env.items()]
    if ctx.carried.secret:  # never in the unit itself: a file only the user can read
        lines.append(f"EnvironmentFile={str(ctx.env_file).replace('%', '%%')}")
    return (
        _template(UNIT)
        .replace("@EXEC_START@", " ".join(systemd_quote(a) for a in argv))
        .replace("@WORKDIR@", str(ctx.home).replace("%", "%%"))  # a path: no quotes, no $
        .replace("@ENVIRONMENT@", "\n".join(lines))
    )


def _fill(value: Any, ctx: Context) -> Any:
    if isinstance(value, dict):
        return {k: _fill(v, ctx) for k, v in value.items()}
    if isinstance(value, list):
        out: list[Any] = []
        for v in value:
            out.extend(ctx.args if v == "@ARGS@" else [_fill(v, ctx)])
        return out
    if isinstance(value, str):
        for key, sub in (
            ("@PYTHON@", str(ctx.python)),
            ("@WORKDIR@", str(ctx.home)),
            ("@PATH@", ctx.path),
            ("@LOGDIR@", str(ctx.log_dir)),
        ):
            value = value.replace(key, sub)
    return value


#: the LaunchAgent's wrapper when there are secrets: ``$0`` is the 0600 file, read with every
#: name exported, then the daemon's argv is exec'd (no quoting: each word is its own argument)
SH_WRAPPER = ["/bin/sh", "-c", 'set -a; . "$0"; set +a; exec "$@"']


def render_launchd(ctx: Context) -> bytes:
    template = plistlib.loads(_template(f"{LABEL}.plist").encode())
    data = _fill(template, ctx)
    data["EnvironmentVariables"].update(ctx.carried.public)
    if ctx.carried.secret:  # a plist has no EnvironmentFile: a wrapper reads the 0600 file
        data["ProgramArguments"] = [*SH_WRAPPER, str(ctx.env_file), *data["ProgramArguments"]]
    return plistlib.dumps(data, sort_keys=False)


def installed_env(manager: Manager) -> dict[str, str] | None:
    """The shell's variables the installed service was given (None: not installed)."""
    path = unit_path(manager)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    out: dict[str, str] = {}
    secrets = False
    if manager == "systemd":
        for line in raw.decode(errors="replace").splitlines():
            if line.startswith("Environment="):
                name, _, value = _systemd_unquote(line[len("Environment=") :]).partition("=")
                out[name] = value
            secrets = secrets or line.startswith("EnvironmentFile=")
    else:
        try:
            data = plistlib.loads(raw)
        except (plistlib.InvalidFileException, ValueError):  # edited by hand: no comparison
            return None
        out.update(data.get("EnvironmentVariables") or {})
        secrets = (data.get("ProgramArguments") or [None])[0] == SH_WRAPPER[0]
    for own in ("PYTHONUNBUFFERED", "PATH"):  # the service's own, not the shell's
        out.pop(own, None)
    if secrets:
        with contextlib.suppress(OSError):
            out.update(service_env.parse_file(service_env.env_file().read_text()))
    return out


def _systemd_unquote(word: str) -> str:
    """The inverse of :func:`systemd_quote` (``expand=False``) for one word it wrote."""
    if word.startswith('"') and word.endswith('"') and len(word) >= 2:
        word = re.sub(r"\\(.)", r"\1", word[1:-1])
    return word.replace("%%", "%")


def drift(manager: Manager, env: dict[str, str] | None = None) -> str | None:
    """A line for ``doctor`` when the installed service was given other settings than this
    shell has (None: the same, or no service installed)."""
    installed = installed_env(manager)
    if installed is None:
        return None
    try:
        now = service_env.carried(dict(os.environ) if env is None else env)
    except ConfigError as exc:
        return f"this shell's settings cannot be carried into the service: {exc}"
    differs = service_env.differences(now, installed)
    if not differs:
        return None
    return (
        f"the service ({unit_path(manager)}) runs with other settings than this shell: "
        f"{', '.join(differs)}; to give it this shell's, run `contemplation service install`"
    )


# --------------------------------------------------------------------------- plans


@dataclass(frozen=True, slots=True)
class Step:
    argv: list[str]
    when: str = ""  # a condition, for --print ("if it is already loaded")
    check: bool = True  # a failure stops the install


@dataclass
class Plan:
    manager: Manager
    action: str
    path: Path  # the unit / plist file
    content: bytes | None  # what is written there (None: removed, or nothing written)
    steps: list[Step] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    env_file: Path | None = None  # the secrets' file (install: written or removed; uninstall)
    secrets: Carried | None = None  # install: what goes into env_file (none: it is removed)

    def describe(self) -> str:
        out = [f"# {self.action} ({self.manager})"]
        if self.content is not None:
            out += [f"# write {self.path}:", self.content.decode().rstrip("\n")]
        if self.secrets is not None and self.secrets.secret and self.env_file is not None:
            names = ", ".join(f"{k}={service_env.MASK}" for k in sorted(self.secrets.secret))
            out.append(f"# write {self.env_file} (mode 0600): {names}")
        elif self.action == "uninstall":
            out.append(f"# remove {self.path}")
        for s in self.steps:
            out.append(shlex.join(s.argv) + (f"    # {s.when}" if s.when else ""))
        out += [f"# {n}" for n in self.notes]
        return "\n".join(out) + "\n"


def unit_path(manager: Manager) -> Path:
    if manager == "systemd":
        base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        return Path(base) / "systemd" / "user" / UNIT
    return Path.home() / "Library" / "LaunchAgents" / f"{LABEL}.plist"


def _domain() -> str:
    return f"gui/{os.getuid()}"


def _linger_hint() -> str | None:
    user = getpass.getuser()
    if Path("/var/lib/systemd/linger", user).exists():
        return None
    return f"to keep it running after you log out: loginctl enable-linger {user}"


def plan(
    settings: Settings, action: str, manager: Manager, *, lines: int = 200, follow: bool = False
) -> Plan:
    ctx = context(settings)
    path = unit_path(manager)
    if manager == "systemd":
        sc = ["systemctl", "--user"]
        if action == "install":
            p = Plan(manager, action, path, render_systemd(ctx).encode())
            p.env_file, p.secrets = ctx.env_file, ctx.carried
            p.steps = [
                Step([*sc, "show-environment"], when="first: a user session to install into"),
                Step([*sc, "daemon-reload"]),
                Step([*sc, "enable", "--now", UNIT]),
                Step([*sc, "try-restart", UNIT], when="if the unit file changed"),
            ]
            hint = _linger_hint()
            p.notes = [
                *ctx.carried.lines(ctx.env_file),
                f"logs: journalctl --user -u {UNIT} -f",
                *([hint] if hint else []),
            ]
            return p
        if action == "uninstall":
            p = Plan(manager, action, path, None, env_file=ctx.env_file)
            p.steps = [
                Step([*sc, "disable", "--now", UNIT], when="if installed", check=False),
                Step([*sc, "daemon-reload"]),
            ]
            p.notes = [f"conversations in {ctx.home} are kept"]
            return p
        if action == "status":
            return Plan(manager, action, path, None, [Step([*sc, "status", UNIT, "--no-pager"])])
        argv = ["journalctl", "--user", "-u", UNIT, "--no-pager", "-n", str(lines)]
        return Plan(manager, action, path, None, [Step(argv + (["-f"] if follow else []))])
    target = f"{_domain()}/{LABEL}"
    if action == "install":
        p = Plan(manager, action, path, render_launchd(ctx))
        p.env_file, p.secrets = ctx.env_file, ctx.carried
        p.steps = [
            Step(["launchctl", "bootout", target], when="if loaded and the plist changed"),
            Step(["launchctl", "bootstrap", _domain(), str(path)], when="if not loaded"),
            Step(["launchctl", "enable", target]),
        ]
        p.notes = [*ctx.carried.lines(ctx.env_file), f"logs: {ctx.log_dir}/daemon.err.log"]
        return p
    if action == "uninstall":
        p = Plan(manager, action, path, None, env_file=ctx.env_file)
        p.steps = [Step(["launchctl", "bootout", target], when="if loaded", check=False)]
        p.notes = [f"conversations in {ctx.home} are kept"]
        return p
    if action == "status":
        return Plan(manager, action, path, None, [Step(["launchctl", "print", target])])
    logs = [str(ctx.log_dir / "daemon.err.log"), str(ctx.log_dir / "daemon.out.log")]
    argv = ["tail", "-n", str(lines), *(["-F"] if follow else []), *logs]
    return Plan(manager, action, path, None, [Step(argv)])


# --------------------------------------------------------------------------- running

Runner = Callable[[list[str], bool], subprocess.CompletedProcess[str]]


def run_command(argv: list[str], capture: bool) -> subprocess.CompletedProcess[str]:
    exe = shutil.which(argv[0])
    if exe is None:
        raise ContemplationError(f"{argv[0]} not found on PATH (is this a {argv[0]} system?)")
    return subprocess.run(
        [exe, *argv[1:]], capture_output=capture, text=True, check=False, timeout=120
    )


def _must(step: Step, run: Runner) -> None:
    proc = run(step.argv, True)
    if proc.returncode != 0 and step.check:
        detail = (proc.stderr or proc.stdout or "").strip()
        raise ContemplationError(f"`{shlex.join(step.argv)}` failed ({proc.returncode}): {detail}")


def _write(path: Path, content: bytes, mode: int = 0o644) -> bool:
    """Write when different; True when the file changed."""
    try:
        if path.read_bytes() == content:
            path.chmod(mode)  # (a file of secrets someone opened up is closed again)
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, content, mode=mode)
    return True


def _write_secrets(p: Plan) -> bool:
    """The 0600 file with the secrets the service carries, or none when there are none;
    True when it changed (the service must start again to read it)."""
    if p.env_file is None or p.secrets is None:
        return False
    if p.secrets.secret:
        return _write(p.env_file, p.secrets.file_text().encode(), mode=0o600)
    try:
        p.env_file.unlink()
    except FileNotFoundError:
        return False
    return True


def _no_user_session(detail: str) -> ContemplationError:
    """The one line for ``systemctl --user`` with no user manager to talk to (an ssh, su,
    sudo or container shell: no ``XDG_RUNTIME_DIR``, no user bus): why, and what to do."""
    user = getpass.getuser()
    said = detail.strip().splitlines()[0] if detail.strip() else "no answer"
    return ContemplationError(
        f"cannot install the service: there is no systemd user session here ({said}), so "
        f"`systemctl --user` has no service manager to install into; run `loginctl "
        f"enable-linger {user}` and log in again (or `export XDG_RUNTIME_DIR=/run/user/"
        f"{os.getuid()}`), or log in to a desktop or ssh session that systemd starts, then "
        f"install again; or run the daemon yourself: `contemplation run`. Nothing was written"
    )


def _old(path: Path | None) -> tuple[bytes, int] | None:
    """What is at ``path`` before an install writes it (None: nothing)."""
    if path is None:
        return None
    try:
        return path.read_bytes(), stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return None


def _put_back(path: Path | None, old: tuple[bytes, int] | None) -> None:
    """Undo an install's write of ``path``: the old content again, or no file."""
    if path is None:
        return
    with contextlib.suppress(OSError):
        if old is None:
            path.unlink(missing_ok=True)
        elif not path.exists() or path.read_bytes() != old[0]:
            atomic_write_bytes(path, old[0], mode=old[1])


def _print(p: Plan) -> list[str]:
    """``launchctl print`` of an install plan's agent (exit 0: it is loaded)."""
    return ["launchctl", "print", p.steps[2].argv[-1]]


def install(p: Plan, run: Runner = run_command) -> list[str]:
    """Carry out an install plan; returns what was done, for the user. systemd's user
    manager is asked first whether it is there (nothing is written when it is not); a step
    that fails after the files were written puts them back as they were, so a failed install
    leaves neither a unit nor a file of secrets that no service uses."""
    if p.content is None:
        raise ContemplationError("not an install plan")
    if p.manager == "systemd":
        probe = run(p.steps[0].argv, True)
        if probe.returncode != 0:
            raise _no_user_session(probe.stderr or probe.stdout or "")
    before = _old(p.path), _old(p.env_file)
    try:
        return _install(p, run, existed=before[0] is not None)
    except BaseException as exc:
        _put_back(p.path, before[0])
        _put_back(p.env_file, before[1])
        with contextlib.suppress(Exception):
            if p.manager == "systemd":  # the manager forgets the unit it was shown
                run(p.steps[1].argv, True)
            elif before[0] is not None and run(_print(p), True).returncode != 0:
                run(p.steps[1].argv, True)  # the old agent, unloaded for the new: loaded again
        if isinstance(exc, ContemplationError):
            undone = "put back as they were" if before[0] else "removed"
            raise ContemplationError(f"{exc}; the files it wrote were {undone}") from exc
        raise


def _install(p: Plan, run: Runner, *, existed: bool) -> list[str]:
    assert p.content is not None
    secrets_changed = _write_secrets(p)  # first: the unit may name it
    changed = _write(p.path, p.content)
    done = [f"{'wrote' if changed else 'unchanged'}: {p.path}"]
    changed = changed or secrets_changed
    if p.manager == "systemd":
        _must(p.steps[1], run)
        _must(p.steps[2], run)
        if changed and existed:
            _must(p.steps[3], run)
            done.append("restarted with the new unit")
        done.append(f"enabled and started {UNIT}")
        return done + p.notes
    context_log = Path(plistlib.loads(p.content)["StandardErrorPath"]).parent
    context_log.mkdir(parents=True, exist_ok=True)
    target = p.steps[2].argv[-1]
    loaded = run(_print(p), True).returncode == 0
    if loaded and changed:
        _must(p.steps[0], run)
        deadline = time.monotonic() + BOOTOUT_WAIT  # bootout is asynchronous
        while run(["launchctl", "print", target], True).returncode == 0:
            if time.monotonic() > deadline:
                raise ContemplationError(f"{LABEL} did not unload within {BOOTOUT_WAIT:.0f} s")
            time.sleep(0.2)
        loaded = False
    if not loaded:
        _must(p.steps[1], run)
        done.append(f"loaded {LABEL} into {_domain()}")
    else:
        done.append(f"{LABEL} already loaded with this plist")
    _must(p.steps[2], run)
    return done + p.notes


def uninstall(p: Plan, run: Runner = run_command) -> list[str]:
    if p.env_file is not None:
        p.env_file.unlink(missing_ok=True)  # the secrets go with the service
    if not p.path.exists():
        return [f"not installed ({p.path} does not exist)", *p.notes]
    if p.manager == "systemd":
        _must(p.steps[0], run)
        p.path.unlink()
        _must(p.steps[1], run)
    else:
        target = p.steps[0].argv[-1]
        if run(["launchctl", "print", target], True).returncode == 0:
            _must(p.steps[0], run)
        p.path.unlink()
    return [f"removed {p.path}", *p.notes]


def passthrough(p: Plan, run: Runner = run_command) -> int:
    """status / logs: the manager's own output, straight to the terminal."""
    if p.action == "status":
        print(f"unit file: {p.path} ({'installed' if p.path.exists() else 'not installed'})")
        sys.stdout.flush()
    return run(p.steps[0].argv, False).returncode
