"""Issue 38, "imported archives read `pending (archived)`": `status` and `list` of an archived
folder say what is true. A folder made by hand (a messages.log, no metadata) has no model to
name and its activity is its log's last dated header, not the time it was copied; and in
completed/ no daemon answers, so a last message of the agent's is unanswered, not pending."""

from __future__ import annotations

import time
from datetime import datetime

from contemplation.store.layout import Home
from tests.conftest import base_env, cli
from tests.system.test_small_words import _imported

ANSWERED = "conv_20260301-083000_wal-checkpoints"
UNANSWERED = "conv_20260302-083000_unanswered"


def _days_since(header: str) -> int:
    return int((time.time() - datetime.strptime(header, "%Y-%m-%d %H:%M:%S").timestamp()) // 86400)


def test_status_of_an_imported_archive_names_no_blank_model_and_its_logs_own_time(
    home: Home,
) -> None:
    _imported(home, ANSWERED, last_by_model=True)
    out = cli(base_env(home), "status", ANSWERED).stdout
    lines = {ln.split(":", 1)[0]: ln.split(":", 1)[1].strip() for ln in out.splitlines()}
    assert lines["model"] == "unknown (imported)", out
    days, unit, _ = lines["activity"].split()  # show.ago rounds: "269 d ago"
    assert unit == "d" and abs(int(days) - _days_since("2026-03-01 09:12:58")) <= 1, out
    assert "stalled" not in out and "no daemon" not in out, out
    assert lines["now"] == "archived: reopen to go on with it", out


def test_an_archive_whose_last_message_got_no_answer_says_so_not_pending(home: Home) -> None:
    _imported(home, ANSWERED, last_by_model=True)
    _imported(home, UNANSWERED, last_by_model=False)
    env = base_env(home)
    out = cli(env, "status", UNANSWERED).stdout
    now = next(ln for ln in out.splitlines() if ln.startswith("now:"))
    assert now.split(":", 1)[1].strip() == (
        "archived: the last message got no answer; reopen to have it answered"
    ), out
    table = cli(env, "list", "--all").stdout
    row = next(ln for ln in table.splitlines() if ln.startswith(UNANSWERED))
    assert "unanswered (archived)" in row and "pending" not in row, table
    assert "idle (archived)" in table, table
