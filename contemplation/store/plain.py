"""A folder's JSON documents (``metadata.json``, a decision in its ``approvals``,
``state.json``) read without the models: importing pydantic costs a read command
(``approvals``, ``status``, ``status CONV``) more than its whole work, and the documents a
daemon writes are plain.

:func:`check` gives what ``Model.model_validate(value).model_dump()`` gives, for a value the
model takes as it is: each field of its exact JSON type (an int where an int goes, an int or a
float where a float goes, a string of the set where a literal goes, the enum's member where a
string enum goes), a missing field its
default, an unknown one kept where the model keeps extras and dropped where it ignores them.
Anything else (a string where a number goes, a bool for an int, ``NaN``, a value outside its
set, a field missing that has no default) is not decided here: :func:`check` says None and the
caller asks the model, which says what it makes of it (its own coercion or its refusal). So the
two never differ: ``tests/unit/store/test_plain.py`` runs both over the same documents and
holds each :class:`Doc` to its model's fields and defaults.
"""

from __future__ import annotations

import copy
import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from contemplation.store.layout import Conv, read_json
from contemplation.values import APPROVALS_KEY, DECISIONS, CutReason, MissCause, Status


class _Unsure(Exception):
    """A value this module does not decide: the model does."""


@dataclass(frozen=True, slots=True)
class Doc:
    """A model's fields: name -> (kind, default); :data:`REQUIRED` where it has none."""

    name: str  # the model's class name (the test finds the model by it)
    fields: Mapping[str, tuple[Any, Any]]
    extra: bool = False  # the model keeps unknown fields (extra="allow")
    omit: Mapping[str, Callable[[Any], bool]] = field(default_factory=dict)  # exclude_if


REQUIRED = object()
STR, INT, FLOAT, BOOL, ANY, DICT = "str", "int", "float", "bool", "any", "dict"


def list_of(kind: Any) -> tuple[str, Any]:
    return ("list", kind)


def optional(kind: Any) -> tuple[str, Any]:
    return ("optional", kind)


def one_of(*kinds: Any) -> tuple[str, Any]:
    return ("one_of", kinds)


def dict_of(kind: Any) -> tuple[str, Any]:
    """A ``dict[str, kind]`` (JSON's keys are strings)."""
    return ("dict", kind)


def among(values: frozenset[str]) -> tuple[str, Any]:
    """A Literal's values."""
    return ("among", values)


def member(of: type[enum.StrEnum]) -> tuple[str, Any]:
    """A string enum's: its value read, its member given (what the model's dump holds)."""
    return ("member", of)


def check(doc: Doc, value: Any) -> dict[str, Any] | None:
    """The model's dump of ``value``, or None: ask the model (see the module's docstring)."""
    try:
        return _doc(doc, value)
    except (_Unsure, RecursionError, OverflowError):  # (an int too large for a float)
        return None


def _doc(doc: Doc, value: Any) -> dict[str, Any]:
    if type(value) is not dict:
        raise _Unsure
    out: dict[str, Any] = {}
    for name, (kind, default) in doc.fields.items():
        if name in value:
            out[name] = _value(kind, value[name])
        elif default is REQUIRED:
            raise _Unsure
        else:
            out[name] = copy.deepcopy(default)
    for name, omitted in doc.omit.items():
        if omitted(out[name]):
            del out[name]
    if doc.extra:
        out |= {k: v for k, v in value.items() if k not in doc.fields}
    return out


_SCALARS: dict[str, Callable[[Any], bool]] = {  # the exact JSON types a kind takes as it is
    STR: lambda v: type(v) is str,
    INT: lambda v: type(v) is int,
    FLOAT: lambda v: type(v) in {int, float} and math.isfinite(v),
    BOOL: lambda v: type(v) is bool,
    DICT: lambda v: type(v) is dict,
    ANY: lambda v: True,
}


def _value(kind: Any, v: Any) -> Any:
    if isinstance(kind, Doc):
        return _doc(kind, v)
    if isinstance(kind, str):
        if not _SCALARS[kind](v):
            raise _Unsure
        return float(v) if kind == FLOAT else dict(v) if kind == DICT else v
    tag, inner = kind
    if tag == "list" and type(v) is list:
        return [_value(inner, x) for x in v]
    if tag == "optional":
        return None if v is None else _value(inner, v)
    if tag == "dict" and type(v) is dict and all(type(k) is str for k in v):
        return {k: _value(inner, x) for k, x in v.items()}
    if tag == "among" and type(v) is str and v in inner:
        return v
    if tag == "member" and type(v) is str and v in inner._value2member_map_:
        return inner(v)
    if tag == "one_of":  # exact types only: no union decides between coercions here
        for k in inner:
            try:
                return _value(k, v)
            except _Unsure:
                continue
    raise _Unsure


# --------------------------------------------------------------------------- the documents

PANEL_SEAT = Doc("PanelSeat", {"model": (STR, REQUIRED), "label": (STR, REQUIRED),
                               "backend": (STR, "")})  # fmt: skip

METADATA = Doc(
    "Metadata",
    {
        "id": (STR, REQUIRED), "topic": (STR, REQUIRED), "created": (STR, REQUIRED),
        "template": (STR, "default"), "backend": (STR, "ollama"), "model": (STR, "llama3.2"),
        "agent_label": (STR, "CLAUDE"), "model_label": (STR, ""), "options": (DICT, {}),
        "system_prompt": (optional(STR), None), "think": (optional(one_of(BOOL, STR)), None),
        "labels": (list_of(STR), []), "context_requirements": (list_of(DICT), []),
        "archive_on_complete": (BOOL, True), "panel": (list_of(PANEL_SEAT), []),
        "debate": (BOOL, False), "synthesize": (optional(PANEL_SEAT), None),
    },
    extra=True,
    omit={"panel": lambda v: not v, "debate": lambda v: not v, "synthesize": lambda v: v is None},
)  # fmt: skip

APPROVAL_DECISION = Doc(
    "ApprovalDecision",
    {
        "request": (STR, REQUIRED), "decision": (among(DECISIONS), REQUIRED),
        "need": (STR, ""), "rule": (STR, ""), "tool": (STR, ""), "arguments": (DICT, {}),
        "time": (STR, ""), "face": (STR, ""), "agent": (STR, ""), "revoked": (STR, ""),
        "revoked_by": (STR, ""), "revoked_agent": (STR, ""),
    },
)  # fmt: skip


APPROVAL_REQUEST = Doc(
    "ApprovalRequest",
    {
        "id": (STR, REQUIRED), "need": (STR, REQUIRED), "rule": (STR, REQUIRED),
        "tool": (STR, REQUIRED), "arguments": (DICT, {}), "why": (STR, ""), "asked": (STR, ""),
    },
)  # fmt: skip

# state.json and the documents inside it (contemplation.models.State)
_CUTS: frozenset[str] = frozenset(get_args(CutReason))
_MISSES: frozenset[str] = frozenset(get_args(MissCause))
ERROR_INFO = Doc("ErrorInfo", {"kind": (STR, REQUIRED), "message": (STR, REQUIRED),
                               "time": (STR, REQUIRED)})  # fmt: skip
REPLY_CUT = Doc("ReplyCut", {"reason": (among(_CUTS), REQUIRED), "message": (STR, REQUIRED),
                             "tokens": (optional(INT), None)})  # fmt: skip
REPLY_END = Doc("ReplyEnd", {"offset": (INT, REQUIRED), "sha256": (STR, REQUIRED),
                             "tail": (STR, REQUIRED)})  # fmt: skip
CRASHES = Doc("Crashes", {"turns": (INT, REQUIRED), "messages": (INT, REQUIRED),
                          "cause": (STR, REQUIRED), "same": (INT, 1),
                          "total": (INT, 1)})  # fmt: skip
INTENT = Doc("Intent", {"kind": (among(frozenset({"message", "reply"})), REQUIRED),
                        "id": (STR, REQUIRED), "offset": (INT, REQUIRED), "length": (INT, 0),
                        "sha256": (STR, "")})  # fmt: skip
LOG_IDENTITY = Doc("LogIdentity", {"ino": (INT, 0), "size": (INT, 0)})
ROTATION = Doc("Rotation", {"segments": (INT, REQUIRED), "ino": (INT, REQUIRED)})
TURN_STARTED = Doc("TurnStarted", {"turns": (INT, REQUIRED), "messages": (INT, REQUIRED),
                                   "run": (STR, REQUIRED), "starts": (INT, 1)})  # fmt: skip
_NUMBER, _COUNT, _WORD = (optional(FLOAT), None), (optional(INT), None), (optional(STR), None)
USAGE = Doc(
    "Usage",
    {
        "prompt_eval_count": _COUNT, "eval_count": _COUNT, "total_duration_ms": _NUMBER,
        "load_duration_ms": _NUMBER, "prompt_eval_duration_ms": _NUMBER,
        "eval_duration_ms": _NUMBER, "first_token_ms": _NUMBER, "wall_ms": _NUMBER,
        "done_reason": _WORD, "context_window": _COUNT, "context_full": (BOOL, False),
        "cached_tokens": _COUNT, "computed_tokens": _COUNT,
        "miss": (optional(among(_MISSES)), None), "queued_ms": _NUMBER, "provider": _WORD,
        "model": _WORD,
    },
    extra=True,
)  # fmt: skip
_SUMS = {
    "turns": (INT, 0), "sent": _COUNT, "reused": _COUNT, "recomputed": _COUNT, "output": _COUNT,
    "queued_ms": _NUMBER, "load_ms": _NUMBER, "prefill_ms": _NUMBER, "generate_ms": _NUMBER,
    "context_bytes": (INT, 0),
}  # fmt: skip
LEDGER_SUMS = Doc("LedgerSums", _SUMS)
LEDGER_TURN = Doc("LedgerTurn", {**_SUMS, "turn": (INT, 0), "provider": (STR, ""),
                                 "model": (STR, ""),
                                 "miss": (optional(among(_MISSES)), None)})  # fmt: skip
LEDGER = Doc("Ledger", {"turns": (list_of(LEDGER_TURN), []),
                        "by": (dict_of(LEDGER_SUMS), {}), "unturned_bytes": (INT, 0)})  # fmt: skip
BACKEND_SESSION = Doc(
    "BackendSession",
    {
        "backend": (STR, REQUIRED), "provider": (STR, ""), "id": (STR, REQUIRED),
        "messages": (INT, 0), "digest": (STR, ""), "last_message": (STR, ""),
    },
    extra=True,
)  # fmt: skip
LADDER_STEP = Doc("LadderStep", {"turn": (INT, 0), "rung": (STR, ""), "model": (STR, ""),
                                 "cause": _WORD, "to": _WORD})  # fmt: skip
LADDER_BOOK = Doc(
    "LadderBook",
    {
        "answered": (dict_of(INT), {}), "escalated": (INT, 0), "to_agent": (INT, 0),
        "saved_tokens_estimate": (INT, 0), "steps": (list_of(LADDER_STEP), []),
    },
)  # fmt: skip
STATE = Doc(
    "State",
    {
        "version": (INT, 1), "status": (member(Status), Status.PENDING),
        "messages_processed": (INT, 0), "turns": (INT, 0),
        "log": (LOG_IDENTITY, {"ino": 0, "size": 0}), "intent": (optional(INTENT), None),
        "rotation": (optional(ROTATION), None), "done_ids": (list_of(STR), []),
        "pending_needs": (list_of(STR), []), "pending_approvals": (list_of(APPROVAL_REQUEST), []),
        "last_error": (optional(ERROR_INFO), None), "retry_count": (INT, 0),
        "next_retry_at": _NUMBER, "retry_settings": (STR, ""),
        "crashes": (optional(CRASHES), None), "last_turn": (optional(USAGE), None),
        "reply_cut": (optional(REPLY_CUT), None), "reply_end": (optional(REPLY_END), None),
        "ledger": (LEDGER, {"turns": [], "by": {}, "unturned_bytes": 0}),
        "ladder": (optional(LADDER_BOOK), None), "generating_since": _NUMBER,
        "turn_started": (optional(TURN_STARTED), None),
        "backend_session": (optional(BACKEND_SESSION), None),
        "parse_errors": (list_of(STR), []), "warnings": (list_of(STR), []),
        "updated": (STR, ""),
    },
    extra=True,
    omit={"ladder": lambda v: v is None},
)  # fmt: skip


# --------------------------------------------------------------------------- the readers


def metadata(conv: Conv) -> dict[str, Any] | None:
    """``metadata.json`` as the model dumps it; None where :func:`layout.read_metadata` is None
    (a file missing, not JSON, or one the model refuses)."""
    data = read_json(conv.metadata)
    return None if data is None else _or_model(METADATA, data)


def state(conv: Conv) -> dict[str, Any] | None:
    """``state.json`` as the model dumps it; None where :func:`layout.read_state` is None (a
    file missing, not JSON, past the size bound, or one the model refuses)."""
    data = read_json(conv.state)
    return None if data is None else _or_model(STATE, data)


def approvals(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The decisions in a metadata dump's ``approvals``, each as the model dumps it; an entry
    the model refuses is skipped (:func:`contemplation.models.read_approvals`)."""
    raw = meta.get(APPROVALS_KEY)
    out: list[dict[str, Any]] = []
    for item in raw if isinstance(raw, list) else []:
        got = _or_model(APPROVAL_DECISION, item)
        if got is not None:
            out.append(got)
    return out


def _or_model(doc: Doc, value: Any) -> dict[str, Any] | None:
    """:func:`check`, else the model's word: its dump, or None where it refuses ``value``."""
    got = check(doc, value)
    if got is not None:
        return got
    from pydantic import ValidationError

    from contemplation import models

    try:
        dumped: dict[str, Any] = getattr(models, doc.name).model_validate(value).model_dump()
    except ValidationError:
        return None
    return dumped
