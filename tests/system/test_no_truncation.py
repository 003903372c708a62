"""No silent truncation. Ollama cuts a prompt over ``num_ctx`` without a word unless
the request says ``"truncate": false``; then it refuses with HTTP 400
``exceed_context_size_error`` (ollama #16712, #16800), and the turn compacts once, visibly,
and asks again, calibrated by the server's own count. The scripted Ollama speaks both modes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from contemplation.backends.base import PhaseTimeouts
from contemplation.backends.ollama import OllamaBackend
from contemplation.engine.runtime import Runtime
from contemplation.errors import ContextOverflow
from contemplation.models import ChatMessage, ChatRequest, MarkerKind, Status
from contemplation.prompt import budget, truncation
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests.conftest import run_burst
from tests.fakes.ollama_server import FakeOllama, Step
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.openai_server import Step as OpenAIStep

FAST = PhaseTimeouts(connect=2, first_byte=2, idle=2, total=10)
WINDOW = 2048


def _post(fake: FakeOllama, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{fake.url}/api/chat", json=body, timeout=10)


def _long(n: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": "word " * n}]


# --------------------------------------------------------------------------- the fake, both modes


def test_the_fake_truncates_silently_by_default_like_ollama(fake_ollama: FakeOllama) -> None:
    """Without ``truncate: false`` the prompt is cut and the count is taken after the cut
    (num_ctx/2 + 2, ollama #17427): comparing the count with the window shows nothing."""
    fake_ollama.enqueue(Step(text="ok"))
    body = {"model": "gemma", "messages": _long(2000), "options": {"num_ctx": 1024}}
    lines = [json.loads(x) for x in _post(fake_ollama, body).text.splitlines()]
    assert lines[-1]["done"] is True and lines[-1]["prompt_eval_count"] == 1024 // 2 + 2
    assert fake_ollama.truncated == 1


def test_the_fake_refuses_with_the_documented_400_when_asked_not_to_truncate(
    fake_ollama: FakeOllama,
) -> None:
    body = {
        "model": "gemma",
        "messages": _long(2000),
        "options": {"num_ctx": 1024},
        "truncate": False,
    }
    resp = _post(fake_ollama, body)
    assert resp.status_code == 400
    inner = json.loads(resp.json()["error"])  # a JSON string inside "error" (ollama #16800)
    n = 10000 // 4 + 1
    assert inner == {
        "error": {
            "code": 400,
            "message": f"request ({n} tokens) exceeds the available context size (1024 tokens), "
            "try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": n,
            "n_ctx": 1024,
        }
    }
    assert fake_ollama.truncated == 0 and fake_ollama.refused == [n]


# --------------------------------------------------------------------------- the backend


def test_every_chat_request_says_truncate_false(fake_ollama: FakeOllama) -> None:
    b = OllamaBackend(fake_ollama.url, timeouts=FAST)
    body = b.request_body(ChatRequest(model="gemma", messages=(ChatMessage("user", "hi"),)))
    assert body["truncate"] is False


def test_the_400_is_a_context_overflow_with_the_servers_counts(fake_ollama: FakeOllama) -> None:
    async def go() -> None:
        b = OllamaBackend(fake_ollama.url, timeouts=FAST, num_ctx=1024)
        req = ChatRequest(model="gemma", messages=(ChatMessage("user", "word " * 2000),))
        try:
            with pytest.raises(ContextOverflow) as err:
                async for _ in b.stream(req):
                    pass
        finally:
            await b.aclose()
        assert (err.value.n_prompt, err.value.n_ctx) == (2501, 1024)
        assert "2501 tokens into a window of 1024" in str(err.value)

    asyncio.run(go())
    assert fake_ollama.truncated == 0


# --------------------------------------------------------------------------- the turn


def notes_of(conv: Conv) -> list[str]:
    return [
        t for b in parse(conv.log.read_bytes()).blocks for k, t in b.markers if k is MarkerKind.NOTE
    ]


def test_a_refused_prompt_is_compacted_once_visibly_and_asked_again(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    """The server's tokenizer counts 2.4 times our estimate: the history we thought fits is
    refused; the turn writes one NOTE with both counts, summarises, and the request it sends
    again fits the server's count. Never an answer built on a cut prompt."""
    rt = Runtime(settings=make_settings(fake_ollama), home=home)
    conv = new_conversation(
        home, "overflow", template=load_template(home, "default"), model="gemma", backend="ollama"
    )
    meta = json.loads(conv.metadata.read_text())
    meta["options"] = {"num_ctx": WINDOW}
    conv.metadata.write_text(json.dumps(meta))
    for i in range(3):  # ~1,300 characters a turn
        drop_message(conv, f"question {i}: " + "Tell me about the plan. " * 40)
        fake_ollama.enqueue(Step(text=f"answer {i}: " + "It moves a table at a time. " * 10))
        run_burst(rt)
    assert fake_ollama.refused == [] and notes_of(conv) == []
    # a server whose tokenizer counts 2.4 times our estimate: the next turn, which fits by
    # our estimate, is refused; then a summary, then the turn again
    fake_ollama.tokens_per_char = 0.6
    fake_ollama.enqueue(Step(text="The agent asked about the plan, twice."), Step(text="Done."))
    drop_message(conv, "And last? " + "Say more. " * 10)
    run_burst(rt)
    st = read_state(conv)
    assert st is not None and st.status is Status.IDLE, st
    assert fake_ollama.truncated == 0  # every request said truncate: false
    assert all(r.get("truncate") is False for r in fake_ollama.chat_requests())
    refused = fake_ollama.refused
    assert len(refused) == 1  # one refusal, one compaction, one retry
    blocks = parse(conv.log.read_bytes()).blocks
    last = blocks[-1]
    notes = notes_of(conv)  # (written before the reply began: on the agent's block)
    assert any(
        f"the server counted {refused[0]} prompt tokens for a window of {WINDOW}" in n
        for n in notes
    ), notes
    assert any(n.startswith("summary of the log before") for n in notes), notes
    assert not [
        t for b in blocks for k, t in b.markers if k in (MarkerKind.ERROR, MarkerKind.WARNING)
    ]
    assert last.text.strip() == "Done."
    # the request sent again fits the server's own count
    final = fake_ollama.chat_requests()[-1]
    assert fake_ollama.prompt_tokens(final["messages"]) <= WINDOW
    # and the calibration keeps the server's ratio: the next turn is not refused again
    assert rt.calibration.ratio("gemma") >= 0.5 > budget.DEFAULT_RATIO


# --------------------------------------------------------------------------- servers that still cut


def _conv(home: Home, name: str, backend: str, model: str, options: dict[str, Any]) -> Conv:
    conv = new_conversation(
        home, name, template=load_template(home, "default"), model=model, backend=backend
    )
    meta = json.loads(conv.metadata.read_text())
    meta["options"] = options
    conv.metadata.write_text(json.dumps(meta))
    return conv


def warnings_of(conv: Conv) -> list[str]:
    return [
        t
        for b in parse(conv.log.read_bytes()).blocks
        for k, t in b.markers
        if k is MarkerKind.WARNING
    ]


def test_an_older_ollama_that_cuts_silently_is_caught_by_our_count_not_the_window(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    """An Ollama that ignores ``truncate: false`` lowers a num_ctx over the model's trained
    context to it (a line in its own log only), then cuts the prompt over that and counts
    num_ctx/2 + 2 (#17427): well inside the window we asked for, so comparing with the window
    shows nothing. Our own count of what was sent (the ratio learnt from its earlier, honest
    counts) is far above it: the reply says, in one WARNING with both counts, that it was
    built on a cut prompt, and the cut count is not learnt as a ratio. The next turn is fitted
    to the tokens the server kept, so it is not cut again (before: every later turn was cut
    and said so, one WARNING a turn)."""
    fake_ollama.honours_truncate = False
    fake_ollama.caps_num_ctx = True
    trained = fake_ollama.models["gemma"]["ctx"]  # 8,192
    rt = Runtime(settings=make_settings(fake_ollama), home=home)
    conv = _conv(home, "cut", "ollama", "gemma", {"num_ctx": 2 * trained})
    for i in range(3):  # ~2,000 tokens a turn
        drop_message(conv, f"question {i}: " + "Tell me about the plan. " * 300)
        fake_ollama.enqueue(Step(text=f"answer {i}: " + "It moves a table at a time. " * 30))
        run_burst(rt)
    assert fake_ollama.truncated == 0 and warnings_of(conv) == []
    learnt = rt.calibration.ratio("gemma")
    fake_ollama.enqueue(Step(text="Built on half of it."))
    drop_message(conv, "And this? " + "Say more about the plan. " * 400)
    run_burst(rt)
    assert fake_ollama.truncated == 1
    cut = trained // 2 + 2
    warnings = warnings_of(conv)
    assert len(warnings) == 1 and f"the server counted {cut} prompt tokens of the ~" in warnings[0]
    sent = int(warnings[0].split("of the ~")[1].split(" ")[0])
    assert sent > cut / truncation.SHARE  # both counts, ours clearly above the server's
    assert f"smaller than the one of {2 * trained} tokens asked for" in warnings[0]
    blocks = parse(conv.log.read_bytes()).blocks
    assert blocks[-1].text.strip() == "Built on half of it."
    assert (MarkerKind.WARNING, warnings[0]) in blocks[-1].markers  # on the reply built on it
    assert rt.calibration.ratio("gemma") == learnt  # the cut count was not learnt
    assert notes_of(conv) == []
    st = read_state(conv)
    assert st is not None and st.status is Status.IDLE and st.turns == 4, st
    assert f"fitted to the {cut} tokens it kept" in warnings[0]
    # the next turn is fitted to what the server kept (a summary of the older part): not cut
    fake_ollama.enqueue(Step(text="The plan moves a table at a time."))  # the summary call
    fake_ollama.enqueue(Step(text="Whole this time."))
    drop_message(conv, "Once more, shortly.")
    run_burst(rt)
    assert fake_ollama.truncated == 1, fake_ollama.truncated
    blocks = parse(conv.log.read_bytes()).blocks
    assert blocks[-1].text.strip() == "Whole this time."
    assert MarkerKind.WARNING not in [k for k, _ in blocks[-1].markers]
    assert len(warnings_of(conv)) == 1
    assert abs(rt.calibration.ratio("gemma") - learnt) < 0.05 * learnt  # an honest count, learnt


def test_an_openai_compatible_server_that_cuts_is_caught(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    """A server with a window smaller than we were told (llama-server's context shift keeps
    what is past n_keep halved) reports ``usage.prompt_tokens`` after its cut."""
    fake = FakeOpenAI().start()
    try:
        rt = Runtime(settings=make_settings(openai={"base_url": fake.url + "/v1"}), home=home)
        conv = _conv(home, "cut", "openai", "fake-model", {"num_ctx": 16384})
        usage = {"prompt_tokens": 400, "completion_tokens": 3, "total_tokens": 403}
        fake.enqueue(OpenAIStep(pieces=["Built on ", "a part."], usage=usage))
        drop_message(conv, "Read this table back: " + "The plan moves a table. " * 400)
        run_burst(rt)
    finally:
        fake.stop()
    warnings = warnings_of(conv)
    assert len(warnings) == 1 and "the server counted 400 prompt tokens of the ~" in warnings[0]
    assert parse(conv.log.read_bytes()).blocks[-1].text.strip() == "Built on a part."


def test_a_prompt_cache_hit_never_looks_like_a_cut(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    """llama-server reuses its cache: ``timings.prompt_n`` is only the new tokens, and
    ``cache_n + prompt_n`` (and ``usage.prompt_tokens``) is the whole prompt; a server that
    gives ``prompt_n`` alone says nothing about a cut. Neither is called one."""
    fake = FakeOpenAI().start()
    try:
        rt = Runtime(settings=make_settings(openai={"base_url": fake.url + "/v1"}), home=home)
        conv = _conv(home, "cached", "openai", "fake-model", {"num_ctx": 16384})
        drop_message(conv, "Read this table back: " + "The plan moves a table. " * 100)
        first = uncounted_turn(fake, rt)
        assert warnings_of(conv) == []
        # the next turn: all but the new tail came from the cache
        fake.enqueue(
            OpenAIStep(
                pieces=["ok"],
                usage={"prompt_tokens": first + 40, "completion_tokens": 1},
                timings={"cache_n": first, "prompt_n": 40, "predicted_n": 1},
            ),
            OpenAIStep(pieces=["ok"], usage=None, timings={"prompt_n": 12, "predicted_n": 1}),
        )
        drop_message(conv, "And again?")
        run_burst(rt)
        drop_message(conv, "And once more?")
        run_burst(rt)
    finally:
        fake.stop()
    assert warnings_of(conv) == []
    st = read_state(conv)
    assert st is not None and st.turns == 3, st


def uncounted_turn(fake: FakeOpenAI, rt: Runtime) -> int:
    """One turn the server gives no count for (nothing to compare); what a server that
    counts a quarter of a token a character and the template's tokens would count for it."""
    fake.enqueue(OpenAIStep(pieces=["ok"], usage=None))
    run_burst(rt)
    sent = fake.chat_requests()[-1]
    chars = sum(len(m.get("content") or "") for m in sent["messages"])
    return chars // 4 + budget.PER_MESSAGE * len(sent["messages"])


def test_an_ollama_dialogue_with_honest_counts_never_looks_cut(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    """Ollama's runner counts every input of the prompt, those from its cache too: a dialogue
    under the window, by an Ollama that would cut, is never called cut."""
    fake_ollama.honours_truncate = False
    rt = Runtime(settings=make_settings(fake_ollama), home=home)
    conv = _conv(home, "honest", "ollama", "gemma", {"num_ctx": WINDOW})
    for i in range(4):
        drop_message(conv, f"question {i}: " + "Tell me about the plan. " * 20)
        fake_ollama.enqueue(Step(text=f"answer {i}."))
        run_burst(rt)
    assert fake_ollama.truncated == 0 and warnings_of(conv) == []


def test_a_conversation_of_numbers_beside_one_of_prose_is_never_called_cut(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    """One model, two conversations: a table of digits (a token a digit) teaches the model's
    ratio a high count; a conversation of prose beside it counts four times fewer a
    character. Its honest count is measured against its own ratio, never the other's."""
    fake_ollama.honours_truncate = False
    fake_ollama.digit_tokens = True
    rt = Runtime(settings=make_settings(fake_ollama), home=home)
    table = _conv(home, "table", "ollama", "gemma", {"num_ctx": 16384})
    prose = _conv(home, "prose", "ollama", "gemma", {"num_ctx": 16384})
    for i in range(3):
        drop_message(table, f"Row {i}: " + "1234567890" * 150)
        fake_ollama.enqueue(Step(text="Read.", model="gemma"))
        run_burst(rt)
    assert rt.calibration.ratio("gemma") > 0.5  # the model's ratio: the table's
    for i in range(3):
        drop_message(prose, f"Chapter {i}: " + "The plan moves a table at a time. " * 100)
        fake_ollama.enqueue(Step(text="Noted.", model="gemma"))
        run_burst(rt)
    assert fake_ollama.truncated == 0
    assert warnings_of(table) == [] and warnings_of(prose) == []
