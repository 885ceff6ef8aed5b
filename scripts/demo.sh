#!/usr/bin/env bash
# Set up .venv if needed, then run `pathweave demo` (arguments pass through,
# e.g. `bash scripts/demo.sh --out /tmp/demo`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
exec .venv/bin/pathweave demo "$@"
