#!/usr/bin/env bash
# Set up .venv if needed, lint, then run the tests (tests/ and the doctests
# under src/pathweave). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

# The emulator test needs ip and tc (iproute2) and sysctl (procps): install
# them where they are missing and this runs as root on an apt system.
if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null \
    && ! { command -v ip && command -v tc && command -v sysctl; } >/dev/null; then
    echo "== apt-get install iproute2 procps (for the emulator test)"
    apt-get install -y -q iproute2 procps || { apt-get update -q && apt-get install -y -q iproute2 procps; }
fi

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
