"""Event-driven fluid simulation of flows on links (numba kernel + slow twin).

A flow ``f`` crosses the links ``flow_links[flow_ptr[f]:flow_ptr[f + 1]]``,
carries ``flow_bytes[f]`` and starts moving data at ``release_s[f]``. While
it moves, its rate is its weighted max-min fair share among the flows moving
at the same time (:mod:`pathweave.sim._maxmin`; weight ``flow_weight[f]``),
capped by ``flow_cap_Bps[f]``.
Rates are recomputed whenever a flow starts or ends.

Flows whose ends fall within ``batch_rtol`` (relative to the simulated time)
of the next end all finish together at the latest of those ends: equal flows
on a symmetric fabric end together up to rounding, and this keeps the event
count small. Batching only ever delays an end, so no link carries more than
its capacity in any interval.

:func:`run_flows` is the numba kernel (arrays in, arrays out, no checks);
:func:`run_flows_reference` is the slow, obvious twin the tests compare it to.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pathweave.sim._maxmin import (
    build_incidence,
    cap_order_of,
    maxmin_on_incidence,
    maxmin_rates_reference,
)


@njit(cache=True)
def _record(seg_t, seg_rate, nseg, t0, t1, rates_row):
    # Append [t0, t1) with per-link rates; halve the buffer by merging
    # neighbours (time-weighted) when it is full, so memory stays bounded.
    cap = seg_rate.shape[0]
    if nseg == cap:
        half = cap // 2
        for k in range(half):
            a = 2 * k
            b = a + 1
            da = seg_t[a + 1] - seg_t[a]
            db = seg_t[b + 1] - seg_t[b]
            d = da + db
            for e in range(seg_rate.shape[1]):
                if d > 0.0:
                    seg_rate[k, e] = (seg_rate[a, e] * da + seg_rate[b, e] * db) / d
                else:
                    seg_rate[k, e] = 0.0
            seg_t[k] = seg_t[a]
            seg_t[k + 1] = seg_t[b + 1]
        nseg = half
        if cap % 2 == 1:  # the odd one out moves down unmerged
            for e in range(seg_rate.shape[1]):
                seg_rate[half, e] = seg_rate[cap - 1, e]
            seg_t[half] = seg_t[cap - 1]
            seg_t[half + 1] = seg_t[cap]
            nseg = half + 1
    seg_t[nseg] = t0
    seg_t[nseg + 1] = t1
    for e in range(seg_rate.shape[1]):
        seg_rate[nseg, e] = rates_row[e]
    return nseg + 1


@njit(cache=True)
def run_flows(
    flow_ptr,
    flow_links,
    capacity_Bps,
    flow_cap_Bps,
    flow_weight,
    flow_bytes,
    release_s,
    batch_rtol,
    num_record_links,
    max_segments,
):
    """Simulate; return ``(end_s, seg_t, seg_rate, events)``.

    ``end_s[f]``: when flow ``f``'s last byte leaves the fluid model (its
    release time for a flow of zero bytes). ``seg_t[k]..seg_t[k + 1]`` with
    ``seg_rate[k, e]`` bytes/s is the rate timeline of links
    ``e < num_record_links`` from time 0 to the last end (``seg_t`` has one
    more entry than ``seg_rate`` has rows). ``events``: rate computations.
    """
    nflows = flow_bytes.shape[0]
    nrec = num_record_links
    order = np.argsort(release_s, kind="mergesort")
    # Caps are fixed per flow: sort them once for every rate computation.
    cap_order = cap_order_of(flow_cap_Bps, flow_weight, np.arange(nflows))
    end_s = np.full(nflows, np.nan)
    remaining = flow_bytes.astype(np.float64).copy()
    rate = np.zeros(nflows, dtype=np.float64)
    active = np.empty(nflows, dtype=np.int64)
    nact = 0
    nxt = 0
    t = 0.0
    events = 0
    cap_seg = max(2, max_segments)
    seg_t = np.zeros(cap_seg + 1, dtype=np.float64)
    seg_rate = np.zeros((cap_seg, nrec), dtype=np.float64)
    nseg = 0
    row = np.zeros(nrec, dtype=np.float64)
    state = np.zeros(nflows, dtype=np.int8)
    # The link -> flow incidence covers a superset of the moving flows; it is
    # rebuilt when flows start or when fewer than half of its flows still move.
    inc_size = 0
    inc_stale = True
    lptr = np.zeros(capacity_Bps.shape[0] + 1, dtype=np.int64)
    lflow = np.zeros(0, dtype=np.int64)
    while nxt < nflows or nact > 0:
        if nact == 0:
            t_rel = release_s[order[nxt]]
            if t_rel > t:
                row[:] = 0.0
                nseg = _record(seg_t, seg_rate, nseg, t, t_rel, row)
                t = t_rel
        while nxt < nflows and release_s[order[nxt]] <= t:
            f = order[nxt]
            nxt += 1
            if remaining[f] > 0.0:
                active[nact] = f
                nact += 1
                inc_stale = True
            else:
                end_s[f] = t
        if nact == 0:
            continue
        members = active[:nact]
        if inc_stale or 2 * nact < inc_size:
            lptr, lflow = build_incidence(flow_ptr, flow_links, capacity_Bps.shape[0], members)
            inc_size = nact
            inc_stale = False
        maxmin_on_incidence(
            flow_ptr,
            flow_links,
            capacity_Bps,
            flow_cap_Bps,
            flow_weight,
            members,
            cap_order,
            lptr,
            lflow,
            state,
            rate,
        )
        events += 1
        t_rel = release_s[order[nxt]] if nxt < nflows else np.inf

        dmin = np.inf
        for i in range(nact):
            f = active[i]
            d = remaining[f] / rate[f]
            if d < dmin:
                dmin = d
        if dmin == np.inf:
            if t_rel == np.inf:
                break  # no flow can move and none will start: the caller reports it
            t_new = t_rel
        elif t + dmin >= t_rel:
            t_new = t_rel
        else:
            t_fin = t + dmin
            window = t_fin + batch_rtol * t_fin
            if window > t_rel:
                window = t_rel
            t_new = t_fin
            for i in range(nact):
                f = active[i]
                te = t + remaining[f] / rate[f]
                if te <= window and te > t_new:
                    t_new = te
        dt = t_new - t

        row[:] = 0.0
        k = 0
        for i in range(nact):
            f = active[i]
            r = rate[f]
            if t + remaining[f] / r <= t_new:
                moved = remaining[f]
                remaining[f] = 0.0
                end_s[f] = t_new
            else:
                moved = r * dt
                remaining[f] -= moved
                active[k] = f
                k += 1
            if dt > 0.0:
                for j in range(flow_ptr[f], flow_ptr[f + 1]):
                    e = flow_links[j]
                    if e < nrec:
                        row[e] += moved / dt
        if dt > 0.0:
            nseg = _record(seg_t, seg_rate, nseg, t, t_new, row)
        nact = k
        t = t_new
    return end_s, seg_t[: nseg + 1].copy(), seg_rate[:nseg].copy(), events


def run_flows_reference(
    flow_ptr: np.ndarray,
    flow_links: np.ndarray,
    capacity_Bps: np.ndarray,
    flow_cap_Bps: np.ndarray,
    flow_weight: np.ndarray,
    flow_bytes: np.ndarray,
    release_s: np.ndarray,
    batch_rtol: float,
) -> np.ndarray:
    """Slow twin of :func:`run_flows`: the end time of every flow.

    Plain Python: at each step take the moving flows, compute their rates
    with :func:`maxmin_rates_reference`, advance to the next start or the
    next batch of ends.
    """
    nflows = len(flow_bytes)
    remaining = [float(b) for b in flow_bytes]
    end = [float("nan")] * nflows
    started = [False] * nflows
    t = 0.0
    while True:
        for f in range(nflows):
            if not started[f] and release_s[f] <= t:
                started[f] = True
                if remaining[f] <= 0:
                    end[f] = t
        moving = [f for f in range(nflows) if started[f] and np.isnan(end[f])]
        waiting = [float(release_s[f]) for f in range(nflows) if not started[f]]
        t_rel = min(waiting) if waiting else float("inf")
        if not moving:
            if not waiting:
                break
            t = t_rel
            continue
        ptr = [0]
        links: list[int] = []
        for f in moving:
            links.extend(int(e) for e in flow_links[flow_ptr[f] : flow_ptr[f + 1]])
            ptr.append(len(links))
        rates = maxmin_rates_reference(
            np.array(ptr),
            np.array(links, dtype=np.int64),
            capacity_Bps,
            np.array([flow_cap_Bps[f] for f in moving]),
            np.array([flow_weight[f] for f in moving]),
        )
        ends = {f: t + remaining[f] / r for f, r in zip(moving, rates, strict=True)}
        first = min(ends.values())
        if first >= t_rel:
            t_new = t_rel
        else:
            window = min(first * (1 + batch_rtol), t_rel)
            t_new = max(v for v in ends.values() if v <= window)
        for f, r in zip(moving, rates, strict=True):
            if ends[f] <= t_new:
                remaining[f] = 0.0
                end[f] = t_new
            else:
                remaining[f] -= r * (t_new - t)
        t = t_new
    return np.array(end)
