"""Schemas that cannot hurt the daemon.

A reply is checked against its schema in a child process with a hard time limit and a regex
engine that cannot backtrack (jsonschema-rs with the ``regex`` crate), so a hostile
``pattern`` never holds the event loop: the daemon's /health answers within a second all the
while and SIGTERM stops it. A schema is checked when it is accepted (depth, size, how far its
$refs expand, recursive $refs, patterns the engine refuses): one line, nothing queued. A reply
nested too deeply is a failed validation, and a turn that fails the same way twice after its
reply streamed is not redone again: one ERROR, and the conversation waits for the agent.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from contemplation.errors import InputRejected
from contemplation.models import BlockKind, MarkerKind, Status
from contemplation.protocol import replycheck, structured
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import conv_lock, drop_message, ensure_home, new_conversation
from tests.conftest import DaemonProc, base_env, cli, cli_here, run_burst, runtime_for, wait_for
from tests.fakes.ollama_server import FakeOllama, Step

LIMIT = 16384
HOSTILE = {  # the finding's two patterns, each with a reply that makes Python's re backtrack
    "nested-plus": ({"type": "string", "pattern": "^(a+)+$"}, json.dumps("a" * 36 + "!")),
    "words": (
        {"type": "string", "pattern": r"^(\w+\s?)*$"},
        json.dumps("the quick brown fox jumps over the lazy dog again!"),
    ),
}
RECURSIVE = {"$ref": "#"}
LOOP = {  # two $refs that reach each other without going into the value: endless
    "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
    "$ref": "#/$defs/a",
}
# recursion through the value: legitimate, bounded by the reply's depth
MUTUAL = {
    "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"items": {"$ref": "#/$defs/a"}}},
    "$ref": "#/$defs/a",
}
TREE = {
    "type": "object",
    "properties": {"children": {"type": "array", "items": {"$ref": "#"}}},
}
NODE = {  # the issue's tree
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        }
    },
    "$ref": "#/$defs/node",
}


def dag(levels: int) -> dict[str, Any]:
    """A small schema whose $refs expand to 2**levels subschemas (each level refers to the
    one below twice): its text grows linearly, the validation exponentially."""
    defs: dict[str, Any] = {"a0": {"type": "string"}}
    for i in range(1, levels):
        below = {"$ref": f"#/$defs/a{i - 1}"}
        defs[f"a{i}"] = {"allOf": [below, dict(below)]}
    return {"$defs": defs, "$ref": f"#/$defs/a{levels - 1}"}


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def model_blocks(conv: Conv) -> list[Any]:
    return [b for b in parse(conv.log.read_bytes()).blocks if b.kind is BlockKind.MODEL]


def make_conv(home: Home) -> Conv:
    ensure_home(home)
    return new_conversation(
        home, "schemas", template=load_template(home, "default"), model="llama3.2", backend="ollama"
    )


def dashboard_port(home: Home, d: DaemonProc) -> int:
    def ready() -> int | None:
        try:
            info = json.loads((home.root / ".dashboard.json").read_text())
        except (OSError, ValueError):
            return None
        return int(info["port"]) if info.get("pid") == d.proc.pid else None

    port: int = wait_for(ready, timeout=15, what="the dashboard to listen")
    return port


# --------------------------------------------------------------------------- accepted or not


@pytest.mark.parametrize(
    ("schema", "start"),
    [
        (RECURSIVE, "the schema's $ref at / refers back to itself (#)"),
        (LOOP, "the schema's $ref at /$defs/"),
        ({"allOf": [{"$ref": "#"}]}, "the schema's $ref at /allOf/0 refers back to itself (#)"),
        (
            {"type": "string", "pattern": "(?=a)b"},
            "the schema's pattern at /pattern cannot be used: ",
        ),
        (
            {"patternProperties": {"(a)\\1": {}}},
            "the schema's pattern at /patternProperties/(a)\\1 cannot be used: ",
        ),
        ({"type": "string", "pattern": "a{1000}{1000}{1000}"}, "the schema's pattern at"),
        (nested(70), "the schema is nested more than 64 levels deep (the limit)"),
        (dag(40), "the schema's $refs expand to more than 100000 subschemas"),
        ({"$ref": "http://127.0.0.1:9/city.json"}, "the schema cannot be used: "),
    ],
    ids=["self", "loop", "allof", "lookahead", "backref", "huge", "deep", "dag", "remote"],
)
def test_a_schema_that_could_hurt_is_refused_in_one_line(schema: Any, start: str) -> None:
    text = json.dumps(schema)
    with pytest.raises(InputRejected) as err:
        structured.load_schema(text, LIMIT)
    message = str(err.value)
    assert "\n" not in message and len(message) < 500, message
    assert message.startswith(start), message
    why = structured.refused(structured.with_schema("hi", schema), LIMIT)
    assert why is not None and why.startswith("the message's SCHEMA line"), why


def _tree(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"children": []}
    for _ in range(depth):
        node = {"children": [node, {"children": []}]}
    return node


@pytest.mark.parametrize("schema", [TREE, NODE], ids=["tree", "node"])
def test_a_schema_recursive_through_the_value_is_accepted_and_checks_replies(
    schema: dict[str, Any],
) -> None:
    """A tree's ``$ref`` recursion goes one level into the reply each round, so it
    ends with the reply (at most replycheck.MAX_DEPTH levels, checked in a child process with
    a time limit): accepted, where a ``$ref`` loop that stays on one value is refused above."""
    assert structured.load_schema(json.dumps(schema), LIMIT) == schema
    assert structured.refused(structured.with_schema("hi", schema), LIMIT) is None
    assert structured.load_schema(json.dumps(MUTUAL), LIMIT) == MUTUAL
    assert replycheck.problem(json.dumps(_tree(100)), schema) is None
    bad = json.dumps({"children": [{"children": [{"children": "leaf"}]}]})
    said = replycheck.problem(bad, schema)
    assert said is not None and "children" in said, said


def test_a_schema_nested_deeper_than_the_json_parser_goes_is_one_line() -> None:
    for text in ("[" * 100_000, '{"a":' * 100_000):
        with pytest.raises(InputRejected, match=r"^the schema is not JSON: nested deeper than"):
            structured.parse_schema(text, 10**6)


def test_ordinary_schemas_are_still_accepted() -> None:
    city = {
        "$defs": {"name": {"type": "string", "pattern": r"^\p{Lu}\w+$"}},
        "type": "object",
        "properties": {"city": {"$ref": "#/$defs/name"}, "alias": {"$ref": "#/$defs/name"}},
        "patternProperties": {"^x-": {"type": "string"}},
    }
    assert structured.load_schema(json.dumps(city), LIMIT) == city
    assert structured.load_schema(json.dumps(nested(20)), LIMIT) == nested(20)
    assert structured.load_schema(json.dumps(dag(12)), LIMIT) == dag(12)


# --------------------------------------------------------------------------- the reply's check


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_pattern_is_checked_in_linear_time(name: str) -> None:
    schema, reply = HOSTILE[name]
    started = time.monotonic()
    why = asyncio.run(replycheck.checked(reply, schema))
    assert why is not None and "does not match" in why, why
    assert time.monotonic() - started < 5


def test_the_check_is_stopped_at_its_time_limit() -> None:
    """A schema no acceptance saw (the check never trusts one): 2**40 subschemas."""
    started = time.monotonic()
    why = asyncio.run(replycheck.checked('"x"', dag(40), seconds=1.0))
    took = time.monotonic() - started
    assert why == "the check against the schema took longer than 1 s and was stopped"
    assert took < 5, took


@pytest.mark.parametrize(
    "reply",
    ["[" * 100_000, "[" * 100_000 + "]" * 100_000, '{"a":' * 300 + "1" + "}" * 300],
    ids=["open", "closed", "300-objects"],
)
def test_a_reply_nested_too_deeply_is_a_failed_check(reply: str) -> None:
    why = asyncio.run(replycheck.checked(reply, {"type": ["array", "object"]}))
    assert why is not None and why.startswith("not valid JSON (nested deeper than"), why
    assert replycheck.problem(reply, {}) == why


def test_a_deeply_nested_reply_ends_as_a_marked_failed_validation(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home)
    drop_message(conv, structured.with_schema("A list, please.", {"type": "array"}))
    deep = '[{"name": "x", "arguments": ' + "[" * 100_000  # looks like a tool call, too
    fake_ollama.default_step = Step(text=deep, chunks=4)
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert len(fake_ollama.chat_requests()) == 2  # the one retry, then an ERROR
    missed, failed = model_blocks(conv)
    (kind, text), *_ = missed.markers  # (then a NOTE: the retry left the long reply out)
    assert kind is MarkerKind.INTERRUPTED and "not valid JSON (nested deeper than" in text
    [(kind, text)] = failed.markers
    assert kind is MarkerKind.ERROR
    assert text.startswith("the reply does not match the schema after one retry: not valid JSON")
    st = read_state(conv)
    assert st is not None and st.status is Status.ERROR


# --------------------------------------------------------------------------- a real daemon


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_pattern_never_stalls_the_daemon(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc], name: str
) -> None:
    """The reply that made the daemon spin for minutes: /health answers within a second
    throughout, the reply ends as a failed validation, and SIGTERM stops the daemon."""
    schema, reply = HOSTILE[name]
    fake_ollama.default_step = Step(text=reply)
    env = base_env(home, fake_ollama)
    d = daemon_factory(env, home, "--dashboard-port", "0").wait_ready()
    port = dashboard_port(home, d)
    conv_id = cli_here(env, "new", "redos").stdout.strip()
    conv = Conv(home.active / conv_id)
    cli_here(env, "send", conv_id, "Say it.", "--schema", json.dumps(schema))
    slowest = 0.0
    deadline = time.monotonic() + 60
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=1.0) as client:
        while True:  # a bounded poll: what is measured is the daemon's answer while it works
            asked = time.monotonic()
            assert client.get("/health").json()["ok"] is True
            slowest = max(slowest, time.monotonic() - asked)
            blocks = model_blocks(conv) if conv.log.exists() else []
            if blocks and any(k is MarkerKind.ERROR for k, _ in blocks[-1].markers):
                break
            assert time.monotonic() < deadline, "no verdict on the hostile reply in 60 s"
            time.sleep(0.05)
    assert slowest < 1.0
    [(kind, text)] = blocks[-1].markers
    assert kind is MarkerKind.ERROR
    assert text.startswith("the reply does not match the schema after one retry: ")
    assert "does not match" in text.partition("retry: ")[2]
    assert len(fake_ollama.chat_requests()) == 2
    stopped = time.monotonic()
    assert d.stop(timeout=15) == 0
    assert time.monotonic() - stopped < 15


def test_a_recursive_schema_is_refused_at_send_and_in_the_inbox_it_is_never_asked(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama, CONTEMPLATION_RESCAN_INTERVAL="0.2")
    conv_id = cli_here(env, "new", "recursive").stdout.strip()
    conv = Conv(home.active / conv_id)
    refused = cli_here(env, "send", conv_id, "Hi", "--schema", json.dumps(RECURSIVE), check=False)
    assert refused.returncode == 1 and refused.stdout == ""
    [line] = refused.stderr.strip().splitlines()
    assert "the schema's $ref at / refers back to itself (#) without going into" in line, line
    assert list(conv.inbox.iterdir()) == []

    (conv.inbox / "by-hand.txt").write_text(structured.with_schema("Hi", LOOP))
    d = daemon_factory(env, home).wait_ready()
    wait_for(
        lambda: conv.log.exists() and "refers back to itself" in conv.log.read_text(),
        15,
        what="the refusal's NOTE",
    )
    # the NOTE is committed before the file leaves processing/ (a crash between says it
    # twice, never loses it): the move follows it
    wait_for(lambda: any(conv.failed.glob("*by-hand.txt")), 15, what="the file in failed/")
    # a recursive schema appended to the log by hand: the turn is free-form, answered once
    fake_ollama.default_step = Step(text="Hello.")
    with conv_lock(conv), conv.log.open("a") as f:  # a hand append takes the lock (docs)
        f.write(
            f"\n=== CLAUDE -> OLLAMA [2026-11-25 10:00:00] ===\nSCHEMA: {json.dumps(LOOP)}\nHi\n"
        )
    wait_for(lambda: len(fake_ollama.chat_requests()) >= 1, 15, what="the free-form turn")
    wait_for(lambda: "Hello." in conv.log.read_text(), 15, what="the reply")
    d.stop()
    [sent] = fake_ollama.chat_requests()
    assert "format" not in sent


def test_a_turn_that_fails_the_same_way_twice_after_streaming_is_not_redone(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    """A reply that crashes the turn after it streamed (a tool call written as JSON nested
    deeper than Python's parser went, fixed since; here a fault injected after the reply's
    last token) was redone at every rescan: 158 model requests for one message. Now twice,
    then one ERROR that names the cause, and the conversation waits."""
    fake_ollama.default_step = Step(text="A reply.", chunks=4)
    env = base_env(home, fake_ollama, CONTEMPLATION_RESCAN_INTERVAL="0.2")
    env |= {"CONTEMPLATION_TESTING": "1", "CONTEMPLATION_RAISE_AT": "reply_done"}
    d = daemon_factory(env, home).wait_ready()
    conv_id = cli(env, "new", "crash", "--message", "Go.").stdout.strip()
    conv = Conv(home.active / conv_id)

    def gave_up() -> bool:
        st = read_state(conv)
        return st is not None and st.status is Status.ERROR

    wait_for(gave_up, 30, what="the turn to be given up")
    settled_at = len(fake_ollama.chat_requests())
    # many rescans (0.2 s apart) later, nothing more was asked
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert len(fake_ollama.chat_requests()) == settled_at
        time.sleep(0.1)
    d.stop()
    assert settled_at == 2
    blocks = model_blocks(conv)
    assert len(blocks) == 2
    [(kind, first)] = blocks[0].markers
    assert kind is MarkerKind.INTERRUPTED and "InjectedFault" in first
    [(kind, last)] = blocks[1].markers
    assert kind is MarkerKind.ERROR and "InjectedFault" in last and "twice" in last
    st = read_state(conv)
    assert st is not None and st.last_error is not None and "InjectedFault" in st.last_error.message
    # the agent's next message is answered again (the fault gone, as a fixed bug is)
    fake_ollama.default_step = Step(text="Fine.")
    del env["CONTEMPLATION_RAISE_AT"]
    d = daemon_factory(env, home).wait_ready()
    cli(env, "send", conv_id, "Try again.", "--wait", "--timeout", "30")
    d.stop()
    assert model_blocks(conv)[-1].text == "Fine."


def test_a_checker_whose_daemon_is_gone_ends_itself_after_its_time_limit() -> None:
    """A daemon killed with SIGKILL cannot kill its checker: the child's own alarm does."""
    payload = json.dumps({"schema": dag(40), "text": '"x"', "seconds": 1})
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "contemplation.protocol.replycheck"],
        input=payload,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == -signal.SIGALRM, done
    assert 1.5 < time.monotonic() - started < 10
