"""A llama-server binary (a build of upstream llama.cpp, e.g. with CUDA on the lent GPU
machine) as a process of its own, with the interface of ``tests.realpeers.LlamaServer``.

The slot count is left to the server unless given (``-np`` auto): the daemon discovers it from
``/props`` as it does for any server, and the benchmarks read it from there too.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from tests import procgroups
from tests.realpeers import LlamaServer


class BinaryLlamaServer(LlamaServer):
    def __init__(
        self, binary: Path, gguf: Path, *, n_ctx: int = 2048, n_parallel: int = 0,
        alias: str = "smollm2",
    ) -> None:  # fmt: skip
        super().__init__(gguf, n_ctx=n_ctx, n_parallel=n_parallel, alias=alias)
        self.binary = binary  # n_parallel 0: the server's own choice

    def start(self, timeout: float = 180) -> BinaryLlamaServer:
        argv = [
            str(self.binary), "-m", str(self.gguf), "--host", "127.0.0.1",
            "--port", str(self.port), "--alias", self.alias, "-ngl", "all", "--metrics",
        ]  # fmt: skip
        if self.n_parallel:  # n_ctx per slot, as tests/llama_server.py does
            argv += ["-np", str(self.n_parallel), "-c", str(self.n_ctx * self.n_parallel)]
        with self.log.open("ab") as out:
            self.proc = procgroups.popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self._ready(f"{self.url}/health", self.log, timeout)
        props = httpx.get(f"{self.url}/props", timeout=10).json()
        self.n_parallel = int(props["total_slots"])  # what the daemon will discover
        return self
