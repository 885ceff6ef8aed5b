"""``hscore``: rail routing by health scores (the Outshift h-score blog, part 2).

Pairs with demand are routed one after the other, whole (or sprayed), in a
fixed order (``order="size"``: largest demand first, ties by pair index;
``order="pair"``: pair index order), against the link loads ``L_e`` (bytes)
of the pairs routed before them.

The h-score
-----------
The blog asks for a score in ``[0, 1]`` where "a score of 1 signifies
line-rate without buffering delay" and lower means more delay, but leaves the
formula open. We score link ``e`` for a message of ``f`` bytes as

    H_e = (f / c_e) / ((L_e + f) / c_e) = f / (L_e + f)

the fraction of its line rate the message gets if it queues behind the
link's current load: the message alone takes ``f / c_e``, behind the
backlog ``(L_e + f) / c_e``. An idle link scores 1 and the score falls toward
0 as the backlog grows relative to the message. The capacity cancels: each
interface is scored against its own line rate, which is what makes the
blog's ratios of rail scores to domain scores (the h-ratio) dimensionless.
The flip side is that the score compares backlogs, not times: the same
bytes queued on a 120 GB/s NVLink and on a 50 GB/s rail give the same
score. A set of links (an interface, a rail crossing, a forward inside a
node) scores its minimum, ``f / (max_e L_e + f)``: a pipelined chain runs at
its worst link. A path scores the product of its interfaces' scores (the
blog's ``H(p_rd) = H(g1) * H(d2)``).

The rule, per inter-node pair ``G1 = s`` on node ``d1`` to ``G2 = d`` on ``d2``
---------------------------------------------------------------------------------
* ``g1``, ``g2``: the first rail of ``s`` and of ``d``. ``H(x)``: the score of
  the crossing on rail ``x``, the network links of the rail path via ``x``
  (source node's NIC -> rail ``x`` -> destination node's NIC; the PCIe hops
  to the NICs carry a subset of those bytes, so they never lower the
  minimum). ``H(d1)``: the dr path's forward inside the source node (``s`` ->
  the GPU on ``g2``); ``H(d2)``: the rd path's forward inside the destination
  node (the GPU on ``g1`` -> ``d``); an empty forward scores 1.
* h-ratios ``gamma(G1) = H(g1) / H(d1)``, ``gamma(G2) = H(g2) / H(d2)``. The
  *rd* path when ``gamma(G1) > gamma(G2)``, else *dr* (ties go to dr, NCCL's
  PXN path). If ``g1 == g2`` the rail-matched path is the baseline.
* Remote-rail theorem: rails other than ``g1``, ``g2`` with
  ``H(x) > m = max(gamma(G1), gamma(G2))`` are routable. If any is, the pair
  takes the *drd* path via the best fit, the routable rail with the lowest
  ``H(x)``, found by binary search (``np.searchsorted``) over the rail
  scores sorted ascending (ties by rail index). The list is sorted per pair:
  a crossing's score depends on the two nodes and on ``f``. The theorem is
  the blog's: it reads one score per domain, whereas here a drd path's
  forwards use their own links (other gateways), so the guarantee
  ``H(p_drd) > H(p_rd), H(p_dr)`` is the blog model's, not a per-link one.
* Corollary: ``H(x) <= 1``, so with ``gamma(G1) > 1`` or ``gamma(G2) > 1``
  (more precisely ``m >= 1``) no rail is routable and the search is skipped.
* Spraying (``spray_delta=delta``): when the theorem says remote rails pay
  off (some rail is routable), the pair's bytes are split evenly (whole
  bytes, earlier rails take the extra ones) over every rail whose ``H(x)``
  lies in ``[m - delta, m + delta]``, located by two binary searches (lower
  bound of ``m - delta``, upper bound of ``m + delta``), each over that rail's
  own path (matched, rd, dr or drd). An empty window falls back to the best
  fit. Spraying never starts without a routable rail, so the corollary holds
  for it too.
* Spines (rail-optimised fabrics): a spine path scores
  ``H(g1) * H(S) * H(g2)``: the source NIC's link up to rail ``g1``, the
  minimum over the spine's two links, rail ``g2``'s link down to the
  destination's NIC. The best spine path (ties to the lowest id) replaces the
  rail choice only if its product is strictly larger than the rail choice's
  product (``H(fwd in d1) * H(x) * H(fwd in d2)`` of the chosen path; the
  least of them when sprayed), so the rail-only route wins ties, as the blog
  argues it should for latency.

Intra-node pairs take the direct path (the blog covers rail routing only).
Fabrics off the blog's model (a GPU without a NIC, path rules or
``max_hops`` that removed the rd or dr path) take the rail path of highest
product, then the spine comparison; a pair with neither rail nor spine paths
takes its first candidate.

The planner is deterministic (fixed order, ties to the lowest rail and path
ids, integer bytes). The per-pair loop runs in a numba kernel
(:mod:`pathweave.plan._hscore_kernel`): work is proportional to the
candidate links of the pairs with demand.

Examples
--------
>>> import numpy as np, pathweave as pw
>>> fab = pw.fabric.preset("h100-2x4")
>>> D = np.zeros((8, 8)); D[0, 5] = 64 << 20
>>> [r.role for r in pw.plan.make(fab, D, "hscore").routes(0, 5)]  # idle: gammas tie
['dr']
>>> D[0, 4] = 256 << 20; D[1, 5] = 192 << 20   # routed first: both own rails busy
>>> [(r.role, r.via) for r in pw.plan.make(fab, D, "hscore").routes(0, 5)]
[('drd', 2)]
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

import numpy as np

from pathweave.errors import PlanError
from pathweave.fabric import Fabric, PathSet, VertexKind
from pathweave.plan import _hscore_kernel as _k
from pathweave.plan._flows import nonzero_pairs, plan_from_flows
from pathweave.plan._plan import Plan
from pathweave.plan.registry import register
from pathweave.plan.timemodel import _kernel_args, _model_key, path_costs

ORDERS = ("size", "pair")

#: Names of the decision codes, in code order (``Plan.info["decisions"]``).
DECISIONS = ("intra", "matched", "rd", "dr", "drd", "sprayed", "spine", "fallback", "other")


def _segments(paths: PathSet) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-path offsets ``(sf_end, core_lo, core_hi, df_lo)``, cached on the path set.

    The crossing of a rail or spine path is bounded by its first link into a
    rail switch and its last link out of one (see
    :func:`~pathweave.plan._hscore_kernel.path_segments`).
    """

    def build() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        fab = paths.fabric
        rail_v = fab.vertex_kind == int(VertexKind.RAIL)
        into_rail = rail_v[fab.link_dst]
        from_rail = rail_v[fab.link_src]
        gpu = fab.vertex_kind == int(VertexKind.GPU)
        segs = tuple(np.zeros(paths.num_paths, dtype=np.int32) for _ in range(4))
        _k.path_segments(paths.links, paths.length, into_rail, from_rail, gpu[fab.link_src],
                         gpu[fab.link_dst], *segs)
        for a in segs:
            a.setflags(write=False)
        return segs

    return paths.derived("hscore.segments", build)


def _kernel_tables(paths: PathSet) -> tuple:
    """:func:`~pathweave.plan._hscore_kernel.route_kernel`'s arguments that depend on
    the path set alone, in its order (``pair_ptr`` to ``num_rails``): one look-up
    per call instead of fifteen (~1 us of an 8-GPU plan)."""
    fab = paths.fabric
    return paths.derived("hscore.tables", lambda: (
        paths.pair_ptr, fab.vertex_node, fab.rank_vertex, paths.first_rail, paths.links,
        paths.length, paths.kind, paths.via, *_segments(paths), len(fab.rails)))


def _check_options(spray_delta: object, order: object) -> float:
    """Validate the options; return the spraying half-width (-1 when off)."""
    if order not in ORDERS:
        raise PlanError(f"hscore option order={order!r}: use one of {', '.join(ORDERS)}")
    if spray_delta is None:
        return -1.0
    if (
        isinstance(spray_delta, bool)
        or not isinstance(spray_delta, Real)
        or not math.isfinite(float(spray_delta))
        or float(spray_delta) < 0
    ):
        raise PlanError(
            f"hscore option spray_delta={spray_delta!r} must be None or a finite number >= 0"
        )
    return float(spray_delta)


#: ``hscore_below`` first routes this many pairs per rank (the largest, in
#: the planner's order) and stops there if they already pass the limit: the
#: largest pairs decide most plans that lose (at 64 GPUs the hot column's
#: first few), and the rest of the plan is not worth sorting.
HEAD_PAIRS_PER_RANK = 4
#: :func:`hscore_below` runs as one kernel call up to this many ranks (its path
#: tables are then copied once for the kernel: small).
BELOW_ONE_CALL_MAX_RANKS = 64

#: The dtype code of ``int64`` (a demand :func:`pathweave.plan.make` checked).
_INT64 = np.dtype(np.int64).char


def hscore_below(
    fabric: Fabric, demand: np.ndarray, paths: PathSet, stop_s: float, model: Any = None,
    *, spray_delta: float | None = None, order: str = "size",
) -> Plan | None:
    """:func:`hscore`'s plan, or None once its predicted time must be at least ``stop_s``.

    A plan's predicted time (:func:`~pathweave.plan.timemodel.predict_time`)
    is at least ``setup_s + load_e / c_e`` for each of its real links ``e``
    (``c_e`` its effective capacity under ``model``), and hscore only adds
    bytes to links as it routes; so routing stops, and None is returned, as
    soon as some link's load passes ``(stop_s - setup_s) * c_e``. With
    ``order="size"`` the largest ``HEAD_PAIRS_PER_RANK * N`` pairs are routed
    first on their own (the plan's first pairs: the same loads), and the
    rest only if they stay within the limit. A plan that is returned is
    :func:`hscore`'s, bit for bit.

    Examples
    --------
    >>> import pathweave as pw
    >>> fab = pw.fabric.preset("h100-2x4")
    >>> D = pw.traffic.hotspot(8, bytes_per_rank=256 << 20, ratio=0.9)
    >>> ps = pw.fabric.candidate_paths(fab)
    >>> t = pw.plan.predict_time(hscore(fab, D, ps))
    >>> hscore_below(fab, D, ps, 0.99 * t) is None
    True
    >>> int(hscore_below(fab, D, ps, t).flow_bytes.sum()) == int(D.sum())
    True
    """
    if (order == "size" and paths.num_ranks <= BELOW_ONE_CALL_MAX_RANKS
            and _kernel_ready(demand)):
        # The limits below, the head, the order and the routing in one kernel call.
        delta = _check_options(spray_delta, order)
        tables, width = _below_tables(paths, model)
        out = np.empty((3, width), dtype=np.int64)
        n = _k.route_below(demand, float(stop_s), HEAD_PAIRS_PER_RANK * paths.num_ranks,
                           *tables, delta, out)
        if n < 0:  # the usual answer inside the default policy: no views to take
            return None
        return _finish(fabric, demand, paths, spray_delta, order, n, out[0], out[1],
                       out[2, :_k.NUM_CODES])
    pc = path_costs(paths, model)
    # A hair above the exact limit: the prediction divides where this multiplies.
    limit = (float(stop_s) - pc.setup_s) * pc.capacity_Bps[: fabric.num_links] * (1.0 + 1e-9)
    return _plan(fabric, demand, paths, spray_delta, order, limit)


@register(
    "hscore",
    baseline=True,
    check=_check_options,
    summary=(
        "h-score rail routing: rd/dr by h-ratio, drd via remote-rail theorem, "
        "best-fit rail by binary search, optional spraying"
    ),
    below=hscore_below,  # NOTE: itself, no lambda around it: ~0.2 us of a default plan
)
def hscore(
    fabric: Fabric,
    demand: np.ndarray,
    paths: PathSet,
    *,
    spray_delta: float | None = None,
    order: str = "size",
) -> Plan:
    """Route every pair by the h-score rules (see the module docstring).

    Parameters
    ----------
    fabric
        The fabric.
    demand
        ``int64[N, N]`` whole bytes per ordered rank pair.
    paths
        Candidate paths compiled for ``fabric``.
    spray_delta
        ``None`` routes each pair over one path; a number ``delta >= 0`` sprays
        a pair that has routable remote rails evenly over every rail whose
        h-score lies within ``delta`` of ``m = max(gamma(G1), gamma(G2))``.
    order
        ``"size"`` (largest demand first, ties by pair index) or ``"pair"``
        (pair index order).

    Returns
    -------
    Plan
        ``info["decisions"]`` counts pairs per decision (``intra``,
        ``matched``, ``rd``, ``dr``, ``drd``, ``sprayed``, ``spine``,
        ``fallback``, ``other``).

    Raises
    ------
    PlanError
        On an unknown ``order`` or a ``spray_delta`` that is not ``None`` or a
        finite number >= 0.
    """
    plan = _plan(fabric, demand, paths, spray_delta, order, None)
    assert plan is not None  # no limit: never stopped
    return plan


def _below_tables(paths: PathSet, model: Any) -> tuple[tuple, int]:
    """:func:`~pathweave.plan._hscore_kernel.route_below`'s arguments from ``setup_s``
    to ``num_rails`` under ``model``, and the row length of its ``out`` (room for
    spraying: any ``delta``), in one look-up per call. The arrays are the kernel's
    own writable copies (:func:`~pathweave.plan.timemodel._kernel_args`: numba
    types a read-only array slower; small, for the path sets of
    :data:`BELOW_ONE_CALL_MAX_RANKS` GPUs and fewer that take this kernel)."""
    def build() -> tuple[tuple, int]:
        pc = path_costs(paths, model)
        args = _kernel_args(paths, ("hscore.below", _model_key(model)), lambda: (
            pc.setup_s, pc.capacity_Bps, paths.fabric.num_links, *_kernel_tables(paths)))
        return args, _k.below_width(paths.num_ranks, args[-1], 0.0)

    # NOTE: the kernel's arguments and the width kept together: two calls and
    # the width's arithmetic were ~0.5 us of every 8-GPU default plan.
    return paths.derived(("hscore.below", _model_key(model)), build)


def _kernel_ready(demand: np.ndarray) -> bool:
    """Whether the kernels read ``demand`` as it is: a checked demand (``int64``,
    C-contiguous, as :func:`pathweave.plan.make` hands it)."""
    return demand.dtype.char == _INT64 and demand.flags.c_contiguous


def _plan(
    fabric: Fabric, demand: np.ndarray, paths: PathSet, spray_delta: float | None, order: str,
    limit: np.ndarray | None,
) -> Plan | None:
    """The plan of :func:`hscore`, or None if a link passes ``limit`` (bytes per link)."""
    delta = _check_options(spray_delta, order)
    # Under a limit, in size order, the kernel routes a head of the largest pairs first.
    head = HEAD_PAIRS_PER_RANK * paths.num_ranks if limit is not None and order == "size" else 0
    if limit is None:
        limit = paths.derived("hscore.no_limit", lambda: np.full(fabric.num_links, np.inf))
    # NOTE: the kernel at every size: 2.2 vs 8.8 ms for numpy's at 1024 GPUs.
    pairs, nbytes = _k.nonzero_flat(demand) if _kernel_ready(demand) else nonzero_pairs(demand)
    return _finish(fabric, demand, paths, spray_delta, order,
                   *_route(paths, pairs, nbytes, head, order == "size", delta, limit))


def _finish(
    fabric: Fabric, demand: np.ndarray, paths: PathSet, spray_delta: float | None, order: str,
    n_out: int, out_pid: np.ndarray, out_bytes: np.ndarray, counts: np.ndarray,
) -> Plan | None:
    """The plan of the routed flows (None where routing stopped: ``n_out < 0``)."""
    if n_out < 0:
        return None
    info = {
        "order": order,
        "spray_delta": spray_delta,
        "decisions": dict(zip(DECISIONS, counts.tolist(), strict=True)),
        "remote_pairs": int(counts[_k.CODE_REMOTE] + counts[_k.CODE_SPRAY]),
    }
    return plan_from_flows(
        fabric, demand, paths, out_pid[:n_out], out_bytes[:n_out], "hscore", info
    )


def _route(
    paths: PathSet, pairs: np.ndarray, nbytes: np.ndarray, head: int, by_size: bool,
    delta: float, limit: np.ndarray,
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`~pathweave.plan._hscore_kernel.route_headed` over ``pairs``: ``(flows or
    -1, path ids, bytes, decision counts)``."""
    tables = _kernel_tables(paths)
    num_rails = tables[-1]
    cap = pairs.size * (max(num_rails, 1) if delta >= 0 else 1)
    out_pid = np.empty(cap, dtype=np.int64)
    out_bytes = np.empty(cap, dtype=np.int64)
    counts = np.zeros(_k.NUM_CODES, dtype=np.int64)
    n_out = _k.route_headed(pairs, nbytes, head, by_size, *tables, delta, limit, out_pid,
                            out_bytes, counts)
    return int(n_out), out_pid, out_bytes, counts
