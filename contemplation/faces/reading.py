"""Read-only views of conversations for the faces (MCP server, dashboard): summaries, the
blocks since a cursor, pending needs, exports. Nothing here writes.

A *cursor* is a byte offset into the whole conversation: the rotated segments (oldest
first) and then the live ``messages.log``, laid end to end. Rotation only renames files, so
offsets already handed out stay valid. A cursor always points at a block boundary: it stops
before a reply that is still being streamed, so the next read returns that block whole.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contemplation.errors import InputRejected, NotFound
from contemplation.index import listing
from contemplation.protocol import panel
from contemplation.protocol.conversation import need_id
from contemplation.protocol.parser import find_responses
from contemplation.store import activity, plain, room
from contemplation.store.cursors import (
    AGENT_SOURCE,
    Segment,
    Since,
    block_dict,
    blocks_since,
    log_text,
    own,
    own_block,
    segment_blocks,
    segments,
)
from contemplation.store.layout import (
    Conv,
    Home,
    list_conversations,
    locate,
    queued_messages,
    read_regular,
)
from contemplation.store.logview import LogView
from contemplation.store.waiting import MIN_PREFIX, WaitItem, look
from contemplation.values import BUSY, Block, BlockKind, Status
from contemplation.writer import daemon_alive

if TYPE_CHECKING:  # loaded by the faces that act, when they ask for them (Standing.meta)
    from contemplation.models import Metadata, State

__all__ = [  # the cursor space's names, which the faces read here
    "AGENT_SOURCE", "Reader", "Segment", "Since", "Standing", "block_dict", "blocks_since",
    "locate", "log_text", "own", "own_block", "segments",
]  # fmt: skip

VIEWS_KEPT = 256
STANDING_TRIES = 8  # reads of a conversation that changes under each one before it is busy


OWN_SEGMENTS_BACK = 8  # rotated segments searched for the agent's last own message


Doc = dict[str, Any]  # a document as its model dumps it (contemplation.store.plain)


@dataclass(frozen=True)
class Standing:
    """One conversation as one moment shows it, for every face that follows one (CLI
    ``--wait`` and ``wait``, MCP check, wait and progress, the dashboard, ``status CONV``): its
    documents, what waits for the agent, and whether the daemon is done, all from the same
    reading. The documents are read as their models dump them (``meta_doc``, ``state_doc``:
    :mod:`contemplation.store.plain`, no pydantic); ``meta`` and ``state`` are the models,
    made from them when a face first asks."""

    meta_doc: Doc | None
    state_doc: Doc | None
    items: list[WaitItem]
    deciding: tuple[str, ...]  # lookups decided by the agent, not answered by the daemon yet
    queued: int  # messages in inbox/ and processing/
    settled: bool

    @cached_property
    def meta(self) -> Metadata | None:
        from contemplation.models import Metadata

        return None if self.meta_doc is None else Metadata.model_validate(self.meta_doc)

    @cached_property
    def state(self) -> State | None:
        from contemplation.models import State

        return None if self.state_doc is None else State.model_validate(self.state_doc)


@dataclass(frozen=True, slots=True)
class Answered:
    """A need of the latest reply, answered already: by whom (``agent``, a tool) and when."""

    need: str
    by: str
    at: str
    queued: bool = False  # still on its way to the log
    id: str = ""  # the need's id (as ``waiting`` lists it)

    def said(self) -> str:
        how = "queued" if self.queued else "answered"
        return f"{self.need!r} was {how} by {self.by} at {self.at}"


LOOK_BACK = 256  # blocks looked back through for an answer given earlier
_SOURCE = re.compile(r"^\(source: ([^,()\n]+), ([^()\n]+)\)$", re.MULTILINE)


def _source(text: str, stamp: str = "?") -> tuple[str, str]:
    """Who wrote an answer and when, from its ``(source: WHO, WHEN)`` line."""
    m = _SOURCE.search(text[:4096])
    return (m[1], m[2]) if m else ("?", stamp)


def _heads(paths: Iterable[Path]) -> Iterator[str]:
    """The first MiB of each queued message that can be read, as text."""
    for path in paths:
        try:
            yield read_regular(path, 1 << 20).decode("utf-8", errors="replace")
        except (OSError, InputRejected):
            continue


def _committed(view: LogView, state: Doc | None, *, daemon: bool) -> tuple[Block, ...]:
    """The blocks of the log as ``state`` accounts for them. While a ``daemon`` runs, a block
    that begins past the state's committed size (one it has just written and not yet
    committed, or a hand append it has not taken in yet) belongs to a later moment than the
    state's and is left out; with none running, nothing takes such bytes in, and the log is
    read as it is."""
    blocks = view.refresh().blocks
    log = state["log"] if state is not None else None
    if not daemon or log is None or (log["ino"] and log["ino"] != view.ino):
        return blocks  # no state, or one of another file (a rotation, a replaced log)
    later = sum(1 for b in view.live.blocks if b.offset >= log["size"])
    return blocks[: len(blocks) - later]


def _settled(
    meta: Doc | None,
    state: Doc | None,
    live: int,
    blocks: tuple[Block, ...],
    *,
    queued: int,
    deciding: tuple[str, ...],
) -> bool:
    """The daemon is done for now: nothing queued, nothing being written, no decision of the
    agent left to act on, and no model turn due."""
    if queued or meta is None or (state is not None and state["intent"] is not None):
        return False
    if state is not None and live != state["log"]["size"]:
        # bytes past the last commit: a reply whose commit also commits the message it
        # answers (written with no intent, see ReplyStream.merge_into_commit), or an
        # append the daemon has not adopted yet; either way not done
        return False
    if not blocks:
        return True  # started empty: there is nothing to wait for
    if state is None or state["status"] in BUSY or deciding:
        return False
    due = panel.next_for(meta, blocks)[1].action  # (every seat of a panel)
    if due == "needs":  # done only once the daemon has handed them to the agent: a panel's
        # seat's needs are routed after the other seats' replies are written, with the state
        # idle in between (send --wait returned there, before the seat's answer)
        return state["status"] not in (Status.IDLE, Status.PENDING)
    return due != "turn"


def _writing_at(state: Doc | None) -> int | None:
    """Where a write in flight begins (its intent's offset), else the end of the last commit;
    None without a state."""
    if state is None:
        return None
    intent = state["intent"]
    return int(intent["offset"] if intent is not None else state["log"]["size"])


# --------------------------------------------------------------------------- the reader


def _live_size(conv: Conv) -> int:
    try:
        return conv.log.stat().st_size
    except FileNotFoundError:
        return 0


@dataclass
class Reader:
    """Reads of one home: summaries from the index, incremental log views."""

    home: Home
    _views: OrderedDict[Path, LogView] = field(default_factory=OrderedDict)

    def conversations(self, *, include_completed: bool = True) -> list[Conv]:
        return list_conversations(self.home, include_completed=include_completed)

    def summary(self, conv: Conv) -> dict[str, Any]:
        """One conversation's summary (its folder read again if it changed)."""
        row = listing.one(self.home, conv.id)
        if row is None:
            raise NotFound(f"no conversation {conv.id!r}")
        return row

    def summaries(self, *, include_completed: bool = True) -> list[dict[str, Any]]:
        """Every summary from the index, newest activity first."""
        return listing.summaries(self.home, include_completed=include_completed)

    def view(self, conv: Conv, agent_label: str) -> LogView:
        v = self._views.get(conv.dir)
        if v is None or v.agent_label != agent_label:
            v = LogView(conv, agent_label, bare=True)  # (no face reads an old text here)
            self._views[conv.dir] = v
        self._views.move_to_end(conv.dir)
        while len(self._views) > VIEWS_KEPT:
            self._views.popitem(last=False)
        return v

    def queued_answers(self, paths: list[Path]) -> set[str]:
        """Needs whose answers are on their way: queued in inbox/ or claimed in processing/
        (``paths``, listed in the order a message moves: inbox → processing → log, so an
        answer on its way is seen in one of the three)."""
        queued: set[str] = set()
        for head in _heads(paths):
            queued.update(find_responses(head))
        return queued

    def answered(self, conv: Conv) -> list[Answered]:
        """The answers already given to the needs of the model's latest reply, while they are
        in play (no reply or message came after them): those on their way (``inbox/``,
        ``processing/``) and those in the log after it, each with who gave it and when (what a
        responder that came second is told)."""
        meta = plain.metadata(conv)
        out: list[Answered] = []
        for head in _heads(queued_messages(conv)):
            out += [Answered(need, *_source(head), queued=True) for need in find_responses(head)]
        if meta is None:
            return out
        given: list[Answered] = []
        for b in reversed(self.view(conv, meta["agent_label"]).refresh().blocks):
            if b.kind is BlockKind.MODEL:  # the latest reply: its needs, if it asked any
                found = out + given[::-1]
                return [replace(a, id=need_id(b, a.need)) for a in found if a.need in b.needs]
            if b.response_to is None:
                break  # a message came since: no need of an earlier reply is still in play
            for need in b.responds:
                given.append(Answered(need, *_source(b.text, b.timestamp)))
        return []

    def last_answer(self, conv: Conv, ref: str | None = None) -> Answered | None:
        """The latest answer given to a need (``ref``: to the need it names, by its id, a
        unique prefix of it, or its text; else one given since the agent's last message), on
        its way or in the log's last ``LOOK_BACK`` blocks, in play or not: what a responder
        that came second, after the model has already gone on, is told."""
        if ref is None:
            for head in reversed(list(_heads(queued_messages(conv)))):
                if found := find_responses(head):
                    return Answered(found[-1], *_source(head), queued=True)
        meta = plain.metadata(conv)
        if meta is None:
            return None
        ref = ref.strip() if ref else None
        given: list[Answered] = []  # answers after the block looked at, nearest first
        for b in reversed(self.view(conv, meta["agent_label"]).refresh().blocks[-LOOK_BACK:]):
            if ref is None and b.kind is BlockKind.AGENT and b.response_to is None:
                return None  # a message came since: what follows it is a new exchange
            if b.kind is BlockKind.MODEL and ref is not None:
                for need in b.needs:
                    nid = need_id(b, need)
                    named = ref in {nid, need} or (len(ref) >= MIN_PREFIX and nid.startswith(ref))
                    hit = next((a for a in given if a.need == need), None)
                    if named and hit is not None:
                        return replace(hit, id=nid)
                given = []  # the answers before this reply answered an earlier one
            for need in b.responds if b.response_to is not None else ():
                if ref is None:
                    return Answered(need, *_source(b.text, b.timestamp))
                given.insert(0, Answered(need, *_source(b.text, b.timestamp)))
        return None

    def standing(self, conv: Conv, *, decided: bool = False) -> Standing:
        """Where ``conv`` stands, as one moment shows it: what waits for the agent and whether
        the daemon is done with it, both from one reading of its metadata, its state and its
        log (``decided``: see :func:`~contemplation.store.waiting.look`). The state is read again
        after the log: a reading it changed under is done again, and one that never holds
        still is *busy* (nothing listed, not settled), never a mix of two moments."""
        if conv.is_completed:
            return Standing(plain.metadata(conv), plain.state(conv), [], (), 0, settled=True)
        for _ in range(STANDING_TRIES):
            got = self._standing(conv, decided=decided)
            if got is not None:
                return got
        return Standing(plain.metadata(conv), plain.state(conv), [], (), 0, settled=False)

    def _standing(self, conv: Conv, *, decided: bool) -> Standing | None:
        if not conv.dir.is_dir():  # archived meanwhile
            return Standing(None, None, [], (), 0, settled=False)
        paths = queued_messages(conv)
        queued = self.queued_answers(paths)
        meta = plain.metadata(conv)
        state = plain.state(conv)
        live = _live_size(conv)
        daemon = daemon_alive(self.home)
        view = self.view(conv, meta["agent_label"]) if meta is not None else None
        blocks = _committed(view, state, daemon=daemon) if view is not None else ()
        if plain.state(conv) != state:
            return None  # the daemon wrote meanwhile: the log may be of another moment
        seen = look(conv, blocks, meta, state, queued, decided=decided)
        return Standing(
            meta,
            state,
            seen.items,
            seen.deciding,
            len(paths),
            settled=_settled(meta, state, live, blocks, queued=len(paths), deciding=seen.deciding),
        )

    def streamed(self, conv: Conv) -> int | None:
        """Characters of the reply being streamed into the log now (None: none is), read
        from the end of what is committed: only the reply in flight is read."""
        partial = self.since(conv, self.boundary(conv)).partial
        return len(str(partial.get("text", ""))) if partial is not None else None

    def activity(self, conv: Conv, view: Standing, *, written: int | None = None) -> str:
        """What ``conv`` is doing, in the words of :func:`activity.describe`, from ``view``
        and the same figures on every face (``status``, MCP, the dashboard): what is queued
        and ahead of it, what waits, and the characters streamed so far (``written``: when
        the caller has just read them; else read here while a turn generates). An archived
        conversation is archived, whatever its last state (:func:`activity.archived`)."""
        meta, state = view.meta_doc, view.state_doc
        if conv.is_completed:
            try:
                return activity.archived(str(self.summary(conv)["status"]))
            except NotFound:  # moved on meanwhile: its state's word
                return activity.archived(str(state["status"] if state else Status.PENDING))
        model = meta["model"] if meta else ""
        behind = 0
        if view.queued and meta is not None:
            rows = self.summaries(include_completed=False)
            behind = activity.queued_behind(conv.id, meta["backend"], model, rows)
        if written is None and state is not None and state["status"] == Status.GENERATING:
            written = self.streamed(conv)
        asks = sum(1 for i in view.items if i.kind == "approval")
        return activity.describe(
            state,
            model=model,
            daemon=daemon_alive(self.home),
            queued=view.queued,
            behind=behind,
            written=written,
            waiting=(len(view.items) - asks, asks),
            disk_full=self.disk_full(view),
        )

    def disk_full(self, view: Standing) -> str:
        """ "the disk is full (…)" while a busy conversation's disk has no room:
        its state.json cannot be written then, so its status is behind (see store/room.py)."""
        busy = view.queued or (view.state_doc is not None and view.state_doc["status"] in BUSY)
        return room.full(self.home.root) if busy else ""

    def waiting(self, conv: Conv, *, decided: bool = False) -> list[WaitItem]:
        """What waits for the agent (:mod:`contemplation.store.waiting`): needs to answer and
        lookups to approve, each with its stable id (``decided``: see ``look``)."""
        return self.standing(conv, decided=decided).items

    def since(self, conv: Conv, cursor: int, *, thinking: bool = False) -> Since:
        meta = plain.metadata(conv)
        # a write in flight: from its intent's offset, else from the last commit (a reply
        # whose commit also commits the message it answers is written with no intent)
        writing_at = _writing_at(plain.state(conv))
        return blocks_since(
            conv,
            cursor,
            agent_label=meta["agent_label"] if meta else "CLAUDE",
            writing_at=writing_at,
            thinking=thinking,
        )

    def last_own(self, conv: Conv) -> int:
        """Cursor of the agent's own latest block (a message or its own answer; never a
        rule's answer), searched back over a few rotated segments; 0 when there is none."""
        meta = plain.metadata(conv)
        label = meta["agent_label"] if meta else "CLAUDE"
        segs = segments(conv)
        if not segs:
            return 0
        view = self.view(conv, label)
        view.refresh()
        live = [b for b in view.live.blocks if own_block(b)]
        if live:
            return segs[-1].start + live[-1].offset
        for seg in reversed(segs[:-1][-OWN_SEGMENTS_BACK:]):
            found = None
            for b in segment_blocks(seg, label):
                found = b if own_block(b) else found
            if found is not None:
                return seg.start + found.offset
        return 0

    def settled(self, conv: Conv) -> bool:
        """The daemon is done with the conversation for now (:attr:`Standing.settled`): the
        one rule of every face (``--wait``, MCP ``wait``)."""
        return self.standing(conv).settled

    def block_at(self, conv: Conv, cursor: int) -> tuple[Block, int] | None:
        """The block a cursor points strictly inside (a page cut in the middle of a long
        block, see :func:`page`), with the cursor of its header; None at a block boundary."""
        segs = segments(conv)
        seg = next((g for g in segs if g.start <= cursor < g.end), None)
        if seg is None:
            return None
        local = cursor - seg.start
        meta = plain.metadata(conv)
        label = meta["agent_label"] if meta else "CLAUDE"
        blocks: Iterable[Block]
        if seg is segs[-1]:
            view = self.view(conv, label)
            view.refresh()
            blocks = view.live.blocks
        else:
            blocks = segment_blocks(seg, label)
        for b in blocks:
            if b.offset < local < b.end:
                return b, seg.start + b.offset
        return None

    def boundary(self, conv: Conv) -> int:
        """The cursor an action hands out (``start``, ``respond``): the end of what is
        committed, so a reply still being written when it is taken is read whole later, never
        skipped. Never past what :meth:`since` would return as its cursor at the same time."""
        segs = segments(conv)
        if not segs:
            return 0
        live = segs[-1]
        at = _writing_at(plain.state(conv))
        if at is None:
            return live.end
        return live.start + min(live.size, max(0, at))

    def locate(self, name: str) -> Conv:
        return locate(self.home, name)
