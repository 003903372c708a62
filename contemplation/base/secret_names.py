"""The secrets, in one list each: the files never read for the model.

Two kinds:

* :data:`OWN_SECRETS`: the files this tool, or Claude's clients on its behalf, write a
  credential into: the dashboard's and the MCP face's tokens, the service's ``service.env``
  (the API keys ``service install`` carried), and the Claude configurations that may hold
  our token (``~/.claude.json``, a project's ``.mcp.json``, Claude Code's
  ``.credentials.json``, Claude Desktop's ``claude_desktop_config.json``). They are refused
  **whatever the roots and the rules say**, by every NEED lookup that names a path and by
  every attachment (:func:`own_secret`); nothing lifts them. The modules that write these
  files take their names from here.
* :data:`SECRET_NAMES`: the person's usual secrets, never read for the model unless they
  are named: read by both places that refuse them, the permissions
  (:mod:`contemplation.needs.permissions`, which a root or a rule that names one lifts) and
  ``files.read``'s own deny-list (:mod:`contemplation.needs.tools.files`, which only a root
  lifts).

Each name is a glob of one path component, anywhere in a path (a folder: all below it too),
compared without regard to case.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

DASHBOARD_TOKEN = ".dashboard.token"  # noqa: S105 - a file name, not a secret
MCP_TOKEN = ".mcp.token"  # noqa: S105 - a file name, not a secret
SERVICE_ENV = "service.env"

#: name -> what it holds, as a refusal says it
OWN_SECRETS: dict[str, str] = {
    DASHBOARD_TOKEN: "the dashboard's token",
    MCP_TOKEN: "the MCP face's token",
    SERVICE_ENV: "the service's API keys",
    ".claude.json": "Claude Code's configuration, which may hold the MCP token",
    ".mcp.json": "an MCP configuration, which may hold the MCP token",
    ".credentials.json": "Claude Code's credentials",
    "claude_desktop_config.json": "Claude Desktop's configuration, which may hold tokens",
}

# The person's: never read unless named; the index of every conversation (index_db.DB_NAME,
# with its -wal and -shm) too; the configuration file is added by path where it is known.
SECRET_NAMES = (
    ".ssh", ".gnupg", ".aws", ".kube", ".password-store", ".netrc", ".pgpass",
    ".git-credentials", ".env", ".env.*", "*.pem", "*.key", ".index.sqlite3*",
)  # fmt: skip

# files.read refuses these too (a root lifts them): private keys by their usual names, the
# keychains, a repository's config (it may hold a token) and every .env-like file (.envrc)
FILES_ALSO = ("id_*", "*.keychain", "*.keychain-db", ".git/config", ".env*")


def own_secret(parts: Iterable[str]) -> str | None:
    """Why a path (its components) is one of this tool's own secrets, the one line a
    refusal says; None when it is not one."""
    for part in parts:
        folded = part.casefold()
        for name, holds in OWN_SECRETS.items():
            if fnmatch.fnmatchcase(folded, name):
                return (
                    f"{part} is {holds}: contemplation never reads it for a model or attaches "
                    "it, whatever tools.allowed_roots or [permissions] say"
                )
    return None
