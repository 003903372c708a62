"""The daemon's claim of an inbox file: the file is linked into ``processing/``,
that folder made durable, and only then unlinked from ``inbox/``, so it always has a durable
name; a claim cut between the two leaves two names for one file, and recovery keeps the
claimed one only. The daemon links at once and does the rest with the turn's first state
write (``claim_link``, ``finish_claims``)."""

from __future__ import annotations

import os

from contemplation.store.layout import Conv, Home, queued_messages
from contemplation.store.templates import load_template
from contemplation.writer import claim, drop_message, new_conversation
from contemplation.writer.attachments import drop_folder_message
from contemplation.writer.durable import run_now
from contemplation.writer.folders import claim_link, drop_claimed_twins, finish_claims, withdraw


def _conv(home: Home) -> Conv:
    tpl = load_template(home, "default")
    return new_conversation(home, "c", template=tpl, model="m", backend="ollama", durable=False)


def test_a_claimed_file_is_the_same_file_under_one_name(home: Home) -> None:
    conv = _conv(home)
    msg = drop_message(conv, "Which index?")
    ino = os.stat(msg).st_ino
    claimed = claim(conv, msg)
    assert claimed is not None and claimed.parent == conv.processing
    assert not msg.exists() and os.stat(claimed).st_ino == ino
    assert os.stat(claimed).st_nlink == 1
    assert claimed.name.endswith("-" + msg.name)


def test_a_claim_cut_between_its_link_and_its_unlink_is_taken_once(home: Home) -> None:
    conv = _conv(home)
    msg = drop_message(conv, "Which index?")
    twin = conv.processing / f"{0:020d}-abcdef-{msg.name}"
    os.link(msg, twin)  # what a claim killed at its point "claim_linked" leaves
    other = drop_message(conv, "another")
    assert drop_claimed_twins(conv) == [msg.name]
    assert sorted(p.name for p in conv.inbox.iterdir()) == [other.name]
    assert twin.read_text() == "Which index?" and os.stat(twin).st_nlink == 1
    assert drop_claimed_twins(conv) == []


def test_a_file_linked_in_twice_by_hand_is_two_messages(home: Home) -> None:
    """Only the claim's own twin goes (same inode and the claim's name for it): the same
    file put into inbox/ under two names by hand is sent twice, as it was before."""
    conv = _conv(home)
    first = drop_message(conv, "same words", name="q1.md")
    second = conv.inbox / "q2.md"
    os.link(first, second)
    claimed = claim(conv, first)
    assert claimed is not None and os.stat(claimed).st_nlink == 2  # shared with q2.md
    assert drop_claimed_twins(conv) == []
    assert second.exists()


def test_a_folder_message_is_claimed_whole_by_a_rename(home: Home) -> None:
    conv = _conv(home)
    msg = drop_folder_message(conv, "see attached", ())
    claimed = claim(conv, msg)
    assert claimed is not None and claimed.is_dir() and not msg.exists()
    assert list(conv.inbox.iterdir()) == []


def test_a_symlink_is_claimed_as_itself_not_its_target(home: Home) -> None:
    conv = _conv(home)
    target = home.root / "elsewhere.txt"
    target.write_text("not a message")
    link = conv.inbox / "link.msg"
    link.symlink_to(target)
    claimed = claim(conv, link)
    assert claimed is not None and claimed.is_symlink() and not os.path.lexists(link)
    assert os.stat(target).st_nlink == 1  # the target was never given another name


def test_a_claim_linked_and_not_yet_durable_has_both_names_and_is_queued_once(home: Home) -> None:
    """The daemon's claim in two halves (the second with the turn's first state write): the
    link alone leaves the inbox name, counted once as claimed; the second half removes it."""
    conv = _conv(home)
    msg = drop_message(conv, "Which index?")
    claimed = claim_link(conv, msg)
    assert claimed is not None and msg.exists() and os.stat(claimed).st_nlink == 2
    assert queued_messages(conv) == [claimed]
    run_now(finish_claims(conv, [(msg, claimed)]))
    assert not msg.exists() and os.stat(claimed).st_nlink == 1
    assert queued_messages(conv) == [claimed]
    assert claim_link(conv, msg) is None  # taken


def test_a_withdraw_after_the_link_finds_the_claim_and_leaves_it(home: Home) -> None:
    """Once linked the claim has won: a withdraw then removes only the inbox name, says it
    withdrew nothing, and the second half of the claim finds that name gone."""
    conv = _conv(home)
    msg = drop_message(conv, "Which index?")
    claimed = claim_link(conv, msg)
    assert claimed is not None
    assert withdraw(conv, msg.name, durable=False) is False
    assert list(conv.inbox.iterdir()) == [] and claimed.read_text() == "Which index?"
    run_now(finish_claims(conv, [(msg, claimed)]))
    assert claimed.read_text() == "Which index?" and os.stat(claimed).st_nlink == 1


def test_the_second_half_leaves_another_file_that_took_the_inbox_name(home: Home) -> None:
    conv = _conv(home)
    msg = drop_message(conv, "first", name="q.md")
    claimed = claim_link(conv, msg)
    assert claimed is not None
    assert withdraw(conv, msg.name, durable=False) is False
    again = drop_message(conv, "second", name="q.md")
    run_now(finish_claims(conv, [(msg, claimed)]))
    assert again.read_text() == "second" and claimed.read_text() == "first"


def test_a_folder_message_is_not_linked(home: Home) -> None:
    conv = _conv(home)
    assert claim_link(conv, drop_folder_message(conv, "see attached", ())) is None
