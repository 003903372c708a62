"""Secrets are never shown and never read.

* A password in a provider's URL is masked (``user:***@``) on every face — the log and its
  markers, ``state.json``, the daemon's log, ``doctor``, ``status``, ``list``, ``models``,
  the dashboard's API and MCP — and goes to the server as HTTP Basic auth; with an api key as
  well it is one line of config error, never a crash or a conversation pending for ever.
* A built-in list of secrets (the tool's own token, index and config file, ``.ssh``,
  ``.gnupg``, ``.aws``, ``.netrc``, ``*.pem``, ``*.key``, ``.env``) is never read for the
  model, whatever broad root or rule allows, unless a root or a rule names it.

Real daemons, real loopback servers (a closed port, a scripted OpenAI-compatible server that
answers 500), the real CLI and the real MCP SDK client.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contemplation import settings as settings_mod
from contemplation.backends.base import phase_timeouts
from contemplation.backends.openai import OpenAIBackend
from contemplation.base.redact import credentials, redacted
from contemplation.base.secret_names import OWN_SECRETS, SERVICE_ENV
from contemplation.models import ChatMessage, ChatRequest
from contemplation.needs import permissions
from contemplation.needs.tools import registry
from contemplation.needs.tools.base import Refused
from contemplation.needs.tools.files import FileReader
from contemplation.settings import TimeoutSettings
from contemplation.store.layout import Home, list_conversations, read_state
from tests.conftest import DaemonProc, base_env, cli, cli_here, wait_for
from tests.fakes.ollama_server import FakeOllama
from tests.fakes.ollama_server import Step as OllamaStep
from tests.fakes.openai_server import FakeOpenAI, Step

PASSWORD = "Pw-zq81-SECRET"  # noqa: S105 - planted, to be looked for everywhere

# --------------------------------------------------------------------------- the one function


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://user:pass@host/v1", "http://user:***@host/v1"),
        (
            "cannot reach https://a:b@10.0.0.5:8080/v1: refused",
            "cannot reach https://a:***@10.0.0.5:8080/v1: refused",
        ),
        ("https://TOKEN@github.com/x", "https://***@github.com/x"),
        ("http://u:p@ss@host:1/v1", "http://u:***@host:1/v1"),  # a raw @ in the password
        ("{'url': 'http://u:p@h/v1', 'x': 'a@b'}", "{'url': 'http://u:***@h/v1', 'x': 'a@b'}"),
        ("http://host/path?mail=a@b", "http://host/path?mail=a@b"),
        ("mail me: a@b.c", "mail me: a@b.c"),
        ("no url here", "no url here"),
    ],
)
def test_redacted_masks_the_credentials_of_every_url(text: str, shown: str) -> None:
    assert redacted(text) == shown


def test_credentials_split_a_url_into_the_bare_url_and_the_pair() -> None:
    assert credentials("http://al%40ice:p%3Aw@127.0.0.1:8/v1") == (
        "http://127.0.0.1:8/v1",
        ("al@ice", "p:w"),
    )
    assert credentials("http://127.0.0.1:8/v1") == ("http://127.0.0.1:8/v1", None)


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_no_log_line_shows_a_url_password(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    import structlog

    from contemplation.base import logs

    root = logging.getLogger()
    kept = (root.handlers[:], root.level)
    logs.configure(fmt, "info")  # type: ignore[arg-type]
    try:
        _log_lines_are_masked(capsys)
    finally:  # structlog's logger holds this test's captured stderr: not for later tests
        structlog.reset_defaults()
        root.handlers[:], _ = kept
        root.setLevel(kept[1])


def _log_lines_are_masked(capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    import structlog

    url = f"http://alice:{PASSWORD}@10.0.0.5:8080/v1"
    log = structlog.get_logger("test")
    log.warning("backend_failed", url=url, error=f"cannot reach {url}", nested={"urls": [url]})

    def fail() -> None:
        raise ValueError(f"bad {url}")

    try:
        fail()
    except ValueError:
        log.exception("crashed")
    err = capsys.readouterr().err
    assert "alice:***@10.0.0.5" in err and "bad http://alice:***@" in err
    assert PASSWORD not in err
    # a library's record through the standard library's handler
    for handler in logging.getLogger().handlers:
        record = logging.LogRecord("aiohttp", logging.ERROR, "", 0, "Unclosed %s", (url,), None)
        assert handler.filter(record)
        line = handler.format(record)
        assert "Unclosed http://alice:***@10.0.0.5" in line and PASSWORD not in line


def test_a_bad_setting_line_does_not_show_the_password(tmp_path: Path) -> None:
    from contemplation.config.validate import validate
    from contemplation.errors import ConfigError

    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[providers.b]\nkind = "openai"\nurl = "ftp://u:{PASSWORD}@h/v1"\n')
    with pytest.raises(ConfigError) as err:
        validate(settings_mod.load(config=cfg, home=tmp_path / "home", env={}))
    assert "providers.b.url" in str(err.value) and "u:***@h" in str(err.value)
    assert PASSWORD not in str(err.value)


# --------------------------------------------------------------------------- finding 3


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def failing_server() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI().start()
    fake.default_step = Step(kind="error", status=500)
    yield fake
    fake.stop()


def _env(home: Home, cfg: str, **extra: str) -> dict[str, str]:
    path = home.root.parent / "config.toml"
    path.write_text(cfg)
    env = base_env(home, CONTEMPLATION_CONFIG=str(path), CONTEMPLATION_RETRY__MAX_ATTEMPTS="2")
    env.pop("OPENAI_API_KEY", None)
    env.pop("OPENAI_BASE_URL", None)
    env.update(extra)
    return env


def _api(home: Home, path: str) -> Any:
    info = json.loads((home.root / ".dashboard.json").read_text())
    token = (home.root / ".dashboard.token").read_text().strip()
    req = urllib.request.Request(
        info["url"].rstrip("/") + path, headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _mcp_checks(home: Home, env: dict[str, str], ids: list[str]) -> list[dict[str, Any]]:
    from mcp import Client

    from contemplation.faces.mcp import server as mcp_server
    from tests.system.test_mcp_server import tool

    settings = settings_mod.load(home=home.root, env={}, config=Path(env["CONTEMPLATION_CONFIG"]))

    async def main() -> list[dict[str, Any]]:
        async with Client(mcp_server.build_server(settings)) as c:
            return [await tool(c, "conversation_check", conversation_id=i) for i in ids]

    return asyncio.run(main())


def test_a_password_in_an_openai_url_is_shown_nowhere(
    home: Home,
    failing_server: FakeOpenAI,
    daemon_factory: Callable[..., DaemonProc],
) -> None:
    """One provider at a closed port, one at a server that answers 500: both fail, and the
    password is in no file, log, command output, dashboard answer or MCP result."""
    shut = f"http://alice:{PASSWORD}@127.0.0.1:{_closed_port()}/v1"
    broken = f"http://alice:{PASSWORD}@127.0.0.1:{failing_server.httpd.server_address[1]}/v1"
    env = _env(
        home,
        f'[providers.shut]\nkind = "openai"\nurl = "{shut}"\n\n'
        f'[providers.broken]\nkind = "openai"\nurl = "{broken}"\n',
    )
    daemon = daemon_factory(env, home).wait_ready()
    ids = [
        cli_here(env, "new", name, "--backend", name, "--model", "m", "--message", "hi").stdout.strip()
        for name in ("shut", "broken")
    ]
    convs = [home.conv(i) for i in ids]
    for conv in convs:
        wait_for(
            lambda c=conv: (st := read_state(c)) is not None and bool(st.last_error),
            30,
            what=f"{conv.id} failed",
        )
    # the password went to the 500 server as Basic auth, not in the URL
    sent = [r for r in failing_server.requests if r["_path"].endswith("/chat/completions")]
    basic = "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    assert sent and all(r["_headers"]["Authorization"] == basic for r in sent)
    surfaces: dict[str, str] = {}
    for conv in convs:
        for f in (conv.log, conv.state, conv.metadata):
            surfaces[f"{conv.id}/{f.name}"] = f.read_text()
    port = shut.rsplit(":", 1)[1]
    assert f"cannot reach http://127.0.0.1:{port}" in surfaces[f"{ids[0]}/state.json"]
    for args in (["doctor"], ["status"], *(["status", i] for i in ids), ["list", "--json"],
                 ["models"], ["models", "--json"]):  # fmt: skip
        out = cli(env, *args, check=False)
        assert "Traceback" not in out.stderr, (args, out.stderr)
        surfaces[" ".join(args)] = out.stdout + out.stderr
    surfaces["/api/conversations"] = json.dumps(_api(home, "/api/conversations"))
    for i in ids:
        surfaces[f"/api/conversations/{i}"] = json.dumps(_api(home, f"/api/conversations/{i}"))
    surfaces["mcp conversation_check"] = json.dumps(_mcp_checks(home, env, ids))
    daemon.stop()
    surfaces["daemon log"] = daemon.stderr()
    assert "turn_failed" in surfaces["daemon log"]
    leaked = [name for name, text in surfaces.items() if PASSWORD in text]
    assert leaked == []


def test_a_password_in_the_url_and_an_api_key_is_one_line_of_config_error(
    home: Home, daemon_factory: Callable[..., DaemonProc], failing_server: FakeOpenAI
) -> None:
    port = failing_server.httpd.server_address[1]
    env = _env(
        home,
        f'[providers.both]\nkind = "openai"\nurl = "http://u:{PASSWORD}@127.0.0.1:{port}/v1"\n'
        'api_key = "sk-also"\n',
    )
    why = "providers.both.url carries a password and api_key is set: use one"
    out = cli_here(env, "models", "-b", "both", check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert why in out.stdout + out.stderr and PASSWORD not in out.stdout + out.stderr
    daemon_factory(env, home).wait_ready()
    conv = home.conv(
        cli_here(
            env, "new", "both", "--backend", "both", "--model", "m", "--message", "hi"
        ).stdout.strip()
    )
    wait_for(lambda: (st := read_state(conv)) is not None and st.status.value == "error", 30,
             what="the config error")  # fmt: skip
    state = read_state(conv)
    assert state is not None and state.last_error is not None
    assert state.last_error.kind == "config" and why in state.last_error.message
    assert f"=== ERROR: cannot use backend 'both': {why} ===" in conv.log.read_text()
    assert failing_server.requests == []  # nothing was sent with two credentials
    doctor = cli_here(env, "doctor", check=False)
    assert why in doctor.stdout and PASSWORD not in doctor.stdout + doctor.stderr


def test_a_url_password_goes_as_basic_auth_and_a_reply_comes(tmp_path: Path) -> None:
    fake = FakeOpenAI().start()
    try:
        url = f"http://bob:{PASSWORD}@127.0.0.1:{fake.httpd.server_address[1]}"
        timeouts = phase_timeouts(TimeoutSettings(), 1 << 20)
        backend = OpenAIBackend(url, api_key="none", timeouts=timeouts)  # "none": no key
        assert PASSWORD not in backend.base_url and backend.base_url.endswith("/v1")
        req = ChatRequest(model="fake-model", messages=(ChatMessage("user", "hello"),))

        async def turn() -> list[Any]:
            try:
                return [ev async for ev in backend.stream(req)]
            finally:
                await backend.aclose()

        events = asyncio.run(turn())
        assert "Echo: hello" in "".join(e.text for e in events if e.kind == "content")
        [sent] = fake.chat_requests()
        basic = "Basic " + base64.b64encode(f"bob:{PASSWORD}".encode()).decode()
        assert sent["_headers"]["Authorization"] == basic
    finally:
        fake.stop()


def test_an_opencode_url_password_is_the_basic_auth_unless_a_password_is_set_too() -> None:
    from contemplation.backends.opencode import OpenCodeBackend
    from contemplation.errors import ConfigError

    backend = OpenCodeBackend(f"http://opencode:{PASSWORD}@127.0.0.1:4096")
    assert (
        backend.base_url == "http://127.0.0.1:4096" and backend._http.base_url == backend.base_url
    )
    assert "Basic " in backend._http.headers["Authorization"]
    with pytest.raises(ConfigError, match=r"opencode\.url carries a password and password is set"):
        OpenCodeBackend(f"http://u:{PASSWORD}@127.0.0.1:4096", auth=("u", "other"))


# --------------------------------------------------------------------------- finding 6


def test_the_tools_own_files_are_on_the_list() -> None:
    from contemplation.faces import dashboard
    from contemplation.faces.mcp import server as mcp_server
    from contemplation.index import db as index_db
    from contemplation.needs.tools.files import DEFAULT_DENY

    for name in (dashboard.TOKEN_FILE, mcp_server.TOKEN_FILE, SERVICE_ENV):
        assert name in OWN_SECRETS  # the modules that write them take the names from there
    own = (*OWN_SECRETS, index_db.DB_NAME, index_db.DB_NAME + "-wal")
    for name in own:
        assert (
            permissions.decide(
                "r", "files.read", {"path": f"/h/{name}"}, permissions.defaults()
            ).action
            == "deny"
        )
    assert FileReader([Path("/")]).denied([index_db.DB_NAME]) is not None
    assert ".index.sqlite3*" in DEFAULT_DENY


HOME = "/home/u"


def verdict(table: dict[str, Any], path: str, roots: tuple[str, ...] = ()) -> permissions.Verdict:
    compiled = permissions.compile_permissions(
        table, source="test.toml", names=[*registry.kinds(), "read_file"], home=HOME
    )
    perms = [
        *permissions.defaults(home=HOME, configs=["~/.config/contemplation/config.toml"],
                              roots=roots),
        *compiled,
    ]  # fmt: skip
    return permissions.decide("read_file", "files.read", {"path": path}, perms, HOME)


SECRETS = [
    "~/.ssh/id_rsa",
    "/home/u/.gnupg/private-keys-v1.d/x.key",
    "~/.aws/credentials",
    "~/.netrc",
    "/srv/tls/server.pem",
    "/srv/tls/server.key",
    "/srv/app/.env",
    "/home/u/.local/share/contemplation/.dashboard.token",
    "/home/u/.local/share/contemplation/.index.sqlite3",
    "/home/u/.config/contemplation/config.toml",
]


@pytest.mark.parametrize("path", SECRETS)
@pytest.mark.parametrize(
    "table", [{}, {"read_file": "allow"}, {"*": {"~/**": "allow"}}, {"read_file": {"*": "allow"}}]
)
def test_no_broad_rule_or_root_lifts_a_built_in_secret(path: str, table: dict[str, Any]) -> None:
    v = verdict(table, path, roots=("~",))
    assert v.action == "deny", (path, table, v)
    said = "whatever tools.allowed_roots" if "token" in path else "name it"
    assert v.rule is not None and said in v.rule.shown()


@pytest.mark.parametrize(
    ("table", "roots", "path"),
    [
        ({"read_file": {"~/.ssh/**": "allow"}}, (), "~/.ssh/id_rsa"),
        ({}, ("~/.ssh",), "~/.ssh/id_rsa"),
        ({"read_file": {"/srv/tls/*.pem": "allow"}}, (), "/srv/tls/server.pem"),
        ({"read_file": {"**/.env": "allow"}}, (), "/srv/app/.env"),
        (
            {"*": {"~/.config/contemplation/config.toml": "allow"}},
            (),
            "~/.config/contemplation/config.toml",
        ),
    ],
)
def test_a_root_or_rule_that_names_a_secret_lifts_it(
    table: dict[str, Any], roots: tuple[str, ...], path: str
) -> None:
    assert verdict(table, path, roots=roots).action == "allow"


def test_what_only_looks_like_a_secret_is_not_one() -> None:
    for fine in ("/home/u/notes/plan.md", "/srv/app/.envrc", "how do I read my .ssh key files"):
        assert verdict({}, fine, roots=("~",)).action == "allow", fine


def test_the_file_reader_refuses_its_own_secrets_and_says_how_to_lift(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = tmp_path / "user"
    (user / ".ssh").mkdir(parents=True)
    (user / ".ssh" / "known_hosts").write_text("KNOWN HOSTS\n")
    (user / "app").mkdir()
    cfg = user / "app" / "contemplation.toml"
    cfg.write_text('api_key = "sk-x"\n')
    monkeypatch.setenv("HOME", str(user))
    broad = FileReader([Path("~")], protected=[cfg])
    with pytest.raises(Refused, match=r'deny-list.*add "~/\.ssh" to tools\.allowed_roots'):
        broad.read("~/.ssh/known_hosts")
    with pytest.raises(Refused, match="configuration file"):
        broad.read("~/app/contemplation.toml")
    # the root that names it most precisely decides
    named = FileReader([Path("~"), Path("~/.ssh")], protected=[cfg])
    assert named.read("~/.ssh/known_hosts").text == "KNOWN HOSTS\n"
    (user / "certs").mkdir()
    (user / "certs" / "server.pem").write_text("CERT\n")
    with pytest.raises(Refused, match=r'add "~/certs/server\.pem" to tools\.allowed_roots'):
        broad.read("~/certs/server.pem")
    assert FileReader([Path("~"), Path("~/certs/server.pem")]).read("~/certs/server.pem").text == (
        "CERT\n"
    )


def test_a_daemon_turn_never_sends_a_secret_to_the_model(
    tmp_path: Path,
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
) -> None:
    """HOME is tmp_path; the contemplation home and the config live under it, as they would;
    allowed_roots = ["~"]. The model asks for ~/.ssh/id_rsa, the dashboard token and the
    config file (which holds an api key): each is refused with the reason and the way to
    lift it, and none of their bytes reach the server."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_rsa").write_text("SSH-PRIVATE-KEY-BYTES\n")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "plan.md").write_text("THE PLAN IS FINE\n")
    home.root.mkdir(parents=True)
    token = home.root / ".dashboard.token"
    token.write_text("T" * 43 + "\n")
    os.chmod(token, 0o600)
    cfg_dir = tmp_path / "xdg-config" / "contemplation"
    cfg_dir.mkdir(parents=True)
    cfg = cfg_dir / "config.toml"
    cfg.write_text(
        '[tools]\nallowed_roots = ["~"]\n\n'
        '[providers.hosted]\nkind = "openai"\nurl = "http://127.0.0.1:9/v1"\n'
        'api_key = "sk-CONFIG-KEY-77"\n'
    )
    env = base_env(home, fake_ollama, HOME=str(tmp_path))
    asks = [
        "~/.ssh/id_rsa",
        str(token),
        "~/xdg-config/contemplation/config.toml",
        "~/notes/plan.md",
    ]
    fake_ollama.enqueue(
        OllamaStep(text="\n".join(f"NEED: File contents of {a}" for a in asks)),
        OllamaStep(text="I will do without them."),
    )
    routed = cli_here(env, "routes", "test", "NEED: File contents of ~/.ssh/id_rsa", check=False)
    assert "permission: deny" in routed.stdout and "name it" in routed.stdout
    daemon_factory(env, home).wait_ready()
    cid = cli_here(env, "new", "secrets", "--model", "gemma", "--message", "go").stdout.strip()
    conv = home.conv(cid)
    wait_for(lambda: b"I will do without them." in conv.log.read_bytes(), 30, what="the reply")
    log = conv.log.read_text()
    sent = json.dumps(fake_ollama.chat_requests())
    for secret in ("SSH-PRIVATE-KEY-BYTES", "T" * 43, "sk-CONFIG-KEY-77"):
        assert secret not in sent and secret not in log
    assert "THE PLAN IS FINE" in sent  # the root works for what is not a secret
    assert log.count("NOT ANSWERED (refused)") == 3
    assert "tools.allowed_roots" in log and "name it" in log
    assert [c.id for c in list_conversations(home)] == [cid]


# ------------------------------------------------- a secret the service's unit must not show

OWN = [
    "~/.config/contemplation/service.env",
    "~/.claude.json",
    "~/.claude/.credentials.json",
    "~/work/project/.mcp.json",
    "/home/u/.local/share/contemplation/.mcp.token",
]


@pytest.mark.parametrize("path", OWN)
def test_no_root_or_rule_lifts_the_tools_own_secrets(path: str) -> None:
    """What lifts the person's secrets (a root or a rule that names them) never lifts the
    files the tool writes a credential into; the refusal says why in one line."""
    folder = path.rsplit("/", 1)[0]
    named = {"read_file": {path: "allow", folder + "/**": "allow"}}
    for table, roots in (({}, ("~",)), (named, (folder, path)), ({"*": "allow"}, ("/",))):
        v = verdict(table, path, roots=roots)
        assert v.action == "deny", (path, table, roots, v)
        assert v.rule is not None and "never reads it for a model" in v.rule.shown(), v
    assert verdict({}, "~/notes/claude.json.md", roots=("~",)).action == "allow"


def test_the_file_reader_and_attachments_refuse_the_tools_own_secrets_by_any_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Named, under a root that is their own folder, or behind a link in a root: refused."""
    from contemplation.errors import InputRejected
    from contemplation.settings import AttachmentSettings
    from contemplation.store import attachments

    user = tmp_path / "user"
    conf = user / ".config" / "contemplation"
    conf.mkdir(parents=True)
    (conf / "service.env").write_text("OPENAI_API_KEY=sk-SERVICE-ENV-KEY\n")
    (user / ".claude.json").write_text('{"mcpServers": {"x": {"headers": {"A": "B"}}}}\n')
    (user / "notes").mkdir()
    (user / "notes" / "innocent.txt").symlink_to(conf / "service.env")
    (user / "notes" / "cfg").symlink_to(conf)
    monkeypatch.setenv("HOME", str(user))
    reader = FileReader([Path("~"), conf, conf / "service.env", user / ".claude.json"])
    for asked in (
        "~/.config/contemplation/service.env",
        str(conf / "service.env"),
        "~/.claude.json",
        "notes/innocent.txt",
        "~/notes/cfg/service.env",
    ):
        with pytest.raises(Refused, match="never reads it for a model"):
            reader.read(asked)
    limits = AttachmentSettings()
    for path in (conf / "service.env", user / ".claude.json", user / "notes" / "cfg" / "service.env"):
        with pytest.raises(InputRejected, match="never reads it for a model or attaches it"):
            attachments.read_paths([path], limits)


def test_a_daemon_turn_never_sends_the_tools_own_secrets_nor_attaches_them(
    tmp_path: Path,
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
) -> None:
    """allowed_roots names ``~`` and the config folder itself, [permissions] allows every read:
    the model asks for service.env, ~/.claude.json (holding the MCP token, as ``claude mcp add
    --header`` leaves it) and the MCP token file; each is refused with the line saying why,
    none of their bytes reach the server, and ``send --attach`` of either queues nothing."""
    cfg_dir = tmp_path / "xdg-config" / "contemplation"
    cfg_dir.mkdir(parents=True)
    (cfg_dir / "service.env").write_text("OPENAI_API_KEY=sk-SERVICE-ENV-KEY-91\n")
    (tmp_path / ".claude.json").write_text(
        json.dumps({"mcpServers": {"c": {"headers": {"Authorization": "Bearer CLAUDE-JSON-TOK"}}}})
    )
    home.root.mkdir(parents=True)
    (home.root / ".mcp.token").write_text("MCP-TOKEN-FILE-BYTES\n")
    (cfg_dir / "config.toml").write_text(
        f'[tools]\nallowed_roots = ["~", "{cfg_dir}", "{home.root}"]\n\n'
        '[permissions]\nread_file = { "*" = "allow" }\n'
    )
    env = base_env(home, fake_ollama, HOME=str(tmp_path))
    asks = ["~/xdg-config/contemplation/service.env", "~/.claude.json", str(home.root / ".mcp.token")]
    fake_ollama.enqueue(
        OllamaStep(text="\n".join(f"NEED: File contents of {a}" for a in asks)),
        OllamaStep(text="I will do without them."),
    )
    daemon_factory(env, home).wait_ready()
    cid = cli_here(env, "new", "own", "--model", "gemma", "--message", "go").stdout.strip()
    conv = home.conv(cid)
    wait_for(lambda: b"I will do without them." in conv.log.read_bytes(), 30, what="the reply")
    log = conv.log.read_text()
    sent = json.dumps(fake_ollama.chat_requests())
    for secret in ("SK-SERVICE-ENV-KEY-91", "CLAUDE-JSON-TOK", "MCP-TOKEN-FILE-BYTES"):
        assert secret.casefold() not in sent.casefold() and secret.casefold() not in log.casefold()
    assert log.count("NOT ANSWERED (refused)") == 3, log
    assert log.count("never reads it for a model") == 3, log
    for path in (cfg_dir / "service.env", tmp_path / ".claude.json"):
        sent_attach = cli_here(env, "send", cid, "look", "--attach", str(path), check=False)
        assert sent_attach.returncode != 0
        assert "never reads it for a model or attaches it" in sent_attach.stderr
    assert not list(conv.inbox.iterdir())
