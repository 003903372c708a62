"""Which conversations have their slot's cache kept in a file of the server.

llama-server started with ``--slot-save-path`` writes a slot's KV cache to a file named by the
request (``POST /slots/{id}?action=save``) and reads it back into any slot (``restore``). It
has no call that deletes a file, so the files are a pool of names that are written over: at
most ``FILES`` names, and no new name once the files written come to ``BYTES``; past either,
the conversation kept longest ago (least recently saved or restored) gives its name up. So
10,000 conversations cost at most ``FILES`` files and about ``BYTES`` bytes (one file more
while a larger one is written over a smaller). A file is a slot's cache: up to its window's
tokens (SmolLM2-135M: ~23 KB a token; an 8B model: ~128 KB a token).

Kept across restarts (:meth:`KvFiles.durable`): the pool is read from the home's durable map
(:mod:`kvmap`) when a provider is first used and written back, off the event loop, after each
save (:meth:`KvFiles.flush`); a name is random, so a daemon started again never writes over a
file the map still gives to a conversation. The model the files were made by is kept with
them: files of another model are never restored (``model changed``), and a conversation
whose file was given up is remembered (``file evicted``), for the ledger's miss cause.
"""

from __future__ import annotations

import hashlib
import secrets
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from contemplation.base.aio import on_thread
from contemplation.models import ChatMessage
from contemplation.writer import kvmap
from contemplation.writer.slotfiles import drop_slot_files

log = structlog.get_logger("contemplation.kv")
FILES = 64  # names in the pool
BYTES = 8 << 30  # no new name once the files written come to this
PREFIX = "contemplation-kv-"


@dataclass(frozen=True, slots=True)
class Kept:
    name: str  # the file's name on the server
    tokens: int  # tokens the file holds
    history: int  # prompt tokens of the conversation's last turn (what a restore must give)
    size: int  # bytes written (0: the server did not say)
    said: tuple[int, ...] = ()  # that turn's messages (:func:`digest`)


@dataclass
class KvFiles:
    files: int = FILES
    budget: int = BYTES
    _kept: OrderedDict[str, Kept] = field(default_factory=OrderedDict)  # conversation -> file
    _free: list[str] = field(default_factory=list)  # names given up, to be written over
    _names: int = 0  # names handed out so far
    model: str = ""  # the server's model the files were made by ("": not known yet)
    home: Path | None = None  # where the durable map is (None: kept in memory only)
    provider: str = ""  # whose part of the map
    _evicted: OrderedDict[str, None] = field(default_factory=OrderedDict)  # files given up
    _changed: bool = False  # the map on disk is behind
    folder: Path | None = None  # the server's --slot-save-path, where files are removed

    @classmethod
    def durable(
        cls, home: Path, provider: str, *, budget: int = BYTES, folder: Path | None = None
    ) -> KvFiles:
        """The pool of ``provider``, read from the home's durable map (:mod:`kvmap`). The
        files of conversations gone since the map was written (archived, pruned, deleted
        while no daemon ran) are removed from ``folder`` (the server's, when known)."""
        got = kvmap.load(home, provider)
        if folder is not None and got.gone:
            drop_slot_files(folder, got.gone)
        pool = cls(budget=budget, model=got.model, home=home, provider=provider, folder=folder)
        for e in got.entries:
            pool._kept[e.conv] = Kept(e.name, e.tokens, e.history, e.size, e.said)
        pool._free = list(dict.fromkeys(got.free))[: pool.files]
        pool._names = len(pool._kept) + len(pool._free)
        pool._evicted = OrderedDict.fromkeys(got.evicted)
        return pool

    def name_for(self, conv_id: str) -> str:
        """The file to save ``conv_id``'s slot into: its own, else a new name while under
        both bounds, else one given up, else the least recently kept conversation's."""
        if (kept := self._kept.get(conv_id)) is not None:
            return kept.name
        if self._free:
            self._changed = True
            return self._free.pop()
        if self._names < self.files and self.size() < self.budget:
            self._names += 1
            return f"{PREFIX}{secrets.token_hex(12)}.bin"
        gone, oldest = self._kept.popitem(last=False)
        self.evicted(gone)
        return oldest.name

    def evicted(self, conv_id: str) -> None:
        """``conv_id``'s file was given up to another conversation (remembered, bounded)."""
        self._evicted[conv_id] = None
        self._evicted.move_to_end(conv_id)
        while len(self._evicted) > kvmap.EVICTED_KEPT:
            self._evicted.popitem(last=False)
        self._changed = True

    def was_evicted(self, conv_id: str) -> bool:
        return conv_id in self._evicted

    def saved(
        self, conv_id: str, name: str, *, tokens: int, history: int, size: int,
        said: tuple[int, ...] = (),
    ) -> None:  # fmt: skip
        self._kept[conv_id] = Kept(name, tokens, history, size, said)
        self._kept.move_to_end(conv_id)
        self._evicted.pop(conv_id, None)
        self._changed = True

    def kept(self, conv_id: str) -> Kept | None:
        """``conv_id``'s file, if it has one (kept as the most recent from now on)."""
        if (kept := self._kept.get(conv_id)) is not None:
            self._kept.move_to_end(conv_id)
        return kept

    def drop(self, conv_id: str) -> None:
        """``conv_id``'s file no longer holds its history (a failed restore, a new turn
        elsewhere): its name is written over by the next save."""
        if (kept := self._kept.pop(conv_id, None)) is not None:
            self._free.append(kept.name)
            self._changed = True

    def forget(self, conv_id: str) -> list[str]:
        """A conversation gone (archived, pruned, deleted): the names of its files (its own,
        and its panel seats', ``<id>#<seat>``), given up. Returns those names."""
        gone = [c for c in self._kept if c == conv_id or c.startswith(f"{conv_id}#")]
        names = [self._kept[c].name for c in gone]
        for c in gone:
            self.drop(c)
        return names

    def made_by(self, model: str) -> bool:
        """Whether the files were made by ``model`` (the server's model now). Files of
        another model are all given up (their names written over), and the model is
        noted as theirs from now on."""
        if not model or self.model == model:
            return True
        known, self.model, self._changed = self.model, model, True
        if not known:
            return True
        for conv_id in list(self._kept):
            self.drop(conv_id)
        return False

    async def flush(self) -> None:
        """The durable map brought up to the pool, off the event loop (none: nothing)."""
        if self.home is None or not self._changed:
            return
        self._changed = False
        saved = kvmap.Saved(
            self.model,
            tuple(kvmap.Entry(c, k.name, k.tokens, k.history, k.size, k.said)
                  for c, k in self._kept.items()),
            tuple(self._evicted),
            tuple(self._free),
        )  # fmt: skip
        home, provider = self.home, self.provider
        seq = kvmap.snapshot()
        try:
            written = await on_thread(lambda: kvmap.store(home, provider, saved, seq))
        except OSError as exc:
            self._changed = True
            log.warning("kv_map_not_written", provider=provider, error=str(exc))
            return
        for e in saved.entries:  # conversations gone meanwhile: their names freed
            if e not in written.entries and e.conv in self._kept:
                self.drop(e.conv)
        await self.remove(written.gone)

    async def remove(self, names: Iterable[str]) -> list[str]:
        """Files given up by conversations that are gone, removed from the server's folder
        (off the event loop; none without a folder). Returns the names removed."""
        folder, names = self.folder, list(names)
        if folder is None or not names:
            return []
        removed = await on_thread(lambda: drop_slot_files(folder, names))
        if removed:
            log.info("kv_files_removed", provider=self.provider, files=len(removed))
        return removed

    def size(self) -> int:
        return sum(k.size for k in self._kept.values())

    def conversations(self) -> list[str]:
        """The keys (a conversation's id, or ``<id>#<seat>``) that have a file."""
        return list(self._kept)

    def __contains__(self, conv_id: object) -> bool:
        return conv_id in self._kept

    def __len__(self) -> int:
        return len(self._kept)


def digest(messages: Iterable[ChatMessage]) -> tuple[int, ...]:
    """A request's messages, one number each: a turn whose request begins with the messages
    of the turn a file was saved after must find that file's history in the cache; one whose
    history was summarised meanwhile need not (its check is skipped)."""
    return tuple(_hashed(m) for m in messages)


def _hashed(m: ChatMessage) -> int:
    """A message's number, the same in every process (the map keeps it across restarts)."""
    text = "\x00".join((m.role, m.content, m.tool_call_id or ""))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "big")


def said(provider: str, conv_id: str, verdict: str) -> None:
    """The log's word on a restore a turn checked (see ``SlotAffinity.verified``): a failed
    one as a warning, the one that turns restores off once, as an error naming why."""
    if verdict == "restored":
        log.debug("kv_restored", provider=provider, conv=conv_id)
    elif verdict == "failed":
        log.warning(
            "kv_restore_failed",
            provider=provider,
            conv=conv_id,
            why="the turn reused less than the history restored (llama.cpp #26676)",
        )
    elif verdict in {"model changed", "evicted"}:
        log.info(f"kv_{verdict.replace(' ', '_')}", provider=provider, conv=conv_id)
    elif verdict == "off":
        log.error(
            "kv_restores_off",
            provider=provider,
            conv=conv_id,
            why="restored slot files did not hold on this server: no more restores "
            "until the daemon starts again",
        )
