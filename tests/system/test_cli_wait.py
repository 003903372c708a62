"""Waiting from a shell: ``respond --wait``, ``approve --wait``, ``new --message
--wait`` and ``contemplation wait`` print the exchange and end with ``send --wait``'s exit
codes; ``--wait`` prints only the exchange its own message started. A real daemon process
against the scripted fake Ollama, driven by the real CLI."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from contemplation.faces.reading import Reader
from contemplation.models import Status
from contemplation.store.layout import Conv, Home, read_state
from tests.conftest import DaemonProc, base_env, cli, cli_here, wait_for
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_permissions import daemon_env, state_is


def test_respond_wait_and_wait_print_the_exchange_with_the_exit_codes(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(Step(text="Who?\nNEED: The release manager"), Step(text="Ada ships it."))
    made = cli_here(
        env, "new", "rel", "--message", "Who ships?", "--wait", "--timeout", "30", check=False
    )
    assert made.returncode == 3, made.stderr
    conv_id = made.stderr.splitlines()[0]
    conv = Conv(home.active / conv_id)
    assert made.stdout.startswith("=== CLAUDE -> OLLAMA [") and "Who ships?" in made.stdout
    assert "NEED: The release manager" in made.stdout
    [item] = Reader(home).waiting(conv)
    assert f'contemplation respond {conv_id} "…" --need {item.id}' in made.stderr

    again = cli_here(env, "wait", conv_id, "--timeout", "30", check=False)
    assert again.returncode == 3 and "NEED: The release manager" in again.stdout
    assert f"need {item.id}: The release manager" in again.stderr

    done = cli_here(env, "respond", conv_id, "Ada", "--wait", "--timeout", "30", check=False)
    assert done.returncode == 0, done.stderr
    assert f"answered need {item.id}: The release manager" in done.stderr
    # the exchange its answer started: the answer's block, then the model's reply; not the
    # earlier exchange
    assert done.stdout.startswith("=== CLAUDE -> OLLAMA [")
    assert "RESPONSE TO NEED: The release manager" in done.stdout
    assert done.stdout.rstrip().endswith("Ada ships it.")
    assert "Who ships?" not in done.stdout
    settled = cli_here(env, "wait", conv_id, "--timeout", "30")
    assert settled.stdout.rstrip().endswith("Ada ships it.")


def test_approve_wait_prints_the_lookup_and_the_reply(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    env, notes = daemon_env(home, fake_ollama, tmp_path, 'read_file = "ask"')
    (notes / "plan.md").write_text("ship on Friday")
    fake_ollama.enqueue(
        Step(text=f"NEED: File contents of {notes / 'plan.md'}"), Step(text="Friday it is.")
    )
    daemon_factory(env, home).wait_ready()
    conv_id = cli_here(env, "new", "ask", "--message", "When?").stdout.strip()
    conv = Conv(home.active / conv_id)
    wait_for(state_is(conv, Status.AWAITING_APPROVAL), 30, what="awaiting approval")
    done = cli_here(env, "approve", conv_id, "--once", "--wait", "--timeout", "30", check=False)
    assert done.returncode == 0, done.stderr
    assert "approved once: files.read" in done.stderr
    assert "ship on Friday" in done.stdout and done.stdout.rstrip().endswith("Friday it is.")
    assert "When?" not in done.stdout


def test_send_wait_prints_only_its_own_exchange_while_an_earlier_reply_streams(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    slow = " ".join(f"w{i}" for i in range(60))
    fake_ollama.enqueue(Step(text=slow, chunk_delay=0.05), Step(text="The second answer."))
    conv_id = cli_here(env, "new", "two", "--message", "first").stdout.strip()
    conv = Conv(home.active / conv_id)
    wait_for(lambda: b"w3" in conv.log.read_bytes(), 30, what="the first reply streaming")
    st = read_state(conv)
    assert st is not None and st.status is Status.GENERATING
    out = cli_here(env, "send", conv_id, "second", "--wait", "--timeout", "30", check=False)
    assert out.returncode == 0, out.stderr
    assert "an earlier reply is still being written" in out.stderr
    assert "w59" not in out.stdout  # the tail of the earlier reply is not this exchange
    assert out.stdout.startswith("=== CLAUDE -> OLLAMA [") and "\nsecond\n" in out.stdout
    assert out.stdout.rstrip().endswith("The second answer.")


def test_small_things_say_yes_no_refuse_alike_and_name_the_queue(
    home: Home, fake_ollama: FakeOllama
) -> None:
    env = base_env(home, fake_ollama)
    conv_id = cli_here(env, "new", "small").stdout.strip()
    status = cli_here(env, "status").stdout
    assert "daemon_running: no" in status and "True" not in status and "False" not in status
    nothing = cli_here(env, "cancel", conv_id, check=False)
    assert nothing.returncode == 1 and nothing.stderr.startswith("error: nothing to cancel")
    sent = cli_here(env, "send", conv_id, "hello").stdout.strip()
    [name] = [p.name for p in (home.active / conv_id / "inbox").iterdir()]
    assert sent == f"queued for {conv_id} (inbox/{name})"
    one = cli_here(env, "status", conv_id).stdout
    assert "stalled: no daemon is running" in one


def test_doctor_and_models_only_fail_for_an_unreachable_backend_in_use(home: Home) -> None:
    env = base_env(home, CONTEMPLATION_OLLAMA_HOST="http://127.0.0.1:9")  # nothing listens
    doctor = cli_here(env, "doctor", check=False)
    assert doctor.returncode == 0, doctor.stdout
    assert "warn ollama" in doctor.stdout and "no active conversation uses it" in doctor.stdout
    models = cli_here(env, "models", check=False)
    assert models.returncode == 0 and "ollama:" in models.stderr
    asked = cli_here(env, "models", "-b", "ollama", check=False)
    assert asked.returncode == 1
    cli_here(env, "new", "uses it", "--backend", "ollama")
    assert cli_here(env, "doctor", check=False).returncode == 1
    assert cli_here(env, "models", check=False).returncode == 1


# --------------------------------------------------------------------------- refused messages


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("before\x00after", "the message holds NUL bytes (binary data is not a message)"),
        ('SCHEMA: {"type": 5}\nLargest city?', "the message's SCHEMA line is not a valid JSON"),
        ("SCHEMA: {this is prose, not JSON}\nhi", "the message's SCHEMA line is not JSON"),
    ],
)
def test_send_refuses_what_the_daemon_would_refuse_and_queues_nothing(
    home: Home, text: str, why: str
) -> None:
    """The daemon's own rules, before anything is queued: one line, exit 1."""
    env = base_env(home)
    conv_id = cli_here(env, "new", "refuse").stdout.strip()
    for args in (["send", conv_id, "-", "--wait", "--timeout", "30"], ["send", conv_id, "-"]):
        got = cli(env, *args, input=text, check=False)
        assert got.returncode == 1, got.stderr
        assert got.stderr.startswith(f"error: {why}") and got.stderr.count("\n") == 1, got.stderr
        assert got.stdout == ""
    made = cli_here(env, "new", "x", "--message", "-", input=text, check=False)
    assert made.returncode == 1 and made.stderr.startswith(f"error: {why}"), made.stderr
    assert list((home.active / conv_id / "inbox").iterdir()) == []


def test_send_wait_ends_at_once_when_the_daemon_refuses_its_message(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    """A message the daemon refuses into failed/ for a reason the sender could not check (here
    the daemon's own, smaller, max_message_bytes) ends the wait with that reason, exit 1;
    never "the reply still comes"."""
    env = base_env(home, fake_ollama)
    small = base_env(home, fake_ollama, CONTEMPLATION_MAX_MESSAGE_BYTES="64")
    daemon_factory(small, home).wait_ready()
    conv_id = cli_here(env, "new", "small").stdout.strip()
    t0 = time.monotonic()
    got = cli_here(env, "send", conv_id, "x" * 100, "--wait", "--timeout", "30", check=False)
    assert got.returncode == 1, got.stderr
    assert time.monotonic() - t0 < 20
    assert "max_message_bytes" in got.stderr and "64" in got.stderr, got.stderr
    assert "still comes" not in got.stderr and "timed out" not in got.stderr
    assert fake_ollama.chat_requests() == []
    as_json = cli_here(env, "send", conv_id, "y" * 100, "--wait", "--json", check=False)
    assert as_json.returncode == 1, as_json.stderr
    out = json.loads(as_json.stdout)
    assert out["exit_code"] == 1 and "max_message_bytes" in out["error"]
    assert out["error"].startswith("the daemon refused the message (kept in failed/")


def test_wait_ends_at_once_when_a_message_dropped_by_hand_is_refused(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    conv_id = cli_here(env, "new", "by hand", "--message", "hi", "--wait", "--timeout", "30").stderr
    conv = Conv(home.active / conv_id.splitlines()[0])
    (conv.inbox / "bad.txt").write_bytes(b"half\x00binary")
    got = cli_here(env, "wait", conv.id, "--timeout", "30", check=False)
    assert got.returncode == 1, got.stderr
    assert "the file holds NUL bytes (binary data is not a message)" in got.stderr
    assert "still comes" not in got.stderr
    again = cli_here(env, "wait", conv.id, "--json", "--timeout", "30", check=False)
    assert again.returncode == 1 and "NUL bytes" in json.loads(again.stdout)["error"]
    # a message taken after it is the exchange now: the refusal no longer ends the wait
    assert cli_here(env, "send", conv.id, "more", "--wait", "--timeout", "30").returncode == 0
    assert cli_here(env, "wait", conv.id, "--timeout", "30").returncode == 0


def test_send_while_the_model_waits_needs_plain_and_says_what_stays_unanswered(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    """As MCP asks for plain=true, `send` while needs or lookups wait is
    refused (exit 1, nothing queued) with each item's command; --plain sends it and says
    what is left unanswered."""
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(Step(text="Who?\nNEED: The release manager"), Step(text="Moving on."))
    made = cli_here(
        env, "new", "rel", "--message", "Who ships?", "--wait", "--timeout", "30", check=False
    )
    assert made.returncode == 3, made.stderr
    conv = Conv(home.active / made.stderr.splitlines()[0])
    [item] = Reader(home).waiting(conv)
    refused = cli_here(env, "send", conv.id, "Something else.", "--wait", check=False)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith(
        f"error: {conv.id} waits for 1 answer(s) from you; a message now leaves it "
        "unanswered. Settle it, or send the message anyway with --plain:\n"
    ), refused.stderr
    assert f'contemplation respond {conv.id} "…" --need {item.id}' in refused.stderr
    assert list(conv.inbox.iterdir()) == []
    sent = cli_here(env, "send", conv.id, "Something else.", "--plain", "--wait", "--timeout", "30")
    assert f"note: left unanswered: {item.id} (need): The release manager" in sent.stderr
    assert sent.stdout.rstrip().endswith("Moving on.")
