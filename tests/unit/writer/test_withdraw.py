"""Withdrawing a queued message (``tasks/cancel`` before a daemon claims it) against the
daemon's claim: one rename each on the same name, so exactly one of them wins, every time."""

from __future__ import annotations

import threading
from pathlib import Path

from contemplation.store.layout import Conv, Home, queued_messages
from contemplation.store.templates import load_template
from contemplation.writer import claim, drop_message, new_conversation
from contemplation.writer.attachments import drop_folder_message
from contemplation.writer.folders import withdraw


def _conv(home: Home) -> Conv:
    tpl = load_template(home, "default")
    return new_conversation(home, "w", template=tpl, model="m", backend="ollama", durable=False)


def test_a_queued_message_is_withdrawn_and_nothing_is_left_behind(home: Home) -> None:
    conv = _conv(home)
    msg = drop_message(conv, "Which index?")
    assert withdraw(conv, msg.name) is True
    assert list(conv.inbox.iterdir()) == [] and queued_messages(conv) == []
    assert withdraw(conv, msg.name) is False  # once
    assert withdraw(conv, "../metadata.json") is False and withdraw(conv, ".x.tmp") is False


def test_a_folder_message_is_withdrawn_whole(home: Home) -> None:
    conv = _conv(home)
    msg = drop_folder_message(conv, "see attached", ())
    assert withdraw(conv, msg.name) is True
    assert list(conv.inbox.iterdir()) == []


def _race(conv: Conv, msg: Path) -> tuple[bool, bool]:
    """The daemon's claim and a withdraw, released at once; whether each won."""
    go = threading.Barrier(2)
    won: dict[str, bool] = {}

    def take() -> None:
        go.wait()
        won["claim"] = claim(conv, msg) is not None

    def cancel() -> None:
        go.wait()
        won["withdraw"] = withdraw(conv, msg.name, durable=False)

    threads = [threading.Thread(target=take), threading.Thread(target=cancel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return won["claim"], won["withdraw"]


def test_withdraw_and_claim_racing_exactly_one_wins(home: Home) -> None:
    conv = _conv(home)
    for i in range(200):
        claimed, withdrawn = _race(conv, drop_message(conv, f"message {i}"))
        assert claimed != withdrawn, i
        assert list(conv.inbox.iterdir()) == []
        for p in conv.processing.iterdir():
            p.unlink()
