"""The read commands' settings (contemplation.faces.cli.light) and the settings model agree:
the same home by the same precedence, the same values, and no value the model refuses is
ever used (a verdict is recorded only by a load the model accepted, for exactly its inputs)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from contemplation import settings as S
from contemplation.errors import ConfigError
from contemplation.faces.cli import light

ROOT = Path(__file__).resolve().parents[3]
APP = "contemplation"


def _both(
    monkeypatch: pytest.MonkeyPatch,
    cwd: Path,
    env: dict[str, str],
    *,
    config: Path | None = None,
    home: Path | None = None,
    overrides: dict[str, object] | None = None,
) -> tuple[light.Light, light.Light | None]:
    """What the model makes of these inputs, and what the light path makes of them once the
    model's verdict is recorded."""
    monkeypatch.chdir(cwd)
    given = {"config": config, "home": home, "overrides": overrides or {}, "env": env}
    assert light.load(**given) is None  # nothing recorded yet: the model is loaded
    model = S.load(**given)  # type: ignore[arg-type]
    light.remember(model, **given)  # type: ignore[arg-type]
    return light.of(model), light.load(**given)


def test_the_constants_are_the_settings_own() -> None:
    assert (light.APP, light.ENV_PREFIX) == (S.APP, S.ENV_PREFIX)
    assert light.default_config_path() == S.default_config_path()
    assert set(S.SERVER_ENV) == light.SERVER_NAMES


@pytest.mark.parametrize(
    "case",
    ["defaults", "flag", "variable", "file", "flag over all", "variable over file", "relative",
     "tilde", "values", "embedding server"],
)  # fmt: skip
def test_same_home_and_values_as_the_model(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        'home = "/from/file"\nlog_level = "error"\nsearch_seconds = 3\n'
        '[aliases.coder]\nmodel = "qwen"\nproviders = ["ollama"]\n'
    )
    env: dict[str, str] = {}
    config: Path | None = None
    home: Path | None = None
    overrides: dict[str, object] = {}
    if case == "flag":
        home = Path("/from/flag")
    elif case == "variable":
        env["CONTEMPLATION_HOME"] = "/from/env"
    elif case == "file":
        config = cfg
    elif case == "flag over all":
        config, home, env["CONTEMPLATION_HOME"] = cfg, Path("/from/flag"), "/from/env"
    elif case == "variable over file":
        env["CONTEMPLATION_CONFIG"], env["CONTEMPLATION_HOME"] = str(cfg), "/from/env"
    elif case == "relative":
        home = Path("here/home")
    elif case == "tilde":
        env["CONTEMPLATION_HOME"] = "~/convs"
    elif case == "values":
        config = cfg
        env["CONTEMPLATION_LOG_FORMAT"] = "json"
        overrides["log_level"] = "debug"
    elif case == "embedding server":  # the file's section, one key of it from a variable
        cfg.write_text('[semantic]\nembed_url = " http://127.0.0.1:11434 "\nembed_model = "x"\n')
        config = cfg
        env["CONTEMPLATION_SEMANTIC__EMBED_MODEL"] = " nomic-embed-text "
        env["CONTEMPLATION_SEMANTIC__EMBED_TIMEOUT"] = "5"
    model, cheap = _both(monkeypatch, tmp_path, env, config=config, home=home, overrides=overrides)
    assert cheap == model
    if case == "values":
        assert (cheap.log_format, cheap.log_level, cheap.search_seconds) == ("json", "debug", 3)
        assert cheap.aliases == {"coder"}
    if case == "embedding server":
        assert cheap.embed == ("http://127.0.0.1:11434", "nomic-embed-text", "ollama", 5.0)
    else:
        assert cheap.embed == ("", "", "ollama", 30.0)  # the offline model


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ('embed_url = "http://127.0.0.1:11434"', "embed_url and embed_model go together"),
        ('embed_model = "nomic-embed-text"', "embed_url and embed_model go together"),
        ('embed_url = "ftp://x"\nembed_model = "m"', "semantic.embed_url"),
        ('embed_url = "http://h:1"\nembed_model = "m"\nembed_api = "cohere"', "'ollama' or"),
        ('embed_url = "http://h:1"\nembed_model = "m"\nembed_timeout = 0', "embed_timeout"),
        ('embed_url = "http://h:1"\nembed_modle = "m"', "embed_modle"),
    ],
)
def test_a_bad_embedding_server_setting_is_one_line_naming_it(
    table: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused by the model, so never recorded for the light path either."""
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"[semantic]\n{table}\n")
    with pytest.raises(ConfigError, match=says) as got:
        S.load(config=cfg, env={})
    assert str(cfg) in str(got.value) and "\n" not in str(got.value)
    assert light.load(config=cfg, env={}) is None


def test_a_relative_home_is_resolved_in_each_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verdict holds whatever the folder; the home is made absolute where the command
    runs, as the model makes it."""
    env = {"CONTEMPLATION_HOME": "rel"}
    _both(monkeypatch, tmp_path, env)
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    cheap = light.load(env=env)
    assert cheap is not None and cheap.home == S.load(env=env).home == other / "rel"


def test_changed_inputs_load_the_model_again_and_a_bad_value_is_never_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text("rescan_interval = 2\n")
    env = {"CONTEMPLATION_CONFIG": str(cfg)}
    _, cheap = _both(monkeypatch, tmp_path, env)
    assert cheap is not None
    assert light.load(env={**env, "CONTEMPLATION_LOG_LEVEL": "debug"}) is None  # a new input
    assert light.load(env={**env, "OLLAMA_HOST": "http://box:11434"}) is None  # a server's
    cfg.write_text("rescan_interval = 'soon'\n")  # a value the model refuses
    assert light.load(env=env) is None
    with pytest.raises(ConfigError, match="rescan_interval"):
        S.load(env=env)
    cfg.write_text("not toml [\n")
    assert light.load(env=env) is None  # the model names the file and the error
    cfg.unlink()
    assert light.load(env=env) is None  # a named file missing: the model says so


def test_the_verdicts_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for n in range(light.KEPT + 5):
        env = {"CONTEMPLATION_HOME": f"/h{n}"}
        light.remember(S.load(env=env), env=env)
    assert light.load(env={"CONTEMPLATION_HOME": "/h0"}) is None  # the oldest went first
    assert light.load(env={"CONTEMPLATION_HOME": f"/h{light.KEPT + 4}"}) is not None
    kept = light.verdicts_path().read_text()
    assert kept.count('"log_format"') == light.KEPT


def test_every_module_the_settings_import_is_a_checker() -> None:
    """A change to the code that checks the settings is a new verdict: the stamp names each
    module settings.py imports from the package."""
    pkg = ROOT / "contemplation"
    files = set()
    for node in ast.walk(ast.parse((pkg / "settings.py").read_text())):
        if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(APP):
            continue
        where = Path(*str(node.module).split(".")[1:])
        for alias in node.names:  # a module of a package, or a name of a module
            sub = where / f"{alias.name}.py"
            files.add(str(sub if (pkg / sub).is_file() else where.with_suffix(".py")))
    assert files <= set(light.CHECKERS)
