"""Numba kernels of the ``hscore`` planner: arrays in, arrays out, no validation.

The public wrapper (:mod:`pathweave.plan.hscore`) validates options and
derives the per-path segment offsets once; these functions trust their
inputs. :func:`decide` is the per-pair rule of the h-score blog and is also
callable from Python, so tests can probe it with hand-made h-scores.
Each kernel has a slow plain-Python twin at the end of the module
(:func:`segments_reference`, :func:`decide_reference`, :func:`route_reference`,
:func:`nonzero_flat_reference`, :func:`size_head_reference`,
:func:`route_headed_reference`, :func:`route_below_reference`) that
tests/test_hscore.py compares it with.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from pathweave._sort import argsort_int64, argsort_stable, select

# Path kinds, as pathweave.fabric.PathKind codes (numba cannot see the enum).
_DIRECT = 0
_RAIL = 2
_SPINE = 3

# Decision codes returned by decide(); also the slots of the counters array.
CODE_INTRA = 0  # intra-node pair: direct path
CODE_MATCHED = 1  # both ends on the same rail: the rail-matched path
CODE_RD = 2  # gamma(G1) > gamma(G2): source's own rail
CODE_DR = 3  # gamma(G1) <= gamma(G2): destination's own rail (PXN)
CODE_REMOTE = 4  # remote-rail theorem, best-fit rail: a drd path
CODE_SPRAY = 5  # remote-rail theorem, spraying over the rails in the window
CODE_SPINE = 6  # a spine path beat the rail choice's h-score product
CODE_FALLBACK = 7  # rd or dr path missing: the best-product rail path
CODE_OTHER = 8  # no rail and no spine path: the pair's first candidate
NUM_CODES = 9


@njit(cache=True)
def path_segments(links, length, into_rail, from_rail, from_gpu, to_gpu, sf_end, core_lo,
                  core_hi, df_lo):
    """Split every rail and spine path into source forward, crossing, destination forward.

    The crossing runs from the first link into a rail switch to the last
    link out of one: ``NIC -> rail -> NIC`` on a rail path, ``NIC -> rail ->
    spine -> rail -> NIC`` on a spine path. The forward inside the source node
    ends where the gateway GPU's PCIe route to its NIC starts (the last link
    out of a GPU before the crossing); the one inside the destination node
    starts after the NIC's PCIe route into a GPU (the first link into a GPU
    after the crossing). ``from_gpu[e]`` / ``to_gpu[e]``: link ``e`` leaves /
    enters a GPU. Paths that touch no rail switch keep zeros.
    """
    for p in range(links.shape[0]):
        first = -1
        last = -1
        for h in range(length[p]):
            e = links[p, h]
            if first < 0 and into_rail[e]:
                first = h
            if from_rail[e]:
                last = h
        if first >= 1 and last >= first:
            up = first - 1
            while up > 0 and not from_gpu[links[p, up]]:
                up -= 1
            down = last + 1
            while down < length[p] - 1 and not to_gpu[links[p, down]]:
                down += 1
            sf_end[p] = up
            core_lo[p] = first
            core_hi[p] = last + 1
            df_lo[p] = down + 1


@njit(cache=True, inline="always")
def decide(hx, hsf, hdf, rail_pid, g1, g2, delta, chosen):
    """The rail(s) for one inter-node pair, from its per-rail h-scores.

    Parameters
    ----------
    hx, hsf, hdf : float64[K]
        Per rail ``x``: h-score of the crossing on ``x`` (``H(x)``), of the
        forward inside the source node to ``x``'s gateway GPU, and of the
        forward inside the destination node from ``x``'s gateway.
    rail_pid : int64[K]
        Path id of the pair's rail path via ``x``, -1 where it has none.
    g1, g2 : int
        The source's and destination's own rail (-1 without a NIC).
    delta : float
        Spraying half-width; negative disables spraying.
    chosen : int64[K]
        Output: the chosen rails, ascending, in ``chosen[:n]``.

    Returns
    -------
    n : int
        Number of rails chosen (0 when the pair has no rail path).
    code : int
        One of the ``CODE_*`` constants.
    gamma1, gamma2 : float
        ``gamma(G1) = H(g1) / H(d1)`` and ``gamma(G2) = H(g2) / H(d2)``;
        NaN on the fallback.
    """
    k = hx.shape[0]
    rd = rail_pid[g1] if g1 >= 0 else -1
    dr = rail_pid[g2] if g2 >= 0 else -1
    if rd < 0 or dr < 0:
        # Off the blog's model (a GPU without a NIC, rules or max_hops that
        # dropped the rd or dr path): take the healthiest rail path there is.
        best = -1
        best_s = -1.0
        for x in range(k):
            if rail_pid[x] >= 0:
                s = hsf[x] * hx[x] * hdf[x]
                if s > best_s:
                    best_s = s
                    best = x
        if best < 0:
            return 0, CODE_OTHER, np.nan, np.nan
        chosen[0] = best
        return 1, CODE_FALLBACK, np.nan, np.nan
    # H(d1): the dr path's forward inside the source node (s -> GPU on g2);
    # H(d2): the rd path's forward inside the destination node (GPU on g1 -> d).
    gamma1 = hx[g1] / hsf[g2]
    gamma2 = hx[g2] / hdf[g1]
    if g1 == g2:
        base_code = CODE_MATCHED
        base = g1
    elif gamma1 > gamma2:
        base_code = CODE_RD
        base = g1
    else:  # ties go to dr: NCCL's PXN path, the status quo
        base_code = CODE_DR
        base = g2
    m = max(gamma1, gamma2)
    chosen[0] = base
    if m >= 1.0:
        # Corollary of the remote-rail theorem: H(x) <= 1 <= m, so no rail is
        # routable and the search can be skipped.
        return 1, base_code, gamma1, gamma2
    # The blog's sorted rail list: rails with a path, by h-score, ties by rail
    # index. Best fit: the first rail of that list strictly above m, own rails
    # skipped (they cannot be there: H(g1) <= gamma(G1) because H(d1) <= 1,
    # but skipping them keeps the rule a remote-rail rule whatever the
    # floating point does); that is the least (h-score, rail) above m.
    # NOTE: found by one scan instead of sorting: the sort's temporary arrays
    # (allocated and freed per pair) were most of a pair's decision.
    fit = -1
    for x in range(k):
        if rail_pid[x] >= 0 and hx[x] > m and x != g1 and x != g2 and (
                fit < 0 or hx[x] < hx[fit]):
            fit = x
    if fit < 0:
        return 1, base_code, gamma1, gamma2
    if delta >= 0.0:
        # The window: every rail with a path whose h-score lies in
        # [m - delta, m + delta], in rail order.
        nw = 0
        for x in range(k):
            if rail_pid[x] >= 0 and m - delta <= hx[x] <= m + delta:
                chosen[nw] = x
                nw += 1
        if nw > 0:
            return nw, CODE_SPRAY, gamma1, gamma2
    chosen[0] = fit
    return 1, CODE_REMOTE, gamma1, gamma2


@njit(cache=True)
def route_kernel(order, pairs, nbytes, pair_ptr, vertex_node, rank_vertex, first_rail,
                 links, length, kind, via, sf_end, core_lo, core_hi, df_lo, num_rails, delta,
                 limit, load, out_pid, out_bytes, counts):
    """Route the pairs ``order`` one after the other; return the number of flows.

    ``load`` (bytes per link) is updated as pairs are placed; ``out_pid`` and
    ``out_bytes`` receive the fragments (at most ``max(1, num_rails)`` per
    pair); ``counts[code]`` counts pairs per decision code. Routing stops and
    -1 is returned as soon as a fragment leaves some link ``e`` with
    ``load[e] > limit[e]`` (``np.inf`` everywhere: never). ``pairs[k]`` is
    the flat pair ``s * N + d`` of ``nbytes[k]``; its candidates are
    ``pair_ptr[q]:pair_ptr[q + 1]``, its ranks' nodes
    ``vertex_node[rank_vertex[s]]`` and first rails ``first_rail[s]``.
    """
    # NOTE: the per-pair look-ups happen here, not as numpy calls before the
    # call: eight fewer array operations per plan (~5 us of an 8-GPU plan).
    ranks = rank_vertex.shape[0]
    kk = max(num_rails, 1)
    hx = np.ones(kk)
    hsf = np.ones(kk)
    hdf = np.ones(kk)
    rail_pid = np.full(kk, -1, dtype=np.int64)
    chosen = np.empty(kk, dtype=np.int64)
    # The pair's fragments before they are placed: path, bytes.
    frag_p = np.empty(kk, dtype=np.int64)
    frag_b = np.empty(kk, dtype=np.int64)
    # A path's link sets [seg[i, 0], seg[i, 1]) and their set scores.
    seg = np.zeros((5, 2), dtype=np.int64)
    score = np.ones(5)
    n_out = 0
    # NOTE: set scores and placements are written out here, not called: numba
    # reference-counts (atomically) every array a helper call passes, and the
    # ~25 calls per pair were a quarter of hscore's time at 64 GPUs.
    for k in order:
        s, d = divmod(pairs[k], ranks)
        lo = pair_ptr[pairs[k]]
        hi = pair_ptr[pairs[k] + 1]
        f = nbytes[k]
        ff = float(f)
        nf = 1
        if vertex_node[rank_vertex[s]] == vertex_node[rank_vertex[d]]:  # inside a node
            p = lo
            for q in range(lo, hi):
                if kind[q] == _DIRECT:
                    p = q
                    break
            frag_p[0] = p
            frag_b[0] = f
            counts[CODE_INTRA] += 1
        else:
            for x in range(kk):  # NOTE: not rail_pid[:]: a slice is a reference-counted view
                rail_pid[x] = -1
            best_sp = -1
            best_sp_s = -1.0
            for p in range(lo, hi):
                if kind[p] == _RAIL:
                    nseg = 3  # forward to the gateway, the crossing, forward from it
                    seg[0, 0], seg[0, 1] = 0, sf_end[p]
                    seg[1, 0], seg[1, 1] = core_lo[p], core_hi[p]
                    seg[2, 0], seg[2, 1] = df_lo[p], length[p]
                elif kind[p] == _SPINE:
                    # H(g1) * H(S) * H(g2): the source's link up to its rail,
                    # the spine links, its rail down to the destination;
                    # forwards inside the nodes (none with the path rules)
                    # multiply in too.
                    nseg = 5
                    seg[0, 0], seg[0, 1] = core_lo[p], core_lo[p] + 1
                    seg[1, 0], seg[1, 1] = core_lo[p] + 1, core_hi[p] - 1
                    seg[2, 0], seg[2, 1] = core_hi[p] - 1, core_hi[p]
                    seg[3, 0], seg[3, 1] = 0, sf_end[p]
                    seg[4, 0], seg[4, 1] = df_lo[p], length[p]
                else:
                    continue
                # h-score of each link set for f bytes: min_e f / (L_e + f) is
                # f / (max_e L_e + f), one division per set; an empty set scores 1.
                for i in range(nseg):
                    worst = 0.0
                    for h in range(seg[i, 0], seg[i, 1]):
                        v = load[links[p, h]]
                        if v > worst:
                            worst = v
                    score[i] = ff / (worst + ff)
                if kind[p] == _RAIL:
                    x = via[p]
                    rail_pid[x] = p
                    hsf[x] = score[0]
                    hx[x] = score[1]
                    hdf[x] = score[2]
                else:
                    sp = score[0] * score[1] * score[2] * score[3] * score[4]
                    if sp > best_sp_s:
                        best_sp_s = sp
                        best_sp = p
            n, code, _, _ = decide(hx, hsf, hdf, rail_pid, first_rail[s], first_rail[d], delta,
                                   chosen)
            # A sprayed choice is as healthy as its least healthy fragment.
            rail_s = 2.0
            for j in range(n):
                x = chosen[j]
                sc = hsf[x] * hx[x] * hdf[x]
                if sc < rail_s:
                    rail_s = sc
            if best_sp >= 0 and (n == 0 or best_sp_s > rail_s):
                frag_p[0] = best_sp
                frag_b[0] = f
                counts[CODE_SPINE] += 1
            elif n == 0:
                frag_p[0] = lo
                frag_b[0] = f
                counts[CODE_OTHER] += 1
            else:
                # Even shares, earlier rails take the extra bytes (split_evenly's rule).
                share = f // n
                extra = f % n
                nf = 0
                for j in range(n):
                    piece = share + (1 if j < extra else 0)
                    if piece > 0:
                        frag_p[nf] = rail_pid[chosen[j]]
                        frag_b[nf] = piece
                        nf += 1
                counts[code] += 1
        # Place the fragments; stop once a link's load passes its limit (loads
        # only grow, so the finished plan's would too).
        for j in range(nf):
            p = frag_p[j]
            out_pid[n_out] = p
            out_bytes[n_out] = frag_b[j]
            n_out += 1
            fb = float(frag_b[j])
            over = False
            for h in range(length[p]):
                e = links[p, h]
                load[e] += fb
                over |= load[e] > limit[e]
            if over:
                return -1
    return n_out


@njit(cache=True)
def nonzero_flat(demand):  # pragma: no cover - numba
    """The pairs with bytes (flat ``s * N + d``, increasing) and their bytes, in one
    call (``demand``: ``int64[N, N]``, C-contiguous): numpy's three passes were ~4 us
    of an 8-GPU plan."""
    flat = demand.reshape(-1)
    n = np.count_nonzero(flat)
    pairs = np.empty(n, dtype=np.int64)
    nbytes = np.empty(n, dtype=np.int64)
    k = 0
    for i in range(flat.shape[0]):
        if flat[i] != 0:
            pairs[k] = i
            nbytes[k] = flat[i]
            k += 1
    return pairs, nbytes


@njit(cache=True)
def size_head(nbytes, k):
    """Indices of the first ``k`` (``1 <= k <= nbytes.size``) of ``nbytes`` in ``"size"``
    order (largest first, ties by index), in that order, without sorting the rest:
    the selection of :func:`size_head_reference` in one call."""
    v = select(nbytes, nbytes.size - k)  # the k-th largest
    above = 0
    for i in range(nbytes.size):
        above += nbytes[i] > v
    out = np.empty(k, dtype=np.int64)
    big = np.empty(above, dtype=np.int64)
    j = 0
    t = above
    for i in range(nbytes.size):
        if nbytes[i] > v:
            big[j] = i
            j += 1
        elif nbytes[i] == v and t < k:
            out[t] = i
            t += 1
    order = argsort_stable(-nbytes[big])
    for j in range(above):
        out[j] = big[order[j]]
    return out



@njit(cache=True)
def route_headed(pairs, nbytes, head, by_size, pair_ptr, vertex_node, rank_vertex, first_rail,
                 links, length, kind, via, sf_end, core_lo, core_hi, df_lo, num_rails, delta,
                 limit, out_pid, out_bytes, counts):  # pragma: no cover - numba
    """:func:`route_kernel` over every pair, largest first (``by_size``, ties by pair) or
    in pair order, from no load; returns the flows or -1.

    With ``head > 0`` and more than ``2 * head`` pairs, the first ``head`` of
    the size order (:func:`size_head`) are routed alone first, and -1 returned
    if they pass a limit: the whole routing would, at the same pair, and the
    rest is never sorted (``hscore_below``'s early stop, the one place it is
    written). ``out_pid``, ``out_bytes`` and ``counts`` as ``route_kernel``'s.
    """
    num_links = limit.shape[0]
    if head > 0 and pairs.size > 2 * head:
        counts[:] = 0
        if route_kernel(size_head(nbytes, head), pairs, nbytes, pair_ptr, vertex_node,
                        rank_vertex, first_rail, links, length, kind, via, sf_end, core_lo,
                        core_hi, df_lo, num_rails, delta, limit, np.zeros(num_links), out_pid,
                        out_bytes, counts) < 0:
            return -1
    counts[:] = 0
    seq = argsort_int64(-nbytes) if by_size else np.arange(pairs.size)
    return route_kernel(seq, pairs, nbytes, pair_ptr, vertex_node, rank_vertex, first_rail,
                        links, length, kind, via, sf_end, core_lo, core_hi, df_lo, num_rails,
                        delta, limit, np.zeros(num_links), out_pid, out_bytes, counts)


@njit(cache=True)
def route_below(demand, stop_s, head, setup_s, capacity, num_links, pair_ptr, vertex_node,
                rank_vertex, first_rail, links, length, kind, via, sf_end, core_lo, core_hi,
                df_lo, num_rails, delta, out):  # pragma: no cover - numba
    """:func:`route_headed` in ``"size"`` order under the link limits of
    ``hscore_below`` at ``stop_s``, the demand's pairs found here: one call.

    Link ``e``'s limit is ``(stop_s - setup_s) * capacity[e] * (1 + 1e-9)``
    (``capacity``: effective capacities, the first ``num_links`` the real
    links'). ``out``: ``int64[3, M]`` with ``M >= max(pairs * rails,
    NUM_CODES)`` (:func:`below_width`), written as ``out[0]`` path ids,
    ``out[1]`` bytes, ``out[2, :NUM_CODES]`` decision counts. NOTE: one call
    for the wrapper's limit, ordering, buffers and routing: each was a numpy
    or numba call of its own, ~7 us of the ~11 us that ``hscore`` took in an
    8-GPU default plan it loses (and ~30 of ~55 us at 64 GPUs, with the
    head); and the outputs go into the caller's one buffer: three arrays
    returned (boxed) cost ~1 us more than one passed in.
    """
    limit = np.empty(num_links)
    for e in range(num_links):
        limit[e] = (stop_s - setup_s) * capacity[e] * (1.0 + 1e-9)
    pairs, nbytes = nonzero_flat(demand)
    return route_headed(pairs, nbytes, head, True, pair_ptr, vertex_node, rank_vertex,
                        first_rail, links, length, kind, via, sf_end, core_lo, core_hi, df_lo,
                        num_rails, delta, limit, out[0], out[1], out[2, :NUM_CODES])


def below_width(ranks: int, num_rails: int, delta: float) -> int:
    """The row length :func:`route_below`'s ``out`` needs for ``ranks`` ranks: a slot
    per fragment of every pair (``max(1, num_rails)`` a pair when spraying), and
    room for the decision counts."""
    return max(ranks * ranks * (max(num_rails, 1) if delta >= 0 else 1), NUM_CODES)

# ------------------------------------------------------------ slow reference twins
# Plain Python, one rule per line, written from the module's rules rather than
# from the kernels' loops; the tests compare every kernel above with its twin.


def segments_reference(links, length, into_rail, from_rail, from_gpu, to_gpu):
    """:func:`path_segments` as lists: ``(sf_end, core_lo, core_hi, df_lo)`` per path."""
    out = ([], [], [], [])
    for p in range(len(length)):
        hops = [int(e) for e in links[p, : length[p]]]
        entering = [h for h, e in enumerate(hops) if into_rail[e]]
        leaving = [h for h, e in enumerate(hops) if from_rail[e]]
        seg = (0, 0, 0, 0)
        if entering and leaving and entering[0] >= 1 and leaving[-1] >= entering[0]:
            lo, hi = entering[0], leaving[-1]
            # the gateway's PCIe route starts at the last hop out of a GPU
            # before the crossing; the NIC's route ends at the first hop into
            # a GPU after it
            up = max([h for h in range(lo) if from_gpu[hops[h]]], default=0)
            down = min([h for h in range(hi + 1, len(hops)) if to_gpu[hops[h]]],
                       default=len(hops) - 1)
            seg = (up, lo, hi + 1, down + 1)
        for column, value in zip(out, seg, strict=True):
            column.append(value)
    return out


def decide_reference(hx, hsf, hdf, rail_pid, g1, g2, delta):
    """:func:`decide` with a sorted list; returns ``(rails, code, gamma1, gamma2)``."""
    rails = [x for x in range(len(hx)) if rail_pid[x] >= 0]
    if g1 < 0 or g2 < 0 or rail_pid[g1] < 0 or rail_pid[g2] < 0:
        if not rails:
            return [], CODE_OTHER, math.nan, math.nan
        best = max(rails, key=lambda x: (hsf[x] * hx[x] * hdf[x], -x))
        return [best], CODE_FALLBACK, math.nan, math.nan
    gamma1 = hx[g1] / hsf[g2]
    gamma2 = hx[g2] / hdf[g1]
    base_code = CODE_MATCHED if g1 == g2 else (CODE_RD if gamma1 > gamma2 else CODE_DR)
    base = g1 if base_code != CODE_DR else g2
    m = max(gamma1, gamma2)
    ranked = sorted(rails, key=lambda x: (hx[x], x))
    above = [x for x in ranked if hx[x] > m and x not in (g1, g2)]
    if m >= 1.0 or not above:
        return [base], base_code, gamma1, gamma2
    if delta >= 0.0:
        window = sorted(x for x in ranked if m - delta <= hx[x] <= m + delta)
        if window:
            return window, CODE_SPRAY, gamma1, gamma2
    return [above[0]], CODE_REMOTE, gamma1, gamma2


def route_reference(
    order, pairs, nbytes, pair_ptr, vertex_node, rank_vertex, first_rail, links, length, kind,
    via,
    sf_end, core_lo, core_hi, df_lo, num_rails, delta, limit, load, out_pid, out_bytes, counts,
):
    """:func:`route_kernel` in plain Python, with the same arguments and outputs."""

    def score(p, lo, hi, f):
        # The h-score of a set: its least healthy link, f / (L_e + f).
        return min((f / (load[links[p, h]] + f) for h in range(lo, hi)), default=1.0)

    flows = []

    def emit(p, b):
        # Place b bytes on path p; False once one of its links is over its limit.
        flows.append((p, b))
        hops = [links[p, h] for h in range(length[p])]
        for e in hops:
            load[e] += float(b)
        return all(load[e] <= limit[e] for e in hops)

    kk = max(num_rails, 1)
    hx, hsf, hdf = [1.0] * kk, [1.0] * kk, [1.0] * kk
    for k in order:
        q = int(pairs[k])
        src, dst = divmod(q, len(rank_vertex))
        lo, hi, f = int(pair_ptr[q]), int(pair_ptr[q + 1]), int(nbytes[k])
        if vertex_node[rank_vertex[src]] == vertex_node[rank_vertex[dst]]:
            direct = [q for q in range(lo, hi) if kind[q] == _DIRECT]
            if not emit(direct[0] if direct else lo, f):
                return -1
            counts[CODE_INTRA] += 1
            continue
        rail_pid = [-1] * kk
        spine = []
        for p in range(lo, hi):
            a, c0, c1, d0, z = sf_end[p], core_lo[p], core_hi[p], df_lo[p], length[p]
            if kind[p] == _RAIL:
                x = via[p]
                rail_pid[x] = p
                hsf[x], hx[x], hdf[x] = score(p, 0, a, f), score(p, c0, c1, f), score(p, d0, z, f)
            elif kind[p] == _SPINE:
                s = (score(p, c0, c0 + 1, f) * score(p, c0 + 1, c1 - 1, f)
                     * score(p, c1 - 1, c1, f) * score(p, 0, a, f) * score(p, d0, z, f))
                spine.append((s, p))
        rails, code, _, _ = decide_reference(hx, hsf, hdf, rail_pid, first_rail[src],
                                             first_rail[dst], delta)
        rail_s = min((hsf[x] * hx[x] * hdf[x] for x in rails), default=2.0)
        # The first spine path of the best score (the kernel keeps the first on ties).
        best_sp = max(spine, key=lambda sp: (sp[0], -sp[1])) if spine else None
        if best_sp is not None and (not rails or best_sp[0] > rail_s):
            placed = [emit(best_sp[1], f)]
            counts[CODE_SPINE] += 1
        elif not rails:
            placed = [emit(lo, f)]
            counts[CODE_OTHER] += 1
        else:
            share, extra = divmod(f, len(rails))
            placed = [emit(rail_pid[x], share + (j < extra))
                      for j, x in enumerate(rails) if share + (j < extra) > 0]
            counts[code] += 1
        if not all(placed):
            return -1
    for i, (p, b) in enumerate(flows):
        out_pid[i], out_bytes[i] = p, b
    return len(flows)


def size_head_reference(nbytes, k):
    """:func:`size_head` with numpy: the first ``k`` of a stable sort by size."""
    return np.argsort(-np.asarray(nbytes), kind="stable")[:k]


def nonzero_flat_reference(demand):
    """:func:`nonzero_flat` with numpy."""
    flat = np.asarray(demand).reshape(-1)
    pairs = np.flatnonzero(flat)
    return pairs.astype(np.int64), flat[pairs].astype(np.int64)


def route_headed_reference(pairs, nbytes, head, by_size, *tables):
    """:func:`route_headed` from the twins: numpy's stable sort and
    :func:`route_reference` over every pair, no head (a head must change nothing: the
    same arguments and outputs, and the same result)."""
    *rest, limit, out_pid, out_bytes, counts = tables
    order = np.argsort(-np.asarray(nbytes), kind="stable") if by_size else np.arange(len(pairs))
    counts[:] = 0
    return route_reference(order, pairs, nbytes, *rest, limit, np.zeros(len(limit)), out_pid,
                           out_bytes, counts)


def route_below_reference(demand, stop_s, head, setup_s, capacity, num_links, *tables):
    """:func:`route_below` from the twins: numpy's limits and pairs,
    :func:`route_headed_reference` (the same arguments, ``out`` last, and the same
    result)."""
    pairs, nbytes = nonzero_flat_reference(demand)
    limit = (stop_s - setup_s) * np.asarray(capacity[:num_links]) * (1.0 + 1e-9)
    *rest, out = tables
    return route_headed_reference(pairs, nbytes, head, True, *rest, limit, out[0], out[1],
                                  out[2, :NUM_CODES])
