"""``contemplation memory``, ``state`` and ``templates``: output through click's CliRunner, and
the real command in real processes for concurrent writes and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from contemplation.needs.tools.memory import MEMORY_FILE, STATE_FILE, JsonStore
from contemplation.store.layout import Home
from tests.conftest import ROOT, base_env, cli
from tests.system.test_cli_commands import invoke


def memory_doc(home: Home) -> dict[str, dict[str, object]]:
    entries: dict[str, dict[str, object]] = json.loads((home.root / MEMORY_FILE).read_text())[
        "entries"
    ]
    return entries


# --------------------------------------------------------------------------- memory


def test_memory_add_list_search_rm(home: Home) -> None:
    r = invoke(home, "memory", "add", "Query patterns", "reads dominate 9:1", "-t", "db")
    assert r.exit_code == 0, r.output
    assert r.stdout == f"added 'Query patterns' in {home.root / MEMORY_FILE}\n"
    r = invoke(home, "memory", "add", "deploy", "-", input="fridays, after the cache warms\n")
    assert r.exit_code == 0 and r.stdout.startswith("added 'deploy'")
    assert memory_doc(home)["deploy"]["value"] == "fridays, after the cache warms"

    listed = invoke(home, "memory", "list")
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["KEY", "UPDATED", "TAGS", "VALUE"]
    assert lines[1].startswith("deploy ") and lines[2].startswith("Query patterns ")
    assert lines[2].split()[-3:] == ["reads", "dominate", "9:1"] and " db " in lines[2]
    as_json = json.loads(invoke(home, "memory", "list", "--json", "--tag", "db").stdout)
    assert [(e["key"], e["value"], e["tags"]) for e in as_json] == [
        ("Query patterns", "reads dominate 9:1", ["db"])
    ]

    hits = json.loads(invoke(home, "memory", "search", "query", "--json").stdout)
    assert [h["key"] for h in hits] == ["Query patterns"] and hits[0]["score"] > 0
    none = invoke(home, "memory", "search", "zebra")
    assert none.exit_code == 0 and none.stdout == "nothing in memory about 'zebra' (2 entries)\n"

    again = invoke(home, "memory", "add", "query  PATTERNS", "reads dominate 8:1", "--json")
    data = json.loads(again.stdout)
    assert data["added"] is False and data["replaced"]["value"] == "reads dominate 9:1"
    assert data["entry"]["key"] == "query PATTERNS" and len(memory_doc(home)) == 2

    assert invoke(home, "memory", "rm", "QUERY patterns").stdout.startswith("removed ")
    gone = invoke(home, "memory", "rm", "query patterns")
    assert gone.exit_code == 1
    assert gone.stderr == f"error: no memory entry 'query patterns' in {home.root / MEMORY_FILE}\n"
    assert list(memory_doc(home)) == ["deploy"]


def test_bad_input_is_one_line_and_changes_nothing(home: Home) -> None:
    invoke(home, "memory", "add", "a", "1")
    before = (home.root / MEMORY_FILE).read_bytes()
    for args in (
        ("memory", "add", " ", "x"),
        ("memory", "add", "b", ""),
        ("state", "set", "", "x"),
    ):
        r = invoke(home, *args)
        assert r.exit_code == 1 and r.stdout == ""
        assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert (home.root / MEMORY_FILE).read_bytes() == before
    usage = invoke(home, "memory", "search", "x", "--limit", "0")
    assert usage.exit_code == 2


def test_a_malformed_store_is_an_error_naming_the_file_and_is_left_alone(home: Home) -> None:
    home.root.mkdir(parents=True)
    path = home.root / MEMORY_FILE
    path.write_text('{"version": 1, "entries": [1, 2]}')
    for args in (
        ("memory", "list"),
        ("memory", "search", "x"),
        ("memory", "add", "k", "v"),
        ("memory", "rm", "k"),
    ):
        r = invoke(home, *args)
        assert r.exit_code == 1 and r.stdout == "", args
        assert r.stderr == (
            f'error: cannot read {path}: "entries" must be an object (key → entry), not list\n'
        )
    assert path.read_text() == '{"version": 1, "entries": [1, 2]}'
    (home.root / STATE_FILE).write_text("{")
    r = invoke(home, "state", "show")
    assert r.exit_code == 1 and r.stderr.startswith(
        f"error: cannot read {home.root / STATE_FILE}: not JSON"
    )


# --------------------------------------------------------------------------- state


def test_state_set_show_rm(home: Home) -> None:
    r = invoke(home, "state", "set", "deploy pipeline", "green; last run 10:02")
    assert r.stdout == f"recorded the state of 'deploy pipeline' in {home.root / STATE_FILE}\n"
    invoke(home, "state", "set", "database", "-", input="migrating\nto v16\n")
    shown = invoke(home, "state", "show", "Deploy  Pipeline")
    assert shown.exit_code == 0
    head, value = shown.stdout.splitlines()
    assert head.startswith("deploy pipeline (recorded ") and value == "green; last run 10:02"
    one = json.loads(invoke(home, "state", "show", "database", "--json").stdout)
    assert one["value"] == "migrating\nto v16" and one["key"] == "database"
    every = json.loads(invoke(home, "state", "show", "--json").stdout)
    assert [e["key"] for e in every] == ["database", "deploy pipeline"]
    table = invoke(home, "state", "show").stdout.splitlines()
    assert table[0].split() == ["KEY", "UPDATED", "TAGS", "VALUE"] and len(table) == 3
    missing = invoke(home, "state", "show", "kubernetes")
    assert missing.exit_code == 1
    assert missing.stderr == (
        "error: no state recorded for 'kubernetes' (recorded: database, deploy pipeline)\n"
    )
    assert invoke(home, "state", "rm", "database").exit_code == 0
    assert [e.key for e in JsonStore(home, STATE_FILE).entries()] == ["deploy pipeline"]
    assert invoke(home, "state", "rm", "database").exit_code == 1


def test_empty_stores_say_where_they_would_be(home: Home) -> None:
    assert invoke(home, "memory", "list").stdout == f"no entries in {home.root / MEMORY_FILE}\n"
    assert (
        invoke(home, "state", "show").stdout == f"no state recorded in {home.root / STATE_FILE}\n"
    )
    assert json.loads(invoke(home, "memory", "list", "--json").stdout) == []


# --------------------------------------------------------------------------- templates


def test_templates_lists_the_homes_and_the_shipped_ones(home: Home) -> None:
    listed = invoke(home, "templates")
    assert listed.exit_code == 0, listed.output
    rows = [line.split()[0] for line in listed.stdout.splitlines()]
    assert rows == ["NAME", "default", "research"]
    assert listed.stdout.splitlines()[2].endswith("shipped")  # the home does not exist yet

    mine = home.templates / "reviewer"
    mine.mkdir(parents=True)
    (mine / "template.toml").write_text(
        'model = "qwen3:8b"\nbackend = "ollama"\ndescription = "Reviews diffs."\n'
    )
    data = json.loads(invoke(home, "templates", "--json").stdout)
    assert [d["name"] for d in data] == ["default", "research", "reviewer"]
    reviewer = data[2]
    assert reviewer == {
        "name": "reviewer",
        "model": "qwen3:8b",
        "backend": "ollama",
        "description": "Reviews diffs.",
        "prompt_mode": "add",
        "where": str(mine),
        "shipped": False,
        "error": None,
    }
    assert data[0]["shipped"] is True


def test_a_broken_template_is_listed_with_its_error_and_the_exit_code_says_so(home: Home) -> None:
    bad = home.templates / "broken"
    bad.mkdir(parents=True)
    (bad / "template.toml").write_text('prompt_mode = "merge"\n')
    r = invoke(home, "templates")
    assert r.exit_code == 1
    line = next(x for x in r.stdout.splitlines() if x.startswith("broken"))
    assert "error: invalid prompt_mode" in line
    assert r.stderr.startswith("error: template broken: invalid prompt_mode in template ")
    assert r.stderr.count("\n") == 1
    assert "research" in r.stdout  # the others are still listed


def test_templates_show_gives_the_settings_and_the_prompt_as_sent(
    home: Home, tmp_path: Path
) -> None:
    r = invoke(home, "templates", "show", "research", "--topic", "cache eviction")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "template     research" in out and "(shipped with contemplation)" in out
    assert "model        llama3.2 (from the config)" in out
    assert '  - {"type": "memory", "query": "{topic}"}' in out
    prompt = out.split("system prompt as sent:\n", 1)[1]
    assert "about: cache eviction." in prompt and "You are researching" in prompt
    assert "NEED: Brain memory about <topic>" in prompt
    assert "Obsidian notes matching" not in prompt  # no vault is configured

    vault = tmp_path / "vault"
    vault.mkdir()
    data = json.loads(
        invoke(
            home,
            "templates",
            "show",
            "default",
            "--json",
            CONTEMPLATION_TOOLS__NOTES_VAULT=str(vault),
        ).stdout
    )
    assert data["prompt_mode"] == "add" and data["shipped"] is True
    assert data["system_prompt"].startswith("Answer thoughtfully")
    assert "NEED: Obsidian notes matching <query>" in data["prompt"]
    assert "=== COMPLETE ===\n\nAnswer thoughtfully" in data["prompt"]
    assert data["prompt"].endswith("This conversation is about: <topic>.")  # the topic last

    missing = invoke(home, "templates", "show", "nope")
    assert missing.exit_code == 1 and missing.stderr.startswith("error: no template named 'nope'")


def test_a_template_naming_a_configured_provider_or_alias_is_usable_everywhere(
    home: Home, tmp_path: Path
) -> None:
    """``templates``, ``templates show``, ``new --template`` and ``doctor``'s check are one
    check, with the settings: a provider or an alias of the config is a backend."""
    config = tmp_path / "config.toml"
    config.write_text(
        '[providers.box1]\nkind = "openai"\nurl = "http://127.0.0.1:9/v1"\n\n'
        '[aliases.coder]\nmodel = "qwen2.5-coder:7b"\nproviders = ["box1"]\n'
    )
    for name, backend in (("onbox", "box1"), ("coding", "coder")):
        folder = home.templates / name
        folder.mkdir(parents=True)
        (folder / "template.toml").write_text(f'model = "m"\nbackend = "{backend}"\n')
    listed = invoke(home, "--config", str(config), "templates", "--json")
    assert listed.exit_code == 0, listed.output
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert rows["onbox"]["error"] is None and rows["onbox"]["backend"] == "box1"
    assert rows["coding"]["error"] is None and rows["coding"]["backend"] == "coder"
    for name in ("onbox", "coding"):
        shown = invoke(home, "--config", str(config), "templates", "show", name)
        assert shown.exit_code == 0, shown.output
    made = invoke(home, "--config", str(config), "new", "t", "--template", "coding")
    assert made.exit_code == 0, made.output
    # without the config the same template names nothing: listed as broken, refused by show
    bare = invoke(home, "templates")
    assert bare.exit_code == 1 and "invalid backend 'coder'" in bare.stderr
    refused = invoke(home, "templates", "show", "coding")
    assert refused.exit_code == 1 and "invalid backend 'coder'" in refused.stderr


# --------------------------------------------------------------------------- real processes


def test_two_real_processes_adding_at_once_both_survive(home: Home) -> None:
    """The command end to end (test_memory holds the store to a start barrier: 4 processes)."""
    env = base_env(home)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "contemplation", "memory", "add", f"key {n}", f"value {n}"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert out.startswith("added 'key ")
    assert sorted(memory_doc(home)) == ["key 0", "key 1"]
    listed = cli(env, "memory", "list", "--json")
    assert sorted(e["key"] for e in json.loads(listed.stdout)) == ["key 0", "key 1"]
    home.root.joinpath(MEMORY_FILE).write_text("[")
    broken = cli(env, "memory", "add", "key 2", "x", check=False)
    assert broken.returncode == 1 and broken.stdout == ""
    assert broken.stderr.startswith(f"error: cannot read {home.root / MEMORY_FILE}: not JSON")
    assert broken.stderr.count("\n") == 1 and "Traceback" not in broken.stderr
