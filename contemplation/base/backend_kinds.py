"""The built-in backend kinds as the settings know them before any backend is imported (a
leaf: ``settings`` reads it at start, and a backend module pulls aiohttp in). Each kind owns
its entry: its name (its module in :mod:`contemplation.backends`, its ``KIND``'s name and its
config section) and the variables its server's users already know, each with the key of the
kind's section it sets. ``BUILT_IN``, the providers' ``SECTIONS`` and ``SERVER_ENV`` are
derived from it."""

from __future__ import annotations

OLLAMA, OPENAI, OPENCODE, LOCAL = "ollama", "openai", "opencode", "local"

# kind → {the server's own variable: the key of the kind's section it sets}
SERVER_ENV_BY_KIND: dict[str, dict[str, str]] = {
    OLLAMA: {"OLLAMA_HOST": "host"},
    OPENAI: {"OPENAI_BASE_URL": "base_url", "OPENAI_API_KEY": "api_key"},
    OPENCODE: {
        "OPENCODE_SERVER_URL": "url",
        "OPENCODE_SERVER_USERNAME": "username",
        "OPENCODE_SERVER_PASSWORD": "password",
    },
    LOCAL: {},
}
NAMES = tuple(SERVER_ENV_BY_KIND)  # the built-in kinds, in the order they are listed
