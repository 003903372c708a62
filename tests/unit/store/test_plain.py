"""The light reader (contemplation.store.plain) and the models say the same of the same
documents: for any value, the light check either gives the model's dump or leaves it to the
model (None), and never takes what the model refuses; over folders (a normal one, malformed
JSON, wrong types, a missing file, a file past the size bound) the light readers give what
read_metadata and its approvals give. Each Doc is held to its model's fields and defaults."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from contemplation import models
from contemplation.store import layout, plain
from contemplation.store.layout import Conv
from tests.unit.examples import examples

DOCS = [
    plain.METADATA, plain.APPROVAL_DECISION, plain.PANEL_SEAT, plain.APPROVAL_REQUEST,
    plain.ERROR_INFO, plain.REPLY_CUT, plain.REPLY_END, plain.CRASHES, plain.INTENT,
    plain.LOG_IDENTITY, plain.ROTATION, plain.TURN_STARTED, plain.USAGE, plain.LEDGER_SUMS,
    plain.LEDGER_TURN, plain.LEDGER, plain.BACKEND_SESSION, plain.LADDER_STEP,
    plain.LADDER_BOOK, plain.STATE,
]  # fmt: skip


def _model(doc: plain.Doc) -> type[BaseModel]:
    model: type[BaseModel] = getattr(models, doc.name)
    return model


def _same(light: dict[str, Any] | None, model: dict[str, Any] | None) -> bool:
    """Equal, types and all (1 == True and 1 == 1.0 in Python; not in JSON's text)."""
    return json.dumps(light, sort_keys=True, default=str) == json.dumps(
        model, sort_keys=True, default=str
    )


def _dump(doc: plain.Doc, value: Any) -> dict[str, Any] | None:
    try:
        return _model(doc).model_validate(value).model_dump()
    except ValidationError:
        return None


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_each_doc_names_its_models_fields_defaults_and_extras(doc: plain.Doc) -> None:
    model = _model(doc)
    assert list(doc.fields) == list(model.model_fields)
    for name, (_, default) in doc.fields.items():
        f = model.model_fields[name]
        if default is plain.REQUIRED:
            assert f.is_required(), name
        else:
            want = f.get_default(call_default_factory=True)
            if isinstance(want, BaseModel):  # a document's default: its dump
                want = want.model_dump()
            assert _same(want, default) and want == default, name
    assert doc.extra == (model.model_config.get("extra") == "allow")
    assert set(doc.omit) == {n for n, f in model.model_fields.items() if f.exclude_if}


SEAT = {"model": "qwen3", "label": "QWEN", "backend": "ollama"}
META = {"id": "c1", "topic": "t", "created": "2026-01-01T00:00:00Z"}
DECISION = {"request": "r1", "decision": "always", "tool": "web", "arguments": {"q": "x"}}
ASK = {"id": "a1", "need": "file: x", "rule": "read_file", "tool": "files.read",
       "arguments": {"path": "x"}, "why": "ask"}  # fmt: skip
USAGE = {"prompt_eval_count": 12, "eval_count": 3, "eval_duration_ms": 40, "wall_ms": 50.5,
         "miss": "slot taken", "context_full": False, "provider": "p", "own": [1]}  # fmt: skip
LEDGER = {"turns": [{"turns": 1, "turn": 1, "sent": 5, "queued_ms": 2, "miss": "cut"}],
          "by": {"p/m": {"turns": 2, "output": 7, "generate_ms": 1.5}}, "unturned_bytes": 3}  # fmt: skip
STATE = {
    "version": 1, "status": "awaiting_approval", "turns": 2, "log": {"ino": 9, "size": 100},
    "intent": {"kind": "reply", "id": "r", "offset": 4}, "pending_approvals": [ASK],
    "last_error": {"kind": "http", "message": "m", "time": "t"}, "next_retry_at": 1.5e9,
    "last_turn": USAGE, "reply_cut": {"reason": "length", "message": "m", "tokens": 9},
    "ledger": LEDGER, "ladder": {"answered": {"": 2}, "steps": [{"turn": 1, "to": "agent"}]},
    "crashes": {"turns": 1, "messages": 1, "cause": "c"}, "generating_since": 17,
    "backend_session": {"backend": "opencode", "id": "s", "extra": True},
    "turn_started": {"turns": 1, "messages": 1, "run": "x"}, "own": {"a": 1},
}  # fmt: skip
CASES: list[tuple[plain.Doc, Any]] = [
    (plain.METADATA, META),
    (plain.METADATA, {**META, "panel": [SEAT], "debate": True, "synthesize": SEAT}),
    (plain.METADATA, {**META, "approvals": [DECISION], "own": 1}),  # extras kept
    (plain.METADATA, {**META, "think": "high", "system_prompt": None, "labels": ["a"]}),
    (plain.METADATA, {**META, "think": True, "options": {"num_ctx": 8}}),
    (plain.METADATA, {**META, "archive_on_complete": 1}),  # the model's coercion: unsure
    (plain.METADATA, {**META, "labels": "a"}),  # refused by the model
    (plain.METADATA, {"topic": "t", "created": "x"}),  # no id
    (plain.METADATA, {**META, "panel": [{"model": "m"}]}),  # a seat without its label
    (plain.METADATA, {**META, "id": 7}),
    (plain.METADATA, [META]),
    (plain.APPROVAL_DECISION, DECISION),
    (plain.APPROVAL_DECISION, {**DECISION, "revoked": "now", "revoked_by": "cli", "x": 1}),
    (plain.APPROVAL_DECISION, {**DECISION, "decision": "maybe"}),
    (plain.APPROVAL_DECISION, {**DECISION, "arguments": []}),
    (plain.APPROVAL_DECISION, {"decision": "once"}),
    (plain.STATE, STATE),
    (plain.STATE, {}),  # every field its default
    (plain.STATE, {**STATE, "ladder": None, "reply_end": {"offset": 1, "sha256": "s", "tail": ""}}),
    (plain.STATE, {**STATE, "status": "bogus"}),  # refused by the model
    (plain.STATE, {**STATE, "turns": 2.0}),  # the model's coercion: unsure
    (plain.STATE, {**STATE, "retry_count": True}),  # a bool for an int: unsure
    (plain.STATE, {**STATE, "next_retry_at": float("nan")}),  # the model takes NaN: unsure
    (plain.STATE, {**STATE, "generating_since": 10**400}),  # past a float: unsure
    (plain.STATE, {**STATE, "ledger": {**LEDGER, "by": {"p/m": {"turns": "2"}}}}),
    (plain.STATE, {**STATE, "last_turn": {**USAGE, "miss": "no such cause"}}),
    (plain.STATE, {**STATE, "pending_approvals": [{**ASK, "rule": None}]}),
    (plain.STATE, {**STATE, "ladder": {"answered": {"": "2"}}}),
    (plain.STATE, [STATE]),
]


@pytest.mark.parametrize(("doc", "value"), CASES)
def test_light_gives_the_models_dump_or_leaves_it_to_the_model(doc: plain.Doc, value: Any) -> None:
    light, model = plain.check(doc, value), _dump(doc, value)
    assert light is None or _same(light, model)
    if model is None:
        assert light is None


def test_plain_documents_are_decided_without_the_model() -> None:
    """What a daemon writes is decided here: the model is not asked (the point of it)."""
    for doc, value in CASES[:5] + CASES[11:13] + CASES[16:19]:
        assert plain.check(doc, value) is not None, value


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


def _field_values(doc: plain.Doc) -> st.SearchStrategy[dict[str, Any]]:
    """Documents with each field left out, of its own kind, or of any JSON value."""
    good = {
        "model": "m", "label": "L", "id": "c", "topic": "t", "created": "x", "request": "r",
        "decision": "once", "panel": [SEAT], "synthesize": SEAT, "think": "low",
    }  # fmt: skip
    parts = {
        name: st.sampled_from(["absent", good.get(name, default)]) | _JSON
        for name, (_, default) in doc.fields.items()
    }
    extra = st.dictionaries(st.text(max_size=4), _JSON, max_size=2)
    return st.fixed_dictionaries(parts).flatmap(
        lambda d: extra.map(lambda e: {**e, **{k: v for k, v in d.items() if v != "absent"}})
    )


# the documents read whole (their parts are drawn inside them and held by the cases above)
WHOLE = [plain.METADATA, plain.APPROVAL_DECISION, plain.STATE, plain.USAGE, plain.LEDGER]


@pytest.mark.parametrize("doc", WHOLE, ids=[d.name for d in WHOLE])
def test_light_and_model_agree_on_any_document(doc: plain.Doc) -> None:
    @settings(max_examples=examples(300), deadline=None)
    @given(_field_values(doc))
    def agree(value: dict[str, Any]) -> None:
        light, model = plain.check(doc, value), _dump(doc, value)
        assert light is None or _same(light, model)
        if model is None:
            assert light is None

    agree()


# --------------------------------------------------------------------------- over folders


def _folder(tmp_path: Path, name: str, content: bytes | None) -> Conv:
    conv = Conv(tmp_path / name)
    conv.dir.mkdir()
    if content is not None:
        conv.metadata.write_bytes(content)
    return conv


FOLDERS: dict[str, bytes | None] = {
    "normal": json.dumps({**META, "approvals": [DECISION, {**DECISION, "request": "r2",
                                                           "decision": "nope"}]}).encode(),
    "malformed": b'{"id": "c1", "topic": ',
    "wrong-types": json.dumps({**META, "labels": {"a": 1}}).encode(),
    "coerced": json.dumps({**META, "archive_on_complete": "yes",
                           "approvals": [{**DECISION, "time": 5}]}).encode(),
    "approvals-not-a-list": json.dumps({**META, "approvals": {"r1": DECISION}}).encode(),
    "missing": None,
    "huge": json.dumps({**META, "topic": "x" * 5000}).encode(),
}  # fmt: skip


@pytest.mark.parametrize("case", list(FOLDERS))
def test_the_light_readers_read_folders_as_the_model_does(
    tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layout, "JSON_MAX_BYTES", 4096)  # "huge" is past it: read by neither
    conv = _folder(tmp_path, case, FOLDERS[case])
    meta = layout.read_metadata(conv)
    light = plain.metadata(conv)
    assert _same(light, None if meta is None else meta.model_dump())
    if meta is not None and light is not None:
        got, want = plain.approvals(light), [d.model_dump() for d in meta.approvals()]
        assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
    if case == "normal":
        assert light is not None
        assert [d["request"] for d in plain.approvals(light)] == ["r1"]  # "nope" skipped
