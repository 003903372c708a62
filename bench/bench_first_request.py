"""How often the real Claude Code's first model request lists contemplation's tools:
10 fresh Claude Codes with ``claude -p`` and 10 interactive ones given
their prompt at start, each spawning a fresh ``contemplation mcp``; "Claude" is the scripted
Messages API (tests/fakes/anthropic_server.py), the daemon need not run.

    .venv/bin/python bench/bench_first_request.py [--runs 10]

Prints, per mode, how many first requests listed the tools, and how many offered Claude
Code's WaitForMcpServers instead (a server still connecting).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' scripted peers

from contemplation.store.layout import Home
from tests.fakes.anthropic_server import WAIT_FOR_SERVERS, FakeAnthropic
from tests.fakes.ollama_server import FakeOllama
from tests.system.test_claude_code_first_request import (
    first_requests,
    interactive,
    printed,
)
from tests.system.test_claude_code_tasks import START


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    runs = parser.parse_args().runs
    made: list[FakeAnthropic] = []

    def make() -> FakeAnthropic:
        made.append(FakeAnthropic().start())
        return made[-1]

    ollama = FakeOllama().start()
    try:
        for name, mode in (("claude -p", printed), ("interactive", interactive)):
            with tempfile.TemporaryDirectory() as tmp:
                home = Home(Path(tmp) / "home")
                home.root.mkdir()
                firsts = first_requests(home, Path(tmp), ollama, make, mode, runs)
            listed = sum(START in tools for tools in firsts)
            waited = sum(START not in tools and WAIT_FOR_SERVERS in tools for tools in firsts)
            print(
                f"{name:12} tools in the first request: {listed}/{runs}; "
                f"WaitForMcpServers offered instead: {waited}/{runs}"
            )
    finally:
        for fake in made:
            fake.stop()
        ollama.stop()


if __name__ == "__main__":
    main()
