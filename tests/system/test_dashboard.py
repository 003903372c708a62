"""The dashboard: its security rules at the HTTP level, then the real page in real headless
Chromium against a real daemon (live replies over SSE, search, export, refused actions)."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from contemplation import settings as settings_mod
from contemplation.faces.dashboard import dashboard_link, ensure_token, panels, read_token
from contemplation.faces.dashboard.app import Dashboard
from contemplation.faces.dashboard.live import percentile
from contemplation.faces.dashboard.security import CSP
from contemplation.store.layout import Conv, Home, read_json
from contemplation.store.templates import load_template
from contemplation.writer import new_conversation, open_writer
from tests import peers
from tests.conftest import ARTIFACTS, DaemonProc, base_env, cli_here, wait_for
from tests.fakes.ollama_server import FakeOllama, Step

PORT = 5556
BASE = f"http://127.0.0.1:{PORT}"
TOKEN = "t" * 43
XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


def make_conv(home: Home, topic: str = "dashboard", reply: str = "Hello there.") -> Conv:
    conv = new_conversation(
        home, topic, template=load_template(home, "default"), model="llama3.2", backend="ollama"
    )
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "First question", msg_id="m1")
        r = w.reply("OLLAMA", "CLAUDE", "r1")
        r.thinking("let me think")
        r.content(reply)
        r.finish()
    return conv


@pytest.fixture
def client(home: Home) -> Iterator[TestClient]:
    settings = settings_mod.load(home=home.root, env={}, config=None)
    dash = Dashboard(settings, token=TOKEN)
    # every /api/ read needs the token (on loopback too): the page sends it with each one
    with TestClient(dash.asgi(), base_url=BASE, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def auth(**extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json", **extra}


# --------------------------------------------------------------------------- HTTP level


@pytest.mark.parametrize("host", ["evil.example:5556", "127.0.0.1.nip.io:5556", "127.0.0.1:9999"])
@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/"),
        ("GET", "/api/conversations"),
        ("GET", "/health"),
        ("POST", "/api/conversations/x/messages"),
    ],
)
def test_a_foreign_host_is_refused_everywhere(
    client: TestClient, host: str, method: str, path: str
) -> None:
    r = client.request(method, path, headers={**auth(), "Host": host}, content=b'{"text":"x"}')
    assert r.status_code == 400 and r.json() == {"error": "invalid Host header"}
    assert r.headers["content-security-policy"] == CSP


def test_state_changes_need_token_json_and_our_origin(home: Home, client: TestClient) -> None:
    conv = make_conv(home)
    url = f"/api/conversations/{conv.id}/messages"
    body = json.dumps({"text": "hi"})
    assert (
        client.post(
            url, content=body, headers={"Content-Type": "application/json", "Authorization": ""}
        ).status_code
        == 401
    )
    wrong = {"Authorization": "Bearer " + "x" * 43, "Content-Type": "application/json"}
    assert client.post(url, content=body, headers=wrong).status_code == 401
    form = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-www-form-urlencoded"}
    assert client.post(url, content="text=hi", headers=form).status_code == 415
    assert (
        client.post(url, content=body, headers=auth(Origin="http://evil.example")).status_code
        == 403
    )
    assert list(conv.inbox.iterdir()) == []  # nothing got through
    ok = client.post(url, content=body, headers=auth(Origin=f"http://localhost:{PORT}"))
    assert ok.status_code == 200
    assert (conv.inbox / ok.json()["queued"]).read_text() == "hi"
    empty = client.post(url, content=json.dumps({"text": " "}), headers=auth())
    assert empty.status_code == 422


def test_pages_and_api_carry_a_strict_csp(client: TestClient) -> None:
    for path in ("/", "/c/anything", "/static/app.js", "/api/conversations", "/health"):
        r = client.get(path)
        assert r.status_code == 200, path
        csp = r.headers["content-security-policy"]
        assert csp == CSP
        for rule in (
            "default-src 'self'",
            "script-src 'self'",
            "object-src 'none'",
            "frame-ancestors 'none'",
        ):
            assert rule in csp
        assert r.headers["x-content-type-options"] == "nosniff"
    js = client.get("/static/app.js").text
    assert "innerHTML" not in js.replace("never innerHTML", "")
    html = client.get("/").text
    assert "<script>" not in html and 'src="/static/app.js"' in html  # no inline script


def test_health_without_the_token_says_only_that_it_is_alive(
    home: Home, client: TestClient
) -> None:
    """/health answers anyone who reaches the port (a probe, a load balancer), so
    without the token it says it is alive and nothing else: no pid, no path of the home."""
    bare = client.get("/health", headers={"Authorization": ""})
    assert bare.status_code == 200 and bare.json() == {"ok": True}
    wrong = client.get("/health", headers={"Authorization": "Bearer " + "x" * 43})
    assert wrong.json() == {"ok": True}
    said = client.get("/health").json()  # the client sends the token
    assert said["ok"] is True and said["home"] == str(home.root) and said["pid"] > 0
    assert set(said) == {"ok", "pid", "daemon_alive", "uptime_s", "home"}


def test_the_list_comes_a_page_at_a_time_with_a_cursor(home: Home, client: TestClient) -> None:
    """The browser asks for one page (not the whole home), filtered on the server; the
    cursor continues exactly where the page ended."""
    for i in range(25):
        d = home.completed / f"old-{i:02d}"
        (d / "inbox").mkdir(parents=True)
        (d / "messages.log").write_text(
            f"=== CLAUDE -> OLLAMA [2025-02-{i + 1:02d} 10:00:00] ===\nquestion {i}\n"
        )
    make_conv(home, topic="current one")
    first = client.get("/api/conversations", params={"limit": 10}).json()
    assert (first["count"], first["total"]) == (10, 26) and first["cursor"]
    assert first["conversations"][0]["topic"] == "current one"
    seen = [r["id"] for r in first["conversations"]]
    cursor = first["cursor"]
    while cursor:
        page = client.get("/api/conversations", params={"limit": 10, "cursor": cursor}).json()
        seen += [r["id"] for r in page["conversations"]]
        cursor = page["cursor"]
    assert len(seen) == len(set(seen)) == 26
    archived = client.get("/api/conversations", params={"status": "archived", "q": "old-0"})
    assert archived.json()["total"] == 10  # old-00 .. old-09
    status = client.get("/api/status").json()
    assert (status["active"], status["completed"]) == (1, 25)
    assert status["disk_completed_bytes"] > 25 * 40  # each archived log, counted from the index
    metrics = client.get("/api/metrics").json()
    assert metrics["conversations"] == 26 and metrics["disk"]["completed"] > 0
    bad = client.get("/api/conversations", params={"limit": "many"})
    assert bad.status_code == 400 and "limit" in bad.json()["error"]
    worse = client.get("/api/conversations", params={"cursor": "forged"})
    assert worse.status_code == 422 and "cursor" in worse.json()["error"]


def test_api_reads_exports_and_actions(home: Home, client: TestClient) -> None:
    conv = make_conv(home, topic="Export me")
    rows = client.get("/api/conversations").json()["conversations"]
    assert [r["id"] for r in rows] == [conv.id]
    assert rows[0]["status"] in {"pending", "idle"} and rows[0]["model"] == "llama3.2"
    assert client.get("/api/conversations", params={"q": "nothing"}).json()["count"] == 0
    assert client.get("/api/conversations", params={"q": "EXPORT"}).json()["count"] == 1
    blocks = client.get(f"/api/conversations/{conv.id}/blocks").json()
    assert [b["kind"] for b in blocks["blocks"]] == ["agent", "model"]
    assert blocks["blocks"][1]["thinking"].strip() == "let me think"
    md = client.get(f"/api/conversations/{conv.id}/export.md")
    assert md.headers["content-disposition"] == f'attachment; filename="{conv.id}.md"'
    assert md.text.startswith("# Export me") and "Hello there." in md.text
    data = client.get(f"/api/conversations/{conv.id}/export.json").json()
    assert data["metadata"]["topic"] == "Export me" and len(data["blocks"]) == 2
    assert "done_ids" not in data["state"]
    assert client.get("/api/conversations/nope").status_code == 404
    r = client.post(f"/api/conversations/{conv.id}/archive", content=b"{}", headers=auth())
    assert r.status_code == 200 and (home.completed / conv.id).is_dir()
    health = client.get("/health").json()
    assert health["ok"] is True and health["daemon_alive"] is False


def test_respond_to_a_need_through_the_api(home: Home, client: TestClient) -> None:
    conv = make_conv(home, reply="Need two things.\nNEED: the schema\nNEED: the counts")
    detail = client.get(f"/api/conversations/{conv.id}").json()
    assert detail["pending_needs"] == ["the schema", "the counts"]
    assert detail["activity"] == "waiting for your answer to 2 need(s)"  # status's words
    url = f"/api/conversations/{conv.id}/respond"
    counts = next(w for w in detail["waiting"] if w["need"] == "the counts")
    assert counts["kind"] == "need"
    two = client.post(url, content=json.dumps({"text": "12 rows"}), headers=auth())
    assert two.status_code == 422 and "2 needs wait" in two.json()["error"]
    r = client.post(
        url, content=json.dumps({"text": "12 rows", "need": counts["id"]}), headers=auth()
    )
    assert r.status_code == 200 and r.json()["answered"] == "the counts"
    body = (conv.inbox / r.json()["queued"]).read_text().split("\n")
    assert body[0] == "RESPONSE TO NEED: the counts" and body[2] == "12 rows"
    assert client.get(f"/api/conversations/{conv.id}").json()["pending_needs"] == ["the schema"]
    bad = client.post(url, content=json.dumps({"text": "x", "need": "nope"}), headers=auth())
    assert bad.status_code == 422 and "is 'nope'; waiting: " in bad.json()["error"]


def test_a_panel_is_one_registration_and_its_rows_stay_text_and_bounded(
    home: Home, client: TestClient
) -> None:
    """A panel added in Python alone reaches /api/panels (the page draws every panel it
    lists); a long or hostile row is cut and stays text; a panel that raises is one row."""
    make_conv(home)

    def queue(seen: panels.Seen) -> list[tuple[str, str]]:
        n = len(list(seen.home.active.iterdir()))
        return [("active folders", str(n)), (XSS, "x" * 10_000)] + [("row", "r")] * 500

    def broken(seen: panels.Seen) -> list[tuple[str, str]]:
        raise RuntimeError("the disk went away")

    panels.KINDS.replace(panels.Panel("queue", "the queue", queue))
    panels.KINDS.replace(panels.Panel("broken", "broken", broken))
    try:
        shown = {p["name"]: p for p in client.get("/api/panels").json()["panels"]}
    finally:
        panels.KINDS.forget("queue")
        panels.KINDS.forget("broken")
    assert next(iter(shown)) == "metrics"  # the built-in first, then in registration order
    metrics = dict(shown["metrics"]["rows"])
    assert metrics["conversations"] == "1" and metrics["turns (all time)"] == "1"
    rows = shown["queue"]["rows"]
    assert shown["queue"]["title"] == "the queue" and rows[0] == ["active folders", "1"]
    assert rows[1][0] == XSS and len(rows[1][1]) == panels.MAX_TEXT  # text; the page escapes it
    assert len(rows) == panels.MAX_ROWS
    assert shown["broken"]["rows"] == [["unavailable", "RuntimeError: the disk went away"]]
    with pytest.raises(ValueError, match="lower-case word"):
        panels.register(panels.Panel("Bad Name", "x", queue))


def test_metrics_percentiles() -> None:
    assert percentile([], 50) is None
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0 or percentile(values, 50) == 51.0
    assert percentile(values, 99) == 99.0 or percentile(values, 99) == 100.0


def test_token_file_is_private_and_stable(home: Home) -> None:
    home.root.mkdir(parents=True)
    token = ensure_token(home)
    path = home.root / ".dashboard.token"
    assert path.stat().st_mode & 0o777 == 0o600 and len(token) >= 32
    assert ensure_token(home) == token
    path.chmod(0o644)  # readable by others: replaced
    assert ensure_token(home) != token
    assert path.stat().st_mode & 0o777 == 0o600
    assert dashboard_link(home) is None  # no daemon recorded


# --------------------------------------------------------------------------- real Chromium


CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def dashboard_port(home: Home, d: DaemonProc) -> int:
    def ready() -> int | None:
        info = read_json(home.root / ".dashboard.json")
        if info and info.get("pid") == d.proc.pid:
            return int(info["port"])
        return None

    port: int = wait_for(ready, timeout=15, what="the dashboard to listen")
    return port


def test_dashboard_in_real_chromium(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    chromium = peers.executable("chromium")
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        peers.missing("playwright (pip install -e '.[dev]')")
        raise
    env = base_env(home, fake_ollama)
    d = daemon_factory(env, home, "--dashboard-port", "0").wait_ready()
    port = dashboard_port(home, d)
    token = read_token(home)
    assert token
    status = json.loads(cli_here(env, "status", "--json").stdout)
    assert status["dashboard"] == f"http://127.0.0.1:{port}/#token={token}"
    fake_ollama.enqueue(Step(text=XSS))
    alpha = cli_here(env, "new", "Alpha migration", "--message", "Plan the migration").stdout.strip()
    wait_for(
        lambda: b"onerror" in (home.active / alpha / "messages.log").read_bytes(), what="reply"
    )  # before beta's message: the fake's one scripted reply is alpha's, whatever the order
    beta = cli_here(env, "new", "Beta caching", "--message", "Cache what?").stdout.strip()
    base = f"http://127.0.0.1:{port}"
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        try:
            ctx = browser.new_context(accept_downloads=True)
            page = ctx.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            # the list renders, with status/model/last activity; search filters it
            page.goto(f"{base}/#token={token}")
            rows = page.locator("#conversations tbody tr")
            expect(rows).to_have_count(2)
            assert "#token" not in page.url  # the token left the address bar
            expect(page.locator(f'tr[data-id="{alpha}"] td.status')).to_have_text(
                re.compile("idle")
            )
            expect(page.locator(f'tr[data-id="{alpha}"]')).to_contain_text("llama3.2")
            page.fill("#search", "beta")
            expect(rows).to_have_count(1)
            expect(rows.first).to_have_attribute("data-id", beta)
            page.fill("#search", "")
            expect(rows).to_have_count(2)
            expect(page.locator("#metrics")).to_contain_text("turns (all time)")
            page.screenshot(path=str(ARTIFACTS / "dashboard-list.png"), full_page=True)
            # model output is text, never markup
            page.click(f'tr[data-id="{alpha}"] a')
            expect(page.locator("#log article.model pre.text")).to_have_text(XSS)
            assert page.evaluate("window.__xss") is None
            assert page.locator("#log img").count() == 0
            # a new reply appears live, streamed token by token, without a reload
            words = " ".join(f"word{i}" for i in range(12))
            fake_ollama.enqueue(Step(text=words, chunk_delay=0.15))
            page.fill("#message", "Stream something")
            page.click("#send")
            expect(page.locator("#flash")).to_have_text("queued")
            expect(page.locator("#live")).to_contain_text("word3", timeout=15000)
            streamed_early = "word11" not in (page.text_content("#log") or "")
            last_reply = page.locator("#log article.model pre.text").last
            expect(last_reply).to_have_text(words, timeout=15000)
            assert streamed_early
            page.screenshot(path=str(ARTIFACTS / "dashboard-conversation.png"), full_page=True)
            # export downloads the conversation
            with page.expect_download() as dl:
                page.click("#export-md")
            md = Path(dl.value.path()).read_text()
            assert dl.value.suggested_filename == f"{alpha}.md"
            assert md.startswith("# Alpha migration") and words in md
            # an action without the token is refused, and nothing happens
            page.evaluate("sessionStorage.removeItem('token')")
            page.fill("#token", "")
            page.click("#archive")
            expect(page.locator("#flash")).to_contain_text("refused: missing or wrong token")
            assert (home.active / alpha).is_dir()
            # a foreign Host (DNS rebinding) is refused by the server
            rebind = p.chromium.launch(
                executable_path=str(chromium),
                args=[*CHROMIUM_ARGS, "--host-resolver-rules=MAP evil.example 127.0.0.1"],
            )
            try:
                evil = rebind.new_page()
                resp = evil.goto(f"http://evil.example:{port}/api/conversations")
                assert resp is not None and resp.status == 400
                assert "invalid Host header" in (evil.text_content("body") or "")
                assert alpha not in (evil.content() or "")
            finally:
                rebind.close()
            assert errors == []
        finally:
            browser.close()
    req = urllib.request.Request(
        f"{base}/api/metrics", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        metrics: dict[str, Any] = json.loads(r.read())
    assert metrics["live"]["turns"] >= 3 and metrics["live"]["response_ms"]["p50"] is not None
    assert metrics["turns_total"] >= 3
    assert metrics["disk"]["active"] > 0 and metrics["by_status"]
    assert d.stop() == 0


def test_every_read_of_conversation_data_needs_the_token_on_loopback_too(
    home: Home, client: TestClient
) -> None:
    """Any local user of a shared machine reaches 127.0.0.1: reads need the token as writes
    do (a header, or ?token= for the event stream and download links)."""
    conv = make_conv(home)
    reads = [
        "/api/conversations",
        f"/api/conversations/{conv.id}",
        f"/api/conversations/{conv.id}/blocks",
        f"/api/conversations/{conv.id}/export.md",
        f"/api/conversations/{conv.id}/export.json",
        "/api/search?q=hello",
        "/api/status",
        "/api/metrics",
    ]
    for path in reads:
        bare = client.get(path, headers={"Authorization": ""})
        assert bare.status_code == 401, path
        assert "token" in bare.json()["error"] and "Hello there" not in bare.text
        wrong = client.get(path, headers={"Authorization": "Bearer " + "x" * 43})
        assert wrong.status_code == 401, path
        assert client.get(path).status_code == 200, path  # the fixture's client has the token
    link = client.get(
        f"/api/conversations/{conv.id}/export.md?token={TOKEN}", headers={"Authorization": ""}
    )
    assert link.status_code == 200 and "Hello there." in link.text
    page = client.get("/", headers={"Authorization": ""})  # the page shell holds no data
    assert page.status_code == 200 and conv.id not in page.text
