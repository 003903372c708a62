"""Writing the Claude Code plugin and the Desktop bundle (``contemplation.faces.claude``), in
process; the real ``claude`` and ``mcpb`` read them in tests/system."""

from __future__ import annotations

import glob
import json
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from contemplation.errors import ContemplationError
from contemplation.faces import claude
from tests.conftest import ROOT

PKG = ROOT / "contemplation"


def test_package_data_ships_every_file_of_the_plugin() -> None:
    """setuptools globs package-data as ``glob(recursive=True)`` does: a dotfile is only shipped
    when a pattern names it, so a file added to the plugin and missed here is caught."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["contemplation"]
    shipped = {Path(f) for p in patterns for f in glob.glob(str(PKG / p), recursive=True)}
    files = {
        f for f in (PKG / "faces" / "claude_code").rglob("*") if f.is_file() and "__" not in f.name
    }
    assert files and files <= shipped, files - shipped


def test_the_plugin_points_at_this_python_and_the_hook_is_opt_in(tmp_path: Path) -> None:
    cmd = claude.server_command(home=tmp_path / "h")
    assert cmd == [sys.executable, "-P", "-m", "contemplation", "--home", str(tmp_path / "h"), "mcp"]
    plugin = claude.write_plugin(tmp_path / "m", cmd)
    mcp = json.loads((plugin / ".mcp.json").read_text())["mcpServers"]["contemplation"]
    assert [mcp["command"], *mcp["args"]] == cmd
    assert (plugin / "skills" / "local-model-dialogue" / "SKILL.md").is_file()
    assert not (plugin / "hooks").exists() and not (plugin / claude.HOOK_DATA).exists()
    market = json.loads((tmp_path / "m" / ".claude-plugin" / "marketplace.json").read_text())
    assert market["plugins"][0]["source"] == "./contemplation"
    claude.write_plugin(tmp_path / "m", cmd, with_hook=True)
    assert (plugin / "hooks" / "hooks.json").is_file()
    claude.write_plugin(tmp_path / "m", cmd)
    assert not (plugin / "hooks").exists()


def test_a_folder_that_is_not_the_plugin_is_never_replaced(tmp_path: Path) -> None:
    (tmp_path / "contemplation").mkdir()
    (tmp_path / "contemplation" / "mine.txt").write_text("keep")
    with pytest.raises(ContemplationError, match="not this plugin"):
        claude.write_plugin(tmp_path, ["python"])
    assert (tmp_path / "contemplation" / "mine.txt").read_text() == "keep"


def test_the_default_folder_is_beside_the_home_never_in_it() -> None:
    assert claude.default_dir({"HOME": "/h"}) == Path("/h/.local/share/contemplation-claude")
    assert claude.default_dir({"XDG_DATA_HOME": "/x"}) == Path("/x/contemplation-claude")


def test_the_bundle_is_a_zip_with_the_manifest_at_its_root(tmp_path: Path) -> None:
    path = claude.write_bundle(tmp_path / "b.mcpb", config=tmp_path / "c.toml")
    with zipfile.ZipFile(path) as z:
        assert sorted(z.namelist()) == ["manifest.json", "server/main.py"]
        manifest = json.loads(z.read("manifest.json"))
    assert manifest["server"]["entry_point"] == "server/main.py"
    assert manifest["server"]["mcp_config"]["args"] == [
        "-P",
        "${__dirname}/server/main.py",
        "--config",
        str(tmp_path / "c.toml"),
    ]
    assert not (tmp_path / "b.mcpb.part").exists()


def test_without_claude_the_plugin_is_written_and_the_command_to_run_is_said(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from contemplation.faces.cli.root import main

    for extra in ([], ["--claude", str(tmp_path / "no-claude")]):
        done = CliRunner(env={"PATH": str(tmp_path)}).invoke(
            main, ["install", "claude-code", "--dir", str(tmp_path / "m"), *extra]
        )
        assert done.exit_code == 1, done.output
        assert "plugin install contemplation --marketplace" in done.output
        assert (tmp_path / "m" / "contemplation" / ".mcp.json").is_file()
