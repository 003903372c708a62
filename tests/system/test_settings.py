"""Settings layers, OLLAMA_HOST forms, and clear errors for bad config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from contemplation import backends
from contemplation import settings as S
from contemplation.backends import providers
from contemplation.backends.ollama import parse_ollama_host
from contemplation.errors import ConfigError
from contemplation.store.layout import Home
from tests.conftest import base_env, cli_here


def own(s: S.Settings, name: str) -> Any:
    """A provider's own settings, as its kind's model reads them."""
    return backends.config(s, name)[1]


def checked(**kw: Any) -> S.Settings:
    """Settings loaded and every section's table checked by its kind (as start and doctor do)."""
    s = S.load(**kw)
    for name in providers.SECTIONS:
        backends.config(s, name)
    return s


def test_file_then_env_then_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('default_model = "from-file"\nrescan_interval = 9\n[ollama]\nnum_ctx = 4096\n')
    s = S.load(
        config=cfg,
        env={"CONTEMPLATION_DEFAULT_MODEL": "from-env", "CONTEMPLATION_OLLAMA__NUM_CTX": "16384"},
        overrides={"default_model": "from-flag"},
        home=tmp_path / "h",
    )
    assert s.default_model == "from-flag"
    assert own(s, "ollama").num_ctx == 16384
    assert s.rescan_interval == 9
    assert s.home == (tmp_path / "h").absolute()


def test_home_precedence(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'home = "{tmp_path / "file-home"}"\n')
    assert S.load(config=cfg, env={}).home == tmp_path / "file-home"
    assert (
        S.load(config=cfg, env={"CONTEMPLATION_HOME": str(tmp_path / "env-home")}).home
        == tmp_path / "env-home"
    )
    assert (
        S.load(
            config=cfg, env={"CONTEMPLATION_HOME": str(tmp_path / "e")}, home=tmp_path / "flag"
        ).home
        == tmp_path / "flag"
    )


@pytest.mark.parametrize(
    ("value", "url", "auth"),
    [
        (None, "http://127.0.0.1:11434", None),
        (":56789", "http://127.0.0.1:56789", None),
        ("example.com", "http://example.com:11434", None),
        ("https://example.com", "https://example.com:443", None),
        ("0.0.0.0", "http://127.0.0.1:11434", None),
        ("alice:s3cret@gpu.local:11434", "http://gpu.local:11434", ("alice", "s3cret")),
        ("http://h:1/prefix/", "http://h:1/prefix", None),
    ],
)
def test_ollama_host_forms(value: str | None, url: str, auth: tuple[str, str] | None) -> None:
    assert parse_ollama_host(value) == (url, auth)


def test_ollama_host_env_reaches_settings() -> None:
    s = S.load(env={"OLLAMA_HOST": "box:7000"}, config=None)
    assert parse_ollama_host(own(s, "ollama").host) == ("http://box:7000", None)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[ollama]\nnum_ctx = 'big'\n", "ollama.num_ctx"),
        ("rescan_interval = -1\n", "rescan_interval"),
        ("no_such_key = 1\n", "no_such_key"),
        ("this is not toml", "cannot parse"),
    ],
)
def test_invalid_config_names_key_and_file(tmp_path: Path, text: str, needle: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        checked(config=cfg, env={})
    assert needle in str(info.value) and str(cfg) in str(info.value)


def test_bad_env_value_is_named() -> None:
    with pytest.raises(ConfigError, match="settle_seconds"):
        S.load(env={"CONTEMPLATION_SETTLE_SECONDS": "soon"}, config=None)


def test_cli_bad_config_is_one_line_and_nonzero(tmp_path: Path, home: Home) -> None:
    """A bad value of the settings' own is refused by every command; a provider's table
    (here [ollama]) is its kind's to check, where it is used: start, reload, doctor, models."""
    cfg = tmp_path / "bad.toml"
    cfg.write_text("rescan_interval = 'soon'\n")
    proc = cli_here(base_env(home), "--config", str(cfg), "list", check=False)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "rescan_interval" in proc.stderr and str(cfg) in proc.stderr

    cfg.write_text("[ollama]\nnum_ctx = 'big'\n")
    proc = cli_here(base_env(home), "--config", str(cfg), "doctor", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("FAIL config") and "ollama.num_ctx" in first and str(cfg) in first


# ---------------------------------------------------------------- the sources (pydantic-settings)


def test_nested_env_two_levels_deep() -> None:
    s = S.load(env={"CONTEMPLATION_OLLAMA__TIMEOUTS__TOTAL": "5"}, config=None)
    assert own(s, "ollama").timeouts.total == 5
    assert own(s, "ollama").timeouts.idle == S.TimeoutSettings().idle  # the rest of the table: defaults
    assert own(s, "openai").timeouts.total == S.TimeoutSettings().total  # other sections untouched
    assert s.source("ollama.timeouts.total") == (
        "the environment (CONTEMPLATION_OLLAMA__TIMEOUTS__TOTAL)"
    )
    assert s.source("ollama.timeouts.idle") == "the defaults"


def test_env_merges_with_the_file_key_by_key(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[ollama]\nkeep_alive = "1h"\nnum_ctx = 4096\n[ollama.timeouts]\nidle = 7\n')
    s = S.load(
        config=cfg,
        env={
            "CONTEMPLATION_OLLAMA__NUM_CTX": "16384",
            "CONTEMPLATION_OLLAMA__TIMEOUTS__TOTAL": "5",
        },
    )
    assert (own(s, "ollama").keep_alive, own(s, "ollama").num_ctx) == ("1h", 16384)
    assert (own(s, "ollama").timeouts.idle, own(s, "ollama").timeouts.total) == (7, 5)
    assert s.source("ollama.keep_alive") == str(cfg)
    assert s.source("ollama.timeouts.idle") == str(cfg)
    assert s.source("ollama.num_ctx") == "the environment (CONTEMPLATION_OLLAMA__NUM_CTX)"


def test_env_tables_and_lists_as_json_or_plain() -> None:
    s = S.load(
        env={
            "CONTEMPLATION_OLLAMA": '{"num_ctx": 1024}',
            "CONTEMPLATION_TOOLS__DENY": '["*.key", "*.pem"]',
            "CONTEMPLATION_FALLBACK": "ollama, local",  # documented: comma-separated
            "CONTEMPLATION_TOOLS__ALLOWED_ROOTS": "/a:/b",  # os.pathsep-separated
        },
        config=None,
    )
    assert own(s, "ollama").num_ctx == 1024
    assert s.source("ollama.num_ctx") == "the environment (CONTEMPLATION_OLLAMA)"
    assert s.tools.deny == ["*.key", "*.pem"]
    assert s.fallback == ["ollama", "local"]
    assert s.tools.allowed_roots == [Path("/a"), Path("/b")]


@pytest.mark.parametrize(("variable", "path"), list(S.SERVER_ENV.items()))
def test_server_variable_precedence(tmp_path: Path, variable: str, path: tuple[str, str]) -> None:
    """A server's own variable fills its key; CONTEMPLATION_* and the file both win over it."""
    section, key = path
    prefixed = f"CONTEMPLATION_{section.upper()}__{key.upper()}"

    def value(s: S.Settings) -> str:
        return str(getattr(s, section)[key])

    s = S.load(env={variable: "http://server-var:1"}, config=None)
    assert value(s) == "http://server-var:1"
    assert s.source(f"{section}.{key}") == f"the environment ({variable})"

    both = {variable: "http://server-var:1", prefixed: "http://prefixed:2"}
    s = S.load(env=both, config=None)
    assert value(s) == "http://prefixed:2"
    assert s.source(f"{section}.{key}") == f"the environment ({prefixed})"

    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[{section}]\n{key} = "http://file:3"\n')
    s = S.load(env={variable: "http://server-var:1"}, config=cfg)
    assert value(s) == "http://file:3"
    assert s.source(f"{section}.{key}") == str(cfg)

    s = S.load(env=both, config=cfg)
    assert value(s) == "http://prefixed:2"


def test_empty_server_variable_is_unset() -> None:
    s = S.load(env={"OLLAMA_HOST": "", "OPENAI_API_KEY": ""}, config=None)
    assert (own(s, "ollama").host, own(s, "openai").api_key) == ("", "")
    assert s.source("ollama.host") == "the defaults"


@pytest.mark.parametrize(
    ("source", "key", "where"),
    [
        ("file", "ollama.num_ctx", "{cfg}"),
        ("file", "ollama.timeouts.total", "{cfg}"),
        ("env", "ollama.num_ctx", "the environment (CONTEMPLATION_OLLAMA__NUM_CTX)"),
        ("env", "ollama.timeouts.total", "the environment (CONTEMPLATION_OLLAMA__TIMEOUTS__TOTAL)"),
        ("env", "settle_seconds", "the environment (CONTEMPLATION_SETTLE_SECONDS)"),
        ("server", "ollama.host", "the environment (OLLAMA_HOST)"),
        ("server", "openai.base_url", "the environment (OPENAI_BASE_URL)"),
        ("server", "opencode.url", "the environment (OPENCODE_SERVER_URL)"),
        ("flag", "settle_seconds", "the command line (--settle-seconds)"),
        ("flag", "retry.base", "the command line (--retry)"),
    ],
)
def test_bad_value_in_each_source_is_one_line_naming_it(
    tmp_path: Path, source: str, key: str, where: str
) -> None:
    bad = {
        "ollama.num_ctx": "'big'",
        "ollama.timeouts.total": "-1",
        "settle_seconds": "'soon'",
        "retry.base": "-1",
        "ollama.host": "'ftp://x'",
        "openai.base_url": "'nope'",
        "opencode.url": "'http://h:99999'",
    }[key]
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    env: dict[str, str] = {}
    overrides: dict[str, object] = {}
    *sections, last = key.split(".")
    if source == "file":
        cfg.write_text(f"[{'.'.join(sections)}]\n{last} = {bad}\n")
    elif source == "env":
        env["CONTEMPLATION_" + "__".join(key.split(".")).upper()] = bad.strip("'")
    elif source == "server":
        variable = {path: name for name, path in S.SERVER_ENV.items()}[(sections[0], last)]
        env[variable] = bad.strip("'")
    else:
        value: object = float(bad) if bad[0] != "'" else bad.strip("'")
        top, *rest = key.split(".")
        for part in reversed(rest):
            value = {part: value}
        overrides[top] = value
    with pytest.raises(ConfigError) as info:
        checked(config=cfg, env=env, overrides=overrides)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"invalid setting {key} in {where.format(cfg=cfg)}: "), message


@pytest.mark.parametrize(
    ("text", "key"),
    [("no_such_key = 1\n", "no_such_key"), ("[ollama]\nno_such = 1\n", "ollama.no_such")],
)
def test_unknown_key_in_the_file_is_refused(tmp_path: Path, text: str, key: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        checked(config=cfg, env={})
    assert str(info.value) == (
        f"invalid setting {key} in {cfg}: Extra inputs are not permitted (got 1)"
    )


def test_unknown_variables() -> None:
    """A stray top-level CONTEMPLATION_* (e.g. the CONTEMPLATION_EVENT a notification command
    gets) is not a setting and is ignored; an unknown key inside a section is refused."""
    s = S.load(env={"CONTEMPLATION_EVENT": "reply", "CONTEMPLATION_TESTING": "1"}, config=None)
    assert s.default_model == S.Settings().default_model
    with pytest.raises(
        ConfigError, match=r"ollama\.nope in the environment \(CONTEMPLATION_OLLAMA__NOPE\)"
    ):
        checked(env={"CONTEMPLATION_OLLAMA__NOPE": "1"}, config=None)


def test_explicit_env_mapping_never_reads_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONTEMPLATION_DEFAULT_MODEL", "from-process")
    monkeypatch.setenv("OLLAMA_HOST", "process:1")
    s = S.load(env={}, config=None)
    assert s.default_model == S.Settings.model_fields["default_model"].default
    assert own(s, "ollama").host == ""
    assert S.Settings().default_model != "from-process"  # made in code: arguments and defaults
    s = S.load(config=None)  # no mapping: the process environment
    assert (s.default_model, own(s, "ollama").host) == ("from-process", "process:1")
    assert s.source("default_model") == "the environment (CONTEMPLATION_DEFAULT_MODEL)"


def test_config_file_remembers_where_it_was_named(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    s = S.load(env={"CONTEMPLATION_CONFIG": str(cfg)})
    assert s.config_file == cfg
    assert s.source("config_file") == "the environment (CONTEMPLATION_CONFIG)"
    assert S.load(config=cfg, env={}).source("config_file") == "the command line (--config)"
    with pytest.raises(ConfigError, match="does not exist"):
        S.load(env={"CONTEMPLATION_CONFIG": str(tmp_path / "missing.toml")})
