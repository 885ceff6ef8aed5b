"""What the fork server of :func:`pathweave.runtime.launch.run_local` loads once.

Importing this module imports torch and the data plane, and loads the
planners' numba kernels by planning one tiny demand. Every process of a local
job is forked from a server that imported it, so none of them pays these
costs again (about 1 s of imports and 0.5 s of kernel loading per process,
several seconds for a job of 8 processes on a small machine).
"""

from __future__ import annotations

import numpy as np
import torch.distributed  # noqa: F401

import pathweave.distributed  # noqa: F401
from pathweave.fabric import preset
from pathweave.plan import DEFAULT_POLICY, make


def _load_kernels() -> None:
    fab = preset("h100-2x4")
    demand = np.zeros((fab.num_ranks, fab.num_ranks))
    demand[0, 5] = demand[1, 2] = 64 << 20
    for policy in ("mwu", "hscore", DEFAULT_POLICY):
        make(fab, demand, policy)


_load_kernels()
