#!/usr/bin/env bash
# The full test suite on a fresh machine: set up everything (scripts/setup.sh), check types and
# lint, then run pytest against the real peers. Extra arguments go to pytest (e.g. --slow: the long
# variants too, with no budget).
set -euo pipefail
# the whole command's, set-up included (docs/internals/testing.md): a guard against a test that makes it slow.
# The target is 25; a quiet clean clone here takes ~23 and CI's ran ~2 min over this machine's
# (docs/internals/testing.md), so the guard sits at 40: room for a slow day, not for a test
# that doubles the run.
BUDGET_MINUTES=40
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# The suite's processes keep their compiled code (__pycache__, ignored by git): where
# PYTHONDONTWRITEBYTECODE is set (the build machine sets it) each pytest worker compiled every test
# module again (collection 19 s, 8.4 s with the cache) and each subprocess what it imported.
unset PYTHONDONTWRITEBYTECODE
# ruff and the three mypy runs side by side (one mypy keeps one core: one after another they
# left a core idle for ~40 s of a clean clone); each one's output is shown, a failure fails the run.
echo "== ruff, mypy --strict (package, benchmarks, example plugin), side by side"
lint_dir=$(mktemp -d)
lint() {  # lint NAME COMMAND...
  local name=$1; shift
  ( "$@" ) >"$lint_dir/$name.log" 2>&1 &
  echo "$! $name" >>"$lint_dir/pids"
}
lint ruff ruff check contemplation tests bench scripts examples
lint mypy mypy
lint mypy-bench mypy --strict --explicit-package-bases --cache-dir .mypy_cache/bench bench  # the benchmarks: scripts, not the package
lint mypy-example mypy --strict --cache-dir .mypy_cache/example examples/contemplation-echo/contemplation_echo  # as its users would check theirs
lint_failed=0
while read -r pid name; do
  wait "$pid" || lint_failed=1
  echo "-- $name"; cat "$lint_dir/$name.log"
done <"$lint_dir/pids"
rm -rf "$lint_dir"
[ "$lint_failed" = 0 ] || { echo "lint failed" >&2; exit 1; }
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
