"""Helpers every planner shares: turning per-path byte counts into a Plan."""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from pathweave.fabric import Fabric, PathSet
from pathweave.plan._plan import Plan


def plan_from_flows(
    fabric: Fabric,
    demand: np.ndarray,
    paths: PathSet,
    flow_path: np.ndarray,
    flow_bytes: np.ndarray,
    policy: str,
    info: dict[str, Any] | None = None,
) -> Plan:
    """Build a :class:`Plan` from unsorted, possibly repeated (path, bytes) pairs.

    Path ids are ordered by pair, so sorting by path id sorts by pair too;
    repeated ids are summed and zero-byte fragments dropped.
    """
    fp = np.asarray(flow_path, dtype=np.int64)
    fb = np.asarray(flow_bytes, dtype=np.int64)
    if fp.size:
        # NOTE: a stable argsort and a check for repeats instead of np.unique
        # with its inverse: most planners emit each path once, and unique was
        # half of an 8-GPU hscore plan's Python time (8 of 14 us here).
        order = np.argsort(fp, kind="stable")
        fp, fb = fp[order], fb[order]
        if fp.size > 1 and not (fp[1:] > fp[:-1]).all():
            starts = np.flatnonzero(np.concatenate([[True], fp[1:] != fp[:-1]]))
            fp, fb = fp[starts], np.add.reduceat(fb, starts)
        keep = fb != 0
        fp, fb = fp[keep], fb[keep]
    fp.setflags(write=False)
    fb.setflags(write=False)
    return Plan(fabric, paths, demand, fp, fb, policy, 0.0, dict(info or {}))


def nonzero_pairs(demand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat pair indices ``s * N + d`` with demand, in increasing order, and their bytes."""
    flat = demand.reshape(-1)
    pairs = np.flatnonzero(flat)
    return pairs.astype(np.int64), flat[pairs].astype(np.int64)


def split_evenly(total: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """Split each ``total[i]`` into ``parts[i]`` whole shares differing by at most one byte.

    Returns the shares flattened in order; earlier shares get the extra bytes.

    >>> split_evenly(np.array([10, 7]), np.array([3, 2])).tolist()
    [4, 3, 3, 4, 3]
    """
    total = np.asarray(total, dtype=np.int64)
    parts = np.asarray(parts, dtype=np.int64)
    base = np.repeat(total // parts, parts)
    rem = np.repeat(total % parts, parts)
    starts = np.repeat(np.cumsum(parts) - parts, parts)
    idx = np.arange(base.size) - starts
    return base + (idx < rem)


def matching_paths(
    paths: PathSet, pairs: np.ndarray, accept: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For each pair, the candidate paths whose ``accept[path_id]`` is true.

    Returns ``(which, path_ids)``: ``which[i]`` indexes ``pairs`` for the
    ``i``-th match; matches are ordered by pair and then by path id.
    """
    lo = paths.pair_ptr[pairs]
    hi = paths.pair_ptr[pairs + 1]
    counts = hi - lo
    which = np.repeat(np.arange(pairs.size), counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    pid = np.repeat(lo, counts) + (np.arange(which.size) - starts)
    ok = accept[pid]
    return which[ok], pid[ok]


def first_matching(paths: PathSet, pairs: np.ndarray, accept: np.ndarray) -> np.ndarray:
    """For each pair, the first accepted path id, or -1 where none is."""
    which, pid = matching_paths(paths, pairs, accept)
    out = np.full(pairs.size, -1, dtype=np.int64)
    # reversed assignment leaves the first match of each pair in place
    out[which[::-1]] = pid[::-1]
    return out


@njit(cache=True)
def _stripe_flows(flat, ptr, pid, out):  # pragma: no cover - numba
    # Every pair's bytes split evenly over its stripe paths (split_evenly's
    # shares), zero shares dropped, into fp / fb = out[0] / out[1] (room for
    # every stripe); returns the count. NOTE: one pass (no counting pass first).
    fp = out[0]
    fb = out[1]
    i = 0
    for q in range(flat.shape[0]):
        d = flat[q]
        if d <= 0:
            continue
        lo = ptr[q]
        k = ptr[q + 1] - lo
        if k == 1:  # most pairs: no integer division
            fp[i] = pid[lo]
            fb[i] = d
            i += 1
            continue
        if k <= 0:
            continue
        base = d // k
        rem = d % k
        for j in range(k):
            b = base + (1 if j < rem else 0)
            if b > 0:
                fp[i] = pid[lo + j]
                fb[i] = b
                i += 1
    return i


@njit(cache=True)
def whole_bytes(src, out, sums):  # pragma: no cover - numba
    """Copy square ``src`` into int64 ``out``; the largest entry if every entry is
    a whole, non-negative number and the diagonal is zero, else -1. Adds each
    row's sum to ``sums[0]`` and each column's to ``sums[1]`` (``int64[2, N]``,
    valid when the result is not -1).

    NOTE: one pass instead of numpy's five (finite, min, diagonal, rint,
    compare, cast): the demand checks were most of a 1024-GPU replan. The
    largest entry and the sums (the cut bound's) come with it, saving the
    replan two passes of their own; both sums in one array: one allocation.
    """
    n = src.shape[0]
    bad = False
    top = np.int64(0)
    rows = sums[0]
    cols = sums[1]
    for i in range(n):
        row = src[i]
        dst = out[i]
        acc = np.int64(0)
        for j in range(n):
            x = row[j]
            y = np.int64(x)
            dst[j] = y
            top = max(top, y)
            acc += y
            # not (x < 2**63): NaN, inf and overflow (the cast is undefined there)
            bad |= (x < 0) | (not (x < 9.2e18)) | (y != x)
        rows[i] += acc
        for j in range(n):  # a loop of its own: it vectorises
            cols[j] += dst[j]
    for i in range(n):
        bad |= out[i, i] != 0
    return np.int64(-1) if bad else top


def whole_bytes_reference(src: np.ndarray) -> np.ndarray | None:
    """Slow twin of :func:`whole_bytes`: the int64 copy, or None where it would fail."""
    a = np.asarray(src)
    with np.errstate(invalid="ignore"):
        ok = (np.isfinite(a).all() and (a >= 0).all() and not np.diagonal(a).any()
              and np.array_equal(np.rint(a), a) and (a < 2.0**63).all())
    return a.astype(np.int64) if ok else None


@njit(cache=True)
def _single_flows(flat, path_of, out):  # pragma: no cover - numba
    # _stripe_flows where no pair has more than one stripe: path_of[q] is pair
    # q's path (-1: none). NOTE: branch-free (every pair is written, the count
    # moves on only for a kept one) and no stripe pointers to read: half the
    # time of _stripe_flows on a dense 1024-GPU demand. fp / fb need one slot
    # more than the fragments.
    fp = out[0]
    fb = out[1]
    i = 0
    for q in range(flat.shape[0]):
        d = flat[q]
        p = path_of[q]
        fp[i] = p
        fb[i] = d
        i += (d > 0) & (p >= 0)
    return i


def single_paths(
    paths: PathSet, stripes: tuple[np.ndarray, np.ndarray], key: str
) -> np.ndarray | None:
    """Every pair's one stripe path (``int32[N * N]``, -1: none), or None where a pair
    has several; kept with ``paths`` under ``key`` (the stripes' owner)."""

    def build() -> np.ndarray | None:
        ptr, pid = stripes
        count = np.diff(ptr)
        if count.size and (count.max() > 1 or paths.num_paths >= 2**31):
            return None
        out = np.full(count.size, -1, dtype=np.int32)
        out[count == 1] = pid
        out.setflags(write=False)
        return out

    return paths.derived(("stripes.single", key), build)


def stripe_flows_reference(
    demand: np.ndarray, stripes: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Slow twin of :func:`stripe_plan`'s kernels: ``(flow_path, flow_bytes)``, pair by pair."""
    ptr, pid = stripes
    fp: list[int] = []
    fb: list[int] = []
    for q, d in enumerate(np.asarray(demand, dtype=np.int64).reshape(-1).tolist()):
        k = int(ptr[q + 1] - ptr[q])
        if d <= 0 or k <= 0:
            continue
        for j, b in enumerate(split_evenly(np.array([d]), np.array([k])).tolist()):
            if b > 0:
                fp.append(int(pid[ptr[q] + j]))
                fb.append(b)
    return np.array(fp, dtype=np.int64), np.array(fb, dtype=np.int64)


def stripe_flows(
    flat: np.ndarray, stripes: tuple[np.ndarray, np.ndarray], single: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(flow_path, flow_bytes)`` of the striped plan of ``flat`` (``int64[N * N]``).

    Read-only views of one buffer with room for every stripe; ``single``: the
    per-pair path map of :func:`single_paths` where every pair has one stripe.
    """
    ptr, pid = stripes
    # pages past the last fragment are never touched. NOTE: one buffer, frozen
    # once: two allocations and two setflags were ~0.5 us of an 8-GPU plan.
    out = np.empty((2, pid.size + 1), dtype=np.int64)
    if single is not None:
        n = _single_flows(flat, single, out)
    else:
        n = _stripe_flows(flat, ptr, pid, out)
    out.setflags(write=False)
    return out[0, :n], out[1, :n]


def stripe_plan(
    fabric: Fabric, demand: np.ndarray, paths: PathSet, stripes: tuple[np.ndarray, np.ndarray],
    policy: str,
) -> Plan:
    """The plan that splits every pair's bytes evenly over its stripe paths.

    ``stripes = (ptr, pid)``: a CSR over all ``N * N`` flat pairs, path ids
    ascending within a pair; earlier paths get the extra bytes
    (:func:`split_evenly`'s rule). ``policy`` names the plan and, since a
    policy's stripes are fixed per path set, keys the per-pair path map of
    :func:`single_paths` kept with ``paths``.
    """
    return striped_plan(fabric, demand, paths, stripes, single_paths(paths, stripes, policy),
                        policy)


def striped_plan(
    fabric: Fabric, demand: np.ndarray, paths: PathSet, stripes: tuple[np.ndarray, np.ndarray],
    single: np.ndarray | None, policy: str,
) -> Plan:
    """:func:`stripe_plan` given the stripes' :func:`single_paths` map: for a caller
    that keeps both (the default policy, which builds the baseline it picks)."""
    flat = np.ascontiguousarray(demand, dtype=np.int64).reshape(-1)
    fp, fb = stripe_flows(flat, stripes, single)  # read-only
    if 2 * fp.size < stripes[1].size:  # a sparse demand: do not keep the spare room
        fp, fb = fp.copy(), fb.copy()
        fp.setflags(write=False)
        fb.setflags(write=False)
    return Plan(fabric, paths, demand, fp, fb, policy)
