"""Pure: a search query as typed → an FTS5 expression that can only search what it is given to,
and the pattern that marks its words in a snippet.

The syntax is FTS5's, less what could reach past the columns a search is given: words,
``"a phrase"``, ``prefix*`` (a word or a phrase), ``AND``/``OR``/``NOT``, ``( … )`` and
``NEAR(… , N)``. Every word is made an FTS5 string, so ``thinking : word``, ``{body thinking}``,
``^word`` or ``-word`` are text, never a column filter or an operator; a query that is not
that syntax (an unbalanced ``(`` or ``"``) is one phrase of its words, as before.

Refused in one line (:class:`InputRejected`): a query past :data:`MAX_QUERY_BYTES` (a 100 KB
one took 30 s), and a prefix shorter than :data:`MIN_PREFIX` letters (``a*`` expands to every
word that starts with an a).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from contemplation.errors import InputRejected

MAX_QUERY_BYTES = 1024
MIN_PREFIX = 3  # letters before a '*'
OPERATORS = frozenset({"AND", "OR", "NOT"})

_TOKEN = re.compile(r'"(?:[^"]|"")*"|NEAR\(|[(),]|[^\s"(),]+|"')
_WORD = re.compile(r"[^\W_]+")
_DISTANCE = re.compile(r"\d+")


@dataclass(frozen=True, slots=True)
class Parsed:
    """The FTS5 expression, and the phrases it looks for (each a tuple of words; the last
    one a prefix when ``prefix``) for the snippet's marks."""

    expression: str
    phrases: tuple[tuple[tuple[str, ...], bool], ...]
    as_phrase: str = ""  # the whole query as one phrase (when FTS5 rejects the expression)

    def needles(self) -> tuple[str, ...]:
        """Each phrase's first word, lower case: a piece of text that holds none of them
        (lower-cased) holds no match, found at ``str.find``'s speed (the pattern's scan is
        20 times slower)."""
        return tuple({words[0].lower() for words, _ in self.phrases if words})

    def pattern(self) -> re.Pattern[str] | None:
        """What marks a match in a block's text: each phrase's words, any separators
        between them, case folded (longest phrase first, so it wins over its own words)."""
        alts = []
        for words, prefix in sorted(self.phrases, key=lambda p: -len(p[0])):
            body = r"[\W_]+".join(re.escape(w) for w in words)
            alts.append(rf"(?<![^\W_]){body}" + (r"[^\W_]*" if prefix else r"(?![^\W_])"))
        return re.compile("|".join(alts), re.IGNORECASE) if alts else None


def parse(query: str) -> Parsed:
    """``query`` as an FTS5 expression of strings; raises :class:`InputRejected` for an
    empty or too long query, or a prefix too short."""
    q = query.strip()
    if not q:
        raise InputRejected("the search needs a query")
    size = len(q.encode("utf-8", errors="replace"))
    if size > MAX_QUERY_BYTES:
        raise InputRejected(
            f"the query is {size} bytes; a search takes at most {MAX_QUERY_BYTES}: "
            "search for fewer words"
        )
    phrase = '"' + q.replace('"', '""') + '"'
    words = tuple(_WORD.findall(q))
    if not words:
        raise InputRejected(f"the query {q!r} has no word to look for")
    got = _safe(q, phrase)
    if got is None:  # not the syntax: the words as said
        got = Parsed(phrase, ((words, False),), phrase)
    for words, prefix in got.phrases:
        if prefix and (not words or len(words[-1]) < MIN_PREFIX):
            shown = " ".join(words) + "*"
            raise InputRejected(
                f"a prefix needs at least {MIN_PREFIX} letters before '*' ({shown!r} would "
                "match too many words): type more of the word"
            )
    return got


def _safe(q: str, phrase: str) -> Parsed | None:
    """The expression with every word and phrase an FTS5 string; None when ``q`` is not
    the syntax (an unbalanced parenthesis or quote)."""
    tokens = _TOKEN.findall(q)
    out: list[str] = []
    phrases: list[tuple[tuple[str, ...], bool]] = []
    groups: list[str] = []  # "(" or "NEAR(" open
    i = 0
    while i < len(tokens):
        t = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        i += 1
        if t in {"(", "NEAR(", ")"}:
            if not _grouped(t, groups):
                return None
            out.append(t)
        elif t == ",":  # NEAR's distance; elsewhere punctuation
            if groups[-1:] == ["NEAR("] and _DISTANCE.fullmatch(nxt):
                out.append(f", {nxt}")
                i += 1
        elif t in OPERATORS:
            out.append(t)
        else:
            term = _term(t, nxt)
            if term is None:
                return None  # a quote never closed
            text, words, prefix = term
            i += t.startswith('"') and prefix  # the '*' after a phrase
            if words:  # punctuation alone, "" or "...": no word to look for
                out.append(text)
                phrases.append((words, prefix))
    if groups or not phrases:
        return None
    return Parsed(" ".join(out), tuple(phrases), phrase)


def _grouped(t: str, groups: list[str]) -> bool:
    """``groups`` after a parenthesis; False for a ')' that closes nothing."""
    if t != ")":
        groups.append(t)
        return True
    if not groups:
        return False
    groups.pop()
    return True


def _term(t: str, nxt: str) -> tuple[str, tuple[str, ...], bool] | None:
    """A word or a phrase as an FTS5 string (a prefix with ' *'), its words and whether it is
    a prefix; None for a lone quote."""
    if t == '"':
        return None
    if t.startswith('"'):
        prefix = nxt != "" and nxt.strip("*") == ""
        words = tuple(_WORD.findall(t[1:-1].replace('""', '"')))
        return t + (" *" if prefix else ""), words, prefix
    word = t.rstrip("*")
    prefix = word != t
    text = '"' + word.replace('"', '""') + '"' + (" *" if prefix else "")
    return text, tuple(_WORD.findall(word)), prefix
