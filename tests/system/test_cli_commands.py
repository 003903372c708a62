"""The CLI's commands through click's CliRunner (parsing and output; real folders, and the
scripted Ollama-wire fake where a model has to have said something)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from contemplation.engine.runtime import Runtime
from contemplation.faces.cli.root import main
from contemplation.faces.reading import Reader
from contemplation.models import BUSY, CANCELLABLE, SETTLED, Status
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_metadata
from contemplation.store.templates import load_template
from contemplation.writer import archive, drop_message, new_conversation
from tests.conftest import base_env, cli, run_burst
from tests.fakes.ollama_server import FakeOllama, Step

ARCHIVED = "archived (in completed/)"


def invoke(home: Home, *args: str, input: str | None = None, **env: str) -> Result:
    """``contemplation ARGS`` in-process, on ``home`` only (the caller's environment hidden)."""
    clean: dict[str, str | None] = {
        k: None for k in os.environ if k.startswith(("CONTEMPLATION_", "OLLAMA_", "OPENAI_"))
    }
    clean.update(
        CONTEMPLATION_HOME=str(home.root),
        XDG_CONFIG_HOME=str(home.root.parent / "xdg-config"),
        CONTEMPLATION_LOG_LEVEL="warning",
        CONTEMPLATION_SETTLE_SECONDS="0",
    )
    clean.update(env)
    return CliRunner().invoke(main, list(args), input=input, env=clean, prog_name="contemplation")


def make(home: Home, topic: str = "cli") -> Conv:
    return new_conversation(
        home, topic, template=load_template(home, "default"), model="llama3.2", backend="ollama"
    )


def waiting_for(
    home: Home, fake: FakeOllama, make_settings: Callable[..., Settings], *needs: str
) -> Conv:
    """A conversation whose model asked for ``needs`` that no rule answers."""
    conv = make(home, "needs")
    fake.enqueue(Step(text="\n".join(f"NEED: {n}" for n in needs)))
    drop_message(conv, "who signs off?")
    s = make_settings(fake)
    run_burst(Runtime(settings=s, home=Home(s.home)))
    return conv


# --------------------------------------------------------------------------- lookup


def test_an_archived_conversation_is_found_and_refused_with_where_it_is(home: Home) -> None:
    conv = make(home, "old news")
    archive(home, conv)
    short = conv.id[:20]
    for args in (["send", short, "more"], ["respond", short, "more"], ["cancel", short]):
        r = invoke(home, *args)
        assert r.exit_code == 1, (args, r.output)
        assert ARCHIVED in r.stderr and r.stderr.count("\n") == 1, r.stderr
    status = invoke(home, "status", "old news")
    assert status.exit_code == 0 and f"{conv.id}  {ARCHIVED}" in status.stdout
    again = invoke(home, "archive", conv.id)
    assert again.exit_code == 0 and ARCHIVED in again.stderr
    assert again.stdout.strip() == str(home.completed / conv.id)


def test_an_unknown_conversation_is_one_line_and_exit_1(home: Home) -> None:
    r = invoke(home, "send", "nothing-like-it", "hi")
    assert r.exit_code == 1
    assert r.stderr == "error: no conversation matches 'nothing-like-it'\n"


def test_list_and_status_share_one_summary(home: Home) -> None:
    conv = make(home, "shared")
    listed = json.loads(invoke(home, "list", "--json").stdout)["conversations"]
    status = json.loads(invoke(home, "status", conv.id, "--json").stdout)
    assert listed[0]["id"] == conv.id
    assert set(listed[0]) <= set(status)
    assert {k: status[k] for k in ("topic", "status", "model", "backend", "completed")} == {
        k: listed[0][k] for k in ("topic", "status", "model", "backend", "completed")
    }


def test_every_status_is_either_settled_or_busy() -> None:
    assert SETTLED.isdisjoint(BUSY)
    assert set(Status) == SETTLED | BUSY
    assert CANCELLABLE < BUSY and Status.PENDING not in CANCELLABLE


# --------------------------------------------------------------------------- new


@pytest.mark.parametrize(
    ("flag", "think"), [("--think", True), ("--no-think", False), (None, None)]
)
def test_new_sets_think(home: Home, flag: str | None, think: bool | None) -> None:
    r = invoke(home, "new", "thinking", *([flag] if flag else []), "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    meta = read_metadata(Conv(Path(data["path"])))
    assert meta is not None and meta.think is think
    assert data["queued"] is None


def test_new_with_an_empty_message_creates_nothing(home: Home) -> None:
    r = invoke(home, "new", "empty", "--message", "-", input="  \n")
    assert r.exit_code == 1 and "the message is empty" in r.stderr
    assert not list(home.active.glob("conv_*"))


def test_new_with_a_message_queues_it(home: Home) -> None:
    r = invoke(home, "new", "first", "--message", "-", "--json", input="hello\n")
    data = json.loads(r.stdout)
    conv = Conv(Path(data["path"]))
    assert (conv.inbox / data["queued"]).read_text() == "hello\n"


def test_new_refuses_an_unknown_backend_and_template(home: Home) -> None:
    bad = invoke(home, "new", "x", "--backend", "nope")
    assert bad.exit_code == 1 and "unknown backend 'nope'" in bad.stderr
    tpl = invoke(home, "new", "x", "--template", "nope")
    assert tpl.exit_code == 1 and "no template named 'nope'" in tpl.stderr


# --------------------------------------------------------------------------- respond


def test_respond_without_a_pending_need_queues_a_message(home: Home) -> None:
    conv = make(home)
    r = invoke(home, "respond", conv.id, "just so you know")
    assert r.exit_code == 0
    assert r.stdout.startswith("queued as a message (") and "None" not in r.stdout
    assert len(list(conv.inbox.iterdir())) == 1
    nope = invoke(home, "respond", conv.id, "x", "--need", "1")
    assert nope.exit_code == 1 and "waits for nothing from the agent" in nope.stderr


def test_an_answer_that_came_second_after_the_reply_costs_no_turn(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    """Two agents answer one need; the second is slower: by the time it runs, the first
    answer was taken and the model has replied. Its ``respond`` (no --need) used to be
    queued as a new message and cost a third model turn; now it exits 1 naming who answered
    and when, and sends nothing. The loser of --need is told the need was answered, not
    that nothing is its id."""
    conv = waiting_for(home, fake_ollama, make_settings, "The release manager")
    (item,) = Reader(home).waiting(conv)
    assert invoke(home, "respond", conv.id, "Ada").exit_code == 0
    fake_ollama.enqueue(Step(text="Ada signs off, then."))
    s = make_settings(fake_ollama)
    run_burst(Runtime(settings=s, home=Home(s.home)))
    assert "Ada signs off" in conv.log.read_text()
    late = invoke(home, "respond", conv.id, "Bob")
    assert late.exit_code == 1, late.output
    assert "'The release manager' was answered by agent at 2" in late.stderr, late.stderr
    assert "nothing was sent" in late.stderr
    named = invoke(home, "respond", conv.id, "Bob", "--need", item.id)
    assert named.exit_code == 1
    assert "'The release manager' was answered by agent at 2" in named.stderr, named.stderr
    assert list(conv.inbox.iterdir()) == []
    run_burst(Runtime(settings=s, home=Home(s.home)))
    assert len(fake_ollama.chat_requests()) == 2  # the question and the answer: no third
    plain = invoke(home, "respond", conv.id, "A new question.", "--plain")
    assert plain.exit_code == 0  # a new message is still one flag away
    fake_ollama.enqueue(Step(text="Noted."))
    run_burst(Runtime(settings=s, home=Home(s.home)))
    after = invoke(home, "respond", conv.id, "and a follow-up")  # a message came since
    assert after.exit_code == 0 and after.stdout.startswith("queued as a message (")


def test_two_agents_answering_one_need_cost_one_answer_and_the_loser_is_told(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    """Two real processes answer the one waiting need at once, without --need: exactly one
    answer is queued; the other exits 1 saying who answered and when, and sends nothing. The
    loser of --need is told the need was just answered, not that nothing is its id."""
    conv = waiting_for(home, fake_ollama, make_settings, "The release manager")
    (item,) = Reader(home).waiting(conv)
    env = base_env(home)
    with ThreadPoolExecutor(2) as pool:
        runs = list(
            pool.map(
                lambda who: cli(env, "respond", conv.id, f"{who} says Ada", check=False),
                ("first", "second"),
            )
        )
    assert sorted(r.returncode for r in runs) == [0, 1], [r.stderr for r in runs]
    lost = next(r for r in runs if r.returncode == 1)
    assert "'The release manager' was queued by agent at 2" in lost.stderr, lost.stderr
    assert "nothing was sent" in lost.stderr and f"contemplation send {conv.id}" in lost.stderr
    assert len(list(conv.inbox.iterdir())) == 1
    plain = invoke(home, "respond", conv.id, "a new message", "--plain")
    assert plain.exit_code == 0 and plain.stdout.startswith("queued as a message (")
    (conv.inbox / plain.stdout.split("(")[1].split(")")[0]).unlink()
    late = invoke(home, "respond", conv.id, "Bob", "--need", item.id)
    assert late.exit_code == 1
    assert "'The release manager' was queued by agent at" in late.stderr, late.stderr
    assert len(list(conv.inbox.iterdir())) == 1


def test_respond_says_which_need_it_answered(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = waiting_for(home, fake_ollama, make_settings, "The release manager", "The date")
    manager, date = Reader(home).waiting(conv)
    two = invoke(home, "respond", conv.id, "2026-02-01")
    assert two.exit_code == 1 and "2 needs wait" in two.stderr and date.id in two.stderr
    r = invoke(home, "respond", conv.id, "2026-02-01", "--need", date.id)
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [
        f"answered need {date.id}: The date",
        f"still waiting: {manager.id} (need) The release manager",
    ]
    data = json.loads(invoke(home, "respond", conv.id, "Ada", "--json").stdout)
    assert data["answered"] == "The release manager" and data["need_id"] == manager.id
    assert data["still_waiting"] == [] and (conv.inbox / data["queued"]).is_file()


# --------------------------------------------------------------------------- tail --json


def test_tail_json_is_one_block_object_a_line(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = waiting_for(home, fake_ollama, make_settings, "The release manager")
    r = invoke(home, "tail", conv.id, "--json")
    assert r.exit_code == 0
    blocks = [json.loads(line) for line in r.stdout.splitlines()]
    assert [b["kind"] for b in blocks] == ["agent", "model"]
    assert blocks[0]["text"].strip() == "who signs off?"
    assert blocks[1]["needs"] == ["The release manager"] and blocks[1]["from"] == "OLLAMA"
    last = invoke(home, "tail", conv.id, "--json", "-n", "1")
    assert [json.loads(line)["kind"] for line in last.stdout.splitlines()] == ["model"]


# --------------------------------------------------------------------------- routes


def test_routes_show_patterns_as_written(home: Home, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        "[[routes]]\nname = 'clock'\nmatch = '(?:the )?current time in (?P<tz>\\S+)'\n"
        "tool = 'state.get'\nargs = { thing = 'time {tz}' }\n"
    )
    r = invoke(home, "--config", str(config), "routes")
    assert r.exit_code == 0, r.output
    clock = next(line for line in r.stdout.splitlines() if "clock" in line)
    assert r"matches (?:the )?current time in (?P<tz>\S+)" in clock
    assert r"\\S" not in clock and "re.compile" not in clock
    rows = json.loads(invoke(home, "--config", str(config), "routes", "--json").stdout)
    assert rows[0]["match"] == r"(?:the )?current time in (?P<tz>\S+)"
    assert rows[0]["case_sensitive"] is False


def test_routes_test_call_prints_only_the_answer_on_stdout(home: Home, tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "plan.md").write_text("ship it on Friday\n")
    config = tmp_path / "config.toml"
    config.write_text(f"[tools]\nallowed_roots = [{json.dumps(str(notes))}]\n")
    need = f"NEED: File contents of {notes / 'plan.md'}"
    r = invoke(home, "--config", str(config), "routes", "test", "--call", need)
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("RESPONSE TO NEED: File contents of ")
    assert "ship it on Friday" in r.stdout and "rule:" not in r.stdout
    assert "rule:       read_file (built in)" in r.stderr
    # the root the file lies in is the rule that allows it (it would also lift a secret there)
    assert f'permission: allow (* "{notes}" = "allow" (tools.allowed_roots))' in r.stderr


@pytest.mark.parametrize("action", ["ask", "deny"])
def test_routes_test_shows_the_permission_and_call_obeys_it(
    home: Home, tmp_path: Path, action: str
) -> None:
    notes = tmp_path / "notes"
    (notes / "secrets").mkdir(parents=True)
    (notes / "secrets" / "plan.md").write_text("the secret plan\n")
    config = tmp_path / "config.toml"
    config.write_text(
        f"[tools]\nallowed_roots = [{json.dumps(str(notes))}]\n\n"
        f'[permissions]\nread_file = {{ "*secrets*" = "{action}" }}\n'
    )
    need = f"NEED: File contents of {notes / 'secrets' / 'plan.md'}"
    shown = invoke(home, "--config", str(config), "routes", "test", need)
    assert shown.exit_code == 0, shown.output
    assert f'permission: {action} (read_file "*secrets*" = "{action}" ({config}))' in shown.stdout
    called = invoke(home, "--config", str(config), "routes", "test", "--call", need)
    assert called.exit_code == 1 and "the secret plan" not in called.output
    assert f"not called: the permissions say {action}" in called.stderr
    data = json.loads(
        invoke(home, "--config", str(config), "routes", "test", need, "--json").stdout
    )
    assert data["permission"]["action"] == action and "answer" not in data


def _commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    out: list[tuple[str, click.Command]] = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # the lazy ones too (loaded here)
        cmd = group.get_command(ctx, name)
        assert cmd is not None, name
        out.append((prefix + name, cmd))
        if isinstance(cmd, click.Group):
            out.extend(_commands(cmd, prefix + name + " "))
    return out


def test_every_json_option_and_every_option_has_help() -> None:
    missing: list[str] = []
    seen_json = 0
    for name, cmd in _commands(main):
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.help:
                missing.append(f"{name} {p.opts[0]}")
            seen_json += isinstance(p, click.Option) and "--json" in p.opts
    assert not missing, missing
    assert seen_json >= 8


def test_help_documents_the_exit_codes(home: Home) -> None:
    for args in (["--help"], ["send", "--help"]):
        out = invoke(home, *args).stdout
        assert "  3    the model waits for the agent" in out, args
        assert "  4    timed out" in out, args


# --------------------------------------------------------------------------- completion


def complete(home: Home, words: str, **env: str) -> list[str]:
    """What the shell would offer for the last word of ``words`` (bash protocol)."""
    parts = words.split(" ")
    r = invoke(
        home,
        _CONTEMPLATION_COMPLETE="bash_complete",
        COMP_WORDS=words,
        COMP_CWORD=str(len(parts) - 1),
        **env,
    )
    assert r.exit_code == 0, r.output
    return [line.split(",", 1)[1] for line in r.stdout.splitlines()]


def test_completion_offers_active_and_archived_ids_and_templates(home: Home) -> None:
    a, b = make(home, "alpha"), make(home, "beta")
    archive(home, b)
    (home.templates / "reviewer").mkdir(parents=True)
    (home.templates / "reviewer" / "template.toml").write_text("model = 'x'\n")
    assert set(complete(home, "contemplation status conv_")) == {a.id, b.id}
    assert complete(home, f"contemplation tail {a.id[:-2]}") == [a.id]
    assert complete(home, "contemplation new topic --template ") == [
        "default",
        "research",
        "reviewer",
    ]
    assert "completion" in complete(home, "contemplation comp")


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_the_script(home: Home, shell: str) -> None:
    r = invoke(home, "completion", shell)
    assert r.exit_code == 0
    assert "_CONTEMPLATION_COMPLETE" in r.stdout and f"{shell}_complete" in r.stdout


def test_completion_refuses_an_unknown_shell(home: Home) -> None:
    r = invoke(home, "completion", "tcsh")
    assert r.exit_code == 2 and "tcsh" in r.stderr
