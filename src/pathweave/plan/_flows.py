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
        uniq, inv = np.unique(fp, return_inverse=True)
        sums = np.bincount(inv, weights=fb, minlength=uniq.size)
        fb = np.rint(sums).astype(np.int64)
        keep = fb != 0
        fp, fb = uniq[keep], fb[keep]
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
def _stripe_flows(flat, ptr, pid):  # pragma: no cover - numba
    # Every pair's bytes split evenly over its stripe paths (split_evenly's
    # shares), zero shares dropped: one pass, no per-pair numpy temporaries.
    n = 0
    for q in range(flat.shape[0]):
        if flat[q] > 0:
            n += min(ptr[q + 1] - ptr[q], flat[q])
    fp = np.empty(n, dtype=np.int64)
    fb = np.empty(n, dtype=np.int64)
    i = 0
    for q in range(flat.shape[0]):
        d = flat[q]
        if d <= 0:
            continue
        k = ptr[q + 1] - ptr[q]
        if k == 1:  # most pairs: no integer division
            fp[i] = pid[ptr[q]]
            fb[i] = d
            i += 1
            continue
        base = d // k
        rem = d % k
        for j in range(k):
            b = base + (1 if j < rem else 0)
            if b > 0:
                fp[i] = pid[ptr[q] + j]
                fb[i] = b
                i += 1
    return fp, fb


def stripe_plan(
    fabric: Fabric, demand: np.ndarray, paths: PathSet, stripes: tuple[np.ndarray, np.ndarray],
    policy: str,
) -> Plan:
    """The plan that splits every pair's bytes evenly over its stripe paths.

    ``stripes = (ptr, pid)``: a CSR over all ``N * N`` flat pairs, path ids
    ascending within a pair; earlier paths get the extra bytes
    (:func:`split_evenly`'s rule).
    """
    ptr, pid = stripes
    flat = np.ascontiguousarray(demand, dtype=np.int64).reshape(-1)
    fp, fb = _stripe_flows(flat, ptr, pid)
    fp.setflags(write=False)
    fb.setflags(write=False)
    return Plan(fabric, paths, demand, fp, fb, policy)
