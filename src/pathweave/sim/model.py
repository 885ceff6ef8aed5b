"""The simulator's result (:class:`SimResult`); its parameters, :class:`SimModel`,
are the time model's and live in :mod:`pathweave.plan.model` (re-exported here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pathweave.plan.model import SimModel

__all__ = ["SimModel", "SimResult"]


@dataclass(frozen=True, eq=False)
class SimResult:
    """What :func:`pathweave.sim.simulate` returns; fixed fields for every plan.

    Attributes
    ----------
    makespan_s
        Time until the last byte of the plan has arrived.
    pair_finish_s
        ``float64[N, N]``: when the last fragment of each pair arrives; NaN
        where the pair has no demand.
    flow_finish_s
        ``float64[F]``: arrival time of each plan fragment (``plan.flow_path``
        order); NaN for fragments carrying no bytes.
    link_bytes
        ``float64[L]``: bytes each directed link carried.
    times_s, link_util
        The utilisation timeline: in ``[times_s[k], times_s[k + 1])`` link
        ``e`` ran at ``link_util[k, e]`` of its capacity (``float32[T, L]``,
        time-averaged where segments were merged; at most
        ``model.max_segments`` rows).
    achieved_Bps
        Total bytes / makespan.
    total_bytes
        Bytes of the plan.
    policy
        The plan's policy.
    model
        The :class:`SimModel` used.
    events
        Number of rate computations (each start or end of flows).
    sim_s
        Wall time of the simulation, seconds.
    """

    makespan_s: float
    pair_finish_s: np.ndarray
    flow_finish_s: np.ndarray
    link_bytes: np.ndarray
    times_s: np.ndarray
    link_util: np.ndarray
    achieved_Bps: float
    total_bytes: int
    policy: str
    model: SimModel
    events: int
    sim_s: float

    def _finite_pairs(self) -> np.ndarray:
        v = self.pair_finish_s[np.isfinite(self.pair_finish_s)]
        return v

    @property
    def p50_s(self) -> float:
        """Median pair completion time (NaN without demand)."""
        v = self._finite_pairs()
        return float(np.percentile(v, 50)) if v.size else math.nan

    @property
    def p99_s(self) -> float:
        """99th-percentile pair completion time (NaN without demand)."""
        v = self._finite_pairs()
        return float(np.percentile(v, 99)) if v.size else math.nan

    def mean_util(self) -> np.ndarray:
        """``float64[L]``: each link's busy share over the makespan."""
        if self.times_s.size < 2 or self.makespan_s <= 0:
            return np.zeros(self.link_util.shape[1])
        dt = np.diff(self.times_s)
        return (self.link_util.astype(np.float64) * dt[:, None]).sum(axis=0) / self.makespan_s

    def summary(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "makespan_s": self.makespan_s,
            "p50_s": self.p50_s,
            "p99_s": self.p99_s,
            "achieved_Bps": self.achieved_Bps,
            "total_bytes": self.total_bytes,
            "events": self.events,
            "sim_s": self.sim_s,
        }

    def __repr__(self) -> str:
        return (
            f"SimResult(policy={self.policy!r}, makespan_s={self.makespan_s:.6g}, "
            f"achieved_Bps={self.achieved_Bps:.4g}, events={self.events})"
        )
