#!/usr/bin/env bash
# Set up .venv if needed, then rerun every command transcript marked in
# README.md and docs/cli.md (`<!-- docs.sh: COMMAND -->` ... `<!-- /docs.sh -->`)
# and rewrite the blocks whose output changed (pathweave._docgen). Blocks
# tagged slow (demo, benchmarks, torchrun) rerun only with --slow, root ones
# only as root; --check writes nothing and exits 1 when numbers changed.
# Extra arguments go to `python -m pathweave._docgen` (e.g. a file to update).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" exec .venv/bin/python -m pathweave._docgen "$@"
