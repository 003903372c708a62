"""One configured provider: its client, slot scheduler, health, slot affinity (with its KV
files), the limits its server said and what its models can do, made once and asked by the turn.

Made on first use by the runtime (:meth:`~contemplation.engine.runtime.Runtime.provider`);
the client itself is made when first asked (:attr:`Provider.backend`: a provider the settings
cannot make raises ConfigError there, the turn's ERROR) and again after :meth:`aclose` (a
runtime used by one event loop after another). :meth:`stale` forgets what the server said
when it went away; a reload replaces the provider whole (:meth:`successor`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from contemplation import backends as backend_registry
from contemplation.backends.base import Backend, Capabilities, KnowsLimits, Slots
from contemplation.backends.openai import slot_folder as folder_of
from contemplation.engine import kvfiles
from contemplation.engine.affinity import CopiesSlots, NamesSlots, Pinned, SlotAffinity
from contemplation.engine.breaker import Guard
from contemplation.engine.provider.health import Health
from contemplation.engine.scheduler import Held, ModelScheduler
from contemplation.errors import BackendError
from contemplation.models import ChatMessage, Metadata, Usage
from contemplation.settings import Settings

log = structlog.get_logger("contemplation.runtime")


CAPS_RETRY = 30.0  # seconds before a failed capability or slots lookup is tried again
NO_NAMED_HISTORY = (
    "its turns found nothing of their history in their own slot (llama-server with -np left "
    "to its default moves idle slots out of the KV cache; give -np to keep them): the server "
    "picks each turn's slot from here on"
)


@dataclass
class Provider:
    """Provider ``name`` as the settings it was made from describe it."""

    name: str
    settings: Settings
    health: Health
    steady: Callable[[], float]
    affinity: SlotAffinity = field(default_factory=SlotAffinity)  # slots a turn names
    slots: Slots | None = None  # what the server said of its slots
    _client: Backend | None = None
    _scheduler: ModelScheduler | None = None
    _asked: float | None = None  # when its slots were asked (a failure: retried)
    # model -> the lock of one capabilities lookup, and the loop it serves
    _cap_locks: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Lock]] = field(
        default_factory=dict
    )
    _cap_failed: dict[str, float] = field(default_factory=dict)  # model -> when it failed

    def __post_init__(self) -> None:
        self._kv_files()

    @classmethod
    def make(
        cls,
        name: str,
        settings: Settings,
        *,
        clock: Callable[[], float],
        steady: Callable[[], float],
        health: Health | None = None,
    ) -> Provider:
        """A new provider; ``health``: the breakers and probe of the one it replaces."""
        if health is None:
            health = Health(
                name, settings.breaker_threshold, settings.breaker_cooldown, clock, steady
            )
        return cls(name, settings, health, steady)

    def successor(self, settings: Settings) -> Provider:
        """The provider a reload makes of this one: new settings, a new client, scheduler,
        slot affinity and limits; only the health is handed on. This one stays as the turns
        in flight hold it until they end."""
        return Provider(self.name, settings, self.health, self.steady)

    @property
    def backend(self) -> Backend:
        """The client, made once (raises ConfigError where the settings cannot make it)."""
        if self._client is None:
            self._client = backend_registry.build(self.name, self.settings)
        return self._client

    @property
    def made(self) -> bool:
        """Its client has been made (and not closed since)."""
        return self._client is not None

    def use(self, client: Backend) -> None:
        """Serve with ``client`` (a test's or a bench's in-process server)."""
        self._client = client

    @property
    def scheduler(self) -> ModelScheduler:
        if self._scheduler is None:
            self._scheduler = ModelScheduler(
                slots=self.backend.concurrency, switch_after=self.settings.model_switch_after
            )
        return self._scheduler

    def guard(self, model: str) -> Guard:
        """The breakers a turn of ``model`` passes: the server's and its own."""
        return self.health.guard(model)

    async def limits(self) -> None:
        """Ask the server how many slots it has, once (again after :meth:`stale`, and
        CAPS_RETRY seconds after a failed ask), and size the scheduler to that."""
        asked = self._asked
        if asked is not None and (self.slots is not None or self.steady() - asked < CAPS_RETRY):
            return
        self._asked = self.steady()
        backend = self.backend
        if not isinstance(backend, KnowsLimits):
            self.slots = Slots(backend.concurrency, "the backend")
            return
        try:
            found = await backend.slots()
        except BackendError as exc:
            log.info("slots_unknown", provider=self.name, error=str(exc))
            return
        self.slots = found
        self.scheduler.resize(found.count, models_at_once=found.models_at_once)
        log.info("slots", provider=self.name, slots=found.count, source=found.source)

    def stale(self) -> None:
        """The server went away (refused, cut): its limits are asked again when it is next
        used, since a restarted server may have other slots or another window; its slots
        hold nothing any more."""
        self._asked = None
        self.slots = None
        self.affinity = SlotAffinity()
        self._kv_files()
        if isinstance(self._client, KnowsLimits):
            self._client.stale()

    async def capabilities(self, model: str) -> Capabilities | None:
        """What ``model`` can do, asked of the server once however many turns ask at once
        (2,000 conversations starting together make one /api/show, not 2,000); a failed
        lookup is not repeated for CAPS_RETRY seconds (the turn reports the real error)."""
        loop = asyncio.get_running_loop()
        held = self._cap_locks.get(model)
        if held is None or held[0] is not loop:  # a lock waited on in one loop fails in
            held = self._cap_locks[model] = (loop, asyncio.Lock())  # another (asyncio.run)
        async with held[1]:
            failed = self._cap_failed.get(model)
            if failed is not None and self.steady() - failed < CAPS_RETRY:
                return None
            try:
                caps = await self.backend.capabilities(model)
            except BackendError:
                self._cap_failed[model] = self.steady()
                return None
            self._cap_failed.pop(model, None)
            return caps

    def forget_failures(self) -> None:
        """A reload: the capability lookups that failed are tried again at once."""
        self._cap_failed.clear()

    def pinned(self, slot: int | None) -> Backend:
        """The client, every request of which names server slot ``slot`` when there is one."""
        return self.backend if slot is None else Pinned(self.backend, slot)

    async def name_slot(self, key: str, meta: Metadata, held: Held) -> int | None:
        """The server slot a turn of ``key`` names, where the server lets a request name one:
        its own cache, else its template's warm prefix, copied into an unused slot where the
        server copies slots; given back with ``held``."""
        backend = self.backend
        try:
            ids = await backend.slot_ids() if isinstance(backend, NamesSlots) else 0
        except BackendError:  # the turn itself reports what is wrong with the server
            ids = 0
        affinity = self.affinity
        if not ids or not affinity.named:
            return None
        copier = backend if isinstance(backend, CopiesSlots) else None
        if copier is not None:
            await affinity.asked()
        prefix = f"{meta.model}\n{meta.template}"
        slot = affinity.take(key, prefix, slots=ids, copy=copier is not None)
        held.then(lambda: affinity.give(slot))
        if copier is not None:
            await affinity.ready(slot, copier)
        return slot

    def heard(
        self, slot: int | None, key: str, usage: Usage, messages: Sequence[ChatMessage]
    ) -> str:
        """What the server's usage of a turn of ``key`` on ``slot`` says of the slot: a
        server that keeps no named slot's history (its slots are not named again), and
        whether a slot file restored for it held. Returns the restore's verdict (see
        :meth:`SlotAffinity.verified`)."""
        affinity = self.affinity
        if slot is not None and affinity.observed(slot, key, usage.cached_tokens):
            log.warning("slots_not_named", provider=self.name, why=NO_NAMED_HISTORY)
        restored = affinity.verified(
            slot, key, usage.cached_tokens, usage.prompt_eval_count, kvfiles.digest(messages)
        )
        kvfiles.said(self.name, key, restored)
        return restored

    async def forget_files(self, conv_id: str) -> list[str]:
        """A conversation gone (archived, pruned, deleted): its slot files leave the durable
        map, and are removed from the server's folder where the provider names it
        (:meth:`slot_folder`). Slot saves in flight end first (one for it would name it
        again). Returns the names removed from the folder."""
        files = self.affinity.files
        if not any(c == conv_id or c.startswith(f"{conv_id}#") for c in files.conversations()):
            return []
        await self.affinity.settled()
        names = files.forget(conv_id)
        await files.flush()
        return await files.remove(names)

    def slot_folder(self) -> Path | None:
        """The server's ``--slot-save-path`` as this provider's ``slot_save_path`` names it
        (:func:`~contemplation.backends.openai.slot_folder`): an absolute folder, of a
        server on this machine; else None (its files are only written over)."""
        return folder_of(self.settings, self.name)

    def _kv_files(self) -> None:
        """The affinity's slot files kept in the home's durable map (warm across restarts)."""
        self.affinity.files = kvfiles.KvFiles.durable(
            self.settings.home,
            self.name,
            budget=self.settings.kv_files_bytes,
            folder=self.slot_folder(),
        )

    async def aclose(self) -> None:
        """Close the client (it belongs to the running event loop); the next use makes a
        new one. What is known of the server is kept; slot saves in flight end first."""
        await self.affinity.settled()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
