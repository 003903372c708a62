"""Human output of the CLI: labelled lines and aligned tables, as ``ollama ps`` and
``systemctl status`` print them (``--json`` prints the data itself)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from contemplation.base.terminal import safe

if TYPE_CHECKING:  # the models load where a face waits for a reply, not to read a status
    from contemplation.models import State

ADVICE = {  # by Status value (a StrEnum member finds its entry)
    "error": "withdraw the failed turn with `contemplation retract {id}` and send again "
    "(`contemplation set-model {id} MODEL` for another model), or `contemplation doctor` to "
    "check the backend",
    "retrying": "it retries by itself; `contemplation cancel {id}` stops it",
}


MIN_RATED_MS = 1.0  # a shorter generation (an empty reply's) has no meaningful rate


def ago(epoch: float | None, now: float | None = None) -> str:
    """``3 s ago``, ``5 min ago``, ``2 h ago``, ``4 d ago``."""
    if epoch is None:
        return "never"
    s = max(0.0, (now or time.time()) - epoch)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.0f} {unit} ago"
    return f"{s:.0f} s ago"


def size(n: int) -> str:
    """``812 B``, ``4.2 KB``, ``1.3 GB`` (powers of 1000, as ``du --si`` prints)."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """Columns aligned to their widest cell, a header row first."""
    cells = [list(header), *([str(c) for c in r] for r in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return safe("\n".join(lines))


def seats(summary: dict[str, Any]) -> str:
    """A panel's seats as ``panel: LABEL (backend/model), …`` ("" without a panel): what
    ``list`` and ``status`` show for it (its top-level model is only its first seat's)."""
    if not summary.get("panel"):
        return ""
    return "panel: " + ", ".join(
        f"{s['label']} ({s.get('backend') or summary['backend']}/{s['model']})"
        for s in summary["panel"]
    )


def list_model(row: dict[str, Any]) -> str:
    """``list``'s MODEL cell: ``backend/model``, a panel's seats, or ``-`` (none named)."""
    if row.get("panel"):
        return seats(row)
    return f"{row['backend']}/{row['model']}" if row["model"] else "-"


def _model(summary: dict[str, Any]) -> str:
    if summary.get("panel"):  # a panel: every seat answers each message
        return seats(summary)
    alias = summary.get("alias")
    if not summary["model"]:  # a folder made by hand or imported: no metadata names one
        return "unknown (imported)"
    if not alias:
        return f"{summary['model']} on {summary['backend']}"
    where = " | ".join(alias["providers"])
    return f"{summary['model']} (alias: {alias['model']} on {where}, a free slot on any)"


def list_status(status: str, archived: bool) -> str:
    """The STATUS column of ``list``: an archived "pending" is a message nobody answers."""
    if not archived:
        return status
    return ("unanswered" if status == "pending" else status) + " (archived)"


def fork_origin(forked_from: Any) -> str:
    """``<id>#<block>`` for a fork's summary ``forked_from``; "" for any other conversation."""
    if not isinstance(forked_from, dict) or not forked_from.get("id"):
        return ""
    return f"{forked_from['id']}#{forked_from.get('block', 0)}"


def conversation(
    summary: dict[str, Any], state: Mapping[str, Any] | None, log_mtime: float | None
) -> str:
    """``contemplation status CONV``: one labelled line per fact, the error as a sentence.
    ``state``: state.json as the model dumps it (:func:`contemplation.store.plain.state`)."""
    from contemplation.protocol import ledger
    from contemplation.values import Status

    lines = [
        (
            "conversation",
            summary["id"] + ("  archived (in completed/)" if summary["completed"] else ""),
        ),
        ("topic", summary["topic"]),
        ("model", _model(summary)),
        ("status", summary["status"]),
        # without state.json (made by hand, imported) the log's last dated header, not
        # the time the folder was copied
        ("activity", ago(log_mtime if state is not None else summary["last_activity_ts"])),
        ("messages", f"{summary['messages']} from the agent, {summary['turns']} model turns"),
    ]
    origin = fork_origin(summary.get("forked_from"))
    if origin:
        lines.append(("forked from", origin.replace("#", " at block ")))
    if summary.get("problem"):  # a file of its folder cannot be read (see index_rows)
        lines.append(("problem", str(summary["problem"])))
    if state is not None:
        status = Status(state["status"])
        if status is Status.GENERATING and state["generating_since"] is not None:
            stale = summary.get("daemon_running") is False
            lines.append(
                (
                    "generating",
                    f"since {ago(state['generating_since'])}"
                    + (" — stale: no daemon is running; redone when one starts" if stale else ""),
                )
            )
        turn = state["last_turn"]
        if turn is not None and turn["eval_count"]:
            rate = ""
            evals, took = turn["eval_count"], turn["eval_duration_ms"]
            if evals > 1 and (took or 0) >= MIN_RATED_MS:
                rate = f", {evals / ((took or 1) / 1000):.1f} tok/s"
            prompt = f"{turn['prompt_eval_count']} prompt + " if turn["prompt_eval_count"] else ""
            lines.append(("last turn", f"{prompt}{evals} tokens{rate}"))
        if state["ledger"]["by"]:  # where every turn's tokens and time went (contemplation ledger)
            lines.append(("ledger", ledger.sums_line(ledger.total_of(state["ledger"]))))
        if status is Status.RETRYING and state["next_retry_at"]:
            lines.append(("next try", f"in {max(0.0, state['next_retry_at'] - time.time()):.0f} s"))
        error = state["last_error"]
        if error is not None and status in (Status.ERROR, Status.RETRYING):
            advice = ADVICE.get(status, "").format(id=summary["id"])
            if summary.get("panel"):  # a panel's model is its seats': one is moved at a time
                advice = advice.replace(" MODEL`", " MODEL --seat LABEL`")
            if "contemplation retract" in error["message"]:
                advice = ""  # the error says how to go on already
            lines.append(("error", f"{error['message']}" + (f" — {advice}" if advice else "")))
    width = max(len(k) for k, _ in lines)
    return safe("\n".join(f"{k + ':':<{width + 1}} {v}" for k, v in lines))


def responded(done: dict[str, Any]) -> str:
    """``contemplation respond``: what was answered or queued, and what still waits."""
    from contemplation.store import waiting

    if done.get("answered") is None:
        return f"queued as a message ({done['queued']}): the model was not waiting for a need"
    lines = [f"answered need {done['need_id']}: {done['answered']}"]
    lines.extend(waiting.still(done.get("still_waiting") or []))
    return safe("\n".join(lines))


def still_running(conv_id: str, state: State | None, *, waited: float, now: str) -> str:
    """``send --wait --timeout``: the real status when time ran out (the reply is not lost),
    with ``now``, what it is doing (``Reader.activity``: the words of every face)."""
    from contemplation.models import Status

    status = state.status if state is not None else Status.PENDING
    what = f"{status.value}: {now}"
    if now.startswith(f"{Status.RETRYING.value}: "):  # a full disk: state.json is behind
        what = now
    return safe(
        f"timed out after {waited:g} s; {conv_id} is {what}. The reply still comes: "
        f"`contemplation tail -f {conv_id}` follows it"
    )
