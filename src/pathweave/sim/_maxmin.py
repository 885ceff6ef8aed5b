"""Weighted max-min fair rates of flows sharing directed links (progressive filling).

Flows are given in compressed form: the links of flow ``f`` are
``flow_links[flow_ptr[f]:flow_ptr[f + 1]]``. A link listed ``k`` times by one
flow carries that flow ``k`` times (its rate counts ``k`` times against the
capacity). Each flow may also have its own rate ceiling ``flow_cap_Bps[f]``
(``np.inf`` for none), treated as a private link that only that flow crosses.

Each flow has a weight ``flow_weight[f] > 0`` (1 when not given); the rate
of flow ``f`` is its weight times its *level*. The allocation is the unique
weighted max-min fair one: every flow's level is as large as possible given
that no flow's level can be raised without lowering that of a flow whose
level is already no larger. Progressive filling finds it by raising all
levels together and freezing the flows of each link as it fills. The static
simulator weighs each fragment by its bytes, as the executor shares a link
(``docs/simulator.md``); with unit weights it is plain max-min fairness.

:func:`maxmin_into` and :func:`maxmin_subset_into` are the numba kernels
(arrays in, arrays out; callable from other numba code); the kernels take the
five arrays of a flow set together as one :class:`FlowNet`, but for
:func:`maxmin_into`, the entry point from Python;
:func:`maxmin_rates` is the validating public wrapper;
:func:`maxmin_rates_reference` is the slow, obvious twin the tests use.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from pathweave._check import indices as check_indices
from pathweave._sort import argsort_stable

__all__ = [
    "FlowNet",
    "build_incidence",
    "cap_order_of",
    "maxmin_core",
    "maxmin_into",
    "maxmin_on_incidence",
    "maxmin_rates",
    "maxmin_rates_reference",
    "maxmin_subset_into",
]


class FlowNet(NamedTuple):
    """The flows and links every max-min and simulation kernel reads, as one argument.

    A NamedTuple, not a dataclass, so that numba kernels take it (and build
    one for a subset). The links of flow ``f`` are
    ``flow_links[flow_ptr[f]:flow_ptr[f + 1]]`` (int64); ``capacity_Bps[e]``
    is link ``e``'s capacity, ``flow_cap_Bps[f]`` flow ``f``'s rate ceiling
    (``np.inf``: none) and ``flow_weight[f] > 0`` its weight (float64).
    """

    flow_ptr: np.ndarray
    flow_links: np.ndarray
    capacity_Bps: np.ndarray
    flow_cap_Bps: np.ndarray
    flow_weight: np.ndarray


# ----------------------------------------------------------------- binary heap
# A min-heap of (key, id) pairs in two parallel arrays; ties break toward the
# lower id so the order of freezing is deterministic.
@njit(cache=True, inline="always")
def _less(ka, ia, kb, ib):
    return ka < kb or (ka == kb and ia < ib)


@njit(cache=True, inline="always")
def _heap_set(hkey, hid, hver, i, key, ident, ver):
    hkey[i] = key
    hid[i] = ident
    hver[i] = ver


@njit(cache=True)
def _heap_push(hkey, hid, hver, size, key, ident, ver):
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        if not _less(key, ident, hkey[parent], hid[parent]):
            break
        _heap_set(hkey, hid, hver, i, hkey[parent], hid[parent], hver[parent])
        i = parent
    _heap_set(hkey, hid, hver, i, key, ident, ver)
    return size + 1


@njit(cache=True)
def _heap_pop(hkey, hid, hver, size):
    # Removes the root; the caller has read it already. Returns the new size.
    size -= 1
    if size == 0:
        return 0
    key = hkey[size]
    ident = hid[size]
    ver = hver[size]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and _less(hkey[c + 1], hid[c + 1], hkey[c], hid[c]):
            c += 1
        if not _less(hkey[c], hid[c], key, ident):
            break
        _heap_set(hkey, hid, hver, i, hkey[c], hid[c], hver[c])
        i = c
    _heap_set(hkey, hid, hver, i, key, ident, ver)
    return size


# --------------------------------------------------------------------- kernel
@njit(cache=True)
def _freeze_flow(
    f, level, flow_ptr, flow_links, flow_weight, rate_Bps, state, weight, count, remaining,
    dirty, dirty_list, ndirty,
):
    # Flow f stops at `level` (its rate: level times its weight): take it off
    # every link it crosses.
    state[f] = 2
    share = level * flow_weight[f]
    rate_Bps[f] = share
    for k in range(flow_ptr[f], flow_ptr[f + 1]):
        e = flow_links[k]
        weight[e] -= flow_weight[f]
        count[e] -= 1
        rem = remaining[e] - share
        remaining[e] = rem if rem > 0.0 else 0.0
        if not dirty[e]:
            dirty[e] = True
            dirty_list[ndirty] = e
            ndirty += 1
    return ndirty


@njit(cache=True)
def build_incidence(flow_ptr, flow_links, nlinks, flows):
    """Link -> flow incidence of ``flows``: flows on link e are ``lflow[lptr[e]:lptr[e+1]]``."""
    lptr = np.zeros(nlinks + 1, dtype=np.int64)
    for j in range(flows.shape[0]):
        f = flows[j]
        for k in range(flow_ptr[f], flow_ptr[f + 1]):
            lptr[flow_links[k] + 1] += 1
    for e in range(nlinks):
        lptr[e + 1] += lptr[e]
    lfill = lptr[:-1].copy()
    lflow = np.empty(lptr[nlinks], dtype=np.int64)
    for j in range(flows.shape[0]):
        f = flows[j]
        for k in range(flow_ptr[f], flow_ptr[f + 1]):
            e = flow_links[k]
            lflow[lfill[e]] = f
            lfill[e] += 1
    return lptr, lflow


@njit(cache=True)
def maxmin_on_incidence(net, members, cap_order, lptr, lflow, state, rate_Bps):
    """Weighted max-min rates of ``members`` of the :class:`FlowNet` ``net`` over a prebuilt
    incidence (numba kernel, no checks).

    ``lptr, lflow`` (:func:`build_incidence`) may cover a superset of
    ``members``: the others are skipped, so an event-driven caller rebuilds
    it only now and then. ``cap_order`` lists flows with a finite cap in
    ascending order of ``cap / weight`` (others than members are skipped,
    :func:`cap_order_of`). ``state`` is an ``int8[F]`` scratch array of
    zeros, left as zeros on return.

    Flow ``f`` gets ``flow_weight[f]`` times a common *level*: a link's fair
    level is ``remaining / unfrozen weight`` (lazily in a heap: a version
    stamp marks stale entries). The smallest level, or the smallest
    ``cap / weight`` if lower, is the next bottleneck; its unfrozen flows
    freeze at that level, and their rates are taken off the other links
    they cross. Levels never fall as flows freeze, so one pass suffices.
    """
    flow_ptr, flow_links, capacity_Bps, flow_cap_Bps, flow_weight = net
    m = members.shape[0]
    nlinks = capacity_Bps.shape[0]
    weight = np.zeros(nlinks, dtype=np.float64)
    # Unfrozen crossings per link: whether a link is still live does not
    # hang on float weights summing back to exactly zero.
    count = np.zeros(nlinks, dtype=np.int64)
    for j in range(m):
        f = members[j]
        state[f] = 1
        rate_Bps[f] = np.inf
        for k in range(flow_ptr[f], flow_ptr[f + 1]):
            weight[flow_links[k]] += flow_weight[f]
            count[flow_links[k]] += 1
    nnz = 0
    for e in range(nlinks):
        nnz += count[e]

    remaining = capacity_Bps.astype(np.float64).copy()
    version = np.zeros(nlinks, dtype=np.int64)
    dirty = np.zeros(nlinks, dtype=np.bool_)
    dirty_list = np.empty(nlinks, dtype=np.int64)
    # Every push is a link's first entry or follows a freeze of a flow
    # crossing that link: at most L + nnz entries.
    hsize_max = nlinks + nnz + 1
    hkey = np.empty(hsize_max, dtype=np.float64)
    hid = np.empty(hsize_max, dtype=np.int64)
    hver = np.empty(hsize_max, dtype=np.int64)
    # NOTE: np.int64(0), not 0: numba types a plain 0 passed to a helper as
    # Literal[int](0) and compiles the helper once more for it (~1.5 s of CPU
    # over the simulator's helpers on a cold cache).
    size = np.int64(0)
    for e in range(nlinks):
        if count[e] > 0:
            size = _heap_push(hkey, hid, hver, size, remaining[e] / weight[e], e, np.int64(0))

    ncap = cap_order.shape[0]
    cp = 0
    left = m
    while left > 0:
        # The next cap of an unfrozen member, and the next live heap entry.
        while cp < ncap and state[cap_order[cp]] != 1:
            cp += 1
        cap_share = flow_cap_Bps[cap_order[cp]] / flow_weight[cap_order[cp]] if cp < ncap \
            else np.inf
        while size > 0 and (hver[0] != version[hid[0]] or count[hid[0]] <= 0):
            size = _heap_pop(hkey, hid, hver, size)  # stale: re-keyed since this push
        link_share = hkey[0] if size > 0 else np.inf
        if cap_share == np.inf and link_share == np.inf:
            break  # only unconstrained flows remain
        # The bottleneck's flows: the capped flow alone, or the flows of the link.
        if cap_share <= link_share:
            level = cap_share
            bottleneck = cap_order[cp : cp + 1]
            cp += 1
        else:
            level = link_share
            e0 = hid[0]
            size = _heap_pop(hkey, hid, hver, size)
            bottleneck = lflow[lptr[e0] : lptr[e0 + 1]]
        ndirty = np.int64(0)
        for f in bottleneck:
            if state[f] == 1:
                ndirty = _freeze_flow(
                    f,
                    level,
                    flow_ptr,
                    flow_links,
                    flow_weight,
                    rate_Bps,
                    state,
                    weight,
                    count,
                    remaining,
                    dirty,
                    dirty_list,
                    ndirty,
                )
                left -= 1
        # Re-key each touched link once per bottleneck, not once per crossing.
        for i in range(ndirty):
            e = dirty_list[i]
            dirty[e] = False
            version[e] += 1
            if count[e] > 0:
                size = _heap_push(hkey, hid, hver, size, remaining[e] / weight[e], e, version[e])
    for j in range(m):
        state[members[j]] = 0
    return rate_Bps


@njit(cache=True)
def maxmin_core(net, subset, cap_order, rate_Bps):
    """Weighted max-min rates of the flows in ``subset`` of ``net`` (numba kernel, no checks).

    Writes ``rate_Bps[subset[j]]``; other entries are left alone: flows
    outside ``subset`` take no capacity. ``cap_order``: see
    :func:`maxmin_on_incidence`.
    """
    lptr, lflow = build_incidence(net.flow_ptr, net.flow_links, net.capacity_Bps.shape[0], subset)
    state = np.zeros(net.flow_ptr.shape[0] - 1, dtype=np.int8)
    return maxmin_on_incidence(net, subset, cap_order, lptr, lflow, state, rate_Bps)


@njit(cache=True)
def cap_order_of(net, subset):
    """Members of ``subset`` with a finite cap, in ascending order of ``cap / weight`` (stable)."""
    flow_cap_Bps, flow_weight = net.flow_cap_Bps, net.flow_weight
    n = 0
    for j in range(subset.shape[0]):
        if flow_cap_Bps[subset[j]] < np.inf:
            n += 1
    ids = np.empty(n, dtype=np.int64)
    vals = np.empty(n, dtype=np.float64)
    n = 0
    for j in range(subset.shape[0]):
        f = subset[j]
        if flow_cap_Bps[f] < np.inf:
            ids[n] = f
            vals[n] = flow_cap_Bps[f] / flow_weight[f]
            n += 1
    return ids[argsort_stable(vals)]


@njit(cache=True)
def maxmin_subset_into(net, subset, rate_Bps):
    """Weighted max-min rates of the flows in ``subset`` of ``net`` only (numba kernel, no
    checks).

    As :func:`maxmin_core`, sorting the subset's caps itself.
    """
    return maxmin_core(net, subset, cap_order_of(net, subset), rate_Bps)


@njit(cache=True)
def maxmin_into(flow_ptr, flow_links, capacity_Bps, flow_cap_Bps, flow_weight, rate_Bps):
    """Fill ``rate_Bps[:F]`` with the weighted max-min rates of all flows (numba, no checks).

    The entry point from Python, so it takes the :class:`FlowNet`'s arrays
    one by one: numba types a tuple argument at each call (about 5 us more
    per call, once per epoch of the dynamic simulator).
    """
    net = FlowNet(flow_ptr, flow_links, capacity_Bps, flow_cap_Bps, flow_weight)
    return maxmin_subset_into(net, np.arange(flow_ptr.shape[0] - 1), rate_Bps)


# --------------------------------------------------------------------- wrapper
def _check(flow_ptr, flow_links, capacity_Bps, flow_cap_Bps, flow_weight=None) -> FlowNet:
    flow_ptr = np.ascontiguousarray(flow_ptr, dtype=np.int64)
    flow_links = np.ascontiguousarray(flow_links, dtype=np.int64)
    capacity_Bps = np.ascontiguousarray(capacity_Bps, dtype=np.float64)
    flow_cap_Bps = np.ascontiguousarray(flow_cap_Bps, dtype=np.float64)
    if flow_ptr.ndim != 1 or flow_ptr.size < 1:
        raise ValueError(
            f"flow_ptr must be a 1-d array of F + 1 offsets, got shape {flow_ptr.shape}"
        )
    nflows = flow_ptr.size - 1
    steps = np.diff(flow_ptr)
    if np.any(steps < 0):
        raise ValueError(f"flow_ptr decreases at flow {int(np.flatnonzero(steps < 0)[0])}")
    if flow_ptr[0] != 0 or flow_ptr[-1] != flow_links.size:
        raise ValueError(
            f"flow_ptr must run from 0 to len(flow_links) = {flow_links.size}, "
            f"got {int(flow_ptr[0])} .. {int(flow_ptr[-1])}"
        )
    if flow_cap_Bps.shape != (nflows,):
        raise ValueError(f"flow_cap_Bps has shape {flow_cap_Bps.shape}, expected ({nflows},)")
    if capacity_Bps.ndim != 1:
        raise ValueError(f"capacity_Bps must be 1-d, got shape {capacity_Bps.shape}")
    bad = np.flatnonzero(~(capacity_Bps > 0))
    if bad.size:
        e = int(bad[0])
        raise ValueError(f"capacity_Bps[{e}] = {float(capacity_Bps[e])!r}; capacities must be > 0")
    bad = np.flatnonzero(~(flow_cap_Bps > 0))
    if bad.size:
        f = int(bad[0])
        raise ValueError(
            f"flow_cap_Bps[{f}] = {float(flow_cap_Bps[f])!r}; caps must be > 0 (inf: none)"
        )
    check_indices("flow_links", flow_links, capacity_Bps.size, "a link id in")
    if flow_weight is None:
        flow_weight = np.ones(nflows)
    flow_weight = np.ascontiguousarray(flow_weight, dtype=np.float64)
    if flow_weight.shape != (nflows,):
        raise ValueError(f"flow_weight has shape {flow_weight.shape}, expected ({nflows},)")
    bad = np.flatnonzero(~((flow_weight > 0) & (flow_weight < np.inf)))
    if bad.size:
        f = int(bad[0])
        raise ValueError(
            f"flow_weight[{f}] = {float(flow_weight[f])!r}; weights must be finite and > 0"
        )
    return FlowNet(flow_ptr, flow_links, capacity_Bps, flow_cap_Bps, flow_weight)


def maxmin_rates(
    flow_ptr: np.ndarray,
    flow_links: np.ndarray,
    capacity_Bps: np.ndarray,
    flow_cap_Bps: np.ndarray,
    flow_weight: np.ndarray | None = None,
) -> np.ndarray:
    """The exact (weighted) max-min fair rate of every flow.

    Parameters
    ----------
    flow_ptr : int64[F + 1]
        The links of flow ``f`` are ``flow_links[flow_ptr[f]:flow_ptr[f + 1]]``.
    flow_links : int64[nnz]
        Link ids in ``[0, L)``.
    capacity_Bps : float64[L]
        Capacity of each link, bytes per second, ``> 0``.
    flow_cap_Bps : float64[F]
        Per-flow rate ceiling, ``np.inf`` for none.
    flow_weight : float64[F], optional
        Each flow's weight (finite, ``> 0``; default 1): flows held by the
        same bottleneck get rates in proportion to their weights.

    Returns
    -------
    float64[F]
        Rates in bytes per second. A flow with no links and no cap gets ``inf``.

    Examples
    --------
    Two flows share link 0 (10 B/s); the second also crosses link 1 (2 B/s),
    which holds it to 2, so the first gets the remaining 8:

    >>> import numpy as np
    >>> maxmin_rates(np.array([0, 1, 3]), np.array([0, 0, 1]),
    ...              np.array([10.0, 2.0]), np.array([np.inf, np.inf]))
    array([8., 2.])

    Weighted 3 : 1, two flows alone on link 0 share it 3 : 1:

    >>> maxmin_rates(np.array([0, 1, 2]), np.array([0, 0]), np.array([8.0]),
    ...              np.array([np.inf, np.inf]), np.array([3.0, 1.0]))
    array([6., 2.])
    """
    net = _check(flow_ptr, flow_links, capacity_Bps, flow_cap_Bps, flow_weight)
    return maxmin_into(*net, np.empty(net.flow_ptr.size - 1, dtype=np.float64))


def maxmin_rates_reference(
    flow_ptr: np.ndarray,
    flow_links: np.ndarray,
    capacity_Bps: np.ndarray,
    flow_cap_Bps: np.ndarray,
    flow_weight: np.ndarray | None = None,
) -> np.ndarray:
    """Slow, obvious progressive filling; the twin of :func:`maxmin_rates`.

    Raise every unfrozen flow's rate by its weight times the largest common
    step that keeps all links (and caps) feasible; freeze the flows of every
    link or cap that is now full; repeat.

    Examples
    --------
    >>> import numpy as np
    >>> maxmin_rates_reference(np.array([0, 1, 3]), np.array([0, 0, 1]),
    ...                        np.array([10.0, 2.0]), np.array([np.inf, np.inf]))
    array([8., 2.])
    """
    fp, fl, cap, fcap, wf = _check(flow_ptr, flow_links, capacity_Bps, flow_cap_Bps, flow_weight)
    nflows = fp.size - 1
    links_of = [[int(e) for e in fl[fp[f] : fp[f + 1]]] for f in range(nflows)]
    rate = [0.0] * nflows
    active = [True] * nflows
    used = [0.0] * cap.size  # capacity taken so far
    while any(active):
        # weight of each link: the weights of the active flows crossing it,
        # once per crossing
        weight = [0.0] * cap.size
        for f in range(nflows):
            if active[f]:
                for e in links_of[f]:
                    weight[e] += wf[f]
        step = np.inf
        for e in range(cap.size):
            if weight[e]:
                step = min(step, (cap[e] - used[e]) / weight[e])
        for f in range(nflows):
            if active[f]:
                step = min(step, (fcap[f] - rate[f]) / wf[f])
        if step == np.inf:
            for f in range(nflows):
                if active[f]:
                    rate[f] = np.inf
                    active[f] = False
            break
        step = max(step, 0.0)
        for f in range(nflows):
            if active[f]:
                rate[f] += step * wf[f]
                for e in links_of[f]:
                    used[e] += step * wf[f]
        tol = 1e-12
        full = [weight[e] > 0 and cap[e] - used[e] <= tol * cap[e] for e in range(cap.size)]
        for f in range(nflows):
            capped = fcap[f] < np.inf and fcap[f] - rate[f] <= tol * fcap[f]
            if active[f] and (capped or any(full[e] for e in links_of[f])):
                active[f] = False
    return np.array(rate, dtype=np.float64)
