"""``spray``: every flow split equally over all of its candidate paths.

Random packet spraying, as a fluid: each path carries the same share of the
flow's bytes. Under asymmetry the share on the slowest path finishes last, so
the flow runs at (number of paths) x (its rate on the slowest path), and
bytes on faster paths overtake earlier bytes on slower ones (out-of-order
exposure, counted by the simulator).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from pathweave.sim.policies import DynamicPolicy, Observation, PathChoice, register


@register
class Spray(DynamicPolicy):
    """Equal split over every alive candidate path of the pair.

    Examples
    --------
    >>> from pathweave.fabric.builders import leaf_spine
    >>> from pathweave.sim import run_dynamic
    >>> from pathweave.traffic.trace import FlowTrace
    >>> fab = leaf_spine(leaves=2, hosts_per_leaf=1, spines=4)
    >>> r = run_dynamic(fab, FlowTrace.from_flows([(0.0, 0, 1, 4 * 10**6)], num_ranks=2), "spray")
    >>> r.finished
    1
    """

    name = "spray"
    summary = "equal split of every flow over all its candidate paths"
    options: ClassVar[dict[str, Any]] = {}

    def assign(self, flows: np.ndarray, obs: Observation) -> list[PathChoice]:
        out = []
        for f in flows.tolist():
            ps = self.ctx.flow_paths(f, obs.path_alive)
            w = 1.0 / ps.size
            out.append(PathChoice(f, tuple(ps.tolist()), (w,) * ps.size))
        return out
