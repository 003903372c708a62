"""The shell sessions the README and docs/getting-started.md show are what the code prints:
scripts/examples.py runs them again (a real daemon, the real CLI, the embedded SmolLM2 at
temperature 0 where a model answers, the scripted Ollama where it must write NEEDs on cue) and
each page's block must match, times, ids and speeds masked. The README's first hour had
drifted: a doctor output the code no longer printed, a unit-loop figure of months before."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests import peers
from tests.conftest import cli_here
from tests.scripts import script


def _script() -> ModuleType:
    return script("examples")


def test_masks_hide_what_changes_between_runs_and_nothing_else() -> None:
    ex = _script()
    one = "conv_20261129-045956_queues  2026-11-29 05:00:28  0.6 tok/s  3 s ago  7f8fa5d493e2"
    two = "conv_20261130-101010_queues  2026-11-30 10:10:10  88.9 tok/s  0 s ago  0123456789ab"
    assert ex.masked(one) == ex.masked(two)
    assert ex.masked("240 prompt + 25 tokens") != ex.masked("240 prompt + 26 tokens")


@pytest.mark.timeout(900)
def test_the_pages_show_what_the_commands_print_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    peers.xllamacpp_available()
    peers.smollm2_gguf()
    ex = _script()
    shown_run: Callable[..., str] = ex.Session.run

    def run(self: Any, *args: str, show: bool = True, note: str = "") -> str:
        """What the pages show, from real processes as ``--write`` makes it; the commands
        they do not show (the polls for the daemon, the ids the sessions read) in this
        process: a new interpreter costs ~0.65 s each, and a poll by one saw the daemon up
        that much late."""
        if show:
            return shown_run(self, *args, show=show, note=note)
        return cli_here(self.env, *args, check=False).stdout

    monkeypatch.setattr(ex.Session, "run", run)
    made = ex.capture()  # one run of each session, shared by every page
    bad = ex.differences(made, lambda p: p.read_text())
    assert bad == [], "\n".join([*bad, "run .venv/bin/python scripts/examples.py --write"])
    # a page that shows other output is caught
    changed = dict(made, readme=made["readme"].replace("idle", "busy", 1))
    assert ex.differences(changed, lambda p: p.read_text()) == [
        "README.md: the readme example differs from what the code prints"
    ]
