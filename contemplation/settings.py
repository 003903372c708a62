"""Settings: a TOML file, overridden by the environment, overridden by command-line flags.

Built on pydantic-settings (:class:`Settings` is a ``BaseSettings``); :func:`load` picks the
sources, highest first:

* flags: ``--home`` and the other overrides a command passes.
* environment: ``CONTEMPLATION_<KEY>`` for top-level keys and ``CONTEMPLATION_<SECTION>__<KEY>``
  for nested ones (e.g. ``CONTEMPLATION_OLLAMA__TIMEOUTS__TOTAL=300``); a table or list may
  also be given whole as JSON (``fallback`` and ``tools.allowed_roots`` stay plain lists:
  comma- and ``os.pathsep``-separated).
* file: ``--config PATH``, else ``CONTEMPLATION_CONFIG``, else ``<platformdirs config>/config.toml``
  (a missing default file is fine; a missing explicit file is an error).
* the variables users of each server already know (:data:`SERVER_ENV`: ``OLLAMA_HOST``,
  ``OPENAI_BASE_URL``, ...), used only when neither the file nor ``CONTEMPLATION_*`` sets
  that key.

Every value remembers its source (:meth:`Settings.source`), so a bad one is one line naming
the key and the file, the variable or the flag.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit

import platformdirs
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from contemplation.base.backend_kinds import SERVER_ENV_BY_KIND
from contemplation.base.redact import redacted
from contemplation.errors import ConfigError
from contemplation.protocol import escalation

if TYPE_CHECKING:
    from pydantic_settings.sources.types import Traversable

APP = "contemplation"
ENV_PREFIX = "CONTEMPLATION_"


class Section(BaseModel):
    """A table whose unknown keys are refused (a misspelt key is named, never ignored)."""

    model_config = ConfigDict(extra="forbid")


class TimeoutSettings(Section):
    connect: float = Field(10.0, gt=0, description="seconds to open the connection")
    first_byte: float = Field(600.0, gt=0, description="wait for the first byte (cold model load)")
    idle: float = Field(120.0, gt=0, description="longest silence between two chunks")
    total: float = Field(
        900.0,
        gt=0,
        description="cap on one whole reply: a reply that drips slowly cannot hold a backend "
        "slot (and every conversation queued behind it) for longer",
    )


class RetrySettings(Section):
    base: float = Field(2.0, gt=0, description="first backoff in seconds")
    cap: float = Field(300.0, gt=0, description="longest backoff in seconds")
    max_attempts: int = Field(50, ge=1, description="then the turn fails with status error")


class RetentionSettings(Section):
    archived_days: int | None = Field(
        None,
        ge=1,
        description="the daemon deletes archived conversations whose last activity is older, "
        "once a day (unset: never)",
    )


class NotificationRule(Section):
    """``[[notifications]]``: run ``command`` (an argv list, never a shell line) on events."""

    on: list[Literal["reply", "need", "complete", "error"]] = Field(
        min_length=1, description="the events that run the command"
    )
    command: list[str] = Field(
        min_length=1, description="the command, an argv list (never a shell line)"
    )
    timeout: float = Field(30.0, gt=0, description="seconds before the command is killed")


def _concurrency(v: Any) -> int | Literal["auto"]:
    if v == "auto":
        return "auto"
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v)  # from the environment
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 64:
        raise ValueError('must be "auto" or a whole number from 1 to 64')
    return v


# turns a provider takes at once: "auto" asks the server (a number in the config wins)
Concurrency = Annotated[int | Literal["auto"], PlainValidator(_concurrency)]


def check_url(v: str) -> str:
    """An http(s) URL with a host and a valid port, or empty (the default)."""
    if not v:
        return v
    try:
        parts = urlsplit(v)
        port_ok = parts.port is None or parts.port > 0
    except ValueError as exc:
        raise ValueError(f"not a usable URL: {exc}") from None
    if parts.scheme not in {"http", "https"} or not parts.hostname or not port_ok:
        raise ValueError("must be an http:// or https:// URL with a host")
    return v


NAME_RE = r"^[a-z][a-z0-9_]{0,31}$"  # a provider or alias name: also the log's label, upper-cased


class ProviderTable(BaseModel):
    """``[providers.<name>]``: its ``kind`` here; the rest of the table is the kind's own keys
    (``url``, ``concurrency``, ...), checked by that kind's settings model wherever the
    provider is made or validated (start, ``doctor``, ``models``: ``backends.config``), so
    this module knows no backend kind."""

    model_config = ConfigDict(extra="allow")
    kind: str = Field(min_length=1, description="ollama | openai | opencode | local | a plugin's")

    def own(self) -> dict[str, Any]:
        """The kind's own keys: the table without ``kind``."""
        return dict(self.model_extra or {})


class AliasSettings(Section):
    """``[aliases.<name>]``: what a conversation names with ``--model``: the server's own model
    name, the providers that serve it (a turn takes a free slot on any), options and think."""

    model: str = Field(min_length=1, description="the server's own model name")
    providers: list[str] = Field(
        min_length=1, max_length=64,
        description="the providers that serve it; a turn takes a free slot on any",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="the model's options (temperature, num_ctx, ...)"
    )
    think: bool | str | None = Field(
        None, description="ask the model to think (true, false, or a level)"
    )
    escalate: list[str] = Field(
        default_factory=list,
        description="the escalation ladder: the rungs after this model (a model, an alias, "
        "panel:A,B, agent last), tried in turn when a reply fails for a cause of [escalation]",
    )
    sticky: bool = Field(
        True, description="the rung that answers stays the conversation's (false: that turn only)"
    )


class EscalationSettings(Section):
    """``[escalation]``: the named causes that send a turn up its ladder (an alias's or a
    template's ``escalate``); each can be turned off. Without a ladder nothing changes."""

    loop: bool = Field(True, description="the loop watch stopped the reply")
    length: bool = Field(True, description="cut at the token limit after one continue")
    schema_: bool = Field(
        True, alias="schema", description="the reply did not match its schema after its retry"
    )
    needs: bool = Field(True, description="the need-round limit was hit")
    error: bool = Field(True, description="a backend error after its retries and fail-over")
    time: bool = Field(True, description="a reply went over time_budget")
    seat: bool = Field(
        True,
        description="a seat of a panel rung failed (any of the causes above, on that seat): "
        "the turn goes to the next rung without asking the seats after it; off: as without a "
        "ladder (an error ends the turn, a reply stopped early is that seat's answer)",
    )
    disagree: bool = Field(
        True,
        description="a panel rung's seats disagree: no strict majority gives the same answer "
        "(compared without case, spacing and punctuation; JSON by its value); off: every "
        "seat's answer stands, a NOTE says they disagree",
    )
    time_budget: float = Field(
        0.0,
        ge=0,
        description="seconds a reply on a ladder may stream before it is stopped (0: no budget)",
    )

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def rules(self) -> dict[str, bool]:
        on = self.model_dump(by_alias=True, exclude={"time_budget"})
        on["time"] = bool(on["time"] and self.time_budget > 0)
        return {k: bool(v) for k, v in on.items()}


class CapabilityOverride(Section):
    """What a model can do, when neither the server nor the family table gets it right."""

    thinking: bool | None = Field(
        None, description="the model can think before it answers"
    )
    tools: bool | None = Field(
        None, description="the model can call tools"
    )
    vision: bool | None = Field(
        None, description="the model reads images"
    )
    context_length: int | None = Field(
        None, ge=1, description="the model's window, in tokens"
    )


class McpServerSettings(Section):
    """One ``[mcp_servers.<name>]``: the Claude Desktop ``mcpServers`` shape (or ``url``)."""

    command: str = Field("", description="executable of a stdio server (absolute or on PATH)")
    args: list[str] = Field(
        default_factory=list, description="the stdio server's arguments"
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="variables set for the stdio server"
    )
    cwd: str | None = Field(
        None, description="the stdio server's working folder"
    )
    url: str = Field("", description="a streamable HTTP server instead of a command")
    headers: dict[str, str] = Field(
        default_factory=dict, description="HTTP headers sent to a url server"
    )
    type: Literal["stdio", "http", "streamable-http"] | None = Field(
        None, description="stdio or http (default: from command or url)"
    )
    timeout: float = Field(30.0, gt=0, description="seconds per tool call")
    start_timeout: float = Field(30.0, gt=0, description="seconds to start and initialise")
    roots: list[Path] = Field(
        default_factory=list, description="MCP roots to advertise (each inside tools.allowed_roots)"
    )

    @field_validator("url", mode="after")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if v and urlsplit(v).scheme not in {"http", "https"}:
            raise ValueError("url must start with http:// or https://")
        return v


class ToolLimits(Section):
    needs_per_reply: int = Field(5, ge=1, description="needs answered per model reply")
    calls_per_minute: float = Field(30, gt=0, description="tool calls per conversation a minute")
    tool_timeout: float = Field(20.0, gt=0, description="seconds for one need")
    parallel: int = Field(8, ge=1, description="tool calls in flight at once")


class ToolSettings(Section):
    allowed_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list, description="folders `File contents of` may read (nothing if empty)"
    )
    notes_vault: Path | None = Field(None, description="a folder of Markdown notes")
    answer_budget_chars: int = Field(
        2000,
        ge=200,
        description="characters of one need's answer (~500 tokens), for every tool: a longer "
        "answer is cut at a line end and says how many characters were left out; a file is "
        "read in parts of this size, each naming the NEED for the next (`… lines A-B`)",
    )
    max_file_bytes: int = Field(
        256 * 1024,
        ge=1024,
        description="characters of a file shown at most in one answer (the smaller of this "
        "and answer_budget_chars)",
    )
    deny: list[str] = Field(default_factory=list, description="more names never read (globs)")
    search_tool: str = Field("", description="`server:tool` for `Search results for`")
    search_arguments: dict[str, Any] = Field(
        default_factory=lambda: {"query": "{query}"},
        description="the arguments of search_tool, with {query} filled in",
    )
    context_deadline: float = Field(4.0, gt=0, le=30, description="seconds to gather context")
    context_fresh_seconds: float = Field(300.0, ge=0, description="reuse gathered context")
    limits: ToolLimits = Field(default_factory=ToolLimits)

    @field_validator("allowed_roots", mode="before")
    @classmethod
    def _split_roots(cls, v: Any) -> Any:
        return [p for p in v.split(os.pathsep) if p] if isinstance(v, str) else v


class SemanticSettings(Section):
    """search by meaning with your own embedding server (Ollama, llama-server, any
    OpenAI-compatible one) instead of the offline model, which embeds while it is unset"""

    embed_url: str = Field(
        "",
        description="the embedding server, e.g. http://127.0.0.1:11434 (Ollama) or "
        "http://127.0.0.1:8080 (llama-server --embeddings); empty: the offline model",
    )
    embed_model: str = Field(
        "", description="the model it embeds with, e.g. nomic-embed-text (with embed_url)"
    )
    embed_api: Literal["ollama", "openai"] = Field(
        "ollama", description="ollama: POST /api/embed; openai: POST /v1/embeddings"
    )
    embed_timeout: float = Field(
        30.0,
        gt=0,
        le=600,
        description="seconds one request to it may take (a search's query: 10 at most; past "
        "it the search says so and ranks by words)",
    )

    @field_validator("embed_url", mode="after")
    @classmethod
    def _url(cls, v: str) -> str:
        return check_url(v.strip())

    @field_validator("embed_model", mode="after")
    @classmethod
    def _model(cls, v: str) -> str:
        return v.strip()

    @model_validator(mode="after")
    def _both(self) -> SemanticSettings:
        if bool(self.embed_url) != bool(self.embed_model):
            raise ValueError(
                "embed_url and embed_model go together: the server and the model it embeds "
                "with (both empty: the offline model)"
            )
        return self

    def server(self) -> tuple[str, str, str, float]:
        """What :func:`contemplation.index.embedder.configure` takes."""
        return (self.embed_url, self.embed_model, self.embed_api, self.embed_timeout)


class AttachmentSettings(Section):
    """What one message may carry (see :mod:`contemplation.store.attachments`); over a limit the
    message goes to ``failed/`` with the reason."""

    max_file_bytes: int = Field(10 * 1024 * 1024, ge=1, description="bytes of one attached file")
    max_message_bytes: int = Field(
        20 * 1024 * 1024, ge=1, description="bytes of all the files one message carries"
    )
    max_files: int = Field(8, ge=1, description="files one message carries")
    inline_text_bytes: int = Field(
        64 * 1024,
        ge=256,
        description="bytes of an attached text file inlined into the message (cut at a line "
        "end past it, saying how much was left out)",
    )


class Settings(BaseSettings):
    """Every setting. :func:`load` fills it from (highest first) the command-line flags,
    ``CONTEMPLATION_*``, the TOML file, the servers' own variables (:data:`SERVER_ENV`) and
    the defaults, and remembers where each value came from (:meth:`source`)."""

    model_config = SettingsConfigDict(
        extra="forbid",
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        case_sensitive=True,  # keys in the file and flags as written; see _EnvSource for names
    )

    home: Path = Field(
        default_factory=lambda: Path(platformdirs.user_data_dir(APP)),
        description="the folder of every conversation (active/, completed/), the stores and "
        "the index",
    )
    config_file: Path | None = Field(
        None, description="the TOML file read (set it with --config or CONTEMPLATION_CONFIG)"
    )
    default_backend: str = Field(
        "ollama", description="the backend (provider) of a conversation that names none"
    )
    default_model: str = Field(
        "llama3.2",
        description="the model of a conversation that names none (and its template neither)",
    )
    default_template: str = Field(
        "default", description="the template of `new` without --template"
    )
    rescan_interval: float = Field(
        5.0, gt=0, description="seconds between the periodic full scans, besides filesystem events"
    )
    settle_seconds: float = Field(1.0, ge=0, description="quiet time before a naive write counts")
    search_seconds: float = Field(
        10.0, gt=0, le=3600, description="the longest a full-text search runs before it is cut"
    )
    max_message_bytes: int = Field(
        2 * 1024 * 1024, ge=1,
        description="the largest message file taken from inbox/ (larger: failed/)",
    )
    max_reply_bytes: int = Field(
        4 * 1024 * 1024, ge=1024,
        description="the most text one reply may write; past it the stream is closed",
    )
    attachments: AttachmentSettings = Field(default_factory=AttachmentSettings)
    max_schema_bytes: int = Field(
        16 * 1024, ge=64, description="largest JSON Schema a message or template may ask for"
    )
    agent_approves: Literal["never", "without_forms", "always"] = Field(
        "without_forms",
        description="when the agent's conversation_approve may decide a lookup marked ask: "
        "never; without_forms (only when its MCP client shows the person no forms); always",
    )
    archive_on_complete: bool = Field(
        True, description="move a conversation to completed/ once the model ends it"
    )
    stop_grace: float = Field(
        10.0, ge=0, description="seconds in-flight turns get to finish after SIGTERM"
    )
    durability: Literal["fsync", "none"] = Field(
        "fsync",
        description="fsync: every write made durable before it is acknowledged; none: tests only",
    )
    log_format: Literal["auto", "console", "json"] = Field(
        "auto", description="the diagnostic log's format on stderr (auto: console on a terminal)"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="the diagnostic log's level"
    )
    native_tools: bool = Field(
        True, description="offer the routes as native tools to models that can call tools"
    )
    stop_repeating: bool = Field(
        True, description="stop a reply that repeats one span over and over (a model in a loop)"
    )
    reply_cap: float = Field(
        0.5,
        ge=0,
        le=1,
        description="the most a reply may take, as a share of the window, when the options "
        "set no num_predict (0: no cap sent)",
    )
    breaker_threshold: int = Field(
        5, ge=1, description="transient failures in a row before a backend is left alone"
    )
    breaker_cooldown: float = Field(10.0, gt=0, description="seconds a failing backend rests")
    max_need_rounds: int = Field(
        5, ge=1, description="model replies with NEEDs per agent message before a pause"
    )
    model_switch_after: int = Field(
        4, ge=1, description="turns on the loaded model before waiting turns on others get in"
    )
    rotate_bytes: int = Field(
        10 * 1024 * 1024, ge=1024, description="rotate messages.log once it passes this size"
    )
    kv_files_bytes: int = Field(
        8 << 30,
        ge=0,
        description="slot files (llama-server --slot-save-path) kept for conversations, in "
        "bytes: no new file past it, the least recently used written over",
    )
    dashboard_enabled: bool = Field(
        True, description="serve the dashboard from the daemon (run --no-dashboard: off)"
    )
    dashboard_port: int = Field(5556, ge=0, le=65535, description="0: any free port")
    dashboard_host: str = Field("127.0.0.1", description="bind address (loopback by default)")
    dashboard_allow_remote: bool = Field(
        False, description="allow a non-loopback dashboard_host; then reads need the token too"
    )
    dashboard_max_connections: int = Field(
        256, ge=8, le=10_000, description="open dashboard connections; more get a quick 503"
    )
    dashboard_max_subscribers: int = Field(
        64, ge=1, le=10_000, description="live event streams at once; more get a quick 503"
    )
    notifications: list[NotificationRule] = Field(default_factory=list)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    escalation: EscalationSettings = Field(default_factory=EscalationSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    semantic: SemanticSettings = Field(default_factory=SemanticSettings)
    ollama: dict[str, Any] = Field(
        default_factory=dict, description="[ollama]: the provider named ollama (kind ollama)"
    )
    routes: list[dict[str, Any]] = Field(
        default_factory=list, description="[[routes]]: NEED rules, checked by contemplation.router"
    )
    permissions: dict[str, Any] = Field(
        default_factory=dict,
        description="[permissions]: allow / ask / deny per rule or tool and argument pattern, "
        "checked by contemplation.needs.rules",
    )
    mcp_servers: dict[str, McpServerSettings] = Field(default_factory=dict)
    tools: ToolSettings = Field(default_factory=ToolSettings)
    openai: dict[str, Any] = Field(
        default_factory=dict, description="[openai]: the provider named openai (kind openai)"
    )
    opencode: dict[str, Any] = Field(
        default_factory=dict, description="[opencode]: the provider named opencode (kind opencode)"
    )
    local: dict[str, Any] = Field(
        default_factory=dict, description="[local]: the provider named local (kind local)"
    )
    fallback: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="backends in order, e.g. ['ollama', 'local']: when one is unreachable, "
        "its turn goes to the next one after it (env: comma-separated)",
    )
    think_unsupported: Literal["error", "downgrade"] = Field(
        "downgrade", description="think asked of a model that cannot: fail, or drop it with a note"
    )
    plugins: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="[plugins.<name>]: a plugin backend's own settings (its model checks them)",
    )
    capabilities: dict[str, CapabilityOverride] = Field(
        default_factory=dict, description="per-model overrides, keyed by model name"
    )
    providers: dict[str, ProviderTable] = Field(
        default_factory=dict,
        description="[providers.<name>]: servers by name (kind, url, concurrency, ...); the "
        "[ollama], [openai], [opencode] and [local] sections are the providers of those names",
    )
    aliases: dict[str, AliasSettings] = Field(
        default_factory=dict,
        description="[aliases.<name>]: a model name over one or more providers, with options",
    )

    _sources: _Sources | None = PrivateAttr(default=None)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Highest first: the flags (``init_settings``), ``CONTEMPLATION_*``, the TOML file,
        the servers' own variables; pydantic-settings adds the defaults last. Only while
        :func:`load` runs: ``Settings(...)`` made in code takes its arguments and defaults."""
        loading = _LOADING.get()
        return (init_settings,) if loading is None else loading.build(settings_cls, init_settings)

    def source(self, key: str) -> str:
        """Where a setting's value came from (for errors found after loading)."""
        sources = self._sources
        return sources.source(tuple(key.split("."))) if sources is not None else "the settings"

    def refusal(self, exc: ValidationError, at: tuple[str, ...]) -> ConfigError:
        """A table a backend kind's own model refused (``at``: ``("providers", "box1")``,
        ``("ollama",)``): one line naming the key and the file, variable or flag."""
        sources = self._sources
        if sources is None:  # made in code: nothing to name but the key
            sources = _Sources()
            sources.by_path[at] = "the settings"
        return ConfigError(_describe(exc, sources, at))

    @field_validator("fallback", mode="before")
    @classmethod
    def _comma_list(cls, v: Any) -> Any:
        return [p.strip() for p in v.split(",") if p.strip()] if isinstance(v, str) else v

    @field_validator("home", mode="after")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        return v.expanduser().absolute()


def default_config_path() -> Path:
    return Path(platformdirs.user_config_dir(APP)) / "config.toml"


# the variables users of each server already know; a value in the file or in
# CONTEMPLATION_* wins over them (each kind declares its own: :mod:`.backend_kinds`)
SERVER_ENV = {
    name: (kind, key) for kind, env in SERVER_ENV_BY_KIND.items() for name, key in env.items()
}
_SERVER_VARIABLE = {path: name for name, path in SERVER_ENV.items()}

_Where = Callable[[tuple[str, ...]], str]


class _Sources:
    """For every key a source supplied, where its value came from.

    Sources are read highest first and merged like pydantic-settings merges them (a table
    from two sources is merged key by key, anything else is taken whole from the higher one),
    so the first source to supply a key, or a key above or below it, owns it.
    """

    def __init__(self) -> None:
        self.by_path: dict[tuple[str, ...], str] = {}

    def record(self, data: Mapping[str, Any], where: _Where, at: tuple[str, ...] = ()) -> None:
        for k, v in data.items():
            path = (*at, str(k))
            if isinstance(v, dict) and v:
                self.record(v, where, path)
            elif not any(p[: len(path)] == path or path[: len(p)] == p for p in self.by_path):
                self.by_path[path] = where(path)

    def source(self, loc: tuple[str | int, ...]) -> str:
        """Where the value at ``loc`` (or the nearest enclosing key) was set."""
        key = tuple(str(p) for p in loc)
        for n in range(len(key), 0, -1):
            found = self.by_path.get(key[:n])
            if found:
                return found
        for path, found in self.by_path.items():  # a section given whole, e.g. a bad table
            if path[: len(key)] == key:
                return found
        return "the defaults"

    def table_source(self, loc: tuple[str | int, ...]) -> str:
        """Where the table holding ``loc`` was written (a required key left out of it)."""
        key = tuple(str(p) for p in loc)
        for n in range(len(key) - 1, 0, -1):
            for path, found in self.by_path.items():
                if path[:n] == key[:n]:
                    return found
        return "the defaults"


class _Tracked(PydanticBaseSettingsSource):
    """A source whose values are recorded in ``sources`` with where they came from."""

    def __init__(self, inner: PydanticBaseSettingsSource, sources: _Sources, where: _Where) -> None:
        super().__init__(inner.settings_cls)
        self.inner, self.sources, self.where = inner, sources, where

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.inner.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        data = self.inner()
        self.sources.record(data, self.where)
        return data


class _EnvSource(EnvSettingsSource):
    """``CONTEMPLATION_<KEY>`` and ``CONTEMPLATION_<SECTION>__<KEY>``, read from the mapping
    :func:`load` was given (never ``os.environ`` behind its back). Names the model does not
    have are ignored (``CONTEMPLATION_CONFIG``, and the ``CONTEMPLATION_EVENT`` & co. a
    notification command gets); an unknown key inside a section is refused."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self.given = {k: v for k, v in env.items() if k.startswith(ENV_PREFIX)}
        super().__init__(settings_cls, case_sensitive=False)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {k.lower(): v for k, v in self.given.items()}

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        """A table or list may be given as JSON; anything else goes to validation as it is,
        which then names the key, the variable and what it wanted."""
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError:
            return value

    def where(self, path: tuple[str, ...]) -> str:
        """The variable that set ``path``, or the table above it (given as JSON)."""
        names = {k.lower(): k for k in self.given}
        for n in range(len(path), 0, -1):
            name = names.get((ENV_PREFIX + "__".join(path[:n])).lower())
            if name:
                return f"the environment ({name})"
        return "the environment"


class _TomlSource(TomlConfigSettingsSource):
    """The config file; a file that cannot be read or parsed is one line naming it."""

    def _read_file(self, file_path: Path | Traversable) -> dict[str, Any]:
        try:
            return super()._read_file(file_path)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"cannot parse {file_path}: {exc}") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {file_path}: {exc}") from exc


class _ServerEnvSource(PydanticBaseSettingsSource):
    """:data:`SERVER_ENV`: the servers' own variables, below the file and ``CONTEMPLATION_*``.

    Not ``AliasChoices``: an alias on a nested model's field is never looked up without the
    prefix, and an alias would put ``OLLAMA_HOST`` above the file."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.values = {name: env[name] for name in SERVER_ENV if env.get(name)}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ reads by variable, not by field

    def __call__(self) -> dict[str, Any]:
        data: dict[str, dict[str, str]] = {}
        for name, value in self.values.items():
            section, key = SERVER_ENV[name]
            data.setdefault(section, {})[key] = value
        return data

    @staticmethod
    def where(path: tuple[str, ...]) -> str:
        return f"the environment ({_SERVER_VARIABLE.get((path[0], path[-1]), 'a server variable')})"


class _Loading:
    """What one :func:`load` reads, and where each value it finds came from."""

    def __init__(self, env: Mapping[str, str], config: Path, config_from: str) -> None:
        self.env, self.config, self.config_from = env, config, config_from
        self.sources = _Sources()

    def build(
        self, settings_cls: type[BaseSettings], flags: PydanticBaseSettingsSource
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        env = _EnvSource(settings_cls, self.env)
        servers = _ServerEnvSource(settings_cls, self.env)
        return (
            _Tracked(flags, self.sources, self.flag),
            _Tracked(env, self.sources, env.where),
            _Tracked(_TomlSource(settings_cls, self.config), self.sources, self.file),
            _Tracked(servers, self.sources, servers.where),
        )

    def flag(self, path: tuple[str, ...]) -> str:
        if path[0] == "config_file":
            return self.config_from
        return f"the command line (--{path[0].replace('_', '-')})"

    def file(self, path: tuple[str, ...]) -> str:
        return str(self.config)


_LOADING: ContextVar[_Loading | None] = ContextVar("contemplation_settings_loading", default=None)


def _describe(exc: ValidationError, sources: _Sources, at: tuple[str, ...] = ()) -> str:
    """One line for the first error: the key (``at``: the table a kind's model checked),
    where it was set, what was wrong, and the value given."""
    first = exc.errors()[0]
    loc = (*at, *first["loc"])
    key = ".".join(str(p) for p in loc) or "(top level)"
    got = first.get("input")
    shown = "" if isinstance(got, dict) else f" (got {got!r})"
    msg = first["msg"].removeprefix("Value error, ")
    where = sources.table_source(loc) if first["type"] == "missing" else sources.source(loc)
    return redacted(f"invalid setting {key} in {where}: {msg}{shown}")  # a URL's password


def load(
    *,
    config: Path | None = None,
    home: Path | None = None,
    overrides: dict[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Build settings from their sources; a bad value raises :class:`ConfigError` naming the
    key and where it was set: the file, the environment variable, or the command-line flag.

    ``env`` is the environment to read (default: ``os.environ``); tests pass their own."""
    env = dict(os.environ) if env is None else env
    named = env.get(ENV_PREFIX + "CONFIG")
    if config is not None:
        path, config_from = config, "the command line (--config)"
    elif named:
        path, config_from = Path(named), f"the environment ({ENV_PREFIX}CONFIG)"
    else:
        path, config_from = default_config_path(), "the defaults"
    path = path.expanduser()
    if not path.exists():
        if config is not None or named:
            raise ConfigError(f"config file {path} does not exist")
    elif not path.is_file():
        raise ConfigError(f"cannot read {path}: not a file")
    flags: dict[str, Any] = {} if home is None else {"home": str(home)}
    flags.update(overrides or {})
    flags["config_file"] = str(path) if path.exists() else None
    loading = _Loading(env, path, config_from)
    token = _LOADING.set(loading)
    try:
        settings = Settings(**flags)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, loading.sources)) from exc
    except SettingsError as exc:  # a source could not read a value; ours say why themselves
        raise ConfigError(f"invalid settings: {exc}") from exc
    finally:
        _LOADING.reset(token)
    settings._sources = loading.sources
    check_names(settings)
    return settings


def check_names(settings: Settings) -> None:
    """Providers and aliases: names that can be labels, no alias named like a provider, no
    alias naming a provider that is neither configured nor a built-in kind's. One line naming
    the key and where it was set. (A plugin's kind is checked where plugins are read:
    :func:`contemplation.config.validate.validate`, at start and by ``doctor``.)"""
    import re

    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"invalid setting {key} in {settings.source(key)}: {why}")

    for table in ("providers", "aliases"):
        for name in getattr(settings, table):
            if not re.match(NAME_RE, name):
                raise bad(
                    f"{table}.{name}",
                    "a name is a lower-case word (a-z, 0-9, _; at most 32 characters)",
                )
    for name in settings.aliases:
        if name in settings.providers:
            raise bad(f"aliases.{name}", f"{name!r} is a provider's name too")
    for name, alias in settings.aliases.items():
        try:
            escalation.parse(alias.escalate, aliases=settings.aliases, own=name)
        except escalation.LadderError as exc:
            raise bad(f"aliases.{name}.escalate", str(exc)) from None


def check_kinds(settings: Settings, known: Callable[[str], bool], kinds: list[str]) -> None:
    """What needs the backend kinds read: a provider's kind exists, an alias's providers
    exist (at start and in ``doctor``, where plugins are read)."""

    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"invalid setting {key} in {settings.source(key)}: {why}")

    for name, p in settings.providers.items():
        if not known(p.kind):
            raise bad(
                f"providers.{name}.kind", f"no backend kind {p.kind!r}; known: {', '.join(kinds)}"
            )
    for name, alias in settings.aliases.items():
        for used in alias.providers:
            if used not in settings.providers and not known(used):
                raise bad(f"aliases.{name}.providers", f"no provider named {used!r}")
