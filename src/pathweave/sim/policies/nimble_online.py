"""``nimble-online``: NIMBLE's planner re-run on measured link loads, with hysteresis.

NIMBLE (Sec. IV) monitors link utilisation at run time and re-plans the
split of each pair's traffic over all its paths with the multiplicative
weights planner, keeping a plan unless a new one is clearly better
(hysteresis) so paths do not oscillate.

Here, every ``replan_epochs`` epochs the policy builds the demand from the
running flows' remaining bytes (per pair) and plans it with the ``mwu``
kernel of :mod:`pathweave.plan.mwu` on the capacity left to them: link
telemetry gives each link's capacity and measured load, the flows' own rates
are known, and the difference is background traffic the plan must avoid::

    available_e = capacity_e - max(0, measured_load_e - own_load_e)

The new plan replaces the current split only if it is a clear gain: its
congestion ``max_e bytes_e / available_e`` over the remaining bytes must be
at most ``(1 - min_gain)`` times that of the current split; then only flows
whose split changes (a path added or removed, or a weight moved by more
than ``min_shift``) are re-split. New flows (and flows whose path died) are
placed by a plan of everything running plus them. As in NIMBLE, pairs
smaller than ``min_split_bytes`` go whole on one path, and the receiver
reassembles per destination, so the reordering the simulator counts for
split flows is absorbed by NIMBLE's reassembly buffer.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from pathweave.errors import PlanError
from pathweave.plan.mwu import route_flows
from pathweave.plan.registry import check_options, policy_info
from pathweave.sim._queue import link_in_bytes
from pathweave.sim.policies import (
    DynamicPolicy,
    Observation,
    PathChoice,
    PolicyContext,
    register,
)

#: A link never counts as having less than this share of its capacity left.
MIN_AVAILABLE_SHARE = 0.02
#: The ``mwu`` planner's options with its defaults, as its registry entry reads them.
_MWU_OPTIONS: dict[str, Any] = dict(policy_info("mwu").options)


@register
class NimbleOnline(DynamicPolicy):
    """Periodic ``mwu`` re-plans from link telemetry, adopted only for a clear gain.

    Options
    -------
    replan_epochs
        Epochs between re-plans (4).
    min_gain
        Adopt a new plan only if it lowers the congestion by this share (0.1).
    min_shift
        A flow is re-split only if some path's weight moves by more (0.05).
    fraction, chunk_bytes, min_split_bytes, hop_penalty_s, refine
        The ``mwu`` planner's options (see :mod:`pathweave.plan.mwu`).
    """

    name = "nimble-online"
    summary = "mwu re-plans from measured link loads, kept unless a new plan is clearly better"
    # mwu's options and defaults are mwu's (its signature), checked by mwu's own rules.
    options: ClassVar[dict[str, Any]] = {
        "replan_epochs": 4, "min_gain": 0.1, "min_shift": 0.05, **_MWU_OPTIONS,
    }
    counters = ("replans", "adopted", "kept", "resplits")

    def __init__(self, ctx: PolicyContext, **options) -> None:
        super().__init__(ctx, **options)
        self.replan_epochs = int(self.check("replan_epochs", 1, 1e9))
        self.min_gain = self.check("min_gain", 0.0, 1.0)
        self.min_shift = self.check("min_shift", 0.0, 1.0)
        mwu = {k: self.opts[k] for k in _MWU_OPTIONS}
        try:
            check_options("mwu", mwu, execute=False)
        except (PlanError, TypeError) as exc:
            raise type(exc)(f"{self.name} (its mwu re-plans): {exc}") from None
        self.fraction = float(mwu["fraction"])
        self.chunk_bytes = int(mwu["chunk_bytes"])
        self.min_split_bytes = int(mwu["min_split_bytes"])
        self.refine = int(mwu["refine"])
        self.hop_penalty_s = float(mwu["hop_penalty_s"])

    # ---------------------------------------------------------------- helpers
    def _inv_available(self, obs: Observation) -> np.ndarray:
        ps = self.ctx.paths
        own = link_in_bytes(
            ps.links, ps.length, obs.sub_path, obs.sub_rate_Bps, self.ctx.fabric.num_links
        )
        cap = obs.link_capacity_Bps
        background = np.maximum(obs.link_load_Bps - own, 0.0)
        avail = np.maximum(cap - background, MIN_AVAILABLE_SHARE * cap)
        inv = np.empty_like(avail)
        up = avail > 0
        inv[up] = 1.0 / avail[up]
        # A failed link costs so much that a plan uses it only for a pair
        # with no other path (such flows are stranded and skipped anyway).
        inv[~up] = 1e6 * (inv[up].max() if up.any() else 1.0)
        return inv

    def _plan(
        self, flows: np.ndarray, rem: np.ndarray, inv: np.ndarray
    ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """``pair -> (paths, weights)`` of an ``mwu`` plan of the flows' remaining bytes."""
        ps = self.ctx.paths
        tr = self.ctx.trace
        n = ps.num_ranks
        pair = tr.src[flows] * n + tr.dst[flows]
        demand = np.zeros(n * n, dtype=np.int64)
        np.add.at(demand, pair, np.ceil(rem).astype(np.int64))
        pid, fb = route_flows(
            ps, demand, inv, fraction=self.fraction, chunk_bytes=self.chunk_bytes,
            min_split_bytes=self.min_split_bytes, hop_penalty_s=self.hop_penalty_s,
            refine=self.refine,
        )
        self.replans += 1
        keep = fb > 0
        pid, fb = pid[keep], fb[keep].astype(np.float64)
        ppair = ps.src[pid].astype(np.int64) * n + ps.dst[pid]
        out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        bounds = np.flatnonzero(np.r_[True, ppair[1:] != ppair[:-1], True])
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            w = fb[a:b]
            out[int(ppair[a])] = (pid[a:b].astype(np.int64), w / w.sum())
        return out

    def _split(
        self, flow: int, plan: dict[int, tuple[np.ndarray, np.ndarray]], alive: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray] | None:
        tr = self.ctx.trace
        key = int(tr.src[flow]) * self.ctx.paths.num_ranks + int(tr.dst[flow])
        if key not in plan:
            return None
        p, w = plan[key]
        ok = alive[p]
        if not ok.any():
            return None
        return p[ok], w[ok] / w[ok].sum()

    @staticmethod
    def _congestion(paths_links, length, sub_path, sub_bytes, inv, num_links) -> float:
        load = link_in_bytes(paths_links, length, sub_path, sub_bytes, num_links)
        return float((load * inv).max()) if load.size else 0.0

    # -------------------------------------------------------------- interface
    def assign(self, flows: np.ndarray, obs: Observation) -> list[PathChoice]:
        tr = self.ctx.trace
        running = np.unique(obs.sub_flow)
        run_rem = np.bincount(
            np.searchsorted(running, obs.sub_flow),
            weights=obs.sub_remaining_bytes,
            minlength=running.size,
        )
        # stranded flows are in both sets: count them once, with what they have left
        is_new = ~np.isin(flows, running)
        new_rem = tr.size_bytes[flows].astype(np.float64)
        all_f = np.concatenate([running, flows[is_new]])
        all_rem = np.concatenate([run_rem, new_rem[is_new]])
        plan = self._plan(all_f, all_rem, self._inv_available(obs))
        out = []
        for f in flows.tolist():
            split = self._split(f, plan, obs.path_alive)
            if split is None:  # the plan did not route it: fall back to ECMP
                out.extend(self.ecmp_choice(np.array([f]), obs))
                continue
            p, w = split
            out.append(PathChoice(f, tuple(p.tolist()), tuple(w.tolist())))
        return out

    def on_epoch(self, obs: Observation) -> list[PathChoice]:
        if obs.epoch % self.replan_epochs or obs.sub_flow.size == 0:
            return []
        ps = self.ctx.paths
        nl = self.ctx.fabric.num_links
        inv = self._inv_available(obs)
        running, idx = np.unique(obs.sub_flow, return_inverse=True)
        rem = np.bincount(idx, weights=obs.sub_remaining_bytes, minlength=running.size)
        plan = self._plan(running, rem, inv)
        cur = self._congestion(ps.links, ps.length, obs.sub_path, obs.sub_remaining_bytes, inv, nl)
        new_path, new_bytes, splits = [], [], {}
        for i, f in enumerate(running.tolist()):
            split = self._split(f, plan, obs.path_alive)
            if split is None:
                sel = obs.sub_flow == f
                new_path.append(obs.sub_path[sel])
                new_bytes.append(obs.sub_remaining_bytes[sel])
                continue
            splits[f] = split
            new_path.append(split[0])
            new_bytes.append(split[1] * rem[i])
        new = self._congestion(
            ps.links, ps.length, np.concatenate(new_path), np.concatenate(new_bytes), inv, nl
        )
        if not new <= (1.0 - self.min_gain) * cur or not math.isfinite(new):
            self.kept += 1
            return []
        self.adopted += 1
        out = []
        starts = np.searchsorted(obs.sub_flow, running)
        ends = np.searchsorted(obs.sub_flow, running, side="right")
        for i, f in enumerate(running.tolist()):
            if f not in splits or obs.sub_pending[starts[i] : ends[i]].any() or rem[i] <= 0:
                continue
            p, w = splits[f]
            cp = obs.sub_path[starts[i] : ends[i]]
            cw = obs.sub_remaining_bytes[starts[i] : ends[i]] / rem[i]
            old = dict(zip(cp.tolist(), cw.tolist(), strict=True))
            newd = dict(zip(p.tolist(), w.tolist(), strict=True))
            shift = max(abs(old.get(k, 0.0) - newd.get(k, 0.0)) for k in set(old) | set(newd))
            if set(old) != set(newd) or shift > self.min_shift:
                out.append(PathChoice(f, tuple(p.tolist()), tuple(w.tolist())))
                self.resplits += 1
        return out
