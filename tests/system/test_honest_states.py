"""Say what is happening: an empty reply is a marked failure, not a success, and no
rate is made up from a zero duration; a message that is not UTF-8 is kept with a NOTE saying
so; a folder deleted while its reply streams stops the stream. A real daemon process or the
real pipeline, against the scripted fake Ollama; real folders."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable

from contemplation.engine.runtime import Runtime
from contemplation.faces.cli import show
from contemplation.models import Status, Usage
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import new_conversation
from tests.conftest import DaemonProc, base_env, cli_here, run_burst, wait_for
from tests.fakes.ollama_server import FakeOllama, Step


def _conv(home: Home, topic: str = "states") -> Conv:
    return new_conversation(
        home, topic, template=load_template(home, "default"), model="llama3.2", backend="ollama"
    )


def test_an_empty_reply_is_a_marked_failure_with_no_made_up_rate(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(Step(text="", no_content=True), Step(text="Now an answer."))
    conv_id = cli_here(env, "new", "empty").stdout.strip()
    out = cli_here(env, "send", conv_id, "say something", "--wait", "--timeout", "30", check=False)
    assert out.returncode == 1, out.stderr
    assert "error: the model returned an empty reply (no text and no tool call)" in out.stderr
    conv = Conv(home.active / conv_id)
    st = read_state(conv)
    assert st is not None and st.status is Status.ERROR and st.last_error is not None
    assert "=== ERROR: the model returned an empty reply" in conv.log.read_text()
    again = cli_here(env, "send", conv_id, "try again", "--wait", "--timeout", "30")
    assert again.stdout.rstrip().endswith("Now an answer.")  # the agent's next message goes on


def test_no_rate_from_a_zero_duration() -> None:
    summary = {
        "id": "c", "completed": False, "topic": "t", "model": "m", "backend": "b",
        "status": "idle", "messages": 1, "turns": 1,
    }  # fmt: skip
    from contemplation.models import State

    tiny = State(status=Status.IDLE, last_turn=Usage(eval_count=1, eval_duration_ms=0.001))
    assert "tok/s" not in show.conversation(summary, tiny.model_dump(), None)
    real = State(status=Status.IDLE, last_turn=Usage(eval_count=40, eval_duration_ms=1000.0))
    assert "40 tokens, 40.0 tok/s" in show.conversation(summary, real.model_dump(), None)


def test_a_message_that_is_not_utf8_is_kept_with_a_note(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = _conv(home)
    (conv.inbox / "latin1.txt").write_bytes("Grüße aus Köln".encode("latin-1"))
    fake_ollama.enqueue(Step(text="Danke."))
    s = make_settings(fake_ollama)
    run_burst(Runtime(settings=s, home=Home(s.home)))
    log = conv.log.read_text()
    assert (
        "=== NOTE: the next message (latin1.txt) was not UTF-8: invalid UTF-8 was replaced by "
        "U+FFFD ===" in log
    )
    blocks = parse(conv.log.read_bytes()).blocks
    assert blocks[0].text == "Gr\ufffd\ufffde aus K\ufffdln" and blocks[-1].text == "Danke."
    assert fake_ollama.chat_requests()[0]["messages"][-1]["content"].startswith("Gr\ufffd")


def test_a_folder_deleted_mid_generation_stops_its_stream(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    slow = " ".join(f"w{i}" for i in range(200))
    fake_ollama.enqueue(Step(text=slow, chunk_delay=0.05), Step(text="still serving"))
    doomed = cli_here(env, "new", "doomed", "--message", "talk a lot").stdout.strip()
    wait_for(lambda: b"w5" in (home.active / doomed / "messages.log").read_bytes(), 30)
    started = time.monotonic()
    shutil.rmtree(home.active / doomed)
    wait_for(lambda: fake_ollama.aborted == 1, 5, what="the stream closed")
    assert time.monotonic() - started < 5  # not the 10 s the whole reply takes
    other = cli_here(env, "new", "other", "--message", "hello", "--wait", "--timeout", "30")
    assert other.stdout.rstrip().endswith("still serving")
    assert not (home.active / doomed).exists()


def test_a_folder_the_daemon_will_not_take_is_named_with_why(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    """A hand-made folder whose name has a space was ignored without a word: it is named once
    in the daemon's log, by doctor and by list --all, with the naming rule."""
    env = base_env(home, fake_ollama)
    home.active.mkdir(parents=True, exist_ok=True)
    bad = home.active / "my notes"
    (bad / "inbox").mkdir(parents=True)
    (bad / "inbox" / "q.txt").write_text("hello?")
    d = daemon_factory(env, home).wait_ready()
    good = cli_here(env, "new", "fine", "--message", "hi", "--wait", "--timeout", "30")
    assert good.returncode == 0
    doctor = cli_here(env, "doctor").stdout
    assert "warn folders  active/my notes is not taken: not a conversation id (" in doctor
    listed = cli_here(env, "list", "--all")
    assert "not taken: active/my notes: not a conversation id" in listed.stderr
    assert cli_here(env, "list").stderr == ""  # the plain list stays quiet
    assert d.stop() == 0  # said at start (long before the reply came), by no rescan again
    log = d.stderr()
    assert log.count('"folder_not_taken"') == 1 and "my notes" in log
    assert (bad / "inbox" / "q.txt").exists()  # nothing of it was touched


def test_status_after_the_daemon_died_says_the_generation_is_stale(home: Home) -> None:
    from contemplation.writer import open_writer

    conv = _conv(home, "died")
    with open_writer(conv) as w:  # as a daemon killed mid-reply leaves it
        w.state.generating_since = time.time() - 7
        w.set_status(Status.GENERATING)
    out = cli_here(base_env(home), "status", conv.id).stdout
    # 7 s before the command started; a slow start (a loaded machine) may make it 8 or 9
    assert re.search(r"generating: +since [789] s ago — stale: no daemon is running", out), out
    assert "now:          stalled: no daemon is running" in out


def test_status_with_no_daemon_says_so_and_counts_only_the_agents_messages(home: Home) -> None:
    """An approval decided while no daemon runs left ``now: awaiting_approval`` (a
    raw status); the permissions' automatic refusal was counted as a message of the agent."""
    from contemplation.writer import open_writer

    conv = _conv(home, "decided")
    with open_writer(conv) as w:  # the lookup was decided; no daemon has taken it up
        w.set_status(Status.AWAITING_APPROVAL)
    conv.log.write_text(
        "=== CLAUDE -> OLLAMA [2026-11-24 22:31:06] ===\nWho ships 2.0?\n\n"
        "=== OLLAMA -> CLAUDE [2026-11-24 22:31:06] ===\nNEED: File contents of .env\n\n"
        "=== CLAUDE -> OLLAMA [2026-11-24 22:31:06] ===\nRESPONSE TO NEED: File contents of "
        ".env\n(source: permissions, 2026-11-24 22:31:06)\nNOT ANSWERED (refused): denied\n\n"
    )
    out = cli_here(base_env(home), "status", conv.id).stdout
    assert "messages:     1 from the agent, 1 model turns" in out, out
    now = next(line for line in out.splitlines() if line.startswith("now:"))
    assert now.startswith("now:          stalled: no daemon is running"), now
