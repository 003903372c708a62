"""``File contents of`` as models write it: quoted paths with a part, roots written with ``~``
and reached through a link, hostile spellings, and reads that stay bounded on huge files."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from contemplation.errors import ToolError
from contemplation.needs.tools import parts
from contemplation.needs.tools.base import Refused
from contemplation.needs.tools.files import FileReader
from contemplation.needs.tools.parts import split_range


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp/home is the user's home; ~/notes holds plan.md (5 lines); tmp/outside a secret."""
    home = tmp_path / "home"
    (home / "notes").mkdir(parents=True)
    (home / "notes" / "plan.md").write_text("one\ntwo\nthree\nfour\nfive\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "passwd").write_text("OUTSIDE SECRET\n")
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.mark.parametrize(
    "asked",
    [
        "`~/notes/plan.md` lines 2-3",
        "'notes/plan.md' lines 2-3",
        '"plan.md", lines 2-3',
        "~/notes/plan.md (lines 2-3)",
        "`plan.md` (lines 2 to 3)",
    ],
)
def test_a_quoted_path_with_a_part_after_it(home: Path, asked: str) -> None:
    result = FileReader(["~/notes"]).read(asked)  # type: ignore[list-item]
    assert (result.text, result.note) == ("two\nthree\n", "lines 2-3 of 5")


def test_split_range_leaves_a_path_that_only_looks_like_a_range_alone() -> None:
    assert split_range("notes/lines 3.md") == ("notes/lines 3.md", 1, None)
    assert split_range("notes/line 3") == ("notes/line 3", 1, None)  # no space before 'line'
    assert split_range("a b/c.md line 3") == ("a b/c.md", 3, 3)


def test_a_root_written_with_tilde_that_is_a_link_is_found_by_its_own_name(
    home: Path, tmp_path: Path
) -> None:
    """``~/notes`` links to /data/vault: ``notes/plan.md`` is the file under the root as the
    user wrote it, not only as it resolves."""
    data = tmp_path / "data" / "vault"
    data.mkdir(parents=True)
    (data / "todo.md").write_text("the todo\n")
    (home / "linked").symlink_to(data)
    r = FileReader([Path("~/linked")])
    assert r.read("linked/todo.md").text == "the todo\n"
    assert r.read("vault/todo.md").text == "the todo\n"  # its real name too
    assert r.read("~/linked/todo.md").text == "the todo\n"


@pytest.mark.parametrize(
    ("asked", "why"),
    [
        ("~/../outside/passwd", r"'\.\.'"),
        ("~root/.bashrc", "not ~user"),
        ("~+/notes/plan.md", "not ~user"),
        ("notes/../../outside/passwd", r"'\.\.'"),
        ("~/notes/../../outside/passwd", r"'\.\.'"),
        ("/notes/plan.md", "outside the allowed folders"),
        ("~/outside.md", "outside the allowed folders"),
        ("notes/.ssh/id_rsa", "deny-list"),
        ("`~/notes/.env` lines 1-2", "deny-list"),
    ],
)
def test_hostile_spellings_are_refused(home: Path, asked: str, why: str) -> None:
    with pytest.raises(Refused, match=why):
        FileReader([home / "notes"]).read(asked)


def test_a_roots_own_name_that_leads_through_a_link_out_is_refused(
    home: Path, tmp_path: Path
) -> None:
    """Leaving out the root's name never lets a link inside the root lead out of it."""
    (home / "notes" / "notes").symlink_to(tmp_path / "outside")
    with pytest.raises(Refused, match="leads outside"):
        FileReader([home / "notes"]).read("notes/passwd")


def test_no_home_to_expand_is_a_refusal_not_a_crash(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    r = FileReader([home / "notes"])
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    with pytest.raises(Refused, match="no home folder"):
        r.read("~/notes/plan.md")


def test_a_huge_single_line_is_read_in_bounded_memory(home: Path) -> None:
    """A 16 MB file of one line (minified JSON): the answer is its first part, the note says
    so and counts its lines exactly, and the read never holds the line in memory."""
    wide = home / "notes" / "wide.json"
    with wide.open("wb") as f:
        f.write(b"[" + b"1234567," * 2_000_000 + b"0]\nsecond\n")
    r = FileReader([home / "notes"])
    tracemalloc.start()
    try:
        result = r.read("wide.json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024
    assert result.text == "[" + "1234567," * 249 + "1234567"
    assert result.note == (
        "line 1 of 2 is longer than an answer: its first part only; the next part: "
        "NEED: File contents of wide.json lines 2-2"
    )
    assert r.read("wide.json line 2").text == "second\n"


def test_counting_and_skipping_stop_at_the_bound_and_say_so(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parts, "COUNT_CAP", 17 * 1000)
    monkeypatch.setattr(parts, "CHUNK", 1000)
    (home / "notes" / "big.log").write_bytes(b"line of log text\n" * 5000)
    r = FileReader([home / "notes"])
    first = r.read("big.log")
    assert first.note.startswith("showing lines 1-117 of ")
    total = int(first.note.split(" of ")[1].split("+;")[0].replace(",", ""))
    assert 1000 <= total < 5000  # a lower bound, marked with "+", never a made-up figure
    assert f"of {total:,}+; {total - 117:,}+ more line(s)" in first.note
    with pytest.raises(ToolError, match="past the first 17,000 bytes"):
        r.read("big.log lines 4000-4010")
    assert r.read("big.log lines 900-901").text == "line of log text\n" * 2


def test_an_empty_file_is_an_empty_answer_and_a_part_of_it_is_not_there(home: Path) -> None:
    (home / "notes" / "empty.md").write_text("")
    r = FileReader([home / "notes"])
    result = r.read("empty.md")
    assert (result.text, result.note) == ("", "the file is empty")
    with pytest.raises(ToolError, match="has 0 lines; there is no line 2"):
        r.read("empty.md line 2")
