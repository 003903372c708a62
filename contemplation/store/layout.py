"""The folder contract: paths, listing and reading (the log as one parse: :mod:`.logview`;
templates: :mod:`.templates`). This module never writes."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contemplation.errors import Ambiguous, InputRejected, NotFound

if TYPE_CHECKING:  # the models (pydantic) load when a folder's JSON is read, not with a path
    from contemplation.models import Metadata, State

CONV_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
IGNORED_SUFFIXES = (".tmp", ".part", "~", ".swp")
# the names of the folder contract, owned here (everyone else spells them through these)
ACTIVE, COMPLETED, TEMPLATES = "active", "completed", "templates"
LOG_NAME, METADATA_NAME, STATE_NAME = "messages.log", "metadata.json", "state.json"
INBOX, CONTEXT, PROCESSING, FAILED = "inbox", "context", "processing", "failed"
ATTACHMENTS = "attachments"  # <conv>/attachments/
LOCK_NAME, CANCEL_NAME = ".lock", ".cancel"
DAEMON_LOCK, DAEMON_INFO = ".daemon.lock", ".daemon.json"
JSON_MAX_BYTES = 16 << 20  # a state.json or metadata.json (any JSON file read here) past it: unread
# bytes asked of one read: Linux gives at most 0x7ffff000 at once, so a read that gives less
# than it was asked for proves the end of a file only when it asked for less than that
MAX_READ = 1 << 30


@dataclass(frozen=True, slots=True)
class Home:
    root: Path

    @property
    def active(self) -> Path:
        return self.root / ACTIVE

    @property
    def completed(self) -> Path:
        return self.root / COMPLETED

    @property
    def templates(self) -> Path:
        return self.root / TEMPLATES

    @property
    def daemon_lock(self) -> Path:
        return self.root / DAEMON_LOCK

    @property
    def daemon_info(self) -> Path:
        return self.root / DAEMON_INFO

    def conv(self, conv_id: str, *, completed: bool = False) -> Conv:
        if not valid_id(conv_id):
            raise NotFound(f"not a conversation id: {conv_id!r}")
        return Conv((self.completed if completed else self.active) / conv_id)


@dataclass(frozen=True, slots=True)
class Conv:
    """A conversation folder and the paths in it (made once: a turn uses them dozens of
    times, and joining pathlib paths costs more than the system calls they name)."""

    dir: Path
    log: Path = field(init=False, compare=False, repr=False)
    metadata: Path = field(init=False, compare=False, repr=False)
    state: Path = field(init=False, compare=False, repr=False)
    inbox: Path = field(init=False, compare=False, repr=False)
    context: Path = field(init=False, compare=False, repr=False)
    processing: Path = field(init=False, compare=False, repr=False)
    failed: Path = field(init=False, compare=False, repr=False)
    lock: Path = field(init=False, compare=False, repr=False)
    cancel_flag: Path = field(init=False, compare=False, repr=False)
    id: str = field(init=False, compare=False, repr=False)  # the folder's name

    def __post_init__(self) -> None:
        d = self.dir
        object.__setattr__(self, "id", d.name)
        for name, leaf in (
            ("log", LOG_NAME), ("metadata", METADATA_NAME), ("state", STATE_NAME),
            ("inbox", INBOX), ("context", CONTEXT), ("processing", PROCESSING),
            ("failed", FAILED), ("lock", LOCK_NAME), ("cancel_flag", CANCEL_NAME),
        ):  # fmt: skip
            object.__setattr__(self, name, d / leaf)

    @property
    def is_completed(self) -> bool:
        return self.dir.parent.name == COMPLETED


def valid_id(name: str) -> bool:
    return bool(CONV_ID_RE.match(name)) and name not in {".", ".."}


ID_RULE = (
    "a conversation folder's name is its id: letters, digits, '.', '_' and '-', starting "
    "with a letter or digit, at most 128 characters"
)


def refused_folders(home: Home) -> list[tuple[str, str]]:
    """Folders in ``active/`` and ``completed/`` the daemon will not take, each with why (a
    name that is no id, a symbolic link): listed by ``doctor`` and ``list --all`` and logged
    once by the daemon, so a folder made by hand is never ignored without a word."""
    out: list[tuple[str, str]] = []
    for d in (home.active, home.completed):
        try:
            with os.scandir(d) as it:
                entries = sorted(it, key=lambda e: e.name)
        except FileNotFoundError:
            continue
        for e in entries:
            if e.name.startswith("."):
                continue
            where = f"{d.name}/{e.name}"
            if e.is_symlink():
                out.append((where, "a symbolic link: folders are never followed"))
            elif e.is_dir(follow_symlinks=False) and not valid_id(e.name):
                out.append((where, f"not a conversation id ({ID_RULE})"))
    return out


def topic_of_id(conv_id: str) -> str:
    """The topic a folder without one is given: the slug of ``conv_<stamp>_<slug>`` in words,
    or the folder's name."""
    return conv_id.split("_", 2)[-1].replace("-", " ") if conv_id.startswith("conv_") else conv_id


def slugify(topic: str, limit: int = 40) -> str:
    text = unicodedata.normalize("NFKD", topic).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:limit].rstrip("-") or "conversation"


def list_conversations(home: Home, *, include_completed: bool = False) -> list[Conv]:
    dirs = [home.active] + ([home.completed] if include_completed else [])
    out: list[Conv] = []
    for d in dirs:
        try:
            with os.scandir(d) as it:
                out.extend(
                    Conv(Path(e.path))
                    for e in it
                    if valid_id(e.name)
                    and not e.name.startswith(".")
                    and e.is_dir(follow_symlinks=False)
                )
        except FileNotFoundError:
            continue
    out.sort(key=lambda c: c.id)
    return out


def find_conversation(home: Home, name: str, *, include_completed: bool = True) -> Conv:
    """A conversation by full id, unique id prefix, or unique topic/slug match."""
    convs = list_conversations(home, include_completed=include_completed)
    exact = [c for c in convs if c.id == name]
    if exact:
        return exact[0]
    prefixed = [c for c in convs if c.id.startswith(name)]
    if len(prefixed) == 1:
        return prefixed[0]
    if not prefixed:
        slug = slugify(name)
        prefixed = [c for c in convs if c.id.split("_", 2)[-1].startswith(slug)]
        if len(prefixed) > 1:  # an exact topic wins over longer ones that start with it
            exact = [c for c in prefixed if _is_topic(c, name, slug)]
            prefixed = exact or prefixed
        if not prefixed:
            prefixed = [c for c in convs if _is_topic(c, name, None)]
        if len(prefixed) == 1:
            return prefixed[0]
    if not prefixed:
        raise NotFound(f"no conversation matches {name!r}")
    names = ", ".join(c.id for c in prefixed[:SHOWN_MATCHES])
    more = f", and {len(prefixed) - SHOWN_MATCHES} more" if len(prefixed) > SHOWN_MATCHES else ""
    raise Ambiguous(f"{name!r} matches {len(prefixed)} conversations: {names}{more}")


SHOWN_MATCHES = 5  # the matches an ambiguous name lists


def locate(home: Home, name: str) -> Conv:
    """The one conversation lookup of every face: an exact id (active first, then completed),
    else a unique id prefix or topic among active and completed conversations.

    An archived conversation is found like any other (reading it is fine); the actions that
    would change it refuse with "archived (in completed/)" (``actions.require_active``)."""
    try:
        if valid_id(name):
            for completed in (False, True):
                conv = home.conv(name, completed=completed)
                if conv.dir.is_dir():
                    return conv
        return find_conversation(home, name)
    except OSError as exc:
        raise NotFound(f"cannot read conversation {name!r}: {exc}") from exc


def _is_topic(conv: Conv, name: str, slug: str | None) -> bool:
    """``name`` is the conversation's topic (its slug, when ``slug`` is given, or its
    metadata's topic, case aside)."""
    if slug is not None and conv.id.split("_", 2)[-1] == slug:
        return True
    meta = read_metadata(conv)
    return meta is not None and meta.topic.casefold() == name.casefold()


_KINDS = {
    stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
}  # fmt: skip
_SAFE_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_regular(path: Path) -> int:
    """A read descriptor on ``path`` if it is a regular file: a symlink is never followed and
    a FIFO never blocks. Anything else raises :class:`InputRejected` saying what it is."""
    return open_regular_stat(path)[0]


def open_regular_stat(path: Path) -> tuple[int, os.stat_result]:
    """:func:`open_regular`, and the file's stat (taken through the descriptor)."""
    try:
        fd = os.open(path, _SAFE_OPEN)
    except OSError as exc:
        if os.path.islink(path):
            raise InputRejected(f"{path.name} is a symbolic link (never followed)") from None
        if exc.errno == errno.ENXIO:  # a socket
            raise InputRejected(f"{path.name} is not a regular file") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise InputRejected(f"{path.name} is {kind}, not a regular file")
    return fd, st


def read_to_end(fd: int, expected: int, offset: int = 0) -> bytes:
    """Read a descriptor from ``offset`` to the end, by position (the descriptor's own offset
    is neither used nor moved): one read when ``expected`` bytes are left (asking one byte
    more proves the end), more when the file grew or is longer than ``MAX_READ``."""
    left = max(expected, 0) + 1
    want = min(left, MAX_READ)
    parts: list[bytes] = []
    while True:
        chunk = os.pread(fd, want, offset)
        parts.append(chunk)
        if len(chunk) < want:
            return parts[0] if len(parts) == 1 else b"".join(parts)
        offset += len(chunk)
        left -= len(chunk)
        want = min(max(left, 1 << 20), MAX_READ)


def read_regular(path: Path, limit: int | None = None, limit_name: str = "the limit") -> bytes:
    """The bytes of a regular file (see :func:`open_regular`), at most ``limit`` of them:
    a larger file raises :class:`InputRejected` before anything is read."""
    fd, st = open_regular_stat(path)
    try:
        if limit is not None and st.st_size > limit:
            raise InputRejected(f"{st.st_size} bytes is larger than {limit_name} ({limit})")
        return read_to_end(fd, st.st_size)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class Seen:
    """A message file as it was read: where the bytes read end, and its modification time
    right after the read. A file that differs from it later was written into since."""

    size: int
    mtime_ns: int


def read_message(path: Path, limit: int, offset: int = 0) -> tuple[str | None, str]:
    """The text of a claimed file (from byte ``offset`` on), or None and why it cannot be a
    message (a link, a FIFO, a folder, too large, empty, binary): never followed, never
    blocking."""
    text, note, _ = read_message_seen(path, limit, offset)
    return text, note


def read_message_seen(
    path: Path, limit: int, offset: int = 0
) -> tuple[str | None, str, Seen | None]:
    """:func:`read_message`, and the file as it was read (None when it was refused)."""
    try:
        fd, st = open_regular_stat(path)
    except InputRejected as exc:
        return None, str(exc), None
    try:
        left = st.st_size - offset
        if left > limit:
            return None, f"{left} bytes is larger than max_message_bytes ({limit})", None
        data = read_to_end(fd, left, offset)
        seen = Seen(offset + len(data), os.fstat(fd).st_mtime_ns)
    finally:
        os.close(fd)
    text, note = _message_text(data)
    return text, note, seen


def not_a_message(data: bytes, what: str = "the file") -> str | None:
    """Why ``data`` cannot be a message's text (empty, binary), else None: the daemon's rule
    for a file it takes, and the faces' before they queue one (one rule, one wording)."""
    if not data.strip():
        return f"{what} is empty"
    if b"\x00" in data:
        return f"{what} holds NUL bytes (binary data is not a message)"
    return None


def _message_text(data: bytes) -> tuple[str | None, str]:
    why = not_a_message(data)
    if why is not None:
        return None, why
    text = data.decode("utf-8", errors="replace")
    note = (
        ""
        if "\ufffd" not in text or b"\xef\xbf\xbd" in data
        else "invalid UTF-8 was replaced by U+FFFD"
    )
    return text, note


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from a regular file; None for a missing, unreadable or odd file."""
    return read_json_why(path)[0]


def read_json_why(path: Path) -> tuple[dict[str, Any] | None, str]:
    """:func:`read_json`, and why it is None: "" for a missing file, else what is wrong with
    it in a few words (JSON nested too deeply to read, a folder, not JSON, past
    ``JSON_MAX_BYTES``: its size is looked at before a byte is read, so a state.json of a
    gigabyte costs nothing but the line that says it)."""
    try:
        fd, st = open_regular_stat(path)
        try:
            raw = b"" if st.st_size > JSON_MAX_BYTES else read_to_end(fd, st.st_size)
        finally:
            os.close(fd)
        if st.st_size > JSON_MAX_BYTES or len(raw) > JSON_MAX_BYTES:
            size = max(st.st_size, len(raw))
            return None, (
                f"{path.name} is {size} bytes, past the bound of {JSON_MAX_BYTES} bytes for "
                "a JSON file of a conversation: not read"
            )
        data = json.loads(raw)
    except FileNotFoundError:
        return None, ""
    except RecursionError:  # nested deeper than the interpreter's stack: not an object of ours
        return None, f"{path.name} is nested too deeply to read"
    except InputRejected as exc:  # a link, a folder, a FIFO
        return None, str(exc)
    except OSError as exc:
        return None, f"{path.name}: {exc.strerror or exc}"
    except ValueError as exc:  # not JSON, not UTF-8, a number with too many digits
        return None, f"{path.name} is not JSON: {str(exc)[:200]}"
    if not isinstance(data, dict):
        return None, f"{path.name} is not a JSON object"
    return data, ""


def read_metadata(conv: Conv) -> Metadata | None:
    from pydantic import ValidationError

    from contemplation.models import Metadata

    data = read_json(conv.metadata)
    if data is None:
        return None
    try:
        return Metadata.model_validate(data)
    except ValidationError:
        return None


def read_state(conv: Conv) -> State | None:
    from pydantic import ValidationError

    from contemplation.models import State

    data = read_json(conv.state)
    if data is None:
        return None
    try:
        return State.model_validate(data)
    except ValidationError:
        return None


@dataclass(frozen=True, slots=True)
class InboxEntry:
    name: str
    path: Path
    size: int
    mtime_ns: int


def ignored_name(name: str) -> bool:
    """Names being written, not messages: dot-files (``.#name`` too), ``*.tmp``, ``*.part``
    and editor temporaries (``name~``, ``*.swp``, Emacs' ``#name#``)."""
    return (
        name.startswith(".")
        or name.endswith(IGNORED_SUFFIXES)
        or (len(name) > 1 and name.startswith("#") and name.endswith("#"))
    )


REST_NAME_KEPT = 50  # characters of the first name a follow-up keeps (a claim keeps 80)
REST_RECORD = ".rest-"  # processing/.rest-<inode>: a follow-up's record (see Rest)


@dataclass(frozen=True, slots=True)
class Rest:
    """The record of a follow-up: what was written into a claimed message's file after the
    daemon took it, put back into ``inbox/`` by the writer (``release_claimed``) to be taken
    as a message of its own, from byte ``offset`` on.

    The record is the one place its bookkeeping lives: ``processing/.rest-<inode>``, a
    dot-name (the inbox rule and :func:`processing_entries` never list it) in a folder only
    the daemon writes, written atomically before the file is put back. The follow-up's name
    (``<first>.rest@<offset>``, see :func:`rest_name`) only tells a person what it is: a
    file of any name without a record that proves it is a whole, ordinary message, never cut
    and never deleted on the strength of a name. See :func:`rest_of` for the
    proof, and ``release_claimed`` for its crash safety."""

    first: str  # the name of the message it is the rest of (the NOTE says it)
    offset: int  # the bytes of the file taken before: read from here on
    name: str  # the name it was put back into inbox/ under
    sha256: str  # of its first ``offset`` bytes, as they were when it was put back


def rest_name(first: str, offset: int) -> str:
    """The inbox name of a follow-up of the message ``first`` whose first ``offset`` bytes
    were taken: for people to read; the daemon reads nothing from it (see :class:`Rest`)."""
    return f"{first[:REST_NAME_KEPT]}.rest@{offset}"


def rest_record(folder: Path, ino: int) -> Path:
    """Where the record of the follow-up with inode ``ino`` lives (``folder``: the
    conversation's ``processing/``)."""
    return folder / f"{REST_RECORD}{ino}"


def head_sha256(fd: int, n: int) -> str | None:
    """The sha256 of the first ``n`` bytes of an open file (None: it holds fewer)."""
    h = hashlib.sha256()
    at = 0
    while at < n:
        chunk = os.pread(fd, min(n - at, 1 << 20), at)
        if not chunk:
            return None
        h.update(chunk)
        at += len(chunk)
    return h.hexdigest()


def rest_of(claimed: Path) -> Rest | None:
    """The record of the claimed file ``claimed`` (in ``processing/``) when it proves the
    file is that follow-up, else None: a whole message. Proven when the record named by the
    file's inode is a record, names the file (its inbox name, after the claim's prefix and
    any prefix a taken name got) and the file's first ``offset`` bytes are still those it
    was put back with. A record left by a crash (its file gone) whose inode a person's new
    file got, or a follow-up renamed or rewritten in place, is not trusted: that file is
    taken whole (the bytes taken before come twice at worst; nothing is ever lost)."""
    try:
        fd, st = open_regular_stat(claimed)
    except (OSError, InputRejected):
        return None
    try:
        data = read_json(rest_record(claimed.parent, st.st_ino))
        if data is None:
            return None
        first, offset = data.get("first"), data.get("offset")
        name, sha = data.get("name"), data.get("sha256")
        if not (
            isinstance(first, str)
            and isinstance(name, str)
            and isinstance(sha, str)
            and type(offset) is int
            and 0 <= offset <= st.st_size
            and name
        ):
            return None
        taken = claimed.name.split("-", 2)[-1]  # the claim's prefix off
        if taken != name and not taken.endswith(f"-{name}"):
            return None
        if head_sha256(fd, offset) != sha:
            return None
        return Rest(first, offset, name, sha)
    finally:
        os.close(fd)


def inbox_entries(conv: Conv) -> list[InboxEntry]:
    """Entries of ``inbox/`` that are messages, oldest first (ties: by name). A link, FIFO or
    folder is listed too: it is claimed like a message and then refused into ``failed/``."""
    out: list[InboxEntry] = []
    try:
        with os.scandir(conv.inbox) as it:
            for e in it:
                if ignored_name(e.name):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                    mtime = (
                        _newest(e.path, st.st_mtime_ns)
                        if e.is_dir(follow_symlinks=False)
                        else st.st_mtime_ns
                    )
                except FileNotFoundError:
                    continue
                out.append(InboxEntry(e.name, Path(e.path), st.st_size, mtime))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out.sort(key=lambda x: (x.mtime_ns, x.name))
    return out


def _newest(folder: str, mtime_ns: int) -> int:
    """A folder message made in place settles when the newest of its files has (a file
    written into it changes its own time, not the folder's)."""
    try:
        with os.scandir(folder) as it:
            for e in it:
                mtime_ns = max(mtime_ns, e.stat(follow_symlinks=False).st_mtime_ns)
    except OSError:  # gone, or unreadable: claimed as it is, and refused if it must be
        pass
    return mtime_ns


def processing_entries(conv: Conv) -> list[Path]:
    try:
        names = sorted(n for n in os.listdir(conv.processing) if not n.startswith("."))
    except FileNotFoundError:
        return []
    return [conv.processing / n for n in names]


def queued_messages(conv: Conv) -> list[Path]:
    """The messages queued for ``conv`` and not yet answered: those waiting in ``inbox/``
    (oldest first) and those claimed into ``processing/`` (the one reader of that count).
    A file being claimed has both names for a moment (linked into ``processing/``, its
    inbox name removed once that is durable): it is counted once, as claimed."""
    claimed = processing_entries(conv)
    taken: set[tuple[int, int]] = set()
    for p in claimed:
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if st.st_nlink > 1:
            taken.add((st.st_dev, st.st_ino))
    waiting = [e.path for e in inbox_entries(conv)]
    if taken:
        waiting = [p for p in waiting if not _same_file(p, taken)]
    return waiting + claimed


def _same_file(path: Path, files: set[tuple[int, int]]) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) in files


def list_folder(conv: Conv) -> list[str]:
    """The names in a conversation's folder ([] once it is gone)."""
    try:
        return os.listdir(conv.dir)
    except FileNotFoundError:
        return []
