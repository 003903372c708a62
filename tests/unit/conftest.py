"""The unit tests' own settings: ``--slow`` gives each property test all its examples."""

from __future__ import annotations

import pytest

from tests.unit import examples


def pytest_configure(config: pytest.Config) -> None:
    examples.SLOW = bool(config.getoption("--slow"))
