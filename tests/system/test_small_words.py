"""Small words that mislead: each surface says only what is true for the
command that was run."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import ListResourcesResult

from contemplation.errors import Ambiguous
from contemplation.faces import actions
from contemplation.faces.mcp import calls as mcp_faces
from contemplation.faces.reading import locate
from contemplation.store.layout import Conv, Home
from contemplation.store.templates import load_template
from contemplation.writer import new_conversation, open_writer
from tests.conftest import ROOT, DaemonProc, base_env, cli_here, wait_for
from tests.system.test_mcp_server import run_calls, settings_for


def make_conv(home: Home, topic: str = "follow me") -> Conv:
    return new_conversation(
        home, topic, template=load_template(home, "default"), model="llama3.2", backend="ollama"
    )


def exchange(conv: Conv, words: str) -> None:
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", f"question {words}", msg_id=f"m-{words}")
        r = w.reply("OLLAMA", "CLAUDE", f"r-{words}")
        r.content(f"answer {words}")
        r.finish()


class Reader:
    """What a follower process has printed so far (its stdout read without blocking)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.out = proc.stdout
        os.set_blocking(self.out.fileno(), False)
        self.seen = bytearray()

    def saw(self, marker: str) -> Callable[[], bool]:
        def check() -> bool:
            chunk = self.out.read()
            if chunk:
                self.seen.extend(chunk)
            return marker.encode() in self.seen

        return check


def test_tail_f_and_a_real_tail_F_keep_up_across_archive_and_reopen(home: Home) -> None:
    """`contemplation tail -f` went silent once a conversation it followed was archived and
    reopened (it looked for the folder in completed/ only, where it was no more). The log
    keeps its identity across both moves (one rename of the folder), so the real `tail -F`
    on the active path the docs name keeps up as well."""
    if shutil.which("tail") is None:
        pytest.skip("no tail")
    conv = make_conv(home)
    exchange(conv, "one")
    env = base_env(home)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "contemplation", "tail", "-f", conv.id],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
        ),
        subprocess.Popen(
            ["tail", "-F", "-n", "+1", str(conv.log)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        ),
    ]
    ours, real = (Reader(p) for p in procs)
    try:
        for r in (ours, real):
            wait_for(r.saw("answer one"), 15, what="the follower to print the log")
        archived = actions.archive_conversation(home, conv)
        assert archived.is_completed
        exchange(archived, "archived")  # by hand, in completed/
        wait_for(ours.saw("answer archived"), 15, what="tail -f to follow into completed/")
        back = actions.reopen(home, archived)
        assert not back.is_completed
        exchange(back, "reopened")
        for r in (ours, real):
            wait_for(r.saw("answer reopened"), 15, what="the follower after reopen")
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for r in (ours, real):
        text = r.seen.decode()
        assert text.count("answer one") == 1, text  # nothing printed twice
        assert text.count("answer reopened") == 1, text


def crashed_mid_reply(home: Home) -> Conv:
    """A conversation whose daemon died while a reply streamed: state.json still says
    generating, half a reply after what it committed, and nobody holds the lock."""
    conv = make_conv(home, "crashed")
    exchange(conv, "one")
    with conv.log.open("ab") as f:
        f.write(b"\n=== OLLAMA -> CLAUDE [2026-01-01 00:00:00] ===\nhalf a rep")
    state = json.loads(conv.state.read_text())
    state["status"] = "generating"
    conv.state.write_text(json.dumps(state))
    return conv


def test_send_says_an_earlier_reply_is_being_written_only_with_wait_and_only_when_true(
    home: Home,
) -> None:
    """Plain `send` printed --wait's note ("this prints only the exchange this message
    starts") although it prints no exchange, and both said a reply was still being written
    after the daemon that wrote it had crashed."""
    conv = crashed_mid_reply(home)
    env = base_env(home)
    plain = cli_here(env, "send", conv.id, "hello")
    assert "earlier reply" not in plain.stderr, plain.stderr
    waited = cli_here(env, "send", conv.id, "again", "--wait", "--timeout", "0.5", check=False)
    assert waited.returncode == 4, waited.stderr  # no daemon: it times out
    assert "still being written" not in waited.stderr, waited.stderr


def test_an_exact_topic_wins_over_longer_topics_and_a_cut_list_says_how_many_more(
    home: Home,
) -> None:
    """"memory" was ambiguous next to "memory persistence" although one conversation is
    called exactly that; and the list of matches showed 5 of 7 without a word."""
    exact = make_conv(home, "Memory")
    make_conv(home, "memory persistence")
    make_conv(home, "memory leaks")
    assert locate(home, "memory") == exact
    assert locate(home, "Memory") == exact
    for letter in "abcdefg":
        make_conv(home, f"plan {letter}")
    with pytest.raises(Ambiguous) as got:
        locate(home, "plan")
    assert "matches 7 conversations" in str(got.value)
    assert str(got.value).endswith(", and 2 more"), str(got.value)


def _imported(home: Home, name: str, last_by_model: bool) -> None:
    """A folder copied into completed/ by hand: a log, no state.json."""
    folder = home.completed / name
    folder.mkdir(parents=True)
    blocks = [
        "=== CLAUDE -> OLLAMA [2026-03-01 09:12:40] ===\nWhy does the WAL keep growing?\n",
        "=== OLLAMA -> CLAUDE [2026-03-01 09:12:58] ===\nAn open reader holds it back.\n",
    ]
    (folder / "messages.log").write_text("\n".join(blocks if last_by_model else blocks[:1]))


def test_an_imported_archive_the_model_answered_last_is_not_pending(home: Home) -> None:
    """A folder copied into completed/ without state.json was listed `pending (archived)`
    although its last block is the model's: nothing is pending, the next word is the
    agent's (what the daemon calls idle)."""
    _imported(home, "conv_20260301-083000_wal-checkpoints", last_by_model=True)
    _imported(home, "conv_20260302-083000_unanswered", last_by_model=False)
    env = base_env(home)
    listed = json.loads(cli_here(env, "list", "--all", "--json").stdout)["conversations"]
    rows = {r["id"]: r for r in listed}
    assert rows["conv_20260301-083000_wal-checkpoints"]["status"] == "idle"
    assert rows["conv_20260302-083000_unanswered"]["status"] == "pending"
    table = cli_here(env, "list", "--all").stdout
    assert "idle (archived)" in table, table


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_doctor_hints_name_the_providers_own_keys_and_no_reload_that_would_be_refused(
    home: Home, tmp_path: Path, daemon_factory: Callable[..., DaemonProc]
) -> None:
    """A named provider with its own url was told "set OPENAI_BASE_URL (or openai.base_url)",
    which it never reads; and doctor suggested `service reload` for a file the reload refuses."""
    config = tmp_path / "config.toml"
    good = f'[providers.lab]\nkind = "openai"\nurl = "http://127.0.0.1:{_free_port()}/v1"\n'
    config.write_text(good)
    env = base_env(home, CONTEMPLATION_CONFIG=str(config))
    out = cli_here(env, "doctor", check=False).stdout
    lab = next(line for line in out.splitlines() if line.split()[1:2] == ["lab"])
    hint = out.split(lab, 1)[1].splitlines()[1]
    assert "hint:" in hint and "OPENAI_BASE_URL" not in hint and "openai.base_url" not in hint
    assert "providers.lab.url" in hint, hint
    daemon_factory(env, home).wait_ready()
    config.write_text('default_backend = "nope"\n' + good)  # loads, but does not validate
    out = cli_here(env, "doctor", check=False).stdout
    assert "runs other settings than" in out, out
    assert "service reload" not in out and "kill -HUP" not in out, out
    assert "would be refused" in out, out


def test_search_without_all_says_how_many_archived_blocks_match_and_how_to_see_them(
    home: Home,
) -> None:
    """`search` said "no block matches" while archived conversations held the words."""
    for name in ("conv_20260301-083000_wal-one", "conv_20260302-083000_wal-two"):
        _imported(home, name, last_by_model=True)  # archived: one block says WAL
    env = base_env(home)
    out = cli_here(env, "search", "wal")
    assert out.stdout == ""
    assert "no block of an active conversation matches 'wal'" in out.stderr, out.stderr
    assert "2 archived block(s) match: search --all to see them" in out.stderr, out.stderr
    assert json.loads(cli_here(env, "search", "wal", "--all", "--json").stdout.splitlines()[0])
    none = cli_here(env, "search", "quokka", "--mode", "words").stderr
    assert none.strip() == "no block matches 'quokka'", none
    # by meaning too (the default with the semantic extra): it says what it could not search
    both = cli_here(env, "search", "quokka").stderr
    assert "2 conversation(s) not embedded yet" in both, both


def test_resources_list_is_paged_with_the_mcp_cursor(home: Home) -> None:
    """resources/list was one unpaged answer, two resources per active conversation; it
    now comes a bounded page at a time, with nextCursor while more follow (the real SDK
    client pages through it), and a cursor it never gave is refused."""
    ids = {make_conv(home, f"paged {i}").id for i in range(7)}

    async def script(c: Client) -> tuple[list[ListResourcesResult], str]:
        pages: list[ListResourcesResult] = []
        cursor = None
        for _ in range(10):  # bounded: 3 pages are expected
            got = await c.list_resources(cursor=cursor, cache_mode="bypass")
            pages.append(got)
            cursor = got.next_cursor
            if cursor is None:
                break
        try:
            await c.list_resources(cursor="not-a-cursor", cache_mode="bypass")
        except MCPError as exc:
            return pages, str(exc)
        return pages, ""

    pages, refused = run_calls(
        settings_for(home), script, mcp_faces.Limits(resources_page=3)
    )
    assert [len(p.resources) for p in pages] == [6, 6, 2]
    uris = [str(r.uri) for p in pages for r in p.resources]
    assert len(uris) == len(set(uris)) == 14
    assert {u.split("/")[2] for u in uris} == ids
    assert "not a cursor this server gave" in refused, refused
