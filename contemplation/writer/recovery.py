"""Recovery at a conversation's first step: finish or undo what a crash interrupted.

An agent message needs no journal entry of its own: its file stays in ``processing/`` until
the block is durable and committed, and the block is a pure function of that file, the
labels and the log (:meth:`ConvWriter.block_bytes`). So :func:`recover` finds, past the
committed size, either the whole block of a claimed file (rolled forward), a torn prefix of
it (cut away), or something else (left for adoption as a hand append). Other appends (the
answers to needs) first record an *intent* (offset, length, sha256) in ``state.json``,
rolled forward or back the same way. A streamed reply records an intent (its offset); a
cut-off one is marked ``=== INTERRUPTED ===`` so the turn is redone. A reply begun with no
journaled intent (``ReplyStream.merge_into_commit``: its turn makes one state write) follows
a claimed message's uncommitted block, and is found and marked right after it. A reply
whose commit was recorded (its state's temp file) is finished instead, when the log is
what the record says (:func:`adopt_finished_reply`). Recovery also completes an interrupted
rotation.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pydantic import ValidationError

from contemplation.errors import InputRejected
from contemplation.models import Intent, MarkerKind, ReplyEnd, State, TurnStarted
from contemplation.protocol import logformat
from contemplation.protocol.parser import parse
from contemplation.settings import AttachmentSettings
from contemplation.store.attachments import read_claimed
from contemplation.store.layout import read_json, read_regular
from contemplation.writer.files import write_all
from contemplation.writer.folders import (
    drop_claimed_twins,
    pid_alive,
    remove_stale_deliveries,
    remove_tmp_files,
)
from contemplation.writer.session import ConvWriter, remove_claimed


def recover(
    w: ConvWriter,
    max_message_bytes: int = 16 * 1024 * 1024,
    limits: AttachmentSettings | None = None,
    *,
    cut: str | None = None,
) -> list[str]:
    """Finish or undo what a crash interrupted. Returns what was done (for the log).
    ``limits``: those a folder message (with files) was taken under; ``cut``: what cut the
    reply when it was no restart (a failed write: "writing messages.log failed: …")."""
    done: list[str] = []
    done.extend(adopt_finished_reply(w))
    twins = drop_claimed_twins(w.conv, durable=w.durable)
    done.extend(f"removed {n!r} from inbox/: it was claimed already" for n in twins)
    remove_tmp_files(w.conv, w.folder_names())
    remove_stale_deliveries(w.conv)  # logged nowhere: no sender was told these were delivered
    if w.state.rotation is not None:
        done.append(w.complete_rotation())
    intent = w.state.intent
    if intent is not None:
        what = (
            _recover_message(w, intent)
            if intent.kind == "message"
            else _recover_reply(w, intent, cut)
        )
        done.extend([what] if what else [])
    claimed = w.claimed_files()
    counted = w.state.messages_processed
    done.extend(_recover_claimed(w, claimed, max_message_bytes, limits or AttachmentSettings()))
    if w.state.messages_processed > counted and cut is None:  # a restart, not a failed write
        _count_the_death(w)
    done.extend(_clean_processing(w, claimed))
    if done:
        w.save()
    return done


def adopt_finished_reply(w: ConvWriter) -> list[str]:
    """A reply whose commit was recorded before a crash kept it from being renamed in: its
    commit's temp file (``.state.json.tmp.<pid>.<rand>``, written before the reply's last
    bytes, see ``ReplyStream.finish_steps``) is whole, names the log's inode, counts one
    turn more, and its writer is gone. When the log is what it says (its bytes since the
    reply began hash as recorded, followed by all, some or none of the reply's last bytes,
    which it holds: ``reply_end``), the missing last bytes are appended and it is renamed
    in, so the reply is adopted, never marked INTERRUPTED and asked again (a process killed
    after the server said ``done`` keeps the record in the page cache; after a power cut it
    is there only once it was made durable). A record without ``reply_end`` is taken only
    when the log has its very size. Anything else is left to the rest of recovery (the temp
    file is then removed as stale)."""
    st = w.state
    if st.rotation is not None or (st.intent is not None and st.intent.kind != "reply"):
        return []
    size = w.log_size()
    if size <= st.log.size or (st.intent is not None and size <= st.intent.offset):
        return []
    ino = os.fstat(w.fd).st_ino if w.fd is not None else _ino(w.conv.log)
    prefix = f".{w.conv.state.name}.tmp."
    for name in w.folder_names():
        found = _record(w, name[len(prefix) :], ino) if name.startswith(prefix) else None
        if found is None:
            continue
        end = found.reply_end
        if end is None:  # a record that does not hold the reply's last bytes
            missing = b"" if found.log.size == size else None
        else:
            missing = _missing(w, st, end, found.log.size, size)
        if missing is None:
            continue
        if missing:
            fd = w.append_fd()
            write_all(fd, missing)
            if w.durable:  # the reply whole on disk before the state that counts it
                os.fsync(fd)
        found.reply_end = None
        w.state = found
        w.save()
        if missing:
            return [
                f"finished the reply's commit: its last {len(missing)} bytes, recorded with "
                f"it, appended up to byte {found.log.size}"
            ]
        return [f"adopted the reply whole in the log up to byte {size} (its commit was cut)"]
    return []


def _record(w: ConvWriter, suffix: str, ino: int) -> State | None:
    """The state in temp file ``.state.json.tmp.<suffix>`` if it can be a reply's commit
    record: its writer (``<pid>.<rand>``) gone, whole, no write in progress, the log's
    inode, one turn more than state.json counts."""
    pid = suffix.split(".", 1)[0]
    if not pid.isdigit() or pid_alive(int(pid)):
        return None
    data = read_json(w.conv.dir / f".{w.conv.state.name}.tmp.{suffix}")
    try:
        found = State.model_validate(data) if data is not None else None
    except ValidationError:
        return None
    if (
        found is None
        or found.intent is not None
        or found.rotation is not None
        or found.log.ino != ino
        or found.turns <= w.state.turns
    ):
        return None
    return found


_HASHED = 1 << 20  # bytes of the log read at a time to check a reply's hash


def _missing(w: ConvWriter, st: State, end: ReplyEnd, final: int, size: int) -> bytes | None:
    """What the log lacks of the reply a commit record describes (``end``, the record's
    size ``final``; the log has ``size`` bytes), or None when the log is not that reply: it
    must hold the reply from where it began (after what state.json commits, and where a
    journaled intent says) hashing as recorded, then a prefix of its recorded last bytes."""
    tail = end.tail.encode()
    pre = final - len(tail)
    if not (st.log.size <= end.offset <= pre <= size <= final):
        return None
    if st.intent is not None and st.intent.offset != end.offset:
        return None
    if w.log_bytes(pre, size - pre) != tail[: size - pre]:
        return None
    sha = hashlib.sha256()
    with open(w.conv.log, "rb") as f:
        f.seek(end.offset)
        left = pre - end.offset
        while left > 0:
            chunk = f.read(min(left, _HASHED))
            if not chunk:
                return None
            sha.update(chunk)
            left -= len(chunk)
    if sha.hexdigest() != end.sha256:
        return None
    return tail[size - pre :]


def _ino(path: Path) -> int:
    try:
        return os.stat(path, follow_symlinks=False).st_ino
    except OSError:
        return -1


def _recover_message(w: ConvWriter, intent: Intent) -> str:
    """A whole block is committed (roll forward); a torn one proven ours is cut away."""
    size = w.log_size()
    end = intent.offset + intent.length
    data = b""
    if size >= end:
        data = w.log_bytes(intent.offset, intent.length)
    if size >= end and hashlib.sha256(data).hexdigest() == intent.sha256:
        w.commit_message(intent.id, end)
        return f"committed message {intent.id} found whole in the log"
    what = ""
    if size > intent.offset:
        if size < end and _starts_with_header(w, intent.offset):
            w.rollback(intent.offset)
            what = f"rolled back a torn append of {intent.id}"
        else:
            w.warn(f"bytes at {intent.offset} are not the intended block; kept")
        w.state.log.size = w.log_size()
    w.state.intent = None
    w.save()
    return what


def _count_the_death(w: ConvWriter) -> None:
    """A message found whole in the log, uncommitted, was taken by a run that died before its
    turn's first state write, which carries the record that the turn began (see
    :mod:`contemplation.engine.inflight`): its request may have gone out with that write, and
    what ended the run (a plugin's ``os._exit`` on its first piece) may end the next. That
    run is counted as one that began the turn, so the turn is given up after as many deaths
    as its ERROR says (three runs died under a marker that said two)."""
    st = w.state
    if st.turn_started is None:
        st.turn_started = TurnStarted(
            turns=st.turns, messages=st.messages_processed, run="recovered", starts=1
        )


def _recover_claimed(
    w: ConvWriter, claimed_files: list[Path], max_message_bytes: int, limits: AttachmentSettings
) -> list[str]:
    """Bytes past the committed size that are the block of a claimed message: a whole
    block is committed (its file then goes), a torn prefix is cut away. Anything else is
    left alone, to be adopted as a hand append."""
    done: list[str] = []
    if w.state.intent is not None or w.state.rotation is not None:
        return done
    for claimed in claimed_files:
        start, size = w.state.log.size, w.log_size()
        if size <= start or claimed.name in w.state.done_ids:
            break
        msg = read_claimed(claimed, max_message_bytes, limits)
        if msg.text is None:
            break
        expected, found = _claimed_block(w, msg.text, start, msg.own)
        if found == expected:
            w.commit_message(claimed.name, start + len(expected))
            done.append(f"committed message {claimed.name} found whole in the log")
            reply = _recover_unjournaled_reply(w, start + len(expected))
            if reply:
                done.append(reply)
                break
            continue
        if size - start < len(expected) and _same_but_time(expected, found):
            w.rollback(start)
            done.append(f"rolled back a torn append of {claimed.name}")
        break
    return done


def _claimed_block(
    w: ConvWriter, text: str, start: int, own: tuple[int, ...]
) -> tuple[bytes, bytes]:
    """The block a claimed message would have been appended as at ``start`` (with the
    header time found there), and the bytes the log holds in its place."""
    sender, recipient = w.meta.agent_label, w.meta.sender_label()
    shape = w.block_bytes(sender, recipient, text, start, ts=_TIME_SHAPE, own=own)
    found = w.log_bytes(start, len(shape))
    at = shape.index(b"[") + 1
    ts = found[at : at + len(_TIME_SHAPE)]
    if len(ts) == len(_TIME_SHAPE) and ts.isascii():
        shape = w.block_bytes(sender, recipient, text, start, ts=ts.decode(), own=own)
    return shape, found


def _recover_unjournaled_reply(w: ConvWriter, offset: int) -> str:
    """The bytes right after a claimed message's block that recovery has just committed:
    if they are (the start of) this conversation's reply block, they are a reply that
    was begun without a journaled intent (``ReplyStream.merge_into_commit``) and never
    committed: marked INTERRUPTED like any reply a crash cut, so the turn is redone; a
    header torn before its line ended is cut away. Anything else is left alone, for
    adoption as a hand append."""
    raw = w.log_bytes(offset, 256)
    found = raw.lstrip(b"\n")
    head = logformat.header_start(w.meta.sender_label(), w.meta.agent_label).encode()
    if not raw or len(raw) - len(found) > 2 or not head.startswith(found[: len(head)]):
        return ""
    if b"\n" not in found:  # the separator, or a header cut before its line's end
        w.rollback(offset)
        w.save()
        return f"rolled back the torn start of a reply at byte {offset}"
    return _recover_reply(w, Intent(kind="reply", id=f"unjournaled-{offset}", offset=offset))


def _recover_reply(w: ConvWriter, intent: Intent, cut: str | None = None) -> str:
    """A streamed reply that was cut off is marked INTERRUPTED, so the turn is redone; its
    line names what cut it (``cut``: a failed write), else a restart."""
    w.state.intent = None
    size = w.log_size()
    if size <= intent.offset:
        w.save()
        return ""
    w.state.log.size = size
    why = f"reply cut off: {cut}" if cut else "reply cut off by a restart"
    w.append_marker(MarkerKind.INTERRUPTED, f"{why}; it will be redone")
    return f"marked the interrupted reply at byte {intent.offset}"


def _clean_processing(w: ConvWriter, claimed_files: list[Path]) -> list[str]:
    """Inputs already in the log are removed; the rest stay queued in processing/."""
    recent: set[str] = set()
    if w.rebuilt:
        result = parse(
            w.conv.log.read_bytes() if w.conv.log.exists() else b"",
            agent_label=w.meta.agent_label,
        )
        recent = {b.text.strip() for b in result.blocks[-100:] if b.kind.value == "agent"}
    done: list[str] = []
    for p in list(claimed_files):
        if p.name in w.state.done_ids:
            remove_claimed(p)
            done.append(f"removed {p.name} (already in the log)")
        elif w.rebuilt and _read_text(p).strip() in recent:
            remove_claimed(p)
            done.append(f"removed {p.name} (its text is already in the log)")
        else:
            continue
        w.took(p)
    return done


def _starts_with_header(w: ConvWriter, offset: int) -> bool:
    return w.log_bytes(offset, 200).lstrip(b"\n").startswith(logformat.FRAME_OPEN.encode())


_TIME_SHAPE = logformat.timestamp()  # every header time has this length


def _same_but_time(expected: bytes, found: bytes) -> bool:
    """``found`` is a prefix of ``expected`` apart from the header's time."""
    at = expected.index(b"[") + 1
    span = slice(at, at + len(_TIME_SHAPE))
    a, b = bytearray(expected[: len(found)]), bytearray(found)
    a[span], b[span] = b"", b""
    return a == b


def _read_text(p: Path) -> str:
    if p.is_dir() and not p.is_symlink():  # a folder message: its block's text
        return read_claimed(p, 16 * 1024 * 1024, AttachmentSettings()).text or ""
    try:
        return read_regular(p).decode("utf-8", errors="replace")
    except (OSError, InputRejected):
        return ""
