"""The slot files of conversations that are gone (archived, pruned, deleted) are removed from
llama-server's ``--slot-save-path`` where the provider names it (``slot_save_path``) and the
server runs on this machine: only files the durable map names for that conversation, looked
up inside that folder (a name never leads out of it, a link is never followed)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from contemplation.engine.pipeline import process
from contemplation.engine.provider import Provider
from contemplation.engine.runtime import Runtime
from contemplation.engine.tracking import Tracked
from contemplation.settings import Settings
from contemplation.store.layout import Home
from contemplation.writer import kvmap
from contemplation.writer.slotfiles import drop_slot_files


def _name(i: int) -> str:
    return f"contemplation-kv-{i:024x}.bin"


def _entry(conv: str, i: int) -> kvmap.Entry:
    return kvmap.Entry(conv, _name(i), tokens=100, history=100, size=10, said=())


def _provider(settings: Settings) -> Provider:
    return Provider.make("box", settings, clock=time.time, steady=time.monotonic)


@pytest.fixture
def slots(tmp_path: Path) -> Path:
    folder = tmp_path / "slots"
    folder.mkdir()
    for i in range(1, 5):
        (folder / _name(i)).write_bytes(b"kv")
    return folder


def _settings(
    make_settings: Callable[..., Settings], folder: Path | str, url: str = "http://127.0.0.1:9"
) -> Settings:
    table = {"kind": "openai", "url": url, "slot_save_path": str(folder)}
    return make_settings(providers={"box": table})


def test_an_archived_conversations_files_are_removed_and_no_others(
    home: Home, slots: Path, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    for conv in ("a", "b"):
        (home.active / conv).mkdir(parents=True)
    outside = tmp_path / "keep.txt"
    outside.write_text("not a slot file")
    (slots / _name(9)).symlink_to(outside)  # a link of a slot file's name: left as it is
    kvmap.store(
        home.root,
        "box",
        kvmap.Saved("m", (_entry("a", 1), _entry("a#seat", 2), _entry("b", 3), _entry("a#two", 9))),
    )
    provider = _provider(_settings(make_settings, slots))
    os.rename(home.active / "a", tmp_path / "a-archived")

    removed = asyncio.run(provider.forget_files("a"))

    assert sorted(removed) == [_name(1), _name(2)]
    assert sorted(p.name for p in slots.iterdir()) == [_name(3), _name(4), _name(9)]
    assert outside.read_text() == "not a slot file"
    assert [e.conv for e in kvmap.load(home.root, "box").entries] == ["b"]
    assert asyncio.run(provider.forget_files("a")) == []  # once


def test_files_of_conversations_gone_while_no_daemon_ran_go_when_the_map_is_read(
    home: Home, slots: Path, make_settings: Callable[..., Settings]
) -> None:
    (home.active / "b").mkdir(parents=True)
    kvmap.store(home.root, "box", kvmap.Saved("m", (_entry("b", 3),)))
    (home.active / "c").mkdir()
    kvmap.store(home.root, "box", kvmap.Saved("m", (_entry("b", 3), _entry("c", 4))))
    (home.active / "c").rmdir()  # pruned while the daemon was stopped

    _provider(_settings(make_settings, slots))

    assert sorted(p.name for p in slots.iterdir()) == [_name(1), _name(2), _name(3)]


@pytest.mark.parametrize(
    ("folder", "url"),
    [
        ("relative/slots", "http://127.0.0.1:9"),  # not an absolute folder
        (None, "http://10.1.2.3:8080"),  # another machine's server: its folder is not ours
    ],
)
def test_nothing_is_removed_unless_the_folder_is_absolute_and_the_server_local(
    home: Home,
    slots: Path,
    make_settings: Callable[..., Settings],
    folder: str | None,
    url: str,
) -> None:
    (home.active / "a").mkdir(parents=True)
    kvmap.store(home.root, "box", kvmap.Saved("m", (_entry("a", 1),)))
    provider = _provider(_settings(make_settings, folder or slots, url))
    (home.active / "a").rmdir()
    assert provider.slot_folder() is None
    assert asyncio.run(provider.forget_files("a")) == []
    assert (slots / _name(1)).exists()


def test_a_name_never_leads_out_of_the_folder(slots: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"x")
    names = ["../victim.bin", str(victim), "..", ".", "", f"../slots/{_name(1)}", "x.bin"]
    assert drop_slot_files(slots, names) == []
    assert victim.exists() and (slots / _name(1)).exists()
    link = tmp_path / "linked-slots"
    link.symlink_to(slots, target_is_directory=True)
    assert drop_slot_files(link, [_name(1)]) == []  # the folder itself a link: not followed
    assert drop_slot_files(Path("slots"), [_name(1)]) == []  # relative: refused
    assert drop_slot_files(slots, [_name(1)]) == [_name(1)]


def test_the_daemon_removes_them_when_it_sees_the_conversation_gone(
    home: Home, slots: Path, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    """``process`` of a conversation whose folder went (archive, prune): every provider made
    forgets it, its slot files included."""
    (home.active / "a").mkdir(parents=True)
    kvmap.store(home.root, "box", kvmap.Saved("m", (_entry("a", 1), _entry("a#seat", 2))))
    rt = Runtime(settings=_settings(make_settings, slots), home=home)
    assert rt.provider("box").backend is not None  # used in this run: its client made
    os.rename(home.active / "a", tmp_path / "a-archived")

    async def gone() -> None:
        try:
            await process(home.conv("a"), rt, Tracked())
        finally:
            await rt.aclose()

    asyncio.run(gone())
    assert sorted(p.name for p in slots.iterdir()) == [_name(3), _name(4)]
