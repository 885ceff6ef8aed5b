"""``multirail``: what UCX / MPI multi-rail striping does.

* Intra-node: the direct route, like ``static``.
* Inter-node: each message is striped evenly over the rails of the NICs the
  source GPU owns (UCX splits a rendezvous message over the HCAs near the
  buffer). With one NIC per GPU that is the source's own rail, the h-score
  blog's *rd* path: the receiving node's NIC on that rail hands the bytes
  to the destination GPU through its node (PCIe/NVLink), modelled as the
  forward from the rail's GPU. With several NICs per GPU the stripes go over
  all of them. The split ignores load.

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
    "multirail",
    options={},
    baseline=True,
    stripes=lambda paths: _stripes(paths),
    summary="UCX/MPI-like: direct inside a node, striped over the source GPU's rails across",
)
def multirail(fabric: Fabric, demand: np.ndarray, paths: PathSet) -> Plan:
    # Stripes are in pair order and path order within a pair: the Plan layout.
    return stripe_plan(fabric, demand, paths, _stripes(paths), "multirail")


def _stripes(paths: PathSet) -> tuple[np.ndarray, np.ndarray]:
    """CSR over all pairs of the paths each pair is striped over (kept with the paths)."""

    def build() -> tuple[np.ndarray, np.ndarray]:
        n = paths.num_ranks
        pairs = np.flatnonzero(paths.pair_ptr[1:] > paths.pair_ptr[:-1]).astype(np.int64)
        own = paths.owns_rail
        is_rail = paths.kind == PathKind.RAIL
        via = np.where(is_rail, paths.via, 0)
        accept = is_rail & own[paths.src, via]
        which, pid = matching_paths(paths, pairs, accept)
        counts = np.bincount(which, minlength=pairs.size)
        # A pair without an own-rail path (inside a node, or no NIC) goes static.
        rest = counts == 0
        which = np.concatenate([which, np.flatnonzero(rest)])
        pid = np.concatenate([pid, static_paths(paths, pairs[rest])])
        order = np.lexsort((pid, which))
        per_pair = np.zeros(n * n, dtype=np.int64)
        per_pair[pairs] = np.bincount(which, minlength=pairs.size)
        ptr = np.concatenate([[0], np.cumsum(per_pair)])
        out = (ptr, np.ascontiguousarray(pid[order]))
        for a in out:
            a.setflags(write=False)
        return out

    return paths.derived("multirail.stripes", build)
