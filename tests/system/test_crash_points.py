"""Named crash points: a reply that was whole is never asked again.

A real daemon process (``run --once``) against the scripted Ollama, which counts the
requests it is sent, is killed at a named crash point; a plain restart must leave each
acknowledged message once in its log, followed by one whole reply, and the model must have
been asked once per message whatever the crash point.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from contemplation.base import testing
from contemplation.models import BlockKind
from contemplation.protocol.conversation import whole
from contemplation.store.layout import Home, list_conversations, read_state
from contemplation.store.logview import LogView
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests import powercut
from tests.conftest import ROOT, base_env
from tests.crashsweep import FSYNC, SCENARIOS, Case, record, run_case, sweep
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_crash import KILLS, default_tier, run_once


def _case_ok(case: str, work: Path) -> None:
    """One case of the sweep (``SCENARIO:STEP:POINT:N:MODE``) against a scripted Ollama of its
    own: nothing lost, duplicated or diverged."""
    fake = FakeOllama().start()
    fake.default_step = Step(chunks=4)
    try:
        outcome = run_case(Case.parse(case), work, fake)
    finally:
        fake.stop()
    assert outcome.ok, outcome.problems


def _run(env: dict[str, str], crash: str | None = None) -> int:
    return run_once(env, crash, timeout=120)


# point -- reply_tail: its last bytes in the log, its commit not renamed in; reply_record:
# the commit's record (its temp file) written, the reply's last bytes not yet (a kill at that
# record's fsync, after the server said done, was marked INTERRUPTED and asked again).
# lag -- "0": a journaled intent; "0.3": the turn's one state write. The default tier runs
# the four of the eight that pair each value of each with each value of the others.
WHOLE_REPLY_KILLS = [
    pytest.param(point, lag, durability, marks=(pytest.mark.slow,) * ((i + j + k) % 2 == 1))
    for i, point in enumerate(("reply_tail", "reply_record"))
    for j, lag in enumerate(("0", "0.3"))
    for k, durability in enumerate(("none", "fsync"))
]


@pytest.mark.parametrize("point,lag,durability", WHOLE_REPLY_KILLS)
def test_a_reply_whole_in_the_log_when_killed_is_adopted_not_asked_again(
    home: Home, fake_ollama: FakeOllama, durability: str, lag: str, point: str
) -> None:
    fake_ollama.default_step = Step(chunks=4)
    env = base_env(
        home,
        fake_ollama,
        CONTEMPLATION_SETTLE_SECONDS="0",
        CONTEMPLATION_DURABILITY=durability,
        CONTEMPLATION_COMMIT_LAG=lag,
    )
    conv = new_conversation(
        home, "whole", template=load_template(home, "default"), model="llama3.2",
        backend="ollama",
    )  # fmt: skip
    drop_message(conv, "the only question", name="000.msg")
    assert _run(env, f"{point}:1") == -9
    assert len(fake_ollama.chat_requests()) == 1
    assert _run(env) == 0
    log = conv.log.read_text()
    assert "INTERRUPTED" not in log, log
    assert len(fake_ollama.chat_requests()) == 1, "the model was asked again for a whole reply"
    blocks = LogView(conv).refresh().blocks
    assert [b.kind for b in blocks] == [BlockKind.AGENT, BlockKind.MODEL], log
    assert whole(blocks[1])
    st = read_state(conv)
    assert st is not None and st.intent is None and st.turns == 1
    assert st.log.size == conv.log.stat().st_size
    assert list(conv.inbox.iterdir()) == [] and list(conv.processing.iterdir()) == []
    assert not list(conv.dir.glob(".*.tmp.*"))
    assert [c.id for c in list_conversations(home)] == [conv.id]


def test_the_default_tier_kills_a_whole_reply_with_every_pair_of_its_settings() -> None:
    """The four whole-reply kills without --slow pair each point with each lag and each
    durability, and each lag with each durability (the eight are the long tier's)."""
    from itertools import combinations

    chosen = default_tier(WHOLE_REPLY_KILLS)
    assert len(chosen) == 4
    every = [tuple(p.values) for p in WHOLE_REPLY_KILLS]
    for a, b in combinations(range(3), 2):
        assert {(c[a], c[b]) for c in chosen} == {(c[a], c[b]) for c in every}


def test_a_send_that_answered_survives_a_power_cut_right_after(tmp_path: Path) -> None:
    """``contemplation send`` exits 0, then the power goes (only what was fsynced stays, see
    tests/powercut.py): the message is still in inbox/ and is answered. It renamed its file
    into inbox/ and never fsynced inbox/, so the rename was lost."""
    _case_ok("send:0:exit:1:cut", tmp_path)


# a case the default tier's sweep sample runs too is the long tier's here (the sample's test
# fails if it stops running it: IN_THE_SAMPLE)
SAMPLED = pytest.mark.slow
IN_THE_SAMPLE = {"inbox": "inbox:0:exit:1:cut", "mcp": "mcp:1:file_tmp:1:kill"}


@pytest.mark.parametrize(
    "case", [pytest.param(IN_THE_SAMPLE["inbox"], marks=SAMPLED), "inbox:0:commit:2:cut"]
)
def test_a_message_answered_is_not_taken_again_after_a_power_cut(tmp_path: Path, case: str) -> None:
    """A power cut once a message's block is committed: its claim (the rename out of inbox/)
    must be as durable as the commit, or inbox/ holds it again and it is answered twice."""
    _case_ok(case, tmp_path)


def test_a_reply_whole_and_fsynced_when_the_power_goes_is_adopted(tmp_path: Path) -> None:
    """A power cut once the reply's commit (its log bytes and the state's temp file) is
    fsynced but before its rename: the temp file's name must be durable too, or the record of
    the reply's end is gone and the whole reply is asked again (state_tmp:2 is the first
    reply's commit in the scenario "inbox")."""
    _case_ok("inbox:0:state_tmp:2:cut", tmp_path)


@pytest.mark.parametrize("point", ["claim", "claim_linked"])
def test_a_message_being_claimed_survives_another_process_fsyncing_inbox(
    tmp_path: Path, point: str
) -> None:
    """The daemon dies (and then the power) while it claims a message; in between, a ``send``
    makes inbox/ durable. The claim was a rename into processing/ never yet fsynced: inbox/'s
    fsync made the message's absence there durable, not its presence in processing/, and it
    was lost (the crash sweep's scenario "during"). Now it is linked into processing/ and
    that folder fsynced before its inbox/ name goes; a crash between leaves both names, and
    it is taken once (the link is made before its request, the rest with the turn's first
    state write)."""
    fake = FakeOllama().start()
    fake.default_step = Step(chunks=4)
    home = Home(tmp_path / "home")
    conv = new_conversation(
        home, "claims", template=load_template(home, "default"), model="llama3.2", backend="ollama"
    )
    drop_message(conv, "the first", name="000.msg")
    journal = tmp_path / "journal"
    env = base_env(home, fake, CONTEMPLATION_SETTLE_SECONDS="0", CONTEMPLATION_DURABILITY="fsync")
    crash = {**env, "CONTEMPLATION_TESTING": "1", "CONTEMPLATION_CRASH_AT": point}

    def journaled(e: dict[str, str], *args: str) -> int:
        cmd = [sys.executable, "-m", "tests.powercut", str(journal), "--", *args]
        return subprocess.run(cmd, env=e, cwd=ROOT, capture_output=True, timeout=120).returncode

    try:
        baseline = powercut.snapshot(home.root)
        assert journaled(crash, "run", "--once") == -9
        assert journaled(env, "send", conv.id, "the second") == 0
        powercut.cut(home.root, baseline, journal)
        assert _run(env) == 0
        agent = [b.text for b in LogView(conv).refresh().blocks if b.kind is BlockKind.AGENT]
        assert agent == ["the first", "the second"]
        assert list(conv.inbox.iterdir()) == [] and list(conv.processing.iterdir()) == []
        # the claim is made durable while its request goes out (the turn's first state
        # write): the first message may have been asked once before the daemon died there
        asked = [r["messages"][-1]["content"] for r in fake.chat_requests()]
        assert asked.count("the second") == 1 and asked.count("the first") in (1, 2), asked
    finally:
        fake.stop()


@pytest.mark.parametrize(
    "case",
    [
        "mcp:1:deliver:1:kill",
        pytest.param(IN_THE_SAMPLE["mcp"], marks=SAMPLED),
        "mcp:1:file_tmp:1:cut",
    ],
)
def test_a_start_asked_again_with_its_idempotency_key_after_a_crash_makes_one(
    tmp_path: Path, case: str
) -> None:
    """conversation_start died after the conversation and its first message were made but
    before its idempotency key was written: the client's retry with the same key made a
    second conversation, the message twice. The key is now written (durably) with the name
    reserved before anything is made, and the conversation appears whole with its message."""
    _case_ok(case, tmp_path)


@pytest.mark.parametrize("case", ["prune:0:exit:1:cut", "prune:0:pruned:1:cut"])
def test_a_prune_that_answered_stays_done_after_a_power_cut(tmp_path: Path, case: str) -> None:
    """prune renamed the conversations out of sight and removed them, and never fsynced
    completed/: a power cut after it answered brought them back (the removal undone), and
    one mid-way half a conversation (its files gone, its rename undone)."""
    _case_ok(case, tmp_path)


def _sample(cases: list[Case]) -> list[Case]:
    """The long tier's subset (``--slow``): every 9th case of a scenario, its last, every
    cut right after a step answered (``exit``: where the sweep found most), and the power cut
    at the first hit of each point the scenario owns (the default tier kills it there); the
    whole sweep is bench/crash_sweep.py."""
    return [
        c
        for i, c in enumerate(cases)
        if i % 9 == 0
        or i == len(cases) - 1
        or c.point == "exit"
        or (c.point in OWNED.get(c.scenario, ()) and c.nth == 1 and c.mode == "cut")
    ]


# The default tier's sweep: the first hit of each point only a command reaches (no turn:
# tests/system/test_crash.py kills those), killed in the scenario that owns it (its power
# cut there is the long tier's, as in the old sample) ...
OWNED = {
    "send": ("deliver",),
    "memory": ("memory_tmp",),
    "approve": ("metadata_tmp",),
    "mcp": ("task_tmp", "file_tmp"),
    "archive": ("archive",),
    "reopen": ("unarchive",),
    "prune": ("prune",),
}
# ... and one power cut in each scenario: at a point, between two fsyncs, or right after a
# step answered, in turn (the middle one of that kind)
CUT_KINDS = ("cut", "sync", "exit")
# the points killed by the default tier elsewhere than the sweep and test_crash's turns
ELSEWHERE = {
    "attachment_copy": "test_crash.py::test_kill_during_an_attachment_copy…",
    "index_write": "test_crash.py::test_kill_during_an_index_write…",
    "pruned": "test_crash.py::test_kill_during_prune…",
    "fork_staged": "test_fork.py (each FORK_POINTS)",
    "fork": "test_fork.py (each FORK_POINTS)",
    "fork_renamed": "test_fork.py (each FORK_POINTS)",
    "escalated": "test_escalation.py::test_a_kill_after_the_marker_redoes_only_the_next_rung",
}
# points no test kills yet (named here so that the gap is seen, not silent)
UNKILLED = {"withdraw": "a queued message taken back: no scenario withdraws"}


def _default_sample(scenario: str) -> Callable[[list[Case]], list[Case]]:
    kind = CUT_KINDS[sorted(SCENARIOS).index(scenario) % len(CUT_KINDS)]

    def pick(cases: list[Case]) -> list[Case]:
        out: list[Case] = []
        for point in OWNED.get(scenario, ()):
            hits = [c for c in cases if c.point == point and c.nth == 1 and c.mode == "kill"]
            assert hits, f"{scenario} reaches no {point}"
            out.append(hits[0])
        pool = [
            c
            for c in cases
            if (c.point == "exit") == (kind == "exit")
            and c.mode == ("sync" if kind == "sync" else "cut")
        ]
        assert pool, f"{scenario}: no case of kind {kind}"
        out.append(pool[len(pool) // 2])
        return out

    return pick


@pytest.mark.parametrize("tier", ["default", pytest.param("long", marks=pytest.mark.slow)])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_crash_sweep_sample_loses_duplicates_and_diverges_nothing(
    scenario: str, tier: str
) -> None:
    """The scenario recorded fault-free, then a sample of its crash points killed and cut,
    and of its durable calls cut between (see tests/crashsweep.py); a failing case names its
    one-line replay."""
    ran: list[str] = []
    result = sweep(
        [scenario],
        pick=_sample if tier == "long" else _default_sample(scenario),
        report=lambda case, _: ran.append(str(case)),
    )
    print(json.dumps(result.as_json()))
    if tier == "default" and scenario in IN_THE_SAMPLE:
        assert IN_THE_SAMPLE[scenario] in ran, ran
    assert not result.failures, "\n".join(result.failures)
    assert (result.lost, result.duplicated, result.diverged) == (0, 0, 0)
    if tier == "long":
        assert result.kills >= 1 and result.cuts >= 1
    else:
        assert result.kills == len(OWNED.get(scenario, ()))
        assert result.kills + result.cuts + result.between == 1 + result.kills


def test_the_default_tier_kills_every_named_point() -> None:
    """Without --slow, every crash point the code names is killed somewhere: a turn's in
    test_crash.py (both kinds of folder), a command's in the sweep's scenario that owns it
    (whose test fails if it stops reaching it), the rest where ELSEWHERE says; a new point
    fails here until a test kills it."""
    named = {
        p
        for name, points in vars(testing).items()
        if name.endswith("POINTS") and isinstance(points, tuple)
        for p in points
    }
    turns = {point for point, _, _ in default_tier(KILLS)}
    owned = {p for points in OWNED.values() for p in points}
    assert owned.isdisjoint(turns)
    assert named == turns | owned | set(ELSEWHERE) | set(UNKILLED)
    for where in set(ELSEWHERE.values()):
        assert (ROOT / "tests" / "system" / where.split(" ")[0].split("::")[0]).exists(), where


def test_a_fault_free_run_records_every_point_of_a_turn_and_of_a_send(tmp_path: Path) -> None:
    """CONTEMPLATION_CRASH_RECORD lists the points each process reaches, in order: the
    sweep's list of where to kill."""
    fake = FakeOllama().start()
    fake.default_step = Step(chunks=4)
    try:
        points = record(SCENARIOS["send"], tmp_path, fake)
    finally:
        fake.stop()
    # each step's crash points, then an "fsync" for each durable call it made (sync cases)
    assert all(p.count(FSYNC) >= 2 for p in points), points
    points = [[p for p in step if p != FSYNC] for step in points]
    assert points[0] == points[1] == ["deliver"]
    turn = points[2]  # two turns: the order of the first one's points, then the second's
    # the claim's link, then the message's block (held), then the claim made durable with
    # the reply's first state write, which its request does not wait for: before the reply's
    # header on a quiet machine, as late as after the reply's end on a loaded one, and always
    # before the reply's commit record
    assert turn[:3] == ["intent", "appended", "commit"], turn
    linked = turn.index("claim_linked")
    assert turn[linked + 1] == "claim" and linked < turn.index("reply_record"), turn
    assert turn.index("reply_header") < turn.index("reply_stream") < turn.index("reply_done")
    assert turn.count("claim") == turn.count("reply_done") == 2, turn


def test_an_archive_that_answered_is_in_completed_only_after_a_power_cut(tmp_path: Path) -> None:
    """archive renamed the folder into completed/ and fsynced completed/ only: a power cut
    after it answered left the conversation in active/ and in completed/ both."""
    _case_ok("archive:1:exit:1:cut", tmp_path)


def test_a_power_cut_inside_archive_leaves_the_conversation_in_one_place(tmp_path: Path) -> None:
    """The power cut after archive made completed/ durable, before active/: the conversation
    is in completed/ only (a folder's rename is one journal transaction: the power-cut layer
    once kept it in both folders, a state no POSIX file system can reach), and, the archive
    never having answered, either place is right."""
    _case_ok("archive:1:fsync:1:sync", tmp_path)


@pytest.mark.parametrize("case", ["archive:0:reply_header:1:kill", "archive:0:reply_done:1:kill"])
def test_archive_after_a_crash_cut_a_reply_leaves_it_to_be_finished(
    tmp_path: Path, case: str
) -> None:
    """The daemon is killed in a reply, then ``contemplation archive`` runs before it is
    back: the conversation went to completed/ with its write half done (the reply's intent
    pending, a temp file left, the reply never marked nor redone, nor adopted). Archive now
    refuses while a crash's write waits to be finished, as it does for a queued message."""
    _case_ok(case, tmp_path)


def test_the_first_new_conversation_of_a_home_survives_a_power_cut(tmp_path: Path) -> None:
    """``contemplation new --message`` on a home that did not exist yet answers with the id,
    then the power goes: the conversation and its message are there (the home's folders,
    made by that command, were never made durable: active/ itself was lost)."""
    _case_ok("new:0:exit:1:cut", tmp_path)


@pytest.mark.slow  # the default tier cuts between fsyncs in the sweep's sample (CUT_KINDS)
def test_a_power_cut_between_any_two_fsyncs_of_two_turns_leaves_each_reply_once() -> None:
    """Two messages answered, the power cut after each of the daemon's durable calls in turn
    (fsync, syncfs): the log and the temp file that records a reply's end were made durable
    in one point, the log first, so a cut between the two kept a whole reply without its
    record: marked INTERRUPTED and asked again (what scenario mcp showed when another
    conversation's crash point fell there). The record is now durable, by name, before the
    reply's last bytes are written."""
    result = sweep(["inbox"], modes=("sync",))
    assert not result.failures, "\n".join(result.failures)
    assert result.between >= 10 and result.kills == result.cuts == 0


AFTER_DONE = ("reply_record", "reply_tail", "state_tmp")  # a reply's commit, in its order


def after_done(points: list[str]) -> list[str]:
    """``point:n`` for each crash point of a step that comes after a reply ended (its
    ``reply_done``) and before its commit is renamed in (a ``state_tmp`` after it)."""
    seen: dict[str, int] = {}
    out: list[str] = []
    ended = 0  # replies ended and not yet committed (a burst's turns interleave)
    for name in points:
        seen[name] = seen.get(name, 0) + 1
        if name == "reply_done":
            ended += 1
        elif ended and name in AFTER_DONE:
            out.append(f"{name}:{seen[name]}")
            ended -= name == "state_tmp"
    return out


@pytest.mark.parametrize(
    "scenario,every",
    [  # one turn at a time: each point's first hit by default, every hit with --slow; a
        # burst's turns interleave (another reply in flight at a later hit): every hit
        ("inbox", False),
        pytest.param("inbox", True, marks=pytest.mark.slow),
        ("burst", True),
    ],
)
def test_a_kill_anywhere_after_the_server_said_done_never_asks_the_model_again(
    tmp_path: Path, scenario: str, every: bool
) -> None:
    """SIGKILL at each crash point between a reply's end and its commit's rename (journaled
    intents, and each turn's one state write in a burst): the model is asked once per
    message. At the record's fsync (``reply_record``) the reply's last bytes were still held:
    the restart marked the whole reply INTERRUPTED and asked again; recovery now finishes
    the commit its record describes. (At ``reply_done`` itself nothing is on disk yet: those
    bytes are in memory only, and the turn is redone, as after a power cut.)"""
    fake = FakeOllama().start()
    fake.default_step = Step(chunks=4)
    try:
        points = record(SCENARIOS[scenario], tmp_path / "record", fake)
        messages = len(fake.chat_requests())
        kills = after_done(points[0])
        assert len(kills) >= 3 * messages, points[0]
        if not every:  # the first hit of each point
            firsts: dict[str, str] = {}
            for kill in kills:
                firsts.setdefault(kill.split(":")[0], kill)
            assert sorted(firsts) == sorted(AFTER_DONE), kills
            kills = list(firsts.values())
        for kill in kills:
            name, n = kill.split(":")
            before = len(fake.chat_requests())
            outcome = run_case(Case(scenario, 0, name, int(n), "kill"), tmp_path / kill, fake)
            # the oracle: a reply whole, or short only of the last bytes its commit's record
            # holds, when the process died is never marked INTERRUPTED and asked again
            assert outcome.ok, (kill, outcome.problems)
            asked = len(fake.chat_requests()) - before
            if scenario == "inbox":  # one turn at a time: no other reply was cut meanwhile
                assert asked == messages, f"killed at {kill}: the model was asked {asked} times"
    finally:
        fake.stop()
