"""What every step of the pipeline shares: the :class:`Runtime` and the step results."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import structlog

from contemplation import backends as backend_registry
from contemplation.backends import providers
from contemplation.backends.base import Backend, Capabilities, KnowsLimits, Slots
from contemplation.config.reload import backend_fingerprint
from contemplation.engine.affinity import SlotAffinity
from contemplation.engine.breaker import Breaker, Guard
from contemplation.engine.probing import Prober
from contemplation.engine.retryclock import RetryClock, longest_wait
from contemplation.engine.scheduler import ModelScheduler
from contemplation.errors import BackendError, LockBusy
from contemplation.models import ConvEvent, Metadata
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
CAPS_RETRY = 30.0  # seconds before a failed capability lookup is tried again


@dataclass
class Runtime:
    """The services a step uses, built once by the daemon (or a test). What is remembered
    about each conversation lives in :class:`~contemplation.engine.tracking.Tracked`."""

    settings: Settings
    home: Home
    backends: dict[str, Backend] = field(default_factory=dict)
    schedulers: dict[str, ModelScheduler] = field(default_factory=dict)
    observers: list[Observer] = field(default_factory=list)
    templates: dict[str, Template] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)
    clock: Callable[[], float] = time.time  # wall: what is written down and shown
    steady: Callable[[], float] = time.monotonic  # what waits and rests are measured on
    router: NeedRouter | None = None
    assembler: ContextAssembler | None = None
    calibration: Calibration = field(default_factory=Calibration)
    breakers: dict[str, Breaker] = field(default_factory=dict)
    committer: GroupCommitter = field(default_factory=GroupCommitter)  # turns' durable writes
    retry_now: set[str] = field(default_factory=set)  # backoffs to cut short (a reload)
    retired: list[Any] = field(default_factory=list)  # clients a reload replaced: closed at the end
    slots_seen: dict[str, Slots] = field(default_factory=dict)  # what each provider said
    affinities: dict[str, SlotAffinity] = field(default_factory=dict)  # slots a turn names
    _slots_asked: dict[str, float] = field(default_factory=dict)  # when (a failure: retried)
    # (provider, model) -> the lock of one capabilities lookup, and the loop it serves
    _cap_locks: dict[
        tuple[str, str], tuple[asyncio.AbstractEventLoop, asyncio.Lock]
    ] = field(default_factory=dict)
    _cap_failed: dict[tuple[str, str], float] = field(default_factory=dict)
    retries: RetryClock = field(init=False, repr=False)  # retry times, on the monotonic clock
    prober: Prober = field(init=False, repr=False)  # dead providers, probed in the background

    def __post_init__(self) -> None:
        self.retries = RetryClock(wall=self.clock, steady=self.steady)
        self.prober = Prober(clock=self.clock)

    def retry_due(self, conv_id: str, at: float | None, now: float) -> float | None:
        """state.json's retry time ``at`` as a wall time in the terms of ``now`` (see
        :mod:`contemplation.engine.retryclock`)."""
        return self.retries.due(conv_id, at, now, longest_wait(self.settings))

    def backend(self, name: str) -> Backend:
        if name not in self.backends:
            self.backends[name] = backend_registry.build(name, self.settings)
        return self.backends[name]

    def scheduler(self, name: str) -> ModelScheduler:
        if name not in self.schedulers:
            self.schedulers[name] = ModelScheduler(
                slots=self.backend(name).concurrency, switch_after=self.settings.model_switch_after
            )
        return self.schedulers[name]

    def affinity(self, name: str) -> SlotAffinity:
        """Which of provider ``name``'s server slots holds which conversation's prompt."""
        return self.affinities.setdefault(name, SlotAffinity())

    def target(self, meta: Metadata) -> providers.Target:
        """Where ``meta``'s turns go (its provider, or its alias's providers)."""
        return providers.target(
            self.settings, meta.backend, meta.model, options=meta.options, think=meta.think
        )

    async def limits(self, name: str) -> None:
        """Ask provider ``name`` how many slots it has, once (again after :meth:`stale`, and
        CAPS_RETRY seconds after a failed ask), and size its scheduler to that."""
        asked = self._slots_asked.get(name)
        if asked is not None and (name in self.slots_seen or self.steady() - asked < CAPS_RETRY):
            return
        self._slots_asked[name] = self.steady()
        backend = self.backend(name)
        if not isinstance(backend, KnowsLimits):
            self.slots_seen[name] = Slots(backend.concurrency, "the backend")
            return
        try:
            found = await backend.slots()
        except BackendError as exc:
            log.info("slots_unknown", provider=name, error=str(exc))
            return
        self.slots_seen[name] = found
        self.scheduler(name).resize(found.count, models_at_once=found.models_at_once)
        log.info("slots", provider=name, slots=found.count, source=found.source)

    def stale(self, name: str) -> None:
        """Provider ``name`` went away (refused, cut): its limits are asked again when it is
        next used, since a restarted server may have other slots or another window."""
        self._slots_asked.pop(name, None)
        self.slots_seen.pop(name, None)
        self.affinities.pop(name, None)  # a restarted server's slots hold nothing
        backend = self.backends.get(name)
        if isinstance(backend, KnowsLimits):
            backend.stale()

    def watch(self, name: str) -> None:
        """Provider ``name`` cannot be reached: it rests until a background probe of its
        model list answers (no user's turn is sent to find out), asked at most
        ``breaker_cooldown`` apart."""
        self.prober.watch(
            name,
            self.breaker(name),
            lambda: self.backend(name).models,
            self.settings.breaker_cooldown,
        )

    def breaker(self, name: str) -> Breaker:
        if name not in self.breakers:
            s = self.settings
            self.breakers[name] = Breaker(
                threshold=s.breaker_threshold,
                cooldown=s.breaker_cooldown,
                clock=self.clock,
                steady=self.steady,
            )
        return self.breakers[name]

    async def capabilities(self, backend_name: str, model: str) -> Capabilities | None:
        """What a model can do, asked of its server once however many turns ask at once
        (2,000 conversations starting together make one /api/show, not 2,000); a failed
        lookup is not repeated for CAPS_RETRY seconds (the turn reports the real error)."""
        key = (backend_name, model)
        loop = asyncio.get_running_loop()
        held = self._cap_locks.get(key)
        if held is None or held[0] is not loop:  # a lock waited on in one loop fails in
            held = self._cap_locks[key] = (loop, asyncio.Lock())  # another (asyncio.run)
        async with held[1]:
            failed = self._cap_failed.get(key)
            if failed is not None and self.steady() - failed < CAPS_RETRY:
                return None
            try:
                caps = await self.backend(backend_name).capabilities(model)
            except BackendError:
                self._cap_failed[key] = self.steady()
                return None
            self._cap_failed.pop(key, None)
            return caps

    def guard(self, provider: str, model: str) -> Guard:
        """The breakers a turn of ``model`` on ``provider`` passes: the server's and its own."""
        return Guard(self.breaker(provider), self.breaker(f"{provider}:{model}"))

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
        """New settings from a reload: turns from now on use them. The clients of the backends
        in ``changed`` and the old router are kept (turns in flight still use them) and closed
        when the daemon stops; at most RETIRED_KEPT are kept, the oldest closed first."""
        self.settings = settings
        if self.router is not None:
            self.retired.append(self.router)
        self.router, self.assembler = router, None
        self.templates.clear()
        self._cap_failed.clear()
        for name in changed:
            backend = self.backends.pop(name, None)
            self.schedulers.pop(name, None)
            self.affinities.pop(name, None)
            self._slots_asked.pop(name, None)
            self.slots_seen.pop(name, None)
            if backend is not None:
                self.retired.append(backend)
        while len(self.retired) > RETIRED_KEPT:
            old = self.retired.pop(0)
            asyncio.get_running_loop().create_task(_close_quietly(old))

    def backoff_outdated(self, conv_id: str, backend: str, recorded: str) -> bool:
        """A backoff to cut short: its backend's settings changed since it was set (a reload
        says so at once; a restart after an edit shows it in the recorded fingerprint)."""
        if conv_id in self.retry_now:
            self.retry_now.discard(conv_id)
            return True
        return bool(recorded) and recorded != backend_fingerprint(self.settings, backend)

    async def aclose(self) -> None:
        """Close clients and tool servers (they belong to the running event loop)."""
        await self.prober.aclose()
        for old in self.retired:
            await _close_quietly(old)
        self.retired.clear()
        backends, self.backends = list(self.backends.values()), {}
        for b in backends:
            with contextlib.suppress(Exception):
                await b.aclose()
        self.committer.close()
        self.committer = GroupCommitter()
        router, self.router, self.assembler = self.router, None, None
        if router is not None:
            with contextlib.suppress(Exception):
                await router.aclose()


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
