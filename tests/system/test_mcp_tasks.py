"""The MCP tasks extension (``io.modelcontextprotocol/tasks``, protocol 2026-07-28) on the
durable queue, spoken line by line over stdio to the real ``contemplation mcp`` process, as
Claude Code speaks it (the ``_meta`` envelope on every request), with a real daemon and a
scripted Ollama answering."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contemplation.faces.reading import Reader
from contemplation.models import Status
from contemplation.store.layout import Home, read_json, read_state
from tests import procgroups
from tests.conftest import ROOT, DaemonProc, base_env, cli, wait_for
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_mcp_elicitation import asking_setup

TASKS = "io.modelcontextprotocol/tasks"
TASK_ID = re.compile(r"^(?P<conv>.+)\.(?P<secret>[0-9a-f]{32})$")


def envelope(*, tasks: bool) -> dict[str, Any]:
    caps: dict[str, Any] = {"elicitation": {"form": {}}}
    if tasks:
        caps["extensions"] = {TASKS: {}}
    return {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "pytest", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": caps,
    }


class Wire:
    """One ``contemplation mcp`` process, spoken to in JSON-RPC lines."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = procgroups.popen(
            [sys.executable, "-m", "contemplation", "mcp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=ROOT,
        )
        self.ids = 0
        self.request("server/discover", {}, tasks=True)

    def request(self, method: str, params: dict[str, Any], *, tasks: bool = True) -> dict[str, Any]:
        """The response (``result`` or ``error``) to one request; notifications are skipped."""
        assert self.proc.stdout is not None
        sent = self.send(method, params, tasks=tasks)
        for _ in range(1000):  # bounded: notifications before the answer
            line = self.proc.stdout.readline()
            assert line, "the MCP server closed its stdout"
            got = json.loads(line)
            if got.get("id") == sent:
                return dict(got)
        raise AssertionError(f"no response to {method}")

    def call(self, tool: str, *, tasks: bool = True, **args: Any) -> dict[str, Any]:
        got = self.request("tools/call", {"name": tool, "arguments": args}, tasks=tasks)
        assert "result" in got, got
        return dict(got["result"])

    def send(self, method: str, params: dict[str, Any], *, tasks: bool = True) -> int:
        """Write one request and return its id without reading the answer (a listen
        stream's answer is its notifications)."""
        assert self.proc.stdin is not None
        self.ids += 1
        msg = {
            "jsonrpc": "2.0",
            "id": self.ids,
            "method": method,
            "params": {**params, "_meta": envelope(tasks=tasks)},
        }
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()
        return self.ids

    def read(self) -> dict[str, Any]:
        """The next line the server writes (a notification or a response)."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the MCP server closed its stdout"
        return dict(json.loads(line))

    def get(self, task_id: str) -> dict[str, Any]:
        got = self.request("tasks/get", {"taskId": task_id})
        assert "result" in got, got
        return dict(got["result"])

    def until(
        self, task_id: str, done: Callable[[dict[str, Any]], bool], seconds: float = 20
    ) -> dict[str, Any]:
        seen: list[dict[str, Any]] = []

        def check() -> bool:
            seen.append(self.get(task_id))
            return done(seen[-1])

        wait_for(check, seconds, what=f"task {task_id}")
        return seen[-1]

    def kill(self) -> None:
        procgroups.kill(self.proc)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        finally:
            procgroups.kill(self.proc)


@pytest.fixture
def wires() -> Iterator[Callable[[dict[str, str]], Wire]]:
    made: list[Wire] = []

    def make(env: dict[str, str]) -> Wire:
        made.append(Wire(env))
        return made[-1]

    yield make
    for w in made:
        w.kill()


def text_of(result: dict[str, Any]) -> dict[str, Any]:
    [block] = result["content"]
    out = json.loads(block["text"])
    assert isinstance(out, dict)
    return out


def completed(task: dict[str, Any]) -> bool:
    return bool(task["status"] == "completed")


def test_a_client_that_takes_tasks_gets_one_and_the_reply_in_it_from_any_mcp_process(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    wires: Callable[[dict[str, str]], Wire],
) -> None:
    """conversation_start answers with a task once the message and the task record are
    durable; the first MCP process is killed -9 and another one, on the same home, answers
    tasks/get for the same id from the conversation's folder: working, then completed with
    what conversation_wait returns (the model's reply since the message)."""
    env = base_env(home, fake_ollama, CONTEMPLATION_DASHBOARD_ENABLED="false")
    first = wires(env)
    created = first.call("conversation_start", topic="Index", initial_prompt="Which index?")
    assert created["resultType"] == "task", created
    assert created["status"] == "working"
    task_id = created["taskId"]
    m = TASK_ID.match(task_id)
    assert m is not None, task_id
    conv = Reader(home).locate(m["conv"])
    assert (conv.dir / "tasks" / f"{m['secret']}.json").is_file()  # durable before the answer
    # no daemon yet: the message waits, and the task says so in the words every face uses
    assert "no daemon" in created["statusMessage"]
    assert created["pollIntervalMs"] >= 5000
    assert created["ttlMs"] is None and created["createdAt"].endswith("Z")
    first.kill()  # kill -9 while the task is working

    fake_ollama.enqueue(Step(text="Add an index on users(email)."))
    daemon_factory(env, home).wait_ready()
    second = wires(env)
    done = second.until(task_id, completed)
    assert done["resultType"] == "complete"
    out = text_of(done["result"])
    assert done["result"]["isError"] is False
    assert out["conversation_id"] == conv.id and out["timed_out"] is False
    assert [b["kind"] for b in out["blocks"]] == ["model"]  # the agent's own words left out
    assert "users(email)" in out["blocks"][0]["text"]
    assert second.get(task_id)["result"] == done["result"]  # asked again: the same answer


def test_a_client_without_the_extension_gets_todays_results_and_no_tasks(
    home: Home, wires: Callable[[dict[str, str]], Wire]
) -> None:
    wire = wires(base_env(home))
    plain = wire.call(
        "conversation_start", tasks=False, topic="Old client", initial_prompt="Hello?"
    )
    assert plain.get("resultType", "complete") == "complete" and "taskId" not in plain
    out = text_of(plain)
    assert out["created"] is True and out["cursor"] == 0
    # tasks/get from a client that does not declare the extension: -32021, never a task
    refused = wire.request(
        "tasks/get", {"taskId": f"{out['conversation_id']}.{'0' * 32}"}, tasks=False
    )
    assert refused["error"]["code"] == -32021
    assert refused["error"]["data"] == {"requiredCapabilities": {"extensions": {TASKS: {}}}}
    # an unknown or guessed id is not found (-32602), and nothing leaks which part was wrong
    for bad in (f"{out['conversation_id']}.{'0' * 32}", "nope", f"conv_x.{'a' * 32}"):
        missing = wire.request("tasks/get", {"taskId": bad})
        assert missing["error"]["code"] == -32602
        assert "Task not found" in missing["error"]["message"]
    # an empty start queues nothing: no turn, so no task
    empty = wire.call("conversation_start", topic="Empty")
    assert "taskId" not in empty and text_of(empty)["created"] is True


def test_a_need_no_rule_answers_completes_the_task_and_the_answer_starts_a_new_one(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    wires: Callable[[dict[str, str]], Wire],
) -> None:
    env = base_env(home, fake_ollama, CONTEMPLATION_DASHBOARD_ENABLED="false")
    daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(
        Step(text="To answer I need the table.\nNEED: schema of the users table"),
        Step(text="With that schema: add an index on email."),
    )
    wire = wires(env)
    task = wire.call("conversation_start", topic="Needs", initial_prompt="Which index?")
    asked = wire.until(task["taskId"], completed)
    out = text_of(asked["result"])
    assert out["status"] == "awaiting_agent"
    [need] = out["waiting"]
    assert need["need"] == "schema of the users table"
    assert need["how"].startswith("conversation_respond(")
    again = wire.call(
        "conversation_respond", conversation_id=out["conversation_id"], response="id, email"
    )
    assert again["resultType"] == "task" and again["taskId"] != task["taskId"]
    answered = text_of(wire.until(again["taskId"], completed)["result"])
    assert [b["kind"] for b in answered["blocks"]] == ["model"]
    assert "index on email" in answered["blocks"][0]["text"]


def test_tasks_cancel_stops_the_turn_within_two_seconds(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    wires: Callable[[dict[str, str]], Wire],
) -> None:
    env = base_env(home, fake_ollama, CONTEMPLATION_DASHBOARD_ENABLED="false")
    daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(Step(kind="hang", after_chunks=2, hang_seconds=60))
    wire = wires(env)
    task = wire.call("conversation_start", topic="Long", initial_prompt="Write a novel.")
    streaming = wire.until(
        task["taskId"], lambda t: t["status"] == "working" and "generating" in t["statusMessage"]
    )
    assert streaming["pollIntervalMs"] <= 2000  # short while the model is at work
    t0 = time.monotonic()
    acked = wire.request("tasks/cancel", {"taskId": task["taskId"]})["result"]
    assert acked["resultType"] == "complete" and "taskId" not in acked
    cancelled = wire.until(task["taskId"], lambda t: t["status"] == "cancelled", seconds=5)
    took = time.monotonic() - t0
    assert took < 2.0, took
    conv = Reader(home).locate(TASK_ID.match(task["taskId"])["conv"])  # type: ignore[index]
    state = read_state(conv)
    assert state is not None and state.status is Status.CANCELLED
    assert cancelled["statusMessage"].startswith("cancelled")


def test_the_daemon_killed_mid_reply_the_task_still_completes_with_the_reply_once(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    wires: Callable[[dict[str, str]], Wire],
) -> None:
    """kill -9 of the daemon while the task is working (the model streaming): the task stays
    working, and once a daemon runs again it completes with the reply, exactly once."""
    env = base_env(home, fake_ollama, CONTEMPLATION_DASHBOARD_ENABLED="false")
    daemon = daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(
        Step(text="A first draft that never ends", kind="hang", after_chunks=2, hang_seconds=60),
        Step(text="Add an index on users(email)."),
    )
    wire = wires(env)
    task = wire.call("conversation_start", topic="Crash", initial_prompt="Which index?")
    wire.until(task["taskId"], lambda t: "generating" in t["statusMessage"])
    daemon.stop(signal.SIGKILL)
    stalled = wire.get(task["taskId"])
    assert stalled["status"] == "working" and "no daemon" in stalled["statusMessage"]
    daemon_factory(env, home).wait_ready()
    done = wire.until(task["taskId"], completed, seconds=30)
    out = text_of(done["result"])
    whole = [b for b in out["blocks"] if b["kind"] == "model" and "users(email)" in b["text"]]
    assert len(whole) == 1, out["blocks"]
    # the draft the kill cut (marked INTERRUPTED, then redone) is not the task's answer: it
    # was carried beside the redone reply, the same words twice
    assert [b["kind"] for b in out["blocks"]] == ["model"], out["blocks"]
    assert not any("first draft" in b["text"] for b in out["blocks"]), out["blocks"]


def test_cancel_of_a_message_still_queued_withdraws_it_and_the_task_is_cancelled(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    wires: Callable[[dict[str, str]], Wire],
) -> None:
    """No turn runs yet (no daemon): tasks/cancel withdraws the message from inbox/ before
    any daemon claims it, so the task ends cancelled and a daemon started later never sends
    it to the model. An answer to a need, still queued, is withdrawn the same way."""
    env = base_env(home, fake_ollama, CONTEMPLATION_DASHBOARD_ENABLED="false")
    wire = wires(env)
    task = wire.call("conversation_start", topic="Queued", initial_prompt="Which index?")
    conv = Reader(home).locate(TASK_ID.match(task["taskId"])["conv"])  # type: ignore[index]
    assert [p.name for p in conv.inbox.iterdir()] == ["0000-initial.msg"]
    acked = wire.request("tasks/cancel", {"taskId": task["taskId"]})["result"]
    assert acked["resultType"] == "complete"
    assert [p.name for p in conv.inbox.iterdir()] == []  # withdrawn, nothing left behind
    got = wire.get(task["taskId"])
    assert got["status"] == "cancelled", got
    assert "withdrawn" in got["statusMessage"]
    sent = wire.call("conversation_respond", conversation_id=conv.id, response="Second try?")
    assert sent["resultType"] == "task"
    wire.request("tasks/cancel", {"taskId": sent["taskId"]})
    assert wire.get(sent["taskId"])["status"] == "cancelled"
    fake_ollama.enqueue(Step(text="Add an index on users(email)."))
    daemon_factory(env, home).wait_ready()
    third = wire.call("conversation_respond", conversation_id=conv.id, response="Third?")
    done = wire.until(third["taskId"], completed)
    assert [b["text"] for b in text_of(done["result"])["blocks"]] == [
        "Add an index on users(email)."
    ]
    log = conv.log.read_text()
    assert "Which index?" not in log and "Second try?" not in log  # never sent
    assert wire.get(task["taskId"])["status"] == "cancelled"  # and stays so


def test_a_listener_is_told_working_then_completed_and_never_polls(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    wires: Callable[[dict[str, str]], Wire],
) -> None:
    """subscriptions/listen with the task's id: the ack names it, then notifications/tasks
    carry the whole task on every change (working with its statusMessage, then completed
    with the result tasks/get would give), with no tasks/get call at all."""
    env = base_env(home, fake_ollama, CONTEMPLATION_DASHBOARD_ENABLED="false")
    wire = wires(env)
    task = wire.call("conversation_start", topic="Push", initial_prompt="Which index?")
    unknown = task["taskId"][:-1] + ("0" if task["taskId"][-1] != "0" else "1")
    listen = {"notifications": {"taskIds": [task["taskId"], unknown]}}
    sid = wire.send("subscriptions/listen", listen)
    ack = wire.read()
    assert ack["method"] == "notifications/subscriptions/acknowledged", ack
    assert ack["params"]["notifications"]["taskIds"] == [task["taskId"]]  # unknown left out
    seen = [wire.read()]
    assert seen[0]["method"] == "notifications/tasks", seen
    assert seen[0]["params"]["status"] == "working"
    assert "no daemon" in seen[0]["params"]["statusMessage"]
    assert seen[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == sid
    fake_ollama.enqueue(Step(text="Add an index on users(email)."))
    daemon_factory(env, home).wait_ready()
    for _ in range(100):  # bounded: a notification per change (a hang is pytest-timeout's)
        if seen[-1]["params"]["status"] == "completed":
            break
        seen.append(wire.read())
    assert all(n["method"] == "notifications/tasks" for n in seen), seen
    said = [(n["params"]["status"], n["params"]["statusMessage"]) for n in seen]
    assert len(set(said)) == len(said), said  # one notification per change
    done = seen[-1]["params"]
    assert text_of(done["result"])["blocks"][0]["text"] == "Add an index on users(email)."
    got = wire.get(task["taskId"])
    assert {k: v for k, v in done.items() if k != "_meta"} == {
        k: v for k, v in got.items() if k not in {"resultType", "_meta"}
    }


def test_listening_to_tasks_needs_the_extension_and_is_bounded(
    home: Home, wires: Callable[[dict[str, str]], Wire]
) -> None:
    wire = wires(base_env(home, None, CONTEMPLATION_DASHBOARD_ENABLED="false"))
    task = wire.call("conversation_start", topic="Push", initial_prompt="Which index?")
    ids = {"notifications": {"taskIds": [task["taskId"]]}}
    refused = wire.request("subscriptions/listen", ids, tasks=False)
    assert refused["error"]["code"] == -32021, refused
    many = {"notifications": {"taskIds": [f"{task['taskId']}{i}" for i in range(65)]}}
    assert wire.request("subscriptions/listen", many)["error"]["code"] == -32602


def test_two_hundred_tasks_started_at_once_all_complete_with_their_own_replies(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    wires: Callable[[dict[str, str]], Wire],
    request: pytest.FixtureRequest,
) -> None:
    """The scripted model echoes each question, so every task's result must hold its own.
    Two hundred tasks under ``--slow``; the default tier starts 50. Each start is ~0.1 s of
    the MCP process beside the answering daemon (200 were 21 s of the test's 24), and in
    both tiers the daemon answers while the starts go on, the tasks completing under the
    calls that start the next ones (measured: 47 of 50, 198 of 200 questions had reached the
    model when the last start returned)."""
    count = 200 if request.config.getoption("--slow") else 50
    env = base_env(home, fake_ollama, CONTEMPLATION_DASHBOARD_ENABLED="false")
    daemon_factory(env, home).wait_ready()
    wire = wires(env)
    asked = {
        wire.call("conversation_start", topic=f"q{i}", initial_prompt=f"question number {i}")[
            "taskId"
        ]: f"question number {i}"
        for i in range(count)
    }
    assert len(asked) == count  # a task of its own for each start
    left = dict(asked)

    def sweep() -> bool:
        for task_id in list(left)[:50]:  # a bounded sweep; the rest at the next look
            task = wire.get(task_id)
            if task["status"] == "completed":
                out = text_of(task["result"])
                assert [b["text"] for b in out["blocks"]] == ["Echo: " + left.pop(task_id)], out
        return not left

    wait_for(sweep, 240, what=f"{len(left)} tasks still working")


def test_a_lookup_marked_ask_is_a_form_for_the_person_and_their_answer_goes_on(
    home: Home,
    tmp_path: Path,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    wires: Callable[[dict[str, str]], Wire],
) -> None:
    """To a client that takes forms, a lookup a [permissions] rule marks ``ask`` makes the
    task ``input_required`` with an elicitation form (allow once / always / reject, what will
    be read and why); the person's answer through ``tasks/update`` decides it, and the turn
    goes on to complete the task. A reply the person declines is a rejection."""
    env, secret = asking_setup(tmp_path, home, fake_ollama)
    fake_ollama.enqueue(
        Step(text=f"NEED: File contents of {secret}"), Step(text="Fine, without it.")
    )
    daemon_factory(env, home).wait_ready()
    wire = wires(env)
    task = wire.call("conversation_start", topic="Ask", initial_prompt="Read it", model="gemma")
    asking = wire.until(task["taskId"], lambda t: t["status"] == "input_required", seconds=30)
    [(key, form)] = asking["inputRequests"].items()
    assert form["method"] == "elicitation/create" and form["params"]["mode"] == "form"
    assert str(secret) in form["params"]["message"] and "ask" in form["params"]["message"]
    choices = form["params"]["requestedSchema"]["properties"]["decision"]["oneOf"]
    assert [c["const"] for c in choices] == ["once", "always", "reject"]
    assert wire.get(task["taskId"])["inputRequests"] == asking["inputRequests"]  # same key
    acked = wire.request(
        "tasks/update", {"taskId": task["taskId"], "inputResponses": {key: {"action": "decline"}}}
    )["result"]
    assert acked["resultType"] == "complete"
    done = wire.until(task["taskId"], completed, seconds=30)
    out = text_of(done["result"])
    assert out["blocks"][-1]["text"] == "Fine, without it."
    conv = Reader(home).locate(out["conversation_id"])
    assert "the launch code" not in conv.log.read_text()
    # the answer came from the person's form: recorded as a decision, never as chat text
    assert "refused" in conv.log.read_text()


def test_a_form_answered_after_another_face_decided_is_refused_and_the_agent_never_decides(
    home: Home,
    tmp_path: Path,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    wires: Callable[[dict[str, str]], Wire],
) -> None:
    """While the person's form is out, the agent's conversation_approve is
    refused (nothing decided); the person decides at the CLI; their later answer in the stale
    form is a JSON-RPC error naming that decision, never a silent success."""
    env, secret = asking_setup(tmp_path, home, fake_ollama)
    fake_ollama.enqueue(Step(text=f"NEED: File contents of {secret}"), Step(text="Read it."))
    daemon_factory(env, home).wait_ready()
    wire = wires(env)
    task = wire.call("conversation_start", topic="Ask", initial_prompt="Read it", model="gemma")
    asking = wire.until(task["taskId"], lambda t: t["status"] == "input_required", seconds=30)
    [(key, _)] = asking["inputRequests"].items()
    cid = TASK_ID.match(task["taskId"])["conv"]  # type: ignore[index]
    agent = wire.request(
        "tools/call",
        {
            "name": "conversation_approve",
            "arguments": {"conversation_id": cid, "decision": "always"},
        },
        tasks=False,
    )
    assert agent["result"]["isError"] and "are the person's to decide" in json.dumps(agent), agent
    decided = cli(env, "approve", cid, "--once")
    assert decided.returncode == 0, decided.stderr
    stale = wire.request(
        "tasks/update", {"taskId": task["taskId"], "inputResponses": {key: {"action": "decline"}}}
    )
    assert "error" in stale, stale
    said = stale["error"]["message"]
    assert "was decided already: approved once by the person (the CLI)" in said, said
    done = wire.until(task["taskId"], completed, seconds=30)
    assert text_of(done["result"])["blocks"][-1]["text"] == "Read it."
    meta = read_json(Reader(home).locate(cid).metadata) or {}
    assert [(d["decision"], d["face"]) for d in meta["approvals"]] == [("once", "cli")]


def test_cancel_of_a_task_whose_lookup_waits_for_the_person_says_so_and_decides_nothing(
    home: Home,
    tmp_path: Path,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    wires: Callable[[dict[str, str]], Wire],
) -> None:
    """tasks/cancel of a task whose turn waits for the person's approval is not a
    way for the agent to take that decision: a JSON-RPC error says the turn waits for the
    person and where they decide (never "its turn is over"); the form stays out, and the
    person's answer still goes on."""
    env, secret = asking_setup(tmp_path, home, fake_ollama)
    fake_ollama.enqueue(Step(text=f"NEED: File contents of {secret}"), Step(text="Read it."))
    daemon_factory(env, home).wait_ready()
    wire = wires(env)
    task = wire.call("conversation_start", topic="Ask", initial_prompt="Read it", model="gemma")
    asking = wire.until(task["taskId"], lambda t: t["status"] == "input_required", seconds=30)
    cid = TASK_ID.match(task["taskId"])["conv"]  # type: ignore[index]
    refused = wire.request("tasks/cancel", {"taskId": task["taskId"]})
    print(f"tasks/cancel while the form is out: {refused}")
    said = refused.get("error", {}).get("message", "")
    assert refused["error"]["code"] == -32602, refused
    assert "waits for the person's decision" in said and "over" not in said, said
    assert "in the form, on the dashboard, or in their own terminal" in said, said
    assert "contemplation approve" not in said
    again = wire.get(task["taskId"])
    assert again["status"] == "input_required"
    assert again["inputRequests"] == asking["inputRequests"]
    assert cli(env, "approve", cid, "--once").returncode == 0
    done = wire.until(task["taskId"], completed, seconds=30)
    assert text_of(done["result"])["blocks"][-1]["text"] == "Read it."


def test_a_reply_that_completes_the_conversation_completes_the_task_from_the_archive(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    wires: Callable[[dict[str, str]], Wire],
) -> None:
    """COMPLETE archives the conversation: its folder (and the task's record in it) moves to
    completed/, and tasks/get still finds the task there."""
    env = base_env(home, fake_ollama, CONTEMPLATION_DASHBOARD_ENABLED="false")
    daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(Step(text="Use an index.\n=== COMPLETE ==="))
    wire = wires(env)
    task = wire.call("conversation_start", topic="Done", initial_prompt="One word?")
    cid = TASK_ID.match(task["taskId"])["conv"]  # type: ignore[index]
    wait_for((home.completed / cid).is_dir, 30, what="archived")
    out = text_of(wire.until(task["taskId"], completed)["result"])
    assert out["archived"] is True and "Use an index." in out["blocks"][0]["text"]


def test_each_task_is_its_own_question_with_parallel_calls_on_one_conversation(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    wires: Callable[[dict[str, str]], Wire],
) -> None:
    """Claude Code makes parallel calls. A conversation is started and two
    more questions are sent on it at once (both requests written before either answer is
    read), all before the model answered anything: each task completes with the reply to its
    own message, never another message's. Calls made at once have no order: the two
    questions may be queued either way round, so the reply each task must carry is read from
    the turn whose last message was its own question."""
    env = base_env(home, fake_ollama, CONTEMPLATION_DASHBOARD_ENABLED="false")
    wire = wires(env)
    first = wire.call("conversation_start", topic="Three", initial_prompt="Question one?")
    m = TASK_ID.match(first["taskId"])
    assert m is not None
    sent = [
        wire.send("tools/call", {"name": "conversation_respond", "arguments": {
            "conversation_id": m["conv"], "response": f"Question {n}?"}})
        for n in ("two", "three")
    ]  # fmt: skip
    answers: dict[int, dict[str, Any]] = {}
    for _ in range(1000):  # bounded: notifications before the answers
        got = wire.read()
        if got.get("id") in sent:
            answers[got["id"]] = got["result"]
        if len(answers) == len(sent):
            break
    tasks = [first["taskId"], *(answers[i]["taskId"] for i in sent)]
    fake_ollama.enqueue(
        Step(text="Answer one."), Step(text="Answer two."), Step(text="Answer three.")
    )
    daemon_factory(env, home).wait_ready()
    done = [wire.until(t, completed) for t in tasks]
    said = [[b["text"] for b in text_of(t["result"])["blocks"]] for t in done]
    chats = [r for r in fake_ollama.requests if r["_path"] == "/api/chat"]
    asked = [r["messages"][-1]["content"] for r in chats]
    replies = ["Answer one.", "Answer two.", "Answer three."]  # the fake's, in turn order
    print(f"the three tasks' blocks: {said}; the turns asked, in order: {asked}")
    assert len(chats) == 3, asked
    questions = ["Question one?", "Question two?", "Question three?"]
    turn_of = [next(i for i, a in enumerate(asked) if q in a) for q in questions]
    assert sorted(turn_of) == [0, 1, 2], asked  # each question was a turn of its own
    assert turn_of[0] == 0, asked  # the start's question came before the two sent on it
    assert said == [[replies[i]] for i in turn_of], (said, asked)


def test_cancel_of_a_task_whose_turn_is_over_is_an_error_that_says_so(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    wires: Callable[[dict[str, str]], Wire],
) -> None:
    """tasks/cancel never answers success for nothing done. A task the
    model has answered is not cancelled: a JSON-RPC error (-32602) says its turn is over,
    and the task stays completed with its reply."""
    env = base_env(home, fake_ollama, CONTEMPLATION_DASHBOARD_ENABLED="false")
    fake_ollama.enqueue(Step(text="Done already."))
    daemon_factory(env, home).wait_ready()
    wire = wires(env)
    task = wire.call("conversation_start", topic="Over", initial_prompt="Quick one?")
    wire.until(task["taskId"], completed)
    refused = wire.request("tasks/cancel", {"taskId": task["taskId"]})
    print(f"tasks/cancel of a completed task: {refused}")
    assert refused.get("error", {}).get("code") == -32602, refused
    assert "Cannot cancel" in refused["error"]["message"]
    assert "over" in refused["error"]["message"], refused
    again = wire.get(task["taskId"])
    assert again["status"] == "completed"
    assert text_of(again["result"])["blocks"][-1]["text"] == "Done already."


def test_cancel_of_a_finished_task_never_cancels_the_next_message_just_claimed(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    wires: Callable[[dict[str, str]], Wire],
) -> None:
    """Task A's reply is whole; B's message has just been claimed into
    ``processing/`` (not yet in the log: the moment between the daemon's claim and its
    append). ``tasks/cancel`` of A says A's turn is over and leaves B's turn alone: no
    ``.cancel`` flag is written, and B is answered."""
    env = base_env(home, fake_ollama, CONTEMPLATION_DASHBOARD_ENABLED="false")
    fake_ollama.enqueue(Step(text="Answer A."), Step(text="Answer B."))
    daemon = daemon_factory(env, home).wait_ready()
    wire = wires(env)
    a = wire.call("conversation_start", topic="Two", initial_prompt="Question A?")
    wire.until(a["taskId"], completed)
    daemon.stop()
    cid = TASK_ID.match(a["taskId"])["conv"]  # type: ignore[index]
    b = wire.call("conversation_respond", conversation_id=cid, response="Question B?")
    conv = Reader(home).locate(cid)
    [queued] = [p for p in conv.inbox.iterdir() if not p.name.startswith(".")]
    queued.rename(conv.processing / queued.name)  # the daemon's claim, as it does it
    refused = wire.request("tasks/cancel", {"taskId": a["taskId"]})
    print(f"tasks/cancel of A while B is claimed: {refused}")
    assert refused.get("error", {}).get("code") == -32602, refused
    assert "over" in refused["error"]["message"], refused
    assert not conv.cancel_flag.exists()
    daemon_factory(env, home).wait_ready()
    done = wire.until(b["taskId"], completed, seconds=30)
    assert text_of(done["result"])["blocks"][-1]["text"] == "Answer B."
    assert wire.get(a["taskId"])["status"] == "completed"
