"""``MoEAllToAll``: expert-parallel dispatch and combine on the multi-path data plane.

One object per MoE layer shape (experts, top-k, hidden size, token budget,
payload dtype), shared by every call of that layer. A call is:

1. **metadata**: every rank checks its arguments and writes, in one
   ``int64`` row, any local problem, its token count, a digest of its
   routing table and the pairs it sends to each expert; one small exchange
   gives every rank every row, so all ranks raise the same error for bad
   input (:mod:`pathweave.moe._checks`) and agree on every size and offset
   (:mod:`pathweave.moe._routing`) before any data moves;
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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from pathweave.moe import _routing as R
from pathweave.moe._checks import (
    ERR_FIELDS,
    FLOAT_DTYPES,
    INDEX_DTYPES,
    MoEArgError,
    check_config,
    check_handle_ids,
    check_same_layer,
    dtype_code,
    dtype_name,
    raise_first,
    shape_nums,
    type_code,
)
from pathweave.runtime.executor import group_rank_size, start_row_exchange

__all__ = ["CombineWork", "DispatchWork", "MoEAllToAll", "MoEHandle"]

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_TAG_BYTES = 4  # source token id (int32) carried by every dispatched row
_ID_BYTES = 4  # one local expert id (int32) per top-k slot, compact layout only


def _byte_rows(t: torch.Tensor, rows: int, nbytes: int) -> torch.Tensor:
    """A contiguous tensor's bytes as ``uint8[rows, nbytes]`` (a view; empty tensors too)."""
    if t.numel() == 0:  # torch cannot reinterpret an empty tensor's dtype
        return torch.empty(rows, nbytes, dtype=torch.uint8, device=t.device)
    return t.view(torch.uint8).view(rows, nbytes)


def _dtype_ok(t: torch.Tensor, names: Sequence[str]) -> bool:
    return str(t.dtype).removeprefix("torch.") in names


def _i64(a: np.ndarray, device: torch.device) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


class _Pool:
    """Reusable byte buffers, one per role; a role in use by a pending call is never shared."""

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, torch.device], torch.Tensor] = {}
        self.busy: set[str] = set()

    def get(self, role: str, rows: int, row_bytes: int, device: torch.device) -> torch.Tensor:
        need = rows * row_bytes
        if role in self.busy:
            return torch.empty(rows, row_bytes, dtype=torch.uint8, device=device)
        buf = self._bufs.get((role, device))
        if buf is None or buf.numel() < need:
            buf = torch.empty(max(need, 1) * 5 // 4 + 64, dtype=torch.uint8, device=device)
            self._bufs[(role, device)] = buf
        return buf[:need].view(rows, row_bytes)


@dataclass(eq=False)
class MoEHandle:
    """What one dispatch recorded for its combine (and for the caller to inspect).

    Index tables are tensors on ``x``'s device (built there with torch ops);
    counts known from the metadata exchange are numpy arrays.

    Attributes
    ----------
    layout
        ``"expert-major"`` or ``"compact"``.
    call_id
        Which dispatch of the layer this is (0, 1, ...; the same on every
        rank); combine checks it in its metadata exchange.
    num_tokens
        Tokens ``m`` of this rank's ``x``.
    expert_num_tokens
        ``int64[L]`` (numpy): rows received per local expert.
    expert_x_scale
        Block scales that travelled with the rows (``float32``, shaped like
        ``expert_x`` with ``S`` columns instead of ``H``), or ``None``.
    expert_ids
        ``compact`` only: ``int64[R, k]`` tensor, the local expert of each
        top-k slot of each received row, -1 for slots served elsewhere.
    expert_rows, expert_offsets
        ``compact`` only: the (row, local expert) pairs grouped by local
        expert: pairs of expert ``l`` are ``expert_offsets[l]:expert_offsets[l+1]``
        (numpy) and ``expert_rows`` (``int64`` tensor) gives the row of
        ``expert_x`` of each. Combine takes one output row per pair in this
        order.
    """

    owner: Any
    layout: str
    call_id: int
    num_tokens: int
    expert_num_tokens: np.ndarray
    recv_src_rank: np.ndarray  # per received row, in arrival order (from the counts)
    recv_src_token: torch.Tensor | None = None  # per received row, from the rows' tags
    positions: np.ndarray | None = None  # expert-major: row of expert_x (flat) per received row
    expert_x_scale: torch.Tensor | None = None
    expert_ids: torch.Tensor | None = None
    expert_rows: torch.Tensor | None = None
    expert_offsets: np.ndarray | None = None
    # combine: what this rank sends back and what it receives
    ret_gather: torch.Tensor | None = None
    ret_send_splits: list[int] = field(default_factory=list)
    ret_recv_splits: list[int] = field(default_factory=list)
    # [r, t]: rows rank r returns to rank t in combine (every rank's, from dispatch's metadata)
    ret_matrix: np.ndarray | None = None
    # [m, k]: row of combine's receive buffer answering each slot, -1 for none
    slot_pos: torch.Tensor | None = None
    # dispatch's exchange, for its backward (the transposed exchange)
    send_splits: list[int] = field(default_factory=list)
    recv_splits: list[int] = field(default_factory=list)
    split_matrix: np.ndarray | None = None
    send_slot_row: torch.Tensor | None = None  # [m, k]: send row of each slot, -1 for none
    positions_t: torch.Tensor | None = None
    #: Set by the combine that consumed this handle; a second combine raises.
    combined: bool = False

    @property
    def num_pairs(self) -> int:
        """(row, local expert) pairs this rank received: rows ``expert_y`` has in compact layout."""
        return int(self.expert_num_tokens.sum())

    @property
    def expert_src(self) -> np.ndarray:
        """Source ``(rank, token)`` of every row of ``expert_x``; -1 on padding rows.

        ``int64[L, capacity, 2]`` (expert-major) or ``int64[R, 2]`` (compact),
        read back to the host (for inspection; the layer itself never needs it).
        With ``dp_size > 1`` the rank is the DP group's member that sent the row.
        """
        tok = np.zeros(0, dtype=np.int64)
        if self.recv_src_token is not None:
            tok = self.recv_src_token.cpu().numpy().astype(np.int64)
        src = np.stack([self.recv_src_rank, tok], axis=1)
        if self.layout == "compact":
            return src
        owner = self.owner
        out = np.full((owner.num_local_experts * owner.expert_capacity, 2), -1, dtype=np.int64)
        out[self.positions] = src
        return out.reshape(owner.num_local_experts, owner.expert_capacity, 2)


class DispatchWork:
    """A dispatch in flight; :meth:`wait` returns ``(expert_x, expert_num_tokens, handle)``."""

    def __init__(self, work: Any, finish: Any):
        self._work = work
        self._finish = finish
        self._result: tuple[torch.Tensor, torch.Tensor, MoEHandle] | None = None

    def is_completed(self) -> bool:
        return self._result is not None or self._work is None or self._work.is_completed()

    def wait(self) -> tuple[torch.Tensor, torch.Tensor, MoEHandle]:
        if self._result is None:
            if self._work is not None:
                self._work.wait()
            self._result = self._finish()
        return self._result


class CombineWork:
    """A combine in flight; :meth:`wait` returns ``out [m, H]``."""

    def __init__(self, work: Any, finish: Any):
        self._work = work
        self._finish = finish
        self._result: torch.Tensor | None = None

    def is_completed(self) -> bool:
        return self._result is not None or self._work is None or self._work.is_completed()

    def wait(self) -> torch.Tensor:
        if self._result is None:
            if self._work is not None:
                self._work.wait()
            self._result = self._finish()
        return self._result


def _positive(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


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
        every rank before data moves.

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
    ):
        self.num_experts = _positive("num_experts", num_experts)
        self.experts_per_token = _positive("experts_per_token", experts_per_token)
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"experts_per_token ({experts_per_token}) must be <= num_experts ({num_experts})"
            )
        self.hidden_dim = _positive("hidden_dim", hidden_dim)
        self.max_num_tokens = _positive("max_num_tokens", max_num_tokens)
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
        self.dp_size = _positive("dp_size", dp_size)
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
            bad = np.flatnonzero((place < 0) | (place >= self.num_ranks))
            if bad.size:
                e = int(bad[0])
                raise ValueError(
                    f"placement[{e}] = {int(place[e])} is not a rank of the group "
                    f"[0, {self.num_ranks})"
                )
        self.placement = place
        self.placement.setflags(write=False)
        self.local_index, self.experts_per_rank = R.local_experts(place, self.num_ranks)
        self.local_expert_ids = np.flatnonzero(place == self.rank)
        self.num_local_experts = int(self.local_expert_ids.size)
        worst = self.max_num_tokens * self.num_dp_groups
        self.expert_capacity = (
            worst if expert_capacity is None else _positive("expert_capacity", expert_capacity)
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
        self._pool = _Pool()
        self._dev_tables: dict[torch.device, Any] = {}
        # Every parameter that shapes the exchange: checked across ranks once per layer
        # (a fixed-width row, so a rank with another num_experts cannot desize the gather),
        # then its digest rides in every call's row.
        self._config_row = np.array([
            self.num_experts, self.experts_per_token, self.hidden_dim, self.max_num_tokens,
            dtype_code(dtype), R.LAYOUTS.index(layout), self.dp_size, self.expert_capacity,
            R.fingerprint(self.placement.reshape(1, -1)), self.num_ranks,
        ], dtype=np.int64)
        self._config_digest = R.fingerprint(self._config_row.reshape(1, -1))
        self._config_checked = False
        self._dispatches = 0  # call id of the next dispatch
        # Payload rows are copied as integers of the same width: bit-exact, and every
        # index kernel supports them (fp8 dtypes have no index_copy_ on CPU).
        self._move_dtype = _INT_OF_SIZE[torch.empty(0, dtype=dtype).element_size()]
        self.scale_block = 128

    def __repr__(self) -> str:
        return (
            f"MoEAllToAll(num_experts={self.num_experts}, experts_per_token="
            f"{self.experts_per_token}, hidden_dim={self.hidden_dim}, max_num_tokens="
            f"{self.max_num_tokens}, dtype={self.dtype}, ranks={self.num_ranks}, "
            f"dp_size={self.dp_size}, layout={self.layout!r})"
        )

    # ------------------------------------------------------------ helpers
    def _check_config(self) -> None:
        """Compare every rank's layer parameters (once per layer; raises on every rank)."""
        if not self._config_checked:
            check_config(self._exchange(self._config_row)(), R.LAYOUTS)
            self._config_checked = True

    def _exchange(self, row: np.ndarray) -> Any:
        """Start an all-gather of one ``int64`` row per rank; returns a function that waits.

        The data plane's row exchange
        (:func:`pathweave.runtime.executor.start_row_exchange`: gather and
        broadcast on gloo, an all-gather on NCCL), bounded by the
        orchestrator's ``timeout_s``. The caller packs while the rows travel.
        """
        from pathweave import distributed as pwd
        orch = self.orchestrator or pwd.default_orchestrator(self.group)
        return start_row_exchange(row, self.group, deadline=time.monotonic() + orch.timeout_s)

    def _a2a(
        self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
        in_splits: list[int], async_op: bool, split_matrix: np.ndarray | None = None,
    ) -> Any:
        from pathweave import distributed as pwd

        # The split matrix comes from this layer's own metadata exchange (the
        # same on every rank): the data plane skips its exchange.
        return pwd.all_to_all_single(
            out, inp, out_splits, in_splits, group=self.group, async_op=async_op,
            orchestrator=self.orchestrator, split_matrix=split_matrix,
        )

    def _check_dispatch(self, x: Any, topk_idx: Any, x_scale: Any) -> int:
        """Local checks of types, dtypes, shapes and devices; returns the scale columns (-1: none).

        The routing table's values are checked on its device
        (:func:`pathweave.moe._routing.check_topk`), with the counts.
        """
        if not isinstance(x, torch.Tensor):
            raise MoEArgError(1, type_code(x))
        if x.dtype != self.dtype:
            raise MoEArgError(2, dtype_code(x.dtype), dtype_code(self.dtype))
        if x.dim() != 2 or x.shape[1] != self.hidden_dim:
            raise MoEArgError(3, *shape_nums(x))
        m = int(x.shape[0])
        if m > self.max_num_tokens:
            raise MoEArgError(4, m)
        if not isinstance(topk_idx, torch.Tensor):
            raise MoEArgError(5, type_code(topk_idx))
        if not _dtype_ok(topk_idx, INDEX_DTYPES):
            raise MoEArgError(6, dtype_code(topk_idx.dtype))
        if topk_idx.dim() != 2 or tuple(topk_idx.shape) != (m, self.experts_per_token):
            raise MoEArgError(7, *shape_nums(topk_idx), 0, 0, m)
        if topk_idx.device != x.device:
            raise MoEArgError(13, 1)
        cols = -1
        if x_scale is not None:
            if not isinstance(x_scale, torch.Tensor):
                raise MoEArgError(10, type_code(x_scale))
            if x_scale.dtype != torch.float32:
                raise MoEArgError(11, dtype_code(x_scale.dtype))
            if x_scale.dim() != 2 or x_scale.shape[0] != m or x_scale.shape[1] < 1:
                raise MoEArgError(12, *shape_nums(x_scale), 0, 0, m)
            if x_scale.device != x.device:
                raise MoEArgError(13, 2)
            cols = int(x_scale.shape[1])
        return cols

    def _tables(self, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Placement, local index and expert order as ``int64`` tensors on ``dev`` (cached)."""
        t = self._dev_tables.get(dev)
        if t is None:
            t = tuple(
                torch.from_numpy(np.array(a, dtype=np.int64)).to(dev)
                for a in (self.placement, self.local_index, R.expert_order(self.placement))
            )
            self._dev_tables[dev] = t
        return t  # type: ignore[return-value]

    def _local_plan(
        self, x: torch.Tensor, topk_idx: torch.Tensor
    ) -> tuple[R.SendPlan, np.ndarray]:
        """This rank's send plan (untrimmed) and its counts, read back in one transfer.

        ``counts``: the routing check (code, token, slot, value), the routing
        digest, pairs per expert, rows per rank: the only numbers of a call
        that cross from the device to the host.
        """
        place, local, order = self._tables(x.device)
        idx = topk_idx.to(torch.int64)
        plan = R.send_plan(idx, place, local, order, self.num_ranks, layout=self.layout,
                           dp_size=self.dp_size, member=self._member)
        counts = torch.cat([
            R.check_topk(idx, self.num_experts), R.routing_digest(idx).view(1),
            plan.pairs_per_expert, plan.rows_per_rank,
        ]).cpu().numpy()
        if counts[0]:
            code, i, j, v = (int(c) for c in counts[:4])
            raise MoEArgError(8 if code == 1 else 9, i, j, v)
        return plan, counts

    # ------------------------------------------------------------ dispatch
    def dispatch(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        x_scale: torch.Tensor | None = None,
        *,
        async_op: bool = False,
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
            returns, so errors are raised here.

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
        self._check_config()
        n = self.num_ranks
        E = self.num_experts
        err = np.zeros(ERR_FIELDS, dtype=np.int64)
        cols, plan, counts = -1, None, None
        try:
            cols = self._check_dispatch(x, topk_idx, x_scale)
            plan, counts = self._local_plan(x, topk_idx)
        except MoEArgError as exc:
            err = exc.row()
            plan = None
        # Row: error | layer digest, m, routing digest, scale columns, needs grad |
        # pairs per expert | rows per rank.
        c0 = ERR_FIELDS + 5
        row = np.zeros(c0 + E + n, dtype=np.int64)
        row[:ERR_FIELDS] = err
        row[ERR_FIELDS] = self._config_digest
        if plan is not None and counts is not None:
            grad = torch.is_grad_enabled() and x.requires_grad
            row[ERR_FIELDS + 1 : c0] = (int(x.shape[0]), counts[4], cols, int(grad))
            row[c0:] = counts[5:]
            plan = plan.trim(int(counts[5 + E :].sum()), int(counts[5 : 5 + E].sum()))
        wait = self._exchange(row)
        packed = None if plan is None else self._pack(x, x_scale, plan, cols, row[c0 + E :])
        meta = wait()
        check_same_layer(meta[:, ERR_FIELDS], "dispatch")
        raise_first(meta, self._fields)
        ms, digests, scols = (meta[:, ERR_FIELDS + i] for i in (1, 2, 3))
        pairs = meta[:, c0 : c0 + E]  # [src, expert]
        rows = meta[:, c0 + E :]  # [src, dst]
        self._check_global(ms, digests, scols, pairs)
        assert plan is not None and packed is not None
        grad = bool(meta[:, ERR_FIELDS + 4].any())  # every rank joins the backward, or none
        return self._dispatch_data(x, topk_idx, plan, pairs, rows, cols, packed, async_op, grad)

    def _check_global(
        self, ms: np.ndarray, digests: np.ndarray, scols: np.ndarray, pairs: np.ndarray
    ) -> None:
        """Checks over all ranks' rows (the same outcome on every rank)."""
        if (scols != scols[0]).any():
            r = int(np.flatnonzero(scols != scols[0])[0])

            def say(c: int) -> str:
                return "no x_scale" if c < 0 else f"x_scale with {c} columns"

            raise ValueError(
                f"rank 0 passed {say(int(scols[0]))} but rank {r} passed {say(int(scols[r]))}; "
                "all ranks must pass scales of the same width, or none"
            )
        dp = self.dp_size
        if dp > 1:
            for g in range(self.num_dp_groups):
                lo = g * dp
                for r in range(lo + 1, lo + dp):
                    if ms[r] != ms[lo] or digests[r] != digests[lo]:
                        what = (
                            f"{int(ms[lo])} and {int(ms[r])} tokens" if ms[r] != ms[lo]
                            else "different topk_idx"
                        )
                        raise ValueError(
                            f"ranks {lo} and {r} are in one DP group (dp_size={dp}) but hold "
                            f"{what}; ranks of a DP group must pass identical tokens and routing"
                        )
        load = pairs.sum(axis=0)
        over = np.flatnonzero(load > self.expert_capacity)
        if over.size and self.layout == "expert-major":
            e = int(over[0])
            raise ValueError(
                f"expert {e} (rank {int(self.placement[e])}) would receive {int(load[e])} tokens, "
                f"more than expert_capacity={self.expert_capacity}"
            )

    def _row_bytes(self, x: torch.Tensor, cols: int) -> tuple[int, int, int]:
        """Byte widths of a dispatched row: payload, metadata (scales, tag, ids), whole row.

        The metadata width is a multiple of 8 so that every chunk's payload
        starts aligned for any dtype.
        """
        hb = self.hidden_dim * x.element_size()
        sb = 4 * cols if cols > 0 else 0
        extra = _ID_BYTES * self.experts_per_token if self.layout == "compact" else 0
        mb = -(-(sb + _TAG_BYTES + extra) // 8) * 8
        return hb, mb, hb + mb

    def _chunks(
        self, buf: torch.Tensor, counts: Sequence[int], hb: int, mb: int, dtype: torch.dtype
    ) -> list[tuple[torch.Tensor | None, torch.Tensor]]:
        """Per peer: its payload rows (``dtype[n, H]``) and metadata rows (``uint8[n, mb]``).

        A peer's chunk holds all its payload rows, then all its metadata
        rows, so payloads move as whole rows of their own dtype.
        """
        flat = buf.view(-1)
        out = []
        off = 0
        for c in counts:
            c = int(c)
            pay = flat[off : off + c * hb]
            payload = pay.view(dtype).view(c, self.hidden_dim) if c else None
            meta = flat[off + c * hb : off + c * (hb + mb)].view(c, mb)
            out.append((payload, meta))
            off += c * (hb + mb)
        return out

    def _pack(
        self, x: torch.Tensor, x_scale: torch.Tensor | None, plan: R.SendPlan, cols: int,
        rows_per_rank: np.ndarray,
    ) -> torch.Tensor:
        """Rows to send, per destination: payloads, then scales | source token | (compact) ids.

        The metadata rows are built as ``int32`` columns on ``x``'s device
        (scales by their bits); nothing goes through the host.
        """
        hb, mb, row_bytes = self._row_bytes(x, cols)
        S = cols if cols > 0 else 0
        n_send = int(plan.row_token.numel())
        dev = x.device
        send = self._pool.get("d_send", n_send, row_bytes, dev)
        if n_send == 0:
            return send
        meta = torch.zeros(n_send, mb // 4, dtype=torch.int32, device=dev)
        if S:
            assert x_scale is not None
            meta[:, :S] = x_scale.index_select(0, plan.row_token).view(torch.int32)
        meta[:, S] = plan.row_token.to(torch.int32)
        if self.layout == "compact":
            meta[:, S + 1 : S + 1 + self.experts_per_token] = plan.row_local.to(torch.int32)
        meta8 = meta.view(torch.uint8)
        xc = x.detach().contiguous().view(self._move_dtype)
        ptr = np.concatenate(([0], np.cumsum(rows_per_rank)))
        for q, (payload, mview) in enumerate(
            self._chunks(send, rows_per_rank, hb, mb, self._move_dtype)
        ):
            if payload is None:
                continue
            a, b = int(ptr[q]), int(ptr[q + 1])
            torch.index_select(xc, 0, plan.row_token[a:b], out=payload)
            mview.copy_(meta8[a:b])
        return send

    def _dispatch_data(
        self, x: torch.Tensor, topk_idx: torch.Tensor, plan: R.SendPlan, pairs: np.ndarray,
        rows: np.ndarray, cols: int, send: torch.Tensor, async_op: bool, grad: bool,
    ) -> Any:
        n, H = self.num_ranks, self.hidden_dim
        dev = x.device
        compact = self.layout == "compact"
        k = self.experts_per_token
        hb, mb, row_bytes = self._row_bytes(x, cols)
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
            send_slot_row=plan.slot_row,
        )
        self._dispatches += 1
        place, _, order = self._tables(dev)
        handle.slot_pos = R.return_slots(topk_idx.to(torch.int64), place, order,
                                         layout=self.layout, dp_size=self.dp_size)
        if not compact:
            handle.positions = R.expert_major_positions(block, self.expert_capacity)
            handle.positions_t = _i64(handle.positions, dev)
            self._combine_send_tables(handle, handle.positions_t, recv_counts)

        def finish() -> tuple[torch.Tensor, torch.Tensor, MoEHandle]:
            self._pool.busy.discard("d_send")
            self._pool.busy.discard("d_recv")
            chunks = self._chunks(recv, recv_counts, hb, mb, self._move_dtype)
            meta8 = torch.cat([m for _, m in chunks]) if n_recv else None
            meta = None if meta8 is None else meta8.view(torch.int32)  # [n_recv, mb / 4]
            handle.recv_src_token = (
                meta[:, S].to(torch.int64) if meta is not None
                else torch.zeros(0, dtype=torch.int64, device=dev)
            )
            starts = np.concatenate(([0], np.cumsum(recv_counts)))
            if compact:
                expert_x = torch.empty(n_recv, H, dtype=self.dtype, device=dev)
                for s_, (payload, _) in enumerate(chunks):
                    if payload is not None:
                        expert_x[starts[s_] : starts[s_ + 1]].view(self._move_dtype).copy_(
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
                flat = expert_x.view(self._move_dtype).view(L * cap, H)
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
                        _byte_rows(scale, L * cap, 4 * S).index_copy_(0, p, mview[:, : 4 * S])
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
        work = self._a2a(recv, send, recv_splits, send_splits, async_op, split_matrix=rows)
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
                  split_matrix=handle.split_matrix.T.copy())
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
        pos = torch.arange(flat.numel(), device=ids.device)
        key = torch.where(valid, flat * max(flat.numel(), 1) + pos, torch.iinfo(torch.int64).max)
        P = handle.num_pairs
        grouped = torch.sort(key, stable=True).indices[:P]  # by local expert, then (row, slot)
        handle.expert_rows = grouped // max(k, 1)
        handle.expert_offsets = np.concatenate(
            ([0], np.cumsum(handle.expert_num_tokens))
        ).astype(np.int64)
        # Return order is (row, slot) ascending; where each returned pair sits when grouped.
        ret_index = valid.to(torch.int64).cumsum(0) - 1
        where = torch.empty(P, dtype=torch.int64, device=ids.device)
        where[ret_index[grouped]] = torch.arange(P, device=ids.device)
        self._combine_send_tables(handle, where, block.sum(axis=1))

    # ------------------------------------------------------------ combine
    def combine(
        self,
        expert_y: torch.Tensor,
        handle: MoEHandle,
        topk_weights: torch.Tensor | None = None,
        weighted: bool = True,
        *,
        async_op: bool = False,
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

        Returns
        -------
        out
            ``[m, H]`` in ``expert_y``'s dtype, or a :class:`CombineWork`.
        """
        self._check_config()
        err = np.zeros(ERR_FIELDS, dtype=np.int64)
        try:
            w = self._check_combine(expert_y, handle, topk_weights, weighted)
        except MoEArgError as exc:
            err = exc.row()
            w = None
        # Row: error | expert_y dtype | layer digest | the handle's dispatch call id | needs grad.
        row = np.zeros(ERR_FIELDS + 4, dtype=np.int64)
        row[:ERR_FIELDS] = err
        row[ERR_FIELDS + 1] = self._config_digest
        grad = False
        if not err[0]:
            row[ERR_FIELDS] = dtype_code(expert_y.dtype)
            row[ERR_FIELDS + 2] = handle.call_id
            grad = torch.is_grad_enabled() and (
                expert_y.requires_grad or (w is not None and w.requires_grad)
            )
            row[ERR_FIELDS + 3] = int(grad)
        wait = self._exchange(row)
        send = None if err[0] else self._pack_combine(expert_y, handle, grad)
        meta = wait()
        check_same_layer(meta[:, ERR_FIELDS + 1], "combine")
        raise_first(meta, self._fields)
        check_handle_ids(meta[:, ERR_FIELDS + 2])
        codes = meta[:, ERR_FIELDS]
        if (codes != codes[0]).any():
            r = int(np.flatnonzero(codes != codes[0])[0])
            raise TypeError(
                f"expert_y has dtype {dtype_name(int(codes[0]))} on rank 0 but "
                f"{dtype_name(int(codes[r]))} on rank {r}; it must be the same on every rank"
            )
        assert send is not None
        handle.combined = True
        if bool(meta[:, ERR_FIELDS + 3].any()) and not grad:
            # A peer needs the backward: join its graph with a stand-in leaf.
            send = send.detach().clone().requires_grad_()
            grad = True
        return self._combine_data(expert_y, handle, w, send, async_op, grad)

    def _check_combine(
        self, expert_y: Any, handle: Any, topk_weights: Any, weighted: bool
    ) -> torch.Tensor | None:
        if not isinstance(handle, MoEHandle):
            raise MoEArgError(20, type_code(handle))
        if handle.owner is not self:
            raise MoEArgError(28)
        if handle.combined:
            raise MoEArgError(29, handle.call_id)
        if not isinstance(expert_y, torch.Tensor):
            raise MoEArgError(21, type_code(expert_y))
        if not _dtype_ok(expert_y, FLOAT_DTYPES):
            raise MoEArgError(22, dtype_code(expert_y.dtype))
        H = self.hidden_dim
        if self.layout == "compact":
            want: tuple[int, ...] = (handle.num_pairs, H)
            exp_nums = (handle.num_pairs, 1)
        else:
            want = (self.num_local_experts, self.expert_capacity, H)
            exp_nums = (self.num_local_experts, 0)
        if tuple(expert_y.shape) != want:
            raise MoEArgError(23, *shape_nums(expert_y), *exp_nums)
        if not weighted:
            return None
        m = handle.num_tokens
        if not isinstance(topk_weights, torch.Tensor):
            raise MoEArgError(24, type_code(topk_weights))
        if not _dtype_ok(topk_weights, FLOAT_DTYPES):
            raise MoEArgError(25, dtype_code(topk_weights.dtype))
        if tuple(topk_weights.shape) != (m, self.experts_per_token):
            raise MoEArgError(26, *shape_nums(topk_weights), 0, 0, m)
        if topk_weights.device != expert_y.device:
            raise MoEArgError(27)
        return topk_weights.to(torch.float32)

    def _pack_combine(
        self, expert_y: torch.Tensor, handle: MoEHandle, grad: bool
    ) -> torch.Tensor:
        """The output rows going back, in return order (``[rows, H]`` in ``expert_y``'s dtype).

        With gradients a fresh, differentiable gather; without, into a reused buffer.
        """
        H = self.hidden_dim
        assert handle.ret_gather is not None
        flat = expert_y.reshape(-1, H)
        if grad:
            return flat.index_select(0, handle.ret_gather)
        rows = int(handle.ret_gather.numel())
        send = self._pool.get("c_send", rows, H * expert_y.element_size(), expert_y.device)
        out = send.view(expert_y.dtype).view(rows, H) if rows else flat[:0]
        if rows:
            torch.index_select(flat, 0, handle.ret_gather, out=out)
        return out

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
                            split_matrix=handle.ret_matrix)
                out = _slot_sum(ys, handle.slot_pos, w, m, H)
            else:
                out = _slot_sum(padded, handle.slot_pos, w, m, H, self._pool, zero_row=n_recv)
            return out if dt == torch.float32 else out.to(dt)

        work = self._a2a(recv, send.detach(), handle.ret_recv_splits, handle.ret_send_splits,
                         async_op, split_matrix=handle.ret_matrix)
        if not async_op:
            return finish()
        self._pool.busy.update(("c_send", "c_recv"))
        return CombineWork(work, finish)


def _slot_sum(
    rows: torch.Tensor, slot_row: torch.Tensor, w: torch.Tensor | None, m: int, H: int,
    pool: _Pool | None = None, zero_row: int | None = None,
) -> torch.Tensor:
    """``out[i] = sum_j w[i, j] * rows[slot_row[i, j]]`` over slots with a row, in float32.

    Slots are added in order ``j = 0, 1, ..`` (fixed, so the bits are the
    same on every run and every device); differentiable in ``rows`` and
    ``w``. An empty ``rows`` still joins the result's graph, so the
    backward's collective runs on every rank.

    Without gradients the caller may pass ``zero_row``, the index of a row
    of zeros in ``rows``: slots without a row read it (adding ``+-0.0``
    leaves the sum's bits alone) instead of being masked, and the per-slot
    temporaries come from ``pool`` (fresh ``[m, H]`` buffers would cost a
    page fault per page, more than the arithmetic).
    """
    acc = torch.zeros(m, H, dtype=torch.float32, device=rows.device)
    if rows.shape[0] == (0 if zero_row is None else 1) or m == 0:
        link = rows.sum().to(torch.float32) * 0
        return acc + (link if w is None else link + w.sum() * 0)
    for j in range(slot_row.shape[1]):
        pos = slot_row[:, j]
        if zero_row is None or pool is None:
            part = rows.index_select(0, pos.clamp(min=0)).to(torch.float32)
            if w is not None:
                part = part * w[:, j : j + 1]
            acc = acc + part.masked_fill((pos < 0).unsqueeze(1), 0.0)
            continue
        lo = pool.get("c_tmp", m, H * rows.element_size(), rows.device)
        lo = lo.view(rows.dtype).view(m, H)
        torch.index_select(rows, 0, torch.where(pos < 0, zero_row, pos), out=lo)
        part = pool.get("c_tmp32", m, 4 * H, rows.device).view(torch.float32).view(m, H)
        part.copy_(lo)
        if w is not None:
            part.mul_(w[:, j : j + 1])
        acc.add_(part)
    return acc


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
