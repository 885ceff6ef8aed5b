"""``mwu``: NIMBLE's multiplicative-weights min-congestion planner (Algorithm 1).

For every pair with bytes left, in a fixed order, take a fraction ``fraction``
(the paper's lambda) of its residual, rounded down to whole ``chunk_bytes``
(its epsilon; the last residual below one chunk goes whole), and put it on
the candidate path of least cost; then raise the cost of the links it used.
Sweep until every byte is routed.

Pieces (our addition). A visit's share is placed in up to as many pieces as
the pair has candidate paths, each of at least two chunks and each on the
path cheapest at that moment. Algorithm 1 puts the whole share on one path,
so a pair that is alone on its links ends with half its bytes on one path
after the first sweep; with pieces, a lone 400 MB pair lands within 1 % of
the optimum over its four rails.

Cost. A link's cost is ``F(L_e) = (L_e + f) / capacity_e``, the time the link
needs for its load including the piece being placed; a path costs the
maximum over its links (the bottleneck: forwarding is pipelined, so a path
runs at its slowest link, Sec. IV-B). Because the path cost is a maximum,
any increasing transform of the link cost (the exponential of
Garg-Koenemann included) picks the same path; the time form keeps costs in
seconds so the size-aware penalty can be added to it:

    cost(path) = max_e (L_e + f) / c_e  +  hop_penalty_s * extra_hops(path)

where ``extra_hops`` counts links beyond the pair's shortest candidate. A
piece of 64 MB on 120 GB/s links takes 530 us, so a few microseconds of
penalty are noise; for a 256 KB piece (2 us) they keep traffic on the
shortest path unless that path is badly loaded, which is the paper's
"significant penalty when the message size is not large enough".

Size threshold. Pairs below ``min_split_bytes`` (default 1 MiB) go whole on
their ``static`` path (Sec. V-B: multi-path, forwarding included, is
disabled for <= 1 MB), so a small pair is never split nor relayed.

Refinement (our addition). After the sweeps, up to ``refine`` passes
(default 1) rip up and re-route each pair that touches a link loaded to at
least 90 % of the maximum, against everybody else's load (same step rule);
pairs smaller than four chunks stay put. This removes the bias of the fixed
pair order: without it a 1-D stencil on ``h100-2x4`` ends 5.5 % above the LP
optimum, with it at the optimum. ``refine=0`` is the paper's sweep alone.

Early stop on a certified gap (our addition). No pass starts once the
congestion is within ``CERTIFIED_GAP`` (1 %) of the cut bound
(:func:`~pathweave.plan.timemodel.lower_bound_s` with
:meth:`SimModel.ideal() <pathweave.sim.SimModel.ideal>`: every byte leaves
its GPU and its node, and enters them, over the links crossing out of and
into them), a lower bound of every plan's congestion and so of the LP
optimum: the plan is then certified within 1 % of the optimum, which a pass
could at best approach. On the planner benchmark up to 64 GPUs the bound
equals the LP optimum and the sweeps alone end within 0.6 % of it, so the
pass is skipped there; it was 10-100 % of the planning time and moved the
gap by -0.2 % to +0.4 %. Over the benchmark ``mwu`` is at most 0.75 % above
the optimum (``docs/benchmarks.md``).

Link classes (no effect on plans). Links on exactly the same candidate paths
carry the same bytes under every plan; the kernel keeps one load per such
class, priced with its largest ``1/capacity`` (:func:`class_tables`), so each
path cost is the same number over fewer links (5.4 -> 2.2 per path on
``h100-2x4``).

The planner is deterministic: a fixed pair order, a fixed path order, ties to
the lowest path id, integer bytes.
"""

from __future__ import annotations

import numpy as np

from pathweave import _check as _args
from pathweave._cache import Cache
from pathweave.errors import PlanError
from pathweave.fabric import Fabric, PathSet
from pathweave.plan._mwu_kernel import link_classes, route_cut, route_pinned
from pathweave.plan._plan import Plan
from pathweave.plan.model import SimModel
from pathweave.plan.registry import register
from pathweave.plan.static import static_pins
from pathweave.plan.timemodel import _frozen, _model_key, cut_tables, ideal_model

#: Refinement stops once the congestion is within this share of the cut bound.
CERTIFIED_GAP = 0.01

DEFAULTS = {
    "fraction": 0.5,
    "chunk_bytes": 1 << 20,
    "min_split_bytes": 1 << 20,
    "hop_penalty_s": 2e-6,
    "refine": 1,
}


def _derived(paths: PathSet, hop_penalty_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-path hop penalty (s) and per-link 1/capacity, kept with the path set."""

    def build() -> tuple[np.ndarray, np.ndarray]:
        penalty = _readonly(_extra_hops(paths) * float(hop_penalty_s))
        return penalty, _readonly(1.0 / paths.fabric.capacity_Bps)

    # One look-up per plan: the key is the option as given (a float or an int
    # of equal value finds the same tables).
    return paths.derived(("mwu.tables", hop_penalty_s), build)


def class_tables(
    paths: PathSet, key: object, links: np.ndarray, length: np.ndarray, inv_cap: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(clinks, clength, class_inv)``: ``links`` grouped into link classes, kept with
    the path set under ``key`` (which names the tables: the same ``key``, the same
    ``links`` and ``inv_cap``).

    Links on exactly the same paths always carry the same bytes
    (:func:`~pathweave.plan._mwu_kernel.link_classes`): the kernels keep one
    load per class, priced with the class's largest ``1/capacity``
    (``class_inv``), and see the same costs bit for bit over fewer links.
    """

    def build() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cls, clinks, clength, _ = _classes(paths, key, links, length, inv_cap.size)
        return clinks, clength, _readonly(class_inv(cls, inv_cap))

    return paths.derived(("mwu.class_tables", key), build)


def _classes(
    paths: PathSet, key: object, links: np.ndarray, length: np.ndarray, num_links: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """:func:`~pathweave.plan._mwu_kernel.link_classes` of ``links``, kept under ``key``."""

    def build() -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        cls, clinks, clength, n = link_classes(links, length, np.int64(num_links))
        return _readonly(cls), _readonly(clinks), _readonly(clength), int(n)

    return paths.derived(("mwu.classes", key), build)


def class_inv(cls: np.ndarray, inv_cap: np.ndarray) -> np.ndarray:
    """``float64[classes]``: the largest ``inv_cap`` of each link class (0 if none)."""
    out = np.zeros(int(cls.max(initial=-1)) + 1)
    used = cls >= 0
    np.maximum.at(out, cls[used], inv_cap[used])
    return out


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _extra_hops(paths: PathSet) -> np.ndarray:
    """Links of each path beyond the shortest candidate of its pair."""
    ln = paths.length.astype(np.int64)
    starts = paths.pair_ptr[:-1]
    nonempty = paths.pair_ptr[1:] > starts
    mins = np.zeros(paths.pair_ptr.size - 1, dtype=np.int64)
    mins[nonempty] = np.minimum.reduceat(ln, starts[nonempty])
    return ln - np.repeat(mins, np.diff(paths.pair_ptr))


def _check(name: str, value: float, lo: float, hi: float, lo_open: bool = False) -> None:
    """An ``mwu`` option in ``[lo, hi]`` (``(lo, hi]``); PlanError naming it otherwise."""
    _args.real(f"mwu option {name}", value, low=lo, high=hi, low_open=lo_open, error=PlanError)


def _check_options(
    *, fraction: float, chunk_bytes: int, min_split_bytes: int, refine: int,
    hop_penalty_s: float = 0.0,
) -> None:
    """Every Algorithm-1 option in range (``mwu``'s, and ``mwu_time``'s, which has no
    hop penalty); PlanError naming the first that is not."""
    # NOTE: every plan checks its options, and five checks cost ~3 us of a
    # ~50 us plan at 8 ranks; a set of options once found valid is not checked
    # again. Types are part of the key: True == 1, but refine=True is refused.
    key = (type(fraction), fraction, type(chunk_bytes), chunk_bytes, type(min_split_bytes),
           min_split_bytes, type(hop_penalty_s), hop_penalty_s, type(refine), refine)
    try:
        if key in _VALID_OPTIONS:
            return
    except TypeError:  # an unhashable value: the checks below name it
        pass
    _check("fraction", fraction, 0.0, 1.0, lo_open=True)
    _check("chunk_bytes", chunk_bytes, 1, 2**62)
    _check("min_split_bytes", min_split_bytes, 0, 2**62)
    _check("hop_penalty_s", hop_penalty_s, 0.0, 1.0)
    _check("refine", refine, 0, 1000)
    _VALID_OPTIONS.put(key, True)


#: Option sets :func:`_check_options` found valid, the last 64 found (a hit
#: does not refresh one: a sweep over many values keeps checking, it does
#: not grow the cache).
_VALID_OPTIONS: Cache[bool] = Cache(64)


@register(
    "mwu",
    summary="NIMBLE Algorithm 1: multiplicative-weights min-congestion over all candidate paths",
    check=_check_options,
)
def mwu(
    fabric: Fabric,
    demand: np.ndarray,
    paths: PathSet,
    *,
    fraction: float = DEFAULTS["fraction"],
    chunk_bytes: int = DEFAULTS["chunk_bytes"],
    min_split_bytes: int = DEFAULTS["min_split_bytes"],
    hop_penalty_s: float = DEFAULTS["hop_penalty_s"],
    refine: int = DEFAULTS["refine"],
) -> Plan:
    """Plan with NIMBLE's Algorithm 1 (see the module docstring)."""
    _check_options(fraction=fraction, chunk_bytes=chunk_bytes, min_split_bytes=min_split_bytes,
                   hop_penalty_s=hop_penalty_s, refine=refine)
    penalty, inv_cap = _derived(paths, hop_penalty_s)
    return route(
        fabric, demand, paths, "mwu", "real", paths.links, paths.length, penalty, inv_cap,
        fraction=fraction, chunk_bytes=chunk_bytes, min_split_bytes=min_split_bytes,
        refine=refine, bound=(ideal_model(), 0.0),
    )


def route_flows(
    paths: PathSet,
    demand_flat: np.ndarray,
    inv_cap_per_link: np.ndarray,
    *,
    fraction: float = DEFAULTS["fraction"],
    chunk_bytes: int = DEFAULTS["chunk_bytes"],
    min_split_bytes: int = DEFAULTS["min_split_bytes"],
    hop_penalty_s: float = DEFAULTS["hop_penalty_s"],
    refine: int = DEFAULTS["refine"],
    pin_small: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Route a flat demand with the Algorithm-1 kernel against any per-link cost.

    The entry point for callers that price links themselves (an online
    policy's capacity left after background traffic) and need flows, not a
    :class:`~pathweave.plan.Plan`.

    Parameters
    ----------
    paths
        Candidate paths; ``demand_flat[s * N + d]`` are the bytes of pair ``(s, d)``.
    demand_flat
        ``int64[N * N]`` bytes per ordered pair.
    inv_cap_per_link
        ``float64[num_links]``: seconds per byte of each link (1 / capacity).
    fraction, chunk_bytes, min_split_bytes, hop_penalty_s, refine
        The ``mwu`` options (see the module docstring); not checked here.
    pin_small
        Pin pairs below ``min_split_bytes`` to their ``static`` path, as the
        ``mwu`` planner does; if ``False`` they are routed whole on the
        cheapest path.

    Returns
    -------
    path_ids, flow_bytes : numpy.ndarray
        ``int64`` flows sorted by pair and path, without repeats.
    """
    penalty, _ = _derived(paths, hop_penalty_s)
    # Read-only demand and prices and stop_s given: the planner's own call's
    # types, one compiled version.
    flat = _frozen(demand_flat)
    pin = static_pins(paths) if pin_small else _no_pins(paths)
    # The caller's prices change per call: the classes are kept, their prices are not.
    cls, clinks, clength, _ = _classes(paths, "real", paths.links, paths.length,
                                       paths.fabric.num_links)
    cinv = _readonly(class_inv(cls, np.asarray(inv_cap_per_link, dtype=np.float64)))
    pid, fb, _ = route_pinned(
        flat, paths.pair_ptr, clinks, clength, penalty, cinv,
        float(fraction), np.int64(chunk_bytes), np.int64(min_split_bytes), np.int64(refine),
        np.int64(cinv.size), pin, 0.0,
    )
    return pid, fb


def _no_pins(paths: PathSet) -> np.ndarray:
    """``int64[N * N]`` of -1: a pin table that pins no pair, kept with the path set."""
    return paths.derived(
        "mwu.no_pins", lambda: _readonly(np.full(paths.num_ranks**2, -1, dtype=np.int64))
    )


def route(
    fabric: Fabric,
    demand: np.ndarray,
    paths: PathSet,
    policy: str,
    key: object,
    links: np.ndarray,
    length: np.ndarray,
    penalty_s: np.ndarray,
    inv_cap: np.ndarray,
    *,
    fraction: float,
    chunk_bytes: int,
    min_split_bytes: int,
    refine: int,
    bound: tuple[SimModel, float] | None = None,
    info: dict | None = None,
) -> Plan:
    """Run the Algorithm-1 kernel over ``links`` (any link ids, ``inv_cap`` per id).

    ``key`` names ``links`` and ``inv_cap`` for the link classes kept with
    the path set (:func:`class_tables`). Pairs below ``min_split_bytes`` are
    pinned to their ``static`` path.
    ``bound = (model, less_s)``: ``max(lower_bound_s(paths, demand, model) -
    less_s, 0)`` is a lower bound of ``max(load * inv_cap)`` over every plan,
    and refinement stops within :data:`CERTIFIED_GAP` of it (the kernel
    computes it, :func:`~pathweave.plan._mwu_kernel.route_cut`); None: no
    early stop.
    """
    model = None if bound is None else bound[0]

    def build() -> tuple:
        # The kernel pins only the pairs below min_split_bytes to static_pins' paths.
        cut = None if bound is None else cut_tables(paths, model)
        return (*class_tables(paths, key, links, length, inv_cap), static_pins(paths),
                None if cut is None else (*cut[0], cut[1]))

    # NOTE: one look-up of every table a plan reads (four were ~1.5 us of an 8-GPU plan).
    clinks, clength, cinv, pins, cut = paths.derived(
        ("mwu.route", key, None if bound is None else _model_key(model)), build)
    # NOTE: Python ints pass as the kernel's int64 (np.int64() cost ~0.5 us a plan).
    args = (paths.pair_ptr, clinks, clength, penalty_s, cinv, float(fraction), int(chunk_bytes),
            int(min_split_bytes), int(refine), cinv.size, pins)
    if cut is None:
        pid, fb, sweeps = route_pinned(demand.reshape(-1), *args, 0.0)
    else:
        pid, fb, sweeps = route_cut(demand, *args, *cut, float(bound[1]), CERTIFIED_GAP)
    pid.setflags(write=False)
    fb.setflags(write=False)
    # compact_flows yields ids sorted by pair and path without repeats: the
    # Plan layout, so no re-sorting is needed.
    return Plan(fabric, paths, demand, pid, fb, policy, 0.0,
                {"sweeps": int(sweeps), **(info or {})})
