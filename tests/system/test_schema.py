"""Structured answers: a message's JSON Schema goes to the server in its own wire
shape (Ollama ``format``, OpenAI ``response_format``; an instruction for OpenCode), the reply
is validated (one retry with the validator's message, then an ERROR marker), and the faces
return the parsed object. The fake servers record the exact request bodies; the last test
runs the real llama-server with SmolLM2."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contemplation.engine.pipeline import Runtime
from contemplation.errors import ConfigError, InputRejected
from contemplation.faces.reading import Reader
from contemplation.models import BlockKind, MarkerKind, Status
from contemplation.protocol import structured
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import claim, drop_message, ensure_home, new_conversation
from tests import realpeers
from tests.conftest import DaemonProc, base_env, cli, cli_here, run_burst, runtime_for
from tests.fakes.ollama_server import FakeOllama, Step
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.openai_server import Step as OpenAIStep
from tests.fakes.opencode_server import FakeOpenCode
from tests.fakes.opencode_server import Step as OpenCodeStep

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


def make_conv(home: Home, backend: str = "ollama", model: str = "llama3.2") -> Conv:
    ensure_home(home)
    return new_conversation(
        home, "cities", template=load_template(home, "default"), model=model, backend=backend
    )


def ask(conv: Conv, text: str, schema: dict[str, Any] = CITY) -> None:
    drop_message(conv, structured.with_schema(text, schema))


def model_blocks(conv: Conv) -> list[Any]:
    return [b for b in parse(conv.log.read_bytes()).blocks if b.kind is BlockKind.MODEL]


def status(conv: Conv) -> Status:
    st = read_state(conv)
    assert st is not None
    return st.status


# --------------------------------------------------------------------------- the schema


def test_a_schema_is_json_text_or_a_file_and_a_bad_one_is_refused_with_one_line(
    tmp_path: Path,
) -> None:
    assert structured.load_schema(json.dumps(CITY), 16384) == CITY
    f = tmp_path / "city.json"
    f.write_text(json.dumps(CITY, indent=2))
    assert structured.load_schema(str(f), 16384) == CITY
    cases = {
        "{not json": "the schema is not JSON: ",
        '["a list"]': "the schema is neither JSON nor a readable file",  # JSON text is {…}
        '{"type": 12}': "the schema is not a valid JSON Schema: 12 is not valid under any",
        '{"type": "object", "required": "city"}': 'the schema is not a valid JSON Schema: "city" is not of type "array"',
        json.dumps(
            {"description": "x" * 200}
        ): "the schema is 218 bytes; the limit is 100 (max_schema_bytes)",
        str(tmp_path / "missing.json"): "the schema is neither JSON nor a readable file: ",
    }
    for source, start in cases.items():
        with pytest.raises(InputRejected) as err:
            structured.load_schema(source, 100 if "description" in source else 16384)
        message = str(err.value)
        assert "\n" not in message
        assert message.startswith(start), message
    list_file = tmp_path / "list.json"
    list_file.write_text("[1]")
    with pytest.raises(InputRejected, match="is not a JSON object"):
        structured.load_schema(str(list_file), 16384)


def test_only_a_first_line_schema_object_is_a_schema_line() -> None:
    assert structured.split('SCHEMA: {"type":"object"}\nhi') == ('{"type":"object"}', "hi")
    assert structured.split("SCHEMA: for the new tables\nhi") == (
        None,
        "SCHEMA: for the new tables\nhi",
    )
    assert structured.split('hi\nSCHEMA: {"type":"object"}')[0] is None


# --------------------------------------------------------------------------- wire shapes


def test_ollama_gets_the_schema_object_as_format_and_the_reply_is_parsed(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home)
    ask(conv, "The largest city of France?")
    fake_ollama.enqueue(Step(text='{"city": "Paris", "population": 2100000}'))
    run_burst(runtime_for(make_settings(fake_ollama)))
    [sent] = fake_ollama.chat_requests()
    assert sent["format"] == CITY
    assert "tools" not in sent
    # no NEED protocol (a constrained reply cannot ask), and the SCHEMA line is not words
    assert "NEED" not in sent["messages"][0]["content"]
    assert sent["messages"][1:] == [{"role": "user", "content": "The largest city of France?"}]
    [reply] = model_blocks(conv)
    assert (MarkerKind.NOTE, structured.VALID_NOTE) in reply.markers
    assert status(conv) is Status.IDLE
    got = Reader(home).since(conv, 0).blocks
    assert got[-1]["parsed"] == {"city": "Paris", "population": 2100000}
    assert "parsed" not in got[0]


def test_openai_gets_response_format_json_schema_strict(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    fake = FakeOpenAI().start()
    try:
        conv = make_conv(home, backend="openai", model="smollm2")
        ask(conv, "The largest city of Italy?")
        fake.enqueue(OpenAIStep(pieces=['{"city": "Rome", ', '"population": 2800000}']))
        run_burst(runtime_for(make_settings(openai={"base_url": fake.url})))
        [sent] = fake.chat_requests()
    finally:
        fake.stop()
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": CITY, "strict": True},
    }
    assert sent["messages"][-1] == {"role": "user", "content": "The largest city of Italy?"}
    got = Reader(home).since(conv, 0).blocks
    assert got[-1]["parsed"] == {"city": "Rome", "population": 2800000}


def test_opencode_cannot_constrain_so_the_schema_is_an_instruction_in_the_prompt(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    fake = FakeOpenCode().start()
    try:
        conv = make_conv(home, backend="opencode", model="local/smollm2")
        ask(conv, "The largest city of Spain?")
        fake.enqueue(OpenCodeStep(text='{"city": "Madrid", "population": 3300000}'))
        run_burst(runtime_for(make_settings(opencode={"url": fake.url})))
        [prompt] = fake.calls("POST", "/message")
    finally:
        fake.stop()
    [part] = prompt["body"]["parts"]
    assert part["text"] == (
        f"The largest city of Spain?\n\n{structured.INSTRUCTION}\n{structured.compact(CITY)}"
    )
    assert "format" not in prompt["body"] and "response_format" not in prompt["body"]
    assert Reader(home).since(conv, 0).blocks[-1]["parsed"]["city"] == "Madrid"


# --------------------------------------------------------------------------- retry, then ERROR


def test_an_invalid_reply_gets_one_retry_with_the_validators_message(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home)
    ask(conv, "The largest city of France?")
    fake_ollama.enqueue(
        Step(text='{"city": "Paris"}'), Step(text='{"city": "Paris", "population": 2100000}')
    )
    run_burst(runtime_for(make_settings(fake_ollama)))
    first, second = fake_ollama.chat_requests()
    assert first["format"] == second["format"] == CITY
    why = '"population" is a required property'  # jsonschema-rs's words (replycheck.py)
    assert second["messages"][-2:] == [
        {"role": "assistant", "content": '{"city": "Paris"}'},
        {"role": "user", "content": f"{structured.RETRY_HEAD} {why}"},
    ]
    missed, answer = model_blocks(conv)
    assert missed.markers == (
        (MarkerKind.INTERRUPTED, f"{structured.RETRY_PREFIX}; asked once more: {why}"),
    )
    assert (MarkerKind.NOTE, structured.VALID_NOTE) in answer.markers
    assert status(conv) is Status.IDLE
    got = [b for b in Reader(home).since(conv, 0).blocks if b["kind"] == "model"]
    assert "parsed" not in got[0] and got[0]["interrupted"]
    assert got[1]["parsed"] == {"city": "Paris", "population": 2100000}


def test_a_second_invalid_reply_ends_with_an_error_that_says_what_was_wrong(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home)
    ask(conv, "The largest city of France?")
    fake_ollama.enqueue(
        Step(text="Paris, I think."), Step(text='{"city": "Paris", "population": "many"}')
    )
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert len(fake_ollama.chat_requests()) == 2  # one retry, no more
    missed, failed = model_blocks(conv)
    [(kind, text)] = missed.markers
    assert kind is MarkerKind.INTERRUPTED and "not valid JSON (Expecting value" in text
    why = 'the reply does not match the schema after one retry: "many" is not of type "integer" (at /population)'
    assert failed.markers == ((MarkerKind.ERROR, why),)
    st = read_state(conv)
    assert st is not None and st.status is Status.ERROR
    assert st.last_error is not None and st.last_error.message == why
    assert st.last_error.kind == "protocol"
    # the agent's next message starts over, with the schema it carries (none: free-form)
    drop_message(conv, "Never mind.")
    fake_ollama.enqueue(Step(text="Fine."))
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert "format" not in fake_ollama.chat_requests()[-1]
    assert status(conv) is Status.IDLE


# --------------------------------------------------------------------------- durability, bad input


def test_the_schema_survives_a_kill_between_the_claim_and_the_turn(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    """The schema is the message's first line: it is wherever the message is. Claimed into
    processing/ (a kill right after the claim), or already a block in the log with its file
    gone (a kill after the append): the turn sends the same format."""
    conv = make_conv(home)
    ask(conv, "Largest city of Peru?")
    [entry] = list(conv.inbox.iterdir())
    assert claim(conv, entry) is not None  # the daemon died here
    fake_ollama.enqueue(Step(text='{"city": "Lima", "population": 9700000}'))
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert fake_ollama.chat_requests()[-1]["format"] == CITY

    other = make_conv(home)  # the block is in the log; nothing in inbox/ or processing/
    line = structured.with_schema("Largest city of Chile?", CITY)
    with other.log.open("a") as f:
        f.write(f"=== CLAUDE -> OLLAMA [2026-11-25 10:00:00] ===\n{line}\n")
    fake_ollama.enqueue(Step(text='{"city": "Santiago", "population": 6300000}'))
    run_burst(runtime_for(make_settings(fake_ollama, settle_seconds=0)))
    assert fake_ollama.chat_requests()[-1]["format"] == CITY
    assert Reader(home).since(other, 0).blocks[-1]["parsed"]["city"] == "Santiago"


def test_a_dropped_file_with_a_bad_schema_goes_to_failed_with_the_reason(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home)
    drop_message(conv, 'SCHEMA: {"type": "object", "properties": 3}\nLargest city?', name="q.txt")
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert fake_ollama.chat_requests() == []
    [kept] = [p for p in conv.failed.iterdir() if not p.name.endswith(".reason.json")]
    reason = json.loads(kept.with_name(kept.name + ".reason.json").read_text())["reason"]
    assert reason.startswith(
        "the message's SCHEMA line is not a valid JSON Schema: 3 is not of type \"object\""
    )
    assert "Largest city?" in kept.read_text()
    assert (
        "was not taken: the message's SCHEMA line is not a valid JSON Schema"
        in conv.log.read_text()
    )


def test_a_template_schema_holds_every_message_and_a_bad_one_is_refused(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    ensure_home(home)
    folder = home.templates / "city"
    folder.mkdir(parents=True)
    (folder / "template.toml").write_text(
        'description = "cities"\n[schema]\ntype = "object"\nrequired = ["city"]\n'
        '[schema.properties.city]\ntype = "string"\n'
    )
    tpl = load_template(home, "city")
    assert tpl.schema == {
        "type": "object",
        "required": ["city"],
        "properties": {"city": {"type": "string"}},
    }
    conv = new_conversation(home, "t", template=tpl, model="llama3.2", backend="ollama")
    drop_message(conv, "Largest city of Japan?")
    fake_ollama.enqueue(Step(text='{"city": "Tokyo"}'))
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert fake_ollama.chat_requests()[-1]["format"] == tpl.schema
    assert Reader(home).since(conv, 0).blocks[-1]["parsed"] == {"city": "Tokyo"}

    (folder / "template.toml").write_text('schema = "{\\"type\\": 5}"\n')
    with pytest.raises(
        ConfigError,
        match=r"invalid schema in template .*template.toml: the template's schema is not a valid JSON Schema",
    ):
        load_template(home, "city")


# --------------------------------------------------------------------------- the CLI and MCP


def test_send_schema_wait_json_returns_the_parsed_object(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    env = base_env(home, fake_ollama)
    conv_id = cli_here(env, "new", "cities").stdout.strip()
    refused = cli_here(env, "send", conv_id, "Largest city?", "--schema", '{"type": 1}', check=False)
    assert refused.returncode != 0 and refused.stdout == ""
    assert refused.stderr.strip().endswith(
        "the schema is not a valid JSON Schema: 1 is not valid under any of the schemas listed in the 'anyOf' keyword (at /type)"
    )
    assert len(refused.stderr.strip().splitlines()) == 1
    assert list(Conv(home.active / conv_id).inbox.iterdir()) == []

    daemon_factory(env, home).wait_ready()
    schema_file = tmp_path / "city.json"
    schema_file.write_text(json.dumps(CITY))
    fake_ollama.enqueue(Step(text='{"city": "Oslo", "population": 700000}'))
    done = cli_here(
        env, "send", conv_id, "Largest city of Norway?", "--schema", str(schema_file),
        "--wait", "--json", "--timeout", "30",
    )  # fmt: skip
    out = json.loads(done.stdout)
    assert out["parsed"] == {"city": "Oslo", "population": 700000}
    assert out["text"] == '{"city": "Oslo", "population": 700000}'
    assert out["status"] == "idle" and out["exit_code"] == 0
    assert [b["kind"] for b in out["blocks"]] == ["model"]
    assert fake_ollama.chat_requests()[-1]["format"] == CITY
    again = json.loads(cli_here(env, "wait", conv_id, "--json", "--timeout", "30").stdout)
    assert again["parsed"] == out["parsed"]


def test_mcp_respond_and_start_take_a_schema(home: Home) -> None:
    from mcp import Client

    from contemplation import settings as settings_mod
    from contemplation.faces.mcp import server as mcp_server

    settings = settings_mod.load(home=home.root, env={}, config=None)

    async def script() -> tuple[dict[str, Any], str, str]:
        async with Client(mcp_server.build_server(settings)) as c:
            started = await c.call_tool(
                "conversation_start",
                {"topic": "cities", "initial_prompt": "Largest?", "schema": CITY},
            )
            out = json.loads(getattr(started.content[0], "text", ""))
            bad = await c.call_tool(
                "conversation_respond",
                {"conversation_id": out["conversation_id"], "response": "x", "schema": {"type": 7}},
            )
            alone = await c.call_tool("conversation_start", {"topic": "t2", "schema": CITY})
            return out, getattr(bad.content[0], "text", ""), getattr(alone.content[0], "text", "")

    out, bad, alone = asyncio.run(script())
    conv = Conv(home.active / out["conversation_id"])
    [queued] = list(conv.inbox.iterdir())
    assert queued.read_text() == structured.with_schema("Largest?", CITY)
    assert "the schema is not a valid JSON Schema" in bad
    assert "a schema goes with a message" in alone


# --------------------------------------------------------------------------- real llama-server


@pytest.mark.real
def test_real_llama_server_constrains_smollm2_to_the_schema(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    llama = realpeers.shared_llama_server()
    rt = Runtime(settings=make_settings(openai={"base_url": llama.url}), home=home)
    conv = make_conv(home, backend="openai", model="smollm2")
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    data = json.loads(conv.metadata.read_text())
    data["options"] = {"num_predict": 64, "temperature": 0}
    conv.metadata.write_text(json.dumps(data))
    ask(conv, "Name one city and the country it is in.", schema)
    run_burst(rt)
    [reply] = model_blocks(conv)
    assert (MarkerKind.NOTE, structured.VALID_NOTE) in reply.markers, conv.log.read_text()
    value = Reader(home).since(conv, 0).blocks[-1]["parsed"]
    assert set(value) == {"city", "country"} and all(isinstance(v, str) for v in value.values())
    assert structured.problem(reply.text, schema) is None


@pytest.mark.real
def test_the_embedded_local_backend_constrains_too() -> None:
    """xllamacpp runs llama-server's own engine in process: the same response_format holds."""
    from dataclasses import replace

    from contemplation.backends.base import PhaseTimeouts
    from contemplation.backends.local import LocalBackend
    from contemplation.models import ChatMessage, ChatRequest
    from tests import peers

    peers.xllamacpp_available()
    peers.smollm2_gguf()
    schema = {
        "type": "object",
        "properties": {"fruit": {"type": "string"}, "colour": {"type": "string"}},
        "required": ["fruit", "colour"],
    }
    request = ChatRequest(
        "smollm2",
        (ChatMessage("user", "Name a fruit and its colour."),),
        options={"num_predict": 48, "temperature": 0},
    )
    backend = LocalBackend(timeouts=PhaseTimeouts(connect=1, first_byte=60, idle=30, total=120))
    assert backend.structured_output

    async def go() -> str:
        events = [ev async for ev in backend.stream(replace(request, schema=schema))]
        return "".join(ev.text for ev in events if ev.kind == "content")

    text = asyncio.run(go())
    assert structured.problem(text, schema) is None, text


def test_a_ref_is_never_fetched_and_a_hand_appended_bad_schema_leaves_the_turn_free(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    port = realpeers.free_port()  # nothing listens there; a fetch would fail differently
    remote = {"$ref": f"http://127.0.0.1:{port}/city.json"}
    with pytest.raises(InputRejected, match="Retrieval is disabled, cannot fetch http"):
        structured.check_schema(remote, 16384)
    conv = make_conv(home)
    ask(conv, "Largest city?", remote)  # by hand, past the faces: refused when it is taken
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert fake_ollama.chat_requests() == []
    assert "the message's SCHEMA line cannot be used: Resource 'http" in conv.log.read_text()

    other = make_conv(home)
    with other.log.open("a") as f:
        f.write('=== CLAUDE -> OLLAMA [2026-11-25 10:00:00] ===\nSCHEMA: {"type": 5}\nHi\n')
    fake_ollama.enqueue(Step(text="Hello."))
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert "format" not in fake_ollama.chat_requests()[-1]
    assert status(other) is Status.IDLE


KILL_POINTS = ("claim", "intent", "append", "appended", "commit", "reply_header", "reply_stream", "reply_done")  # fmt: skip


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_sigkill_at_each_step_of_a_schema_turn_keeps_the_schema(
    home: Home, fake_ollama: FakeOllama, point: str
) -> None:
    """A real daemon process (``run --once``) killed at each step from the claim to the
    reply's commit: the turn that is redone still sends the schema, and its one whole reply
    is the parsed answer."""
    from contemplation.protocol.conversation import whole

    answer = '{"city": "Quito", "population": 2800000}'
    fake_ollama.default_step = Step(text=answer, chunks=4)
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    conv = make_conv(home)
    ask(conv, "Largest city of Ecuador?")

    def run_once(**extra: str) -> int:
        return cli(env | extra, "run", "--once", check=False).returncode

    assert run_once(CONTEMPLATION_TESTING="1", CONTEMPLATION_CRASH_AT=f"{point}:1") == -9
    assert run_once() == 0
    sent = fake_ollama.chat_requests()
    assert sent and all(r["format"] == CITY for r in sent)
    blocks = parse(conv.log.read_bytes()).blocks
    assert [b.text for b in blocks if b.kind is BlockKind.AGENT] == [
        structured.with_schema("Largest city of Ecuador?", CITY)
    ]
    [reply] = [b for b in blocks if b.kind is BlockKind.MODEL and whole(b)]
    assert reply.text == answer and (MarkerKind.NOTE, structured.VALID_NOTE) in reply.markers
    assert status(conv) is Status.IDLE
    assert Reader(home).since(conv, 0).blocks[-1]["parsed"]["city"] == "Quito"


def test_a_schema_turn_gathers_the_context_requirements_and_offers_no_need_lines(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home)
    data = json.loads(conv.metadata.read_text())
    data["context_requirements"] = [{"type": "constraints", "text": "Only cities in Europe."}]
    conv.metadata.write_text(json.dumps(data))
    ask(conv, "Largest city?")
    fake_ollama.enqueue(Step(text='{"city": "Istanbul", "population": 15600000}'))
    run_burst(runtime_for(make_settings(fake_ollama)))
    system = fake_ollama.chat_requests()[-1]["messages"][0]["content"]
    assert "Only cities in Europe." in system
    assert "NEED" not in system and "=== COMPLETE ===" not in system
