"""Settings layers, OLLAMA_HOST forms, and clear errors for bad config."""

from __future__ import annotations

from pathlib import Path

import pytest

from contemplation import settings as S
from contemplation.errors import ConfigError
from contemplation.layout import Home
from tests.conftest import base_env, cli


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
    assert s.ollama.num_ctx == 16384
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
    assert S.parse_ollama_host(value) == (url, auth)


def test_ollama_host_env_reaches_settings() -> None:
    s = S.load(env={"OLLAMA_HOST": "box:7000"}, config=None)
    assert S.ollama_base(s) == ("http://box:7000", None)


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
        S.load(config=cfg, env={})
    assert needle in str(info.value) and str(cfg) in str(info.value)


def test_bad_env_value_is_named() -> None:
    with pytest.raises(ConfigError, match="settle_seconds"):
        S.load(env={"CONTEMPLATION_SETTLE_SECONDS": "soon"}, config=None)


def test_cli_bad_config_is_one_line_and_nonzero(tmp_path: Path, home: Home) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[ollama]\nnum_ctx = 'big'\n")
    proc = cli(base_env(home), "--config", str(cfg), "list", check=False)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "ollama.num_ctx" in proc.stderr and str(cfg) in proc.stderr
