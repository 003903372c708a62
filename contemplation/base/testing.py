"""Test-only fault injection: stop the process at a named step.

Honoured only when ``CONTEMPLATION_TESTING=1``. ``CONTEMPLATION_CRASH_AT=<point>:<n>`` sends
SIGKILL to this process on the n-th time ``crashpoint(<point>)`` is reached (n defaults to 1).
The points are listed in :data:`POINTS`; the crash tests enumerate them.

``CONTEMPLATION_CRASH_RECORD=<file>``: every point reached is appended to that file, one name a
line (a fault-free run's list is what the crash sweep, ``bench/crash_sweep.py``, kills at in
turn: ``<point>:<n>`` for the n-th line naming ``<point>``).

``CONTEMPLATION_RAISE_AT=<point>``: :class:`InjectedFault` is raised every time that point is
reached, as an unexpected bug there would (a turn that fails the same way each time it is run).

``CONTEMPLATION_COMMIT_LAG=<seconds>``: the group committer waits that long before it takes
each batch, as a committer busy with a burst does, so that a test can make the turns that
find their start write still queued (see ``GroupCommitter.withdraw``) happen every time.
"""

from __future__ import annotations

import os

POINTS = (
    "claim_linked",  # an inbox file linked into processing/ (fsynced), not yet unlinked
    "claim",  # after an inbox file was claimed into processing/
    "attachment_copy",  # half of a message's attached file copied into attachments/
    "intent",  # before a block is written (its intent journaled, or its file in processing/)
    "append",  # in the middle of appending a message block (half of it written)
    "appended",  # after the block was written, before the commit
    "commit",  # after the commit, before processing/ was cleaned
    "reply_header",  # after a reply's header was written
    "reply_stream",  # after some reply tokens were written
    "reply_done",  # after the reply ended, its last bytes held, before its commit
    "reply_record",  # its commit's record (a temp file) written, not durable, last bytes held
    "reply_tail",  # its last bytes in the log (the commit's temp file durable), not durable
    "state_tmp",  # inside an atomic write of state.json, after the temp file was written
    "archive",  # before the conversation folder is moved to completed/
    "rotate",  # after a rotation was journaled in state.json, before any rename
    "rotate_renamed",  # after messages.log became messages.1.log, before the new log exists
)

# written by the faces (CLI, MCP): a message delivered into inbox/, one taken back, and a
# conversation's unarchive
FACE_POINTS = (
    "deliver",  # a message renamed into inbox/, before inbox/ was fsynced
    "withdraw",  # a queued message renamed to its hidden name, before its removal
    "unarchive",  # before an archived conversation is moved back into active/
)

# the other files written whole (temp file, fsync, rename): after the temp file was written
RECORD_POINTS = (
    "metadata_tmp",  # metadata.json: the decisions (approve), a model set, the daemon's own
    "task_tmp",  # an MCP task's record (tasks/<secret>.json)
    "memory_tmp",  # the memory store (<home>/memory.json)
    "file_tmp",  # any other (current-state.json, .idempotency.json, the daemon's info, …)
)

# the escalation ladder (reached only by a conversation with a ladder whose reply failed)
LADDER_POINTS = (
    "escalated",  # a failed reply's ESCALATED marker committed, the next rung not asked yet
)

# the derived index and retention (reached by search, list, reindex and prune, not by a turn)
INDEX_POINTS = (
    "index_write",  # inside an index transaction: a conversation's text written, not its row
    "prune",  # after the archived conversations were renamed out of sight, before an fsync
    "pruned",  # after one of them was removed, before the next
)

# a fork (reached by `contemplation fork`, MCP conversation_fork, the dashboard's "fork here")
FORK_POINTS = (
    "fork_staged",  # the fork's log and segments written under its dot-name, nothing else
    "fork",  # the fork whole (and durable) under its dot-name, before the rename into active/
    "fork_renamed",  # after the rename into active/, before active/ was fsynced
)

_enabled = os.environ.get("CONTEMPLATION_TESTING") == "1"
#: False outside the tests. A hook on a path run for every block or streamed event reads it
#: first (``if ENABLED: crashpoint(...)``), so a daemon in use makes no call there.
ENABLED = _enabled
_target, _, _nth = os.environ.get("CONTEMPLATION_CRASH_AT", "").partition(":")
_remaining = int(_nth or "1") if _enabled and _target else 0

_raise_at = os.environ.get("CONTEMPLATION_RAISE_AT", "") if _enabled else ""
_record = os.environ.get("CONTEMPLATION_CRASH_RECORD", "") if _enabled else ""


class InjectedFault(RuntimeError):
    """What ``CONTEMPLATION_RAISE_AT`` raises."""


COMMIT_LAG = float(os.environ.get("CONTEMPLATION_COMMIT_LAG", "0") or 0) if _enabled else 0.0


def crashpoint(name: str) -> None:
    global _remaining  # noqa: PLW0603 - a process-wide countdown is the point
    if _record:
        _note(name)
    if _raise_at and name == _raise_at:
        raise InjectedFault(f"injected fault at {name}")
    if not _remaining or name != _target:
        return
    _remaining -= 1
    if _remaining == 0:
        import signal  # only here: its enums cost every process that imports this ~1 ms

        os.kill(os.getpid(), signal.SIGKILL)


def _note(name: str) -> None:
    """Append ``name`` to the record file (one write with O_APPEND: threads and processes
    that share the file never interleave their lines)."""
    fd = os.open(_record, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, f"{name}\n".encode())
    finally:
        os.close(fd)


def armed(name: str) -> bool:
    """True when a crash at ``name`` is pending (lets a writer split a write to tear it)."""
    return bool(_remaining) and name == _target
