"""Conversation folders: create, drop into the inbox, claim, reject, archive, flag."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contemplation.base.privacy import DIR_MODE, FILE_MODE
from contemplation.base.testing import ENABLED, crashpoint
from contemplation.errors import InputRejected, NotFound
from contemplation.store.layout import (
    REST_RECORD,
    Conv,
    Home,
    Rest,
    Seen,
    head_sha256,
    ignored_name,
    list_folder,
    open_regular_stat,
    read_json,
    read_metadata,
    read_state,
    rest_name,
    rest_of,
    rest_record,
    slugify,
)
from contemplation.store.openfiles import being_written
from contemplation.store.templates import Template
from contemplation.writer.durable import Durable, Steps, run_now
from contemplation.writer.files import (
    atomic_write_bytes,
    atomic_write_json,
    fsync_dir,
    now_iso,
    staging_name,
    write_all,
)
from contemplation.writer.templates import seed_templates

if TYPE_CHECKING:  # the models (pydantic) load when a folder is made, not with the writer
    from contemplation.models import Metadata


# --------------------------------------------------------------------------- creation


def ensure_home(home: Home) -> None:
    """The home's folders. A templates/ folder made here gets the shipped templates (to
    read and edit); one that exists is never touched. Each is the owner's alone (see
    :mod:`contemplation.base.privacy`); an existing folder's mode is left as it is."""
    made = [d for d in (home.root, home.active, home.completed) if not d.is_dir()]
    home.root.mkdir(DIR_MODE, parents=True, exist_ok=True)
    for d in (home.active, home.completed):
        d.mkdir(DIR_MODE, exist_ok=True)
    for d in {p.parent for p in made}:  # made here: durable before anything is put in them
        fsync_dir(d)  # (the first conversation of a home answered, then a power cut: gone)
    try:
        home.templates.mkdir(DIR_MODE)
    except FileExistsError:
        return
    seed_templates(home)


def new_conversation(
    home: Home,
    topic: str,
    *,
    template: Template,
    model: str,
    backend: str,
    extra: dict[str, Any] | None = None,
    durable: bool = True,
    name: str | None = None,
    first: Callable[[Conv], object] | None = None,
) -> Conv:
    """A new conversation. ``name``: the empty folder :func:`reserve_conversation` made for
    it (else one is reserved here); ``first``: puts its first message into its ``inbox/``
    before it appears, so it appears with that message or not at all."""
    if not topic.strip():
        raise InputRejected("a conversation needs a topic")
    name = name or reserve_conversation(home, topic)
    target = home.active / name
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
    own = template.requirements_for(topic.strip())
    if own:  # the template's context requirements first, then the caller's
        fields["context_requirements"] = [*own, *fields.get("context_requirements", [])]
    fields["id"] = name
    # the files are built under a dot-name (never listed, never watched), then renamed over
    # the empty reservation: the daemon never sees a half-made conversation
    staging = home.active / f".new-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        staging.mkdir(DIR_MODE)
        from contemplation.models import Metadata

        ensure_conversation_files(Conv(staging), Metadata.model_validate(fields), durable=durable)
        if first is not None:
            first(Conv(staging))
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            target.rmdir()
        raise
    if durable:
        fsync_dir(home.active)
    return Conv(target)


def reserve_conversation(home: Home, topic: str) -> str:
    """A free conversation name for ``topic``, reserved by an empty folder (mkdir is atomic;
    an empty folder is never adopted as a conversation)."""
    ensure_home(home)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = f"conv_{stamp}_{slugify(topic)}"
    for n in range(1000):
        name = base if n == 0 else f"{base}-{n + 1}"
        try:
            (home.active / name).mkdir(DIR_MODE)
        except FileExistsError:
            continue
        return name
    raise InputRejected(f"too many conversations named {base}")


def ensure_conversation_files(conv: Conv, meta: Metadata, *, durable: bool = True) -> None:
    """Create what a conversation folder is missing: inbox/, processing/, the lock file,
    metadata, an empty log, context/ and state.

    Everything a turn needs exists from the start, so no turn pays for making a file or a
    folder (on some file systems that costs more than the rest of the turn)."""
    for d in (conv.inbox, conv.processing, conv.context):
        d.mkdir(DIR_MODE, parents=True, exist_ok=True)
    os.close(os.open(conv.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, FILE_MODE))
    if read_metadata(conv) is None:
        atomic_write_json(conv.metadata, meta.model_dump(mode="json"), durable=durable)
    _make_log(conv)
    if read_state(conv) is None and not conv.state.exists():
        from contemplation.models import LogIdentity, State

        st = State(updated=now_iso())
        info = os.stat(conv.log)
        st.log = LogIdentity(ino=info.st_ino, size=0)
        atomic_write_json(conv.state, st.model_dump(mode="json"), durable=durable)


def adopt_folder(conv: Conv, *, has_inbox: bool = False) -> None:
    """What a folder made by hand (an ``inbox/`` or a ``messages.log``, no metadata) needs
    before its first turn: ``processing/`` and the log. Its metadata and state are the
    defaults and what the log says; the writer's first save writes them (see
    :meth:`~contemplation.writer.session.ConvWriter.save_steps`), and its context/ is made
    when something is saved there."""
    for d in (conv.processing,) if has_inbox else (conv.processing, conv.inbox):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, DIR_MODE)
    _make_log(conv)


def _make_log(conv: Conv) -> None:
    """An empty ``messages.log`` unless there is one (never through a link, never waiting on
    a FIFO)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(conv.log, flags, FILE_MODE)
    except OSError:
        if os.path.lexists(conv.log):
            return  # a link, a FIFO, a folder: the writer refuses it with a clear error
        raise
    os.close(fd)


def write_metadata(conv: Conv, meta: Metadata, *, durable: bool = True) -> None:
    atomic_write_json(conv.metadata, meta.model_dump(mode="json"), durable=durable)


def write_context_file(conv: Conv, name: str, data: bytes, *, durable: bool = True) -> Path:
    """Save one assembled-context file into ``<conv>/context/`` (made if missing), atomically."""
    if not name or "/" in name or "\x00" in name or name.startswith("."):
        raise InputRejected(f"not a usable context file name: {name!r}")
    conv.context.mkdir(DIR_MODE, parents=True, exist_ok=True)
    atomic_write_bytes(conv.context / name, data, durable=durable)
    return conv.context / name


def drop_message(conv: Conv, text: str, *, name: str | None = None) -> Path:
    """Maildir delivery into ``inbox/``: write a dot-file, fsync, rename into place, fsync
    ``inbox/`` (an answered send survives a power cut). A write that fails (a full disk)
    leaves no dot-file behind."""
    conv.inbox.mkdir(DIR_MODE, parents=True, exist_ok=True)
    final = name or f"{time.time_ns()}-{secrets.token_hex(4)}.msg"
    if ignored_name(final) or "/" in final or final in {".", ".."}:
        raise InputRejected(f"not a usable inbox file name: {final!r}")
    tmp = conv.inbox / staging_name(final)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        try:
            write_all(fd, text.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, conv.inbox / final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    crashpoint("deliver")
    fsync_dir(conv.inbox)  # the rename survives a power cut once the sender is told
    return conv.inbox / final


def claim(conv: Conv, inbox_file: Path, *, durable: bool = True) -> Path | None:
    """Take an inbox file into ``processing/``; None if someone else won (a withdraw). The
    caller holds the conversation's lock (one claimer at a time).

    A file is linked into ``processing/``, that folder fsynced, and only then unlinked from
    ``inbox/``: at every moment it has a durable name, whatever another process makes durable
    meanwhile (a ``send``'s fsync of ``inbox/`` while a rename into ``processing/`` was not
    yet durable lost the message at a power cut: a file system need not keep a rename's two
    folders together). A crash between leaves both names, one file: recovery removes the
    inbox name (:func:`drop_claimed_twins`). A folder message cannot be linked: it is renamed,
    then ``processing/`` fsynced. The daemon does the link alone first (:func:`claim_link`)
    and the rest with the message's first state write (:func:`finish_claims`), so that the
    fsync is not between the message and its request."""
    claimed = _claimed_path(conv, inbox_file)
    try:
        linked = _link_or_rename(inbox_file, claimed)
    except FileNotFoundError:
        if conv.processing.is_dir() or not os.path.lexists(inbox_file):
            return None  # someone else took it
        # a folder from before processing/ came with it
        conv.processing.mkdir(DIR_MODE, exist_ok=True)
        return claim(conv, inbox_file, durable=durable)
    if linked:
        run_now(finish_claims(conv, [(inbox_file, claimed)], durable=durable))
        return claimed
    if durable:
        fsync_dir(conv.processing)
    if ENABLED:
        crashpoint("claim")
    return claimed


def claim_link(conv: Conv, inbox_file: Path) -> Path | None:
    """The first half of a claim (see :func:`claim`), for a writer that finishes it with
    its next durable write (:func:`finish_claims`): a second name for the file in
    ``processing/``, nothing fsynced, its inbox name kept. Once linked the claim has won:
    a withdraw that renames the inbox name away after it finds the file in ``processing/``
    and leaves it there. None: not linked (someone else took it, a folder, a file system
    without hard links, no ``processing/`` yet): :func:`claim` it, which says which."""
    if os.path.isdir(inbox_file) and not os.path.islink(inbox_file):
        return None
    claimed = _claimed_path(conv, inbox_file)
    try:
        os.link(inbox_file, claimed, follow_symlinks=False)
    except OSError:
        return None
    return claimed


def finish_claims(
    conv: Conv, linked: list[tuple[Path, Path]], *, durable: bool = True
) -> Steps[None]:
    """The second half of the claims ``linked`` ((inbox name, processing/ name) pairs, see
    :func:`claim_link`), as steps: ``processing/`` made durable with their new names, then
    their inbox names removed (made durable by the commit that counts their blocks, which
    fsyncs ``inbox/`` before their ``processing/`` names go). An inbox name gone already
    was renamed away by a withdraw that found the claim first: the claim stands (and a file
    of that name that is not the claimed one is another message, left alone)."""
    if durable:
        yield Durable(folders=(conv.processing,))
    for inbox_file, claimed in linked:
        if ENABLED:
            crashpoint("claim_linked")
        with contextlib.suppress(FileNotFoundError):
            st, mine = os.lstat(inbox_file), os.lstat(claimed)
            if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
                os.unlink(inbox_file)
        if ENABLED:
            crashpoint("claim")


def _claimed_path(conv: Conv, inbox_file: Path) -> Path:
    """The name a claim gives ``inbox_file`` in ``processing/`` (in the order of claims)."""
    name = _claim_name(inbox_file.name)
    return conv.processing / f"{time.time_ns():020d}-{secrets.token_hex(3)}-{name}"


def _link_or_rename(src: Path, dst: Path) -> bool:
    """A second name ``dst`` for ``src`` (True), or ``src`` moved there when it cannot have
    one (a folder; a file system without hard links: False)."""
    if not os.path.isdir(src) or os.path.islink(src):
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in {errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP}:
                raise  # FileNotFoundError among them: someone else took it
        else:
            return True
    os.rename(src, dst)
    return False


def drop_claimed_twins(conv: Conv, *, durable: bool = True) -> list[str]:
    """The inbox names of files that are also in ``processing/`` (a claim a crash cut between
    its link and its unlink): removed, so the message is taken once, once ``processing/`` is
    durable (a kill may have come before the claim's fsync). Returns their names."""
    claimed: dict[tuple[int, int], list[str]] = {}
    for e in _entries(conv.processing):
        with contextlib.suppress(FileNotFoundError):
            st = e.stat(follow_symlinks=False)
            if st.st_nlink > 1:
                claimed.setdefault((st.st_dev, st.st_ino), []).append(e.name)
    if not claimed:
        return []
    twins: list[os.DirEntry[str]] = []
    for e in _entries(conv.inbox):
        with contextlib.suppress(FileNotFoundError):
            st = e.stat(follow_symlinks=False)
            names = claimed.get((st.st_dev, st.st_ino), [])
            if any(n.endswith("-" + _claim_name(e.name)) for n in names):  # that very claim
                twins.append(e)
    if twins and durable:
        fsync_dir(conv.processing)
    for e in twins:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(e.path)
    return [e.name for e in twins]


def _claim_name(name: str) -> str:
    """The end of the name a claim gives to inbox file ``name`` in ``processing/``."""
    # a name that is not UTF-8 (bytes as surrogates) could not be written into state.json:
    # its claim is named with those bytes escaped (\xff), so any name is claimed once
    return os.fsencode(name).decode("utf-8", "backslashreplace")[:80]


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _claim_of(conv: Conv, st: os.stat_result, name: str) -> bool:
    """Inbox file ``name`` (``st``: its stat) has a second name in ``processing/`` that a
    claim gave it (see :func:`claim_link`): the same file, named after it."""
    if not stat.S_ISREG(st.st_mode):
        return False
    end = "-" + _claim_name(name)
    for e in _entries(conv.processing):
        with contextlib.suppress(FileNotFoundError):
            got = e.stat(follow_symlinks=False)
            if (got.st_dev, got.st_ino) == (st.st_dev, st.st_ino) and e.name.endswith(end):
                return True
    return False


def withdraw(conv: Conv, name: str, *, durable: bool = True) -> bool:
    """Take message ``name`` back out of ``inbox/`` before a daemon claims it: renamed to a
    dot-name (which no daemon claims) in one step, then removed. Either this or the daemon's
    claim wins, never both: a claim that has linked the file into ``processing/`` has won
    (it goes on to its request before its inbox name is removed, see :func:`claim_link`).
    False when it is no longer there (claimed, or withdrawn already)."""
    if ignored_name(name) or "/" in name or name in {".", ".."}:
        return False
    gone = conv.inbox / f".{name}.{secrets.token_hex(3)}.withdrawn"
    try:
        os.rename(conv.inbox / name, gone)
    except (FileNotFoundError, NotADirectoryError):
        return False
    st = os.lstat(gone)
    claimed = st.st_nlink > 1 and _claim_of(conv, st, name)
    if claimed and durable:  # linked into processing/ first: the claim won
        fsync_dir(conv.processing)  # its name there durable before this one goes
    if not claimed:
        crashpoint("withdraw")
    if gone.is_dir() and not gone.is_symlink():
        shutil.rmtree(gone, ignore_errors=True)
    else:
        gone.unlink(missing_ok=True)
    # a claim's link that had found the name before the rename may land after the look
    # above, never once the file has no name left (link() refuses a file of no links)
    claimed = claimed or _claim_of(conv, st, name)
    if durable:
        if claimed:
            fsync_dir(conv.processing)
        fsync_dir(conv.inbox)
    return not claimed


def unclaim(conv: Conv, claimed: Path) -> Path:
    """Put a claimed file back into ``inbox/``, under the name it came with (or one still
    free): a process opened it for writing between the look and the claim, so it is taken
    once it has been closed."""
    dest = _free_name(conv.inbox, claimed.name.split("-", 2)[-1])
    os.rename(claimed, dest)
    return dest


def release_claimed(conv: Conv, claimed: Path, seen: Seen, *, durable: bool) -> Path | None:
    """A claimed message file whose block is committed goes, unless it is not as it was read
    (``seen``) or a process still holds it open for writing: then what it holds past the
    bytes taken goes back into ``inbox/`` as a follow-up, a message of its own once its
    writer is done, read from where this one ended. A file cut shorter, or rewritten in
    place, is queued whole. Returns the follow-up's path (None: removed).

    The follow-up's bookkeeping is its record (:class:`~contemplation.store.layout.Rest`,
    ``processing/.rest-<inode>``), never its name: the name (:func:`~contemplation.store.
    layout.rest_name`) is only for people, and a person's file of that shape is a whole
    message. The steps, and what a crash between them leaves:

    1. the record is written atomically (temp file, fsync, rename, fsync of processing/),
       replacing the one a follow-up's own follow-up had. A crash before or after it leaves
       the claimed file in ``processing/`` with its block committed: recovery removes it as
       it removes any committed message (what it gained is lost then, as before: recovery's
       rule, see ``writer.recovery``); a record left without its file is never trusted (it
       names a file by inode, name and the hash of its first bytes, see ``rest_of``) and
       :func:`sweep_rests` removes it;
    2. the file is renamed into ``inbox/`` and inbox/ fsynced: from here it is a follow-up,
       and its record says from which byte it is read (by the take, by a turn that finds it
       grew, and by recovery, which finds its block again). It is released in turn by this
       function: a file taken whole is removed first and its record after
       (:func:`forget_rest`), so a crash between the two never leaves a follow-up without
       its record (which would take the bytes taken before twice)."""
    try:
        st = os.lstat(claimed)
    except FileNotFoundError:
        return None
    grown = st.st_size > seen.size
    rewritten = st.st_size < seen.size or (not grown and st.st_mtime_ns != seen.mtime_ns)
    if not stat.S_ISREG(st.st_mode) or not (grown or rewritten or being_written(claimed)):
        claimed.unlink(missing_ok=True)
        forget_rest(claimed.parent, st.st_ino)  # a follow-up's record goes with its file
        return None
    before = rest_of(claimed)  # a follow-up's follow-up: the rest of the same first message
    first = before.first if before else claimed.name.split("-", 2)[-1]  # the claim's prefix off
    offset = 0 if rewritten else seen.size
    fd, held = open_regular_stat(claimed)
    try:
        sha = head_sha256(fd, offset)
        if sha is None:  # cut shorter since the look: queued whole
            offset, sha = 0, head_sha256(fd, 0) or ""
    finally:
        os.close(fd)
    dest = _free_name(conv.inbox, rest_name(first, offset))
    record = dataclasses.asdict(Rest(first, offset, dest.name, sha))
    atomic_write_json(rest_record(claimed.parent, held.st_ino), record, durable=durable)
    os.rename(claimed, dest)
    if durable:
        fsync_dir(conv.inbox)
    sweep_rests(conv)
    return dest


def forget_rest(processing: Path, ino: int) -> None:
    """The record of the follow-up with inode ``ino``, whose file has just been removed."""
    with contextlib.suppress(OSError):
        rest_record(processing, ino).unlink()


def remove_empty_rest(claimed: Path) -> None:
    """A claimed follow-up its writer added nothing to (its record proves it holds only
    bytes taken before): removed, then its record (see :func:`release_claimed`)."""
    try:
        ino = os.lstat(claimed).st_ino
    except FileNotFoundError:
        return
    claimed.unlink(missing_ok=True)
    forget_rest(claimed.parent, ino)


def sweep_rests(conv: Conv) -> None:
    """Remove the follow-ups' records whose file is no longer queued (in ``inbox/`` or
    ``processing/``): left by a crash (see :func:`release_claimed`), or by a follow-up
    refused into ``failed/``; and a record's temp file whose writer is gone. Run under the
    conversation's lock (only its holder writes records), after recovery and each release.
    A stale record is harmless (``rest_of`` never trusts it for another file): this only
    keeps ``processing/`` clean."""
    try:
        names = os.listdir(conv.processing)
    except (FileNotFoundError, NotADirectoryError):
        return
    records = [n for n in names if n.startswith(REST_RECORD)]
    temps = [n for n in names if n.startswith(f".{REST_RECORD}") and ".tmp." in n]
    for name in temps:  # .<record>.tmp.<pid>.<rand>
        try:
            pid = int(name.rsplit(".", 2)[-2])
        except (ValueError, IndexError):
            pid = 0
        if not pid or not pid_alive(pid):
            with contextlib.suppress(OSError):
                os.unlink(conv.processing / name)
    if not records:
        return
    queued: set[int] = set()
    for folder in (conv.inbox, conv.processing):
        try:
            with os.scandir(folder) as it:
                for e in it:
                    if not e.name.startswith("."):
                        with contextlib.suppress(OSError):
                            queued.add(e.stat(follow_symlinks=False).st_ino)
        except OSError:
            continue
    for name in records:
        ino = name[len(REST_RECORD) :]
        if not (ino.isdigit() and int(ino) in queued):
            with contextlib.suppress(OSError):
                os.unlink(conv.processing / name)


def _free_name(folder: Path, name: str) -> Path:
    """``folder/name``, or when that name is taken, one with a random part in front."""
    dest = folder / name
    for _ in range(8):
        if not os.path.lexists(dest):
            return dest
        dest = folder / f"{secrets.token_hex(3)}-{name}"
    raise FileExistsError(errno.EEXIST, "no free name", str(dest))


def reject_input(conv: Conv, path: Path, reason: str) -> Path:
    """Move an unusable input to ``failed/`` under its own name, with a reason file (input
    is never deleted)."""
    conv.failed.mkdir(DIR_MODE, exist_ok=True)
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
    home.completed.mkdir(DIR_MODE, parents=True, exist_ok=True)
    dest = home.completed / conv.id
    if dest.exists():
        dest = home.completed / f"{conv.id}-{secrets.token_hex(3)}"
    crashpoint("archive")
    os.rename(conv.dir, dest)
    fsync_dir(home.completed)  # the new name first: a cut between leaves two, never none
    fsync_dir(home.active)  # (without it, a cut after archive answered: in both folders)
    return Conv(dest)


def unarchive(home: Home, conv: Conv) -> Conv:
    """Move an archived conversation back into ``active/`` (one atomic rename), so it can be
    continued; refused when an active conversation already has its id."""
    if not conv.is_completed:
        return conv
    if not conv.dir.is_dir():
        raise NotFound(f"no conversation {conv.id}")
    home.active.mkdir(DIR_MODE, parents=True, exist_ok=True)
    dest = home.active / conv.id
    if os.path.lexists(dest):
        raise InputRejected(f"an active conversation {conv.id} exists already; nothing was moved")
    crashpoint("unarchive")
    os.rename(conv.dir, dest)
    fsync_dir(home.active)
    fsync_dir(home.completed)
    return Conv(dest)


def remove_tmp_files(
    conv: Conv, names: list[str] | None = None, *, older_than: float = 3600.0
) -> None:
    """Delete temp files left by a crashed writer (``.<name>.tmp.<pid>.<rand>``). ``names``:
    the folder's listing, if the caller has taken it.

    A temp file is only stale when its writer is gone (or it is very old): another process
    (the CLI, the MCP server) may be writing one right now.
    """
    for name in _stale(conv.dir, list_folder(conv) if names is None else names, older_than):
        with contextlib.suppress(OSError):
            (conv.dir / name).unlink()


def remove_stale_deliveries(conv: Conv, *, older_than: float = 3600.0) -> list[str]:
    """Remove what senders began in ``inbox/`` and never renamed into place (a dot-file or
    dot-folder named by :func:`~contemplation.writer.files.staging_name`, or an older
    ``.<name>.tmp`` one) once their writer is gone (or it is very old). Nothing is lost:
    a sender is told its message is delivered only after the rename. Returns the names
    removed."""
    try:
        names = os.listdir(conv.inbox)
    except FileNotFoundError:
        return []
    gone: list[str] = []
    for name in _stale(conv.inbox, names, older_than, bare=True):
        path = conv.inbox / name
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            gone.append(name)
    return gone


def _stale(folder: Path, names: list[str], older_than: float, *, bare: bool = False) -> list[str]:
    """The temp names in ``names`` (``.<name>.tmp.<pid>.<rand>``; ``bare``: ``.<name>.tmp``
    too) whose writing process is gone, or that were last written ``older_than`` s ago."""
    now = time.time()
    out: list[str] = []
    for name in names:
        if not name.startswith("."):
            continue
        if ".tmp." in name[1:]:  # .<name>.tmp.<pid>.<rand>
            try:
                pid = int(name.rsplit(".", 2)[-2])
            except (ValueError, IndexError):
                pid = 0
        elif bare and name.endswith(".tmp") and len(name) > len(".tmp") + 1:
            pid = 0
        else:
            continue
        with contextlib.suppress(OSError):
            old = now - (folder / name).lstat().st_mtime > older_than
            if (pid and not pid_alive(pid)) or old:
                out.append(name)
    return out


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (this process counts as gone: what it left before a
    restart cannot be in flight)."""
    if pid == os.getpid():
        return False  # our own leftovers from before a restart cannot be in flight
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def request_cancel(conv: Conv) -> None:
    """Ask the daemon to stop the conversation's in-flight generation (``.cancel`` flag file)."""
    atomic_write_bytes(conv.cancel_flag, now_iso().encode(), durable=False)


def clear_cancel(conv: Conv) -> None:
    with contextlib.suppress(FileNotFoundError):
        conv.cancel_flag.unlink()


def idempotent_create(
    home: Home, key: str, ttl: float, create: Callable[[str], Conv], topic: str
) -> tuple[Conv, bool]:
    """``create(name)`` once per ``key`` within ``ttl`` seconds; a repeat gets the same
    conversation.

    The key → id map is ``<home>/.idempotency.json`` (atomic writes, under an flock, so two
    MCP servers on one home agree). The name is reserved and the key written (durably)
    before the conversation is made, and the conversation appears whole with its first
    message (see :func:`new_conversation`): a repeat after a crash anywhere gets the one
    conversation, made then if the crash came before it was. Returns it and whether it is
    new."""
    ensure_home(home)
    path = home.root / ".idempotency.json"
    fd = os.open(home.root / ".idempotency.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
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
                    if conv.metadata.exists():
                        return conv, False
            reserved = home.active / hit["id"]
            if reserved.is_dir() and not any(reserved.iterdir()):  # a crash came between
                return create(hit["id"]), True
        name = reserve_conversation(home, topic)
        keys[key] = {"id": name, "expires": now + ttl}
        try:
            atomic_write_json(path, {"keys": keys})
            return create(name), True
        except BaseException:
            with contextlib.suppress(OSError):
                (home.active / name).rmdir()
            raise
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- deletion

TRASH = ".pruning-"  # an archived conversation on its way out: no face lists a dot-name


def delete_archived(home: Home, conv_ids: list[str]) -> list[str]:
    """Delete archived conversations (``prune``): each out of sight at once (a dot-name
    within ``completed/``), those renames made durable by one fsync of ``completed/``, then
    each removed and the removals made durable. Returns the ids deleted (one reopened or
    removed meanwhile is not). A power cut never brings back a conversation ``prune`` said it
    deleted, nor half of one (its files removed, its rename undone)."""
    gone: list[tuple[str, Path]] = []
    for conv_id in conv_ids:
        trash = home.completed / f"{TRASH}{conv_id}.{os.getpid()}"
        try:
            os.rename(home.completed / conv_id, trash)  # out of sight: never seen half gone
        except FileNotFoundError:
            continue  # reopened or removed meanwhile
        gone.append((conv_id, trash))
    if not gone:
        return []
    crashpoint("prune")
    fsync_dir(home.completed)  # the renames before any file goes (a cut: whole, or gone)
    for _, trash in gone:
        shutil.rmtree(trash, ignore_errors=True)
        crashpoint("pruned")
    fsync_dir(home.completed)  # (a cut after prune answered: the trash is not back either)
    return [conv_id for conv_id, _ in gone]


def finish_deletions(home: Home) -> None:
    """Folders a crashed prune took out of sight but did not delete."""
    try:
        names = [n for n in os.listdir(home.completed) if n.startswith(TRASH)]
    except FileNotFoundError:
        return
    for name in names:
        shutil.rmtree(home.completed / name, ignore_errors=True)


def probe_writable(home: Home) -> None:
    """Write and remove a small file at the home's root (``doctor``): OSError if it cannot."""
    probe = home.root / f".doctor.{os.getpid()}"
    try:
        probe.write_text("ok")
    finally:
        probe.unlink(missing_ok=True)  # made even when the disk had no room for "ok"
