"""A Runtime used from one event loop after another (a library caller's ``asyncio.run`` per
burst): what it keeps between them must not belong to the first loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from contemplation.backends.base import Backend
from contemplation.engine.runtime import Runtime
from contemplation.settings import Settings
from contemplation.store.layout import Home


class SlowCaps:
    """Answers capabilities after a moment, so that concurrent asks wait on the lock."""

    def __init__(self) -> None:
        self.asked = 0

    async def capabilities(self, model: str) -> Any:
        self.asked += 1
        await asyncio.sleep(0.01)
        return model


def test_capabilities_asked_at_once_from_a_second_event_loop(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    rt = Runtime(settings=make_settings(), home=home)
    backend = SlowCaps()
    rt.provider("box").use(cast(Backend, backend))

    async def burst() -> list[Any]:
        return list(await asyncio.gather(*(rt.provider("box").capabilities("m") for _ in range(3))))

    assert asyncio.run(burst()) == ["m"] * 3  # the lock waited on in this loop...
    assert asyncio.run(burst()) == ["m"] * 3  # ...and in the next (before: RuntimeError,
    assert backend.asked == 6  # "bound to a different event loop")
