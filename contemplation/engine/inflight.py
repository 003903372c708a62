"""A turn the daemon died during, twice in a row, is not begun a third time.

What ends the daemon's process in the middle of a turn cannot be caught in the process: a
plugin's ``os._exit`` or a crash of the interpreter in its stream, the OOM killer on a huge
reply, the systemd watchdog killing a loop a plugin blocks. The restarted daemon finds the
turn due again (the agent spoke last, or the reply was cut) and would send the same request
again, to die again, forever.

So before a turn's request goes out, ``state.json`` records that the turn began
(:class:`~contemplation.models.TurnStarted`: which turn, in which run of the daemon, how many
runs in a row began it), and every way a turn ends takes the record away (the reply's commit,
an error or a retry, a cancel, a stop; :meth:`ConvWriter.end_turn`). A record from another
run, found when the same turn is due again, is a run that died during it: begun by
:data:`DEATHS` runs already, the turn is not begun again, but ends with one ERROR naming the
count, and the conversation waits for the agent (its next message is a new turn). A turn
begun again after one death, or the first one due when a run starts, has its record written
before the request goes out, so a run that dies at once is counted; any other turn's record
rides on the turn's first state write (no write more), and a run that dies before that write
is counted by the restart's recovery, which finds the message it took uncommitted in the log
(``recovery._count_the_death``).
"""

from __future__ import annotations

import structlog

from contemplation.engine.steps import Wait
from contemplation.engine.turn.state import Turn
from contemplation.errors import ErrorKind
from contemplation.models import ConvEvent, MarkerKind

log = structlog.get_logger("contemplation.inflight")

DEATHS = 2  # runs that died during the same turn before it is given up


async def begin(turn: Turn, *, fresh: bool) -> Wait | None:
    """Before a turn's request (under the conversation's lock): record that it begins, or,
    when :data:`DEATHS` runs died during it already, end it with one ERROR (the returned
    outcome; None: go on with the turn). ``fresh``: this run's first look at the
    conversation (recovery ran in this step)."""
    conv, rt, seen, w = turn.conv, turn.rt, turn.seen, turn.w
    before = w.state.turn_started
    died = (
        before is not None
        and (before.turns, before.messages) == (w.state.turns, w.state.messages_processed)
        and before.run != seen.run
    )
    if before is not None and died and before.starts >= DEATHS:
        meta = w.meta
        message = (
            f"the daemon stopped {before.starts} times while this turn was in flight "
            f"({meta.backend}, {meta.model}); it is not begun again, since what ended the "
            "daemon would likely end it again: see the daemon's log (a plugin, the model, "
            "the machine's memory); the agent's next message is answered again"
        )
        w.append_marker(MarkerKind.ERROR, message)
        w.gave_up(ErrorKind.INTERNAL, message)
        log.error("turn_not_redone", conv=conv.id, starts=before.starts, backend=meta.backend)
        rt.notify(conv.id, ConvEvent.ERROR, error=message)
        return Wait(None)
    begun = w.begin_turn(seen.run)
    if died:
        log.warning("turn_begun_again", conv=conv.id, starts=begun.starts, after="a run died")
    if died or (fresh and not w.held):  # (held: a message just taken, a turn never begun)
        await rt.committer.run(w.save_steps(durable=False))  # before the request goes out
    return None
