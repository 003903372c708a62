"""NEED routing benchmarks. Run: .venv/bin/python bench/bench_routing.py [--quick]

Prints, with the target next to each figure:
  route lookup      the pure rule table (5 defaults + 20 config rules, prefix and regex)
  answer overhead   NeedRouter.answer_all + render_block for one need, with an instant tool:
                    everything but the tool itself (rate limit, turn cache, timeout, trimming)
  context assembly  ContextAssembler.assemble with real MCP servers already running
                    (mcp-server-time and server-memory), files, notes, memory and state
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contemplation import settings as settings_mod  # noqa: E402
from contemplation.needs import rules as needrules  # noqa: E402
from contemplation.needs.router import NeedRouter  # noqa: E402
from contemplation.needs.tools.base import ToolResult  # noqa: E402
from contemplation.needs.tools.memory import MEMORY_FILE, STATE_FILE, JsonStore  # noqa: E402
from contemplation.prompt.context import ContextAssembler  # noqa: E402
from contemplation.store.layout import Conv, Home  # noqa: E402

PEERS = ROOT / ".peers"


class InstantTool:
    name = "instant"

    async def call(self, arguments: Mapping[str, Any]) -> ToolResult:
        return ToolResult("instant answer " + str(arguments), "bench")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def report(name: str, samples_ms: list[float], target_ms: float) -> None:
    p50, p99 = statistics.median(samples_ms), pct(samples_ms, 99)
    verdict = "ok" if p99 < target_ms else "OVER TARGET"
    print(
        f"{name:<18} p50 {p50 * 1000:8.1f} µs   p99 {p99 * 1000:8.1f} µs   "
        f"(n={len(samples_ms)}, target < {target_ms:g} ms: {verdict})"
    )


def config_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for i in range(10):
        rules.append({"prefix": f"Ticket queue {i}", "tool": "files.read"})
        rules.append(
            {
                "match": rf"Incident (?P<id>\d+) in zone{i}",
                "tool": "state.get",
                "args": {"thing": "incident {id}"},
            }
        )
    return rules


NEEDS = [
    "Brain memory about query patterns and performance metrics {i}",
    "Obsidian notes matching event sourcing {i}",
    "File contents of src/contemplation/router{i}.py",
    "Search results for small language models {i}",
    "Current state of the deploy pipeline {i}",
    "Incident {i} in zone7",
    "Something no rule matches at all, which walks the whole table {i}",
]


def bench_lookup(n: int) -> None:
    table = needrules.table(needrules.compile_rules(config_rules(), source="bench"))
    samples = []
    for i in range(n):
        need = NEEDS[i % len(NEEDS)].format(i=i)
        t0 = time.perf_counter()
        table.route(need)
        samples.append((time.perf_counter() - t0) * 1000)
    report("route lookup", samples, 1.0)


async def bench_answer(n: int, home: Path) -> None:
    settings = settings_mod.load(
        home=home,
        env={},
        config=None,
        overrides={"routes": config_rules(), "tools": {"limits": {"calls_per_minute": 1e9}}},
    )
    instant = InstantTool()
    tools = {
        k: instant
        for k in ("memory.search", "notes.search", "files.read", "state.get", "web.search")
    }
    samples = []
    async with NeedRouter(settings, tools=tools) as router:
        for i in range(n):
            need = NEEDS[i % (len(NEEDS) - 1)].format(i=i)  # all but the unmatched one
            t0 = time.perf_counter()
            [(asked, answer)] = await router.answer_all([need], conv_id="c", turn_key=str(i))
            assert answer is not None and answer.ok
            answer.render_block(asked)
            samples.append((time.perf_counter() - t0) * 1000)
    report("answer overhead", samples, 1.0)


async def bench_context(runs: int, tmp: Path) -> None:
    time_cmd = PEERS / "mcp-server-time" / "bin" / "mcp-server-time"
    memory_js = PEERS / "node_modules/@modelcontextprotocol/server-memory/dist/index.js"
    node = shutil.which("node")
    if not time_cmd.exists() or not memory_js.exists() or not node:
        print("context assembly  skipped: run `bash scripts/setup.sh` for the MCP servers")
        return
    project, vault = tmp / "project", tmp / "vault"
    (project / "pkg").mkdir(parents=True)
    vault.mkdir()
    for i in range(30):
        (project / "pkg" / f"mod{i}.py").write_text(f"def f{i}():\n    pass\n" * 20)
        (vault / f"note{i}.md").write_text(f"# Note {i}\nqueues and delivery {i}\n" * 30)
    (project / "README.md").write_text("# Project\n" + "text\n" * 200)
    home = Home(tmp / "home")
    JsonStore(home, MEMORY_FILE).put("delivery", "maildir semantics")
    JsonStore(home, STATE_FILE).put("ci", "green")
    settings = settings_mod.load(
        home=home.root,
        env={},
        config=None,
        overrides={
            "tools": {"allowed_roots": [str(project)], "notes_vault": str(vault)},
            "mcp_servers": {
                "time": {"command": str(time_cmd)},
                "memory": {
                    "command": node,
                    "args": [str(memory_js)],
                    "env": {"MEMORY_FILE_PATH": str(tmp / "graph.jsonl")},
                },
            },
            "routes": [
                {"prefix": "Time in", "tool": "time:get_current_time", "param": "timezone"},
                {"prefix": "Graph memory about", "tool": "memory:search_nodes"},
            ],
        },
    )
    reqs: list[dict[str, Any]] = [
        {"type": "code_structure", "path": "."},
        {"type": "files", "paths": ["README.md", "pkg/mod1.py"]},
        {"type": "notes", "query": "queues delivery"},
        {"type": "memory", "query": "delivery"},
        {"type": "state", "thing": "ci"},
        {"type": "need", "need": "Time in Europe/Berlin"},
        {"type": "need", "need": "Graph memory about delivery"},
    ]
    conv = Conv(home.active / "conv_bench")
    conv.dir.mkdir(parents=True)
    samples = []
    async with NeedRouter(settings) as router:
        await router.pool.call("time", "get_current_time", {"timezone": "UTC"})  # start them
        await router.pool.call("memory", "read_graph", {})
        ctx = ContextAssembler(router, fresh_seconds=0, durable=True)  # no cache: worst case
        for _ in range(runs):
            t0 = time.perf_counter()
            sections, _ = await ctx.assemble(conv, reqs)
            samples.append((time.perf_counter() - t0) * 1000)
            assert all(s.ok for s in sections), [s for s in sections if not s.ok]
    p50, worst = statistics.median(samples), max(samples)
    verdict = "ok" if worst < 1000 else "OVER TARGET"
    print(
        f"{'context assembly':<18} p50 {p50:8.1f} ms   max {worst:8.1f} ms   "
        f"(n={runs}, {len(reqs)} requirements, 2 MCP servers running, target < 1 s: {verdict})"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # quiet
    n = 2_000 if args.quick else 20_000
    bench_lookup(n)
    with tempfile.TemporaryDirectory() as d:
        asyncio.run(bench_answer(n // 4, Path(d) / "home"))
    with tempfile.TemporaryDirectory() as d:
        asyncio.run(bench_context(5 if args.quick else 20, Path(d)))


if __name__ == "__main__":
    main()
