"""The low-latency mode of :class:`~pathweave.moe.MoEAllToAll`: fixed shapes, no host sync.

For decode (a few tokens per rank, latency bound). Every buffer has a shape
fixed by ``max_num_tokens`` (pplx-kernels' contract), the counts travel with
the data on the device, and nothing is read back to the host, so one dispatch
+ combine can be captured in a CUDA graph and replayed.

Layout of the exchange (one fixed-size ``all_to_all_single`` with equal
splits per direction): the block a rank sends to rank ``q`` has
``max_num_tokens * k`` payload rows and a header of ``Lmax + 1`` ``int64``
words (``Lmax``: most experts on one rank) in the rows after them. The
sender sorts its (token, expert) pairs by key ``(rank q, local expert l,
token t)`` and writes the pair of sorted position ``i`` to row ``i`` of
*every* block (one gather of ``x``, no scatter); the header of block ``q``
holds ``G[q, l]``, the sorted position of the first pair for local expert
``l`` of ``q`` (``G[q, Lmax]``: one past ``q``'s last). So the rows of
``q`` are rows ``G[q, 0] .. G[q, Lmax]`` of block ``q``, grouped by local
expert, and a receiver knows from the header alone where each expert's rows
are and how many there are. Rows outside that range are ignored.

The receiver lays the rows of local expert ``l`` from source ``s`` at
``l * capacity + sum_{s' < s} count[s', l] + (r - G_s[l])`` of ``expert_x``
(grouped by source, then token: the normal mode's order). Combine gathers
each received row's expert output back into the same row of the same block
and returns the blocks; the source reads pair ``(t, j)`` at the row it was
sent from (``dest``) and sums a token's rows weighted, in one
``embedding_bag``. Pairs with no expert (``-1``) are sorted after every real
pair and read a row of zeros.

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
        ``int64[m, k]``: the row of each (token, slot) in the exchanged
        blocks; slots without an expert point at a row of zeros.
    xpos
        ``int64[W * block]``: the row of ``expert_x`` (flattened) of every
        received row; rows that carry no pair point past ``L * capacity``.
    xpos_gather
        ``xpos`` clamped into ``expert_y``'s rows (what combine gathers).
    expert_num_tokens
        ``int64[L]`` on the device: rows per local expert.
    """

    owner: Any
    call_id: int
    num_tokens: int
    buffers: int
    dest: torch.Tensor
    xpos: torch.Tensor
    xpos_gather: torch.Tensor
    expert_num_tokens: torch.Tensor
    layout: str = "expert-major"
    combined: bool = False


class LowLatencyState:
    """Tables and buffers of one layer on one device (built once, reused by every call)."""

    def __init__(self, layer: Any, device: torch.device):
        E, k, W = layer.num_experts, layer.experts_per_token, layer.num_ranks
        mmax, H = layer.max_num_tokens, layer.hidden_dim
        self.device = device
        self.W, self.k, self.H, self.mmax = W, k, H, mmax
        self.payload_dtype = layer.dtype
        self.Lmax = Lmax = int(max(int(layer.experts_per_rank.max()), 1))
        self.L, self.cap = layer.num_local_experts, layer.expert_capacity
        es = torch.empty(0, dtype=layer.dtype).element_size()
        self.row_bytes = rb = H * es
        self.mk_max = mk = mmax * k
        hdr_rows = -(-8 * (Lmax + 1) // rb)
        self.blk = blk = mk + hdr_rows
        # Rows move as 16- (or 8-) byte elements: bit-exact for every dtype, and the CPU's
        # index_copy_, which walks elements, makes a quarter of the steps of a 4-byte type.
        self.move_dtype = torch.complex128 if rb % 16 == 0 else torch.int64
        self.cols = rb // (16 if rb % 16 == 0 else 8)
        place = torch.tensor(np.asarray(layer.placement), dtype=torch.int64)
        local = torch.tensor(np.asarray(layer.local_index), dtype=torch.int64)
        t = torch.arange(mmax, dtype=torch.int64)
        # [2, E + 1, mmax]: sort key (rank, local expert, token) and the block's first row;
        # row E (what -1 indexes) sorts after every real pair, into rows past the blocks.
        cell = torch.cat([place * Lmax + local, torch.tensor([W * Lmax])])
        first = torch.cat([place * blk, torch.tensor([W * blk])])
        table = torch.stack([cell[:, None] * mmax + t, first[:, None].expand(E + 1, mmax)])
        self.table = table.contiguous().to(device)
        self.tokens = t[:, None].expand(mmax, k).contiguous().to(device)
        q = torch.arange(W, dtype=torch.int64)[:, None]
        self.bounds = ((q * Lmax + torch.arange(Lmax + 1)) * mmax).to(device)
        self.arange = torch.arange(max(mk, blk), dtype=torch.int64, device=device)
        self.offsets = torch.arange(0, mk, k, dtype=torch.int64, device=device)
        self.rows = self.arange[:blk].expand(W, blk).contiguous()
        lcap = torch.arange(Lmax, dtype=torch.int64) * self.cap
        # Rows 1..W get the counts per source; the first and last rows make one cumsum give
        # each expert's base and (last row) its total.
        cnt = torch.zeros(W + 2, Lmax, dtype=torch.int64)
        cnt[0], cnt[W + 1] = lcap, -lcap
        self.sets = [self._buffers(cnt, device) for _ in range(NUM_BUFFER_SETS)]
        self.group: Any = None  # set by the layer
        self.orchestrator: Any = None
        self.digests: np.ndarray | None = None
        self.combine_bufs: dict[tuple[int, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        self.calls = 0

    def _buffers(self, cnt: torch.Tensor, device: torch.device) -> dict[str, Any]:
        W, blk, rb, Lmax = self.W, self.blk, self.row_bytes, self.Lmax
        dump = self.L * self.cap  # past expert_x: rows that carry no pair land here
        base = torch.full((W, Lmax + 2), dump, dtype=torch.int64)
        send = torch.zeros((W * blk + self.mk_max) * rb, dtype=torch.uint8, device=device)
        # One rank: the block it sends itself is what it receives (senders write into the
        # receiver's buffer, as pplx-kernels' and DeepEP's kernels do; nothing to copy).
        recv = send[: W * blk * rb] if W == 1 else torch.zeros(W * blk * rb, dtype=torch.uint8,
                                                                device=device)
        return {
            "send": send,
            "recv": recv,
            "gather": torch.zeros(W, blk, dtype=torch.int64, device=device),
            "pos": torch.zeros(self.mk_max, dtype=torch.int64, device=device),
            "header": torch.zeros(W, Lmax + 1, dtype=torch.int64, device=device),  # contiguous
            "cnt": cnt.clone().to(device),
            "base": base.to(device),
            "expert": None,  # [L * cap + blk, H] of the payload dtype, on first use
            "m": 0,
        }

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
            n, H = self.W * self.blk, self.H
            recv = torch.zeros(n + self.mk_max, H, dtype=dtype, device=self.device)
            send = recv[:n] if self.W == 1 else torch.empty(n, H, dtype=dtype, device=self.device)
            b = (send, recv)
            self.combine_bufs[key] = b
        return b


def dispatch_send(st: LowLatencyState, b: dict[str, Any], x: torch.Tensor,
                  idx: torch.Tensor) -> torch.Tensor:
    """Pack ``x`` into ``b["send"]``; returns ``dest`` (``int64[m, k]``). Device ops only."""
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
        torch.index_select(_rows_as(x, st), 0, b["gather"].view(-1), out=send_rows)
    # After the gather, which wrote every row of every block: the headers.
    torch.searchsorted(skey, st.bounds, out=st.header(b["send"]))
    pos = b["pos"][:mk].scatter_(0, order, st.arange[:mk])
    return pos.view(m, k) + keys[1]


def _rows_as(x: torch.Tensor, st: LowLatencyState) -> torch.Tensor:
    """``x``'s rows as ``[m, cols]`` of the move dtype (a view when aligned, else a copy)."""
    if not x.is_contiguous() or (x.storage_offset() * x.element_size()) % 16:
        x = x.contiguous().clone()  # a fresh tensor is aligned
    return x.view(st.move_dtype)


def dispatch_recv(st: LowLatencyState, b: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    """Lay the received rows out by local expert: ``(expert_x, counts, xpos, xpos_gather)``."""
    W, H, Lmax, L, cap = st.W, st.H, st.Lmax, st.L, st.cap
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
    expert_x = b["expert"][: L * cap].view(st.payload_dtype).view(L, cap, H)
    return expert_x, cs[W + 1, :L], xpos, xpos.clamp(max=max(L * cap - 1, 0))


def combine_send(st: LowLatencyState, slot: int, expert_y: torch.Tensor,
                 handle: LowLatencyHandle) -> tuple[torch.Tensor, torch.Tensor]:
    """Every received row's expert output, back in its row: ``(send, recv)`` buffers."""
    send, recv = st.combine_buffers(slot, expert_y.dtype)
    if st.L * st.cap:  # a rank without experts has nothing to send back
        flat = expert_y.reshape(st.L * st.cap, st.H)
        torch.index_select(flat, 0, handle.xpos_gather, out=send)
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
        return F.embedding_bag(dest.view(-1), rows, offsets[:m], mode="sum",
                               per_sample_weights=None if w is None else w.reshape(-1))
    ys = rows.index_select(0, dest.view(-1)).view(m, k, -1).float()
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


def _state(layer: Any, device: torch.device) -> LowLatencyState:
    """The layer's state on ``device``; the first call per device is the (collective)
    warm-up: the layer's configuration check and, for the orchestrator, its digests."""
    st = layer._ll_states.get(device)
    if st is None:
        layer._check_config()
        st = LowLatencyState(layer, device)
        from pathweave import distributed as pwd

        if layer.orchestrator is None:
            st.group = pwd._resolve(None, layer.group, device)[1]
        else:
            st.group, st.orchestrator = layer.group, layer.orchestrator
            st.digests = layer._exchange(
                np.array([layer._plane_digest(torch.empty(0, device=device))]))()[:, 0].copy()
        layer._ll_states[device] = st
    return st


def _check_args(layer: Any, x: Any, idx: Any, x_scale: Any) -> None:
    """Shape, dtype and device checks (host only: nothing is read from the device)."""
    if not isinstance(x, torch.Tensor) or not isinstance(idx, torch.Tensor):
        raise TypeError("x and topk_idx must be tensors, got "
                        f"{type(x).__name__} and {type(idx).__name__}")
    if x_scale is not None:
        raise ValueError("x_scale is not supported in mode='low_latency'; use mode='normal'")
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


def _debug_check(layer: Any, st: LowLatencyState, idx: torch.Tensor) -> None:
    """``debug_checks``: the contract, checked with host syncs; raises on every rank."""
    from pathweave.moe import _routing as R

    words = R.check_topk(idx.to(torch.int64), layer.num_experts).cpu().numpy()
    code, i, j, v = R.topk_problem(words, *idx.shape)
    live = idx[idx >= 0].to(torch.int64).cpu().numpy() if code == 0 else np.zeros(0, np.int64)
    per_expert = np.bincount(live, minlength=layer.num_experts)
    rows = layer._exchange(np.concatenate([[code, i, j, v], per_expert]))()
    bad = np.flatnonzero(rows[:, 0])
    if bad.size:
        r = int(bad[0])
        c, i, j, v = (int(a) for a in rows[r, :4])
        what = "is out of [-1, num_experts)" if c == 1 else "repeats an earlier slot"
        raise ValueError(f"topk_idx[{i}, {j}] = {v} on rank {r} {what}")
    total = rows[:, 4:].sum(axis=0)
    over = np.flatnonzero(total > layer.expert_capacity)
    if over.size:
        e = int(over[0])
        raise ValueError(f"expert {e} receives {int(total[e])} rows, more than "
                         f"expert_capacity={layer.expert_capacity}")


def dispatch(layer: Any, x: torch.Tensor, idx: torch.Tensor, x_scale: Any,
             async_op: bool) -> Any:
    """:meth:`MoEAllToAll.dispatch` in low-latency mode."""
    from pathweave.moe._work import DispatchWork

    _check_args(layer, x, idx, x_scale)
    st = _state(layer, x.device)
    if layer.debug_checks:
        _debug_check(layer, st, idx)
    slot = st.calls % NUM_BUFFER_SETS
    st.calls += 1
    b = st.sets[slot]
    dest = dispatch_send(st, b, x.detach(), idx)
    n = st.W * st.blk * st.row_bytes
    work = exchange(st, b["recv"], b["send"][:n], async_op)
    call_id = layer._dispatches
    layer._dispatches += 1

    def finish() -> tuple[torch.Tensor, torch.Tensor, LowLatencyHandle]:
        expert_x, counts, xpos, xpos_g = dispatch_recv(st, b)
        handle = LowLatencyHandle(layer, call_id, int(x.shape[0]), slot, dest, xpos, xpos_g,
                                  counts)
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
    st = layer._ll_states[expert_y.device]
    shape = (st.L, st.cap, st.H)
    if tuple(expert_y.shape) != shape or not expert_y.is_floating_point():
        raise ValueError(f"expert_y must be a floating {list(shape)} tensor, got "
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
        n = st.W * st.blk
        if st.L * st.cap:
            rows = g.reshape(-1, st.H).index_select(0, h.xpos_gather)
        else:
            rows = g.new_zeros(n, st.H)
        back = _back_rows(st, rows)
        return weighted_sum(back, h.dest, None, st.offsets).to(ctx.dtype), None


class _CombineGrad(torch.autograd.Function):
    """The weighted sum of the returned rows; backward: the gradient rows (times their
    weights) to the experts' ranks (the dispatch exchange) and the weights' gradients
    as float32 dot products at the source."""

    @staticmethod
    def forward(ctx: Any, expert_y: torch.Tensor, w: torch.Tensor | None,  # type: ignore[override]
                box: tuple[Any, Any, torch.Tensor]) -> torch.Tensor:
        ctx.st, ctx.handle, recv = box
        ctx.y_dtype, ctx.w_dtype = expert_y.dtype, None if w is None else w.dtype
        m, k = ctx.handle.dest.shape
        ys = recv.index_select(0, ctx.handle.dest.view(-1)).view(m, k, ctx.st.H).float()
        ctx.save_for_backward(ys, w)
        return weighted_sum(recv, ctx.handle.dest, w, ctx.st.offsets)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, Any, None]:  # type: ignore[override]
        st, h = ctx.st, ctx.handle
        ys, w = ctx.saved_tensors
        m, k = h.dest.shape
        g = g.float()
        gw = None
        if w is not None and ctx.needs_input_grad[1]:
            gw = (ys * g.unsqueeze(1)).sum(-1).to(ctx.w_dtype)
        gy = None
        if ctx.needs_input_grad[0]:
            rows = g.unsqueeze(1).expand(m, k, st.H)
            if w is not None:
                rows = rows * w.float().unsqueeze(2)
            n = st.W * st.blk
            send = torch.zeros(n + st.mk_max, st.H, dtype=ctx.y_dtype, device=g.device)
            send.index_copy_(0, h.dest.view(-1), rows.reshape(m * k, st.H).to(ctx.y_dtype))
            recv = torch.empty(n, st.H, dtype=ctx.y_dtype, device=g.device)
            exchange(st, recv, send[:n], False)
            full = torch.zeros(st.L * st.cap + st.blk, st.H, dtype=ctx.y_dtype, device=g.device)
            full.index_copy_(0, h.xpos, recv)
            gy = full[: st.L * st.cap].view(st.L, st.cap, st.H)
        return gy, gw, None
