"""Write contemplation/faces/mcp/manifest.json: the stdio MCP server's early answers, captured
from the SDK server itself (see contemplation/faces/mcp/front.py). Run it after changing a
tool, the instructions or the MCP SDK's version; tests/system/test_mcp_front.py fails until
the file matches.

    .venv/bin/python scripts/mcp_manifest.py
"""

from __future__ import annotations

import json
from pathlib import Path

from contemplation.faces.mcp.front import MANIFEST
from contemplation.faces.mcp.manifest import capture


def main() -> None:
    text = json.dumps(capture(), indent=1, sort_keys=True) + "\n"
    Path(MANIFEST).write_text(text, encoding="utf-8")
    print(f"wrote {MANIFEST} ({len(text):,} bytes)")


if __name__ == "__main__":
    main()
