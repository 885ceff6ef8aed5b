"""``optimal``: the exact min-congestion split over the candidate paths (LP).

Variables: ``x_p >= 0``, the megabytes on candidate path ``p`` of each pair
with demand, and ``Z``, the congestion in milliseconds.

    minimise    Z
    subject to  sum_{p of pair k} x_p = d_k                  for every pair k
                sum_{p through e} x_p / c_e  <=  Z           for every link e

Units are chosen for the solver: bytes and bytes/s give coefficients near
1e-11, which HiGHS treats as zero, so demands are in MB (1e6 bytes) and
capacities in MB/ms (= GB/s), giving coefficients near 1e-2 and ``Z`` in ms.
The solver's status is checked; anything but optimal raises
:class:`~pathweave.errors.SolverError` (a time-out included).

The fractional optimum is turned into whole bytes per path by largest
remainders within each pair, which conserves every pair's bytes exactly and
moves the congestion by at most a few bytes' worth (reported as
``info["optimum_s"]`` next to the rounded plan's ``congestion_s``).

This is the yardstick of every other policy: over the same candidate paths
no plan has a lower congestion than ``optimum_s``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pathweave import _check as _args
from pathweave.errors import PlanError, SolverError
from pathweave.fabric import Fabric, PathSet
from pathweave.plan._flows import matching_paths, nonzero_pairs, plan_from_flows
from pathweave.plan._plan import Plan
from pathweave.plan.registry import register

MB = 1e6
GBps = 1e9  # 1 GB/s == 1 MB/ms

_STATUS = {
    0: "optimal",
    1: "iteration or time limit reached",
    2: "infeasible",
    3: "unbounded",
    4: "numerical difficulties",
}


def round_within_pairs(which: np.ndarray, x_bytes: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Whole bytes per variable whose per-pair sums equal ``totals`` exactly.

    ``which[i]`` is the pair of variable ``i`` (non-decreasing). Each pair
    gets the floors plus one byte on its variables with the largest
    fractional parts (ties to the lower index).

    >>> round_within_pairs(np.array([0, 0, 1]), np.array([1.6, 1.4, 5.0]), np.array([3, 5]))
    array([2, 1, 5])
    """
    x = np.clip(x_bytes, 0.0, None)
    # Rescale so each pair sums exactly to its total before rounding.
    sums = np.bincount(which, weights=x, minlength=totals.size)
    counts = np.bincount(which, minlength=totals.size)
    scale = np.divide(totals, sums, out=np.zeros(totals.size), where=sums > 0)
    x = x * scale[which]
    even = (sums == 0) & (totals > 0)
    if even.any():  # all-zero solution for a pair with demand: spread evenly
        x = np.where(even[which], (totals / np.maximum(counts, 1))[which], x)
    fl = np.floor(x).astype(np.int64)
    short = totals - np.bincount(which, weights=fl, minlength=totals.size).astype(np.int64)
    frac = x - fl
    # order: by pair, then largest fraction first, then lower index
    order = np.lexsort((np.arange(x.size), -frac, which))
    starts = np.cumsum(counts) - counts
    rank_in_pair = np.empty(x.size, dtype=np.int64)
    rank_in_pair[order] = np.arange(x.size) - np.repeat(starts, counts)
    return fl + (rank_in_pair < short[which])


#: HiGHS methods ``optimal`` accepts.
METHODS = ("highs", "highs-ds", "highs-ipm")


def _check_options(*, time_limit_s: float, method: str) -> None:
    """Both options in range; PlanError (TypeError for a non-number) naming the first that
    is not."""
    _args.real("optimal option time_limit_s", time_limit_s, low=0.0, low_open=True,
               error=PlanError)
    if method not in METHODS:
        raise PlanError(f"optimal option method={method!r}: use {', '.join(METHODS)}")


@register(
    "optimal",
    summary="LP optimum (HiGHS) of min-congestion over the same candidate paths",
    check=_check_options,
)
def optimal(
    fabric: Fabric,
    demand: np.ndarray,
    paths: PathSet,
    *,
    time_limit_s: float = 120.0,
    method: str = "highs",
) -> Plan:
    """Solve the min-congestion LP; see the module docstring."""
    import scipy.optimize  # NOTE: here, not at the top: 0.26-0.38 s of every import pathweave
    import scipy.sparse

    _check_options(time_limit_s=time_limit_s, method=method)
    pairs, nbytes = nonzero_pairs(demand)
    if pairs.size == 0:
        return plan_from_flows(
            fabric,
            demand,
            paths,
            np.zeros(0),
            np.zeros(0),
            "optimal",
            {"optimum_s": 0.0, "solver_status": "optimal"},
        )
    which, pid = matching_paths(paths, pairs, np.ones(paths.num_paths, dtype=bool))
    nvar = pid.size
    # Link rows: one entry per (variable, link on its path).
    rows_links = paths.links[pid]
    mask = rows_links >= 0
    var_idx = np.broadcast_to(np.arange(nvar)[:, None], rows_links.shape)[mask]
    link_idx = rows_links[mask]
    used_links, link_row = np.unique(link_idx, return_inverse=True)
    cap = fabric.capacity_Bps[used_links] / GBps  # MB per ms
    coef = 1.0 / cap[link_row]
    nrow = used_links.size
    a_ub = scipy.sparse.csr_matrix(
        (
            np.concatenate([coef, -np.ones(nrow)]),
            (
                np.concatenate([link_row, np.arange(nrow)]),
                np.concatenate([var_idx, np.full(nrow, nvar)]),
            ),
        ),
        shape=(nrow, nvar + 1),
    )
    a_eq = scipy.sparse.csr_matrix(
        (np.ones(nvar), (which, np.arange(nvar))), shape=(pairs.size, nvar + 1)
    )
    c = np.zeros(nvar + 1)
    c[-1] = 1.0
    res = scipy.optimize.linprog(
        c,
        A_ub=a_ub,
        b_ub=np.zeros(nrow),
        A_eq=a_eq,
        b_eq=nbytes / MB,
        bounds=(0, None),
        method=method,
        options={"time_limit": float(time_limit_s), "presolve": True},
    )
    if res.status != 0 or res.x is None:
        raise SolverError(
            f"HiGHS did not solve the min-congestion LP ({nvar} variables, {nrow} link rows, "
            f"time limit {time_limit_s} s): status {res.status} "
            f"({_STATUS.get(res.status, 'unknown')}): {res.message}"
        )
    x_bytes = res.x[:nvar] * MB
    fb = round_within_pairs(which, x_bytes, nbytes)
    info = {
        "optimum_s": float(res.fun) * 1e-3,
        "solver_status": "optimal",
        "variables": int(nvar),
        "constraints": int(nrow + pairs.size),
    }
    keep = fb > 0
    return plan_from_flows(fabric, demand, paths, pid[keep], fb[keep], "optimal", info)


# ------------------------------------------------------------ time yardstick
def time_optimum(
    fabric: Fabric,
    demand: np.ndarray,
    paths: PathSet | None = None,
    *,
    model: Any = None,
    time_limit_s: float = 120.0,
    min_split_bytes: int = 1 << 20,
) -> Plan:
    """The time yardstick: a plan of least predicted time over the same paths (LP).

    The time model (:mod:`pathweave.plan.timemodel`) of a plan is
    ``max(setup + max_e (load_e / c_e + tail_e), max_f fixed_p + x_f / rate_p)``
    over used effective links ``e`` and used paths ``p``, where ``fixed_p``
    is a path's start plus fill and ``tail_e`` the largest fill on link
    ``e``. For a set ``S`` of usable paths, charging every link the largest
    fill of the paths in ``S`` through it (``tail_e(S)``; a fragment's fill
    counts at most a pair's bytes or one chunk), that is linear::

        minimise    T
        subject to  sum_{p of pair k} x_p = d_k
                    setup + tail_e(S) + sum_{p through e} x_p / c_e <= T     every effective link
                    fixed_p + x_p / rate_p <= T                              every p in S

    ``S`` grows with a threshold on ``fixed_p``: one LP per distinct
    threshold (each pair keeps at least one path) gives the optimum over
    plans whose paths all lie below it; each is solved again over the paths
    its solution used, each charged the fill of the fragment that solution
    gave it (an offered but empty path no longer raises its links' tails; a
    fragment below one chunk fills in less), ``TAIL_ROUNDS`` times at most.
    The least of these, each rounded to whole bytes and predicted with
    :func:`~pathweave.plan.timemodel.predict_time`, is returned.
    ``info["predicted_s"]`` is its predicted time. It is the least over
    these LPs, not a proven optimum over every plan: a link's tail depends
    on which paths a plan uses and how much each carries (not linear).
    Tests compare it with an exhaustive search over one pair's splits.

    Pairs below ``min_split_bytes`` stay whole on their ``static`` path, the
    rule every planner keeps (NIMBLE's size threshold): the model does not
    see what splitting small messages costs (many short flows sharing links
    max-min), so without the rule the yardstick would reward exactly the
    plans the threshold exists to prevent. ``min_split_bytes=0`` lifts it.
    """
    from pathweave.fabric import candidate_paths
    from pathweave.plan.registry import as_demand
    from pathweave.plan.timemodel import path_costs, predict_time

    ps = candidate_paths(fabric) if paths is None else paths
    demand = as_demand(demand, fabric.num_ranks)
    pairs, nbytes = nonzero_pairs(demand)
    if pairs.size == 0:
        return plan_from_flows(fabric, demand, ps, np.zeros(0), np.zeros(0), "time_optimum",
                               {"predicted_s": 0.0})
    pc = path_costs(ps, model)
    which, pid = matching_paths(ps, pairs, np.ones(ps.num_paths, dtype=bool))
    small = nbytes[which] < min_split_bytes
    if small.any():
        from pathweave.plan.static import static_pins

        keep = ~small | (pid == static_pins(ps)[pairs[which]])
        which, pid = which[keep], pid[keep]
    fixed = pc.fixed_s(pid)
    pair_min = np.full(pairs.size, np.inf)
    np.minimum.at(pair_min, which, fixed)
    levels = np.unique(np.round(fixed[fixed >= pair_min.max()], 9))
    best: Plan | None = None
    for level in levels:
        keep = fixed <= level + 1e-9
        for plan in _time_lps(fabric, demand, ps, pc, pairs, nbytes, which[keep], pid[keep],
                              time_limit_s):
            t = predict_time(plan, model)
            if best is None or t < best.info["predicted_s"]:
                plan.info["predicted_s"] = t
                plan.info["levels"] = int(levels.size)
                best = plan
    assert best is not None
    return best


#: Re-solves of one level's LP over the paths its previous solution used.
TAIL_ROUNDS = 3


def _time_lps(
    fabric: Fabric, demand: np.ndarray, ps: PathSet, pc: Any, pairs: np.ndarray,
    nbytes: np.ndarray, which: np.ndarray, pid: np.ndarray, time_limit_s: float,
) -> list[Plan]:
    """The LP over paths ``pid``, then again over what each solution used.

    Fills depend on the plan (not linear): a link's tail is the largest fill
    of a fragment on it, and a fragment below one chunk fills in less. The
    first LP charges every offered path a fill of its pair's bytes (one
    chunk at most); each next one keeps only the paths the last solution
    used (an empty one no longer raises its links' tails) and charges each
    the fill of the fragment the last solution gave it.
    """
    out = []
    frag = nbytes[which].astype(np.float64)
    for _ in range(TAIL_ROUNDS):
        plan = _time_lp(fabric, demand, ps, pc, pairs, nbytes, which, pid, frag, time_limit_s)
        out.append(plan)
        order = np.argsort(plan.flow_path, kind="stable")
        pos = np.minimum(np.searchsorted(plan.flow_path[order], pid), order.size - 1)
        used = plan.flow_path[order][pos] == pid
        got = plan.flow_bytes[order][pos].astype(np.float64)
        if used.all() and np.array_equal(got, frag):
            break
        which, pid, frag = which[used], pid[used], got[used]
    return out


def _time_lp(
    fabric: Fabric, demand: np.ndarray, ps: PathSet, pc: Any, pairs: np.ndarray,
    nbytes: np.ndarray, which: np.ndarray, pid: np.ndarray, frag: np.ndarray,
    time_limit_s: float,
) -> Plan:
    """One LP of :func:`time_optimum` over the variables ``pid``, each charged the
    fill of a fragment of ``frag`` bytes (units: MB and ms)."""
    import scipy.optimize  # as in optimal: only where an LP is solved
    import scipy.sparse

    nvar = pid.size
    rows_links = pc.links[pid]
    mask = rows_links >= 0
    var_idx = np.broadcast_to(np.arange(nvar)[:, None], rows_links.shape)[mask]
    used, link_row = np.unique(rows_links[mask], return_inverse=True)
    coef = GBps / pc.capacity_Bps[used][link_row]
    nrow = used.size
    # Each link's tail: the largest fill of a fragment it may carry.
    fill = pc.fill_s(pid, frag)
    tail = np.zeros(nrow)
    np.maximum.at(tail, link_row, fill[var_idx])
    rate = pc.rate_cap_Bps[pid] / GBps
    fin = np.isfinite(rate)
    fvars = np.flatnonzero(fin)
    t_col = np.full(nvar + 1, 0.0)
    a_ub = scipy.sparse.csr_matrix(
        (
            np.concatenate([coef, -np.ones(nrow), 1.0 / rate[fin], -np.ones(fvars.size)]),
            (
                np.concatenate([link_row, np.arange(nrow), nrow + np.arange(fvars.size),
                                nrow + np.arange(fvars.size)]),
                np.concatenate([var_idx, np.full(nrow, nvar), fvars, np.full(fvars.size, nvar)]),
            ),
        ),
        shape=(nrow + fvars.size, nvar + 1),
    )
    fixed = pc.start_s[pid] + fill
    b_ub = np.concatenate([-(pc.setup_s + tail) * 1e3, -fixed[fin] * 1e3])
    a_eq = scipy.sparse.csr_matrix(
        (np.ones(nvar), (which, np.arange(nvar))), shape=(pairs.size, nvar + 1)
    )
    t_col[-1] = 1.0
    res = scipy.optimize.linprog(
        t_col, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=nbytes / MB, bounds=(0, None),
        method="highs", options={"time_limit": float(time_limit_s), "presolve": True},
    )
    if res.status != 0 or res.x is None:
        raise SolverError(
            f"HiGHS did not solve the min-time LP ({nvar} variables): status {res.status} "
            f"({_STATUS.get(res.status, 'unknown')}): {res.message}"
        )
    # which may skip pairs' indices only if a pair lost all paths; levels prevent that
    fb = round_within_pairs(which, res.x[:nvar] * MB, nbytes)
    keep = fb > 0
    return plan_from_flows(fabric, demand, ps, pid[keep], fb[keep], "time_optimum",
                           {"lp_s": float(res.fun) * 1e-3})
