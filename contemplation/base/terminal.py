"""Model text made safe to print on a terminal (the log itself keeps every byte).

A reply can carry escape sequences that a terminal obeys: OSC 52 writes the clipboard, OSC 0
sets the window title, CSI moves the cursor or clears the screen, a bare carriage return
overwrites the line, bidi overrides reorder what is shown. Every such character is shown in
caret or ``\\u`` notation instead. The mapping is per character, so a sequence split across
two chunks of ``tail -f`` is neutralised just the same.
"""

from __future__ import annotations

_TABLE: dict[int, str | None] = {
    **{c: f"^{chr(c + 64)}" for c in range(0x20) if c not in (0x09, 0x0A, 0x0D)},
    0x0D: None,  # a carriage return would let text overwrite the line before it
    0x7F: "^?",
    **{c: f"\\x{c:02x}" for c in range(0x80, 0xA0)},  # C1 controls (CSI, OSC, ST as one char)
    **{c: f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))},  # bidi
}


def safe(text: str) -> str:
    """``text`` with every terminal control shown, not obeyed (newline and tab are kept)."""
    return text.translate(_TABLE)
