"""Crash consistency: SIGKILL at every named step, and random kill storms.

After every crash and restart: no message lost, none duplicated, no torn or forged block,
interrupted replies marked and redone, state.json consistent with the log.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _pytest.mark import ParameterSet

from contemplation.base.testing import POINTS
from contemplation.models import BlockKind
from contemplation.protocol.conversation import whole
from contemplation.settings import AttachmentSettings
from contemplation.store.attachments import FOLDER, LINE_RE, read_claimed
from contemplation.store.layout import Conv, Home, list_conversations, read_state
from contemplation.store.logview import LogView
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests.conftest import ROOT, base_env
from tests.fakes.ollama_server import FakeOllama, Step

MESSAGES = 3
CONVS = 2


def workload(home: Home) -> dict[str, list[str]]:
    expected: dict[str, list[str]] = {}
    for c in range(CONVS):
        conv = new_conversation(
            home,
            f"crash {c}",
            template=load_template(home, "default"),
            model="llama3.2",
            backend="ollama",
        )
        texts = [f"conv {c} message {i} " + "padding " * 60 for i in range(MESSAGES)]
        for i, t in enumerate(texts):
            drop_message(conv, t, name=f"{i:03d}.msg")
        expected[conv.id] = texts
    return expected


def workload_by_hand(home: Home) -> dict[str, list[str]]:
    """The same messages in folders made by hand: only ``inbox/`` and the files in it, so the
    first sight (metadata, state, log, processing/) runs inside the crashed run too."""
    expected: dict[str, list[str]] = {}
    for c in range(CONVS):
        inbox = home.active / f"by-hand-{c}" / "inbox"
        inbox.mkdir(parents=True)
        texts = [f"conv {c} message {i} " + "padding " * 60 for i in range(MESSAGES)]
        for i, t in enumerate(texts):
            (inbox / f"{i:03d}.msg").write_text(t)
            stamp = time.time() - 10 + i  # arrival order, as files dropped one after another
            os.utime(inbox / f"{i:03d}.msg", (stamp, stamp))
        expected[inbox.parent.name] = texts
    return expected


def run_once(env: dict[str, str], crash: str | None = None, timeout: float = 60) -> int:
    e = dict(env)
    if crash:
        e.update(CONTEMPLATION_TESTING="1", CONTEMPLATION_CRASH_AT=crash)
    return subprocess.run(
        [sys.executable, "-m", "contemplation", "run", "--once"],
        env=e,
        cwd=ROOT,
        capture_output=True,
        timeout=timeout,
    ).returncode


def check_invariants(home: Home, expected: dict[str, list[str]]) -> None:
    convs = {c.id: c for c in list_conversations(home)}
    assert set(convs) == set(expected)
    for conv_id, texts in expected.items():
        conv: Conv = convs[conv_id]
        data = conv.log.read_bytes()
        result = LogView(conv).refresh()  # every rotated segment, then the live log
        assert not [e for e in result.errors if "ends without a newline" in e], result.errors
        agent = [b.text for b in result.blocks if b.kind is BlockKind.AGENT]
        assert agent == texts, f"{conv_id}: messages lost, duplicated or reordered: {agent}"
        # exactly one whole reply after each message, interrupted ones marked
        seq = [b for b in result.blocks if b.kind is BlockKind.AGENT or whole(b)]
        kinds = [b.kind for b in seq]
        assert kinds == [BlockKind.AGENT, BlockKind.MODEL] * len(texts), kinds
        for msg, reply in zip(seq[::2], seq[1::2], strict=True):
            assert reply.text == f"Echo: {msg.text[:60]}"
        for b in result.blocks:
            if b.kind is BlockKind.MODEL and not whole(b):
                assert b.interrupted
        assert list(conv.inbox.iterdir()) == []
        assert not conv.processing.exists() or list(conv.processing.iterdir()) == []
        st = read_state(conv)
        assert st is not None and st.intent is None
        assert st.log.size == len(data) and st.log.ino == conv.log.stat().st_ino
        assert st.turns >= len(texts)
        assert not list(conv.dir.glob(".*.tmp.*"))


def finish(env: dict[str, str], limit: int = 10) -> None:
    for _ in range(limit):
        if run_once(env) == 0:
            return
    raise AssertionError("the daemon never finished cleanly")


@pytest.fixture
def crash_env(home: Home, fake_ollama: FakeOllama) -> dict[str, str]:
    fake_ollama.default_step = Step(chunks=4)
    # long echo replies + the smallest rotate_bytes: logs rotate several times per workload
    fake_ollama.default_step = Step(chunks=4, text="")
    return base_env(
        home,
        fake_ollama,
        CONTEMPLATION_SETTLE_SECONDS="0",
        CONTEMPLATION_DURABILITY="none",
        CONTEMPLATION_ROTATE_BYTES="1024",
    )


# Points a turn's run --once never reaches with these workloads: a kill there is no kill.
# Where the default tier kills them instead: test_kill_during_an_attachment_copy… below, and
# the crash sweep's scenario "archive" (tests/system/test_crash_points.py).
NOT_IN_A_TURN = {"attachment_copy", "archive"}
KINDS = ("new", "hand")  # a folder made by ``new_conversation``, or by hand (only inbox/)


def _kills() -> list[ParameterSet]:
    """(point, nth, made): the default tier kills each point a turn reaches at its first hit
    (and asserts it was killed), in one kind of folder, the kinds alternating from one point
    to the next (7 and 7); the other kind, the later hits, and the points no turn reaches
    are the long tier's (``--slow``). Both kinds at every point were 28 cases, 70 s of the
    default tier."""
    out = []
    for i, point in enumerate(POINTS):
        for nth in (1, 2, 5):
            for made in KINDS:
                slow = nth != 1 or point in NOT_IN_A_TURN or made != KINDS[i % 2]
                marks = (pytest.mark.slow,) if slow else ()
                out.append(pytest.param(point, nth, made, marks=marks, id=f"{made}-{nth}-{point}"))
    return out


KILLS = _kills()


def default_tier(params: list[ParameterSet]) -> list[tuple[Any, ...]]:
    """The values of the parameter sets not marked slow."""
    return [tuple(p.values) for p in params if not any(m.name == "slow" for m in p.marks)]


@pytest.mark.parametrize("point,nth,made", KILLS)
def test_kill_at_every_named_step(
    home: Home, crash_env: dict[str, str], point: str, nth: int, made: str
) -> None:
    expected = workload(home) if made == "new" else workload_by_hand(home)
    rc = run_once(crash_env, f"{point}:{nth}")
    if nth == 1 and point not in NOT_IN_A_TURN:
        assert rc == -9  # the point was reached, and killed there
    elif point != "archive":
        assert rc in (-9, 0)
    finish(crash_env)
    check_invariants(home, expected)
    for conv_id in expected:  # a folder made by hand is adopted whole: its defaults written
        assert json.loads(home.conv(conv_id).metadata.read_text())["id"] == conv_id


def test_the_default_tier_kills_every_point_of_a_turn_in_one_kind_of_folder_or_the_other() -> None:
    """The sample that runs without --slow cannot shrink silently: every named point a turn
    reaches is killed there at its first hit, in a folder of one kind (each kind at about
    half of them), and every step of the path with one state write in one kind or the
    other; --slow kills each in both."""
    killed = {(point, made) for point, nth, made in default_tier(KILLS) if nth == 1}
    assert sorted(point for point, _ in killed) == sorted(p for p in POINTS if p not in NOT_IN_A_TURN)
    new, hand = ([p for p, made in killed if made == kind] for kind in KINDS)
    assert abs(len(new) - len(hand)) <= 1, killed
    one = default_tier(ONE_WRITE_KILLS)
    assert sorted(point for point, _, _ in one) == sorted(ONE_WRITE_POINTS)
    assert {made for _, _, made in one} == set(KINDS)


ONE_WRITE_POINTS = ("appended", "commit", "reply_header", "reply_stream", "reply_done", "state_tmp")
ONE_WRITE_KILLS = [  # the default tier: each point once, the kinds of folder in turn
    pytest.param(
        point,
        nth,
        made,
        marks=(pytest.mark.slow,) * (nth > 1 or made != KINDS[i % 2]),
        id=f"{made}-{nth}-{point}",
    )
    for i, point in enumerate(ONE_WRITE_POINTS)
    for nth in (1, 2)
    for made in KINDS
]


@pytest.mark.parametrize("point,nth,made", ONE_WRITE_KILLS)
def test_kill_at_every_step_of_a_turn_with_one_state_write(
    home: Home, crash_env: dict[str, str], point: str, nth: int, made: str
) -> None:
    """The committer is slow to take work (as in a burst), so each turn's start write is
    still queued when its reply is in: it is withdrawn, the reply begins with no journaled
    intent, and its commit is the turn's one state write (in a folder made by hand, also
    the one that writes its metadata). A kill at each step of that path loses, duplicates
    and forges nothing."""
    expected = workload(home) if made == "new" else workload_by_hand(home)
    rc = run_once(dict(crash_env, CONTEMPLATION_COMMIT_LAG="0.3"), f"{point}:{nth}")
    assert rc == -9
    if point.startswith("reply_") and nth == 1:  # killed in the first reply: that path's
        states = [read_state(c) for c in list_conversations(home)]  # disk as it left it
        assert all(s is None or (s.intent is None and s.turns == 0) for s in states)
        assert any(list(c.processing.iterdir()) for c in list_conversations(home))
    finish(crash_env)
    check_invariants(home, expected)
    for conv_id in expected:
        assert json.loads(home.conv(conv_id).metadata.read_text())["id"] == conv_id


def workload_with_files(home: Home) -> dict[str, list[str]]:
    """Folder messages, each with a text file: the blocks they become name their files."""
    expected: dict[str, list[str]] = {}
    for c in range(CONVS):
        conv = new_conversation(
            home, f"files {c}", template=load_template(home, "default"), model="llama3.2",
            backend="ollama",
        )  # fmt: skip
        texts = []
        for i in range(MESSAGES):
            staging = conv.dir / f".m{i}"
            staging.mkdir()
            (staging / "message.txt").write_text(f"conv {c} message {i}")
            (staging / "notes.txt").write_text(f"notes of {c}/{i}\n" * (40 + i))
            os.rename(staging, conv.inbox / f"{i:03d}.msg")
            taken = read_claimed(conv.inbox / f"{i:03d}.msg", 1 << 20, AttachmentSettings())
            assert taken.text is not None
            texts.append(taken.text)
        expected[conv.id] = texts
    return expected


@pytest.mark.parametrize("nth", [1, *(pytest.param(n, marks=pytest.mark.slow) for n in (2, 5))])
def test_kill_during_an_attachment_copy_names_no_half_file_and_loses_no_message(
    home: Home, crash_env: dict[str, str], nth: int
) -> None:
    expected = workload_with_files(home)
    assert run_once(crash_env, f"attachment_copy:{nth}") == -9
    halves = [p for c in list_conversations(home) for p in (c.dir / FOLDER).glob(".*.tmp.*")]
    assert halves  # the kill came in the middle of a copy
    finish(crash_env)
    check_invariants(home, expected)
    for conv in list_conversations(home):
        kept = {p.name: p.read_bytes() for p in (conv.dir / FOLDER).iterdir()}
        assert not [n for n in kept if n.startswith(".")]  # the half copy is gone
        named = [m["sha"] for t in expected[conv.id] for m in LINE_RE.finditer(t)]
        assert len(named) == MESSAGES == len(kept)
        for sha in named:  # each file the log names is whole
            (data,) = [d for n, d in kept.items() if sha in n]
            assert hashlib.sha256(data).hexdigest() == sha


def test_state_json_deleted_is_rebuilt_from_the_log(home: Home, crash_env: dict[str, str]) -> None:
    expected = workload(home)
    assert run_once(crash_env, "commit:3") == -9
    for conv in list_conversations(home):
        conv.state.unlink()
    finish(crash_env)
    check_invariants(home, expected)


def _storm(home: Home, env: dict[str, str], trials: int, seed: int) -> int:
    rng = random.Random(seed)
    kills = 0
    for _ in range(trials):
        proc = subprocess.Popen(
            [sys.executable, "-m", "contemplation", "run", "--once"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.15, 0.6))  # random kill time: this sleep is the test's dice
        if proc.poll() is None:
            proc.kill()
            kills += 1
        proc.wait()
    return kills


# the default tier's storm is in folders made by hand (their first sight runs in the killed
# runs too); each kind of folder is killed at every named point above, both storms in --slow
@pytest.mark.parametrize("made", [pytest.param("new", marks=pytest.mark.slow), "hand"])
def test_random_sigkill_storm(home: Home, crash_env: dict[str, str], made: str) -> None:
    expected = workload(home) if made == "new" else workload_by_hand(home)
    kills = _storm(home, crash_env, trials=8, seed=7)
    finish(crash_env)
    check_invariants(home, expected)
    assert kills >= 1


@pytest.mark.slow
@pytest.mark.parametrize("made", ["new", "hand"])
@pytest.mark.parametrize("seed", range(10))
def test_random_sigkill_storm_long(
    home: Home, crash_env: dict[str, str], seed: int, made: str
) -> None:
    expected = workload(home) if made == "new" else workload_by_hand(home)
    _storm(home, crash_env, trials=25, seed=seed)
    finish(crash_env)
    check_invariants(home, expected)


def _unused(p: Path) -> None:
    del p


# --------------------------------------------------------------------------- the index


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under the conversation folders, with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".index.sqlite3")
    }


def _cli(
    env: dict[str, str], *args: str, crash: str | None = None
) -> subprocess.CompletedProcess[str]:
    e = dict(env)
    if crash:
        e.update(CONTEMPLATION_TESTING="1", CONTEMPLATION_CRASH_AT=crash)
    return subprocess.run(
        [sys.executable, "-m", "contemplation", *args],
        env=e,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "how,nth",
    [  # a refresh rewrites the 100 changed conversations; a rebuild writes all 300 (the
        # default tier kills each once: the refresh at its last write, the rebuild at its first)
        *(
            pytest.param(("search", "--all", "kiwi"), n, marks=(pytest.mark.slow,) * (n != 100))
            for n in (1, 20, 100)
        ),
        *(
            pytest.param(("reindex",), n, marks=(pytest.mark.slow,) * (n != 1))
            for n in (1, 40, 250)
        ),
    ],
)
def test_kill_during_an_index_write_leaves_folders_untouched_and_the_index_whole(
    home: Home, how: tuple[str, ...], nth: int
) -> None:
    """SIGKILL inside an index transaction (a conversation's text written, its row not):
    the folders are byte for byte as they were, and the next command finds every
    conversation, each block indexed once."""
    from contemplation.index import db as index_db

    for i in range(300):
        d = (home.completed if i % 3 else home.active) / f"c{i:03d}"
        (d / "inbox").mkdir(parents=True)
        (d / "messages.log").write_text(
            f"=== CLAUDE -> OLLAMA [2025-03-03 10:00:00] ===\nkiwi question {i}\n\n"
            f"=== OLLAMA -> CLAUDE [2025-03-03 10:00:05] ===\nanswer {i}\n"
        )
    env = base_env(home)
    assert _cli(env, "search", "nothing-yet").returncode == 0  # an index exists, empty of kiwis
    for i in range(0, 300, 3):  # the active ones change after it was made: a refresh rewrites them
        d = home.active / f"c{i:03d}"
        with (d / "messages.log").open("a") as f:
            f.write("\n=== CLAUDE -> OLLAMA [2025-03-04 10:00:00] ===\nkiwi again\n")
    before = _tree(home.root)
    done = _cli(env, *how, crash=f"index_write:{nth}")
    assert done.returncode == -9, done.stderr
    assert _tree(home.root) == before
    found = _cli(env, "search", "--all", "--limit", "200", "kiwi", "--json")
    assert found.returncode == 0, found.stderr
    assert len(found.stdout.splitlines()) == 200
    with index_db.opened(home) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.execute("INSERT INTO text (text) VALUES ('integrity-check')")  # terms = blocks
        assert conn.execute("SELECT count(*) FROM convs").fetchone()[0] == 300
        assert conn.execute("SELECT count(*) FROM blocks").fetchone()[0] == 300 * 2 + 100


def test_kill_during_prune_hides_the_conversation_and_the_next_prune_finishes(
    home: Home,
) -> None:
    for name in ("old-1", "old-2"):
        d = home.completed / name
        d.mkdir(parents=True)
        (d / "messages.log").write_text(
            "=== CLAUDE -> OLLAMA [2024-01-01 10:00:00] ===\nold words\n"
        )
    env = base_env(home)
    done = _cli(env, "prune", "--older-than", "30d", crash="pruned:1")
    assert done.returncode == -9
    listed = json.loads(_cli(env, "list", "--all", "--json").stdout)["conversations"]
    assert listed == []  # both out of sight before any file went: never one half there
    left = [p.name for p in home.completed.iterdir()]
    assert len(left) == 1 and left[0].startswith(".pruning-old-")  # one removed, one hidden
    again = _cli(env, "prune", "--older-than", "30d", "--json")
    assert json.loads(again.stdout)["removed"] == []
    assert list(home.completed.iterdir()) == []
