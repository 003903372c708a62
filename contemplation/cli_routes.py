"""``contemplation routes``: show the NEED rules, and try one need against them.

    contemplation routes                         the rules in matching order
    contemplation routes test "NEED: File contents of README.md"
    contemplation routes test --call "Current state of deploy"   also run the tool

Added to the main group with ``main.add_command(routes)``.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import click

from contemplation import settings as settings_mod
from contemplation.logformat import NEED_PREFIX
from contemplation.logs import configure
from contemplation.settings import Settings

if TYPE_CHECKING:  # the router pulls in the MCP SDK: only load it when a routes command runs
    from contemplation.needs.router import NeedRouter


def _settings(ctx: click.Context) -> Settings:
    obj: dict[str, Any] = ctx.ensure_object(dict)
    if "settings" not in obj:
        s = settings_mod.load(
            config=obj.get("config"), home=obj.get("home"), overrides=obj.get("overrides") or {}
        )
        configure(s.log_format, s.log_level)  # diagnostics on stderr, never in the output
        obj["settings"] = s
    settings: Settings = obj["settings"]
    return settings


@click.group(invoke_without_command=True)
@click.option("--template", "-t", default=None, help="Include this template's own rules.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def routes(ctx: click.Context, template: str | None, as_json: bool) -> None:
    """The NEED routing rules, in the order they are tried (first match wins)."""
    ctx.ensure_object(dict)["routes_template"] = template
    if ctx.invoked_subcommand is not None:
        return
    from contemplation.needs.router import NeedRouter

    router = NeedRouter(_settings(ctx))
    table = router.rules(template)
    if as_json:
        rows = [
            {
                "name": r.name,
                "prefix": r.prefix or None,
                "match": r.pattern.pattern if r.pattern is not None else None,
                "tool": r.tool,
                "args": dict(r.args),
                "source": r.source,
            }
            for r in table.rules
        ]
        click.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    for n, line in enumerate(router.describe(template=template), 1):
        click.echo(f"{n:>2}. {line}")


@routes.command("test")
@click.argument("need")
@click.option("--call", "call", is_flag=True, help="Also run the tool and print the answer.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def test_route(ctx: click.Context, need: str, call: bool, as_json: bool) -> None:
    """Which rule answers NEED (with or without the leading "NEED:"), and with what."""
    text = need.strip()
    if text.upper().startswith(NEED_PREFIX):
        text = text[len(NEED_PREFIX) :].strip()
    template = ctx.ensure_object(dict).get("routes_template")
    from contemplation.needs.router import NeedRouter

    router = NeedRouter(_settings(ctx))
    found = router.route(text, template=template)
    data: dict[str, Any] = {"need": text, "matched": found is not None}
    if found is not None:
        data.update(rule=found.rule.name, tool=found.tool, arguments=found.arguments)
    if found is not None and call:
        answer = asyncio.run(_call(router, text, template))
        data["answer"] = answer
    if as_json:
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    if found is None:
        click.echo(f"no rule matches {text!r}: the agent answers it")
        return
    click.echo(f"rule:      {found.rule.name} ({found.rule.source})")
    click.echo(f"tool:      {found.tool}")
    click.echo(f"arguments: {json.dumps(found.arguments, ensure_ascii=False)}")
    if call:
        click.echo("")
        click.echo(data["answer"], nl=False)


async def _call(router: NeedRouter, need: str, template: str | None) -> str:
    async with router:
        [(asked, answer)] = await router.answer_all(
            [need], conv_id="cli", turn_key="cli", template=template
        )
    return answer.render_block(asked) if answer else "(no answer: the agent answers it)\n"
