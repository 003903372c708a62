"""The crash sweep: every named crash point a fault-free run reaches, killed in turn
(SIGKILL, or a power cut: :mod:`tests.powercut`), then a plain restart and an oracle.

A *scenario* is a home made in-process, then steps run as real processes one after another
(the CLI's ``send`` and ``archive``; the daemon's ``run --once``) against the
scripted Ollama (it counts requests). The recording run (``CONTEMPLATION_CRASH_RECORD``) lists
the points each step reaches; a *case* is (scenario, step, point, n, kill|cut), and ``exit``
after a step is a power cut right after it answered. After the crash the rest of the steps
run, then the daemon until it is idle, and :func:`oracle` counts:

* lost: an acknowledged message (a drop into ``inbox/`` before the run, a ``send`` that exited
  0) not in its log;
* duplicated: a message in its log twice, a message answered by two whole replies, or a
  reply whose every word was in the log marked INTERRUPTED and asked again;
* diverged: anything else out of place: a reply missing or not whole, blocks out of order,
  files left in ``inbox/``, ``processing/`` or ``failed/``, temp files, a state.json whose
  intent, size or inode disagree with the log, an archived conversation still active (or
  one not archived gone), a search index that finds other than a reindex does.

``python -m tests.crashsweep --case SCENARIO:STEP:POINT:N:MODE`` replays one case.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from contemplation.models import Block, BlockKind
from contemplation.protocol.conversation import whole
from contemplation.store.layout import Conv, Home, list_conversations, read_metadata, read_state
from contemplation.store.logview import LogView
from contemplation.store.templates import load_template
from contemplation.writer import archive, drop_message, new_conversation, open_writer
from tests import powercut
from tests.conftest import ROOT, base_env, cli_here
from tests.fakes.ollama_server import FakeOllama, Step

# kill: SIGKILL at a crash point; cut: a power cut there (only what was fsynced survives);
# sync: a power cut between two durable calls (fsync, syncfs) of a step that ran to its end,
# after every one of them in turn: where two threads interleave their fsyncs, a crash point
# of one cannot name the moment
MODES = ("kill", "cut", "sync")
FSYNC = "fsync"  # the point of a sync case: its n is how many of the step's calls were made


@dataclass(frozen=True)
class Run:
    """One process of a scenario: the CLI (``args``) or the daemon (``args`` empty)."""

    args: tuple[str, ...] = ()
    sends: str = ""  # the message a ``send`` acknowledges with exit 0
    creates: str = ""  # the first message of the conversation a ``new`` prints the id of
    decides: bool = False  # an ``approve``: its decision is recorded once, and final
    remembers: str = ""  # a ``memory add``'s key: kept once, with its value, after exit 0
    prunes: bool = False  # a ``prune``: the conversations it names are gone after exit 0
    retry: bool = False  # run again once when the crash made it fail (as its user would)
    call: tuple[str, str] = ("", "")  # ``mcp``: a tool and its arguments (JSON), as a task
    alongside: tuple[Run, ...] = ()  # ``send``s run while this one runs (never crashed)

    @property
    def tool(self) -> str:
        return self.call[0]

    @property
    def name(self) -> str:
        return self.args[0] if self.args else "daemon"


@dataclass(frozen=True)
class Scenario:
    name: str
    setup: Callable[[Home], dict[str, list[str]]]  # conversation id -> messages dropped
    runs: Callable[[list[str]], list[Run]]  # the steps, given the conversation ids
    env: dict[str, str] = field(default_factory=dict)


def _conv(home: Home, topic: str) -> Conv:
    return new_conversation(
        home, topic, template=load_template(home, "default"), model="llama3.2", backend="ollama"
    )


def _dropped(n_convs: int, n_msgs: int, padding: int = 0) -> Callable[[Home], dict[str, list[str]]]:
    def setup(home: Home) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for c in range(n_convs):
            conv = _conv(home, f"sweep {c}")
            texts = [f"conv {c} message {i}" + " padding" * padding for i in range(n_msgs)]
            for i, t in enumerate(texts):
                drop_message(conv, t, name=f"{i:03d}.msg")
            out[conv.id] = texts
        return out

    return setup


def _none(home: Home) -> dict[str, list[str]]:
    home.root.mkdir(parents=True, exist_ok=True)
    return {}


def _empty(home: Home) -> dict[str, list[str]]:
    return {_conv(home, "sweep send").id: []}


ASKING = "look it up\nNEED: Brain memory about sweep"  # the echo asks for a lookup


def _asking(home: Home) -> dict[str, list[str]]:
    """A conversation whose first reply asks for a lookup the config marks ``ask``."""
    config = home.root.parent / "xdg-config" / "contemplation" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text('[permissions]\n"memory.search" = "ask"\n')
    conv = _conv(home, "sweep approve")
    drop_message(conv, ASKING, name="000.msg")
    return {conv.id: [ASKING]}


def _archived_long_ago(home: Home) -> dict[str, list[str]]:
    """Two archived conversations last said something in 2024 (``prune`` takes them) and an
    active one (never pruned)."""
    kept = _conv(home, "sweep kept")
    for n in range(2):
        conv = _conv(home, f"sweep old {n}")
        conv.log.write_text("=== CLAUDE -> LLAMA3_2 [2024-01-01 10:00:00] ===\nold words\n")
        with open_writer(conv) as w:
            w.check_identity()
            w.adopt_foreign()
        archive(home, conv)
    return {kept.id: []}


MCP_START = {
    "topic": "sweep mcp",
    "initial_prompt": "hi from mcp",
    "backend": "ollama",
    "model": "llama3.2",
    "idempotency_key": "sweep-start-1",
}

DAEMON = Run()

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        # two messages dropped into inbox/, a turn each (journaled reply intents)
        Scenario("inbox", _dropped(1, 2), lambda ids: [DAEMON]),
        # two conversations in a burst: each turn's one state write (the committer lags)
        Scenario(
            "burst", _dropped(2, 1), lambda ids: [DAEMON], {"CONTEMPLATION_COMMIT_LAG": "0.3"}
        ),
        # the CLI sends two messages, the daemon answers them
        Scenario(
            "send",
            _empty,
            lambda ids: [
                Run(("send", ids[0], "sent one"), sends="sent one"),
                Run(("send", ids[0], "sent two"), sends="sent two"),
                DAEMON,
            ],
        ),
        # the CLI starts a conversation with its first message, the daemon answers it
        Scenario(
            "new",
            _none,
            lambda ids: [
                Run(
                    ("new", "sweep new", "-m", "llama3.2", "-b", "ollama", "--message", "hi"),
                    creates="hi",
                ),
                DAEMON,
            ],
        ),
        # three long messages in a log that rotates (rotate_bytes 1024) on the way
        Scenario(
            "rotate",
            _dropped(1, 3, padding=60),
            lambda ids: [DAEMON],
            {"CONTEMPLATION_ROTATE_BYTES": "1024"},
        ),
        # a conversation answered, then forked by the CLI (the fork waits for the agent)
        Scenario("fork", _dropped(1, 1), lambda ids: [DAEMON, Run(("fork", ids[0]))]),
        # a conversation answered, then archived by the CLI
        Scenario(
            "archive",
            _dropped(1, 1),
            lambda ids: [DAEMON, Run(("archive", ids[0]))],
        ),
        # archived by the CLI, then brought back by it
        Scenario(
            "reopen",
            _dropped(1, 1),
            lambda ids: [DAEMON, Run(("archive", ids[0])), Run(("reopen", ids[0]))],
        ),
        # a reply asks for a lookup marked ask; the CLI approves it; the daemon answers it
        Scenario(
            "approve",
            _asking,
            lambda ids: [
                DAEMON,
                Run(("approve", ids[0], "--once"), decides=True, retry=True),
                DAEMON,
            ],
        ),
        # the CLI remembers a fact, then sends a message whose reply looks it up
        Scenario(
            "memory",
            _empty,
            lambda ids: [
                Run(("memory", "add", "sweep", "the sweep value is 42"), remembers="sweep"),
                Run(("send", ids[0], ASKING), sends=ASKING),
                DAEMON,
            ],
        ),
        # the CLI sends two messages while the daemon answers the first (and is crashed)
        Scenario(
            "during",
            _dropped(1, 1),
            lambda ids: [
                Run(
                    alongside=(
                        Run(("send", ids[0], "sent during one"), sends="sent during one"),
                        Run(("send", ids[0], "sent during two"), sends="sent during two"),
                    )
                ),
                DAEMON,
            ],
            {"CONTEMPLATION_COMMIT_LAG": "0.3"},
        ),
        # through the MCP server, as tasks: a message to a conversation, then a new one
        # (a start a crash failed is asked again with its idempotency key, as a client would)
        Scenario(
            "mcp",
            _empty,
            lambda ids: [
                Run(
                    ("mcp",),
                    sends="sent by mcp",
                    call=(
                        "conversation_respond",
                        json.dumps({"conversation_id": ids[0], "response": "sent by mcp"}),
                    ),
                ),
                Run(
                    ("mcp",),
                    creates="hi from mcp",
                    retry=True,
                    call=("conversation_start", json.dumps(MCP_START)),
                ),
                DAEMON,
            ],
        ),
        # prune deletes the archived conversations of long ago, never an active one
        Scenario(
            "prune",
            _archived_long_ago,
            lambda ids: [Run(("prune", "--older-than", "7d"), prunes=True, retry=True)],
        ),
    )
}


@dataclass
class Outcome:
    lost: int = 0
    duplicated: int = 0
    diverged: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.diverged)


@dataclass(frozen=True)
class Case:
    scenario: str
    step: int
    point: str  # a crash point's name, or "exit": after the step answered
    nth: int
    mode: str

    def __str__(self) -> str:
        return f"{self.scenario}:{self.step}:{self.point}:{self.nth}:{self.mode}"

    @classmethod
    def parse(cls, text: str) -> Case:
        s, step, point, nth, mode = text.split(":")
        return cls(s, int(step), point, int(nth), mode)

    @property
    def replay(self) -> str:
        return f".venv/bin/python -m tests.crashsweep --case {self}"


def _env(home: Home, fake: FakeOllama, extra: dict[str, str]) -> dict[str, str]:
    return base_env(
        home,
        fake,
        CONTEMPLATION_SETTLE_SECONDS="0",
        CONTEMPLATION_DURABILITY="fsync",
        CONTEMPLATION_TESTING="1",
        **extra,
    )


def _process(
    run: Run, env: dict[str, str], journal: Path | None
) -> subprocess.CompletedProcess[bytes]:
    args = list(run.args) if run.args else ["run", "--once"]
    cmd = (
        [sys.executable, "-m", "tests.powercut", str(journal), "--", *args]
        if journal is not None
        else [sys.executable, "-m", "contemplation", *args]
    )
    if run.tool:
        return mcp_call(cmd, env, run.tool, json.loads(run.call[1]))
    if run.alongside:
        return _together(cmd, run, env, journal)
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, timeout=120)


def _together(
    cmd: list[str], run: Run, env: dict[str, str], journal: Path | None
) -> subprocess.CompletedProcess[bytes]:
    """``cmd`` while each of ``run.alongside`` runs, one after another, as its own process
    (journaled with it in a power cut; never crashed: the crash point names ``cmd``'s).
    Their exit codes, in order, are the returned stdout's lines."""
    quiet = {k: v for k, v in env.items() if not k.startswith("CONTEMPLATION_CRASH_")}
    with subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as main:
        codes = [_process(other, quiet, journal).returncode for other in run.alongside]
        out, err = main.communicate(timeout=120)
    told = "".join(f"{c}\n" for c in codes).encode()
    return subprocess.CompletedProcess(cmd, main.returncode, told + out, err)


TASKS = "io.modelcontextprotocol/tasks"
META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "crashsweep", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}},
}


def mcp_call(
    cmd: list[str], env: dict[str, str], method: str, params: dict[str, object]
) -> subprocess.CompletedProcess[bytes]:
    """One request to an MCP server process (JSON-RPC lines on its stdin/stdout, the tasks
    extension on): ``method`` is a tool's name (a ``tools/call``) or a method (``tasks/get``).
    Exit 0 and the result's JSON on stdout when it answered, else 1 (the process died
    first: nothing was acknowledged)."""
    return mcp_calls(cmd, env, [(method, params)])[0]


def mcp_calls(
    cmd: list[str], env: dict[str, str], calls: list[tuple[str, dict[str, object]]]
) -> list[subprocess.CompletedProcess[bytes]]:
    """:func:`mcp_call` for each of ``calls``, all sent to one MCP server process (a start of
    one costs ~2.3 s of CPU, most of it the SDK's import): their answers, in order."""
    lines: list[dict[str, object]] = [
        {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": META}}
    ]
    for n, (name, args) in enumerate(calls, start=2):
        method, params = (name, args) if "/" in name else ("tools/call", {"name": name, "arguments": args})
        lines.append({"jsonrpc": "2.0", "id": n, "method": method, "params": {**params, "_meta": META}})
    answers: dict[object, dict[str, object]] = {}
    with subprocess.Popen(
        cmd,
        env=env,
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            for x in lines:
                proc.stdin.write((json.dumps(x) + "\n").encode())
            proc.stdin.flush()
            for line in proc.stdout:  # ends when the process dies (a crash point)
                got = json.loads(line)
                if got.get("id", 1) != 1:
                    answers[got["id"]] = got
                if len(answers) == len(calls):
                    break
            proc.stdin.close()
            proc.wait(timeout=60)
        finally:
            proc.kill()
        err = proc.stderr.read() if proc.stderr is not None else b""
    done = []
    for n in range(2, len(calls) + 2):
        answer = answers.get(n)
        result = answer.get("result") if answer is not None else None
        ok = isinstance(result, dict) and not result.get("isError")
        said = json.dumps(result if ok else answer).encode()
        done.append(subprocess.CompletedProcess(cmd, 0 if ok else 1, said, err))
    return done


def record(scenario: Scenario, work: Path, fake: FakeOllama) -> list[list[str]]:
    """The points each step of a fault-free run reaches, in order, then one ``fsync`` for
    each durable call it made."""
    home = Home(work / "home")
    ids = list(scenario.setup(home))
    out: list[list[str]] = []
    for i, run in enumerate(scenario.runs(ids)):
        rec, journal = work / f"points.{i}", work / f"journal.{i}"
        env = _env(home, fake, {**scenario.env, "CONTEMPLATION_CRASH_RECORD": str(rec)})
        done = _process(run, env, journal)
        if done.returncode != 0:
            raise RuntimeError(f"{scenario.name} step {i} failed: {done.stderr.decode()[-2000:]}")
        points = rec.read_text().split() if rec.exists() else []
        out.append(points + [FSYNC] * powercut.calls(journal))
    return out


def cases(scenario: Scenario, points: list[list[str]], modes: tuple[str, ...]) -> list[Case]:
    """Every hit of every crash point (``name:n``) killed and cut, ``exit`` after each step
    (cut), and each step cut before each of its durable calls but its first (sync: the one
    before the first is the last step's ``exit``)."""
    out: list[Case] = []
    crash_modes = tuple(m for m in modes if m != "sync")
    for step, names in enumerate(points):
        seen: dict[str, int] = {}
        for name in names:
            if name == FSYNC:
                made = seen.get(name, 0)  # calls before this one (none: the last step's exit)
                if "sync" in modes and made:
                    out.append(Case(scenario.name, step, name, made, "sync"))
                seen[name] = made + 1
                continue
            seen[name] = seen.get(name, 0) + 1
            out.extend(Case(scenario.name, step, name, seen[name], m) for m in crash_modes)
        if "cut" in modes:
            out.append(Case(scenario.name, step, "exit", 1, "cut"))
    return out


def run_case(case: Case, work: Path, fake: FakeOllama) -> Outcome:
    """Crash at ``case``, restart, and check the oracle."""
    scenario = SCENARIOS[case.scenario]
    home = Home(work / "home")
    expected = scenario.setup(home)
    ids = list(expected)
    acked: dict[str, list[str]] = {k: list(v) for k, v in expected.items()}
    sent_unacked: dict[str, list[str]] = {k: [] for k in ids}
    archived: set[str] = set()
    was_whole: dict[str, str] = {}
    acts = Acts(prunable=_prunable(home))
    either: set[str] = set()  # an archive or reopen that failed: in either place, whole in one
    for i, run in enumerate(scenario.runs(ids)):
        extra = dict(scenario.env)
        journal: Path | None = None
        baseline: powercut.Image | None = None
        if i == case.step:
            if case.point not in ("exit", FSYNC):
                extra["CONTEMPLATION_CRASH_AT"] = f"{case.point}:{case.nth}"
            if case.mode in ("cut", "sync"):
                journal = work / "journal"
                baseline = powercut.snapshot(home.root)
        done = _process(run, _env(home, fake, extra), journal)
        if journal is not None and baseline is not None:
            upto = case.nth if case.mode == "sync" else None
            if upto is not None and upto < powercut.calls(journal):  # the power went first:
                done = _unanswered(done, run)  # what the step printed, nobody read
            powercut.cut(home.root, baseline, journal, upto)
        if i == case.step:
            was_whole = whole_at_crash(home)
        if run.retry and done.returncode != 0:  # the user runs it again
            if run.creates:  # (what the first try made, if anything, is not to be repeated)
                sent_unacked.setdefault("", []).append(run.creates)
            done = _process(run, _env(home, fake, dict(scenario.env)), None)
        conv_id = _target(run)
        if run.sends:
            (acked if done.returncode == 0 else sent_unacked)[conv_id].append(run.sends)
        codes = done.stdout.decode().splitlines()[: len(run.alongside)]
        for other, code in zip(run.alongside, codes, strict=True):
            (acked if code == "0" else sent_unacked)[_target(other)].append(other.sends)
        if run.creates and done.returncode == 0:
            made = _made(run, done.stdout.decode())
            acked[made] = [run.creates]
            sent_unacked.setdefault("", []).append(run.creates)  # in one conversation only
        elif run.creates:
            sent_unacked.setdefault("", []).append(run.creates)
        if run.name == "archive":
            if done.returncode == 0:
                archived.add(conv_id)
            else:  # the move may have been made durable before the power went
                either.add(conv_id)
        if run.name == "reopen":
            archived.discard(conv_id)
            if done.returncode != 0:
                either.add(conv_id)
        acts.told(run, conv_id, done.returncode == 0)
        acts.task(run, done)
    for _ in range(10):  # the daemon until it is idle
        if _process(DAEMON, _env(home, fake, dict(scenario.env)), None).returncode == 0:
            break
    archived |= acts.prunable - {c for c in acts.prunable if acts.pruned}
    out = oracle(home, acked, sent_unacked, archived, was_whole, frozenset(either))
    acts.check(home, _env(home, fake, {}), out)
    index_agrees(home, _env(home, fake, {}), out)
    return out


def _unanswered(
    done: subprocess.CompletedProcess[bytes], run: Run
) -> subprocess.CompletedProcess[bytes]:
    """A step the power cut before it answered: it failed, as did what ran alongside."""
    return subprocess.CompletedProcess(done.args, -9, b"1\n" * len(run.alongside), done.stderr)


def _target(run: Run) -> str:
    """The conversation a step names (``send ID``, an MCP call's ``conversation_id``)."""
    if run.tool:
        return str(json.loads(run.call[1]).get("conversation_id", ""))
    return run.args[1] if len(run.args) > 1 else ""


def _made(run: Run, stdout: str) -> str:
    """The conversation a ``new`` (its id, printed last) or a ``conversation_start`` (its
    task's id, ``<conversation>.<secret>``) made."""
    if run.tool:
        return str(json.loads(stdout)["taskId"]).rsplit(".", 1)[0]
    return stdout.rsplit(maxsplit=1)[-1]


def _prunable(home: Home) -> set[str]:
    return {
        c.id
        for c in list_conversations(home, include_completed=True)
        if c.dir.parent == home.completed
    }


@dataclass
class Acts:
    """What the commands other than ``send`` were told was done (exit 0), and the oracle
    of each: a decision recorded once and final, a memory kept once, a prune whole."""

    prunable: set[str]
    decided: dict[str, bool] = field(default_factory=dict)  # conversation -> acknowledged
    remembered: set[str] = field(default_factory=set)
    pruned: bool = False
    tasks: list[str] = field(default_factory=list)  # the MCP tasks answered

    def told(self, run: Run, conv_id: str, ok: bool) -> None:
        if run.decides:
            self.decided[conv_id] = self.decided.get(conv_id, False) or ok
        if run.remembers and ok:
            self.remembered.add(run.remembers)
        self.pruned = self.pruned or (run.prunes and ok)

    def task(self, run: Run, done: subprocess.CompletedProcess[bytes]) -> None:
        if run.tool and done.returncode == 0:
            self.tasks.append(str(json.loads(done.stdout)["taskId"]))

    def check(self, home: Home, env: dict[str, str], out: Outcome) -> None:
        def bad(kind: str, what: str) -> None:
            setattr(out, kind, getattr(out, kind) + 1)
            out.problems.append(f"{kind}: {what}")

        for conv_id, acked in self.decided.items():
            meta = read_metadata(home.conv(conv_id))
            made = meta.approvals() if meta is not None else []
            if acked and not made:
                bad("lost", f"{conv_id}: the decision approve was told is recorded is not")
            if len({d.request for d in made}) != len(made):
                bad("duplicated", f"{conv_id}: a lookup decided twice: {made}")
            st = read_state(home.conv(conv_id))
            if acked and st is not None and st.pending_approvals:
                bad("diverged", f"{conv_id}: still waits for approval: {st.pending_approvals}")
        if self.remembered:
            listed = _oracle_cli(env, "memory", "list", "--json").stdout
            for key in self.remembered:
                n = listed.count(f'"{key}"')
                if n != 1 or "the sweep value is 42" not in listed:
                    bad(
                        "lost" if n == 0 else "duplicated",
                        f"memory {key!r} listed {n} times: {listed[-300:]}",
                    )
        mcp = [sys.executable, "-m", "contemplation", "mcp"]
        # each task answered completes, asked from any MCP process (one for them all)
        calls: list[tuple[str, dict[str, object]]] = [("tasks/get", {"taskId": t}) for t in self.tasks]
        asked = mcp_calls(mcp, env, calls) if calls else []
        for task, got in zip(self.tasks, asked, strict=True):
            status = json.loads(got.stdout).get("status") if got.returncode == 0 else None
            if status != "completed":
                bad("diverged", f"task {task} is {status}: {got.stdout.decode()[-300:]}")
        left = self.prunable & {c.id for c in list_conversations(home, include_completed=True)}
        if self.pruned and left:
            bad("diverged", f"prune answered, and {sorted(left)} are still archived")
        half = (
            [p.name for p in home.completed.iterdir() if p.name.startswith(".")]
            if home.completed.is_dir()
            else []
        )
        if half:
            bad("diverged", f"left in completed/: {half}")


def _oracle_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """A command the oracle asks once every step is done, in this process (``cli_here``): no
    crash point is armed then, and a new interpreter for each cost ~0.5 s of CPU a case."""
    quiet = {k: v for k, v in env.items() if not k.startswith("CONTEMPLATION_CRASH_")}
    quiet.pop("CONTEMPLATION_TESTING", None)
    return cli_here(quiet, *args, check=False)


def index_agrees(home: Home, env: dict[str, str], out: Outcome) -> None:
    """The search index as the crash and the restarts left it (brought up to date the way a
    search does) finds what one made anew from the folders (``reindex``) finds."""

    def hits() -> list[str]:
        args = ("search", "--all", "--mode", "words", "--limit", "200", "--json", "Echo")
        done = _oracle_cli(env, *args)
        if done.returncode != 0:
            return [f"search failed: {done.stderr[-300:]}"]
        return sorted(done.stdout.splitlines())

    before = hits()
    _oracle_cli(env, "reindex")
    after = hits()
    if before != after:
        out.diverged += 1
        out.problems.append(f"diverged: the index found {before} where a reindex finds {after}")


def whole_at_crash(home: Home) -> dict[str, str]:
    """Conversations whose log ends, past what state.json has committed, with the whole reply
    to its last message, its last byte included (the scripted server's echo), or with that
    reply short of only the last bytes its commit's record holds (the record written, the
    server done): conversation id -> that message."""
    out: dict[str, str] = {}
    for conv in list_conversations(home):
        st = read_state(conv)
        data = conv.log.read_bytes() if conv.log.exists() else b""
        if st is None or st.log.size >= len(data):
            continue
        agent = [b.text for b in LogView(conv).refresh().blocks if b.kind is BlockKind.AGENT]
        if not agent:
            continue
        echo = f" ===\nEcho: {agent[-1][:60]}\n".encode()
        if any(data.endswith(echo[: len(echo) - n]) for n in _recorded_tails(conv, data)):
            out[conv.id] = agent[-1]
    return out


def _recorded_tails(conv: Conv, data: bytes) -> list[int]:
    """How many of a reply's last bytes the log lacks of what a commit record left in the
    folder says (its ``reply_end``: the reply's start, the hash of its bytes before its last
    ones, those last bytes): 0 for the log as it is, then one for each record the log
    matches."""
    found = [0]
    for tmp in conv.dir.glob(f".{conv.state.name}.tmp.*"):
        try:
            rec = json.loads(tmp.read_bytes())
            end = rec["reply_end"]
            tail = str(end["tail"]).encode()
            pre = int(rec["log"]["size"]) - len(tail)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not 0 <= pre <= len(data) or not tail.startswith(data[pre:]):
            continue
        if hashlib.sha256(data[int(end["offset"]) : pre]).hexdigest() == end["sha256"]:
            found.append(len(tail) - (len(data) - pre))
    return found


def oracle(
    home: Home,
    acked: dict[str, list[str]],
    maybe: dict[str, list[str]],
    archived: set[str],
    whole: dict[str, str],
    either: frozenset[str] = frozenset(),
) -> Outcome:
    """Count what the crash lost, duplicated or left diverged (see the module); ``whole``:
    the conversations whose last reply was whole when it came (:func:`whole_at_crash`)."""
    out = Outcome()

    def bad(kind: str, what: str) -> None:
        setattr(out, kind, getattr(out, kind) + 1)
        out.problems.append(f"{kind}: {what}")

    convs = {c.id: c for c in list_conversations(home, include_completed=True)}
    unasked = [t for texts in maybe.values() for t in texts]
    for conv_id, found in list(convs.items()):  # a name a killed `new` reserved: no folder
        if conv_id not in acked and found.dir.is_dir() and not any(found.dir.iterdir()):
            del convs[conv_id]  # of a conversation ("an empty folder is never adopted")
    for conv_id in convs:  # made by a step (a fork; a `new` that never answered)
        acked.setdefault(conv_id, [])
        maybe.setdefault(conv_id, [])
    everywhere: list[str] = []
    for conv_id, texts in acked.items():
        conv = convs.get(conv_id)
        if conv is None:
            for t in texts:
                bad("lost", f"{conv_id} is gone, with {t!r}")
            continue
        if (home.active / conv_id).exists() and (home.completed / conv_id).exists():
            bad("diverged", f"{conv_id} is both in active/ and in completed/")
        elif conv_id in either:
            pass  # moved or not: a reopen no one was told was done
        elif (conv_id in archived) != (conv.dir.parent == home.completed):
            bad("diverged", f"{conv_id} is in {conv.dir.parent.name}/")
        blocks = LogView(conv).refresh().blocks if conv.log.exists() else []
        agent = [b.text for b in blocks if b.kind is BlockKind.AGENT]
        everywhere.extend(agent)
        for t in texts:
            if agent.count(t) == 0:
                bad("lost", f"{conv_id}: {t!r} is not in the log")
            elif agent.count(t) > 1:
                bad("duplicated", f"{conv_id}: {t!r} is in the log {agent.count(t)} times")
        for t in maybe[conv_id]:
            if agent.count(t) > 1:
                bad("duplicated", f"{conv_id}: {t!r} is in the log {agent.count(t)} times")
        if [t for t in agent if t in texts] != texts:
            bad("diverged", f"{conv_id}: messages out of order: {agent}")
        tail = conv.log.read_bytes()[-400:] if conv.log.exists() else b""
        forked = b"\n=== FORKED: " in tail and tail.rstrip().endswith(b"===")
        _replies(conv_id, blocks, bad, whole.get(conv_id, ""), forked=forked)
        _files(conv, bad)
    for t in unasked:  # a message no one was told was taken: once at most, anywhere
        if everywhere.count(t) > 1:
            bad("duplicated", f"{t!r} is in the logs {everywhere.count(t)} times")
    return out


def _replies(
    conv_id: str,
    blocks: Sequence[Block],
    bad: Callable[[str, str], None],
    was_whole: str,
    *,
    forked: bool = False,
) -> None:
    """After each agent block: interrupted replies (each cut, never whole), then one whole.
    ``was_whole``: the message whose reply was whole in the log when the process died (see
    :func:`whole_at_crash`): it must be adopted, never marked INTERRUPTED and asked again."""
    i = 0
    while i < len(blocks):
        if blocks[i].kind is not BlockKind.AGENT:
            bad("diverged", f"{conv_id}: block {i} ({blocks[i].kind.value}) answers nothing")
            i += 1
            continue
        msg, i = blocks[i], i + 1
        cut: list[str] = []
        while i < len(blocks) and blocks[i].kind is BlockKind.MODEL and not whole(blocks[i]):
            cut.append(blocks[i].text)
            i += 1
        if i >= len(blocks) and forked:  # a fork made at the agent's block waits for it
            continue
        if i >= len(blocks) or blocks[i].kind is not BlockKind.MODEL:
            bad("diverged", f"{conv_id}: {msg.text!r} has no whole reply")
            continue
        i += 1
        if cut and msg.text == was_whole:
            bad("duplicated", f"{conv_id}: a whole reply to {msg.text!r} was asked again")
        while i < len(blocks) and blocks[i].kind is BlockKind.MODEL and whole(blocks[i]):
            bad("duplicated", f"{conv_id}: {msg.text!r} has a second whole reply")
            i += 1


def _files(conv: Conv, bad: Callable[[str, str], None]) -> None:
    for folder in (conv.inbox, conv.processing, conv.failed):
        left = [p.name for p in folder.iterdir()] if folder.is_dir() else []
        if left:
            bad("diverged", f"{conv.id}: left in {folder.name}/: {left}")
    temps = [p.name for p in conv.dir.glob(".*.tmp.*")]
    if temps:
        bad("diverged", f"{conv.id}: temp files left: {temps}")
    st = read_state(conv)
    size = conv.log.stat().st_size if conv.log.exists() else 0
    ino = conv.log.stat().st_ino if conv.log.exists() else 0
    if st is None:
        bad("diverged", f"{conv.id}: state.json unreadable")
    elif st.intent is not None or st.log.size != size or (size and st.log.ino != ino):
        bad("diverged", f"{conv.id}: state.json says {st.log} intent {st.intent}; log {size}")


@dataclass
class Sweep:
    """What a sweep found, for the table (see scripts/crash_table.py)."""

    scenarios: list[str] = field(default_factory=list)
    points: set[str] = field(default_factory=set)
    kills: int = 0
    cuts: int = 0
    between: int = 0  # power cuts between two durable calls
    lost: int = 0
    duplicated: int = 0
    diverged: int = 0
    failures: list[str] = field(default_factory=list)

    def add(self, case: Case, outcome: Outcome) -> None:
        if case.mode == "kill":
            self.kills += 1
        elif case.mode == "sync":
            self.between += 1
        else:
            self.cuts += 1
        if case.mode != "sync":
            self.points.add(case.point)
        self.lost += outcome.lost
        self.duplicated += outcome.duplicated
        self.diverged += outcome.diverged
        if not outcome.ok:
            self.failures.append(f"{case}: {'; '.join(outcome.problems)}\n  replay: {case.replay}")

    def as_json(self) -> dict[str, object]:
        return {
            "scenarios": sorted(self.scenarios),
            "crash_points": sorted(self.points),
            "kills": self.kills,
            "power_cuts": self.cuts,
            "power_cuts_between_fsyncs": self.between,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "diverged": self.diverged,
        }


def sweep(
    names: list[str],
    modes: tuple[str, ...] = MODES,
    pick: Callable[[list[Case]], list[Case]] = lambda cs: cs,
    report: Callable[[Case, Outcome], None] | None = None,
) -> Sweep:
    """Record each scenario, then run the cases ``pick`` keeps (all by default)."""
    result = Sweep(scenarios=list(names))
    fake = FakeOllama().start()
    fake.default_step = Step(chunks=4)
    try:
        for name in names:
            with tempfile.TemporaryDirectory(prefix="sweep-") as tmp:
                points = record(SCENARIOS[name], Path(tmp), fake)
            for case in pick(cases(SCENARIOS[name], points, modes)):
                with tempfile.TemporaryDirectory(prefix="case-") as tmp:
                    outcome = run_case(case, Path(tmp), fake)
                result.add(case, outcome)
                if report is not None:
                    report(case, outcome)
    finally:
        fake.stop()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description="replay one crash case of the sweep")
    ap.add_argument("--case", required=True, help="SCENARIO:STEP:POINT:N:MODE")
    case = Case.parse(ap.parse_args().case)
    fake = FakeOllama().start()
    fake.default_step = Step(chunks=4)
    try:
        with tempfile.TemporaryDirectory(prefix="case-") as tmp:
            outcome = run_case(case, Path(tmp), fake)
    finally:
        fake.stop()
    print(json.dumps({"case": str(case), "ok": outcome.ok, "problems": outcome.problems}))
    sys.exit(0 if outcome.ok else 1)


if __name__ == "__main__":
    os.environ.pop("CONTEMPLATION_CRASH_AT", None)
    main()
