"""The escalation ladder's book summed over every conversation (``contemplation ledger`` without
one, its ``--json``, the dashboard's ledger card): turns each rung answered, turns that reached
the agent, the frontier tokens not spent; from the index, never the folders, and a bounded list
of rungs that says how many more there are."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from typing import Any

from click.testing import CliRunner

from contemplation.faces.card import Seen
from contemplation.faces.cli.root import main
from contemplation.faces.dashboard import cards
from contemplation.index import ledger as sums
from contemplation.models import LadderBook, Ledger, Usage
from contemplation.protocol import ledger
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.writer import archive, drop_message
from tests.conftest import run_burst, runtime_for
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_escalation import BIG, LOOP, SMALL, ladder_settings, small_conv

G3 = "gemma"
PANEL = f"panel:{BIG},{G3}"
NOT_SPENT = "frontier tokens not spent (an estimate from the prompts' size)"


def run_cli(home: Home, *args: str) -> str:
    got = CliRunner().invoke(main, list(args), env={"CONTEMPLATION_HOME": str(home.root)})
    assert got.exit_code == 0, got.output
    return got.output


def book(conv: Conv) -> LadderBook:
    st = read_state(conv)
    assert st is not None and st.ladder is not None
    return st.ladder


def one_turn(home: Home, fake: FakeOllama, settings: Settings, *steps: Step) -> Conv:
    conv = small_conv(home)
    drop_message(conv, "Why is a folder a good queue?")
    fake.enqueue(*steps)
    run_burst(runtime_for(settings))
    fake.requests.clear()
    return conv


def test_the_ledger_over_every_conversation_counts_each_rung_the_agent_and_what_was_saved(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    plain = ladder_settings(make_settings, fake_ollama)
    panel = ladder_settings(make_settings, fake_ollama, [PANEL, "agent"])
    # the small model answers; a loop goes up to the big one; a panel answers; both rungs loop
    small = one_turn(
        home, fake_ollama, plain, Step(text="Renames.", model=SMALL, prompt_eval_count=300)
    )
    up = one_turn(
        home, fake_ollama, plain,
        Step(text=LOOP, model=SMALL),
        Step(text="Atomic renames.", model=BIG, prompt_eval_count=400, eval_count=5),
    )  # fmt: skip
    seats = one_turn(
        home, fake_ollama, panel,
        Step(text=LOOP, model=SMALL),
        Step(text="Paris.", model=BIG, prompt_eval_count=50),
        Step(text="paris", model=G3, prompt_eval_count=60),
    )  # fmt: skip
    agent = one_turn(
        home, fake_ollama, plain, Step(text=LOOP, model=SMALL), Step(text=LOOP, model=BIG)
    )
    books = [book(c) for c in (small, up, seats, agent)]
    assert [b.answered for b in books] == [{SMALL: 1}, {BIG: 1}, {PANEL: 1}, {}]
    assert books[1].saved_tokens_estimate == 405
    saved = sum(b.saved_tokens_estimate for b in books)
    archive(home, up)  # archived conversations are counted as well

    got = json.loads(run_cli(home, "ledger", "--json"))["ladder"]
    assert got["conversations"] == 4
    assert got["answered"] == 3  # a panel's turn once, under the panel's name
    assert (got["escalated"], got["to_agent"]) == (1 + 1 + 2, 1)
    assert got["saved_tokens_estimate"] == saved
    assert got["rungs"] == [
        {"rung": SMALL, "answered": 1, "conversations": 1},
        {"rung": PANEL, "answered": 1, "conversations": 1},
        {"rung": BIG, "answered": 1, "conversations": 1},
    ]
    assert (got["found"], got["more"]) == (3, False)
    kept = sums.ladder(home, scope="archived")  # the archived one's book moved with it
    assert (kept["conversations"], kept["rungs"]) == (1, [got["rungs"][2]])

    said = run_cli(home, "ledger")
    assert (
        f"ladder (4 conversations): answered locally 3, escalated 4, to the agent 1; "
        f"~{saved:,} {NOT_SPENT}"
    ) in said
    assert f"  {PANEL}  answered 1 (1 conversation)" in said
    assert f"  {SMALL}  answered 1 (1 conversation)" in said
    # the dashboard's ledger card says the same
    rows = dict(cards.kinds()["ledger"].rows(Seen(home, {})))
    assert rows["ladder"] == (
        f"4 conversations: answered locally 3 ({SMALL} 1, {PANEL} 1, {BIG} 1), escalated 4, "
        f"to the agent 1; ~{saved:,} {NOT_SPENT}"
    )


def _with_books(home: Home, books: list[dict[str, Any]]) -> list[Conv]:
    """Conversations whose state.json holds these ladder books (and a ledger of a turn), as a
    daemon's commit leaves them (the index reads state.json; no model is asked)."""
    made = []
    for b in books:
        conv = small_conv(home)
        raw = json.loads(conv.state.read_text())
        raw["ladder"] = LadderBook.model_validate(b).model_dump()
        kept = Ledger()
        ledger.record(kept, ledger.entry(Usage(prompt_eval_count=10), turn=1, provider="p",
                                         model=SMALL))  # fmt: skip
        raw["ledger"] = kept.model_dump()
        conv.state.write_text(json.dumps(raw))
        made.append(conv)
    return made


def test_many_rungs_are_listed_a_bounded_few_with_how_many_more(home: Home) -> None:
    rungs = [f"m{i:02d}" for i in range(30)]
    made = _with_books(
        home,
        [
            {"answered": {r: 1 + (r == "m07") for r in rungs[:20]}, "escalated": 3},
            {"answered": {r: 1 for r in rungs[10:]}, "to_agent": 2, "escalated": 2},
            {"saved_tokens_estimate": 1000},
        ],
    )
    got = sums.ladder(home, limit=5)
    assert (got["conversations"], got["answered"], got["found"]) == (3, 41, 30)
    assert (got["escalated"], got["to_agent"], got["saved_tokens_estimate"]) == (5, 2, 1000)
    # the most answered first, then by name; bounded, and how many were left out said
    assert [(r["rung"], r["answered"]) for r in got["rungs"]] == [
        ("m07", 2), ("m10", 2), ("m11", 2), ("m12", 2), ("m13", 2),
    ]  # fmt: skip
    assert got["more"] is True
    said = run_cli(home, "ledger", "--limit", "5")
    assert "  m13  answered 2 (2 conversations)" in said
    assert "  25 more rungs: contemplation ledger --limit 500 lists up to 500" in said
    assert "m14" not in said
    whole = json.loads(run_cli(home, "ledger", "--json"))["ladder"]
    assert len(whole["rungs"]) == sums.RUNGS_SHOWN and whole["found"] == 30
    assert sums.ladder(home, scope="archived")["found"] == 0  # none of them is archived
    # a folder removed by hand: its books leave the sums (the ledger's and the ladder's)
    assert sums.summed(home)["total"]["sent"] == 30
    shutil.rmtree(made[2].dir)
    gone = sums.summed(home, rungs=5)
    assert gone["total"]["sent"] == 20 and gone["found"] == 2
    assert (gone["ladder"]["conversations"], gone["ladder"]["saved_tokens_estimate"]) == (2, 0)


def test_a_home_without_a_ladder_prints_no_ladder_line(home: Home) -> None:
    conv = small_conv(home)
    assert read_state(conv) is not None
    assert "ladder" not in run_cli(home, "ledger")
    got = json.loads(run_cli(home, "ledger", "--json"))["ladder"]
    assert got == {
        "conversations": 0, "answered": 0, "escalated": 0, "to_agent": 0,
        "saved_tokens_estimate": 0, "rungs": [], "found": 0, "more": False,
    }  # fmt: skip
    assert "ladder" not in dict(cards.kinds()["ledger"].rows(Seen(home, {})))
