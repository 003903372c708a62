"""Every search is bounded: ``a*`` with a hit in a 200 MB block ran
10.7 min, a 100 KB query 30 s, the dashboard's searches could not be stopped, and
``x) OR thinking : (word`` searched the thinking without --thinking.

A real index over a generated 50 MB log (four blocks of 12 MB, a word on every line) and
40,000 small blocks; the bound is set small (search_seconds) and each face must say the cut."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client
from structlog.testing import capture_logs

from contemplation import settings as settings_mod
from contemplation.errors import InputRejected
from contemplation.faces.mcp import server as mcp_server
from contemplation.index import db as index_db
from contemplation.index import search as search_index
from contemplation.store.layout import Home
from contemplation.store.templates import load_template
from contemplation.writer import new_conversation, open_writer
from tests.conftest import base_env, cli_here, wait_for
from tests.dashboard_served import Served, serve
from tests.system.test_mcp_server import tool

MB = 1 << 20
BIG_BLOCKS = 4
BLOCK_MB = 12  # under the index's bound of a block (logstream.MAX_BLOCK_BYTES)
SMALL_CONVS, SMALL_BLOCKS = 40, 1000
LINE = (
    "alpaca " * 9 + "llama vicuna guanaco\n"
)  # a dense word: FTS5 snippet() time grows as its square


def _big_log(path: Path) -> None:
    """Four agent/model blocks of 12 MB: 'alpaca' on every line, 'quagga' once, at the end
    of each; 'pangolin' only in the model's thinking."""
    path.parent.mkdir(parents=True)
    (path.parent / "inbox").mkdir()
    body = LINE * (BLOCK_MB * MB // len(LINE))
    with path.open("w") as f:
        for i in range(BIG_BLOCKS):
            who = "CLAUDE -> OLLAMA" if i % 2 == 0 else "OLLAMA -> CLAUDE"
            f.write(f"=== {who} [2025-03-01 10:00:0{i}] ===\n{body}the quagga at the end\n\n")


def _small_logs(home: Home) -> None:
    """40 conversations of 1,000 blocks, 'common' in every block."""
    for c in range(SMALL_CONVS):
        d = home.active / f"conv_small{c:03d}"
        (d / "inbox").mkdir(parents=True)
        blocks = (
            f"=== {'CLAUDE -> OLLAMA' if b % 2 == 0 else 'OLLAMA -> CLAUDE'} "
            f"[2025-03-02 10:00:00] ===\ncommon words in block {b} of {c} about nothing much\n"
            for b in range(SMALL_BLOCKS)
        )
        (d / "messages.log").write_text("\n".join(blocks))


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Home:
    home = Home(tmp_path_factory.mktemp("bounds") / "home")
    _big_log(home.active / "conv_20250301-100000_herd" / "messages.log")
    _small_logs(home)
    conv = new_conversation(
        home, "Thinking", template=load_template(home, "default"), model="m", backend="ollama"
    )
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "what do you think?", msg_id="q")
        r = w.reply("OLLAMA", "CLAUDE", "r")
        r.thinking("a pangolin crossed my mind")
        r.content("nothing to say")
        r.finish()
    index_db.read(home, lambda conn: None)  # indexed once, outside every bound
    return home


def _timed(fn: object, *args: object, **kw: object) -> tuple[object, float]:
    t = time.monotonic()
    got = fn(*args, **kw)  # type: ignore[operator]
    return got, time.monotonic() - t


# --------------------------------------------------------------------------- the bound


def test_a_word_on_every_line_of_a_50_mb_log_is_found_in_bounded_time(big: Home) -> None:
    """FTS5's snippet() over these blocks took minutes (its time grows with the square of a
    block's matches); now the hits come with their snippet within the bound."""
    found, took = _timed(search_index.find, big, "alpaca", seconds=5)
    assert isinstance(found, search_index.Found)
    assert took < 3, f"{took:.1f} s"
    assert not found.cut and len(found.hits) == BIG_BLOCKS
    assert all("«alpaca»" in h.snippet for h in found.hits), found.hits[0].snippet
    # a word only at the end of each 12 MB block: found, and shown where it is
    found, took = _timed(search_index.find, big, "quagga", seconds=5)
    assert isinstance(found, search_index.Found)
    assert took < 5, f"{took:.1f} s"
    assert [h.snippet.endswith("the «quagga» at the end") for h in found.hits] == [True] * 4


def test_a_search_past_its_bound_is_cut_and_says_so(big: Home) -> None:
    """'common' is in 40,000 blocks: ranking them takes about 0.1 s here, ten times the
    bound. The search stops at the bound and says it was cut, in every face."""
    found, took = _timed(search_index.find, big, "common", seconds=0.01)
    assert isinstance(found, search_index.Found)
    assert took < 1, f"{took:.2f} s"
    assert found.cut.startswith("search cut after 0.01 s: ") and found.hits == []
    assert "search_seconds" in found.cut
    # the CLI: the line on stderr, exit 0
    env = base_env(big, CONTEMPLATION_SEARCH_SECONDS="0.01")
    out = cli_here(env, "search", "common")
    assert "search cut after 0.01 s" in out.stderr and out.stdout == ""
    # MCP: the result says it
    s = settings_mod.load(home=big.root, env={}, config=None, overrides={"search_seconds": 0.01})

    async def over_mcp() -> dict[str, object]:
        async with Client(mcp_server.build_server(s)) as c:
            return await tool(c, "conversation_search", query="common")

    got = asyncio.run(over_mcp())
    assert str(got["cut"]).startswith("search cut after 0.01 s") and got["count"] == 0
    # the dashboard: 200, with the cut in the answer (the page shows it under the hits)
    with serve(s) as served:
        r = httpx.get(
            f"{served.base}/api/search",
            params={"q": "common"},
            headers={"Authorization": f"Bearer {served.token}"},
            timeout=10,
        )
    assert r.status_code == 200 and r.json()["cut"].startswith("search cut after 0.01 s")
    app_js = resources.files("contemplation.faces.dashboard").joinpath("static", "app.js").read_text()
    assert "data.cut" in app_js


def test_a_cancelled_search_stops_at_once(big: Home) -> None:
    import threading

    cancel = threading.Event()
    threading.Timer(0.02, cancel.set).start()
    found, took = _timed(search_index.find, big, "common", seconds=60, cancel=cancel)
    assert isinstance(found, search_index.Found)
    assert found.cut == "search cancelled" and took < 0.5, (found.cut, took)


@pytest.fixture
def served_big(big: Home) -> Iterator[Served]:
    s = settings_mod.load(home=big.root, env={}, config=None, overrides={"search_seconds": 60})
    with serve(s) as served:
        yield served


def test_the_dashboard_cancels_a_search_whose_browser_went_away(
    served_big: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request sent and the connection closed at once (a newer keystroke aborted the
    fetch): the search is cancelled, not run to its bound, and its slot is free. The real
    search here takes 0.1 s, which a fast machine finishes before the close is seen; so it
    starts only once the close was seen or 10 s passed (a search as long as a slow one)."""
    real = search_index.find

    def find_that_outlasts_the_browser(*args: Any, **kw: Any) -> search_index.Found:
        kw["cancel"].wait(10)
        return real(*args, **kw)

    monkeypatch.setattr(search_index, "find", find_that_outlasts_the_browser)
    request = (
        f"GET /api/search?q=common HTTP/1.1\r\nHost: {served_big.host}\r\n"
        f"Authorization: Bearer {served_big.token}\r\nConnection: close\r\n\r\n"
    ).encode()
    with capture_logs() as logs:
        with socket.create_connection(("127.0.0.1", served_big.port)) as sock:
            sock.sendall(request)
        wait_for(lambda: any(e["event"] == "search_cancelled" for e in logs), 10, what="the cancel")
    (said,) = [e for e in logs if e["event"] == "search_cancelled"]
    assert said["why"] == "search cancelled"
    wait_for(lambda: served_big.dash._searches == 0, 5, what="the slot back")


# --------------------------------------------------------------------------- the query


def test_short_prefixes_and_long_queries_are_refused_in_one_line(big: Home) -> None:
    for q in ("a*", "al*", '"the herd a"*'):
        with pytest.raises(InputRejected, match="at least 3 letters before"):
            search_index.find(big, q)
    assert search_index.find(big, "alp*", seconds=5).hits  # three letters: served
    with pytest.raises(InputRejected, match=r"1099 bytes; a search takes at most 1024"):
        search_index.find(big, "word " * 220)
    env = base_env(big)
    out = cli_here(env, "search", "a*", check=False)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "3 letters" in out.stderr
    # the dashboard's box: a word too short to be a prefix is searched as itself
    assert search_index.as_typed("an alpa") == "an alpa*"


@pytest.mark.parametrize(
    "query",
    [
        "x) OR thinking : (pangolin",
        "{body thinking} : pangolin",
        "thinking : pangolin",
        "x OR {thinking}: pangolin",
        "NEAR(thinking : pangolin, 2)",
    ],
)
def test_the_thinking_is_out_of_reach_without_asking(big: Home, query: str) -> None:
    assert search_index.find(big, query, seconds=5).hits == []
    asked = search_index.Filters(thinking=True)
    assert search_index.find(big, "pangolin", asked, seconds=5).hits


def test_json_hits_carry_the_cut_too(big: Home) -> None:
    got = search_index.find(big, "common", seconds=0.01).as_dict()
    assert json.loads(json.dumps(got))["cut"].startswith("search cut")
