"""Index math of MoE dispatch and combine: counts, orders, offsets, checks.

Public: the layer (:class:`pathweave.moe.MoEAllToAll`) lays its rows out with
these functions, and a baseline that must move the same rows in the same order
(``bench moe``'s exact torch all-to-all) calls them too.

One process, no communication. Functions of the routing table ``topk_idx``
(``int[m, k]``, -1 = no expert) are torch ops on the table's device (sorts
and scatters, nothing read back: on a GPU the only host transfer of a call
is the counts the metadata row carries); functions of the gathered counts
(placement, capacity offsets) are numpy on the host. Every rank of a group
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import ClassVar

import numpy as np
import torch

__all__ = [
    "LAYOUTS",
    "SendPlan",
    "check_topk",
    "default_placement",
    "expert_major_positions",
    "expert_order",
    "fingerprint",
    "flat_pairs",
    "local_experts",
    "pair_grid",
    "return_slots",
    "routing_digest",
    "send_plan",
    "topk_problem",
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


def check_topk(
    topk_idx: torch.Tensor, num_experts: int, pairs: tuple[torch.Tensor, ...] | None = None,
) -> torch.Tensor:
    """The first problem of a routing table, as ``int64[2]`` on its device.

    ``(key, value)``, decoded on the host by :func:`topk_problem`: ``key`` is
    the position (row-major) of the first expert id out of ``[-1,
    num_experts)``, else ``m * k`` plus the position of the first slot that
    repeats an earlier slot of its row, else ``2 * m * k`` (no problem);
    ``value`` is the id found there. Range errors come first, then
    duplicates, each in row-major order, so every process reports the same
    one. Torch ops on the table's device; nothing is read back here (the
    caller ships the two numbers with the counts), and the least of one key
    per entry takes a handful of operations (each a kernel launch on a GPU).
    ``pairs``: :func:`flat_pairs` of the table, if the caller has them.

    Examples
    --------
    >>> check_topk(torch.tensor([[0, 1], [2, -1]]), 3).tolist()
    [8, 0]
    >>> check_topk(torch.tensor([[0, 1], [2, 3]]), 3).tolist()
    [3, 3]
    >>> check_topk(torch.tensor([[0, 1], [2, 2]]), 3).tolist()
    [7, 2]
    """
    idx = topk_idx.to(torch.int64)
    m, k = idx.shape
    n = m * k
    if not n:
        return torch.tensor([0, 0], device=idx.device)
    flat = idx.reshape(-1)
    _, _, _, valid, pos = flat_pairs(idx, num_experts) if pairs is None else pairs
    ok = valid | (flat == -1)
    # A slot repeats an earlier slot of its row: every pair of slots (k is small), the
    # strict lower triangle of each row's [k, k] comparison.
    dup = (idx.unsqueeze(2) == idx.unsqueeze(1)).tril_(-1).any(2).reshape(-1) & valid
    first = torch.where(ok, torch.where(dup, pos + n, 2 * n), pos).min()
    # The id there, gathered on the device (indexing by a 0-d tensor would read it back).
    return torch.cat([first.view(1), flat.index_select(0, first.remainder(n).view(1))])


def topk_problem(words: Sequence[int], m: int, k: int) -> tuple[int, int, int, int]:
    """``(code, token, slot, value)`` of :func:`check_topk`'s words for an ``[m, k]`` table.

    Code 1: an expert id out of range; code 2: token ``token`` routed to
    expert ``value`` twice (``slot`` is the second slot); code 0: no problem
    (all zeros).

    Examples
    --------
    >>> topk_problem([8, 0], 2, 2), topk_problem([3, 3], 2, 2), topk_problem([7, 2], 2, 2)
    ((0, 0, 0, 0), (1, 1, 1, 3), (2, 1, 1, 2))
    """
    n = m * k
    key, value = int(words[0]), int(words[1])
    if not n or key >= 2 * n:
        return 0, 0, 0, 0
    at = key % n
    return (1 if key < n else 2), at // k, at % k, value


def routing_digest(topk_idx: torch.Tensor) -> torch.Tensor:
    """A digest of a routing table on its device (ranks of a DP group compare theirs).

    Position-dependent odd multipliers, summed with int64 wrap-around; equal
    tables give equal digests on every device.

    Examples
    --------
    >>> a = torch.tensor([[0, 1], [2, -1]])
    >>> bool(routing_digest(a) == routing_digest(a.clone()))
    True
    >>> bool(routing_digest(a) == routing_digest(a.flip(1)))
    False
    """
    idx = topk_idx.to(torch.int64).reshape(-1)
    n = idx.numel()
    w = torch.arange(n, dtype=torch.int64, device=idx.device) * _GOLDEN | 1
    return ((idx + 2) * w).sum() ^ ((n * _MIX) & _LOW63)


_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)  # as a signed int64
_MIX = 0x5851F42D4C957F2D
_LOW63 = (1 << 63) - 1


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
    """What one rank sends in dispatch and receives back in combine (tensors on its device).

    Built by :func:`send_plan` without reading anything back: the arrays hold
    every (token, slot) of the table, the rows and pairs in use first, in the
    documented orders. :meth:`trim` cuts them to the counts once they are on
    the host (they travel in the metadata row anyway). ``row_ptr``,
    ``row_local``, ``ret_token``, ``ret_slot`` and ``ret_ptr`` are built on
    first access (the layer reads none of them in expert-major layout and
    only ``row_local`` in compact); :data:`FIELDS` names every attribute.

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
    rows_per_rank
        ``int64[num_ranks]``: rows sent to each rank.
    slot_row
        ``int64[m, k]``: the send row that carries slot ``j`` of token
        ``i`` (in ``compact`` layout only the token's first slot on each rank
        names the row), -1 where none: the backward of dispatch sums the
        gradient rows that come back through it.
    ret_row
        ``int64[m, k]``: the row of combine's receive buffer that answers
        each slot, -1 where none (:func:`return_slots`); ``None`` with DP
        groups (each member receives the whole group's pairs: call
        :func:`return_slots`).
    """

    row_token: torch.Tensor
    pairs_per_expert: torch.Tensor
    rows_per_rank: torch.Tensor
    slot_row: torch.Tensor
    ret_row: torch.Tensor | None
    #: How to build the other attributes, untrimmed, on first use: the layer needs
    #: none of them on its way (expert-major) or only ``row_local`` (compact).
    _build: dict[str, Callable[[], torch.Tensor]] = field(repr=False, compare=False)
    _rows: int | None = None
    _pairs: int | None = None

    #: Every attribute above, the lazily built ones included.
    FIELDS: ClassVar[tuple[str, ...]] = (
        "row_token", "row_ptr", "row_local", "ret_token", "ret_slot", "ret_ptr",
        "pairs_per_expert", "rows_per_rank", "slot_row", "ret_row")

    @cached_property
    def row_ptr(self) -> torch.Tensor:
        return _ptr(self.rows_per_rank)

    @cached_property
    def row_local(self) -> torch.Tensor:
        return self._build["row_local"]()[: self._rows]

    @cached_property
    def ret_token(self) -> torch.Tensor:
        return self._build["ret_token"]()[: self._pairs]

    @cached_property
    def ret_slot(self) -> torch.Tensor:
        return self._build["ret_slot"]()[: self._pairs]

    @cached_property
    def ret_ptr(self) -> torch.Tensor:
        return self._build["ret_ptr"]()

    def trim(self, num_rows: int | None = None, num_pairs: int | None = None) -> SendPlan:
        """The plan cut to ``num_rows`` send rows and ``num_pairs`` pairs.

        ``None`` reads the count back from the device (tests and one-off
        use; the layer passes the counts it already holds on the host).
        """
        rows = int(self.rows_per_rank.sum()) if num_rows is None else num_rows
        pairs = int(self.pairs_per_expert.sum()) if num_pairs is None else num_pairs
        return replace(self, row_token=self.row_token[:rows], _rows=rows, _pairs=pairs)


def expert_order(placement: np.ndarray) -> np.ndarray:
    """Position of each expert when experts are sorted by rank, then by id.

    >>> expert_order(np.array([1, 0, 1, 0])).tolist()
    [2, 0, 3, 1]
    """
    order = np.argsort(np.asarray(placement, dtype=np.int64), kind="stable")
    pos = np.empty_like(order)
    pos[order] = np.arange(order.size)
    return pos


def _ptr(counts: torch.Tensor) -> torch.Tensor:
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])


def _rank_of(order: torch.Tensor, arange: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse permutation: where each element of ``order`` sits (``arange``: ``0, 1, ..``
    of ``order``'s length, if the caller keeps one)."""
    if arange is None:
        arange = torch.arange(order.numel(), device=order.device)
    return torch.empty_like(order).scatter_(0, order, arange)


def flat_pairs(
    idx: torch.Tensor, num_experts: int, grid: tuple[torch.Tensor, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token, slot, expert (clamped into range), validity and position of every entry,
    row-major.

    :func:`send_plan`, :func:`return_slots` and :func:`check_topk` take them
    as ``pairs`` (a caller that calls several computes them once). ``grid``:
    the token, slot and position of every entry of a table of at least ``m``
    rows (:func:`pair_grid`; a caller that keeps it saves its operations on
    every call).

    >>> [t.tolist() for t in flat_pairs(torch.tensor([[1, -1], [0, 2]]), 2)]
    [[0, 0, 1, 1], [0, 1, 0, 1], [1, 0, 0, 1], [True, False, True, False], [0, 1, 2, 3]]
    """
    m, k = idx.shape
    e = idx.reshape(-1).to(torch.int64)
    if grid is None:
        grid = pair_grid(m, k, idx.device)
    tok, slot, pos = (g[: m * k] for g in grid)
    clamped = e.clamp(0, max(num_experts - 1, 0))
    return tok, slot, clamped, clamped == e, pos  # in range exactly where clamping kept it


def pair_grid(m: int, k: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
    """Token, slot and position of every entry of an ``[m, k]`` table, row-major.

    >>> [t.tolist() for t in pair_grid(2, 2)]
    [[0, 0, 1, 1], [0, 1, 0, 1], [0, 1, 2, 3]]
    """
    return (torch.arange(m, device=device).repeat_interleave(k),
            torch.arange(k, device=device).repeat(m), torch.arange(m * k, device=device))


def send_plan(
    topk_idx: torch.Tensor,
    placement: torch.Tensor,
    local_index: torch.Tensor,
    order: torch.Tensor,
    num_ranks: int,
    *,
    layout: str = "expert-major",
    dp_size: int = 1,
    member: int = 0,
    pairs: tuple[torch.Tensor, ...] | None = None,
) -> SendPlan:
    """The rows one rank dispatches and the pairs it gets back, in the documented orders.

    Torch ops on ``topk_idx``'s device (sorts and scatters; nothing is read
    back). The arrays are untrimmed: see :class:`SendPlan`.

    Parameters
    ----------
    topk_idx
        ``int[m, k]`` routing table (entries outside ``[0, E)`` are skipped;
        :func:`check_topk` reports them).
    placement, local_index, order
        Rank, local index and :func:`expert_order` of each expert, as
        ``int64`` tensors on the table's device.
    num_ranks
        Group size.
    layout
        ``"expert-major"`` or ``"compact"``.
    dp_size, member
        DP group size and this rank's position in its DP group: this rank
        sends the tokens ``i`` with ``i % dp_size == member``.
    pairs
        :func:`flat_pairs` of the table, if the caller has them.

    Examples
    --------
    Two ranks, experts 0, 1 on rank 0 and 2, 3 on rank 1; token 0 goes to
    experts 3 and 0, token 1 to 1 and 2:

    >>> t = lambda *a: torch.tensor(a)
    >>> place, local, order = t(0, 0, 1, 1), t(0, 1, 0, 1), t(0, 1, 2, 3)
    >>> p = send_plan(torch.tensor([[3, 0], [1, 2]]), place, local, order, 2).trim()
    >>> p.row_token.tolist(), p.row_ptr.tolist(), p.row_local.tolist()
    ([0, 1, 1, 0], [0, 2, 4], [0, 1, 0, 1])
    >>> p.ret_slot.tolist(), p.slot_row.tolist()
    ([1, 0, 1, 0], [[3, 0], [1, 2]])
    >>> c = send_plan(torch.tensor([[3, 2], [1, -1]]), place, local, order, 2,
    ...               layout="compact").trim()
    >>> c.row_token.tolist(), c.row_ptr.tolist(), c.row_local.tolist()
    ([1, 0], [0, 1, 2], [[1, -1], [1, 0]])
    >>> c.ret_token.tolist(), c.ret_slot.tolist(), c.ret_ptr.tolist()
    ([1, 0, 0], [0, 0, 1], [0, 1, 3])
    >>> c.slot_row.tolist()
    [[1, -1], [0, -1]]
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    m, k = topk_idx.shape
    E = int(placement.numel())
    n = num_ranks
    dev = topk_idx.device
    tok, slot, e, keep, pos = flat_pairs(topk_idx, E) if pairs is None else pairs
    if dp_size > 1:
        keep = keep & (tok % dp_size == member)  # not in place: pairs may be shared
    ppe = torch.zeros(E, dtype=torch.int64, device=dev).scatter_add_(0, e, keep.to(torch.int64))

    def pairs_per_rank() -> torch.Tensor:
        return torch.zeros(n, dtype=torch.int64, device=dev).scatter_add_(0, placement, ppe)

    mm = max(m, 1)
    if layout == "expert-major":
        # One row per pair, by (expert order, token): order[e] * mm + tok; unsent pairs last.
        key = torch.where(keep, torch.add(tok, order[e], alpha=mm), E * mm)
        srt = torch.sort(key, stable=True).indices
        rpr = pairs_per_rank()
        slot_row = torch.where(keep, _rank_of(srt, pos), -1).view(m, k)
        row_tok = tok[srt]
        # Combine returns each rank's pairs in the order they were sent: without DP
        # groups the receive row of a slot is its send row.
        return SendPlan(row_tok, ppe, rpr, slot_row, slot_row if dp_size == 1 else None, {
            "row_local": lambda: local_index[e[srt]], "ret_token": lambda: row_tok,
            "ret_slot": lambda: slot[srt], "ret_ptr": lambda: _ptr(rpr)})
    q = placement[e]
    # compact: one row per (rank, token) that has a kept pair there, sorted by rank, token.
    cell = torch.where(keep, torch.add(tok, q, alpha=mm), n * mm)  # q * mm + tok
    used = torch.zeros(n * mm + 1, dtype=torch.int64, device=dev).scatter_(0, cell, 1)[:-1]
    cells = torch.sort(1 - used, stable=True).indices  # used cells first, in (rank, token)
    rpr = used.view(n, mm).sum(1)
    row_tok = cells % mm
    # The send row of every kept pair (a dump row past the cells for the others).
    prow = torch.where(keep, _rank_of(cells)[cell.clamp(max=n * mm - 1)], n * mm)
    # Local expert of every slot of the row's token on the row's rank, -1 elsewhere.
    row_local = torch.full((n * mm + 1, k), -1, dtype=torch.int64, device=dev)
    row_local[prow, slot] = local_index[e]
    ret = torch.sort(torch.where(keep, torch.add(slot, cell, alpha=k), n * mm * k),
                     stable=True).indices  # by cell * k + slot
    # The row of a slot is named once per (token, rank): by the token's first slot there.
    first = torch.full((n * mm + 1,), k, dtype=torch.int64, device=dev)
    first.scatter_reduce_(0, prow, slot, "amin")
    slot_row = torch.where(keep & (first[prow] == slot), prow, -1).view(m, k)
    # Without DP groups combine's receive buffer holds the pairs in return order.
    ret_row = torch.where(keep, _rank_of(ret, pos), -1).view(m, k) if dp_size == 1 else None
    return SendPlan(row_tok, ppe, rpr, slot_row, ret_row, {
        "row_local": lambda: row_local[: n * mm], "ret_token": lambda: tok[ret],
        "ret_slot": lambda: slot[ret], "ret_ptr": lambda: _ptr(pairs_per_rank())})


def return_slots(
    topk_idx: torch.Tensor,
    placement: torch.Tensor,
    order: torch.Tensor,
    *,
    layout: str = "expert-major",
    dp_size: int = 1,
    pairs: tuple[torch.Tensor, ...] | None = None,
) -> torch.Tensor:
    """Row of combine's receive buffer that answers each slot: ``int64[m, k]``, -1 for none.

    Combine brings back, from each expert rank in rank order, the pairs of
    every member of this rank's DP group (members in rank order), each
    member's pairs in its return order (:func:`send_plan`). One sort of the
    whole table on its device. ``pairs``: :func:`flat_pairs` of the table, if
    the caller has them.

    Examples
    --------
    >>> t = lambda *a: torch.tensor(a)
    >>> return_slots(torch.tensor([[3, 0], [1, 2]]), t(0, 0, 1, 1), t(0, 1, 2, 3)).tolist()
    [[3, 0], [1, 2]]
    >>> return_slots(torch.tensor([[3, 0], [1, 2]]), t(0, 0, 1, 1), t(0, 1, 2, 3),
    ...              dp_size=2).tolist()
    [[2, 0], [1, 3]]
    """
    m, k = topk_idx.shape
    E = int(placement.numel())
    tok, slot, e, valid, _ = flat_pairs(topk_idx, E) if pairs is None else pairs
    mm = max(m, 1)
    block = (placement[e] * dp_size + tok % dp_size)
    if layout == "compact":
        key = block * (mm * k) + tok * k + slot
    else:
        key = block * (E * mm) + order[e] * mm + tok
    key = torch.where(valid, key, torch.iinfo(torch.int64).max)
    srt = torch.sort(key, stable=True).indices
    return torch.where(valid, _rank_of(srt), -1).view(m, k)


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
