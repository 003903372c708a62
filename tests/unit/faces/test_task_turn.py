"""Which part of the log is one task's (:mod:`contemplation.faces.mcp.task_turn`), on real
conversation folders with logs written as a person would: each task is its own question."""

from __future__ import annotations

import json
from pathlib import Path

from contemplation.faces import actions
from contemplation.faces.mcp import task_turn
from contemplation.faces.mcp.calls import Faces
from contemplation.faces.mcp.tasks import Tasks
from contemplation.settings import Settings, load
from contemplation.store.layout import Conv


def block(who: str, text: str) -> str:
    return f"=== {who} [2026-01-19 10:00:00] ===\n{text}\n\n"


ASK = "CLAUDE -> OLLAMA"
SAY = "OLLAMA -> CLAUDE"


def made(tmp_path: Path) -> tuple[Settings, Tasks, Conv]:
    settings = load(home=tmp_path / "home", env={})
    conv, _ = actions.start(settings, "turns", None)
    return settings, Tasks(Faces(settings)), conv


def texts(tasks: Tasks, task_id: str) -> list[str]:
    """A task whose turn is over (a later message began): its result's first lines."""
    got = tasks.get(task_id)
    assert got["status"] == "completed", got
    out = json.loads(got["result"]["content"][0]["text"])
    return [b["text"].split("\n")[0] for b in out["blocks"]]


def portion(tasks: Tasks, conv: Conv, task_id: str) -> task_turn.Portion:
    secret = task_id.rpartition(".")[2]
    _, _, record = tasks.locate(task_id)
    return tasks.portion(conv, secret, record)


def test_tasks_sent_at_once_with_the_same_text_each_own_one_turn(tmp_path: Path) -> None:
    _, tasks, conv = made(tmp_path)
    ids = [
        tasks.create(conv.id, 0, "conversation_respond", f"{n}.msg", "Again?")["taskId"]
        for n in (1, 2)
    ]
    conv.log.write_text(block(ASK, "Again?") + block(SAY, "First.") + block(ASK, "Again?"))
    assert texts(tasks, ids[0]) == ["First."]
    second = len((block(ASK, "Again?") + block(SAY, "First.")).encode())
    assert portion(tasks, conv, ids[1]) == task_turn.Portion(second, None, True)
    assert tasks.get(ids[1])["status"] == "working"  # its turn has not answered yet


def test_a_turn_keeps_what_its_needs_led_to_and_stops_at_the_next_message(
    tmp_path: Path,
) -> None:
    _, tasks, conv = made(tmp_path)
    first = tasks.create(conv.id, 0, "conversation_start", "a.msg", "Read the notes.")["taskId"]
    later = tasks.create(conv.id, 0, "conversation_respond", "b.msg", "And then?")["taskId"]
    conv.log.write_text(
        block(ASK, "Read the notes.")
        + block(SAY, "Reading.\nNEED: File contents of notes.md")
        + block(ASK, "RESPONSE TO NEED: File contents of notes.md\n(source: read_file)\nhi")
        + block(SAY, "The notes say hi.")
        + block(ASK, "And then?")
        + block(SAY, "Then nothing.")
    )
    assert texts(tasks, first) == [
        "Reading.",
        "RESPONSE TO NEED: File contents of notes.md",
        "The notes say hi.",
    ]
    at = conv.log.read_text().index("=== CLAUDE -> OLLAMA [2026-01-19 10:00:00] ===\nAnd then?")
    assert portion(tasks, conv, later) == task_turn.Portion(at, None, True)
    secret = first.rpartition(".")[2]
    record = json.loads((conv.dir / "tasks" / f"{secret}.json").read_text())
    assert record["at"] == 0 and isinstance(record["end"], int)  # kept: later looks are cheap
    assert "Read the notes." not in json.dumps(record)  # a fingerprint, never the text


def test_a_message_not_in_the_log_as_sent_falls_back_to_everything_since(
    tmp_path: Path,
) -> None:
    _, tasks, conv = made(tmp_path)
    task = tasks.create(conv.id, 7, "conversation_start", "a.msg", "See the picture.")["taskId"]
    conv.log.write_text(block(ASK, "See it?\n[attached: a.png]") + block(SAY, "A cat."))
    assert portion(tasks, conv, task) == task_turn.Portion(7, None, False)


def test_trimmed_leaves_the_next_turn_out() -> None:
    out = {
        "blocks": [{"offset": 10, "text": "mine"}, {"offset": 50, "text": "theirs"}],
        "cursor": 90,
        "cut": {"next": "more"},
        "in_progress": {"text": "theirs, streaming"},
        "waiting": [{"id": "n1"}],
        "hint": "answer n1",
    }
    got = task_turn.trimmed(out, 40)
    assert got == {"blocks": [{"offset": 10, "text": "mine"}], "cursor": 40, "waiting": []}


def test_the_same_text_sent_again_after_the_cursor_moved_owns_the_later_message(
    tmp_path: Path,
) -> None:
    """An "ok?" queued while an earlier reply was still being written, then "ok?" again once it
    was: the second task's cursor is past the first's, but both messages come after it."""
    _, tasks, conv = made(tmp_path)
    conv.log.write_text(block(ASK, "Before?"))
    first = tasks.create(conv.id, conv.log.stat().st_size, "conversation_respond", "1.msg", "ok?")
    with conv.log.open("a") as f:
        f.write(block(SAY, "Earlier."))
    second = tasks.create(conv.id, conv.log.stat().st_size, "conversation_respond", "2.msg", "ok?")
    with conv.log.open("a") as f:
        f.write(block(ASK, "ok?") + block(SAY, "One.") + block(ASK, "ok?"))
    assert texts(tasks, first["taskId"]) == ["One."]
    at = conv.log.read_text().rindex("=== CLAUDE")
    assert portion(tasks, conv, second["taskId"]) == task_turn.Portion(at, None, True)
