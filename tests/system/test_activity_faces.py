"""One description of what a conversation is doing, on every face: while a
reply streams, ``status``, MCP and the dashboard all say how many tokens so far, at what rate,
for how long -- never "waiting for the first token" while ``messages.log`` grows -- and the
dashboard's header ticks by itself. A real daemon streaming slowly from the scripted fake
Ollama, the real CLI, the real MCP faces, the dashboard in real Chromium."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contemplation import settings as settings_mod
from contemplation.faces.dashboard import read_token
from contemplation.faces.mcp.calls import Faces
from contemplation.store.layout import Conv, Home
from tests.conftest import DaemonProc, base_env, cli_here, wait_for
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_dashboard import dashboard_port
from tests.system.test_dashboard_browser import Tab, browser  # noqa: F401 (a fixture)

pytestmark = pytest.mark.real
SO_FAR = re.compile(r"generating for \d+ s: ~[\d,]+ tokens so far \([\d,]+ characters, \d+ tok/s\)")


def _streaming(
    home: Home, fake: FakeOllama, daemon_factory: Callable[..., DaemonProc], *args: str
) -> tuple[dict[str, str], DaemonProc, Conv]:
    """A daemon and a conversation whose reply has started to stream (and goes on ~20 s)."""
    env = base_env(home, fake)
    d = daemon_factory(env, home, *args).wait_ready()
    fake.enqueue(Step(text=" ".join(["Thinking"] * 400), chunk_delay=0.05))
    conv = home.conv(cli_here(env, "new", "Slow", "--message", "Take your time").stdout.strip())
    wait_for(lambda: "Thinking Thinking" in conv.log.read_text(), 15, what="the reply to stream")
    return env, d, conv


def test_status_and_mcp_say_tokens_so_far_while_the_reply_streams(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env, d, conv = _streaming(home, fake_ollama, daemon_factory)
    now = json.loads(cli_here(env, "status", conv.id, "--json").stdout)["activity"]
    assert SO_FAR.fullmatch(now), now
    human = cli_here(env, "status", conv.id).stdout
    assert "first token" not in human and re.search(r"now: +generating for .* tokens so far", human)
    settings = settings_mod.load(home=home.root, env={"OLLAMA_HOST": fake_ollama.url}, config=None)
    faces = Faces(settings)
    assert SO_FAR.fullmatch(faces.snapshot(conv)["activity"])  # the status resource too
    assert SO_FAR.fullmatch(faces.check(conv.id)["activity"])
    cli_here(env, "cancel", conv.id)
    assert d.stop() == 0


def test_the_dashboard_header_ticks_while_the_reply_streams(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    browser: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    env, d, conv = _streaming(home, fake_ollama, daemon_factory, "--dashboard-port", "0")
    token = read_token(home)
    assert token
    tab = Tab(browser, f"http://127.0.0.1:{dashboard_port(home, d)}", token, tmp_path / "shots")
    try:
        tab.goto(f"/c/{conv.id}")
        meta = tab.page.locator("#conv-meta")
        expect(meta).to_contain_text("tokens so far")
        first = meta.text_content()
        # no event comes from the page's side: the header is read again while the turn runs
        expect(meta).not_to_have_text(first or "")
        expect(meta).to_contain_text("tokens so far")
        assert "first token" not in (meta.text_content() or "")
        assert tab.errors == []
    finally:
        tab.close()
    cli_here(env, "cancel", conv.id)
    assert d.stop() == 0
