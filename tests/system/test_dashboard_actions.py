"""The dashboard's write endpoints, full-text search and favicon over real HTTP on loopback
(uvicorn serving a real home, no daemon, so what an action writes stays on disk to be seen)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from contemplation import settings as settings_mod
from contemplation.index import search as search_index
from contemplation.models import ApprovalRequest, Status
from contemplation.protocol.conversation import need_id
from contemplation.protocol.parser import parse
from contemplation.store.layout import Conv, Home, read_json, read_state
from contemplation.writer import archive, open_writer
from tests.conftest import wait_for
from tests.dashboard_served import Served, make_conv, serve

ACTIONS = ["messages", "respond", "cancel", "archive"]
MAX_MESSAGE = 4000


@pytest.fixture
def served(home: Home) -> Iterator[Served]:
    settings = settings_mod.load(
        home=home.root, env={}, config=None, overrides={"max_message_bytes": MAX_MESSAGE}
    )
    with serve(settings) as s:
        yield s


@pytest.fixture
def web(served: Served) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {served.token}"}  # reads need the token too
    with httpx.Client(base_url=served.base, timeout=10, headers=headers) as c:
        yield c


def auth(served: Served, **extra: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {served.token}",
        "Content-Type": "application/json",
        **extra,
    }


def generating(home: Home, reply: str = "Need it.\nNEED: the schema") -> Conv:
    """A conversation whose turn is running (as the daemon marks it) with a pending need."""
    conv = make_conv(home, "busy", "Question", reply)
    with open_writer(conv) as w:
        w.set_status(Status.GENERATING)
    return conv


LOOKUP = "file: ~/secrets/plan.md"


def asking(home: Home, topic: str = "asks", other: str | None = "the schema") -> Conv:
    """A conversation whose reply asks for a lookup a permission marks ``ask`` (waiting for
    approval, as the daemon records it in state.json) and, with ``other``, a need no rule
    answers."""
    reply = f"Two things.\nNEED: {LOOKUP}" + (f"\nNEED: {other}" if other else "")
    conv = make_conv(home, topic, "Plan it", reply)
    block = parse(conv.log.read_bytes()).blocks[-1]
    with open_writer(conv) as w:
        w.state.status = Status.AWAITING_APPROVAL
        w.state.pending_approvals = [
            ApprovalRequest(
                id=need_id(block, LOOKUP),
                need=LOOKUP,
                rule="read_file",
                tool="files.read",
                arguments={"path": "~/secrets/plan.md"},
                why='read_file "~/secrets/**" = "ask"',
            )
        ]
        w.save()
    return conv


def untouched(home: Home, conv: Conv) -> None:
    assert list(conv.inbox.iterdir()) == []
    assert not (conv.dir / ".cancel").exists()
    assert (home.active / conv.id).is_dir()


BODIES: dict[str, dict[str, Any]] = {
    "messages": {"text": "hi"},
    "respond": {"text": "the answer"},  # a turn is running: a plain message
    "cancel": {},
    "archive": {},
}


@pytest.mark.parametrize("action", ACTIONS)
def test_every_write_endpoint_needs_the_token_and_our_origin(
    home: Home, served: Served, web: httpx.Client, action: str
) -> None:
    conv = generating(home)
    url = f"/api/conversations/{conv.id}/{action}"
    body = json.dumps(BODIES[action])
    json_only = {"Content-Type": "application/json", "Authorization": ""}  # no token
    r = web.post(url, content=body, headers=json_only)
    assert r.status_code == 401 and "token" in r.json()["error"]
    wrong = {**json_only, "Authorization": "Bearer " + "x" * 43}
    assert web.post(url, content=body, headers=wrong).status_code == 401
    for origin in ("http://evil.example", "null", f"http://127.0.0.1:{served.port + 1}"):
        r = web.post(url, content=body, headers=auth(served, Origin=origin))
        assert r.status_code == 403 and r.json()["error"] == "cross-origin request refused"
    assert web.get(url, headers=auth(served)).status_code == 405  # reads cannot act
    untouched(home, conv)
    ok = web.post(url, content=body, headers=auth(served, Origin=served.base))
    assert ok.status_code == 200, ok.text


def test_an_unknown_action_is_404_and_still_needs_the_token(
    home: Home, served: Served, web: httpx.Client
) -> None:
    conv = generating(home)
    url = f"/api/conversations/{conv.id}/delete"  # no such action
    assert (
        web.post(
            url, content=b"{}", headers={"Content-Type": "application/json", "Authorization": ""}
        ).status_code
        == 401
    )
    assert web.post(url, content=b"{}", headers=auth(served)).status_code == 404
    untouched(home, conv)


def test_oversized_bodies_are_refused_with_413(home: Home, served: Served) -> None:
    conv = make_conv(home, "sizes", "Q", "A")
    limit = 2 * MAX_MESSAGE + 64 * 1024
    path = f"/api/conversations/{conv.id}/messages"

    def post(body: bytes | Iterator[bytes], headers: dict[str, str]) -> tuple[int, Any]:
        c = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
        try:
            c.request(
                "POST", path, body=body, headers=headers, encode_chunked=not isinstance(body, bytes)
            )
            r = c.getresponse()
            return r.status, json.loads(r.read())
        finally:
            c.close()

    headers = auth(served)
    big = json.dumps({"text": "x" * (limit + 10)}).encode()
    status, data = post(big, headers)  # refused by Content-Length, before any is read
    assert status == 413 and str(limit) in data["error"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as the chunks arrive
        yield b'{"text": "'
        for _ in range(limit // 8192 + 2):
            yield b"y" * 8192
        yield b'"}'

    status, data = post(chunks(), headers)
    assert status == 413 and str(limit) in data["error"]
    # without the token, the body is never read: 401 whatever its size
    status, _ = post(big, {"Content-Type": "application/json"})
    assert status == 401
    # within the body limit but over max_message_bytes: the action says which limit
    status, data = post(json.dumps({"text": "z" * (MAX_MESSAGE + 1)}).encode(), headers)
    assert status == 422 and "max_message_bytes" in data["error"]
    assert list(conv.inbox.iterdir()) == []
    status, data = post(json.dumps({"text": "fits"}).encode(), headers)
    assert status == 200 and (conv.inbox / data["queued"]).read_text() == "fits"


def test_cancel_writes_the_flag_only_while_a_turn_runs(
    home: Home, served: Served, web: httpx.Client
) -> None:
    idle = make_conv(home, "idle one", "Q", "A")
    r = web.post(f"/api/conversations/{idle.id}/cancel", content=b"{}", headers=auth(served))
    assert r.status_code == 409 and "nothing is running" in r.json()["error"]
    assert not (idle.dir / ".cancel").exists()
    assert "cancel" not in web.get(f"/api/conversations/{idle.id}").json()["actions"]

    busy = generating(home)
    detail = web.get(f"/api/conversations/{busy.id}").json()
    assert "cancel" in detail["actions"] and detail["cancel_requested"] is False
    r = web.post(f"/api/conversations/{busy.id}/cancel", content=b"{}", headers=auth(served))
    assert r.status_code == 200 and r.json() == {"cancelling": "generating"}
    assert (busy.dir / ".cancel").is_file()  # the flag the daemon honours once
    assert web.get(f"/api/conversations/{busy.id}").json()["cancel_requested"] is True
    state = read_state(busy)
    assert state is not None and state.status is Status.GENERATING  # the daemon decides


def test_detail_offers_the_actions_that_fit_the_status(
    home: Home, served: Served, web: httpx.Client
) -> None:
    waiting = make_conv(home, "waiting", "Q", "Two things.\nNEED: the schema\nNEED: the counts")
    d = web.get(f"/api/conversations/{waiting.id}").json()
    assert d["pending_needs"] == ["the schema", "the counts"]
    assert d["actions"] == ["messages", "respond", "archive"]
    r = web.post(
        f"/api/conversations/{waiting.id}/respond",
        content=json.dumps({"need": "the counts", "text": "12 rows"}),
        headers=auth(served),
    )
    assert r.status_code == 200
    assert [(w["kind"], w["need"]) for w in r.json()["still_waiting"]] == [("need", "the schema")]
    done = make_conv(home, "done", "Q", "A")
    assert (
        web.post(
            f"/api/conversations/{done.id}/archive", content=b"{}", headers=auth(served)
        ).status_code
        == 200
    )
    assert web.get(f"/api/conversations/{done.id}").json()["actions"] == []


def test_detail_offers_only_the_actions_that_will_succeed(
    home: Home, served: Served, web: httpx.Client
) -> None:
    """What the page offers is what the endpoint then accepts: archive neither while a turn
    runs (the busy lock) nor while a message is queued; respond only for a need-kind item,
    approve only for a lookup waiting for approval (each refuses the other's id)."""

    def offered(conv: Conv) -> list[str]:
        actions: list[str] = web.get(f"/api/conversations/{conv.id}").json()["actions"]
        return actions

    def post(conv: Conv, action: str, body: dict[str, Any]) -> httpx.Response:
        url = f"/api/conversations/{conv.id}/{action}"
        return web.post(url, content=json.dumps(body), headers=auth(served))

    busy = generating(home)
    assert offered(busy) == ["messages", "cancel"]
    assert web.get(f"/api/conversations/{busy.id}").json()["waiting"] == []  # the daemon's
    idle = make_conv(home, "queued", "Q", "A")
    assert offered(idle) == ["messages", "archive"]
    assert post(idle, "messages", {"text": "one more"}).status_code == 200
    assert offered(idle) == ["messages"]  # queued: archive would strand it
    refused = post(idle, "archive", {})
    assert refused.status_code == 422 and "queued" in refused.json()["error"]

    both = asking(home)
    d = web.get(f"/api/conversations/{both.id}").json()
    assert [(w["kind"], w["need"]) for w in d["waiting"]] == [
        ("approval", LOOKUP),
        ("need", "the schema"),
    ]
    lookup, need = d["waiting"]
    assert lookup["tool"] == "files.read" and lookup["arguments"] == {"path": "~/secrets/plan.md"}
    assert d["pending_needs"] == ["the schema"]  # the lookup is no need to answer
    assert [r["id"] for r in d["pending_approvals"]] == [lookup["id"]]
    assert d["actions"] == ["messages", "respond", "approve", "archive"]

    only = asking(home, "only asks", other=None)
    d = web.get(f"/api/conversations/{only.id}").json()
    assert d["actions"] == ["messages", "approve", "archive"]  # nothing to answer with text
    (item,) = d["waiting"]
    wrong = post(only, "respond", {"need": item["id"], "text": "here it is"})
    assert wrong.status_code == 422 and "not a need to answer" in wrong.json()["error"]
    assert list(only.inbox.iterdir()) == []
    r = post(only, "approve", {"need": item["id"], "decision": "once"})
    assert r.status_code == 200 and r.json()["request"] == item["id"]
    meta = read_json(only.metadata)
    assert meta is not None
    assert [(a["request"], a["decision"]) for a in meta["approvals"]] == [(item["id"], "once")]
    assert offered(only) == ["messages", "archive"]  # decided: nothing waits for you

    wrong = post(both, "approve", {"need": need["id"], "decision": "once"})
    assert wrong.status_code == 422 and "not a lookup to approve" in wrong.json()["error"]


def test_the_live_event_stream_needs_the_token_too(served: Served) -> None:
    """An EventSource cannot send headers: the stream takes ?token=, and without it (or with
    a wrong one) it is refused with a one-line JSON error before any event is sent."""
    with httpx.Client(base_url=served.base, timeout=10) as bare:
        for params in ({}, {"token": "x" * 43}):
            r = bare.get("/api/events", params=params)
            assert r.status_code == 401, params
            assert r.headers["content-type"] == "application/json"
            assert "\n" not in r.text and "token" in r.json()["error"]
        with bare.stream("GET", "/api/events", params={"token": served.token}) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            got = ""
            for chunk in stream.iter_text():
                got += chunk
                if "event: hello" in got:
                    break
            assert "event: hello" in got


# --------------------------------------------------------------------------- search


def test_full_text_search_finds_log_text_case_insensitively(home: Home, web: httpx.Client) -> None:
    a = make_conv(home, "Animals", "Where do QUOKKAS live?", "On Rottnest Island, mostly.")
    b = make_conv(home, "Islands", "Name one island", "Rottnest — home of the quokka.")
    make_conv(home, "Unrelated", "What is 2+2?", "4")
    r = web.get("/api/search", params={"q": "quokka*"})
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    data = r.json()
    assert {h["conversation_id"] for h in data["hits"]} == {a.id, b.id}
    by_id = {h["conversation_id"]: h for h in data["hits"]}
    assert "«QUOKKAS»" in by_id[a.id]["snippet"] and "«quokka»" in by_id[b.id]["snippet"]
    log = b.log.read_bytes()
    at = by_id[b.id]["at"]  # the block's offset in the log: the page links to it
    assert log[at:].startswith(b"=== OLLAMA -> CLAUDE") and by_id[b.id]["block"] == 2
    # block headers are framing, not what was said: they neither match nor show in snippets
    assert web.get("/api/search", params={"q": "claude"}).json()["hits"] == []
    assert "===" not in json.dumps(data["hits"])


def test_the_search_covers_every_byte_of_long_logs_and_archived_ones(
    home: Home, web: httpx.Client
) -> None:
    """No bound on how much is searched (the dashboard once read 4 MiB a log, 64 MiB a search):
    a word at the end of a 6 MB log is found, and so is one in an archived conversation."""
    long = make_conv(home, "Long", "Tell me everything", "filler words here\n" * 350_000 + "zebu")
    old = make_conv(home, "Old", "Archived question", "an okapi answer")
    archive(home, old)
    assert long.log.stat().st_size > 6_000_000
    assert [h["conversation_id"] for h in web.get("/api/search", params={"q": "zebu"}).json()["hits"]] == [long.id]
    hits = web.get("/api/search", params={"q": "okapi"}).json()["hits"]
    assert [(h["conversation_id"], h["archived"]) for h in hits] == [(old.id, True)]


@pytest.mark.parametrize(
    "params,expect",
    [({}, "needs a query"), ({"q": "  "}, "needs a query"), ({"q": "x" * 201}, "1 to 200")],
)
def test_a_bad_search_is_400(web: httpx.Client, params: dict[str, str], expect: str) -> None:
    r = web.get("/api/search", params=params)
    assert r.status_code == 400 and expect in r.json()["error"]


def test_a_query_fts5_rejects_is_searched_as_words(home: Home, web: httpx.Client) -> None:
    conv = make_conv(home, "Quotes", "What did she say?", 'She said "half a quote')
    for q in ('"half a', "AND", "-", "half -"):
        r = web.get("/api/search", params={"q": q})
        assert r.status_code in {200, 400}, (q, r.text)
        assert "Traceback" not in r.text
    hits = web.get("/api/search", params={"q": '"half a'}).json()["hits"]
    assert [h["conversation_id"] for h in hits] == [conv.id]


def test_search_never_follows_a_link_out_of_the_home(
    home: Home, web: httpx.Client, tmp_path: Any
) -> None:
    conv = make_conv(home, "linked", "Q", "A")
    secret = tmp_path / "secret.txt"
    secret.write_text("=== CLAUDE -> OLLAMA [2025-01-01 10:00:00] ===\nzebra-password\n")
    (conv.dir / "messages.1.log").symlink_to(secret)
    data = web.get("/api/search", params={"q": "zebra"}).json()
    assert data["hits"] == []


def test_favicon_is_served(web: httpx.Client) -> None:
    r = web.get("/favicon.ico")
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
    assert r.text.startswith("<svg") and "</svg>" in r.text
    assert web.get("/static/favicon.svg").status_code == 200
    assert 'rel="icon" href="/static/favicon.svg"' in web.get("/").text


def test_a_running_search_blocks_neither_the_loop_nor_other_reads(
    home: Home, served: Served, web: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search runs in a worker thread: while one is held mid-search, the server answers
    other requests; past SEARCHES_AT_ONCE, more searches get 429 instead of piling up."""
    import threading

    from contemplation.faces.dashboard import app as app_mod

    conv = make_conv(home, "held", "Q", "the held needle")
    started = threading.Semaphore(0)
    release = threading.Event()
    real = search_index.find

    def held(*args: Any, **kwargs: Any) -> search_index.Found:
        started.release()
        assert release.wait(30)
        return real(*args, **kwargs)

    from contemplation.index import fusion  # the dashboard searches through it

    monkeypatch.setattr(fusion, "find", held)
    results: list[httpx.Response] = []

    def search() -> None:
        headers = {"Authorization": f"Bearer {served.token}"}
        with httpx.Client(base_url=served.base, timeout=30, headers=headers) as c:
            results.append(c.get("/api/search", params={"q": "needle"}))

    threads = [threading.Thread(target=search) for _ in range(app_mod.SEARCHES_AT_ONCE)]
    for t in threads:
        t.start()
    try:
        assert started.acquire(timeout=10)  # one scan is in the worker thread, held there
        wait_for(lambda: served.dash._searches == app_mod.SEARCHES_AT_ONCE, what="searches")
        assert web.get("/health").json()["ok"] is True
        assert web.get(f"/api/conversations/{conv.id}").status_code == 200
        extra = web.get("/api/search", params={"q": "needle"})
        assert extra.status_code == 429 and extra.headers["retry-after"] == "1"
    finally:
        release.set()
        for t in threads:
            t.join(30)
    assert [r.status_code for r in results] == [200] * app_mod.SEARCHES_AT_ONCE
    assert all(r.json()["hits"][0]["conversation_id"] == conv.id for r in results)
    assert served.dash._searches == 0


def test_a_message_sent_past_waiting_needs_says_what_stays_unanswered(
    home: Home, served: Served, web: httpx.Client
) -> None:
    conv = asking(home)  # a lookup waits for approval and a need no rule answers
    r = web.post(
        f"/api/conversations/{conv.id}/messages", json={"text": "never mind"}, headers=auth(served)
    )
    assert r.status_code == 200, r.text
    data = r.json()
    assert (conv.inbox / data["queued"]).read_text() == "never mind"
    left = {(i["kind"], i["need"]) for i in data["left_unanswered"]}
    assert left == {("approval", LOOKUP), ("need", "the schema")}
    quiet = make_conv(home, "quiet", "Q", "A")  # nothing waits: nothing is said
    r = web.post(
        f"/api/conversations/{quiet.id}/messages", json={"text": "more"}, headers=auth(served)
    )
    assert r.status_code == 200 and r.json()["left_unanswered"] == []
