"""The default policy, ``mintime``: the candidate plan of least predicted time.

pathweave's promise is "faster under skew, never slower". The congestion
bound alone does not keep it: forwarding costs time the bound does not see
(relay efficiency, per-forwarder set-up, pipeline fill, the NVLink-injection
and NIC-aggregate limits), and a min-congestion plan that forwards a lot can
be slower than plain rail striping with the same bound. ``mintime`` plans
several candidates and returns the one the time model
(:func:`pathweave.plan.timemodel.predict_time`) predicts fastest:

* every registered *baseline* the data plane runs (``static``, ``deepep``,
  ``hscore``; :func:`pathweave.plan.registry.baselines` with
  ``executable_only``), so by construction the result is never predicted
  slower than any of them. ``multirail`` (UCX) is a model of a peer whose
  route the data plane cannot take (:attr:`pathweave.plan.Policy.executable`):
  never a candidate, it is compared against in the benchmarks instead;
* ``mwu`` (NIMBLE's Algorithm 1, min-congestion over the real links);
* ``mwu_time``: the same kernel over the model's *effective* links (network
  efficiency, the virtual NVLink-injection and NIC-aggregate links) with each
  path's forwarding time (set-up per relay, pipeline fill) as its penalty
  over the pair's cheapest path.

Choosing. The executor shares every link in proportion to the fragments'
bytes (each round is a slice of the whole plan,
:mod:`pathweave.runtime.schedule`), the simulator shares links the same way
(weighted max-min, ``docs/simulator.md``), and the model's congestion bound
is what such sharing drains to. Over ``bench planner``'s cases up to 64 GPUs
(36 multi-path plans of ``mwu``, ``mwu_time`` and the time LP) the
simulator ends a median 0.02 % and at worst 0.6 % above the prediction, and
at or above it (up to 0.8 %) for the baselines' plans
(``docs/benchmarks.md``). When links were shared per fragment instead,
multi-path plans ended up to 17 % above their prediction and the margin was
12 %. So a multi-path candidate replaces the best baseline only if its
prediction is lower by more than ``margin`` (default 1 %: the worst error
measured, rounded up), and among baselines within ``tie`` (0.1 %, the
simulator's own tie noise; it was 0.2 % when baselines too were predicted
less exactly) of each other the first registered wins (``static`` before
``deepep`` before ``hscore``: the simplest; the model cannot tell such
plans apart).

Searching. Candidates that cannot be chosen are not planned
(:func:`search`): a cut lower bound of every plan's predicted time
(:func:`~pathweave.plan.timemodel.lower_bound_s`) rules out later
baselines once one reaches it (up to the links' tails) and the
multi-path candidates when no plan could beat the chosen baseline by
``margin``; ``static`` and ``deepep`` are scored from their stripes
without building their plans, and ``hscore`` stops routing as soon as its
loads prove it no faster than the fastest baseline so far
(:attr:`~pathweave.plan.Policy.below`; it is 1.15-4.3x the bound on
``bench planner``'s cases, where ``deepep`` is within 6 %). The result is
the plan the full search (``prune=False``) returns, but where a skipped
candidate would have been faster by less than the slack :func:`search`
allows.

:data:`pathweave.plan.DEFAULT_POLICY` (defined in the registry) names it;
:func:`pathweave.plan.make`, the Orchestrator and the CLI use it where no
policy is given.

Examples
--------
>>> import pathweave as pw
>>> fab = pw.fabric.preset("h100-2x4")
>>> D = pw.traffic.hotspot(8, bytes_per_rank=256 << 20, ratio=0.9)
>>> plan = pw.plan.make(fab, D)
>>> plan.policy, plan.info["chosen"]
('mintime', 'deepep')
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Any, NamedTuple

import numpy as np

from pathweave.errors import PlanError
from pathweave.fabric import Fabric, PathSet
from pathweave.plan._flows import single_paths, striped_plan
from pathweave.plan._mwu_kernel import compact_flows, refine_kernel
from pathweave.plan._plan import Plan
from pathweave.plan.mwu import DEFAULTS as MWU_DEFAULTS
from pathweave.plan.mwu import _check_options, class_tables, route
from pathweave.plan.registry import (
    DEFAULT_POLICY,
    Policy,
    baseline_names,
    baselines,
    policy_info,
    register,
)
from pathweave.plan.static import static_pins
from pathweave.plan.timemodel import (
    _frozen,
    _model_key,
    bound_scorer,
    path_costs,
    predict_time,
    stripe_scorer,
    tail_slack_s,
)

#: Multi-path candidates planned beside the baselines, in the order they are tried.
MULTIPATH = ("mwu_time", "mwu")

#: A candidate within this relative distance of the lower bound has reached it
#: (the bound and the scores sum the same loads in different orders).
BOUND_RTOL = 1e-12

#: A candidate within this share of the cut bound, and within the largest
#: tail a link can have, counts as reaching it (the bound has no tails).
#: Later baselines are skipped only within ``tie`` of it instead (see search).
REACH_RTOL = 0.01

#: The multi-path candidates plan in chunks of at least the largest pair / PLAN_PIECES.
PLAN_PIECES = 64



def _time_tables(paths: PathSet, model: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-path forwarding penalty (s) over the pair's cheapest path, and 1/capacity."""
    def build() -> tuple[np.ndarray, np.ndarray]:
        pc = path_costs(paths, model)
        fixed = pc.fixed_s(np.arange(paths.num_paths))
        ptr = paths.pair_ptr
        starts = ptr[:-1]
        nonempty = ptr[1:] > starts
        mins = np.zeros(starts.size)
        mins[nonempty] = np.minimum.reduceat(fixed, starts[nonempty])
        pen = fixed - np.repeat(mins, np.diff(ptr))
        inv = 1.0 / pc.capacity_Bps
        pen.setflags(write=False)
        inv.setflags(write=False)
        return pen, inv

    return paths.derived(("mwu_time.tables", _model_key(model)), build)


def _time_classes(paths: PathSet, model: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`~pathweave.plan.mwu.class_tables` of the effective links under ``model``."""
    pc = path_costs(paths, model)
    inv = _time_tables(paths, model)[1]
    return class_tables(paths, ("time", _model_key(model)), pc.links, pc.length, inv)


def _check_mwu_time(*, model: Any = None, **algorithm1: Any) -> None:
    _check_options(**algorithm1)


@register(
    "mwu_time",
    summary="Algorithm 1 over the time model's effective links, forwarding time as penalty",
    check=_check_mwu_time,
)
def mwu_time(
    fabric: Fabric,
    demand: np.ndarray,
    paths: PathSet,
    *,
    fraction: float = MWU_DEFAULTS["fraction"],
    chunk_bytes: int = MWU_DEFAULTS["chunk_bytes"],
    min_split_bytes: int = MWU_DEFAULTS["min_split_bytes"],
    refine: int = MWU_DEFAULTS["refine"],
    model: Any = None,
) -> Plan:
    """Time-aware MWU: see the module docstring."""
    _check_options(fraction=fraction, chunk_bytes=chunk_bytes, min_split_bytes=min_split_bytes,
                   refine=refine)
    pc = path_costs(paths, model)
    pen, inv = _time_tables(paths, model)
    # The cut bound less the set-up bounds every plan's most loaded effective
    # link's time: the certified target of refinement's early stop.
    return route(
        fabric, demand, paths, "mwu_time", ("time", _model_key(model)),
        pc.links, pc.length, pen, inv,
        fraction=fraction, chunk_bytes=chunk_bytes, min_split_bytes=min_split_bytes,
        refine=refine, bound=(model, pc.setup_s),
    )


def search(
    fabric: Fabric, demand: np.ndarray, paths: PathSet,
    multi: dict[str, Callable[[], Plan]] | Callable[[], dict[str, Callable[[], Plan]]],
    *, model: Any = None, margin: float, tie: float, prune: bool = True,
    first: str | None = None, sums: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[str, Plan, dict[str, float], float]:
    """Plan the candidates in order, skipping those that cannot be chosen.

    Baselines come first, in registration order, then the thunks of
    ``multi`` (each returns a multi-path candidate's plan; ``multi`` may be a
    function returning them, called only if one is tried). With ``prune``,
    :func:`~pathweave.plan.timemodel.lower_bound_s` (``lb``, a lower bound of
    every plan's predicted time) skips what :func:`choose` could not pick.
    The bound has no link tails (a link's tail, the largest fill of its
    fragments, depends on how a plan splits), so a candidate *reaches* it
    within ``slack``: the largest tail any link can have
    (:func:`~pathweave.plan.timemodel.tail_slack_s`, 37-39 us on the
    presets) but at most ``REACH_RTOL`` (1 %) of the bound:

    * a later baseline when the best baseline so far is within the largest
      tail and ``tie`` of ``lb`` (it could only be faster by less than a tie,
      which the earlier one wins anyway; with the 1 % slack ``static`` was
      kept 0.11 % slower than ``deepep``, then named multirail, on h100-2x4,
      hotspot:0.1);
    * every multi-path candidate when ``(lb + slack) * (1 + margin)`` is at
      least the chosen baseline's time (none could clear the margin by more
      than ``slack``);
    * the remaining multi-path candidates once one reaches ``lb``.

    A baseline with a :attr:`~pathweave.plan.Policy.below` (``hscore``) is
    given the fastest baseline time so far and skipped if it proves itself
    no faster: :func:`choose` ranks baselines from the fastest, so one that
    is not faster changes nothing (exact, no slack).

    So the pruned search returns the plan the full one would, but where a
    skipped candidate would have been faster by less than ``slack`` (tested
    on random cases: none differed). Exchanges of a few milliseconds and
    more prune as before; below, where a tail is over 1 % of the time,
    every baseline is scored (``hscore`` until it loses).

    ``first`` (a baseline or a key of ``multi``; the previous step's winner
    in :func:`replan`) is scored before anything else and returned at once
    if it reaches the bound; else its score (and plan) is kept, not
    computed again, and the search goes on. ``sums``: the demand's row and column sums, if
    the caller has them (passed to :func:`~pathweave.plan.timemodel.lower_bound_s`).

    Returns
    -------
    name, plans, times_s, bound_s
        The chosen candidate, the plans and predicted times of the planned
        candidates, and the bound (0.0 without ``prune``).
    """
    tab = _tables(paths, model)
    dem = _frozen(demand)  # what the bound and the stripe scorers read
    lb = tab.bound(dem, sums) if prune else 0.0
    slack = tab.slack_s if prune else 0.0
    reach = lb + min(slack, REACH_RTOL * lb) if prune else 0.0
    reach_base = lb + min(slack, tie * lb) if prune else 0.0
    plans: dict[str, Plan] = {}
    times: dict[str, float] = {}
    lazy = [multi]
    tried: list[str] = []  # the multi-path candidates scored

    def candidates() -> dict[str, Callable[[], Plan]]:
        # The multi-path thunks, built on first use (most 8-GPU plans never try one).
        if callable(lazy[0]):
            lazy[0] = lazy[0]()
        return lazy[0]

    def score(name: str, stop_s: float | None = None) -> None:
        # NOTE: multi-path candidates are never baselines: index -1.
        i = tab.index.get(name, -1)
        if i >= 0 and tab.scorers[i] is not None:  # scored without building the plan
            times[name] = tab.scorers[i](dem)
            return
        pol = tab.pols[i] if i >= 0 else None
        if pol is not None and pol.below is not None and stop_s is not None:
            p = pol.below(fabric, demand, paths, stop_s, model)
            if p is None:  # predicted at least stop_s: not the fastest baseline
                return
            plans[name] = p
        elif pol is None:
            plans[name] = candidates()[name]()
            tried.append(name)
        else:
            plans[name] = pol.func(fabric, demand, paths)
        times[name] = predict_time(plans[name], model)

    best = np.inf  # the fastest baseline so far
    if prune and first is not None and (first in tab.index or first in candidates()):
        score(first)
        if times[first] <= reach * (1.0 + BOUND_RTOL):
            if first not in plans:
                plans[first] = _build(fabric, demand, paths, tab, first)
            return first, plans[first], times, lb
        if first in tab.index:
            best = times[first]
    for name, scorer in zip(tab.base, tab.scorers, strict=True):
        if name in times or reach_base >= best:
            continue
        if scorer is not None:  # NOTE: score()'s first case inline: two per 8-GPU plan
            t = times[name] = scorer(dem)
        else:
            # A baseline that cannot beat the fastest so far cannot change the
            # choice (choose() ranks baselines from the fastest): stop it early.
            score(name, best if prune and best < np.inf else None)
            t = times.get(name, np.inf)
        if t < best:
            best = t
    pick = _choose(times, tab.index, margin, tie, base_only=True)
    if reach * (1.0 + margin) < times[pick] and candidates():
        for name in candidates():
            if name not in times:
                score(name)
            if times[name] <= reach * (1.0 + BOUND_RTOL):
                break
    if tried:  # else the choice among the baselines stands
        pick = _choose(times, tab.index, margin, tie)
    if pick not in plans:
        plans[pick] = _build(fabric, demand, paths, tab, pick)
    return pick, plans[pick], times, lb


def _build(fabric: Fabric, demand: np.ndarray, paths: PathSet, tab: _Tables, name: str) -> Plan:
    """The plan of policy ``name``; a baseline with stripes from the kept tables (its
    plan is its stripes' by :attr:`~pathweave.plan.Policy.stripes`' contract)."""
    i = tab.index.get(name, -1)
    if i >= 0 and tab.stripes[i] is not None:
        return striped_plan(fabric, demand, paths, *tab.stripes[i], name)
    return policy_info(name).func(fabric, demand, paths)


class _Tables(NamedTuple):
    """What :func:`search` reads per path set and model, whatever the demand."""

    #: The executable baselines in registration order, and each one's position.
    base: tuple[str, ...]
    index: dict[str, int]
    pols: tuple[Policy, ...]
    #: A baseline with stripes: its score as a function of the demand
    #: (:func:`~pathweave.plan.timemodel.stripe_scorer`); None otherwise.
    scorers: tuple[Callable[[np.ndarray], float] | None, ...]
    slack_s: float
    #: The cut bound as a function of the demand and its sums
    #: (:func:`~pathweave.plan.timemodel.bound_scorer`).
    bound: Callable[[np.ndarray, tuple[np.ndarray, np.ndarray] | None], float]
    #: A baseline with stripes: ``(stripes, single_paths map)``; None otherwise.
    stripes: tuple[tuple[tuple[np.ndarray, np.ndarray], np.ndarray | None] | None, ...]


def _tables(paths: PathSet, model: Any) -> _Tables:
    """:class:`_Tables`, kept with ``paths`` (rebuilt when a baseline registers)."""
    base = baseline_names(True)

    def build() -> _Tables:
        pols = tuple(policy_info(n) for n in base)
        stripes = tuple(None if p.stripes is None else p.stripes(paths) for p in pols)
        scorers = tuple(None if st is None else stripe_scorer(paths, st, model, key=p.name)
                        for p, st in zip(pols, stripes, strict=True))
        return _Tables(base, {n: i for i, n in enumerate(base)}, pols, scorers,
                       tail_slack_s(paths, model), bound_scorer(paths, model),
                       tuple(None if st is None else (st, single_paths(paths, st, p.name))
                             for p, st in zip(pols, stripes, strict=True)))

    return paths.derived(("mintime.search", _model_key(model), base), build)


def _multipath(
    fabric: Fabric, demand: np.ndarray, paths: PathSet, *, chunk_bytes: int,
    min_split_bytes: int, model: Any = None,
) -> dict[str, Callable[[], Plan]]:
    """Thunks planning ``mwu_time`` and ``mwu`` (none when no pair is large enough to split)."""
    largest = int(demand.max(initial=0))
    if largest < min_split_bytes:
        return {}
    # Planning granularity: at least 1/PLAN_PIECES of the largest pair. Finer
    # chunks cost planning time (13x at 64 GPUs, 256 MiB per rank) and moved
    # no prediction by more than 0.01 % over the benchmark workloads.
    split = {"chunk_bytes": max(chunk_bytes, largest // PLAN_PIECES),
             "min_split_bytes": min_split_bytes}
    mwu = policy_info("mwu").func
    return {
        "mwu_time": lambda: mwu_time(fabric, demand, paths, model=model, **split),
        "mwu": lambda: mwu(fabric, demand, paths, **split),
    }


def choose(times_s: dict[str, float], *, margin: float, tie: float) -> str:
    """The chosen candidate's name among ``times_s``'s (rule in the module docstring)."""
    return _choose(times_s, frozenset(baselines(executable_only=True)), margin, tie)


def _choose(times_s: dict[str, float], base: Collection[str], margin: float, tie: float,
            *, base_only: bool = False) -> str:
    """:func:`choose` given the baselines' names (``base_only``: among them alone)."""
    # NOTE: plain loops, no lists or generators: choose ran twice per 8-GPU plan at
    # ~5 us each, and each generator cost ~0.4 us of the 1.3 us left.
    best_base = np.inf
    for n, t in times_s.items():
        if n in base and t < best_base:
            best_base = t
    near = best_base * (1.0 + tie)
    # The first within tie of the fastest, in times_s's order: the simplest.
    for n, t in times_s.items():
        if n in base and t <= near:
            pick = n
            break
    if base_only:
        return pick
    m, tm = None, np.inf
    for n, t in times_s.items():
        if n not in base and (m is None or t < tm):
            m, tm = n, t
    if m is not None and tm * (1.0 + margin) < times_s[pick]:
        return m
    return pick


def _check_rule(margin: float, tie: float) -> None:
    if 0.0 <= margin < 1.0 and 0.0 <= tie < 1.0:  # NOTE: every plan passes here: no loop
        return
    for name, v in (("margin", margin), ("tie", tie)):
        if not (0.0 <= v < 1.0):
            raise PlanError(f"mintime option {name}={v!r} must lie in [0, 1)")


def _check_mintime(*, chunk_bytes: int, min_split_bytes: int, margin: float, tie: float,
                   **_: Any) -> None:
    _check_options(fraction=MWU_DEFAULTS["fraction"], chunk_bytes=chunk_bytes,
                   min_split_bytes=min_split_bytes, refine=MWU_DEFAULTS["refine"])
    _check_rule(margin, tie)


@register(
    DEFAULT_POLICY,
    summary="default: the least predicted time of every baseline, mwu_time and mwu",
    check=_check_mintime,
)
def mintime(
    fabric: Fabric,
    demand: np.ndarray,
    paths: PathSet,
    *,
    chunk_bytes: int = MWU_DEFAULTS["chunk_bytes"],
    min_split_bytes: int = MWU_DEFAULTS["min_split_bytes"],
    model: Any = None,
    margin: float = 0.01,
    tie: float = 0.001,
    prune: bool = True,
) -> Plan:
    """Plan the candidates and return the fastest in prediction (module docstring)."""
    _check_rule(margin, tie)
    name, p, times, lb = search(
        fabric, demand, paths,
        lambda: _multipath(fabric, demand, paths, chunk_bytes=chunk_bytes,
                           min_split_bytes=min_split_bytes, model=model),
        model=model, margin=margin, tie=tie, prune=bool(prune))
    info = {**p.info, "chosen": name, "predicted_s": times[name],
            "candidates_s": dict(times), "bound_s": lb}
    return _as_default(p, demand, 0.0, info)


def _as_default(p: Plan, demand: np.ndarray, plan_s: float, info: dict[str, Any]) -> Plan:
    """:func:`search`'s plan ``p`` as the default policy's: the same flows, renamed.

    NOTE: in place: every plan :func:`search` returns was made for that call
    and no one else holds it (a copy was ~0.6 us of an 8-GPU plan); what the
    plan cached of its flows (link loads) stays true.
    """
    p.__dict__.update(demand=demand, policy=DEFAULT_POLICY, plan_s=plan_s, info=info)
    return p


#: The default policy's options and their defaults (declared once, in :func:`mintime`'s
#: signature).
MINTIME_DEFAULTS: dict[str, Any] = policy_info(DEFAULT_POLICY).options


# ------------------------------------------------------------ incremental replan
def warm_start(
    prev: Plan, demand: np.ndarray, *, model: Any = None, chunk_bytes: int,
    min_split_bytes: int, refine: int = 2, fraction: float = MWU_DEFAULTS["fraction"],
) -> Plan:
    """``mwu_time`` started from ``prev``'s split instead of from scratch.

    Each pair keeps ``prev``'s shares of its paths, applied to its new bytes
    (new pairs and pairs below ``min_split_bytes`` go whole on their static
    path); then ``refine`` rip-up-and-re-route passes over the hot links
    (:func:`~pathweave.plan._mwu_kernel.refine_kernel`) move what the new
    demand overloads.
    """
    ps = prev.paths
    flat = demand.reshape(-1)
    pairs = np.flatnonzero(flat)
    pins = static_pins(ps)
    dem = flat[pairs].astype(np.int64)
    small = dem < min_split_bytes
    lo = np.where(small, pins[pairs], ps.pair_ptr[pairs])
    hi = np.where(small, pins[pairs] + 1, ps.pair_ptr[pairs + 1])
    off = np.concatenate([[0], np.cumsum(hi - lo)])
    kidx = np.full(flat.size, -1, dtype=np.int64)
    kidx[pairs] = np.arange(pairs.size)
    # The previous shares, applied to the new bytes (rounded down).
    pf, fp, fb = prev._pair_of_flow, prev.flow_path, prev.flow_bytes
    prev_tot = np.bincount(pf, weights=fb, minlength=flat.size)
    k = kidx[pf]
    ok = (k >= 0) & (fb > 0)
    ok[ok] &= (fp[ok] >= lo[k[ok]]) & (fp[ok] < hi[k[ok]])
    k, fpk = k[ok], fp[ok]
    share = np.floor(dem[k] * (fb[ok] / prev_tot[pf[ok]])).astype(np.int64)
    nslot = int(off[-1])
    flow = np.bincount(off[k] + fpk - lo[k], weights=share, minlength=nslot)
    # What rounding or new pairs leave goes to the static path.
    got = np.bincount(k, weights=share, minlength=pairs.size)
    flow += np.bincount(off[:-1] + pins[pairs] - lo, weights=dem - got, minlength=nslot)
    flow = np.rint(flow).astype(np.int64)
    pen, _ = _time_tables(ps, model)
    clinks, clength, inv = _time_classes(ps, model)
    slot_path = np.repeat(lo - off[:-1], hi - lo) + np.arange(nslot)
    rows = clinks[slot_path]
    m = rows >= 0
    load = np.bincount(rows[m], weights=np.broadcast_to(flow[:, None], rows.shape)[m],
                       minlength=inv.size).astype(np.float64)
    refine_kernel(lo, hi, dem, off, clinks, clength, pen, inv, float(fraction),
                  np.int64(chunk_bytes), np.int64(min_split_bytes), np.int64(refine), load,
                  flow)
    pid, nb = compact_flows(lo, hi, flow)
    pid.setflags(write=False)
    nb.setflags(write=False)
    return Plan(prev.fabric, ps, demand, pid, nb, "mwu_time", 0.0, {"warm_start": True})


def replan(
    prev: Plan, demand: Any, *, model: Any = None, chunk_bytes: int | None = None,
    min_split_bytes: int | None = None, margin: float | None = None, tie: float | None = None,
) -> Plan:
    """Plan ``demand`` from ``prev`` (a plan on the same paths): the incremental default policy.

    When the demand changes a little (the next MoE step), the previous
    split is a good start: :func:`warm_start` applies it to the new bytes and
    re-routes only what got hot. The previous step's winner (the warm start
    if a multi-path plan won) is scored first and kept at once if it reaches
    the cut bound (:func:`~pathweave.plan.timemodel.lower_bound_s`): nothing
    can be faster. Otherwise the result competes with every baseline exactly
    as in ``mintime`` (the same pruned :func:`search`), so a replan is never
    predicted slower than a baseline either; ``info["chosen"]`` says which
    won (``"warm"`` for the warm start).

    Examples
    --------
    >>> import pathweave as pw
    >>> fab = pw.fabric.preset("h100-2x4")
    >>> D1 = pw.traffic.parse_workload("stencil:dims=2", 8, bytes_per_rank=256 << 20)
    >>> p1 = pw.plan.make(fab, D1)
    >>> p2 = pw.plan.replan(p1, D1 * 1.1 // 1)
    >>> p2.policy, p2.info["chosen"]
    ('mintime', 'warm')
    """
    from pathweave.plan.registry import demand_bytes

    d = MINTIME_DEFAULTS
    chunk = d["chunk_bytes"] if chunk_bytes is None else chunk_bytes
    split = d["min_split_bytes"] if min_split_bytes is None else min_split_bytes
    t0 = time.perf_counter()
    checked = demand_bytes(demand, prev.paths.num_ranks)
    dem = checked.bytes
    margin = d["margin"] if margin is None else margin
    tie = d["tie"] if tie is None else tie
    _check_rule(margin, tie)
    fab, ps = prev.fabric, prev.paths
    multi: dict[str, Callable[[], Plan]] = {}
    if checked.largest >= split:
        multi["warm"] = lambda: warm_start(prev, dem, model=model, chunk_bytes=chunk,
                                           min_split_bytes=split)
    prev_pick = prev.info.get("chosen")
    first = "warm" if prev_pick in ("warm", *MULTIPATH) else prev_pick
    name, p, times, lb = search(fab, dem, ps, multi, model=model, margin=margin, tie=tie,
                                first=first, sums=(checked.rows, checked.cols))
    info = {"chosen": name, "predicted_s": times[name], "candidates_s": dict(times),
            "bound_s": lb}
    return _as_default(p, dem, time.perf_counter() - t0, info)
