"""Templates on disk: seeding a new home, never over a person's own, reading and checking
template.toml (one line naming the file and the key), and what a new conversation gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from contemplation import settings as settings_mod
from contemplation.config.validate import validate
from contemplation.errors import ConfigError, NotFound
from contemplation.store.layout import Home, read_metadata
from contemplation.store.templates import load_template, shipped_templates, template_dirs
from contemplation.writer import ensure_home, new_conversation
from contemplation.writer.templates import _place, seed_templates

SHIPPED = ["default", "research"]


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def write_template(home: Home, name: str, toml: str, prompt: str | None = None) -> Path:
    d = home.templates / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "template.toml").write_text(toml)
    if prompt is not None:
        (d / "system_prompt.md").write_text(prompt)
    return d / "template.toml"


# --------------------------------------------------------------------------- seeding


def test_a_new_home_gets_the_shipped_templates_as_editable_copies(home: Home) -> None:
    ensure_home(home)
    assert sorted(p.name for p in home.templates.iterdir()) == SHIPPED  # no staging left over
    for name in SHIPPED:
        assert files(home.templates / name) == files(shipped_templates() / name)
    assert template_dirs(home) == {n: (home.templates / n, False) for n in SHIPPED}
    assert load_template(home, "research").folder == home.templates / "research"


def test_an_existing_templates_folder_is_never_touched(home: Home) -> None:
    ensure_home(home)
    (home.templates / "research" / "template.toml").unlink()
    (home.templates / "research" / "system_prompt.md").unlink()
    (home.templates / "research").rmdir()  # the person removed it on purpose
    mine = home.templates / "default" / "template.toml"
    mine.write_text('model = "mine"\n')
    ensure_home(home)
    assert not (home.templates / "research").exists()
    assert mine.read_text() == 'model = "mine"\n'
    assert load_template(home, "research").shipped  # the shipped one is still there to use


def test_seeding_skips_a_template_the_home_has_and_a_race_keeps_the_winner(home: Home) -> None:
    write_template(home, "default", 'model = "mine"\n', "my words")
    assert seed_templates(home, durable=False) == ["research"]
    assert (home.templates / "default" / "template.toml").read_text() == 'model = "mine"\n'
    assert (home.templates / "default" / "system_prompt.md").read_text() == "my words"
    # someone else makes the folder between the check and the rename: theirs stays
    assert _place(shipped_templates() / "research", home, durable=False) is False
    assert files(home.templates / "research") == files(shipped_templates() / "research")
    assert sorted(p.name for p in home.templates.iterdir()) == SHIPPED


def test_a_home_template_hides_the_shipped_one_and_odd_folders_are_no_templates(
    home: Home,
) -> None:
    write_template(home, "default", 'description = "mine"\n')
    (home.templates / "empty").mkdir()
    (home.templates / ".hidden").mkdir()
    (home.templates / ".hidden" / "template.toml").write_text("")
    found = template_dirs(home)
    assert list(found) == ["default", "research"]
    assert found["default"] == (home.templates / "default", False)
    assert found["research"] == (shipped_templates() / "research", True)
    assert load_template(home, "default").description == "mine"
    with pytest.raises(NotFound, match="no template named 'empty'"):
        load_template(home, "empty")


# --------------------------------------------------------------------------- reading


def test_the_shipped_templates_load_and_pass_validation(tmp_path: Path) -> None:
    default = load_template(Home(tmp_path), "default")
    assert default.prompt_mode == "add" and default.shipped
    assert default.system_prompt.startswith("Answer thoughtfully")  # the comment is not sent
    assert "<!--" not in default.system_prompt
    research = load_template(Home(tmp_path), "research")
    assert research.description and research.options == {"temperature": 0.3}
    assert [r["type"] for r in research.context_requirements] == ["memory", "notes", "constraints"]
    s = settings_mod.load(home=tmp_path / "home", env={}, config=None)
    ensure_home(Home(s.home))
    validate(s)  # the seeded copies and the shipped ones


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('prompt_mode = "merge"\n', "invalid prompt_mode in template {path}: 'merge'; use \"add\""),
        ("description = 3\n", "invalid description in template {path}: must be a string, not int"),
        ('options = "hot"\n', "invalid options in template {path}: must be a table, not str"),
        ("think = 1\n", "invalid think in template {path}: must be true or false or a string"),
        ("archive_on_complete = 'no'\n", "invalid archive_on_complete in template {path}"),
        ('context_requirements = "notes"\n', "invalid context_requirements in template {path}"),
        (
            'context_requirements = [{ query = "x" }]\n',
            "invalid context_requirements in template {path}: entry 1 must be a table with a "
            '"type"',
        ),
        ('system_prompt_file = "../secret.md"\n', "invalid system_prompt_file in template {path}"),
        ('system_prompt = ["a"]\n', "invalid system_prompt in template {path}: must be a string"),
        ('modle = "x"\n', "unknown key 'modle' in template {path}; known keys:"),
        ("model = \n", "cannot parse template {path}"),
    ],
)
def test_a_bad_template_value_is_one_line_naming_the_file_and_key(
    home: Home, toml: str, message: str
) -> None:
    path = write_template(home, "bad", toml)
    with pytest.raises(ConfigError) as err:
        load_template(home, "bad")
    assert message.format(path=path) in str(err.value)
    assert "\n" not in str(err.value)


def test_validate_names_an_unknown_context_requirement_type(tmp_path: Path) -> None:
    s = settings_mod.load(home=tmp_path / "home", env={}, config=None)
    path = write_template(Home(s.home), "lab", '[[context_requirements]]\ntype = "vibes"\n')
    with pytest.raises(ConfigError) as err:
        validate(s)
    assert str(err.value).startswith(
        f"invalid context_requirements in template {path}: entry 1 has type 'vibes'; known: "
    )


def test_prompt_text_comments_and_missing_files(home: Home) -> None:
    write_template(
        home,
        "t",
        'prompt_mode = "replace"\nsystem_prompt_file = "p.md"\n',
    )
    (home.templates / "t" / "p.md").write_text("<!--\nmulti\nline\n-->\nA <!-- inline --> B\n")
    tpl = load_template(home, "t")
    assert tpl.system_prompt == "A B" and tpl.prompt_mode == "replace"
    write_template(home, "bare", 'model = "m"\n')  # no system_prompt.md: nothing of its own
    assert load_template(home, "bare").system_prompt == ""
    write_template(home, "inline", 'system_prompt = "Inline {topic}."\n', "the file loses")
    assert load_template(home, "inline").system_prompt == "Inline {topic}."


# --------------------------------------------------------------------------- a new conversation


def test_a_new_conversation_gets_the_templates_requirements_for_its_topic(home: Home) -> None:
    write_template(
        home,
        "lab",
        '[[context_requirements]]\ntype = "notes"\nquery = "{topic} results"\n'
        '[[context_requirements]]\ntype = "files"\npaths = ["{topic}.md", "README.md"]\n',
    )
    conv = new_conversation(
        home,
        " Cache eviction ",
        template=load_template(home, "lab"),
        model="m",
        backend="ollama",
        extra={"context_requirements": [{"type": "memory", "query": "mine"}]},
    )
    meta = read_metadata(conv)
    assert meta is not None
    assert meta.context_requirements == [
        {"type": "notes", "query": "Cache eviction results"},
        {"type": "files", "paths": ["Cache eviction.md", "README.md"]},
        {"type": "memory", "query": "mine"},  # the caller's come after the template's
    ]
    plain = new_conversation(
        home, "x", template=load_template(home, "default"), model="m", backend="ollama"
    )
    plain_meta = read_metadata(plain)
    assert plain_meta is not None and plain_meta.context_requirements == []
