"""The MCP tools' bodies, kept apart from the SDK so they are plain functions to test: where
a conversation stands, the blocks since a cursor in pages that fit a budget, waiting with
progress, a page of the list, the models. Everything here reads the folder
(:mod:`contemplation.faces.reading`); the tools that change it go through
:mod:`contemplation.faces.actions`. No import of the MCP SDK."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import anyio

from contemplation.errors import ContemplationError, InputRejected
from contemplation.faces.reading import Reader, Since, block_dict, own, segments
from contemplation.index import listing
from contemplation.models import BUSY, Status
from contemplation.protocol import escalation, ledger, paging
from contemplation.settings import Settings
from contemplation.store import attachments
from contemplation.store.attachments import Attachment
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.waiting import WaitItem
from contemplation.writer import daemon_alive

if TYPE_CHECKING:
    from contemplation.needs.router import NeedRouter

MODELS_SHOWN = 50  # model names per backend in conversation_models
MODELS_WAIT = 10.0  # seconds conversation_models waits for the backends in all
LIST_DEFAULT = 20  # conversations in one page of conversation_list
LIST_CAP = 200
WAIT_DEFAULT = 45.0
WAIT_CAP = 50.0  # well under Claude Desktop's 60 s cut of a tool call
POLL = 0.1
PROGRESS_EVERY = 5.0  # seconds between two progress notifications of conversation_wait


@dataclass(frozen=True, slots=True)
class Limits:
    """What bounds the MCP faces (tests and embedders pass smaller figures)."""

    wait_cap: float = WAIT_CAP  # conversation_wait's longest wait
    progress_every: float = PROGRESS_EVERY  # between two progress notifications
    max_subscriptions: int = 64  # per session (resources/subscribe) and per listen stream
    max_watched: int = 256  # resources watched at once, over all sessions
    max_listen_streams: int = 32  # open subscriptions/listen streams
    resources_page: int = 50  # conversations a resources/list page lists (two resources each)


LIST_FILTERS = ("active", "all", "archived", *(s.value for s in Status))
EMPTY_HINT = "The conversation is empty: send the first message with conversation_respond."

Progress = Callable[[float, float, str], Awaitable[None]]
P = ParamSpec("P")
R = TypeVar("R")


def _json(obj: Any) -> str:
    """The one encoding of a tool result: compact, and non-ASCII text kept as it is."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _locked(fn: Callable[Concatenate[Faces, P], R]) -> Callable[Concatenate[Faces, P], R]:
    def inner(self: Faces, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.lock:
            return fn(self, *args, **kwargs)

    return inner


def _own(block: dict[str, Any]) -> bool:
    """A block the agent wrote (see :func:`contemplation.faces.reading.own`)."""
    return own(str(block.get("kind")), "response_to" in block, str(block.get("text", "")))


def _log_size(conv: Conv) -> int:
    segs = segments(conv)
    return segs[-1].end if segs else 0


class Faces:
    """The tool bodies, kept apart from the SDK so they are plain, testable functions."""

    def __init__(self, settings: Settings, limits: Limits | None = None) -> None:
        self.settings = settings
        self.limits = limits or Limits()
        self.home = Home(settings.home)
        self.reader = Reader(self.home)
        self.lock = threading.RLock()  # sync tools run in worker threads; the caches are shared
        self._router: NeedRouter | None = None  # judges attachments; made on first use

    # -- helpers ------------------------------------------------------------------------

    def _hint(
        self,
        conv: Conv,
        status: str,
        waiting: list[WaitItem],
        alive: bool,
        empty: bool,
        *,
        panel: bool = False,
    ) -> str:
        if conv.is_completed:
            return "This conversation is archived: conversation_reopen brings it back to continue."
        down = (
            f"No contemplation daemon is running on {self.home.root}: messages stay queued "
            "until one starts (`contemplation run`, or `contemplation service install`)."
        )
        if waiting:
            asks = sum(1 for i in waiting if i.kind == "approval")
            parts = []
            if asks:
                parts.append(
                    f"decide about {asks} lookup(s) with conversation_approve (their answers "
                    "come from the tool, never from your text)"
                )
            if len(waiting) > asks:
                parts.append(f"answer {len(waiting) - asks} need(s) with conversation_respond")
            said = "The model waits for you: " + "; ".join(parts) + ". Each item says how."
            return said if alive else f"{said} {down}"
        if not alive:
            return down
        if empty:
            return EMPTY_HINT
        if status in {s.value for s in BUSY}:
            return "The model is working: conversation_wait returns when it replies."
        if status == Status.ERROR.value and panel:  # a seat failed: the others' answers stand
            return (
                "A seat of the panel failed (its ERROR says why; the other seats' answers "
                "stand): conversation_respond with retract=true withdraws its failed turn and "
                f"sends your message; `contemplation set-model {conv.id} MODEL --seat LABEL` "
                "moves that seat to another model."
            )
        if status == Status.ERROR.value:
            return (
                "The last turn failed (its ERROR says why): conversation_respond with "
                "retract=true withdraws it and sends your message instead; model= picks "
                "another model."
            )
        return ""

    def _since(self, conv: Conv, cursor: int) -> Since:
        """Blocks after ``cursor``; a cursor past the end gets nothing and the real end."""
        total = _log_size(conv)
        if cursor > total:
            return Since([], total, total)
        return self.reader.since(conv, cursor)

    @_locked
    def snapshot(self, conv: Conv, *, written: int | None = None) -> dict[str, Any]:
        """Where a conversation stands (what ``check`` says besides the blocks, and what the
        status resource holds). ``written``: characters of a reply being streamed, if known.
        The status, the activity and what waits come from one reading (``Reader.standing``)."""
        view = self.reader.standing(conv)
        meta, state, items, queued = view.meta, view.state, view.items, view.queued
        status = state.status.value if state else Status.PENDING.value
        if self.reader.disk_full(view):  # its state.json cannot say so
            status = Status.RETRYING.value
        alive = daemon_alive(self.home)
        model = meta.model if meta else ""
        if meta is not None and meta.panel:  # its seats answer, not its first model alone
            model = "panel: " + ", ".join(f"{s.label} ({s.model})" for s in meta.seats())
        out: dict[str, Any] = {
            "conversation_id": conv.id,
            "topic": meta.topic if meta else "",
            "status": status,
            "activity": self.reader.activity(conv, view, written=written),
            "archived": conv.is_completed,
            "model": model,
            **(
                {"panel": [s.model_dump(mode="json") for s in meta.seats()]}
                if meta and meta.panel
                else {}
            ),
            "waiting": [i.as_dict(conv.id, "mcp") for i in items],
            "queued_messages": queued,
            "last_error": state.last_error.model_dump() if state and state.last_error else None,
            "daemon_alive": alive,
        }
        if state is not None and state.reply_cut is not None:  # the last reply is not whole
            out["reply_cut"] = state.reply_cut.model_dump()
        if state is not None and state.ledger.by:  # where its tokens and time went
            out["ledger"] = ledger.total(state.ledger).model_dump()
        if state is not None and (rung := escalation.last_rung(state.ladder)):
            out["rung"] = rung  # the escalation ladder: which rung answered, or where it went
            out["ladder"] = state.ladder.model_dump() if state.ladder else None
        empty = queued == 0 and _log_size(conv) == 0
        hint = self._hint(conv, status, items, alive, empty, panel=bool(meta and meta.panel))
        if not hint and "reply_cut" in out and status == Status.IDLE.value:
            hint = (
                "The last reply was stopped before its end (reply_cut says why): "
                "conversation_continue has the model go on where it stopped; "
                "conversation_respond steers it instead."
            )
        if hint:
            out["hint"] = hint
        return out

    @_locked
    def check(
        self,
        conversation_id: str,
        since: int | None = None,
        *,
        include_own: bool = False,
        max_bytes: int = paging.PAGE_BYTES,
    ) -> dict[str, Any]:
        """The snapshot and the blocks after ``since`` (None: after the agent's own last
        message, so a reply and the rules' answers to its needs are never skipped), at most
        ``max_bytes`` of them: a page cut short says so and its cursor continues at the cut."""
        conv = self.reader.locate(conversation_id)
        start = self.last_exchange(conv) if since is None else since

        def keep(b: dict[str, Any]) -> bool:
            return include_own or not _own(b)

        offered: list[tuple[dict[str, Any], int]] = []
        inside = self.reader.block_at(conv, start) if start > 0 else None
        # a cursor from a page cut inside this block: header + 1 + bytes of text shown (a
        # cursor past all its text is the end of the log as it was, before a separator)
        if inside is not None and start - inside[1] - 1 < len(inside[0].text.encode()):
            block, at = inside
            whole = block_dict(block, at)
            if keep(whole):
                before = start - at - 1
                offered.append((paging.continuation(whole, before), before))
            start = at + (block.end - block.offset)
        got = self._since(conv, start)
        offered.extend((b, 0) for b in got.blocks)
        budget = min(max(int(max_bytes), paging.PAGE_FLOOR), paging.PAGE_CAP)
        page = paging.fit(offered, budget, keep=lambda b: True if b.get("continues") else keep(b))
        partial = got.partial
        written = len(str(partial.get("text", ""))) if partial is not None else None
        out = self.snapshot(conv, written=written)
        out["blocks"] = page.blocks
        out["cursor"] = got.cursor if page.cursor is None else page.cursor
        if page.cut is not None:
            out["cut"] = page.cut | {"next": _read_on(conv.id, out["cursor"], include_own)}
        elif partial is not None and keep(partial):
            room = budget - paging.size(page.blocks)
            room_tokens = paging.PAGE_TOKENS - paging.tokens(page.blocks)
            text = str(partial.get("text", ""))
            if paging.size(partial) > room or paging.tokens(partial) > room_tokens:
                head = paging.cut_text(text, max(room, 256), max(room_tokens, 128))
                partial = partial | {"text": head, "cut": True}  # a long reply streaming
            out["in_progress"] = partial
        return out

    @_locked
    def status_text(self, conv: Conv) -> str:
        """The status resource: :meth:`snapshot` as compact JSON, with ``turns`` (finished)
        and ``cursor`` (the log's end). Both only grow, so every change of the conversation
        changes the text, and a subscriber is told, even when the status word is the same
        before and after (a whole turn between two looks of the poller)."""
        state = read_state(conv)
        grows = {"turns": state.turns if state else 0, "cursor": _log_size(conv)}
        return _json(self.snapshot(conv) | grows)

    @_locked
    def settled(self, conv: Conv) -> bool:
        return self.reader.settled(conv)

    async def models(self) -> dict[str, Any]:
        """Backends with their model names (bounded: MODELS_SHOWN each, MODELS_WAIT in all),
        the defaults and the templates: what conversation_start can name."""
        from contemplation.backends import catalog
        from contemplation.store.templates import load_template, template_dirs

        s = self.settings
        with anyio.move_on_after(MODELS_WAIT) as scope:
            listing = await catalog.list_all(s, catalog.configured(s, ()))
        out: dict[str, Any] = {
            "default_backend": s.default_backend,
            "default_model": s.default_model,
        }
        if scope.cancelled_caught:
            out["backends"] = [{"error": f"the backends did not answer within {MODELS_WAIT:g} s"}]
        else:
            out["backends"] = [_backend_row(e) for e in listing]
        templates = []
        for name in template_dirs(self.home):
            try:
                tpl = load_template(self.home, name)
            except ContemplationError as exc:
                templates.append({"name": name, "error": str(exc)})
                continue
            templates.append({"name": name, "description": tpl.description})
        out["templates"] = templates
        return out

    @_locked
    def attached(self, paths: Sequence[str], template: str | None) -> tuple[Attachment, ...]:
        """The files the agent names for a message to a conversation of ``template``, each
        judged first exactly as a NEED reading it is (:meth:`NeedRouter.judge_file`:
        ``[permissions]``, ``tools.allowed_roots`` and the secrets), then read and checked as
        any attachment. A refused one is one line naming it; nothing is read before."""
        if not paths:
            return ()
        if self._router is None:  # imported here: the router's MCP tools import the SDK
            from contemplation.needs.router import NeedRouter

            self._router = NeedRouter(self.settings)
        found: list[tuple[Path, str]] = []
        for path in paths:
            try:
                found.append((self._router.judge_file(path, template=template), Path(path).name))
            except ContemplationError as exc:  # the agent is told the setting too: its person's
                hint = getattr(exc, "hint", "")
                why = f"{exc} ({hint})" if hint else str(exc)
                raise InputRejected(f"cannot attach {path}: {why}") from exc
        limits = self.settings.attachments
        return attachments.checked(
            tuple(attachments.read_file(real, limits, name) for real, name in found), limits
        )

    @_locked
    def last_exchange(self, conv: Conv) -> int:
        """Cursor of the agent's own latest block (what "new" means when no cursor is given):
        the model's replies and the rules' answers after it are all new."""
        return self.reader.last_own(conv)

    @_locked
    def replied_since(self, conv: Conv, since: int) -> bool:
        got = self._since(conv, since)
        return any(b.get("kind") == "model" for b in got.blocks)

    async def wait(
        self,
        conversation_id: str,
        since: int | None = None,
        timeout_s: float = WAIT_DEFAULT,
        *,
        include_own: bool = False,
        progress: Progress | None = None,
        max_bytes: int = paging.PAGE_BYTES,
    ) -> dict[str, Any]:
        """Until the model has replied (after ``since``) or the conversation is settled, or
        the time is up; ``progress`` is told what is happening every ``progress_every`` s
        (MCP progress notifications: a client shows them, and its idle clock starts again)."""
        budget = min(max(float(timeout_s), 0.0), self.limits.wait_cap)
        start = time.monotonic()
        deadline = start + budget
        conv = self.reader.locate(conversation_id)
        if since is not None:  # past the end: nothing is there yet, so new is what comes next
            since = min(since, _log_size(conv))
        timed_out = False
        told = start
        while True:
            if not conv.dir.is_dir():  # archived meanwhile
                conv = self.reader.locate(conv.id)
            if self.settled(conv) or (since is not None and self.replied_since(conv, since)):
                break
            if not daemon_alive(self.home):
                break
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if progress is not None and now - told >= self.limits.progress_every:
                told = now
                line = self.check(conv.id, since).get("activity", "")
                await progress(now - start, budget, str(line))
            await anyio.sleep(POLL)
        cursor = since if since is not None else self.last_exchange(conv)
        out = self.check(conv.id, cursor, include_own=include_own, max_bytes=max_bytes)
        out["timed_out"] = timed_out
        if timed_out:
            out["hint"] = (
                f"Still running ({out.get('activity', out['status'])}): call conversation_wait "
                "again with the returned cursor."
            )
        return out

    @_locked
    def list(
        self,
        status: str | None = None,
        *,
        limit: int = LIST_DEFAULT,
        cursor: str | None = None,
        model: str | None = None,
        query: str | None = None,
    ) -> dict[str, Any]:
        """One page of conversations, newest activity first: only what an agent needs to pick
        one, how many match, and an opaque cursor for the next page (keyset on activity and
        id, so rows that change between calls are neither repeated nor skipped)."""
        want = (status or "active").strip().lower()
        want = "archived" if want == "completed" else want
        if want not in LIST_FILTERS:
            raise InputRejected(
                f"unknown status filter {status!r}; use one of: {', '.join(LIST_FILTERS)}"
            )
        scope = {"archived": "archived", "all": "all", "complete": "all"}.get(want, "active")
        q = listing.Query(
            scope=scope,
            status="" if want in {"active", "all", "archived"} else want,
            model=model or "",
            topic=query or "",
        )
        got = listing.page(self.home, q, min(max(int(limit), 1), LIST_CAP), cursor)
        return got.as_dict([self._row(r) for r in got.rows])

    def _row(self, r: dict[str, Any]) -> dict[str, Any]:
        row = {k: r[k] for k in ("id", "topic", "status", "model", "last_activity")}
        if r["completed"]:
            row["archived"] = True
        if r["status"] in {Status.AWAITING_AGENT.value, Status.AWAITING_APPROVAL.value}:
            items = self.reader.waiting(self.reader.locate(r["id"]))
            asks = sum(1 for i in items if i.kind == "approval")
            row["waits_for"] = {"needs": len(items) - asks, "lookups": asks}
        return row


def _read_on(conv_id: str, cursor: int, include_own: bool) -> str:
    """What a page cut short says to do next, whichever tool's result it is (a task's of
    conversation_start, where "call again" started another conversation): the one tool that
    reads on from a cursor at once, with the conversation and the cursor written out."""
    own = " and include_own=true" if include_own else ""
    return (
        f'more follows: call conversation_check with conversation_id="{conv_id}" and '
        f"cursor={cursor}{own}; call again with each cursor it returns until a result has no cut"
    )


def _backend_row(entry: dict[str, Any]) -> dict[str, Any]:
    if not entry["ok"]:
        return {"backend": entry["backend"], "error": entry["error"]}
    names = [m["name"] for m in entry.get("models", [])]
    more = len(names) - MODELS_SHOWN + int(entry.get("more") or 0)
    row: dict[str, Any] = {"backend": entry["backend"], "models": names[:MODELS_SHOWN]}
    return row | {"more": more} if more > 0 else row
