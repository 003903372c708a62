"""``contemplation doctor`` on slot files, per llama-server provider: whether the server keeps
them (``--slot-save-path``: conversations warm across restarts), whether the provider names
that folder (``slot_save_path``: the files of conversations that are gone are removed from
it), and when either is missing, the one line that fixes it. Real llama-server (SmolLM2),
with and without ``--slot-save-path``; doctor in-process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contemplation.store.layout import Home
from tests import realpeers
from tests.conftest import base_env, cli_here

KEY = "providers.box.slot_save_path"


def _doctor(home: Home, url: str, slot_save_path: str | None) -> list[dict[str, Any]]:
    """doctor --json with one provider ``box`` at ``url``: its ``slot files`` rows."""
    lines = [
        'default_backend = "box"',
        'default_model = "smollm2"',
        "[providers.box]",
        'kind = "openai"',
        f'url = "{url}"',
        'api_key = "none"',
    ]
    if slot_save_path is not None:
        lines.append(f"slot_save_path = {json.dumps(slot_save_path)}")
    config = home.root.parent / "config.toml"
    config.write_text("\n".join(lines) + "\n")
    env = base_env(home, CONTEMPLATION_CONFIG=str(config))
    got = cli_here(env, "doctor", "--json", check=False)
    rows = json.loads(got.stdout)["checks"]
    return [r for r in rows if r["check"] == "slot files"]


@pytest.fixture(scope="module")
def keeping() -> realpeers.LlamaServer:
    """A server started with ``--slot-save-path`` (its folder: ``<dir>/slots``)."""
    return realpeers.shared_llama_server(n_ctx=2048, slot_save=True)


@pytest.mark.real
def test_a_server_without_slot_files_is_told_both_halves_of_the_fix(home: Home) -> None:
    plain = realpeers.shared_llama_server(n_ctx=4096)  # llama-server's default: no files
    [row] = _doctor(home, plain.url, None)
    assert row["ok"] and row.get("warn"), row
    assert row["detail"].startswith("off for box:"), row
    [fix] = row["detail"].split("hint: ")[1:]
    assert "--slot-save-path DIR" in fix and f'{KEY} = "DIR"' in fix and "\n" not in fix, fix


@pytest.mark.real
def test_a_server_without_slot_files_and_a_slot_save_path_says_they_disagree(
    home: Home, tmp_path: Path
) -> None:
    plain = realpeers.shared_llama_server(n_ctx=4096)
    [row] = _doctor(home, plain.url, str(tmp_path))
    assert row.get("warn") and f"{KEY} is set" in row["detail"], row


@pytest.mark.real
def test_slot_files_kept_but_not_named_say_how_to_have_them_removed(
    home: Home, keeping: realpeers.LlamaServer
) -> None:
    [row] = _doctor(home, keeping.url, None)
    assert row["ok"] and row.get("warn"), row
    assert row["detail"].startswith("kept by box"), row
    assert "only written over" in row["detail"], row
    [fix] = row["detail"].split("hint: ")[1:]
    assert f"set {KEY} = " in fix and "--slot-save-path" in fix and "\n" not in fix, fix


@pytest.mark.real
def test_slot_files_kept_in_the_folder_named_say_so_and_nothing_to_fix(
    home: Home, keeping: realpeers.LlamaServer
) -> None:
    folder = keeping.dir / "slots"
    [row] = _doctor(home, keeping.url, str(folder))
    assert row["ok"] and not row.get("warn"), row
    assert row["detail"].startswith("kept by box") and str(folder) in row["detail"], row
    assert "hint:" not in row["detail"], row


@pytest.mark.real
def test_a_slot_save_path_that_is_not_the_servers_folder_is_found_out(
    home: Home, keeping: realpeers.LlamaServer, tmp_path: Path
) -> None:
    """The server's save of an idle slot (doctor's own question) is looked for in the folder
    named: a folder where it did not land is not the server's."""
    elsewhere = tmp_path / "not-the-servers"
    elsewhere.mkdir()
    [row] = _doctor(home, keeping.url, str(elsewhere))
    assert row.get("warn") and f"not in {elsewhere}" in row["detail"], row
    [fix] = row["detail"].split("hint: ")[1:]
    assert KEY in fix and "--slot-save-path" in fix, fix
    [relative] = _doctor(home, keeping.url, "slots")
    assert relative.get("warn") and "not an absolute folder" in relative["detail"], relative
