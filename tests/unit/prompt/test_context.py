"""Context assembly from metadata's context_requirements: parallel, deadline, cache, saved."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from contemplation import settings as settings_mod
from contemplation.needs.router import NeedRouter
from contemplation.needs.tools.base import ToolResult
from contemplation.needs.tools.memory import MEMORY_FILE, STATE_FILE, JsonStore
from contemplation.prompt.context import ContextAssembler, Section, render, saved_context
from contemplation.store.layout import Conv, Home


class SlowTool:
    name = "slow"

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.calls = 0

    async def call(self, arguments: Mapping[str, Any]) -> ToolResult:
        self.calls += 1
        await asyncio.sleep(self.delay)
        return ToolResult("slow result", "slow")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Any]:
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "README.md").write_text("# Project\nA queue for conversations.\n")
    (project / "pkg" / "core.py").write_text("def run():\n    pass\n\nclass Engine:\n    pass\n")
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / "queues.md").write_text("# Queues\nMaildir style delivery is robust.\n")
    home = Home(tmp_path / "home")
    JsonStore(home, MEMORY_FILE).put("delivery", "we use maildir semantics")
    JsonStore(home, STATE_FILE).put("ci", "green on main")
    conv = Conv(home.active / "conv_1")
    conv.dir.mkdir(parents=True)  # no context/ yet: the writer makes it
    settings = settings_mod.load(
        home=home.root,
        env={},
        config=None,
        overrides={"tools": {"allowed_roots": [str(project)], "notes_vault": str(vault)}},
    )
    return {"settings": settings, "conv": conv, "project": project}


REQUIREMENTS: list[dict[str, Any]] = [
    {"type": "code_structure", "path": "."},
    {"type": "files", "paths": ["README.md", "../../etc/passwd"]},
    {"type": "notes", "query": "maildir delivery"},
    {"type": "memory", "query": "delivery"},
    {"type": "state", "thing": "ci"},
    {"type": "constraints", "items": ["no network", "answer in English"]},
    {"type": "need", "need": "File contents of pkg/core.py"},
    {"type": "horoscope"},
]


def test_every_kind_of_requirement_lands_in_its_labelled_section(world: dict[str, Any]) -> None:
    conv: Conv = world["conv"]

    async def main() -> tuple[list[Section], str]:
        async with NeedRouter(world["settings"]) as router:
            return await ContextAssembler(router, durable=False).assemble(conv, REQUIREMENTS)

    sections, text = asyncio.run(main())
    by_title = {s.title: s for s in sections}
    assert "core.py: run, Engine" in by_title["code structure: ."].text
    assert by_title["file: README.md"].text.startswith("# Project")
    assert not by_title["file: ../../etc/passwd"].ok
    assert "refused" in by_title["file: ../../etc/passwd"].text
    assert "queues.md" in by_title["notes: maildir delivery"].text
    assert by_title["notes: maildir delivery"].label == "notes"
    assert "maildir semantics" in by_title["memory: delivery"].text
    assert (
        by_title["state of ci"].label == "state" and "green on main" in by_title["state of ci"].text
    )
    assert by_title["constraints"].text == "- no network\n- answer in English"
    assert "class Engine" in by_title["File contents of pkg/core.py"].text
    assert sections[-1].title == "unusable requirement" and "horoscope" in sections[-1].text

    headings = [ln for ln in text.splitlines() if ln.startswith("## ")]
    assert headings == ["## Background", "## Current state", "## Constraints", "## Related notes"]
    assert "BEGIN CONTEXT" in text and "END CONTEXT" in text
    assert "root:" not in text
    saved = sorted(p.name for p in conv.context.iterdir())
    assert saved[0] == "01-background.md" and "context.md" in saved
    assert len(saved) == len(sections) + 1
    assert saved_context(conv) == text


def test_what_is_not_ready_by_the_deadline_is_skipped_and_named(world: dict[str, Any]) -> None:
    slow = SlowTool(30)

    async def main() -> tuple[list[Section], float]:
        router = NeedRouter(world["settings"], tools={"notes.search": slow})
        async with router:
            started = time.monotonic()
            sections = await ContextAssembler(router, deadline=0.3, durable=False).gather(
                [{"type": "notes", "query": "anything"}, {"type": "state", "thing": "ci"}]
            )
            return sections, time.monotonic() - started

    sections, took = asyncio.run(main())
    assert took < 3
    assert sections[0].text == "not ready within 0.3 s; skipped" and not sections[0].ok
    assert sections[1].ok and "green on main" in sections[1].text
    assert "(unavailable: not ready within 0.3 s; skipped)" in render(sections)


def test_results_are_cached_per_source_until_they_go_stale(world: dict[str, Any]) -> None:
    tool = SlowTool(0)
    clock = Clock()

    async def main() -> list[int]:
        router = NeedRouter(world["settings"], tools={"notes.search": tool})
        async with router:
            ctx = ContextAssembler(router, fresh_seconds=60, clock=clock, durable=False)
            req = [{"type": "notes", "query": "q"}]
            counts = []
            await ctx.gather(req)
            counts.append(tool.calls)
            clock.t = 59
            await ctx.gather(req)
            counts.append(tool.calls)
            await ctx.gather([{"type": "notes", "query": "other"}])  # another source
            counts.append(tool.calls)
            clock.t = 61
            await ctx.gather(req)
            counts.append(tool.calls)
            return counts

    assert asyncio.run(main()) == [1, 1, 2, 3]


def test_no_requirements_means_no_context_and_no_files(world: dict[str, Any]) -> None:
    conv: Conv = world["conv"]

    async def main() -> tuple[list[Section], str]:
        async with NeedRouter(world["settings"]) as router:
            return await ContextAssembler(router).assemble(conv, [])

    assert asyncio.run(main()) == ([], "")
    assert not conv.context.exists()
    assert saved_context(conv) == ""


def test_the_model_is_never_shown_a_hint_meant_for_the_user(tmp_path: Path) -> None:
    """The research template gathered "unavailable: no notes vault is configured:
    set tools.notes_vault in the config" into the model's prompt. The model hears that the
    source is not there; the setting to change is the person's (doctor names it)."""
    home = Home(tmp_path / "home")
    conv = Conv(home.active / "conv_1")
    conv.dir.mkdir(parents=True)
    settings = settings_mod.load(home=home.root, env={}, config=None)  # no vault, no roots
    reqs = [
        {"type": "notes", "query": "queues"},
        {"type": "files", "paths": ["README.md"]},
        {"type": "need", "need": "Search results for queues"},
    ]

    async def main() -> str:
        async with NeedRouter(settings) as router:
            return (await ContextAssembler(router, durable=False).assemble(conv, reqs))[1]

    text = asyncio.run(main())
    assert text.count("(unavailable: ") == 3, text
    assert "notes vault" in text
    for hint in ("tools.", "notes_vault", "allowed_roots", "search_tool", "the config", "[[routes"):
        assert hint not in text, (hint, text)
