"""The shallow read of a line the MCP stdio face cannot parse."""

from __future__ import annotations

import mcp_types
import pytest
from pydantic import ValidationError

from contemplation.faces.mcp.wire import NESTED, members, refusal


def test_members_reads_the_top_level_only_whatever_the_depth() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    top, whole = members(f'{{"jsonrpc":"2.0","params":{deep},"id":"x","n":-1.5e3,"t":true}}') or (
        {},
        0,
    )
    assert top == {"jsonrpc": "2.0", "params": NESTED, "id": "x", "n": -1500.0, "t": True}
    assert whole is True
    assert members("[1]") is None and members("not json") is None
    cut = members('{"id":3,"params":[[["]')  # unclosed: what came before the fault
    assert cut == ({"id": 3}, False)
    assert members('{"a":"}{","id":4} trailing') == ({"a": "}{", "id": 4}, False)


def _error(line: str) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    return caught.value


@pytest.mark.parametrize(
    ("line", "answer"),
    [
        (
            '{"jsonrpc":"2.0","id":7,"method":"x","params":{"a":' + "[" * 300 + "]" * 300 + "}}",
            (7, -32700),
        ),
        ('{"id":true,' + "[" * 300, (None, -32700)),
        ('{"jsonrpc":"2.0","id":"a","method":"x","params":5}', ("a", -32600)),
        ("5", (None, -32600)),
        ('{"jsonrpc":"2.0","method":"n","params":' + "[" * 300 + "]" * 300 + "}", None),
        ('{"jsonrpc":"2.0","id":3,"result":' + "[" * 300 + "]" * 300 + "}", None),
        # a lone surrogate cannot be written back: the answer's id is null (it killed the
        # server's writer, and the process with it)
        ('{"jsonrpc": "2.0", "id": "\\ud800", "method": "ping"}', (None, -32700)),
    ],
)
def test_refusal_answers_requests_never_notifications_or_responses(
    line: str, answer: tuple[object, int] | None
) -> None:
    got = refusal(_error(line))
    assert (None if got is None else (got.id, got.error.code)) == answer
    if got is not None:
        got.model_dump_json(by_alias=True, exclude_unset=True)  # it can be written
