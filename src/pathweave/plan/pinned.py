"""``pinned``: every pair on one path of chosen roles, to force a route on purpose.

Not a policy users pick for speed: it exists to pin traffic onto relay or
remote-rail (``drd``) paths, so tests and experiments exercise forwarding on
every call, or to reproduce a route seen elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pathweave.errors import PlanError
from pathweave.fabric import Fabric, PathSet, candidate_paths
from pathweave.fabric.paths import ROLES
from pathweave.plan._flows import first_matching, nonzero_pairs, plan_from_flows
from pathweave.plan._plan import Plan
from pathweave.plan.registry import as_demand


def pinned(
    fabric: Fabric,
    demand: np.ndarray,
    roles: Sequence[str],
    *,
    paths: PathSet | None = None,
) -> Plan:
    """All of each pair's bytes on its first candidate path whose role is in ``roles``.

    A pair with no such path keeps its first candidate path (the direct one
    inside a node), so the plan always carries the whole demand.

    Parameters
    ----------
    fabric, demand
        As for :func:`pathweave.plan.make`.
    roles
        Path roles from :data:`pathweave.fabric.paths.ROLES`: ``direct``,
        ``relay``, ``matched``, ``rd``, ``dr``, ``drd``, ``spine``.
    paths
        Candidate paths; default the fabric's cached set.

    Examples
    --------
    >>> import numpy as np, pathweave as pw
    >>> fab = pw.fabric.preset("h100-2x4")
    >>> D = np.zeros((8, 8)); D[1, 0] = D[5, 0] = 1 << 20
    >>> plan = pw.plan.pinned(fab, D, ["relay", "drd"])
    >>> [r.role for r in plan.routes(1, 0)], [r.role for r in plan.routes(5, 0)]
    (['relay'], ['drd'])
    """
    bad = [r for r in roles if r not in ROLES]
    if bad or not roles:
        raise PlanError(f"roles must be a non-empty list of {ROLES}, got {list(roles)!r}")
    demand = as_demand(demand, fabric.num_ranks)
    paths = candidate_paths(fabric) if paths is None else paths
    accept = np.isin(np.asarray(paths.role_code), [ROLES.index(r) for r in roles])
    pairs, nbytes = nonzero_pairs(demand)
    pid = first_matching(paths, pairs, accept)
    missing = pid < 0
    pid[missing] = paths.pair_ptr[pairs[missing]]
    return plan_from_flows(fabric, demand, paths, pid, nbytes, "pinned",
                           {"roles": list(roles)}).validate()
