"""Event-driven fluid simulation of flows on links (numba kernel + slow twin).

The flows and links are a :class:`~pathweave.sim._maxmin.FlowNet` ``net``: a
flow ``f`` crosses the links ``flow_links[flow_ptr[f]:flow_ptr[f + 1]]``,
carries ``flow_bytes[f]`` and starts moving data at ``release_s[f]``. While
it moves, its rate is its weighted max-min fair share among the flows moving
at the same time (:mod:`pathweave.sim._maxmin`; weight ``flow_weight[f]``),
capped by ``flow_cap_Bps[f]``.
Rates are recomputed whenever a flow starts or ends.

Components
    Flows that share no link, directly or through other flows (real and
    virtual links alike), never change each other's max-min rates. The
    flows are split into such *components* once (union-find over links)
    and each component is simulated on its own, over its own links
    renumbered from 0: a start or an end recomputes the rates of its
    component only, and costs nothing elsewhere. This is exact: concurrent
    groups on disjoint nodes simulate each exactly as it does alone.
Batched ends
    Within a component, flows whose ends fall within ``batch_rtol``
    (relative to the simulated time) of the component's next end all
    finish together at the latest of those ends: equal flows on a symmetric
    fabric end together up to rounding, and this keeps the event count
    small. Batching only ever delays an end, by at most ``batch_rtol`` of
    the time, so no link carries more than its capacity in any interval.
    Ends in different components are never batched together (nor is a
    batch cut short by a start in another component).
Ends only
    When flows only ended since the last rate computation (none started),
    every flow whose max-min level (rate over weight) lies below the lowest
    level among the ended ones keeps its rate: progressive filling freezes
    it at the same level as before, since the ended flows' links all filled
    at or above their own levels and no other link's load changed below
    them. The other flows are recomputed on what the kept ones leave of each
    link, which is the full recomputation's result (the kept ones' rates are
    fixed by then, and no link fills below that level). Exact in exact
    arithmetic; a flow within :data:`KEEP_RTOL` of that level is recomputed.
    A dense 256-GPU MoE step recomputes about a third of its moving flows
    per event.
Timeline
    Each component records its own links' rates (at most ``max_segments``
    segments, neighbours merged time-weighted when full); the components'
    breakpoints are then united, merged the same way down to
    ``max_segments``, and every component's rates averaged onto them. With
    one component the timeline is that component's own.
Ties
    Ends within :data:`SAME_RTOL` (relative) of the batch's end, or of a
    start, count as at it: rounding must not decide an event. The kernel's
    rates and its twin's differ in the last bits, and an end exactly on a
    window's edge (30/7 s at 5 %: 4.5 s) fell on one side in one and on the
    other in the other, moving ends by the whole window.

:func:`run_flows` is the numba kernel (arrays in, arrays out, no checks);
:func:`run_flows_reference` is the slow, obvious twin the tests compare it to.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pathweave._sort import argsort_stable, unique
from pathweave.sim._maxmin import (
    FlowNet,
    build_incidence,
    cap_order_of,
    maxmin_on_incidence,
    maxmin_rates_reference,
)

#: Relative distance within which two event times count as one (far above
#: rounding, ~1e-16; far below any time the simulator reports).
SAME_RTOL = 1e-12
#: After ends only, a flow whose level is below the lowest ended level by more than
#: this (relative) keeps its rate; one within it (a tie up to rounding) is recomputed.
KEEP_RTOL = 1e-9


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
def _run_component(net, flow_bytes, release_s, batch_rtol, num_record_links, max_segments):
    # One component's event loop (every flow and link of net is its own):
    # the results of run_flows for these flows alone.
    flow_ptr, flow_links, capacity_Bps = net.flow_ptr, net.flow_links, net.capacity_Bps
    nflows = flow_bytes.shape[0]
    nrec = num_record_links
    order = argsort_stable(release_s)
    # Caps are fixed per flow: sort them once for every rate computation.
    cap_order = cap_order_of(net, np.arange(nflows))
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
    nseg = np.int64(0)  # not a literal 0: see _maxmin's heap
    row = np.zeros(nrec, dtype=np.float64)
    state = np.zeros(nflows, dtype=np.int8)
    # The link -> flow incidence covers a superset of the moving flows; it is
    # rebuilt when flows start or when fewer than half of its flows still move.
    inc_size = 0
    inc_stale = True
    lptr = np.zeros(capacity_Bps.shape[0] + 1, dtype=np.int64)
    lflow = np.zeros(0, dtype=np.int64)
    # Each flow's max-min level (rate / weight) and the lowest level of the flows
    # that ended since the last rate computation (module docstring, "Ends only").
    level = np.zeros(nflows, dtype=np.float64)
    ended_level = 0.0
    resid = np.empty(capacity_Bps.shape[0], dtype=np.float64)
    redo = np.empty(nflows, dtype=np.int64)
    # Each link's summed rate over the moving flows, kept up to date from the flows
    # whose rates change, start or end (summed afresh at every full computation).
    lsum = np.zeros(capacity_Bps.shape[0], dtype=np.float64)
    old = np.empty(nflows, dtype=np.float64)
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
                ended_level = 0.0  # a start can lower any level: all again
            else:
                end_s[f] = t
        if nact == 0:
            continue
        members = active[:nact]
        if inc_stale or 2 * nact < inc_size:
            lptr, lflow = build_incidence(flow_ptr, flow_links, capacity_Bps.shape[0], members)
            inc_size = nact
            inc_stale = False
        _rates(net, members, cap_order, lptr, lflow, state, rate, level, ended_level, resid,
               redo, lsum, old)
        ended_level = np.inf
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
            window = t_fin + (batch_rtol + SAME_RTOL) * t_fin
            if window > t_rel:
                window = t_rel
            t_new = t_fin
            for i in range(nact):
                f = active[i]
                te = t + remaining[f] / rate[f]
                if te <= window and te > t_new:
                    t_new = te
        dt = t_new - t

        # Every moving flow carries its rate over [t, t_new) but those that end, which
        # carry what they had left.
        row[:] = lsum[:nrec]
        k = 0
        for i in range(nact):
            f = active[i]
            r = rate[f]
            if t + remaining[f] / r <= t_new + SAME_RTOL * t_new:
                short = remaining[f] / dt - r if dt > 0.0 else 0.0
                remaining[f] = 0.0
                end_s[f] = t_new
                ended_level = min(ended_level, level[f])
                for j in range(flow_ptr[f], flow_ptr[f + 1]):
                    e = flow_links[j]
                    lsum[e] -= r
                    if e < nrec:
                        row[e] += short
            else:
                remaining[f] -= r * dt
                active[k] = f
                k += 1
        if dt > 0.0:
            nseg = _record(seg_t, seg_rate, nseg, t, t_new, row)
        nact = k
        t = t_new
    return end_s, seg_t[: nseg + 1].copy(), seg_rate[:nseg].copy(), events


@njit(cache=True)
def _rates(net, members, cap_order, lptr, lflow, state, rate, level, ended_level, resid, redo,
           lsum, old):
    # The moving ``members``' max-min rates and levels, and each link's summed rate
    # (``lsum``): after ends only (``ended_level`` > 0) those of the flows at or above
    # the lowest ended level, else every flow's afresh.
    flow_ptr, flow_links = net.flow_ptr, net.flow_links
    if ended_level > 0.0:
        nredo = _rates_after_ends(net, members, cap_order, lptr, lflow, state, rate, level,
                                  ended_level, resid, redo, lsum, old)
        for i in range(nredo):
            f = redo[i]
            for j in range(flow_ptr[f], flow_ptr[f + 1]):
                lsum[flow_links[j]] += rate[f] - old[i]
    else:
        maxmin_on_incidence(net, members, cap_order, lptr, lflow, state, rate)
        nredo = members.shape[0]
        lsum[:] = 0.0
        for i in range(nredo):
            f = members[i]
            redo[i] = f
            for j in range(flow_ptr[f], flow_ptr[f + 1]):
                lsum[flow_links[j]] += rate[f]
    for i in range(nredo):
        f = redo[i]
        level[f] = rate[f] / net.flow_weight[f]


@njit(cache=True)
def _rates_after_ends(net, members, cap_order, lptr, lflow, state, rate, level, ended_level,
                      resid, redo, lsum, old):
    # Max-min rates of the moving ``members`` after flows of lowest level ``ended_level``
    # ended and none started: flows below that level keep their rates, the others are
    # recomputed on what the kept ones leave of each link (its capacity less ``lsum``, the
    # moving flows' rates, plus the recomputed ones'). Fills redo[:n] with the recomputed
    # flows and old[:n] with their rates before; returns n.
    flow_ptr, flow_links, capacity_Bps, flow_cap_Bps, flow_weight = net
    cut = ended_level * (1.0 - KEEP_RTOL)
    for e in range(resid.shape[0]):
        resid[e] = capacity_Bps[e] - lsum[e]
    n = 0
    for i in range(members.shape[0]):
        f = members[i]
        if level[f] >= cut:
            redo[n] = f
            old[n] = rate[f]
            n += 1
            for k in range(flow_ptr[f], flow_ptr[f + 1]):
                resid[flow_links[k]] += rate[f]
    for e in range(resid.shape[0]):
        resid[e] = max(resid[e], 0.0)
    maxmin_on_incidence(FlowNet(flow_ptr, flow_links, resid, flow_cap_Bps, flow_weight),
                        redo[:n], cap_order, lptr, lflow, state, rate)
    return n


@njit(cache=True)
def _find(parent, e):
    # Union-find root of link e, halving the path on the way.
    while parent[e] != e:
        parent[e] = parent[parent[e]]
        e = parent[e]
    return e


@njit(cache=True)
def flow_components(flow_ptr, flow_links, num_links):
    """``(comp, ncomp)``: each flow's component, numbered by first flow.

    Two flows are in one component when a chain of flows, each sharing a
    link with the next, joins them; a flow with no links is alone.
    """
    nflows = flow_ptr.shape[0] - 1
    parent = np.arange(num_links)
    for f in range(nflows):
        lo, hi = flow_ptr[f], flow_ptr[f + 1]
        if hi == lo:
            continue
        a = _find(parent, flow_links[lo])
        for k in range(lo + 1, hi):
            b = _find(parent, flow_links[k])
            if a != b:
                parent[max(a, b)] = min(a, b)
                a = min(a, b)
    label = np.full(num_links, -1, dtype=np.int64)
    comp = np.empty(nflows, dtype=np.int64)
    ncomp = 0
    for f in range(nflows):
        if flow_ptr[f + 1] == flow_ptr[f]:
            comp[f] = ncomp
            ncomp += 1
            continue
        r = _find(parent, flow_links[flow_ptr[f]])
        if label[r] < 0:
            label[r] = ncomp
            ncomp += 1
        comp[f] = label[r]
    return comp, ncomp


@njit(cache=True)
def _localise(members, flow_ptr, flow_links, loc):
    # The component's links, ascending (so real links, ids below any virtual
    # one, come first and the tie order of max-min is the global one), and
    # its flows' links renumbered into them. loc: scratch of -1s, restored.
    m = members.shape[0]
    ptr = np.zeros(m + 1, dtype=np.int64)
    for j in range(m):
        f = members[j]
        ptr[j + 1] = ptr[j] + flow_ptr[f + 1] - flow_ptr[f]
    glinks = np.empty(ptr[m], dtype=np.int64)
    n = 0
    for j in range(m):
        f = members[j]
        for k in range(flow_ptr[f], flow_ptr[f + 1]):
            e = flow_links[k]
            if loc[e] < 0:
                loc[e] = 0
                glinks[n] = e
                n += 1
    glinks = glinks[:n]
    glinks = glinks[argsort_stable(glinks)]
    for i in range(n):
        loc[glinks[i]] = i
    links = np.empty(ptr[m], dtype=np.int64)
    for j in range(m):
        f = members[j]
        base = ptr[j] - flow_ptr[f]
        for k in range(flow_ptr[f], flow_ptr[f + 1]):
            links[base + k] = loc[flow_links[k]]
    for i in range(n):
        loc[glinks[i]] = -1
    return glinks, ptr, links


@njit(cache=True)
def _merge_timelines(tbuf, tptr, rbuf, rptr, lbuf, lptr, num_record_links, max_segments):
    # The union of the components' breakpoints, merged as _record merges
    # down to max_segments, and each component's rates averaged onto it
    # (bytes kept). Where an output segment lies within one of a
    # component's segments, that segment's rate is copied (fraction 1.0).
    cap = max(2, max_segments)
    allt = unique(tbuf[: tptr[tptr.shape[0] - 1]])
    seg_t = np.zeros(cap + 1, dtype=np.float64)
    no_rates = np.zeros((cap, 0), dtype=np.float64)
    nseg = np.int64(0)  # not a literal 0: see _maxmin's heap
    for i in range(allt.shape[0] - 1):
        nseg = _record(seg_t, no_rates, nseg, allt[i], allt[i + 1], no_rates[0])
    seg_rate = np.zeros((nseg, num_record_links), dtype=np.float64)
    for c in range(tptr.shape[0] - 1):
        ct = tbuf[tptr[c]: tptr[c + 1]]
        lk = lbuf[lptr[c]: lptr[c + 1]]
        nl = lk.shape[0]
        base = rptr[c]
        i = 0
        for k in range(nseg):
            a, b = seg_t[k], seg_t[k + 1]
            while i + 1 < ct.shape[0] and ct[i + 1] <= a:
                i += 1
            j = i
            while j + 1 < ct.shape[0] and ct[j] < b:
                ov = min(ct[j + 1], b) - max(ct[j], a)
                if ov > 0.0:
                    frac = ov / (b - a)
                    row = base + j * nl
                    for x in range(nl):
                        seg_rate[k, lk[x]] += rbuf[row + x] * frac
                j += 1
    return seg_t[: nseg + 1].copy(), seg_rate


@njit(cache=True)
def run_flows(net, flow_bytes, release_s, batch_rtol, num_record_links, max_segments):
    """Simulate the flows of the :class:`~pathweave.sim._maxmin.FlowNet` ``net``; return
    ``(end_s, seg_t, seg_rate, events)``.

    ``end_s[f]``: when flow ``f``'s last byte leaves the fluid model (its
    release time for a flow of zero bytes). ``seg_t[k]..seg_t[k + 1]`` with
    ``seg_rate[k, e]`` bytes/s is the rate timeline of links
    ``e < num_record_links`` from time 0 to the last end (``seg_t`` has one
    more entry than ``seg_rate`` has rows). ``events``: rate computations,
    summed over the components.
    """
    flow_ptr, flow_links, capacity_Bps, flow_cap_Bps, flow_weight = net
    nflows = flow_bytes.shape[0]
    nlinks = capacity_Bps.shape[0]
    comp, ncomp = flow_components(flow_ptr, flow_links, nlinks)
    # Flows grouped by component, in flow order within each (a stable sort).
    cptr = np.zeros(ncomp + 1, dtype=np.int64)
    for f in range(nflows):
        cptr[comp[f] + 1] += 1
    for c in range(ncomp):
        cptr[c + 1] += cptr[c]
    fill = cptr[:-1].copy()
    cflow = np.empty(nflows, dtype=np.int64)
    for f in range(nflows):
        cflow[fill[comp[f]]] = f
        fill[comp[f]] += 1
    end_s = np.full(nflows, np.nan)
    loc = np.full(nlinks, -1, dtype=np.int64)
    # Each component's timeline, kept until all are known: breakpoints,
    # rates (row-major over its recorded links) and those links' ids.
    tptr = np.zeros(ncomp + 1, dtype=np.int64)
    rptr = np.zeros(ncomp + 1, dtype=np.int64)
    lptr = np.zeros(ncomp + 1, dtype=np.int64)
    # Sized for the worst case (every component at max_segments rows, each
    # recorded link in one component): pages never written are never resident.
    cap = max(2, max_segments)
    used = np.zeros(nlinks, dtype=np.bool_)
    for k in range(flow_links.shape[0]):
        used[flow_links[k]] = True
    nused = 0
    for e in range(min(num_record_links, nlinks)):
        nused += used[e]
    tbuf = np.empty(ncomp * (cap + 1), dtype=np.float64)
    rbuf = np.empty(cap * nused, dtype=np.float64)
    lbuf = np.empty(nused, dtype=np.int64)
    events = 0
    for c in range(ncomp):
        members = cflow[cptr[c]: cptr[c + 1]]
        glinks, lp, ll = _localise(members, flow_ptr, flow_links, loc)
        nrec = 0
        while nrec < glinks.shape[0] and glinks[nrec] < num_record_links:
            nrec += 1
        own = FlowNet(lp, ll, capacity_Bps[glinks], flow_cap_Bps[members], flow_weight[members])
        end, st, sr, ev = _run_component(own, flow_bytes[members], release_s[members], batch_rtol,
                                         nrec, max_segments)
        end_s[members] = end
        events += ev
        tbuf[tptr[c]: tptr[c] + st.shape[0]] = st
        tptr[c + 1] = tptr[c] + st.shape[0]
        rbuf[rptr[c]: rptr[c] + sr.size] = sr.ravel()
        rptr[c + 1] = rptr[c] + sr.size
        lbuf[lptr[c]: lptr[c] + nrec] = glinks[:nrec]
        lptr[c + 1] = lptr[c] + nrec
    if ncomp == 0:
        return end_s, np.zeros(1), np.zeros((0, num_record_links)), events
    seg_t, seg_rate = _merge_timelines(tbuf, tptr, rbuf, rptr, lbuf, lptr, num_record_links,
                                       max_segments)
    return end_s, seg_t, seg_rate, events


def _components_reference(flow_ptr: np.ndarray, flow_links: np.ndarray) -> list[list[int]]:
    """Flows split into components the obvious way: grow each by breadth-first search."""
    nflows = len(flow_ptr) - 1
    links_of = [set(int(e) for e in flow_links[flow_ptr[f]: flow_ptr[f + 1]])
                for f in range(nflows)]
    seen = [False] * nflows
    out = []
    for f0 in range(nflows):
        if seen[f0]:
            continue
        seen[f0] = True
        comp, todo = [f0], [f0]
        while todo:
            f = todo.pop()
            for g in range(nflows):
                if not seen[g] and links_of[f] & links_of[g]:
                    seen[g] = True
                    comp.append(g)
                    todo.append(g)
        out.append(sorted(comp))
    return out


def run_flows_reference(
    net: FlowNet,
    flow_bytes: np.ndarray,
    release_s: np.ndarray,
    batch_rtol: float,
    *,
    components: bool = True,
) -> np.ndarray:
    """Slow twin of :func:`run_flows`: the end time of every flow.

    Plain Python: split the flows into components (breadth-first search)
    and run each alone; at each step take its moving flows, compute their
    rates with :func:`maxmin_rates_reference` over all links, advance to
    the next start or the next batch of ends. ``components=False`` runs
    every flow in one loop instead (batching then couples flows of
    different components); with ``batch_rtol=0`` both give the same ends,
    which is what makes the split exact.
    """
    nflows = len(flow_bytes)
    groups = (_components_reference(net.flow_ptr, net.flow_links) if components
              else [list(range(nflows))])
    end = np.full(nflows, np.nan)
    for members in groups:
        end[members] = _reference_loop(net, flow_bytes, release_s, batch_rtol, members)
    return end


def _reference_loop(net, flow_bytes, release_s, batch_rtol, members):
    """End times of the flows ``members``, simulated together and alone."""
    flow_ptr, flow_links, capacity_Bps, flow_cap_Bps, flow_weight = net
    remaining = {f: float(flow_bytes[f]) for f in members}
    end = {f: float("nan") for f in members}
    started = {f: False for f in members}
    t = 0.0
    while True:
        for f in members:
            if not started[f] and release_s[f] <= t:
                started[f] = True
                if remaining[f] <= 0:
                    end[f] = t
        moving = [f for f in members if started[f] and np.isnan(end[f])]
        waiting = [float(release_s[f]) for f in members if not started[f]]
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
            window = min(first + (batch_rtol + SAME_RTOL) * first, t_rel)
            t_new = max(v for v in ends.values() if v <= window)
        for f, r in zip(moving, rates, strict=True):
            if ends[f] <= t_new + SAME_RTOL * t_new:
                remaining[f] = 0.0
                end[f] = t_new
            else:
                remaining[f] -= r * (t_new - t)
        t = t_new
    return [end[f] for f in members]
