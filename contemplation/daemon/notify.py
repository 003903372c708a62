"""Notifications: run the configured commands when something needs a person's attention.

``[[notifications]]`` rules name events and an argv list::

    [[notifications]]
    on = ["need", "complete", "error"]
    command = ["notify-send", "contemplation"]

Events: ``reply`` (a model reply arrived), ``need`` (the model waits for the agent's answer),
``complete`` (the conversation reached ``=== COMPLETE ===``), ``error`` (a turn failed for
good). The command gets the event as environment variables (``CONTEMPLATION_EVENT``,
``CONTEMPLATION_CONVERSATION``, ``CONTEMPLATION_TOPIC``, ``CONTEMPLATION_STATUS``,
``CONTEMPLATION_PATH``) and as one JSON object on stdin, which alone carries model text
(needs, an excerpt of the reply, the error). It is run without a shell and never with model
text on its command line. Commands run one at a time, each with a timeout; a failing command
is logged and never affects a conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from contemplation.models import BlockKind, ConvEvent, Status
from contemplation.settings import NotificationRule
from contemplation.store.cursors import blocks_since, segments
from contemplation.store.layout import Conv, Home, read_metadata, read_state

if TYPE_CHECKING:
    from contemplation.engine.runtime import Runtime

log = structlog.get_logger("contemplation.notify")

EXCERPT_CHARS = 2000
WATCHED = {  # events that can notify
    ConvEvent.REPLY,
    ConvEvent.ERROR,
    ConvEvent.AWAITING_AGENT,
    ConvEvent.AWAITING_APPROVAL,
}
QUEUE_SIZE = 1000
OUTPUT_KEPT = 500


@dataclass(frozen=True, slots=True)
class Event:
    name: str  # reply | need | complete | error
    conv_id: str
    payload: dict[str, Any]


def _find(home: Home, conv_id: str) -> Conv | None:
    for completed in (False, True):
        conv = home.conv(conv_id, completed=completed)
        if conv.dir.is_dir():
            return conv
    return None


def _last_model_block(conv: Conv, agent_label: str) -> dict[str, Any] | None:
    """The last model block, read from the start of the live log only (cheap)."""
    live = segments(conv)[-1]
    got = blocks_since(conv, live.start, agent_label=agent_label)
    models = [b for b in got.blocks if b.get("kind") == BlockKind.MODEL.value]
    return models[-1] if models else None


def derive(home: Home, conv_id: str, event: str, data: dict[str, Any]) -> list[Event]:
    """Pipeline events → notification events (reading the folder for what they imply)."""
    if event not in WATCHED:
        return []
    conv = _find(home, conv_id)
    if conv is None:
        return []
    meta = read_metadata(conv)
    state = read_state(conv)
    base: dict[str, Any] = {
        "conversation": conv_id,
        "topic": meta.topic if meta else "",
        "model": meta.model if meta else "",
        "status": state.status.value if state else "",
        "path": str(conv.dir),
    }
    if event == ConvEvent.ERROR:
        return [Event("error", conv_id, base | {"error": str(data.get("error", ""))})]
    block = _last_model_block(conv, meta.agent_label if meta else "CLAUDE")
    out: list[Event] = []
    if event == ConvEvent.REPLY and block is not None:
        excerpt = block["text"][:EXCERPT_CHARS]
        out.append(Event("reply", conv_id, base | {"reply": excerpt, "usage": data.get("usage")}))
        if block.get("complete"):
            out.append(Event("complete", conv_id, base | {"reply": excerpt}))
    needs = [str(n) for n in data.get("needs") or []] if event == ConvEvent.AWAITING_AGENT else []
    if event == ConvEvent.AWAITING_APPROVAL:  # the agent must act: a need event, as for a NEED
        needs = [str(r.get("need", "")) for r in data.get("requests") or []]
    if not needs and state is not None and state.status is Status.AWAITING_AGENT:
        needs = list(state.pending_needs)  # set right after the reply, with no event of its own
    if needs:
        out.append(Event("need", conv_id, base | {"needs": needs}))
    return out


def environment(ev: Event) -> dict[str, str]:
    """What a command sees: the parent's environment plus fields that are never model text."""
    p = ev.payload
    return dict(os.environ) | {
        "CONTEMPLATION_EVENT": ev.name,
        "CONTEMPLATION_CONVERSATION": ev.conv_id,
        "CONTEMPLATION_TOPIC": str(p.get("topic", "")),
        "CONTEMPLATION_STATUS": str(p.get("status", "")),
        "CONTEMPLATION_PATH": str(p.get("path", "")),
    }


async def run_command(rule: NotificationRule, ev: Event) -> int | None:
    """Run one rule's command for one event; returns its exit code (None: timed out)."""
    stdin = json.dumps({"event": ev.name, **ev.payload}, ensure_ascii=False).encode() + b"\n"
    try:
        proc = await asyncio.create_subprocess_exec(
            *rule.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=environment(ev),
            start_new_session=True,
        )
    except OSError as exc:
        log.error("notification_failed", command=rule.command[0], error=str(exc))  # noqa: TRY400
        return -1
    try:
        out, _ = await asyncio.wait_for(proc.communicate(stdin), timeout=rule.timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        log.warning("notification_timeout", command=rule.command[0], timeout=rule.timeout)
        return None
    if proc.returncode:
        log.warning(
            "notification_exit",
            command=rule.command[0],
            code=proc.returncode,
            output=out[:OUTPUT_KEPT].decode(errors="replace"),
        )
    return proc.returncode


class Notifier:
    def __init__(self, home: Home, rules: list[NotificationRule]) -> None:
        self.home = home
        self.rules = rules
        self.queue: asyncio.Queue[tuple[str, str, dict[str, Any]]] = asyncio.Queue(QUEUE_SIZE)
        self.sent: dict[str, tuple[str, ...]] = {}  # conversation → needs already announced

    def observe(self, conv_id: str, event: str, data: dict[str, Any]) -> None:
        """Observer (runs inside the pipeline): only queues, never blocks."""
        if event in WATCHED:
            with contextlib.suppress(asyncio.QueueFull):
                self.queue.put_nowait((conv_id, event, dict(data)))

    async def handle(self, conv_id: str, event: str, data: dict[str, Any]) -> None:
        try:
            events = await asyncio.to_thread(derive, self.home, conv_id, event, data)
        except Exception:
            log.exception("notification_derive_failed", conv=conv_id, event=event)
            return
        for ev in events:
            if ev.name == "need":
                key = tuple(ev.payload.get("needs", []))
                if self.sent.get(conv_id) == key:
                    continue  # already announced these needs
                self.sent[conv_id] = key
            for rule in self.rules:
                if ev.name in rule.on:
                    await run_command(rule, ev)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            getter = asyncio.ensure_future(self.queue.get())
            stopping = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait({getter, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if getter not in done:
                getter.cancel()
                return
            await self.handle(*getter.result())


async def run_notifications(rt: Runtime, stop: asyncio.Event) -> None:
    """Extra for :func:`contemplation.daemon.root.serve`."""
    notifier = Notifier(rt.home, list(rt.settings.notifications))
    with rt.observing(notifier.observe):
        await notifier.run(stop)
