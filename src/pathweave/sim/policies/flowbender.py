"""``flowbender``: re-hash a flow to a random path when its congestion stays high.

FlowBender (Kabbani et al., CoNEXT 2014) starts every flow on its ECMP path
and watches the share of ECN-marked packets; when it stays above a threshold
the end host changes a header field so the switches hash the flow again, onto
a path picked at random (possibly the same one, possibly another congested
one).

Our congestion signal is the flow's RTT on its current path against the
path's base RTT: in the fluid model ECN marks and RTT both rise with the
queue on the path, and the RTT form needs no marking model. A flow whose
RTT exceeds ``threshold`` x base for ``patience_epochs`` epochs in a row is
re-hashed uniformly over its pair's alive candidate paths (the current one
included, as a real re-hash can land there) and its counter restarts. It
switches at once: no pause, so bytes on a faster new path can overtake bytes
still queued on the old one (counted as out-of-order exposure).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from pathweave.sim.policies import (
    DynamicPolicy,
    Observation,
    PathChoice,
    PolicyContext,
    register,
)


@register
class FlowBender(DynamicPolicy):
    """ECMP placement plus random re-hashing under sustained congestion.

    Options
    -------
    threshold
        Congested while RTT > ``threshold`` x base RTT (default 1.5).
    patience_epochs
        Consecutive congested epochs before a re-hash (default 2).
    """

    name = "flowbender"
    summary = "ECMP, re-hashed to a random path when the flow's RTT stays high"
    options: ClassVar[dict[str, Any]] = {"threshold": 1.5, "patience_epochs": 2}
    counters = ("rehashes", "moves")

    def __init__(self, ctx: PolicyContext, **options) -> None:
        super().__init__(ctx, **options)
        self.threshold = self.check("threshold", 1.0, 1e6)
        self.patience = int(self.check("patience_epochs", 1, 1e9))
        self.high_epochs = np.zeros(len(ctx.trace), dtype=np.int64)

    def assign(self, flows: np.ndarray, obs: Observation) -> list[PathChoice]:
        self.high_epochs[flows] = 0
        return self.ecmp_choice(flows, obs)

    def on_epoch(self, obs: Observation) -> list[PathChoice]:
        f, p = obs.movable_flows()
        if f.size == 0:
            return []
        high = obs.rtt_s(p) > self.threshold * obs.base_rtt_s[p]
        cnt = np.where(high, self.high_epochs[f] + 1, 0)
        self.high_epochs[f] = cnt
        out = []
        for i in np.flatnonzero(cnt >= self.patience).tolist():
            flow, cur = int(f[i]), int(p[i])
            cands = self.ctx.flow_paths(flow, obs.path_alive)
            if cands.size == 0:
                continue  # stranded on a dead path: the run re-places it when one comes back
            new = int(cands[self.ctx.rng.integers(cands.size)])
            self.high_epochs[flow] = 0
            self.rehashes += 1
            if new != cur:
                self.moves += 1
                out.append(PathChoice(flow, (new,)))
        return out
