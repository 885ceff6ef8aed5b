#!/usr/bin/env bash
# The checks that need a GPU, in one run of a few minutes (a lent one-GPU machine, or any
# CUDA host): the CUDA/NCCL tests (the low-latency MoE step replayed in a CUDA graph among
# them, and live adaptation's CUDA-event round clock), the one-rank MoE cost against plain
# torch at decode and prefill sizes, `pathweave perf` over NCCL, and the host-cost bench. Every step's output goes to $OUT/gpu_check.log
# (or ./gpu_check.log); a failing step is reported and the next one still runs.
#
# It uses the machine's own python3 with CUDA torch (never installs torch). A package the
# image lacks is taken from wheels in .gpu/ when present (`pip download --no-deps -d .gpu
# defusedxml` on a machine with network; .gpu/ is git-ignored, so name it in `carry`).
#
#   bash scripts/gpu_check.sh            # everything (about 5 minutes on one H100)
#   bash scripts/gpu_check.sh quick      # the CUDA tests and the MoE cost only
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOG=${OUT:-.}/gpu_check.log
: >"$LOG"
deps=$(mktemp -d)
if compgen -G ".gpu/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --target "$deps" .gpu/*.whl >>"$LOG" 2>&1
fi
export PYTHONPATH="$PWD/src:$deps${PYTHONPATH:+:$PYTHONPATH}"
export PATHWEAVE_DEBUG=${PATHWEAVE_DEBUG:-INFO}
failed=()
CLI="import sys; from pathweave.cli.main import app; sys.argv[0] = 'pathweave'; app()"

step() {  # step NAME SECONDS CMD...: run with a time limit, log, remember failures
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*" | tee -a "$LOG"
    local t0=$SECONDS
    timeout "$limit" "$@" >>"$LOG" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"
    ((rc == 0)) || failed+=("$name")
}

step env 60 "$PY" -c "import torch, pathweave; print(torch.__version__, torch.version.cuda, \
torch.cuda.get_device_name(0), 'nccl', torch.cuda.nccl.version())"
# One GPU: 4 ranks share it, each posing as its own host (see the test module's docstring).
step cuda-tests 420 env PATHWEAVE_TEST_NCCL_WORLD=4 "$PY" -m pytest -q -rs tests/test_cuda_nccl.py
# Live adaptation timed by rounds: CUDA events on the stream, read at the next call's words.
step round-timing 240 env PATHWEAVE_TEST_NCCL_WORLD=4 "$PY" -m pytest -q -rs \
    tests/test_round_timing.py -k "cuda or nccl"
step moe-decode 120 "$PY" examples/moe_one_rank_cost.py --tokens 128 --repeat 50
step moe-prefill 180 "$PY" examples/moe_one_rank_cost.py --tokens 4096 --repeat 20
if [[ ${1:-} != quick ]]; then
    step perf-nccl 180 "$PY" -m pathweave.perf --backend nccl --ranks 1 -b 1K -e 256M -f 4 \
        -w uniform --csv "${OUT:-.}/perf_nccl.csv"
    step hostcost 240 "$PY" -c "$CLI" bench hostcost --ranks 8 --ranks 64 --ranks 256 \
        --json "${OUT:-.}/hostcost.json"
fi
grep -E "^(PASS|MISS)|passed|failed|skipped|error" "$LOG" | tail -40
if ((${#failed[@]})); then
    echo "gpu_check: failed steps: ${failed[*]} (details in $LOG)"
    exit 1
fi
echo "gpu_check: every step passed (details in $LOG)"
