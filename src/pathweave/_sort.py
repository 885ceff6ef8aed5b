"""The numba kernels' sorting (a stable argsort, its radix form for int64 keys, unique) and
selection, and their slow twins.

Numba compiles its own ``np.argsort``, ``np.sort`` and ``np.unique`` for
each sort kind and key type, 1.4-2.4 s of CPU each on a cold cache; the
planners' and the simulator's kernels used five of them (mergesort of
float64, int64 and uint64 keys, quicksort of int64 and float64), which was
most of the sorting kernels' compile time, paid by every fresh checkout, CI
run and first ``pathweave`` command. This one merge sort compiles in a
fraction of that per key type and runs as fast at the sizes the kernels
sort. :func:`select` finds one order statistic without sorting (numba's own
``np.partition`` compiled for about 7 s of CPU).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["RADIX_MIN_KEYS", "argsort_int64", "argsort_stable", "argsort_stable_reference",
           "select", "select_reference", "unique"]

#: Runs this long are sorted by insertion before the merges.
_RUN = 16
#: :func:`argsort_int64` sorts this many keys and more by radix: below, its
#: 64 k-bucket counts cost more than the merges (even at 2 k keys: 115 vs 122 us;
#: 1 k: 100 vs 41 us).
RADIX_MIN_KEYS = 1 << 11


@njit(cache=True)
def argsort_stable(keys):  # pragma: no cover - numba
    """Indices that sort ``keys`` (1-D, no NaN) ascending; equal keys keep their order.

    ``np.argsort(keys, kind="stable")`` (:func:`argsort_stable_reference`),
    called from a numba kernel. NOTE: plain loops, no slices (numba's slice
    assignment alone compiles for seconds); the keys move with the indices,
    so the merges read both in order; a pair of runs already in order is
    copied, and input already sorted is found in one pass.
    """
    n = keys.shape[0]
    idx = np.arange(n)
    for i in range(1, n):
        if keys[i] < keys[i - 1]:
            break
    else:
        return idx
    key = keys.copy()
    for lo in range(0, n, _RUN):
        for i in range(lo + 1, min(lo + _RUN, n)):
            k = key[i]
            j = i - 1
            while j >= lo and key[j] > k:
                key[j + 1] = key[j]
                idx[j + 1] = idx[j]
                j -= 1
            key[j + 1] = k
            idx[j + 1] = i
    if n <= _RUN:
        return idx
    key2 = np.empty_like(key)
    idx2 = np.empty_like(idx)
    width = _RUN
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j = lo, mid
            for k in range(lo, hi):
                # the left run wins ties (stable); j == hi: only it is left
                if j >= hi or (i < mid and not key[j] < key[i]):
                    key2[k] = key[i]
                    idx2[k] = idx[i]
                    i += 1
                else:
                    key2[k] = key[j]
                    idx2[k] = idx[j]
                    j += 1
        key, key2 = key2, key
        idx, idx2 = idx2, idx
        width *= 2
    return idx


@njit(cache=True)
def argsort_int64(keys):  # pragma: no cover - numba
    """:func:`argsort_stable` of ``int64`` keys, by radix for large inputs.

    Below :data:`RADIX_MIN_KEYS` keys it is :func:`argsort_stable`; above, a
    least-significant-digit radix sort on 16-bit digits of the keys' sign-flipped
    bits (stable by construction), skipping a digit all keys share (sizes of a
    few GB share the top two). NOTE: 2.6x faster than numpy's stable argsort
    (timsort) on the 930 k pair sizes of a 1024-GPU MoE step (47 vs 125 ms), 3.6x
    faster than the merge sort; the sort was a third of a 1024-GPU ``hscore`` plan.
    """
    n = keys.shape[0]
    if n < RADIX_MIN_KEYS:
        return argsort_stable(keys)
    flip = np.uint64(1) << np.uint64(63)
    key = np.empty(n, dtype=np.uint64)
    for i in range(n):
        key[i] = np.uint64(keys[i]) ^ flip
    idx = np.arange(n)
    key2 = np.empty_like(key)
    idx2 = np.empty_like(idx)
    count = np.empty(1 << 16, dtype=np.int64)
    mask = np.uint64(0xFFFF)
    for shift in range(0, 64, 16):
        sh = np.uint64(shift)
        for b in range(count.shape[0]):
            count[b] = 0
        for i in range(n):
            count[(key[i] >> sh) & mask] += 1
        if count[(key[0] >> sh) & mask] == n:  # one digit for all: nothing moves
            continue
        total = 0
        for b in range(count.shape[0]):
            c = count[b]
            count[b] = total
            total += c
        for i in range(n):
            b = (key[i] >> sh) & mask
            j = count[b]
            count[b] = j + 1
            key2[j] = key[i]
            idx2[j] = idx[i]
        key, key2 = key2, key
        idx, idx2 = idx2, idx
    return idx


@njit(cache=True)
def unique(values):  # pragma: no cover - numba
    """``np.unique(values)`` (1-D, no NaN) from a numba kernel: each value once, ascending."""
    out = values[argsort_stable(values)]
    n = 0
    for i in range(out.shape[0]):
        if n == 0 or out[i] != out[n - 1]:
            out[n] = out[i]
            n += 1
    return out[:n]


@njit(cache=True)
def select(keys, k):  # pragma: no cover - numba
    """``np.sort(keys)[k]`` (1-D, no NaN, ``0 <= k < keys.size``) in expected linear
    time: Hoare's quickselect with a median-of-three pivot, on a copy.

    :func:`select_reference` is its slow twin. NOTE: Hoare's partition swaps
    keys equal to the pivot from both ends, so many equal keys split evenly
    instead of degrading to quadratic time.
    """
    a = keys.copy()
    lo = 0
    hi = a.shape[0] - 1
    while lo < hi:
        x, y, z = a[lo], a[(lo + hi) >> 1], a[hi]
        pivot = max(min(x, y), min(max(x, y), z))
        i, j = lo, hi
        while i <= j:
            while a[i] < pivot:
                i += 1
            while a[j] > pivot:
                j -= 1
            if i <= j:
                a[i], a[j] = a[j], a[i]
                i += 1
                j -= 1
        # [lo, j] <= pivot, [i, hi] >= pivot, and anything between equals it
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            return a[k]
    return a[k]


def select_reference(keys: np.ndarray, k: int) -> object:
    """Slow twin of :func:`select`: the ``k``-th smallest key by a full sort."""
    return np.sort(np.asarray(keys))[k]


def argsort_stable_reference(keys: np.ndarray) -> np.ndarray:
    """Slow twin of :func:`argsort_stable`: numpy's stable argsort."""
    return np.argsort(keys, kind="stable")
