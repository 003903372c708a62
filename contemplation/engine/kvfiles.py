"""Which conversations have their slot's cache kept in a file of the server.

llama-server started with ``--slot-save-path`` writes a slot's KV cache to a file named by the
request (``POST /slots/{id}?action=save``) and reads it back into any slot (``restore``). It
has no call that deletes a file, so the files are a pool of names that are written over: at
most ``FILES`` names, and no new name once the files written come to ``BYTES``; past either,
the conversation kept longest ago (least recently saved or restored) gives its name up. So
10,000 conversations cost at most ``FILES`` files and about ``BYTES`` bytes (one file more
while a larger one is written over a smaller). A file is a slot's cache: up to its window's
tokens (SmolLM2-135M: ~23 KB a token; an 8B model: ~128 KB a token).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

import structlog

from contemplation.models import ChatMessage

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

    def name_for(self, conv_id: str) -> str:
        """The file to save ``conv_id``'s slot into: its own, else a new name while under
        both bounds, else one given up, else the least recently kept conversation's."""
        if (kept := self._kept.get(conv_id)) is not None:
            return kept.name
        if self._free:
            return self._free.pop()
        if self._names < self.files and self.size() < self.budget:
            self._names += 1
            return f"{PREFIX}{self._names - 1}.bin"
        _, oldest = self._kept.popitem(last=False)
        return oldest.name

    def saved(
        self, conv_id: str, name: str, *, tokens: int, history: int, size: int,
        said: tuple[int, ...] = (),
    ) -> None:  # fmt: skip
        self._kept[conv_id] = Kept(name, tokens, history, size, said)
        self._kept.move_to_end(conv_id)

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

    def size(self) -> int:
        return sum(k.size for k in self._kept.values())

    def __contains__(self, conv_id: object) -> bool:
        return conv_id in self._kept

    def __len__(self) -> int:
        return len(self._kept)


def digest(messages: Iterable[ChatMessage]) -> tuple[int, ...]:
    """A request's messages, one number each: a turn whose request begins with the messages
    of the turn a file was saved after must find that file's history in the cache; one whose
    history was summarised meanwhile need not (its check is skipped)."""
    return tuple(hash((m.role, m.content, m.tool_call_id)) for m in messages)


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
    elif verdict == "off":
        log.error(
            "kv_restores_off",
            provider=provider,
            conv=conv_id,
            why="restored slot files did not hold on this server: no more restores "
            "until the daemon starts again",
        )
