"""Index math of MoE dispatch and combine: counts, orders, offsets, checks.

Pure numpy, one process, no torch: every function takes the routing table
``topk_idx`` (``int64[m, k]``, -1 = no expert) and the expert placement, and
returns the integer arrays the data movement needs. Every rank of a group
runs the same functions on the same gathered metadata, so all ranks agree on
every size and offset without talking about them.

Orders (the contract between sender, receiver and combine):

* a rank of DP group ``g`` (ranks ``g*dp .. g*dp+dp-1``) sends the tokens
  ``i`` with ``i % dp == member`` (its position in the group); each
  (token, expert) pair thus leaves the group exactly once;
* ``expert-major``: one row per (token, expert) pair, sorted by destination
  rank, then local expert, then token; combine returns the pairs in the same
  order;
* ``compact``: one row per (token, destination rank), sorted by destination
  rank, then token; combine returns one row per pair, sorted by destination
  rank, then token, then top-k slot;
* an expert rank lays the rows of each local expert out by source rank, then
  by the source's order; combine sends a DP group's rows back to every rank
  of that group, members in rank order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "LAYOUTS",
    "SendPlan",
    "check_topk",
    "default_placement",
    "expert_major_positions",
    "fingerprint",
    "local_experts",
    "pair_counts",
    "send_plan",
]

LAYOUTS = ("expert-major", "compact")


def default_placement(num_experts: int, num_ranks: int) -> np.ndarray:
    """Rank of each expert when ``num_experts / num_ranks`` sit on each rank in order.

    Examples
    --------
    >>> default_placement(8, 4).tolist()
    [0, 0, 1, 1, 2, 2, 3, 3]
    """
    if num_ranks < 1 or num_experts % num_ranks:
        raise ValueError(
            f"num_experts ({num_experts}) must be a multiple of the group size ({num_ranks}); "
            "pass placement= for another layout"
        )
    return np.arange(num_experts, dtype=np.int64) // (num_experts // num_ranks)


def local_experts(placement: np.ndarray, num_ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """Local index of each expert on its rank, and the number of experts per rank.

    Local experts of a rank are numbered in increasing global id.

    Examples
    --------
    >>> idx, per_rank = local_experts(np.array([1, 0, 1, 1]), 2)
    >>> idx.tolist(), per_rank.tolist()
    ([0, 0, 1, 2], [1, 3])
    """
    placement = np.asarray(placement, dtype=np.int64)
    per_rank = np.bincount(placement, minlength=num_ranks)
    order = np.argsort(placement, kind="stable")
    local = np.empty_like(placement)
    starts = np.concatenate(([0], np.cumsum(per_rank)[:-1]))
    local[order] = np.arange(placement.size) - np.repeat(starts, per_rank)
    return local, per_rank


def check_topk(topk_idx: np.ndarray, num_experts: int) -> tuple[int, int, int, int] | None:
    """The first problem of a routing table, or ``None``.

    Returns ``(code, token, slot, value)``: code 1, an expert id out of
    ``[-1, num_experts)``; code 2, token ``token`` routed to expert ``value``
    twice (``slot`` is the second slot). Row-major order decides which
    problem is "first", so every process reports the same one.

    Examples
    --------
    >>> check_topk(np.array([[0, 1], [2, -1]]), 3) is None
    True
    >>> check_topk(np.array([[0, 1], [2, 3]]), 3)
    (1, 1, 1, 3)
    >>> check_topk(np.array([[0, 1], [2, 2]]), 3)
    (2, 1, 1, 2)
    >>> check_topk(np.array([[-1, -1]]), 3) is None
    True
    """
    idx = np.asarray(topk_idx, dtype=np.int64)
    bad = (idx < -1) | (idx >= num_experts)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        return 1, int(i), int(j), int(idx[i, j])
    m, k = idx.shape
    if k < 2 or m == 0:
        return None
    # Sort each row; equal neighbours that are not -1 are duplicates.
    srt = np.sort(idx, axis=1)
    dup = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)
    rows = np.flatnonzero(dup.any(axis=1))
    if rows.size == 0:
        return None
    i = int(rows[0])
    seen: dict[int, int] = {}
    for j, e in enumerate(idx[i].tolist()):
        if e >= 0 and e in seen:
            return 2, i, j, e
        seen[e] = j
    raise AssertionError("unreachable: a duplicate was found by sorting")


def fingerprint(topk_idx: np.ndarray) -> int:
    """A 62-bit digest of a routing table (ranks of a DP group compare theirs).

    Examples
    --------
    >>> a = np.array([[0, 1], [2, -1]])
    >>> fingerprint(a) == fingerprint(a.copy()), fingerprint(a) == fingerprint(a[:, ::-1])
    (True, False)
    """
    idx = np.asarray(topk_idx, dtype=np.int64).ravel()
    n = idx.size
    # Position-dependent odd multipliers; uint64 arithmetic wraps by design.
    w = (np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) | np.uint64(1)
    h = int(np.bitwise_xor.reduce((idx + 2).astype(np.uint64) * w)) if n else 0
    return (h ^ (n * 0x5851F42D4C957F2D)) & ((1 << 62) - 1)


@dataclass(frozen=True)
class SendPlan:
    """What one rank sends in dispatch and receives back in combine.

    Attributes
    ----------
    row_token
        ``int64[rows]``: source token of each dispatched row, in send order.
    row_ptr
        ``int64[num_ranks + 1]``: rows for rank ``q`` are
        ``row_ptr[q]:row_ptr[q+1]``.
    row_local
        ``expert-major``: ``int64[rows]``, the local expert of each row on
        its destination. ``compact``: ``int64[rows, k]``, the local expert
        of each top-k slot on the destination, -1 for slots elsewhere.
    ret_token, ret_slot
        ``int64[pairs]``: token and top-k slot of each pair that combine
        returns, in return order.
    ret_ptr
        ``int64[num_ranks + 1]``: pairs returned by rank ``q``.
    pairs_per_expert
        ``int64[num_experts]``: pairs sent to each expert.
    """

    row_token: np.ndarray
    row_ptr: np.ndarray
    row_local: np.ndarray
    ret_token: np.ndarray
    ret_slot: np.ndarray
    ret_ptr: np.ndarray
    pairs_per_expert: np.ndarray


def _ptr(keys: np.ndarray, n: int) -> np.ndarray:
    return np.searchsorted(keys, np.arange(n + 1)).astype(np.int64)


def send_plan(
    topk_idx: np.ndarray,
    placement: np.ndarray,
    local_index: np.ndarray,
    num_ranks: int,
    *,
    layout: str = "expert-major",
    dp_size: int = 1,
    member: int = 0,
) -> SendPlan:
    """The rows one rank dispatches and the pairs it gets back, in the documented orders.

    Parameters
    ----------
    topk_idx
        ``int64[m, k]``, checked by :func:`check_topk`.
    placement, local_index
        Rank and local index of each expert.
    num_ranks
        Group size.
    layout
        ``"expert-major"`` or ``"compact"``.
    dp_size, member
        DP group size and this rank's position in its DP group: this rank
        sends the tokens ``i`` with ``i % dp_size == member``.

    Examples
    --------
    Two ranks, experts 0, 1 on rank 0 and 2, 3 on rank 1; token 0 goes to
    experts 3 and 0, token 1 to 1 and 2:

    >>> idx = np.array([[3, 0], [1, 2]])
    >>> place, local = np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])
    >>> p = send_plan(idx, place, local, 2)
    >>> p.row_token.tolist(), p.row_ptr.tolist(), p.row_local.tolist()
    ([0, 1, 1, 0], [0, 2, 4], [0, 1, 0, 1])
    >>> p.ret_slot.tolist()
    [1, 0, 1, 0]
    >>> c = send_plan(np.array([[3, 2], [1, -1]]), place, local, 2, layout="compact")
    >>> c.row_token.tolist(), c.row_ptr.tolist(), c.row_local.tolist()
    ([1, 0], [0, 1, 2], [[1, -1], [1, 0]])
    >>> c.ret_token.tolist(), c.ret_slot.tolist(), c.ret_ptr.tolist()
    ([1, 0, 0], [0, 0, 1], [0, 1, 3])
    """
    idx = np.asarray(topk_idx, dtype=np.int64)
    m, k = idx.shape
    placement = np.asarray(placement, dtype=np.int64)
    tok = np.repeat(np.arange(m, dtype=np.int64), k)
    slot = np.tile(np.arange(k, dtype=np.int64), m)
    e = idx.ravel()
    keep = e >= 0
    if dp_size > 1:
        keep &= tok % dp_size == member
    tok, slot, e = tok[keep], slot[keep], e[keep]
    q = placement[e]
    loc = np.asarray(local_index, dtype=np.int64)[e]
    ppe = np.bincount(e, minlength=placement.size).astype(np.int64)
    if layout == "expert-major":
        order = np.lexsort((tok, loc, q))
        qs = q[order]
        ptr = _ptr(qs, num_ranks)
        return SendPlan(
            tok[order], ptr, loc[order], tok[order], slot[order], ptr.copy(), ppe
        )
    if layout != "compact":
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    # Pairs are already in (token, slot) order; one row per (rank, token).
    key = q * max(m, 1) + tok
    rows, inverse = np.unique(key, return_inverse=True)
    row_q = rows // max(m, 1)
    row_local = np.full((rows.size, k), -1, dtype=np.int64)
    row_local[inverse, slot] = loc
    order = np.lexsort((slot, tok, q))
    ret_q = q[order]
    return SendPlan(
        rows % max(m, 1),
        _ptr(row_q, num_ranks),
        row_local,
        tok[order],
        slot[order],
        _ptr(ret_q, num_ranks),
        ppe,
    )


def pair_counts(plan: SendPlan, num_ranks: int) -> np.ndarray:
    """Pairs returned by each rank (``ret_ptr`` as counts).

    >>> p = send_plan(np.array([[1, 0]]), np.array([0, 1]), np.array([0, 0]), 2)
    >>> pair_counts(p, 2).tolist()
    [1, 1]
    """
    return np.diff(plan.ret_ptr)[:num_ranks]


def expert_major_positions(block: np.ndarray, capacity: int) -> np.ndarray:
    """Where each received row goes in ``expert_x`` viewed as ``[L * capacity]`` rows.

    ``block[s, l]``: rows from source ``s`` for local expert ``l``. Rows
    arrive grouped by source, then local expert (the sender's order); in
    ``expert_x`` each expert's rows are grouped by source, so the rows of
    expert ``l`` from source ``s`` start at ``l * capacity + sum(block[:s, l])``.

    Examples
    --------
    >>> expert_major_positions(np.array([[1, 2], [1, 0]]), 4).tolist()
    [0, 4, 5, 1]
    """
    block = np.asarray(block, dtype=np.int64)
    num_local = block.shape[1]
    if block.size == 0:
        return np.zeros(0, dtype=np.int64)
    dst_start = np.cumsum(block, axis=0) - block + np.arange(num_local)[None, :] * capacity
    flat = block.ravel()
    src_start = np.cumsum(flat) - flat
    total = int(flat.sum())
    return np.repeat(dst_start.ravel() - src_start, flat) + np.arange(total, dtype=np.int64)
