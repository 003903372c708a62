"""The real Claude Code (2.1.328, from npm) lists contemplation's tools in its first model
request.

Claude Code spawns its stdio MCP servers at start and sends the first request with the tools
listed by then: ``claude -p`` waits about 1.6 to 2 s for the servers, an interactive session
given its prompt at start does not wait at all. ``contemplation mcp`` answered the handshake
only after importing the MCP SDK (1.1 to 1.9 s on this 2-core machine, more under load), and
the first request went out without the tools in 7 of 7 interactive runs. Each run here is a
fresh Claude Code with a fresh ``contemplation mcp``; "Claude" is the scripted Messages API,
which keeps every request (``bench/bench_first_request.py`` makes 10 runs of each).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

from contemplation.store.layout import Home
from tests import peers
from tests.conftest import wait_for
from tests.fakes.anthropic_server import WAIT_FOR_SERVERS, FakeAnthropic
from tests.fakes.ollama_server import FakeOllama
from tests.system.test_claude_code_tasks import (
    START,
    Terminal,
    anthropic,
    claude_env,
    set_up_claude,
)

RUNS = 3  # a test's share; the benchmark makes 10 of each
PROMPT = "Ask the local model about indexes."

__all__ = ["anthropic"]  # the fixture, used by name


def first_request_tools(fake: FakeAnthropic) -> list[str]:
    with fake.lock:
        first = fake.requests[0]
    return [str(t.get("name")) for t in first.get("tools", [])]


def interactive(env: dict[str, str], project: Path, fake: FakeAnthropic) -> list[str]:
    """Claude Code on a pseudo-terminal, its prompt given at start: the tools of its first
    request."""
    term = Terminal([str(peers.node_bin("claude")), PROMPT], env, project)
    try:

        def asked() -> bool:
            if term.proc.poll() is not None:
                raise AssertionError(f"claude exited: {term.tail()}")
            with fake.lock:
                return bool(fake.requests)

        wait_for(asked, 90, what=f"Claude Code's first request; screen: {term.tail()[-1500:]}")
    finally:
        term.stop()
    return first_request_tools(fake)


def printed(env: dict[str, str], project: Path, fake: FakeAnthropic) -> list[str]:
    """``claude -p``: the tools of its first request."""
    done = subprocess.run(
        [str(peers.node_bin("claude")), "-p", PROMPT],
        env=env,
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert fake.requests, f"no request: {done.stdout[-1000:]} {done.stderr[-1000:]}"
    return first_request_tools(fake)


def first_requests(
    home: Home,
    tmp: Path,
    fake_ollama: FakeOllama,
    make: Callable[[], FakeAnthropic],
    mode: Callable[[dict[str, str], Path, FakeAnthropic], list[str]],
    runs: int,
) -> list[list[str]]:
    """The tools of the first request of ``runs`` fresh Claude Codes (``mode``)."""
    firsts = []
    for run in range(runs):
        fake = make()
        env = claude_env(home, tmp / f"run{run}", fake, fake_ollama)
        set_up_claude(env, tmp / f"run{run}" / "project")
        firsts.append(mode(env, tmp / f"run{run}" / "project", fake))
    return firsts


def test_every_first_request_of_claude_p_lists_the_tools(
    home: Home,
    tmp_path: Path,
    fake_ollama: FakeOllama,
    anthropic: Callable[..., FakeAnthropic],
) -> None:
    """Before: none did (the server answered Claude Code's ``server/discover`` probe only
    once the SDK was imported, after ``claude -p`` had stopped waiting)."""
    firsts = first_requests(home, tmp_path, fake_ollama, anthropic, printed, RUNS)
    listed = [START in tools for tools in firsts]
    assert listed == [True] * RUNS, json.dumps(listed)


def test_an_interactive_first_request_lists_the_tools_or_the_wait_for_them(
    home: Home,
    tmp_path: Path,
    fake_ollama: FakeOllama,
    anthropic: Callable[..., FakeAnthropic],
) -> None:
    """Interactive with the prompt given at start, Claude Code takes its tools about 0.6 s
    after it spawns its servers, on a machine under load before this one has answered the
    three round trips of its connect (it then offers ``WaitForMcpServers``, which the
    scripted Claude calls, as a real one is asked to): either way the tools are Claude's
    from its first request on."""
    firsts = first_requests(home, tmp_path, fake_ollama, anthropic, interactive, 1)
    assert START in firsts[0] or WAIT_FOR_SERVERS in firsts[0], firsts[0]
