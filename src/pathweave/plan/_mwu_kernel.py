"""Numba kernels of the ``mwu`` planner: arrays in, arrays out, no validation.

The public wrapper (:mod:`pathweave.plan.mwu`) validates inputs once; these
functions trust them. :func:`route_reference` is the slow, obvious version the
tests compare the kernel with.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pathweave._sort import argsort_stable
from pathweave.plan._stripe_kernel import cut_bound

#: A refinement pass re-routes the pairs that use a link loaded to at least
#: this share of the most loaded link's time.
HOT_SHARE = 0.9
#: Pairs smaller than this many chunks are left as phase 1 placed them.
REFINE_MIN_CHUNKS = 4
#: A visit is cut into pieces of at least this many chunks.
PIECE_MIN_CHUNKS = 2


# NOTE: the routing loops compile with error_model="numpy": their integer
# divisions are by whole chunks and piece counts (>= 1, checked by the
# wrapper), and numba's default model tests every divisor to raise
# ZeroDivisionError; without the tests the 8-GPU kernel is 5-7 % faster,
# same plans.
@njit(cache=True, inline="always", error_model="numpy")
def _step(rem: np.int64, total: np.int64, lam: float, chunk: np.int64, min_split: np.int64):
    # Algorithm 1, lines 23-27: the residual below one chunk goes whole;
    # otherwise a fraction lam of it, rounded down to whole chunks. Pairs
    # smaller than min_split_bytes are never split.
    if total < min_split or rem <= chunk:
        return rem
    f = np.int64(rem * lam) // chunk * chunk
    if f < chunk:
        f = chunk
    return min(f, rem)


@njit(cache=True, error_model="numpy")
def _pass(
    pair_lo, pair_hi, demand, rem, off, links, length, penalty_s, inv_cap, lam, chunk,
    min_split, load, flow, hot,
):
    """One pass over the pairs; returns the bytes it routed.

    ``hot < 0``: a sweep of Algorithm 1, one visit of each pair with a
    residual ``rem[k]`` (updated). ``hot >= 0``: a refinement pass, ripping
    up and re-routing whole each pair that touches a link whose time
    (``load * inv_cap``) is at least ``hot``.

    A visit routes ``f = _step(...)`` bytes in up to (number of candidate
    paths) pieces of whole chunks, each on the path cheapest at that moment,
    so even a lone pair spreads over its paths within one visit.

    NOTE: one function with no array-taking helpers: numba increfs and
    decrefs (atomically) every array passed to a helper on every call, and
    those atomics were over 80 % of the kernel's time at 8 ranks.
    """
    routed = np.int64(0)
    for k in range(pair_lo.shape[0]):
        lo = pair_lo[k]
        hi = pair_hi[k]
        d = demand[k]
        if hot < 0.0:
            r = rem[k]
            if r == 0:
                continue
        else:
            # Pairs of a few chunks barely move the maximum; skipping them
            # halves a pass on small fabrics.
            if d < REFINE_MIN_CHUNKS * chunk or hi - lo == 1:
                continue
            touches = False
            for p in range(lo, hi):
                if flow[off[k] + p - lo]:
                    for h in range(length[p]):
                        e = links[p, h]
                        if load[e] * inv_cap[e] >= hot:
                            touches = True
                            break
                if touches:
                    break
            if not touches:
                continue
            for p in range(lo, hi):
                fj = flow[off[k] + p - lo]
                if fj:
                    for h in range(length[p]):
                        load[links[p, h]] -= fj
                    flow[off[k] + p - lo] = 0
            r = d
        while r > 0:
            f = _step(r, d, lam, chunk, min_split)
            unit = chunk if d >= min_split else f
            # Pieces of at least PIECE_MIN_CHUNKS units: late, small steps go
            # whole (as in Algorithm 1), only the big early ones are spread.
            # NOTE: counted by comparison (f // m >= k iff f >= k * m for whole
            # positive numbers) and the share divided once per visit: integer
            # divisions were ~6 % of the kernel at 8 ranks.
            piece = unit * PIECE_MIN_CHUNKS
            pieces = 1
            need = 2 * piece  # stays below f + piece: no overflow below 2**61 bytes
            while pieces < hi - lo and f >= need:
                pieces += 1
                need += piece
            share = max((f // pieces) // unit * unit, unit) if pieces > 1 else f
            left = f
            for i in range(pieces):
                g = left if i == pieces - 1 else share
                best = -1
                best_cost = np.inf
                for p in range(lo, hi):
                    # Bottleneck cost (NIMBLE Sec. IV-B): pipelined forwarding
                    # runs at the speed of the path's busiest link.
                    c = penalty_s[p]
                    for h in range(length[p]):
                        e = links[p, h]
                        t = (load[e] + g) * inv_cap[e] + penalty_s[p]
                        if t > c:
                            c = t
                            if c >= best_cost:
                                break  # NOTE: cannot win any more; saves a third of the work
                    if c < best_cost:
                        best_cost = c
                        best = p
                for h in range(length[best]):
                    load[links[best, h]] += g
                flow[off[k] + best - lo] += g
                left -= g
            r -= f
            routed += f
            if hot < 0.0:
                rem[k] = r
                break
    return routed


@njit(cache=True)
def route_kernel(
    pair_lo: np.ndarray,
    pair_hi: np.ndarray,
    demand: np.ndarray,
    links: np.ndarray,
    length: np.ndarray,
    penalty_s: np.ndarray,
    inv_cap: np.ndarray,
    lam: float,
    chunk: np.int64,
    min_split: np.int64,
    refine: np.int64,
    load: np.ndarray,
    flow: np.ndarray,
    stop_s: float = 0.0,
) -> np.int64:
    """Route every pair's demand; fills ``load`` (bytes per link) and ``flow``.

    ``flow`` is indexed like the concatenation of the pairs' path ranges:
    pair ``k``'s paths occupy ``flow[off[k]:off[k] + pair_hi[k] - pair_lo[k]]``.
    ``stop_s``: refinement's early stop (:func:`refine_kernel`). Returns the
    number of sweeps over the pairs.
    """
    k_pairs = pair_lo.shape[0]
    off = np.empty(k_pairs + 1, dtype=np.int64)
    off[0] = 0
    for k in range(k_pairs):
        off[k + 1] = off[k] + pair_hi[k] - pair_lo[k]
    rem = demand.copy()
    left = np.int64(0)
    for k in range(k_pairs):
        left += rem[k]
    sweeps = 0
    # Phase 1: Algorithm 1. Sweep the pairs in a fixed order, each time
    # routing a fraction of each residual on its currently cheapest path.
    while left > 0:
        sweeps += 1
        left -= _pass(pair_lo, pair_hi, demand, rem, off, links, length, penalty_s, inv_cap,
                      lam, chunk, min_split, load, flow, -1.0)
    # Phase 2: rip up and re-route (also the warm start of a replan).
    sweeps += refine_kernel(
        pair_lo, pair_hi, demand, off, links, length, penalty_s, inv_cap, lam, chunk,
        min_split, refine, load, flow, stop_s,
    )
    return sweeps


@njit(cache=True)
def refine_kernel(
    pair_lo, pair_hi, demand, off, links, length, penalty_s, inv_cap, lam, chunk, min_split,
    refine, load, flow, stop_s=0.0,
):
    """Rip up and re-route the pairs on hot links, up to ``refine`` passes; returns the
    passes made.

    Early pairs chose paths before later pairs loaded the fabric; re-routing
    each pair against everyone else's final load removes most of that order
    bias. Given any ``flow`` and its ``load`` (a previous plan's split of a
    new demand), it is also the warm start of an incremental replan.

    Early stop: no pass starts once the most loaded link's time
    (``load * inv_cap``) is at most ``stop_s``, the caller's certified
    target (a lower bound of every plan's maximum times one plus the gap it
    accepts; 0 never stops). A pass does not lower the maximum by
    construction: over ``bench planner``'s cases up to 64 GPUs, all within
    0.6 % of the bound before it, it moved the gap to the LP optimum by
    -0.2 % to +0.4 % at 10-100 % more planning time (``docs/benchmarks.md``).
    """
    sweeps = 0
    no_rem = np.empty(0, dtype=np.int64)  # a refinement pass reads no residuals
    for _ in range(refine):
        # Only pairs that touch a link near the current maximum can lower
        # it; leaving the others in place halves the cost of a pass.
        hot = 0.0
        for e in range(load.shape[0]):
            t = load[e] * inv_cap[e]
            if t > hot:
                hot = t
        if hot <= stop_s:
            break
        sweeps += 1
        _pass(pair_lo, pair_hi, demand, no_rem, off, links, length, penalty_s, inv_cap, lam,
              chunk, min_split, load, flow, hot * HOT_SHARE)
    return sweeps


@njit(cache=True)
def compact_flows(pair_lo: np.ndarray, pair_hi: np.ndarray, flow: np.ndarray):
    """``(path_ids, bytes)`` of the non-zero entries of a kernel ``flow`` array."""
    n = np.count_nonzero(flow)
    pid = np.empty(n, dtype=np.int64)
    fb = np.empty(n, dtype=np.int64)
    i = 0
    j = 0
    for k in range(pair_lo.shape[0]):
        for p in range(pair_lo[k], pair_hi[k]):
            if flow[i] != 0:
                pid[j] = p
                fb[j] = flow[i]
                j += 1
            i += 1
    return pid, fb


@njit(cache=True)
def route_pinned(
    demand_flat: np.ndarray,
    pair_ptr: np.ndarray,
    links: np.ndarray,
    length: np.ndarray,
    penalty_s: np.ndarray,
    inv_cap: np.ndarray,
    lam: float,
    chunk: np.int64,
    min_split: np.int64,
    refine: np.int64,
    num_links: np.int64,
    pin: np.ndarray,
    stop_s: float = 0.0,
):
    """Whole planner in one call: pairs with demand -> ``(path_ids, bytes, sweeps)``.

    ``stop_s``: refinement's early stop (:func:`refine_kernel`).

    ``pin[i] >= 0`` restricts flat pair ``i`` to that one path when its
    bytes are below ``min_split`` (the size threshold: a small pair goes
    whole on its static path, never forwarded); all ``-1``: no pins.

    NOTE: the threshold is applied here, not by masking ``pin`` in numpy per
    call, so callers pass one cached table (``static.static_pins``): the
    masking cost ~3 us of a ~50 us plan at 8 ranks.

    NOTE: one entry point instead of several numpy steps around the kernel,
    because at 8 ranks the Python-side glue cost as much as the routing.
    """
    n = np.count_nonzero(demand_flat)
    lo = np.empty(n, dtype=np.int64)
    hi = np.empty(n, dtype=np.int64)
    dem = np.empty(n, dtype=np.int64)
    m = 0
    j = 0
    for i in range(demand_flat.shape[0]):
        if demand_flat[i] != 0:
            if pin[i] >= 0 and demand_flat[i] < min_split:
                lo[j] = pin[i]
                hi[j] = pin[i] + 1
            else:
                lo[j] = pair_ptr[i]
                hi[j] = pair_ptr[i + 1]
            dem[j] = demand_flat[i]
            m += hi[j] - lo[j]
            j += 1
    load = np.zeros(num_links)
    flow = np.zeros(m, dtype=np.int64)
    sweeps = route_kernel(
        lo, hi, dem, links, length, penalty_s, inv_cap, lam, chunk, min_split, refine, load, flow,
        stop_s,
    )
    pid, fb = compact_flows(lo, hi, flow)
    return pid, fb, sweeps


@njit(cache=True)
def route_cut(demand, pair_ptr, links, length, penalty_s, inv_cap, lam, chunk, min_split,
              refine, num_links, pin, node, gout, gin, nout, nin, members_ptr, members,
              setup_s, less_s, gap):
    """:func:`route_pinned` of ``demand`` (``int64[N, N]``) with refinement's early stop
    ``gap`` above ``max(bound - less_s, 0)``, the bound computed here: the cut bound
    (:func:`pathweave.plan.timemodel.lower_bound_s`) of the tables ``node`` to
    ``members`` and set-up ``setup_s`` (:func:`pathweave.plan.timemodel.cut_tables`).

    NOTE: one call instead of two: at 8 ranks the bound's own call (numba's
    dispatch and the Python around it) cost ~2.7 us of a ~30 us plan. The
    tables come as arrays, not a tuple of them: numba types a tuple argument
    in Python, arrays in C.
    """
    worst, used = cut_bound(demand, node, members_ptr, members, gout, gin, nout, nin)
    bound = setup_s + worst if used else 0.0
    stop = max(bound - less_s, 0.0) * (1.0 + gap)
    return route_pinned(demand.reshape(-1), pair_ptr, links, length, penalty_s, inv_cap, lam,
                        chunk, min_split, refine, num_links, pin, stop)


@njit(cache=True)
def link_classes(links, length, num_links):
    """Group links used by the same paths: ``(cls, clinks, clength, classes)``.

    Two links that lie on exactly the same candidate paths (a GPU's PCIe
    hop, its NIC and rail link on a two-node fabric) carry the same bytes
    under every plan, so the routing kernels keep one load per class and
    price it with the class's largest ``1/capacity``: the same costs, bit
    for bit (the same additions in the same order), with fewer links per
    path (5.4 to about 2 on ``h100-2x4``).

    ``cls[e]``: class of link ``e`` (-1: on no path), numbered by lowest
    link id; ``clinks[p, :clength[p]]``: path ``p``'s classes, each once,
    in path order, -1 padded.
    """
    n_paths = length.shape[0]
    ptr = np.zeros(num_links + 1, dtype=np.int64)
    for p in range(n_paths):
        for h in range(length[p]):
            ptr[links[p, h] + 1] += 1
    for e in range(num_links):
        ptr[e + 1] += ptr[e]
    on = np.empty(ptr[num_links], dtype=np.int64)  # each link's paths, ascending
    fill = ptr[:-1].copy()
    for p in range(n_paths):
        for h in range(length[p]):
            e = links[p, h]
            on[fill[e]] = p
            fill[e] += 1
    # FNV-1a over each link's path list: equal lists meet in one run of the
    # sorted hashes, where they are compared exactly (a collision only costs
    # a comparison).
    key = np.empty(num_links, dtype=np.uint64)
    for e in range(num_links):
        h = np.uint64(14695981039346656037)
        for i in range(ptr[e], ptr[e + 1]):
            h = (h ^ np.uint64(on[i])) * np.uint64(1099511628211)
        key[e] = h
    order = argsort_stable(key)
    rep = np.full(num_links, -1, dtype=np.int64)  # lowest link id of the class
    i = 0
    while i < num_links:
        j = i
        while j < num_links and key[order[j]] == key[order[i]]:
            j += 1
        for a in range(i, j):
            e = order[a]
            if rep[e] >= 0 or ptr[e + 1] == ptr[e]:
                continue
            rep[e] = e
            for b in range(a + 1, j):
                e2 = order[b]
                if rep[e2] < 0 and _same_paths(on, ptr, e, e2):
                    rep[e2] = e
        i = j
    cls = np.full(num_links, -1, dtype=np.int64)
    classes = 0
    for e in range(num_links):
        if rep[e] >= 0:
            if cls[rep[e]] < 0:
                cls[rep[e]] = classes
                classes += 1
            cls[e] = cls[rep[e]]
    clinks = np.full(links.shape, -1, dtype=np.int32)
    clength = np.zeros(n_paths, dtype=np.int32)
    for p in range(n_paths):
        k = 0
        for h in range(length[p]):
            c = cls[links[p, h]]
            seen = False
            for q in range(k):
                if clinks[p, q] == c:
                    seen = True
            if not seen:
                clinks[p, k] = c
                k += 1
        clength[p] = k
    return cls, clinks, clength, classes


@njit(cache=True)
def _same_paths(on, ptr, a, b):
    if ptr[a + 1] - ptr[a] != ptr[b + 1] - ptr[b]:
        return False
    for i in range(ptr[a + 1] - ptr[a]):
        if on[ptr[a] + i] != on[ptr[b] + i]:
            return False
    return True


def link_classes_reference(links, length, num_links):
    """Plain-Python twin of :func:`link_classes` for tests."""
    on: dict[int, list[int]] = {}
    for p in range(length.shape[0]):
        for e in links[p, : length[p]]:
            on.setdefault(int(e), []).append(p)
    first: dict[tuple, int] = {}
    for e in sorted(on):
        first.setdefault(tuple(on[e]), len(first))
    cls = np.array([first[tuple(on[e])] if e in on else -1 for e in range(num_links)])
    rows = [list(dict.fromkeys(int(cls[e]) for e in links[p, : length[p]]))
            for p in range(length.shape[0])]
    clinks = np.full(links.shape, -1, dtype=np.int32)
    for p, row in enumerate(rows):
        clinks[p, : len(row)] = row
    return cls, clinks, np.array([len(r) for r in rows], dtype=np.int32), len(first)


def route_reference(
    pair_lo, pair_hi, demand, links, length, penalty_s, inv_cap, lam, chunk, min_split, refine,
    stop_s=0.0,
):
    """Plain-Python twin of :func:`route_kernel` for tests; returns ``(load, flow)``."""
    load = np.zeros(inv_cap.shape[0])
    sizes = [int(h - lo) for lo, h in zip(pair_lo, pair_hi, strict=False)]
    flows = [[0] * s for s in sizes]

    def step(r, total):
        if total < min_split or r <= chunk:
            return r
        f = max(int(r * lam) // chunk * chunk, chunk)
        return min(f, r)

    def best(k, f):
        costs = []
        for j in range(sizes[k]):
            p = int(pair_lo[k]) + j
            lk = links[p, : length[p]]
            costs.append(max((load[e] + f) * inv_cap[e] for e in lk) + penalty_s[p])
        return int(np.argmin(costs))  # first minimum, like the kernel

    def put(k, j, f):
        p = int(pair_lo[k]) + j
        for e in links[p, : length[p]]:
            load[e] += f
        flows[k][j] += f

    def visit(k, f, total):
        unit = chunk if total >= min_split else f
        pieces = min(max(f // (unit * PIECE_MIN_CHUNKS), 1), sizes[k])
        left = f
        for i in range(pieces):
            g = left if i == pieces - 1 else max((f // pieces) // unit * unit, unit)
            put(k, best(k, g), g)
            left -= g

    rem = [int(d) for d in demand]
    while sum(rem) > 0:
        for k in range(len(rem)):
            if rem[k]:
                f = step(rem[k], int(demand[k]))
                visit(k, f, int(demand[k]))
                rem[k] -= f
    for _ in range(refine):
        if float(np.max(load * inv_cap)) <= stop_s:  # the certified target is met
            break
        hot = float(np.max(load * inv_cap)) * HOT_SHARE
        for k in range(len(rem)):
            d = int(demand[k])
            if d < REFINE_MIN_CHUNKS * chunk or sizes[k] == 1:
                continue
            used = [int(pair_lo[k]) + j for j in range(sizes[k]) if flows[k][j]]
            if not any(load[e] * inv_cap[e] >= hot for p in used for e in links[p, : length[p]]):
                continue
            for j in range(sizes[k]):
                if flows[k][j]:
                    put(k, j, -flows[k][j])
            r = d
            while r > 0:
                f = step(r, d)
                visit(k, f, d)
                r -= f
    return load, np.array([f for fl in flows for f in fl], dtype=np.int64)
