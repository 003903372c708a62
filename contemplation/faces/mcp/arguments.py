"""The arguments of an MCP tool call, checked before the SDK validates their values: an
unknown name is refused with the name to use (a close match, else the names the tool takes),
an alias is read as the argument it stands for (``since`` for ``cursor``), and values the
tool's schema refuses are told in one line that names each argument, without pydantic's
input echoes and documentation URLs. No import of the MCP SDK."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from contemplation.errors import InputRejected

SHOWN = 5  # unknown names, and refused values, told in one error
NAME_CHARS = 60  # of an unknown name, as told back
VALUE_CHARS = 40  # of a value, as told back


def _short(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


def _name(name: str) -> str:
    return repr(_short(name, NAME_CHARS))


def _near(name: str, takes: Sequence[str]) -> str | None:
    close = difflib.get_close_matches(name, takes, n=1)
    return close[0] if close else None


def unknown(names: Sequence[str], takes: Sequence[str]) -> str:
    """The one line that refuses ``names``: each one's close match, else what the tool takes."""
    listed = f"this tool takes {', '.join(takes)}" if takes else "this tool takes no arguments"
    if len(names) == 1:
        near = _near(names[0], takes)
        return f"unknown argument {_name(names[0])}: " + (
            f"this tool's is {near!r}" if near else listed
        )
    told = []
    for name in names[:SHOWN]:
        near = _near(name, takes)
        told.append(_name(name) + (f" (this tool's is {near!r})" if near else ""))
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return f"unknown arguments {', '.join(told)}{more}: {listed}"


def checked(
    arguments: Mapping[str, Any], takes: Sequence[str], aliases: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """``arguments`` with each alias read as the argument it stands for, and which name the
    caller used for an argument given by its alias (to say it back in an error). Raises
    :class:`InputRejected` for an unknown name, or an argument given under both names with
    two different values."""
    strangers = [k for k in arguments if k not in takes and k not in aliases]
    if strangers:
        raise InputRejected(unknown(strangers, takes))
    args = dict(arguments)
    said: dict[str, str] = {}
    for alias, name in aliases.items():
        if alias not in args:
            continue
        value = args.pop(alias)
        if name in args and args[name] != value:
            got = f"{_short(repr(args[name]), VALUE_CHARS)} and {_short(repr(value), VALUE_CHARS)}"
            raise InputRejected(
                f"{name!r} and {alias!r} are the same argument: give one (got {got})"
            )
        if name not in args:
            said[name] = alias
        args[name] = value
    return args, said


def refused(exc: ValidationError, said: Mapping[str, str]) -> str:
    """One line for the values the tool's schema refused, each under the caller's name."""
    parts = []
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    for err in errors[:SHOWN]:
        loc = [str(p) for p in err["loc"]]
        if loc:
            loc[0] = said.get(loc[0], loc[0])
        where = _name(".".join(loc))
        if err["type"] == "missing" and len(loc) == 1:
            parts.append(f"missing argument {where}")
        else:
            parts.append(f"argument {where}: {' '.join(err['msg'].split())}")
    more = f"; and {len(errors) - SHOWN} more" if len(errors) > SHOWN else ""
    return "; ".join(parts) + more
