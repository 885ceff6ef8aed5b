"""``static``: what NCCL does, one fixed path per pair.

* Intra-node: the direct route (one NVLink on a mesh, through the NVSwitch
  otherwise).
* Inter-node: PXN (NCCL >= 2.12). The source forwards over NVLink to the GPU
  of its node that sits on the destination's rail, which sends over that
  rail, so the destination receives from its own NIC without crossing rails
  (the h-score blog's *dr* path; rail-matched when source and destination
  share the rail). Where the source's node has no GPU on the destination's
  rail, the source's own NIC and the one spine path the switches' ECMP hash
  gives the pair (the ``spine`` rule, :mod:`pathweave.fabric.paths`). If the
  destination has no NIC, or there is no spine, the lowest-numbered rail
  path is used.

Nothing depends on load: a skewed exchange piles onto the destination's rail.
"""

from __future__ import annotations

import numpy as np

from pathweave.fabric import Fabric, PathKind, PathSet
from pathweave.plan._flows import first_matching, stripe_plan
from pathweave.plan._plan import Plan
from pathweave.plan.registry import register


def static_paths(paths: PathSet, pairs: np.ndarray) -> np.ndarray:
    """The single path NCCL would use for each flat pair index."""
    dst_rail = paths.first_rail
    direct = paths.kind == PathKind.DIRECT
    pxn = (paths.kind == PathKind.RAIL) & (paths.via == dst_rail[paths.dst])
    # No PXN: the source's NIC and the spine its connection hashes to (the
    # spine rule gives such a pair one; under ecmp the PXN path comes first).
    spine = paths.kind == PathKind.SPINE
    pid = first_matching(paths, pairs, direct | pxn | spine)
    # A destination without a NIC has no PXN path: take the pair's first
    # candidate (compile_paths guarantees every pair has one).
    missing = pid < 0
    pid[missing] = paths.pair_ptr[pairs[missing]]
    return pid


def static_pins(paths: PathSet) -> np.ndarray:
    """``int64[N * N]``: every pair's static path (-1 on the diagonal), kept with the paths."""

    def build() -> np.ndarray:
        n = paths.num_ranks
        pairs = np.flatnonzero(paths.pair_ptr[1:] > paths.pair_ptr[:-1]).astype(np.int64)
        out = np.full(n * n, -1, dtype=np.int64)
        out[pairs] = static_paths(paths, pairs)
        out.setflags(write=False)
        return out

    return paths.derived("static.pins", build)


def static_stripes(paths: PathSet) -> tuple[np.ndarray, np.ndarray]:
    """The static plan as stripes: one path per pair (see ``_flows.stripe_plan``)."""

    def build() -> tuple[np.ndarray, np.ndarray]:
        pins = static_pins(paths)
        ptr = np.concatenate([[0], np.cumsum(pins >= 0)]).astype(np.int64)
        pid = np.ascontiguousarray(pins[pins >= 0])
        for a in (ptr, pid):
            a.setflags(write=False)
        return ptr, pid

    return paths.derived("static.stripes", build)


@register(
    "static",
    baseline=True,
    stripes=static_stripes,
    summary="NCCL-like: direct NVLink inside a node, PXN (destination's rail) across nodes",
)
def static(fabric: Fabric, demand: np.ndarray, paths: PathSet) -> Plan:
    # One path per pair, in pair order: path ids ascend, the Plan layout as is.
    return stripe_plan(fabric, demand, paths, static_stripes(paths), "static")
