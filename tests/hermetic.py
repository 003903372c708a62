"""The environment every test, and every process a test starts, runs in: a private HOME that
holds nothing, the XDG folders inside it (the runtime folder beside it), and none of the
person's own settings: no ``CONTEMPLATION_*``, none of the variables the servers' users know
(``OLLAMA_HOST``, ``OPENAI_*``, ``OPENCODE_*``, …), no proxy, no service manager's socket.
What the real peers need stays: PATH, the interpreter's own variables, ``CI``.

A config file in the real user location is then never read (the settings look for it under
``XDG_CONFIG_HOME``, else ``~/.config``), nor is anything written into the real home."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

# read by contemplation, by the servers the tests start (llama-server reads LLAMA_ARG_*,
# LiteLLM its LITELLM_*), or by the SDKs a peer loads
HIDDEN_PREFIXES = (
    "CONTEMPLATION_",
    "XDG_",
    "OLLAMA_",
    "OPENAI_",
    "OPENCODE_",
    "ANTHROPIC_",
    "LLAMA_",
    "LITELLM_",
)
# proxies (httpx and the peers honour them) and systemd's (sd_notify, the watchdog)
HIDDEN_NAMES = frozenset(
    {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "NOTIFY_SOCKET", "WATCHDOG_USEC",
     "WATCHDOG_PID"}
    # the marks an agent's shell tool sets (contemplation.base.acting): a test run from an
    # agent's shell is not the agent
    | {"CLAUDECODE", "CLAUDE_PID", "CLAUDE_CODE_SESSION_ID", "CLAUDE_CODE_CHILD_SESSION",
       "GEMINI_CLI", "CODEX_SANDBOX", "CODEX_THREAD_ID", "OPENCODE", "AI_AGENT"}
)  # fmt: skip


class Env(Protocol):
    """What changes the environment: ``pytest.MonkeyPatch`` (undone after the test or run)."""

    def setenv(self, name: str, value: str, prepend: str | None = None) -> None: ...
    def delenv(self, name: str, raising: bool = True) -> None: ...


def hidden(name: str) -> bool:
    upper = name.upper()
    return upper.startswith(HIDDEN_PREFIXES) or upper in HIDDEN_NAMES


def isolate(env: Env, base: Path) -> Path:
    """Hide the person's settings from ``os.environ`` and point HOME and the XDG folders into
    ``base`` (an empty folder of this test's or run's own); returns the private HOME."""
    for name in [n for n in os.environ if hidden(n)]:
        env.delenv(name)
    home = base / "home"
    home.mkdir()
    runtime = base / "runtime"
    runtime.mkdir(mode=0o700)
    env.setenv("HOME", str(home))
    env.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    env.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    env.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    env.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    env.setenv("XDG_RUNTIME_DIR", str(runtime))
    return home
