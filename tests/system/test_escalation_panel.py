"""The escalation ladder's panel rung: its seats answer the turn one after another, each once,
and the panel's own causes (a seat that fails, seats that disagree) send the turn up.

With the strict scripted Ollama: every request is scripted for one model and the models asked
are asserted in order, so a seat asked twice, a seat asked after the panel failed, or the small
model asked again fails the test."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from contemplation.faces.reading import Reader
from contemplation.models import MarkerKind, Status
from contemplation.protocol import escalation
from contemplation.protocol.escalation import Seat
from contemplation.settings import Settings
from contemplation.store.layout import Home, read_state
from contemplation.writer import drop_message
from tests.conftest import base_env, run_burst, runtime_for
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_crash import run_once
from tests.system.test_escalation import (
    BIG,
    LOOP,
    SMALL,
    escalated,
    ladder_settings,
    model_blocks,
    models_asked,
    small_conv,
    status,
)

G3, TOP = "gemma", "mistral"
PANEL = f"panel:{BIG},{G3}"
ARROW = escalation.ARROW
LONG = " ".join(str(i) for i in range(400))  # 1,490 bytes that do not repeat


@pytest.fixture(autouse=True)
def _mistral(fake_ollama: FakeOllama) -> None:
    fake_ollama.models[TOP] = {"capabilities": ["completion"], "arch": "llama", "ctx": 8192}


def contents(fake: FakeOllama, n: int) -> list[str]:
    return [m.get("content") or "" for m in fake.chat_requests()[n]["messages"]]


def test_a_panel_rung_asks_each_seat_once_and_seats_that_agree_answer_the_turn(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = small_conv(home)
    drop_message(conv, "The capital of France?")
    fake_ollama.enqueue(
        Step(text=LOOP, model=SMALL), Step(text="Paris.", model=BIG), Step(text="paris", model=G3)
    )
    settings = ladder_settings(make_settings, fake_ollama, [PANEL, "agent"])
    run_burst(runtime_for(settings))
    assert models_asked(fake_ollama) == [SMALL, BIG, G3]
    failed, first, second = model_blocks(conv)
    assert escalated(failed) == [f"stopped repeating itself{ARROW}{PANEL}"]
    assert escalation.seat_of(first) == Seat(PANEL, 1, 2, BIG)
    assert escalation.seat_of(second) == Seat(PANEL, 2, 2, G3)
    assert escalation.rung_of(second) == PANEL
    # every face's blocks (MCP, wait --json, the dashboard, tail --json): the rung and the seat
    faced = [b for b in Reader(home).since(conv, 0).blocks if b["kind"] == "model"]
    assert [(b.get("rung"), b.get("seat")) for b in faced] == [
        (None, None),
        (PANEL, {"number": 1, "of": 2, "model": BIG}),
        (PANEL, {"number": 2, "of": 2, "model": G3}),
    ]
    assert (
        MarkerKind.NOTE,
        f"{escalation.AGREED}2 of 2 seats gave the same answer ({escalation.RULE})",
    ) in second.markers
    assert status(conv) is Status.IDLE
    # the second seat answers afresh: neither the loop nor the first seat's answer
    asked = contents(fake_ollama, 2)
    assert "capital of France" in asked[-1]
    assert not any("Paris." in c or "the queue and the folder" in c for c in asked)
    # the ledger's book: one turn answered on the panel (not one a seat)
    st = read_state(conv)
    assert st is not None and st.ladder is not None and st.ladder.answered == {PANEL: 1}
    # sticky: the next message is the panel's again; its history carries one answer a turn
    fake_ollama.requests.clear()
    drop_message(conv, "And of Italy?")
    fake_ollama.enqueue(Step(text="Rome.", model=BIG), Step(text="Rome", model=G3))
    run_burst(runtime_for(settings))
    assert models_asked(fake_ollama) == [BIG, G3]
    for n in (0, 1):
        said = contents(fake_ollama, n)
        assert said.count("Paris.") == 1 and "paris" not in said and "Rome." not in said
    assert status(conv) is Status.IDLE


def test_seats_that_disagree_send_the_turn_to_the_next_rung(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = small_conv(home)
    drop_message(conv, "The capital of France?")
    fake_ollama.enqueue(
        Step(text=LOOP, model=SMALL),
        Step(text="Paris.", model=BIG),
        Step(text="Lyon.", model=G3),
        Step(text="Paris, since 987.", model=TOP),
    )
    run_burst(runtime_for(ladder_settings(make_settings, fake_ollama, [PANEL, TOP, "agent"])))
    assert models_asked(fake_ollama) == [SMALL, BIG, G3, TOP]
    *_, second, answer = model_blocks(conv)
    assert escalated(second) == [
        f"the panel's seats disagreed (2 different answers from 2 seats, no majority){ARROW}{TOP}"
    ]
    assert escalation.rung_of(answer) == TOP and answer.text.strip() == "Paris, since 987."
    asked = contents(fake_ollama, 3)  # the next rung answers afresh: no seat's answer
    assert "capital of France" in asked[-1]
    assert not any("Paris." in c or "Lyon" in c for c in asked)
    assert status(conv) is Status.IDLE
    st = read_state(conv)
    assert st is not None and st.ladder is not None
    assert [(s.rung, s.cause, s.to) for s in st.ladder.steps] == [
        ("", "loop", PANEL),
        (PANEL, "disagree", TOP),
        (TOP, None, None),
    ]


def test_with_disagree_off_every_seats_answer_stands(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = small_conv(home)
    drop_message(conv, "The capital of France?")
    fake_ollama.enqueue(
        Step(text=LOOP, model=SMALL), Step(text="Paris.", model=BIG), Step(text="Lyon.", model=G3)
    )
    settings = ladder_settings(
        make_settings, fake_ollama, [PANEL, "agent"], escalation={"disagree": False}
    )
    run_burst(runtime_for(settings))
    assert models_asked(fake_ollama) == [SMALL, BIG, G3]
    *_, second = model_blocks(conv)
    assert escalated(second) == []
    assert any(
        k is MarkerKind.NOTE and t.startswith("the panel's seats disagree: 2 different answers")
        for k, t in second.markers
    )
    assert status(conv) is Status.IDLE


def test_three_seats_agree_by_a_majority(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = small_conv(home)
    drop_message(conv, '{"answer": 4}?')
    fake_ollama.enqueue(
        Step(text=LOOP, model=SMALL),
        Step(text='{"answer": 4}', model=BIG),
        Step(text="5", model=G3),
        Step(text='{ "answer" : 4 }', model=TOP),
    )
    three = f"panel:{BIG},{G3},{TOP}"
    run_burst(runtime_for(ladder_settings(make_settings, fake_ollama, [three, "agent"])))
    assert models_asked(fake_ollama) == [SMALL, BIG, G3, TOP]
    last = model_blocks(conv)[-1]
    assert escalated(last) == []
    assert any(t.startswith(f"{escalation.AGREED}2 of 3 seats") for _, t in last.markers)
    assert status(conv) is Status.IDLE


def test_a_seat_that_fails_sends_the_turn_up_and_the_seats_after_it_are_not_asked(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = small_conv(home)
    drop_message(conv, "The capital of France?")
    fake_ollama.enqueue(Step(text=LOOP, model=SMALL), Step(text=LOOP, model=BIG))
    run_burst(runtime_for(ladder_settings(make_settings, fake_ollama, [PANEL, "agent"])))
    assert models_asked(fake_ollama) == [SMALL, BIG]  # gemma3 is never asked
    _, seat = model_blocks(conv)
    assert escalated(seat) == [
        f"a seat of the panel failed (seat 1 of 2, {BIG}: stopped repeating itself){ARROW}agent"
    ]
    st = read_state(conv)
    assert st is not None and st.status is Status.ERROR and st.last_error is not None
    assert st.last_error.message == f"escalated to the agent: a seat of the panel failed on {PANEL}"


def test_a_seats_backend_error_sends_the_turn_up_and_off_it_ends_the_turn(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    for seat_rule in (True, False):
        conv = small_conv(home)
        drop_message(conv, "The capital of France?")
        fake_ollama.enqueue(
            Step(text=LOOP, model=SMALL),
            Step(text="Paris.", model=BIG),
            Step(kind="error", status=400, error="invalid options", model=G3),
        )
        settings = ladder_settings(
            make_settings, fake_ollama, [PANEL, "agent"], escalation={"seat": seat_rule}
        )
        run_burst(runtime_for(settings))
        assert models_asked(fake_ollama) == [SMALL, BIG, G3]
        text = conv.log.read_text()
        said = f"=== ESCALATED: a seat of the panel failed (seat 2 of 2, {G3}: the backend failed"
        assert (said in text) is seat_rule, text
        assert f"{ARROW}agent ===" in text if seat_rule else "=== ERROR: " in text
        assert status(conv) is Status.ERROR
        fake_ollama.requests.clear()


def test_a_kill_after_the_marker_naming_a_panel_asks_each_seat_once(
    home: Home, fake_ollama: FakeOllama
) -> None:
    """The daemon killed once the ESCALATED marker naming the panel rung is durable, before
    any seat is asked: the next start asks each seat once, never the small model again."""
    env = base_env(home, fake_ollama, CONTEMPLATION_STOP_REPEATING="true")
    config = home.root.parent / "xdg-config" / "contemplation" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        f'[aliases.small]\nmodel = "{SMALL}"\nproviders = ["ollama"]\n'
        f'escalate = ["{PANEL}", "agent"]\n'
    )
    conv = small_conv(home)
    drop_message(conv, "The capital of France?")
    fake_ollama.enqueue(
        Step(text=LOOP, model=SMALL), Step(text="Paris.", model=BIG), Step(text="Paris", model=G3)
    )
    assert run_once(env, "escalated:1") == -9  # killed there
    assert models_asked(fake_ollama) == [SMALL]
    [failed] = model_blocks(conv)
    assert escalated(failed) == [f"stopped repeating itself{ARROW}{PANEL}"]
    assert run_once(env) == 0
    assert models_asked(fake_ollama) == [SMALL, BIG, G3]
    _, first, second = model_blocks(conv)
    assert [escalation.seat_of(b) for b in (first, second)] == [
        Seat(PANEL, 1, 2, BIG),
        Seat(PANEL, 2, 2, G3),
    ]
    assert status(conv) is Status.IDLE
    assert run_once(env) == 0  # nothing more is due
    assert models_asked(fake_ollama) == [SMALL, BIG, G3]


def test_a_kill_during_the_second_seats_reply_asks_only_that_seat_again(
    home: Home, fake_ollama: FakeOllama
) -> None:
    """Killed once the second seat's reply is over and before it is committed: the next start
    asks that seat again, never the first seat nor the small model."""
    env = base_env(home, fake_ollama, CONTEMPLATION_STOP_REPEATING="true")
    config = home.root.parent / "xdg-config" / "contemplation" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        f'[aliases.small]\nmodel = "{SMALL}"\nproviders = ["ollama"]\n'
        f'escalate = ["{PANEL}", "agent"]\n'
    )
    conv = small_conv(home)
    drop_message(conv, "The capital of France?")
    fake_ollama.enqueue(
        Step(text=LOOP, model=SMALL),
        Step(text="Paris.", model=BIG),
        Step(text="Paris", model=G3),
        Step(text="Paris", model=G3),
    )
    assert run_once(env, "reply_done:3") == -9  # the small model's, the first seat's, killed
    assert models_asked(fake_ollama) == [SMALL, BIG, G3]
    assert run_once(env) == 0
    assert models_asked(fake_ollama) == [SMALL, BIG, G3, G3]
    whole = [b for b in model_blocks(conv) if escalation.seat_of(b) is not None]
    assert [escalation.seat_of(b) for b in whole] == [
        Seat(PANEL, 1, 2, BIG),
        Seat(PANEL, 2, 2, G3),
    ]
    assert any(t.startswith(escalation.AGREED) for _, t in whole[-1].markers)
    assert status(conv) is Status.IDLE
    assert run_once(env) == 0
    assert models_asked(fake_ollama) == [SMALL, BIG, G3, G3]


def test_the_vote_reads_back_a_seats_answer_the_logs_rotation_moved_away(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    """The log rotated between two seats (the first seat's answer alone is over 1 KiB): its
    reply is in a rotated segment, held without its text, and the vote reads it back."""
    conv = small_conv(home)
    drop_message(conv, "The capital of France, and count to 399?")
    fake_ollama.enqueue(
        Step(text=LOOP, model=SMALL),
        Step(text="Paris: " + LONG, model=BIG),
        Step(text="paris " + LONG, model=G3),
    )
    settings = ladder_settings(make_settings, fake_ollama, [PANEL, "agent"], rotate_bytes=1024)
    run_burst(runtime_for(settings))
    assert models_asked(fake_ollama) == [SMALL, BIG, G3]
    rotated = "".join(p.read_text() for p in conv.dir.glob("messages.*.log"))
    assert "Paris: 0 1 2" in rotated and "Paris: 0 1 2" not in conv.log.read_text()
    assert status(conv) is Status.IDLE
    everything = "".join(p.read_text() for p in conv.dir.glob("messages*.log"))
    assert f"{escalation.AGREED}2 of 2" in everything and "disagreed" not in everything


def test_a_seat_is_asked_for_its_answer_without_need_lines_or_tools(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    """A seat's answer is compared with the others': it is offered no NEED lines and no tools
    (a reply of NEED lines would be no answer to compare), as a reply held to a schema."""
    conv = small_conv(home)
    drop_message(conv, "The capital of France?")
    fake_ollama.enqueue(
        Step(text=LOOP, model=SMALL), Step(text="Paris.", model=BIG), Step(text="Paris", model=G3)
    )
    run_burst(runtime_for(ladder_settings(make_settings, fake_ollama, [PANEL, "agent"])))
    small, *seats = fake_ollama.chat_requests()
    assert "NEED:" in small["messages"][0]["content"]  # the small model is offered them
    assert len(seats) == 2
    for seat in seats:
        assert seat["messages"][0]["role"] == "system"
        assert "NEED:" not in seat["messages"][0]["content"]
        assert not seat.get("tools")


def test_with_seat_off_a_seats_loop_stands_as_its_answer_and_the_vote_goes_on(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = small_conv(home)
    drop_message(conv, "The capital of France?")
    fake_ollama.enqueue(
        Step(text=LOOP, model=SMALL), Step(text=LOOP, model=BIG), Step(text="Paris", model=G3)
    )
    settings = ladder_settings(
        make_settings, fake_ollama, [PANEL, "agent"], escalation={"seat": False}
    )
    run_burst(runtime_for(settings))
    assert models_asked(fake_ollama) == [SMALL, BIG, G3]
    _, first, second = model_blocks(conv)
    assert escalated(first) == [] and escalation.seat_of(first) == Seat(PANEL, 1, 2, BIG)
    assert escalated(second) == [
        f"the panel's seats disagreed (2 different answers from 2 seats, no majority){ARROW}agent"
    ]
