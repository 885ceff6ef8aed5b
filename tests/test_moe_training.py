"""A real model as client: a tiny Hugging Face Mixtral trained with expert parallelism
over pathweave on 4 gloo ranks equals the same model trained in one process.

``examples/moe_training.py`` does the work; this test runs it for every layout in one
job (each rank imports transformers once, the job's main cost) and checks the loss
curve, the first step's gradients (experts and routers) and the final weights against
the single-process run with transformers' own experts (relative error <= 1e-4, fp32).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pathweave.moe.routing import LAYOUTS
from pathweave.runtime.launch import run_local


@pytest.mark.slow  # four processes import transformers (seconds each on a loaded host)
def test_mixtral_expert_parallel_training_equals_single_process() -> None:
    examples = str(Path(__file__).resolve().parents[1] / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)  # the ranks import the example by name, like this process
    import moe_training as ex

    ref = ex.train_single_process()
    assert ref["losses"][-1] < 0.8 * ref["losses"][0], ref["losses"]  # it does train
    per_rank = run_local(ex.train_expert_parallel, ex.WORLD, (tuple(LAYOUTS),), timeout_s=300)
    for layout in LAYOUTS:
        errs = ex.compare([r[layout] for r in per_rank], ref)
        assert max(errs.values()) <= 1e-4, (layout, errs)
