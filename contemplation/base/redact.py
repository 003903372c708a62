"""Credentials out of what is shown: ``http://user:pass@host`` is written ``http://user:***@host``.

One function, :func:`redacted`, for every face that shows a URL or a text that may hold one
(a backend's error, a check's line, a log event): the password of a URL never reaches a log,
a marker, ``state.json``, a command's output, the dashboard or an MCP result. A URL's user
name alone (``https://TOKEN@host``) is often a token too, so it is masked as well.

:func:`credentials` is the other half, for the backends: the URL without its ``user:pass@``
and the pair, which they send as HTTP Basic auth instead of keeping it in the URL.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"

# scheme://userinfo@ — userinfo runs to the last "@" before the host's end (a password with a
# raw "@" in it is still all masked); quotes, brackets and spaces end it, so a URL inside a
# repr or a JSON text is found without eating what follows
_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)([^\s/?#\"'<>\\\[\]{}|]*)@")


def _mask(m: re.Match[str]) -> str:
    user, colon, _ = m.group(2).partition(":")
    return f"{m.group(1)}{user}:{MASK}@" if colon and user else f"{m.group(1)}{MASK}@"


def redacted(text: str) -> str:
    """``text`` with the credentials of every URL in it masked (``user:***@``; a bare
    ``token@`` as ``***@``). Text without ``://`` and ``@`` is returned as it is, at once."""
    if "@" not in text or "://" not in text:
        return text
    return _USERINFO.sub(_mask, text)


def credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` without its ``user:pass@`` and the (percent-decoded) pair; None when it has
    none. A URL that does not parse is returned as it is (its check says why)."""
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return url, None
    if user is None and password is None:
        return url, None
    host = parts.netloc.rpartition("@")[2]
    bare = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return bare, (unquote(user or ""), unquote(password or ""))
