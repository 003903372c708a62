"""docs/reference/*.md are what scripts/reference.py makes of the code now: the CLI's commands
and options (click), the settings (the settings model), the MCP tools (the tool table) and the
exit codes. A reference typed by hand drifted: it missed commands (``approvals``, ``watch``)
and named modules that had moved; a page that disagrees with the code fails here."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

from tests.scripts import script

ROOT = Path(__file__).resolve().parent.parent.parent


def _script() -> ModuleType:
    return script("reference")


def test_each_reference_page_is_what_the_code_makes_now() -> None:
    ref = _script()
    for name, make in ref.PAGES.items():
        on_disk = (ROOT / "docs" / "reference" / name).read_text()
        assert on_disk == make(), (
            f"docs/reference/{name} is stale: run .venv/bin/python scripts/reference.py --write"
        )


def test_every_command_and_option_is_in_the_cli_page() -> None:
    import click

    from contemplation.faces.cli.root import main

    page = _script().cli_page()
    ctx = click.Context(main, info_name="contemplation")
    for name in main.list_commands(ctx):
        cmd = main.get_command(ctx, name)
        assert cmd is not None
        assert f"## contemplation {name}\n" in page
        for param in cmd.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("-") and not getattr(param, "hidden", False):
                    assert opt in page, (name, opt)
    for sub in ("approvals revoke", "watch", "search", "related"):
        assert f"## contemplation {sub}\n" in page


def test_every_setting_has_its_environment_name_default_and_a_meaning() -> None:
    ref = _script()
    page = ref.settings_page()
    rows = [line.split(" | ") for line in page.splitlines() if line.startswith("| `")]
    assert len(rows) > 60
    empty = [r[0] for r in rows if not r[-1].rstrip(" |").strip()]
    assert empty == [], f"settings with no meaning (describe the field): {empty}"
    keys = {r[0].strip("| `") for r in rows}
    unknown = [k for k in ref.MEANINGS if k not in keys and k.strip("[]") not in keys]
    assert unknown == [], f"MEANINGS names no setting: {unknown}"
    assert "| `tools.limits.parallel` | `CONTEMPLATION_TOOLS__LIMITS__PARALLEL` | `8` |" in page


def test_the_exit_codes_page_names_every_code_the_cli_has() -> None:
    from contemplation.base import exits

    page = _script().exit_codes_page()
    shown = {int(c) for c in re.findall(r"^\| (\d+) \|", page, re.M)}
    codes = {v for k, v in vars(exits).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert shown == codes | {2}  # 2 is click's own


def test_a_stale_page_is_caught(tmp_path: Path) -> None:
    ref = _script()
    ref.OUT = tmp_path  # type: ignore[attr-defined]
    for name, make in ref.PAGES.items():
        (tmp_path / name).write_text(make())
    assert ref.stale() == []
    page = tmp_path / "cli.md"
    page.write_text(page.read_text().replace("--json", "--jsn", 1))
    assert ref.stale() == ["cli.md"]
