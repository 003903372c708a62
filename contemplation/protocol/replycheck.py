"""A reply checked against its JSON Schema, off the event loop and within a hard time limit.

The engine is jsonschema-rs with the Rust ``regex`` crate behind ``pattern`` and
``patternProperties`` (:func:`validator`): its matching takes time linear in the text, so
``^(a+)+$`` against ``aaa…a!`` is answered in microseconds where Python's ``re`` backtracks
for hours (bench/bench_schema_redos.py measures both). It holds the GIL while it validates,
and a schema can still make it work hard in other ways (``$ref``s that expand
exponentially), so :func:`checked` runs the check in a child process (``python -P -m
contemplation.protocol.replycheck``, in ``/``: see :mod:`contemplation.base.child`) that is
killed at ``seconds``: the daemon's loop only waits on a pipe, and a check that runs out of
time, or a checker that dies, is a failed validation that says so, never a frozen or crashed turn.

A reply nested deeper than :data:`MAX_DEPTH` levels is not valid JSON here (Python's parser
raises RecursionError near 1,000 levels; the engine recurses with the nesting).
"""

from __future__ import annotations

import json
import math
import signal
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from contemplation.base import child

if TYPE_CHECKING:
    import jsonschema_rs

MAX_DEPTH = 256  # levels of a reply's JSON
CHECK_SECONDS = 10.0  # the hard limit on one check (the child is killed then)
MAX_MESSAGE = 2000  # characters of the engine's message passed back
NESTED = f"not valid JSON (nested deeper than {MAX_DEPTH} levels)"


def nesting(value: Any, stop: int) -> int:
    """How many levels of lists and objects ``value`` has (counted up to ``stop`` + 1: a
    deeper one is only known to be too deep). Iterative: any depth is measured safely."""
    deepest = 0
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > stop:
            return deepest
        todo.extend((child, level + 1) for child in children)
    return deepest


def validator(schema: Mapping[str, Any]) -> jsonschema_rs.Validator:
    """The engine for ``schema``: linear-time patterns, formats not asserted (as before),
    a ``$ref`` resolved within the schema only (never fetched). Raises the engine's
    ValidationError (a pattern it refuses, a schema it cannot use) or ReferencingError."""
    import jsonschema_rs  # a compiled module: imported where a schema is checked

    return jsonschema_rs.validator_for(
        dict(schema),
        pattern_options=jsonschema_rs.RegexOptions(),
        validate_formats=False,
        offline=True,
    )


def engine_message(exc: Exception) -> str:
    """The first line of the engine's message (its str() adds the schema and instance)."""
    message = getattr(exc, "message", None)
    text = message if isinstance(message, str) else str(exc)
    return text.strip().split("\n", 1)[0][:MAX_MESSAGE]


def where(path: list[str | int]) -> str:
    return "/" + "/".join(str(p) for p in path)


def problem(text: str, schema: Mapping[str, Any]) -> str | None:
    """What is wrong with ``text`` as an answer to ``schema`` (None: it matches). In this
    process, unbounded in time: the daemon calls :func:`checked`."""
    import jsonschema_rs

    try:
        value = json.loads(text)
    except RecursionError:
        return NESTED
    except ValueError as exc:
        return f"not valid JSON ({exc})"
    if nesting(value, MAX_DEPTH) > MAX_DEPTH:
        return NESTED
    try:
        error = next(iter(validator(schema).iter_errors(value)), None)
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError) as exc:
        return f"the schema cannot be applied ({engine_message(exc)})"
    if error is None:
        return None
    at = f" (at {where(error.instance_path)})" if error.instance_path else ""
    return engine_message(error) + at


# --------------------------------------------------------------------------- the child


async def checked(
    text: str, schema: Mapping[str, Any], seconds: float = CHECK_SECONDS
) -> str | None:
    """:func:`problem`, in a child process killed after ``seconds``: a check that runs out
    of time, or a checker that fails, is a problem that says so."""
    import asyncio  # here: the child (main) never needs it, and its start-up is paid per check

    payload = json.dumps(
        {"schema": schema, "text": text, "seconds": seconds}, ensure_ascii=False
    ).encode("utf-8")
    proc = await asyncio.create_subprocess_exec(
        *child.python("-m", "contemplation.protocol.replycheck"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=child.environment(),
        cwd=child.CWD,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(payload), seconds)
    except TimeoutError:
        return f"the check against the schema took longer than {seconds:g} s and was stopped"
    finally:
        if proc.returncode is None:  # out of time, or the turn was cancelled meanwhile
            proc.kill()
            await proc.wait()
    try:
        answer = json.loads(out)
        found = answer["problem"]
    except (ValueError, TypeError, KeyError):
        lines = err.decode("utf-8", "replace").strip().splitlines()
        said = f": {lines[-1][:MAX_MESSAGE]}" if lines else ""
        return f"the check against the schema failed (its process exited {proc.returncode}{said})"
    return found if isinstance(found, str) else None


def main() -> None:
    """The child: the schema and the text as one JSON object on stdin, the answer on stdout.
    It ends itself a second after its time limit (SIGALRM, whose default ends the process
    even while the engine holds the GIL), should the daemon that waits for it be gone."""
    data = json.loads(sys.stdin.buffer.read())
    if hasattr(signal, "alarm"):
        signal.alarm(math.ceil(float(data.get("seconds", CHECK_SECONDS))) + 1)
    json.dump({"problem": problem(data["text"], data["schema"])}, sys.stdout)


if __name__ == "__main__":
    main()
