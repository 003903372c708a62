"""A panel of models. A real daemon, the real CLI, and the scripted Ollama (strict
per model: each step answers only the model it names, so a request to the wrong model gets
the filler and fails the test). Each message is answered once by each model, in a block
whose header names it; each model sees the shared question and its own line only (with
--debate also the others' answers of the round before; --synthesize adds one reply that
weighs the round); a need is its asker's; a daemon killed mid-round answers the missing
models only; cancel stops the round."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from contemplation.faces.dashboard.app import Dashboard
from contemplation.faces.reading import Reader
from contemplation.models import Status
from contemplation.settings import load
from contemplation.store.layout import Home, read_state
from contemplation.writer import open_writer
from tests import peers, realpeers
from tests.conftest import DaemonProc, base_env, cli, cli_here, wait_for
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_mcp_tasks import Wire, completed, text_of, wires  # noqa: F401 (fixture)

BEARER = {"Authorization": "Bearer " + "t" * 43}
HEADER = re.compile(r"^=== ([A-Z0-9_]+) -> ([A-Z0-9_]+) \[", re.MULTILINE)


def heads(log: str) -> list[tuple[str, str]]:
    return HEADER.findall(log)


def asked(fake: FakeOllama, model: str) -> list[list[dict[str, Any]]]:
    """The messages of each chat request to ``model``, in order."""
    return [r["messages"] for r in fake.chat_requests() if r["model"].split(":")[0] == model]


def said(messages: list[dict[str, Any]]) -> str:
    return json.dumps(messages)


def panel_new(env: dict[str, str], *args: str) -> str:
    done = cli_here(env, "new", "Index", "--model", "gemma", "--model", "llama3.2", *args, "--json")
    return str(json.loads(done.stdout)["id"])


def test_a_seats_need_the_daemon_has_not_routed_yet_is_not_settled(
    home: Home, fake_ollama: FakeOllama
) -> None:
    """A seat's needs are routed after the other seats' replies are written, and the state
    says idle in between: `send --wait` took that moment for the end and returned before the
    seat's answer (seen once in a clean run). Needs are settled only once handed to the agent."""
    env = base_env(home, fake_ollama)
    conv = Reader(home).locate(panel_new(env))
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "PANEL", "When do we ship?", msg_id="q1")
        for label, text in (("GEMMA", "NEED: File contents of plan.md"), ("LLAMA3_2", "No idea.")):
            r = w.reply(label, "CLAUDE", f"r-{label}")
            r.content(text)
            r.finish()
        w.set_status(Status.IDLE)
    assert not Reader(home).standing(conv).settled  # the daemon's to route: not done
    with open_writer(conv) as w:
        w.set_status(Status.AWAITING_AGENT)
    assert Reader(home).standing(conv).settled  # handed to the agent: done for now


def test_each_model_answers_each_message_once_in_its_own_line(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    fake_ollama.enqueue(
        Step(model="gemma", text="Gemma: an index on email."),
        Step(model="llama3.2", text="Llama: a unique index on email."),
        Step(model="gemma", text="Gemma: lookups by email."),
        Step(model="llama3.2", text="Llama: it keeps emails unique."),
    )
    daemon_factory(env, home).wait_ready()
    done = cli_here(
        env, "new", "Index", "--model", "gemma", "--model", "llama3.2",
        "--message", "Which index for users?", "--wait", "--timeout", "60",
    )  # fmt: skip
    print(done.stdout)
    assert "Gemma: an index on email." in done.stdout
    assert "Llama: a unique index on email." in done.stdout  # --wait waits for the whole round
    conv = Reader(home).locate(done.stderr.strip().splitlines()[-1])
    meta = json.loads(conv.metadata.read_text())
    assert [s["label"] for s in meta["panel"]] == ["GEMMA", "LLAMA3_2"]
    again = cli_here(env, "send", conv.id, "And why?", "--wait", "--timeout", "60")
    assert "Gemma: lookups by email." in again.stdout
    assert "Llama: it keeps emails unique." in again.stdout
    log = conv.log.read_text()
    assert heads(log) == [
        ("CLAUDE", "PANEL"), ("GEMMA", "CLAUDE"), ("LLAMA3_2", "CLAUDE"),
        ("CLAUDE", "PANEL"), ("GEMMA", "CLAUDE"), ("LLAMA3_2", "CLAUDE"),
    ]  # fmt: skip
    gemma, llama = asked(fake_ollama, "gemma"), asked(fake_ollama, "llama3.2")
    assert len(gemma) == 2 and len(llama) == 2  # once per model per message
    assert "Gemma: an index on email." in said(gemma[1])  # its own line
    assert "Llama" not in said(gemma[0]) + said(gemma[1])  # never the other's
    assert "Gemma" not in said(llama[0]) + said(llama[1])
    assert gemma[1][-1]["content"] == "And why?" == llama[1][-1]["content"]
    state = read_state(conv)
    assert state is not None and state.status is Status.IDLE
    turns = json.loads(cli_here(env, "ledger", conv.id, "--json").stdout)["turns"]
    assert sorted(t["model"].split(":")[0] for t in turns) == sorted(["gemma", "llama3.2"] * 2)
    shown = cli_here(env, "status", conv.id).stdout
    assert "panel: GEMMA (ollama/gemma), LLAMA3_2 (ollama/llama3.2)" in shown, shown
    dash = Dashboard(load(home=home.root, env={}, config=None), token="t" * 43)
    with TestClient(dash.asgi(), base_url="http://127.0.0.1:5556", headers=BEARER) as client:
        detail = client.get(f"/api/conversations/{conv.id}").json()
        md = client.get(f"/api/conversations/{conv.id}/export.md").text
    assert [s["label"] for s in detail["panel"]] == ["GEMMA", "LLAMA3_2"]
    assert "GEMMA (ollama/gemma), LLAMA3_2 (ollama/llama3.2)" in md
    assert "## LLAMA3_2 → CLAUDE" in md


def test_a_debate_shows_the_others_last_answers_and_the_synthesis_weighs_the_round(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    fake_ollama.enqueue(
        Step(model="gemma", text="Gemma one."),
        Step(model="llama3.2", text="Llama one."),
        Step(model="qwen3", text="Both say one; Llama is surer."),
        Step(model="gemma", text="Gemma two."),
        Step(model="llama3.2", text="Llama two."),
        Step(model="qwen3", text="Two, agreed."),
    )
    daemon_factory(env, home).wait_ready()
    cid = panel_new(env, "--debate", "--synthesize", "qwen3")
    first = cli_here(env, "send", cid, "How many?", "--wait", "--timeout", "60")
    assert "Both say one; Llama is surer." in first.stdout
    cli_here(env, "send", cid, "Sure?", "--wait", "--timeout", "60")
    log = Reader(home).locate(cid).log.read_text()
    assert [h for h, _ in heads(log) if h != "CLAUDE"] == [
        "GEMMA", "LLAMA3_2", "SYNTHESIS_QWEN3", "GEMMA", "LLAMA3_2", "SYNTHESIS_QWEN3",
    ]  # fmt: skip
    synth = asked(fake_ollama, "qwen3")
    assert len(synth) == 2
    assert "[GEMMA]\\nGemma one." in said(synth[0]) and "[LLAMA3_2]\\nLlama one." in said(synth[0])
    assert "Gemma two." in said(synth[1]) and "Gemma one." not in said(synth[1][-1:])
    gemma = asked(fake_ollama, "gemma")
    assert "[LLAMA3_2]\\nLlama one." in said(gemma[1][-1:])  # the debate: the others' last
    assert "Both say one" not in said(gemma[1])  # the synthesis is not a seat's answer


def test_a_need_is_its_askers_and_answered_to_it(
    home: Home, tmp_path: Path, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "plan.md").write_text("Ship on Friday.")
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[tools]\nallowed_roots = ["{notes}"]\n')
    env = base_env(home, fake_ollama, CONTEMPLATION_CONFIG=str(cfg))
    fake_ollama.enqueue(
        Step(model="gemma", text=f"NEED: File contents of {notes / 'plan.md'}"),
        Step(model="llama3.2", text="Llama: no idea."),
        Step(model="gemma", text="Gemma: Friday."),
    )
    daemon_factory(env, home).wait_ready()
    cid = panel_new(env)
    done = cli(env, "send", cid, "When do we ship?", "--wait", "--timeout", "60")
    assert "Gemma: Friday." in done.stdout and "Llama: no idea." in done.stdout
    log = Reader(home).locate(cid).log.read_text()
    assert ("CLAUDE", "GEMMA") in heads(log)  # the answer is addressed to the seat that asked
    gemma, llama = asked(fake_ollama, "gemma"), asked(fake_ollama, "llama3.2")
    assert len(gemma) == 2 and len(llama) == 1
    assert "Ship on Friday." in said(gemma[1]) and "Ship on Friday." not in said(llama)


def test_a_daemon_killed_mid_round_answers_the_missing_models_only(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    fake_ollama.enqueue(
        Step(model="gemma", text="Gemma answers."),
        Step(model="llama3.2", text="Llama starts\n" + "and goes on " * 40, chunk_delay=0.25),
    )
    daemon = daemon_factory(env, home).wait_ready()
    cid = panel_new(env)
    cli_here(env, "send", cid, "Go.")
    conv = Reader(home).locate(cid)
    # llama is asked while gemma streams (Ollama runs both models at once); killed once its
    # own turn writes the line it held into the log, after gemma's reply
    wait_for(lambda: "Llama starts" in conv.log.read_text(), 30, what="llama writing")
    daemon.stop(signal.SIGKILL)
    fake_ollama.enqueue(Step(model="llama3.2", text="Llama answers."))
    daemon_factory(env, home).wait_ready()
    done = cli_here(env, "wait", cid, "--timeout", "60")
    assert "Llama answers." in done.stdout, done.stdout
    log = conv.log.read_text()
    assert log.count("Gemma answers.") == 1 and log.count("Llama answers.") == 1
    assert len(asked(fake_ollama, "gemma")) == 1  # the seat that had answered: not again
    assert len(asked(fake_ollama, "llama3.2")) == 2  # the cut one: redone once
    assert "INTERRUPTED" in log


def test_cancel_stops_the_round(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    fake_ollama.enqueue(Step(model="gemma", kind="hang", after_chunks=1, text="Gemma starts"))
    daemon_factory(env, home).wait_ready()
    cid = panel_new(env)
    cli_here(env, "send", cid, "Go.")
    wait_for(lambda: len(asked(fake_ollama, "gemma")) == 1, 30, what="gemma asked")
    cli_here(env, "cancel", cid)
    conv = Reader(home).locate(cid)
    wait_for(
        lambda: (s := read_state(conv)) is not None and s.status is Status.CANCELLED, 30,
        what="the round cancelled",
    )  # fmt: skip
    # llama may have been asked ahead (Ollama runs both models at once): what it held is
    # discarded, never written, and it is not asked again for this round
    assert len(asked(fake_ollama, "llama3.2")) <= 1
    log = conv.log.read_text()
    assert "CANCELLED" in log and "LLAMA3_2" not in [h for h, _ in heads(log)], log


def test_malformed_panels_are_refused_before_anything_is_made(home: Home) -> None:
    env = base_env(home)
    many = [a for i in range(9) for a in ("--model", f"m{i}")]
    done = cli_here(env, "new", "Too many", *many, check=False)
    assert done.returncode != 0 and "at most 8" in done.stderr, done.stderr
    lone = cli_here(env, "new", "Lone", "--model", "gemma", "--debate", check=False)
    assert lone.returncode != 0 and "need a panel" in lone.stderr, lone.stderr
    assert not home.active.exists() or not any(home.active.iterdir())


@pytest.mark.real
def test_a_panel_of_two_aliases_on_the_real_llama_server(
    home: Home, tmp_path: Path, daemon_factory: Callable[..., DaemonProc]
) -> None:
    """The real llama-server (SmolLM2) behind two aliases with their own options: one
    question, two replies, each in its own block named after its alias, each seat's request
    its own (the ledger's rows name each alias's model and the server counted each prompt)."""
    peers.xllamacpp_available()
    server = realpeers.LlamaServer(peers.smollm2_gguf(), n_ctx=2048).start()
    try:
        cfg = tmp_path / "config.toml"
        cfg.write_text(
            f'[providers.box]\nkind = "openai"\nurl = "{server.url}/v1"\n\n'
            f'[aliases.terse]\nmodel = "{server.alias}"\nproviders = ["box"]\n'
            "options = { temperature = 0, num_predict = 24 }\n\n"
            f'[aliases.wordy]\nmodel = "{server.alias}"\nproviders = ["box"]\n'
            "options = { temperature = 0.7, seed = 7, num_predict = 48 }\n"
        )
        env = base_env(home, CONTEMPLATION_CONFIG=str(cfg))
        daemon_factory(env, home).wait_ready()
        done = cli_here(
            env, "new", "Colours", "--model", "terse", "--model", "wordy",
            "--message", "Name one primary colour.", "--wait", "--timeout", "240",
        )  # fmt: skip
        print(done.stdout)
        assert done.returncode in (0, 5), done.stderr  # 5: a reply stopped at its token cap
        cid = done.stderr.strip().splitlines()[-1]
        log = Reader(home).locate(cid).log.read_text()
        assert [h for h, _ in heads(log)] == ["CLAUDE", "TERSE", "WORDY"], log
        blocks = [b for b in log.split("\n\n=== ")[1:] if b.strip()]
        assert all(len(b.split("===\n", 1)[-1].strip()) > 0 for b in blocks), log
        turns = json.loads(cli_here(env, "ledger", cid, "--json").stdout)["turns"]
        assert len(turns) == 2 and all(t["sent"] > 0 for t in turns), turns
    finally:
        server.stop()


def test_an_agent_starts_a_panel_over_mcp_and_gets_the_round_whole(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    wires: Callable[[dict[str, str]], Wire],  # noqa: F811
) -> None:
    """MCP ``conversation_start`` with ``models`` (the real stdio server, as Claude Code
    calls it, with tasks): the task completes once the whole round is in, its result holds
    every seat's reply, each ``from`` its seat."""
    env = base_env(home, fake_ollama, CONTEMPLATION_DASHBOARD_ENABLED="false")
    fake_ollama.enqueue(
        Step(model="gemma", text="Gemma: yes.", first_byte_delay=0.5),
        Step(model="llama3.2", text="Llama: no.", first_byte_delay=0.5),
    )
    daemon_factory(env, home).wait_ready()
    wire = wires(env)
    task = wire.call(
        "conversation_start", topic="Vote", initial_prompt="Yes or no?",
        models=["gemma", "llama3.2"],
    )  # fmt: skip
    done = wire.until(task["taskId"], completed, seconds=30)
    got = text_of(done["result"])
    blocks = [(b["from"], b["text"]) for b in got["blocks"] if b["kind"] == "model"]
    assert blocks == [("GEMMA", "Gemma: yes."), ("LLAMA3_2", "Llama: no.")], got


def test_a_fork_follows_one_seats_line(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    """``fork --seat GEMMA``: a conversation of that seat alone, which sees its own line of
    the blocks taken (the other seat's stay in the log for people, never in its requests)."""
    env = base_env(home, fake_ollama)
    fake_ollama.enqueue(
        Step(model="gemma", text="Gemma: tabs."),
        Step(model="llama3.2", text="Llama: spaces."),
        Step(model="gemma", text="Gemma: still tabs."),
    )
    daemon_factory(env, home).wait_ready()
    cid = panel_new(env)
    cli_here(env, "send", cid, "Tabs or spaces?", "--wait", "--timeout", "60")
    wrong = cli_here(env, "fork", cid, "--seat", "mistral", check=False)
    assert wrong.returncode != 0 and "its seats: GEMMA (gemma), LLAMA3_2 (llama3.2)" in wrong.stderr
    forked = json.loads(cli_here(env, "fork", cid, "--seat", "GEMMA", "--json").stdout)["id"]
    done = cli_here(env, "send", forked, "Sure?", "--wait", "--timeout", "60")
    assert "Gemma: still tabs." in done.stdout
    gemma = asked(fake_ollama, "gemma")
    assert len(gemma) == 2 and len(asked(fake_ollama, "llama3.2")) == 1
    assert "Gemma: tabs." in said(gemma[1]) and "Llama" not in said(gemma[1])
    meta = json.loads(Reader(home).locate(forked).metadata.read_text())
    assert [s["label"] for s in meta["panel"]] == ["GEMMA"]


def test_a_template_holds_a_panel_and_a_bad_one_says_which_key(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    duo = home.root / "templates" / "duo"
    duo.mkdir(parents=True)
    (duo / "template.toml").write_text('models = ["gemma", "llama3.2"]\n')
    fake_ollama.enqueue(Step(model="gemma", text="G."), Step(model="llama3.2", text="L."))
    daemon_factory(env, home).wait_ready()
    done = cli_here(env, "new", "Duo", "--template", "duo", "--message", "Hi?", "--wait")
    assert "G." in done.stdout and "L." in done.stdout
    (duo / "template.toml").write_text('models = ["gemma", 3]\n')
    bad = cli_here(env, "new", "Bad", "--template", "duo", check=False)
    assert bad.returncode != 0 and "invalid models in template" in bad.stderr, bad.stderr


def test_a_daemon_killed_during_the_first_seats_reply_redoes_that_seat(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    """The first reply after a message may be written with the message's own commit (no
    intent of its own): recovery must know the seat's header as a reply's, mark it
    INTERRUPTED and redo that seat — not adopt the cut words as a block written by hand."""
    env = base_env(home, fake_ollama)
    fake_ollama.enqueue(Step(model="gemma", kind="hang", after_chunks=2, text="Gemma starts to"))
    daemon = daemon_factory(env, home).wait_ready()
    cid = panel_new(env)
    cli_here(env, "send", cid, "Go.")
    conv = Reader(home).locate(cid)
    wait_for(lambda: "GEMMA -> CLAUDE" in conv.log.read_text(), 30, what="gemma streaming")
    daemon.stop(signal.SIGKILL)
    fake_ollama.enqueue(
        Step(model="gemma", text="Gemma answers."), Step(model="llama3.2", text="Llama answers.")
    )
    daemon_factory(env, home).wait_ready()
    done = cli_here(env, "wait", cid, "--timeout", "60")
    assert "Gemma answers." in done.stdout and "Llama answers." in done.stdout, done.stdout
    log = conv.log.read_text()
    assert "INTERRUPTED" in log, log
    assert [h for h, _ in heads(log)] == ["CLAUDE", "GEMMA", "GEMMA", "LLAMA3_2"], log
    assert log.count("Llama answers.") == 1 and len(asked(fake_ollama, "gemma")) == 2
    # llama, asked ahead while gemma streamed, held its reply in memory only: the kill lost
    # it, and it was asked again (at most once more)
    assert 1 <= len(asked(fake_ollama, "llama3.2")) <= 2
