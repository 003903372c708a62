"""Memory does not grow with one conversation's size. A log is indexed
a stretch of blocks at a time, never read whole and never skipped for its size (a block past
the bound is indexed by its first bytes, with a log line); a state.json or metadata.json past
its bound is refused before it is read, in one line naming that conversation, and every other
conversation still lists. Real folders, the real CLI in child processes, peak RSS as the
kernel counts it (``ru_maxrss`` of a process that runs only the command)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contemplation.store import layout
from contemplation.store.layout import JSON_MAX_BYTES, Conv, Home
from contemplation.store.logstream import MAX_BLOCK_BYTES
from contemplation.writer import open_writer
from tests.conftest import ROOT, base_env, cli_here, model_replies
from tests.fakes.ollama_server import FakeOllama

MB = 1 << 20
LOG_MB = 200
GROWTH_BOUND_MB = 120  # measured: 69 (a 16 MiB block and its parse); held whole: 414

# runs argv, and prints the peak RSS of it alone (its only child), in KiB
_MEASURE = (
    "import resource, subprocess, sys\n"
    "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(r.returncode)\n"
)


def peak_rss_kib(env: dict[str, str], *args: str) -> tuple[int, str]:
    """The real CLI run in a process of its own: its peak RSS (KiB) and its stderr."""
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, sys.executable, "-m", "contemplation", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split()[-1]), proc.stderr


def block(sender: str, recipient: str, second: int, body: str) -> bytes:
    return f"=== {sender} -> {recipient} [2026-01-01 10:00:{second:02d}] ===\n{body}\n\n".encode()


def write_big_log(path: Path, size: int, long_block: bytes = b"") -> int:
    """About ``size`` bytes of log: a pattern of exchanges written again and again (lines of
    few words, so that indexing is quick), ``long_block`` in its middle; how many blocks."""
    line = "w" * 990 + " zebra\n"
    pattern = b"".join(
        block(*(("CLAUDE", "OLLAMA") if i % 2 == 0 else ("OLLAMA", "CLAUDE")), i, line * 64)
        for i in range(16)
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    blocks = 0
    with path.open("wb") as f:
        written = 0
        while written < size:
            f.write(pattern)
            written, blocks = written + len(pattern), blocks + 16
            if long_block and written >= size // 2:
                f.write(long_block)
                written, blocks = written + len(long_block), blocks + 1
                long_block = b""
    return blocks


def test_indexing_a_200_mb_log_keeps_memory_flat(home: Home) -> None:
    """``reindex`` of a home with one 200 MB conversation (a block of 40 MB in it) grows the
    process by less than GROWTH_BOUND_MB over ``reindex`` of an empty home; every block is
    indexed, the long one by its first MAX_BLOCK_BYTES, and the run says so."""
    env = base_env(home)
    home.root.mkdir(parents=True)
    empty, _ = peak_rss_kib(env, "reindex")
    long_text = "okapi begins it\n" + ("x" * 99 + "\n") * (40 * MB // 100) + "quokka ends it"
    long_block = block("OLLAMA", "CLAUDE", 59, long_text)
    blocks = write_big_log(
        home.active / "conv_20260101-100000_big" / "messages.log", LOG_MB * MB, long_block
    )
    peak, said = peak_rss_kib(env, "reindex")
    growth_mb = (peak - empty) / 1024
    assert growth_mb < GROWTH_BOUND_MB, f"reindex of {LOG_MB} MB grew by {growth_mb:.0f} MB"
    assert "index block cut" in said and f"bound is {MAX_BLOCK_BYTES} bytes" in said, said
    assert "index_skipped" not in said, said
    rows = json.loads(cli_here(env, "list", "--json").stdout)["conversations"]
    (row,) = rows
    assert row["blocks"] == blocks and row["bytes"] > LOG_MB * MB and not row["problem"], row
    assert "conv_20260101-100000_big" in cli_here(env, "search", "okapi").stdout
    # past the block's bound (by words: by meaning, the one conversation is the nearest)
    assert "conv_" not in cli_here(env, "search", "--mode", "words", "quokka").stdout


def test_forking_a_200_mb_conversation_keeps_memory_flat(home: Home) -> None:
    """``fork`` of a 200 MB conversation (a block of 40 MB in it) grows the process by less
    than GROWTH_BOUND_MB over a fork of one exchange: the log is read block by block and
    copied file to file, and the fork's state is counted the same way. The fork holds every
    byte up to its last block."""
    env = base_env(home, CONTEMPLATION_DASHBOARD_ENABLED="false")
    small, big = made(env, home, "small", "big")
    with open_writer(small) as w:
        r = w.reply("OLLAMA", "CLAUDE", "r1")
        r.content("an answer")
        r.finish()
    one, _ = peak_rss_kib(env, "fork", small.id)
    long_block = block("OLLAMA", "CLAUDE", 59, "okapi\n" + ("x" * 99 + "\n") * (40 * MB // 100))
    blocks = write_big_log(big.log, LOG_MB * MB, long_block)
    peak, said = peak_rss_kib(env, "fork", big.id)
    growth_mb = (peak - one) / 1024
    assert growth_mb < GROWTH_BOUND_MB, f"a fork of {LOG_MB} MB grew by {growth_mb:.0f} MB"
    (forked,) = [c for c in home.active.iterdir() if "_big" in c.name and c.name != big.id]
    with big.log.open("rb") as f:  # the source's last block, less its blank lines, and "\n"
        f.seek(-64, 2)
        blank = 64 - len(f.read().rstrip(b"\n")) - 1
    assert (forked / "messages.log").stat().st_size == big.log.stat().st_size - blank, said
    state = json.loads((forked / "state.json").read_text())
    assert state["turns"] + state["messages_processed"] == blocks, state


def made(env: dict[str, str], home: Home, *topics: str) -> list[Conv]:
    out = []
    for topic in topics:
        conv = home.conv(cli_here(env, "new", topic).stdout.strip())
        with open_writer(conv) as w:
            w.append_block("CLAUDE", "OLLAMA", f"tell me about {topic}", msg_id="m1")
        out.append(conv)
    return out


def oversize(path: Path) -> None:
    """The file made one byte past the bound, still a JSON object (written by rename)."""
    data = json.loads(path.read_text())
    data["padding"] = ""
    room = JSON_MAX_BYTES + 1 - len(json.dumps(data).encode())
    data["padding"] = "p" * room
    tmp = path.with_name(".big.tmp")
    tmp.write_text(json.dumps(data))
    tmp.rename(path)
    assert path.stat().st_size == JSON_MAX_BYTES + 1


@pytest.mark.parametrize("name", ["state.json", "metadata.json"])
def test_a_state_or_metadata_past_the_bound_is_refused_and_the_others_list(
    home: Home, name: str
) -> None:
    """state.json (or metadata.json) one byte past JSON_MAX_BYTES: that conversation is listed
    as 'unreadable' with the bound in its problem, status CONV says it in one line, every
    other conversation lists as it was, and nothing prints a traceback."""
    env = base_env(home, CONTEMPLATION_DASHBOARD_ENABLED="false")
    big, fine = made(env, home, "alpha", "beta")
    oversize(big.dir / name)
    listed = cli_here(env, "list", "--json")
    assert "Traceback" not in listed.stderr, listed.stderr
    rows = {r["id"]: r for r in json.loads(listed.stdout)["conversations"]}
    assert set(rows) == {big.id, fine.id}
    assert rows[fine.id]["status"] == "pending" and not rows[fine.id]["problem"]
    assert rows[big.id]["status"] == "unreadable", rows[big.id]
    problem = rows[big.id]["problem"]
    assert f"{name} is {JSON_MAX_BYTES + 1} bytes" in problem, problem
    assert str(JSON_MAX_BYTES) in problem and "not read" in problem, problem
    shown = cli_here(env, "status", big.id).stdout
    (line,) = [ln for ln in shown.splitlines() if ln.startswith("problem:")]
    assert name in line, shown
    assert fine.id in cli_here(env, "list").stdout


def test_a_file_longer_than_one_read_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Linux gives at most 0x7ffff000 bytes to one read, so a short read proves the end only
    for a read asked for less than that: a 2 GiB live log was read cut short at 2 GiB - 4 KiB
    (a fork of a 2 GB log ended 62 blocks early, and refused for a NEED it cut through). Here
    the kernel's bound is played by a pread that gives at most 100 bytes, under a MAX_READ of
    64 bytes a read: every byte of a 1,000-byte file comes back, from any offset."""
    data = bytes(range(256)) * 4
    path = tmp_path / "f"
    path.write_bytes(data[:1000])
    real = os.pread
    monkeypatch.setattr(layout.os, "pread", lambda fd, n, at: real(fd, min(n, 100), at))
    monkeypatch.setattr(layout, "MAX_READ", 64)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert layout.read_to_end(fd, 1000) == data[:1000]
        assert layout.read_to_end(fd, 10, 500) == data[500:1000]  # it grew since: read on
    finally:
        os.close(fd)


def test_a_turn_of_a_200_mb_active_conversation_keeps_memory_flat(
    home: Home, fake_ollama: FakeOllama
) -> None:
    """``run --once`` taking the turn of an active conversation whose log is 200 MB (twenty
    rotated 10 MB segments, then the agent's question in the live log) grows the process by
    less than GROWTH_BOUND_MB over the same turn of a one-message conversation: the rotated
    segments are held as a bare index of their blocks, and the history is read back from the
    file, newest first, only as far as the model's window can reach (summary included). The
    turn is taken: the history is summarised, and what is sent fits the window."""
    env = base_env(home, fake_ollama, CONTEMPLATION_DASHBOARD_ENABLED="false")
    (small,) = made(env, home, "small")
    one, _ = peak_rss_kib(env, "run", "--once")
    assert len(fake_ollama.chat_requests()) == 1 and len(model_replies(small)) == 1
    (big,) = made(env, home, "big")
    for k in range(LOG_MB // 10, 0, -1):  # messages.20.log is the oldest
        write_big_log(big.dir / f"messages.{k}.log", 10 * MB)
    peak, said = peak_rss_kib(env, "run", "--once")
    growth_mb = (peak - one) / 1024
    assert growth_mb < GROWTH_BOUND_MB, f"a turn of {LOG_MB} MB grew by {growth_mb:.0f} MB"
    assert len(model_replies(big)) == 1, said
    asked = fake_ollama.chat_requests()[-1]
    chars = sum(len(m["content"]) for m in asked["messages"])
    assert chars < 64 * 1024, chars  # it fits the (default) window, the summary in it
    assert any("tell me about big" in m["content"] for m in asked["messages"])


def test_status_of_a_200_mb_active_conversation_keeps_memory_flat(home: Home) -> None:
    """``status`` (the reading every face shares: status, check, wait, the dashboard) of an
    active conversation whose log is 200 MB in rotated segments grows the process by less
    than GROWTH_BOUND_MB over ``status`` of a one-message conversation: the segments are
    held as bare blocks (measured: 228 MB when held with their text)."""
    env = base_env(home, CONTEMPLATION_DASHBOARD_ENABLED="false")
    small, big = made(env, home, "small", "big")
    one, _ = peak_rss_kib(env, "status", small.id)
    for k in range(LOG_MB // 10, 0, -1):
        write_big_log(big.dir / f"messages.{k}.log", 10 * MB)
    peak, _ = peak_rss_kib(env, "status", big.id)
    growth_mb = (peak - one) / 1024
    assert growth_mb < GROWTH_BOUND_MB, f"status of {LOG_MB} MB grew by {growth_mb:.0f} MB"
    assert big.id in cli_here(env, "status", big.id).stdout
