"""``File contents of``: only regular text files inside the allowed roots, hostile paths refused."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from contemplation import settings as settings_mod
from contemplation.errors import ToolError
from contemplation.needs.router import NeedRouter
from contemplation.needs.tools.base import Refused, Unconfigured
from contemplation.needs.tools.files import FileReader


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """tmp/base (the root), tmp/base-evil (the prefix pitfall), tmp/outside."""
    base = tmp_path / "base"
    (base / "docs").mkdir(parents=True)
    (base / "docs" / "guide.md").write_text("# Guide\nhello from inside\n")
    (base / "src").mkdir()
    (base / "src" / "app.py").write_text("def main():\n    pass\n\nclass App:\n    pass\n")
    evil = tmp_path / "base-evil"
    evil.mkdir()
    (evil / "secret.txt").write_text("EVIL SECRET")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "passwd").write_text("OUTSIDE SECRET")
    return base


def reader(base: Path, **kw: object) -> FileReader:
    return FileReader([base], **kw)  # type: ignore[arg-type]


def test_reads_relative_and_absolute_paths_inside_the_root(tree: Path) -> None:
    r = reader(tree)
    rel = r.read("docs/guide.md")
    assert rel.text == "# Guide\nhello from inside\n"
    assert rel.source == str((tree / "docs" / "guide.md").resolve())
    assert not rel.more
    assert r.read(str(tree / "docs" / "guide.md")).text == rel.text


@pytest.mark.parametrize(
    "path", ["../outside/passwd", "docs/../../outside/passwd", "docs/../guide.md", ".."]
)
def test_dot_dot_is_refused_even_when_it_would_stay_inside(tree: Path, path: str) -> None:
    with pytest.raises(Refused, match=r"'\.\.'"):
        reader(tree).read(path)


def test_absolute_paths_outside_the_roots_are_refused(tree: Path) -> None:
    r = reader(tree)
    with pytest.raises(Refused, match="outside the allowed folders"):
        r.read("/etc/passwd")
    with pytest.raises(Refused, match="outside the allowed folders"):
        r.read(str(tree.parent / "outside" / "passwd"))


def test_the_startswith_prefix_pitfall_is_refused(tree: Path) -> None:
    evil = tree.parent / "base-evil" / "secret.txt"
    assert str(evil).startswith(str(tree))  # the trap: a string prefix match would allow it
    with pytest.raises(Refused, match="outside the allowed folders"):
        reader(tree).read(str(evil))


def test_symlinked_file_and_directory_that_leave_the_root_are_refused(tree: Path) -> None:
    (tree / "innocent.txt").symlink_to(tree.parent / "outside" / "passwd")
    (tree / "linkdir").symlink_to(tree.parent / "base-evil", target_is_directory=True)
    r = reader(tree)
    with pytest.raises(Refused, match="link that leads outside"):
        r.read("innocent.txt")
    with pytest.raises(Refused, match="link that leads outside"):
        r.read("linkdir/secret.txt")
    with pytest.raises(Refused, match="link that leads outside"):
        r.read(str(tree / "linkdir" / "secret.txt"))


def test_symlinks_that_stay_inside_are_fine(tree: Path) -> None:
    (tree / "alias.md").symlink_to(tree / "docs" / "guide.md")
    (tree / "d").symlink_to(tree / "docs", target_is_directory=True)
    r = reader(tree)
    assert "hello from inside" in r.read("alias.md").text
    assert "hello from inside" in r.read("d/guide.md").text


def test_nul_bytes_directories_fifos_and_sockets_are_refused(tree: Path) -> None:
    r = reader(tree)
    with pytest.raises(Refused, match="NUL"):
        r.read("docs/guide.md\x00.png")
    with pytest.raises(Refused, match="folder, not a file"):
        r.read("docs")
    os.mkfifo(tree / "pipe")
    with pytest.raises(Refused, match="not a regular file"):
        r.read("pipe")  # returns at once: nothing blocks on a FIFO without a writer
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(tree / "sock"))
        with pytest.raises(Refused, match="not a regular file"):
            r.read("sock")
    finally:
        sock.close()


def test_devices_are_refused(tree: Path) -> None:
    r = FileReader([tree, Path("/dev")])
    with pytest.raises(Refused, match="not a regular file"):
        r.read("/dev/zero")


@pytest.mark.parametrize(
    "name",
    [
        ".ssh/id_rsa",
        ".env",
        ".env.local",
        "certs/server.pem",
        "keys/ID_ED25519",
        ".netrc",
        "repo/.git/config",
        ".GnuPG/secring.gpg",
    ],
)
def test_the_deny_list_applies_inside_the_roots(tree: Path, name: str) -> None:
    target = tree / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("PRIVATE")
    with pytest.raises(Refused, match="deny-list"):
        reader(tree).read(name)


def test_a_harmless_name_that_links_to_a_denied_file_is_refused(tree: Path) -> None:
    (tree / ".ssh").mkdir()
    (tree / ".ssh" / "id_rsa").write_text("PRIVATE KEY")
    (tree / "notes.txt").symlink_to(tree / ".ssh" / "id_rsa")
    with pytest.raises(Refused, match="denied name"):
        reader(tree).read("notes.txt")


def test_extra_deny_patterns_from_the_config(tree: Path) -> None:
    (tree / "payroll.csv").write_text("salaries")
    with pytest.raises(Refused, match="deny-list"):
        reader(tree, deny=["*.csv"]).read("payroll.csv")


def test_huge_files_are_read_in_parts_with_exact_counts_and_the_next_need(tree: Path) -> None:
    big = tree / "big.log"
    big.write_bytes(b"line of log text\n" * 380_000)  # 6.5 MB, as in the 6.2 MB file
    result = reader(tree).read("big.log")
    assert result.text == "line of log text\n" * 117  # 117 * 17 = 1,989 of 2,000 characters
    assert not result.more
    assert result.note == (
        "showing lines 1-117 of 380,000; 379,883 more line(s) — the next part: "
        "NEED: File contents of big.log lines 118-234"
    )
    # the NEED line it names reads exactly the next part, and so on to the end
    nxt = reader(tree).read("big.log lines 118-234")
    assert nxt.text == "line of log text\n" * 117 and nxt.note == "lines 118-234 of 380,000"
    last = reader(tree).read("big.log lines 379990-")
    assert last.text.count("\n") == 11 and last.note == "lines 379,990-380,000 of 380,000"


@pytest.mark.parametrize(
    ("asked", "text", "note"),
    [
        ("notes.md line 3", "three\n", "lines 3-3 of 5"),
        ("notes.md lines 2-3", "two\nthree\n", "lines 2-3 of 5"),
        ("notes.md Lines 4 - 9", "four\nfive", "lines 4-5 of 5"),
        ("notes.md lines 4-", "four\nfive", "lines 4-5 of 5"),
        ("notes.md", "one\ntwo\nthree\nfour\nfive", ""),
    ],
)
def test_a_line_range_as_a_model_writes_it(tree: Path, asked: str, text: str, note: str) -> None:
    (tree / "notes.md").write_text("one\ntwo\nthree\nfour\nfive")  # no newline at the end
    result = reader(tree).read(asked)
    assert (result.text, result.note) == (text, note)


def test_a_range_past_the_end_and_a_line_longer_than_an_answer(tree: Path) -> None:
    (tree / "short.md").write_text("a\nb\n")
    with pytest.raises(ToolError, match="has 2 lines; there is no line 7"):
        reader(tree).read("short.md lines 7-9")
    (tree / "wide.md").write_text("x" * 5000 + "\nsecond\n")
    wide = reader(tree).read("wide.md")
    assert wide.text == "x" * 2000
    assert wide.note == (
        "line 1 of 2 is longer than an answer: its first part only; the next part: "
        "NEED: File contents of wide.md lines 2-2"
    )


def test_tilde_the_roots_own_name_and_an_ambiguous_path(
    tree: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tree.parent))
    r = reader(tree)
    assert r.read(f"~/{tree.name}/docs/guide.md").text.startswith("# Guide")
    assert r.read(f"{tree.name}/docs/guide.md").text.startswith("# Guide")  # root's own name
    with pytest.raises(Refused, match="not ~user"):
        r.read("~root/.bashrc")
    with pytest.raises(Refused, match=r"'\.\.'"):
        r.read("~/../etc/passwd")
    with pytest.raises(Refused, match="outside the allowed folders"):
        r.read("~/elsewhere.md")
    other = tmp_path / "other"
    (other / "docs").mkdir(parents=True)
    (other / "docs" / "guide.md").write_text("another guide")
    both = FileReader([tree, other])
    with pytest.raises(ToolError, match="in more than one allowed folder") as e:
        both.read("docs/guide.md")
    assert str(tree / "docs" / "guide.md") in str(e.value)
    assert str(other / "docs" / "guide.md") in str(e.value)


def test_binary_missing_and_unconfigured(tree: Path) -> None:
    (tree / "blob.bin").write_bytes(b"\x7fELF\x00\x00\x01")
    with pytest.raises(Refused, match="binary"):
        reader(tree).read("blob.bin")
    with pytest.raises(ToolError, match="no such file"):
        reader(tree).read("docs/missing.md")
    with pytest.raises(Unconfigured, match="no folders are open") as unset:
        FileReader([]).read("docs/guide.md")
    assert "allowed_roots" in unset.value.hint and "allowed_roots" not in str(unset.value)


def test_tree_lists_the_layout_and_python_names_but_no_secrets(tree: Path) -> None:
    (tree / ".ssh").mkdir()
    (tree / ".ssh" / "id_rsa").write_text("x")
    (tree / ".env").write_text("x")
    result = reader(tree).tree(".")
    assert "src/" in result.text
    assert "app.py: main, App" in result.text
    assert "guide.md" in result.text
    assert ".ssh" not in result.text and ".env" not in result.text


def test_hostile_needs_through_the_router_get_clear_answers(tree: Path, tmp_path: Path) -> None:
    (tree / "x").symlink_to(tree.parent / "outside", target_is_directory=True)
    (tree / "big.txt").write_text("0123456789\n" * 2000)
    settings = settings_mod.load(
        home=tmp_path / "home",
        env={},
        config=None,
        overrides={"tools": {"allowed_roots": [str(tree)], "answer_budget_chars": 500}},
    )
    needs = [
        "File contents of ../../etc/passwd",
        "File contents of /etc/passwd",
        "File contents of x/passwd",
        f"File contents of {tree.parent / 'base-evil' / 'secret.txt'}",
        "File contents of big.txt",
    ]

    async def run() -> list[tuple[str, str]]:
        async with NeedRouter(settings) as router:
            answered = await router.answer_all(needs, conv_id="c", turn_key="t")
        out: list[tuple[str, str]] = []
        for need, answer in answered:
            assert answer is not None
            out.append((answer.status, answer.render_block(need)))
        return out

    results = asyncio.run(run())
    assert [s for s, _ in results] == ["refused", "refused", "refused", "refused", "ok"]
    for _, block in results[:4]:
        assert "NOT ANSWERED (refused)" in block
        assert "SECRET" not in block and "root:" not in block
    big = results[4][1]
    assert big.startswith("RESPONSE TO NEED: File contents of big.txt\n(source: files.read, ")
    assert "more exists" not in big and "narrower part" not in big
    assert "1,955 more line(s) — the next part: NEED: File contents of big.txt lines 46-90" in big
    body = big.split("BEGIN TOOL OUTPUT", 1)[1].split("END TOOL OUTPUT", 1)[0]
    assert len(body) < 700


def test_permissions_judge_the_file_a_need_reads_however_it_is_written(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deny or ask on the real path holds for the same file asked as ``~/…``, by the
    root's own name, by a relative path, or for a part of it (``lines 1-3``)."""
    monkeypatch.setenv("HOME", str(tree.parent))
    (tree / "secrets").mkdir()
    (tree / "secrets" / "plan.md").write_text("the plan\n")
    (tree / ".env").write_text("KEY=1\n")
    settings = settings_mod.load(
        home=tmp_path / "home",
        env={},
        config=None,
        overrides={
            "tools": {"allowed_roots": [str(tree)]},
            "permissions": {"read_file": {f"{tree}/secrets/**": "ask"}},
        },
    )
    router = NeedRouter(settings)
    for written in (
        f"{tree}/secrets/plan.md",
        f"~/{tree.name}/secrets/plan.md",
        f"{tree.name}/secrets/plan.md",
        "secrets/plan.md",
        "secrets/plan.md lines 1-3",
    ):
        found = router.route(f"File contents of {written}")
        assert found is not None
        assert router.permit(found).action == "ask", written
    env = router.route("File contents of .env lines 1-2")
    assert env is not None and router.permit(env).action == "deny"
    # the prompt names the folders a model may read, home-relative, and the part form
    [told] = [r for r in router.offered() if r.tool == "files.read"]
    assert f": ~/{tree.name}. A part: add lines 120-180 after the path." in told.description
