"""The pure rule table: matching, argument templates, rule errors, tool-call healing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contemplation import settings as settings_mod
from contemplation.config.validate import validate
from contemplation.errors import ConfigError
from contemplation.needs import permissions
from contemplation.needs import rules as needrules
from contemplation.needs.router import NeedRouter
from contemplation.needs.tools import registry
from tests.unit.examples import examples

DEFAULTS = needrules.table()


@pytest.mark.parametrize(
    ("need", "tool", "args"),
    [
        ("Brain memory about query patterns", "memory.search", {"query": "query patterns"}),
        ("Obsidian notes matching event sourcing", "notes.search", {"query": "event sourcing"}),
        ("File contents of src/main.py", "files.read", {"path": "src/main.py"}),
        ("Search results for rust async", "web.search", {"query": "rust async"}),
        ("Current state of the deploy", "state.get", {"thing": "the deploy"}),
    ],
)
def test_the_five_protocol_needs_route_to_their_tools(
    need: str, tool: str, args: dict[str, str]
) -> None:
    found = DEFAULTS.route(need)
    assert found is not None
    assert found.tool == tool
    assert found.arguments == args


def test_prefix_is_case_insensitive_and_values_are_cleaned() -> None:
    found = DEFAULTS.route("file CONTENTS of `src/app.py`.")
    assert found is not None
    assert found.arguments == {"path": "src/app.py"}
    found = DEFAULTS.route('  Brain memory about "caching"  ')
    assert found is not None
    assert found.arguments == {"query": "caching"}


def test_prefix_must_end_at_a_word_boundary_and_unknown_needs_match_nothing() -> None:
    assert DEFAULTS.route("File contents ofsomething") is None
    assert DEFAULTS.route("The meaning of life") is None
    assert DEFAULTS.route("") is None


def test_need_text_is_capped() -> None:
    found = DEFAULTS.route("File contents of " + "a" * 5000)
    assert found is not None
    assert len(found.need) == needrules.MAX_NEED_CHARS
    assert len(found.arguments["path"]) <= needrules.MAX_ARG_CHARS


def test_regex_rule_fills_named_captures_need_and_literal_braces() -> None:
    rules = needrules.compile_rules(
        [
            {
                "name": "ticket",
                "match": r"Ticket (?P<id>\d+) in (?P<project>\w+)",
                "tool": "files.read",
                "args": {"path": "tickets/{project}/{id}.md", "raw": "{{need}}={need}", "n": 3},
            }
        ],
        source="test.toml",
    )
    found = needrules.table(rules).route("ticket 42 in CORE")
    assert found is not None
    assert found.rule.name == "ticket"
    assert found.arguments == {
        "path": "tickets/CORE/42.md",
        "raw": "{need}=ticket 42 in CORE",
        "n": 3,
    }
    assert needrules.table(rules).route("ticket 42 in CORE and more junk") is None  # whole need


def test_first_match_wins_config_before_defaults_and_template_before_config() -> None:
    config = needrules.compile_rules(
        [{"prefix": "File contents of", "tool": "agent"}], source="config.toml"
    )
    template = needrules.compile_rules(
        [{"prefix": "File contents of secret", "tool": "state.get"}], source="tpl.toml"
    )
    table = needrules.table(config, template)
    a = table.route("File contents of secret plans")
    b = table.route("File contents of README")
    assert a is not None and a.tool == "state.get"
    assert a.arguments == {"thing": "plans"}  # default argument for state.get
    assert b is not None and b.tool == "agent"


CONFIG_HEAD = """\
home = "{home}"

[mcp_servers.time]
command = "/bin/true"

[[routes]]
prefix = "Ticket"
tool = "files.read"
"""


@pytest.mark.parametrize(
    ("rule", "reason"),
    [
        ('match = "Ticket (?P<id"\ntool = "files.read"', "bad regular expression"),
        ('prefix = "Weather in"\ntool = "weather.get"', "unknown tool 'weather.get'"),
        ('prefix = "Weather in"', "missing field 'tool'"),
        ('prefix = "Weather in"\ntool = "nosuch:forecast"', "no [mcp_servers.nosuch]"),
        ('prefix = "A"\nmatch = "B"\ntool = "files.read"', "exactly one of 'prefix' or 'match'"),
        ('tool = "files.read"', "exactly one of 'prefix' or 'match'"),
        ('prefix = "Weather in"\ntool = "time:x"\nargs = { tz = "{city}" }', "{city}"),
        ('prefix = "Weather in"\ntool = "files.read"\nprefx = "typo"', "unknown field(s) prefx"),
        ('prefix = "Weather in"\ntool = "files.read"\nargs = "nope"', "'args' must be a table"),
    ],
)
def test_a_bad_rule_is_rejected_at_start_with_file_position_line_and_reason(
    tmp_path: Path, rule: str, reason: str
) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(CONFIG_HEAD.format(home=tmp_path / "home") + "\n[[routes]]\n" + rule + "\n")
    settings = settings_mod.load(config=cfg, env={})
    with pytest.raises(ConfigError) as info:
        NeedRouter(settings)
    msg = str(info.value)
    assert str(cfg) in msg
    assert "[[routes]] #2" in msg
    assert "(line 10)" in msg  # the second [[routes]] header
    assert reason in msg


def test_good_config_rules_compile_and_name_their_line(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        CONFIG_HEAD.format(home=tmp_path / "home")
        + '\n[[routes]]\nname = "now"\nmatch = "time in (?P<tz>.+)"\ntool = "time:get_current_time"'
        + '\nargs = { timezone = "{tz}" }\n'
    )
    router = NeedRouter(settings_mod.load(config=cfg, env={}))
    found = router.route("TIME IN Europe/Paris")
    assert found is not None
    assert found.tool == "time:get_current_time"
    assert found.arguments == {"timezone": "Europe/Paris"}
    assert "line 10" in found.rule.source


def test_template_rules_come_first_and_a_bad_one_names_the_template_file(tmp_path: Path) -> None:
    home = tmp_path / "home"
    tpl = home / "templates" / "ops"
    tpl.mkdir(parents=True)
    (tpl / "template.toml").write_text(
        'model = "x"\n\n[[routes]]\nprefix = "Current state of"\ntool = "files.read"\n'
        'param = "thing"\nargs = { path = "status/{thing}.txt" }\n'
    )
    router = NeedRouter(settings_mod.load(home=home, env={}, config=None))
    found = router.route("Current state of db", template="ops")
    assert found is not None
    assert found.arguments == {"path": "status/db.txt"}
    plain = router.route("Current state of db")
    assert plain is not None and plain.tool == "state.get"

    (tpl / "template.toml").write_text('\n\n[[routes]]\nmatch = "("\ntool = "files.read"\n')
    settings = settings_mod.load(home=home, env={}, config=None)
    with pytest.raises(ConfigError, match=r"template.toml: \[\[routes\]\] #1 \(line 3\)"):
        validate(settings)  # every template's routes compile at start and in doctor


# --------------------------------------------------------------------------- native tools


@pytest.mark.parametrize(
    "raw",
    [
        {"path": "a.txt"},
        '{"path": "a.txt"}',
        json.dumps(json.dumps({"path": "a.txt"})),  # double-escaped
        json.dumps(json.dumps(json.dumps({"path": "a.txt"}))),  # and once more
        "a.txt",  # a bare value for a one-parameter tool
    ],
)
def test_arguments_are_healed_from_every_shape_small_models_send(raw: object) -> None:
    assert needrules.heal_arguments(raw, ["path"]) == {"path": "a.txt"}


@pytest.mark.parametrize("raw", [None, "", "{not json", "[1, 2]", 42.5])
def test_unusable_arguments_become_an_empty_dict(raw: object) -> None:
    assert needrules.heal_arguments(raw, ["a", "b"]) == {}


def test_tool_calls_written_as_text_are_recognised() -> None:
    text = (
        "Sure, let me look.\n```json\n"
        '{"name": "read_file", "arguments": {"path": "src/a.py"}}\n```\n'
        '<tool_call>{"name": "brain_memory", "parameters": "{\\"topic\\": \\"x\\"}"}</tool_call>\n'
        '{"function": {"name": "web_search", "arguments": "{\\"query\\": \\"q\\"}"}}\n'
        '{"tool_calls": [{"function": {"name": "current_state", "arguments": {"thing": "db"}}}]}\n'
        '{"name": "rm_rf", "arguments": {}} and {"unrelated": true}'
    )
    calls = needrules.parse_text_tool_calls(text, known=DEFAULTS.functions())
    assert calls == [
        ("read_file", {"path": "src/a.py"}),
        ("brain_memory", {"topic": "x"}),
        ("web_search", {"query": "q"}),
        ("current_state", {"thing": "db"}),
    ]
    assert needrules.parse_text_tool_calls("no json here {at all") == []


def test_a_reply_nested_past_the_json_parser_is_no_tool_call_and_no_crash() -> None:
    call = '{"name": "read_file", "arguments": {"path": "a.py"}}'
    deep = '{"name": ' + "[" * 100_000
    # the call before the deep part is kept; the scan stops there instead of raising
    assert needrules.parse_text_tool_calls(f"{call}\n{deep}") == [("read_file", {"path": "a.py"})]
    assert needrules.parse_text_tool_calls("[" * 100_000) == []


def test_rules_are_offered_as_tools_in_the_ollama_openai_format() -> None:
    specs = [needrules.tool_spec(r) for r in DEFAULTS.functions().values()]
    names = [s["function"]["name"] for s in specs]
    assert names == ["brain_memory", "search_notes", "read_file", "web_search", "current_state"]
    read = specs[2]
    assert read["type"] == "function"
    assert read["function"]["parameters"] == {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "path"}},
        "required": ["path"],
    }


def test_a_native_call_is_routed_like_the_need_it_stands_for() -> None:
    rule = DEFAULTS.functions()["read_file"]
    found = needrules.route_call(rule, {"path": " docs/x.md "})
    assert found.need == "File contents of docs/x.md"
    assert found.arguments == {"path": "docs/x.md"}
    assert needrules.missing_params(rule, {}) == ["path"]


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=3000))
def test_routing_never_raises_and_never_returns_a_long_need(text: str) -> None:
    found = DEFAULTS.route(text)
    if found is not None:
        assert len(found.need) <= needrules.MAX_NEED_CHARS
        assert "\n" not in found.need


# --------------------------------------------------------------------------- a part of a file


@pytest.mark.parametrize(
    ("need", "path"),
    [
        ("File contents of ~/notes/plan.md lines 120-180", "~/notes/plan.md lines 120-180"),
        ("File contents of `notes/plan.md` line 120", "`notes/plan.md` line 120"),
        ("File contents of notes/plan.md (lines 120-)", "notes/plan.md (lines 120-)"),
    ],
)
def test_a_part_of_a_file_routes_to_the_reader_whole(need: str, path: str) -> None:
    """The built-in rule passes the path and its part as one argument; the reader splits them
    (so a native call's path may carry a part too)."""
    found = DEFAULTS.route(need)
    assert found is not None and found.tool == "files.read"
    assert found.arguments == {"path": path}


@pytest.mark.parametrize(
    "path",
    [
        "~/secret/plan.md lines 1-3",
        "`~/secret/plan.md` lines 1-3",
        "'~/secret/plan.md', lines 1-3",
        "~/secret/plan.md (lines 1 to 3)",
        "`~/secret/plan.md`",
        "/home/u/secret/plan.md line 2",
    ],
)
def test_a_part_of_a_file_is_judged_as_the_file_however_it_is_quoted(path: str) -> None:
    perms = [
        *permissions.DEFAULT_PERMISSIONS,
        *permissions.compile_permissions(
            {"read_file": {"~/secret/**": "deny"}},
            source="t.toml",
            names=[*registry.kinds(), "read_file"],
            home="/home/u",
        ),
    ]
    verdict = permissions.decide("read_file", "files.read", {"path": path}, perms, "/home/u")
    assert verdict.action == "deny"


def test_a_template_s_errors_name_the_file_it_was_read_from(tmp_path: Path) -> None:
    """A template the home lacks is the package's: its routes and permissions name that file
    (the router once built contemplation/needs/skeleton/..., which does not exist)."""
    from contemplation.needs.router import _template_file
    from contemplation.store.layout import Home
    from contemplation.store.templates import load_template

    bare = Home(tmp_path / "bare")  # no templates/ of its own
    shipped = load_template(bare, "default")
    assert shipped.shipped and _template_file(shipped).is_file()
    assert "skeleton/templates/default" in str(_template_file(shipped))
