"""The ledger: per turn in state.json, summed per conversation, model and provider,
and shown by ``status``, ``contemplation ledger``, MCP and the dashboard; its totals are the
server's own counters."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from contemplation.engine.runtime import Runtime
from contemplation.faces.cli.root import main
from contemplation.faces.dashboard import cards
from contemplation.faces.mcp.calls import Faces
from contemplation.index import ledger as sums
from contemplation.models import Ledger, Usage
from contemplation.protocol import ledger
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import archive, drop_message, new_conversation
from tests import realpeers
from tests.conftest import DaemonProc, base_env, cli_here, run_burst, wait_for
from tests.fakes.ollama_server import FakeOllama, Step

LOAD_MS, PREFILL_MS, EVAL_MS = 1.334875, 342.546, 4535.599  # the fake's done line, in ms


def make(home: Home, topic: str = "ledger", model: str = "gemma") -> Conv:
    return new_conversation(
        home, topic, template=load_template(home, "default"), model=model, backend="ollama"
    )


def run_cli(home: Home, *args: str) -> str:
    got = CliRunner().invoke(main, list(args), env={"CONTEMPLATION_HOME": str(home.root)})
    assert got.exit_code == 0, got.output
    return got.output


def test_scripted_ollama_turns_are_in_the_ledger_as_the_server_said(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.md").write_text("1. ship it\n")
    s = make_settings(fake_ollama, tools={"allowed_roots": [str(notes)]})
    rt = Runtime(settings=s, home=Home(s.home))
    conv = make(home)
    fake_ollama.enqueue(
        Step(text=f"Let me look.\nNEED: File contents of {notes / 'todo.md'}",
             prompt_eval_count=100, eval_count=7),
        Step(text="Your list says: ship it.", prompt_eval_count=140, eval_count=6),
        Step(text="Done.", prompt_eval_count=170, eval_count=2),
    )  # fmt: skip
    drop_message(conv, "What is on my todo list?")
    run_burst(rt)
    drop_message(conv, "Thanks.")
    run_burst(rt)
    st = read_state(conv)
    assert st is not None and st.turns == 3
    turns = st.ledger.turns
    assert [(t.turn, t.sent, t.output) for t in turns] == [(1, 100, 7), (2, 140, 6), (3, 170, 2)]
    assert all(t.provider == "ollama" and t.model == "gemma" for t in turns)
    # Ollama says neither what it reused nor what it recomputed: unknown, never guessed
    assert all(t.reused is None and t.recomputed is None for t in turns)
    assert all(t.queued_ms is not None and t.queued_ms >= 0 for t in turns)
    for t in turns:
        assert t.load_ms == pytest.approx(LOAD_MS) and t.prefill_ms == pytest.approx(PREFILL_MS)
        assert t.generate_ms == pytest.approx(EVAL_MS)
    # the file's answer was read for the model (turn 2's prompt), never by the agent
    answer = next(b for b in conv.log.read_text().split("\n\n") if "RESPONSE TO NEED" in b)
    assert turns[1].context_bytes >= len("1. ship it") and turns[1].context_bytes <= len(answer) * 2
    assert turns[0].context_bytes == turns[2].context_bytes == 0
    total = ledger.total(st.ledger)
    assert (total.turns, total.sent, total.output) == (3, 410, 15)
    assert total.generate_ms == pytest.approx(3 * EVAL_MS)

    # the faces: status's line, ledger CONV, and the sums from the index
    assert "ledger:       3 turns: 410 prompt tokens (? reused, ? recomputed) + 15 out" in (
        run_cli(home, "status", conv.id)
    )
    one = json.loads(run_cli(home, "ledger", conv.id, "--json"))
    assert one["total"]["sent"] == 410 and len(one["turns"]) == 3 and one["more"] is False
    paged = json.loads(run_cli(home, "ledger", conv.id, "--json", "--limit", "2"))
    assert [t["turn"] for t in paged["turns"]] == [2, 3] and paged["more"]
    rest = json.loads(run_cli(home, "ledger", conv.id, "--json", "--cursor", paged["cursor"]))
    assert [t["turn"] for t in rest["turns"]] == [1] and not rest["more"]
    # MCP: conversation_check (and wait, and the status resource) carry the conversation's sums
    checked = Faces(s).check(conv.id)
    assert checked["ledger"] == one["total"]
    archive(home, conv)  # archived conversations are summed as well
    assert f"ledger: {ledger.line(total)}" in run_cli(home, "status")  # the daemon's: all
    by = json.loads(run_cli(home, "ledger", "--json", "--by", "provider"))
    assert by["groups"] == [{"key": "ollama", **by["total"]}]
    assert by["total"]["sent"] == 410 and by["total"]["reused"] is None
    assert by["total"]["context_bytes"] == turns[1].context_bytes
    # the dashboard's panel: every conversation, per provider and per model
    rows = dict(cards.kinds()["ledger"].rows(cards.Seen(home, {})))
    assert rows["all"] == rows["ollama"] == rows["ollama/gemma"] == ledger.line(total)


def _archived_with_ledger(home: Home, n: int) -> None:
    for i in range(n):
        conv = make(home, f"old {i}", model=f"m{i % 3}")
        book = Ledger()
        u = Usage(prompt_eval_count=10, cached_tokens=4, computed_tokens=6, eval_count=2)
        ledger.record(book, ledger.entry(u, turn=1, provider="p", model=f"m{i % 3}"))
        raw = json.loads(conv.state.read_text())
        raw["ledger"] = book.model_dump()
        conv.state.write_text(json.dumps(raw))  # as a daemon's commit would have left it
        archive(home, conv)


def test_sums_over_archived_conversations_come_from_the_index_a_page_at_a_time(
    home: Home,
) -> None:
    n = 120
    _archived_with_ledger(home, n)
    seen: list[str] = []
    cursor = None
    while True:
        got = sums.summed(home, limit=50, cursor=cursor)
        assert got["count"] <= 50 and got["found"] == n
        assert got["total"]["sent"] == 10 * n and got["total"]["recomputed"] == 6 * n
        seen += [g["key"] for g in got["groups"]]
        if not got["more"]:
            break
        cursor = got["cursor"]
    assert len(seen) == n == len(set(seen))
    models = sums.summed(home, by="model")
    assert [(g["key"], g["turns"]) for g in models["groups"]] == [
        ("p/m0", 40), ("p/m1", 40), ("p/m2", 40),
    ]  # fmt: skip


_METRIC = r"^llamacpp:{}\s+(\S+)$"


def _metric(url: str, name: str) -> float:
    m = re.search(_METRIC.format(name), httpx.get(f"{url}/metrics", timeout=10).text, re.M)
    assert m is not None, name
    return float(m.group(1))


@pytest.mark.real
def test_a_real_llama_server_counts_what_the_ledger_says_within_one_percent(
    home: Home, daemon_factory: Callable[..., DaemonProc]
) -> None:
    server = realpeers.shared_llama_server(n_ctx=4096)  # its counters read as differences
    env = base_env(home, OPENAI_BASE_URL=server.url + "/v1")
    daemon_factory(env, home).wait_ready()
    conv_id = cli_here(env, "new", "ledger", "--backend", "openai", "--model", "smollm2")
    conv = Conv(home.active / conv_id.stdout.strip())
    meta = json.loads(conv.metadata.read_text())
    meta["options"] = {"temperature": 0, "num_predict": 24}
    conv.metadata.write_text(json.dumps(meta))
    before = (_metric(server.url, "prompt_tokens_total"),
              _metric(server.url, "tokens_predicted_total"))  # fmt: skip
    for k, text in enumerate(("Name one colour.", "And another?", "Which is warmer?"), 1):
        cli_here(env, "send", conv.id, text)
        wait_for(
            lambda k=k: (st := read_state(conv)) is not None and st.turns == k,
            timeout=180,
            what=f"real reply {k}",
        )
    prefilled = _metric(server.url, "prompt_tokens_total") - before[0]
    predicted = _metric(server.url, "tokens_predicted_total") - before[1]
    st = read_state(conv)
    assert st is not None
    total = ledger.total(st.ledger)
    assert total.turns == 3 and total.recomputed and total.output and total.reused is not None
    assert total.sent == total.reused + total.recomputed
    assert total.recomputed == pytest.approx(prefilled, rel=0.01)
    assert total.output == pytest.approx(predicted, rel=0.01)
    assert total.prefill_ms and total.generate_ms and total.queued_ms is not None
    off = [
        abs(a - b) / b * 100 for a, b in ((total.recomputed, prefilled), (total.output, predicted))
    ]
    print(
        f"\nledger recomputed {total.recomputed} vs server prompt_tokens_total {prefilled:.0f} "
        f"({off[0]:.2f} % off); ledger output {total.output} vs tokens_predicted_total "
        f"{predicted:.0f} ({off[1]:.2f} % off); sent {total.sent} = reused {total.reused} "
        f"+ recomputed {total.recomputed}"
    )
