#!/usr/bin/env bash
# Set up .venv if needed, lint, then run the tests (tests/ and the doctests
# under src/pathweave): all but the emulator's on PYTEST_WORKERS pytest-xdist
# workers (default 2, the CI machine's cores: many tests start 4-8 rank
# processes of their own, so more workers than cores oversubscribe them),
# and beside them, in one process of their own, the tests that bring up the
# emulator (marked `emulator` where they are: they time real bytes and share
# namespace prefixes; the emulator's pure tests, layouts, argv lists,
# checks, run on the workers).
# Extra arguments go to both.
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

# The kernels every fork server loads (runtime/_preload.py: one per xdist
# worker, one for the emulator's tests), compiled into numba's cache while
# ruff and pytest's collection run. They take turns on a lock, so in a clean
# clone the first would compile them (~30 s of CPU) while the rest wait idle.
.venv/bin/python -c "import pathweave.runtime._preload" >/dev/null 2>&1 &
warm_pid=$!
trap 'kill "$warm_pid" 2>/dev/null || true' EXIT

echo "== ruff check src tests"
.venv/bin/ruff check src tests

echo "== pytest"
# pytest's "no tests collected" (5) must fail a whole run: a broken
# collection must not pass. With arguments (some files) one of the two runs
# may select nothing, and that is fine.
run() {
    local status=0
    .venv/bin/python -m pytest -q "$@" || status=$?
    if [[ $status -eq 5 && -n "$picked" ]]; then
        return 0
    fi
    if [[ $status -eq 5 ]]; then
        echo "test.sh: pytest collected no tests; treating that as a failure" >&2
        return 1
    fi
    return "$status"
}
picked="$*"
status=0
# The emulator's tests run beside the others, in a pytest of their own: one
# at a time (they share namespace prefixes), and mostly waiting on shaped
# links (their ranks are forked from a fork server that imported torch, so
# they cost little CPU). Their rate checks take the best of 3 transfers,
# timed by kernel timestamps, which a busy machine does not skew. Without
# arguments only the test files that carry the mark are collected there:
# `-m emulator` deselects the rest only after importing them (and rewriting
# their asserts, ~7 s of CPU), the doctests under src included.
emu_log="$(mktemp)"
mapfile -t emu_files < <(grep -l "mark\.emulator" tests/test_*.py)
(run -m emulator --durations=10 "${@:-${emu_files[@]}}" >"$emu_log" 2>&1) &
emu_pid=$!
trap 'kill "$emu_pid" "$warm_pid" 2>/dev/null || true; rm -f "$emu_log"' EXIT
# --durations: the log names the slowest tests of each run (the suite's time
# budget is 5 minutes from a clean clone on 2 cores).
run -n "${PYTEST_WORKERS:-2}" -m "not emulator" --durations=25 "$@" || status=$?
emu_status=0
wait "$emu_pid" || emu_status=$?
echo "== pytest (the emulator's tests, run beside the ones above)"
cat "$emu_log"
if [[ $emu_status -ne 0 ]]; then
    status=$emu_status
fi
exit "$status"
