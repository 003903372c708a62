"""How many examples a property test tries: the count it was written with under ``--slow``,
a third of it (at least 25) in the default tier. The properties are the same; the default
tier samples fewer inputs, the slow tier as many as before (the unit loop's CPU was a third
Hypothesis)."""

from __future__ import annotations

SLOW = False  # set from --slow by tests/unit/conftest.py before the test modules are imported


def examples(slow: int) -> int:
    return slow if SLOW else max(25, slow // 3)
