"""The ledger: where a conversation's tokens and time went, turn by turn.

A turn's entry is made from the backend's :class:`Usage` alone: a figure the server did not
report stays None (never guessed); "sent" is the server's prompt count, or its cached and
computed counts added when it gave those instead. Sums keep None only where no turn said.
Pure: the writer keeps the ledger in state.json, the index sums it over conversations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the models (pydantic) load where a ledger is made, not to print sums
    from contemplation.models import Ledger, LedgerSums, LedgerTurn, MissCause, Usage

FIELDS = (
    "sent", "reused", "recomputed", "output",
    "queued_ms", "load_ms", "prefill_ms", "generate_ms",
)  # fmt: skip
OTHER = "other"  # the key past LEDGER_KEYS_KEPT provider/model pairs


def _sent(u: Usage) -> int | None:
    if u.prompt_eval_count is not None:
        return u.prompt_eval_count
    if u.cached_tokens is not None and u.computed_tokens is not None:
        return u.cached_tokens + u.computed_tokens
    return None


def entry(
    usage: Usage | None,
    *,
    turn: int,
    provider: str,
    model: str,
    context_bytes: int = 0,
    turns: int = 1,
    miss: MissCause | None = None,
) -> LedgerTurn:
    """One turn's line of the ledger; or (``turns`` 0) a request the turn made besides its
    reply, a compaction's summary call (``miss`` "compaction"): a row of its own, no turn."""
    from contemplation.models import LedgerTurn, Usage

    u = usage or Usage()
    return LedgerTurn(
        turns=turns,
        turn=turn,
        provider=u.provider or provider,
        model=u.model or model,
        sent=_sent(u),
        reused=u.cached_tokens,
        recomputed=u.computed_tokens,
        output=u.eval_count,
        queued_ms=u.queued_ms,
        load_ms=u.load_duration_ms,
        prefill_ms=u.prompt_eval_duration_ms,
        generate_ms=u.eval_duration_ms,
        context_bytes=context_bytes,
        miss=miss or u.miss,
    )


SHORT = 16  # tokens a server may evaluate again of a prompt it holds (its last ones)
SHORT_SHARE = 0.1  # and the share of it a re-tokenized reply may differ by


def miss(
    usage: Usage | None,
    *,
    held: int | None,
    extends: bool,
    same_tools: bool = True,
    compacted: bool = False,
    cut: bool = False,
    restore: str = "",
    first: bool = False,
) -> MissCause | None:
    """Why the server recomputed more than the turn's new text, or None (it did not, or its
    cache figure is unknown: a miss is never guessed). ``held``: the server's count of the
    conversation's previous request (None: none known); ``extends``: this request begins with
    that one (its messages and tools); ``restore``: what :meth:`Affinity.verified` said of a
    slot file restored for the turn ("failed" or "off": it did not hold; "model changed":
    the server serves another model now; "evicted": the file was given up); ``first``: the
    conversation's first turn."""
    if usage is None or usage.cached_tokens is None:
        return None
    if held is not None and extends:
        if usage.cached_tokens + max(SHORT, int(held * SHORT_SHARE)) >= held:
            return None
        return _RESTORE_MISS.get(restore, "slot taken")
    if held is None and restore in _RESTORE_MISS:  # after a restart: its file did not serve
        return _RESTORE_MISS[restore]
    if held is None:
        return "new conversation" if first else None
    if cut:
        return "cut"
    if not same_tools:
        return "tools changed"
    return "compaction" if compacted else "history changed"


# what the slot file restored (or meant to be) for a turn said (SlotAffinity.verified)
_RESTORE_MISS: dict[str, MissCause] = {
    "failed": "restore failed", "off": "restore failed", "model changed": "model changed",
    "evicted": "file evicted",
}  # fmt: skip


def _plus(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def added(total: LedgerSums, more: LedgerSums) -> LedgerSums:
    """``total`` with ``more`` added (None + None stays None)."""
    from contemplation.models import LedgerSums

    return LedgerSums(**plus(total.model_dump(), more.model_dump()))


def record(ledger: Ledger, line: LedgerTurn) -> None:
    """Add a turn: listed (the last LEDGER_TURNS_KEPT), and summed under its provider/model
    (past LEDGER_KEYS_KEPT pairs, under "other")."""
    from contemplation.models import LEDGER_KEYS_KEPT, LEDGER_TURNS_KEPT, LedgerSums

    ledger.turns = [*ledger.turns, line][-LEDGER_TURNS_KEPT:]
    key = f"{line.provider}/{line.model}"
    if key not in ledger.by and len(ledger.by) >= LEDGER_KEYS_KEPT:
        key = OTHER
    ledger.by[key] = added(ledger.by.get(key, LedgerSums()), line)


def total(ledger: Ledger) -> LedgerSums:
    """Every turn of the conversation summed."""
    return summed(ledger.by.values())


def total_of(ledger: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`total` of state.json's ``ledger`` as the model dumps it, as the model dumps the
    sums: what a read command says without the models."""
    out: dict[str, Any] = {"turns": 0, **dict.fromkeys(FIELDS), "context_bytes": 0}
    for p in ledger["by"].values():
        out = plus(out, p)
    return out


def plus(total: Mapping[str, Any], more: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`added` of dumps: ``turns``, :data:`FIELDS` and ``context_bytes``, in the
    model's order."""
    return {
        "turns": total["turns"] + more["turns"],
        **{k: _plus(total[k], more[k]) for k in FIELDS},
        "context_bytes": total["context_bytes"] + more["context_bytes"],
    }


def summed(parts: Iterable[LedgerSums]) -> LedgerSums:
    from contemplation.models import LedgerSums

    out = LedgerSums()
    for p in parts:
        out = added(out, p)
    return out


def _n(v: int | float | None, unit: str = "") -> str:
    # at a tenth first, as the index keeps its sums (index/ledger.py): else a sum of 0.51 ms
    # said "1 ms" from state.json and "0 ms" from the index (0.5, rounded half to even)
    return "?" if v is None else f"{round(round(v, 1)):,}{unit}"


def line(s: LedgerSums) -> str:
    """One line: ``3 turns: 1,200 prompt tokens (900 reused, 300 recomputed) + 80 out; ...``
    (a turn's line ends with the cause of its miss, when it had one)."""
    return sums_line(s.model_dump())


def sums_line(s: Mapping[str, Any]) -> str:
    """:func:`line` of sums as a mapping (the index's, without the models): ``turns``,
    :data:`FIELDS`, ``context_bytes`` and, for a turn, ``miss``."""
    cause = s.get("miss")
    return (
        f"{s['turns']} turns: {_n(s['sent'])} prompt tokens ({_n(s['reused'])} reused, "
        f"{_n(s['recomputed'])} recomputed) + {_n(s['output'])} out; "
        f"{_n(s['queued_ms'], ' ms')} queued, {_n(s['load_ms'], ' ms')} loading, "
        f"{_n(s['prefill_ms'], ' ms')} prefill, {_n(s['generate_ms'], ' ms')} generating; "
        f"{_n(s['context_bytes'], ' B')} context read for the model"
    ) + (f"; cache missed: {cause}" if cause else "")


def as_dict(s: LedgerSums) -> dict[str, Any]:
    return s.model_dump()
