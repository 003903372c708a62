"""Real models through the real daemon: llama-server over the OpenAI API, and the embedded model.

The whole path — CLI → inbox → daemon → backend → messages.log → state — with real inference,
including a llama.cpp server killed in the middle of a reply and started again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from contemplation.models import BlockKind, MarkerKind, Status
from contemplation.protocol.parser import parse
from contemplation.store.layout import Conv, Home, read_state
from tests import peers, realpeers
from tests.conftest import DaemonProc, base_env, cli_here, wait_for

pytestmark = pytest.mark.real


@pytest.fixture
def own_llama() -> Iterator[realpeers.LlamaServer]:
    """A llama.cpp server of this test's own (it gets killed and restarted)."""
    peers.xllamacpp_available()
    server = realpeers.LlamaServer(peers.smollm2_gguf(), n_ctx=4096).start()
    yield server
    server.stop()


def model_blocks(conv: Conv) -> list[tuple[str, bool]]:
    return [
        (b.text, b.interrupted)
        for b in parse(conv.log.read_bytes()).blocks
        if b.kind is BlockKind.MODEL
    ]


def set_options(conv: Conv, **options: object) -> None:
    meta = json.loads(conv.metadata.read_text())
    meta["options"] = {**meta.get("options", {}), **options}
    conv.metadata.write_text(json.dumps(meta))


def test_a_real_llama_cpp_reply_streams_into_the_log(
    home: Home, daemon_factory: Callable[..., DaemonProc], own_llama: realpeers.LlamaServer
) -> None:
    env = base_env(home, OPENAI_BASE_URL=own_llama.url + "/v1")
    daemon_factory(env, home).wait_ready()
    conv_id = cli_here(env, "new", "colours", "--backend", "openai", "--model", "smollm2").stdout.strip()
    conv = Conv(home.active / conv_id)
    set_options(conv, temperature=0, num_predict=24)
    cli_here(env, "send", conv_id, "Name one colour.")
    wait_for(
        lambda: (st := read_state(conv)) is not None and st.turns == 1,
        timeout=120,
        what="a real reply",
    )
    [(text, interrupted)] = model_blocks(conv)
    assert text.strip() and not interrupted
    assert "=== OPENAI -> CLAUDE [" in conv.log.read_text()
    st = read_state(conv)
    assert st is not None and st.last_turn is not None
    u = st.last_turn
    assert (
        u.eval_count and 0 < u.eval_count <= 24 and u.prompt_eval_count and u.prompt_eval_count > 5
    )
    # llama-server's usage and timings, as sent in the last streamed chunk
    assert u.eval_duration_ms and u.prompt_eval_duration_ms and u.wall_ms and u.first_token_ms
    assert 0 < u.first_token_ms <= u.wall_ms and u.eval_duration_ms < u.wall_ms


def test_llama_cpp_killed_mid_reply_is_retried_and_answers_after_a_restart(
    home: Home, daemon_factory: Callable[..., DaemonProc], own_llama: realpeers.LlamaServer
) -> None:
    env = base_env(home, OPENAI_BASE_URL=own_llama.url, CONTEMPLATION_BREAKER_COOLDOWN="0.5")
    daemon_factory(env, home).wait_ready()
    conv_id = cli_here(env, "new", "long", "--backend", "openai", "--model", "smollm2").stdout.strip()
    conv = Conv(home.active / conv_id)
    set_options(conv, temperature=0, num_predict=400)
    cli_here(env, "send", conv_id, "Count from one to two hundred in words, one number per line.")
    wait_for(
        lambda: b"=== OPENAI -> CLAUDE" in conv.log.read_bytes(),
        timeout=120,
        what="the reply starts streaming",
    )
    own_llama.kill()
    wait_for(
        lambda: (s := read_state(conv)) is not None and s.status is Status.RETRYING,
        timeout=60,
        what="a retry is scheduled",
    )
    assert any(
        b.interrupted for b in parse(conv.log.read_bytes()).blocks
    )  # the cut reply is marked
    st = read_state(conv)
    assert st is not None and st.turns == 0 and st.last_error is not None
    set_options(conv, num_predict=16)  # the retry does not need to count that far
    own_llama.start()
    wait_for(
        lambda: (s := read_state(conv)) is not None and s.turns == 1,
        timeout=120,
        what="an answer after the restart",
    )
    blocks = [b for b in parse(conv.log.read_bytes()).blocks if b.kind is BlockKind.MODEL]
    assert blocks[0].interrupted and any(k is MarkerKind.INTERRUPTED for k, _ in blocks[0].markers)
    assert not blocks[-1].interrupted and blocks[-1].text.strip()
    assert sum(1 for b in blocks if not b.interrupted) == 1  # answered exactly once


def test_the_embedded_model_answers_through_the_real_daemon(
    home: Home, daemon_factory: Callable[..., DaemonProc]
) -> None:
    peers.xllamacpp_available()
    peers.smollm2_gguf()
    env = base_env(home)
    daemon_factory(env, home).wait_ready()
    conv_id = cli_here(env, "new", "embedded", "--backend", "local", "--model", "smollm2").stdout.strip()
    conv = Conv(home.active / conv_id)
    set_options(conv, temperature=0, num_predict=24)
    cli_here(env, "send", conv_id, "Say hello.")
    wait_for(
        lambda: (st := read_state(conv)) is not None and st.turns == 1,
        timeout=180,
        what="an embedded reply",
    )
    [(text, interrupted)] = model_blocks(conv)
    assert text.strip() and not interrupted
    assert "=== LOCAL -> CLAUDE [" in conv.log.read_text()
    st = read_state(conv)
    assert st is not None and st.last_turn is not None
    u = st.last_turn
    assert (
        u.eval_count and 0 < u.eval_count <= 24 and u.prompt_eval_count and u.prompt_eval_count > 5
    )
    assert u.eval_duration_ms and u.prompt_eval_duration_ms and u.context_window == 4096
