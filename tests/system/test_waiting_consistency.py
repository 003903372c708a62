"""What waits is one consistent view on every face.

``approve --once --wait`` once told the agent to ``respond`` to the lookup it had just
approved: the follower read the decision, the state and the log at different moments, and
the daemon wrote a state in which the lookup was no longer asked for but the conversation
still said it waited. Here a real daemon process answers rounds of mixed NEEDs (lookups that
ask, lookups a rule answers, needs no rule answers) while the agent decides and answers them
in a drawn order, a thread burns CPU, and a follower reads every face's view over and over:
no view may show a decided lookup (let alone as a need to answer), and no view may call the
conversation settled while a decision waits for the daemon."""

from __future__ import annotations

import contextlib
import os
import random
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from contemplation import settings as settings_mod
from contemplation.errors import InputRejected
from contemplation.faces import actions
from contemplation.faces.cli import wait as cli_wait
from contemplation.faces.cli.common import EXIT_NEEDS_AGENT
from contemplation.faces.mcp import calls as mcp_faces
from contemplation.faces.reading import Reader
from contemplation.models import Decider
from contemplation.protocol.conversation import need_id, unanswered
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home
from contemplation.store.templates import load_template
from contemplation.store.waiting import WaitItem
from contemplation.writer import new_conversation
from tests.conftest import DaemonProc, base_env, wait_for
from tests.fakes.ollama_server import FakeOllama, Step

ROUNDS = int(os.environ.get("CONTEMPLATION_TEST_ROUNDS", "200"))
ROUNDS_PER_CONV = 5
FACES: tuple[Decider, ...] = ("cli", "mcp", "dashboard")


@dataclass(frozen=True)
class Round:
    asked: int  # lookups [permissions] mark ask
    allowed: int  # lookups a rule answers at once
    free: bool  # a need no rule answers (the agent responds)
    decisions: tuple[str, ...]  # per asked lookup: once | always | reject
    faces: tuple[Decider, ...]  # per asked lookup: who decides
    order: tuple[int, ...]  # the agent's moves: index < asked decides that lookup, else responds


def draw(rng: random.Random) -> Round:
    asked = rng.randint(1, 2)
    free = rng.random() < 0.5
    order = list(range(asked + int(free)))
    rng.shuffle(order)
    return Round(
        asked=asked,
        allowed=rng.randint(0, 2),
        free=free,
        decisions=tuple(rng.choice(["once", "always", "reject"]) for _ in range(asked)),
        faces=tuple(rng.choice(FACES) for _ in range(asked)),
        order=tuple(order),
    )


@dataclass
class Watch:
    """What the follower checks against: the lookups' needs, the needs only the agent can
    answer, and the lookups decided so far (added once the decision returned)."""

    conv: Conv | None = None  # the conversation the rounds play in now
    lookups: set[str] = field(default_factory=set)
    free: set[str] = field(default_factory=set)
    decided: dict[str, str] = field(default_factory=dict)  # id -> need
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    views: int = 0
    wrong: list[str] = field(default_factory=list)

    def decisions(self) -> tuple[Conv | None, dict[str, str]]:
        """Taken before a view: every decision in it was made before the view was read."""
        with self.lock:
            return self.conv, dict(self.decided)

    def asked(self) -> tuple[set[str], set[str]]:
        """Taken after a view: every need in it was asked before the view was read."""
        with self.lock:
            return set(self.lookups), set(self.free)


def _open_decisions(reader: Reader, conv: Conv, decided: dict[str, str]) -> list[str]:
    """Decided lookups whose answer is not in the log (read now: answers only get added, so
    one missing now was missing at any earlier view)."""
    blocks = reader.view(conv, "CLAUDE").refresh().blocks
    block, open_needs = unanswered(blocks)
    return [n for n in open_needs if need_id(block, n) in decided]


def _check_items(
    where: str, items: list[dict[str, Any]], decided: dict[str, str], watch: Watch
) -> list[str]:
    lookups, free = watch.asked()
    out = []
    for i in items:
        if i["id"] in decided:
            out.append(f"{where}: decided lookup {i['need']!r} shown as {i['kind']}")
        elif i["kind"] == "need" and i["need"] not in free:
            out.append(f"{where}: {i['need']!r} shown as a need to answer")
        elif i["kind"] == "approval" and i["need"] not in lookups:
            out.append(f"{where}: {i['need']!r} shown as a lookup")
    return out


def follow(s: Settings, watch: Watch) -> None:
    """Every face's view, round and round: the CLI's (what ``--wait`` ends on and prints),
    the MCP server's snapshot (check, wait, progress) and the reader's."""
    reader = Reader(Home(s.home))
    truth = Reader(Home(s.home))
    faces = mcp_faces.Faces(s)
    n = 0
    while not watch.stop.is_set():
        n += 1
        conv, decided = watch.decisions()
        if conv is None:
            continue
        wrong: list[str] = []
        if n % 2:
            ex = cli_wait.Exchange(0, request=next(reversed(decided), ""))
            code, view = cli_wait.outcome(reader, conv, ex)  # what --wait ends on and prints
            items = [i.as_dict(conv.id, "cli") for i in view.items]
            if code is not None:
                st = view.state.status if view.state else None
                wrong += _check_items(f"cli --wait ({st})", items, decided, watch)
                late = _open_decisions(truth, conv, decided)
                if late:
                    wrong.append(f"cli --wait ended ({code}) with {late} decided, not answered")
                if code == EXIT_NEEDS_AGENT and not items:
                    wrong.append("cli --wait: exit 3 with nothing waiting")
        else:
            snap = faces.snapshot(conv)
            wrong += _check_items(f"mcp ({snap['status']})", snap["waiting"], decided, watch)
            if faces.settled(conv) and _open_decisions(truth, conv, decided):
                wrong.append("mcp wait: settled while a decision waits for the daemon")
        with watch.lock:
            watch.views += 1
            watch.wrong.extend(wrong[:5])
            del watch.wrong[50:]


def burn(stop: threading.Event) -> None:
    """Load, so the reads of a view and the daemon's writes interleave at odd places."""
    x = 0
    while not stop.is_set():
        x = sum(i * i for i in range(20_000)) + x % 7


@contextlib.contextmanager
def running(stop: threading.Event, target: Callable[..., None], *args: Any) -> Iterator[None]:
    """``target(*args)`` in a thread until the block ends (``stop`` tells it to)."""
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(30)


def answer(s: Settings, reader: Reader, conv: Conv, text: str, need: str) -> bool:
    """Answer ``need``; False while the daemon is looking up the decided lookups of its
    reply (no need is listed then: an answer by hand would race a rule)."""
    try:
        actions.respond(s, reader, conv, text, need)
    except InputRejected as exc:
        assert "nothing waiting in" in str(exc) or "waits for nothing" in str(exc), exc
        return False
    return True


def play(r: int, plan: Round, s: Settings, notes: Path, fake: FakeOllama, watch: Watch) -> None:
    """One round: the model asks, the agent decides and answers in the drawn order, and the
    daemon carries on to the model's next reply. A new conversation every ROUNDS_PER_CONV
    rounds keeps each within the tool-call rate and the model's context (whose summary would
    take a scripted reply)."""
    if r % ROUNDS_PER_CONV == 0:
        made = new_conversation(
            Home(s.home),
            f"views {r}",
            template=load_template(Home(s.home), "default"),
            model="gemma",
            backend="ollama",
        )
        with watch.lock:
            watch.conv = made
    conv = watch.conv
    assert conv is not None
    asked = [f"File contents of {notes / f'secret-{r}-{i}.md'}" for i in range(plan.asked)]
    allowed = [f"File contents of {notes / f'open-{r}-{i}.md'}" for i in range(plan.allowed)]
    free = [f"The owner of round {r}"] if plan.free else []
    for need in asked + allowed:
        Path(need.removeprefix("File contents of ")).write_text(f"text of {need}")
    with watch.lock:
        watch.lookups.update(asked + allowed)
        watch.free.update(free)
    done = f"Round {r} done."
    fake.enqueue(
        Step(text="\n".join(f"NEED: {n}" for n in [*asked, *allowed, *free])), Step(text=done)
    )
    reader = Reader(Home(s.home))
    actions.send(s, conv, f"round {r}")

    def all_asked() -> list[WaitItem] | None:
        items = reader.waiting(conv)
        got = {i.need for i in items}
        return items if set(asked + free) <= got else None

    items = {i.need: i for i in wait_for(all_asked, 30, what=f"round {r}'s lookups")}
    for move in plan.order:
        if move < plan.asked:
            item = items[asked[move]]
            actions.approve(
                s,
                conv,
                plan.decisions[move],
                item.id,
                reader=reader,
                face=plan.faces[move],
            )
            with watch.lock:
                watch.decided[item.id] = item.need
        else:
            wait_for(
                lambda: answer(s, reader, conv, f"Ada owns round {r}", items[free[0]].id),
                30,
                what=f"round {r}'s need listed again",
            )
    wait_for(
        lambda: done.encode() in conv.log.read_bytes() and reader.settled(conv),
        30,
        what=f"round {r}'s last reply",
    )


@pytest.mark.slow  # 136 s in the default tier's clean-clone run: a soak of every face, in --slow
def test_no_face_ever_shows_a_decided_lookup_or_settles_before_the_daemon_acts(
    tmp_path: Path, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    """The property, over ROUNDS drawn rounds (the seed is in the failure's message)."""
    seed = int(os.environ.get("CONTEMPLATION_TEST_SEED", random.randrange(1 << 32)))
    rng = random.Random(seed)
    plans = [draw(rng) for _ in range(ROUNDS)]
    home = Home(tmp_path / "home")
    notes = tmp_path / "notes"
    notes.mkdir()
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[tools]\nallowed_roots = ["{notes}"]\n\n[permissions]\n'
        'read_file = { "*secret*" = "ask" }\n'
    )
    env = base_env(
        home, fake_ollama, CONTEMPLATION_CONFIG=str(cfg), CONTEMPLATION_SETTLE_SECONDS="0"
    )
    s = settings_mod.load(home=home.root, env={"OLLAMA_HOST": fake_ollama.url}, config=cfg)
    daemon = daemon_factory(env, home).wait_ready()
    said: deque[str] = deque(maxlen=20)  # the daemon's last log lines, for a failure
    # its log is read as it comes: a pipe left full would stop the daemon at its next line
    threading.Thread(target=lambda: said.extend(daemon.proc.stderr or ()), daemon=True).start()
    watch = Watch()
    burner = threading.Event()
    with running(burner, burn, burner), running(watch.stop, follow, s, watch):
        for r, plan in enumerate(plans):
            play(r, plan, s, notes, fake_ollama, watch)
            assert not watch.wrong, (f"seed {seed}, round {r}: {plan}", watch.wrong, *said)
    assert watch.views > len(plans), "the follower must look while the rounds play"
    assert not watch.wrong, (f"seed {seed}", watch.wrong)
