"""``contemplation models`` against the scripted Ollama-wire fake, a real llama.cpp server
(upstream llama-server, OpenAI-compatible), the embedded backend's model file, and a port
where nothing listens."""

from __future__ import annotations

import json

import pytest

from contemplation.store.layout import Home
from tests import peers, realpeers
from tests.conftest import base_env, cli_here
from tests.fakes.ollama_server import FakeOllama


def closed_port_url() -> str:
    return f"http://127.0.0.1:{realpeers.free_port()}"  # bound and released: nothing listens


def test_models_lists_each_model_with_what_it_can_do(home: Home, fake_ollama: FakeOllama) -> None:
    env = base_env(home, fake_ollama)
    data = json.loads(cli_here(env, "models", "--json").stdout)
    [ollama] = data["backends"]
    assert ollama["backend"] == "ollama" and ollama["ok"] is True
    by_name = {m["name"]: m for m in ollama["models"]}
    assert set(by_name) == {"llama3.2:latest", "qwen3:latest", "gemma:latest"}
    qwen = by_name["qwen3:latest"]
    assert (qwen["tools"], qwen["thinking"], qwen["context_length"]) == (True, True, 40960)
    assert qwen["source"] == "server" and qwen["request_window"] == 8192  # num_ctx sent
    gemma = by_name["gemma:latest"]
    assert (gemma["tools"], gemma["thinking"]) == (False, False)
    table = cli_here(env, "models").stdout.splitlines()
    assert table[0].split() == [
        "BACKEND",
        "MODEL",
        "TOOLS",
        "THINKING",
        "VISION",
        "CONTEXT",
        "SLOTS",
        "FROM",
    ]
    row = next(line for line in table if "qwen3:latest" in line).split()
    assert row[:5] == ["ollama", "qwen3:latest", "yes", "yes", "no"]
    assert row[-2:] == ["1", "server"]  # Ollama's auto: 1 (its own OLLAMA_NUM_PARALLEL)
    assert "ollama: 1 slot(s), auto: 1" in "\n".join(table)
    assert (ollama["slots"], ollama["slots_from"].split(":")[0]) == (1, "auto")
    assert "40960 (8192 per request)" in next(line for line in table if "qwen3" in line)


def test_a_config_override_wins_and_says_so(home: Home, fake_ollama: FakeOllama) -> None:
    config = home.root.parent / "caps.toml"
    config.write_text('[capabilities."gemma"]\ntools = true\n')
    env = base_env(home, fake_ollama, CONTEMPLATION_CONFIG=str(config))
    data = json.loads(cli_here(env, "models", "--json").stdout)
    gemma = next(m for m in data["backends"][0]["models"] if m["name"] == "gemma:latest")
    assert gemma["tools"] is True and gemma["source"] == "config"


def test_an_unreachable_backend_is_one_line_not_a_traceback(home: Home) -> None:
    env = base_env(home, OLLAMA_HOST=closed_port_url())
    r = cli_here(env, "models", check=False)
    assert r.returncode == 0  # no conversation uses it (test_cli_wait: exit 1 once one does)
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("ollama: not reachable at http://127.0.0.1:")
    assert "ollama serve" in r.stderr  # what to do
    data = json.loads(cli_here(env, "models", "--json", check=False).stdout)
    assert data["backends"][0]["ok"] is False and "not reachable" in data["backends"][0]["error"]


def test_an_unknown_backend_name_is_one_line(home: Home) -> None:
    r = cli_here(base_env(home), "models", "--backend", "nope", check=False)
    assert r.returncode == 1 and r.stderr.startswith("nope: unknown backend 'nope'")


@pytest.mark.real
def test_a_real_llama_cpp_server_beside_an_unreachable_one(home: Home) -> None:
    llama = realpeers.shared_llama_server()
    env = base_env(home, OPENAI_BASE_URL=f"{llama.url}/v1", OLLAMA_HOST=closed_port_url())
    r = cli_here(env, "models", "-b", "openai", "-b", "ollama", "--json", check=False)
    assert r.returncode == 1  # one of the two is down
    openai, ollama = json.loads(r.stdout)["backends"]
    assert openai["ok"] is True and ollama["ok"] is False
    [smollm] = openai["models"]
    assert smollm["name"] == "smollm2"
    assert isinstance(smollm["context_length"], int) and smollm["context_length"] > 0
    human = cli_here(env, "models", "-b", "openai", "-b", "ollama", check=False)
    assert "smollm2" in human.stdout and human.stderr.startswith("ollama: ")


@pytest.mark.real
def test_the_embedded_backend_lists_its_model_file(home: Home) -> None:
    gguf = peers.smollm2_gguf()
    env = base_env(
        home, CONTEMPLATION_LOCAL__MODEL_PATH=str(gguf), CONTEMPLATION_LOCAL__N_CTX="4096"
    )
    data = json.loads(cli_here(env, "models", "-b", "local", "--json").stdout)
    [local] = data["backends"]
    assert [m["name"] for m in local["models"]] == [gguf.name]
    assert local["models"][0]["context_length"] == 4096
