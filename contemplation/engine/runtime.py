"""What every step of the pipeline shares: the :class:`Runtime` and the step results."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from contemplation.backends import providers as table
from contemplation.backends.base import Backend
from contemplation.config.reload import backend_fingerprint
from contemplation.engine.breaker import Breaker, Guard
from contemplation.engine.provider import Provider
from contemplation.engine.retryclock import RetryClock, longest_wait
from contemplation.errors import LockBusy
from contemplation.models import BackendSession, ConvEvent, Metadata
from contemplation.needs.router import NeedRouter
from contemplation.prompt.budget import Calibration
from contemplation.prompt.context import ContextAssembler
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, topic_of_id
from contemplation.store.templates import Template, load_template
from contemplation.writer import ConvWriter, now_iso, open_writer
from contemplation.writer.durable import GroupCommitter

log = structlog.get_logger("contemplation.runtime")

Observer = Callable[[str, ConvEvent, dict[str, Any]], None]


@dataclass
class Runtime:
    """The services a step uses, built once by the daemon (or a test). What is remembered
    about each conversation lives in :class:`~contemplation.engine.tracking.Tracked`; what
    is known of each provider, in its :class:`~contemplation.engine.provider.Provider`."""

    settings: Settings
    home: Home
    providers: dict[str, Provider] = field(default_factory=dict)  # made on first use
    observers: list[Observer] = field(default_factory=list)
    templates: dict[str, Template] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)
    clock: Callable[[], float] = time.time  # wall: what is written down and shown
    steady: Callable[[], float] = time.monotonic  # what waits and rests are measured on
    router: NeedRouter | None = None
    assembler: ContextAssembler | None = None
    calibration: Calibration = field(default_factory=Calibration)
    committer: GroupCommitter = field(default_factory=GroupCommitter)  # turns' durable writes
    retry_now: set[str] = field(default_factory=set)  # backoffs to cut short (a reload)
    retired: list[Any] = field(default_factory=list)  # what a reload replaced: closed at the end
    retries: RetryClock = field(init=False, repr=False)  # retry times, on the monotonic clock

    def __post_init__(self) -> None:
        self.retries = RetryClock(wall=self.clock, steady=self.steady)

    def retry_due(self, conv_id: str, at: float | None, now: float) -> float | None:
        """state.json's retry time ``at`` as a wall time in the terms of ``now`` (see
        :mod:`contemplation.engine.retryclock`)."""
        return self.retries.due(conv_id, at, now, longest_wait(self.settings))

    def provider(self, name: str) -> Provider:
        """Provider ``name``, made on first use (its client when first asked)."""
        got = self.providers.get(name)
        if got is None:
            got = self.providers[name] = Provider.make(
                name, self.settings, clock=self.clock, steady=self.steady
            )
        return got

    def made(self) -> list[str]:
        """The providers whose client is made (and not closed since)."""
        return [name for name, p in self.providers.items() if p.made]

    def backend(self, name: str) -> Backend:
        """Provider ``name``'s client (raises ConfigError where the settings cannot make it)."""
        return self.provider(name).backend

    def target(self, meta: Metadata) -> table.Target:
        """Where ``meta``'s turns go (its provider, or its alias's providers)."""
        return table.target(
            self.settings, meta.backend, meta.model, options=meta.options, think=meta.think
        )

    def route(
        self,
        meta: Metadata,
        session: BackendSession | None = None,
        *,
        steer: Callable[[table.Target], table.Target] | None = None,
    ) -> tuple[table.Target, dict[str, Provider]]:
        """Where ``meta``'s turn goes (``steer``: moved, a rung of its ladder), and its
        providers by name. A conversation whose history a server holds (an OpenCode
        session) stays on it."""
        target = self.target(meta)
        if steer is not None:
            target = steer(target)
        target = pinned(target, session)
        return target, {name: self.provider(name) for name in target.providers}

    def stale(self, name: str) -> None:
        """Provider ``name`` went away (refused, cut): see :meth:`Provider.stale`."""
        self.provider(name).stale()

    def watch(self, name: str) -> None:
        """Provider ``name`` cannot be reached: it rests until a background probe of its
        model list answers (no user's turn is sent to find out), asked at most
        ``breaker_cooldown`` apart; the client asked is the one in use at each probe."""
        self.provider(name).health.watch(
            lambda: self.provider(name).backend.models, self.settings.breaker_cooldown
        )

    def breaker(self, name: str) -> Breaker:
        """Provider ``name``'s server breaker."""
        return self.provider(name).health.server

    def guard(self, provider: str, model: str) -> Guard:
        """The breakers a turn of ``model`` on ``provider`` passes: the server's and its own."""
        return self.provider(provider).guard(model)

    def template(self, name: str) -> Template:
        if name not in self.templates:
            self.templates[name] = load_template(self.home, name)
        return self.templates[name]

    @contextlib.contextmanager
    def observing(self, observer: Observer) -> Iterator[None]:
        """``observer`` sees every event while the block runs (an extra's lifetime)."""
        self.observers.append(observer)
        try:
            yield
        finally:
            with contextlib.suppress(ValueError):
                self.observers.remove(observer)

    def told(self, conv_id: str, event: ConvEvent, text: str) -> None:
        """A reply's event with its text (what a live reply tells as it streams)."""
        self.notify(conv_id, event, text=text)

    def notify(self, conv_id: str, event: ConvEvent, **data: Any) -> None:
        for obs in list(self.observers):
            try:
                obs(conv_id, event, data)
            except Exception:  # an observer must never break a turn
                log.exception("observer_failed", event=event)

    def default_metadata(self, conv: Conv) -> Metadata:
        tpl = self.template(self.settings.default_template)
        topic = topic_of_id(conv.id)
        return Metadata(
            id=conv.id,
            topic=topic,
            created=now_iso(),
            template=tpl.name,
            backend=tpl.backend or self.settings.default_backend,
            model=tpl.model or self.settings.default_model,
            options=dict(tpl.options),
            think=tpl.think,
        )

    def need_router(self) -> NeedRouter:
        """The NEED router (built on first use; a bad rule raises ConfigError here)."""
        if self.router is None:
            self.router = NeedRouter(self.settings)
        return self.router

    def context_assembler(self) -> ContextAssembler:
        if self.assembler is None:
            self.assembler = ContextAssembler(
                self.need_router(), durable=self.settings.durability == "fsync"
            )
        return self.assembler

    def apply(self, settings: Settings, router: NeedRouter, changed: frozenset[str]) -> None:
        """New settings from a reload: turns from now on use them. The providers in
        ``changed`` are replaced whole (see :meth:`Provider.successor`): the old ones, and the
        old router, are kept for the turns in flight and closed when the daemon stops; at
        most RETIRED_KEPT are kept, the oldest closed first."""
        self.settings = settings
        if self.router is not None:
            self.retired.append(self.router)
        self.router, self.assembler = router, None
        self.templates.clear()
        for name, old in list(self.providers.items()):
            if name not in changed:
                old.forget_failures()
                continue
            self.providers[name] = old.successor(settings)
            if old.made:
                self.retired.append(old)
        while len(self.retired) > RETIRED_KEPT:
            gone = self.retired.pop(0)
            asyncio.get_running_loop().create_task(_close_quietly(gone))

    def backoff_outdated(self, conv_id: str, backend: str, recorded: str) -> bool:
        """A backoff to cut short: its backend's settings changed since it was set (a reload
        says so at once; a restart after an edit shows it in the recorded fingerprint)."""
        if conv_id in self.retry_now:
            self.retry_now.discard(conv_id)
            return True
        return bool(recorded) and recorded != backend_fingerprint(self.settings, backend)

    async def aclose(self) -> None:
        """Close clients and tool servers (they belong to the running event loop); what is
        known of each provider is kept."""
        for p in self.providers.values():
            await p.health.aclose()
        for old in self.retired:
            await _close_quietly(old)
        self.retired.clear()
        for p in self.providers.values():
            await _close_quietly(p)
        self.committer.close()
        self.committer = GroupCommitter()
        router, self.router, self.assembler = self.router, None, None
        if router is not None:
            with contextlib.suppress(Exception):
                await router.aclose()


def pinned(target: table.Target, session: BackendSession | None) -> table.Target:
    """A conversation whose history a server holds (an OpenCode session) stays on it."""
    held = session.provider if session is not None else None
    if len(target.providers) > 1 and held in target.providers:
        return replace(target, providers=(held,))
    return target


def backoff(rt: Runtime, attempt: int, retry_after: float | None) -> float:
    r = rt.settings.retry
    ceiling = min(r.cap, r.base * (2 ** max(0, attempt - 1)))
    delay = rt.rng.uniform(ceiling / 2, ceiling)  # "equal jitter": never hammer, never stall
    if retry_after is not None:
        delay = max(delay, min(retry_after, r.cap))
    return delay


RETIRED_KEPT = 32  # clients replaced by reloads kept open for the turns still using them


async def _close_quietly(obj: Any) -> None:
    with contextlib.suppress(Exception):
        await obj.aclose()


async def lock(conv: Conv, rt: Runtime, meta: Metadata) -> tuple[contextlib.ExitStack, ConvWriter]:
    """Take the conversation's lock without blocking the event loop."""
    while True:
        stack = contextlib.ExitStack()
        try:
            w = stack.enter_context(
                open_writer(
                    conv, durable=rt.settings.durability == "fsync", default_meta=meta, wait=False
                )
            )
        except LockBusy:
            stack.close()
            await asyncio.sleep(0.1)
            continue
        return stack, w
