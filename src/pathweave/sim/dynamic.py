"""Dynamic flow-level simulation: flows arrive over time and policies react.

:func:`run_dynamic` plays a :class:`~pathweave.traffic.trace.FlowTrace` on a
fabric in fixed epochs of ``epoch_s`` seconds, with link failures,
degradations and background traffic as timed events, and lets a dynamic
policy (:mod:`pathweave.sim.policies`) route and re-route the flows.

The model
---------
Flows and subflows. A flow goes over one path or is split over several (a
*subflow* per path, each with its share of the bytes). A policy's
:class:`~pathweave.sim.policies.PathChoice` re-splits a flow's remaining
bytes over new paths, optionally after a pause.

Queues (:mod:`pathweave.sim._queue`). Every directed link ``e`` has a queue
``q_e`` in bytes. Over an epoch it receives what the subflows crossing it
sent plus its background traffic and serves up to ``capacity * epoch_s``:
a queue fed above capacity grows at the excess rate; otherwise it drains at
capacity minus the arrival rate. A link that cannot serve what it receives
shapes the subflows crossing it: downstream links see its output, shared in
proportion to what each subflow brought, so a standing queue forms only at
the bottleneck (:func:`pathweave.sim._queue.propagate`). Bytes cross all
links of their path within the epoch they are sent in (the propagation
latency enters the delays below, not the byte accounting). The one-way
delay of a path is its links' latencies plus ``sum q_e / c_e``; its RTT
adds the same latencies again for the ACKs, which we take to see no queue::

    rtt(path) = 2 * sum(latency_e) + sum(q_e / c_e)

Congestion control (how senders set their rate). Once per epoch, at its
start, every sender that has had feedback takes its max-min fair share
(:func:`pathweave.sim.maxmin_rates`) of an *effective* capacity that steers
each queue toward a small standing queue ``K = queue_target_bytes``::

    c_eff = max(0.01 * c_e, c_e - background_e + (K - q_e) / tau)
    tau = drain_epochs * epoch_s

This abstracts a well-tuned DCQCN/Swift: a bottleneck runs full with about
``K`` bytes queued (the marking threshold), an excess queue drains within a
few epochs, an idle link keeps none. Because ``K`` is in bytes, a slow link's
standing queue costs more time (``K / c``): a 10x slower path shows a
clearly larger RTT, which is the signal Hopper probes for. The CC reacts one
epoch late: a new flow starts at line rate (RDMA starts at line rate: the
capacity of its path's first network link, times its share) and a moved
flow keeps its previous rate for its first epoch on the new path; both can
overshoot and build a queue that the next epoch's rates drain.

Within an epoch a subflow sends at its rate from ``max(epoch start, ready
time)`` until its bytes run out, so arrivals and finishes fall between
epoch boundaries. A flow's completion time (FCT) is from its arrival to the
time its last byte was sent plus the one-way delay that byte sees (each
queue on its path taken at that moment, growing at the epoch's starting
rates). Events (link changes, background) and policy decisions take effect
at epoch boundaries; a flow arriving during an epoch is placed at the
boundary before it and starts sending at its arrival time.

Out-of-order exposure (bytes that can arrive before bytes the same flow sent
earlier). When a flow moves from paths with one-way delay ``d_old`` (the
largest of them) to a path with ``d_new`` at time ``t`` after a pause ``w``,
what it sends on the new path before ``t + d_old - d_new`` overtakes the
tail of the old path: exposure is the bytes sent in that window (none if
``w >= d_old - d_new``, which is what Hopper's delay aims for). A flow that
sends on several paths at once (spray, nimble-online) exposes, each epoch,
the bytes it sends on paths faster than its slowest path.

A failed link (capacity factor 0) drops its queue (``dropped_bytes``); the
flows crossing it send those bytes again, shared by their rates
(``resent_bytes``), and every flow on a path through it is handed to the
policy's ``assign`` to be placed again. A flow whose pair has no alive
path waits until one comes back.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pathweave import _check
from pathweave.errors import FabricError, PlanError
from pathweave.fabric import Fabric, LinkKind, PathSet, candidate_paths, resolve
from pathweave.sim._maxmin import maxmin_into
from pathweave.sim._queue import link_in_bytes, path_sums, propagate, queue_step
from pathweave.sim.policies import (
    DynamicPolicy,
    Observation,
    PathChoice,
    PolicyContext,
    make_policy,
)
from pathweave.traffic.trace import FlowTrace

__all__ = ["BackgroundEvent", "DynamicResult", "LinkEvent", "run_dynamic"]

LinkKey = int | tuple[str, str]

#: Effective capacity never drops below this share of a link's capacity, so a
#: sender on a link with a long queue still crawls instead of stopping.
MIN_RATE_SHARE = 0.01
#: Two one-way delays closer than this count as equal (no reordering).
OOO_TOLERANCE_S = 1e-9


@dataclass(frozen=True)
class LinkEvent:
    """At ``time_s`` set the capacity of ``links`` to ``factor`` x the fabric's.

    ``factor=0`` fails them (queues dropped, flows re-placed); ``1`` restores
    them. Links are ids or ``(src, dst)`` vertex names; :meth:`cable` gives
    both directions.

    Examples
    --------
    >>> LinkEvent.cable(1e-3, "leaf0", "spine0")
    LinkEvent(time_s=0.001, links=(('leaf0', 'spine0'), ('spine0', 'leaf0')), factor=0.0)
    """

    time_s: float
    links: tuple[LinkKey, ...]
    factor: float = 0.0

    @classmethod
    def cable(cls, time_s: float, a: str, b: str, factor: float = 0.0) -> LinkEvent:
        """Both directions of the cable between vertices ``a`` and ``b``."""
        return cls(time_s, ((a, b), (b, a)), factor)


@dataclass(frozen=True)
class BackgroundEvent:
    """From ``time_s`` on, ``links`` each carry ``rate_Bps`` of background traffic.

    Background traffic does not react to congestion: it takes its rate off
    the capacity the flows share and feeds the queue when the link is full.
    ``rate_Bps=0`` stops it.
    """

    time_s: float
    links: tuple[LinkKey, ...]
    rate_Bps: float


@dataclass(frozen=True, eq=False)
class DynamicResult:
    """What a dynamic run measured. Flow arrays are indexed by flow id.

    Attributes
    ----------
    policy, fabric_name
        The policy and fabric of the run.
    start_s, size_bytes
        Arrival time and bytes of each flow (from the trace).
    finish_s, fct_s : float64[F]
        Completion time and FCT of each flow (NaN if it did not finish).
    ideal_fct_s : float64[F]
        FCT alone on an idle fabric on its best path: bytes / line rate +
        one-way latency. ``fct_s / ideal_fct_s`` is the slowdown.
    sent_bytes : float64[F]
        Bytes each flow sent: ``size_bytes + resent_bytes`` for a finished flow.
    resent_bytes : float64[F]
        Bytes the flow sent again because a failed link dropped them.
    switches : int64[F]
        Times a policy moved or re-split the flow (placements after a failure
        not included: they are in ``failovers``).
    failovers : int64[F]
        Times the flow was placed again because its path died.
    ooo_bytes : float64[F]
        Out-of-order exposure (see the module docstring).
    first_path : int64[F]
        First path id the flow was placed on (its lowest, if split).
    link_bytes : float64[L]
        Bytes each link carried (served).
    link_utilisation : float64[L]
        ``link_bytes`` over the capacity-time the link offered.
    link_queue_max_bytes, dropped_bytes : float64[L]
        Largest queue and bytes dropped by failures, per link.
    link_in_bytes, link_queue_bytes : float64[L]
        Bytes fed to each link (flows and background) and its queue at the end.
    epochs, end_s, wall_s
        Epochs simulated, simulated time at the end, wall time of the run.
    info
        The policy's counters (probes, re-plans, ...) and ``stalled_flows``:
        flows that had to wait for an alive path.
    """

    policy: str
    fabric_name: str
    start_s: np.ndarray
    size_bytes: np.ndarray
    finish_s: np.ndarray
    fct_s: np.ndarray
    ideal_fct_s: np.ndarray
    sent_bytes: np.ndarray
    resent_bytes: np.ndarray
    switches: np.ndarray
    failovers: np.ndarray
    ooo_bytes: np.ndarray
    first_path: np.ndarray
    link_bytes: np.ndarray
    link_utilisation: np.ndarray
    link_queue_max_bytes: np.ndarray
    dropped_bytes: np.ndarray
    link_in_bytes: np.ndarray
    link_queue_bytes: np.ndarray
    network_links: np.ndarray
    epochs: int
    end_s: float
    wall_s: float
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_flows(self) -> int:
        return int(self.fct_s.size)

    @property
    def finished(self) -> int:
        """Flows that completed."""
        return int(np.count_nonzero(~np.isnan(self.fct_s)))

    @property
    def unfinished(self) -> int:
        return self.num_flows - self.finished

    @property
    def avg_fct_s(self) -> float:
        """Mean FCT over finished flows (NaN if none)."""
        f = self.fct_s[~np.isnan(self.fct_s)]
        return float(f.mean()) if f.size else math.nan

    @property
    def p99_fct_s(self) -> float:
        """99th percentile FCT over finished flows (NaN if none)."""
        f = self.fct_s[~np.isnan(self.fct_s)]
        return float(np.percentile(f, 99)) if f.size else math.nan

    @property
    def slowdown(self) -> np.ndarray:
        """``fct_s / ideal_fct_s`` per flow."""
        return self.fct_s / self.ideal_fct_s

    @property
    def ooo_flows(self) -> int:
        """Flows with any out-of-order exposure."""
        return int(np.count_nonzero(self.ooo_bytes > 0))

    def link_summary(self) -> dict[str, float]:
        """Mean and max utilisation over network links, and the largest queue."""
        u = self.link_utilisation[self.network_links]
        return {
            "net_util_mean": float(u.mean()) if u.size else 0.0,
            "net_util_max": float(u.max()) if u.size else 0.0,
            "queue_max_bytes": float(self.link_queue_max_bytes.max(initial=0.0)),
            "dropped_bytes": float(self.dropped_bytes.sum()),
        }

    def summary(self) -> dict[str, Any]:
        """The headline numbers, for tables."""
        return {
            "policy": self.policy,
            "flows": self.num_flows,
            "finished": self.finished,
            "avg_fct_s": self.avg_fct_s,
            "p99_fct_s": self.p99_fct_s,
            "switches": int(self.switches.sum()),
            "ooo_bytes": float(self.ooo_bytes.sum()),
            "ooo_flows": self.ooo_flows,
            **self.link_summary(),
            "epochs": self.epochs,
            "wall_s": self.wall_s,
        }

    def __repr__(self) -> str:
        return (
            f"DynamicResult(policy={self.policy!r}, flows={self.num_flows}, "
            f"finished={self.finished}, avg_fct_s={self.avg_fct_s:.4g}, "
            f"p99_fct_s={self.p99_fct_s:.4g})"
        )


# ------------------------------------------------------------------ subflows
class _Subflows:
    """Running subflows as parallel arrays, kept sorted by flow id."""

    FIELDS = (
        ("flow", np.int64),
        ("path", np.int64),
        ("rem", np.float64),  # bytes left
        ("ready", np.float64),  # sends from this time on (arrival, or end of a pause)
        ("rate", np.float64),  # last sending rate (carried into a fresh epoch)
        ("fresh", np.bool_),  # no CC feedback yet: sends at `rate` instead of its share
        ("ooo_until", np.float64),  # bytes sent before this time overtake older bytes
    )

    def __init__(self) -> None:
        for name, dt in self.FIELDS:
            setattr(self, name, np.zeros(0, dtype=dt))

    def __len__(self) -> int:
        return int(self.flow.size)

    def keep(self, mask: np.ndarray) -> None:
        for name, _ in self.FIELDS:
            setattr(self, name, getattr(self, name)[mask])

    def add(self, **cols: np.ndarray) -> None:
        for name, dt in self.FIELDS:
            setattr(self, name, np.concatenate([getattr(self, name), np.asarray(cols[name], dt)]))

    def sort(self) -> None:
        order = np.argsort(self.flow, kind="stable")
        for name, _ in self.FIELDS:
            setattr(self, name, getattr(self, name)[order])


# ------------------------------------------------------------------ helpers
def _resolve_links(fab: Fabric, links: Iterable[LinkKey], what: str) -> np.ndarray:
    out = []
    for k in links:
        if isinstance(k, tuple):
            out.append(fab.link_id(k[0], k[1]))
        else:
            i = int(k)
            if not 0 <= i < fab.num_links:
                raise FabricError(f"{what}: link id {i} out of range [0, {fab.num_links})")
            out.append(i)
    if not out:
        raise FabricError(f"{what} names no link")
    return np.array(out, dtype=np.int64)


def _path_line_rate(fab: Fabric, ps: PathSet) -> np.ndarray:
    """Capacity of each path's first network link (a NIC's line rate), else its first link."""
    lk = ps.links.astype(np.int64)
    valid = lk >= 0
    safe = np.where(valid, lk, 0)
    net = valid & (fab.link_kind[safe] == int(LinkKind.NETWORK))
    col = np.where(net.any(axis=1), net.argmax(axis=1), 0)
    return fab.capacity_Bps[safe[np.arange(lk.shape[0]), col]]


# ------------------------------------------------------------------ the run
def run_dynamic(
    fabric: Fabric | str,
    trace: FlowTrace,
    policy: str | type[DynamicPolicy] = "ecmp",
    *,
    events: Sequence[LinkEvent | BackgroundEvent] = (),
    paths: PathSet | None = None,
    epoch_s: float = 10e-6,
    queue_target_bytes: float = 64e3,
    drain_epochs: float = 2.0,
    max_time_s: float | None = None,
    seed: int = 0,
    **policy_options: Any,
) -> DynamicResult:
    """Play ``trace`` on ``fabric`` with the dynamic ``policy``; see the module docstring.

    Parameters
    ----------
    fabric
        A fabric or a preset spec.
    trace
        The flows (arrival, source, destination, bytes).
    policy
        A dynamic policy: ``ecmp``, ``spray``, ``flowbender``, ``hopper``,
        ``nimble-online`` (:func:`pathweave.sim.policies.policy_names`), or a
        :class:`~pathweave.sim.policies.DynamicPolicy` subclass.
    events
        :class:`LinkEvent` and :class:`BackgroundEvent` items, any order.
    paths
        Candidate paths; default ``candidate_paths(fabric)``.
    epoch_s
        Epoch length: senders and policies act once per epoch.
    queue_target_bytes
        Standing queue the congestion control keeps at a bottleneck (``K``).
    drain_epochs
        Time constant, in epochs, with which it steers queues to ``K``.
    max_time_s
        Stop at this simulated time (flows still running stay unfinished);
        default: run until every flow finishes (or none can make progress).
    seed
        Seeds the policy's random choices and the ECMP hash salt.
    **policy_options
        Options of the policy; an unknown one is an error.

    Returns
    -------
    DynamicResult

    Examples
    --------
    One 12.5 MB flow alone on a 100 Gb/s NIC takes 1 ms plus the path's
    one-way latency (6 links of 1 us):

    >>> from pathweave.fabric.builders import leaf_spine
    >>> from pathweave.traffic.trace import FlowTrace
    >>> fab = leaf_spine(leaves=2, hosts_per_leaf=1, spines=1)
    >>> r = run_dynamic(fab, FlowTrace.from_flows([(0.0, 0, 1, 12_500_000)], num_ranks=2))
    >>> round(float(r.fct_s[0]) * 1e6, 3)
    1006.0
    """
    t_wall = time.perf_counter()
    fab = resolve(fabric)
    if not isinstance(trace, FlowTrace):
        raise TypeError(f"trace must be a FlowTrace, got {type(trace).__name__}")
    if trace.num_ranks != fab.num_ranks:
        raise ValueError(
            f"trace is for {trace.num_ranks} ranks but fabric {fab.name!r} has {fab.num_ranks}"
        )
    dt = _check.real("epoch_s", epoch_s, low=0.0, low_open=True)
    K = _check.real("queue_target_bytes", queue_target_bytes, low=0.0)
    tau = _check.real("drain_epochs", drain_epochs, low=0.0, low_open=True) * dt
    t_limit = (math.inf if max_time_s is None
               else _check.real("max_time_s", max_time_s, low=0.0, low_open=True))
    _check.integer("seed", seed)
    ps = candidate_paths(fab) if paths is None else paths
    if ps.fabric is not fab:
        raise PlanError("paths were compiled for another fabric")

    # ---- events, sorted by time (stable: same-time events apply in given order)
    ev_time, ev_links, ev_kind, ev_val = [], [], [], []
    for i, ev in enumerate(events):
        if isinstance(ev, LinkEvent):
            f = float(ev.factor)
            if not (0.0 <= f <= 1.0):
                raise FabricError(f"event {i}: capacity factor {ev.factor!r} must lie in [0, 1]")
            kind, val = 0, f
        elif isinstance(ev, BackgroundEvent):
            r = float(ev.rate_Bps)
            if not (r >= 0 and math.isfinite(r)):
                raise FabricError(f"event {i}: background rate {ev.rate_Bps!r} must be >= 0")
            kind, val = 1, r
        else:
            raise TypeError(f"event {i} is a {type(ev).__name__}, not a LinkEvent/BackgroundEvent")
        if not (float(ev.time_s) >= 0 and math.isfinite(float(ev.time_s))):
            raise FabricError(f"event {i}: time_s={ev.time_s!r} must be >= 0")
        ev_time.append(float(ev.time_s))
        ev_links.append(_resolve_links(fab, ev.links, f"event {i}"))
        ev_kind.append(kind)
        ev_val.append(val)
    ev_order = sorted(range(len(ev_time)), key=lambda k: ev_time[k])

    # ---- static tables
    nl = fab.num_links
    links2d = ps.links
    plen = ps.length
    cap0 = fab.capacity_Bps.astype(np.float64)
    ctx = PolicyContext.build(fab, ps, trace, seed=int(seed), epoch_s=dt)
    base_rtt = ctx.base_rtt_s
    base_owd = 0.5 * base_rtt
    line_rate = _path_line_rate(fab, ps)
    # ideal FCT: alone, on the pair's fastest path (line rate and latency)
    pair_of = trace.src * ps.num_ranks + trace.dst
    best_time = np.full(len(trace), np.inf)
    for k, p in enumerate(pair_of.tolist()):
        lo, hi = int(ps.pair_ptr[p]), int(ps.pair_ptr[p + 1])
        best_time[k] = np.min(trace.size_bytes[k] / line_rate[lo:hi] + base_owd[lo:hi])

    # ---- state
    F = len(trace)
    factor = np.ones(nl)
    cap = cap0.copy()
    bg = np.zeros(nl)
    queue = np.zeros(nl)
    path_alive = np.ones(ps.num_paths, dtype=bool)
    link_load = np.zeros(nl)  # measured over the last epoch, B/s
    subs = _Subflows()
    sent = np.zeros(F)
    resent = np.zeros(F)  # bytes sent again after a failure dropped them
    last_send = np.full(F, -np.inf)
    last_owd = np.zeros(F)
    finish = np.full(F, np.nan)
    fct = np.full(F, np.nan)
    switches = np.zeros(F, dtype=np.int64)
    failovers = np.zeros(F, dtype=np.int64)
    ooo = np.zeros(F)
    first_path = np.full(F, -1, dtype=np.int64)
    stalled = np.zeros(F, dtype=bool)  # had to wait for an alive path
    acc_in = np.zeros(nl)
    acc_out = np.zeros(nl)
    acc_captime = np.zeros(nl)
    qmax = np.zeros(nl)
    dropped = np.zeros(nl)

    pol: DynamicPolicy = make_policy(policy, ctx, **policy_options)
    policy_name = pol.name or type(pol).__name__

    def observe(t: float, epoch: int) -> Observation:
        qs = np.zeros(nl)
        up = cap > 0
        qs[up] = queue[up] / cap[up]
        return Observation(
            time_s=t,
            epoch=epoch,
            paths=ps,
            path_alive=path_alive,
            base_rtt_s=base_rtt,
            link_queue_s=qs,
            link_capacity_Bps=cap.copy(),
            link_load_Bps=link_load.copy(),
            sub_flow=subs.flow.copy(),
            sub_path=subs.path.copy(),
            sub_remaining_bytes=subs.rem.copy(),
            sub_rate_Bps=subs.rate.copy(),
            sub_pending=subs.ready > t,
        )

    def owd(pids: np.ndarray) -> np.ndarray:
        qs = np.zeros(nl)
        up = cap > 0
        qs[up] = queue[up] / cap[up]
        return base_owd[pids] + path_sums(links2d, plen, pids, qs)

    def apply(choices: list[PathChoice], t: float, kind: str, expect: np.ndarray | None) -> None:
        """Validate a policy's choices and re-split the flows they name."""
        if expect is not None:
            got = sorted(c.flow for c in choices)
            if got != sorted(expect.tolist()):
                raise PlanError(
                    f"policy {policy_name!r}: assign() must return one choice per flow "
                    f"{sorted(expect.tolist())[:8]}..., got {got[:8]}..."
                )
        if not choices:
            return
        rows_keep = np.ones(len(subs), dtype=bool)
        add: dict[str, list] = {name: [] for name, _ in _Subflows.FIELDS}
        seen: set[int] = set()
        for c in choices:
            f = int(c.flow)
            if f in seen:
                raise PlanError(
                    f"policy {policy_name!r} chose paths for flow {f} twice in one epoch"
                )
            seen.add(f)
            p = np.asarray(c.paths, dtype=np.int64)
            w = np.asarray(c.weights, dtype=np.float64)
            cands = ps.pair_paths(int(trace.src[f]), int(trace.dst[f]))
            lo, hi = cands.start, cands.stop
            if (
                p.size == 0
                or p.shape != w.shape
                or np.unique(p).size != p.size
                or np.any((p < lo) | (p >= hi))
            ):
                raise PlanError(
                    f"policy {policy_name!r}: flow {f} "
                    f"({int(trace.src[f])} -> {int(trace.dst[f])}) "
                    f"got paths {c.paths} / weights {c.weights}; need distinct candidate paths "
                    f"in [{lo}, {hi}) with one weight each"
                )
            if not path_alive[p].all():
                raise PlanError(f"policy {policy_name!r} put flow {f} on a dead path {c.paths}")
            if np.any(w < 0) or not abs(w.sum() - 1.0) < 1e-6:
                raise PlanError(
                    f"policy {policy_name!r}: flow {f} weights {c.weights} must sum to 1"
                )
            delay = float(c.delay_s)
            if not (delay >= 0 and math.isfinite(delay)):
                raise PlanError(
                    f"policy {policy_name!r}: flow {f} delay_s={c.delay_s!r} must be >= 0"
                )
            lo_i, hi_i = np.searchsorted(subs.flow, [f, f + 1])
            if lo_i == hi_i:  # new flow
                total = float(trace.size_bytes[f])
                ready = max(float(trace.start_s[f]), t + delay)
                rate = line_rate[p] * w
                ooo_until = np.full(p.size, -np.inf)
                first_path[f] = int(p.min())
            else:
                old_p = subs.path[lo_i:hi_i]
                old_rem = subs.rem[lo_i:hi_i]
                total = float(old_rem.sum())
                if kind == "move" and p.size == 1 and old_p.size == 1 and p[0] == old_p[0]:
                    continue  # the same single path: nothing to do
                rows_keep[lo_i:hi_i] = False
                ready = max(float(subs.ready[lo_i:hi_i].max()), t + delay)
                was_sending = (old_rem > 0) & (subs.rate[lo_i:hi_i] > 0) & path_alive[old_p]
                cur_rate = float(subs.rate[lo_i:hi_i].sum())
                if cur_rate <= 0:
                    cur_rate = float(line_rate[p].max())
                rate = cur_rate * w
                if was_sending.any():
                    d_old = float(owd(old_p[was_sending]).max())
                    ooo_until = t + d_old - owd(p)
                else:
                    ooo_until = np.full(p.size, -np.inf)
                if kind == "move":
                    switches[f] += 1
                else:
                    failovers[f] += 1
            share = total * w
            share[-1] = total - share[:-1].sum()
            add["flow"].append(np.full(p.size, f))
            add["path"].append(p)
            add["rem"].append(np.maximum(share, 0.0))
            add["ready"].append(np.full(p.size, ready))
            add["rate"].append(rate)
            add["fresh"].append(np.ones(p.size, dtype=bool))
            add["ooo_until"].append(np.asarray(ooo_until, dtype=np.float64))
        subs.keep(rows_keep)
        if add["flow"]:
            subs.add(**{k: np.concatenate(v) for k, v in add.items()})
        subs.sort()

    # ---- epochs
    t = math.floor(float(trace.start_s[0]) / dt) * dt if F else 0.0
    epoch = 0
    next_arr = 0
    next_ev = 0
    done = 0
    pending_stalled: list[int] = []
    while done < F:
        if t >= t_limit:
            break
        t_end = t + dt
        # 1. events due by the start of this epoch
        changed = False
        while next_ev < len(ev_order) and ev_time[ev_order[next_ev]] <= t + 1e-15:
            k = ev_order[next_ev]
            if ev_kind[k] == 0:
                factor[ev_links[k]] = ev_val[k]
            else:
                bg[ev_links[k]] = ev_val[k]
            changed = changed or ev_kind[k] == 0
            next_ev += 1
        if changed:
            cap = cap0 * factor
            dead = cap <= 0
            lost = dead & (queue > 0)
            if lost.any() and len(subs):
                # the senders crossing a failed link re-send what its queue
                # held, shared by their rates (the fluid has no packet owners)
                sub_links = links2d[subs.path]
                for e in np.flatnonzero(lost).tolist():
                    rows = np.flatnonzero((sub_links == e).any(axis=1))
                    w = subs.rate[rows]
                    if rows.size == 0 or w.sum() <= 0:
                        continue
                    back = queue[e] * w / w.sum()
                    subs.rem[rows] += back
                    np.add.at(resent, subs.flow[rows], back)
            dropped[dead] += queue[dead]
            queue[dead] = 0.0
            lk = np.where(links2d >= 0, links2d, 0)
            path_alive = ~np.any(dead[lk] & (links2d >= 0), axis=1)
        # 2. flows arriving during this epoch
        hi_arr = int(np.searchsorted(trace.start_s, t_end, side="left"))
        new = np.arange(next_arr, hi_arr, dtype=np.int64)
        next_arr = hi_arr
        obs = observe(t, epoch)
        # 3. flows on dead paths (and flows waiting for one) are placed again
        if changed or pending_stalled:
            on_dead = np.unique(subs.flow[~path_alive[subs.path]]) if len(subs) else []
            cand = np.unique(
                np.r_[
                    np.asarray(on_dead, dtype=np.int64), np.asarray(pending_stalled, dtype=np.int64)
                ]
            )
            can_go = np.array([ctx.flow_paths(f, path_alive).size > 0 for f in cand.tolist()])
            placeable = cand[can_go] if cand.size else cand
            pending_stalled = cand[~can_go].tolist() if cand.size else []
            stalled[pending_stalled] = True
            if placeable.size:
                apply(pol.assign(placeable, obs), t, "failover", placeable)
        # 4. new flows
        if new.size:
            ok = np.array([ctx.flow_paths(f, path_alive).size > 0 for f in new.tolist()])
            waiting = new[~ok]
            pending_stalled.extend(waiting.tolist())
            stalled[waiting] = True
            if ok.any():
                apply(pol.assign(new[ok], obs), t, "new", new[ok])
        # 5. the policy's moves
        apply(pol.on_epoch(obs), t, "move", None)

        # 6. rates
        S = len(subs)
        rate = np.zeros(S)
        if S:
            alive = path_alive[subs.path]
            starts = np.maximum(t, subs.ready)
            active = alive & (starts < t_end) & (subs.rem > 0)
            fb = active & ~subs.fresh  # senders with feedback get their max-min share
            if fb.any():
                sp = subs.path[fb]
                ln = plen[sp].astype(np.int64)
                ptr = np.zeros(sp.size + 1, dtype=np.int64)
                np.cumsum(ln, out=ptr[1:])
                rows = links2d[sp]
                flat = rows[rows >= 0].astype(np.int64)
                eff = cap - bg + (K - queue) / tau
                eff = np.maximum(eff, MIN_RATE_SHARE * cap)
                eff[cap <= 0] = 1.0  # unused: no sender crosses a failed link
                out = np.empty(sp.size)
                maxmin_into(ptr, flat, eff, np.full(sp.size, np.inf), out)
                rate[fb] = out
            fr = active & subs.fresh
            rate[fr] = subs.rate[fr]
            # 7. send
            span = np.where(active, t_end - starts, 0.0)
            can = rate * span
            fin = active & (can >= subs.rem) & (rate > 0)
            snt = np.where(fin, subs.rem, np.minimum(can, subs.rem))
            snt[~active] = 0.0
            fin_time = np.where(
                fin, starts + np.divide(subs.rem, rate, where=rate > 0, out=np.zeros(S)), np.nan
            )
            end_send = np.where(fin, fin_time, t_end)
            # out-of-order exposure: bytes sent before ooo_until after a move ...
            win = np.clip(np.minimum(end_send, subs.ooo_until) - starts, 0.0, None)
            ooo_b = np.where(active, np.minimum(rate * win, snt), 0.0)
            # ... and, for a flow sending on several paths, bytes on paths faster
            # than its slowest one
            idx = np.flatnonzero(snt > 0)
            if idx.size > 1:
                _, grp, cnt = np.unique(subs.flow[idx], return_inverse=True, return_counts=True)
                many = cnt[grp] > 1
                if many.any():
                    idx, grp = idx[many], grp[many]
                    d = owd(subs.path[idx])
                    dmax = np.full(cnt.size, -np.inf)
                    np.maximum.at(dmax, grp, d)
                    faster = idx[d < dmax[grp] - OOO_TOLERANCE_S]
                    ooo_b[faster] = snt[faster]
            np.add.at(ooo, subs.flow, ooo_b)
            np.add.at(sent, subs.flow, snt)
            subs.rem = subs.rem - snt
            subs.rem[fin] = 0.0
            subs.rate = np.where(active, rate, subs.rate)
            subs.fresh = subs.fresh & ~active
            q0 = queue.copy()
            in_b, out_b = propagate(links2d, plen, subs.path, snt, bg * dt, queue, cap, dt)
            # last byte of each flow: keep the latest finishing subflow, and the
            # one-way delay its last byte sees: each queue at its finish time,
            # grown at the epoch's starting rates (at most what the link held
            # plus all it received this epoch)
            if fin.any():
                fi = np.flatnonzero(fin)
                fi = fi[np.argsort(fin_time[fi], kind="stable")]
                rows = links2d[subs.path[fi]].astype(np.int64)
                m = rows >= 0
                r0 = np.where(m, rows, 0)
                grow = link_in_bytes(links2d, plen, subs.path, np.where(active, rate, 0.0), nl)
                grow += bg - cap
                qf = q0[r0] + grow[r0] * (fin_time[fi] - t)[:, None]
                qf = np.clip(qf, 0.0, (q0 + in_b)[r0])
                qd = np.divide(qf, cap[r0], out=np.zeros(qf.shape), where=m & (cap[r0] > 0))
                f_owd = base_owd[subs.path[fi]] + qd.sum(axis=1)
                for j, i in enumerate(fi.tolist()):
                    f = int(subs.flow[i])
                    if fin_time[i] >= last_send[f]:
                        last_send[f] = fin_time[i]
                        last_owd[f] = f_owd[j]
        else:
            in_b = bg * dt
            out_b = queue_step(queue, in_b, cap, dt)
        # 8. link counters
        acc_in += in_b
        acc_out += out_b
        acc_captime += cap * dt
        np.maximum(qmax, queue, out=qmax)
        link_load = in_b / dt
        # 9. completions
        if S:
            gone = subs.rem <= 0
            if gone.any():
                fl_gone = np.unique(subs.flow[gone])
                subs.keep(~gone)
                still = np.isin(fl_gone, subs.flow)
                doneflows = fl_gone[~still]
                if doneflows.size:
                    fin_s = last_send[doneflows] + last_owd[doneflows]
                    finish[doneflows] = fin_s
                    fct[doneflows] = fin_s - trace.start_s[doneflows]
                    done += int(doneflows.size)
        t = t_end
        epoch += 1
        if done >= F:
            break
        # 10. nothing running: jump to the next arrival or event (queues drain meanwhile)
        if len(subs) == 0 and not pending_stalled:
            nxt = [float(trace.start_s[next_arr])] if next_arr < F else []
            if next_ev < len(ev_order):
                nxt.append(ev_time[ev_order[next_ev]])
            if not nxt:
                break
            t_next = max(math.floor(min(nxt) / dt) * dt, t)
            if min(nxt) > t_limit:
                t_next = max(math.floor(t_limit / dt) * dt, t)
            gap = t_next - t
            if gap > 0:
                g_in = bg * gap
                g_out = queue_step(queue, g_in, cap, gap)
                acc_in += g_in
                acc_out += g_out
                acc_captime += cap * gap
                link_load = bg.copy()
                epoch += round(gap / dt)
                t = t_next
        elif len(subs) == 0 or not (path_alive[subs.path].any()):
            # only stalled flows: progress needs an event
            if next_arr >= F and next_ev >= len(ev_order):
                break

    util = np.divide(acc_out, acc_captime, out=np.zeros(nl), where=acc_captime > 0)
    for a in (finish, fct, sent, resent, switches, failovers, ooo, first_path):
        a.setflags(write=False)
    net = np.flatnonzero(fab.link_kind == int(LinkKind.NETWORK))
    return DynamicResult(
        policy=policy_name,
        fabric_name=fab.name,
        start_s=trace.start_s,
        size_bytes=trace.size_bytes,
        finish_s=finish,
        fct_s=fct,
        ideal_fct_s=best_time,
        sent_bytes=sent,
        resent_bytes=resent,
        switches=switches,
        failovers=failovers,
        ooo_bytes=ooo,
        first_path=first_path,
        link_bytes=acc_out,
        link_utilisation=util,
        link_queue_max_bytes=qmax,
        dropped_bytes=dropped,
        link_in_bytes=acc_in,
        link_queue_bytes=queue,
        network_links=net,
        epochs=epoch,
        end_s=t,
        wall_s=time.perf_counter() - t_wall,
        info={**pol.stats(), "stalled_flows": int(stalled.sum())},
    )
