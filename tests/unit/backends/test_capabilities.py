"""The capability registry, the think policy, backend selection, fallback and doctor checks."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncGenerator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from contemplation import backends
from contemplation import settings as settings_mod
from contemplation.backends.base import Backend, Capabilities, Check, PhaseTimeouts
from contemplation.backends.capabilities import (
    base_name,
    family_of,
    normalize_think,
    resolve,
    resolve_think,
)
from contemplation.backends.fallback import FallbackBackend
from contemplation.backends.ollama import OllamaBackend
from contemplation.errors import BackendError, ConfigError
from contemplation.models import ChatMessage, ChatRequest, StreamEvent
from contemplation.settings import CapabilityOverride, Settings

# --------------------------------------------------------------------------- family table


@pytest.mark.parametrize(
    ("model", "family"),
    [
        ("qwen3:8b", "qwen3"),
        ("Qwen/Qwen3-8B-GGUF", "qwen3"),
        ("local/qwen3-coder:30b", "qwen3-coder"),
        ("qwen3-vl:4b", "qwen3-vl"),
        ("/models/DeepSeek-R1-Distill-Qwen-7B-Q4_K_M.gguf", "deepseek-r1"),
        ("gpt-oss:20b", "gpt-oss"),
        ("llama3.2-vision", "llama3.2-vision"),
        ("llama3.2:3b", "llama3.2"),
        ("magistral:24b", "magistral"),
    ],
)
def test_the_longest_family_prefix_of_the_base_name_wins(model: str, family: str) -> None:
    fam = family_of(model)
    assert fam is not None and fam.prefix == family


def test_unknown_models_have_no_family_and_plain_capabilities() -> None:
    assert family_of("llama3:8b") is None
    assert resolve("some-finetune") == Capabilities()


def test_base_name_drops_provider_path_suffix_and_tag() -> None:
    assert base_name("local/SmolLM2-135M.gguf") == "smollm2-135m"
    assert base_name("hf.co/org/Model:Q4") == "model"


def test_server_answers_beat_the_table_and_config_beats_both() -> None:
    server = Capabilities(thinking=False, tools=True, context_length=4096, source="server")
    assert resolve("qwen3", server=server) == server  # the server says no thinking: trust it
    over = {"qwen3": CapabilityOverride(thinking=True, context_length=32768)}
    got = resolve("qwen3", server=server, overrides=over)
    assert got.thinking and got.tools and got.context_length == 32768 and got.source == "config"


def test_overrides_match_the_exact_name_or_the_base_name() -> None:
    over = {"mymodel": CapabilityOverride(vision=True)}
    assert resolve("local/mymodel:latest", overrides=over).vision
    assert not resolve("othermodel", overrides=over).vision


def test_a_reported_context_length_fills_in_a_table_guess() -> None:
    got = resolve("qwen3-8b", context_length=40960)
    assert got.thinking and got.context_length == 40960 and got.source == "family table"


# --------------------------------------------------------------------------- think policy


def test_think_passes_through_for_a_thinking_model() -> None:
    caps = Capabilities(thinking=True)
    assert resolve_think(caps, "high", "error") == ("high", None)
    assert resolve_think(caps, True, "error") == (True, None)
    assert resolve_think(caps, "False", "error") == (False, None)


def test_not_asking_to_think_never_fails() -> None:
    assert resolve_think(Capabilities(), None, "error") == (None, None)
    assert resolve_think(Capabilities(), False, "error") == (False, None)


def test_downgrade_drops_think_with_a_note_naming_the_model() -> None:
    value, note = resolve_think(Capabilities(source="server"), "max", "downgrade", model="gemma")
    assert value is None
    assert note is not None and "gemma cannot think" in note and "server" in note


def test_error_policy_raises_a_permanent_unsupported_error() -> None:
    with pytest.raises(BackendError) as info:
        resolve_think(Capabilities(), True, "error", model="gemma")
    assert not info.value.transient and info.value.kind == "unsupported"
    assert "gemma" in str(info.value)


def test_invalid_think_values_are_rejected() -> None:
    with pytest.raises(BackendError) as info:
        normalize_think("extreme")
    assert info.value.kind == "bad_request"
    assert normalize_think(" HIGH ") == "high"


# --------------------------------------------------------------------------- selection


@pytest.fixture
def make(tmp_path: Any) -> Iterator[Any]:
    def load(env: dict[str, str] | None = None, **overrides: Any) -> Settings:
        return settings_mod.load(home=tmp_path, env=env or {}, overrides=overrides, config=None)

    yield load


def test_every_backend_family_is_registered(make: Any) -> None:
    assert {"ollama", "openai", "opencode", "local"} <= set(backends.available())
    for name in ("ollama", "openai", "opencode", "local"):
        b = backends.build(name, make())
        assert b.name == name
        asyncio.run(b.aclose())


def test_unknown_backend_names_are_config_errors(make: Any) -> None:
    with pytest.raises(ConfigError, match="unknown backend"):
        backends.build("nope", make())


def test_fallback_list_from_the_environment_is_comma_separated(make: Any) -> None:
    s = make(env={"CONTEMPLATION_FALLBACK": "ollama, local"})
    assert s.fallback == ["ollama", "local"]
    b = backends.build("ollama", s)
    assert isinstance(b, FallbackBackend) and [x.name for x in b.chain] == ["ollama", "local"]
    assert not isinstance(backends.build("local", s), FallbackBackend)  # nothing after it
    assert not isinstance(backends.build("ollama", s, fallback=False), FallbackBackend)
    asyncio.run(b.aclose())


def test_backend_settings_come_from_the_sdk_environment_variables(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make(
        env={
            "OPENAI_BASE_URL": "http://10.1.2.3:8000",
            "OPENAI_API_KEY": "sk-test",
            "OPENCODE_SERVER_URL": "http://127.0.0.1:4999",
            "OPENCODE_SERVER_PASSWORD": "pw",
        }
    )
    oa: Any = backends.build("openai", s)
    oc: Any = backends.build("opencode", s)
    try:
        assert oa.base_url == "http://10.1.2.3:8000/v1"
        assert oa._http.headers["Authorization"] == "Bearer sk-test"
        assert oc.base_url == "http://127.0.0.1:4999"
        assert oc._http.headers["Authorization"] == "Basic b3BlbmNvZGU6cHc="  # opencode:pw
    finally:
        asyncio.run(oa.aclose())
        asyncio.run(oc.aclose())


class _Scripted:
    """A backend whose stream raises ``error`` before any event, or replies ``text``."""

    def __init__(self, name: str, *, error: BackendError | None = None, text: str = "") -> None:
        self.name = name
        self.label = name.upper()
        self.concurrency = 1
        self.error = error
        self.text = text
        self.calls = 0
        self.closed = False

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        yield StreamEvent("content", text=self.text)
        yield StreamEvent("done")

    async def capabilities(self, model: str) -> Capabilities:
        if self.error is not None:
            raise self.error
        return Capabilities(source=self.name)

    async def check(self, model: str | None) -> list[Check]:
        return [Check(self.name, self.error is None, "scripted")]

    async def forget(self, conversation_id: str) -> None:
        return None

    async def aclose(self) -> None:
        self.closed = True


REQ = ChatRequest("m", (ChatMessage("user", "hi"),), conversation_id="c")
DOWN = BackendError("cannot reach http://127.0.0.1:9: refused", transient=True, kind="unreachable")


async def _collect(b: Backend) -> list[StreamEvent]:
    return [ev async for ev in b.stream(REQ)]


def test_an_unreachable_server_hands_the_turn_on_with_a_note() -> None:
    chain = [_Scripted("ollama", error=DOWN), _Scripted("local", text="from local")]
    events = asyncio.run(_collect(FallbackBackend(chain)))
    assert events[0].kind == "note"
    assert events[0].text.startswith("ollama unreachable (cannot reach http://127.0.0.1:9")
    assert events[0].text.endswith("this reply comes from local")
    assert [e.text for e in events if e.kind == "content"] == ["from local"]


def test_other_errors_never_fall_back() -> None:
    busy = BackendError("503", transient=True, kind="server_busy")
    second = _Scripted("local", text="x")
    with pytest.raises(BackendError) as info:
        asyncio.run(_collect(FallbackBackend([_Scripted("ollama", error=busy), second])))
    assert info.value is busy and second.calls == 0


def test_a_reachable_primary_gets_no_note() -> None:
    events = asyncio.run(_collect(FallbackBackend([_Scripted("a", text="hi"), _Scripted("b")])))
    assert [e.kind for e in events] == ["content", "done"]


def test_when_every_server_is_unreachable_the_first_error_stays_transient() -> None:
    chain = [_Scripted("a", error=DOWN), _Scripted("b", error=DOWN)]
    with pytest.raises(BackendError) as info:
        asyncio.run(_collect(FallbackBackend(chain)))
    assert info.value.transient and info.value.kind == "unreachable"
    assert "fallbacks (b) were unreachable too" in str(info.value)


def test_capabilities_and_close_go_through_the_chain() -> None:
    a, b = _Scripted("a", error=DOWN), _Scripted("b")
    fb = FallbackBackend([a, b])
    assert asyncio.run(fb.capabilities("m")).source == "b"
    asyncio.run(fb.aclose())
    assert a.closed and b.closed


def test_check_all_covers_the_default_backend_and_its_fallbacks(make: Any) -> None:
    backends.register("scripted_ok", lambda s: _Scripted("scripted_ok"))
    backends.register("scripted_down", lambda s: _Scripted("scripted_down", error=DOWN))
    s = make(default_backend="scripted_ok", fallback=["scripted_down"])
    checks = asyncio.run(backends.check_all(s, extra=["nosuch"]))
    assert [(c.name, c.ok) for c in checks] == [
        ("scripted_ok", True),
        ("scripted_down", False),
        ("nosuch", False),
    ]


# --------------------------------------------------------------------------- Ollama


class _OldOllama(BaseHTTPRequestHandler):
    """An Ollama that predates ``capabilities`` in /api/show, with a model loaded."""

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _json(self, data: Any) -> None:
        body = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        loaded = {"name": "llama3.2:latest", "model": "llama3.2:latest", "context_length": 8192}
        self._json({"models": [loaded]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        info = {"general.architecture": "llama", "llama.context_length": 131072}
        self._json({"details": {"family": "llama"}, "model_info": info})


@pytest.fixture
def old_ollama() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _OldOllama)
    threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_ollama_without_capabilities_falls_back_to_the_table_and_ps_context(
    old_ollama: str,
) -> None:
    async def go() -> tuple[Capabilities, Capabilities]:
        timeouts = PhaseTimeouts(connect=2, first_byte=5, idle=5, total=10)
        plain = OllamaBackend(old_ollama, timeouts=timeouts)
        over = OllamaBackend(
            old_ollama, timeouts=timeouts, overrides={"llama3.2": CapabilityOverride(vision=True)}
        )
        try:
            return await plain.capabilities("llama3.2"), await over.capabilities("llama3.2")
        finally:
            await plain.aclose()
            await over.aclose()

    plain, over = asyncio.run(go())
    assert plain.tools and not plain.thinking and plain.source == "family table"
    assert plain.context_length == 8192  # what /api/ps says is allocated, not the trained 131072
    assert over.vision and over.tools and over.source == "config"
