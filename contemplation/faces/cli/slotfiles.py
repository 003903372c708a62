"""What ``archive`` and ``prune`` do for llama-server's slot files when no daemon runs: the
files the home's durable map gives conversations that are gone are removed from each
provider's ``slot_save_path`` (:func:`contemplation.writer.slotfiles.drop_gone`, the
daemon's rules: an absolute folder of a server on this machine, the map's names only, no
link followed). A running daemon removes them itself when it sees the conversations gone.

A daemon that starts while this runs may free one of those names and write a new file under
it before the command removes it: that conversation's next restore then fails its check
(``cache_n``), is counted, and its turn goes on cold, never wrong.
"""

from __future__ import annotations

import click

from contemplation.errors import ConfigError
from contemplation.faces.cli.common import ctx_home, ctx_settings
from contemplation.writer import daemon_alive, kvmap


def drop_gone(ctx: click.Context) -> None:
    """Remove the slot files of conversations gone, unless a daemon runs (or there is no
    map, or the config does not load: then the next daemon does it); says what went."""
    home = ctx_home(ctx)
    if daemon_alive(home) or not kvmap.path_in(home.root).is_file():
        return
    try:
        settings = ctx_settings(ctx)
    except ConfigError:
        return
    from contemplation.backends.openai import slot_folders
    from contemplation.writer.slotfiles import drop_gone as drop

    folders = slot_folders(settings)
    for provider, names in drop(home.root, folders).items():
        click.echo(
            f"note: removed {len(names)} slot file(s) of conversations that are gone from "
            f"{folders[provider]} ({provider})",
            err=True,
        )
