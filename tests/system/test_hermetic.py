"""The suite never reads the person's own setup, and never outlives itself.

A config file in the real user location (rich or broken) and the user's own variables change
no test's outcome; SIGTERM to pytest ends it as Ctrl-C does (a summary, the finalizers run)
and stops every server a fixture started; no test signals pytest's own process."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests import peers, procgroups
from tests.conftest import ROOT, wait_for

PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--no-header"]
# a few files that load settings, run the CLI in-process and as a process, and start daemons
SUBSET = [
    "tests/system/test_settings.py",
    "tests/system/test_cli_commands.py",
    "tests/system/test_faults.py::test_the_rescan_finds_work_when_no_event_arrives",
    "tests/system/test_daemon.py::test_send_wait_streams_the_reply_to_stdout",
]

RICH_CONFIG = """\
default_backend = "box1"
default_model = "qwen3:8b"
settle_seconds = 3.0
rescan_interval = 60.0
max_need_rounds = 1
fallback = ["ollama", "local"]
home = "{home}/contemplation-home"

[ollama]
host = "http://127.0.0.1:9"
num_ctx = 2048
timeouts = {{ connect = 1, first_byte = 5, idle = 5, total = 10 }}

[retry]
base = 30.0
cap = 300.0
max_attempts = 2

[tools]
allowed_roots = ["~/notes", "~/src/brain"]
notes_vault = "~/Obsidian/Main"
answer_budget_chars = 300

[mcp_servers.time]
command = "/nonexistent/mcp-server-time"

[[routes]]
match = '(?:the )?current time in (?P<tz>\\S+)'
tool = "time:get_current_time"
args = {{ timezone = "{{tz}}" }}

[permissions]
read_file = {{ "*" = "deny", "~/secrets/**" = "ask" }}
"time:*" = "ask"

[providers.laptop]
kind = "ollama"
url = "http://127.0.0.1:9"

[providers.box1]
kind = "openai"
url = "http://127.0.0.1:9/v1"
api_key = "sk-user"

[aliases.coder]
model = "qwen2.5-coder:7b"
providers = ["box1", "laptop"]
"""

BROKEN_CONFIG = "this is [not toml\nproviders = = 3\n"

# what a person's shell may hold: each would change a test that read it
USER_VARIABLES = {
    "OLLAMA_HOST": "http://127.0.0.1:9",
    "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
    "OPENAI_API_KEY": "sk-user",
    "OPENCODE_SERVER_URL": "http://127.0.0.1:9",
    "ANTHROPIC_API_KEY": "sk-ant-user",
    "CONTEMPLATION_DEFAULT_BACKEND": "opencode",
    "CONTEMPLATION_SETTLE_SECONDS": "5",
    "CONTEMPLATION_TOOLS__ALLOWED_ROOTS": "/nonexistent",
    "HTTP_PROXY": "http://127.0.0.1:9",
}


def user_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment as a person's shell with ``home`` as HOME would have it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "CONTEMPLATION_"))}
    return env | {"HOME": str(home)} | extra


WHY: dict[str, str] = {}  # "run: test id" -> what a failing test said


def outcomes(tmp_path: Path, envs: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """Run SUBSET in a pytest of its own under each of ``envs`` (at once: most of a run is
    waiting on processes); each test's outcome by its id, for each run."""

    def start(name: str, env: dict[str, str]) -> subprocess.Popen[str]:
        argv = [
            *PYTEST,
            f"--junitxml={tmp_path / name}.xml",
            f"--basetemp={tmp_path / 'runs' / name}",
        ]
        return procgroups.popen(
            [*argv, *SUBSET],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    (tmp_path / "runs").mkdir()
    runs = {name: start(name, env) for name, env in envs.items()}
    got: dict[str, dict[str, str]] = {}
    try:
        for name, proc in runs.items():
            out, _ = proc.communicate(timeout=240)
            report = tmp_path / f"{name}.xml"
            assert report.exists(), f"{name}: no report ({proc.returncode}):\n{out[-3000:]}"
            got[name] = {}
            for case in ET.parse(report).iter("testcase"):  # noqa: S314 - our pytest wrote it
                kinds = [c for c in case if c.tag in ("failure", "error", "skipped")]
                key = f"{case.get('classname')}::{case.get('name')}"
                got[name][key] = kinds[0].tag if kinds else "passed"
                if kinds and kinds[0].tag != "skipped":  # what it said, for the assertion
                    WHY[f"{name}: {key}"] = (kinds[0].text or kinds[0].get("message", ""))[-3000:]
    finally:
        for proc in runs.values():
            procgroups.kill(proc)
    return got


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_a_rich_or_broken_user_config_changes_no_outcome(tmp_path: Path) -> None:
    rich, broken, none = tmp_path / "rich", tmp_path / "broken", tmp_path / "none"
    for home in (rich, broken, none):
        (home / ".config" / "contemplation").mkdir(parents=True)
    (rich / ".config" / "contemplation" / "config.toml").write_text(RICH_CONFIG.format(home=rich))
    (broken / ".config" / "contemplation" / "config.toml").write_text(BROKEN_CONFIG)
    before = {h: files_under(h) for h in (rich, broken, none)}

    got = outcomes(
        tmp_path,
        {
            "none": user_env(none),
            "rich": user_env(rich, XDG_CONFIG_HOME=str(rich / ".config"), **USER_VARIABLES),
            "broken": user_env(broken, CONTEMPLATION_SETTLE_SECONDS="not a number"),
        },
    )
    clean, with_rich, with_broken = got["none"], got["rich"], got["broken"]

    assert list(clean.values()).count("passed") >= 40, clean
    assert {k: v for k, v in with_rich.items() if v != clean.get(k)} == {}, WHY
    assert {k: v for k, v in with_broken.items() if v != clean.get(k)} == {}, WHY
    assert with_rich.keys() == with_broken.keys() == clean.keys()
    # and nothing was written into the person's home
    assert {h: files_under(h) for h in (rich, broken, none)} == before


def test_each_test_sees_an_empty_private_home_and_none_of_the_users_variables() -> None:
    home = Path(os.environ["HOME"])
    assert home.is_dir() and not any(home.iterdir())
    assert Path(tempfile.gettempdir()).resolve() in home.resolve().parents  # a private one
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        assert Path(os.environ[name]).is_relative_to(home), name
    runtime = Path(os.environ["XDG_RUNTIME_DIR"])
    assert runtime.is_dir() and runtime.stat().st_mode & 0o777 == 0o700
    leaked = [
        k
        for k in os.environ
        if k.startswith(("CONTEMPLATION_", "OLLAMA_", "OPENAI_", "OPENCODE_", "ANTHROPIC_"))
    ]
    assert leaked == []
    assert os.environ.get("PATH"), "the peers need PATH"


def alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting for its parent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_sigterm_to_pytest_ends_it_cleanly_and_stops_its_servers(tmp_path: Path) -> None:
    """``tests/hermetic_probe.py`` starts a daemon (a fixture's) and a bare server (only
    registered), writes their pids and waits; pytest gets SIGTERM, as a CI runner's timeout
    or ``timeout(1)`` sends it."""
    pids = tmp_path / "pids"
    proc = subprocess.Popen(
        [*PYTEST, f"--basetemp={tmp_path / 'base'}", "tests/hermetic_probe.py"],
        env=dict(os.environ, HERMETIC_PROBE_PIDS=str(pids)),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(lambda: pids.exists() or proc.poll() is not None, 60, what="the probe's pids")
        assert pids.exists(), proc.communicate()[0]
        started = [int(p) for p in pids.read_text().split()]
        assert len(started) == 2 and all(alive(p) for p in started)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 2, out  # pytest's "interrupted", not killed by the signal
    assert "KeyboardInterrupt" in out and " in " in out.splitlines()[-1], out
    wait_for(lambda: not any(alive(p) for p in started), 10, what="the probe's servers to stop")


LLAMA_IN_A_CHILD = """
import sys, time
from pathlib import Path
from tests.realpeers import LlamaServer

print(LlamaServer(Path(sys.argv[1]), n_ctx=512).start().proc.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.real
def test_a_llama_server_does_not_outlive_a_test_run_killed_outright() -> None:
    """SIGKILL leaves no finalizer and no atexit: the server sees its parent gone and exits."""
    peers.xllamacpp_available()
    run = procgroups.popen(
        [sys.executable, "-c", LLAMA_IN_A_CHILD, str(peers.smollm2_gguf())],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    server = 0
    try:
        assert run.stdout is not None
        server = int(run.stdout.readline() or 0)  # the start is bounded: 120 s, then it fails
        assert server and alive(server), run.communicate(timeout=30)
        run.send_signal(signal.SIGKILL)  # the run, not its server (a group of its own)
        run.wait(10)
        wait_for(lambda: not alive(server), 15, what="the orphaned llama-server to exit")
    finally:
        procgroups.kill(run)
        if server and alive(server):
            os.killpg(server, signal.SIGKILL)


SELF = {"getpid", "getpgid", "getpgrp"}


def signals_itself(call: ast.Call) -> bool:
    """``os.kill(os.getpid(), …)``, ``os.killpg(os.getpgid(…) or 0, …)``, ``signal.raise_signal``."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name in ("raise_signal", "pthread_kill"):
        return True
    if name not in ("kill", "killpg") or not call.args:
        return False
    target = call.args[0]
    if isinstance(target, ast.Constant) and target.value == 0 and name == "killpg":
        return True
    return any(
        isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", "")) in SELF
        for n in ast.walk(target)
    )


def test_no_test_signals_pytests_own_process() -> None:
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        text = path.read_text()
        if "kill" not in text and "_signal" not in text:
            continue  # nothing to look at closer
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.Call) and signals_itself(node):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], "signal a child instead: " + ", ".join(found)
