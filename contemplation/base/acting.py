"""Who is acting: the person, or an agent running the CLI through its shell tool.

Coding agents mark the environment of the commands their shell tool runs: Claude Code sets
``CLAUDECODE=1``, Gemini CLI ``GEMINI_CLI=1``, Codex ``CODEX_SANDBOX``/``CODEX_THREAD_ID``,
OpenCode ``OPENCODE=1``. A CLI process whose environment carries such a mark is the agent.
So is one whose *parents* carried it when they started (``/proc/PID/environ`` keeps a
process's starting environment whatever it does later), or one with the agent's own program
among its parents (a shell execs its last command in place, so ``bash -c 'unset
CLAUDECODE; contemplation …'`` is a child of Claude Code itself): ``unset CLAUDECODE`` or
``env -u CLAUDECODE`` in the agent's shell does not turn the agent into the person. This
decides, with or without a terminal on stdin: an agent can open a pseudo-terminal
(``script -qc …``), so a terminal proves nothing.

Limits (said in docs/concepts/who-decides.md): a process that leaves its parents (a double fork,
``setsid``) and clears its environment is not seen; an agent's shell can write any file the
person can (the config included). Those are closed by the agent's own permission rules
(Claude Code: deny ``Bash(contemplation approve:*)`` and edits of the config), not here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

#: (variable, the agent's name, whether that agent's MCP client shows the person forms)
AGENTS: tuple[tuple[str, str, bool], ...] = (
    ("CLAUDECODE", "Claude Code", True),
    ("GEMINI_CLI", "Gemini CLI", False),
    ("CODEX_SANDBOX", "Codex", False),
    ("CODEX_THREAD_ID", "Codex", False),
    ("OPENCODE", "OpenCode", False),
)
#: the mark several agents share, ``AI_AGENT=<agent>_<version>_<how>``: read after the
#: agents' own marks (Claude Code sets both), its value's start names the agent
SHARED_MARK = "AI_AGENT"
SHARED_NAMES: tuple[tuple[str, str, bool], ...] = (
    ("claude-code", "Claude Code", True),
    ("gemini", "Gemini CLI", False),
    ("codex", "Codex", False),
    ("opencode", "OpenCode", False),
)
PROGRAM = "\0program"  # in an ancestor's mapping: its program (no variable has this name)
SESSION_ENV = "CLAUDE_PID"  # Claude Code's own process id, in its children's environment
#: agents known by their own process, an ancestor of whatever their tools run: the name the
#: kernel gives it (``comm``), or a package path on its command line (one run by node)
AGENT_PROGRAMS: tuple[tuple[str, str, bool], ...] = (
    ("claude", "Claude Code", True),
    ("claude.exe", "Claude Code", True),
    ("gemini", "Gemini CLI", False),
    ("codex", "Codex", False),
    ("opencode", "OpenCode", False),
)
AGENT_PACKAGES: tuple[tuple[str, str, bool], ...] = (
    ("@anthropic-ai/claude-code", "Claude Code", True),
    ("@google/gemini-cli", "Gemini CLI", False),
    ("@openai/codex", "Codex", False),
    ("opencode-ai", "OpenCode", False),
)
MAX_CMDLINE = 8192  # bytes of an ancestor's command line read
MAX_PARENTS = 12  # ancestors looked at (a shell tool's command sits 1 to 4 below its agent)
MAX_ENVIRON = 1 << 20  # bytes of one ancestor's environment read


@dataclass(frozen=True, slots=True)
class Actor:
    """``agent``: the agent's name, or "" for the person. ``forms``: whether that agent's
    MCP client shows the person forms (then lookups are the person's to decide there)."""

    agent: str = ""
    forms: bool = False

    @property
    def is_agent(self) -> bool:
        return bool(self.agent)

    @property
    def words(self) -> str:
        """Who it is, as a decision's record says it."""
        return f"the agent (the CLI under {self.agent})" if self.agent else "the person (the CLI)"


PERSON = Actor()


def _marked(env: Mapping[str, str]) -> Actor | None:
    for var, name, forms in AGENTS:
        value = env.get(var, "")
        if value and value not in {"0", "false"}:
            return Actor(name, forms)
    return None


def acting(env: Mapping[str, str], parents: Iterable[Mapping[str, str]] = ()) -> Actor:
    """Who runs this process: an agent when ``env`` or any of ``parents`` (their starting
    environments, nearest first, each with ``PROGRAM``: its program, see :func:`parents`)
    carries an agent's own mark or is the agent's own program, or else carries the mark
    agents share; otherwise the person."""
    chain = [env, *parents]
    for one in chain:
        if (found := _marked(one) or _program(one.get(PROGRAM, ""))) is not None:
            return found
    for one in chain:
        if shared := one.get(SHARED_MARK, ""):
            name = next((n for n in SHARED_NAMES if shared.lower().startswith(n[0])), None)
            return Actor(name[1], name[2]) if name else Actor("an agent")
    return PERSON


def _program(what: str) -> Actor | None:
    comm, _, cmdline = what.partition("\0")
    for name, agent, forms in AGENT_PROGRAMS:
        if comm == name:
            return Actor(agent, forms)
    for package, agent, forms in AGENT_PACKAGES:
        if package in cmdline:
            return Actor(agent, forms)
    return None


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()[:MAX_ENVIRON]
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    return int(stat.rpartition(")")[2].split()[1])  # the field after the state


def _what(pid: int) -> str:
    """``comm`` and the command line of ``pid``, as ``PROGRAM`` holds them."""
    comm = Path(f"/proc/{pid}/comm").read_text(encoding="utf-8", errors="replace").strip()
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()[:MAX_CMDLINE]
    except OSError:
        cmdline = b""
    return comm + "\0" + cmdline.replace(b"\0", b" ").decode("utf-8", "replace")


def parents(pid: int | None = None) -> Iterator[dict[str, str]]:
    """The starting environments of this process's ancestors, nearest first, each with its
    program under ``PROGRAM`` (a shell execs its last command in place, so the agent's own
    process may be the parent; Linux; none where /proc cannot tell, or for ancestors of
    another user)."""
    pid = os.getpid() if pid is None else pid
    for _ in range(MAX_PARENTS):
        try:
            pid = _parent(pid)
            if pid <= 1:
                return
            found = _environ(pid)
            found[PROGRAM] = _what(pid)
            yield found
        except (OSError, ValueError, IndexError):
            return


def _start(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    return stat.rpartition(")")[2].split()[19]  # starttime: the pid with it names one process


def _process(pid: int) -> str:
    try:
        return f"{pid}:{_start(pid)}"
    except (OSError, ValueError, IndexError):
        return str(pid)  # no /proc (macOS): the pid alone


def this_process() -> str:
    """This process, as :func:`session` names a process (``PID:STARTTIME``)."""
    return _process(os.getpid())


def alive(process: str) -> bool:
    """Whether the process ``PID:STARTTIME`` (or a bare ``PID``) still runs: the same pid
    with the same start, so a pid taken again by another process is not it."""
    pid, _, start = process.partition(":")
    if not pid.isdigit():
        return False
    try:
        return not start or _start(int(pid)) == start
    except (OSError, ValueError, IndexError):
        if start:
            return False
    try:
        os.kill(int(pid), 0)  # no /proc: the pid alone
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def session(env: Mapping[str, str] | None = None, pid: int | None = None) -> str | None:
    """The agent's own process, as ``PID:STARTTIME``, for a process it started (an MCP
    server, its shell tool's commands, its monitors and hooks), so that each agent session
    is told of its own conversations only. Claude Code names itself in ``CLAUDE_PID`` (kept
    across ``/clear``, unlike its session id); for another agent, the first ancestor above
    the ones that carry its mark. None where neither tells."""
    env = os.environ if env is None else env
    pid = os.getpid() if pid is None else pid
    ancestry = list(parents(pid))
    for one in (env, *ancestry):
        if (claude := one.get(SESSION_ENV, "")).isdigit():
            return _process(int(claude))
    try:
        for _ in range(MAX_PARENTS):
            pid = _parent(pid)
            if pid <= 1:
                return None
            if _program(_what(pid)) is not None or _marked(_environ(pid)) is None:
                return _process(pid)
    except (OSError, ValueError, IndexError):
        return None
    return None


def here() -> Actor:
    """Who runs this CLI process."""
    return acting(os.environ, parents())
