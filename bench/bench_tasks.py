"""MCP tasks benchmark. Run: .venv/bin/python bench/bench_tasks.py [--quick]

With N conversations in the home (default 500), over stdio to a real ``contemplation mcp``
process, spoken as Claude Code speaks it (the 2026-07-28 ``_meta`` envelope):

  conversation_start, plain       today's result (a client without the tasks extension)
  conversation_start → task       the CreateTaskResult (message and task record durable)
  tasks/get                       a working task, read from the conversation's folder

Target: CreateTaskResult p95 <= 200 ms at 500 conversations.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_faces import env_for, line, pct, populate  # noqa: E402
from contemplation.store.layout import Home  # noqa: E402

TASKS = "io.modelcontextprotocol/tasks"


class Wire:
    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "contemplation", "mcp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=ROOT,
        )
        self.ids = 0
        self.request("server/discover", {}, tasks=True)

    def request(self, method: str, params: dict[str, Any], *, tasks: bool) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.ids += 1
        caps: dict[str, Any] = {"extensions": {TASKS: {}}} if tasks else {}
        meta = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": caps,
        }
        msg = {"jsonrpc": "2.0", "id": self.ids, "method": method}
        msg["params"] = {**params, "_meta": meta}
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()
        for _ in range(1000):
            got = json.loads(self.proc.stdout.readline())
            if got.get("id") == self.ids:
                return dict(got["result"])
        raise AssertionError(method)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(10)


def timed(wire: Wire, method: str, params: dict[str, Any], *, tasks: bool) -> tuple[float, Any]:
    t0 = time.perf_counter()
    got = wire.request(method, params, tasks=tasks)
    return (time.perf_counter() - t0) * 1000, got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--conversations", type=int, default=500)
    args = ap.parse_args()
    runs = 20 if args.quick else 100
    with tempfile.TemporaryDirectory() as tmp:
        home = Home(Path(tmp) / "home")
        populate(home, args.conversations)
        wire = Wire(env_for(home))
        plain, created, got = [], [], []
        task_ids = []
        for i in range(runs):
            start = {
                "name": "conversation_start",
                "arguments": {"topic": f"b{i}", "initial_prompt": "hi"},
            }
            ms, _ = timed(wire, "tools/call", start, tasks=False)
            plain.append(ms)
            ms, task = timed(
                wire,
                "tools/call",
                start | {"arguments": {"topic": f"t{i}", "initial_prompt": "hi"}},
                tasks=True,
            )
            assert task["resultType"] == "task", task
            created.append(ms)
            task_ids.append(task["taskId"])
        for task_id in task_ids:
            ms, _ = timed(wire, "tasks/get", {"taskId": task_id}, tasks=True)
            got.append(ms)
        wire.close()
    n = args.conversations
    line(f"conversation_start plain ({n})", plain, "as today")
    line(f"start → CreateTaskResult ({n})", created, "p95 <= 200 ms")
    line(f"tasks/get working ({n})", got, "-")
    print(f"CreateTaskResult p95 {pct(created, 95):.1f} ms")


if __name__ == "__main__":
    main()
