"""One conversation, one readable function: :func:`process`. And the burst: :func:`process_pending`.

``process(conv)`` does whatever is due in a conversation and returns when nothing more can be
done right now, with the time it wants to be looked at again (a retry, a file still settling).
Start-up, the watcher, the periodic rescan, ``run --once`` and the tests all go through here.

A step, under the conversation's lock (:func:`_step`):
  recover a crash → adopt bytes appended by hand → honour a cancel → decide from the log:
  a model turn is due (:mod:`contemplation.engine.turn`) / needs to look up
  (:mod:`contemplation.needs`)
  / complete → archive / else take the next inbox message (exactly once).
"""

from __future__ import annotations

import asyncio
import collections
import os
import stat
from pathlib import Path

import structlog

from contemplation.engine import answering, inflight
from contemplation.engine.escalation import escalate_rounds
from contemplation.engine.prefetch import Ahead
from contemplation.engine.runtime import Runtime
from contemplation.engine.steps import AGAIN, Again, Decision, NeedsDue, Outcome, TurnDue, Wait
from contemplation.engine.tracking import Tracked
from contemplation.engine.turn.run import run_turn
from contemplation.engine.turn.state import Turn
from contemplation.errors import ContemplationError, LockBusy, NotFound
from contemplation.models import BackendSession, ConvEvent, MarkerKind, Metadata, Status
from contemplation.protocol import logformat, structured
from contemplation.protocol.conversation import Next, awaiting
from contemplation.protocol.panel import Seated, seated
from contemplation.store import attachments
from contemplation.store.layout import (
    Conv,
    Rest,
    inbox_entries,
    list_conversations,
    read_metadata,
    read_state,
    rest_of,
)
from contemplation.store.openfiles import being_written
from contemplation.writer import (
    ConvWriter,
    archive,
    claim,
    clear_cancel,
    open_writer,
    reject_input,
    unclaim,
)
from contemplation.writer.attachments import store as store_attachments
from contemplation.writer.folders import remove_empty_rest, sweep_rests
from contemplation.writer.recovery import recover

log = structlog.get_logger("contemplation.pipeline")

ROUND_LIMIT_NOTE = "need rounds limit reached"
SETTLE_ROUNDS = 20  # looks again at files still settling, in one process_pending burst
WRITER_RECHECK = 1.0  # s: a settled inbox file still open for writing is looked at again


def _settled(mtime_ns: int, now: float, window: float) -> bool:
    return now - mtime_ns / 1e9 >= window


def _nothing_past(path: Path, offset: int) -> bool:
    """A regular file that ends at or before ``offset`` (a follow-up with nothing in it)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size <= offset


async def _step(conv: Conv, rt: Runtime, seen: Tracked, w: ConvWriter, own: Metadata) -> Decision:
    """One decision under the lock: tidy up the folder, then decide from the log, then take
    the next message, and make the status say why when there is nothing to do. ``own``: the
    conversation's metadata; in a panel the writer speaks as the seat that is due
    (:func:`~contemplation.protocol.panel.seated`) until the step takes a message."""
    now = rt.clock()
    w.meta = own
    unsettled, known = _tidy(conv, rt, seen, w, now)
    if unsettled is not None:
        return unsettled
    parsed = await seen.view(conv, own.agent_label).refreshed(known, w.folder_names, w.fd)
    w.record_parse_errors(list(parsed.errors))
    due = seated(own, parsed.blocks, awaiting(w.state, own))  # a lookup held: not by hand
    w.meta = due.meta
    decided = _decide(conv, rt, w, due, now=now)
    if decided is not None:
        return decided
    w.meta = own  # a message taken is the whole panel's
    taken = await _next_message(w, rt, seen, now)
    if isinstance(taken, Wait):
        _say_why(w, rt, due.nxt, has_blocks=bool(parsed.blocks))
    return taken


def _tidy(
    conv: Conv, rt: Runtime, seen: Tracked, w: ConvWriter, now: float
) -> tuple[Wait | None, os.stat_result | None]:
    """Recover unfinished writes, adopt settled hand appends, rotate a long log. Returns a
    Wait while bytes appended by hand are still settling, and the log's stat when it still
    holds (nothing was adopted or rotated), so the log is stat'ed once per step."""
    # an intent or rotation left in state.json is a write that did not finish (a crash, a
    # full disk): nobody else writes while we hold the lock, so it is recovered now
    if conv.id not in seen.recovered or w.state.intent is not None or w.state.rotation:
        cut = seen.cut_by.get(conv.id)  # a failed write, not a restart
        for what in recover(w, rt.settings.max_message_bytes, rt.settings.attachments, cut=cut):
            log.warning("recovered", conv=conv.id, what=what)
        seen.cut_by.pop(conv.id, None)
        sweep_rests(conv)  # follow-ups' records a crash left without their files
        seen.recovered.add(conv.id)
    kept = w.keep_log(now, 2 * rt.settings.settle_seconds, rt.settings.rotate_bytes)
    if kept.settling_until is not None:
        return Wait(kept.settling_until), None
    if kept.adopted:
        log.info("adopted_append", conv=conv.id, bytes=kept.adopted)
    if kept.rotated:  # between blocks; tail -F follows the rename
        log.info("rotated", conv=conv.id)
    for warning in w.warnings:
        log.warning("log_warning", conv=conv.id, warning=warning)
    w.warnings.clear()
    return None, kept.stat


def _decide(conv: Conv, rt: Runtime, w: ConvWriter, due: Seated, *, now: float) -> Decision | None:
    """What the log says is due: a cancel, a turn, an archive, needs to look up. None: take
    the next message."""
    nxt = due.nxt
    if nxt.action != "needs":
        w.record_asked(())  # a message or a turn since: nothing waits for approval
    if conv.cancel_flag.exists():  # honoured once, never left for a future turn
        clear_cancel(conv)
        if nxt.action == "turn":
            w.append_marker(MarkerKind.CANCELLED, "the turn was cancelled by the agent")
            w.show(Status.CANCELLED)
            rt.notify(conv.id, ConvEvent.CANCELLED)
            return AGAIN
    if nxt.action == "turn":
        retry_at = rt.retry_due(conv.id, w.state.next_retry_at, now)  # measured monotonic
        if retry_at is not None and retry_at > now:
            if not rt.backoff_outdated(conv.id, w.meta.backend, w.state.retry_settings):
                w.show(Status.RETRYING)
                return Wait(retry_at)
            log.info("retry_at_once", conv=conv.id, why="the backend's settings changed")
        return TurnDue(w.meta)
    if nxt.action == "complete":
        # archived once, when the COMPLETE marker is first seen: a conversation reopened (or
        # moved back into active/ by hand) keeps its status COMPLETE and stays
        first = w.state.status is not Status.COMPLETE
        w.show(Status.COMPLETE)
        if first and w.meta.archive_on_complete and rt.settings.archive_on_complete:
            dest = archive(rt.home, conv)
            rt.notify(conv.id, ConvEvent.ARCHIVED, path=str(dest.dir))
            log.info("archived", conv=conv.id)
            return AGAIN  # the next round sees the folder gone and lets backends forget it
    if nxt.action == "needs":  # looked up outside the lock, unless the model loops
        if nxt.rounds > rt.settings.max_need_rounds and escalate_rounds(rt, w, due):
            return AGAIN  # a ladder: the next rung takes the turn
        needs = _needs(w, rt, due)
        if needs is not None:
            w.show(Status.ROUTING, nxt.needs)
            return needs
    return None


async def _next_message(
    w: ConvWriter, rt: Runtime, seen: Tracked, now: float
) -> TurnDue | Again | Wait:
    """Claimed messages first (recovery), then the inbox in arrival order; a file written in
    place is taken once it has settled and no process holds it open for writing (Wait until
    then: its writer's close pokes the conversation on Linux, else the next look does).
    Settled: its mtime that long ago by the wall clock, or seen unchanged that long by the
    monotonic one (a wall clock stepped back since it was written puts its mtime ahead)."""
    conv = w.conv
    await _claims_durable(w, rt)
    for claimed in w.claimed_files():
        return _take(w, rt, claimed)
    wake: float | None = None
    settle = rt.settings.settle_seconds
    steady = rt.steady()
    for entry in inbox_entries(conv):
        quiet = seen.quiet_for(entry, steady)
        at = min(entry.mtime_ns / 1e9 + settle, now + settle - quiet)
        if (
            entry.path in seen.fast_ready
            or _settled(entry.mtime_ns, now, settle)
            or quiet >= settle
        ):
            seen.fast_ready.discard(entry.path)
            if being_written(entry.path):
                if seen.still_written(entry):
                    log.info("inbox_being_written", conv=conv.id, file=entry.name, bytes=entry.size)
                at = now + max(settle, WRITER_RECHECK)
            else:
                seen.writing.pop(entry.path, None)
                seen.quiet.pop(entry.path, None)
                claimed_path = await _claim(w, entry.path)
                if claimed_path is None:
                    continue
                return _take(w, rt, claimed_path)
        wake = at if wake is None else min(wake, at)
    return Wait(wake)


def _say_why(w: ConvWriter, rt: Runtime, nxt: Next, *, has_blocks: bool) -> None:
    """Nothing to do: the status says why."""
    if nxt.action == "needs" and w.state.pending_approvals:
        if w.state.status is not Status.AWAITING_APPROVAL:
            asked = [r.model_dump(mode="json") for r in w.state.pending_approvals]
            log.info("awaiting_approval", conv=w.conv.id, requests=len(asked))
            rt.notify(w.conv.id, ConvEvent.AWAITING_APPROVAL, requests=asked)
        w.show(Status.AWAITING_APPROVAL, nxt.needs)
    elif nxt.action == "needs":
        w.show(Status.AWAITING_AGENT, nxt.needs)
    elif nxt.action == "stopped":
        w.show(Status.CANCELLED if nxt.reason == "cancelled" else Status.ERROR)
    elif nxt.action == "idle" and w.state.status is not Status.COMPLETE:
        w.show(Status.IDLE if has_blocks else Status.PENDING)


def _needs(w: ConvWriter, rt: Runtime, due: Seated) -> NeedsDue | None:
    """Needs to look up now; None leaves them to the agent (no rule, or too many rounds) or
    to the agent's approval (recorded in state.json for :func:`_say_why`)."""
    limit, nxt = rt.settings.max_need_rounds, due.nxt
    if nxt.rounds > limit:
        w.record_asked(())
        if not any(t.startswith(ROUND_LIMIT_NOTE) for _, t in due.log[-1].markers):
            w.append_marker(
                MarkerKind.NOTE,
                f"{ROUND_LIMIT_NOTE}: {nxt.rounds} replies with NEEDs since the agent's last "
                f"message (max_need_rounds = {limit}); the agent can answer or send a message",
            )
        return None
    planned = answering.plan(rt, w.meta, due.blocks, nxt.needs)
    w.record_asked(planned.asked)
    return planned.due


async def _claim(w: ConvWriter, path: Path) -> Path | None:
    """:func:`~contemplation.writer.claim`. With durability on, a file is linked into
    ``processing/`` here and its claim made durable by the turn's first state write, while
    its request goes out (:meth:`ConvWriter.claim`); a folder message is claimed whole off
    the loop (it fsyncs ``processing/``: milliseconds on a busy disk, more on a slow one)."""
    if not w.durable:
        return claim(w.conv, path, durable=False)
    linked = w.claim(path)
    if linked is not None:
        return linked
    return await asyncio.to_thread(claim, w.conv, path, durable=True)


async def _claims_durable(w: ConvWriter, rt: Runtime) -> None:
    """The claims linked and not yet durable, made so now (off the loop) before the inbox
    is looked at again (a claimed file's inbox name is there until then)."""
    if w.claiming:
        await rt.committer.run(w.claim_steps())


def _take(w: ConvWriter, rt: Runtime, claimed: Path) -> TurnDue | Again:
    """Append a claimed message as an agent block, exactly once, then drop the claim. Its
    block is held for the turn's first state write, which makes its claim durable too;
    every other way out (rare) makes the claim durable first, here."""
    w.took(claimed)
    if being_written(claimed):  # opened for writing between the look and the claim
        w.claims_durable()
        back = unclaim(w.conv, claimed)
        log.info("unclaimed", conv=w.conv.id, file=back.name, why="open for writing")
        return AGAIN
    folder = claimed.is_dir() and not claimed.is_symlink()
    # a follow-up its record proves (see release_claimed; never a name): the message it
    # is the rest of, and the bytes of it taken before. Any other file is a whole message.
    rest = None if folder else rest_of(claimed)
    if rest is not None and rest.offset and _nothing_past(claimed, rest.offset):
        w.claims_durable()
        remove_empty_rest(claimed)  # its writer added nothing: it holds only bytes taken
        return AGAIN
    try:  # a file, or a folder with files (kept in attachments/ before the block names them)
        msg = attachments.read_claimed(
            claimed, rt.settings.max_message_bytes, rt.settings.attachments
        )
    except FileNotFoundError:
        w.claims_durable()
        return AGAIN
    text, note = msg.text, msg.note
    bad_schema = structured.refused(text, rt.settings.max_schema_bytes) if text else None
    if bad_schema is not None:
        text, note = None, bad_schema
    if text is not None and msg.files:
        store_attachments(w.conv, attachments.block_id(claimed.name), msg.files, durable=w.durable)
    if text is None:
        w.claims_durable()
        # said (and committed) before the file leaves processing/: a reader that finds the
        # message no longer queued finds why (`wait` read it settled between the two, exit 0).
        # A crash between them refuses it again after the restart: said twice, never lost.
        w.append_marker(MarkerKind.NOTE, logformat.not_taken(claimed.name, note, claimed.name))
        reject_input(w.conv, claimed, note)
        rt.notify(w.conv.id, ConvEvent.REJECTED, reason=note)
        return AGAIN
    if note:
        w.warn(f"{claimed.name}: {note}")
        # said in the log too, before the message (a line after it would sit between the
        # claimed message and its reply, where recovery looks for the reply)
        name = claimed.name.split("-", 2)[-1]  # as the agent named it (claim's prefix off)
        w.append_marker(MarkerKind.NOTE, f"the next message ({name}) was not UTF-8: {note}")
    if rest is not None:
        _note_rest(w, rest)
    # fsynced, committed and its file removed by the turn's first state write (off the loop)
    w.append_block(
        w.meta.agent_label,
        w.meta.sender_label(),
        text,
        msg_id=claimed.name,
        claimed=claimed,
        seen=msg.seen,
        own=msg.own,
    )
    rt.notify(w.conv.id, ConvEvent.MESSAGE, text=text)
    if w.meta.panel:  # the next step decides which seat answers first
        return AGAIN
    return TurnDue(w.meta)  # the agent spoke last: the model's turn, without deciding again


def _note_rest(w: ConvWriter, rest: Rest) -> None:
    """The NOTE before a follow-up's block; not again when the log ends with it already (a
    crash after it was committed and before the block was: the follow-up is taken again)."""
    text = (
        f"the next message is the rest of {rest.first}: written into it after it was taken "
        f"(its bytes from {rest.offset} on), so it follows as a message of its own"
    )
    said = logformat.marker(MarkerKind.NOTE, text).encode("utf-8")
    size = w.log_size()
    if size >= len(said) and w.log_bytes(size - len(said), len(said)) == said:
        return
    w.append_marker(MarkerKind.NOTE, text)


# --------------------------------------------------------------------------- entry points

MAX_STEPS = 10_000


def _looks_like_a_conversation(conv: Conv) -> bool:
    """A folder made by hand has an inbox or a log (its metadata is checked first)."""
    return conv.inbox.is_dir() or conv.log.exists()


def _archived_sessions(rt: Runtime, conv: Conv) -> list[BackendSession]:
    """The server-side sessions the archived copy of a conversation names in its state.json
    (``completed/<id>``, or ``<id>-<suffix>`` when that name was taken): a restarted daemon
    knows them from there only."""
    found: list[BackendSession] = []
    done = rt.home.completed
    for d in [done / conv.id, *sorted(done.glob(f"{conv.id}-*"))]:
        copy = Conv(d)
        meta = read_metadata(copy)
        if d.name != conv.id and (meta is None or meta.id != conv.id):
            continue  # another conversation whose id starts the same way
        state = read_state(copy)
        if state is not None and state.backend_session is not None:
            found.append(state.backend_session)
    return found


async def _forget(conv: Conv, rt: Runtime, seen: Tracked) -> None:
    """Let every backend drop what it keeps for a conversation that is gone (OpenCode sessions),
    the sessions its archived state.json names included, and every provider its slot files.
    A failure is logged, never raised."""
    seen.forget(conv.id)
    rt.retries.forget(conv.id)
    sessions = _archived_sessions(rt, conv)
    for name in sorted(set(rt.made()) | {s.provider or s.backend for s in sessions}):
        try:
            backend = rt.backend(name)
            named = [s for s in sessions if (s.provider or s.backend) == name]
            for session in named:
                await backend.forget(conv.id, session)
            if not named:
                await backend.forget(conv.id)
        except (ContemplationError, OSError) as exc:
            log.warning("forget_failed", conv=conv.id, backend=name, error=str(exc))
    for name in sorted(rt.made()):  # its slot files (see Provider.forget_files)
        try:
            await rt.provider(name).forget_files(conv.id)
        except (ContemplationError, OSError) as exc:
            log.warning("forget_failed", conv=conv.id, provider=name, error=str(exc))


TURNS_PER_SESSION = 100  # turns decided again under one lock before it is let go


async def _session(conv: Conv, rt: Runtime, seen: Tracked) -> Outcome:
    """Steps under one hold of the conversation's lock, and what they end with. A turn runs
    under the same lock and writer as the step that decided it, and the step after it too
    (nothing is locked or read twice); needs are looked up after the lock is let go, since
    tools can be slow."""
    try:
        with open_writer(
            conv,
            durable=rt.settings.durability == "fsync",
            default_meta=lambda: rt.default_metadata(conv),
            wait=False,
        ) as w:
            own = w.meta  # the conversation's; a panel's seat speaks through it in turn
            # a panel's seats asked ahead: closed with the session (a conversation of one
            # model has no seats to ask ahead, and no table of them)
            held_ahead = Ahead() if own.panel else None
            try:
                for _ in range(TURNS_PER_SESSION):
                    fresh = conv.id not in seen.recovered  # this run's first look: recovery
                    decision = await _step(conv, rt, seen, w, own)
                    if not isinstance(decision, TurnDue):
                        break
                    turn = Turn(conv, rt, seen, w, held_ahead)
                    stop = await inflight.begin(turn, fresh=fresh)
                    if stop is not None:  # a turn runs that died during it: not again
                        return stop
                    try:
                        outcome = await run_turn(turn)
                    finally:
                        w.end_turn()  # however it ended, a stop too (a death leaves it)
                        w.meta = own
                    if isinstance(outcome, Wait) or seen.stopping:
                        return outcome
                else:
                    return AGAIN
            finally:
                if held_ahead is not None:  # what was asked ahead and not taken: nothing kept
                    await held_ahead.close()
                w.flush()  # what the step or the turn committed in memory, before the lock goes
                seen.remember_size(conv)
                rt.retries.note(conv.id, w.state.next_retry_at)  # a retry set: how far off
    except OSError:
        # a write failed (a full disk): what it left is found by recovery, so the next
        # step runs it first, as after a restart (else a claimed message whose commit was
        # lost would be taken again)
        seen.recovered.discard(conv.id)
        raise
    if isinstance(decision, NeedsDue):
        outcome = await answering.answer(conv, rt, seen, decision)
        seen.remember_size(conv)
        return outcome
    return decision


async def process(conv: Conv, rt: Runtime, seen: Tracked) -> float | None:
    """Do what is due in one conversation. Returns when to look again (None: on an event)."""
    for _ in range(MAX_STEPS):
        if seen.stopping:
            return None
        if conv.id not in seen.recovered and not conv.metadata.exists():
            # not yet seen since the start, and not plainly a conversation: gone, or a folder
            # being made (an empty name reservation: nothing is created in it), or by hand
            if not conv.dir.is_dir():
                await _forget(conv, rt, seen)
                return None
            if not _looks_like_a_conversation(conv):
                return None
        try:
            outcome = await _session(conv, rt, seen)
        except LockBusy:
            return rt.clock() + 0.2
        except NotFound:
            if not conv.dir.is_dir():  # archived (by us, the CLI or the MCP server) or deleted
                await _forget(conv, rt, seen)
            return None
        if isinstance(outcome, Wait):
            return outcome.at
    return rt.clock() + 1.0


FAILED_CAP_S = 60.0  # a conversation that keeps failing is tried again at least this often


async def process_safely(conv: Conv, rt: Runtime, seen: Tracked) -> float | None:
    """:func:`process` for the daemon: one broken conversation never stops the others. One
    that keeps failing (a full disk: its message stays claimed or queued) is tried again with
    backoff, from the rescan interval up to ``FAILED_CAP_S``, its error said once (and again
    when it changes); an event (a new message) tries it at once."""
    try:
        wake = await process(conv, rt, seen)
    except asyncio.CancelledError:
        raise
    except (ContemplationError, OSError) as exc:
        return _failed(conv, rt, seen, exc)
    except Exception as exc:
        log.exception("conversation_crashed", conv=conv.id)
        seen.failed(conv.id, _said(conv, exc))  # said above, with its trace
        return rt.clock() + rt.settings.rescan_interval
    if seen.failing.pop(conv.id, None) is not None:
        log.info("conversation_resumed", conv=conv.id)
    return wake


def _failed(conv: Conv, rt: Runtime, seen: Tracked, exc: Exception) -> float:
    """When to try a failed conversation again; its error in one line the first time."""
    n, new = seen.failed(conv.id, _said(conv, exc))
    base = rt.settings.rescan_interval
    delay = min(max(FAILED_CAP_S, base), base * 2.0 ** min(n - 1, 16))
    error = f"{type(exc).__name__}: {exc}"
    if new:
        log.error("conversation_failed", conv=conv.id, error=error, retry_in=round(delay, 2))
    else:
        log.debug("conversation_failed", conv=conv.id, error=error, retry_in=round(delay, 2))
    return rt.clock() + delay


def _said(conv: Conv, exc: Exception) -> str:
    """A failure as a person reads it: an OS error by its name and number (not the temp
    file's name), our own errors by their text, without the conversation's id again."""
    if isinstance(exc, OSError) and exc.errno:
        return f"{os.strerror(exc.errno)} (errno {exc.errno})"
    if isinstance(exc, ContemplationError):
        return str(exc).removeprefix(f"{conv.id}: ")
    return f"{type(exc).__name__}: {exc}"


async def process_pending(
    rt: Runtime,
    *,
    parallel: int = 256,
    settle_wait: float = 0.0,
    seen: Tracked | None = None,
) -> dict[str, float | None]:
    """The burst: handle whatever is waiting in every active conversation, then return.

    ``settle_wait``: a conversation that wants another look within that many seconds (a
    file written in place still settling, a hand append) is waited for and done again, at
    most SETTLE_ROUNDS times, so ``run --once`` right after ``echo … > inbox/q.txt`` answers
    it instead of leaving it for later. Retries further off are left to the next run.
    ``seen``: the burst's memory, given by a caller that reads it after (``failing``: the
    conversations whose last step failed)."""
    seen = Tracked() if seen is None else seen
    results: dict[str, float | None] = {}

    async def worker(queue: collections.deque[Conv]) -> None:
        while queue:
            c = queue.popleft()
            results[c.id] = await process_safely(c, rt, seen)

    async def run_all(convs: list[Conv]) -> None:
        """``parallel`` workers over one queue (not a task per conversation behind a
        semaphore: thousands of waiters make each release cost a scan of them all)."""
        queue = collections.deque(convs)
        await asyncio.gather(*(worker(queue) for _ in range(min(parallel, len(convs)))))

    todo = list_conversations(rt.home)
    for _ in range(SETTLE_ROUNDS):
        await run_all(todo)
        now = rt.clock()
        soon = {
            c.id: at for c in todo if (at := results[c.id]) is not None and at - now <= settle_wait
        }
        if not soon:
            break
        await asyncio.sleep(max(0.0, min(soon.values()) - now))  # a timer, not a poll
        todo = [c for c in todo if c.id in soon]
    return results


def left_undone(rt: Runtime, results: dict[str, float | None], seen: Tracked) -> dict[str, str]:
    """What a burst could not do, by conversation: a step that failed (``seen.failing``: a
    broken metadata.json, a full disk) or a turn left waiting to retry (a server that could
    not be reached). Only the conversations that wanted another look are read again."""
    undone = {conv_id: what for conv_id, (_, what) in seen.failing.items()}
    for conv_id, at in results.items():
        if at is None or conv_id in undone:
            continue
        try:
            state = read_state(rt.home.conv(conv_id))
        except (ContemplationError, OSError):
            continue
        if state is not None and state.status is Status.RETRYING:
            why = state.last_error.message if state.last_error is not None else "the turn failed"
            undone[conv_id] = f"retrying: {why}"
    return undone


__all__ = ["Runtime", "left_undone", "process", "process_pending", "process_safely"]
