"""The dashboard served over real HTTP on loopback without a daemon (uvicorn in a thread, on
a real home folder), for tests that must see exactly what an action wrote: with a daemon
running, an inbox file or a ``.cancel`` flag is consumed at once. Also what the Chromium
tests share: launching it, and judging a screenshot."""

from __future__ import annotations

import base64
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from contemplation.faces.dashboard.app import Dashboard
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home
from contemplation.store.templates import load_template
from contemplation.writer import new_conversation, open_writer
from tests import peers
from tests.conftest import wait_for

TOKEN = "s" * 43
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Served:
    base: str
    port: int
    dash: Dashboard
    token: str = TOKEN

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextmanager
def serve(settings: Settings, token: str = TOKEN) -> Iterator[Served]:
    dash = Dashboard(settings, token=token)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    dash.port = int(sock.getsockname()[1])
    config = uvicorn.Config(
        dash.asgi(),
        log_config=None,
        access_log=False,
        lifespan="off",
        log_level="warning",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=10, what="the dashboard to serve")
        yield Served(f"http://127.0.0.1:{dash.port}", dash.port, dash, token)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
    assert not thread.is_alive(), "the dashboard did not stop"


def make_conv(home: Home, topic: str, question: str, reply: str) -> Conv:
    """A conversation with one question and one finished reply, written by the real writer."""
    conv = new_conversation(
        home, topic, template=load_template(home, "default"), model="llama3.2", backend="ollama"
    )
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", question, msg_id="m1")
        r = w.reply("OLLAMA", "CLAUDE", "r1")
        r.content(reply)
        r.finish()
    return conv


def chromium() -> Path:
    path = peers.executable("chromium")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        peers.missing("playwright (pip install -e '.[dev]')")
        raise
    return path


IMAGE_STATS = """async (b64) => {
  const img = new Image();
  img.src = "data:image/png;base64," + b64;
  await img.decode();
  const c = document.createElement("canvas");
  c.width = img.width; c.height = img.height;
  const g = c.getContext("2d");
  g.drawImage(img, 0, 0);
  const px = g.getImageData(0, 0, c.width, c.height).data;
  const counts = new Map();
  for (let i = 0; i < px.length; i += 4) {
    const k = (px[i] << 16) | (px[i + 1] << 8) | px[i + 2];
    counts.set(k, (counts.get(k) || 0) + 1);
  }
  const top = Math.max(...counts.values());
  return { width: c.width, height: c.height, colours: counts.size, dominant: top / (px.length / 4) };
}"""


def assert_rich_png(browser: Any, path: Path, *, min_colours: int = 8) -> dict[str, Any]:
    """The screenshot is a real PNG with something drawn on it: decoded by Chromium itself
    (on a blank page), it has several colours and no single colour covers almost all of it."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    page = browser.new_page()
    try:
        stats: dict[str, Any] = page.evaluate(IMAGE_STATS, base64.b64encode(data).decode())
    finally:
        page.close()
    assert stats["width"] > 0 and stats["height"] > 0, stats
    assert stats["colours"] >= min_colours, f"{path.name} looks blank: {stats}"
    assert stats["dominant"] < 0.995, f"{path.name} is nearly one colour: {stats}"
    return stats
