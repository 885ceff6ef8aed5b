#!/usr/bin/env bash
# Set up .venv if needed, lint, then run the tests (tests/ and the doctests
# under src/pathweave). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

echo "== ruff check src tests"
.venv/bin/ruff check src tests

echo "== pytest"
status=0
.venv/bin/python -m pytest -q "$@" || status=$?
if [[ $status -eq 5 ]]; then
    # pytest's "no tests collected": a broken collection must not pass.
    echo "test.sh: pytest collected no tests; treating that as a failure" >&2
    exit 1
fi
exit "$status"
