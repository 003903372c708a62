"""Structured answers: a message that asks for a reply matching a JSON Schema.

How the schema travels: it is the first line of the agent's message, ``SCHEMA: <the schema as
one line of JSON>`` — in the dropped inbox file, and so in the agent block of ``messages.log``
once the message is taken. The log is the one durable record (a kill between the claim and the
turn finds the schema where it finds the message), and it stays plain text. A template may
name a ``schema`` for every message that carries none of its own.

How a reply is judged (:func:`judge`, from the turn's finish): JSON that matches is marked
with a ``NOTE`` (:data:`VALID_NOTE`; the faces return its ``parsed`` object); a reply that
does not parse or match is ``INTERRUPTED`` with the validator's message (:data:`RETRY_PREFIX`),
so the turn is due again and is asked once more with that message (:func:`spec_for` finds it
in the log); a second miss ends with an ``ERROR`` marker that says what was wrong. The check
runs in a child process with a hard time limit and a linear-time regex engine
(:mod:`contemplation.protocol.replycheck`), so no schema can hold the daemon's loop.

A schema is accepted (:func:`check_schema`) when it is valid under its draft's meta-schema
and breaks none of the rules that keep a schema harmless
(:mod:`contemplation.protocol.schema_rules`:
its depth, no ``$ref`` loop that stays on one value (recursion into the value, a tree, is
fine), how far its ``$ref`` entries expand, patterns the engine can run), checked by the same
engine that checks the replies.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contemplation.errors import ErrorKind, InputRejected
from contemplation.protocol import replycheck, schema_rules
from contemplation.protocol.logformat import one_line
from contemplation.values import Block, BlockKind, ChatMessage, MarkerKind, Status

if TYPE_CHECKING:  # the models (pydantic) load with a backend, not to read a log
    from contemplation.models import ChatRequest

SCHEMA_PREFIX = "SCHEMA: "
RETRY_PREFIX = "the reply does not match the schema"  # the INTERRUPTED marker of a miss
VALID_NOTE = "the reply is JSON that matches the schema"
RETRY_HEAD = "Your reply does not match the JSON Schema it must follow:"
INSTRUCTION = (
    "Answer with only one JSON value (no other text, no code fence, no NEED line) "
    "that matches this JSON Schema:"
)
MAX_WHY = 300  # characters of the validator's message kept in a marker
TEMPLATE_LIMIT = 1024 * 1024  # a schema not sent with a message: a template's, a hand append's


# --------------------------------------------------------------------------- the schema


def check_schema(schema: Any, limit: int, what: str = "the schema") -> dict[str, Any]:
    """``schema`` if it is a JSON Schema (an object valid under its draft's meta-schema) of
    at most ``limit`` bytes as one line that breaks none of :mod:`.schema_rules`; else
    InputRejected, one line."""
    if not isinstance(schema, dict):
        raise InputRejected(f"{what} is not a JSON object (a JSON Schema is one)")
    if (deep := schema_rules.too_deep(schema, what)) is not None:  # before any recursion
        raise InputRejected(deep)
    size = len(compact(schema).encode("utf-8"))
    if size > limit:
        raise InputRejected(f"{what} is {size} bytes; the limit is {limit} (max_schema_bytes)")
    if (why := schema_rules.refusal(schema, what)) is not None:
        raise InputRejected(one_line(why, 2 * MAX_WHY))
    return schema


def parse_schema(text: str, limit: int, what: str = "the schema") -> dict[str, Any]:
    """A JSON Schema from its JSON text (see :func:`check_schema`)."""
    if len(text.encode("utf-8")) > 4 * limit:  # pretty-printed text may be larger than compact
        raise InputRejected(f"{what} is larger than {limit} bytes (max_schema_bytes)")
    try:
        schema = json.loads(text)
    except RecursionError:
        raise InputRejected(
            f"{what} is not JSON: nested deeper than {schema_rules.MAX_DEPTH} levels"
        ) from None
    except ValueError as exc:
        raise InputRejected(f"{what} is not JSON: {exc}") from None
    return check_schema(schema, limit, what)


def load_schema(source: str, limit: int) -> dict[str, Any]:
    """``--schema FILE_OR_JSON``: JSON text (it starts with ``{``), else a file holding it."""
    if source.lstrip().startswith("{"):
        return parse_schema(source, limit)
    path = Path(source).expanduser()
    try:
        with path.open("rb") as f:
            data = f.read(4 * limit + 1)
    except OSError as exc:
        raise InputRejected(
            f"the schema is neither JSON nor a readable file: {source} ({exc.strerror or exc})"
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputRejected(f"the schema file {source} is not UTF-8 text") from None
    return parse_schema(text, limit, f"the schema in {source}")


def compact(schema: Mapping[str, Any]) -> str:
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def with_schema(text: str, schema: Mapping[str, Any]) -> str:
    """The message text that carries ``schema``: its ``SCHEMA:`` line, then the text."""
    return f"{SCHEMA_PREFIX}{compact(schema)}\n{text}"


def split(text: str) -> tuple[str | None, str]:
    """A message's schema line's JSON (None: it has none) and the rest of its text. Only a
    first line ``SCHEMA: {`` is one; any other text is left alone."""
    if not text.startswith(SCHEMA_PREFIX + "{"):
        return None, text
    head, _, rest = text.partition("\n")
    return head[len(SCHEMA_PREFIX) :], rest


def body(text: str) -> str:
    """A message's text without its schema line (what the model is sent as the message)."""
    return split(text)[1]


def refused(text: str, limit: int) -> str | None:
    """Why a dropped message's schema line cannot be used (None: fine, or it has none)."""
    raw, _ = split(text)
    if raw is None:
        return None
    try:
        parse_schema(raw, limit, "the message's SCHEMA line")
    except InputRejected as exc:
        return str(exc)
    return None


# --------------------------------------------------------------------------- a turn


@dataclass(frozen=True, slots=True)
class Spec:
    """The schema the next reply must match, and, when it is the retry, the reply that
    missed and the validator's message about it."""

    schema: dict[str, Any]
    missed: tuple[str, str] | None = None


def spec_for(
    blocks: tuple[Block, ...], template_schema: dict[str, Any] | None = None
) -> Spec | None:
    """The schema of the turn that is due: the agent's last own message's ``SCHEMA:`` line,
    else the template's. None: a free-form reply."""
    schema: dict[str, Any] | None = None
    start = -1
    for i in range(len(blocks) - 1, -1, -1):
        b = blocks[i]
        if b.kind is BlockKind.AGENT and b.response_to is None:
            raw, _ = split(b.text)
            schema = _usable(raw) if raw is not None else None
            start = i
            break
    schema = schema if schema is not None else template_schema
    if schema is None:
        return None
    missed: tuple[str, str] | None = None
    for b in blocks[start + 1 :]:
        if b.kind is not BlockKind.MODEL:
            continue
        for kind, detail in b.markers:
            if kind is MarkerKind.INTERRUPTED and detail.startswith(RETRY_PREFIX):
                missed = (b.text, detail.partition(": ")[2])
            elif kind is MarkerKind.ESCALATED:  # the next rung gets its own retry
                missed = None
    return Spec(schema, missed)


@functools.lru_cache(maxsize=64)
def _usable(raw: str) -> dict[str, Any] | None:
    """The schema of a SCHEMA line, checked (a dropped file's was checked when it was taken;
    one appended by hand that is not usable leaves the turn free-form)."""
    try:
        return parse_schema(raw, TEMPLATE_LIMIT)
    except InputRejected:
        return None


def instruction(schema: Mapping[str, Any]) -> str:
    return f"{INSTRUCTION}\n{compact(schema)}"


def shape(request: ChatRequest, spec: Spec, *, constrains: bool) -> ChatRequest:
    """The request for a reply that must match ``spec``: the schema travels in
    ``request.schema`` (sent as the server's constraint by the backends that have one); the
    retry adds the missed reply and the validator's message; a backend that cannot constrain
    gets the schema as an instruction at the end of the last message."""
    messages = list(request.messages)
    if spec.missed is not None:
        bad, why = spec.missed
        messages += [ChatMessage("assistant", bad), ChatMessage("user", f"{RETRY_HEAD} {why}")]
    if not constrains and messages:
        last = messages[-1]
        messages[-1] = replace(last, content=f"{last.content}\n\n{instruction(spec.schema)}")
    return replace(request, messages=tuple(messages), schema=spec.schema)


def problem(text: str, schema: Mapping[str, Any]) -> str | None:
    """What is wrong with ``text`` as an answer to ``schema`` (None: it matches), in this
    process (the daemon's turns use :func:`judge`, which checks in a child)."""
    return replycheck.problem(text, schema)


@dataclass(frozen=True, slots=True)
class Verdict:
    """How a reply that had to match a schema ends: the marker after it, and the status and
    error that the reply's commit records (None: left as the turn decides)."""

    marker: tuple[MarkerKind, str]
    status: Status | None = None
    error: tuple[ErrorKind, str] | None = None


async def judge(request: ChatRequest, text: str) -> Verdict | None:
    """The verdict on a reply to ``request`` (None: no schema was asked for), checked off
    the loop within :data:`replycheck.CHECK_SECONDS`."""
    if request.schema is None:
        return None
    why = await replycheck.checked(text.strip(), request.schema)
    if why is None:
        return Verdict((MarkerKind.NOTE, VALID_NOTE))
    why = one_line(why, MAX_WHY)
    last = request.messages[-1] if request.messages else None
    if last is None or not last.content.startswith(RETRY_HEAD):  # the first miss
        return Verdict(
            (MarkerKind.INTERRUPTED, f"{RETRY_PREFIX}; asked once more: {why}"),
            status=Status.PENDING,
        )
    message = f"the reply does not match the schema after one retry: {why}"
    return Verdict((MarkerKind.ERROR, message), Status.ERROR, (ErrorKind.PROTOCOL, message))


# --------------------------------------------------------------------------- the faces


def parsed(block: Block) -> tuple[bool, Any]:
    """(True, the JSON value) for a reply the daemon found to match its schema."""
    if block.kind is not BlockKind.MODEL or (MarkerKind.NOTE, VALID_NOTE) not in block.markers:
        return False, None
    try:
        return True, json.loads(block.text)
    except ValueError:
        return False, None


# --------------------------------------------------------------------------- templates


def template_schema(value: Any) -> dict[str, Any] | None:
    """A template's ``schema`` (a TOML table, or a string of JSON), checked; None: none."""
    if value is None:
        return None
    what = "the template's schema"
    if isinstance(value, str):
        return parse_schema(value, TEMPLATE_LIMIT, what)
    return check_schema(value, TEMPLATE_LIMIT, what)
