"""The low-latency mode of :class:`~pathweave.moe.MoEAllToAll`: fixed shapes, no host sync.

For decode (a few tokens per rank, latency bound). Every buffer has a shape
fixed by ``max_num_tokens`` (pplx-kernels' contract), the counts travel with
the data on the device, and nothing is read back to the host, so one dispatch
+ combine can be captured in a CUDA graph and replayed.

**expert-major** (one fixed-size ``all_to_all_single`` with equal splits per
direction): the block a rank sends to rank ``q`` has ``max_num_tokens * k``
payload rows and a header of ``Lmax + 1`` ``int64`` words (``Lmax``: most
experts on one rank) in the rows after them. The sender sorts its (token,
expert) pairs by key ``(rank q, DP member of the token, local expert l,
token t)`` and writes the pair of sorted position ``i`` to row ``i`` of
*every* block (one gather of ``x``, no scatter); the header of block ``q``
holds ``G[q, l]``, the sorted position of the first pair of *this* member
for local expert ``l`` of ``q`` (``G[q, Lmax]``: one past its last). So the
rows a rank sends ``q`` are rows ``G[q, 0] .. G[q, Lmax]`` of block ``q``,
grouped by local expert, and a receiver knows from the header alone where
each expert's rows are and how many there are. Rows outside that range are
ignored. The receiver lays the rows of local expert ``l`` from source ``s``
at ``l * capacity + sum_{s' < s} count[s', l] + (r - G_s[l])`` of
``expert_x`` (grouped by source, then token: the normal mode's order).

**compact** (DeepEP's normal-mode layout): block ``q`` holds one row per
token ``t < max_num_tokens`` (row ``t``), its payload followed by the local
expert ids of its ``k`` slots on ``q`` (-1 for slots served elsewhere, and
for every slot of a token that sends ``q`` nothing). ``expert_x`` is
``[W * max_num_tokens, H]``, row ``s * max_num_tokens + t`` token ``t`` of
source ``s``; one stable sort of the received ids groups the (row, local
expert) pairs by expert (``expert_rows``, ``expert_offsets`` on the device).
Fixed-size blocks carry every token; they are ``k`` times smaller than the
expert-major ones.

Combine (both layouts) returns to every source a block of ``mk`` (compact)
or ``blk`` (expert-major) rows, the expert output of each of its pairs in
the row it chose for the pair (``dest``), and the source sums a token's rows
weighted, in one ``embedding_bag``. Pairs with no expert (``-1``) read a row
of zeros.

**DP groups** (``dp_size > 1``): members of a group hold the same tokens and
compute the same sort; member ``d`` marks as its own only the pairs of tokens
``t % dp == d`` (its header range, or in compact layout its ids), so each
pair reaches its expert once. Every member computes the same ``dest``; the
expert's rank merges the members' ranges (from their headers, or from
``t % dp``) into the one block it returns to every member, and a combine
backward sums the members' gradients of a row in member order.

**fp8 scales** (``x_scale [m, S]`` float32) travel in the same rows, after
the payload; ``handle.expert_x_scale`` is shaped like ``expert_x`` with
``S`` columns. The layer keeps one set of buffers per ``S``: every rank must
pass scales of one width on every call, or none (not checked on the device).

Contract (as pplx-kernels' and DeepEP's low-latency kernels): no argument is
checked on the device. ``topk_idx`` must hold ids in ``[-1, E)`` with no
repeat in a row, and no expert may receive more than ``expert_capacity``
rows; a violation is not detected (an index error on the CPU, corrupt rows
on a GPU). ``debug_checks=True`` checks both, at the price of host syncs.
Every rank must take the same autograd path (a backward that one rank skips
leaves its peers waiting). Buffers alternate between two sets (as DeepEP's):
``expert_x`` of a dispatch stays valid until the second dispatch after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["NUM_BUFFER_SETS", "LowLatencyHandle", "LowLatencyState"]

#: Buffer sets used in turn (a dispatch's ``expert_x`` survives the next dispatch).
NUM_BUFFER_SETS = 2


@dataclass(eq=False)
class LowLatencyHandle:
    """What a low-latency dispatch leaves for its combine: device tensors only.

    Attributes
    ----------
    num_tokens
        Tokens ``m`` of this call.
    dest
        ``int64[m, k]``: the row of each (token, slot) in combine's returned
        blocks; slots without an expert point at a row of zeros.
    ret_gather
        The row of (flattened) ``expert_y`` that combine sends back in each
        row of its blocks.
    expert_num_tokens
        ``int64[L]`` on the device: rows (compact: pairs) per local expert.
    expert_x_scale
        Scales that travelled with the rows, shaped like ``expert_x``, or None.
    expert_ids, expert_rows, expert_offsets
        ``compact`` only (device tensors): local expert of each received
        row's slots (-1: none); the (row, local expert) pairs grouped by
        expert, the first ``expert_offsets[L]`` of ``expert_rows`` valid.
    """

    owner: Any
    call_id: int
    num_tokens: int
    buffers: int
    dest: torch.Tensor
    ret_gather: torch.Tensor
    expert_num_tokens: torch.Tensor
    topk_idx: torch.Tensor
    layout: str = "expert-major"
    state: Any = None  # the LowLatencyState (one per device and scale width) it used
    xpos: torch.Tensor | None = None  # expert-major: expert_x row of each received row
    xpos_gather: torch.Tensor | None = None  # xpos clamped into expert_y's rows
    back_pos: torch.Tensor | None = None  # expert_x row of each (member-summed) returned row
    expert_x_scale: torch.Tensor | None = None
    expert_ids: torch.Tensor | None = None
    expert_rows: torch.Tensor | None = None
    expert_offsets: torch.Tensor | None = None
    order: torch.Tensor | None = None  # compact: received (row, slot) of each grouped pair
    grouped: torch.Tensor | None = None  # compact: sorted keys (local expert, L if none)
    combined: bool = False

    @property
    def num_pairs(self) -> int:
        """Pairs received (compact: the rows ``expert_y`` needs); a host read."""
        return int(self.expert_num_tokens.sum())


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class LowLatencyState:
    """Tables and buffers of one layer on one device for one scale width (built once)."""

    def __init__(self, layer: Any, device: torch.device, scale_cols: int = 0):
        E, k, W = layer.num_experts, layer.experts_per_token, layer.num_ranks
        mmax, H = layer.max_num_tokens, layer.hidden_dim
        self.device = device
        self.W, self.k, self.H, self.mmax, self.S = W, k, H, mmax, scale_cols
        self.dp, self.member = layer.dp_size, layer._member
        self.compact = layer.layout == "compact"
        self.payload_dtype = layer.dtype
        self.Lmax = max(int(layer.experts_per_rank.max()), 1)
        self.L, self.cap = layer.num_local_experts, layer.expert_capacity
        self.Hb = H * torch.empty(0, dtype=layer.dtype).element_size()
        extra = 4 * scale_cols + (4 * k if self.compact else 0)
        self.row_bytes = rb = _round_up(self.Hb + extra, 8)
        self.mk_max = mk = mmax * k
        if self.compact:
            self.blk, self.cblk = mmax, mk  # dispatch / combine rows per block
        else:
            self.blk = self.cblk = mk + -(-8 * (self.Lmax + 1) // rb)
        # Rows move as 16- (or 8-) byte elements: bit-exact for every dtype, and the CPU's
        # index_copy_, which walks elements, makes a quarter of the steps of a 4-byte type.
        self.move_dtype = torch.complex128 if rb % 16 == 0 else torch.int64
        self.cols = rb // (16 if rb % 16 == 0 else 8)
        self.place = np.asarray(layer.placement, dtype=np.int64)
        self.local = np.asarray(layer.local_index, dtype=np.int64)
        t = torch.arange(mmax, dtype=torch.int64)
        self.own = (t % self.dp == self.member).view(-1, 1).to(device)
        n = max(mk, W * self.cblk, self.L + 1, W)
        self.arange = torch.arange(n, dtype=torch.int64, device=device)
        self.offsets = torch.arange(0, mk, k, dtype=torch.int64, device=device)
        self.stage = (torch.zeros(mmax, rb, dtype=torch.uint8, device=device)
                      if scale_cols and not self.compact else None)
        (self._compact_tables if self.compact else self._expert_major_tables)(E, t)
        self.sets = [self._buffers() for _ in range(NUM_BUFFER_SETS)]
        self.group: Any = None  # set by the layer
        self.orchestrator: Any = None
        self.digests: np.ndarray | None = None
        self.combine_bufs: dict[tuple[int, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        self.calls = 0

    def _expert_major_tables(self, E: int, t: torch.Tensor) -> None:
        W, dp, Lmax, mmax, blk, dev = self.W, self.dp, self.Lmax, self.mmax, self.blk, self.device
        place, local = torch.tensor(self.place), torch.tensor(self.local)
        # [2, E + 1, mmax]: sort key (rank, member of t, local expert, token) and the block's
        # first row; row E (what -1 indexes) sorts after every real pair, into rows past
        # the blocks.
        cell = (place[:, None] * dp + t % dp) * Lmax + local[:, None]
        cell = torch.cat([cell, torch.full((1, mmax), W * dp * Lmax)])
        first = torch.cat([place * blk, torch.tensor([W * blk])])
        table = torch.stack([cell * mmax + t, first[:, None].expand(E + 1, mmax)])
        self.table = table.contiguous().to(dev)
        self.tokens = t[:, None].expand(mmax, self.k).contiguous().to(dev)
        q = torch.arange(W, dtype=torch.int64)[:, None]
        self.bounds = (((q * dp + self.member) * Lmax + torch.arange(Lmax + 1)) * mmax).to(dev)
        self.rows = self.arange[:blk].expand(W, blk).contiguous()
        g = torch.arange(W // dp, dtype=torch.int64)[:, None]
        self.group_rows = (g * dp * blk + torch.arange(blk)).to(dev)  # [G, blk]
        lcap = torch.arange(Lmax, dtype=torch.int64) * self.cap
        # Rows 1..W get the counts per source; the first and last rows make one cumsum give
        # each expert's base and (last row) its total.
        self.cnt0 = torch.zeros(W + 2, Lmax, dtype=torch.int64)
        self.cnt0[0], self.cnt0[W + 1] = lcap, -lcap

    def _compact_tables(self, E: int, t: torch.Tensor) -> None:
        W, dp, k, mmax, mk, dev = self.W, self.dp, self.k, self.mmax, self.mk_max, self.device
        ids = np.full((W, E + 1), -1, dtype=np.int32)  # column E: what -1 indexes
        ids[self.place, np.arange(E)] = self.local
        self.id_table = torch.from_numpy(ids).to(dev)
        self.dest_table = torch.from_numpy(np.append(self.place * mk, W * mk)).to(dev)
        self.rank_table = torch.from_numpy(np.append(self.place, W)).to(dev)
        self.slots = (t[:, None] * k + torch.arange(k)).to(dev)  # [mmax, k]
        # Combine's block to rank r, entry (token, slot): received from the group member
        # that owns the token; a combine backward sums a row over the members.
        r, tok, j = np.meshgrid(np.arange(W), np.arange(mmax), np.arange(k), indexing="ij")
        g = r // dp
        self.ret_map = torch.from_numpy(
            (((g * dp + tok % dp) * mmax + tok) * k + j).reshape(-1)).to(dev)
        self.sum_map = torch.from_numpy((g * mk + tok * k + j).reshape(-1)).to(dev)

    def _buffers(self) -> dict[str, Any]:
        W, blk, rb, dev = self.W, self.blk, self.row_bytes, self.device
        send = torch.zeros((W * blk + self.mk_max) * rb, dtype=torch.uint8, device=dev)
        # One rank: the block it sends itself is what it receives (senders write into the
        # receiver's buffer, as pplx-kernels' and DeepEP's kernels do; nothing to copy).
        recv = send[: W * blk * rb] if W == 1 else torch.zeros(W * blk * rb, dtype=torch.uint8,
                                                                device=dev)
        b: dict[str, Any] = {"send": send, "recv": recv, "m": 0}
        if self.compact:
            b["inv"] = torch.empty(W * self.cblk, dtype=torch.int64, device=dev)
            send.view(torch.int32)[: W * blk * rb // 4].view(W, blk, -1)[:, :, self.id_col:] \
                .fill_(-1)  # rows of absent tokens carry no pair
            return b
        dump = self.L * self.cap  # past expert_x: rows that carry no pair land here
        b.update({
            "gather": torch.zeros(W, blk, dtype=torch.int64, device=dev),
            "pos": torch.zeros(self.mk_max, dtype=torch.int64, device=dev),
            "header": torch.zeros(W, self.Lmax + 1, dtype=torch.int64, device=dev),
            "cnt": self.cnt0.clone().to(dev),
            "base": torch.full((W, self.Lmax + 2), dump, dtype=torch.int64, device=dev),
            "expert": None,  # [L * cap + blk, cols] of the move dtype, on first use
        })
        return b

    @property
    def id_col(self) -> int:
        """compact: first ``int32`` column of a row's local expert ids."""
        return (self.Hb + 4 * self.S) // 4

    def split_matrix(self, rows: int) -> np.ndarray:
        """Every pair moves ``rows / W`` rows (the orchestrator's split matrix)."""
        return np.full((self.W, self.W), rows // self.W, dtype=np.int64)

    def header(self, buf: torch.Tensor) -> torch.Tensor:
        """The ``int64[W, Lmax + 1]`` headers of a send or receive buffer (a strided view)."""
        W, blk, rb = self.W, self.blk, self.row_bytes
        off = self.mk_max * rb
        blocks = buf[: W * blk * rb].view(W, blk * rb)
        return blocks[:, off : off + 8 * (self.Lmax + 1)].view(torch.int64)

    def combine_buffers(self, slot: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Send and receive rows of combine for ``dtype``; the receive rows past the blocks
        stay zero (what slots without an expert read)."""
        key = (slot, dtype)
        b = self.combine_bufs.get(key)
        if b is None:
            n, H = self.W * self.cblk, self.H
            recv = torch.zeros(n + self.mk_max, H, dtype=dtype, device=self.device)
            send = recv[:n] if self.W == 1 else torch.empty(n, H, dtype=dtype, device=self.device)
            b = (send, recv)
            self.combine_bufs[key] = b
        return b


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """``[m, c]`` as ``[m, c * itemsize]`` bytes (a view when contiguous)."""
    return t.contiguous().view(torch.uint8)


def dispatch_send(st: LowLatencyState, b: dict[str, Any], x: torch.Tensor,
                  idx: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """expert-major: pack ``x`` into ``b["send"]``; returns ``dest``. Device ops only."""
    m, k = idx.shape
    mk = m * k
    W = st.W
    keys = st.table[:, idx, st.tokens[:m]]  # [2, m, k]: sort key, block's first row
    skey, order = torch.sort(keys[0].view(-1))
    if m < b["m"]:  # rows past m*k of the gather index must name a token of this x
        b["gather"][:, mk:].zero_()
    b["m"] = m
    send_rows = b["send"].view(-1, st.row_bytes)[: W * st.blk].view(st.move_dtype)
    if m:
        torch.remainder(skey.expand(W, mk), st.mmax, out=b["gather"][:, :mk])
        torch.index_select(_source_rows(st, x, scale), 0, b["gather"].view(-1), out=send_rows)
    # After the gather, which wrote every row of every block: the headers.
    torch.searchsorted(skey, st.bounds, out=st.header(b["send"]))
    pos = b["pos"][:mk].scatter_(0, order, st.arange[:mk])
    return pos.view(m, k) + keys[1]


def _source_rows(st: LowLatencyState, x: torch.Tensor,
                 scale: torch.Tensor | None) -> torch.Tensor:
    """The rows to send as ``[m, cols]`` of the move dtype: ``x`` itself (a view when
    aligned), or with scales the payload and scale bytes staged side by side."""
    if scale is not None:
        assert st.stage is not None
        m = x.shape[0]
        st.stage[:m, : st.Hb].copy_(_bytes(x))
        st.stage[:m, st.Hb : st.Hb + 4 * st.S].copy_(_bytes(scale))
        return st.stage.view(st.move_dtype)
    if not x.is_contiguous() or (x.storage_offset() * x.element_size()) % 16:
        x = x.contiguous().clone()  # a fresh tensor is aligned
    return x.view(st.move_dtype)


def _rows_of(st: LowLatencyState, rows: torch.Tensor, n: int,
             shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Payload and scales of ``n`` received rows (``rows``: ``[>= n, cols]`` of the move
    dtype): a view when the rows hold the payload alone, else copies."""
    if st.row_bytes == st.Hb:
        return rows[:n].view(st.payload_dtype).view(*shape, st.H), None
    raw = rows[:n].view(torch.uint8)
    x = raw[:, : st.Hb].contiguous().view(st.payload_dtype).view(*shape, st.H)
    if not st.S:
        return x, None
    s = raw[:, st.Hb : st.Hb + 4 * st.S].contiguous().view(torch.float32).view(*shape, st.S)
    return x, s


def dispatch_recv(st: LowLatencyState, b: dict[str, Any]) -> dict[str, Any]:
    """expert-major: lay the received rows out by local expert. Returns the handle's
    tables and ``expert_x``."""
    W, Lmax, L, cap = st.W, st.Lmax, st.L, st.cap
    hdr = b["header"]
    hdr.copy_(st.header(b["recv"]))  # contiguous: searchsorted's boundaries must be
    cnt = b["cnt"]
    torch.sub(hdr[:, 1:], hdr[:, :-1], out=cnt[1 : W + 1])
    cs = cnt.cumsum(0)  # row s: l*cap + rows of earlier sources; row W+1: the totals
    base = b["base"]
    torch.sub(cs[:W], hdr[:, :-1], out=base[:, 1 : Lmax + 1])
    expert_of = torch.searchsorted(hdr, st.rows, right=True)  # local expert + 1 of each row
    xpos = base.gather(1, expert_of).add_(st.rows).view(-1)
    if b["expert"] is None:
        b["expert"] = torch.zeros(L * cap + st.blk, st.cols, dtype=st.move_dtype,
                                  device=st.device)
    recv_rows = b["recv"].view(W * st.blk, -1).view(st.move_dtype)
    b["expert"].index_copy_(0, xpos, recv_rows)
    expert_x, scale = _rows_of(st, b["expert"], L * cap, (L, cap))
    xpos_gather = xpos.clamp(max=max(L * cap - 1, 0))
    out = {"expert_x": expert_x, "counts": cs[W + 1, :L], "xpos": xpos,
           "xpos_gather": xpos_gather, "ret_gather": xpos_gather, "back_pos": xpos,
           "expert_x_scale": scale}
    if st.dp > 1:
        out.update(_merge_members(st, hdr, xpos))
    return out


def _merge_members(st: LowLatencyState, hdr: torch.Tensor, xpos: torch.Tensor) -> dict[str, Any]:
    """expert-major with DP groups: row ``r`` of a group's blocks belongs to the member
    whose header range holds it (the ranges of a group's members follow each other);
    combine returns that member's row to every member."""
    G, dp, blk = st.W // st.dp, st.dp, st.blk
    starts = hdr[:, 0].reshape(G, dp).contiguous()
    owner = torch.searchsorted(starts, st.rows[:G], right=True).sub_(1).clamp_(min=0)
    own_pos = xpos[owner.mul_(blk).add_(st.group_rows).view(-1)]  # [G * blk]
    gather = own_pos.clamp(max=max(st.L * st.cap - 1, 0))
    ret = gather.view(G, 1, blk).expand(G, dp, blk).reshape(-1)
    return {"ret_gather": ret, "back_pos": own_pos}


def compact_send(st: LowLatencyState, b: dict[str, Any], x: torch.Tensor,
                 idx: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """compact: every token's row, and its local expert ids on each rank, into every
    block; returns ``dest``. Device ops only."""
    m = idx.shape[0]
    W, mmax = st.W, st.mmax
    rows = b["send"].view(torch.int32)[: W * mmax * st.row_bytes // 4].view(W, mmax, -1)
    own = idx if st.dp == 1 else torch.where(st.own[:m], idx, -1)
    if m < b["m"]:
        rows[:, m:, st.id_col :].fill_(-1)
    b["m"] = m
    if m:
        rows[:, :m, : st.Hb // 4].copy_(_bytes(x).view(torch.int32).expand(W, m, -1))
        if scale is not None:
            rows[:, :m, st.Hb // 4 : st.id_col].copy_(scale.view(torch.int32).expand(W, m, -1))
        rows[:, :m, st.id_col : st.id_col + st.k].copy_(st.id_table[:, own])
    return st.dest_table[idx] + st.slots[:m]


def compact_recv(st: LowLatencyState, b: dict[str, Any]) -> dict[str, Any]:
    """compact: the received rows, their local expert ids and the pairs grouped by
    expert (one stable sort), all on the device."""
    W, mmax, k, L = st.W, st.mmax, st.k, st.L
    rows = b["recv"].view(torch.int32).view(W * mmax, -1)
    expert_x, scale = _rows_of(st, rows.view(st.move_dtype), W * mmax, (W * mmax,))
    ids = rows[:, st.id_col : st.id_col + k].to(torch.int64)
    flat = ids.view(-1)
    grouped, order = torch.sort(torch.remainder(flat, L + 1), stable=True)  # -1 sorts last
    offsets = torch.searchsorted(grouped, st.arange[: L + 1])
    # Each received (row, slot)'s place among the grouped pairs: the row of expert_y that
    # combine returns for it (combine clamps the (row, slot)s without a pair into expert_y).
    ret = b["inv"].scatter_(0, order, st.arange[: flat.numel()])
    if st.dp > 1:
        ret = ret[st.ret_map]
    return {"expert_x": expert_x, "counts": offsets[1:] - offsets[:-1], "ret_gather": ret,
            "expert_x_scale": scale, "expert_ids": ids, "expert_rows": order // k,
            "expert_offsets": offsets, "order": order, "grouped": grouped}


def combine_send(st: LowLatencyState, slot: int, expert_y: torch.Tensor,
                 handle: LowLatencyHandle) -> tuple[torch.Tensor, torch.Tensor]:
    """Every returned row's expert output, in its row: ``(send, recv)`` buffers."""
    send, recv = st.combine_buffers(slot, expert_y.dtype)
    flat = expert_y.reshape(-1, st.H)
    n = flat.shape[0]
    if n:  # a rank without experts (or pairs) has nothing to send back
        rows = handle.ret_gather.clamp(max=n - 1) if st.compact else handle.ret_gather
        torch.index_select(flat, 0, rows, out=send)
    return send, recv


def weighted_sum(rows: torch.Tensor, dest: torch.Tensor, w: torch.Tensor | None,
                 offsets: torch.Tensor) -> torch.Tensor:
    """``out[t] = sum_j w[t, j] * rows[dest[t, j]]``, accumulated in float32.

    float32 rows: one ``embedding_bag`` (gather, weigh and sum in one op);
    other dtypes: the token's rows are gathered, cast and summed by ``bmm``.
    ``offsets``: ``0, k, 2k, ..`` (at least ``m``), the bags' starts.
    """
    m, k = dest.shape
    if w is not None and w.dtype != torch.float32:
        w = w.float()
    if m == 0:
        return torch.zeros(0, rows.shape[1], dtype=torch.float32, device=rows.device)
    if rows.dtype == torch.float32:  # offsets given: embedding_bag's own arange is one op more
        return F.embedding_bag(dest.reshape(-1), rows, offsets[:m], mode="sum",
                               per_sample_weights=None if w is None else w.reshape(-1))
    ys = rows.index_select(0, dest.reshape(-1)).view(m, k, -1).float()
    if w is None:
        return ys.sum(1)
    return torch.bmm(w.unsqueeze(1), ys).view(m, -1)


def exchange(st: LowLatencyState, out: torch.Tensor, inp: torch.Tensor, async_op: bool) -> Any:
    """One fixed-size all-to-all (equal splits): torch's on the layer's group, or the
    orchestrator's (its split-matrix path: a constant matrix, no exchange of its own)."""
    if out.data_ptr() == inp.data_ptr():  # one rank, sending into its receive buffer
        return None
    if st.orchestrator is None:
        import torch.distributed as dist

        return dist.all_to_all_single(out, inp, group=st.group, async_op=async_op)
    from pathweave import distributed as pwd

    return pwd.all_to_all_single(out, inp, group=st.group, async_op=async_op,
                                 orchestrator=st.orchestrator,
                                 split_matrix=st.split_matrix(out.shape[0]),
                                 config_digests=st.digests)


def _state(layer: Any, device: torch.device, scale_cols: int) -> LowLatencyState:
    """The layer's state on ``device`` for ``scale_cols``; the first call per device is the
    (collective) warm-up: the layer's configuration check and, for the orchestrator, its
    digests."""
    st = layer._ll_states.get((device, scale_cols))
    if st is None:
        layer._check_config()
        st = LowLatencyState(layer, device, scale_cols)
        from pathweave import distributed as pwd

        if layer.orchestrator is None:
            st.group = pwd.run_group(layer.group, device)
        else:
            st.group, st.orchestrator = layer.group, layer.orchestrator
            st.digests = layer._exchange(
                np.array([layer._plane_digest(torch.empty(0, device=device))]))()[:, 0].copy()
        layer._ll_states[(device, scale_cols)] = st
    return st


def _check_args(layer: Any, x: Any, idx: Any, x_scale: Any) -> int:
    """Shape, dtype and device checks (host only: nothing is read from the device);
    returns the scale columns (0 without scales)."""
    if not isinstance(x, torch.Tensor) or not isinstance(idx, torch.Tensor):
        raise TypeError("x and topk_idx must be tensors, got "
                        f"{type(x).__name__} and {type(idx).__name__}")
    m = x.shape[0] if x.dim() == 2 else -1
    if x.dim() != 2 or x.shape[1] != layer.hidden_dim:
        raise ValueError(f"x must be [m, {layer.hidden_dim}], got {list(x.shape)}")
    if m > layer.max_num_tokens:
        raise ValueError(f"x has {m} tokens, more than max_num_tokens={layer.max_num_tokens}")
    if x.dtype != layer.dtype:
        raise TypeError(f"x has dtype {x.dtype}, the layer was built for {layer.dtype}")
    if tuple(idx.shape) != (m, layer.experts_per_token) or idx.is_floating_point():
        raise ValueError(f"topk_idx must be an integer [{m}, {layer.experts_per_token}] "
                         f"tensor, got {idx.dtype} {list(idx.shape)}")
    if idx.device != x.device:
        raise ValueError(f"topk_idx is on {idx.device}, x on {x.device}")
    if x_scale is None:
        return 0
    if not isinstance(x_scale, torch.Tensor) or x_scale.dtype != torch.float32:
        raise TypeError(f"x_scale must be a float32 tensor, got "
                        f"{getattr(x_scale, 'dtype', type(x_scale).__name__)}")
    if x_scale.dim() != 2 or x_scale.shape[0] != m or x_scale.shape[1] < 1:
        raise ValueError(f"x_scale must be [{m}, S] with S >= 1, got {list(x_scale.shape)}")
    if x_scale.device != x.device:
        raise ValueError(f"x_scale is on {x_scale.device}, x on {x.device}")
    return int(x_scale.shape[1])


def _debug_check(layer: Any, idx: torch.Tensor, scale_cols: int) -> None:
    """``debug_checks``: the contract, checked with host syncs; raises on every rank."""
    from pathweave.moe import routing as R

    words = R.check_topk(idx.to(torch.int64), layer.num_experts).cpu().numpy()
    code, i, j, v = R.topk_problem(words, *idx.shape)
    live = np.zeros(0, np.int64)
    if code == 0:  # the pairs this rank sends: with DP groups, those of its own tokens
        own = idx[layer._member :: layer.dp_size]
        live = own[own >= 0].to(torch.int64).cpu().numpy()
    per_expert = np.bincount(live, minlength=layer.num_experts)
    rows = layer._exchange(np.concatenate([[code, i, j, v, scale_cols], per_expert]))()
    bad = np.flatnonzero(rows[:, 0])
    if bad.size:
        r = int(bad[0])
        c, i, j, v = (int(a) for a in rows[r, :4])
        what = "is out of [-1, num_experts)" if c == 1 else "repeats an earlier slot"
        raise ValueError(f"topk_idx[{i}, {j}] = {v} on rank {r} {what}")
    cols = rows[:, 4]
    if (cols != cols[0]).any():
        r = int(np.flatnonzero(cols != cols[0])[0])
        raise ValueError(f"x_scale has {int(cols[0])} columns on rank 0 but {int(cols[r])} "
                         f"on rank {r} (0: none); every rank must pass the same")
    total = rows[:, 5:].sum(axis=0)
    over = np.flatnonzero(total > layer.expert_capacity)
    if over.size and layer.layout == "expert-major":
        e = int(over[0])
        raise ValueError(f"expert {e} receives {int(total[e])} rows, more than "
                         f"expert_capacity={layer.expert_capacity}")


def dispatch(layer: Any, x: torch.Tensor, idx: torch.Tensor, x_scale: Any,
             async_op: bool) -> Any:
    """:meth:`MoEAllToAll.dispatch` in low-latency mode."""
    from pathweave.moe._work import DispatchWork

    cols = _check_args(layer, x, idx, x_scale)
    if layer.debug_checks:
        _debug_check(layer, idx, cols)
    st = _state(layer, x.device, cols)
    slot = st.calls % NUM_BUFFER_SETS
    st.calls += 1
    b = st.sets[slot]
    send = compact_send if st.compact else dispatch_send
    dest = send(st, b, x.detach(), idx, x_scale)
    n = st.W * st.blk * st.row_bytes
    work = exchange(st, b["recv"], b["send"][:n], async_op)
    call_id = layer._dispatches
    layer._dispatches += 1

    def finish() -> tuple[torch.Tensor, torch.Tensor, LowLatencyHandle]:
        got = (compact_recv if st.compact else dispatch_recv)(st, b)
        expert_x, counts = got.pop("expert_x"), got.pop("counts")
        handle = LowLatencyHandle(layer, call_id, int(x.shape[0]), slot, dest,
                                  expert_num_tokens=counts, topk_idx=idx, layout=layer.layout,
                                  state=st, **got)
        if torch.is_grad_enabled() and x.requires_grad:
            expert_x = _DispatchGrad.apply(x, (st, handle, expert_x))
        return expert_x, counts, handle

    return DispatchWork(work, finish) if async_op else finish()


def combine(layer: Any, expert_y: torch.Tensor, handle: Any, w: torch.Tensor | None,
            weighted: bool, async_op: bool) -> Any:
    """:meth:`MoEAllToAll.combine` in low-latency mode."""
    from pathweave.moe._work import CombineWork

    if not isinstance(handle, LowLatencyHandle) or handle.owner is not layer:
        raise ValueError("handle must come from this layer's low-latency dispatch")
    if handle.combined:
        raise ValueError(f"the handle of dispatch {handle.call_id} was already combined")
    st = handle.state
    if expert_y.device != st.device:
        raise ValueError(f"expert_y is on {expert_y.device}, the dispatch ran on {st.device}")
    ok = (expert_y.dim() == 2 and expert_y.shape[1] == st.H) if st.compact else (
        tuple(expert_y.shape) == (st.L, st.cap, st.H))
    if not ok or not expert_y.is_floating_point():
        want = "[P, H] (P >= the pairs received)" if st.compact else [st.L, st.cap, st.H]
        raise ValueError(f"expert_y must be a floating {want} tensor, got "
                         f"{expert_y.dtype} {list(expert_y.shape)}")
    m = handle.num_tokens
    if weighted and (w is None or tuple(w.shape) != (m, st.k)):
        raise ValueError(f"topk_weights must be [{m}, {st.k}] when weighted, got "
                         f"{None if w is None else list(w.shape)}")
    handle.combined = True
    wv = w if weighted else None
    send, recv = combine_send(st, handle.buffers, expert_y.detach(), handle)
    work = exchange(st, recv[: send.shape[0]], send, async_op)
    grad = torch.is_grad_enabled() and (
        expert_y.requires_grad or (wv is not None and wv.requires_grad))

    def finish() -> torch.Tensor:
        if grad:
            out = _CombineGrad.apply(expert_y, wv, (st, handle, recv))
        else:
            out = weighted_sum(recv, handle.dest, wv, st.offsets)
        return out if expert_y.dtype == torch.float32 else out.to(expert_y.dtype)

    return CombineWork(work, finish) if async_op else finish()


def _back_rows(st: LowLatencyState, rows: torch.Tensor) -> torch.Tensor:
    """Exchange ``[W * blk, H]`` rows; returns them with zero rows past the blocks."""
    out = torch.zeros(rows.shape[0] + st.mk_max, st.H, dtype=rows.dtype, device=rows.device)
    exchange(st, out[: rows.shape[0]], rows, False)
    return out


def _back_dest(st: LowLatencyState, h: LowLatencyHandle) -> torch.Tensor:
    """Dispatch backward: where each token finds its rows' gradients in the returned
    blocks (a row of zeros for the slots, or with DP groups the tokens, not its own)."""
    m = h.num_tokens
    if st.compact:  # one row per (token, rank with one of its experts)
        ranks = st.rank_table[h.topk_idx]
        if st.dp > 1:
            ranks = torch.where(st.own[:m], ranks, st.W)
        has = torch.zeros(m, st.W + 1, dtype=torch.bool, device=ranks.device)
        has.scatter_(1, ranks, True)
        t = st.arange[:m, None]
        return torch.where(has[:, : st.W], st.arange[: st.W] * st.mmax + t, st.W * st.mmax)
    if st.dp > 1:
        return torch.where(st.own[:m], h.dest, st.W * st.blk)
    return h.dest


class _DispatchGrad(torch.autograd.Function):
    """Joins ``expert_x`` to ``x``'s graph; backward: each row's gradient back to its
    source (the combine exchange, unweighted), summed per token in float32."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, box: tuple[Any, Any, torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        ctx.st, ctx.handle, expert_x = box
        ctx.dtype = x.dtype
        return expert_x.clone()  # the buffer is reused two dispatches later

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        st, h = ctx.st, ctx.handle
        if st.compact:  # the received rows are the returned rows
            rows = g.reshape(-1, st.H).contiguous()
        elif st.L * st.cap:
            rows = g.reshape(-1, st.H).index_select(0, h.xpos_gather)
        else:
            rows = g.new_zeros(st.W * st.blk, st.H)
        back = _back_rows(st, rows)
        dest = _back_dest(st, h)
        m, n = dest.shape  # compact: one bag of W rows per token
        offsets = st.offsets if n == st.k else torch.arange(0, m * n, n, device=dest.device)
        return weighted_sum(back, dest, None, offsets).to(ctx.dtype), None


class _CombineGrad(torch.autograd.Function):
    """The weighted sum of the returned rows; backward: the gradient rows (times their
    weights) to the experts' ranks (the dispatch direction; with DP groups summed over
    the members, in member order) and the weights' gradients as float32 dot products at
    the source."""

    @staticmethod
    def forward(ctx: Any, expert_y: torch.Tensor, w: torch.Tensor | None,  # type: ignore[override]
                box: tuple[Any, Any, torch.Tensor]) -> torch.Tensor:
        ctx.st, ctx.handle, recv = box
        ctx.y_dtype, ctx.w_dtype = expert_y.dtype, None if w is None else w.dtype
        ctx.y_rows = expert_y.reshape(-1, ctx.st.H).shape[0]
        m, k = ctx.handle.dest.shape
        ys = recv.index_select(0, ctx.handle.dest.view(-1)).view(m, k, ctx.st.H).float()
        ctx.save_for_backward(ys, w)
        return weighted_sum(recv, ctx.handle.dest, w, ctx.st.offsets)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, Any, None]:  # type: ignore[override]
        st, h = ctx.st, ctx.handle
        ys, w = ctx.saved_tensors
        g = g.float()
        gw = None
        if w is not None and ctx.needs_input_grad[1]:
            gw = (ys * g.unsqueeze(1)).sum(-1).to(ctx.w_dtype)
        gy = None
        if ctx.needs_input_grad[0]:
            gy = _expert_grad(st, h, _returned_grad(st, h, g, w, ctx.y_dtype), ctx.y_rows)
        return gy, gw, None


def _returned_grad(st: LowLatencyState, h: LowLatencyHandle, g: torch.Tensor,
                   w: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Each returned row's gradient back to the expert's rank: ``[rows, H]`` in combine's
    block order, summed over a DP group's members."""
    m, k = h.dest.shape
    rows = g.unsqueeze(1).expand(m, k, st.H)
    if w is not None:
        rows = rows * w.float().unsqueeze(2)
    n = st.W * st.cblk
    send = torch.zeros(n + st.mk_max, st.H, dtype=dtype, device=g.device)
    send.index_copy_(0, h.dest.view(-1), rows.reshape(m * k, st.H).to(dtype))
    recv = torch.empty(n, st.H, dtype=dtype, device=g.device)
    exchange(st, recv, send[:n], False)
    if st.dp > 1:
        recv = recv.view(st.W // st.dp, st.dp, st.cblk, st.H).sum(1).view(-1, st.H)
    return recv


def _expert_grad(st: LowLatencyState, h: LowLatencyHandle, recv: torch.Tensor,
                 rows: int) -> torch.Tensor:
    """``expert_y``'s gradient (``rows`` rows in compact layout) from the returned rows."""
    if st.compact:  # pair p's gradient is the returned row of its (source, token, slot)
        assert h.order is not None and h.grouped is not None
        src = h.order[:rows] if st.dp == 1 else st.sum_map[h.order[:rows]]
        src = torch.where(h.grouped[:rows] < st.L, src, recv.shape[0])
        padded = torch.cat([recv, recv.new_zeros(1, st.H)])
        return padded.index_select(0, src)
    full = torch.zeros(st.L * st.cap + st.blk, st.H, dtype=recv.dtype, device=recv.device)
    full.index_copy_(0, h.back_pos, recv)
    return full[: st.L * st.cap].view(st.L, st.cap, st.H)
