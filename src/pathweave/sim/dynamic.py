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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pathweave import _check
from pathweave.errors import PlanError
from pathweave.fabric import Fabric, LinkKind, PathSet, candidate_paths, resolve
from pathweave.fabric.paths import DEFAULT_KINDS
from pathweave.sim import _dynamic_account as account
from pathweave.sim import _dynamic_cc as cc
from pathweave.sim import policies as dynamic_policies
from pathweave.sim._dynamic_events import (
    BackgroundEvent,
    EventQueue,
    LinkEvent,
    LinkKey,
    apply_capacity,
)
from pathweave.sim._dynamic_place import Placer, observe
from pathweave.sim._dynamic_state import FlowStats, LinkStats, Network, Subflows, ideal_fct_s
from pathweave.sim._queue import propagate, queue_step
from pathweave.sim.policies import DynamicPolicy, PolicyContext
from pathweave.traffic.trace import FlowTrace

__all__ = ["BackgroundEvent", "DynamicResult", "LinkEvent", "LinkKey", "run_dynamic"]


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
        ``nimble-online`` (:func:`pathweave.sim.policies.policies`), or a
        :class:`~pathweave.sim.policies.DynamicPolicy` subclass.
    events
        :class:`LinkEvent` and :class:`BackgroundEvent` items, any order.
    paths
        Candidate paths; default ``candidate_paths(fabric, (*DEFAULT_KINDS,
        "ecmp"))``: the default rules with every spine path of a pair.
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
    # The network picks among equal-cost spines here (ECMP, spraying,
    # flowlets): every spine path, the ecmp rule.
    ps = candidate_paths(fab, (*DEFAULT_KINDS, "ecmp")) if paths is None else paths
    if ps.fabric is not fab:
        raise PlanError("paths were compiled for another fabric")
    evq = EventQueue(fab, events)
    ctx = PolicyContext.build(fab, ps, trace, seed=int(seed), epoch_s=dt)
    net = Network.build(fab, ps, ctx.base_rtt_s)
    best_time = ideal_fct_s(ps, trace, net)
    subs = Subflows()
    flows = FlowStats.zeros(len(trace))
    links = LinkStats.zeros(fab.num_links)
    pol: DynamicPolicy = dynamic_policies.make(policy, ctx, **policy_options)
    placer = Placer(pol, ctx, net, subs, trace, flows)
    run = _Run(trace, net, subs, flows, links, evq, placer, cc.Control(K, tau), dt, t_limit)
    run.play()

    util = np.divide(links.served, links.captime, out=np.zeros(fab.num_links),
                     where=links.captime > 0)
    for a in (flows.finish, flows.fct, flows.sent, flows.resent, flows.switches,
              flows.failovers, flows.ooo, flows.first_path):
        a.setflags(write=False)
    return DynamicResult(
        policy=placer.name,
        fabric_name=fab.name,
        start_s=trace.start_s,
        size_bytes=trace.size_bytes,
        finish_s=flows.finish,
        fct_s=flows.fct,
        ideal_fct_s=best_time,
        sent_bytes=flows.sent,
        resent_bytes=flows.resent,
        switches=flows.switches,
        failovers=flows.failovers,
        ooo_bytes=flows.ooo,
        first_path=flows.first_path,
        link_bytes=links.served,
        link_utilisation=util,
        link_queue_max_bytes=links.qmax,
        dropped_bytes=links.dropped,
        link_in_bytes=links.fed,
        link_queue_bytes=net.queue,
        network_links=np.flatnonzero(fab.link_kind == int(LinkKind.NETWORK)),
        epochs=run.epoch,
        end_s=run.t,
        wall_s=time.perf_counter() - t_wall,
        info={**pol.stats(), "stalled_flows": int(flows.stalled.sum())},
    )


class _Run:
    """The epoch loop: events, placement, sending, accounting, in that order."""

    def __init__(self, trace: FlowTrace, net: Network, subs: Subflows, flows: FlowStats,
                 links: LinkStats, evq: EventQueue, placer: Placer, ctl: cc.Control,
                 dt: float, t_limit: float) -> None:
        self.trace, self.net, self.subs, self.flows, self.links = trace, net, subs, flows, links
        self.evq, self.placer, self.ctl, self.dt, self.t_limit = evq, placer, ctl, dt, t_limit
        self.num_flows = len(trace)
        self.t = math.floor(float(trace.start_s[0]) / dt) * dt if self.num_flows else 0.0
        self.epoch = 0
        self.next_arr = 0  # first flow not yet arrived
        self.done = 0  # flows completed

    def play(self) -> None:
        """Run epochs until every flow finished, time ran out or nothing can progress."""
        while self.done < self.num_flows:
            if self.t >= self.t_limit:
                break
            self.step()
            if self.done >= self.num_flows or not self.skip_idle():
                break

    def step(self) -> None:
        """One epoch."""
        t, net, placer = self.t, self.net, self.placer
        t_end = t + self.dt
        changed = self.evq.apply_due(t, net)
        if changed:
            apply_capacity(net, self.subs, self.flows, self.links)
        hi_arr = int(np.searchsorted(self.trace.start_s, t_end, side="left"))
        new = np.arange(self.next_arr, hi_arr, dtype=np.int64)
        self.next_arr = hi_arr
        obs = observe(net, self.subs, t, self.epoch)
        if changed or placer.pending:
            placer.replace_stranded(obs, t)
        if new.size:
            placer.place_new(new, obs, t)
        placer.apply(placer.pol.on_epoch(obs), t, "move", None)
        in_b, out_b = self.transfer(t, t_end) if len(self.subs) else self.idle_epoch()
        self.links.count(in_b, out_b, net.cap * self.dt)
        np.maximum(self.links.qmax, net.queue, out=self.links.qmax)
        net.link_load = in_b / self.dt
        self.done += account.complete(self.subs, self.flows, self.trace)
        self.t = t_end
        self.epoch += 1

    def transfer(self, t: float, t_end: float) -> tuple[np.ndarray, np.ndarray]:
        """The subflows send; the queues take what they sent. Returns bytes fed and served."""
        net, subs, flows = self.net, self.subs, self.flows
        s = cc.send(self.ctl, net, subs, t, t_end)
        np.add.at(flows.ooo, subs.flow, account.exposure(net, subs, s))
        np.add.at(flows.sent, subs.flow, s.sent)
        cc.advance(subs, s)
        q0 = net.queue.copy()
        in_b, out_b = propagate(net.links2d, net.plen, subs.path, s.sent, net.bg * self.dt,
                                net.queue, net.cap, self.dt)
        account.last_bytes(net, subs, s, flows, t, q0, in_b)
        return in_b, out_b

    def idle_epoch(self) -> tuple[np.ndarray, np.ndarray]:
        in_b = self.net.bg * self.dt
        return in_b, queue_step(self.net.queue, in_b, self.net.cap, self.dt)

    def skip_idle(self) -> bool:
        """With nothing running, jump to the next arrival or event; False if the run is over."""
        net, subs, evq = self.net, self.subs, self.evq
        if len(subs) == 0 and not self.placer.pending:
            arrival = self.next_arr < self.num_flows
            nxt = [float(self.trace.start_s[self.next_arr])] if arrival else []
            if not evq.exhausted:
                nxt.append(evq.next_time())
            if not nxt:
                return False
            t_next = max(math.floor(min(nxt) / self.dt) * self.dt, self.t)
            if min(nxt) > self.t_limit:
                t_next = max(math.floor(self.t_limit / self.dt) * self.dt, self.t)
            gap = t_next - self.t
            if gap > 0:
                account.idle(net, self.links, gap)
                self.epoch += round(gap / self.dt)
                self.t = t_next
        elif len(subs) == 0 or not (net.path_alive[subs.path].any()):
            # only stalled flows: progress needs an arrival or an event
            return not (self.next_arr >= self.num_flows and evq.exhausted)
        return True
