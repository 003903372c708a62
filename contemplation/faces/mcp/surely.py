"""What the MCP SDK surely reads as a request, a notification, or nothing it answers the same
way: the stdio front's reading of a line (standard library only, as the front is).

The front answers a line early only where the SDK server would answer it the same, so it
reads each line more strictly than the SDK does: where the two parsers or the SDK's models
might disagree (a float, a huge integer, an escaped surrogate, a duplicated key, a member
the envelope does not name, ``null`` for an optional value), the line is :data:`OTHER` and
left to the SDK. A line read as :data:`REQUEST` is one the SDK takes as a JSON-RPC request
with the same id, method and params; :data:`NOTE`, one it takes as a notification.

The shapes a request's parameters must have to be answered early (:func:`envelope`,
:func:`handshake`) are likewise the SDK's models narrowed to what it surely accepts;
``tests/system/test_mcp_front_fuzz.py`` sends the same lines to both and compares.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, Final, Literal

VERSION_KEY: Final = "io.modelcontextprotocol/protocolVersion"  # a stateless request's version
INFO_KEY: Final = "io.modelcontextprotocol/clientInfo"
CAPABILITIES_KEY: Final = "io.modelcontextprotocol/clientCapabilities"
REQUEST: Final = "request"
NOTE: Final = "notification"
OTHER: Final = "other"
Kind = Literal["request", "notification", "other"]
READ_BYTES: Final = 64 * 1024  # longer lines are never read here: the server reads them
_ENVELOPE: Final = frozenset({"jsonrpc", "id", "method", "params"})
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")  # an escaped surrogate: the parsers may differ
_LONE = re.compile("[\ud800-\udfff]")  # a surrogate in a str: it cannot be encoded
_ID_LIMIT: Final = 2**53  # an integer id past it is left to the SDK (parsers differ on big ones)


class _Unsure(ValueError):
    """A construct the SDK's parser may read otherwise."""


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: json reads inf, the SDK's parser may refuse it
        raise _Unsure(text)
    return value


def _integer(text: str) -> int:
    if len(text) > 15:  # the SDK's parser may read a long one otherwise (or refuse it)
        raise _Unsure(text)
    return int(text)


def _constant(text: str) -> object:
    raise _Unsure(text)  # NaN, Infinity: not JSON


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    got = dict(pairs)
    if len(got) != len(pairs):  # a key twice: which one wins is the parser's choice
        raise _Unsure("duplicate key")
    return got


def parse(line: str) -> object:
    """The JSON value on ``line``, or :data:`OTHER` where it is not one the SDK surely reads
    alike (or is longer than :data:`READ_BYTES`)."""
    if len(line) > READ_BYTES or _SURROGATE.search(line):
        return OTHER
    try:
        return json.loads(
            line,
            parse_float=_number,
            parse_int=_integer,
            parse_constant=_constant,
            object_pairs_hook=_pairs,
        )
    except (ValueError, RecursionError):
        return OTHER


def request_id(value: object) -> bool:
    """An id the SDK takes (a string or an integer; never a boolean, a float, a list, an
    object or null), and that can be written back (no lone surrogate)."""
    if isinstance(value, str):
        return value.isascii() or not _LONE.search(value)
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < _ID_LIMIT


def kind(msg: object) -> Kind:
    """:data:`REQUEST` or :data:`NOTE` where the SDK surely reads ``msg`` (parsed by
    :func:`parse`) as one, else :data:`OTHER`."""
    if not isinstance(msg, dict) or not set(msg) <= _ENVELOPE:
        return OTHER
    if msg.get("jsonrpc") != "2.0" or not isinstance(msg.get("method"), str):
        return OTHER
    if "params" in msg and not isinstance(msg["params"], dict):
        return OTHER
    if "id" not in msg:
        return NOTE
    return REQUEST if request_id(msg["id"]) else OTHER


def enveloped(msg: Mapping[str, Any]) -> bool:
    """The SDK's test of a stateless request: ``params._meta`` names a protocol version."""
    params = msg.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and VERSION_KEY in meta


def _strings(value: object, required: set[str], allowed: set[str]) -> bool:
    return (
        isinstance(value, dict)
        and required <= set(value) <= allowed
        and all(isinstance(v, str) for v in value.values())
    )


def client_info(value: object) -> bool:
    """An ``Implementation`` the SDK takes: a name and a version, and maybe a title, a
    description and a website (strings; Claude Code 2.1.328 sends all five), nothing else."""
    return _strings(
        value, {"name", "version"}, {"name", "version", "title", "description", "websiteUrl"}
    )


def _objects(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(v, dict) for v in value.values())


def capabilities(value: object) -> bool:
    """Client capabilities the SDK takes, of the kinds named here only."""
    if not isinstance(value, dict):
        return False
    for key, got in value.items():
        if key in ("experimental", "extensions"):
            ok = _objects(got)
        elif key == "roots":
            ok = got == {} or (
                isinstance(got, dict)
                and set(got) == {"listChanged"}
                and isinstance(got["listChanged"], bool)
            )
        elif key == "elicitation":  # {} or the modes, each {} (Claude Code: form and url)
            ok = isinstance(got, dict) and set(got) <= {"form", "url"}
            ok = ok and all(v == {} for v in got.values())
        elif key == "sampling":
            ok = got == {}
        else:
            ok = False
        if not ok:
            return False
    return True


def envelope(params: object, *, allowed: frozenset[str] = frozenset()) -> str | None:
    """The protocol version of a stateless request's parameters that the SDK surely
    accepts as they are (``_meta`` with the version, the client's capabilities and maybe its
    info; ``allowed`` the other members there may be), else None."""
    if not isinstance(params, dict) or not set(params) <= {"_meta", *allowed}:
        return None
    meta = params.get("_meta")
    if not isinstance(meta, dict) or not set(meta) <= {VERSION_KEY, INFO_KEY, CAPABILITIES_KEY}:
        return None
    version = meta.get(VERSION_KEY)
    if not isinstance(version, str) or not capabilities(meta.get(CAPABILITIES_KEY)):
        return None
    if INFO_KEY in meta and not client_info(meta[INFO_KEY]):
        return None
    return version


def handshake(msg: Mapping[str, Any]) -> bool:
    """An ``initialize`` request the SDK surely takes: its parameters have the handshake's
    shape and nothing else."""
    params = msg.get("params")
    if msg.get("method") != "initialize" or not isinstance(params, dict):
        return False
    return (
        set(params) == {"protocolVersion", "capabilities", "clientInfo"}
        and isinstance(params["protocolVersion"], str)
        and capabilities(params["capabilities"])
        and client_info(params["clientInfo"])
    )


def bare(msg: Mapping[str, Any]) -> bool:
    """A request without parameters (or with ``{}``): ``tools/list``'s first page, ``ping``."""
    return bool(msg.get("params", {}) == {})
