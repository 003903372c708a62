"""``contemplation plugins``: what extends this installation, and from where.

    contemplation plugins [--probe] [--json]

Lists every backend kind, NEED tool kind, context requirement kind and dashboard panel with the
distribution it comes from (``built in`` for the package's own, else the plugin's; for a
tool, the rules it offers too); then
each plugin that could not be loaded, with why (exit 1 when there is one), and each that
took longer than a second to load. ``--probe`` loads each plugin in a child process of its
own first (:mod:`contemplation.faces.cli.probe`), so one that ends or hangs its process is named
instead of ending or hanging this one.
"""

from __future__ import annotations

import sys

import click

from contemplation.base.exits import EXIT_ERROR
from contemplation.base.terminal import safe
from contemplation.faces.cli import show
from contemplation.faces.cli.common import emit, json_option


@click.command()
@click.option(
    "--probe",
    is_flag=True,
    help="Load each plugin in a child process first: one that ends or hangs it is named.",
)
@json_option(
    'Print {"backends": [{name, from}], "tools": [{name, from, argument, rules, description}], '
    '"context": [{name, from, label, description}], "cards": [{name, from, title}] (the '
    'dashboard\'s; "panels": the same, its former name), "failed": [{plugin, error}], '
    '"slow": [{plugin, seconds}]}.'
)
def plugins(probe: bool, as_json: bool) -> None:
    """The backends, NEED tools, context kinds and dashboard cards, built in and from plugins,
    and the plugins that failed to load or were slow to."""
    from contemplation import backends
    from contemplation.base.plugins import BUILT_IN
    from contemplation.faces.cli import probe as probes
    from contemplation.faces.dashboard import cards as dashboard_cards
    from contemplation.needs.tools import registry
    from contemplation.prompt import context_kinds

    probed = probes.probe() if probe else None  # before anything here loads them

    families = [{"name": n, "from": d} for n, d in backends.origins().items()]
    origins = registry.origins()
    kinds = list(registry.kinds().values())
    tools = [
        {
            "name": k.name,
            "from": origins.get(k.name, BUILT_IN),
            "argument": k.default_arg,
            "rules": [r.name for r in k.rules],
            "description": k.description,
        }
        for k in kinds
    ]
    context_from = context_kinds.origins()
    context = [
        {"name": k.name, "from": context_from[k.name], "label": k.label,
         "description": k.description}
        for k in context_kinds.kinds().values()
    ]  # fmt: skip
    card_from = dashboard_cards.origins()
    cards = [
        {"name": c.name, "from": card_from[c.name], "title": c.title}
        for c in dashboard_cards.kinds().values()
    ]
    failed = [
        {"plugin": where, "error": why}
        for where, why in (
            *backends.failures(), *registry.failures(), *context_kinds.failures(),
            *dashboard_cards.failures(),
        )
    ]  # fmt: skip
    human = show.table([(f["name"], f["from"]) for f in families], ("BACKEND", "FROM"))
    rows = [
        (k.name, origins.get(k.name, BUILT_IN), ", ".join(r.name for r in k.rules) or "-",
         k.description)
        for k in kinds
    ]  # fmt: skip
    human += "\n\n" + show.table(rows, ("TOOL", "FROM", "RULES", "WHAT"))
    human += "\n\n" + show.table(
        [(c["name"], c["from"], c["label"], c["description"]) for c in context],
        ("CONTEXT", "FROM", "SECTION", "WHAT"),
    )
    human += "\n\n" + show.table(
        [(c["name"], c["from"], c["title"]) for c in cards], ("CARD", "FROM", "TITLE")
    )
    slow = [
        {"plugin": where, "seconds": round(took, 2)}
        for where, took in (
            probes.slow(probed) if probed is not None else [
                *backends.KINDS.slow(), *registry.KINDS.slow(), *context_kinds.KINDS.slow(),
                *dashboard_cards.KINDS.slow(),
            ]
        )
    ]  # fmt: skip
    human += "".join(f"\nFAILED {f['plugin']}: {f['error']}" for f in failed)
    human += "".join(
        f"\nSLOW {s['plugin']}: took {s['seconds']:.1f} s to load (a start waits for it)"
        for s in slow
    )
    emit(
        {
            "backends": families,
            "tools": tools,
            "context": context,
            "cards": cards,
            "panels": cards,  # the former name (deprecated)
            "failed": failed,
            "slow": slow,
        },
        as_json,
        safe(human),
    )
    if failed:
        sys.exit(EXIT_ERROR)
