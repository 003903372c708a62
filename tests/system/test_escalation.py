"""The escalation ladder: when the small model fails for a named cause, the next rung takes the
turn, and the log says why (one ``ESCALATED`` marker after the failed reply, which stays).

Each cause with the strict scripted Ollama: every request is scripted for one model (a step
with ``model=``), and the count of requests each model got is asserted, so a rung asked twice,
or a small model asked again after its failure, fails the test."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from contemplation.errors import ConfigError
from contemplation.faces.mcp.calls import Faces
from contemplation.faces.reading import Reader
from contemplation.models import Block, BlockKind, MarkerKind, Status
from contemplation.protocol import escalation, structured
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, ensure_home, new_conversation
from tests.conftest import base_env, cli_here, run_burst, runtime_for
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_crash import run_once

SMALL, BIG = "llama3.2", "qwen3"
LOOP = "the queue and the folder and " * 120  # the loop watch stops this (a loop of words)
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
}


def ladder_settings(
    make_settings: Callable[..., Settings],
    fake: FakeOllama,
    escalate: list[str] | None = None,
    *,
    sticky: bool = True,
    **overrides: Any,
) -> Settings:
    alias = {
        "model": SMALL,
        "providers": ["ollama"],
        "escalate": escalate if escalate is not None else [BIG, "agent"],
        "sticky": sticky,
    }
    return make_settings(fake, aliases={"small": alias}, stop_repeating=True, **overrides)


def small_conv(home: Home) -> Conv:
    ensure_home(home)
    tpl = load_template(home, "default")
    return new_conversation(home, "ladder", template=tpl, model="small", backend="small")


def models_asked(fake: FakeOllama) -> list[str]:
    return [r["model"] for r in fake.chat_requests()]


def model_blocks(conv: Conv) -> list[Block]:
    return [b for b in parse(conv.log.read_bytes()).blocks if b.kind is BlockKind.MODEL]


def escalated(block: Block) -> list[str]:
    return [t for k, t in block.markers if k is MarkerKind.ESCALATED]


def answered_by(block: Block) -> str | None:
    return escalation.rung_of(block)


def status(conv: Conv) -> Status:
    st = read_state(conv)
    assert st is not None
    return st.status


def test_a_loop_goes_to_the_next_rung_and_the_failed_reply_stays_marked(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = small_conv(home)
    drop_message(conv, "Why is a folder a good queue?")
    fake_ollama.enqueue(
        Step(text=LOOP, model=SMALL), Step(text="Because renames are atomic.", model=BIG)
    )
    run_burst(runtime_for(ladder_settings(make_settings, fake_ollama)))
    assert models_asked(fake_ollama) == [SMALL, BIG]
    failed, answer = model_blocks(conv)
    assert "the queue and the folder" in failed.text  # what it said is kept
    assert escalated(failed) == [f"stopped repeating itself{escalation.ARROW}{BIG}"]
    assert failed.markers[-1][0] is MarkerKind.ESCALATED
    assert answer.text.strip() == "Because renames are atomic."
    assert answered_by(answer) == BIG
    assert status(conv) is Status.IDLE
    # the next rung answers the agent's message afresh: the loop is not in its history
    big = fake_ollama.chat_requests()[1]["messages"]
    assert big[-1]["role"] == "user" and "folder a good queue" in big[-1]["content"]
    assert not any("the queue and the folder" in (m.get("content") or "") for m in big)
    assert "=== ESCALATED: stopped repeating itself → qwen3 ===" in conv.log.read_text()


def test_sticky_keeps_the_rung_and_not_sticky_goes_back_to_the_small_model(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    for sticky, second in ((True, BIG), (False, SMALL)):
        conv = small_conv(home)
        drop_message(conv, "First?")
        fake_ollama.enqueue(Step(text=LOOP, model=SMALL), Step(text="One.", model=BIG))
        settings = ladder_settings(make_settings, fake_ollama, sticky=sticky)
        run_burst(runtime_for(settings))
        fake_ollama.requests.clear()
        drop_message(conv, "Second?")
        fake_ollama.enqueue(Step(text="Two.", model=second))
        run_burst(runtime_for(settings))
        assert models_asked(fake_ollama) == [second], sticky
        last = model_blocks(conv)[-1]
        assert last.text.strip() == "Two."
        assert answered_by(last) == (BIG if sticky else None)
        fake_ollama.requests.clear()


def test_the_top_of_the_ladder_is_the_agent_and_the_turn_waits_saying_why(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = small_conv(home)
    drop_message(conv, "Loop, please.")
    fake_ollama.enqueue(Step(text=LOOP, model=SMALL), Step(text=LOOP, model=BIG))
    run_burst(runtime_for(ladder_settings(make_settings, fake_ollama)))
    assert models_asked(fake_ollama) == [SMALL, BIG]  # and nobody after the agent's rung
    first, second = model_blocks(conv)
    assert escalated(first) == [f"stopped repeating itself{escalation.ARROW}{BIG}"]
    assert escalated(second) == [f"stopped repeating itself{escalation.ARROW}agent"]
    st = read_state(conv)
    assert st is not None and st.status is Status.ERROR
    assert st.last_error is not None
    assert st.last_error.message == f"escalated to the agent: stopped repeating itself on {BIG}"
    assert Faces(ladder_settings(make_settings, fake_ollama)).check(conv.id)["activity"] == (
        f"the last turn failed: escalated from {BIG} to agent: stopped repeating itself"
    )
    # the agent's next message is answered by the rung that last answered (sticky)
    fake_ollama.requests.clear()
    drop_message(conv, "Try again, briefly.")
    fake_ollama.enqueue(Step(text="Briefly: yes.", model=BIG))
    run_burst(runtime_for(ladder_settings(make_settings, fake_ollama)))
    assert models_asked(fake_ollama) == [BIG]
    assert status(conv) is Status.IDLE


def test_a_rule_turned_off_leaves_the_failure_as_it_was(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = small_conv(home)
    drop_message(conv, "Loop, please.")
    fake_ollama.enqueue(Step(text=LOOP, model=SMALL))
    run_burst(runtime_for(ladder_settings(make_settings, fake_ollama, escalation={"loop": False})))
    assert models_asked(fake_ollama) == [SMALL]
    [block] = model_blocks(conv)
    assert escalated(block) == []
    assert status(conv) is Status.IDLE


def test_a_cut_at_the_token_limit_goes_on_once_then_goes_up(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = small_conv(home)
    drop_message(conv, "List the colours.")
    fake_ollama.enqueue(
        Step(text="Red, orange,", done_reason="length", model=SMALL),
        Step(text=" yellow,", done_reason="length", model=SMALL),
        Step(text="Red, orange, yellow, green, blue.", model=BIG),
    )
    run_burst(runtime_for(ladder_settings(make_settings, fake_ollama)))
    assert models_asked(fake_ollama) == [SMALL, SMALL, BIG]
    first, second, answer = model_blocks(conv)
    assert (
        MarkerKind.GO_ON,
        "asked by the escalation ladder once (the reply was cut at the token limit)",
    ) in first.markers
    assert escalated(second) == [
        f"cut at the token limit after one continue{escalation.ARROW}{BIG}"
    ]
    assert answered_by(answer) == BIG
    big = fake_ollama.chat_requests()[2]["messages"]
    assert big[-1] == {"role": "user", "content": "List the colours."} or (
        big[-1]["role"] == "user" and big[-1]["content"].startswith("List the colours.")
    )  # neither partial reply is in its history
    assert not any("orange" in (m.get("content") or "") for m in big)


def test_a_schema_missed_after_its_retry_goes_up_and_the_rung_gets_its_own_retry(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = small_conv(home)
    drop_message(conv, structured.with_schema("The largest city of France?", CITY))
    fake_ollama.enqueue(
        Step(text="Paris.", model=SMALL),
        Step(text='{"city": "Paris"}', model=SMALL),
        Step(text='{"city": "Paris"}', model=BIG),
        Step(text='{"city": "Paris", "population": 2100000}', model=BIG),
    )
    run_burst(runtime_for(ladder_settings(make_settings, fake_ollama)))
    assert models_asked(fake_ollama) == [SMALL, SMALL, BIG, BIG]
    blocks = model_blocks(conv)
    assert escalated(blocks[1]) == [
        f"did not match its schema after one retry{escalation.ARROW}{BIG}"
    ]
    assert not any(k is MarkerKind.ERROR for k, _ in blocks[1].markers)
    first_big = fake_ollama.chat_requests()[2]["messages"]
    assert not first_big[-1]["content"].startswith(structured.RETRY_HEAD)  # its own first try
    assert (MarkerKind.NOTE, structured.VALID_NOTE) in blocks[-1].markers
    assert status(conv) is Status.IDLE


def test_a_backend_error_after_its_retries_goes_up(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = small_conv(home)
    drop_message(conv, "Hello?")
    fake_ollama.enqueue(
        Step(kind="error", status=400, error="invalid options", model=SMALL),
        Step(text="Hello.", model=BIG),
    )
    run_burst(runtime_for(ladder_settings(make_settings, fake_ollama)))
    assert models_asked(fake_ollama) == [SMALL, BIG]
    text = conv.log.read_text()
    assert "=== ESCALATED: the backend failed after its retries (" in text
    assert f"{escalation.ARROW}{BIG} ===" in text
    [answer] = model_blocks(conv)
    assert answer.text.strip() == "Hello." and answered_by(answer) == BIG
    st = read_state(conv)
    assert st is not None and st.status is Status.IDLE


def test_the_need_round_limit_goes_up(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = small_conv(home)
    drop_message(conv, "What is in the notes?")
    fake_ollama.enqueue(
        Step(text="NEED: File contents of nowhere-1.txt", model=SMALL),
        Step(text="NEED: File contents of nowhere-2.txt", model=SMALL),
        Step(text="I could not read them.", model=BIG),
    )
    settings = ladder_settings(make_settings, fake_ollama, max_need_rounds=1)
    run_burst(runtime_for(settings))
    assert models_asked(fake_ollama) == [SMALL, SMALL, BIG]
    blocks = model_blocks(conv)
    assert escalated(blocks[1]) == [
        f"hit the need-round limit (2 rounds, max_need_rounds = 1){escalation.ARROW}{BIG}"
    ]
    assert answered_by(blocks[-1]) == BIG
    assert status(conv) is Status.IDLE


# --------------------------------------------------------------------------- bad ladders


@pytest.mark.parametrize(
    ("escalate", "why"),
    [
        (["", "agent"], "rung 1 is empty"),
        (["agent", "qwen3"], "rung 1 is agent: the agent can only be the last rung"),
        (["small"], "rung 1 ('small') is the ladder's own 'small': a cycle"),
        (["qwen3", "qwen3"], "rung 2 ('qwen3') is named twice: a cycle"),
        (["alias:nope"], "rung 1 ('alias:nope'): no alias named 'nope'"),
        (["panel:qwen3"], "a panel is panel:MODEL,MODEL (two at least)"),
        (["panel:"], "a panel is panel:MODEL,MODEL (two at least)"),  # no seat at all
        (["panel:qwen3,alias:nope"], "rung 1 ('panel:qwen3,alias:nope'): seat 2 names no alias"),
        (["panel:panel:a,b,c"], "seat 1 is a panel; panels do not nest"),
        ([f"m{i}" for i in range(9)], "9 rungs; at most 8"),
    ],
)
def test_a_bad_ladder_is_a_configuration_error_in_one_line(
    home: Home,
    fake_ollama: FakeOllama,
    make_settings: Callable[..., Settings],
    escalate: list[str],
    why: str,
) -> None:
    with pytest.raises(ConfigError) as err:
        ladder_settings(make_settings, fake_ollama, escalate)
    assert "aliases.small.escalate" in str(err.value) and why in str(err.value)


# --------------------------------------------------------------------------- across a crash


def test_a_kill_after_the_marker_redoes_only_the_next_rung(
    home: Home, fake_ollama: FakeOllama
) -> None:
    """The daemon killed once the ESCALATED marker is durable, before the next rung is asked:
    the next start asks that rung once, never the small model again, never the rung twice."""
    env = base_env(home, fake_ollama, CONTEMPLATION_STOP_REPEATING="true")
    config = home.root.parent / "xdg-config" / "contemplation" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        f'[aliases.small]\nmodel = "{SMALL}"\nproviders = ["ollama"]\n'
        f'escalate = ["{BIG}", "agent"]\n'
    )
    conv = small_conv(home)
    drop_message(conv, "Why is a folder a good queue?")
    fake_ollama.enqueue(Step(text=LOOP, model=SMALL), Step(text="Atomic renames.", model=BIG))
    assert run_once(env, "escalated:1") == -9  # killed there
    assert models_asked(fake_ollama) == [SMALL]
    [failed] = model_blocks(conv)
    assert escalated(failed) == [f"stopped repeating itself{escalation.ARROW}{BIG}"]
    assert run_once(env) == 0
    assert models_asked(fake_ollama) == [SMALL, BIG]
    failed, answer = model_blocks(conv)
    assert answer.text.strip() == "Atomic renames." and answered_by(answer) == BIG
    assert status(conv) is Status.IDLE
    assert run_once(env) == 0  # nothing more is due
    assert models_asked(fake_ollama) == [SMALL, BIG]


def test_a_kill_after_a_backend_errors_marker_asks_the_next_rung_once(
    home: Home, fake_ollama: FakeOllama
) -> None:
    """The same across the error path: the marker written after the agent's message (no reply
    began), the daemon killed there; the next start asks the next rung once."""
    env = base_env(home, fake_ollama)
    write_config(home)
    conv = small_conv(home)
    drop_message(conv, "Hello?")
    fake_ollama.enqueue(
        Step(kind="error", status=400, error="invalid options", model=SMALL),
        Step(text="Hello.", model=BIG),
    )
    assert run_once(env, "escalated:1") == -9
    assert models_asked(fake_ollama) == [SMALL]
    assert f"{escalation.ARROW}{BIG} ===" in conv.log.read_text()
    assert run_once(env) == 0
    assert models_asked(fake_ollama) == [SMALL, BIG]
    [answer] = model_blocks(conv)
    assert answer.text.strip() == "Hello." and answered_by(answer) == BIG
    assert run_once(env) == 0
    assert models_asked(fake_ollama) == [SMALL, BIG]


# --------------------------------------------------------------------------- every face


def write_config(home: Home) -> None:
    config = home.root.parent / "xdg-config" / "contemplation" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        f'[aliases.small]\nmodel = "{SMALL}"\nproviders = ["ollama"]\n'
        f'escalate = ["{BIG}", "agent"]\n'
    )


def test_every_face_says_which_rung_answered_and_the_ledger_counts_what_it_saved(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    write_config(home)
    env = base_env(home, fake_ollama)
    conv = small_conv(home)
    drop_message(conv, "Why is a folder a good queue?")
    fake_ollama.enqueue(
        Step(text=LOOP, model=SMALL),
        Step(text="Atomic renames.", model=BIG, prompt_eval_count=400, eval_count=5),
    )
    settings = ladder_settings(make_settings, fake_ollama)
    run_burst(runtime_for(settings))
    # the blocks every face reads (MCP, wait --json, the dashboard, tail --json)
    failed, answer = (b for b in Reader(home).since(conv, 0).blocks if b["kind"] == "model")
    assert failed["escalated"] == {"cause": "loop", "to": BIG}
    assert answer["rung"] == BIG and "rung" not in failed
    # wait (send --wait's ending): which rung answered, and each step up
    human = cli_here(env, "wait", conv.id)
    assert human.returncode == 0, human.stderr
    assert f"=== ESCALATED: stopped repeating itself{escalation.ARROW}{BIG} ===" in human.stdout
    assert f"rung: answered on {BIG} (a rung of the escalation ladder)" in human.stderr
    out = json.loads(cli_here(env, "wait", conv.id, "--json").stdout)
    assert out["rung"] == BIG and out["escalated"] == [{"cause": "loop", "to": BIG}]
    # MCP
    checked = Faces(settings).check(conv.id)
    assert checked["rung"] == f"answered on {BIG} (a rung of the escalation ladder)"
    # status (and the activity line MCP and the dashboard show)
    said = (
        f"idle: waiting for your next message; answered on {BIG} (a rung of the escalation ladder)"
    )
    assert checked["activity"] == said
    assert json.loads(cli_here(env, "status", conv.id, "--json").stdout)["activity"] == said
    assert f"now:          {said}" in cli_here(env, "status", conv.id).stdout
    # the ledger: one row per rung with its cause, what was answered locally, what it saved
    data = json.loads(cli_here(env, "ledger", conv.id, "--json").stdout)
    book = data["ladder"]
    assert book["answered"] == {BIG: 1} and book["escalated"] == 1 and book["to_agent"] == 0
    assert book["saved_tokens_estimate"] == 405  # the server's prompt count and the reply's
    assert [(s["rung"], s["model"], s["cause"], s["to"]) for s in book["steps"]] == [
        ("", SMALL, "loop", BIG),
        (BIG, BIG, None, None),
    ]
    said = cli_here(env, "ledger", conv.id).stdout
    assert (
        f"ladder: answered locally: {BIG} 1; escalated 1, to the agent 0; ~405 frontier tokens "
        "not spent (an estimate from the prompts' size)"
    ) in said
    assert f"{SMALL} → {BIG}: stopped repeating itself" in said


def test_a_reply_over_its_time_budget_is_stopped_and_goes_up(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = small_conv(home)
    drop_message(conv, "Take your time.")
    slow = " ".join(f"word{i}" for i in range(200))
    fake_ollama.enqueue(
        Step(text=slow, chunks=200, chunk_delay=0.05, model=SMALL),
        Step(text="Quickly: done.", model=BIG),
    )
    settings = ladder_settings(make_settings, fake_ollama, escalation={"time_budget": 0.5})
    run_burst(runtime_for(settings))
    assert models_asked(fake_ollama) == [SMALL, BIG]
    failed, answer = model_blocks(conv)
    assert "word0" in failed.text and "word199" not in failed.text  # stopped, what it said kept
    assert escalated(failed) == [f"went over its time budget (0.5 s){escalation.ARROW}{BIG}"]
    assert answer.text.strip() == "Quickly: done." and answered_by(answer) == BIG
    assert status(conv) is Status.IDLE


def test_an_alias_rung_brings_its_providers_and_its_options_over_the_conversations(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = small_conv(home)  # the default template's options: temperature 0.7
    drop_message(conv, "Loop, please.")
    fake_ollama.enqueue(Step(text=LOOP, model=SMALL), Step(text="No loop.", model=BIG))
    aliases = {
        "small": {"model": SMALL, "providers": ["ollama"], "escalate": ["steady"]},
        "steady": {
            "model": BIG,
            "providers": ["ollama"],
            "options": {"temperature": 0.9, "repeat_penalty": 1.5},
        },
    }
    run_burst(runtime_for(make_settings(fake_ollama, aliases=aliases, stop_repeating=True)))
    assert models_asked(fake_ollama) == [SMALL, BIG]
    small, steady = (r["options"] for r in fake_ollama.chat_requests())
    assert small["temperature"] == 0.7
    assert steady["temperature"] == 0.9 and steady["repeat_penalty"] == 1.5
    assert answered_by(model_blocks(conv)[-1]) == "steady"


def test_a_template_carries_a_ladder_and_a_bad_one_names_the_file(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    ensure_home(home)
    folder = home.root / "templates" / "laddered"
    folder.mkdir(parents=True)
    (folder / "template.toml").write_text(
        f'model = "{SMALL}"\nbackend = "ollama"\nescalate = ["{BIG}", "agent"]\nsticky = false\n'
    )
    tpl = load_template(home, "laddered")
    conv = new_conversation(home, "t", template=tpl, model=SMALL, backend="ollama")
    drop_message(conv, "Loop, please.")
    fake_ollama.enqueue(Step(text=LOOP, model=SMALL), Step(text="No loop.", model=BIG))
    run_burst(runtime_for(make_settings(fake_ollama, stop_repeating=True)))
    assert models_asked(fake_ollama) == [SMALL, BIG]
    assert answered_by(model_blocks(conv)[-1]) == BIG
    (folder / "template.toml").write_text('escalate = ["agent", "qwen3"]\n')
    with pytest.raises(ConfigError) as err:
        load_template(home, "laddered")
    assert str(err.value) == (
        f"invalid escalate in template {folder / 'template.toml'}: "
        "rung 1 is agent: the agent can only be the last rung"
    )
