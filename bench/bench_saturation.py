"""Saturation: does the daemon keep a server's slots as busy as a direct client does?

Run: .venv/bin/python bench/bench_saturation.py [--conversations 16] [--max-tokens 48]
     [--rounds 3] [--failover 40] [--skip-failover]
On a GPU (bench/gpu/run.sh): ... --llama-server BUILD/bin/llama-server --gguf MODEL
     [--slots N] --only-one    (a llama.cpp build of one's own; slots: the server's choice)

Real llama-servers (xllamacpp's build of upstream llama-server, SmolLM2-135M, each its own
process on loopback) and the daemon as its own process (``contemplation run``, default
settings but for a config.toml naming the providers: concurrency ``auto``, so the slots are
whatever the server's ``/props`` says). Every reply is the same length (temperature 0,
``max_tokens`` with ``ignore_eos``) and both sides send the same messages (the daemon's
system prompt, built by the daemon's own code, and the same user text).

1. one server with 4 slots: the daemon against a direct streaming client at 4 at once;
2. two servers with 2 slots each, an alias over both: the daemon against a direct client
   that keeps 2 requests in flight on each;
3. fail-over: a burst of ``--failover`` conversations over that alias, undisturbed, then
   again with one server killed (SIGKILL) once the first replies are in; every conversation
   must be answered exactly once, and the time to the last reply is compared.

Half the conversations are made with the CLI (``contemplation new``), half by hand (a
folder and a message file written by the library); the messages are dropped together when a
burst starts, and a burst ends when every reply is committed (state.json says idle).
Rounds are interleaved (direct, daemon, direct, daemon ...); the median of each is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gpu.server import BinaryLlamaServer  # noqa: E402
from contemplation.models import BlockKind, Metadata, Status  # noqa: E402
from contemplation.needs.router import NeedRouter  # noqa: E402
from contemplation.prompt.prompts import build_request, need_forms  # noqa: E402
from contemplation.protocol.logformat import header  # noqa: E402
from contemplation.protocol.parser import parse  # noqa: E402
from contemplation.settings import load  # noqa: E402
from contemplation.store.layout import Conv, Home, read_state  # noqa: E402
from contemplation.store.templates import load_template  # noqa: E402
from contemplation.writer import drop_message, new_conversation  # noqa: E402
from tests import peers  # noqa: E402
from tests.realpeers import LlamaServer  # noqa: E402

Server = LlamaServer | BinaryLlamaServer

TOPICS = ["a lighthouse keeper", "a clockmaker", "a river pilot", "a beekeeper"]


def prompt(i: int) -> str:
    return f"Write a short story about {TOPICS[i % len(TOPICS)]} (number {i})."


def options(max_tokens: int) -> dict[str, Any]:
    return {"temperature": 0, "num_predict": max_tokens, "ignore_eos": True, "seed": 1}


def topic(i: int) -> str:
    return f"story {i}"


def messages(home: Home, i: int, max_tokens: int) -> list[dict[str, str]]:
    """What the daemon sends for conversation ``i``'s first message (its topic included):
    the daemon's own code builds it."""
    tpl = load_template(home, "default")
    text = prompt(i)
    meta = Metadata(
        id="conv_bench", topic=topic(i), created="2026-11-25T00:00:00", backend="small",
        model="smollm2", options=options(max_tokens),
    )  # fmt: skip
    log = header("CLAUDE", "SMALL", "2026-11-25 00:00:00") + text + "\n"
    blocks = parse(log.encode()).blocks
    settings = load(home=home.root, env={}, config=None)
    offered = need_forms(NeedRouter(settings).offered(tpl.name))  # as the daemon offers them
    req = build_request(
        meta, blocks, template_prompt=tpl.system_prompt, prompt_mode=tpl.prompt_mode, needs=offered
    )
    return [{"role": m.role, "content": m.content} for m in req.messages]


# --------------------------------------------------------------------------- direct client


async def _one(
    session: aiohttp.ClientSession, url: str, msgs: list[dict[str, str]], max_tokens: int
) -> int:
    body = {
        "model": "smollm2", "messages": msgs, "stream": True, "temperature": 0,
        "max_tokens": max_tokens, "ignore_eos": True, "seed": 1,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    tokens = 0
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            usage = json.loads(line[6:]).get("usage")
            if usage:
                tokens = int(usage.get("completion_tokens") or 0)
    return tokens


async def direct(
    urls: list[str], per_server: int, prompts: list[list[dict[str, str]]], max_tokens: int
) -> tuple[float, int]:
    """``per_server`` requests in flight on each server, pulling from one queue."""
    queue: asyncio.Queue[list[dict[str, str]]] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    total = 0

    async def worker(session: aiohttp.ClientSession, url: str) -> None:
        nonlocal total
        while True:
            try:
                msgs = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            got = await _one(session, url, msgs, max_tokens)  # (not `total += await`: that
            total += got  # reads total before the await, and loses the others' updates)

    # a fresh connection per request: llama-server closes kept-alive ones after a stream
    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(session, u) for u in urls for _ in range(per_server)))
        return time.perf_counter() - t0, total


# --------------------------------------------------------------------------- the daemon


class Daemon:
    """``contemplation run`` in a temp home with a config naming the providers."""

    def __init__(self, config: str) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="bench-saturation-"))
        self.home = Home(self.tmp / "home")
        cfg = self.tmp / "config.toml"
        cfg.write_text("archive_on_complete = false\n" + config)  # SmolLM2 may say COMPLETE
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("CONTEMPLATION_")},
            "CONTEMPLATION_HOME": str(self.home.root),
            "CONTEMPLATION_CONFIG": str(cfg),
            "CONTEMPLATION_LOG_LEVEL": "warning",
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "contemplation", "run", "--no-dashboard"],
            env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not self.home.daemon_info.exists():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the daemon did not start")
            time.sleep(0.05)
        self.made = 0

    def conversations(self, n: int, backend: str, model: str) -> list[Conv]:
        """Half by the CLI, half by hand; no message yet."""
        convs = []
        for i in range(n):
            self.made += 1
            name = topic(i)
            if i % 2 == 0:
                out = subprocess.run(
                    [sys.executable, "-m", "contemplation", "new", name, "--model", model],
                    env=self.env, cwd=ROOT, capture_output=True, text=True, check=True,
                )  # fmt: skip
                convs.append(Conv(self.home.active / out.stdout.strip()))
            else:
                tpl = load_template(self.home, "default")
                convs.append(
                    new_conversation(self.home, name, template=tpl, model=model, backend=backend)
                )
        return convs

    def burst(
        self, convs: list[Conv], texts: list[str], kill: Server | None = None
    ) -> tuple[float, int]:
        t0 = time.perf_counter()
        for c, text in zip(convs, texts, strict=True):
            drop_message(c, text)
        killed = kill is None
        left, ended = list(convs), t0
        while left:  # a light poll (state.json of those not done, every 20 ms): the harness
            # must not take the cores the server and the daemon share
            now = time.perf_counter()
            still = [c for c in left if not _idle(c)]
            if len(still) < len(left):
                ended = now
            left = still
            if not killed and len(convs) - len(left) >= 3:
                assert kill is not None
                kill.kill()
                killed = True
            if now - t0 > 900:
                raise RuntimeError(f"only {len(convs) - len(left)} of {len(convs)} answered")
            if left:
                time.sleep(0.02)
        wall = ended - t0
        tokens = 0
        for c in convs:
            whole = [
                b for b in parse(c.log.read_bytes()).blocks
                if b.kind is BlockKind.MODEL and not b.interrupted
            ]  # fmt: skip
            if len(whole) != 1:
                raise RuntimeError(f"{c.id}: {len(whole)} whole replies, not one")
            state = read_state(c)
            tokens += (state.last_turn.eval_count or 0) if state and state.last_turn else 0
        return wall, tokens

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _idle(conv: Conv) -> bool:
    """The reply is committed (its whole-ness is checked from the log after the burst)."""
    state = read_state(conv)
    done = {Status.IDLE, Status.COMPLETE}  # (a reply may end with COMPLETE)
    return state is not None and state.status in done and state.last_turn is not None


def _provider(name: str, url: str) -> str:
    return f'[providers.{name}]\nkind = "openai"\nurl = "{url}/v1"\napi_key = "none"\n'


def _alias(providers: list[str], max_tokens: int) -> str:
    opts = ", ".join(f"{k} = {json.dumps(v)}" for k, v in options(max_tokens).items())
    names = ", ".join(json.dumps(p) for p in providers)
    return f'[aliases.small]\nmodel = "smollm2"\nproviders = [{names}]\noptions = {{ {opts} }}\n'


def compare(
    label: str, servers: Sequence[Server], per_server: int, args: argparse.Namespace
) -> None:
    names = [f"box{i + 1}" for i in range(len(servers))]
    config = "".join(_provider(n, s.url) for n, s in zip(names, servers, strict=True))
    daemon = Daemon(config + _alias(names, args.max_tokens))
    try:
        texts = [prompt(i) for i in range(args.conversations)]
        msgs = [messages(daemon.home, i, args.max_tokens) for i in range(len(texts))]
        urls = [s.url for s in servers]
        # warm: the server's prompt cache holds these prompts for both sides from here on
        asyncio.run(direct(urls, per_server, msgs, args.max_tokens))
        daemon.burst(daemon.conversations(2, "small", "small"), texts[:2])
        d_rates, c_rates = [], []
        for _ in range(args.rounds):
            wall, tokens = asyncio.run(direct(urls, per_server, msgs, args.max_tokens))
            d_rates.append(tokens / wall)
            convs = daemon.conversations(args.conversations, "small", "small")
            wall, tokens = daemon.burst(convs, texts)
            c_rates.append(tokens / wall)
        d, c = statistics.median(d_rates), statistics.median(c_rates)
        print(
            f"{label}: direct {d:.1f} tok/s, daemon {c:.1f} tok/s, ratio {c / d:.2f}x "
            f"(rounds: direct {', '.join(f'{r:.1f}' for r in d_rates)}; "
            f"daemon {', '.join(f'{r:.1f}' for r in c_rates)})",
            flush=True,
        )
    finally:
        daemon.stop()


def failover(args: argparse.Namespace) -> None:
    servers = [_server(2, share=2), _server(2, share=2)]
    config = _provider("box1", servers[0].url) + _provider("box2", servers[1].url)
    daemon = Daemon(config + _alias(["box1", "box2"], args.max_tokens))
    try:
        texts = [prompt(i) for i in range(args.failover)]
        daemon.burst(daemon.conversations(2, "small", "small"), texts[:2])  # warm
        calm, _ = daemon.burst(daemon.conversations(args.failover, "small", "small"), texts)
        hit, _ = daemon.burst(
            daemon.conversations(args.failover, "small", "small"), texts, kill=servers[1]
        )
        print(
            f"fail-over: {args.failover} conversations, each answered exactly once; "
            f"undisturbed {calm:.1f} s, with box2 killed after the first 3 replies {hit:.1f} s "
            f"({hit / calm:.2f}x)",
            flush=True,
        )
    finally:
        daemon.stop()
        for s in servers:
            s.stop()


def _server(slots: int, share: int = 1) -> LlamaServer:
    """A llama-server with ``slots``; ``share``: servers on this machine (each gets its part of
    the cores: llama.cpp's threads spin while they wait, two servers with all cores each
    would fight over them)."""
    threads = max(1, (os.cpu_count() or 2) // share) if share > 1 else 0
    return LlamaServer(peers.smollm2_gguf(), n_ctx=2048, n_parallel=slots, threads=threads).start()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--failover", type=int, default=40)
    ap.add_argument("--skip-failover", action="store_true")
    ap.add_argument("--llama-server", type=Path, help="a llama-server binary (default: xllamacpp)")
    ap.add_argument("--gguf", type=Path, help="the model for --llama-server")
    ap.add_argument("--slots", type=int, help="slots of the one server (--llama-server: its own)")
    ap.add_argument("--only-one", action="store_true", help="one server only (implies no fail-over)")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs; {args.conversations} conversations a burst, "
          f"{args.max_tokens} tokens each (ignore_eos), median of {args.rounds} rounds", flush=True)  # fmt: skip
    one: list[Server]
    if args.llama_server:
        gguf = args.gguf or peers.smollm2_gguf()
        one = [BinaryLlamaServer(args.llama_server, gguf, n_parallel=args.slots or 0).start()]
    else:
        one = [_server(args.slots or 4)]
    slots = one[0].n_parallel
    try:
        compare(f"one server, {slots} slots", one, slots, args)
    finally:
        one[0].stop()
    if args.only_one:
        return
    two = [_server(2, share=2), _server(2, share=2)]
    try:
        compare("two servers, 2 slots each (alias)", two, 2, args)
    finally:
        for s in two:
            s.stop()
    if not args.skip_failover:
        failover(args)


if __name__ == "__main__":
    main()
