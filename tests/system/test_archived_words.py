"""Imported archives read `pending (archived)`: `status` and `list` of an archived
folder say what is true. A folder made by hand (a messages.log, no metadata) has no model to
name and its activity is its log's last dated header, not the time it was copied; and in
completed/ no daemon answers, so a last message of the agent's is unanswered, not pending."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from mcp import Client
from starlette.testclient import TestClient

from contemplation.faces.dashboard.app import Dashboard
from contemplation.models import Status
from contemplation.store.layout import Home, read_state
from contemplation.writer import atomic_write_json
from tests.conftest import base_env, cli_here
from tests.system.test_dashboard import BASE, TOKEN
from tests.system.test_mcp_server import needs_conv, run_calls, settings_for, tool
from tests.system.test_small_words import _imported

ANSWERED = "conv_20260301-083000_wal-checkpoints"
UNANSWERED = "conv_20260302-083000_unanswered"


def _days_since(header: str) -> int:
    return int((time.time() - datetime.strptime(header, "%Y-%m-%d %H:%M:%S").timestamp()) // 86400)


def test_status_of_an_imported_archive_names_no_blank_model_and_its_logs_own_time(
    home: Home,
) -> None:
    _imported(home, ANSWERED, last_by_model=True)
    out = cli_here(base_env(home), "status", ANSWERED).stdout
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
    out = cli_here(env, "status", UNANSWERED).stdout
    now = next(ln for ln in out.splitlines() if ln.startswith("now:"))
    assert now.split(":", 1)[1].strip() == (
        "archived: the last message got no answer; reopen to have it answered"
    ), out
    table = cli_here(env, "list", "--all").stdout
    row = next(ln for ln in table.splitlines() if ln.startswith(UNANSWERED))
    assert "unanswered (archived)" in row and "pending" not in row, table
    assert "idle (archived)" in table, table


def test_an_archived_conversation_reads_archived_on_every_face_not_stalled(home: Home) -> None:
    """Review: MCP ``check`` and the dashboard said "stalled: no daemon is running" of an
    archived conversation whose model had asked for something: archived is finished, not
    stalled. A real conversation (written by the writer), archived by the real CLI, with no
    daemon running; then each face is asked."""
    conv = needs_conv(home, "the schema")
    state = read_state(conv)
    assert state is not None
    state.status = Status.AWAITING_AGENT  # as the daemon leaves it when it stops
    atomic_write_json(conv.state, state.model_dump(mode="json"), durable=False)
    env = base_env(home)
    cli_here(env, "archive", conv.id)
    assert home.conv(conv.id, completed=True).dir.is_dir()
    said: dict[str, str] = {}
    out = cli_here(env, "status", conv.id).stdout
    said["cli"] = next(ln for ln in out.splitlines() if ln.startswith("now:")).split(":", 1)[1]

    async def check(c: Client) -> Any:
        return await tool(c, "conversation_check", conversation_id=conv.id)

    said["mcp"] = run_calls(settings_for(home), check)["activity"]
    dash = Dashboard(settings_for(home), token=TOKEN)
    with TestClient(dash.asgi(), base_url=BASE, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        said["dashboard"] = c.get(f"/api/conversations/{conv.id}").json()["activity"]
    for face, words in said.items():
        assert words.strip() == "archived: reopen to go on with it", (face, said)
