"""Numba kernels that score striped plans and bound every plan from node-level sums.

Arrays in, arrays out; the public wrappers (:func:`pathweave.plan.timemodel.stripe_time`,
:func:`~pathweave.plan.timemodel.lower_bound_s`) validate and cache. Each kernel
has a slow, obvious twin here (``*_reference``) that the tests compare with.

Node-factored scoring. On a fabric of equal nodes whose ranks are numbered
node by node (rank ``s = ns * G + ls``), a rail-striped baseline sends pair
``(s, d)`` of different nodes over stripe ``j`` whose effective links split in
two: those of the source node, the same for every destination node (they
depend on ``s``, ``ld`` and ``j`` only), and those of the destination node,
the same for every source node (``ls``, ``d``, ``j``). A link's load is then
a sum of two small aggregates of the demand, ``XA[s, ld, j]`` (bytes ``s``
sends to local rank ``ld`` of other nodes on stripe ``j``) and
``XB[ls, d, j]``, and a fragment's lone time depends on its bytes only
through the largest fragment of its class ``(ls, ld, j)`` (the time grows
with the bytes). So one pass over the demand, reading it in order into
arrays that stay in cache, replaces a pass over every fragment's links.
Pairs inside a node keep their own paths and are scored one by one.

Loads are sums of whole bytes, exact in float64 below 2**53 bytes per link,
so the score equals the built plan's prediction bit for bit. The kernel also
returns the *tailed* links term (each link's drain time followed by the
longest pipeline fill of its fragments; a side's longest fill is its largest
fragment's), which the time model can charge in place of the bare drain.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit


@njit(cache=True)
def factor_tables(gpus, ptr, pid, links, length, owner, rate_cap, start, latency, stage,
                  kpair, side_a, side_b, params):  # pragma: no cover - numba
    """Fill the node-factored tables of stripes ``(ptr, pid)``; False if they do not factor.

    ``owner[e]``: the node an effective link belongs to (-1: none). Outputs
    (preallocated, -1 / NaN filled): ``kpair[ls, ld]`` stripes per pair of
    different nodes, ``side_a[s, ld, j, :]`` the source-node links,
    ``side_b[ls, d, j, :]`` the destination-node links (-1 padded) and
    ``params[ls, ld, j]`` = (start, rate cap, latency, stage) of the stripe.
    """
    n = ptr.shape[0] - 1
    ranks = int(np.sqrt(n) + 0.5)
    tmp_a = np.empty(links.shape[1], dtype=np.int64)
    tmp_b = np.empty(links.shape[1], dtype=np.int64)
    for s in range(ranks):
        ns = s // gpus
        ls = s - ns * gpus
        for d in range(ranks):
            nd = d // gpus
            if nd == ns:
                continue
            ld = d - nd * gpus
            q = s * ranks + d
            k = ptr[q + 1] - ptr[q]
            if kpair[ls, ld] < 0:
                kpair[ls, ld] = k
            elif kpair[ls, ld] != k:
                return False
            for j in range(k):
                p = pid[ptr[q] + j]
                ca = 0
                cb = 0
                for h in range(length[p]):
                    e = links[p, h]
                    if owner[e] == ns:
                        tmp_a[ca] = e
                        ca += 1
                    elif owner[e] == nd:
                        tmp_b[cb] = e
                        cb += 1
                    else:  # a link of neither node (e.g. a spine): not factored
                        return False
                if not _same_or_set(side_a[s, ld, j], tmp_a, ca):
                    return False
                if not _same_or_set(side_b[ls, d, j], tmp_b, cb):
                    return False
                par = params[ls, ld, j]
                vals = (start[p], rate_cap[p], latency[p], stage[p])
                if np.isnan(par[0]):
                    for i in range(4):
                        par[i] = vals[i]
                else:
                    for i in range(4):
                        if par[i] != vals[i]:
                            return False
    return True


@njit(cache=True, inline="always")
def _same_or_set(row, tmp, count):  # pragma: no cover - numba
    # First stripe of its group: record its links; later ones must match them.
    if row[0] == -2:
        for h in range(count):
            row[h] = tmp[h]
        for h in range(count, row.shape[0]):
            row[h] = -1
        return True
    for h in range(row.shape[0]):
        want = tmp[h] if h < count else -1
        if row[h] != want:
            return False
    return True


@njit(cache=True)
def intra_tables(gpus, ptr, pid, links, rate_cap, start, latency, stage):  # pragma: no cover
    """The stripes of pairs inside a node, packed: ``(iptr, ilinks, ipar)``.

    ``iptr`` is a CSR over ``(s, ld)`` (pair ``s`` to local rank ``ld`` of its own
    node); ``ilinks`` each stripe's effective links (-1 padded), ``ipar`` its
    (start, rate cap, latency, stage): a few kB the scoring pass reads in order
    instead of rows scattered over every path's tables.
    """
    ranks = int(np.sqrt(ptr.shape[0] - 1) + 0.5)
    iptr = np.zeros(ranks * gpus + 1, dtype=np.int64)
    for s in range(ranks):
        own = s // gpus * gpus
        for ld in range(gpus):
            q = s * ranks + own + ld
            iptr[s * gpus + ld + 1] = iptr[s * gpus + ld] + ptr[q + 1] - ptr[q]
    ilinks = np.empty((iptr[-1], links.shape[1]), dtype=np.int64)
    ipar = np.empty((iptr[-1], 4))
    for s in range(ranks):
        own = s // gpus * gpus
        for ld in range(gpus):
            q = s * ranks + own + ld
            for j in range(ptr[q + 1] - ptr[q]):
                i = iptr[s * gpus + ld] + j
                p = pid[ptr[q] + j]
                ilinks[i] = links[p]
                ipar[i, 0] = start[p]
                ipar[i, 1] = rate_cap[p]
                ipar[i, 2] = latency[p]
                ipar[i, 3] = stage[p]
    return iptr, ilinks, ipar


@njit(cache=True)
def factored_terms(demand, gpus, kpair, side_a, side_b, params, iptr, ilinks, ipar, capacity,
                   setup, chunk):  # pragma: no cover - numba
    """``(links_s, tailed_s, flows_s)`` of the striped plan of ``demand``, from the tables.

    ``links_s``: set-up plus the most loaded effective link's drain time;
    ``tailed_s``: set-up plus the largest ``fill + max drain over its links``
    of any fragment (each link's drain followed by its longest pipeline
    fill); ``flows_s``: the slowest lone fragment.
    """
    ranks = demand.shape[0]
    kmax = side_a.shape[2]
    xa = np.zeros((ranks, gpus, kmax), dtype=np.int64)
    xb = np.zeros((gpus, ranks, kmax), dtype=np.int64)
    ma = np.zeros((ranks, gpus, kmax), dtype=np.int64)
    mb = np.zeros((gpus, ranks, kmax), dtype=np.int64)
    load = np.zeros(capacity.shape[0])
    single = kmax == 1
    for ls in range(gpus):
        for ld in range(gpus):
            if kpair[ls, ld] != 1:
                single = False
    # Pairs inside a node: straight onto their paths.
    flows, used = _intra_fragments(demand, gpus, iptr, ilinks, ipar, load, chunk)
    if single:  # 2-D views: contiguous rows the adds vectorise over
        _single_sums(demand, gpus, xa.reshape(ranks, gpus), xb.reshape(gpus, ranks),
                     ma.reshape(ranks, gpus), mb.reshape(gpus, ranks))
    else:
        _split_sums(demand, gpus, kpair, xa, xb, ma, mb)
    # NOTE: the loops below index whole arrays: a slice per class (8 k at 1024
    # GPUs) costs reference counting that took longer than the sums above.
    for s in range(ranks):  # the largest fragment of each class has the slowest time
        ls = s % gpus
        for ld in range(gpus):
            for j in range(kmax):
                b = float(ma[s, ld, j])
                if b <= 0:
                    continue
                used = True
                flows = max(flows, params[ls, ld, j, 0] + b / params[ls, ld, j, 1]
                            + params[ls, ld, j, 2] + min(b, chunk) * params[ls, ld, j, 3])
    if not used:
        return 0.0, 0.0, 0.0
    _add_sides(xa, side_a, load)
    _add_sides(xb, side_b, load)
    drain = load / capacity
    worst = 0.0
    for e in range(drain.shape[0]):
        worst = max(worst, drain[e])
    tail = _intra_tails(demand, gpus, iptr, ilinks, ipar, drain, chunk)
    # A side's longest fill is its largest fragment's.
    tail = max(tail, _side_tails(ma, side_a, params, drain, chunk, True))
    tail = max(tail, _side_tails(mb, side_b, params, drain, chunk, False))
    return setup + worst, setup + tail, flows


@njit(cache=True)
def _side_tails(top_bytes, side, params, drain, chunk, source):  # pragma: no cover - numba
    # The largest ``drain + fill`` over the sides with bytes: ``top_bytes[a, b, j]``
    # the side's largest fragment, ``side[a, b, j]`` its links; (a, b) is (s, ld)
    # on the source side, (ls, d) on the destination side.
    # NOTE: the latest drain reads the whole padded row, padding (-1) counting
    # as 0 (drain times are >= 0), without a branch: a third of the time of
    # stopping at the first pad (1024 GPUs, 16 k sides); and it indexes the
    # 4-D array, no row slice: a slice per side costs reference counting.
    gpus = params.shape[0]
    tail = 0.0
    for a in range(top_bytes.shape[0]):
        for b in range(top_bytes.shape[1]):
            ls, ld = (a % gpus, b) if source else (a, b % gpus)
            for j in range(top_bytes.shape[2]):
                if top_bytes[a, b, j] <= 0:
                    continue
                top = 0.0
                for h in range(side.shape[3]):
                    e = side[a, b, j, h]
                    v = drain[max(e, 0)]
                    top = max(top, v if e >= 0 else 0.0)
                fill = params[ls, ld, j, 2] + min(float(top_bytes[a, b, j]), chunk) * params[
                    ls, ld, j, 3]
                tail = max(tail, top + fill)
    return tail


@njit(cache=True)
def _intra_tails(demand, gpus, iptr, ilinks, ipar, drain, chunk):  # pragma: no cover - numba
    # The tailed term of the pairs inside a node, fragment by fragment.
    ranks = demand.shape[0]
    tail = 0.0
    for s in range(ranks):
        own = s // gpus * gpus
        for ld in range(gpus):
            d = demand[s, own + ld]
            r = s * gpus + ld
            k = iptr[r + 1] - iptr[r]
            if d <= 0 or k <= 0:
                continue
            for j in range(k):
                b = float(d // k + (1 if j < d % k else 0))
                if b <= 0:
                    continue
                i = iptr[r] + j
                top = 0.0
                for h in range(ilinks.shape[1]):
                    e = ilinks[i, h]
                    if e < 0:
                        break
                    top = max(top, drain[e])
                tail = max(tail, top + (ipar[i, 2] + min(b, chunk) * ipar[i, 3]))
    return tail


@njit(cache=True)
def _single_sums(demand, gpus, xa, xb, ma, mb):  # pragma: no cover - numba
    # One stripe per pair: sums and maxima of each side's bytes, one pass.
    # NOTE: with the trip count a literal (8 GPUs a node, every preset) the
    # row helper runs 1.6x faster at 1024 GPUs: LLVM unrolls and vectorises
    # the eight lanes; any other node size takes the same code, not unrolled.
    ranks = demand.shape[0]
    for s in range(ranks):
        if gpus == 8:
            _row_sums(demand, s, 8, xa, xb, ma, mb)
        else:
            _row_sums(demand, s, gpus, xa, xb, ma, mb)


@njit(cache=True, inline="always")
def _row_sums(demand, s, gpus, xa, xb, ma, mb):  # pragma: no cover - numba
    # Row s of the demand into its destination-side sums (row ls of xb, mb:
    # shared by the sources of local rank ls) and its own per-local-rank sums
    # (row s of xa, ma). Pairs inside the source's node are not a side's.
    # NOTE: the destination sides in two whole-row loops around the own node
    # (they vectorise), the source's in strided loops with scalar sums: 1.3x
    # faster at 1024 GPUs than one loop doing both through small arrays. The
    # row loops run over row views from 0, which LLVM vectorises better than
    # 2-D indexing from an offset: these sums 1.22 -> 0.88 ms at 1024 GPUs.
    ranks = demand.shape[0]
    ls = s % gpus
    own = s - ls
    row, sums, tops = demand[s], xb[ls], mb[ls]
    _add_max(row[:own], sums[:own], tops[:own])
    _add_max(row[own + gpus:], sums[own + gpus:], tops[own + gpus:])
    for ld in range(gpus):
        acc = np.int64(0)
        top = np.int64(0)
        for t in range(ld, own, gpus):
            acc += demand[s, t]
            top = max(top, demand[s, t])
        for t in range(own + gpus + ld, ranks, gpus):
            acc += demand[s, t]
            top = max(top, demand[s, t])
        xa[s, ld] = acc
        ma[s, ld] = top


@njit(cache=True, inline="always")
def _add_max(row, sums, tops):  # pragma: no cover - numba
    # sums += row and tops = max(tops, row), elementwise.
    for t in range(row.shape[0]):
        x = row[t]
        sums[t] += x
        tops[t] = max(tops[t], x)


@njit(cache=True)
def _split_sums(demand, gpus, kpair, xa, xb, ma, mb):  # pragma: no cover - numba
    # Several stripes per pair: each gets the even share, earlier ones the extra bytes.
    ranks = demand.shape[0]
    nodes = ranks // gpus
    for s in range(ranks):
        ns = s // gpus
        ls = s - ns * gpus
        for nd in range(nodes):
            if nd == ns:
                continue
            lo = nd * gpus
            for ld in range(gpus):
                x = demand[s, lo + ld]
                k = kpair[ls, ld]
                if x <= 0 or k <= 0:
                    continue
                base = x // k
                rem = x % k
                for j in range(k):
                    b = base + (1 if j < rem else 0)
                    xa[s, ld, j] += b
                    xb[ls, lo + ld, j] += b
                    ma[s, ld, j] = max(ma[s, ld, j], b)
                    mb[ls, lo + ld, j] = max(mb[ls, lo + ld, j], b)


@njit(cache=True)
def _add_sides(agg, side, load):  # pragma: no cover - numba
    for a in range(agg.shape[0]):
        for b in range(agg.shape[1]):
            for j in range(agg.shape[2]):
                v = agg[a, b, j]
                if v == 0:
                    continue
                for h in range(side.shape[3]):
                    e = side[a, b, j, h]
                    if e < 0:
                        break
                    load[e] += v


@njit(cache=True)
def _intra_fragments(demand, gpus, iptr, ilinks, ipar, load, chunk):  # pragma: no cover
    # Every pair inside a node: its stripes (row s * gpus + ld of the packed
    # tables) onto their links; the slowest lone fragment, and whether any
    # pair moves bytes. NOTE: one call for every pair, not one per pair: a
    # call costs reference counting of its arrays (8 k pairs at 1024 GPUs).
    ranks = demand.shape[0]
    worst = 0.0
    used = False
    for s in range(ranks):
        own = s // gpus * gpus
        for ld in range(gpus):
            d = demand[s, own + ld]
            if d <= 0:
                continue
            used = True
            r = s * gpus + ld
            lo = iptr[r]
            k = iptr[r + 1] - lo
            if k <= 0:
                continue
            base = d // k
            rem = d % k
            for j in range(k):
                b = float(base + (1 if j < rem else 0))
                if b <= 0:
                    continue
                i = lo + j
                for h in range(ilinks.shape[1]):
                    e = ilinks[i, h]
                    if e < 0:
                        break
                    load[e] += b
                worst = max(worst, ipar[i, 0] + b / ipar[i, 1] + ipar[i, 2]
                            + min(b, chunk) * ipar[i, 3])
    return worst, used


def stripe_terms_reference(demand: np.ndarray, ptr: np.ndarray, pid: np.ndarray,
                           pc: Any) -> tuple[float, float, float]:
    """Slow twin of :func:`factored_terms`: every fragment of the striped plan, one by one."""
    flat = demand.reshape(-1)
    load = np.zeros(pc.capacity_Bps.size)
    frags = []
    flows, used = 0.0, False
    chunk = float(pc.chunk_bytes)
    for q in np.flatnonzero(flat > 0):
        used = True
        k = int(ptr[q + 1] - ptr[q])
        for j in range(k):
            b = float(flat[q] // k + (1 if j < flat[q] % k else 0))
            if b <= 0:
                continue
            p = pid[ptr[q] + j]
            links = pc.links[p, : pc.length[p]]
            np.add.at(load, links, b)  # a link may repeat on a path
            fill = pc.latency_s[p] + min(b, chunk) * pc.stage_s_per_byte[p]
            frags.append((links, fill))
            flows = max(flows, pc.start_s[p] + b / pc.rate_cap_Bps[p] + pc.latency_s[p]
                        + min(b, chunk) * pc.stage_s_per_byte[p])
    if not used:
        return 0.0, 0.0, 0.0
    drain = load / pc.capacity_Bps
    tail = max((float(drain[links].max(initial=0.0)) + fill for links, fill in frags),
               default=0.0)
    return pc.setup_s + float(drain.max()), pc.setup_s + tail, flows


# ------------------------------------------------------------------ cut bound
@njit(cache=True)
def cut_sums(demand, rank_node, members_ptr, members):  # pragma: no cover - numba
    """Bytes out of / into every GPU and node (to / from other nodes) and whether any moves.

    ``members[members_ptr[a]:members_ptr[a + 1]]``: the ranks of node ``a``.
    Integer sums: exact, and the row and column adds vectorise.
    """
    ranks = demand.shape[0]
    rows = np.zeros(ranks, dtype=np.int64)
    cols = np.zeros(ranks, dtype=np.int64)
    for s in range(ranks):
        row = demand[s]
        acc = 0
        for t in range(ranks):
            x = max(row[t], 0)
            acc += x
            cols[t] += x
        rows[s] = acc
    return node_sums(demand, rows, cols, rank_node, members_ptr, members)


@njit(cache=True)
def node_sums(demand, rows, cols, rank_node, members_ptr, members):  # pragma: no cover - numba
    """:func:`cut_sums` from the GPUs' sums ``rows`` / ``cols`` (bytes out of / into
    each GPU): reads only the pairs inside each node."""
    ranks = demand.shape[0]
    nnodes = members_ptr.shape[0] - 1
    nout = np.zeros(nnodes, dtype=np.int64)
    nin = np.zeros(nnodes, dtype=np.int64)
    for s in range(ranks):
        a = rank_node[s]
        if a >= 0:
            nout[a] += rows[s]
    for t in range(ranks):
        c = rank_node[t]
        if c >= 0:
            nin[c] += cols[t]
    for a in range(nnodes):  # minus the bytes that stay inside the node
        inner = 0
        for i in range(members_ptr[a], members_ptr[a + 1]):
            for k in range(members_ptr[a], members_ptr[a + 1]):
                inner += max(demand[members[i], members[k]], 0)
        nout[a] -= inner
        nin[a] -= inner
    used = False
    for s in range(ranks):
        if rows[s] > 0:
            used = True
    return rows, cols, nout, nin, used


@njit(cache=True)
def cut_bound(demand, rank_node, members_ptr, members, gpu_out, gpu_in, node_out,
              node_in):  # pragma: no cover - numba
    """``(max over cuts of bytes / capacity, whether any byte moves)`` from :func:`cut_sums`."""
    return _worst_cut(*cut_sums(demand, rank_node, members_ptr, members), gpu_out, gpu_in,
                      node_out, node_in)


@njit(cache=True)
def cut_bound_sums(demand, rows, cols, rank_node, members_ptr, members, gpu_out, gpu_in,
                   node_out, node_in):  # pragma: no cover - numba
    """:func:`cut_bound` with the GPUs' sums given (the demand check's,
    :func:`pathweave.plan._flows.whole_bytes`): no pass over the whole demand."""
    return _worst_cut(*node_sums(demand, rows, cols, rank_node, members_ptr, members),
                      gpu_out, gpu_in, node_out, node_in)


@njit(cache=True)
def _worst_cut(rows, cols, nout, nin, used, gpu_out, gpu_in, node_out,
               node_in):  # pragma: no cover - numba
    worst = 0.0
    for load, cap in ((rows, gpu_out), (cols, gpu_in), (nout, node_out), (nin, node_in)):
        for k in range(load.shape[0]):
            if cap[k] > 0 and load[k] / cap[k] > worst:
                worst = load[k] / cap[k]
    return worst, used


def cut_sums_reference(demand: np.ndarray, rank_node: np.ndarray, nnodes: int) -> tuple:
    """Slow twin of :func:`cut_sums`: pair by pair."""
    n = demand.shape[0]
    rows, cols = np.zeros(n), np.zeros(n)
    nout, nin = np.zeros(nnodes), np.zeros(nnodes)
    for s in range(n):
        for t in range(n):
            b = float(demand[s, t])
            if b <= 0:
                continue
            rows[s] += b
            cols[t] += b
            a, c = rank_node[s], rank_node[t]
            if a != c:
                if a >= 0:
                    nout[a] += b
                if c >= 0:
                    nin[c] += b
    return rows, cols, nout, nin, bool(rows.any())
