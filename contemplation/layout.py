"""The folder contract: paths, listing and reading. This module never writes."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import stat
import tomllib
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from contemplation.aio import on_thread
from contemplation.errors import Ambiguous, ConfigError, InputRejected, NotFound
from contemplation.models import Block, MarkerKind, Metadata, ParseResult, State
from contemplation.parser import merge, parse

CONV_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
IGNORED_SUFFIXES = (".tmp", ".part", "~", ".swp")
LOG_NAME = "messages.log"


@dataclass(frozen=True, slots=True)
class Home:
    root: Path

    @property
    def active(self) -> Path:
        return self.root / "active"

    @property
    def completed(self) -> Path:
        return self.root / "completed"

    @property
    def templates(self) -> Path:
        return self.root / "templates"

    @property
    def daemon_lock(self) -> Path:
        return self.root / ".daemon.lock"

    @property
    def daemon_info(self) -> Path:
        return self.root / ".daemon.json"

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
            ("log", LOG_NAME), ("metadata", "metadata.json"), ("state", "state.json"),
            ("inbox", "inbox"), ("context", "context"), ("processing", "processing"),
            ("failed", "failed"), ("lock", ".lock"), ("cancel_flag", ".cancel"),
        ):  # fmt: skip
            object.__setattr__(self, name, d / leaf)

    @property
    def is_completed(self) -> bool:
        return self.dir.parent.name == "completed"


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
        if not prefixed:
            for c in convs:
                meta = read_metadata(c)
                if meta is not None and meta.topic.casefold() == name.casefold():
                    prefixed.append(c)
        if len(prefixed) == 1:
            return prefixed[0]
    if not prefixed:
        raise NotFound(f"no conversation matches {name!r}")
    names = ", ".join(c.id for c in prefixed[:5])
    raise Ambiguous(f"{name!r} matches {len(prefixed)} conversations: {names}")


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
    more proves the end), more when the file grew."""
    want = max(expected, 0) + 1
    parts: list[bytes] = []
    while True:
        chunk = os.pread(fd, want, offset)
        parts.append(chunk)
        if len(chunk) < want:
            return parts[0] if len(parts) == 1 else b"".join(parts)
        offset += len(chunk)
        want = 1 << 20


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


def read_message(path: Path, limit: int) -> tuple[str | None, str]:
    """The text of a claimed file, or None and why it cannot be a message (a link, a FIFO, a
    folder, too large, empty, binary): never followed, never blocking."""
    try:
        data = read_regular(path, limit, "max_message_bytes")
    except InputRejected as exc:
        return None, str(exc)
    if not data.strip():
        return None, "the file is empty"
    if b"\x00" in data:
        return None, "the file holds NUL bytes (binary data is not a message)"
    text = data.decode("utf-8", errors="replace")
    note = (
        ""
        if "\ufffd" not in text or b"\xef\xbf\xbd" in data
        else "invalid UTF-8 was replaced by U+FFFD"
    )
    return text, note


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from a regular file; None for a missing, unreadable or odd file."""
    try:
        data = json.loads(read_regular(path))
    except (OSError, ValueError, InputRejected):
        return None
    return data if isinstance(data, dict) else None


def read_metadata(conv: Conv) -> Metadata | None:
    data = read_json(conv.metadata)
    if data is None:
        return None
    try:
        return Metadata.model_validate(data)
    except ValidationError:
        return None


def read_state(conv: Conv) -> State | None:
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
                except FileNotFoundError:
                    continue
                out.append(InboxEntry(e.name, Path(e.path), st.st_size, st.st_mtime_ns))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out.sort(key=lambda x: (x.mtime_ns, x.name))
    return out


def processing_entries(conv: Conv) -> list[Path]:
    try:
        names = sorted(n for n in os.listdir(conv.processing) if not n.startswith("."))
    except FileNotFoundError:
        return []
    return [conv.processing / n for n in names]


def list_folder(conv: Conv) -> list[str]:
    """The names in a conversation's folder ([] once it is gone)."""
    try:
        return os.listdir(conv.dir)
    except FileNotFoundError:
        return []


_SEGMENT_RE = re.compile(r"messages\.(\d+)\.log")
LONG_PARSE = 256 * 1024  # bytes of log parsed at once (~2 ms) above which it is done off the loop


def log_segments(conv: Conv, names: Callable[[], list[str]] | None = None) -> list[Path]:
    """Rotated segments oldest first, then the live log (``messages.N.log``: higher is older).
    ``names``: the folder's listing, when the caller (the lock holder) has taken it."""
    segs: list[tuple[int, Path]] = []
    try:
        for name in names() if names is not None else os.listdir(conv.dir):
            m = _SEGMENT_RE.fullmatch(name)
            if m:
                segs.append((int(m.group(1)), conv.dir / name))
    except FileNotFoundError:
        return []
    segs.sort(key=lambda t: -t[0])
    return [p for _, p in segs] + [conv.log]


def read_log_bytes(conv: Conv) -> bytes:
    try:
        return read_regular(conv.log)
    except (FileNotFoundError, InputRejected):
        return b""


_CONTINUED = f"=== {MarkerKind.CONTINUED.value}".encode()


def parse_segment(data: bytes, *, agent_label: str = "CLAUDE") -> ParseResult:
    """Parse one file of the log. The ``=== CONTINUED ... ===`` line a rotation writes at the
    top of a new ``messages.log`` is a system line, not text before the first header."""
    skip = 0
    if data.startswith(_CONTINUED):
        nl = data.find(b"\n")
        skip = len(data) if nl < 0 else nl + 1
    result = parse(data[skip:], agent_label=agent_label, base=skip)
    return dataclasses.replace(result, size=result.size + skip) if skip else result


def _inodes(segments: list[Path]) -> tuple[tuple[str, int], ...]:
    out: list[tuple[str, int]] = []
    for p in segments:
        try:
            out.append((p.name, os.stat(p, follow_symlinks=False).st_ino))
        except FileNotFoundError:
            continue
    return tuple(out)


def segment_inodes(conv: Conv) -> tuple[tuple[str, int], ...]:
    """(name, inode) of every rotated segment: changes whenever a rotation happens."""
    return _inodes(log_segments(conv)[:-1])


def _read_segments(segments: list[Path], agent_label: str) -> tuple[Block, ...]:
    blocks: list[Block] = []
    for seg in segments:
        try:
            data = read_regular(seg)
        except (FileNotFoundError, InputRejected):
            continue
        blocks.extend(parse_segment(data, agent_label=agent_label).blocks)
    return tuple(blocks)


@dataclass
class LogView:
    """An incrementally refreshed parse of one whole conversation.

    ``live`` is the parse of ``messages.log`` (offsets in that file), ``history`` the blocks of
    the rotated ``messages.N.log`` segments (read again only when the live file is a new one,
    i.e. after a rotation), ``result`` both together: what the model's history is built from.

    ``locked``: the caller holds the conversation's lock, so no rotation can run while the
    files are read (one listing of the folder instead of one before and one after).
    """

    conv: Conv
    agent_label: str = "CLAUDE"
    result: ParseResult = field(default_factory=lambda: ParseResult(blocks=(), size=0))
    ino: int = 0
    live: ParseResult = field(default_factory=lambda: ParseResult(blocks=(), size=0))
    history: tuple[Block, ...] = ()
    locked: bool = False

    def refresh(
        self,
        known: os.stat_result | None = None,
        names: Callable[[], list[str]] | None = None,
        fd: int | None = None,
    ) -> ParseResult:
        """The parse as the log is now. ``known``: the log's stat (by name, links not
        followed) the caller has just taken, under the lock; ``names``: the folder's listing,
        if a whole read needs it (see :func:`log_segments`); ``fd``: the lock holder's open
        descriptor on the log, checked to be the file by that name (see
        :meth:`ConvWriter.check_identity`): it is read through, with no open of its own."""
        names = names if self.locked else None  # a listing is a snapshot only under the lock
        if fd is not None:
            return self._refresh_from(fd, known or os.fstat(fd), names)
        st = known or self._stat(None)
        if st is None:
            self._load_all(names)
            return self._combine()
        if self._holds(st) and stat.S_ISREG(st.st_mode):
            return self.result  # nothing new: one stat, no open
        try:
            fd, st = open_regular_stat(self.conv.log)
        except FileNotFoundError:
            self._load_all(names)
            return self._combine()
        try:
            return self._refresh_from(fd, st, names)
        finally:
            os.close(fd)

    async def refreshed(
        self,
        known: os.stat_result | None = None,
        names: Callable[[], list[str]] | None = None,
        fd: int | None = None,
    ) -> ParseResult:
        """:meth:`refresh` for the event loop: a long stretch to parse (see
        :meth:`long_refresh`) is parsed on a thread, awaited to its end even through a cancel
        (``fd`` stays open meanwhile). The caller holds the lock: nothing else writes."""
        st = known or self._stat(fd)  # taken once, for the check and the refresh
        if self.long_refresh(st, names, fd):
            return await on_thread(lambda: self.refresh(st, names, fd))
        return self.refresh(st, names, fd)

    def long_refresh(
        self,
        known: os.stat_result | None = None,
        names: Callable[[], list[str]] | None = None,
        fd: int | None = None,
    ) -> bool:
        """Would :meth:`refresh` (same arguments) parse more than LONG_PARSE bytes: a long log
        at first sight or after a rotation (rotated segments are long), a long block appended?
        Such a refresh is run off the event loop (~9 ms a megabyte)."""
        names = names if self.locked else None
        st = known or self._stat(fd)
        if st is None:
            return False
        if st.st_ino == self.ino and st.st_size >= self.live.size:  # appended to: the tail
            start = self.live.blocks[-1].offset if self.live.blocks else 0
            return st.st_size - start > LONG_PARSE
        if st.st_size > LONG_PARSE:
            return True
        return names is not None and any(_SEGMENT_RE.fullmatch(n) for n in names())

    def _stat(self, fd: int | None) -> os.stat_result | None:
        """The live log's stat: through ``fd`` if open, else by name (None: no log)."""
        try:
            return os.fstat(fd) if fd is not None else os.stat(self.conv.log, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def _holds(self, st: os.stat_result) -> bool:
        """The file last parsed, with nothing appended since."""
        return st.st_ino == self.ino and st.st_size == self.live.size

    def _refresh_from(
        self, fd: int, st: os.stat_result, names: Callable[[], list[str]] | None
    ) -> ParseResult:
        """Refresh from an open descriptor on the live log (``st``: its stat)."""
        if self._holds(st):
            return self.result
        if st.st_ino == self.ino and st.st_size > self.live.size:
            if self.live.blocks:  # the last block again (it may have been unfinished)
                start = self.live.blocks[-1].offset
                data = read_to_end(fd, st.st_size - start, start)
                tail = parse(data, agent_label=self.agent_label, base=start)
                self.live = merge(self.live, tail, start)
            else:
                data = read_to_end(fd, st.st_size)
                self.live = parse_segment(data, agent_label=self.agent_label)
            return self._combine()
        # a new file (first sight, a rotation): read whole, through this descriptor if the
        # lock is held (else the segments are listed first, then the log opened again, so
        # that a rotation meanwhile is seen)
        self._load_all(names, opened=(fd, st) if self.locked else None)
        return self._combine()

    def _load_all(
        self,
        names: Callable[[], list[str]] | None = None,
        opened: tuple[int, os.stat_result] | None = None,
    ) -> None:
        """Parse the segments and the live log from scratch, again if a rotation ran meanwhile.
        ``opened``: a descriptor on the live log the caller has open (and its stat), read on
        the first pass instead of opening the log again."""
        data, ino = b"", 0
        history: tuple[Block, ...] = ()
        for _ in range(20):
            segments = log_segments(self.conv, names)[:-1]
            before = _inodes(segments)
            history = _read_segments(segments, self.agent_label)
            if opened is not None:
                (fd, st), opened = opened, None
                ino, data = st.st_ino, read_to_end(fd, st.st_size)
            else:
                ino, data = self._read_live()
            if self.locked or segment_inodes(self.conv) == before:
                break
        self.history, self.ino = history, ino
        self.live = parse_segment(data, agent_label=self.agent_label)

    def _read_live(self) -> tuple[int, bytes]:
        """The live log's inode and bytes, by name (0 and nothing when there is none)."""
        try:
            fd, st = open_regular_stat(self.conv.log)
        except FileNotFoundError:
            return 0, b""
        try:
            return st.st_ino, read_to_end(fd, st.st_size)
        finally:
            os.close(fd)

    def _combine(self) -> ParseResult:
        live = self.live
        self.result = (
            ParseResult(
                blocks=self.history + live.blocks,
                size=live.size,
                preamble=live.preamble,
                errors=live.errors,
            )
            if self.history
            else live
        )
        return self.result


PromptMode = Literal["add", "replace"]
PROMPT_MODES: tuple[PromptMode, ...] = ("add", "replace")
MAX_TEMPLATE_REQUIREMENTS = 20
_COMMENT_RE = re.compile(r"<!--.*?-->[ \t]*\n?", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Template:
    name: str
    model: str | None = None
    backend: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    system_prompt: str = ""  # adds to the protocol, or replaces it (prompt_mode)
    think: bool | str | None = None
    archive_on_complete: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # routes, permissions, ...
    description: str = ""
    prompt_mode: PromptMode = "add"
    context_requirements: tuple[dict[str, Any], ...] = ()
    folder: Path | None = None  # where it was read from
    shipped: bool = False  # the package's copy: the home has no template of this name

    def requirements_for(self, topic: str) -> list[dict[str, Any]]:
        """The context requirements a new conversation about ``topic`` gets from this
        template, with ``{topic}`` filled in every text value."""
        return [_fill_topic(req, topic) for req in self.context_requirements]


def _fill_topic(value: Any, topic: str) -> Any:
    if isinstance(value, str):
        return value.replace("{topic}", topic)
    if isinstance(value, dict):
        return {k: _fill_topic(v, topic) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill_topic(v, topic) for v in value]
    return value


TEMPLATE_KEYS = frozenset({
    "model", "backend", "options", "think", "archive_on_complete", "system_prompt",
    "system_prompt_file", "routes", "permissions", "description", "prompt_mode",
    "context_requirements",
})  # fmt: skip
_TEMPLATE_FIELDS = {
    "model", "backend", "options", "think", "archive_on_complete", "description", "prompt_mode",
    "context_requirements",
}  # fmt: skip


def template_dirs(home: Home) -> dict[str, tuple[Path, bool]]:
    """Every template by name: its folder and whether it is the shipped copy (a template in
    the home hides the shipped one of the same name). Sorted by name."""
    found: dict[str, tuple[Path, bool]] = {}
    for folder, shipped in ((home.templates, False), (shipped_templates(), True)):
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for d in entries:
            if valid_id(d.name) and (d / "template.toml").is_file():
                found.setdefault(d.name, (d, shipped))
    return dict(sorted(found.items()))


def load_template(home: Home, name: str) -> Template:
    """``templates/<name>/template.toml`` (+ ``system_prompt.md``), else the shipped one.
    A template that cannot be used raises :class:`ConfigError` naming the file and the key."""
    if not valid_id(name):
        raise NotFound(f"not a template name: {name!r}")
    for d, shipped in ((home.templates / name, False), (shipped_templates() / name, True)):
        if (d / "template.toml").is_file():
            return _read_template(name, d, shipped=shipped)
    raise NotFound(f"no template named {name!r} (looked in {home.templates})")


def _read_template(name: str, d: Path, *, shipped: bool) -> Template:
    toml_path = d / "template.toml"
    try:
        data = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot parse template {toml_path}: {exc}") from exc
    unknown = sorted(set(data) - TEMPLATE_KEYS)
    if unknown:
        raise ConfigError(
            f"unknown key {unknown[0]!r} in template {toml_path}; known keys: "
            f"{', '.join(sorted(TEMPLATE_KEYS))}"
        )
    _check_template_values(data, toml_path)
    prompt = _template_prompt(data, d, toml_path)  # takes the prompt keys out of data
    return Template(
        name=name,
        model=data.get("model"),
        backend=data.get("backend"),
        options=dict(data.get("options", {})),
        system_prompt=prompt,
        think=data.get("think"),
        archive_on_complete=data.get("archive_on_complete"),
        extra={k: v for k, v in data.items() if k not in _TEMPLATE_FIELDS},
        description=data.get("description", "").strip(),
        prompt_mode=data.get("prompt_mode", "add"),
        context_requirements=tuple(dict(r) for r in data.get("context_requirements", [])),
        folder=d,
        shipped=shipped,
    )


def _template_prompt(data: dict[str, Any], d: Path, toml_path: Path) -> str:
    """The template's own prompt text: ``system_prompt``, else its file; HTML comments
    (``<!-- … -->``) are notes for whoever edits the file and are not sent."""
    prompt = data.pop("system_prompt", None)
    file_name = data.pop("system_prompt_file", "system_prompt.md")
    if not isinstance(file_name, str) or not file_name or "/" in file_name:
        raise ConfigError(
            f"invalid system_prompt_file in template {toml_path}: a file name in the "
            "template's folder"
        )
    if prompt is None:
        try:
            prompt = (d / file_name).read_text(encoding="utf-8")
        except FileNotFoundError:
            prompt = ""
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {d / file_name}: {exc}") from exc
    elif not isinstance(prompt, str):
        raise ConfigError(f"invalid system_prompt in template {toml_path}: must be a string")
    return _COMMENT_RE.sub("", prompt).strip()


_TEMPLATE_TYPES: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "backend": (str,),
    "description": (str,),
    "options": (dict,),
    "archive_on_complete": (bool,),
    "think": (bool, str),
    "routes": (list,),
    "permissions": (dict,),
    "context_requirements": (list,),
}


def _check_template_values(data: dict[str, Any], toml_path: Path) -> None:
    """Each known key's form; one line naming the key and the file."""
    for key, types in _TEMPLATE_TYPES.items():
        if key in data and not isinstance(data[key], types):
            wanted = " or ".join(_TOML_NAMES[t] for t in types)
            raise ConfigError(
                f"invalid {key} in template {toml_path}: must be {wanted}, "
                f"not {type(data[key]).__name__}"
            )
    mode = data.get("prompt_mode", "add")
    if mode not in PROMPT_MODES:
        raise ConfigError(
            f'invalid prompt_mode in template {toml_path}: {mode!r}; use "add" (the '
            'template\'s prompt is added to the protocol instructions) or "replace"'
        )
    reqs = data.get("context_requirements", [])
    if len(reqs) > MAX_TEMPLATE_REQUIREMENTS:
        raise ConfigError(
            f"invalid context_requirements in template {toml_path}: {len(reqs)} entries; "
            f"at most {MAX_TEMPLATE_REQUIREMENTS}"
        )
    for n, req in enumerate(reqs, 1):
        if not isinstance(req, dict) or not isinstance(req.get("type"), str):
            raise ConfigError(
                f"invalid context_requirements in template {toml_path}: entry {n} must be a "
                'table with a "type", e.g. { type = "notes", query = "{topic}" }'
            )


_TOML_NAMES: dict[type, str] = {
    str: "a string",
    dict: "a table",
    bool: "true or false",
    list: "an array",
}


def shipped_templates() -> Path:
    """The templates that ship with the package (copied into a new home's templates/)."""
    return Path(__file__).parent / "skeleton" / "templates"
