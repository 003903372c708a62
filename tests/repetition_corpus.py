"""A corpus for the loop watch (contemplation/protocol/repetition.py): honest structured
answers that repeat exactly and correctly, and loops a model really falls into.

``honest()``: what a model is asked for and answers rightly, of every shape that repeats a
span back to back (JSON arrays of identical records, tables of identical rows, CSV of zeros,
separator lines, base64 of zero bytes, zero matrices, repeated ``assert`` lines, logs, code,
YAML, SQL, a FASTA sequence with a poly-A tail), built here from the standard library's own
encoders (json, csv, base64, textwrap) the way a model's answer would print, and real text
(the standard library's sources, a calendar CSV, the HTTP status table). Sizes are those of an
answer a person asks for (the issue's case: 60 identical records held to a schema).

``loops()``: degenerate loops, each with the text before it (its ``start``): the scripted ones
of tests/unit/protocol/test_repetition.py, those SmolLM2 falls into on llama.cpp at
temperature 0 (tests/system/test_reply_cut.py's ask and the README's, its runs of emoji and
of fullwidth ``U+FF01``), and loops of data (a model that prints the same record until its window
ends), which the watch must still stop, later (see its module).

``smollm2()``: SmolLM2-135M's own replies, recorded (tests/repetition_smollm2.json, which says
how): ``loops`` that fell into an exact loop, ``honest`` ones that did not (also in
``honest()``), and ``runs`` of one emoji or ``U+FF01`` that ended before the watch's 600
characters."""

from __future__ import annotations

import base64
import calendar
import csv
import datetime
import difflib
import http
import io
import json
import string
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RECORDED = Path(__file__).with_name("repetition_smollm2.json")


@dataclass(frozen=True)
class Looping:
    """A reply that falls into a loop: ``start`` (honest), then ``span`` repeated ``times``."""

    name: str
    start: str
    span: str
    times: int

    @property
    def text(self) -> str:
        return self.start + self.span * self.times


def _json_records() -> str:
    # the case: "return exactly 60 records, each {id: 0, status: 'pending', ...}"
    rec = {"id": 0, "status": "pending", "owner": None, "tags": [], "score": 0.0}
    return json.dumps([rec] * 60, indent=2)


def _json_compact() -> str:
    rec = {"sku": "A-100", "qty": 1, "price": 9.99, "in_stock": True}
    return json.dumps({"items": [rec] * 100}).replace("}, {", "},\n  {")


def _json_strings() -> str:
    return json.dumps({"labels": ["unknown"] * 150})


def _table() -> str:
    head = "| Host | Status | Errors | Last seen |\n|---|---|---:|---|\n"
    return "All hosts report the same state:\n\n" + head + "| - | ok | 0 | never |\n" * 80


def _csv_zeros() -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([f"c{i}" for i in range(12)])
    w.writerows([[0] * 12] * 200)
    return buf.getvalue()


def _tsv_zeros() -> str:
    return "\n".join("\t".join(["0"] * 16) for _ in range(120)) + "\n"


def _separators() -> str:
    parts = []
    for i, title in enumerate(["Summary", "Details", "Appendix"]):
        parts += ["=" * 120, title.center(120), "=" * 120, "-" * 120, f"Section {i}", "─" * 200]
    parts += ["#" * 100, "# generated", "#" * 100, "* " * 60, ". " * 300, "_" * 160]
    parts += ["Wide report", "=" * 720, "-" * 720]  # a separator as wide as its table
    return "\n".join(parts) + "\n"


def _base64_zeros() -> str:
    return base64.b64encode(bytes(4096)).decode()  # 5,464 characters of 'A'


def _base64_wrapped() -> str:
    return (
        "-----BEGIN DATA-----\n" + base64.encodebytes(bytes(4096)).decode() + "-----END DATA-----\n"
    )


def _zero_matrix() -> str:
    rows = ["[" + ", ".join(["0"] * 32) + "]" for _ in range(32)]
    return "```python\nzeros = [\n    " + ",\n    ".join(rows) + ",\n]\n```\n"


def _zero_matrix_float() -> str:
    rows = ["[" + " ".join(["0."] * 16) + "]" for _ in range(40)]
    return "array([" + "\n       ".join(rows) + "])\n"


def _latex_matrix() -> str:
    row = " & ".join(["0"] * 10) + r" \\" + "\n"
    return "\\begin{pmatrix}\n" + row * 40 + "\\end{pmatrix}\n"


def _asserts() -> str:
    lines = ["def test_buffer_starts_zeroed() -> None:", "    buf = bytearray(64)"]
    lines += ["    assert buf.pop() == 0"] * 64
    lines += ["", "", "def test_flags() -> None:"]
    lines += ["    assert not flags.pop()"] * 40
    return "\n".join(lines) + "\n"


def _logs() -> str:
    lines = ["$ docker compose up"] + [
        "[db] waiting for the database to accept connections..."
    ] * 60
    lines += ["web-1  | INFO:     Waiting for application startup."] * 40
    lines += ["GET /health HTTP/1.1 200 OK"] * 90
    return "\n".join(lines) + "\n"


def _c_array() -> str:
    vals = ", ".join(["0x00"] * 1024)
    return (
        "static const uint8_t pad[1024] = {\n    "
        + "\n    ".join(textwrap.wrap(vals, 78))
        + "\n};\n"
    )


def _hexdump() -> str:
    return "".join(
        f"{off:08x}: 0000 0000 0000 0000 0000 0000 0000 0000  ................\n"
        for off in range(0, 4096, 16)
    )


def _yaml() -> str:
    item = "  - name: worker\n    image: app:latest\n    replicas: 1\n    env: []\n"
    return "services:\n" + item * 40


def _sql() -> str:
    return "INSERT INTO slots (used, owner) VALUES\n" + "  (0, NULL),\n" * 150 + "  (0, NULL);\n"


def _fasta() -> str:
    seq = "ATGGCGTACGCTAGCTAGGCTTACGATCG" * 4 + "A" * 1500
    return ">mrna_1 with its poly(A) tail\n" + "\n".join(textwrap.wrap(seq, 60)) + "\n"


def _grid() -> str:
    return "\n".join([". " * 40] * 40) + "\n"


def _html() -> str:
    return "<table>\n" + "  <tr><td>0</td><td>0</td><td>0</td></tr>\n" * 80 + "</table>\n"


def _stdlib(mod: object) -> str:
    return Path(str(getattr(mod, "__file__", ""))).read_text()


def _calendar_csv() -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    day = datetime.date(2024, 1, 1)
    while day.year < 2026:
        w.writerow([day.isoformat(), calendar.day_name[day.weekday()], day.month])
        day += datetime.timedelta(days=1)
    return buf.getvalue()


def _http_table() -> str:
    rows = ["| Code | Phrase |", "|---:|---|"]
    return "\n".join(rows + [f"| {s.value} | {s.phrase} |" for s in http.HTTPStatus])


def smollm2() -> dict[str, dict[str, str]]:
    """``loops``, ``honest`` and ``runs``: name -> SmolLM2's reply (see the module)."""
    data: dict[str, Any] = json.loads(RECORDED.read_text(encoding="utf-8"))
    return {
        kind: {n: r["text"] for n, r in data[kind].items()} for kind in ("loops", "honest", "runs")
    }


def honest() -> dict[str, str]:
    """Name: an honest answer that the watch must never stop."""
    said = {f"smollm2: {n}": t for n, t in smollm2()["honest"].items()}
    return said | {
        "json array of 60 identical records": _json_records(),
        "json array of 100 identical records, one a line": _json_compact(),
        "json array of 150 identical strings": _json_strings(),
        "markdown table of 80 identical rows": _table(),
        "csv of zeros, 200 rows": _csv_zeros(),
        "tsv of zeros, 120 rows": _tsv_zeros(),
        "separator lines": _separators(),
        "base64 of 4 KiB of zero bytes": _base64_zeros(),
        "base64 of 4 KiB of zero bytes, wrapped": _base64_wrapped(),
        "zero matrix 32x32": _zero_matrix(),
        "zero matrix numpy 40x16": _zero_matrix_float(),
        "zero matrix latex 40x10": _latex_matrix(),
        "repeated assert lines": _asserts(),
        "logs of identical lines": _logs(),
        "c array of 1024 zero bytes": _c_array(),
        "hexdump of zero bytes": _hexdump(),
        "yaml of 40 identical services": _yaml(),
        "sql insert of 150 identical rows": _sql(),
        "fasta with a poly-A tail": _fasta(),
        "dot grid 40x40": _grid(),
        "html table of 80 identical rows": _html(),
        "python: difflib.py": _stdlib(difflib),
        "python: string.py": _stdlib(string),
        "csv: two years of days": _calendar_csv(),
        "markdown: http statuses": _http_table(),
    }


README = "In one sentence: why is a folder of text files a good queue?\n\nContemplation is"
#: what SmolLM2-135M says at temperature 0 (tests/system/test_reply_cut.py's LOOP_ASK)
SMOL_START = (
    "the queue and the folder and the queue and the folder and the queue and the folder and "
)


def loops() -> list[Looping]:
    """Loops the watch must stop: prose ones as soon as before, data ones later."""
    para = (
        "The warehouse stores the data for the analysts, who query it every morning "
        "to build the reports that the managers read before their meetings.\n\n"
    )
    honest_start = _stdlib(textwrap)[:3000] + "\nThe end. The end. "
    return [
        Looping("readme: and a data warehouse", README, " and a data warehouse", 400),
        Looping(
            "smollm2: the queue and the folder", SMOL_START, "the queue and the folder and ", 300
        ),
        Looping("i hope this helps, after code", honest_start, "I hope this helps! ", 300),
        Looping("one character", "Sure", "!", 3000),
        Looping("a paragraph", "Here is what I think.\n\n", para, 60),
        Looping("a short line", "Sure.\n", "Yes!\n", 2000),
        Looping("abc", "xxxxx", "abc ", 2000),
        Looping("sorry", "", "I'm sorry, I can't help with that. ", 300),
        Looping("smollm2: pineapples", "Here are some fruits:\n\n", "🍍", 2000),
        Looping("smollm2: fullwidth shouts", "🍍" * 100, "\uff01", 2000),
        Looping("cjk", "数据仓库是", "一个数据仓库和", 300),
        Looping("blank lines", "Done.", "\n", 20_000),
        Looping("data: zeros", "[", "0, ", 20_000),
        Looping("data: a json record", "[\n", '  {"id": 0, "name": "item"},\n', 2000),
        Looping("data: a table row", "| a | b |\n|---|---|\n", "| x | 0 |\n", 5000),
        Looping("data: a code line", "def f():\n", "    x = x + 1\n", 3000),
    ]
