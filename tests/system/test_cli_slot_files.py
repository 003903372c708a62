"""``archive`` and ``prune`` on the command line while no daemon runs remove the slot files
of the conversations that are gone themselves (before, they stayed in llama-server's folder
until a daemon next read the durable map): the same files and the same rules as the daemon's
(the provider's ``slot_save_path`` absolute, its server on this machine, only names the map
gives a conversation that is gone, looked up in the folder without following a link). With
a daemon running they are left to it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from contemplation.store.layout import Home
from contemplation.writer import DaemonLock, archive, kvmap
from contemplation.writer.slotfiles import drop_gone
from tests.conftest import base_env, cli_here
from tests.system.test_index import by_hand, listing_conv


def _name(i: int) -> str:
    return f"contemplation-kv-{i:024x}.bin"


def _entry(conv: str, i: int) -> kvmap.Entry:
    return kvmap.Entry(conv, _name(i), tokens=100, history=100, size=10, said=())


@pytest.fixture
def slots(tmp_path: Path) -> Path:
    folder = tmp_path / "slots"
    folder.mkdir()
    for i in range(1, 7):
        (folder / _name(i)).write_bytes(b"kv")
    return folder


def _env(home: Home, slots: Path) -> dict[str, str]:
    """Two providers share the folder's name: ``box`` on this machine names it, ``far`` (a
    server on another machine) names it too and must never remove from it."""
    config = home.root.parent / "config.toml"
    config.write_text(
        "[providers.box]\n"
        'kind = "openai"\n'
        'url = "http://127.0.0.1:9/v1"\n'
        f"slot_save_path = {json.dumps(str(slots))}\n"
        "[providers.far]\n"
        'kind = "openai"\n'
        'url = "http://10.1.2.3:8080/v1"\n'
        f"slot_save_path = {json.dumps(str(slots))}\n"
    )
    return base_env(home, CONTEMPLATION_CONFIG=str(config))


def _left(slots: Path) -> list[str]:
    return sorted(p.name for p in slots.iterdir())


def test_archive_with_no_daemon_removes_the_conversations_files_and_no_others(
    home: Home, slots: Path, tmp_path: Path
) -> None:
    a = by_hand(home, "conv-a", "2025-01-05")
    by_hand(home, "conv-b", "2025-01-06")
    outside = tmp_path / "keep.txt"
    outside.write_text("not a slot file")
    (slots / _name(9)).symlink_to(outside)  # a link of a slot file's name: left as it is
    entries = (_entry("conv-a", 1), _entry("conv-a#seat", 2), _entry("conv-b", 3))
    kvmap.store(home.root, "box", kvmap.Saved("m", (*entries, _entry("conv-a#two", 9))))
    kvmap.store(home.root, "far", kvmap.Saved("m", (_entry("conv-a", 4),)))
    env = _env(home, slots)

    done = cli_here(env, "archive", a.name)

    assert done.stdout.strip() == str(home.completed / a.name)
    assert _left(slots) == [_name(3), _name(4), _name(5), _name(6), _name(9)]
    assert outside.read_text() == "not a slot file"
    assert "removed 2 slot file(s)" in done.stderr, done.stderr


def test_prune_with_no_daemon_removes_the_files_of_what_it_pruned(home: Home, slots: Path) -> None:
    old = by_hand(home, "old-one", "2025-01-05")
    by_hand(home, "kept-one", "2025-01-06")
    entries = (_entry("old-one", 1), _entry("kept-one", 2))
    kvmap.store(home.root, "box", kvmap.Saved("m", entries))  # by a daemon, now stopped
    archive(home, listing_conv(home, old.name))  # archived with no daemon and no CLI
    env = _env(home, slots)

    dry = cli_here(env, "prune", "--older-than", "90d", "--dry-run")
    assert "would remove old-one" in dry.stdout and _name(1) in _left(slots)
    done = cli_here(env, "prune", "--older-than", "90d")

    assert "removed old-one" in done.stdout
    assert _left(slots) == [_name(2), _name(3), _name(4), _name(5), _name(6)]


def test_with_a_daemon_running_the_files_are_left_to_it(home: Home, slots: Path) -> None:
    """A running daemon holds the map (its newer state in memory) and removes them itself
    when it sees the conversation gone."""
    a = by_hand(home, "conv-a", "2025-01-05")
    kvmap.store(home.root, "box", kvmap.Saved("m", (_entry("conv-a", 1),)))
    env = _env(home, slots)
    lock = DaemonLock(home)
    lock.acquire()
    try:
        cli_here(env, "archive", a.name)
    finally:
        lock.release()
    assert _name(1) in _left(slots)


def test_drop_gone_removes_only_named_files_of_conversations_gone(home: Home, slots: Path) -> None:
    by_hand(home, "here", "2025-01-05")
    gone = by_hand(home, "gone", "2025-01-05")
    kvmap.store(home.root, "box", kvmap.Saved("m", (_entry("here", 1), _entry("gone", 2))))
    shutil.rmtree(gone)  # deleted by hand
    assert drop_gone(home.root, {"box": slots, "none": slots}) == {"box": [_name(2)]}
    assert drop_gone(home.root, {"box": slots}) == {}  # once
    assert drop_gone(home.root, {"box": Path("slots")}) == {}  # a relative folder: refused
    assert _left(slots) == [_name(1), _name(3), _name(4), _name(5), _name(6)]
