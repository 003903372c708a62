"""Real servers for tests and benchmarks: upstream llama-server (xllamacpp) and ``opencode serve``.

Each is a real process on loopback with its log in a temp dir (shown when it fails to start).
:func:`shared_llama_server` starts one SmolLM2 server per test session (several test modules
share it; it is stopped at exit). Readiness is polled with a per-request timeout: a server that
is still booting may accept a connection and not answer it (OpenCode does). Each runs in a
process group of its own (:mod:`tests.procgroups`): one that fails to start is killed at once,
and any still running when pytest ends, however it ends, is killed then.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests import peers, procgroups

OPENCODE_OFFLINE_ENV = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _poll(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Until ``url`` answers 200; fail with the log if the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited ({proc.returncode}):\n{_tail(log)}")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url}: not ready after {timeout:g} s:\n{_tail(log)}")
        time.sleep(0.1)


# Each peer's folder (its log, its slot files, OpenCode's home) lies in one folder of this
# process's, removed when it exits: one folder each in /tmp was ~5 GB after a few runs (a
# llama-server's saved slots alone ~300 MB).
_SCRATCH = Path(tempfile.mkdtemp(prefix="contemplation-peers-"))
atexit.register(shutil.rmtree, _SCRATCH, True)  # registered first: run after the stops


def _scratch(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir=_SCRATCH))


def _tail(log: Path, n: int = 4000) -> str:
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


class _Proc:
    proc: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 3 s (an idle peer exits in well under a second;
        OpenCode with a reply in flight held a test's teardown for the whole of the 10 s
        this once waited)."""
        p = self.proc
        if p is None or p.poll() is not None:
            return
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(3)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def kill(self) -> None:
        """SIGKILL at once (a crash)."""
        p = self.proc
        if p is not None and p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def _ready(self, url: str, log: Path, timeout: float) -> None:
        """Until ``url`` answers; a server that does not (or an interrupted wait) is killed."""
        assert self.proc is not None
        try:
            _poll(url, self.proc, log, timeout)
        except BaseException:
            self.kill()
            raise


def share_of_the_cores(servers: int = 1) -> int:
    """The CPU threads each of ``servers`` llama-servers started here at once may use: 0
    (llama.cpp's choice, every core) for one in one process; else its share of the cores,
    under pytest-xdist its share of its worker's. llama.cpp's threads spin while they wait
    for each other, so two servers with every core each, one per worker, generating at once,
    starved each other: 200 tokens each took 4.4 s alone and did not finish in 300 s side by
    side on two cores; with a core each, 6.6 s alone and 7.1 s side by side
    (``bench/bench_threads.py``)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)  # set by xdist in workers
    sharing = servers * max(1, workers)
    return max(1, (os.cpu_count() or 1) // sharing) if sharing > 1 else 0


class LlamaServer(_Proc):
    """Upstream llama-server (xllamacpp's build, ``tests/llama_server.py``) serving SmolLM2 as
    ``alias``, with ``n_parallel`` slots of ``n_ctx`` tokens, on ``threads`` CPU threads
    (None: :func:`share_of_the_cores`)."""

    def __init__(
        self,
        gguf: Path,
        *,
        n_ctx: int = 8192,
        n_parallel: int = 1,
        alias: str = "smollm2",
        threads: int | None = None,
        slot_save: bool = False,
        kv_unified: bool = False,
    ) -> None:
        self.gguf = gguf
        self.kv_unified = kv_unified  # llama-server's way with -np left to it (see llama_server.py)
        self.slot_save = slot_save  # /slots save and restore (--slot-save-path): slot copies
        self.threads = share_of_the_cores() if threads is None else threads
        self.n_ctx = n_ctx
        self.n_parallel = n_parallel
        self.alias = alias
        self.port = free_port()
        self.dir = _scratch("llama-server-")
        self.log = self.dir / "server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> LlamaServer:
        argv = [
            sys.executable, str(Path(__file__).with_name("llama_server.py")), str(self.gguf),
            "--port", str(self.port), "--n-ctx", str(self.n_ctx),
            "--n-parallel", str(self.n_parallel), "--alias", self.alias,
            "--threads", str(self.threads),
        ] + (["--slot-save-path", str(self.dir / "slots")] if self.slot_save else []) + (
            ["--kv-unified"] if self.kv_unified else []
        )  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = procgroups.popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self._ready(f"{self.url}/health", self.log, timeout)
        return self


def serving_smollm2(**kwargs: Any) -> Iterator[LlamaServer]:
    """For a fixture: a SmolLM2 llama-server (``LlamaServer``'s keywords), started, yielded
    and stopped however the tests end."""
    peers.xllamacpp_available()
    server = LlamaServer(peers.smollm2_gguf(), **kwargs).start()
    try:
        yield server
    finally:
        server.stop()


class OpenCodeServer(_Proc):
    """``opencode serve`` in a scratch project with a private HOME, offline, whose one
    provider ``local`` points at an OpenAI-compatible server (``model_id`` is its model id)
    and whose default agent's prompt is one line."""

    def __init__(
        self, llama_url: str, *, model_id: str = "smollm2", context: int = 8192, output: int = 512
    ) -> None:
        self.binary = peers.node_bin("opencode")
        self.root = _scratch("opencode-")
        self.home = self.root / "home"
        self.work = self.root / "project"
        self.home.mkdir()
        self.work.mkdir()
        self.log = self.root / "server.log"
        self.port = free_port()
        config = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                "local": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Local llama.cpp",
                    "options": {"baseURL": f"{llama_url}/v1", "apiKey": "sk-local"},
                    "models": {
                        model_id: {
                            "name": model_id,
                            "limit": {"context": context, "output": output},
                        }
                    },
                }
            },
            "model": f"local/{model_id}",
            "small_model": f"local/{model_id}",
            # The default agent's own prompt, one line: OpenCode's built-in coding prompt is
            # ~2,200 tokens, which SmolLM2 on a test's one core reads at ~70 tokens/s: 30 s
            # (90 s under load) before each slot's first reply. What these tests test (the
            # sessions, the prompt body, kills, restarts) does not depend on its words.
            "agent": {"build": {"prompt": "You are a helpful assistant."}},
            "autoupdate": False,
            "share": "disabled",
        }
        (self.work / "opencode.json").write_text(json.dumps(config, indent=2))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENCODE_", "XDG_"))}
        env.update(OPENCODE_OFFLINE_ENV)
        env.update(
            HOME=str(self.home),
            XDG_CONFIG_HOME=str(self.home / ".config"),
            XDG_DATA_HOME=str(self.home / ".local" / "share"),
            XDG_CACHE_HOME=str(self.home / ".cache"),
            XDG_STATE_HOME=str(self.home / ".local" / "state"),
        )
        return env

    def start(self, timeout: float = 120) -> OpenCodeServer:
        argv = [
            str(self.binary), "serve", "--port", str(self.port), "--hostname", "127.0.0.1",
            "--pure",
        ]  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = procgroups.popen(
                argv, cwd=self.work, env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        self._ready(f"{self.url}/global/health", self.log, timeout)
        return self


class LiteLLMProxy(_Proc):
    """LiteLLM's proxy (``.peers/litellm``) over ``servers``: one ``model_list`` entry per
    server under the one name ``model`` (its router balances them), its own retries off so
    that contemplation's decide (docs/guides/servers.md has the same config)."""

    def __init__(self, servers: list[str], *, model: str = "smollm2") -> None:
        self.binary = peers.python_peer("litellm")
        self.port = free_port()
        self.dir = _scratch("litellm-")
        self.log = self.dir / "proxy.log"
        self.config = self.dir / "litellm.yaml"
        entries = [
            {
                "model_name": model,
                "litellm_params": {
                    "model": f"openai/{model}",
                    "api_base": f"{url}/v1",
                    "api_key": "none",
                },
            }
            for url in servers
        ]
        config = {
            "model_list": entries,
            "router_settings": {"num_retries": 0, "routing_strategy": "least-busy"},
            "litellm_settings": {"num_retries": 0, "request_timeout": 120},
        }
        self.config.write_text(json.dumps(config, indent=2))  # JSON is YAML

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> LiteLLMProxy:
        argv = [
            str(self.binary), "--config", str(self.config), "--host", "127.0.0.1",
            "--port", str(self.port),
        ]  # fmt: skip
        env = {**os.environ, "LITELLM_LOG": "ERROR", "DISABLE_SCHEMA_UPDATE": "true"}
        with self.log.open("ab") as out:
            self.proc = procgroups.popen(
                argv, cwd=self.dir, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        self._ready(f"{self.url}/health/liveliness", self.log, timeout)
        return self


_shared: dict[tuple[tuple[str, Any], ...], LlamaServer] = {}


def shared_llama_server(**config: Any) -> LlamaServer:
    """One SmolLM2 server per configuration (``LlamaServer``'s keywords: n_ctx 8192, alias
    ``smollm2`` by default) per process, for the tests that neither stop it nor depend on
    what it served before (they read its counters as differences); skipped or failed (under
    CI) through :mod:`tests.peers` when xllamacpp or the model is missing."""
    peers.xllamacpp_available()
    gguf = peers.smollm2_gguf()
    key = tuple(sorted(config.items()))
    if key not in _shared:
        server = LlamaServer(gguf, **config).start()
        atexit.register(server.stop)
        _shared[key] = server
    return _shared[key]
