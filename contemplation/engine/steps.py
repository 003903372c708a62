"""What one step decides about a conversation, and what a turn or an answer round ends with.

Only the step (:func:`contemplation.engine.pipeline._step`, under the conversation's lock) decides;
a turn re-checks its decision with one :func:`contemplation.protocol.conversation.still_due` call,
and
the writer never decides anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from contemplation.models import Metadata, Route


@dataclass(frozen=True, slots=True)
class TurnDue:
    """The model's turn: a message was taken in, or every need is answered."""

    meta: Metadata


@dataclass(frozen=True, slots=True)
class NeedsDue:
    """NEED lines some rule can answer: look them up outside the lock."""

    meta: Metadata
    needs: tuple[str, ...]
    turn_key: str
    routes: tuple[Route | None, ...] = ()  # of the first needs_per_reply needs


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to do now; look again at ``at`` (wall clock), or on an event when None."""

    at: float | None


@dataclass(frozen=True, slots=True)
class Again:
    """Something changed (a marker written, the folder archived): decide again."""


AGAIN = Again()

Decision = TurnDue | NeedsDue | Wait | Again
Outcome = Wait | Again  # how a turn or an answer round ends
