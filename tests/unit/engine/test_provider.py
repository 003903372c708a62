"""A provider is one object: what a reload, a server gone away and the end of an event loop
do to it, each in one place (before: seven runtime dictionaries emptied in step)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from contemplation.backends.base import Slots
from contemplation.engine.runtime import Runtime
from contemplation.needs.router import NeedRouter
from contemplation.settings import Settings
from contemplation.store.layout import Home


def test_a_reload_replaces_a_changed_provider_whole_and_hands_on_only_its_health(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    s = make_settings()
    rt = Runtime(settings=s, home=home)

    async def go() -> None:
        old, kept = rt.provider("ollama"), rt.provider("openai")
        client, scheduler, affinity = old.backend, old.scheduler, old.affinity
        kept_client = kept.backend
        old.health.server.trip(rt.clock() + 60)  # its server rests
        rt.apply(s, NeedRouter(s), frozenset({"ollama"}))
        new = rt.provider("ollama")
        assert new is not old and new.health is old.health
        assert new.guard("m").resting() is not None  # still resting, as before the reload
        assert new.backend is not client and new.scheduler is not scheduler
        assert new.affinity is not affinity and new.slots is None
        assert old in rt.retired  # its turns in flight finish on it; closed at the end
        assert rt.provider("openai") is kept and kept.backend is kept_client
        await rt.aclose()
        assert not old.made and rt.retired == []

    asyncio.run(go())


def test_a_provider_gone_away_forgets_what_its_server_said_and_its_slot_owners(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    rt = Runtime(settings=make_settings(), home=home)
    p = rt.provider("ollama")
    p.slots = Slots(4, "server /props")
    affinity = p.affinity
    rt.stale("ollama")
    assert p.slots is None and p.affinity is not affinity
    assert rt.provider("ollama") is p  # the same provider: its client and breakers kept


def test_the_end_of_an_event_loop_closes_the_client_and_keeps_the_rest(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    rt = Runtime(settings=make_settings(), home=home)
    p = rt.provider("ollama")

    async def first() -> None:
        p.backend  # noqa: B018 (made)
        p.health.server.trip(rt.clock() + 60)
        await rt.aclose()

    asyncio.run(first())
    assert not p.made and rt.made() == []
    assert rt.provider("ollama") is p and p.health.server.resting() is not None
    assert p.backend is not None and rt.made() == ["ollama"]  # made again when asked
    asyncio.run(rt.aclose())
