"""The built-in secrets: the names of files that are never read for the model unless they
are named (issue 35 finding 6). One list, read by both places that refuse them: the
permissions (:mod:`contemplation.needs.permissions`, which a root or a rule that names one
lifts) and ``files.read``'s own deny-list (:mod:`contemplation.needs.tools.files`, which only a
root lifts). Each is a glob of one path component, anywhere in a path (a folder: all below
it too), compared without regard to case.
"""

from __future__ import annotations

# The tool's own: the dashboard's and the MCP face's tokens (dashboard.TOKEN_FILE,
# mcp_server.TOKEN_FILE) and the index of every conversation (index_db.DB_NAME, with its -wal
# and -shm); the configuration file is added by path where it is known.
SECRET_NAMES = (
    ".ssh", ".gnupg", ".aws", ".kube", ".password-store", ".netrc", ".pgpass",
    ".git-credentials", ".env", ".env.*", "*.pem", "*.key", ".dashboard.token",
    ".mcp.token", ".index.sqlite3*",
)  # fmt: skip

# files.read refuses these too (a root lifts them): private keys by their usual names, the
# keychains, a repository's config (it may hold a token) and every .env-like file (.envrc)
FILES_ALSO = ("id_*", "*.keychain", "*.keychain-db", ".git/config", ".env*")
