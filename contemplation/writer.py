"""The only code that writes under the home.

Every change to a conversation's ``messages.log`` and ``state.json`` happens while holding
``flock(<conv>/.lock)`` (an advisory lock on a separate file, so it survives log rotation).
People who append by hand take the same lock:
``flock <conv>/.lock -c 'cat msg >> <conv>/messages.log'``.

Crash safety:

* ``state.json`` / ``metadata.json``: temp file in the same folder, fsync, ``os.replace``,
  fsync of the folder. A reader sees the old or the new file, never half of one.
* inbox files are claimed by ``rename`` into ``processing/`` under a unique id.
* an append first records an *intent* (offset, length, sha256) in ``state.json``; recovery
  rolls a complete append forward, rolls a torn one back (only bytes proven ours), and marks a
  cut-off streamed reply ``=== INTERRUPTED ===`` so the turn is redone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contemplation import logformat
from contemplation.errors import AlreadyRunning, InputRejected, LockBusy, NotFound
from contemplation.layout import (
    Conv,
    Home,
    LogView,
    Template,
    ignored_name,
    log_segments,
    processing_entries,
    read_json,
    read_metadata,
    read_state,
    slugify,
)
from contemplation.models import (
    ErrorInfo,
    Intent,
    LogIdentity,
    MarkerKind,
    Metadata,
    Rotation,
    State,
    Status,
    Usage,
)
from contemplation.parser import find_needs, parse
from contemplation.testing import armed, crashpoint

DONE_IDS_KEPT = 64  # only a crash between commit and unlink needs them (see recover)
_FSYNC = {"fsync": True, "none": False}


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        _write_all(fd, data)
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    crashpoint("state_tmp")
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_json(path: Path, data: Any, *, durable: bool = True) -> None:
    atomic_write_bytes(
        path, (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode(), durable=durable
    )


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


# --------------------------------------------------------------------------- locks


class DaemonLock:
    """One daemon per home: an exclusive ``flock`` held for the daemon's lifetime."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self._fd: int | None = None

    def acquire(self) -> None:
        self.home.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.home.daemon_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = read_json(self.home.daemon_info) or {}
            os.close(fd)
            who = f" (pid {info['pid']})" if "pid" in info else ""
            raise AlreadyRunning(
                f"another contemplation daemon is already running on {self.home.root}{who}; "
                "stop it first or use a different --home"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.home.daemon_info)
            os.close(self._fd)
            self._fd = None


def daemon_alive(home: Home) -> bool:
    """True when some process holds the daemon lock of ``home``."""
    try:
        fd = os.open(home.daemon_lock, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def conv_lock(conv: Conv, *, blocking: bool = True) -> Iterator[bool]:
    """Hold ``flock(<conv>/.lock)``. Yields False (lock not taken) only when non-blocking."""
    fd = os.open(conv.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing the descriptor releases the lock


# --------------------------------------------------------------------------- creation


def ensure_home(home: Home) -> None:
    for d in (home.active, home.completed, home.templates):
        d.mkdir(parents=True, exist_ok=True)


def new_conversation(
    home: Home,
    topic: str,
    *,
    template: Template,
    model: str,
    backend: str,
    extra: dict[str, Any] | None = None,
    durable: bool = True,
) -> Conv:
    ensure_home(home)
    if not topic.strip():
        raise InputRejected("a conversation needs a topic")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = f"conv_{stamp}_{slugify(topic)}"
    # The name is reserved with mkdir (atomic; an empty folder is never adopted as a
    # conversation), the files are built under a dot-name (never listed, never watched), then
    # renamed over the empty reservation: the daemon never sees a half-made conversation.
    for n in range(1000):
        name = base if n == 0 else f"{base}-{n + 1}"
        target = home.active / name
        try:
            target.mkdir()
        except FileExistsError:
            continue
        fields: dict[str, Any] = {
            "id": name,
            "topic": topic.strip(),
            "created": now_iso(),
            "template": template.name,
            "backend": backend,
            "model": model,
            "options": dict(template.options),
            "think": template.think,
            "archive_on_complete": (
                True if template.archive_on_complete is None else template.archive_on_complete
            ),
        }
        fields.update(extra or {})  # caller's values (e.g. think, labels) win
        fields["id"] = name
        staging = home.active / f".new-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            staging.mkdir()
            ensure_conversation_files(
                Conv(staging), Metadata.model_validate(fields), durable=durable
            )
            os.rename(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            with contextlib.suppress(OSError):
                target.rmdir()
            raise
        if durable:
            fsync_dir(home.active)
        return Conv(target)
    raise InputRejected(f"too many conversations named {base}")


def ensure_conversation_files(conv: Conv, meta: Metadata, *, durable: bool = True) -> None:
    """Create what a conversation folder is missing (folders, metadata, state, empty log)."""
    for d in (conv.inbox, conv.context):
        d.mkdir(parents=True, exist_ok=True)
    if read_metadata(conv) is None:
        atomic_write_json(conv.metadata, meta.model_dump(mode="json"), durable=durable)
    if not conv.log.exists():
        fd = os.open(conv.log, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        os.close(fd)
    if read_state(conv) is None and not conv.state.exists():
        st = State(updated=now_iso())
        info = os.stat(conv.log)
        st.log = LogIdentity(ino=info.st_ino, size=0)
        atomic_write_json(conv.state, st.model_dump(mode="json"), durable=durable)


def write_metadata(conv: Conv, meta: Metadata, *, durable: bool = True) -> None:
    atomic_write_json(conv.metadata, meta.model_dump(mode="json"), durable=durable)


def write_context_file(conv: Conv, name: str, data: bytes, *, durable: bool = True) -> Path:
    """Save one assembled-context file into ``<conv>/context/`` (made if missing), atomically."""
    if not name or "/" in name or "\x00" in name or name.startswith("."):
        raise InputRejected(f"not a usable context file name: {name!r}")
    conv.context.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(conv.context / name, data, durable=durable)
    return conv.context / name


def drop_message(conv: Conv, text: str, *, name: str | None = None) -> Path:
    """Maildir delivery into ``inbox/``: write a dot-file, fsync, rename into place."""
    conv.inbox.mkdir(parents=True, exist_ok=True)
    final = name or f"{time.time_ns()}-{secrets.token_hex(4)}.msg"
    if ignored_name(final) or "/" in final or final in {".", ".."}:
        raise InputRejected(f"not a usable inbox file name: {final!r}")
    tmp = conv.inbox / f".{final}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        _write_all(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, conv.inbox / final)
    return conv.inbox / final


def claim(conv: Conv, inbox_file: Path) -> Path | None:
    """Take an inbox file by renaming it into ``processing/``; None if someone else won."""
    conv.processing.mkdir(exist_ok=True)
    claimed = (
        conv.processing / f"{time.time_ns():020d}-{secrets.token_hex(3)}-{inbox_file.name[:80]}"
    )
    try:
        os.rename(inbox_file, claimed)
    except FileNotFoundError:
        return None
    crashpoint("claim")
    return claimed


def reject_input(conv: Conv, path: Path, reason: str) -> Path:
    """Move an unusable input to ``failed/`` with a reason file (input is never deleted)."""
    conv.failed.mkdir(exist_ok=True)
    dest = conv.failed / path.name
    os.replace(path, dest)
    atomic_write_json(
        dest.with_name(dest.name + ".reason.json"), {"reason": reason, "time": now_iso()}
    )
    return dest


def archive(home: Home, conv: Conv) -> Conv:
    """Move the folder whole into ``completed/`` (one atomic rename)."""
    if conv.is_completed:
        return conv
    if not conv.dir.is_dir():
        raise NotFound(f"no conversation {conv.id}")
    home.completed.mkdir(parents=True, exist_ok=True)
    dest = home.completed / conv.id
    if dest.exists():
        dest = home.completed / f"{conv.id}-{secrets.token_hex(3)}"
    crashpoint("archive")
    os.rename(conv.dir, dest)
    fsync_dir(home.completed)
    return Conv(dest)


def remove_tmp_files(conv: Conv, *, older_than: float = 3600.0) -> None:
    """Delete temp files left by a crashed writer (``.<name>.tmp.<pid>.<rand>``).

    A temp file is only stale when its writer is gone (or it is very old): another process
    (the CLI, the MCP server) may be writing one right now.
    """
    now = time.time()
    for p in conv.dir.glob(".*.tmp.*"):
        try:
            pid = int(p.name.rsplit(".", 2)[-2])
        except (ValueError, IndexError):
            pid = 0
        with contextlib.suppress(OSError):
            if (pid and not _pid_alive(pid)) or now - p.stat().st_mtime > older_than:
                p.unlink()


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own leftovers from before a restart cannot be in flight
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --------------------------------------------------------------------------- the session


@dataclass
class ConvWriter:
    """Writes to one conversation while its lock is held (see :func:`open_writer`)."""

    conv: Conv
    meta: Metadata
    state: State
    durable: bool = True
    rebuilt: bool = False  # state.json was lost and derived from the log
    warnings: list[str] = field(default_factory=list)

    # -- state ------------------------------------------------------------------------

    def save(self, *, durable: bool = True) -> None:
        """Write state.json atomically; ``durable=False`` skips fsync for informational changes
        (a status) that are rebuilt from the log after a power loss anyway."""
        self.state.updated = now_iso()
        atomic_write_bytes(
            self.conv.state,
            self.state.model_dump_json(indent=2).encode() + b"\n",
            durable=self.durable and durable,
        )

    def set_status(self, status: Status, *, save: bool = True) -> None:
        self.state.status = status
        if save:
            self.save()

    def record_error(self, kind: str, message: str, *, status: Status = Status.ERROR) -> None:
        self.state.last_error = ErrorInfo(kind=kind, message=message, time=now_iso())
        self.state.status = status
        self.save()

    def warn(self, text: str) -> None:
        self.warnings.append(text)
        self.state.warnings = ([*self.state.warnings, text])[-20:]

    # -- the log ------------------------------------------------------------------------

    def log_size(self) -> int:
        try:
            st = os.stat(self.conv.log, follow_symlinks=False)
        except FileNotFoundError:
            return 0
        return st.st_size

    def check_identity(self) -> int:
        """Compare the log with what state.json accounted for; return the foreign byte count.

        A replaced file (new inode: an editor saved it) or a shrunk one (truncated by hand) is
        re-baselined with a warning: offsets recorded before that point are not trusted.
        """
        try:
            st = os.stat(self.conv.log, follow_symlinks=False)
        except FileNotFoundError:
            fd = os.open(self.conv.log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            os.close(fd)
            st = os.stat(self.conv.log)
            if self.state.log.size:
                self.warn("messages.log was deleted; started a new one")
            self.state.log = LogIdentity(ino=st.st_ino, size=0)
            self.save()
            return 0
        if not stat.S_ISREG(st.st_mode):
            raise InputRejected(
                f"{self.conv.log} is not a regular file (a symlink?); refusing to write through it"
            )
        ident = self.state.log
        if ident.ino and st.st_ino != ident.ino:
            self.warn("messages.log was replaced (new inode); re-read it whole")
            self.state.log = LogIdentity(ino=st.st_ino, size=st.st_size)
            self.save()
            return 0
        if st.st_size < ident.size:
            self.warn(
                f"messages.log shrank from {ident.size} to {st.st_size} bytes; re-read it whole"
            )
            self.state.log = LogIdentity(ino=st.st_ino, size=st.st_size)
            self.save()
            return 0
        if not ident.ino:
            self.state.log.ino = st.st_ino
        return st.st_size - ident.size

    def adopt_foreign(self) -> int:
        """Account for bytes someone appended by hand (they stay in the log as written)."""
        size = self.log_size()
        n = size - self.state.log.size
        if n > 0:
            self.state.log.size = size
            self.save()
        return n

    def _append_raw(self, data: bytes, *, sync: bool) -> None:
        fd = os.open(
            self.conv.log,
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
            0o644,
        )
        try:
            _write_all(fd, data)
            if sync and self.durable:
                os.fsync(fd)
        finally:
            os.close(fd)

    def _rollback(self, offset: int) -> None:
        """Cut the log back to ``offset`` (never through a symlink)."""
        with contextlib.suppress(OSError):
            fd = os.open(self.conv.log, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.ftruncate(fd, offset)
            finally:
                os.close(fd)

    def append_block(self, sender: str, recipient: str, text: str, *, msg_id: str) -> int:
        """Append one whole block exactly once (intent → write → commit). Returns its offset."""
        if msg_id in self.state.done_ids:
            return -1
        data = (logformat.header(sender, recipient) + logformat.body(text)).encode("utf-8")
        offset = self.log_size()
        data = self._separator(offset) + data
        self.state.intent = Intent(
            kind="message",
            id=msg_id,
            offset=offset,
            length=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
        )
        self.save()
        crashpoint("intent")
        try:
            if armed("append"):
                self._append_raw(data[: len(data) // 2], sync=False)
                crashpoint("append")
                self._append_raw(data[len(data) // 2 :], sync=True)
            else:
                self._append_raw(data, sync=True)
        except OSError:
            self._rollback(offset)
            self.state.intent = None
            with contextlib.suppress(OSError):
                self.save()
            raise
        crashpoint("appended")
        self._commit_message(msg_id, offset + len(data))
        return offset

    def _separator(self, offset: int) -> bytes:
        """A blank line before a new header (as in the documented format)."""
        if offset == 0:
            return b""
        return b"\n" if self._ends_with_newline(offset) else b"\n\n"

    def _ends_with_newline(self, size: int) -> bool:
        with open(self.conv.log, "rb") as f:
            f.seek(size - 1)
            return f.read(1) == b"\n"

    def _commit_message(self, msg_id: str, end: int) -> None:
        self.state.intent = None
        self.state.log.size = end
        self.state.done_ids = [*self.state.done_ids, msg_id][-DONE_IDS_KEPT:]
        self.state.messages_processed += 1
        self.state.retry_count = 0  # a new message from the agent resets any backoff
        self.state.next_retry_at = None
        # No fsync needed here: the intent and the block are already durable, so after a power
        # loss recovery finds the intent, the bytes and their hash, and commits again.
        self.save(durable=False)
        crashpoint("commit")

    def append_marker(self, kind: MarkerKind, text: str = "") -> None:
        offset = self.log_size()
        data = logformat.marker(kind, text).encode("utf-8")
        if offset and not self._ends_with_newline(offset):
            data = b"\n" + data
        self._append_raw(data, sync=True)
        self.state.log.size = offset + len(data)
        self.save()

    def reply(self, sender: str, recipient: str, reply_id: str) -> ReplyStream:
        return ReplyStream(self, sender, recipient, reply_id)

    # -- rotation -----------------------------------------------------------------------

    def maybe_rotate(self, limit: int) -> bool:
        """Rotate ``messages.log`` once it is ``limit`` bytes or more. Call it between blocks:
        it does nothing while a write is in flight or foreign bytes are not yet adopted."""
        size = self.log_size()
        if size < limit or self.state.intent is not None or size != self.state.log.size:
            return False
        self.rotate()
        return True

    def rotate(self) -> None:
        """``messages.N.log`` → ``N+1`` (highest first), ``messages.log`` → ``messages.1.log``,
        then a new ``messages.log``. Renames only, so ``tail -F`` follows it. Journaled in
        state.json first; :meth:`recover` completes a rotation a crash interrupted."""
        segs = [p.name for p in log_segments(self.conv)[:-1]]
        top = max((int(n.split(".")[1]) for n in segs), default=0)
        self.state.rotation = Rotation(segments=top, ino=os.stat(self.conv.log).st_ino)
        self.save()
        crashpoint("rotate")
        self._complete_rotation()

    def _complete_rotation(self) -> str:
        rot = self.state.rotation
        if rot is None:
            return ""
        d = self.conv.dir
        for n in range(rot.segments, 0, -1):
            src, dst = d / f"messages.{n}.log", d / f"messages.{n + 1}.log"
            if src.exists() and not dst.exists():
                os.rename(src, dst)
        first = d / "messages.1.log"
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.conv.log).st_ino == rot.ino and not first.exists():
                os.rename(self.conv.log, first)
                crashpoint("rotate_renamed")
        try:
            fd = os.open(self.conv.log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            pass
        else:
            try:
                note = "earlier blocks are in messages.1.log, messages.2.log, … (higher is older)"
                _write_all(fd, logformat.marker(MarkerKind.CONTINUED, note).encode())
                if self.durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
        if self.durable:
            fsync_dir(d)
        st = os.stat(self.conv.log)
        self.state.log = LogIdentity(ino=st.st_ino, size=st.st_size)
        self.state.rotation = None
        self.save()
        return f"rotated messages.log into messages.1.log ({rot.segments + 1} segments)"

    # -- recovery -----------------------------------------------------------------------

    def recover(self) -> list[str]:
        """Finish or undo what a crash interrupted. Returns what was done (for the log)."""
        done: list[str] = []
        remove_tmp_files(self.conv)
        if self.state.rotation is not None:
            done.append(self._complete_rotation())
        intent = self.state.intent
        size = self.log_size()
        if intent is not None:
            if intent.kind == "message":
                end = intent.offset + intent.length
                data = b""
                if size >= end:
                    with open(self.conv.log, "rb") as f:
                        f.seek(intent.offset)
                        data = f.read(intent.length)
                if size >= end and hashlib.sha256(data).hexdigest() == intent.sha256:
                    self._commit_message(intent.id, end)
                    done.append(f"committed message {intent.id} found whole in the log")
                elif intent.offset < size < end or size >= end:
                    if size < end and self._starts_with_header(intent.offset):
                        self._rollback(intent.offset)
                        done.append(f"rolled back a torn append of {intent.id}")
                    else:
                        self.warn(f"bytes at {intent.offset} are not the intended block; kept")
                    self.state.intent = None
                    self.state.log.size = self.log_size()
                    self.save()
                else:
                    self.state.intent = None
                    self.save()
            else:  # a streamed reply was cut off
                self.state.intent = None
                if size > intent.offset:
                    self.state.log.size = size
                    self.append_marker(
                        MarkerKind.INTERRUPTED, "reply cut off by a restart; it will be redone"
                    )
                    done.append(f"marked the interrupted reply at byte {intent.offset}")
                else:
                    self.save()
        # inputs already in the log are cleaned; the rest stay queued in processing/
        recent: set[str] = set()
        if self.rebuilt:
            result = parse(
                self.conv.log.read_bytes() if self.conv.log.exists() else b"",
                agent_label=self.meta.agent_label,
            )
            recent = {b.text.strip() for b in result.blocks[-100:] if b.kind.value == "agent"}
        for p in processing_entries(self.conv):
            if p.name in self.state.done_ids:
                p.unlink(missing_ok=True)
                done.append(f"removed {p.name} (already in the log)")
            elif self.rebuilt and _read_text(p).strip() in recent:
                p.unlink(missing_ok=True)
                done.append(f"removed {p.name} (its text is already in the log)")
        if done:
            self.save()
        return done

    def _starts_with_header(self, offset: int) -> bool:
        with open(self.conv.log, "rb") as f:
            f.seek(offset)
            head = f.read(200).lstrip(b"\n")
        return head.startswith(b"=== ")


def _read_text(p: Path) -> str:
    try:
        return p.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ""


class ReplyStream:
    """A model reply streamed into the log as it arrives.

    The header is written with the first text, so a call that fails before any output leaves
    no empty block. Text is stuffed line by line (see :mod:`contemplation.logformat`), thinking
    goes into a ``=== THINKING === … === END THINKING ===`` section.
    """

    def __init__(self, w: ConvWriter, sender: str, recipient: str, reply_id: str) -> None:
        self.w = w
        self.sender = sender
        self.recipient = recipient
        self.reply_id = reply_id
        self.started = False
        self.bytes_written = 0
        self._stuffer = logformat.StreamStuffer()
        self._think_stuffer = logformat.StreamStuffer()
        self._in_thinking = False
        self._last_char = "\n"
        self.content_parts: list[str] = []

    def _start(self) -> None:
        offset = self.w.log_size()
        prefix = self.w._separator(offset).decode()
        self.w.state.intent = Intent(kind="reply", id=self.reply_id, offset=offset)
        self.w.save()
        self.started = True
        self._write(prefix + logformat.header(self.sender, self.recipient))
        crashpoint("reply_header")

    def _write(self, text: str) -> None:
        if not text:
            return
        data = text.encode("utf-8")
        self.w._append_raw(data, sync=False)
        self.bytes_written += len(data)
        self._last_char = text[-1]

    def _ensure_newline(self) -> None:
        if self._last_char != "\n":
            self._write("\n")

    def thinking(self, text: str) -> None:
        if not text:
            return
        if not self.started:
            self._start()
        if not self._in_thinking:
            self._ensure_newline()
            self._write(logformat.marker(MarkerKind.THINKING))
            self._in_thinking = True
        self._write(self._think_stuffer.feed(text))

    def _end_thinking(self) -> None:
        if self._in_thinking:
            self._write(self._think_stuffer.flush())
            self._ensure_newline()
            self._write(logformat.marker(MarkerKind.END_THINKING))
            self._in_thinking = False

    def content(self, text: str) -> None:
        if not text:
            return
        if not self.started:
            self._start()
        self._end_thinking()
        self.content_parts.append(text)
        self._write(self._stuffer.feed(text))
        crashpoint("reply_stream")

    def note(self, text: str) -> None:
        """A NOTE line about how this reply is being made (e.g. a fallback backend)."""
        if self.started:
            self._ensure_newline()
            self._write(logformat.marker(MarkerKind.NOTE, text))
        else:
            self.w.append_marker(MarkerKind.NOTE, text)

    @property
    def saw_complete(self) -> bool:
        return self._stuffer.saw_complete

    def finish(
        self, *, markers: list[tuple[MarkerKind, str]] | None = None, usage: Usage | None = None
    ) -> int:
        """Close the block (and any markers), fsync, and commit. Returns bytes written."""
        if not self.started:
            self._start()
        self._end_thinking()
        self._write(self._stuffer.flush())
        self._ensure_newline()
        for kind, text in markers or []:
            self._write(logformat.marker(kind, text))
        if self.saw_complete:
            self._write(logformat.marker(MarkerKind.COMPLETE))
        crashpoint("reply_done")
        if self.w.durable:
            fd = os.open(self.w.conv.log, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self.w.state.intent = None
        self.w.state.log.size = self.w.log_size()
        self.w.state.turns += 1
        self.w.state.last_turn = usage
        self.w.state.retry_count = 0
        self.w.state.next_retry_at = None
        if not self.saw_complete and not find_needs("".join(self.content_parts)):
            self.w.state.status = Status.IDLE  # what the next step would decide; saves a write
        self.w.save()
        return self.bytes_written

    def abort(self, kind: MarkerKind, reason: str) -> None:
        """End a reply that did not finish: mark it so it is never taken for a whole answer."""
        if self.started:
            self._end_thinking()
            self._write(self._stuffer.flush())
            self._ensure_newline()
            self._write(logformat.marker(kind, reason))
            self.w.state.intent = None
            self.w.state.log.size = self.w.log_size()
            self.w.save()


@contextlib.contextmanager
def open_writer(
    conv: Conv, *, durable: bool = True, default_meta: Metadata | None = None, wait: bool = True
) -> Iterator[ConvWriter]:
    """Lock the conversation, load (or rebuild) its state, and yield a writer.

    With ``wait=False`` a lock held by someone else raises :class:`LockBusy` at once.
    """
    if not conv.dir.is_dir():
        raise NotFound(f"no conversation folder {conv.dir}")
    with conv_lock(conv, blocking=wait) as got:
        if not got:
            raise LockBusy(f"{conv.id} is locked by another writer")
        meta = read_metadata(conv)
        if meta is None:
            dropped_in = conv.inbox.is_dir() or conv.log.exists()
            if default_meta is None or not dropped_in:
                raise NotFound(f"{conv.id} has no readable metadata.json")
            meta = default_meta
            ensure_conversation_files(conv, meta, durable=durable)
        state = read_state(conv)
        rebuilt = state is None
        if state is None:
            state = rebuild_state(conv, meta)
        w = ConvWriter(conv, meta, state, durable=durable, rebuilt=rebuilt)
        if rebuilt:
            w.warn("state.json was missing or unreadable; rebuilt it from messages.log")
        yield w


def rebuild_state(conv: Conv, meta: Metadata) -> State:
    """A state derived from the log alone (when state.json is lost or corrupt)."""
    try:
        data = conv.log.read_bytes()
        ino = os.stat(conv.log).st_ino
    except FileNotFoundError:
        data, ino = b"", 0
    result = LogView(conv, meta.agent_label).refresh()  # rotated segments included
    st = State(updated=now_iso())
    st.log = LogIdentity(ino=ino, size=len(data))
    st.turns = sum(1 for b in result.blocks if b.kind.value == "model" and not b.interrupted)
    st.messages_processed = sum(1 for b in result.blocks if b.kind.value == "agent")
    st.parse_errors = list(result.errors)[:20]
    return st


def copy_template(src: Path, dest: Path) -> None:
    if not dest.exists():
        shutil.copytree(src, dest)


def is_enospc(exc: OSError) -> bool:
    return exc.errno in {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}


def request_cancel(conv: Conv) -> None:
    """Ask the daemon to stop the conversation's in-flight generation (``.cancel`` flag file)."""
    atomic_write_bytes(conv.dir / ".cancel", now_iso().encode(), durable=False)


def clear_cancel(conv: Conv) -> None:
    with contextlib.suppress(FileNotFoundError):
        (conv.dir / ".cancel").unlink()


def idempotent_create(
    home: Home, key: str, ttl: float, create: Callable[[], Conv]
) -> tuple[Conv, bool]:
    """``create()`` once per ``key`` within ``ttl`` seconds; a repeat gets the same conversation.

    The key → id map is ``<home>/.idempotency.json`` (atomic writes, under an flock, so two
    MCP servers on one home agree). Returns the conversation and whether it is new.
    """
    ensure_home(home)
    path = home.root / ".idempotency.json"
    fd = os.open(home.root / ".idempotency.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        now = time.time()
        raw = (read_json(path) or {}).get("keys")
        keys = {
            k: v
            for k, v in (raw if isinstance(raw, dict) else {}).items()
            if isinstance(v, dict) and float(v.get("expires", 0)) > now
        }
        hit = keys.get(key)
        if hit and isinstance(hit.get("id"), str):
            for completed in (False, True):
                with contextlib.suppress(NotFound):
                    conv = home.conv(hit["id"], completed=completed)
                    if conv.dir.is_dir():
                        return conv, False
        conv = create()
        keys[key] = {"id": conv.id, "expires": now + ttl}
        atomic_write_json(path, {"keys": keys})
        return conv, True
    finally:
        os.close(fd)
