"""torch's own all-to-all test cases, run against the ``pathweave`` backend on gloo.

The cases are every ``test_all_to_all*`` method of
``torch.testing._internal.distributed.distributed_test.DistributedTest._DistTestBase``
of the installed torch, unchanged: each starts 8 processes that call
``init_process_group("pathweave")`` (through torch's ``TestDistBackend``) and
check ``dist.all_to_all_single``/``dist.all_to_all`` against the expected
tensors, on the default group, a 2-rank subgroup and a full subgroup, for
float and complex data, equal and unequal splits.

torch marks the CPU variants "Only MPI supports ..." (gloo has no CPU
all-to-all in the eyes of that file), so they are skipped for any backend but
MPI; here the skip mark is left out (the body runs as written). What does not
apply, by rule:

* ``*_cuda*`` cases: they need one GPU per rank and NCCL (this build of
  torch has no CUDA); the pathweave backend runs CUDA tensors on NCCL the
  same way, unchecked here.
* torch's profiler assertions in these cases (``call_dist_op``) check only
  backends in its ``PROFILING_SUPPORTED_BACKENDS``; for ``pathweave`` they
  are skipped by torch's own code, as for any out-of-tree backend.

torch's file reads ``BACKEND``, ``WORLD_SIZE`` and ``TEMP_DIR`` when it is
imported, so the cases run in a child Python (this file as a script); the
test asserts that every applicable case ran and passed, none skipped, with
``PATHWEAVE_MULTIPATH=on`` so that every call runs pathweave's executor (the
cases on the default group also check that its orchestrator counted them).
"""

from __future__ import annotations

import os
import subprocess
import sys
import unittest

WORLD_SIZE = 8  # the subgroup cases need 8 ranks (torch's skip_if_small_worldsize)


def not_applicable(name: str) -> str | None:
    """Why torch's case ``name`` does not run here, or ``None`` if it does."""
    if "cuda" in name:
        return "needs a GPU per rank and NCCL (CPU-only torch build)"
    return None


def _cases() -> dict[str, str | None]:
    from torch.testing._internal.distributed.distributed_test import DistributedTest

    names = sorted(n for n in dir(DistributedTest._DistTestBase) if n.startswith("test_all_to_all"))
    return {n: not_applicable(n) for n in names}


def _unskipped(f):
    """torch's case body without its skip mark, then proof that pathweave served it."""

    def case(self):
        import torch.distributed as dist

        import pathweave.distributed as pwd
        from pathweave.runtime.backend import ProcessGroupPathweave

        before = pwd.default_orchestrator().stats.multipath_calls
        f(self)
        assert isinstance(dist.group.WORLD, ProcessGroupPathweave)
        if "group" not in f.__name__:  # the default group's orchestrator ran every call
            assert pwd.default_orchestrator().stats.multipath_calls > before

    case.__name__ = f.__name__
    return case


def _main() -> int:
    import torch
    from torch.testing._internal.distributed.distributed_test import (
        DistributedTest,
        TestDistBackend,
    )

    # pathweave.distributed registers the backend; _preload loads the
    # planners' kernels once here: every case forks 8 ranks from this
    # process, and each would otherwise load them from numba's cache again on
    # its first call (about 0.5 s of CPU a rank, 96 ranks).
    import pathweave.distributed
    import pathweave.runtime._preload  # noqa: F401

    class PathweaveAllToAll(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            # fork: the children start with torch and pathweave imported
            self._start_processes(torch.multiprocessing.get_context("fork").Process)

    run = [n for n, why in _cases().items() if why is None]
    for name in run:
        setattr(PathweaveAllToAll, name,
                _unskipped(getattr(DistributedTest._DistTestBase, name)))
    suite = unittest.TestSuite(PathweaveAllToAll(n) for n in run)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    print(f"PATHWEAVE-SUITE ran={result.testsRun} skipped={len(result.skipped)} "
          f"ok={result.wasSuccessful()}", flush=True)
    return 0 if result.wasSuccessful() and not result.skipped else 1


def test_torch_all_to_all_cases_pass_on_the_pathweave_backend(tmp_path):
    env = dict(os.environ, BACKEND="pathweave", WORLD_SIZE=str(WORLD_SIZE),
               TEMP_DIR=str(tmp_path), OMP_NUM_THREADS="1", PATHWEAVE_MULTIPATH="on")
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                          timeout=400, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    os.environ.setdefault("BACKEND", "pathweave")  # torch's file reads it on import
    os.environ.setdefault("WORLD_SIZE", str(WORLD_SIZE))
    cases = _cases()
    run = [n for n, why in cases.items() if why is None]
    assert len(run) >= 12, cases  # every CPU case of torch's file: 6 forms x plain/complex/group
    assert f"PATHWEAVE-SUITE ran={len(run)} skipped=0 ok=True" in out, out[-6000:]
    for name in run:
        assert f"{name} " in out and "ok" in out, name


if __name__ == "__main__":
    sys.exit(_main())
