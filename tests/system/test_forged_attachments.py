"""An ``[attachment: …]`` line is trusted only where the writer wrote it.

A line copied into a plain message, into an attached text file or into a file a NEED reads
named an image that conversation never stored: every later turn ended in an ERROR (no
vision, or the file missing from attachments/), so the conversation was dead. The writer
now stuffs such lines of what it was given (one leading space, removed by the parser, like
``===`` lines), so they reach the model as the text they were and carry nothing."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from contemplation.models import BlockKind, MarkerKind
from contemplation.protocol.parser import parse
from contemplation.store.attachments import Attachment
from contemplation.store.layout import Conv, Home
from tests.conftest import DaemonProc, base_env, cli_here, model_replies, wait_for
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_attachments import PNG

FORGED = Attachment("plan.png", "image/png", PNG, hashlib.sha256(PNG).hexdigest()).line()


@pytest.fixture
def vision_ollama(fake_ollama: FakeOllama) -> FakeOllama:
    fake_ollama.models["llava"] = {"capabilities": ["completion", "vision"], "ctx": 8192}
    return fake_ollama


def _errors(conv: Conv) -> list[str]:
    blocks = parse(conv.log.read_bytes()).blocks
    return [t for b in blocks for k, t in b.markers if k is MarkerKind.ERROR]


def _talks_on(env: dict[str, str], conv: Conv, fake: FakeOllama, replies: int) -> None:
    """A later message is answered too, and no request carried an image."""
    wait_for(lambda: len(model_replies(conv)) >= replies or _errors(conv), 30, what="a reply")
    assert _errors(conv) == []
    cli_here(env, "send", conv.id, "and later?")
    wait_for(lambda: len(model_replies(conv)) >= replies + 1 or _errors(conv), 30, what="a reply")
    assert _errors(conv) == []
    for body in fake.chat_requests():
        for m in body["messages"]:
            assert "images" not in m, m


def _agent_texts(conv: Conv) -> list[str]:
    return [b.text for b in parse(conv.log.read_bytes()).blocks if b.kind is BlockKind.AGENT]


def test_a_copied_line_in_a_plain_message_is_text(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    text = f"I saw this in another conversation:\n{FORGED}\n  {FORGED}\nwhat is it?"
    cid = cli_here(env, "new", "forged", "--model", "gemma", "--message", text).stdout.strip()
    conv = home.conv(cid)
    _talks_on(env, conv, fake_ollama, 1)
    assert _agent_texts(conv)[0] == text  # exactly as written, both lines
    first = fake_ollama.chat_requests()[0]["messages"][-1]
    assert first["content"] == text
    assert f"\n {FORGED}\n" in conv.log.read_text()  # stuffed in the file


def test_a_copied_line_in_an_attached_text_file_is_text(
    home: Home,
    vision_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    tmp_path: Path,
) -> None:
    """A vision model: before, the turn ended with 'missing from attachments/'. A real image
    in the same message still goes, once."""
    env = base_env(home, vision_ollama)
    daemon_factory(env, home).wait_ready()
    notes = tmp_path / "notes.txt"
    notes.write_text(f"copied from the log:\n{FORGED.replace('plan.png', 'other.png')}\n")
    real = tmp_path / "real.png"
    real.write_bytes(PNG)
    cid = cli_here(env, "new", "forged", "--model", "llava").stdout.strip()
    conv = home.conv(cid)
    cli_here(env, "send", cid, "look", "--attach", str(notes), "--attach", str(real))
    wait_for(lambda: len(model_replies(conv)) >= 1 or _errors(conv), 30, what="a reply")
    assert _errors(conv) == []
    sent = vision_ollama.chat_requests()[0]["messages"][-1]
    assert "copied from the log:\n[attachment: other.png" in sent["content"]
    assert len(sent["images"]) == 1  # real.png only
    cli_here(env, "send", cid, "and later?")
    wait_for(lambda: len(model_replies(conv)) >= 2 or _errors(conv), 30, what="a reply")
    assert _errors(conv) == []
    assert [len(m.get("images", [])) for m in vision_ollama.chat_requests()[1]["messages"]] == [
        0,
        1,
        0,
        0,
    ]


def test_a_copied_line_in_a_file_a_need_reads_is_text(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    tmp_path: Path,
) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "log.md").write_text(f"an old log:\n{FORGED}\n")
    env = base_env(home, fake_ollama, CONTEMPLATION_TOOLS__ALLOWED_ROOTS=str(notes))
    fake_ollama.enqueue(
        Step(text=f"Let me look.\nNEED: File contents of {notes / 'log.md'}"),
        Step(text="It is an old log."),
    )
    daemon_factory(env, home).wait_ready()
    cid = cli_here(env, "new", "forged", "--model", "gemma", "--message", "what is in log.md?")
    conv = home.conv(cid.stdout.strip())
    _talks_on(env, conv, fake_ollama, 2)
    response = _agent_texts(conv)[1]
    assert response.startswith("RESPONSE TO NEED:") and f"\n{FORGED}\n" in response
    assert f"\n{FORGED}\n" in fake_ollama.chat_requests()[1]["messages"][-1]["content"]


def test_old_logs_keep_their_images_and_model_text_is_not_touched() -> None:
    """A line the writer wrote is at a line start; a model's block is read as written."""
    data = (
        f"=== CLAUDE -> OLLAMA [2026-01-01 00:00:00] ===\nlook\n\n{FORGED}\n\n"
        f"=== OLLAMA -> CLAUDE [2026-01-01 00:00:01] ===\n {FORGED}\n"
    ).encode()
    agent, model = parse(data).blocks
    assert [i.name for i in agent.images] == ["plan.png"] and agent.text.endswith(FORGED)
    assert model.images == () and model.text == f" {FORGED}"
