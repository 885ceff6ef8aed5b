"""``deepep``: how DeepEP's normal (high-throughput) kernels route.

DeepEP (DeepSeek's expert-parallel communication library; its README,
"Normal kernels with NVLink and RDMA forwarding") sends a token bound for
another node by RDMA to the GPU *on the same rail* of the destination node,
which forwards it over NVLink to the destination GPU; inside a node tokens
go over NVLink directly. NIMBLE's receive-side relay is the same shape.

* Intra-node: the direct route, like ``static``.
* Inter-node: each message is striped evenly over the rails of the NICs the
  source GPU owns. With one NIC per GPU that is the source's own rail, the
  h-score blog's *rd* path: the destination node's GPU on that rail
  forwards over NVLink to the destination. The split ignores load.

A GPU without a NIC falls back to the ``static`` path.
"""

from __future__ import annotations

import numpy as np

from pathweave.fabric import Fabric, PathKind, PathSet
from pathweave.plan._flows import matching_paths, stripe_plan
from pathweave.plan._plan import Plan
from pathweave.plan.registry import register
from pathweave.plan.static import static_paths


@register(
    "deepep",
    baseline=True,
    stripes=lambda paths: deepep_stripes(paths),
    summary="DeepEP normal kernels: RDMA to the destination node's same-rail GPU, then NVLink",
)
def deepep(fabric: Fabric, demand: np.ndarray, paths: PathSet) -> Plan:
    # Stripes are in pair order and path order within a pair: the Plan layout.
    return stripe_plan(fabric, demand, paths, deepep_stripes(paths), "deepep")


def stripes_csr(paths: PathSet, which: np.ndarray, pid: np.ndarray,
                pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Matched ``(which, pid)`` as a CSR over all flat pairs; pairs without a
    match take the ``static`` path."""
    n = paths.num_ranks
    rest = np.bincount(which, minlength=pairs.size) == 0
    which = np.concatenate([which, np.flatnonzero(rest)])
    pid = np.concatenate([pid, static_paths(paths, pairs[rest])])
    order = np.lexsort((pid, which))
    per_pair = np.zeros(n * n, dtype=np.int64)
    per_pair[pairs] = np.bincount(which, minlength=pairs.size)
    out = (np.concatenate([[0], np.cumsum(per_pair)]), np.ascontiguousarray(pid[order]))
    for a in out:
        a.setflags(write=False)
    return out


def own_rail_paths(paths: PathSet) -> np.ndarray:
    """``bool[num_paths]``: rail paths that leave on a rail the source owns."""
    is_rail = paths.kind == PathKind.RAIL
    via = np.where(is_rail, paths.via, 0)
    return is_rail & paths.owns_rail[paths.src, via]


def deepep_stripes(paths: PathSet) -> tuple[np.ndarray, np.ndarray]:
    """CSR over all pairs of the paths each pair is striped over (kept with the paths)."""

    def build() -> tuple[np.ndarray, np.ndarray]:
        pairs = np.flatnonzero(paths.pair_ptr[1:] > paths.pair_ptr[:-1]).astype(np.int64)
        which, pid = matching_paths(paths, pairs, own_rail_paths(paths))
        return stripes_csr(paths, which, pid, pairs)

    return paths.derived("deepep.stripes", build)
