"""A reply stuck in a loop is seen as it streams (contemplation/protocol/repetition.py), and
honest long text of every repetitive shape is never taken for one: real CSV, real Python
files of the standard library read at test time, real markdown tables, numbered lists, a
song whose chorus comes back after every verse."""

from __future__ import annotations

import argparse
import calendar
import csv
import datetime
import difflib
import email.message
import http
import io
import json
import keyword
import random
import string
import textwrap
import unicodedata
from pathlib import Path

import pytest

from contemplation.protocol.repetition import Loop, Watch

README_LOOP = "Contemplation is a data warehouse and a data warehouse and a data warehouse"


def streamed(text: str, seed: int = 0, watch: Watch | None = None) -> Loop | None:
    """``text`` fed as a model streams it: pieces of 1 to 12 characters."""
    rng = random.Random(seed)
    w = watch or Watch()
    i = 0
    while i < len(text):
        n = rng.randint(1, 12)
        if (found := w.feed(text[i : i + n])) is not None:
            return found
        i += n
    return None


# ---------------------------------------------------------------------- loops are seen


def test_the_readme_loop_is_stopped_within_a_few_hundred_characters() -> None:
    text = "In one sentence: " + " and a data warehouse" * 200
    found = streamed(text)
    assert found is not None
    assert found.span.strip() in {"and a data warehouse", "a data warehouse and"} or (
        "data warehouse" in found.span
    )
    assert found.period == len(" and a data warehouse")
    assert found.repeats >= 3
    # seen early: after at most the least tail (600) and one look (32) past the prefix
    w = Watch()
    fed = 0
    for piece in [text[i : i + 5] for i in range(0, len(text), 5)]:
        fed += len(piece)
        if w.feed(piece):
            break
    assert fed <= 17 + 600 + 32 + 21


def test_a_loop_after_a_long_honest_answer_is_seen() -> None:
    honest = Path(textwrap.__file__).read_text()
    assert streamed(honest + "\nThe end. The end. " + "I hope this helps! " * 60) is not None


def test_a_one_character_loop_and_a_paragraph_loop_are_seen() -> None:
    assert streamed("Sure" + "!" * 700) is not None
    para = (
        "The warehouse stores the data for the analysts, who query it every morning "
        "to build the reports that the managers read before their meetings.\n\n"
    )
    found = streamed("Here is what I think.\n\n" + para * 6)
    assert found is not None and found.period == len(para)
    assert "143 characters" in found.describe() and "…»" in found.describe()
    lines = streamed("Sure.\n" + "Yes!\n" * 200)
    assert lines is not None and "\n" not in lines.describe() and "\\n" in lines.describe()


def test_once_found_it_stays_found_and_memory_is_bounded() -> None:
    w = Watch()
    honest = Path(difflib.__file__).read_text() * 3  # ~250 kB of code, no loop in it
    for i in range(0, len(honest), 7):
        assert w.feed(honest[i : i + 7]) is None
        assert len(w._text) <= 2 * w._window
    loop = streamed("x" * 5 + "abc " * 400, watch=w)
    assert loop is not None and w.feed("anything") is loop


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="min_repeats"):
        Watch(min_repeats=1)


# ---------------------------------------------------------------------- honest text is not


def _stdlib_sources() -> list[str]:
    mods = [csv, difflib, email.message, json.decoder, string, textwrap, calendar, argparse]
    return [Path(str(m.__file__)).read_text() for m in mods]


@pytest.mark.parametrize("index", range(8))
def test_real_python_files_of_the_stdlib_are_not_loops(index: int) -> None:
    src = _stdlib_sources()[index]
    assert len(src.splitlines()) > 100
    assert streamed(src, seed=index) is None


def test_python_with_repeated_structure_is_not_a_loop() -> None:
    """Many near-identical functions, a table of constants, rules of dashes."""
    out = ["# " + "-" * 77]
    for name in unicodedata.name("a"), *[unicodedata.name(chr(c)) for c in range(0x41, 0x5B)]:
        ident = name.lower().replace(" ", "_").replace("-", "_")
        out += [
            f"def test_{ident}() -> None:",
            f"    assert unicodedata.name({name!r}.lower()) is not None",
            "    assert True",
            "",
            "",
        ]
    out.append("ZEROS = [" + ", ".join(["0"] * 64) + "]")
    out.append("# " + "=" * 77)
    assert streamed("\n".join(out)) is None


def test_a_real_csv_is_not_a_loop() -> None:
    """Every day of two years: date, weekday (a cycle of seven rows), week, month."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["date", "weekday", "iso_week", "day_of_year", "month", "quarter", "is_weekend"])
    day = datetime.date(2024, 1, 1)
    while day.year < 2026:
        w.writerow([
            day.isoformat(), calendar.day_name[day.weekday()], day.isocalendar().week,
            day.timetuple().tm_yday, calendar.month_name[day.month], (day.month - 1) // 3 + 1,
            "yes" if day.weekday() >= 5 else "no",
        ])  # fmt: skip
        day += datetime.timedelta(days=1)
    text = buf.getvalue()
    assert len(text.splitlines()) > 700
    assert streamed(text) is None


def test_a_real_markdown_table_is_not_a_loop() -> None:
    rows = ["| Code | Phrase | Description |", "|---:|---|---|"]
    rows += [f"| {s.value} | {s.phrase} | {s.description or ' '} |" for s in http.HTTPStatus]
    # and a sparse one: mostly empty cells, the same marks row after row
    rows += ["", "| Letter | Upper | Lower | Digit | Space |", "|---|:-:|:-:|:-:|:-:|"]
    for c in string.printable[:94]:
        marks = [c.isupper(), c.islower(), c.isdigit(), c.isspace()]
        rows.append(f"| `{c}` | " + " | ".join("x" if m else " " for m in marks) + " |")
    assert len(rows) > 150
    assert streamed("\n".join(rows)) is None


def test_a_numbered_list_of_the_same_step_is_not_a_loop() -> None:
    lines = [f"{i}. Review the logs and restart the service if it failed." for i in range(1, 301)]
    assert streamed("Here is the checklist:\n\n" + "\n".join(lines)) is None


def test_a_song_whose_chorus_comes_back_is_not_a_loop() -> None:
    chorus = (
        "So heave away, my bully boys, the tide is running low,\n"
        "And we'll be home by morning light, wherever the wind may blow.\n"
    )
    verses = []
    for i, word in enumerate(keyword.kwlist):
        verses.append(
            f"Verse {i + 1}: We sailed upon the {word} sea, the captain at the wheel,\n"
            f"With {calendar.month_name[i % 12 + 1]} skies above us and the {word} under keel.\n"
            + chorus
        )
    song = "\n".join(verses) + "\n" + chorus  # the last chorus sung twice
    assert len(song.splitlines()) > 100
    assert streamed(song) is None
