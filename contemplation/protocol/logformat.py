"""Pure: the textual framing of ``messages.log`` shared by the writer and the parser.

Frame lines
-----------
* header: ``=== SENDER -> RECIPIENT [YYYY-MM-DD HH:MM:SS] ===``
* marker: ``=== WORD ===`` or ``=== WORD: one line of text ===`` where WORD is one of
  :class:`~contemplation.models.MarkerKind` (COMPLETE, INTERRUPTED, ERROR, ...).

Stuffing
--------
A body line that could be taken for a frame line is written with one extra leading space:
any line matching ``^ *===`` gains a space, and the parser removes exactly one leading space
from such lines. This is exact and reversible (like SMTP dot-stuffing), so model text full of
``=== X -> Y [..] ===`` lines round-trips unchanged and can never forge a header or marker.

An agent's block is stuffed the same way for ``[attachment: …]`` lines: the writer's own (one
per file a folder message carries, see :mod:`contemplation.store.attachments`) are written as they
are, and every other line shaped ``^ *[attachment: `` (the agent's text, an attached text file,
a tool's answer to a NEED) gains one space, which the parser removes. So a copied line is the
text it was and names no file: only a line at a line start in the file is the writer's.
"""

from __future__ import annotations

import re
from datetime import datetime

from contemplation.values import MarkerKind

HEADER_RE = re.compile(
    rb"^=== ([A-Z][A-Z0-9_]*) -> ([A-Z][A-Z0-9_]*) \[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] ===\r?$"
)
_MARKER_WORDS = "|".join(re.escape(m.value) for m in MarkerKind)
MARKER_RE = re.compile(rb"^=== (" + _MARKER_WORDS.encode() + rb")(?:: (.*?))? ===\r?$")
LABEL_RE = re.compile(r"^[A-Z][A-Z0-9_]{0,31}$")
FRAME = "==="  # a line that starts so is a frame (a body line so shaped is stuffed: " ===")
FRAME_OPEN = FRAME + " "  # every header and marker line starts so
NEED_PREFIX = "NEED:"
RESPONSE_PREFIX = "RESPONSE TO NEED:"
TOOL_OUTPUT_BEGIN = "BEGIN TOOL OUTPUT"  # frames a tool's answer inside a RESPONSE TO NEED block
TOOL_OUTPUT_END = "END TOOL OUTPUT"
# a native tool call recorded in a model's reply, the NEED it is answered as on the next line
TOOL_CALL_OPEN = "(tool call "
TOOL_CALL_RE = re.compile(
    "^" + re.escape(TOOL_CALL_OPEN) + r"(\S+): (\S+) (.*)\)\n" + NEED_PREFIX + " (.*)$",
    re.MULTILINE,
)
COMPLETE_LINE = "=== COMPLETE ==="
ATTACHMENT_OPEN = "[attachment: "  # a file the writer kept (an agent's block; stuffed else)
ATTACHMENT_LINE_RE = re.compile(
    r"^\[attachment: (?P<name>.+) (?P<mime>[a-z]+/[A-Za-z0-9.+-]+) "
    r"(?P<size>\d+ (?:B|KB|MB|GB)) sha256:(?P<sha>[0-9a-f]{64})\]$",
    re.MULTILINE,
)
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def timestamp(now: datetime | None = None) -> str:
    return (now or datetime.now()).strftime(TIME_FORMAT)


def header(sender: str, recipient: str, ts: str | None = None) -> str:
    if not LABEL_RE.match(sender) or not LABEL_RE.match(recipient):
        raise ValueError(f"labels must be upper-case words: {sender!r} -> {recipient!r}")
    return f"{header_start(sender, recipient)}{ts or timestamp()}] ===\n"


def header_start(sender: str, recipient: str) -> str:
    """A header's text up to its timestamp (how a block from ``sender`` begins)."""
    return f"{FRAME_OPEN}{sender} -> {recipient} ["


def tool_call_lines(call_id: str, name: str, arguments: str, need: str) -> str:
    """A native tool call as the reply records it (read back by :data:`TOOL_CALL_RE`):
    ``(tool call <id>: <name> <json arguments>)`` and the ``NEED:`` line it is answered as."""
    return f"{TOOL_CALL_OPEN}{call_id}: {name} {arguments})\n{NEED_PREFIX} {need}\n"


def canonical_need(text: str) -> str:
    """The one form a need is compared, keyed and echoed in: runs of any Unicode whitespace
    (tabs, NBSP, U+2028 ...) become one space, ends trimmed. A RESPONSE header carries this
    form, so a need matches its answer however the model spaced it."""
    return " ".join(text.split())


def one_line(text: str, limit: int = 500) -> str:
    flat = " ".join(text.split())
    flat = flat.replace("===", "= = =")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def marker(kind: MarkerKind, text: str = "") -> str:
    return f"=== {kind.value}: {one_line(text)} ===\n" if text else f"=== {kind.value} ===\n"


NOT_TAKEN = " was not taken: "  # a NOTE marker's words for a message refused into failed/
KEPT_IN = "; kept in failed/"


def not_taken(claimed: str, why: str, kept: str) -> str:
    """The NOTE marker's text for a message the daemon refused into ``failed/`` (``claimed``:
    its name in processing/, the inbox name after the claim's prefix; ``kept``: its name in
    failed/). :func:`refusal` reads it back."""
    return f"message {claimed}{NOT_TAKEN}{why}{KEPT_IN}{kept}"


def refusal(text: str) -> tuple[str, str, str] | None:
    """(claimed name, why, name in failed/) of a :func:`not_taken` marker text; None for any
    other text. A reason cut by the marker's length limit keeps what is left of it."""
    head, sep, rest = text.partition(NOT_TAKEN)
    if not sep or not head.startswith("message "):
        return None
    name = head.removeprefix("message ")
    why, sep, kept = rest.rpartition(KEPT_IN)
    return (name, why, kept) if sep else (name, rest, "")


def _needs_stuffing(line: str) -> bool:
    return line.lstrip(" ").startswith("===")


def stuff(text: str) -> str:
    """Escape body text so that no line of it can be read as a frame line."""
    if "===" not in text:
        return text
    return "\n".join(" " + ln if _needs_stuffing(ln) else ln for ln in text.split("\n"))


def body(text: str, own: tuple[int, ...] = ()) -> str:
    """An agent block's stuffed text ending with exactly one newline (trailing blank lines
    are not kept). ``own``: the lines (by index) that are the writer's ``[attachment: …]``
    lines; any other line so shaped is stuffed (see :func:`inert`)."""
    return stuff(inert(text.replace("\r\n", "\n").rstrip("\n"), own)) + "\n"


def _attachment_shaped(line: str) -> bool:
    return line.lstrip(" ").startswith(ATTACHMENT_OPEN)


def inert(text: str, own: tuple[int, ...] = ()) -> str:
    """``text`` with one more space before each ``[attachment: `` line but the ``own``
    lines (indices), so that it names no file the writer kept."""
    if ATTACHMENT_OPEN not in text:
        return text
    lines = text.split("\n")
    mine = frozenset(own)
    return "\n".join(
        " " + ln if i not in mine and _attachment_shaped(ln) else ln for i, ln in enumerate(lines)
    )


def uninert(text: str) -> str:
    """The parser's side of :func:`inert`: one space less before each stuffed line."""
    if " " + ATTACHMENT_OPEN not in text:
        return text
    return "\n".join(
        ln[1:] if ln.startswith(" ") and _attachment_shaped(ln) else ln for ln in text.split("\n")
    )


class StreamStuffer:
    """Stuffs text that arrives in arbitrary pieces (streamed tokens).

    Text is passed through at once except at the start of a line, where it is held back
    only until it is clear whether the line starts with ``===``. A line that does is held
    until its end so that a model's own ``=== COMPLETE ===`` line can be recognised and
    written as the real marker; everything else of that shape is stuffed.
    """

    HOLD_LIMIT = 4096

    def __init__(self) -> None:
        self._pending = ""  # undecided start of the current line
        self._at_line_start = True
        self.saw_complete = False

    def feed(self, piece: str) -> str:
        out: list[str] = []
        i = 0
        n = len(piece)
        while i < n:
            if not self._at_line_start:
                j = piece.find("\n", i)
                if j < 0:
                    out.append(piece[i:])
                    break
                out.append(piece[i : j + 1])
                i = j + 1
                self._at_line_start = True
                continue
            # at a line start: accumulate until decided
            j = piece.find("\n", i)
            chunk = piece[i:] if j < 0 else piece[i : j + 1]
            i = n if j < 0 else j + 1
            self._pending += chunk
            decided = self._decide(final=False)
            if decided is not None:
                out.append(decided)
        return "".join(out)

    def _decide(self, *, final: bool) -> str | None:
        p = self._pending
        stripped = p.lstrip(" ")
        ended = p.endswith("\n")
        if stripped.startswith("==="):
            if not ended and not final and len(p) < self.HOLD_LIMIT:
                return None
            self._pending = ""
            self._at_line_start = ended
            if p.strip() == COMPLETE_LINE and (ended or final):
                self.saw_complete = True
                return ""  # the writer emits the real marker at the end of the block
            return " " + p
        if ("===".startswith(stripped) or not stripped) and not ended and not final:
            return None  # still could become "==="
        self._pending = ""
        self._at_line_start = ended
        return p

    def flush(self) -> str:
        if not self._pending:
            return ""
        out = self._decide(final=True)
        return out or ""
