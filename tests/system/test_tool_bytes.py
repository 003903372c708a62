"""The tools a turn offers go out in one canonical form. Two configurations that
list the same routes in another order (and so the tools in another order) send the same
``tools`` bytes, so the server's cached prefix stays usable across daemons and turns."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contemplation.engine.runtime import Runtime
from contemplation.settings import Settings
from contemplation.store.layout import Home
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests.conftest import run_burst
from tests.fakes.ollama_server import FakeOllama, Step

ROUTES = [
    {"name": "notes_b", "prefix": "Notes B", "tool": "files.read", "param": "path"},
    {"name": "notes_a", "prefix": "Notes A", "tool": "files.read", "param": "path"},
    {"name": "notes_c", "prefix": "Notes C", "tool": "files.read", "param": "path"},
]


def tools_sent(
    root: Path,
    fake: FakeOllama,
    make_settings: Callable[..., Settings],
    routes: list[dict[str, Any]],
) -> str:
    notes = root / "notes"
    notes.mkdir(parents=True)
    settings = make_settings(fake, routes=routes, tools={"allowed_roots": [str(notes)]})
    home = Home(settings.home)
    conv = new_conversation(
        home, "tools", template=load_template(home, "default"), model="llama3.2", backend="ollama"
    )
    drop_message(conv, "hello")
    fake.enqueue(Step(text="hi"))
    run_burst(Runtime(settings=settings, home=home))
    return json.dumps(fake.chat_requests()[-1]["tools"])


def test_routes_in_another_order_send_the_same_tool_bytes(
    tmp_path: Path, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    one = tools_sent(tmp_path / "one", fake_ollama, make_settings, ROUTES)
    other = tools_sent(tmp_path / "other", fake_ollama, make_settings, ROUTES[::-1])
    names = [t["function"]["name"] for t in json.loads(one)]
    assert {"notes_a", "notes_b", "notes_c"} <= set(names) and names == sorted(names)
    assert one == other
