"""The time model: a plan's predicted completion time, in one place.

A plan's congestion bound (``max_e load_e / capacity_e``) is what every byte
costs; the simulator (:func:`pathweave.sim.simulate`) and the emulator charge
forwarding on top. This module is the closed form of those charges that the
planner optimises, the simulator's flow builder reads and the Orchestrator
decides with; the parameters are :class:`pathweave.plan.model.SimModel`'s
(re-exported as ``pathweave.sim.SimModel``).

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

    links:  setup_s + max_e  load_e / eff_capacity_e + tail_e   (e: used real and virtual)
    flows:  max_f  start_s[p_f] + bytes_f / rate_cap[p_f] + fill_s[f]

plus, where ``round_s > 0``, the data plane's host cost of its rounds,
serial with the transfers and so added to both terms::

    host:   round_s * rounds(plan)

``rounds(plan)`` (:func:`executor_rounds`) is what the executor's schedule
runs for the plan's fragments (:mod:`pathweave.runtime.schedule`; both use
:mod:`pathweave.plan.rounds`' rule): exact for the fragments as given,
counted at the model's ``chunk_bytes`` and ``window``.

The first is the congestion bound over the effective links, started once,
each link followed by its *tail*: the largest fill of the fragments on it
(the simulator adds a fragment's fill after its last byte has crossed its
links, so the last fragment through the busiest link still has its fill to
go); the second is the slowest single fragment on its own. The tail makes
the model no strict lower bound of the simulator's max-min fluid makespan
(the fragment with the largest fill need not end last) but a closer one:
without it the model was up to 45 % below the simulator on 1-2 MB pairs,
where a few chunks of fill are a fifth of the time. The links term assumes
that the fragments on a link share it in proportion to their bytes, so that
those held by it end together: the executor's rounds do that and the
simulator models it (weighted max-min), and multi-path plans simulate within
0.6 % of the prediction on ``bench planner``'s cases (up to 17 % above it
when links were shared per fragment; ``docs/simulator.md``).
With :meth:`SimModel.ideal` the prediction is the congestion bound exactly.

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

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numba import njit

from pathweave.fabric import Fabric, LinkKind, PathSet, VertexKind
from pathweave.plan._flows import stripe_flows
from pathweave.plan._stripe_kernel import (
    cut_bound,
    cut_bound_sums,
    factor_tables,
    factored_terms,
    intra_tables,
)
from pathweave.plan.model import SimModel
from pathweave.plan.rounds import (
    entry_round,
    pacing,
    pipeline_fill_s,
    route_ranks,
    unpaced_direct,
)

if TYPE_CHECKING:
    from pathweave.plan._plan import Plan

__all__ = ["PathCosts", "bound_scorer", "default_model", "effective_links", "executor_rounds",
           "ideal_model", "lower_bound_s", "message_fill_terms", "path_costs", "predict_time",
           "round_cost_s", "stripe_scorer", "stripe_time", "tail_slack_s", "time_terms"]

_GPU = int(VertexKind.GPU)
_NIC = int(VertexKind.NIC)


@functools.cache  # built once: planning asks for it on every call
def default_model() -> SimModel:
    """The default :class:`~pathweave.sim.SimModel` (fitted to the NIMBLE testbed)."""
    return SimModel()


@functools.cache
def ideal_model() -> SimModel:
    """:meth:`SimModel.ideal() <pathweave.sim.SimModel.ideal>`, built once: its
    prediction is the congestion bound, its :func:`lower_bound_s` a lower bound of
    every plan's congestion (``mwu``'s certified gap)."""
    return SimModel.ideal()


@dataclass(frozen=True)
class PathCosts:
    """Per-path tables of the time model for one path set and one model.

    Attributes
    ----------
    links
        ``int32[P, H]`` (the dtype of :class:`~pathweave.fabric.PathSet`'s): each path's
        effective links (real, then the virtual links they imply; ids ``>= num_links`` are
        virtual), -1 padded.
    length
        ``int32[P]``: effective links per path.
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
    out = np.full(fabric.num_links, float(model.hop_latency_s))
    out.setflags(write=False)  # read-only as the fabric's: one numba specialisation of _path_tables
    return out


@njit(cache=True)
def _path_tables(pl, virt_a, virt_b, cap, lat, src_kind, relay_eff):
    # The per-path tables of _build_reference, path by path (sums in hop
    # order): ext (real links, then their virtual a's, then their b's),
    # length, latency, stage_inv, relays, rate_cap. NOTE: a kernel because
    # the numpy version's (P, 3H) temporaries took 4.4 s at 1024 GPUs.
    npaths, hmax = pl.shape
    # int32 as the path set's own links and lengths: the routing kernels take
    # either, and each dtype was a compiled version of its own (4.5-4.9 s cold
    # for link_classes alone).
    length = np.zeros(npaths, dtype=np.int32)
    width = 1
    for p in range(npaths):  # the widest row first: the table is allocated once
        n = 0
        for h in range(hmax):
            e = pl[p, h]
            if e >= 0:
                n += 1 + (virt_a[e] >= 0) + (virt_b[e] >= 0)
        width = max(width, n)
    ext = np.full((npaths, width), -1, dtype=np.int32)
    latency = np.zeros(npaths)
    stage_inv = np.zeros(npaths)
    relays = np.zeros(npaths, dtype=np.int64)
    rate_cap = np.full(npaths, np.inf)
    for p in range(npaths):
        n = 0
        for h in range(hmax):
            if pl[p, h] >= 0:
                ext[p, n] = pl[p, h]
                n += 1
        for virt in (virt_a, virt_b):
            for h in range(hmax):
                e = pl[p, h]
                if e >= 0 and virt[e] >= 0:
                    ext[p, n] = virt[e]
                    n += 1
        length[p] = n
        rate = np.inf
        for k in range(n):
            rate = min(rate, cap[ext[p, k]])
        for h in range(hmax):
            e = pl[p, h]
            if e < 0:
                continue
            latency[p] += lat[e]
            v = src_kind[e]
            if h == 0 or (v != _GPU and v != _NIC):
                continue
            stage_inv[p] += 1.0 / cap[e]
            if v == _GPU:
                relays[p] += 1
                if relay_eff < 1.0:
                    before = cap[max(pl[p, h - 1], 0)]
                    rate = min(rate, relay_eff * min(before, cap[e]))
        rate_cap[p] = rate
    return ext, length, latency, stage_inv, relays, rate_cap


def _build(paths: PathSet, model: SimModel) -> PathCosts:
    fab = paths.fabric
    virt_a, virt_b, cap = effective_links(fab, model)
    pl = np.ascontiguousarray(paths.links)
    src_kind = np.ascontiguousarray(fab.vertex_kind[fab.link_src], dtype=np.int64)
    ext, length, latency, stage_inv, relays, rate_cap = _path_tables(
        pl, virt_a, virt_b, cap, link_latency_s(fab, model), src_kind,
        float(model.relay_efficiency))
    start = model.setup_s + model.relay_setup_s * relays.astype(np.float64)
    arrays = [ext, length, cap, rate_cap, relays, start, latency, stage_inv]
    for a in arrays:
        a.setflags(write=False)
    return PathCosts(*arrays, setup_s=float(model.setup_s), chunk_bytes=_stage_chunk(model))


def _stage_chunk(model: SimModel) -> int:
    # The chunk a store-and-forward stage holds in the per-path tables; with
    # message_fill the fill is per fragment instead (time_terms).
    return 0 if model.message_fill else int(model.chunk_bytes)


def _build_reference(paths: PathSet, model: SimModel) -> PathCosts:
    """Slow twin of :func:`_build` (numpy over all paths at once; sums in hop order)."""
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
    ext = np.ascontiguousarray(ext[:, : max(int(length.max(initial=0)), 1)])
    # Store-and-forward stages: every hop after the first whose source is a
    # GPU or a NIC; a GPU among them is a forwarding GPU.
    vsrc = fab.vertex_kind[fab.link_src[safe]]
    inner = valid & (np.arange(hmax)[None, :] > 0)
    stage = inner & ((vsrc == _GPU) | (vsrc == _NIC))
    relay = inner & (vsrc == _GPU)
    ceff = cap[: fab.num_links][safe]
    latency = np.zeros(npaths)
    stage_inv = np.zeros(npaths)
    for h in range(hmax):  # hop by hop: the kernel's order of addition
        latency += np.where(valid[:, h], lat[safe[:, h]], 0.0)
        stage_inv += np.where(stage[:, h], 1.0 / ceff[:, h], 0.0)
    relays = relay.sum(axis=1).astype(np.int64)
    prev = np.concatenate([ceff[:, :1], ceff[:, :-1]], axis=1)
    rate = np.where(relay, model.relay_efficiency * np.minimum(prev, ceff), np.inf)
    if model.relay_efficiency >= 1.0:
        rate = np.full_like(rate, np.inf)
    # Alone on its path a fragment still runs at most at its slowest effective link.
    path_cap = np.where(ext >= 0, cap[np.maximum(ext, 0)], np.inf).min(axis=1)
    rate_cap = np.minimum(rate.min(axis=1), path_cap) if hmax else np.full(npaths, np.inf)
    start = model.setup_s + model.relay_setup_s * relays.astype(np.float64)
    return PathCosts(ext, length, cap, rate_cap, relays, start, latency, stage_inv,
                     setup_s=float(model.setup_s), chunk_bytes=_stage_chunk(model))


def path_costs(paths: PathSet, model: SimModel | None = None) -> PathCosts:
    """The time model's per-path tables, built once per (path set, model)."""
    m = default_model() if model is None else model
    return paths.derived(("timemodel", m), lambda: _build(paths, m))


@njit(cache=True, inline="always")
def _fragment(p, b, load, links, length, rate_cap, start, latency, stage, chunk):
    # Load one fragment of b bytes on path p; return its lone-fragment time.
    for h in range(length[p]):
        load[links[p, h]] += b
    return start[p] + b / rate_cap[p] + latency[p] + min(b, chunk) * stage[p]


@njit(cache=True, inline="always")
def _tailed(p, fill, drain, links, length):
    # The latest drain of the links of path p plus a fragment's fill on it:
    # what that fragment adds to the links term as the tail of its links.
    worst = 0.0
    for h in range(length[p]):
        t = drain[links[p, h]]
        if t > worst:
            worst = t
    return worst + fill


@njit(cache=True, inline="always")
def _drain(load, capacity):
    # load_e / c_e, in place of the loads (no allocation on the hot path).
    for e in range(load.shape[0]):
        load[e] = load[e] / capacity[e]
    return load


@njit(cache=True)
def _terms(flow_path, flow_bytes, links, length, capacity, rate_cap, start, latency, stage,
           setup, chunk):
    # Two passes over the fragments: effective-link loads and the slowest
    # lone fragment, then the links term. NOTE: a kernel, because scoring
    # candidates runs on every plan and numpy's per-call overhead was most
    # of a 8-GPU prediction. The links term max_e (drain_e + tail_e), a
    # tail being the largest fill on the link, is computed fragment-major
    # as max_f (fill_f + max_{e in f} drain_e): a read-only second pass that
    # skips fragments which cannot raise it (one scatter of tails into the
    # first pass cost 35 % more at 64 GPUs).
    load = np.zeros(capacity.shape[0])
    flows = 0.0
    used = False
    for i in range(flow_path.shape[0]):
        b = float(flow_bytes[i])
        if b <= 0:
            continue
        used = True
        t = _fragment(flow_path[i], b, load, links, length, rate_cap, start, latency, stage,
                      chunk)
        if t > flows:
            flows = t
    if not used:
        return 0.0, 0.0
    drain = _drain(load, capacity)
    top = drain.max()
    worst = 0.0
    for i in range(flow_path.shape[0]):
        b = float(flow_bytes[i])
        if b <= 0:
            continue
        p = flow_path[i]
        fill = latency[p] + min(b, chunk) * stage[p]
        if top + fill > worst:
            worst = max(worst, _tailed(p, fill, drain, links, length))
    return setup + worst, flows


@njit(cache=True)
def _stripe_terms_by_link(flat, ptr, rate_cap, start, latency, stage, capacity, lptr, lfrag,
                          tail_max, setup, chunk):
    # The striped plan's terms over gathered tables, link-major: first every fragment's
    # bytes, fill and the flows term, then each link's load as a sum over
    # the fragments crossing it, then the tails of the links that could
    # still hold the links term. NOTE: summing per link (a gather) instead
    # of adding each fragment to its links (a scatter whose adds wait on
    # each other) halves a 256-GPU scoring pass.
    frag = np.zeros(rate_cap.shape[0])
    flows = 0.0
    longest = 0.0
    used = False
    for q in range(flat.shape[0]):
        d = flat[q]
        if d <= 0:
            continue
        used = True
        lo = ptr[q]
        k = ptr[q + 1] - lo
        base = d if k == 1 else d // k
        rem = 0 if k == 1 else d % k
        for j in range(k):
            b = float(base + (1 if j < rem else 0))
            if b <= 0:
                continue
            i = lo + j
            frag[i] = b
            fill = latency[i] + min(b, chunk) * stage[i]
            longest = max(longest, fill)
            t = start[i] + b / rate_cap[i] + fill
            if t > flows:
                flows = t
    if not used:
        return 0.0, 0.0
    drain = np.zeros(capacity.shape[0])
    for e in range(capacity.shape[0]):
        # Four partial sums: one running sum would wait on every add.
        a0 = a1 = a2 = a3 = 0.0
        lo, hi = lptr[e], lptr[e + 1]
        x = lo
        while x + 4 <= hi:
            a0 += frag[lfrag[x]]
            a1 += frag[lfrag[x + 1]]
            a2 += frag[lfrag[x + 2]]
            a3 += frag[lfrag[x + 3]]
            x += 4
        while x < hi:
            a0 += frag[lfrag[x]]
            x += 1
        drain[e] = ((a0 + a1) + (a2 + a3)) / capacity[e]
    # The most loaded link first; another can only hold the links term if
    # its drain plus the largest tail it could have (tail_max: its stripes'
    # fills at a whole chunk) beats that: on balanced loads most cannot.
    top = int(np.argmax(drain))
    worst = drain[top] + _link_tail(top, frag, latency, stage, chunk, lptr, lfrag)
    for e in range(capacity.shape[0]):
        if drain[e] > 0 and drain[e] + min(longest, tail_max[e]) > worst:
            worst = max(worst, drain[e] + _link_tail(e, frag, latency, stage, chunk, lptr,
                                                     lfrag))
    return setup + worst, flows


@njit(cache=True, inline="always")
def _link_tail(e, frag, latency, stage, chunk, lptr, lfrag):
    # Largest fill among the fragments with bytes crossing link e.
    tail = 0.0
    for x in range(lptr[e], lptr[e + 1]):
        i = lfrag[x]
        if frag[i] > 0:
            tail = max(tail, latency[i] + min(frag[i], chunk) * stage[i])
    return tail


def _kernel_args(paths: PathSet, key: tuple, args: Callable[[], tuple]) -> tuple:
    """``args()`` with each array a private, writable copy, kept with ``paths`` under
    ``key``: what a scorer's closure hands its kernel, never anyone else.

    NOTE: numba types a read-only array argument by its slow path (~50 ns more
    than a writable one, measured): the 8-GPU default plan hands its bound and
    stripe kernels 23 table arrays, ~1 us. The cached tables themselves stay
    read-only; these copies are small (per rank and node, not per path) and
    only the closures of :func:`stripe_scorer` and :func:`bound_scorer`, the
    kernels' one caller each, hold them, so each kernel has one compiled version.
    """
    return paths.derived(("kernel args", *key), lambda: tuple(
        np.array(a) if isinstance(a, np.ndarray) else a for a in args()))


def _frozen(demand: np.ndarray) -> np.ndarray:
    """``demand`` as contiguous ``int64``, read-only (a view: the caller's array keeps its
    flags), as the planners hand it (``registry.as_demand``): the cut and stripe kernels
    compiled a version of their own for each writability."""
    dem = np.ascontiguousarray(demand, dtype=np.int64)
    if dem.flags.writeable:
        dem = dem.view()
        dem.setflags(write=False)
    return dem


def stripe_time(
    paths: PathSet, demand: np.ndarray, stripes: tuple[np.ndarray, np.ndarray],
    model: SimModel | None = None, *, key: str | None = None,
) -> float:
    """:func:`predict_time` of ``stripe_plan(demand, stripes)`` without building the plan.

    ``stripes = (ptr, pid)`` as for :func:`pathweave.plan._flows.stripe_plan`
    (a baseline's :attr:`~pathweave.plan.Policy.stripes`); the result is the
    built plan's prediction (bit for bit without ``key``; with it, up to the
    order of the per-link sums). With ``key`` (the stripes' owner, e.g. the
    policy name) the path tables of the stripe paths are gathered once into
    stripe order, with each effective link's list of stripes, and kept with
    ``paths``: the scoring pass then reads memory in order. Where the
    stripes factor by node (equal nodes, ranks numbered node by node, every
    stripe's links in its two end nodes: :mod:`pathweave.plan._stripe_kernel`)
    the pass instead reads the demand once into per-rank aggregates, the
    same loads exactly (whole bytes, below 2**53 per link). A model with
    ``round_s > 0`` also builds the fragments, to count their rounds; one
    with ``message_fill`` scores the built fragments (:func:`time_terms`).
    """
    dem = _frozen(demand)
    if key is None:
        # The built plan's fragments (stripe_plan's) through predict_time's own
        # terms: its prediction by construction, without the Plan object.
        return max(time_terms(paths, *stripe_flows(dem.reshape(-1), stripes), model))
    return stripe_scorer(paths, stripes, model, key=key)(dem)


def stripe_scorer(
    paths: PathSet, stripes: tuple[np.ndarray, np.ndarray], model: SimModel | None = None,
    *, key: str,
) -> Callable[[np.ndarray], float]:
    """``stripe_time(paths, demand, stripes, model, key=key)`` as a function of ``demand``
    alone (``int64[N, N]``, C-contiguous), its tables looked up once: for a caller
    that scores many demands on one path set (the default policy keeps it there)."""
    m = default_model() if model is None else model
    if m.message_fill:  # the fill depends on every fragment's bottleneck: build them
        return lambda dem: max(time_terms(paths, *stripe_flows(dem.reshape(-1), stripes), m))
    fac = factored(paths, stripes, key, model)
    if fac is not None:  # fac: every argument of the kernel but the demand
        fac = _kernel_args(paths, ("timemodel.factored", key, _model_key(model)),
                           lambda: fac)

        def links_s(dem: np.ndarray) -> float:
            _, tailed_s, flows_s = factored_terms(dem, *fac)
            return max(tailed_s, flows_s)
    else:
        ptr, pid = stripes
        g, lptr, lfrag, tail_max = paths.derived(
            ("timemodel.stripes", key, _model_key(model)),
            lambda: _link_tail_max(*_gather(path_costs(paths, m), pid)))

        def links_s(dem: np.ndarray) -> float:
            return max(_stripe_terms_by_link(
                dem.reshape(-1), ptr, g.rate_cap_Bps, g.start_s, g.latency_s,
                g.stage_s_per_byte, g.capacity_Bps, lptr, lfrag, tail_max, g.setup_s,
                float(g.chunk_bytes)))
    if m.round_s <= 0:
        return links_s
    # The rounds need the fragments: built only where they cost (round_s > 0).
    return lambda dem: links_s(dem) + round_cost_s(
        paths, *stripe_flows(dem.reshape(-1), stripes), m)


def _link_tail_max(
    g: PathCosts, lptr: np.ndarray, lfrag: np.ndarray
) -> tuple[PathCosts, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_gather`'s tables and, per effective link, the largest fill a stripe
    crossing it can have (a whole chunk): a bound of the link's tail."""
    full = g.latency_s + g.chunk_bytes * g.stage_s_per_byte
    out = np.zeros(lptr.size - 1)
    links = np.repeat(np.arange(lptr.size - 1), np.diff(lptr))
    np.maximum.at(out, links, full[lfrag])
    out.setflags(write=False)
    return g, lptr, lfrag, out


def _model_key(model: SimModel | None) -> object:
    """Cache key of a model: the default one by name (hashing a SimModel's fields
    costs about a microsecond, several times per 8-GPU plan)."""
    if model is None or model is default_model():
        return "default"
    return "ideal" if model is ideal_model() else model


def factored(
    paths: PathSet, stripes: tuple[np.ndarray, np.ndarray], key: str,
    model: SimModel | None = None,
) -> tuple | None:
    """The node-factored scoring tables of ``stripes`` (owner ``key``), kept with
    ``paths``; None where the stripes do not factor (:func:`_factor`)."""
    m = default_model() if model is None else model
    return paths.derived(("timemodel.factored", key, _model_key(model)),
                         lambda: _factor(paths, path_costs(paths, m), *stripes, m))


def _link_owner(fabric: Fabric, model: SimModel) -> np.ndarray:
    """The node each effective link belongs to (-1: none, e.g. a switch-to-switch link).

    A real link belongs to its source vertex's node, else to its
    destination's; a virtual link to the node of the real links it limits.
    """
    virt_a, virt_b, cap = effective_links(fabric, model)
    node = np.asarray(fabric.vertex_node, dtype=np.int64)
    real = np.where(node[fabric.link_src] >= 0, node[fabric.link_src], node[fabric.link_dst])
    owner = np.full(cap.size, -1, dtype=np.int64)
    owner[: fabric.num_links] = real
    for virt in (virt_a, virt_b):
        has = virt >= 0
        owner[virt[has]] = real[has]
    return owner


def _factor(
    paths: PathSet, pc: PathCosts, ptr: np.ndarray, pid: np.ndarray, model: SimModel
) -> tuple | None:
    """Node-factored tables of stripes ``(ptr, pid)`` (``_stripe_kernel``), None if they
    do not factor: unequal nodes, ranks not numbered node by node, a stripe through a
    link of neither end node, or stripe classes whose paths differ across node pairs."""
    fab = paths.fabric
    n, g = fab.num_ranks, int(fab.gpus_per_node or 0)
    rank_node = np.asarray(fab.vertex_node, dtype=np.int64)[fab.rank_vertex]
    if g < 1 or n % g or not np.array_equal(rank_node, np.arange(n) // g) or n // g < 2:
        return None
    inter = (np.arange(n)[:, None] // g != np.arange(n)[None, :] // g).reshape(-1)
    kmax = max(int(np.diff(ptr)[inter].max(initial=0)), 1)
    h = pc.links.shape[1]
    kpair = np.full((g, g), -1, dtype=np.int64)
    side_a = np.full((n, g, kmax, h), -2, dtype=np.int64)
    side_b = np.full((g, n, kmax, h), -2, dtype=np.int64)
    params = np.full((g, g, kmax, 4), np.nan)
    ok = factor_tables(g, ptr, pid, pc.links, pc.length, _link_owner(fab, model),
                       pc.rate_cap_Bps, pc.start_s, pc.latency_s, pc.stage_s_per_byte,
                       kpair, side_a, side_b, params)
    if not ok:
        return None
    iptr, ilinks, ipar = intra_tables(g, ptr, pid, pc.links, pc.rate_cap_Bps, pc.start_s,
                                      pc.latency_s, pc.stage_s_per_byte)
    # Link rows cut to their longest: the scoring pass reads whole rows (a
    # side has 4-7 links of 14 at 1024 GPUs; 0.1 ms of a 1024-GPU score).
    side_a, side_b, ilinks = (_trim_links(a) for a in (side_a, side_b, ilinks))
    intra = (iptr, ilinks, ipar)
    for a in (kpair, side_a, side_b, params, *intra):
        a.setflags(write=False)
    return (g, kpair, side_a, side_b, params, *intra, pc.capacity_Bps, pc.setup_s,
            float(pc.chunk_bytes))


def _trim_links(rows: np.ndarray) -> np.ndarray:
    """``rows`` (links along the last axis, -1 padded at the end) without the
    columns that are padding in every row (at least one kept)."""
    width = max(int((rows >= 0).sum(axis=-1).max(initial=0)), 1)
    return np.ascontiguousarray(rows[..., :width])


def _gather(pc: PathCosts, pid: np.ndarray) -> tuple[PathCosts, np.ndarray, np.ndarray]:
    """``pc`` restricted to paths ``pid`` in that order, and a CSR of each link's stripes."""
    arrays = [np.ascontiguousarray(a[pid]) for a in (pc.links, pc.length)]
    arrays.append(pc.capacity_Bps)
    arrays += [np.ascontiguousarray(a[pid]) for a in (pc.rate_cap_Bps, pc.relays, pc.start_s,
                                                      pc.latency_s, pc.stage_s_per_byte)]
    rows = arrays[0]
    stripe, hop = np.nonzero(rows >= 0)
    link = rows[stripe, hop]
    order = np.argsort(link, kind="stable")
    small = np.int32 if pid.size < 2**31 else np.int64
    lfrag = stripe[order].astype(small)
    lptr = np.concatenate([[0], np.cumsum(np.bincount(link, minlength=pc.capacity_Bps.size))])
    for a in [*arrays, lptr, lfrag]:
        a.setflags(write=False)
    return PathCosts(*arrays, setup_s=pc.setup_s, chunk_bytes=pc.chunk_bytes), lptr, lfrag


def tail_slack_s(paths: PathSet, model: SimModel | None = None) -> float:
    """The most a link's tail can add to a plan's links term: the largest fill of one chunk.

    :func:`lower_bound_s` is a cut bound without tails (a plan of small
    fragments has small fills), so a plan's prediction can exceed it by up
    to this much and still be unbeatable but for its tails; the default
    policy treats a candidate within it of the bound as having reached it.
    """
    m = default_model() if model is None else model

    def build() -> float:
        pc = path_costs(paths, m)
        fill = pc.latency_s + pc.chunk_bytes * pc.stage_s_per_byte
        return float(fill.max(initial=0.0))

    return paths.derived(("timemodel.tail_slack", m), build)


def executor_rounds(
    frag_bytes: np.ndarray,
    frag_routes: np.ndarray,
    chunk_bytes: int,
    window: int,
    frag_links: np.ndarray | None = None,
) -> int:
    """Rounds the data plane's schedule runs for these fragments.

    The schedule's rule (:mod:`pathweave.plan.rounds`, which
    :mod:`pathweave.runtime.schedule` builds with): a fragment of ``b > 0``
    bytes is ``k = ceil(b / chunk_bytes)`` chunks; ``R`` entry rounds
    (:func:`~pathweave.plan.rounds.pacing`); hop ``h`` of chunk ``c`` moves in
    round ``entry_round(c) + h``, 0 for a direct fragment the rounds do not
    pace (:func:`~pathweave.plan.rounds.unpaced_direct`, applied where
    ``frag_links`` is given, as the Orchestrator does). The last round is
    the last chunk's last hop: ``max_f entry_round(k_f - 1) + hops_f``
    rounds in all (0 without bytes), the schedule's ``num_rounds`` exactly
    for the same fragments.

    Parameters
    ----------
    frag_bytes
        ``int[F]``: each fragment's bytes.
    frag_routes
        ``int[F, K]``: each fragment's route as ranks, padded with -1
        (:func:`~pathweave.plan.rounds.route_ranks`); its hops are its ranks less one.
    chunk_bytes, window
        The executor's chunk and window.
    frag_links
        ``int[F, K']``: each fragment's fabric links, padded with -1; ``None``:
        every fragment is paced.

    Examples
    --------
    >>> import numpy as np
    >>> executor_rounds(np.array([10]), np.array([[0, 1]]), 4, 2)   # 3 chunks, one a round
    3
    >>> executor_rounds(np.array([4 << 20, 4 << 20]), np.array([[0, 1, -1], [0, 2, 1]]),
    ...                 1 << 20, 4)
    3
    >>> executor_rounds(np.array([10]), np.array([[0, 1]]), 4, 2, np.array([[0]]))  # unpaced
    1
    """
    b = np.asarray(frag_bytes, dtype=np.int64)
    live = b > 0
    if not live.any():
        return 0
    routes = np.asarray(frag_routes, dtype=np.int64)[live]
    k = -(-b[live] // int(chunk_bytes))
    hops = (routes >= 0).sum(axis=1) - 1
    whole = None
    if frag_links is not None:
        n = int(routes.max()) + 1
        whole = unpaced_direct(routes, np.asarray(frag_links, dtype=np.int64)[live], n)
    rounds, _ = pacing(k, window)
    return int((entry_round(k - 1, k, rounds, whole) + hops).max())


def round_cost_s(
    paths: PathSet, flow_path: np.ndarray, flow_bytes: np.ndarray, model: SimModel | None = None
) -> float:
    """``round_s * rounds``: the host cost of the executor's rounds for these fragments.

    The fragments' routes are their paths' ranks (:func:`pathweave.plan.rounds.route_ranks`:
    the source, the forwarding GPUs, the destination) and their links the
    paths' links, which the Orchestrator gives the schedule too.
    The simulator adds the same (:func:`pathweave.sim.simulate`).
    """
    m = default_model() if model is None else model
    if m.round_s <= 0:
        return 0.0
    fp = np.asarray(flow_path, dtype=np.int64)
    return m.round_s * executor_rounds(flow_bytes, route_ranks(paths)[fp], m.chunk_bytes,
                                       m.window, paths.links[fp])


def time_terms(
    paths: PathSet, flow_path: np.ndarray, flow_bytes: np.ndarray, model: SimModel | None = None
) -> tuple[float, float]:
    """``(links_s, flows_s)``: the two terms of the prediction, each with the host
    cost of the rounds (:func:`round_cost_s`; module docstring), and with
    ``model.message_fill`` the data plane's fill per fragment (:func:`message_fill_terms`)."""
    pc = path_costs(paths, model)
    fp = np.ascontiguousarray(flow_path, dtype=np.int64)
    fb = np.ascontiguousarray(flow_bytes, dtype=np.int64)
    links_s, flows_s = _terms(
        fp, fb, pc.links, pc.length,
        pc.capacity_Bps, pc.rate_cap_Bps, pc.start_s, pc.latency_s, pc.stage_s_per_byte,
        pc.setup_s, float(pc.chunk_bytes),
    )
    m = default_model() if model is None else model
    if m.message_fill:
        links_s, flows_s = message_fill_terms(pc, paths, fp, fb, m, links_s, flows_s)
    host_s = round_cost_s(paths, flow_path, flow_bytes, model)
    return float(links_s) + host_s, float(flows_s) + host_s


def message_fill_terms(
    pc: PathCosts, paths: PathSet, flow_path: np.ndarray, flow_bytes: np.ndarray,
    model: SimModel, links_s: float, flows_s: float,
) -> tuple[float, float]:
    """The two terms with the gloo data plane's fill per fragment added.

    :func:`~pathweave.plan.rounds.pipeline_fill_s` gives each fragment a
    ``before_s`` (messages over the segments ahead of its bottleneck, while
    other fragments keep the bottleneck busy) and an ``after_s`` (messages
    over the segments behind it, after its last byte crossed it). As the
    simulator does with them: a link starts when the first of its fragments
    does (``first_e``, the least ``before_s`` among them), a fragment's
    ``after_s`` is the tail of its links (it drains when they do, all
    sharing per byte), and both delay the fragment on its own::

        links:  max(links_s, setup_s + max_f (max_{e in f} first_e + load_e / c_e + after_f))
        flows:  max(flows_s, max_f start_s[p_f] + before_f + bytes_f / rate_cap[p_f] + after_f)

    Examples
    --------
    DeepEP's route for 3 MiB from GPU 5 to GPU 0: rail 1 (5 MB/s), then
    NVLink 1 -> 0 (12 MB/s); 6 chunks of 512 KiB in 3 rounds, 2 a message,
    so the last 1 MiB crosses the NVLink after the rail delivered it:

    >>> import numpy as np, pathweave as pw
    >>> from pathweave.emulate import scale_fabric
    >>> fab = scale_fabric(pw.fabric.preset("h100-2x4"), 1e-4)
    >>> D = np.zeros((8, 8), dtype=np.int64); D[5, 0] = 3 << 20
    >>> plan = pw.plan.make(fab, D, "deepep")
    >>> m = pw.sim.SimModel.ideal(chunk_bytes=1 << 19, message_fill=True)
    >>> rail_s, nvlink_s = (3 << 20) / 5e6, (1 << 20) / 12e6
    >>> round(predict_time(plan, m) - (rail_s + nvlink_s), 12)
    0.0
    """
    before, after = pipeline_fill_s(paths, flow_path, flow_bytes, model.chunk_bytes, model.window)
    live = flow_bytes > 0
    if not (before[live].any() or after[live].any()):
        return links_s, flows_s
    fp, b = flow_path[live], flow_bytes[live].astype(np.float64)
    bf, af = before[live], after[live]
    rows = pc.links[fp]
    used = rows >= 0
    at = rows[used]
    load = np.bincount(at, weights=np.broadcast_to(b[:, None], rows.shape)[used],
                       minlength=pc.capacity_Bps.size)
    # A link carries nothing before the first of its fragments starts.
    first = np.full(pc.capacity_Bps.size, np.inf)
    np.minimum.at(first, at, np.broadcast_to(bf[:, None], rows.shape)[used])
    busy = np.where(np.isfinite(first), first, 0.0) + load / pc.capacity_Bps
    drain = np.where(used, busy[np.maximum(rows, 0)], 0.0).max(axis=1)
    links_s = max(links_s, pc.setup_s + float((drain + af).max()))
    alone = pc.start_s[fp] + bf + b / pc.rate_cap_Bps[fp] + af
    return links_s, max(flows_s, float(alone.max()))


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


# ------------------------------------------------------------------ cut bound
def _cut_capacity(
    fabric: Fabric, cap: np.ndarray, virt_a: np.ndarray, virt_b: np.ndarray,
    owner: np.ndarray, ncuts: int, outward: bool,
) -> np.ndarray:
    """Effective capacity out of (``outward``) or into each cut ``owner == k``.

    The crossing links are grouped by a virtual link they load (their own
    capacity where none): a group delivers at most the smaller of its real
    links' sum and its virtual link.
    """
    a, b = owner[fabric.link_src], owner[fabric.link_dst]
    cut = a if outward else b
    links = np.flatnonzero((cut >= 0) & (a != b))
    va, vb = virt_a[links], virt_b[links]
    group = np.where(va >= 0, va, vb)
    real = cap[links]
    out = np.bincount(cut[links][group < 0], weights=real[group < 0],
                      minlength=ncuts).astype(np.float64)
    g = group >= 0
    if g.any():
        key = cut[links][g] * cap.size + group[g]
        keys, inv = np.unique(key, return_inverse=True)
        total = np.bincount(inv, weights=real[g], minlength=keys.size)
        out += np.bincount(keys // cap.size, weights=np.minimum(total, cap[keys % cap.size]),
                           minlength=ncuts)
    return out


def _cut_tables(paths: PathSet, model: SimModel, key: object = None) -> tuple[np.ndarray, ...]:
    """``(rank_node, gpu_out, gpu_in, node_out, node_in, members_ptr, members)``: cut
    capacities in B/s, and each node's ranks as a CSR."""

    def build() -> tuple[np.ndarray, ...]:
        fab = paths.fabric
        virt_a, virt_b, cap = effective_links(fab, model)
        gpu = np.full(fab.num_vertices, -1, dtype=np.int64)
        gpu[fab.rank_vertex] = np.arange(fab.num_ranks)
        node = np.asarray(fab.vertex_node, dtype=np.int64)
        nnodes = int(node.max(initial=-1)) + 1
        out = [node[fab.rank_vertex]]
        for owner, k in ((gpu, fab.num_ranks), (node, nnodes)):
            for outward in (True, False):
                out.append(_cut_capacity(fab, cap, virt_a, virt_b, owner, k, outward))
        rank_node = out[0]
        members = np.argsort(rank_node, kind="stable")
        members = members[rank_node[members] >= 0]
        counts = np.bincount(rank_node[members], minlength=nnodes)
        out += [np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), members]
        for arr in out:
            arr.setflags(write=False)
        return tuple(out)

    return paths.derived(("timemodel.cuts", model if key is None else key), build)


def cut_tables(paths: PathSet, model: SimModel | None = None) -> tuple[tuple, float]:
    """The tables of :func:`lower_bound_s` under ``model`` (kept with ``paths``) and its
    set-up time: what a kernel needs to compute the bound itself
    (:func:`pathweave.plan._mwu_kernel.route_cut`). The tables are the kernels'
    writable copies (:func:`_kernel_args`, shared with :func:`bound_scorer`): pass
    them to a kernel, never write them."""
    m = default_model() if model is None else model
    return _cut_kernel_args(paths, m, model), float(m.setup_s)


def _cut_kernel_args(paths: PathSet, m: SimModel, model: SimModel | None) -> tuple:
    """:func:`_cut_tables` as the kernels' writable copies (:func:`_kernel_args`)."""
    return _kernel_args(paths, ("timemodel.cuts", _model_key(model)),
                        lambda: _cut_tables(paths, m, _model_key(model)))


def lower_bound_s(
    paths: PathSet, demand: np.ndarray, model: SimModel | None = None, *,
    sums: tuple[np.ndarray, np.ndarray] | None = None,
) -> float:
    """A lower bound of :func:`predict_time` of *every* plan of ``demand`` over ``paths``.

    Every byte a GPU (a node) sends to another GPU (node) leaves it over the
    links crossing out of it, and every byte it receives comes in over the
    links crossing in, whatever paths carry it; so the links term is at
    least ``setup_s`` plus the largest such cut's bytes over its effective
    capacity (crossing links that share a virtual link count at most its
    capacity). The default policy uses it to skip candidates that cannot win.

    Parameters
    ----------
    paths
        The candidate paths (the bound holds for any plan over them).
    demand
        ``int64[N, N]`` bytes.
    model
        The :class:`~pathweave.sim.SimModel`; default ``SimModel()``.
    sums
        ``(rows, cols)``: ``demand``'s row and column sums where the caller
        has them (:func:`pathweave.plan.registry.demand_bytes`), saving a
        pass over the demand.

    Examples
    --------
    >>> import numpy as np, pathweave as pw
    >>> fab = pw.fabric.preset("h100-2x4")
    >>> D = pw.traffic.hotspot(8, bytes_per_rank=256 << 20, ratio=0.9)
    >>> plan = pw.plan.make(fab, D)
    >>> ps = plan.paths
    >>> lower_bound_s(ps, plan.demand) <= predict_time(plan)
    True
    """
    return bound_scorer(paths, model)(_frozen(demand), sums)


def bound_scorer(
    paths: PathSet, model: SimModel | None = None
) -> Callable[[np.ndarray, tuple[np.ndarray, np.ndarray] | None], float]:
    """``lower_bound_s(paths, demand, model, sums=sums)`` as a function of ``(demand,
    sums)`` alone (``demand``: ``int64[N, N]``, C-contiguous, read-only), its tables
    looked up once: for a caller that bounds many demands on one path set (the
    default policy keeps it there, beside :func:`stripe_scorer`'s)."""
    m = default_model() if model is None else model
    node, gout, gin, nout, nin, members_ptr, members = _cut_kernel_args(paths, m, model)
    setup_s = float(m.setup_s)

    def bound(dem: np.ndarray, sums: tuple[np.ndarray, np.ndarray] | None = None) -> float:
        if sums is None:
            worst, used = cut_bound(dem, node, members_ptr, members, gout, gin, nout, nin)
        else:
            worst, used = cut_bound_sums(dem, sums[0], sums[1], node, members_ptr, members,
                                         gout, gin, nout, nin)
        return setup_s + float(worst) if used else 0.0

    return bound
