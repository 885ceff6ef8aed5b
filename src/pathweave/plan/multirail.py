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
from pathweave.plan._flows import matching_paths, nonzero_pairs, plan_from_flows, split_evenly
from pathweave.plan._plan import Plan
from pathweave.plan.registry import register
from pathweave.plan.static import static_paths


@register(
    "multirail",
    options={},
    baseline=True,
    summary="UCX/MPI-like: direct inside a node, striped over the source GPU's rails across",
)
def multirail(fabric: Fabric, demand: np.ndarray, paths: PathSet) -> Plan:
    pairs, nbytes = nonzero_pairs(demand)
    own = paths.owns_rail
    is_rail = paths.kind == PathKind.RAIL
    via = np.where(is_rail, paths.via, 0)
    accept = is_rail & own[paths.src, via]
    which, pid = matching_paths(paths, pairs, accept)
    counts = np.bincount(which, minlength=pairs.size)
    striped = counts > 0
    shares = split_evenly(nbytes[striped], counts[striped])
    rest = ~striped
    fp = np.concatenate([pid, static_paths(paths, pairs[rest])])
    fb = np.concatenate([shares, nbytes[rest]])
    return plan_from_flows(fabric, demand, paths, fp, fb, "multirail")
