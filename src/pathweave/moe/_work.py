"""What a dispatch leaves for its combine (:class:`MoEHandle`) and the calls in flight.

:class:`DispatchWork` and :class:`CombineWork` wrap the data plane's work
object and the step that finishes the call once its bytes have arrived.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import torch

__all__ = ["CombineWork", "DispatchWork", "MoEHandle"]

T = TypeVar("T")


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
    recv_src_token: torch.Tensor | None = None  # per received row, its tag (int32 or int64)
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
    # every rank's configuration digest of the data plane's calls (dispatch's; combine's)
    config_digests: np.ndarray | None = None
    ret_digests: np.ndarray | None = None
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


class _Work(Generic[T]):
    """A call in flight: the data plane's work (None: nothing left to wait for) and the
    step that finishes the call once its bytes have arrived, run once."""

    def __init__(self, work: Any, finish: Callable[[], T]):
        self._work = work
        self._finish = finish
        self._result: T | None = None
        #: With ``stream=`` (CUDA): recorded on that stream after the send half.
        self.event: Any = None

    def is_completed(self) -> bool:
        return self._result is not None or self._work is None or self._work.is_completed()

    def wait(self) -> T:
        if self._result is None:
            if self._work is not None:
                self._work.wait()
            self._result = self._finish()
        return self._result


class DispatchWork(_Work[tuple[torch.Tensor, torch.Tensor, MoEHandle]]):
    """A dispatch in flight; :meth:`wait` returns ``(expert_x, expert_num_tokens, handle)``."""


class CombineWork(_Work[torch.Tensor]):
    """A combine in flight; :meth:`wait` returns ``out [m, H]``."""
