#!/usr/bin/env bash
# The full test suite on a fresh machine: set up everything (scripts/setup.sh), check types and
# lint, then run pytest against the real peers. Extra arguments go to pytest (e.g. --slow: the long
# variants too, with no budget).
set -euo pipefail
# the whole command's, set-up included (docs/internals/testing.md): a guard against a test that makes it slow.
# The target is 25; a clean clone takes ~32 in two workers (docs/internals/testing.md), so the guard sits above that.
BUDGET_MINUTES=50
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
echo "== ruff"
ruff check contemplation tests bench scripts examples
echo "== mypy --strict"
mypy
mypy --strict --explicit-package-bases bench  # the benchmarks: scripts, not the package
mypy --strict examples/contemplation-echo/contemplation_echo  # the example plugin, as its users would check theirs
echo "== pytest"
# pytest exits 5 when it collects nothing: with set -e that fails the run, as it must.
# The slowest 30 tests are printed; the default tier (without --slow) fails when the command as
# a whole passes its budget (tests/conftest.py, --budget: what set-up and lint left of it), so
# a test that makes it slow is seen the day it lands.
# Two pytest-xdist workers (`--dist worksteal`): most tests wait on a server, a daemon or a
# browser, so two workers keep both cores busy (the times: docs/internals/testing.md). Each
# worker starts its own shared llama-servers; the controller alone judges the budget.
# `-n 0` as an extra argument runs one process.
left=$(( BUDGET_MINUTES * 60 - SECONDS ))
python -m pytest -p no:cacheprovider -n 2 --dist worksteal --durations=30 \
    --budget=$(( left > 60 ? left : 60 )) "$@"
