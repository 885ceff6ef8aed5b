"""The time model: a plan's predicted completion time, in one place.

A plan's congestion bound (``max_e load_e / capacity_e``) is what every byte
costs; the simulator (:func:`pathweave.sim.simulate`) and the emulator charge
forwarding on top. This module is the closed form of those charges that the
planner optimises, the simulator's flow builder reads and the Orchestrator
decides with; the parameters are :class:`pathweave.sim.SimModel`'s.

Per candidate path ``p`` (tables kept with the path set, :func:`path_costs`):

* its links plus the *virtual* links they imply: one per GPU for its NVLink
  injection (``nvlink_inject_efficiency`` of the sum of its NVLinks), one
  per node and direction for its NICs' aggregate
  (``nic_aggregate_efficiency``); network links deliver
  ``network_efficiency`` of line rate. These are the *effective* links;
* ``relays_p``: forwarding GPUs on the path; its rate ceiling: its slowest
  effective link, and ``relay_efficiency * min(in, out)`` at each
  forwarding GPU;
* ``start_s[p] = setup_s + relay_setup_s * relays_p``: when its bytes start;
* ``fill_s``: hop latencies plus one chunk (``min(chunk_bytes, bytes)``) per
  store-and-forward stage (a forwarding GPU or NIC), at the next hop's
  effective capacity.

The predicted time of a plan is the larger of two terms::

    links:  setup_s + max_e  load_e / eff_capacity_e          (e: real and virtual)
    flows:  max_f  start_s[p_f] + bytes_f / rate_cap[p_f] + fill_s[f]

The first is the congestion bound over the effective links, started once;
the second is the slowest single fragment on its own. Both are lower bounds
of the simulator's max-min fluid makespan up to its sharing order (a
fragment's pipeline fill is an end delay, not counted on the link term), and
their maximum tracks it closely on the benchmark workloads
(``docs/simulator.md``). With :meth:`SimModel.ideal` the prediction is the
congestion bound exactly.

Examples
--------
One 120 MB transfer over a 120 GB/s NVLink: 1 ms, plus 20 us of set-up and
1 us of hop latency in the default model:

>>> import numpy as np, pathweave as pw
>>> fab = pw.fabric.preset("h100-2x4")
>>> D = np.zeros((8, 8)); D[0, 1] = 120e6
>>> plan = pw.plan.make(fab, D, "static")
>>> round(predict_time(plan) * 1e6, 1)
1021.0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numba import njit

from pathweave.fabric import Fabric, LinkKind, PathSet, VertexKind

if TYPE_CHECKING:
    from pathweave.plan._plan import Plan
    from pathweave.sim.model import SimModel

__all__ = ["PathCosts", "default_model", "effective_links", "path_costs", "predict_time",
           "time_terms"]

_GPU = int(VertexKind.GPU)
_NIC = int(VertexKind.NIC)


_DEFAULT: list[SimModel] = []


def default_model() -> SimModel:
    """The default :class:`~pathweave.sim.SimModel` (fitted to the NIMBLE testbed)."""
    if not _DEFAULT:  # built once: planning asks for it on every call
        from pathweave.sim.model import SimModel

        _DEFAULT.append(SimModel())
    return _DEFAULT[0]


@dataclass(frozen=True)
class PathCosts:
    """Per-path tables of the time model for one path set and one model.

    Attributes
    ----------
    links
        ``int64[P, H]``: each path's effective links (real, then the virtual
        links they imply; ids ``>= num_links`` are virtual), -1 padded.
    length
        ``int64[P]``: effective links per path.
    capacity_Bps
        ``float64[L + V]``: effective capacity of every real and virtual link.
    rate_cap_Bps
        ``float64[P]``: the most a lone fragment gets: its slowest effective
        link, or less through a forwarding GPU.
    relays
        ``int64[P]``: forwarding GPUs on each path.
    start_s
        ``float64[P]``: ``setup_s + relay_setup_s * relays``.
    latency_s
        ``float64[P]``: sum of the path's hop latencies.
    stage_s_per_byte
        ``float64[P]``: sum over store-and-forward stages of ``1 / capacity``;
        times ``min(chunk_bytes, bytes)`` it is the chunk part of the fill.
    setup_s, chunk_bytes
        The model's set-up and pipeline chunk.
    """

    links: np.ndarray
    length: np.ndarray
    capacity_Bps: np.ndarray
    rate_cap_Bps: np.ndarray
    relays: np.ndarray
    start_s: np.ndarray
    latency_s: np.ndarray
    stage_s_per_byte: np.ndarray
    setup_s: float
    chunk_bytes: int

    def fill_s(self, path: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Pipeline fill of fragments of ``nbytes`` on paths ``path``."""
        chunk = np.minimum(np.asarray(nbytes, dtype=np.float64), float(self.chunk_bytes))
        return self.latency_s[path] + chunk * self.stage_s_per_byte[path]

    def fixed_s(self, path: np.ndarray) -> np.ndarray:
        """Start plus fill of a fragment of at least one chunk: its time beyond streaming."""
        return self.start_s[path] + self.latency_s[path] + (
            self.chunk_bytes * self.stage_s_per_byte[path]
        )


def effective_links(fabric: Fabric, model: SimModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(virt_a, virt_b, capacity)`` of the model's effective links.

    ``virt_a[e]`` and ``virt_b[e]`` name up to two virtual links real link
    ``e`` also loads (-1: none); ``capacity`` holds the effective capacity of
    the real links (network links at ``network_efficiency``) followed by the
    virtual links'.
    """
    nlinks = fabric.num_links
    src, dst = fabric.link_src, fabric.link_dst
    vk = fabric.vertex_kind
    kind = fabric.link_kind
    cap = fabric.capacity_Bps
    virt_a = np.full(nlinks, -1, dtype=np.int64)
    virt_b = np.full(nlinks, -1, dtype=np.int64)
    caps: list[np.ndarray] = []
    nxt = nlinks

    def add(mask: np.ndarray, owner: np.ndarray, eff: float, slot: np.ndarray) -> None:
        nonlocal nxt
        if eff >= 1.0 or not mask.any():
            return
        owners, inv = np.unique(owner[mask], return_inverse=True)
        total = np.bincount(inv, weights=cap[mask], minlength=owners.size)
        slot[mask] = nxt + inv
        caps.append(eff * total)
        nxt += owners.size

    inject = (kind == LinkKind.NVLINK) & (vk[src] == _GPU)
    add(inject, src, model.nvlink_inject_efficiency, virt_a)
    node = fabric.vertex_node
    net = kind == LinkKind.NETWORK
    tx = net & (vk[src] == _NIC)
    rx = net & (vk[dst] == _NIC)
    # A NETWORK link leaving a NIC is never an NVLink out of a GPU: slot a is free.
    add(tx, node[src], model.nic_aggregate_efficiency, virt_a)
    add(rx, node[dst], model.nic_aggregate_efficiency, virt_b)
    cap_eff = cap.astype(np.float64).copy()
    cap_eff[net] *= model.network_efficiency
    return virt_a, virt_b, np.concatenate([cap_eff, *caps])


def link_latency_s(fabric: Fabric, model: SimModel) -> np.ndarray:
    """Latency of every real link under ``model`` (its ``hop_latency_s`` if set)."""
    if model.hop_latency_s is None:
        return np.ascontiguousarray(fabric.latency_s, dtype=np.float64)
    return np.full(fabric.num_links, float(model.hop_latency_s))


def _build(paths: PathSet, model: SimModel) -> PathCosts:
    fab = paths.fabric
    virt_a, virt_b, cap = effective_links(fab, model)
    lat = link_latency_s(fab, model)
    pl = paths.links
    npaths, hmax = pl.shape
    valid = pl >= 0
    safe = np.where(valid, pl, 0)
    # Effective links: the real ones, then each hop's virtual links.
    va = np.where(valid, virt_a[safe], -1)
    vb = np.where(valid, virt_b[safe], -1)
    ext = np.concatenate([pl, va, vb], axis=1)
    order = np.argsort(ext < 0, axis=1, kind="stable")  # valid ids first, in order
    ext = np.take_along_axis(ext, order, axis=1)
    length = (ext >= 0).sum(axis=1).astype(np.int64)
    ext = ext[:, : max(int(length.max(initial=0)), 1)]
    latency = np.where(valid, lat[safe], 0.0).sum(axis=1)
    # Store-and-forward stages: every hop after the first whose source is a
    # GPU or a NIC; a GPU among them is a forwarding GPU.
    vsrc = fab.vertex_kind[fab.link_src[safe]]
    inner = valid & (np.arange(hmax)[None, :] > 0)
    stage = inner & ((vsrc == _GPU) | (vsrc == _NIC))
    relay = inner & (vsrc == _GPU)
    ceff = cap[: fab.num_links][safe]
    stage_inv = np.where(stage, 1.0 / ceff, 0.0).sum(axis=1)
    relays = relay.sum(axis=1).astype(np.int64)
    prev = np.concatenate([ceff[:, :1], ceff[:, :-1]], axis=1)
    rate = np.where(relay, model.relay_efficiency * np.minimum(prev, ceff), np.inf)
    if model.relay_efficiency >= 1.0:
        rate = np.full_like(rate, np.inf)
    # Alone on its path a fragment still runs at most at its slowest effective link.
    path_cap = np.where(ext >= 0, cap[np.maximum(ext, 0)], np.inf).min(axis=1)
    rate_cap = np.minimum(rate.min(axis=1), path_cap) if hmax else np.full(npaths, np.inf)
    start = model.setup_s + model.relay_setup_s * relays.astype(np.float64)
    arrays = [ext, length, cap, rate_cap, relays, start, latency, stage_inv]
    for a in arrays:
        a.setflags(write=False)
    return PathCosts(*arrays, setup_s=float(model.setup_s), chunk_bytes=int(model.chunk_bytes))


def path_costs(paths: PathSet, model: SimModel | None = None) -> PathCosts:
    """The time model's per-path tables, built once per (path set, model)."""
    m = default_model() if model is None else model
    return paths.derived(("timemodel", m), lambda: _build(paths, m))


@njit(cache=True)
def _terms(flow_path, flow_bytes, links, length, capacity, rate_cap, start, latency, stage,
           setup, chunk):
    # One pass over the fragments: effective-link loads and the slowest lone
    # fragment. NOTE: a kernel, because scoring candidates runs on every plan
    # and numpy's per-call overhead was most of a 8-GPU prediction.
    load = np.zeros(capacity.shape[0])
    flows = 0.0
    used = False
    for i in range(flow_path.shape[0]):
        b = float(flow_bytes[i])
        if b <= 0:
            continue
        used = True
        p = flow_path[i]
        for h in range(length[p]):
            load[links[p, h]] += b
        t = start[p] + b / rate_cap[p] + latency[p] + min(b, chunk) * stage[p]
        if t > flows:
            flows = t
    if not used:
        return 0.0, 0.0
    worst = 0.0
    for e in range(load.shape[0]):
        t = load[e] / capacity[e]
        if t > worst:
            worst = t
    return setup + worst, flows


def time_terms(
    paths: PathSet, flow_path: np.ndarray, flow_bytes: np.ndarray, model: SimModel | None = None
) -> tuple[float, float]:
    """``(links_s, flows_s)``: the two terms of the prediction (module docstring)."""
    pc = path_costs(paths, model)
    links_s, flows_s = _terms(
        np.ascontiguousarray(flow_path, dtype=np.int64),
        np.ascontiguousarray(flow_bytes, dtype=np.int64), pc.links, pc.length,
        pc.capacity_Bps, pc.rate_cap_Bps, pc.start_s, pc.latency_s, pc.stage_s_per_byte,
        pc.setup_s, float(pc.chunk_bytes),
    )
    return float(links_s), float(flows_s)


def predict_time(plan: Plan, model: SimModel | None = None) -> float:
    """Predicted completion time of ``plan``, in seconds (see the module docstring).

    Parameters
    ----------
    plan
        Any policy's :class:`~pathweave.plan.Plan`.
    model
        The :class:`~pathweave.sim.SimModel` whose costs apply; default
        ``SimModel()``. ``SimModel.ideal()`` gives ``plan.congestion_s``.
    """
    return max(time_terms(plan.paths, plan.flow_path, plan.flow_bytes, model))
