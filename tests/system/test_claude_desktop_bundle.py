"""The Claude Desktop bundle: ``contemplation install claude-desktop --bundle PATH`` writes an
``.mcpb`` that the real ``mcpb`` of ``@anthropic-ai/mcpb`` 2.1.2 reads, validates against its
own manifest schema and packs again; the server it starts answers ``initialize`` far under
Desktop's 60 s."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests import peers
from tests.conftest import ROOT

INITIALIZE_BUDGET_S = 10.0  # Desktop gives up at 60 s


def _mcpb(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        [str(peers.node_bin("mcpb")), *args],
        cwd=cwd,
        env={"HOME": str(cwd), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def _first_start(manifest: dict[str, object], root: Path, home: Path) -> float:
    """Seconds from starting the bundle's server to its answer to ``initialize``."""
    config = manifest["server"]["mcp_config"]  # type: ignore[index]
    cmd = [config["command"], *(a.replace("${__dirname}", str(root)) for a in config["args"])]
    request = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "claude-ai", "version": "0.1.0"},
        },
    }
    start = time.monotonic()
    with subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())
        took = time.monotonic() - start
        proc.stdin.close()
        proc.wait(timeout=30)
    assert answer["id"] == 1 and answer["result"]["serverInfo"]["name"], answer
    return took


def test_the_bundle_passes_the_real_mcpb_and_starts_far_under_a_minute(tmp_path: Path) -> None:
    home = tmp_path / "conversations"
    bundle = tmp_path / "out" / "contemplation.mcpb"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "contemplation", "--home", str(home)),
            *("install", "claude-desktop", "--bundle", str(bundle)),
        ],
        cwd=ROOT,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {bundle}\n")
    info = _mcpb("info", str(bundle), cwd=tmp_path)
    assert "contemplation" in info
    _mcpb("unpack", str(bundle), str(tmp_path / "unpacked"), cwd=tmp_path)
    checked = _mcpb("validate", str(tmp_path / "unpacked" / "manifest.json"), cwd=tmp_path)
    assert "Manifest schema validation passes!" in checked, checked
    packed = _mcpb("pack", str(tmp_path / "unpacked"), str(tmp_path / "again.mcpb"), cwd=tmp_path)
    assert (tmp_path / "again.mcpb").stat().st_size > 0, packed
    manifest = json.loads((tmp_path / "unpacked" / "manifest.json").read_text())
    assert manifest["server"]["mcp_config"]["command"] == sys.executable
    assert manifest["server"]["mcp_config"]["args"][:1] == ["-P"]  # safe-path: see base/child.py
    assert manifest["server"]["mcp_config"]["args"][2:] == ["--home", str(home)]
    took = _first_start(manifest, tmp_path / "unpacked", tmp_path)
    print(f"first start to initialize: {took:.2f} s")
    assert took < INITIALIZE_BUDGET_S
