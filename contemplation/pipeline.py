"""One conversation, one readable function: :func:`process`. And the burst: :func:`process_pending`.

``process(conv)`` does whatever is due in a conversation and returns when nothing more can be
done right now, with the time it wants to be looked at again (a retry, a file still settling).
Start-up, the watcher, the periodic rescan, ``run --once`` and the tests all go through here.

A step, under the conversation's lock:
  recover a crash → adopt bytes appended by hand → honour a cancel → decide from the log:
  a model turn is due / needs wait / complete / nothing → else take the next inbox message.
A model turn streams the reply into the log while holding the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from contemplation import backends as backend_registry
from contemplation.backends.base import Backend
from contemplation.conversation import Next, next_action
from contemplation.errors import BackendError, ContemplationError, LockBusy, NotFound
from contemplation.layout import (
    Conv,
    Home,
    LogView,
    Template,
    inbox_entries,
    list_conversations,
    load_template,
    processing_entries,
)
from contemplation.models import MarkerKind, Metadata, Status, StreamEvent, Usage
from contemplation.prompts import build_request, estimate_tokens
from contemplation.scheduler import ModelScheduler
from contemplation.settings import Settings
from contemplation.writer import (
    ConvWriter,
    archive,
    claim,
    clear_cancel,
    now_iso,
    open_writer,
    reject_input,
)

log = structlog.get_logger("contemplation.pipeline")

Observer = Callable[[str, str, dict[str, Any]], None]
CANCEL_CHECK_INTERVAL = 0.2


class _Cancelled(Exception):
    """The agent asked to cancel the in-flight generation."""


@dataclass
class Runtime:
    """Everything ``process`` needs, built once by the daemon (or a test)."""

    settings: Settings
    home: Home
    backends: dict[str, Backend] = field(default_factory=dict)
    schedulers: dict[str, ModelScheduler] = field(default_factory=dict)
    fast_ready: set[Path] = field(default_factory=set)  # inbox files that arrived by rename
    observers: list[Observer] = field(default_factory=list)
    cancelled: set[str] = field(default_factory=set)
    stopping: bool = False  # set on SIGTERM: finish the current turn, take nothing new
    recovered: set[str] = field(default_factory=set)
    views: dict[str, LogView] = field(default_factory=dict)
    log_sizes: dict[str, int] = field(default_factory=dict)  # what the daemon last left in each log
    templates: dict[str, Template] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)
    clock: Callable[[], float] = time.time

    def backend(self, name: str) -> Backend:
        if name not in self.backends:
            self.backends[name] = backend_registry.build(name, self.settings)
        return self.backends[name]

    def scheduler(self, name: str) -> ModelScheduler:
        if name not in self.schedulers:
            self.schedulers[name] = ModelScheduler(
                slots=self.backend(name).concurrency, switch_after=self.settings.model_switch_after
            )
        return self.schedulers[name]

    def template(self, name: str) -> Template:
        if name not in self.templates:
            self.templates[name] = load_template(self.home, name)
        return self.templates[name]

    def view(self, conv: Conv, agent_label: str) -> LogView:
        v = self.views.get(conv.id)
        if v is None or v.conv != conv or v.agent_label != agent_label:
            v = self.views[conv.id] = LogView(conv, agent_label)
        return v

    def notify(self, conv_id: str, event: str, **data: Any) -> None:
        for obs in list(self.observers):
            try:
                obs(conv_id, event, data)
            except Exception:  # an observer must never break a turn
                log.exception("observer_failed", event=event)

    def default_metadata(self, conv: Conv) -> Metadata:
        tpl = self.template(self.settings.default_template)
        topic = (
            conv.id.split("_", 2)[-1].replace("-", " ") if conv.id.startswith("conv_") else conv.id
        )
        return Metadata(
            id=conv.id,
            topic=topic,
            created=now_iso(),
            template=tpl.name,
            backend=tpl.backend or self.settings.default_backend,
            model=tpl.model or self.settings.default_model,
            options=dict(tpl.options),
            think=tpl.think,
        )

    async def aclose(self) -> None:
        backends, self.backends = list(self.backends.values()), {}
        for b in backends:
            with contextlib.suppress(Exception):
                await b.aclose()


# --------------------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class _Turn:
    meta: Metadata


@dataclass(frozen=True, slots=True)
class _Wait:
    at: float | None  # wall-clock time to look again; None: only on a new event


_AGAIN = object()  # a message was taken in; decide again


def _backoff(rt: Runtime, attempt: int, retry_after: float | None) -> float:
    r = rt.settings.retry
    ceiling = min(r.cap, r.base * (2 ** max(0, attempt - 1)))
    delay = rt.rng.uniform(ceiling / 2, ceiling)  # "equal jitter": never hammer, never stall
    if retry_after is not None:
        delay = max(delay, min(retry_after, r.cap))
    return delay


def _set_status(w: ConvWriter, status: Status, needs: tuple[str, ...] = ()) -> None:
    if w.state.status != status or list(needs) != w.state.pending_needs:
        w.state.status = status
        w.state.pending_needs = list(needs)
        w.save(durable=False)


def _read_message(path: Path, rt: Runtime) -> tuple[str | None, str]:
    """The text of a claimed file, or None and why it cannot be a message."""
    size = path.stat().st_size
    limit = rt.settings.max_message_bytes
    if size > limit:
        return None, f"{size} bytes is larger than max_message_bytes ({limit})"
    data = path.read_bytes()
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


def _settled(mtime_ns: int, now: float, window: float) -> bool:
    return now - mtime_ns / 1e9 >= window


def _step(conv: Conv, rt: Runtime) -> _Turn | _Wait | object:
    """One decision under the lock (see the module docstring)."""
    s = rt.settings
    now = rt.clock()
    with open_writer(
        conv, durable=s.durability == "fsync", default_meta=rt.default_metadata(conv), wait=False
    ) as w:
        if conv.id not in rt.recovered:
            for what in w.recover():
                log.warning("recovered", conv=conv.id, what=what)
            rt.recovered.add(conv.id)
        # 1. bytes appended by hand: adopt them once they have settled
        foreign = w.check_identity()
        if foreign > 0:
            st = os.stat(conv.log)
            window = 2 * s.settle_seconds
            if not _settled(st.st_mtime_ns, now, window):
                return _Wait(st.st_mtime_ns / 1e9 + window)
            w.adopt_foreign()
            log.info("adopted_append", conv=conv.id, bytes=foreign)
        for warning in w.warnings:
            log.warning("log_warning", conv=conv.id, warning=warning)
        w.warnings.clear()
        view = rt.view(conv, w.meta.agent_label)
        parsed = view.refresh()
        if list(parsed.errors[:20]) != w.state.parse_errors:
            w.state.parse_errors = list(parsed.errors[:20])
            w.save()
        nxt: Next = next_action(parsed.blocks)
        cancel_flag = (conv.dir / ".cancel").exists()
        if cancel_flag:
            clear_cancel(conv)
            if nxt.action == "turn":
                w.append_marker(MarkerKind.CANCELLED, "the turn was cancelled by the agent")
                _set_status(w, Status.CANCELLED)
                rt.notify(conv.id, "cancelled")
                return _AGAIN
        # 2. a model turn is due
        if nxt.action == "turn":
            retry_at = w.state.next_retry_at
            if retry_at is not None and retry_at > now:
                _set_status(w, Status.RETRYING)
                return _Wait(retry_at)
            return _Turn(w.meta)
        if nxt.action == "complete":
            _set_status(w, Status.COMPLETE)
            if w.meta.archive_on_complete and s.archive_on_complete:
                dest = archive(rt.home, conv)
                rt.notify(conv.id, "archived", path=str(dest.dir))
                log.info("archived", conv=conv.id)
                return _Wait(None)
        # 3. the next message: claimed ones first (recovery), then the inbox in arrival order
        wake: float | None = None
        for claimed in processing_entries(conv):
            return _take(w, rt, claimed)
        for entry in inbox_entries(conv):
            if entry.path in rt.fast_ready or _settled(entry.mtime_ns, now, s.settle_seconds):
                rt.fast_ready.discard(entry.path)
                claimed_path = claim(conv, entry.path)
                if claimed_path is None:
                    continue
                return _take(w, rt, claimed_path)
            at = entry.mtime_ns / 1e9 + s.settle_seconds
            wake = at if wake is None else min(wake, at)
        # 4. nothing to do: make the status say why
        if nxt.action == "needs":
            _set_status(w, Status.AWAITING_AGENT, nxt.needs)
        elif nxt.action == "stopped":
            _set_status(w, Status.CANCELLED if nxt.reason == "cancelled" else Status.ERROR)
        elif nxt.action == "idle" and w.state.status not in {Status.COMPLETE}:
            _set_status(w, Status.IDLE if parsed.blocks else Status.PENDING)
        return _Wait(wake)


def _take(w: ConvWriter, rt: Runtime, claimed: Path) -> object:
    """Append a claimed message as an agent block, exactly once, then drop the claim."""
    try:
        text, note = _read_message(claimed, rt)
    except FileNotFoundError:
        return _AGAIN
    if text is None:
        dest = reject_input(w.conv, claimed, note)
        w.append_marker(
            MarkerKind.NOTE,
            f"message {claimed.name} was not taken: {note}; kept in failed/{dest.name}",
        )
        rt.notify(w.conv.id, "rejected", reason=note)
        return _AGAIN
    if note:
        w.warn(f"{claimed.name}: {note}")
    w.append_block(w.meta.agent_label, w.meta.sender_label(), text, msg_id=claimed.name)
    claimed.unlink(missing_ok=True)
    rt.notify(w.conv.id, "message", text=text)
    return _AGAIN


# --------------------------------------------------------------------------- the model turn


async def _lock(conv: Conv, rt: Runtime, meta: Metadata) -> tuple[contextlib.ExitStack, ConvWriter]:
    """Take the conversation's lock without blocking the event loop."""
    while True:
        stack = contextlib.ExitStack()
        try:
            w = stack.enter_context(
                open_writer(
                    conv, durable=rt.settings.durability == "fsync", default_meta=meta, wait=False
                )
            )
        except LockBusy:
            stack.close()
            await asyncio.sleep(0.1)
            continue
        return stack, w


async def _turn(conv: Conv, rt: Runtime, meta: Metadata) -> _Wait | object:
    backend = rt.backend(meta.backend)
    sched = rt.scheduler(meta.backend)
    async with sched.slot(meta.model):
        stack, w = await _lock(conv, rt, meta)
        with stack:
            return await _stream_turn(conv, rt, w, backend)


async def _stream_turn(conv: Conv, rt: Runtime, w: ConvWriter, backend: Backend) -> _Wait | object:
    meta = w.meta
    parsed = rt.view(conv, meta.agent_label).refresh()
    if next_action(parsed.blocks).action != "turn":
        return _AGAIN
    tpl = rt.template(meta.template) if meta.template else None
    request = build_request(meta, parsed.blocks, template_prompt=tpl.system_prompt if tpl else "")
    _set_status(w, Status.GENERATING)
    rt.notify(conv.id, "generating", model=meta.model)
    reply = w.reply(meta.sender_label(), meta.agent_label, f"reply-{w.state.log.size}")
    usage: Usage | None = None
    limit = rt.settings.max_reply_bytes
    truncated = False
    next_check = time.monotonic() + CANCEL_CHECK_INTERVAL
    cancel_path = conv.dir / ".cancel"
    try:
        stream = backend.stream(request)
        try:
            async for ev in stream:
                usage = _apply(ev, reply, rt, conv.id) or usage
                if reply.bytes_written > limit:
                    truncated = True
                    break
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + CANCEL_CHECK_INTERVAL
                    if cancel_path.exists():
                        raise _Cancelled
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
    except _Cancelled:
        return _cancelled(conv, rt, w, reply)
    except asyncio.CancelledError:
        if conv.id in rt.cancelled:
            rt.cancelled.discard(conv.id)
            return _cancelled(conv, rt, w, reply)
        reply.abort(
            MarkerKind.INTERRUPTED, "the daemon stopped during this reply; it will be redone"
        )
        _set_status(w, Status.PENDING)
        raise
    except BackendError as exc:
        return _failed(conv, rt, w, reply, exc)
    markers: list[tuple[MarkerKind, str]] = []
    if truncated:
        markers.append(
            (MarkerKind.WARNING, f"the reply was cut at {limit} bytes (max_reply_bytes)")
        )
    if usage is not None:
        warning = _context_warning(usage, estimate_tokens(request))
        if warning:
            usage.context_full = True
            markers.append((MarkerKind.WARNING, warning))
    reply.finish(markers=markers, usage=usage)
    rt.notify(conv.id, "reply", usage=usage.model_dump() if usage else None)
    return _AGAIN


def _apply(ev: StreamEvent, reply: Any, rt: Runtime, conv_id: str) -> Usage | None:
    if ev.kind == "content":
        reply.content(ev.text)
        rt.notify(conv_id, "token", text=ev.text)
    elif ev.kind == "thinking":
        reply.thinking(ev.text)
        rt.notify(conv_id, "thinking", text=ev.text)
    elif ev.kind == "note":
        reply.note(ev.text)
        rt.notify(conv_id, "note", text=ev.text)
    elif ev.kind == "done":
        return ev.usage
    return None


def _context_warning(usage: Usage, estimate: int) -> str:
    window = usage.context_window
    if not window:
        return ""
    used = usage.prompt_eval_count or 0
    if used >= 0.98 * window or estimate > window:
        return (
            f"the prompt (~{max(used, estimate)} tokens) filled the context window ({window}); "
            "the server may have dropped the oldest messages — raise num_ctx or start a new "
            "conversation"
        )
    return ""


def _cancelled(conv: Conv, rt: Runtime, w: ConvWriter, reply: Any) -> object:
    clear_cancel(conv)
    if reply.started:
        reply.abort(MarkerKind.CANCELLED, "generation stopped by the agent")
    else:
        w.append_marker(MarkerKind.CANCELLED, "the turn was cancelled by the agent")
    _set_status(w, Status.CANCELLED)
    rt.notify(conv.id, "cancelled")
    return _AGAIN


def _failed(
    conv: Conv, rt: Runtime, w: ConvWriter, reply: Any, exc: BackendError
) -> _Wait | object:
    attempt = w.state.retry_count + 1
    transient = exc.transient and attempt < rt.settings.retry.max_attempts
    if transient:
        delay = _backoff(rt, attempt, exc.retry_after)
        if reply.started:
            reply.abort(MarkerKind.INTERRUPTED, f"{exc}; retrying in {delay:.0f} s")
        w.state.retry_count = attempt
        w.state.next_retry_at = rt.clock() + delay
        w.record_error(exc.kind, str(exc), status=Status.RETRYING)
        log.warning(
            "turn_retry", conv=conv.id, error=str(exc), attempt=attempt, delay=round(delay, 2)
        )
        rt.notify(conv.id, "retrying", error=str(exc), attempt=attempt, delay=delay)
        return _Wait(w.state.next_retry_at)
    message = str(exc) if exc.transient is False else f"{exc} (gave up after {attempt} attempts)"
    if reply.started:
        reply.abort(MarkerKind.ERROR, message)
    else:
        w.append_marker(MarkerKind.ERROR, message)
    w.state.retry_count = 0
    w.state.next_retry_at = None
    w.record_error(exc.kind, message, status=Status.ERROR)
    log.error("turn_failed", conv=conv.id, error=message)
    rt.notify(conv.id, "error", error=message)
    return _Wait(None)


# --------------------------------------------------------------------------- entry points

MAX_STEPS = 10_000


def _remember_size(conv: Conv, rt: Runtime) -> None:
    try:
        rt.log_sizes[conv.id] = conv.log.stat().st_size
    except OSError:
        rt.log_sizes.pop(conv.id, None)


async def process(conv: Conv, rt: Runtime) -> float | None:
    """Do what is due in one conversation. Returns when to look again (None: on an event)."""
    for _ in range(MAX_STEPS):
        if rt.stopping or not conv.dir.is_dir():
            return None
        try:
            decision = _step(conv, rt)
        except LockBusy:
            return rt.clock() + 0.2
        except NotFound:
            return None
        _remember_size(conv, rt)
        if decision is _AGAIN:
            continue
        if isinstance(decision, _Turn):
            outcome = await _turn(conv, rt, decision.meta)
            _remember_size(conv, rt)
            if outcome is _AGAIN:
                continue
            assert isinstance(outcome, _Wait)
            return outcome.at
        assert isinstance(decision, _Wait)
        return decision.at
    return rt.clock() + 1.0


async def process_safely(conv: Conv, rt: Runtime) -> float | None:
    """:func:`process` for the daemon: one broken conversation never stops the others."""
    try:
        return await process(conv, rt)
    except asyncio.CancelledError:
        raise
    except (ContemplationError, OSError) as exc:
        log.error(  # noqa: TRY400 - an expected failure: one line, no traceback
            "conversation_failed", conv=conv.id, error=f"{type(exc).__name__}: {exc}"
        )
        return rt.clock() + rt.settings.rescan_interval
    except Exception:
        log.exception("conversation_crashed", conv=conv.id)
        return rt.clock() + rt.settings.rescan_interval


async def process_pending(rt: Runtime, *, parallel: int = 256) -> dict[str, float | None]:
    """The burst: handle whatever is waiting in every active conversation, then return."""
    convs = list_conversations(rt.home)
    gate = asyncio.Semaphore(parallel)
    results: dict[str, float | None] = {}

    async def one(c: Conv) -> None:
        async with gate:
            results[c.id] = await process_safely(c, rt)

    await asyncio.gather(*(one(c) for c in convs))
    return results
