"""Pure: split ``<think>…</think>`` out of streamed content.

Many models served over OpenAI-compatible APIs (and through llama.cpp in-process) put their
reasoning inline in the content, wrapped in ``<think>`` tags, instead of a separate
``reasoning_content`` field. :class:`ThinkSplitter` turns such a stream into ``thinking`` and
``content`` pieces. It is a small state machine fed chunk by chunk:

* a tag may be split across chunks at any character; a possible tag prefix at the end of a
  chunk is held back until the next chunk (or :meth:`ThinkSplitter.flush`) decides it;
* whitespace right after a tag is dropped (``<think>\\n`` and ``</think>\\n\\n`` are layout);
* the result does not depend on how the text was split (the tests check this with hypothesis).

Make one splitter per turn (or call :meth:`ThinkSplitter.reset`): state never leaks between turns.
"""

from __future__ import annotations

from typing import Literal

Kind = Literal["content", "thinking"]
Piece = tuple[Kind, str]


class ThinkSplitter:
    def __init__(self, open_tag: str = "<think>", close_tag: str = "</think>") -> None:
        self.open_tag = open_tag
        self.close_tag = close_tag
        self.reset()

    def reset(self) -> None:
        self.in_thinking = False
        self._held = ""  # a possible tag prefix carried over from the previous chunk
        self._skip_ws = False  # drop whitespace right after a tag

    @property
    def _tag(self) -> str:
        return self.close_tag if self.in_thinking else self.open_tag

    def feed(self, text: str) -> list[Piece]:
        """The pieces that are certain after ``text``; adjacent pieces of one kind are merged."""
        if not self._held and not self._skip_ws and self._tag[0] not in text:
            return [("thinking" if self.in_thinking else "content", text)] if text else []
        out: list[Piece] = []  # (above: no tag and no start of one, the common token)
        buf = self._held + text
        self._held = ""
        while buf:
            if self._skip_ws:
                stripped = buf.lstrip()
                if not stripped:
                    return _merge(out)  # all layout so far; keep skipping in the next chunk
                buf = stripped
                self._skip_ws = False
            tag = self._tag
            at = buf.find(tag)
            if at >= 0:
                self._emit(out, buf[:at])
                buf = buf[at + len(tag) :]
                self.in_thinking = not self.in_thinking
                self._skip_ws = True
                continue
            keep = _partial_suffix(buf, tag)
            self._emit(out, buf[: len(buf) - keep])
            self._held = buf[len(buf) - keep :]
            break
        return _merge(out)

    def flush(self) -> list[Piece]:
        """End of the turn: a held-back partial tag is plain text after all."""
        held, self._held = self._held, ""
        out: list[Piece] = []
        self._emit(out, held)
        return out

    def _emit(self, out: list[Piece], text: str) -> None:
        if text:
            out.append(("thinking" if self.in_thinking else "content", text))


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _merge(pieces: list[Piece]) -> list[Piece]:
    merged: list[Piece] = []
    for kind, text in pieces:
        if merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + text)
        else:
            merged.append((kind, text))
    return merged
