"""``contemplation routes``: show the NEED rules, and try one need against them.

    contemplation routes                         the rules in matching order
    contemplation routes test "NEED: File contents of README.md"
    contemplation routes test --call "Current state of deploy"   also run the tool

Added to the main group with ``main.add_command(routes)``.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from typing import TYPE_CHECKING, Any

import click

from contemplation.base.terminal import safe
from contemplation.faces.cli import show
from contemplation.faces.cli.common import (
    TEMPLATE,
    ctx_settings,
    json_option,
    quiet_logs_unless_verbose,
)
from contemplation.protocol.logformat import NEED_PREFIX

if TYPE_CHECKING:  # the router pulls in the MCP SDK: only load it when a routes command runs
    from contemplation.models import Rule
    from contemplation.needs.router import NeedRouter


@click.group(invoke_without_command=True)
@click.option(
    "--template", "-t", type=TEMPLATE, default=None, help="Include this template's own rules."
)
@json_option('Print the rules as a JSON array of {"name", "prefix", "match", "tool", "args", ...}.')
@click.pass_context
def routes(ctx: click.Context, template: str | None, as_json: bool) -> None:
    """The NEED routing rules, in the order they are tried (first match wins).

    Patterns are shown as they are written in the config (a TOML literal string needs no
    doubled backslashes); a match is case-insensitive unless the rule says otherwise."""
    ctx.ensure_object(dict)["routes_template"] = template
    if ctx.invoked_subcommand is not None:
        return
    from contemplation.needs.router import NeedRouter

    table = NeedRouter(ctx_settings(ctx)).rules(template)
    if as_json:
        click.echo(json.dumps([_rule_dict(r) for r in table.rules], indent=2, ensure_ascii=False))
        return
    rows = [
        (f"{n}.", r.name, _how(r), r.tool, json.dumps(dict(r.args), ensure_ascii=False), r.source)
        for n, r in enumerate(table.rules, 1)
    ]
    click.echo(show.table(rows, ("#", "NAME", "NEED", "TOOL", "ARGUMENTS", "FROM")))


def _how(rule: Rule) -> str:
    """What a need must look like for the rule, in the words of the config."""
    if rule.pattern is None:
        return f"starts with {rule.prefix}"
    sensitive = "" if rule.pattern.flags & re.IGNORECASE else " (case-sensitive)"
    return f"matches {rule.pattern.pattern}{sensitive}"


def _rule_dict(rule: Rule) -> dict[str, Any]:
    return {
        "name": rule.name,
        "prefix": rule.prefix or None,
        "match": rule.pattern.pattern if rule.pattern is not None else None,
        "case_sensitive": (
            not rule.pattern.flags & re.IGNORECASE if rule.pattern is not None else False
        ),
        "tool": rule.tool,
        "args": dict(rule.args),
        "source": rule.source,
    }


@routes.command("test")
@click.argument("need")
@click.option(
    "--call",
    "call",
    is_flag=True,
    help="Also run the tool: only its answer goes to stdout (the rule to stderr).",
)
@json_option(
    'Print {"need", "matched", "rule", "tool", "arguments", "permission", "answer"} as JSON.'
)
@click.pass_context
def test_route(ctx: click.Context, need: str, call: bool, as_json: bool) -> None:
    """Which rule answers NEED (with or without the leading "NEED:"), with what, and what the
    permissions decide (allow / ask / deny, and the rule that decided).

    --call runs the tool only when the permissions allow it: an ask or a deny is shown, not
    executed. Diagnostic logs go to stderr, and only with `contemplation -v`."""
    text = need.strip()
    if text.upper().startswith(NEED_PREFIX):
        text = text[len(NEED_PREFIX) :].strip()
    template = ctx.ensure_object(dict).get("routes_template")
    from contemplation.needs.router import NeedRouter

    quiet_logs_unless_verbose(ctx)
    router = NeedRouter(ctx_settings(ctx))
    found = router.route(text, template=template)
    data: dict[str, Any] = {"need": text, "matched": found is not None}
    allowed = False
    if found is not None:
        verdict = router.permit(found, template=template)
        allowed = verdict.action == "allow"
        data.update(rule=found.rule.name, tool=found.tool, arguments=found.arguments)
        data["permission"] = {"action": verdict.action, "why": verdict.why()}
        if call and allowed:
            data["answer"] = asyncio.run(_call(router, text, template))
    if as_json:
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
    elif found is None:
        click.echo(safe(f"no rule matches {text!r}: the agent answers it"), err=call)
        return
    else:
        described = [
            f"rule:       {found.rule.name} ({found.rule.source})",
            f"tool:       {found.tool}",
            f"arguments:  {json.dumps(found.arguments, ensure_ascii=False)}",
            f"permission: {data['permission']['action']} ({data['permission']['why']})",
        ]
        click.echo(safe("\n".join(described)), err=call)  # with --call stdout is the answer
        if call and allowed:
            click.echo(safe(data["answer"]), nl=False)
    if call and found is not None and not allowed:
        action = data["permission"]["action"]
        what = "waits for the agent's approval" if action == "ask" else "is refused"
        click.echo(
            safe(f"not called: the permissions say {action} (in a conversation the lookup {what})"),
            err=True,
        )
        sys.exit(1)


async def _call(router: NeedRouter, need: str, template: str | None) -> str:
    async with router:
        [(asked, answer)] = await router.answer_all(
            [need], conv_id="cli", turn_key="cli", template=template
        )
    return answer.render_block(asked) if answer else "(no answer: the agent answers it)\n"
