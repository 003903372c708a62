"""Which of a server's slots a turn names, so that it lands where its prompt is cached.

llama-server keeps each slot's last prompt and reuses the longest common prefix with the next
request in that slot; a request may name its slot (``id_slot``; a busy one queues it). A
conversation keeps the slot that holds its history unless that slot is busy and another is
free. A new conversation takes an unused slot, else the free slot that holds its
template's prefix (the protocol and the template's text come first in every prompt). No turn
waits behind a busy slot while another is free: on a 16-slot GPU server, a burst that joined
the slot prefilling its prefix kept 10 slots busy and ran at 0.77x a direct client (the
prefix's prefill, which it saved, costs a GPU milliseconds). Where the server copies a
slot's cache into another (llama-server started with ``--slot-save-path``: ``POST
/slots/{id}?action=save`` then ``restore`` into the other, milliseconds), a new
conversation takes an unused slot with a copy of an idle slot that holds its prefix: every
slot busy at once and the prefix never prefilled twice. Only this daemon's turns are
counted: a slot another client keeps busy makes the server queue ours.

Restart-proof KV: on such a server a free slot that another conversation takes is
first saved to a file of the conversation whose history it holds (:mod:`kvfiles`: a bounded
pool of names), and a conversation that comes back finds its file restored into its slot
before its turn. Every restore is checked by the next turn's reuse (the server's cache
figure): llama.cpp can report a restore that did not take (llama.cpp #26676). After
``RESTORE_FAILS`` such turns in a row no more restores are made on that server.

Warm across restarts: a turn's slot is also saved once the turn is over and no turn of this
daemon is on the server (in the background: the reply is committed, nothing waits on it),
and the pool of files is durable in the home (:mod:`kvmap`), so the first turn of a
conversation after a daemon or a server restart finds its file restored into a slot. A
restore the server refused, or files of another model, are said by the turn's verdict
("failed", "model changed"; "evicted" where its file was given up): the ledger's miss cause.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from collections.abc import AsyncGenerator, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import structlog

from contemplation.backends.base import Backend, Capabilities, Check
from contemplation.engine.kvfiles import Kept, KvFiles
from contemplation.errors import BackendError
from contemplation.models import BackendSession, ChatRequest, StreamEvent

log = structlog.get_logger("contemplation.kv")

KEPT = 4096  # conversations remembered per provider (the oldest forgotten)
MISSES = 2  # turns in a row that found nothing of their history in their own named slot
RESTORE_FAILS = 2  # restores in a row that a turn found not to hold: no more restores
SHORT = 4  # tokens a restored history may come up short by (the last one is computed again)
SETTLE = 30.0  # seconds a closing provider waits for the slot saves in flight


@dataclass
class SlotAffinity:
    """One provider's slots as this daemon uses them: who each slot's cache belongs to (the
    conversation whose turn it served last), which template's prefix it holds, and how many
    of this daemon's turns are on it now (more than one: the server queues them)."""

    _load: dict[int, int] = field(default_factory=dict)  # turns on the slot now
    _used: dict[int, int] = field(default_factory=dict)  # slot -> when last taken (a counter)
    _owner: dict[int, str] = field(default_factory=dict)  # slot -> the conversation it holds
    _holds: dict[int, str] = field(default_factory=dict)  # slot -> the prefix it holds
    _warming: set[int] = field(default_factory=set)  # slots prefilling a prefix anew
    copies: bool | None = None  # the server copies slots (None: not asked yet)
    _asking: asyncio.Event | None = None  # set when the server has said it
    _copy: dict[int, int] = field(default_factory=dict)  # slot -> the slot to copy into it first
    _reads: dict[int, int] = field(default_factory=dict)  # slot -> copies planned from it
    _read: dict[int, asyncio.Event] = field(default_factory=dict)  # set when those are made
    _warmed: dict[int, asyncio.Event] = field(default_factory=dict)  # set when its prefill ends
    _conv: OrderedDict[str, int] = field(default_factory=OrderedDict)
    _tick: itertools.count[int] = field(default_factory=itertools.count)
    # False once the server is seen to keep no named slot's history (see :meth:`observed`)
    named: bool = True
    _expect: dict[int, str] = field(default_factory=dict)  # slot -> whose history it holds
    _misses: int = 0
    files: KvFiles = field(default_factory=KvFiles)  # conversations kept in slot files
    restores: bool = True  # False once restores are seen not to hold (RESTORE_FAILS)
    restores_failed: int = 0  # restores a turn found not to hold
    _failing: int = 0  # of them in a row
    _dirty: set[int] = field(default_factory=set)  # slots whose cache no file holds yet
    # slot -> its last turn's prompt tokens and messages (:func:`kvfiles.digest`)
    _sent: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    _save: dict[int, str] = field(default_factory=dict)  # slot -> whose cache to save first
    _restore: dict[int, tuple[str, Kept]] = field(default_factory=dict)  # slot -> to restore
    _verify: dict[int, tuple[str, Kept]] = field(default_factory=dict)  # slot -> restored
    # slot -> a restore's verdict known before the turn ("failed", "model changed", "evicted")
    _verdict: dict[int, tuple[str, str]] = field(default_factory=dict)
    _copier: CopiesSlots | None = None  # the server, as the last turn's ready() was given it
    _saving: dict[int, asyncio.Task[None]] = field(default_factory=dict)  # idle saves
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)  # map writes in flight

    def take(self, conv_id: str, prefix: str, *, slots: int, copy: bool = False) -> int:
        """The slot for a turn of ``conv_id`` whose prompt starts with ``prefix``'s shared
        text, counted until :meth:`give`; :meth:`ready` before its first request.

        Its own slot (the one whose cache is still its history) when free, or when every
        slot is busy; when it is busy and another is free, the free one holding the prefix,
        else the one used longest ago. A new conversation: a slot no turn has used yet, else
        the free slot that holds the prefix, else the one used longest ago; with every slot
        busy with this daemon's turns, the least busy one holding the prefix (queued there).
        ``copy`` (the server may copy slots): a new conversation takes an unused slot with a
        copy of a slot that holds its prefix, free or prefilling it for the first time (made
        by :meth:`ready` once that turn ends: the server copies only an idle slot), rather
        than joining it; while the server has not said whether it copies, one such plan at a
        time (see :meth:`asked`)."""
        free = [i for i in range(slots) if not self._load.get(i)]
        own = self._conv.get(conv_id)
        if own is not None and own < slots and self._owner.get(own) == conv_id:
            if own in free or not free:
                self._mark(own, conv_id, prefix)
                self._expect[own] = conv_id  # its history should be found there
                return own
            moved = min(free, key=lambda i: (self._holds.get(i) != prefix, self._used.get(i, -1)))
            self._keep(moved, conv_id, copy=copy, back=False)
            return self._mark(moved, conv_id, prefix)  # busy, another free: it moves there
        warm = [i for i in range(slots) if self._holds.get(i) == prefix]
        cold = [i for i in free if i not in self._used]
        first = [i for i in warm if i in self._warming and self._load.get(i) == 1]
        source = [i for i in warm if i in free and i not in self._copy] or first
        may = self.copies or (self.copies is None and self._asking is None)
        back = copy and self.restores and self.copies is not False and conv_id in self.files
        if cold and source and copy and may and not back:  # the prefix copied, not prefilled
            if self.copies is None:
                self._asking = asyncio.Event()
            self._copy[cold[0]] = source[0]
            self._reads[source[0]] = self._reads.get(source[0], 0) + 1
            self._read.setdefault(source[0], asyncio.Event())
            if source[0] in first:
                self._warmed.setdefault(source[0], asyncio.Event())
            return self._mark(cold[0], conv_id, prefix, warming=False)
        if cold:  # an unused slot: no other conversation's cache is evicted
            slot = cold[0]
        elif free:  # never queued behind a busy slot while another is free
            slot = min([i for i in free if i in warm] or free, key=lambda i: self._used[i])
        else:  # every slot carries a turn of this daemon: the server queues it there
            slot = min(warm or range(slots), key=lambda i: (self._load.get(i, 0), self._used[i]))
        if slot in free:
            self._keep(slot, conv_id, copy=copy, back=back)
            if copy and self.restores and not back and self.files.was_evicted(conv_id):
                self._verdict[slot] = (conv_id, "evicted")
        return self._mark(slot, conv_id, prefix)

    def _keep(self, slot: int, conv_id: str, *, copy: bool, back: bool) -> None:
        """Plans for a free ``slot`` that ``conv_id`` takes: the history it holds saved to
        its conversation's file first, and ``conv_id``'s own file restored into it
        (``back``), made by :meth:`ready`."""
        if not copy or not self.restores or self.copies is False:
            return
        owner = self._owner.get(slot)
        if owner is not None and owner != conv_id and slot in self._dirty:
            self._save[slot] = owner
        if back and (kept := self.files.kept(conv_id)) is not None:
            self._restore[slot] = (conv_id, kept)

    async def asked(self) -> None:
        """Before :meth:`take`: while the server is being asked whether it copies slots,
        wait for its answer (milliseconds), so that a burst is placed knowing it."""
        while self._asking is not None:
            await self._asking.wait()

    async def ready(self, slot: int, copier: CopiesSlots) -> None:
        """Before the first request of a turn on ``slot``: the copy :meth:`take` planned into
        it made, once its source's first prefill has ended (the server first asked whether
        it copies slots; a refusal: this slot prefills the prefix and no copy is planned
        again), and the copies planned out of this slot made (it must stay idle until then)."""
        await self._before(slot, copier)
        source = self._copy.get(slot)
        if source is not None:
            done = False
            try:
                if self.copies is None:
                    try:
                        self.copies = await copier.copies_slots(slot)  # idle, unused: no harm
                    finally:
                        self._answered()
                if self.copies:
                    if (warmed := self._warmed.get(source)) is not None:
                        await warmed.wait()
                    self.copies = done = await copier.copy_slot(source, slot)
            except BackendError:
                pass  # not this time: it prefills
            finally:
                if not done:
                    self._warming.add(slot)
                if self._copy.pop(slot, None) is not None:
                    self._copied(source)
        if (read := self._read.get(slot)) is not None:
            await read.wait()
        if (back := self._restore.pop(slot, None)) is not None:
            await self._restored(slot, *back, copier)

    async def _before(self, slot: int, copier: CopiesSlots) -> None:
        """An idle save of ``slot`` in flight ended, then the history it holds saved to its
        owner's file where :meth:`take` planned it (the map written in the background)."""
        self._copier = copier
        if (saving := self._saving.get(slot)) is not None:
            await asyncio.wait({saving})
        if (owner := self._save.pop(slot, None)) is not None and slot in self._dirty:
            await self._saved(slot, owner, copier)
            self._later(self.files.flush())

    async def _saved(self, slot: int, owner: str, copier: CopiesSlots) -> None:
        if not isinstance(copier, KeepsSlots):
            return
        if isinstance(copier, SaysModel):  # files of another model are given up
            try:
                self.files.made_by(await copier.served_model())
            except BackendError:
                return
        name = self.files.name_for(owner)
        try:
            done = await copier.keep_slot(slot, "save", name)
        except BackendError:  # not this time: the owner prefills when it comes back
            self.files.drop(owner)
            return
        if done is None:
            self.files.drop(owner)
            if self.copies is None:  # a server without --slot-save-path answers 501
                self.copies = False
            return
        tokens, size = done
        history, said = self._sent.get(slot, (tokens, ()))
        self.files.saved(owner, name, tokens=tokens, history=history, size=size, said=said)
        self._dirty.discard(slot)

    async def _restored(self, slot: int, conv_id: str, kept: Kept, copier: CopiesSlots) -> None:
        if not isinstance(copier, KeepsSlots) or self.files.kept(conv_id) != kept:
            return  # its file was given to another conversation meanwhile
        if isinstance(copier, SaysModel):
            try:
                same = self.files.made_by(await copier.served_model())
            except BackendError:
                same = True  # not known: the restore's check tells
            if not same:
                self._verdict[slot] = (conv_id, "model changed")
                self._later(self.files.flush())
                return
        try:
            done = await copier.keep_slot(slot, "restore", kept.name)
        except BackendError:
            done = None
        if done is not None and done[0]:
            self._verify[slot] = (conv_id, replace(kept, history=min(done[0], kept.history)))
            self._dirty.discard(slot)  # what it holds is that file's
            self._expect[slot] = conv_id
        else:  # the server kept no such file (removed, or of another build): cold, counted
            self.restores_failed += 1
            self.files.drop(conv_id)
            self._verdict[slot] = (conv_id, "failed")
            self._later(self.files.flush())

    def _later(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """``work`` in the background, kept until it ends (awaited by :meth:`settled`)."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _save_when_idle(self, slot: int) -> None:
        """After a turn on ``slot``, with no turn of this daemon on the server: the slot
        saved to its conversation's file in the background (the reply is committed and
        nothing waits on it), and the durable map written after it."""
        copier, owner = self._copier, self._owner.get(slot)
        if copier is None or owner is None or not self.restores or self.copies is False:
            return
        if not isinstance(copier, KeepsSlots) or slot in self._saving:
            return
        if any(self._load.values()):
            return  # the server is busy: saved before another conversation takes it
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no running loop (a test's synchronous use)
            return

        async def save() -> None:
            try:
                if slot in self._dirty and self._owner.get(slot) == owner:
                    await self._saved(slot, owner, copier)
                await self.files.flush()
            except Exception as exc:  # a background save never fails a turn
                log.warning("kv_save_failed", conv=owner, error=str(exc))
            finally:
                self._saving.pop(slot, None)

        self._saving[slot] = self._later(save())

    async def settled(self) -> None:
        """The slot saves and map writes in flight ended (a closing provider), at most
        ``SETTLE`` seconds."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=SETTLE)

    def _answered(self) -> None:
        if (asking := self._asking) is not None:
            self._asking = None
            asking.set()

    def _copied(self, source: int) -> None:
        self._reads[source] -= 1
        if not self._reads[source]:
            del self._reads[source]
            self._read.pop(source).set()

    def _mark(self, slot: int, conv_id: str, prefix: str, *, warming: bool = True) -> int:
        if self._holds.get(slot) != prefix and warming:
            self._warming.add(slot)
        self._holds[slot], self._owner[slot] = prefix, conv_id
        self._expect.pop(slot, None)
        self._load[slot] = self._load.get(slot, 0) + 1
        self._used[slot] = next(self._tick)
        _remember(self._conv, conv_id, slot)
        return slot

    def give(self, slot: int) -> None:
        """A turn on ``slot`` is over: the slot holds that turn's prompt (and prefix)."""
        self._load[slot] = max(0, self._load.get(slot, 0) - 1)
        if (source := self._copy.pop(slot, None)) is not None:  # ended before it was made
            self._copied(source)
            if self.copies is None:
                self._answered()  # the one plan while the server had not said: not asked
        self._dirty.add(slot)  # its cache is that turn's now, in no file
        self._warming.discard(slot)  # the server runs a slot's turns in order: the first
        # to end is the one that prefilled the prefix; those queued behind it reuse it
        if (warmed := self._warmed.pop(slot, None)) is not None:
            warmed.set()  # the copies waiting for that prefill are made now
        if not self._load.get(slot):
            self._save_when_idle(slot)

    def observed(self, slot: int, conv_id: str, reused: int | None) -> bool:
        """What the server reused of a turn's prompt (its cache figure). A turn on its own
        slot that reused nothing, ``MISSES`` times in a row, means the server does not keep a
        named slot's history: llama-server with ``-np`` left to it unifies its KV cache and
        moves idle slots into host memory at each new request (``--cache-idle-slots``), so a
        named slot starts empty while the server, left to pick, finds the prompt in that
        cache. Then no slot is named any more. True: that was decided now."""
        if reused is None or self._expect.get(slot) != conv_id:
            return False
        del self._expect[slot]
        self._misses = 0 if reused else self._misses + 1
        if self._misses < MISSES or not self.named:
            return False
        self.named = False
        return True

    def verified(
        self, slot: int | None, conv_id: str, reused: int | None, sent: int | None,
        said: tuple[int, ...] = (),
    ) -> str:  # fmt: skip
        """After a turn on ``slot``: whether the file restored into it held (its reuse came
        to the history restored, less ``SHORT``), where its request (``said``: its messages,
        :func:`kvfiles.digest`) begins with that history's. "" (nothing to say or nothing
        to tell by), "restored", "failed", or "off" (this failure stopped restores here)."""
        if slot is None:
            return ""
        if sent is not None:
            self._sent[slot] = (sent, said)
        known = self._verdict.pop(slot, None)
        if known is not None and known[0] == conv_id:
            return known[1]
        check = self._verify.pop(slot, None)
        if check is None or check[0] != conv_id or reused is None:
            return ""
        kept = check[1]
        if said[: len(kept.said)] != kept.said:
            return ""  # its history was summarised since: this turn cannot tell
        if reused + SHORT >= kept.history:
            self._failing = 0
            return "restored"
        self.restores_failed += 1
        self._failing += 1
        self.files.drop(conv_id)
        if self._failing < RESTORE_FAILS or not self.restores:
            return "failed"
        self.restores = False
        return "off"

    def remembered(self) -> int:
        return len(self._conv)


def _remember(seen: OrderedDict[str, int], key: str, slot: int) -> None:
    seen[key] = slot
    seen.move_to_end(key)
    while len(seen) > KEPT:
        seen.popitem(last=False)


@runtime_checkable
class NamesSlots(Protocol):
    """A backend whose server lets a request name its slot (llama-server ``id_slot``)."""

    async def slot_ids(self) -> int:
        """How many slots a request may name (0: none); raises BackendError."""
        ...


@runtime_checkable
class CopiesSlots(Protocol):
    """A server that copies one slot's cache into another (llama-server's ``/slots`` save
    and restore, where it was started with ``--slot-save-path``)."""

    async def copies_slots(self, idle: int) -> bool:
        """Whether the server copies slots (asked of ``idle``, a slot no request is on).
        Raises BackendError."""
        ...

    async def copy_slot(self, source: int, target: int) -> bool:
        """``source``'s cache into ``target``; False: the server did not copy it.
        Raises BackendError."""
        ...


@runtime_checkable
class SaysModel(Protocol):
    """A server that says which model file it serves (llama-server ``/props``
    ``model_path``): slot files are restored only into the model that made them."""

    async def served_model(self) -> str:
        """The model the server serves ("": it does not say). Raises BackendError."""
        ...


@runtime_checkable
class KeepsSlots(Protocol):
    """A server that saves a slot's cache to a named file and restores it into any slot
    (llama-server's ``/slots`` ``save`` and ``restore``)."""

    async def keep_slot(self, slot: int, action: str, filename: str) -> tuple[int, int] | None:
        """``action`` "save" or "restore" of ``slot`` with ``filename``: the tokens and bytes
        saved or restored, None where the server did not. Raises BackendError."""
        ...


class Pinned:
    """A backend whose every request of one turn names ``slot`` (the reply and the summary
    call the turn may make first: both start with the prompt that slot holds)."""

    def __init__(self, inner: Backend, slot: int) -> None:
        self.inner, self.slot = inner, slot
        self.name, self.label, self.concurrency = inner.name, inner.label, inner.concurrency

    def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        return self.inner.stream(replace(request, slot=self.slot))

    async def capabilities(self, model: str) -> Capabilities:
        return await self.inner.capabilities(model)

    async def check(self, model: str | None) -> list[Check]:
        return await self.inner.check(model)

    async def models(self) -> list[str]:
        return await self.inner.models()

    async def forget(self, conversation_id: str, session: BackendSession | None = None) -> None:
        await self.inner.forget(conversation_id, session)

    async def aclose(self) -> None:
        return None  # the client is the provider's, not this turn's
