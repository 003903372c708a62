"""The system prompt: a template's text adds to the protocol (or replaces it, on request), and
the protocol offers only the NEED forms this configuration can answer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contemplation import settings as settings_mod
from contemplation.engine.runtime import Runtime
from contemplation.models import BlockKind, Metadata
from contemplation.needs import rules as needrules
from contemplation.needs.router import NeedRouter
from contemplation.needs.tools.memory import MEMORY_FILE, JsonStore
from contemplation.prompt.prompts import (
    COMPLETE_RULE,
    NeedForm,
    build_request,
    need_forms,
    sketch_pattern,
    system_prompt,
)
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Home
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests.conftest import run_burst
from tests.fakes.ollama_server import FakeOllama, Step

ALL_FIVE = [
    "Brain memory about <topic>",
    "Obsidian notes matching <query>",
    "File contents of <path>",
    "Search results for <query>",
    "Current state of <thing>",
]


def meta(**fields: Any) -> Metadata:
    return Metadata(id="c", topic="Memory persistence", created="", **fields)


def offered(text: str) -> list[str]:
    return [
        line.strip()[len("NEED: ") :] for line in text.splitlines() if line.startswith("  NEED: ")
    ]


# --------------------------------------------------------------------------- add / replace


def test_the_default_prompt_is_intro_protocol_style_then_topic_placeholders_filled() -> None:
    """Canonical order: what every conversation shares first, the topic last."""
    text = system_prompt(meta())
    assert text.startswith(
        "You are in an asynchronous conversation with Claude (an AI agent or a person).\n\n"
        'When you need context that you do not have, write a line that starts with "NEED: "'
    )
    assert offered(text) == ALL_FIVE  # no forms given: the built-in five
    assert text.endswith(
        f"{COMPLETE_RULE}\n\nAnswer thoughtfully and concisely.\n\n"
        "This conversation is about: Memory persistence."
    )
    assert "{agent}" not in text and "{topic}" not in text


def test_a_template_prompt_adds_to_the_protocol_instead_of_replacing_it() -> None:
    own = "You review {topic} for {agent}: be blunt."
    text = system_prompt(meta(), own)
    assert "You review Memory persistence for Claude: be blunt." in text
    assert "Answer thoughtfully" not in text  # the template's own words replace the style line
    intro, mine, proto = text.index("You are in"), text.index("You review"), text.index("NEED:")
    assert intro < proto < mine < text.index("This conversation is about")
    assert offered(text) == ALL_FIVE and "\n=== COMPLETE ===\n\nYou review" in text


def test_prompt_mode_replace_keeps_the_old_whole_prompt_behaviour() -> None:
    own = "Only say yes or no about {topic}."
    text = system_prompt(meta(), own, prompt_mode="replace")
    assert text == "Only say yes or no about Memory persistence."
    # an empty own prompt cannot replace anything: the protocol stays
    assert "RESPONSE TO NEED" in system_prompt(meta(), "", prompt_mode="replace")


def test_replace_mode_can_still_list_the_offered_needs_with_the_needs_placeholder() -> None:
    own = "Ask with one of these and nothing else:\n{needs}"
    needs = (NeedForm("Current state of <thing>"),)
    text = system_prompt(meta(), own, prompt_mode="replace", needs=needs)
    assert text == "Ask with one of these and nothing else:\n  NEED: Current state of <thing>"


def test_the_conversations_own_system_prompt_follows_the_same_rule() -> None:
    m = meta(system_prompt="Reply in French.")
    added = system_prompt(m, "template words")
    assert (
        "Reply in French." in added and "template words" not in added
    )  # it wins over the template's
    assert offered(added) == ALL_FIVE and "=== COMPLETE ===\n\nReply in French." in added
    # the template's replace mode applies to it too, and metadata's own prompt_mode wins
    assert system_prompt(m, "t", prompt_mode="replace") == "Reply in French."
    assert system_prompt(meta(system_prompt="x", prompt_mode="replace"), "t") == "x"
    back = system_prompt(meta(system_prompt="x", prompt_mode="add"), "t", prompt_mode="replace")
    assert "RESPONSE TO NEED" in back
    # a prompt_mode that is neither is ignored: the template's decides
    odd = system_prompt(meta(system_prompt="x", prompt_mode="sideways"), "t", prompt_mode="replace")
    assert odd == "x"


def test_with_no_forms_on_offer_the_model_still_learns_need_lines_and_complete() -> None:
    text = system_prompt(meta(), needs=())
    assert offered(text) == []
    assert '"NEED: "' in text and "Claude answers in a" in text and "=== COMPLETE ===\n\n" in text
    assert "You can ask for" not in text


def test_build_request_puts_the_context_after_the_prompt() -> None:
    req = build_request(
        meta(), (), template_prompt="T.", needs=(NeedForm("Ping <x>", "Pong."),), context="CTX"
    )
    system = req.messages[0].content
    assert system.endswith(
        "=== COMPLETE ===\n\nT.\n\nThis conversation is about: Memory persistence.\n\nCTX"
    )
    assert "  NEED: Ping <x>\n      Pong." in system and offered(system) == ["Ping <x>"]


def test_a_cancelled_turn_stays_in_the_history_marked_and_roles_alternate() -> None:
    """Cancelled with words (after a cut-off too) or before any word, the
    turn is an assistant turn that says so; a failed or cut-off reply is still left out."""
    log = (
        "=== CLAUDE -> OLLAMA [2026-01-01 10:00:00] ===\nWrite an essay.\n\n"
        "=== OLLAMA -> CLAUDE [2026-01-01 10:00:01] ===\nOnce upon\n"
        "=== CANCELLED: generation stopped by the agent ===\n\n"
        "=== CLAUDE -> OLLAMA [2026-01-01 10:00:02] ===\nA poem then.\n"
        "=== CANCELLED: the turn was cancelled by the agent ===\n\n"
        "=== CLAUDE -> OLLAMA [2026-01-01 10:00:03] ===\nA haiku.\n\n"
        "=== OLLAMA -> CLAUDE [2026-01-01 10:00:04] ===\nOld pond\n=== INTERRUPTED ===\n"
        "=== CANCELLED: the turn was cancelled by the agent ===\n\n"
        "=== CLAUDE -> OLLAMA [2026-01-01 10:00:05] ===\nOne word.\n"
    )
    req = build_request(meta(), parse(log.encode()).blocks)
    got = [(m.role, m.content) for m in req.messages[1:]]
    assert got == [
        ("user", "Write an essay."),
        ("assistant", "Once upon\n\n(the agent cancelled this reply)"),
        ("user", "A poem then."),
        ("assistant", "(the agent cancelled this reply)"),
        ("user", "A haiku."),
        ("assistant", "Old pond\n\n(the agent cancelled this reply)"),
        ("user", "One word."),
    ]


# --------------------------------------------------------------------------- the forms


@pytest.mark.parametrize(
    ("pattern", "sketch"),
    [
        (r"(?:the )?current time in (?P<tz>\S+)", "current time in <tz>"),
        (r"^deploy status of (?P<svc>[a-z-]+)$", "deploy status of <svc>"),
        (r"(?i)weather\s+in\s+(?P<city>.+)", "weather in <city>"),
        (r"(?:ticket|issue) #(?P<n>\d+)", "ticket #<n>"),
        (r"ticket\.(?P<id>\w+)", "ticket.<id>"),
        (r"[abc]+ things", ""),  # beyond a sketch
        (r"a|b", ""),
    ],
)
def test_a_pattern_rule_is_sketched_as_a_need(pattern: str, sketch: str) -> None:
    assert sketch_pattern(pattern) == sketch


def test_need_forms_keep_rule_order_drop_repeats_and_stop_at_the_limit() -> None:
    rules = needrules.compile_rules(
        [
            {"prefix": "File contents of", "tool": "agent", "param": "path"},  # shadows the default
            {"match": r"(?:the )?time in (?P<tz>\S+)", "tool": "agent", "description": "Clock."},
            {"match": r"[xyz]{3}", "tool": "agent", "description": "Three letters."},
            {"match": r"[xyz]{4}", "tool": "agent"},  # nothing to show: left out
        ],
        source="test",
    )
    forms = need_forms([*rules, *needrules.default_rules()])
    assert [f.form for f in forms] == [
        "File contents of <path>",
        "time in <tz>",
        "<Three letters>",
        "Brain memory about <topic>",
        "Obsidian notes matching <query>",
        "Search results for <query>",
        "Current state of <thing>",
    ]
    assert forms[1].description == "Clock." and forms[0].description == ""
    assert len(need_forms(needrules.default_rules(), limit=2)) == 2
    assert [f.form for f in need_forms(needrules.default_rules())] == ALL_FIVE


def _router(tmp_path: Path, **overrides: Any) -> NeedRouter:
    s = settings_mod.load(home=tmp_path / "home", env={}, overrides=overrides, config=None)
    return NeedRouter(s)


def test_only_what_this_configuration_can_answer_is_offered(tmp_path: Path) -> None:
    bare = need_forms(_router(tmp_path).offered())
    # no notes vault, no allowed folders, no search tool: only the two stores under the home
    assert [f.form for f in bare] == ["Brain memory about <topic>", "Current state of <thing>"]
    text = system_prompt(meta(), needs=bare)
    assert (
        "Obsidian" not in text and "File contents of" not in text and "Search results" not in text
    )

    vault, src = tmp_path / "vault", tmp_path / "src"
    vault.mkdir()
    src.mkdir()
    full = _router(tmp_path, tools={"notes_vault": str(vault), "allowed_roots": [str(src)]})
    assert [f.form for f in need_forms(full.offered())] == [
        "Brain memory about <topic>",
        "Obsidian notes matching <query>",
        "File contents of <path>",
        "Current state of <thing>",
    ]


def test_a_templates_own_rules_are_offered_first(tmp_path: Path) -> None:
    tpl = tmp_path / "home" / "templates" / "ops"
    tpl.mkdir(parents=True)
    (tpl / "template.toml").write_text(
        '[[routes]]\nmatch = "(?:the )?runbook for (?P<service>\\\\S+)"\ntool = "agent"\n'
        'description = "The runbook of a service."\n'
    )
    router = _router(tmp_path)
    forms = need_forms(router.offered("ops"))
    assert forms[0] == NeedForm("runbook for <service>", "The runbook of a service.")
    assert "runbook for <service>" not in [f.form for f in need_forms(router.offered())]


# --------------------------------------------------------------------------- a real turn


def test_a_turn_sends_the_templates_words_and_only_the_routable_needs(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    tpl = home.templates / "terse"
    tpl.mkdir(parents=True)
    (tpl / "template.toml").write_text('description = "Short answers."\n')
    (tpl / "system_prompt.md").write_text(
        "<!-- a note for editors -->\nOne line answers about {topic}.\n"
    )
    conv = new_conversation(
        home, "caching", template=load_template(home, "terse"), model="llama3.2", backend="ollama"
    )
    drop_message(conv, "Redis or memcached?")
    fake_ollama.enqueue(Step(text="Redis."))
    s = make_settings(fake_ollama)
    run_burst(Runtime(settings=s, home=Home(s.home)))
    system = fake_ollama.chat_requests()[-1]["messages"][0]["content"]
    assert "One line answers about caching." in system and "editors" not in system
    assert offered(system) == ["Brain memory about <topic>", "Current state of <thing>"]
    assert system.endswith(
        "=== COMPLETE ===\n\nOne line answers about caching.\n\n"
        "This conversation is about: caching."
    )


def test_the_research_template_gathers_memory_about_the_topic_before_the_first_reply(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    JsonStore(home, MEMORY_FILE, durable=False).put("cache eviction", "we use LRU with a 5 min TTL")
    conv = new_conversation(
        home,
        "cache eviction",
        template=load_template(home, "research"),
        model="llama3.2",
        backend="ollama",
        extra={"context_requirements": [{"type": "constraints", "text": "Mine comes last."}]},
    )
    drop_message(conv, "Is our eviction policy right?")
    fake_ollama.enqueue(Step(text="Probably."))
    s = make_settings(fake_ollama)
    run_burst(Runtime(settings=s, home=Home(s.home)))
    system = fake_ollama.chat_requests()[-1]["messages"][0]["content"]
    assert "You are researching a question for Claude." in system
    assert "we use LRU with a 5 min TTL" in system  # gathered from memory about the topic
    assert "Cite where each claim comes from" in system  # the template's constraints
    assert system.index("Cite where") < system.index("Mine comes last.")
    assert "notes: cache eviction" in system and "unavailable" in system  # no vault: said so
    assert [b.kind for b in parse(conv.log.read_bytes()).blocks] == [
        BlockKind.AGENT,
        BlockKind.MODEL,
    ]


def test_the_prompt_names_the_readable_folders_and_how_to_ask_for_a_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Home-relative, at most 8 then "and N more", whole (never cut mid-name), and the
    `lines A-B` form after them, however long the folder names are."""
    home = tmp_path / "u"
    monkeypatch.setenv("HOME", str(home))
    roots = [home / "projects" / f"client-work-2026-research-notes-{i:02d}" for i in range(10)]
    for r in roots:
        r.mkdir(parents=True)
    router = _router(tmp_path, tools={"allowed_roots": [str(r) for r in roots]})
    text = system_prompt(meta(), needs=need_forms(router.offered()))
    [told] = [line for line in text.splitlines() if "client-work" in line]
    listed = ", ".join(f"~/projects/client-work-2026-research-notes-{i:02d}" for i in range(8))
    assert f"{listed} and 2 more." in told
    assert "research-notes-08" not in told
    assert told.rstrip().endswith("A part: add lines 120-180 after the path.")


def test_a_long_description_is_cut_at_a_word_end_and_marked() -> None:
    [rule] = needrules.compile_rules(
        [
            {
                "prefix": "Runbook for",
                "tool": "agent",
                "param": "service",
                "description": "word " * 90,
            }
        ],
        source="test",
    )
    [form] = need_forms([rule])
    told = form.line().splitlines()[1].strip()
    assert told.endswith("word …") and len(told) <= 300
