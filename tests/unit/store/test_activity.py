"""The one line of what a conversation is doing (store/activity.py): an archived conversation
is finished whatever its last status says (review: it read "stalled: no daemon is running")."""

from __future__ import annotations

import pytest

from contemplation.models import State, Status
from contemplation.store.activity import archived, describe


@pytest.mark.parametrize("status", list(Status))
def test_an_archived_conversation_is_archived_in_any_status(status: Status) -> None:
    line = archived(status.value)
    assert line.startswith("archived: ") and "stalled" not in line, line
    assert ("no answer" in line) is (status is Status.PENDING), line


def test_an_active_one_without_a_daemon_is_still_stalled() -> None:
    line = describe(State(status=Status.AWAITING_AGENT), model="m", daemon=False, queued=0)
    assert line.startswith("stalled: no daemon"), line
