"""``ecmp``: a static hash of each flow onto one of its equal-cost paths.

Switches hash a flow's header onto one of the shortest paths and keep it
there for the flow's life, whatever the load. The hash is
:func:`~pathweave.sim.policies.ecmp_hash` of ``(src, dst, flow id)`` salted
with the run's seed; a flow whose path dies is hashed again over the paths
still alive (routing reconverges).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from pathweave.sim.policies import DynamicPolicy, Observation, PathChoice, register


@register
class Ecmp(DynamicPolicy):
    """Static hash over equal-cost paths; never moves a flow.

    Examples
    --------
    >>> import numpy as np
    >>> from pathweave.fabric.builders import leaf_spine
    >>> from pathweave.sim import run_dynamic
    >>> from pathweave.traffic.trace import FlowTrace
    >>> fab = leaf_spine(leaves=2, hosts_per_leaf=1, spines=4)
    >>> tr = FlowTrace.from_flows([(0.0, 0, 1, 10**6)] * 8, num_ranks=2)
    >>> r = run_dynamic(fab, tr, "ecmp")
    >>> int(r.switches.sum()), len(set(r.first_path.tolist())) > 1
    (0, True)
    """

    name = "ecmp"
    summary = "static hash of each flow onto one equal-cost path"
    options: ClassVar[dict[str, Any]] = {}

    def assign(self, flows: np.ndarray, obs: Observation) -> list[PathChoice]:
        return self.ecmp_choice(flows, obs)
