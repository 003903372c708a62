"""Vectors of meaning from the person's own embedding server, when one is configured: Ollama's
``POST /api/embed`` (``embeddinggemma``, ``nomic-embed-text``, ``qwen3-embedding``...) or any
OpenAI-compatible ``POST /v1/embeddings`` (llama-server started with embeddings on, LiteLLM,
vLLM). The offline model (:mod:`contemplation.index.embedder`) stays the default.

Plain ``urllib`` (no client library on the read path), called from the embedder's own thread
like the offline model, never from an event loop. Bounded: at most :data:`BATCH` texts a
request, :data:`TIMEOUT` seconds each, :data:`MAX_RESPONSE` bytes read; every vector is
checked (one per text, all of one length, numbers) and made a unit vector, so cosines are
plain dot products as with the offline model. A server that cannot answer is one line
(:class:`Unreachable`), never a half-made vector.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from contemplation.errors import InputRejected
from contemplation.index import pending

Api = Literal["ollama", "openai"]
APIS: tuple[Api, ...] = ("ollama", "openai")
BATCH = 16
TIMEOUT = 60.0  # a request's seconds unless the setting says (``[semantic] embed_timeout``)
QUERY_TIMEOUT = 10.0  # a search's query waits at most this (then the search ranks by words)
MAX_RESPONSE = 64 << 20


class Unreachable(InputRejected):
    """The embedding server did not give vectors (down, refused, or an answer of another
    shape): said in one line with what to do."""


@dataclass(frozen=True, slots=True)
class Server:
    """One embedding model behind one server."""

    url: str  # e.g. http://127.0.0.1:11434 (Ollama) or http://127.0.0.1:8080 (llama-server)
    model: str
    api: Api = "ollama"
    timeout: float = TIMEOUT

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise InputRejected(f"an embedding server's timeout is seconds above 0: {self.timeout}")
        if not self.url.startswith(("http://", "https://")):
            raise InputRejected(f"an embedding server is an http:// or https:// URL: {self.url!r}")
        if self.api not in APIS or not self.model.strip():
            raise InputRejected(f"an embedding server needs a model and an api of {APIS}")

    @property
    def tag(self) -> str:
        """What the index records as the model that made a vector."""
        return pending.model_tag(self.url, self.model, self.api)

    def embed(self, texts: list[str], timeout: float | None = None) -> list[list[float]]:
        """Unit vectors of ``texts``, one each, in order; each request ``timeout`` seconds
        at most (None: the server's)."""
        out: list[list[float]] = []
        for i in range(0, len(texts), BATCH):
            out.extend(self._batch(texts[i : i + BATCH], timeout or self.timeout))
        return out

    def _batch(self, texts: list[str], timeout: float) -> list[list[float]]:
        import urllib.error  # (with http.client and email: a search by words never loads them)
        import urllib.request

        path = "/api/embed" if self.api == "ollama" else "/v1/embeddings"
        body = json.dumps({"model": self.model, "input": texts}).encode()
        req = urllib.request.Request(  # noqa: S310 - http(s) only (checked when made)
            self.url.rstrip("/") + path,
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
                raw = resp.read(MAX_RESPONSE + 1)
        except urllib.error.HTTPError as exc:
            said = exc.read(2048).decode("utf-8", "replace").strip()
            raise Unreachable(f"{self._who()} answered {exc.code}: {said[:300]}") from None
        except (OSError, ValueError) as exc:
            raise Unreachable(f"{self._who()} is not reachable: {exc}") from None
        if len(raw) > MAX_RESPONSE:
            raise Unreachable(f"{self._who()} answered more than {MAX_RESPONSE >> 20} MiB")
        try:
            got = json.loads(raw)
        except ValueError:
            raise Unreachable(f"{self._who()} answered something that is not JSON") from None
        return [_unit(v, self._who()) for v in self._vectors(got, len(texts))]

    def _vectors(self, got: Any, n: int) -> list[Any]:
        if self.api == "ollama":
            vecs = got.get("embeddings") if isinstance(got, dict) else None
        else:
            data = got.get("data") if isinstance(got, dict) else None
            rows = data if isinstance(data, list) else []
            ok = all(isinstance(r, dict) for r in rows)
            ranked = sorted(rows, key=lambda r: int(r.get("index", 0))) if ok else []
            vecs = [r.get("embedding") for r in ranked] if ok and rows else None
        if not isinstance(vecs, list) or len(vecs) != n:
            raise Unreachable(f"{self._who()} did not give one vector a text ({n} asked)")
        if len({len(v) if isinstance(v, list) else -1 for v in vecs}) != 1:
            raise Unreachable(f"{self._who()} gave vectors of different lengths")
        return vecs

    def _who(self) -> str:
        return f"the embedding server {self.url} ({self.api}, model {self.model!r})"


def _unit(v: Any, who: str) -> list[float]:
    if not isinstance(v, list) or not v or not all(isinstance(x, int | float) for x in v):
        raise Unreachable(f"{who} gave a vector that is not a list of numbers")
    norm = math.sqrt(sum(float(x) * float(x) for x in v))
    if not norm or not math.isfinite(norm):
        raise Unreachable(f"{who} gave a vector of no length")
    return [float(x) / norm for x in v]
