"""What the faces (MCP server, dashboard) may change: start, send, respond, archive.

Each action validates its input, then writes into the conversation folder through
:mod:`contemplation.writer` only. None of them waits for the model: the daemon (if one runs)
picks the files up; without one they stay queued.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from contemplation import backends
from contemplation.errors import ContemplationError, InputRejected, LockBusy
from contemplation.layout import (
    Conv,
    Home,
    inbox_entries,
    load_template,
    processing_entries,
    read_metadata,
    read_state,
)
from contemplation.models import Status
from contemplation.reading import Reader
from contemplation.settings import Settings
from contemplation.writer import (
    archive,
    conv_lock,
    drop_message,
    ensure_home,
    faces_lock,
    idempotent_create,
    new_conversation,
    request_cancel,
)

KEY_TTL = 24 * 3600.0  # a client-supplied idempotency key is remembered this long
SAME_ARGS_WINDOW = 120.0  # identical start calls within this window are one conversation
INITIAL_NAME = "0000-initial.msg"


def _check_text(text: str, settings: Settings, what: str = "the message") -> None:
    if not text.strip():
        raise InputRejected(f"{what} is empty")
    size = len(text.encode("utf-8"))
    if size > settings.max_message_bytes:
        raise InputRejected(
            f"{what} is {size} bytes; the limit is {settings.max_message_bytes} (max_message_bytes)"
        )


def start(
    settings: Settings,
    topic: str,
    initial_prompt: str,
    *,
    model: str | None = None,
    backend: str | None = None,
    template: str | None = None,
    context_requirements: list[str] | None = None,
    idempotency_key: str | None = None,
) -> tuple[Conv, bool]:
    """A new conversation with its first message queued. Returns it and whether it is new."""
    home = Home(settings.home)
    ensure_home(home)
    if not topic.strip():
        raise InputRejected("a conversation needs a topic")
    _check_text(initial_prompt, settings, "the initial prompt")
    tpl = load_template(home, template or settings.default_template)
    backend_name = backend or tpl.backend or settings.default_backend
    if backend_name not in backends.available():
        known = ", ".join(backends.available())
        raise InputRejected(f"unknown backend {backend_name!r}; known: {known}")
    model_name = model or tpl.model or settings.default_model
    reqs = [{"type": "need", "need": r} for r in (context_requirements or []) if r.strip()]
    if idempotency_key:
        key, ttl = "key:" + idempotency_key, KEY_TTL
    else:
        args = [topic, initial_prompt, model_name, backend_name, tpl.name, reqs]
        digest = hashlib.sha256(json.dumps(args, ensure_ascii=False).encode()).hexdigest()
        key, ttl = "args:" + digest, SAME_ARGS_WINDOW

    def create() -> Conv:
        conv = new_conversation(
            home,
            topic,
            template=tpl,
            model=model_name,
            backend=backend_name,
            extra={"context_requirements": reqs} if reqs else None,
            durable=settings.durability == "fsync",
        )
        drop_message(conv, initial_prompt, name=INITIAL_NAME)
        return conv

    return idempotent_create(home, key, ttl, create)


def send(settings: Settings, conv: Conv, text: str) -> str:
    """Queue a plain message; returns the inbox file name."""
    _active(conv)
    _check_text(text, settings)
    return drop_message(conv, text).name


def respond(
    settings: Settings, reader: Reader, conv: Conv, text: str, need: str | None = None
) -> dict[str, Any]:
    """Answer what the model waits for (a RESPONSE TO NEED block), else send a plain message."""
    _active(conv)
    _check_text(text, settings, "the response")
    with faces_lock(conv):  # two responders at once: the second sees the first's answer
        return _respond(settings, reader, conv, text, need)


def _respond(
    settings: Settings, reader: Reader, conv: Conv, text: str, need: str | None
) -> dict[str, Any]:
    meta = read_metadata(conv)
    pending = reader.pending_needs(conv, meta) if meta else []
    if not pending:
        if need:
            raise InputRejected(
                f"{conv.id} is not waiting for {need!r} (nothing is pending); "
                "leave out the need to send a plain message"
            )
        return {"answered": None, "queued": send(settings, conv, text), "still_pending": []}
    chosen = pending[0]
    if need:
        if need.isdigit() and 1 <= int(need) <= len(pending):
            chosen = pending[int(need) - 1]
        elif need in pending:
            chosen = need
        else:
            raise InputRejected(f"no pending need {need!r}; pending: {pending}")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    body = f"RESPONSE TO NEED: {chosen}\n(source: agent, {stamp})\n{text}"
    name = drop_message(conv, body).name
    return {
        "answered": chosen,
        "queued": name,
        "still_pending": [n for n in pending if n != chosen],
    }


def archive_conversation(home: Home, conv: Conv) -> Conv:
    """Move to ``completed/`` unless the daemon is writing to it right now or a message is
    still queued (in completed/ it would never be answered)."""
    if conv.is_completed:
        return conv
    with conv_lock(conv, blocking=False) as got:
        if not got:
            raise LockBusy(
                f"{conv.id} is busy (a reply is being written); cancel it or try again shortly"
            )
        queued = len(inbox_entries(conv)) + len(processing_entries(conv))
        if queued:
            raise InputRejected(
                f"{conv.id} has {queued} queued message(s) that would never be answered in "
                "completed/; wait for the reply (send --wait) and archive it then"
            )
        return archive(home, conv)


CANCELLABLE = frozenset({Status.GENERATING, Status.ROUTING, Status.RETRYING})


def cancel(conv: Conv) -> Status | None:
    """Ask the daemon to stop the turn in flight (or its retries). Returns the status that is
    being cancelled, or None when nothing runs: then no flag is written, so no future turn
    can be cancelled by mistake."""
    _active(conv)
    state = read_state(conv)
    if state is None or state.status not in CANCELLABLE:
        return None
    request_cancel(conv)
    return state.status


def _active(conv: Conv) -> None:
    if conv.is_completed:
        raise ContemplationError(f"{conv.id} is archived (in completed/); start a new conversation")
