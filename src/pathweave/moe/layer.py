"""``MoEAllToAll``: expert-parallel dispatch and combine on the multi-path data plane.

One object per MoE layer shape (experts, top-k, hidden size, token budget,
payload dtype), shared by every call of that layer. A call is:

1. **metadata**: every rank checks its arguments and writes, in one
   ``int64`` row, any local problem, its token count, a digest of its
   routing table and the pairs it sends to each expert; one small exchange
   gives every rank every row, so all ranks raise the same error for bad
   input (:mod:`pathweave.moe._checks`) and agree on every size and offset
   (:mod:`pathweave.moe.routing`) before any data moves;
2. **pack**: the rows to send (token payload as bytes, block scales, the
   source token id, in ``compact`` layout the local expert ids) are
   gathered into one byte buffer in the documented order;
3. **move**: one :func:`pathweave.distributed.all_to_all_single` with the
   exact split sizes and the split matrix from step 1 (so the data plane
   skips its own exchange); a hot expert's bytes are spread over the
   fabric's relay and rail paths by the :class:`~pathweave.Orchestrator`;
4. **unpack**: rows land in ``expert_x`` grouped by local expert
   (``expert-major``) or stay grouped by source rank (``compact``).

Combine exchanges one more small row (guardrails), sends each expert output
row back to its source rank (every rank of the source's DP group) with one
more ``all_to_all_single``, and sums the
``k`` contributions of each token in float32 in top-k slot order.

Routing (checks, send order, return order, packing) runs with torch ops on
the tensor's device; the only device-to-host copy of a call is its row of
counts. Both directions are differentiable: the backward of dispatch is a
combine of the gradients and that of combine a dispatch of them (plus the
router weights' gradients), each one more exchange through the data plane.

Byte buffers used only inside a call are kept and reused: first-touch page
faults of freshly allocated buffers cost more than the copies themselves.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from pathweave import _check
from pathweave._cache import Cache
from pathweave.moe import _checks as C
from pathweave.moe import _lowlat as LL
from pathweave.moe import _pack as P
from pathweave.moe import routing as R
from pathweave.moe._checks import (
    PROBLEM_WORDS,
    ArgProblem,
    check_config,
    check_handle_ids,
    check_same_layer,
    dtype_code,
    dtype_name,
    raise_first,
)
from pathweave.moe._pool import Pool
from pathweave.moe._work import CombineWork, DispatchWork, MoEHandle
from pathweave.runtime.executor import group_rank_size, start_row_exchange

__all__ = ["CombineWork", "DispatchWork", "MoEAllToAll", "MoEHandle"]



class MoEAllToAll:
    """Dispatch tokens to their experts and combine the experts' outputs, over many paths.

    Every rank of ``group`` builds one with the same arguments and calls
    :meth:`dispatch` and :meth:`combine` in the same order.

    Parameters
    ----------
    num_experts
        Experts ``E`` of the layer, over all ranks.
    experts_per_token
        Top-k ``k``: columns of ``topk_idx``.
    hidden_dim
        Row length ``H`` of ``x`` (and of the expert outputs).
    max_num_tokens
        Most tokens ``m`` a rank dispatches in one call.
    dtype
        dtype of ``x`` (e.g. ``torch.bfloat16``; ``torch.uint8`` for fp8
        payloads with ``x_scale``).
    group
        Process group (``None``: the default group); ``W`` ranks.
    dp_size
        Ranks per DP group: ranks ``g*dp_size .. g*dp_size+dp_size-1`` hold
        identical tokens; each (token, expert) pair is sent once per group
        (member ``d`` sends the tokens ``i`` with ``i % dp_size == d``) and
        every member receives the combined result.
    orchestrator
        :class:`~pathweave.Orchestrator` that moves the bytes (default: the
        group's default, see :mod:`pathweave.distributed`).
    layout
        ``"expert-major"``: ``expert_x`` is ``[L, capacity, H]`` (as
        pplx-kernels and DeepEP's low-latency mode); ``"compact"``: one row
        per (token, destination rank), grouped by source rank (as DeepEP's
        normal mode).
    placement
        Rank of each expert (length ``E``); default ``E / W`` experts per
        rank in order (expert ``e`` on rank ``e // (E / W)``). Local experts
        of a rank are numbered in increasing global id.
    expert_capacity
        Rows per local expert in ``expert_x`` (expert-major);
        default ``max_num_tokens * W / dp_size``, which no routing exceeds.
        A smaller value saves memory; a call that would exceed it raises on
        every rank before data moves (in ``"low_latency"`` mode only with
        ``debug_checks``: see there).
    mode
        ``"normal"``: every call checks its arguments on every rank and moves
        exact-size buffers (sizes read back to the host). ``"low_latency"``
        (decode): fixed-shape buffers sized by ``max_num_tokens``, counts
        travelling with the data on the device, no host sync and no metadata
        exchange, so a dispatch + combine can be captured in a CUDA graph;
        both layouts (compact: ``expert_x`` is ``[W * max_num_tokens, H]``,
        the grouped pairs and their offsets are device tensors), DP groups
        and ``x_scale``; ``hidden_dim * itemsize`` a multiple of 8 bytes.
        Its contract is pplx-kernels': ids in ``[-1, E)`` without repeats,
        no expert over ``expert_capacity``, scales of one width (or none) on
        every rank and call, DP members with identical tokens, the same
        autograd path on every rank; nothing checks it on the device
        (:mod:`pathweave.moe._lowlat`).
    debug_checks
        ``"low_latency"`` only: check that contract on every call (host
        syncs and one small exchange; every rank raises the same error).

    Examples
    --------
    >>> from pathweave.runtime.launch import run_local
    >>> from pathweave.moe.layer import _doc_example
    >>> run_local(_doc_example, 2)
    [[2, 2], [2, 2]]
    """

    def __init__(
        self,
        num_experts: int,
        experts_per_token: int,
        hidden_dim: int,
        max_num_tokens: int,
        dtype: torch.dtype,
        group: Any = None,
        dp_size: int = 1,
        orchestrator: Any = None,
        layout: str = "expert-major",
        *,
        placement: Sequence[int] | np.ndarray | None = None,
        expert_capacity: int | None = None,
        mode: str = "normal",
        debug_checks: bool = False,
    ):
        self.num_experts = _check.integer("num_experts", num_experts, minimum=1)
        self.experts_per_token = _check.integer("experts_per_token", experts_per_token, minimum=1)
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"experts_per_token ({experts_per_token}) must be <= num_experts ({num_experts})"
            )
        self.hidden_dim = _check.integer("hidden_dim", hidden_dim, minimum=1)
        self.max_num_tokens = _check.integer("max_num_tokens", max_num_tokens, minimum=1)
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        if dtype_code(dtype) == 0 or dtype.is_complex or dtype == torch.bool:
            raise TypeError(f"dtype {dtype} is not supported as a payload dtype")
        self.dtype = dtype
        if layout not in R.LAYOUTS:
            raise ValueError(f"layout must be one of {R.LAYOUTS}, got {layout!r}")
        self.layout = layout
        if orchestrator is not None:
            from pathweave.runtime.orchestrator import Orchestrator

            if not isinstance(orchestrator, Orchestrator):
                raise TypeError(
                    "orchestrator must be a pathweave.Orchestrator, got "
                    f"{type(orchestrator).__name__}"
                )
        self.orchestrator = orchestrator
        self.group = group
        self.rank, self.num_ranks = group_rank_size(group)
        self.dp_size = _check.integer("dp_size", dp_size, minimum=1)
        if self.num_ranks % self.dp_size:
            raise ValueError(
                f"dp_size ({dp_size}) must divide the group size ({self.num_ranks})"
            )
        self.num_dp_groups = self.num_ranks // self.dp_size
        if placement is None:
            place = R.default_placement(self.num_experts, self.num_ranks)
        else:
            place = np.asarray(placement)
            if place.shape != (self.num_experts,) or place.dtype.kind not in "iu":
                raise ValueError(
                    f"placement must be {self.num_experts} integer ranks (one per expert), got "
                    f"shape {place.shape} dtype {place.dtype}"
                )
            place = place.astype(np.int64)
            _check.indices("placement", place, self.num_ranks, "a rank of the group")
        self.placement = place
        self.placement.setflags(write=False)
        self.local_index, self.experts_per_rank = R.local_experts(place, self.num_ranks)
        self.local_expert_ids = np.flatnonzero(place == self.rank)
        self.num_local_experts = int(self.local_expert_ids.size)
        worst = self.max_num_tokens * self.num_dp_groups
        self.expert_capacity = worst if expert_capacity is None else _check.integer(
            "expert_capacity", expert_capacity, minimum=1
        )
        self._member = self.rank % self.dp_size
        self._group_first = self.rank - self._member
        self._fields = {
            "k": self.experts_per_token,
            "E": self.num_experts,
            "H": self.hidden_dim,
            "max_m": self.max_num_tokens,
            "cap": self.expert_capacity,
        }
        self._pool = Pool()
        self._dev_tables: Cache[Any] = Cache(8)  # per device: its tables, its grid
        # Every parameter that shapes the exchange: checked across ranks once per layer
        # (a fingerprint has a fixed width, so a rank with another num_experts cannot
        # desize the gather), then its digest rides in every call's row.
        self._config_row = C.config_fingerprint(self)
        self._config_digest = R.fingerprint(self._config_row.reshape(1, -1))
        self._config_checked = False
        self._dispatches = 0  # call id of the next dispatch
        self.scale_block = 128
        self.mode = _check_mode(self, mode)
        self.debug_checks = bool(debug_checks)
        self._ll_states: dict[tuple[torch.device, int], Any] = {}

    def __repr__(self) -> str:
        return (
            f"MoEAllToAll(num_experts={self.num_experts}, experts_per_token="
            f"{self.experts_per_token}, hidden_dim={self.hidden_dim}, max_num_tokens="
            f"{self.max_num_tokens}, dtype={self.dtype}, ranks={self.num_ranks}, "
            f"dp_size={self.dp_size}, layout={self.layout!r}, mode={self.mode!r})"
        )

    # ------------------------------------------------------------ helpers
    def _check_config(self) -> None:
        """Compare every rank's layer parameters (once per layer; raises on every rank)."""
        if not self._config_checked:
            check_config(self._exchange(self._config_row)())
            self._config_checked = True

    def _exchange(self, row: np.ndarray, like: Any = None) -> Any:
        """Start an all-gather of one ``int64`` row per rank; returns a function that waits.

        The data plane's row exchange
        (:func:`pathweave.runtime.executor.start_row_exchange`: gather and
        broadcast on gloo, an all-gather on NCCL), bounded by the
        orchestrator's ``timeout_s``. The caller packs while the rows travel.

        With ``like`` (an argument of the call, :meth:`_plane`) the row also
        carries the data plane's state words
        (:func:`pathweave.distributed.plane_words`), which its calls with
        ``split_matrix`` do not exchange themselves: the group learns from
        the layer's transfers as from any other call's, and ranks out of
        step raise. ``wait()`` returns the rows without them.
        """
        from pathweave import distributed as pwd
        orch = self.orchestrator or pwd.default_orchestrator(self.group)
        deadline = time.monotonic() + orch.timeout_s
        if like is None:
            return start_row_exchange(row, self.group, deadline=deadline)
        plane = self._plane(like)
        tail = pwd.plane_words(self.group, **plane)
        wait = start_row_exchange(np.concatenate([row, tail]), self.group, deadline=deadline)

        def rows() -> np.ndarray:
            meta = wait()
            pwd.absorb_plane_words(meta[:, row.size :], self.group, **plane)
            return np.ascontiguousarray(meta[:, : row.size])

        return rows

    def _a2a(
        self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
        in_splits: list[int], async_op: bool, split_matrix: np.ndarray | None = None,
        digests: np.ndarray | None = None,
    ) -> Any:
        from pathweave import distributed as pwd

        # The split matrix and every rank's config digest come from this layer's
        # own metadata exchange (the same on every rank): the data plane skips its
        # exchange, and still raises on every rank if the configurations differ.
        return pwd.all_to_all_single(
            out, inp, out_splits, in_splits, group=self.group, async_op=async_op,
            orchestrator=self.orchestrator, split_matrix=split_matrix, config_digests=digests,
        )

    def _plane(self, like: Any) -> dict[str, Any]:
        """The data plane's orchestrator and device for a call with argument ``like``
        (a tensor's device; the CPU for anything else)."""
        dev = like.device if isinstance(like, torch.Tensor) else "cpu"
        return {"orchestrator": self.orchestrator, "device": dev}

    def _plane_digest(self, like: Any) -> int:
        """This rank's config digest of the data plane's calls (tensors on ``like``'s device)."""
        from pathweave import distributed as pwd

        return pwd.config_digest(self.group, **self._plane(like))

    def _tables(self, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Placement, local index and expert order as ``int64`` tensors on ``dev`` (cached)."""
        return self._dev_tables.get_or_build(  # type: ignore[no-any-return]
            dev, lambda: tuple(
                torch.from_numpy(np.array(a, dtype=np.int64)).to(dev)
                for a in (self.placement, self.local_index, R.expert_order(self.placement))
            ))

    def _grid(self, dev: torch.device) -> tuple[torch.Tensor, ...]:
        """Token, slot and position of every entry of a ``[max_num_tokens, k]`` table on
        ``dev`` (cached; :func:`~pathweave.moe.routing.pair_grid`)."""
        m, k = self.max_num_tokens, self.experts_per_token
        return self._dev_tables.get_or_build(  # type: ignore[no-any-return]
            (dev, "grid"), lambda: R.pair_grid(m, k, dev))

    def _local_plan(
        self, x: torch.Tensor, topk_idx: torch.Tensor
    ) -> tuple[R.SendPlan, np.ndarray, torch.Tensor]:
        """This rank's send plan (untrimmed), its counts, read back in one transfer, and
        combine's row for each slot (:func:`~pathweave.moe.routing.return_slots`).

        ``counts``: the routing check (:func:`~pathweave.moe.routing.check_topk`'s
        two words), pairs per expert, rows per rank and, with DP groups, the
        routing digest (only members of one compare theirs): the only numbers
        of a call that cross from the device to the host.
        """
        place, local, order = self._tables(x.device)
        idx = topk_idx.to(torch.int64)
        pairs = R.flat_pairs(idx, self.num_experts, self._grid(x.device))
        plan = R.send_plan(idx, place, local, order, self.num_ranks, layout=self.layout,
                           dp_size=self.dp_size, member=self._member, pairs=pairs)
        slot_pos = plan.ret_row
        if slot_pos is None:
            slot_pos = R.return_slots(idx, place, order, layout=self.layout,
                                      dp_size=self.dp_size, pairs=pairs)
        parts = [R.check_topk(idx, self.num_experts, pairs), plan.pairs_per_expert,
                 plan.rows_per_rank]
        if self.dp_size > 1:
            parts.append(R.routing_digest(idx).view(1))
        counts = torch.cat(parts).cpu().numpy()
        if self.dp_size == 1:
            counts = np.append(counts, 0)
        code, i, j, v = R.topk_problem(counts[:2], *idx.shape)
        if code:
            raise ArgProblem(108 if code == 1 else 109, i, j, v)
        return plan, counts, slot_pos

    # ------------------------------------------------------------ dispatch
    def dispatch(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        x_scale: torch.Tensor | None = None,
        *,
        async_op: bool = False,
        stream: Any = None,
    ) -> Any:
        """Send every token to the ranks of its experts.

        Differentiable with respect to ``x`` (a floating payload): the
        backward sends each row's gradient back to its source and sums a
        token's rows there in float32, in slot order.

        Parameters
        ----------
        x
            ``[m, H]`` tokens of this rank, ``m <= max_num_tokens``, dtype
            ``self.dtype``.
        topk_idx
            ``[m, k]`` integer expert ids on ``x``'s device; -1 means "no
            expert" (skipped). A token may not name the same expert twice.
        x_scale
            Optional ``[m, S]`` float32 per-token block scales (fp8 payloads:
            ``S = ceil(H / 128)``), carried with their rows; all ranks pass
            scales or none do, with the same ``S``.
        async_op
            Return a :class:`DispatchWork` at once; its ``wait()`` gives the
            result. Metadata and checks still complete before the call
            returns, so errors are raised here. The send half runs here,
            the receive half in ``wait()`` (pplx-kernels' ``do_send`` /
            ``do_recv``).
        stream
            CUDA only: the stream both halves are enqueued on (default: the
            current stream); the work's ``event`` marks the end of the send
            half. Must be ``None`` for CPU tensors.

        Returns
        -------
        expert_x
            ``expert-major``: ``[L, expert_capacity, H]``; rows
            ``[0, expert_num_tokens[l])`` of expert ``l`` are valid, grouped
            by source rank, then in the source's token order (the rest is
            unspecified). ``compact``: ``[R, H]``, one row per (token, this
            rank), grouped by source rank, then token.
        expert_num_tokens
            ``int64[L]`` on ``x``'s device: tokens received per local expert.
        handle
            :class:`MoEHandle` for :meth:`combine` (scales, source ids, and
            in compact layout the local expert ids per row).

        Raises
        ------
        TypeError, ValueError
            Bad arguments on any rank: raised on every rank, naming the
            rank and the values, before any data moves.
        """
        with _on_stream(stream, x) as event:
            if self.mode == "low_latency":
                return _recorded(LL.dispatch(self, x, topk_idx, x_scale, async_op), event)
            return _recorded(self._dispatch_normal(x, topk_idx, x_scale, async_op), event)

    def _dispatch_normal(self, x: torch.Tensor, topk_idx: torch.Tensor,
                         x_scale: torch.Tensor | None, async_op: bool) -> Any:
        self._check_config()
        n = self.num_ranks
        E = self.num_experts
        err = np.zeros(PROBLEM_WORDS, dtype=np.int64)
        cols, plan, counts, slot_pos = -1, None, None, None
        try:
            cols = C.check_dispatch(self, x, topk_idx, x_scale)
            plan, counts, slot_pos = self._local_plan(x, topk_idx)
        except ArgProblem as exc:
            err = exc.words()
            plan = None
        # Row: problem | layer digest, m, routing digest, scale columns, needs grad, data
        # plane's config digest | pairs per expert | rows per rank.
        c0 = PROBLEM_WORDS + 6
        row = np.zeros(c0 + E + n, dtype=np.int64)
        row[:PROBLEM_WORDS] = err
        row[PROBLEM_WORDS] = self._config_digest
        row[PROBLEM_WORDS + 5] = self._plane_digest(x)
        if plan is not None and counts is not None:
            grad = torch.is_grad_enabled() and x.requires_grad
            row[PROBLEM_WORDS + 1 : PROBLEM_WORDS + 5] = (int(x.shape[0]), counts[-1], cols,
                                                          int(grad))
            row[c0:] = counts[2:-1]
            plan = plan.trim(int(counts[2 + E : -1].sum()), int(counts[2 : 2 + E].sum()))
        wait = self._exchange(row, x)
        packed = (
            None if plan is None else P.pack_dispatch(self, x, x_scale, plan, cols, row[c0 + E :])
        )
        meta = wait()
        check_same_layer(meta[:, PROBLEM_WORDS], "dispatch")
        raise_first(meta, self._fields)
        ms, digests, scols = (meta[:, PROBLEM_WORDS + i] for i in (1, 2, 3))
        pairs = meta[:, c0 : c0 + E]  # [src, expert]
        rows = meta[:, c0 + E :]  # [src, dst]
        C.check_global(self, ms, digests, scols, pairs)
        assert plan is not None and packed is not None and slot_pos is not None
        grad = bool(meta[:, PROBLEM_WORDS + 4].any())  # every rank joins the backward, or none
        digests = meta[:, PROBLEM_WORDS + 5].copy()
        return self._dispatch_data(x, slot_pos, plan, pairs, rows, cols, packed, async_op, grad,
                                   digests)

    def _dispatch_data(
        self, x: torch.Tensor, slot_pos: torch.Tensor, plan: R.SendPlan, pairs: np.ndarray,
        rows: np.ndarray, cols: int, send: torch.Tensor, async_op: bool, grad: bool,
        digests: np.ndarray,
    ) -> Any:
        n, H = self.num_ranks, self.hidden_dim
        dev = x.device
        compact = self.layout == "compact"
        k = self.experts_per_token
        hb, mb, row_bytes = P.row_bytes(self, x, cols)
        S = cols if cols > 0 else 0
        send_splits = [int(v) for v in rows[self.rank]]
        recv_counts = rows[:, self.rank]
        recv_splits = [int(v) for v in recv_counts]
        n_recv = int(recv_counts.sum())
        recv = self._pool.get("d_recv", n_recv, row_bytes, dev)

        local = self.local_expert_ids
        block = pairs[:, local]  # [src, local expert]
        expert_num_tokens = block.sum(axis=0).astype(np.int64)
        handle = MoEHandle(
            owner=self, layout=self.layout, call_id=self._dispatches, num_tokens=int(x.shape[0]),
            expert_num_tokens=expert_num_tokens,
            recv_src_rank=np.repeat(np.arange(n, dtype=np.int64), recv_counts),
            send_splits=send_splits, recv_splits=recv_splits, split_matrix=rows.copy(),
            config_digests=digests,
            send_slot_row=plan.slot_row,
        )
        self._dispatches += 1
        handle.slot_pos = slot_pos
        if not compact:
            handle.positions = R.expert_major_positions(block, self.expert_capacity)
            handle.positions_t = P.i64(handle.positions, dev)
            self._combine_send_tables(handle, handle.positions_t, recv_counts)

        def finish() -> tuple[torch.Tensor, torch.Tensor, MoEHandle]:
            self._pool.busy.discard("d_send")
            self._pool.busy.discard("d_recv")
            move = P.move_dtype(hb, mb)
            chunks = P.chunks(self, recv, recv_counts, hb, mb, move)
            meta8 = torch.cat([m for _, m in chunks]) if n_recv else None
            meta = None if meta8 is None else meta8.view(torch.int32)  # [n_recv, mb / 4]
            handle.recv_src_token = (
                meta[:, S] if meta is not None  # int32 (read by expert_src only)
                else torch.zeros(0, dtype=torch.int64, device=dev)
            )
            starts = np.concatenate(([0], np.cumsum(recv_counts)))
            if compact:
                expert_x = torch.empty(n_recv, H, dtype=self.dtype, device=dev)
                for s_, (payload, _) in enumerate(chunks):
                    if payload is not None:
                        expert_x[starts[s_] : starts[s_ + 1]].view(move).copy_(
                            payload
                        )
                if S:
                    handle.expert_x_scale = (
                        meta[:, :S].contiguous().view(torch.float32) if meta is not None
                        else torch.empty(0, S, dtype=torch.float32, device=dev)
                    )
                ids = (
                    meta[:, S + 1 : S + 1 + k].to(torch.int64) if meta is not None
                    else torch.empty(0, k, dtype=torch.int64, device=dev)
                )
                self._compact_tables(handle, ids, block)
            else:
                L, cap = self.num_local_experts, self.expert_capacity
                expert_x = torch.empty(L, cap, H, dtype=self.dtype, device=dev)
                flat = expert_x.view(move).view(L * cap, hb // move.itemsize)
                scale = None
                if S:
                    scale = torch.empty(L, cap, S, dtype=torch.float32, device=dev)
                    handle.expert_x_scale = scale
                pos_t = handle.positions_t
                assert pos_t is not None
                for s_, (payload, mview) in enumerate(chunks):
                    if payload is None:
                        continue
                    p = pos_t[starts[s_] : starts[s_ + 1]]
                    flat.index_copy_(0, p, payload)
                    if scale is not None:
                        P.byte_rows(scale, L * cap, 4 * S).index_copy_(0, p, mview[:, : 4 * S])
            if grad:
                src = x if x.requires_grad else x.detach().requires_grad_()
                expert_x = _DispatchGrad.apply(src, (self, handle, expert_x))
            return expert_x, torch.from_numpy(expert_num_tokens).to(dev), handle

        # Combine returns each source's pairs to every member of its DP group:
        # rank r sends rank t the pairs of t's group members on r's experts.
        on_rank = np.zeros((self.placement.size, n), dtype=np.int64)
        on_rank[np.arange(self.placement.size), self.placement] = 1
        to_rank = pairs.astype(np.int64) @ on_rank  # [src, expert rank]
        grp = np.arange(n) - np.arange(n) % self.dp_size
        member_sum = np.zeros((n, n), dtype=np.int64)
        np.add.at(member_sum, grp, to_rank)  # [group first, expert rank]
        handle.ret_matrix = member_sum[grp].T.copy()  # [expert rank r, destination t]
        handle.ret_recv_splits = [int(v) for v in handle.ret_matrix[:, self.rank]]
        work = self._a2a(recv, send, recv_splits, send_splits, async_op, split_matrix=rows,
                         digests=digests)
        if not async_op:
            return finish()
        self._pool.busy.update(("d_send", "d_recv"))
        return DispatchWork(work, finish)

    def _dispatch_backward(self, grad: torch.Tensor, handle: MoEHandle) -> torch.Tensor:
        """Gradient of ``x``: every received row's gradient back to its source (the
        transposed exchange), a token's rows summed in float32 in slot order."""
        H = self.hidden_dim
        dev = grad.device
        if self.layout == "compact":
            rows = grad.contiguous()
        else:
            assert handle.positions_t is not None
            rows = grad.reshape(-1, H).index_select(0, handle.positions_t)
        back = torch.empty(sum(handle.send_splits), H, dtype=grad.dtype, device=dev)
        assert handle.split_matrix is not None
        self._a2a(back, rows, handle.send_splits, handle.recv_splits, False,
                  split_matrix=handle.split_matrix.T.copy(), digests=handle.config_digests)
        assert handle.send_slot_row is not None
        return _slot_sum(back, handle.send_slot_row, None, handle.num_tokens, H).to(self.dtype)

    # ------------------------------------------------------------ tables
    def _combine_send_tables(
        self, handle: MoEHandle, pair_pos: torch.Tensor, pairs_from: np.ndarray
    ) -> None:
        """What this rank sends back in combine.

        ``pair_pos``: row of (flattened) ``expert_y`` of every pair, in
        return order, grouped by source rank; ``pairs_from[s]``: pairs
        received from source ``s``. Rank ``t`` gets the pairs of every
        member of its DP group, members in rank order.
        """
        n, dp = self.num_ranks, self.dp_size
        starts = np.concatenate(([0], np.cumsum(pairs_from)))
        if dp == 1:
            handle.ret_gather = pair_pos
            handle.ret_send_splits = [int(v) for v in pairs_from]
            return
        parts, splits = [], []
        for t in range(n):
            lo = t - t % dp
            parts.append(pair_pos[int(starts[lo]) : int(starts[lo + dp])])
            splits.append(int(starts[lo + dp] - starts[lo]))
        handle.ret_gather = torch.cat(parts)
        handle.ret_send_splits = splits

    def _compact_tables(self, handle: MoEHandle, ids: torch.Tensor, block: np.ndarray) -> None:
        """Pairs of the received compact rows: expert-grouped order and return order.

        One sort of the received expert ids on their device; the sizes come
        from the counts (``block[s, l]``: pairs from source ``s`` for local
        expert ``l``).
        """
        handle.expert_ids = ids
        k = ids.shape[1]
        flat = ids.reshape(-1)
        valid = flat >= 0
        P = handle.num_pairs
        # By local expert, then (row, slot): a stable sort of the ids, -1 (as L) last.
        L = self.num_local_experts
        grouped = torch.sort(torch.remainder(flat, L + 1), stable=True).indices[:P]
        handle.expert_rows = grouped // max(k, 1)
        handle.expert_offsets = np.concatenate(
            ([0], np.cumsum(handle.expert_num_tokens))
        ).astype(np.int64)
        # Return order is (row, slot) ascending; where each returned pair sits when grouped.
        # (A valid pair's 1-based rank among the valid ones is its return position + 1.)
        ret_index = valid.cumsum(0, dtype=torch.int64)
        where = torch.empty(P + 1, dtype=torch.int64, device=ids.device)
        where.scatter_(0, ret_index[grouped], torch.arange(P, device=ids.device))
        self._combine_send_tables(handle, where[1:], block.sum(axis=1))

    # ------------------------------------------------------------ combine
    def combine(
        self,
        expert_y: torch.Tensor,
        handle: MoEHandle,
        topk_weights: torch.Tensor | None = None,
        weighted: bool = True,
        *,
        async_op: bool = False,
        stream: Any = None,
    ) -> Any:
        """Return every expert output row to its source and sum each token's ``k`` rows.

        ``out[i] = sum_j w[i, j] * y(expert topk_idx[i, j] of token i)`` over the
        slots ``j`` with an expert, accumulated in float32 in slot order
        ``j = 0, 1, ..`` (deterministic) and cast to ``expert_y``'s dtype;
        ``weighted=False`` gives the plain sum. Tokens with no expert get 0.
        With ``dp_size > 1`` every rank of a DP group gets the result for all
        of the group's tokens.

        Differentiable with respect to ``expert_y`` and ``topk_weights``:
        the backward sends each output row's gradient (times its weight) back
        to the expert's rank through the transposed exchange, and the weight
        gradients are float32 dot products at the source. Every rank must
        run the backward if any does (the exchange is collective).

        Parameters
        ----------
        expert_y
            ``expert-major``: ``[L, expert_capacity, H]`` like ``expert_x``
            (only the valid rows are read). ``compact``: ``[P, H]``, one row
            per (row, local expert) pair in the order of
            ``handle.expert_rows`` (grouped by local expert). A floating
            dtype, the same on every rank.
        handle
            The handle of the dispatch these outputs answer.
        topk_weights
            ``[m, k]`` router weights (any floating dtype; used as float32);
            needed when ``weighted``.
        weighted
            Multiply each row by its weight before summing.
        async_op
            Return a :class:`CombineWork` whose ``wait()`` gives ``out``.
        stream
            As for :meth:`dispatch`.

        Returns
        -------
        out
            ``[m, H]`` in ``expert_y``'s dtype, or a :class:`CombineWork`.
        """
        with _on_stream(stream, expert_y) as event:
            if self.mode == "low_latency":
                return _recorded(LL.combine(self, expert_y, handle, topk_weights, weighted,
                                            async_op), event)
            return _recorded(self._combine_normal(expert_y, handle, topk_weights, weighted,
                                                  async_op), event)

    def _combine_normal(self, expert_y: torch.Tensor, handle: MoEHandle,
                        topk_weights: torch.Tensor | None, weighted: bool,
                        async_op: bool) -> Any:
        self._check_config()
        err = np.zeros(PROBLEM_WORDS, dtype=np.int64)
        try:
            w = C.check_combine(self, expert_y, handle, topk_weights, weighted)
        except ArgProblem as exc:
            err = exc.words()
            w = None
        # Row: problem | expert_y dtype | layer digest | the handle's dispatch call id | needs
        # grad | data plane's config digest.
        row = np.zeros(PROBLEM_WORDS + 5, dtype=np.int64)
        row[:PROBLEM_WORDS] = err
        row[PROBLEM_WORDS + 1] = self._config_digest
        row[PROBLEM_WORDS + 4] = self._plane_digest(expert_y)
        grad = False
        if not err[0]:
            row[PROBLEM_WORDS] = dtype_code(expert_y.dtype)
            row[PROBLEM_WORDS + 2] = handle.call_id
            grad = torch.is_grad_enabled() and (
                expert_y.requires_grad or (w is not None and w.requires_grad)
            )
            row[PROBLEM_WORDS + 3] = int(grad)
        wait = self._exchange(row, expert_y)
        send = None if err[0] else P.pack_combine(self, expert_y, handle, grad)
        meta = wait()
        check_same_layer(meta[:, PROBLEM_WORDS + 1], "combine")
        raise_first(meta, self._fields)
        check_handle_ids(meta[:, PROBLEM_WORDS + 2])
        codes = meta[:, PROBLEM_WORDS]
        if (codes != codes[0]).any():
            r = int(np.flatnonzero(codes != codes[0])[0])
            raise TypeError(
                f"expert_y has dtype {dtype_name(int(codes[0]))} on rank 0 but "
                f"{dtype_name(int(codes[r]))} on rank {r}; it must be the same on every rank"
            )
        assert send is not None
        handle.combined = True
        if bool(meta[:, PROBLEM_WORDS + 3].any()) and not grad:
            # A peer needs the backward: join its graph with a stand-in leaf.
            send = send.detach().clone().requires_grad_()
            grad = True
        handle.ret_digests = meta[:, PROBLEM_WORDS + 4].copy()
        return self._combine_data(expert_y, handle, w, send, async_op, grad)

    def _combine_data(
        self, expert_y: torch.Tensor, handle: MoEHandle, w: torch.Tensor | None,
        send: torch.Tensor, async_op: bool, grad: bool,
    ) -> Any:
        from pathweave.nn.functional import attach

        H = self.hidden_dim
        dev = expert_y.device
        dt = expert_y.dtype
        n_recv = int(sum(handle.ret_recv_splits))
        if grad:  # saved for the weight gradients: never a reused buffer
            recv = torch.empty(n_recv, H, dtype=dt, device=dev)
            padded = recv
        else:  # one more row of zeros: what slots without an expert read
            buf = self._pool.get("c_recv", n_recv + 1, H * expert_y.element_size(), dev)
            padded = buf.view(dt).view(n_recv + 1, H)
            padded[n_recv].zero_()
            recv = padded[:n_recv]
        m = handle.num_tokens

        def finish() -> torch.Tensor:
            self._pool.busy.discard("c_send")
            self._pool.busy.discard("c_recv")
            assert handle.slot_pos is not None
            if grad:
                ys = attach(recv, send, handle.ret_recv_splits, handle.ret_send_splits,
                            self.group, orchestrator=self.orchestrator,
                            split_matrix=handle.ret_matrix, config_digests=handle.ret_digests)
                out = _slot_sum(ys, handle.slot_pos, w, m, H)
            else:
                out = _slot_sum(padded, handle.slot_pos, w, m, H, self._pool, zero_row=n_recv)
            return out if dt == torch.float32 else out.to(dt)

        work = self._a2a(recv, send.detach(), handle.ret_recv_splits, handle.ret_send_splits,
                         async_op, split_matrix=handle.ret_matrix, digests=handle.ret_digests)
        if not async_op:
            return finish()
        self._pool.busy.update(("c_send", "c_recv"))
        return CombineWork(work, finish)


MODES = ("normal", "low_latency")


def _check_mode(layer: MoEAllToAll, mode: str) -> str:
    """``mode``, or a clear error for it or for a setting the low-latency mode lacks."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "low_latency":
        es = torch.empty(0, dtype=layer.dtype).element_size()
        if (layer.hidden_dim * es) % 8 != 0:
            raise ValueError(f"mode='low_latency' does not support hidden_dim={layer.hidden_dim}"
                             f" with {es}-byte {layer.dtype} (rows must be a multiple of 8 "
                             "bytes)")
    return mode


class _on_stream:
    """Run a call on ``stream`` (CUDA tensors only); yields an event to record, or None."""

    def __init__(self, stream: Any, like: Any):
        self.ctx = None
        self.event = None
        if stream is None:
            return
        dev = getattr(like, "device", None)
        if dev is None or dev.type != "cuda":
            raise ValueError(f"stream is for CUDA tensors; the tensors are on {dev}")
        if not isinstance(stream, torch.cuda.Stream):
            raise TypeError(f"stream must be a torch.cuda.Stream, got {type(stream).__name__}")
        self.ctx = torch.cuda.stream(stream)
        self.event = torch.cuda.Event()

    def __enter__(self) -> Any:
        if self.ctx is not None:
            self.ctx.__enter__()
        return self.event

    def __exit__(self, *exc: Any) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(*exc)


def _recorded(result: Any, event: Any) -> Any:
    """``result``, with ``event`` recorded on the current stream and set on a work object."""
    if event is not None:
        event.record()
        if hasattr(result, "event"):
            result.event = event
    return result


#: Most bytes of the temporaries with which :func:`_slot_sum` weighs a group of slots at
#: once (64 MiB: all of 128 tokens' top-8 slots at hidden 7168 in bf16 take 44 MiB).
SLOT_SUM_BATCH_BYTES = 64 << 20


def _slot_sum(
    rows: torch.Tensor, slot_row: torch.Tensor, w: torch.Tensor | None, m: int, H: int,
    pool: Pool | None = None, zero_row: int | None = None,
) -> torch.Tensor:
    """``out[i] = sum_j w[i, j] * rows[slot_row[i, j]]`` over slots with a row, in float32.

    Slots are added in order ``j = 0, 1, ..`` (fixed, so the bits are the
    same on every run and every device); differentiable in ``rows`` and
    ``w``. An empty ``rows`` still joins the result's graph, so the
    backward's collective runs on every rank.

    Without gradients the caller may pass ``zero_row``, the index of the
    last row of ``rows``, a row of zeros: slots without a row read it
    (adding ``+-0.0`` leaves the sum's bits alone; ``-1 mod (zero_row + 1)``
    names it in one operation) instead of being masked, and the
    temporaries come from ``pool`` (fresh buffers would cost a page fault
    per page, more than the arithmetic). Then the rows of as many slots as
    fit :data:`SLOT_SUM_BATCH_BYTES` (all of a decode step's, at least one)
    are gathered, cast and weighted at once: a few operations per group of
    slots instead of four per slot, each a kernel launch on a GPU. The
    additions run in slot order either way, and the sum starts as slot 0's
    row plus ``+0.0`` (the bits of ``0.0 + row``), so the bits are the same.
    """
    if rows.shape[0] == (0 if zero_row is None else 1) or m == 0:
        link = rows.sum().to(torch.float32) * 0
        acc = torch.zeros(m, H, dtype=torch.float32, device=rows.device)
        return acc + (link if w is None else link + w.sum() * 0)
    k = slot_row.shape[1]
    if zero_row is None or pool is None:
        acc = torch.zeros(m, H, dtype=torch.float32, device=rows.device)
        for j in range(k):
            pos = slot_row[:, j]
            part = rows.index_select(0, pos.clamp(min=0)).to(torch.float32)
            if w is not None:
                part = part * w[:, j : j + 1]
            acc = acc + part.masked_fill((pos < 0).unsqueeze(1), 0.0)
        return acc
    assert zero_row == rows.shape[0] - 1, (zero_row, rows.shape)
    f32 = rows.dtype == torch.float32  # gathered straight into the float32 temporaries
    es = 0 if f32 else rows.element_size()
    group = max(1, min(k, SLOT_SUM_BATCH_BYTES // (m * H * (es + 4))))
    out = None
    for j0 in range(0, k, group):
        pos = slot_row[:, j0 : j0 + group]
        g = pos.shape[1]
        part = pool.get("c_tmp32", m * g, 4 * H, rows.device).view(torch.float32)
        lo = part.view(m * g, H) if f32 else pool.get(
            "c_tmp", m * g, H * es, rows.device).view(rows.dtype).view(m * g, H)
        torch.index_select(rows, 0, pos.remainder(zero_row + 1).reshape(-1), out=lo)
        part = part.view(m, g, H)
        if not f32:
            part.copy_(lo.view(m, g, H))
        if w is not None:
            part.mul_(w[:, j0 : j0 + g].unsqueeze(2))
        for j in range(g):
            if out is None:
                out = part[:, j] + 0.0  # a fresh sum (the temporaries are reused)
            else:
                out.add_(part[:, j])
    assert out is not None
    return out


class _DispatchGrad(torch.autograd.Function):
    """Joins ``expert_x`` (moved outside autograd) to ``x``'s graph; backward: transposed move."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, box: tuple[Any, Any, torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        ctx.layer, ctx.handle, expert_x = box
        return expert_x

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return ctx.layer._dispatch_backward(grad, ctx.handle), None


def scale_columns(hidden_dim: int, block: int = 128) -> int:
    """Columns of per-token block scales: ``ceil(hidden_dim / block)``.

    >>> scale_columns(7168), scale_columns(100)
    (56, 1)
    """
    return math.ceil(hidden_dim / block)


def _doc_example(rank: int, world_size: int) -> list[int]:
    """Two ranks, four experts, top-2 (used by the class docstring)."""
    moe = MoEAllToAll(4, 2, 8, max_num_tokens=4, dtype=torch.float32)
    x = torch.full((2, 8), float(rank + 1))
    idx = torch.tensor([[0, 3], [1, 2]])
    expert_x, counts, handle = moe.dispatch(x, idx)
    y = expert_x * 2  # every "expert" doubles its input
    out = moe.combine(y, handle, torch.full((2, 2), 0.25))
    assert torch.equal(out, x), out  # 0.25 * 2x + 0.25 * 2x
    return counts.tolist()
