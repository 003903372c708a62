#!/usr/bin/env bash
# The full test suite on a fresh machine: set up everything (scripts/setup.sh), check types and
# lint, then run pytest against the real peers. Extra arguments go to pytest (e.g. --slow).
set -euo pipefail
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
python -m pytest -p no:cacheprovider "$@"
