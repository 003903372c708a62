"""Human output of the CLI: labelled lines and aligned tables, as ``ollama ps`` and
``systemctl status`` print them (``--json`` prints the data itself)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from contemplation.models import State, Status
from contemplation.terminal import safe

ADVICE = {
    Status.ERROR: "send a message to try again, or `contemplation doctor` to check the backend",
    Status.AWAITING_AGENT: "answer with `contemplation respond {id} TEXT`",
    Status.RETRYING: "it retries by itself; `contemplation cancel {id}` stops it",
}


def ago(epoch: float | None, now: float | None = None) -> str:
    """``3 s ago``, ``5 min ago``, ``2 h ago``, ``4 d ago``."""
    if epoch is None:
        return "never"
    s = max(0.0, (now or time.time()) - epoch)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.0f} {unit} ago"
    return f"{s:.0f} s ago"


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """Columns aligned to their widest cell, a header row first."""
    cells = [list(header), *([str(c) for c in r] for r in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return safe("\n".join(lines))


def conversation(summary: dict[str, Any], state: State | None, log_mtime: float | None) -> str:
    """``contemplation status CONV``: one labelled line per fact, the error as a sentence."""
    lines = [
        (
            "conversation",
            summary["id"] + ("  (archived, in completed/)" if summary["completed"] else ""),
        ),
        ("topic", summary["topic"]),
        ("model", f"{summary['model']} on {summary['backend']}"),
        ("status", summary["status"]),
        ("activity", ago(log_mtime)),
        ("messages", f"{summary['messages']} from the agent, {summary['turns']} model turns"),
    ]
    if state is not None:
        if state.status is Status.GENERATING and state.generating_since is not None:
            lines.append(("generating", f"since {ago(state.generating_since)}"))
        if state.pending_needs:
            lines.append(("waiting for", "; ".join(state.pending_needs[:5])))
        turn = state.last_turn
        if turn is not None and turn.eval_count:
            rate = ""
            if turn.eval_duration_ms:
                rate = f", {turn.eval_count / (turn.eval_duration_ms / 1000):.1f} tok/s"
            prompt = f"{turn.prompt_eval_count} prompt + " if turn.prompt_eval_count else ""
            lines.append(("last turn", f"{prompt}{turn.eval_count} tokens{rate}"))
        if state.status is Status.RETRYING and state.next_retry_at:
            lines.append(("next try", f"in {max(0.0, state.next_retry_at - time.time()):.0f} s"))
        if state.last_error is not None and state.status in (Status.ERROR, Status.RETRYING):
            advice = ADVICE.get(state.status, "").format(id=summary["id"])
            lines.append(
                ("error", f"{state.last_error.message}" + (f" — {advice}" if advice else ""))
            )
        elif state.status is Status.AWAITING_AGENT:
            lines.append(("next", ADVICE[Status.AWAITING_AGENT].format(id=summary["id"])))
    width = max(len(k) for k, _ in lines)
    return safe("\n".join(f"{k + ':':<{width + 1}} {v}" for k, v in lines))
