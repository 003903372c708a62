"""The MCP client against real servers, each reached through a rule from a NEED line.

Servers: mcp-server-time, mcp-server-git (--repository on a real temp repo), the reference
filesystem server (one allowed dir) and memory server (MEMORY_FILE_PATH), plus the small
test server in tests/fakes (stdio and streamable HTTP) for deaths, hangs and errors.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from contemplation import settings as settings_mod
from contemplation.errors import ConfigError
from contemplation.needs.router import Answer, NeedRouter
from contemplation.settings import Settings
from tests import peers
from tests.conftest import wait_for

pytestmark = pytest.mark.real
ROOT = Path(__file__).resolve().parents[2]
TEST_SERVER = {
    "command": sys.executable,
    "args": ["-m", "tests.fakes.mcp_test_server"],
    "cwd": str(ROOT),
}
T = TypeVar("T")


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    return settings_mod.load(home=tmp_path / "home", env={}, config=None, overrides=overrides)


def run(router: NeedRouter, body: Callable[[NeedRouter], Awaitable[T]]) -> T:
    async def main() -> T:
        async with router:
            return await body(router)

    return asyncio.run(main())


async def ask(router: NeedRouter, need: str, turn: str = "t") -> Answer:
    [(_, answer)] = await router.answer_all([need], conv_id="c", turn_key=turn)
    assert answer is not None, f"no rule answered {need!r}"
    return answer


def children(match: str) -> list[int]:
    """Our child processes whose command line contains ``match``."""
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == me and match in cmd:
            out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# --------------------------------------------------------------------------- real servers


def test_time_server_through_a_regex_rule(tmp_path: Path) -> None:
    time_cmd = peers.python_peer("mcp-server-time")
    settings = make_settings(
        tmp_path,
        mcp_servers={"time": {"command": str(time_cmd)}},
        routes=[
            {
                "match": r"(?:the )?current time in (?P<tz>[A-Za-z_]+/[A-Za-z_]+)",
                "tool": "time:get_current_time",
                "args": {"timezone": "{tz}"},
            }
        ],
    )

    async def body(router: NeedRouter) -> list[Answer]:
        first = await ask(router, "Current time in Europe/Paris")
        second = await ask(router, "the current time in Asia/Tokyo")
        bad = await ask(router, "current time in Mars/Olympus")
        assert router.pool.servers["time"].starts == 1  # started once, kept alive
        return [first, second, bad]

    first, second, bad = run(NeedRouter(settings), body)
    assert first.ok and '"timezone": "Europe/Paris"' in first.content
    assert first.tool == "time:get_current_time"
    assert second.ok and "+09:00" in second.content
    assert bad.status == "failed" and "Mars/Olympus" in bad.content


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    git = peers.executable("git")
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    subprocess.run([git, "init", "-q", str(repo)], check=True, env=env)
    (repo / "README.md").write_text("hello\n")
    subprocess.run([git, "-C", str(repo), "add", "README.md"], check=True, env=env)
    subprocess.run([git, "-C", str(repo), "commit", "-qm", "Add the readme"], check=True, env=env)
    (repo / "README.md").write_text("hello, changed\n")
    return repo


def test_git_server_on_a_real_repository(tmp_path: Path, git_repo: Path) -> None:
    git_cmd = peers.python_peer("mcp-server-git")
    settings = make_settings(
        tmp_path,
        mcp_servers={"git": {"command": str(git_cmd), "args": ["--repository", str(git_repo)]}},
        routes=[
            {
                "prefix": "Recent commits in",
                "tool": "git:git_log",
                "args": {"repo_path": str(git_repo), "max_count": 5},
            },
            {
                "prefix": "Uncommitted changes in",
                "tool": "git:git_diff_unstaged",
                "args": {"repo_path": str(git_repo)},
            },
        ],
    )

    async def body(router: NeedRouter) -> tuple[Answer, Answer]:
        return await ask(router, "Recent commits in the repo"), await ask(
            router, "Uncommitted changes in the repo"
        )

    log_answer, diff_answer = run(NeedRouter(settings), body)
    assert log_answer.ok and "Add the readme" in log_answer.content
    assert diff_answer.ok and "+hello, changed" in diff_answer.content


def test_filesystem_server_keeps_its_allowed_dir_no_roots_advertised(tmp_path: Path) -> None:
    node = peers.executable("node")
    fs = peers.node_module("@modelcontextprotocol", "server-filesystem", "dist", "index.js")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "plan.md").write_text("step 1: profit\n")
    (tmp_path / "private.txt").write_text("TOP SECRET")
    settings = make_settings(
        tmp_path,
        mcp_servers={"fs": {"command": str(node), "args": [str(fs), str(shared)]}},
        routes=[{"prefix": "Shared file", "tool": "fs:read_text_file", "param": "path"}],
    )

    async def body(router: NeedRouter) -> tuple[Answer, Answer, str]:
        inside = await ask(router, f"Shared file {shared / 'plan.md'}")
        outside = await ask(router, f"Shared file {tmp_path / 'private.txt'}")
        allowed = await router.pool.call("fs", "list_allowed_directories", {})
        return inside, outside, allowed.text

    inside, outside, allowed = run(NeedRouter(settings), body)
    assert inside.ok and "step 1: profit" in inside.content
    assert outside.status == "failed" and "TOP SECRET" not in outside.content
    assert "denied" in outside.content.lower() or "outside" in outside.content.lower()
    assert str(shared.resolve()) in allowed  # still the dir we gave it, not replaced by roots


def test_memory_server_answers_brain_memory_through_a_rule(tmp_path: Path) -> None:
    node = peers.executable("node")
    mem = peers.node_module("@modelcontextprotocol", "server-memory", "dist", "index.js")
    graph = tmp_path / "graph.jsonl"
    settings = make_settings(
        tmp_path,
        mcp_servers={
            "memory": {
                "command": str(node),
                "args": [str(mem)],
                "env": {"MEMORY_FILE_PATH": str(graph)},
            }
        },
        routes=[{"prefix": "Brain memory about", "tool": "memory:search_nodes"}],
    )

    async def body(router: NeedRouter) -> tuple[Answer, Answer]:
        await router.pool.call(
            "memory",
            "create_entities",
            {
                "entities": [
                    {
                        "name": "QueryPlanner",
                        "entityType": "component",
                        "observations": ["caches plans for 10 minutes"],
                    }
                ]
            },
        )
        hit = await ask(router, "Brain memory about QueryPlanner")
        miss = await ask(router, "Brain memory about Zanzibar")
        return hit, miss

    hit, miss = run(NeedRouter(settings), body)
    assert hit.ok and hit.tool == "memory:search_nodes"
    assert "caches plans for 10 minutes" in hit.content
    assert miss.ok and "QueryPlanner" not in miss.content
    assert "QueryPlanner" in graph.read_text()  # the server kept it in MEMORY_FILE_PATH


def test_a_killed_server_is_restarted_on_the_next_need(tmp_path: Path) -> None:
    time_cmd = peers.python_peer("mcp-server-time")
    settings = make_settings(
        tmp_path,
        mcp_servers={"time": {"command": str(time_cmd)}},
        routes=[
            {
                "prefix": "Time in",
                "tool": "time:get_current_time",
                "param": "tz",
                "args": {"timezone": "{tz}"},
            }
        ],
    )

    async def body(router: NeedRouter) -> tuple[Answer, int, int]:
        assert (await ask(router, "Time in UTC", "1")).ok
        [pid] = children(str(time_cmd))
        os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(wait_for, lambda: not alive(pid), 10, 0.01, "the kill")
        answer = await ask(router, "Time in UTC", "2")
        return answer, router.pool.servers["time"].starts, pid

    answer, starts, old = run(NeedRouter(settings), body)
    assert answer.ok and "UTC" in answer.content
    assert starts == 2
    assert children(str(time_cmd)) == []  # aclose stopped the new one too
    assert not alive(old)


# --------------------------------------------------------------------------- the test server


def test_a_server_killed_mid_call_is_restarted_and_the_need_answered(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    settings = make_settings(
        tmp_path,
        mcp_servers={"t": TEST_SERVER},
        routes=[
            {
                "prefix": "Slow thing",
                "tool": "t:sleep",
                "args": {"seconds": 1.0, "marker": str(marker)},
            }
        ],
    )

    async def body(router: NeedRouter) -> tuple[Answer, list[str], int]:
        call = asyncio.create_task(ask(router, "Slow thing"))
        await asyncio.to_thread(wait_for, marker.exists, 20, 0.01, "the call to start")
        first_pid = int(marker.read_text().split()[0])
        os.kill(first_pid, signal.SIGKILL)  # in the middle of the call
        answer = await asyncio.wait_for(call, 30)
        return answer, marker.read_text().split(), router.pool.servers["t"].starts

    answer, pids, starts = run(NeedRouter(settings), body)
    assert answer.ok, answer.content
    assert starts == 2
    assert len(pids) == 2 and pids[0] != pids[1]  # the retry ran on the new server
    assert f"in {pids[1]}" in answer.content


def test_a_hung_call_times_out_and_the_server_stays_usable(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path,
        mcp_servers={"t": {**TEST_SERVER, "timeout": 0.5}},
        routes=[
            {"prefix": "Hang", "tool": "t:sleep", "args": {"seconds": 30}},
            {"prefix": "Echo", "tool": "t:echo", "param": "text"},
        ],
    )

    async def body(router: NeedRouter) -> tuple[Answer, Answer, float]:
        started = time.monotonic()
        hung = await ask(router, "Hang")
        took = time.monotonic() - started
        return hung, await ask(router, "Echo hello"), took

    hung, echo, took = run(NeedRouter(settings), body)
    assert hung.status == "failed" and "did not answer within 0.5 s" in hung.content
    assert took < 10
    assert echo.ok and echo.content == "echo: hello"


def test_tool_errors_and_servers_that_cannot_start_become_degraded_answers(
    tmp_path: Path,
) -> None:
    settings = make_settings(
        tmp_path,
        mcp_servers={"t": TEST_SERVER, "broken": {"command": str(tmp_path / "no-such-server")}},
        routes=[
            {"prefix": "Fail", "tool": "t:fail", "param": "text"},
            {"prefix": "Broken", "tool": "broken:anything"},
            {"prefix": "Unknown tool", "tool": "t:does_not_exist"},
        ],
    )

    async def body(router: NeedRouter) -> list[Answer]:
        return [await ask(router, n) for n in ("Fail now", "Broken thing", "Unknown tool x")]

    fail, broken, unknown = run(NeedRouter(settings), body)
    assert fail.status == "failed" and "t:fail reported an error" in fail.content
    assert broken.status == "failed" and "could not start MCP server 'broken'" in broken.content
    assert unknown.status == "failed" and "does_not_exist" in unknown.content
    assert "NOT ANSWERED (failed)" in broken.render_block("Broken thing")


def test_concurrent_needs_share_one_server_and_aclose_stops_it(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path,
        mcp_servers={"t": TEST_SERVER},
        routes=[{"prefix": "Echo", "tool": "t:echo", "param": "text"}],
    )
    pids: list[int] = []

    async def body(router: NeedRouter) -> list[tuple[str, Answer | None]]:
        answered = await router.answer_all(
            [f"Echo {i}" for i in range(5)], conv_id="c", turn_key="t"
        )
        pids.append(int((await router.pool.call("t", "pid", {})).text))
        assert router.pool.servers["t"].starts == 1
        return [(n, a) for n, a in answered]

    answered = run(NeedRouter(settings), body)
    assert [a.content for _, a in answered if a] == [f"echo: {i}" for i in range(5)]
    wait_for(lambda: not alive(pids[0]), 10, what="the server to stop after aclose")


def test_roots_are_advertised_only_when_configured_and_only_inside_allowed(
    tmp_path: Path,
) -> None:
    allowed = tmp_path / "allowed"
    (allowed / "sub").mkdir(parents=True)

    async def roots(router: NeedRouter) -> str:
        return (await router.pool.call("t", "roots", {})).text

    plain = make_settings(tmp_path, mcp_servers={"t": TEST_SERVER})
    assert run(NeedRouter(plain), roots).startswith("no roots")
    with_roots = make_settings(
        tmp_path,
        mcp_servers={"t": {**TEST_SERVER, "roots": [str(allowed / "sub")]}},
        tools={"allowed_roots": [str(allowed)]},
    )
    assert run(NeedRouter(with_roots), roots) == (allowed / "sub").resolve().as_uri()
    outside = make_settings(
        tmp_path,
        mcp_servers={"t": {**TEST_SERVER, "roots": [str(tmp_path)]}},
        tools={"allowed_roots": [str(allowed)]},
    )
    with pytest.raises(ConfigError, match=r"not inside tools\.allowed_roots"):
        NeedRouter(outside)


@pytest.fixture
def http_server() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.mcp_test_server", "--http", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def listening() -> bool:
        assert proc.poll() is None, "the HTTP test server exited"
        with socket.socket() as c:
            return c.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(listening, 30, 0.05, "the HTTP MCP server")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


def test_streamable_http_server_and_the_configured_search_tool(
    tmp_path: Path, http_server: str
) -> None:
    settings = make_settings(
        tmp_path,
        mcp_servers={"web": {"url": http_server}},
        tools={"search_tool": "web:echo", "search_arguments": {"text": "results for {query}"}},
    )

    async def body(router: NeedRouter) -> Answer:
        return await ask(router, "Search results for small language models")

    answer = run(NeedRouter(settings), body)
    assert answer.ok and answer.tool == "web.search"
    assert answer.content == "echo: results for small language models"
