"""What is known of a provider's server and models: its breakers and its background probe.

The one part of a provider a reload hands on to the provider that replaces it (a server that
refused connections before the edit is still resting after it, as a turn in flight left it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from contemplation.engine.breaker import Breaker, Guard
from contemplation.engine.probing import Ask, Probe


@dataclass
class Health:
    """Provider ``name``'s breakers: the server's and each model's (see
    :mod:`contemplation.engine.breaker`), and its probe while it is watched."""

    name: str
    threshold: int
    cooldown: float
    clock: Callable[[], float]
    steady: Callable[[], float]
    server: Breaker = field(init=False)
    models: dict[str, Breaker] = field(default_factory=dict)  # model -> its breaker
    probe: Probe = field(init=False)

    def __post_init__(self) -> None:
        self.server = self._breaker()
        self.probe = Probe(self.name, self.server, self.clock)

    def _breaker(self) -> Breaker:
        return Breaker(
            threshold=self.threshold, cooldown=self.cooldown, clock=self.clock, steady=self.steady
        )

    def model(self, model: str) -> Breaker:
        if (got := self.models.get(model)) is None:
            got = self.models[model] = self._breaker()
        return got

    def guard(self, model: str) -> Guard:
        """The breakers a turn of ``model`` passes: the server's and its own."""
        return Guard(self.server, self.model(model))

    def watch(self, ask: Callable[[], Ask], longest: float) -> None:
        """The server cannot be reached: it rests until a background probe answers."""
        self.probe.watch(ask, longest)

    async def aclose(self) -> None:
        await self.probe.aclose()
