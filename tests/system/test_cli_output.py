"""Human CLI output: labelled lines, aligned tables, no Python reprs."""

from __future__ import annotations

from click.testing import CliRunner

from contemplation.faces.cli.root import main
from contemplation.faces.cli.show import ago
from contemplation.store.layout import Conv, Home
from contemplation.store.templates import load_template
from contemplation.writer import archive, drop_message, new_conversation
from tests.conftest import base_env, cli
from tests.fakes.ollama_server import FakeOllama, Step


def make(home: Home, topic: str = "output") -> Conv:
    return new_conversation(
        home, topic, template=load_template(home, "default"), model="llama3.2", backend="ollama"
    )


def test_status_reads_like_systemctl_status(home: Home, fake_ollama: FakeOllama) -> None:
    conv = make(home)
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    fake_ollama.enqueue(Step(text="hello there", prompt_eval_count=12))
    drop_message(conv, "hi")
    cli(env, "run", "--once")
    out = cli(env, "status", conv.id).stdout
    assert "conversation: " + conv.id in out
    assert "status:       idle" in out
    assert "model:        llama3.2 on ollama" in out
    assert "last turn:    12 prompt + " in out and "tokens" in out
    assert " s ago" in out
    for repr_bit in ("{'", "False", "None", "[]"):
        assert repr_bit not in out, out


def test_list_has_a_header_aligned_columns_and_marks_archived(home: Home) -> None:
    a, b = make(home, "first"), make(home, "second topic")
    archive(home, b)
    runner = CliRunner()
    env = {"CONTEMPLATION_HOME": str(home.root)}
    out = runner.invoke(main, ["list", "--all"], env=env).output
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "STATUS", "MODEL", "LAST", "ACTIVITY"]
    col = lines[0].index("STATUS")
    assert all(line[col - 3 : col] == "   " for line in lines[1:])  # one column start
    archived = next(line for line in lines if b.id in line)
    assert "(archived)" in archived and "(archived)" not in next(
        line for line in lines if a.id in line
    )


def test_editor_temporaries_in_the_inbox_are_not_messages(home: Home) -> None:
    from contemplation.store.layout import inbox_entries

    conv = make(home)
    for name in ("#draft#", ".#draft", "draft~", ".draft.swp", "draft.swp", "real.txt"):
        (conv.inbox / name).write_text("x")
    assert [e.name for e in inbox_entries(conv)] == ["real.txt"]


def test_ago_reads_as_people_say_it() -> None:
    assert ago(100.0, now=103.0) == "3 s ago"
    assert ago(0.0, now=300.0) == "5 min ago"
    assert ago(0.0, now=7200.0) == "2 h ago"
    assert ago(None) == "never"


def test_status_of_a_conversation_awaiting_approval_says_what_asks_and_how_to_decide(
    home: Home,
) -> None:
    from contemplation.models import ApprovalRequest, Status
    from contemplation.protocol.conversation import need_id
    from contemplation.protocol.parser import parse
    from contemplation.writer import open_writer

    conv = make(home, "asks")
    need = "file: ~/secrets/plan.md"
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "read my plan", msg_id="m1")
        r = w.reply("OLLAMA", "CLAUDE", "r1")
        r.content(f"NEED: {need}\nNEED: The release manager")
        r.finish()
    block = parse(conv.log.read_bytes()).blocks[-1]
    with open_writer(conv) as w:
        w.state.status = Status.AWAITING_APPROVAL
        w.state.pending_approvals = [
            ApprovalRequest(
                id=need_id(block, need),
                need=need,
                rule="read_file",
                tool="files.read",
                arguments={"path": "~/secrets/plan.md"},
                why='read_file "~/secrets/**" = "ask"',
            )
        ]
        w.save()
    got = CliRunner().invoke(main, ["--home", str(home.root), "status", conv.id])
    assert got.exit_code == 0, got.output
    assert "awaiting_approval" in got.output
    asked = need_id(block, need)
    other = need_id(block, "The release manager")
    assert f"  lookup {asked}: {need}  (files.read " in got.output
    assert f"contemplation approve {conv.id} --need {asked} --once|--always|--reject" in got.output
    assert f'contemplation respond {conv.id} "…" --need {other}' in got.output
    assert "waiting for your approval of 1 lookup(s) and your answer to 1 need(s)" in got.output
