"""A panel whose seat fails for good (its model is missing: the scripted Ollama answers 404
for it, as Ollama does). The round ends as one model's failure ends a turn: the other seats'
answers are kept and delivered, ``send --wait`` exits 1 with the seat's error, the MCP task
completes with it, the next message is taken, and the missing model is asked once per
message the agent sends (never again at the daemon's rescans). The ERROR names remedies that
work: ``set-model --seat`` moves the seat, ``retract`` withdraws its failed turn; ``list``,
``status`` and the MCP results show the panel's seats, not its first model."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable

import pytest

from contemplation.faces.reading import Reader
from contemplation.models import Status
from contemplation.store.layout import Home, read_metadata, read_state
from tests.conftest import DaemonProc, base_env, cli_here
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_mcp_tasks import Wire, completed, text_of, wires  # noqa: F401 (fixture)

HEADER = re.compile(r"^=== ([A-Z0-9_]+) -> ([A-Z0-9_]+) \[", re.MULTILINE)
RESCAN = 0.1  # s: the daemon's periodic rescan, short, so a re-ask would show at once
WATCHED = 20  # rescans watched for a request nobody asked for


def chats(fake: FakeOllama, model: str) -> int:
    return sum(1 for r in fake.chat_requests() if r["model"].split(":")[0] == model)


def errors(log: str) -> int:
    return log.count("=== ERROR")


def quiet_for_rescans(fake: FakeOllama, conv_log: Callable[[], str]) -> tuple[int, int]:
    """The missing model's requests and the log's ERROR lines after ``WATCHED`` rescans:
    an observation window (nothing is awaited; a re-ask at each rescan would add both)."""
    time.sleep(RESCAN * WATCHED)
    return chats(fake, "missing-model"), errors(conv_log())


def start(home: Home, fake: FakeOllama, factory: Callable[..., DaemonProc]) -> dict[str, str]:
    env = base_env(home, fake, CONTEMPLATION_RESCAN_INTERVAL=str(RESCAN))
    env["CONTEMPLATION_DASHBOARD_ENABLED"] = "false"
    factory(env, home).wait_ready()
    return env


def new_panel(env: dict[str, str], *models: str) -> str:
    seats = [a for m in models or ("gemma", "missing-model") for a in ("--model", m)]
    done = cli_here(env, "new", "T", *seats, "--json")
    return str(json.loads(done.stdout)["id"])


def test_a_seat_that_fails_for_good_ends_the_round_and_the_next_message_is_taken(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    fake_ollama.enqueue(
        Step(model="gemma", text="Gemma: one."), Step(model="gemma", text="Gemma: two.")
    )
    env = start(home, fake_ollama, daemon_factory)
    cid = new_panel(env)
    conv = Reader(home).locate(cid)
    first = cli_here(env, "send", cid, "First?", "--wait", "--timeout", "30", check=False)
    assert first.returncode == 1, (first.returncode, first.stdout, first.stderr)
    assert "Gemma: one." in first.stdout  # the other seat's answer is delivered
    assert "not found" in first.stderr, first.stderr  # the seat's error
    assert "the reply still comes" not in first.stderr
    state = read_state(conv)
    assert state is not None and state.status is Status.ERROR
    assert quiet_for_rescans(fake_ollama, conv.log.read_text) == (1, 1)  # asked once, one ERROR
    log = conv.log.read_text()
    assert [h for h, _ in HEADER.findall(log)] == ["CLAUDE", "GEMMA", "MISSING_MODEL"], log
    assert "set-model" in log and "--seat MISSING_MODEL" in log  # a remedy that works
    second = cli_here(env, "send", cid, "Second?", "--wait", "--timeout", "30", check=False)
    assert second.returncode == 1, (second.returncode, second.stdout, second.stderr)
    assert "Gemma: two." in second.stdout  # the next message was taken and answered
    assert quiet_for_rescans(fake_ollama, conv.log.read_text) == (2, 2)  # once per message
    assert chats(fake_ollama, "gemma") == 2


@pytest.mark.parametrize("order", [("gemma", "missing-model"), ("missing-model", "gemma")])
def test_set_model_moves_one_seat_and_retract_withdraws_its_failed_turn(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    order: tuple[str, str],
) -> None:
    """Either seat order: the retract withdraws the failed seat's turn in its own line, never
    the other seat's answer (which its next request still carries)."""
    fake_ollama.enqueue(
        Step(model="gemma", text="Gemma: one."),
        Step(model="gemma", text="Gemma: two."),
        Step(model="llama3.2", text="Llama: two."),
    )
    env = start(home, fake_ollama, daemon_factory)
    cid = new_panel(env, *order)
    conv = Reader(home).locate(cid)
    cli_here(env, "send", cid, "First?", "--wait", "--timeout", "30", check=False)
    listed = json.loads(cli_here(env, "list", "--json").stdout)["conversations"]
    [row] = [r for r in listed if r["id"] == cid]
    assert {s["label"] for s in row["panel"]} == {"GEMMA", "MISSING_MODEL"}, row
    table = cli_here(env, "list").stdout  # the panel's seats, not its first model
    seats = {
        "gemma": "GEMMA (ollama/gemma)",
        "missing-model": "MISSING_MODEL (ollama/missing-model)",
    }
    assert "panel: " + ", ".join(seats[m] for m in order) in table, table
    shown = cli_here(env, "status", cid).stdout
    assert "panel: " + ", ".join(seats[m] for m in order) in shown, shown
    assert "--seat MISSING_MODEL" in shown, shown  # the advice names the seat
    wrong = cli_here(env, "set-model", cid, "llama3.2", check=False)
    assert wrong.returncode != 0 and "--seat" in wrong.stderr, wrong.stderr  # not a silent no-op
    moved = cli_here(env, "set-model", cid, "llama3.2", "--seat", "MISSING_MODEL", "--json")
    assert json.loads(moved.stdout)["was"]["model"] == "missing-model"
    meta = read_metadata(conv)
    assert meta is not None
    now = {(s.label, s.model) for s in meta.panel}  # the label stays: the seat's line goes on
    assert now == {("GEMMA", "gemma"), ("MISSING_MODEL", "llama3.2")}, now
    withdrawn = cli_here(env, "retract", cid, "--json")
    assert json.loads(withdrawn.stdout)["retracted"] is True
    second = cli_here(env, "send", cid, "Second?", "--wait", "--timeout", "30", check=False)
    assert second.returncode == 0, (second.returncode, second.stdout, second.stderr)
    assert "Gemma: two." in second.stdout and "Llama: two." in second.stdout
    llama = [r["messages"] for r in fake_ollama.chat_requests() if r["model"] == "llama3.2"]
    assert len(llama) == 1 and "First?" not in json.dumps(llama[0])  # the withdrawn turn
    assert chats(fake_ollama, "missing-model") == 1
    gemma = [r["messages"] for r in fake_ollama.chat_requests() if r["model"] == "gemma"]
    assert len(gemma) == 2 and "Gemma: one." in json.dumps(gemma[1])  # its answer stands


def test_the_mcp_task_of_a_panel_with_a_missing_model_completes_with_its_error(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    wires: Callable[[dict[str, str]], Wire],  # noqa: F811
) -> None:
    fake_ollama.enqueue(Step(model="gemma", text="Gemma: yes."))
    env = start(home, fake_ollama, daemon_factory)
    wire = wires(env)
    task = wire.call(
        "conversation_start", topic="Vote", initial_prompt="Yes or no?",
        models=["gemma", "missing-model"],
    )  # fmt: skip
    done = wire.until(task["taskId"], completed, seconds=30)
    got = text_of(done["result"])
    blocks = [(b["from"], b["text"]) for b in got["blocks"] if b["kind"] == "model"]
    assert ("GEMMA", "Gemma: yes.") in blocks, got
    assert got["status"] == "error" and "not found" in json.dumps(got["last_error"]), got
    assert got["model"] == "panel: GEMMA (gemma), MISSING_MODEL (missing-model)", got
    assert [s["label"] for s in got["panel"]] == ["GEMMA", "MISSING_MODEL"], got
