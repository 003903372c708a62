"""A conversation as a Markdown or JSON document (every segment, thinking included in JSON)."""

from __future__ import annotations

import json
from typing import Any

from contemplation.faces.reading import blocks_since
from contemplation.store.layout import Conv, read_metadata, read_state


def as_data(conv: Conv) -> dict[str, Any]:
    meta = read_metadata(conv)
    state = read_state(conv)
    got = blocks_since(conv, 0, agent_label=meta.agent_label if meta else "CLAUDE", thinking=True)
    return {
        "id": conv.id,
        "archived": conv.is_completed,
        "metadata": meta.model_dump(mode="json") if meta else None,
        "state": state.model_dump(mode="json", exclude={"done_ids", "intent"}) if state else None,
        "blocks": got.blocks,
    }


def as_json(conv: Conv) -> str:
    return json.dumps(as_data(conv), indent=2, ensure_ascii=False) + "\n"


def _models(meta: dict[str, Any]) -> str:
    """``backend/model``, or each seat of a panel with its label."""
    seats = [*meta.get("panel", []), *([meta["synthesize"]] if meta.get("synthesize") else [])]
    if not seats:
        return f"{meta.get('backend', '')}/{meta.get('model', '')}"
    backend = meta.get("backend", "")
    return ", ".join(f"{s['label']} ({s.get('backend') or backend}/{s['model']})" for s in seats)


def as_markdown(conv: Conv) -> str:
    data = as_data(conv)
    meta = data["metadata"] or {}
    state = data["state"] or {}
    lines = [f"# {meta.get('topic') or conv.id}", ""]
    for key, value in (
        ("id", conv.id),
        ("model", _models(meta)),
        ("created", meta.get("created", "")),
        ("status", state.get("status", "")),
        ("turns", state.get("turns", 0)),
    ):
        lines.append(f"- **{key}**: {value}")
    lines.append("")
    for b in data["blocks"]:
        if b.get("kind") == "marker":
            lines += [f"*{b['marker']}: {b['text']}*", ""]
            continue
        lines += [f"## {b['from']} → {b['to']} · {b['time']}", "", b["text"], ""]
        for kind, text in b.get("markers", []):
            lines += [f"*{kind}{': ' + text if text else ''}*", ""]
    return "\n".join(lines).rstrip("\n") + "\n"
