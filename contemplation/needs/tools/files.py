"""``File contents of <path>``: read a text file from the allowed roots, and nothing else.

The path comes from model output, so it is hostile until proven otherwise:

1. refused outright: a NUL byte, a ``..`` component, an absolute path outside the roots;
2. ``resolve(strict=True)`` and ``is_relative_to(root)`` (never ``str.startswith``: ``/base-evil``
   starts with ``/base``), so a symlinked file or folder that leads out is refused while a
   link that stays inside is fine;
3. a deny-list second layer inside the roots (``.ssh``, ``.gnupg``, ``.env*``, ``*.pem``,
   ``id_*``, ``.netrc``, the tool's own token and index ...), compared case-insensitively on
   every component below the root that holds the file (the deepest one: a root that names a
   secret, ``~/.ssh``, lifts it; ``~`` does not), and the configuration file by its path;
4. ``O_NOFOLLOW | O_NONBLOCK`` on open (a FIFO cannot block us), ``fstat`` must say regular
   file, and the descriptor's real path is checked again on Linux.

Paths as models write them: ``~`` and ``~/…`` are the user's home (``~user`` is refused); a
relative path is tried under each root, and also with a leading folder equal to a root's own
name left out (``notes/plan.md`` under the root ``~/notes``); a path found under several roots
is refused with the candidates. Every form goes through the checks above. No ``$VAR``
expansion, no shell, no subprocess.

A part of a file: ``PATH lines 120-180`` (also ``line 120``, ``lines 120-``; see
:mod:`contemplation.needs.tools.parts`). An answer holds at most ``answer_chars`` characters, cut at
a line end; when it is cut, its note says which lines it shows of how many, how many are left
and the exact NEED line for the next part.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from contemplation.base.secret_names import FILES_ALSO, SECRET_NAMES, own_secret
from contemplation.errors import ToolError
from contemplation.needs.tools.base import Refused, ToolResult, Unconfigured, text_arg
from contemplation.needs.tools.parts import read_part, split_range
from contemplation.settings import default_config_path

if TYPE_CHECKING:
    from contemplation.settings import Settings

DEFAULT_DENY = (*SECRET_NAMES, *FILES_ALSO)  # (see contemplation.base.secret_names)
SKIP_DIRS = {".git", "__pycache__", "node_modules", ".venv", "venv", ".mypy_cache", ".tox"}
_DEF_RE = re.compile(r"^(?:async\s+def|def|class)\s+([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)
_PROC_FD = Path("/proc/self/fd")


def config_files(settings: Settings) -> tuple[Path, ...]:
    """The configuration files, which hold api keys: the one read, and the default one (it
    may be made later), each a secret (see :data:`DEFAULT_DENY` for the rest)."""
    return (*([settings.config_file] if settings.config_file else []), default_config_path())


def _home(raw: str) -> str:
    """``~`` and ``~/…`` as the user's home; ``~user`` is refused (whose home is not ours)."""
    if not raw.startswith("~"):
        return raw
    if raw != "~" and not raw.startswith("~/"):
        raise Refused(f"{raw!r}: only ~/ (your own home) is understood, not ~user")
    try:
        home = Path.home()
    except (RuntimeError, KeyError):
        why = "there is no home folder to expand ~ to; write the full path"
        raise Refused(f"{raw!r}: {why}") from None
    return str(home) + raw[1:]


def _expanded(root: Path) -> Path:
    """A configured root with ``~`` expanded (as it is if there is no home to expand to)."""
    try:
        return root.expanduser()
    except RuntimeError:
        return root


def _both(path: Path) -> tuple[Path, ...]:
    """``path`` made absolute as written and as it resolves (a link to it is the same file)."""
    path = Path(os.path.abspath(path))
    return (path, path.resolve())


def _deepest(path: Path, roots: Sequence[Path]) -> Path | None:
    """The root ``path`` is in that names it most precisely (the longest), or None."""
    inside = [r for r in roots if path.is_relative_to(r)]
    return max(inside, key=lambda r: len(r.parts)) if inside else None


def _tilde(path: Path) -> str:
    try:
        home = Path.home()
    except (RuntimeError, KeyError):
        return str(path)
    inside = path.is_relative_to(home) and path != home
    return f"~/{path.relative_to(home)}" if inside else str(path)


def _real_roots(roots: Sequence[Path]) -> tuple[Path, ...]:
    out: list[Path] = []
    for r in roots:
        try:
            out.append(r.resolve(strict=True))
        except OSError:
            continue  # a root that does not exist allows nothing
    return tuple(out)


class FileReader:
    """Reads files under ``roots``; also lists a folder's structure (for context assembly)."""

    name = "files.read"

    def __init__(
        self,
        roots: Sequence[Path],
        *,
        max_bytes: int = 256 * 1024,
        deny: Sequence[str] = (),
        answer_chars: int = 2000,
        protected: Sequence[Path] = (),
    ) -> None:
        self.configured = tuple(_expanded(Path(r)) for r in roots)
        self.roots = _real_roots(self.configured)
        # files never read unless a root is the file itself (the configuration file)
        self.protected = frozenset(p for f in protected for p in _both(_expanded(Path(f))))
        self.max_bytes = max_bytes
        self.answer_chars = min(answer_chars, max_bytes)
        patterns = [p.casefold() for p in (*DEFAULT_DENY, *deny)]
        self._deny_names = tuple(p for p in patterns if "/" not in p)
        self._deny_paths = tuple(p.strip("/") for p in patterns if "/" in p)

    @property
    def ready(self) -> bool:  # offered to the model only with a folder it may read
        return bool(self.roots)

    async def call(self, arguments: Mapping[str, Any]) -> ToolResult:
        path = text_arg(arguments, "path")
        return await asyncio.to_thread(self.read, path)

    # -- checks -----------------------------------------------------------------------

    def _shown_roots(self) -> str:
        return ", ".join(str(r) for r in self.roots) or "(none)"

    def denied(self, parts: Sequence[str]) -> str | None:
        """The deny pattern that ``parts`` (path components) hit, if any."""
        hit = self._denied_at(parts)
        return hit[0] if hit else None

    def _denied_at(self, parts: Sequence[str]) -> tuple[str, int] | None:
        """The deny pattern ``parts`` hit and how many of them make the denied path."""
        folded = [p.casefold() for p in parts]
        for i, name in enumerate(folded):
            for pat in self._deny_names:
                if fnmatch.fnmatchcase(name, pat):
                    return pat, i + 1
        for pat in self._deny_paths:
            size = pat.count("/") + 1
            for i in range(len(folded) - size + 1):
                if "/".join(folded[i : i + size]) == pat:
                    return pat, i + size
        return None

    def _refuse_secret(self, raw: str, path: Path, root: Path | None, how: str) -> None:
        """:class:`Refused` when ``path`` (under ``root``, the one that names it most
        precisely) is a secret: which one, and how to name it to read it anyway; one of the
        tool's own secrets is refused whatever the roots (nothing lifts it)."""
        if why := own_secret(path.parts):
            raise Refused(f"{raw!r}: {why}")
        if path in self.protected and path != root:
            secret, why = path, "is the configuration file (it holds the api keys)"
        else:
            parts = path.relative_to(root).parts if root is not None else path.parts
            hit = self._denied_at(parts)
            if hit is None:
                return
            pattern, size = hit
            base = root if root is not None else Path(path.anchor)
            secret, why = base.joinpath(*parts[:size]), how.format(pattern)
        raise Refused(
            f"{raw!r} {why}: secrets are never read unless named; to read it, "
            f'add "{_tilde(secret)}" to tools.allowed_roots'
        )

    def locate(self, requested: str) -> Path:
        """The real path of ``requested`` inside a root, or :class:`Refused` / ToolError."""
        if not self.roots:
            raise Unconfigured(
                "no folders are open for reading", hint="set tools.allowed_roots in the config"
            )
        if "\x00" in requested:
            raise Refused("the path contains a NUL byte")
        raw = requested.strip()
        if not raw:
            raise ToolError("missing argument 'path'")
        raw = _home(raw)
        pure = PurePosixPath(raw)
        if ".." in pure.parts:
            raise Refused(f"{raw!r} contains '..', which is not allowed; name the file itself")
        if pure.is_absolute():  # as written, below the root that holds it
            lexical = Path(os.path.normpath(raw))
            root = _deepest(lexical, (*self.roots, *self.configured))
            self._refuse_secret(raw, lexical, root, "matches the deny-list ({})")
        elif hit := self.denied(pure.parts):
            raise Refused(
                f"{raw!r} matches the deny-list ({hit}): secrets are never read unless named; "
                "to read it, add its folder to tools.allowed_roots"
            )
        found = self._found(raw, pure)
        if len(found) > 1:
            listed = ", ".join(str(f) for f in found)
            raise ToolError(f"{raw!r} is in more than one allowed folder: {listed}; ask for one")
        if found:
            return found[0]
        raise ToolError(f"no such file: {raw!r} (looked in {self._shown_roots()})")

    def resolved(self, requested: str) -> Path | None:
        """The real path a request for a file (or a part of one) reads; None when it would be
        refused or is not there (the read says why)."""
        try:
            return self.locate(split_range(requested)[0])
        except ToolError:
            return None

    def _found(self, raw: str, pure: PurePosixPath) -> list[Path]:
        """The real paths of the candidates that exist, each checked against the roots and
        the deny-list."""
        found: list[Path] = []
        for cand in self._candidates(raw, pure):
            try:
                real = cand.resolve(strict=True)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:  # a link loop, a permission problem
                raise ToolError(f"cannot open {raw!r}: {exc.strerror or exc}") from None
            root = _deepest(real, self.roots)
            if root is None:
                raise Refused(
                    f"{raw!r} is a link that leads outside the allowed folders; it is not read"
                )
            self._refuse_secret(raw, real, root, "leads to a denied name ({})")
            if real not in found:
                found.append(real)
        return found

    def _candidates(self, raw: str, pure: PurePosixPath) -> list[Path]:
        """Where ``raw`` may be: itself if absolute (inside a root), else under each root, and
        under a root whose own folder name it starts with, that name left out."""
        if not pure.is_absolute():
            out = [root / pure for root in self.roots]
            if len(pure.parts) > 1:
                rest = PurePosixPath(*pure.parts[1:])
                out += [r / rest for r in self.roots if r.name == pure.parts[0]]
                out += [
                    r / rest for r in self.configured if r.name == pure.parts[0] and r.is_absolute()
                ]
            return out
        lexical = Path(os.path.normpath(raw))
        if not any(lexical.is_relative_to(r) for r in (*self.roots, *self.configured)):
            raise Refused(
                f"{raw!r} is outside the allowed folders ({self._shown_roots()}); "
                "ask for a path inside one of them"
            )
        return [lexical]

    def _open(self, real: Path, raw: str) -> tuple[int, os.stat_result]:
        st = os.stat(real)
        if stat.S_ISDIR(st.st_mode):
            raise Refused(f"{raw!r} is a folder, not a file; ask for one file in it")
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{raw!r} is not a regular file (a device, FIFO or socket)")
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(real, flags)
        except OSError as exc:
            raise ToolError(f"cannot open {raw!r}: {exc.strerror or exc}") from None
        try:
            st = self._check_opened(fd, real, raw)
        except BaseException:
            os.close(fd)
            raise
        return fd, st

    def _check_opened(self, fd: int, real: Path, raw: str) -> os.stat_result:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{raw!r} is not a regular file")
        if _PROC_FD.is_dir():  # Linux: the descriptor's own idea of its path
            opened = Path(os.readlink(_PROC_FD / str(fd)))
            if opened != real or not any(opened.is_relative_to(r) for r in self.roots):
                raise Refused(f"{raw!r} changed while it was being opened; not read")
        return st

    # -- reading ----------------------------------------------------------------------

    def read(self, requested: str) -> ToolResult:
        path, first, last = split_range(requested)
        real = self.locate(path)
        fd, st = self._open(real, path)
        with os.fdopen(fd, "rb") as f:
            head = f.read(8192)
            if b"\x00" in head:
                raise Refused(f"{path!r} is a binary file ({st.st_size:,} bytes); not shown")
            f.seek(0)
            return read_part(f, path, str(real), (first, last), self.answer_chars)

    def read_head(self, real: Path, limit: int) -> str:
        fd, _ = self._open(real, str(real))
        with os.fdopen(fd, "rb") as f:
            return f.read(limit).decode("utf-8", errors="replace")

    def tree(self, requested: str, *, depth: int = 3, max_entries: int = 400) -> ToolResult:
        """A folder's layout (and top-level Python names), within the same roots and deny-list."""
        real = self.locate(requested)
        if not real.is_dir():
            raise Refused(f"{requested!r} is not a folder")
        lines: list[str] = [f"{real.name}/"]
        count = 0
        more = False

        def walk(d: Path, level: int) -> None:
            nonlocal count, more
            try:
                entries = sorted(os.scandir(d), key=lambda e: (not e.is_dir(), e.name))
            except OSError:
                return
            for e in entries:
                if e.name.startswith(".") or e.name in SKIP_DIRS or self.denied([e.name]):
                    continue
                if count >= max_entries:
                    more = True
                    return
                count += 1
                pad = "  " * level
                if e.is_symlink():
                    lines.append(f"{pad}{e.name} (link)")
                elif e.is_dir(follow_symlinks=False):
                    lines.append(f"{pad}{e.name}/")
                    if level < depth:
                        walk(Path(e.path), level + 1)
                elif e.name.endswith(".py"):
                    names = self._py_names(Path(e.path))
                    lines.append(f"{pad}{e.name}" + (f": {', '.join(names)}" if names else ""))
                else:
                    lines.append(f"{pad}{e.name}")

        walk(real, 1)
        note = f"stopped after {max_entries} entries" if more else ""
        return ToolResult("\n".join(lines), str(real), more, note)

    def _py_names(self, path: Path) -> list[str]:
        try:
            head = self.read_head(path, 64 * 1024)
        except (ToolError, OSError):
            return []
        return _DEF_RE.findall(head)[:20]


class FileTree:
    """``files.tree``: a folder's layout through the same checks as :class:`FileReader`."""

    name = "files.tree"

    def __init__(self, reader: FileReader, *, depth: int = 3, max_entries: int = 400) -> None:
        self.reader = reader
        self.depth = depth
        self.max_entries = max_entries

    @property
    def ready(self) -> bool:
        return self.reader.ready

    async def call(self, arguments: Mapping[str, Any]) -> ToolResult:
        path = str(arguments.get("path") or ".")
        return await asyncio.to_thread(
            self.reader.tree, path, depth=self.depth, max_entries=self.max_entries
        )
