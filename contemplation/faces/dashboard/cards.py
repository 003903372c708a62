"""The dashboard's cards: one registry, the built-in ``metrics`` and ``ledger`` registered
through it. (A card was called a panel, a name a panel of models now has alone.)

A :class:`Card` says in one place what the page needs of it: its name (the element's id),
its title, and its rows, ``(label, text)`` pairs computed on a worker thread from what the
dashboard sees (:class:`Seen`: the home, this run's live counters). The page lists every
card from ``/api/cards`` and draws each as a titled list of terms (``app.js``
``loadCards``), as text, never as markup; so adding a card is one module that registers
it, plus its test, and no HTML or JavaScript. A plugin adds one through the entry point group
``contemplation.cards`` (a :class:`Card`, or a callable that returns one or several; the
former group ``contemplation.panels`` is still read); a card whose rows raise
(``BaseException`` included) shows that one line instead of its rows, never a broken page.

Each card's rows run on a thread of their own (a daemon thread: one that never returns does
not hold the daemon's exit), never on the threads and under the lock the dashboard's other
reads take, and are waited for :data:`CARD_LIMIT` seconds at most: a card that sleeps or
blocks shows "took longer than …" and holds no other read; while it is still busy it is not
started again (one thread a card at most).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any

from contemplation.base import plugins
from contemplation.base.contained import described
from contemplation.faces.card import Card, Row, Seen
from contemplation.index import ledger as ledger_sums
from contemplation.index import listing
from contemplation.models import LedgerSums
from contemplation.protocol import escalation, ledger
from contemplation.store.layout import Home

MAX_ROWS = 50  # rows one card shows
MAX_TEXT = 500  # characters of one label or value
CARD_LIMIT = 2.0  # seconds a look at /api/cards waits for the cards' rows
GROUP = "contemplation.cards"
FORMER_GROUP = "contemplation.panels"  # the cards' group when they were called panels


def _adopt(card: Card, origin: str) -> Card:
    if not card.name.isidentifier() or not card.name.islower():
        raise ValueError(f"a card's name is a lower-case word, not {card.name!r}")
    return card


KINDS: plugins.Registry[Card] = plugins.Registry(
    GROUP,
    Card,
    lambda: _builtins(),  # noqa: PLW0108 - defined below
    _adopt,
    former=(FORMER_GROUP,),
)
register, kinds, origins, failures = KINDS.register, KINDS.kinds, KINDS.origins, KINDS.failures


def _cut(text: object) -> str:
    s = str(text)
    return s if len(s) <= MAX_TEXT else s[: MAX_TEXT - 1] + "…"


_busy: dict[str, Future[list[Row]]] = {}  # each card's rows being computed (on the loop)


async def shown(seen: Seen) -> list[dict[str, Any]]:
    """Every card with its rows (at most :data:`MAX_ROWS`, each cut to :data:`MAX_TEXT`),
    each computed on a thread of its own and waited for :data:`CARD_LIMIT` s at most; a
    card whose rows fail, take longer or are still busy from an earlier look says so in one
    row."""
    listed = list((await asyncio.to_thread(kinds)).values())  # the first look imports plugins
    started: dict[str, asyncio.Future[list[Row]]] = {}
    busy: set[str] = set()
    for card in listed:
        before = _busy.get(card.name)
        if before is not None and not before.done():
            busy.add(card.name)
        else:
            _busy[card.name] = _start(card, seen)
            started[card.name] = asyncio.wrap_future(_busy[card.name])
    if started:
        await asyncio.wait(started.values(), timeout=CARD_LIMIT)
    out = [
        {"name": c.name, "title": _cut(c.title), "rows": _rows(c, started, busy)} for c in listed
    ]
    for waited in started.values():  # one still running is no longer waited for (its thread
        waited.cancel()  # goes on, and tells no loop when it ends: this one may be closed)
    return out


def _rows(card: Card, started: dict[str, asyncio.Future[list[Row]]], busy: set[str]) -> list[Row]:
    if card.name in busy:
        return [("unavailable", f"still busy with an earlier look (over {CARD_LIMIT:g} s)")]
    fut = started[card.name]
    if not fut.done():
        return [("unavailable", f"took longer than {CARD_LIMIT:g} s")]
    error = fut.exception()
    if error is not None:  # one card's bug must not take the page down
        return [("unavailable", _cut(described(error)))]
    return fut.result()


def _start(card: Card, seen: Seen) -> Future[list[Row]]:
    """The card's rows, cut to size, computed on a daemon thread of its own."""
    fut: Future[list[Row]] = Future()

    def run() -> None:
        fut.set_running_or_notify_cancel()
        try:
            fut.set_result([(_cut(k), _cut(v)) for k, v in card.rows(seen)[:MAX_ROWS]])
        except BaseException as exc:  # a card's sys.exit ends its thread, never the daemon
            fut.set_exception(exc)

    threading.Thread(target=run, name=f"card-{card.name}", daemon=True).start()
    return fut


def metrics(home: Home, live: dict[str, Any]) -> dict[str, Any]:
    """``/api/metrics``: counted in SQL (the index), never a walk through every folder."""
    s = listing.stats(home)
    by_status = s["by_status"]
    return {
        "live": live,
        "conversations": s["active"] + s["completed"],
        "by_status": by_status,
        "turns_total": s["turns_total"],
        "errors_now": by_status.get("error", 0),
        "retrying_now": by_status.get("retrying", 0),
        "disk": {"active": s["active_bytes"], "completed": s["completed_bytes"]},
    }


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _metrics_rows(seen: Seen) -> list[Row]:
    m = metrics(seen.home, seen.live)
    live, none = m["live"], "\N{EN DASH}"
    ms, tokens, disk = live["response_ms"], live["tokens"], m["disk"]
    tools = ", ".join(f"{k}: {v}" for k, v in live["tool_requests"].items())
    return [
        ("conversations", str(m["conversations"])),
        ("turns (all time)", str(m["turns_total"])),
        ("turns (this run)", str(live["turns"])),
        (
            "response p50 / p90 / p99 (ms)",
            " / ".join(none if ms[k] is None else str(round(ms[k])) for k in ("p50", "p90", "p99")),
        ),
        ("tokens prompt / completion", f"{tokens['prompt']} / {tokens['completion']}"),
        ("errors / retries (this run)", f"{live['errors']} / {live['retries']}"),
        ("in error / retrying now", f"{m['errors_now']} / {m['retrying_now']}"),
        ("tool requests", tools or none),
        ("disk: active / completed", f"{_mb(disk['active'])} / {_mb(disk['completed'])}"),
    ]


LEDGER_GROUPS = 10  # providers, then models, the ledger card lists


def _ledger_rows(seen: Seen) -> list[Row]:
    """Where the tokens and the time went, over every conversation (the index's sums), and
    the escalation ladder's books summed (a row, when a conversation has a ladder)."""
    got = ledger_sums.summed(seen.home, by="provider", limit=LEDGER_GROUPS, rungs=LEDGER_GROUPS)
    rows: list[Row] = [("all", ledger.line(LedgerSums.model_validate(got["total"])))]
    if got["ladder"]["conversations"]:  # the escalation ladder's books, summed
        rows.append(("ladder", escalation.sums_line(got["ladder"])))
    rows += [(g["key"], ledger.line(LedgerSums.model_validate(g))) for g in got["groups"]]
    models = ledger_sums.summed(seen.home, by="model", limit=LEDGER_GROUPS)
    rows += [(g["key"], ledger.line(LedgerSums.model_validate(g))) for g in models["groups"]]
    if got["more"] or models["more"]:
        rows.append(("more", "contemplation ledger --by provider | model"))
    return rows


def _builtins() -> tuple[Card, ...]:
    return (
        Card("metrics", "metrics", _metrics_rows),
        Card("ledger", "ledger: tokens and time", _ledger_rows),
    )
