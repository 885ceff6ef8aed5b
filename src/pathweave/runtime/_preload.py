"""What the fork server of :func:`pathweave.runtime.launch.run_local` loads once.

Importing this module imports torch and the data plane, and loads the
planners' numba kernels by planning one tiny demand. Every process of a local
job is forked from a server that imported it, so none of them pays these
costs again (about 1 s of imports and 0.5 s of kernel loading per process,
several seconds for a job of 8 processes on a small machine).

The kernels include the specialisations an orchestrator's decision runs (its
plans on the frozen path set, its time model, its prediction on the fragments
it splits, the check of a repeated call's matrix, the emulator ranks' model,
which scores built fragments, and a one-node fabric's per-link time model):
numba compiles one per argument type and read-only flag, and with a cold
cache every rank would otherwise compile the same ones at once (8 processes
on 2 cores: about 30 s of CPU in a clean clone's test suite). The suite's
warm-up (scripts/test.sh) imports this module too, so the torchrun ranks of
its tests, fresh interpreters, load what it compiled.

On a torch built without CUDA or ROCm it also imports ``torch._dynamo``:
torch imports it on the first call of a function it keeps out of
``torch.compile`` (every optimizer's constructor, the functional
collectives), about 1.3 s of CPU a process with its bytecode cached and
several seconds without. A job whose ranks train pays it once here instead
of once per rank (the test suite forks ~25 such ranks); a job that never
trains pays 1.3 s once per fork server. A GPU build leaves it to the ranks,
as before: a fork server that touched the GPU would break every rank that
uses it, and that the import never does has not been checked on a GPU.

Fork servers of several callers at once (a test suite's workers) take turns
(a lock file beside the package): with a cold cache the first compiles and
writes numba's cache, the others load what it wrote instead of compiling the
same kernels side by side (about 40 s of CPU each).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed

import pathweave.distributed  # noqa: F401
from pathweave.fabric import candidate_paths, preset
from pathweave.plan import DEFAULT_POLICY, make
from pathweave.runtime import _decision, _validate
from pathweave.runtime._group import _GroupState
from pathweave.runtime.orchestrator import Orchestrator
from pathweave.sim import SimModel

if torch.version.cuda is None and torch.version.hip is None:
    import torch._dynamo


def _load_kernels() -> None:
    fab = preset("h100-2x4")
    demand = np.zeros((fab.num_ranks, fab.num_ranks))
    demand[0, 5] = demand[1, 2] = 64 << 20
    for policy in ("mwu", "hscore", DEFAULT_POLICY):
        make(fab, demand, policy)
    # The emulator's ranks, forked from this server too, decide with a model
    # that scores the fragments a plan builds (message_fill).
    make(fab, demand, DEFAULT_POLICY, model=SimModel.ideal(chunk_bytes=1 << 19, message_fill=True))
    # One node (the common local job): the time model scores per link there.
    make(preset("dgx-h100", nodes=1), demand, DEFAULT_POLICY)
    # What each rank's first call runs: the decision and its prediction, as
    # the data plane makes them (no process group is needed for either).
    orch = Orchestrator(fabric=fab)
    st = _GroupState(None, fab, candidate_paths(fab))
    q = demand.astype(np.int64)
    _decision.predict(st, orch._plan(st, q), q, orch.config)
    # A repeated call's check that its matrix is the one it checked before.
    _validate._same_words(q.reshape(-1), q.reshape(-1).copy())


@contextlib.contextmanager
def _one_at_a_time() -> Iterator[None]:
    """Hold an exclusive lock shared by every process of this installation."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): compile side by side, as before
        yield
        return
    # One lock per package path: numba's cache is per source file.
    tag = hashlib.blake2b(os.path.dirname(__file__).encode(), digest_size=6).hexdigest()
    path = os.path.join(tempfile.gettempdir(), f"pathweave-preload-{tag}.lock")
    try:
        f = open(path, "a")  # closed below, once the kernels are loaded
    except OSError:  # another user's file: compile side by side, as before
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        yield


with _one_at_a_time():
    _load_kernels()
