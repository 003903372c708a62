"""``contemplation watch``: one line per finished reply or lookup waiting, as it happens
(:mod:`contemplation.faces.watching`). Claude Code's plugin runs ``watch --agent`` as a
monitor (every line reaches the model); ``--rewake`` is the opt-in Stop hook's: it waits
while one of the agent's conversations is at work and exits 2 with the line when it is done
(Claude Code's ``asyncRewake`` wakes the idle session on exit 2), 0 when none is at work."""

from __future__ import annotations

import os
import select
import sys
import time

import click

from contemplation.base import acting
from contemplation.faces import watching
from contemplation.faces.cli.common import ctx_home


def _nobody_reads() -> bool:
    """Whoever read our stdout is gone (a pipe's or socket's other end closed: Claude Code's
    monitor dies with its session, and its shell may outlive it)."""
    if not hasattr(select, "poll"):
        return False
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, 0)  # errors and hang-ups are always reported
    gone = select.POLLERR | select.POLLHUP | select.POLLNVAL
    return any(events & gone for _, events in poller.poll(0))


REWAKE_EXIT = 2  # Claude Code's asyncRewake: exit 2 wakes the model with the output


@click.command("watch")
@click.option(
    "--agent",
    is_flag=True,
    help="Only the conversations the agent started; stops when the process that started it "
    "(the agent's session) is gone.",
)
@click.option(
    "--interval",
    type=click.FloatRange(0.1, 60),
    default=1.0,
    show_default=True,
    help="Seconds between looks.",
)
@click.option(
    "--rewake",
    is_flag=True,
    help="Wait for the agent's conversations at work; exit 2 with the first line (a hook's).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=0,
    help="Stop after this many seconds (0: never; --rewake: 3600).",
)
@click.pass_context
def watch(ctx: click.Context, agent: bool, interval: float, rewake: bool, timeout: float) -> None:
    """Print one line per finished reply or lookup waiting, as it happens."""
    parent = os.getppid()  # the agent's session (Claude Code runs its monitors so)
    mine = agent or rewake
    # run by the agent (its monitor, its hook): only the conversations its session started
    session = acting.session() if mine and acting.here().is_agent else None
    w = watching.Watch(ctx_home(ctx), agent_only=mine, session=session)
    w.poll()  # what is so already is not news
    if rewake and not w.busy():
        return  # nothing the agent awaits: nothing to wake it for
    limit = timeout or (3600.0 if rewake else 0.0)
    end = time.monotonic() + limit if limit else None
    while end is None or time.monotonic() < end:
        time.sleep(interval)  # a poll of files: there is nothing to wait on but time
        if _nobody_reads() or ((agent or rewake) and os.getppid() != parent):
            return  # the session that started it is gone: nobody reads these lines
        lines = w.poll()
        for line in lines:
            click.echo(line)
        sys.stdout.flush()
        if rewake and lines:
            click.echo("\n".join(lines), err=True)
            ctx.exit(REWAKE_EXIT)
