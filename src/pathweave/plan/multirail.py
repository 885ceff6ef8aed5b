"""``multirail``: how MPI over UCX routes GPU buffers across nodes.

* Intra-node: the direct route, like ``static`` (CUDA IPC over NVLink).
* Inter-node: UCX's rendezvous protocol stripes a message over at most
  ``UCX_MAX_RNDV_RAILS`` lanes (default 2; UCX's ``ucx_info -f`` and its
  configuration docs), choosing the network devices nearest the buffer's
  GPU by PCIe distance (UCX's topology module ranks devices by their
  system-device distance): here the source GPU's own NICs (those under its
  PCIe switch, ``nvidia-smi``'s PIX/PXB), the first
  :data:`UCX_MAX_RNDV_RAILS` by rail. Each lane's bytes cross that NIC's
  rail to the destination node's NIC on the same rail and enter the
  destination GPU through its own PCIe link by GPUDirect RDMA: straight
  from that NIC where it is the destination's own (the rail-matched path),
  else across the node's PCIe tree (switch, root complex, the inter-socket
  link where the NIC sits on the other socket): the ``pcie`` path rule. On
  a fabric with spines, a lane to another rail goes through the spines to
  the destination's own NIC (the ``ecmp`` rule's spine paths, one per spine,
  striped evenly: the switches hash each lane's connection onto one spine).
  No GPU ever relays UCX bytes. The split ignores load.

A fabric without a PCIe tree cannot express the NIC-to-GPU hop through the
root complex; there the receive-side forward from the rail's GPU (the *rd*
path, what ``deepep`` uses) stands in for it. A GPU without a NIC falls
back to the ``static`` path.

A model, not something pathweave runs (``executable=False`` in the
registry): pathweave's data plane cannot land an RDMA write on one NIC and
DMA it across the receiving node's PCIe tree (a send straight to another
node's GPU leaves on the NIC the transport picks). So the ``pcie`` rule is
not among the default candidate paths, this policy plans on the given paths
with ``pcie`` (and, with spines, ``ecmp``) added (the plan carries them: :attr:`Plan.paths`, which
simulating it uses), the default policy never takes its plan, and the
Orchestrator and the emulator refuse it.
"""

from __future__ import annotations

import numpy as np

from pathweave.errors import PlanError
from pathweave.fabric import Fabric, PathKind, PathSet, candidate_paths
from pathweave.plan._flows import matching_paths, stripe_plan
from pathweave.plan._plan import Plan
from pathweave.plan.deepep import own_rail_paths, stripes_csr
from pathweave.plan.registry import register

#: UCX's default for ``UCX_MAX_RNDV_RAILS``: lanes one rendezvous message uses.
UCX_MAX_RNDV_RAILS = 2


@register(
    "multirail",
    baseline=True,
    executable=False,
    stripes=lambda paths: multirail_stripes(paths),
    summary="MPI/UCX: direct inside a node; across, the source's nearest NICs (at most 2), "
            "GPUDirect RDMA into the destination through its PCIe tree, no GPU relay",
)
def multirail(fabric: Fabric, demand: np.ndarray, paths: PathSet) -> Plan:
    # UCX's route does not depend on pathweave's rule options: the given rules
    # plus pcie and, with spines, every spine (ecmp: a lane's connection is
    # hashed onto one), cached on the fabric; the plan carries that path set.
    want = ("pcie", "ecmp") if "spine" in paths.kinds else ("pcie",)
    if not set(want) <= set(paths.kinds):
        paths = candidate_paths(fabric, (*paths.kinds, *want), paths.max_hops)
    # Stripes are in pair order and path order within a pair: the Plan layout.
    return stripe_plan(fabric, demand, paths, multirail_stripes(paths), "multirail")


def ucx_paths(paths: PathSet) -> np.ndarray:
    """``bool[num_paths]``: the paths UCX may put a pair's bytes on.

    Rail-matched paths and ``pcie`` paths on one of the source's first
    :data:`UCX_MAX_RNDV_RAILS` rails, and spine paths.
    """
    near = np.zeros_like(paths.owns_rail)
    for r, rails in enumerate(paths.rank_rails):
        near[r, list(rails[:UCX_MAX_RNDV_RAILS])] = True
    lane = (paths.kind == PathKind.RAIL) | (paths.kind == PathKind.PCIE)
    via = np.where(lane, paths.via, 0)
    on_lane = lane & near[paths.src, via]
    matched = on_lane & (paths.kind == PathKind.RAIL) & paths.owns_rail[paths.dst, via]
    return matched | (on_lane & (paths.kind == PathKind.PCIE)) | (paths.kind == PathKind.SPINE)


def multirail_stripes(paths: PathSet) -> tuple[np.ndarray, np.ndarray]:
    """CSR over all pairs of the paths each pair is striped over (kept with the paths).

    ``paths`` must have the ``pcie`` rule: without it a PCIe tree's routes
    would silently become the fallback's GPU forwards.
    """
    if "pcie" not in paths.kinds:
        raise PlanError(f"multirail (UCX) stripes need the 'pcie' path rule; paths have "
                        f"kinds {paths.kinds}")

    def build() -> tuple[np.ndarray, np.ndarray]:
        pairs = np.flatnonzero(paths.pair_ptr[1:] > paths.pair_ptr[:-1]).astype(np.int64)
        which, pid = matching_paths(paths, pairs, ucx_paths(paths))
        # With spines the switches carry a lane to the destination's own NIC:
        # no pcie path for a pair that has spine paths.
        spine = paths.kind[pid] == PathKind.SPINE
        has_spine = np.bincount(which[spine], minlength=pairs.size) > 0
        keep = ~((paths.kind[pid] == PathKind.PCIE) & has_spine[which])
        which, pid = which[keep], pid[keep]
        # No PCIe tree: the rd forward stands in for the root-complex hop.
        none = np.flatnonzero(np.bincount(which, minlength=pairs.size) == 0)
        w2, p2 = matching_paths(paths, pairs[none], own_rail_paths(paths))
        return stripes_csr(paths, np.concatenate([which, none[w2]]),
                           np.concatenate([pid, p2]), pairs)

    return paths.derived("multirail.stripes", build)
