"""``contemplation mcp --http`` demands its token: every request without
``Authorization: Bearer <the token in <home>/.mcp.token>`` (0600) is 401, from any local user;
the startup line and ``--print-claude-command`` say how to give it to Claude Code."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from contemplation.store.layout import Home
from contemplation.store.templates import load_template
from contemplation.writer import new_conversation, open_writer
from tests.conftest import base_env, cli
from tests.mcp_http import bearer, serve
from tests.peers import node_bin

NOBODY = 65534

# Run by a python another user can execute: no import from the project or its venv.
CLIENT = r"""
import json, sys, urllib.error, urllib.request
url, token_file = sys.argv[1], sys.argv[2]
token = sys.stdin.read().strip()
out = {}
try:
    with open(token_file) as f:
        f.read()
    out["token_file"] = "read"
except OSError as exc:
    out["token_file"] = type(exc).__name__
init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "other-user", "version": "0"}}}
search = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
          "params": {"name": "conversation_search", "arguments": {"query": "private"}}}
def call(body, auth, method="POST"):
    headers = {"Content-Type": "application/json",
               "Accept": "application/json, text/event-stream"}
    if auth is not None:
        headers["Authorization"] = "Bearer " + auth
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return [r.status, r.headers.get("www-authenticate"), r.read(65536).decode()]
    except urllib.error.HTTPError as exc:
        return [exc.code, exc.headers.get("www-authenticate"), exc.read(65536).decode()]
out["none"] = call(init, None)
out["wrong"] = call(init, "x" * 43)
out["almost"] = call(init, (token or "y" * 43)[:-1])
out["search"] = call(search, None)
out["stream"] = call(None, None, "GET")
out["end"] = call(None, None, "DELETE")
if token:
    out["right"] = call(init, token)
print(json.dumps(out))
"""


def a_private_conversation(home: Home) -> None:
    conv = new_conversation(
        home, "private", template=load_template(home, "default"), model="m", backend="ollama"
    )
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "my private plans", msg_id="m1")


def client(python: str, url: str, token_file: str, token: str, **user: Any) -> dict[str, Any]:
    proc = subprocess.run(
        [python, "-c", CLIENT, url, token_file],
        input=token,
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        check=False,
        **user,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert isinstance(out, dict)
    return out


def assert_refused(out: dict[str, Any]) -> None:
    for what in ("none", "wrong", "almost", "search", "stream", "end"):
        status, challenge, body = out[what]
        assert status == 401, (what, status, body)
        assert challenge is not None and challenge.startswith("Bearer"), (what, challenge)
        assert "private" not in body, (what, body)


def python_for_nobody() -> str | None:
    """A python the user nobody may run (the venv's may lie under a folder only root reads)."""
    for python in (sys.executable, "/usr/bin/python3", shutil.which("python3")):
        if not python or not os.path.exists(python):
            continue
        try:
            ok = subprocess.run(
                [python, "-c", "import json, urllib.request"],
                user=NOBODY,
                group=NOBODY,
                extra_groups=[],
                cwd="/",
                env={"PATH": "/usr/bin:/bin"},
                capture_output=True,
                timeout=60,
                check=False,
            )
        except OSError:
            continue
        if ok.returncode == 0:
            return python
    return None


def test_another_user_gets_401_without_the_token_and_200_only_when_given_it(
    home: Home,
) -> None:
    """The server runs as its owner (root here); a second uid (nobody) cannot read the 0600
    token file, and every request it makes without the token (or with a wrong one) is 401:
    no initialize, no conversation_search of the owner's conversations. Given the token
    (by the test, as the owner would give it to Claude Code), the same user gets 200."""
    if os.geteuid() != 0:
        pytest.skip("running a client as another user needs root")
    python = python_for_nobody()
    if python is None:
        pytest.skip("no python the user nobody can run")
    a_private_conversation(home)
    face = serve(home)
    try:
        as_nobody = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
        st = face.token_file.stat()
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
        blind = client(python, face.url, str(face.token_file), "", **as_nobody)
        assert blind["token_file"] == "PermissionError"  # noqa: S105 - an exception's name
        assert_refused(blind)
        told = client(python, face.url, str(face.token_file), face.token, **as_nobody)
    finally:
        face.stop()
    assert_refused(told)
    status, _, body = told["right"]
    assert status == 200 and '"serverInfo"' in body, body


def test_http_face_demands_the_token_and_says_how_to_give_it(home: Home) -> None:
    """Any user: the token file is made 0600 at start, the startup lines name it and the exact
    `claude mcp add` line; without the token 401, with it the SDK client works."""
    a_private_conversation(home)
    face = serve(home)
    try:
        st = face.token_file.stat()
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert face.proc.stderr is not None
        said = [face.proc.stderr.readline().decode() for _ in range(2)]
        out = client(sys.executable, face.url, str(face.token_file), face.token)

        async def main() -> dict[str, Any]:
            async with Client(bearer(face.url, face.token)) as c:
                result = await c.call_tool("conversation_search", {"query": "private"})
                return json.loads(getattr(result.content[0], "text", ""))

        found = asyncio.run(main())
    finally:
        face.stop()
    assert_refused(out)
    assert out["right"][0] == 200
    assert found["count"] == 1
    assert said[0].startswith(f"MCP streamable HTTP on {face.url} ")
    assert str(face.token_file) in said[0]
    assert said[1].startswith("add it to Claude Code: claude mcp add-json --scope user "), said
    assert "--print-headers" in said[1] and face.url in said[1]
    assert face.token not in "".join(said)  # the token itself stays out of logs


def test_print_claude_command_prints_a_line_without_the_token_and_the_helper_gives_it(
    home: Home,
) -> None:
    """The line names the helper (``mcp --print-headers``), never the token;
    the helper, run as Claude Code runs it (a shell, from any folder), prints the header."""
    env = base_env(home)
    first = cli(env, "mcp", "--http", "8765", "--print-claude-command").stdout
    again = cli(env, "mcp", "--http", "8765", "--print-claude-command").stdout
    token = (home.root / ".mcp.token").read_text().strip()
    assert len(token) >= 32
    assert first == again
    assert token not in first
    words = shlex.split(first)
    assert words[:6] == ["claude", "mcp", "add-json", "--scope", "user", "contemplation"], words
    config = json.loads(words[6])
    assert config["type"] == "http" and config["url"] == "http://127.0.0.1:8765/mcp"
    helper = subprocess.run(  # noqa: S602 - through a shell, as Claude Code runs it
        config["headersHelper"],
        shell=True,
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert helper.returncode == 0, helper.stderr
    assert json.loads(helper.stdout) == {"Authorization": f"Bearer {token}"}
    assert stat.S_IMODE((home.root / ".mcp.token").stat().st_mode) == 0o600


def _argv_with(secret: str) -> list[str]:
    """The command lines of this machine's processes that hold ``secret`` (what another
    user reads from /proc/*/cmdline)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            raw = cmdline.read_bytes()
        except OSError:  # gone meanwhile
            continue
        if secret.encode() in raw:
            found.append(raw.replace(b"\0", b" ").decode(errors="replace"))
    return found


def test_the_real_claude_code_connects_with_the_printed_command_and_not_without_the_token(
    home: Home, tmp_path: Path
) -> None:
    """The line ``--print-claude-command`` prints, run as a person would paste it: the real
    Claude Code (npm) adds the server and its health check connects, through the helper; the
    same server added without the header, or with another token, does not. The token is in
    no process's command line meanwhile, nor in Claude Code's configuration."""
    claude = node_bin("claude")
    face = serve(home)
    try:
        args = ("mcp", "--http", str(face.port), "--print-claude-command")
        line = cli(base_env(home), *args).stdout.strip()
        assert line.startswith("claude mcp add-json ") and face.token not in line
        env = {
            "PATH": f"{claude.parent}:{os.environ.get('PATH', '')}",
            "HOME": str(tmp_path / "claude-home"),  # Claude Code's own config stays here
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        (tmp_path / "claude-home").mkdir()
        project = tmp_path / "project"
        project.mkdir()

        def claude_run(*args: str) -> str:
            proc = subprocess.run(
                args, env=env, cwd=project, capture_output=True, text=True, timeout=120
            )
            assert proc.returncode == 0, proc.stdout + proc.stderr
            return proc.stdout

        claude_run("bash", "-c", line)  # as pasted into a shell
        bare = ("claude", "mcp", "add", "--transport", "http")
        claude_run(*bare, "tokenless", face.url)
        claude_run(*bare, "wrong", face.url, "--header", "Authorization: Bearer " + "0" * 43)
        seen: list[str] = []
        done = threading.Event()

        def scan() -> None:  # as another user would, while Claude Code connects
            while not done.wait(0.002):
                seen.extend(_argv_with(face.token))

        scanner = threading.Thread(target=scan, daemon=True)
        scanner.start()
        try:
            listing = claude_run("claude", "mcp", "list")
        finally:
            done.set()
            scanner.join(10)
        listed = {ln.split(":", 1)[0]: ln for ln in listing.splitlines()}
        assert "✔ Connected" in listed["contemplation"], listed
        assert seen == []
        assert face.token not in (tmp_path / "claude-home" / ".claude.json").read_text()
        assert "✔ Connected" not in listed["tokenless"], listed
        assert "✔ Connected" not in listed["wrong"], listed
    finally:
        face.stop()
