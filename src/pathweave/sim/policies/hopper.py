"""``hopper``: RTT-probing path switching (Nosrati & Ghaderi, arXiv:2506.08132).

Once per epoch, for every flow on one path:

1. *Congestion detection*: keep a moving average of the flow's RTT
   (``avg <- (1 - gain) * avg + gain * rtt``); it is congested when
   ``avg > probe_threshold x base RTT`` (1.5).
2. *Path probing*: probe ``probes`` (2) random alternative paths of the pair
   (power of two choices); a probe measures that path's RTT now.
3. *Path switching*: switch to the best probe only if its RTT is below
   ``switch_ratio x avg`` (0.8), and delay the switch by the estimated RTT
   difference ``avg - best``: the flow pauses that long before it sends on
   the new path, so the bytes in flight on the old path arrive first and
   the receiver sees little reordering. ``delay_switch=False`` switches at
   once (for comparison).

New flows start on their ECMP path. After a switch the moving average starts
again from the probe's RTT.
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
class Hopper(DynamicPolicy):
    """Host-side RTT probing: switch on a clear win, after the RTT difference.

    Options
    -------
    probe_threshold
        Probe when the RTT average exceeds this multiple of base RTT (1.5).
    switch_ratio
        Switch only if the best probe's RTT < ``switch_ratio`` x average (0.8).
    probes
        Random alternative paths probed (2).
    gain
        Weight of the newest RTT sample in the moving average (0.5).
    delay_switch
        Pause for the estimated RTT difference before switching (True).
    """

    name = "hopper"
    summary = "RTT moving average; probe 2 paths; switch on a clear win after the RTT delta"
    options: ClassVar[dict[str, Any]] = {
        "probe_threshold": 1.5,
        "switch_ratio": 0.8,
        "probes": 2,
        "gain": 0.5,
        "delay_switch": True,
    }
    #: ``probes`` counts the probes sent (the option is ``probes_per_round`` here).
    counters = ("probe_rounds", "probes", "switches")

    def __init__(self, ctx: PolicyContext, **options) -> None:
        super().__init__(ctx, **options)
        self.threshold = self.check("probe_threshold", 1.0, 1e6)
        self.ratio = self.check("switch_ratio", 0.0, 1.0, lo_open=True)
        self.probes_per_round = int(self.check("probes", 1, 64))
        self.gain = self.check("gain", 0.0, 1.0, lo_open=True)
        self.delay_switch = bool(self.opts["delay_switch"])
        self.rtt_avg_s = np.full(len(ctx.trace), np.nan)

    def assign(self, flows: np.ndarray, obs: Observation) -> list[PathChoice]:
        self.rtt_avg_s[flows] = np.nan
        return self.ecmp_choice(flows, obs)

    def on_epoch(self, obs: Observation) -> list[PathChoice]:
        f, p = obs.movable_flows()
        if f.size == 0:
            return []
        rtt = obs.rtt_s(p)
        old = self.rtt_avg_s[f]
        avg = np.where(np.isnan(old), rtt, (1.0 - self.gain) * old + self.gain * rtt)
        self.rtt_avg_s[f] = avg
        out = []
        for i in np.flatnonzero(avg > self.threshold * obs.base_rtt_s[p]).tolist():
            flow, cur = int(f[i]), int(p[i])
            cands = self.ctx.flow_paths(flow, obs.path_alive)
            cands = cands[cands != cur]
            if cands.size == 0:
                continue
            k = min(self.probes_per_round, cands.size)
            probe = self.ctx.rng.choice(cands, size=k, replace=False)
            prtt = obs.rtt_s(probe)
            b = int(np.argmin(prtt))
            self.probe_rounds += 1
            self.probes += k
            if prtt[b] < self.ratio * avg[i]:
                delay = float(avg[i] - prtt[b]) if self.delay_switch else 0.0
                out.append(PathChoice(flow, (int(probe[b]),), delay_s=delay))
                self.rtt_avg_s[flow] = prtt[b]
                self.switches += 1
        return out
