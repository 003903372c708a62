"""``contemplation plugins``: what extends this installation, and from where.

    contemplation plugins [--json]

Lists every NEED tool kind, the distribution that registered it (``built in`` for the
package's own, else the plugin's), the argument a rule's capture fills and the rules it
offers; then each plugin that could not be loaded, with why (exit 1 when there is one).
"""

from __future__ import annotations

import sys

import click

from contemplation import show
from contemplation.cli_common import emit, json_option
from contemplation.exits import EXIT_ERROR
from contemplation.terminal import safe


@click.command()
@json_option('Print {"tools": [{name, from, argument, rules, description}], "failed": [...]}.')
def plugins(as_json: bool) -> None:
    """The NEED tools, built in and from plugins, and the plugins that failed to load."""
    from contemplation.tools import registry

    origins = registry.origins()
    kinds = list(registry.kinds().values())
    tools = [
        {
            "name": k.name,
            "from": origins.get(k.name, registry.BUILT_IN),
            "argument": k.default_arg,
            "rules": [r.name for r in k.rules],
            "description": k.description,
        }
        for k in kinds
    ]
    failed = [{"plugin": where, "error": why} for where, why in registry.failures()]
    rows = [
        (k.name, origins.get(k.name, registry.BUILT_IN), ", ".join(r.name for r in k.rules) or "-",
         k.description)
        for k in kinds
    ]  # fmt: skip
    human = show.table(rows, ("TOOL", "FROM", "RULES", "WHAT"))
    human += "".join(f"\nFAILED {f['plugin']}: {f['error']}" for f in failed)
    emit({"tools": tools, "failed": failed}, as_json, safe(human))
    if failed:
        sys.exit(EXIT_ERROR)
