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
    line = describe(
        State(status=Status.AWAITING_AGENT).model_dump(), model="m", daemon=False, queued=0
    )
    assert line.startswith("stalled: no daemon"), line


@pytest.mark.parametrize("status", [Status.GENERATING, Status.ROUTING, Status.RETRYING])
def test_a_full_disk_is_said_as_such_whatever_the_unwritable_state_says(status: Status) -> None:
    """state.json cannot be written on a full disk, so it still says "generating"
    (status printed "~240,612 tokens so far" for the whole outage)."""
    full = "the disk is full (0 KiB free where /h is)"
    state = State(status=status, generating_since=1.0).model_dump()  # (as plain.state reads it)
    line = describe(state, model="m", daemon=True, queued=0, written=4000, disk_full=full, now=9)
    assert line == f"retrying: {full}; the turn is redone whole once there is room", line
    idle = describe(
        State(status=Status.IDLE).model_dump(), model="m", daemon=True, queued=0, disk_full=full
    )
    assert idle.startswith("idle"), idle  # nothing to write: nothing held
    gone = describe(state, model="m", daemon=False, queued=0, disk_full=full)
    assert gone.startswith("stalled: no daemon"), gone
