"""What a dynamic policy sees and how its choices re-split the flows."""

from __future__ import annotations

import math

import numpy as np

from pathweave.errors import PlanError
from pathweave.sim._dynamic_state import FlowStats, Network, Subflows
from pathweave.sim.policies import DynamicPolicy, Observation, PathChoice, PolicyContext
from pathweave.traffic.trace import FlowTrace


def observe(net: Network, subs: Subflows, t: float, epoch: int) -> Observation:
    """The policy's view at the start of an epoch (copies, so it cannot change the run)."""
    return Observation(
        time_s=t,
        epoch=epoch,
        paths=net.ps,
        path_alive=net.path_alive,
        base_rtt_s=net.base_rtt,
        link_queue_s=net.queue_s(),
        link_capacity_Bps=net.cap.copy(),
        link_load_Bps=net.link_load.copy(),
        sub_flow=subs.flow.copy(),
        sub_path=subs.path.copy(),
        sub_remaining_bytes=subs.rem.copy(),
        sub_rate_Bps=subs.rate.copy(),
        sub_pending=subs.ready > t,
    )


class Placer:
    """Hands flows to the policy and applies what it chooses to the subflows."""

    def __init__(self, pol: DynamicPolicy, ctx: PolicyContext, net: Network, subs: Subflows,
                 trace: FlowTrace, flows: FlowStats) -> None:
        self.pol, self.ctx, self.net, self.subs = pol, ctx, net, subs
        self.trace, self.flows = trace, flows
        self.name = pol.name or type(pol).__name__
        self.pending: list[int] = []  # flows waiting for an alive path

    def _can_go(self, flows: np.ndarray) -> np.ndarray:
        return np.array([self.ctx.flow_paths(f, self.net.path_alive).size > 0
                         for f in flows.tolist()])

    def replace_stranded(self, obs: Observation, t: float) -> None:
        """Place again the flows on dead paths and those waiting for a path."""
        subs = self.subs
        on_dead = np.unique(subs.flow[~self.net.path_alive[subs.path]]) if len(subs) else []
        cand = np.unique(
            np.r_[np.asarray(on_dead, dtype=np.int64), np.asarray(self.pending, dtype=np.int64)]
        )
        can_go = self._can_go(cand)
        placeable = cand[can_go] if cand.size else cand
        self.pending = cand[~can_go].tolist() if cand.size else []
        self.flows.stalled[self.pending] = True
        if placeable.size:
            self.apply(self.pol.assign(placeable, obs), t, "failover", placeable)

    def place_new(self, new: np.ndarray, obs: Observation, t: float) -> None:
        """Place flows that arrive this epoch; those with no alive path wait."""
        ok = self._can_go(new)
        waiting = new[~ok]
        self.pending.extend(waiting.tolist())
        self.flows.stalled[waiting] = True
        if ok.any():
            self.apply(self.pol.assign(new[ok], obs), t, "new", new[ok])

    def apply(self, choices: list[PathChoice], t: float, kind: str,
              expect: np.ndarray | None) -> None:
        """Validate a policy's choices and re-split the flows they name."""
        if expect is not None:
            got = sorted(c.flow for c in choices)
            if got != sorted(expect.tolist()):
                raise PlanError(
                    f"policy {self.name!r}: assign() must return one choice per flow "
                    f"{sorted(expect.tolist())[:8]}..., got {got[:8]}..."
                )
        if not choices:
            return
        subs = self.subs
        rows_keep = np.ones(len(subs), dtype=bool)
        add: dict[str, list] = {name: [] for name, _ in Subflows.FIELDS}
        seen: set[int] = set()
        for c in choices:
            f = int(c.flow)
            if f in seen:
                raise PlanError(f"policy {self.name!r} chose paths for flow {f} twice in one epoch")
            seen.add(f)
            p, w = self._checked(c)
            lo_i, hi_i = np.searchsorted(subs.flow, [f, f + 1])
            if lo_i == hi_i:
                total, ready, rate, ooo_until = self._start(f, p, w, t, float(c.delay_s))
            else:
                if kind == "move" and p.size == 1 and hi_i - lo_i == 1 and p[0] == subs.path[lo_i]:
                    continue  # the same single path: nothing to do
                rows_keep[lo_i:hi_i] = False
                total, ready, rate, ooo_until = self._move(lo_i, hi_i, p, w, t, float(c.delay_s))
                counter = self.flows.switches if kind == "move" else self.flows.failovers
                counter[f] += 1
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

    def _checked(self, c: PathChoice) -> tuple[np.ndarray, np.ndarray]:
        """The choice's paths and weights, or the PlanError naming what is wrong."""
        f, tr = int(c.flow), self.trace
        p = np.asarray(c.paths, dtype=np.int64)
        w = np.asarray(c.weights, dtype=np.float64)
        cands = self.net.ps.pair_paths(int(tr.src[f]), int(tr.dst[f]))
        lo, hi = cands.start, cands.stop
        if p.size == 0 or p.shape != w.shape or np.unique(p).size != p.size or np.any(
            (p < lo) | (p >= hi)
        ):
            raise PlanError(
                f"policy {self.name!r}: flow {f} ({int(tr.src[f])} -> {int(tr.dst[f])}) "
                f"got paths {c.paths} / weights {c.weights}; need distinct candidate paths "
                f"in [{lo}, {hi}) with one weight each"
            )
        if not self.net.path_alive[p].all():
            raise PlanError(f"policy {self.name!r} put flow {f} on a dead path {c.paths}")
        if np.any(w < 0) or not abs(w.sum() - 1.0) < 1e-6:
            raise PlanError(f"policy {self.name!r}: flow {f} weights {c.weights} must sum to 1")
        delay = float(c.delay_s)
        if not (delay >= 0 and math.isfinite(delay)):
            raise PlanError(f"policy {self.name!r}: flow {f} delay_s={c.delay_s!r} must be >= 0")
        return p, w

    def _start(self, f: int, p: np.ndarray, w: np.ndarray, t: float,
               delay: float) -> tuple[float, float, np.ndarray, np.ndarray]:
        """A new flow: all its bytes, at line rate, nothing to overtake."""
        self.flows.first_path[f] = int(p.min())
        ready = max(float(self.trace.start_s[f]), t + delay)
        return (float(self.trace.size_bytes[f]), ready, self.net.line_rate[p] * w,
                np.full(p.size, -np.inf))

    def _move(self, lo_i: int, hi_i: int, p: np.ndarray, w: np.ndarray, t: float,
              delay: float) -> tuple[float, float, np.ndarray, np.ndarray]:
        """A running flow: its remaining bytes at its current rate; what the new paths overtake."""
        subs, net = self.subs, self.net
        old_p = subs.path[lo_i:hi_i]
        old_rem = subs.rem[lo_i:hi_i]
        total = float(old_rem.sum())
        ready = max(float(subs.ready[lo_i:hi_i].max()), t + delay)
        was_sending = (old_rem > 0) & (subs.rate[lo_i:hi_i] > 0) & net.path_alive[old_p]
        cur_rate = float(subs.rate[lo_i:hi_i].sum())
        if cur_rate <= 0:
            cur_rate = float(net.line_rate[p].max())
        if was_sending.any():
            d_old = float(net.owd(old_p[was_sending]).max())
            ooo_until = t + d_old - net.owd(p)
        else:
            ooo_until = np.full(p.size, -np.inf)
        return total, ready, cur_rate * w, ooo_until
