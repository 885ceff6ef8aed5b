"""Simulate a static :class:`~pathweave.plan.Plan` on a fabric: :func:`simulate`.

Every fragment of the plan is a flow on its path. Besides the fabric's
links, flows cross a few shared *virtual* links that stand for limits the
graph does not show (see :class:`~pathweave.sim.SimModel`): one per GPU for
its NVLink injection, and one per node and direction for its NICs'
aggregate. Forwarding GPUs cap a flow's rate (``relay_efficiency``).

The data plane's host cost of its rounds (``round_s`` times the rounds its
schedule runs for the plan, :func:`pathweave.plan.timemodel.round_cost_s`)
is serial with the transfers: it delays every fragment's end alike, since
the schedule spreads every fragment over all its rounds. So the makespan
grows by exactly that much, as the time model's prediction does.
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from pathweave.errors import PlanError
from pathweave.fabric import Fabric, VertexKind
from pathweave.fabric.presets import resolve
from pathweave.plan import Plan
from pathweave.plan.rounds import pipeline_fill_s
from pathweave.plan.timemodel import effective_links, link_latency_s, round_cost_s
from pathweave.sim._engine import run_flows
from pathweave.sim._maxmin import FlowNet
from pathweave.sim.model import SimModel, SimResult

__all__ = ["FlowSet", "build_flows", "simulate"]

_GPU = int(VertexKind.GPU)
_NIC = int(VertexKind.NIC)


@njit(cache=True)
def _flow_arrays(
    path_links,
    path_len,
    flow_path,
    flow_bytes,
    link_src,
    vkind,
    cap_eff,
    latency,
    virt_a,
    virt_b,
    relay_eff,
    chunk_bytes,
):
    # Per flow: its links plus the virtual links they imply (CSR), its rate
    # ceiling from forwarding GPUs, its number of forwarding GPUs, and its
    # fill time (hop latencies + one chunk per store-and-forward stage).
    nflows = flow_path.shape[0]
    ptr = np.zeros(nflows + 1, dtype=np.int64)
    for i in range(nflows):
        p = flow_path[i]
        n = 0
        for h in range(path_len[p]):
            e = path_links[p, h]
            n += 1
            if virt_a[e] >= 0:
                n += 1
            if virt_b[e] >= 0:
                n += 1
        ptr[i + 1] = ptr[i] + n
    links = np.empty(ptr[nflows], dtype=np.int64)
    fcap = np.full(nflows, np.inf)
    relays = np.zeros(nflows, dtype=np.int64)
    fill_s = np.zeros(nflows, dtype=np.float64)
    for i in range(nflows):
        p = flow_path[i]
        k = ptr[i]
        chunk = min(chunk_bytes, flow_bytes[i])
        for h in range(path_len[p]):
            e = path_links[p, h]
            links[k] = e
            k += 1
            if virt_a[e] >= 0:
                links[k] = virt_a[e]
                k += 1
            if virt_b[e] >= 0:
                links[k] = virt_b[e]
                k += 1
            fill_s[i] += latency[e]
            if h == 0:
                continue
            v = vkind[link_src[e]]
            if v == 0 or v == 1:  # a GPU or NIC inside the path stores and forwards
                fill_s[i] += chunk / cap_eff[e]
            if v == 0:
                relays[i] += 1
                if relay_eff < 1.0:
                    c = relay_eff * min(cap_eff[path_links[p, h - 1]], cap_eff[e])
                    if c < fcap[i]:
                        fcap[i] = c
    return ptr, links, fcap, relays, fill_s


class FlowSet:
    """The flows of a plan as the engine sees them (arrays; built by :func:`build_flows`).

    Attributes
    ----------
    index
        ``int64[M]``: plan fragment of each flow (fragments with bytes only).
    flow_ptr, flow_links
        Links of flow ``m``: ``flow_links[flow_ptr[m]:flow_ptr[m + 1]]``;
        ids ``>= num_links`` are virtual links.
    capacity_Bps
        Effective capacity of every real and virtual link.
    flow_cap_Bps
        Rate ceiling of each flow (forwarding GPUs), ``inf`` for none.
    bytes, release_s, fill_s
        Bytes, when each flow starts moving data, and its pipeline fill time.
    """

    __slots__ = (
        "bytes",
        "capacity_Bps",
        "fill_s",
        "flow_cap_Bps",
        "flow_links",
        "flow_ptr",
        "index",
        "num_links",
        "release_s",
    )

    def __init__(self, **kw: np.ndarray | int) -> None:
        for k, v in kw.items():
            setattr(self, k, v)


def _check_fabric(fabric: Fabric, plan: Plan) -> None:
    pf = plan.fabric
    if fabric is pf:
        return
    if (
        fabric.vertex_names != pf.vertex_names
        or fabric.num_links != pf.num_links
        or not np.array_equal(fabric.link_src, pf.link_src)
        or not np.array_equal(fabric.link_dst, pf.link_dst)
    ):
        raise PlanError(
            f"plan was made for fabric {pf.name!r} ({pf.num_links} links); fabric "
            f"{fabric.name!r} ({fabric.num_links} links) has other links. Only capacities "
            "and latencies may differ (e.g. with_links(factors))"
        )


def build_flows(fabric: Fabric, plan: Plan, model: SimModel) -> FlowSet:
    """The engine's view of ``plan`` on ``fabric`` under ``model``."""
    _check_fabric(fabric, plan)
    ps = plan.paths
    sel = np.flatnonzero(plan.flow_bytes > 0)
    fpath = np.ascontiguousarray(plan.flow_path[sel], dtype=np.int64)
    fbytes = np.ascontiguousarray(plan.flow_bytes[sel], dtype=np.int64)
    # The effective links are the time model's (pathweave.plan.timemodel):
    # one definition for the planner's prediction and the simulator.
    virt_a, virt_b, cap_all = effective_links(fabric, model)
    cap_eff = np.ascontiguousarray(cap_all[: fabric.num_links])
    vcap = cap_all[fabric.num_links :]
    latency = link_latency_s(fabric, model)
    ptr, links, fcap, relays, fill_s = _flow_arrays(
        ps.links,
        ps.length,
        fpath,
        fbytes,
        np.ascontiguousarray(fabric.link_src, dtype=np.int64),
        np.ascontiguousarray(fabric.vertex_kind, dtype=np.int64),
        cap_eff,
        latency,
        virt_a,
        virt_b,
        float(model.relay_efficiency),
        0 if model.message_fill else int(model.chunk_bytes),  # else per fragment (simulate)
    )
    release = model.setup_s + model.relay_setup_s * relays.astype(np.float64)
    return FlowSet(
        index=sel,
        flow_ptr=ptr,
        flow_links=links,
        capacity_Bps=np.concatenate([cap_eff, vcap]),
        flow_cap_Bps=fcap,
        bytes=fbytes.astype(np.float64),
        release_s=release,
        fill_s=fill_s,
        num_links=fabric.num_links,
    )


def _start_of_flows(plan: Plan, fs: FlowSet, start_s: np.ndarray) -> np.ndarray:
    """Each engine flow's start offset: its source rank's ``start_s``."""
    n = plan.paths.num_ranks
    start = np.asarray(start_s, dtype=np.float64)
    if start.shape != (n,) or not np.all(np.isfinite(start)) or (start < 0).any():
        raise PlanError(f"start_s must be {n} finite times >= 0 (one per rank), got shape "
                        f"{start.shape}" + (f", min {start.min():g}" if start.size else ""))
    return start[plan.paths.src[plan.flow_path[fs.index]]]


def _fill_of_flows(plan: Plan, fs: FlowSet,
                   fill_s: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Each engine flow's ``(before_s, after_s)`` from per-fragment arrays."""
    nf = plan.flow_path.size
    out = []
    for name, a in zip(("before_s", "after_s"), fill_s, strict=True):
        a = np.asarray(a, dtype=np.float64)
        if a.shape != (nf,) or not np.all(np.isfinite(a)) or (a < 0).any():
            raise PlanError(f"fill_s {name} must be {nf} finite times >= 0 (one per plan "
                            f"fragment), got shape {a.shape}")
        out.append(a[fs.index])
    return out[0], out[1]


def simulate(
    fabric: Fabric | str | Plan, plan: Plan | None = None, model: SimModel | None = None, *,
    start_s: np.ndarray | None = None,
    fill_s: tuple[np.ndarray, np.ndarray] | None = None,
) -> SimResult:
    """Simulate ``plan`` on ``fabric``: completion times and link utilisation.

    Parameters
    ----------
    fabric
        The fabric to run on: the plan's own, or a copy with other
        capacities or latencies (e.g. ``fabric.with_links({...: 0.5})``, a
        degraded link the plan did not know about). A preset spec works too.
        A plan in its place, ``simulate(plan[, model])``, runs on its own
        fabric.
    plan
        Any policy's :class:`~pathweave.plan.Plan`.
    model
        Overheads and efficiencies; default :class:`SimModel()` (fitted to the
        NIMBLE testbed). :meth:`SimModel.ideal` is the pure fluid model.
    start_s
        ``float64[num_ranks]``, optional: when each source rank starts
        sending, in seconds (concurrent groups that start apart,
        :mod:`pathweave.plan.groups`); default all at 0. Finish times and
        the makespan count from 0.
    fill_s
        ``(before_s, after_s)``, optional: ``float64[F]`` each, per plan
        fragment (``plan.flow_path`` order), a pipeline fill the caller
        worked out per fragment, beyond the model's (with
        ``model.message_fill`` the model's is the data plane's per fragment,
        :func:`pathweave.plan.rounds.pipeline_fill_s`): ``before_s`` delays the
        fragment's first byte (others keep its links busy meanwhile),
        ``after_s`` is added after its last byte crossed its links (the
        emulator's prediction of the gloo executor,
        :func:`pathweave.emulate.predict`).

    Returns
    -------
    SimResult

    Examples
    --------
    One 120 MB transfer over a 120 GB/s NVLink takes 1 ms in the ideal
    fluid model; the default model adds set-up and latency:

    >>> import numpy as np, pathweave as pw
    >>> fab = pw.fabric.preset("h100-2x4")
    >>> D = np.zeros((8, 8)); D[0, 1] = 120e6
    >>> plan = pw.plan.make(fab, D, policy="static")
    >>> res = pw.sim.simulate(fab, plan, pw.sim.SimModel.ideal())
    >>> round(res.makespan_s * 1e3, 9)
    1.0
    >>> round(pw.sim.simulate(plan).makespan_s * 1e6, 1)   # + 20 us set-up + 1 us
    1021.0
    """
    if isinstance(fabric, Plan):  # simulate(plan[, model]): on the plan's own fabric
        if isinstance(plan, SimModel) and model is None:
            plan, model = None, plan
        if plan is not None:
            raise TypeError(f"simulate(fabric, plan, model) got a Plan and then a "
                            f"{type(plan).__name__}; pass simulate(plan[, model]) or "
                            f"simulate(fabric, plan[, model])")
        fabric, plan = fabric.fabric, fabric
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a pathweave.plan.Plan, got {type(plan).__name__}")
    fab = resolve(fabric)
    if model is None:
        model = SimModel()
    elif not isinstance(model, SimModel):
        raise TypeError(f"model must be a SimModel or None, got {type(model).__name__}")
    t0 = time.perf_counter()
    fs = build_flows(fab, plan, model)
    if start_s is not None:
        fs.release_s = fs.release_s + _start_of_flows(plan, fs, start_s)
    after = 0.0
    fills = [] if fill_s is None else [_fill_of_flows(plan, fs, fill_s)]
    if model.message_fill:
        fills.append(tuple(a[fs.index] for a in pipeline_fill_s(
            plan.paths, plan.flow_path, plan.flow_bytes, model.chunk_bytes, model.window)))
    for before, aft in fills:
        fs.release_s = fs.release_s + before
        after = after + aft
    # Weighted by bytes: the executor shares a link in proportion to them.
    net = FlowNet(fs.flow_ptr, fs.flow_links, fs.capacity_Bps, fs.flow_cap_Bps, fs.bytes)
    end_s, seg_t, seg_rate, events = run_flows(net, fs.bytes, fs.release_s,
                                               float(model.batch_rtol), int(fab.num_links),
                                               int(model.max_segments))
    if np.isnan(end_s).any():
        i = int(np.flatnonzero(np.isnan(end_s))[0])
        raise PlanError(f"fragment {int(fs.index[i])} never finished (no capacity on its path)")
    finish = (end_s + fs.fill_s + after
              + round_cost_s(plan.paths, plan.flow_path, plan.flow_bytes, model))
    nfrag = plan.flow_path.size
    flow_finish = np.full(nfrag, np.nan)
    flow_finish[fs.index] = finish
    n = plan.paths.num_ranks
    # fmax skips the NaN of pairs without a fragment: no N x N mask pass (537
    # MB at 8192 GPUs is the largest array a simulation returns).
    pair_finish = np.full(n * n, np.nan)
    if fs.index.size:
        fpath = plan.flow_path[fs.index]
        pair = plan.paths.src[fpath].astype(np.int64) * n + plan.paths.dst[fpath]
        np.fmax.at(pair_finish, pair, finish)
    makespan = float(finish.max()) if finish.size else 0.0

    times = seg_t
    tail = makespan > (times[-1] if times.size else 0.0)
    # The fill tail and trailing latency get a row of their own: the links are idle by then.
    util = np.zeros((seg_rate.shape[0] + tail, fab.num_links), dtype=np.float32)
    np.divide(seg_rate, fab.capacity_Bps[None, :], out=util[: seg_rate.shape[0]],
              casting="same_kind")
    if tail:
        times = np.append(times if times.size else [0.0], makespan)
    total = int(plan.flow_bytes.sum())
    arrays = {
        "pair_finish_s": pair_finish.reshape(n, n),
        "flow_finish_s": flow_finish,
        "link_bytes": np.asarray(plan.link_load_bytes, dtype=np.float64).copy(),
        "times_s": np.asarray(times, dtype=np.float64),
        "link_util": util,
    }
    for a in arrays.values():
        a.setflags(write=False)  # a result is a record, like the Fabric's arrays
    return SimResult(
        makespan_s=makespan,
        **arrays,
        achieved_Bps=total / makespan if makespan > 0 else 0.0,
        total_bytes=total,
        policy=plan.policy,
        model=model,
        events=int(events),
        sim_s=time.perf_counter() - t0,
    )
