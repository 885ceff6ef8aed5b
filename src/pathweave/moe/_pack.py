"""Packing of the MoE layer: the byte layout of dispatched and returned rows.

A dispatched row is its payload (the token as bytes of an integer type of the
same width, so copies are bit-exact for every dtype, fp8 included) and a
metadata block (block scales by their bits, the source token id, in
``compact`` layout the local expert ids), padded to 8 bytes. A peer's chunk
holds all its payload rows, then all its metadata rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pathweave.moe import routing as R
from pathweave.moe._work import MoEHandle

__all__ = [
    "INT_OF_SIZE", "byte_rows", "chunks", "i64", "move_dtype", "pack_combine", "pack_dispatch",
    "row_bytes",
]

INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
TAG_BYTES = 4  # source token id (int32) carried by every dispatched row
ID_BYTES = 4  # one local expert id (int32) per top-k slot, compact layout only


def byte_rows(t: torch.Tensor, rows: int, nbytes: int) -> torch.Tensor:
    """A contiguous tensor's bytes as ``uint8[rows, nbytes]`` (a view; empty tensors too)."""
    if t.numel() == 0:  # torch cannot reinterpret an empty tensor's dtype
        return torch.empty(rows, nbytes, dtype=torch.uint8, device=t.device)
    return t.view(torch.uint8).view(rows, nbytes)


def i64(a: np.ndarray, device: torch.device) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


def row_bytes(
    layer: Any, x: torch.Tensor, cols: int) -> tuple[int, int, int]:
    """Byte widths of a dispatched row: payload, metadata (scales, tag, ids), whole row.

    The metadata width is a multiple of 8 so that every chunk's payload
    starts aligned for any dtype.
    """
    hb = layer.hidden_dim * x.element_size()
    sb = 4 * cols if cols > 0 else 0
    extra = ID_BYTES * layer.experts_per_token if layer.layout == "compact" else 0
    align = 16 if hb % 16 == 0 else 8  # 16: payloads can move as 16-byte elements
    mb = -(-(sb + TAG_BYTES + extra) // align) * align
    return hb, mb, hb + mb


#: Integer-like dtypes by width, widest first: rows move as the widest that divides them.
_WIDE = ((16, torch.complex128), (8, torch.int64), (4, torch.int32), (2, torch.int16),
         (1, torch.uint8))


def move_dtype(hb: int, mb: int) -> torch.dtype:
    """The dtype payload rows of ``hb`` bytes move as, in chunks of ``hb + mb``-byte rows:
    the widest whose size divides both (every chunk's payload then starts aligned).

    Bit-exact for any payload; the CPU's ``index_copy_`` walks elements, so a
    16-byte element makes a quarter of the steps of a 4-byte one.

    >>> move_dtype(1024, 16), move_dtype(512, 8), move_dtype(300, 8)
    (torch.complex128, torch.int64, torch.int32)
    """
    return next(dt for w, dt in _WIDE if hb % w == 0 and mb % w == 0)

def chunks(
    layer: Any, buf: torch.Tensor, counts: Sequence[int], hb: int, mb: int, dtype: torch.dtype
) -> list[tuple[torch.Tensor | None, torch.Tensor]]:
    """Per peer: its payload rows (``dtype[n, hb / itemsize]``, :func:`move_dtype`) and
    metadata rows (``uint8[n, mb]``).

    A peer's chunk holds all its payload rows, then all its metadata
    rows, so payloads move as whole rows of their own dtype.
    """
    flat = buf.view(-1)
    out = []
    off = 0
    for c in counts:
        c = int(c)
        pay = flat[off : off + c * hb]
        payload = pay.view(dtype).view(c, -1) if c else None
        meta = flat[off + c * hb : off + c * (hb + mb)].view(c, mb)
        out.append((payload, meta))
        off += c * (hb + mb)
    return out

def pack_dispatch(
    layer: Any, x: torch.Tensor, x_scale: torch.Tensor | None, plan: R.SendPlan, cols: int,
    rows_per_rank: np.ndarray,
) -> torch.Tensor:
    """Rows to send, per destination: payloads, then scales | source token | (compact) ids.

    The metadata rows are built as ``int32`` columns on ``x``'s device
    (scales by their bits); nothing goes through the host.
    """
    hb, mb, width = row_bytes(layer, x, cols)
    S = cols if cols > 0 else 0
    n_send = int(plan.row_token.numel())
    dev = x.device
    send = layer._pool.get("d_send", n_send, width, dev)
    if n_send == 0:
        return send
    meta = torch.zeros(n_send, mb // 4, dtype=torch.int32, device=dev)
    if S:
        assert x_scale is not None
        meta[:, :S] = x_scale.index_select(0, plan.row_token).view(torch.int32)
    meta[:, S] = plan.row_token  # cast by the copy
    if layer.layout == "compact":
        meta[:, S + 1 : S + 1 + layer.experts_per_token] = plan.row_local
    meta8 = meta.view(torch.uint8)
    move = move_dtype(hb, mb)
    xc = _rows_as(x.detach(), move)
    ptr = np.concatenate(([0], np.cumsum(rows_per_rank)))
    for q, (payload, mview) in enumerate(chunks(layer, send, rows_per_rank, hb, mb, move)):
        if payload is None:
            continue
        a, b = int(ptr[q]), int(ptr[q + 1])
        torch.index_select(xc, 0, plan.row_token[a:b], out=payload)
        mview.copy_(meta8[a:b])
    return send

def _rows_as(x: torch.Tensor, move: torch.dtype) -> torch.Tensor:
    """``x``'s rows as ``[m, hb / itemsize]`` of ``move`` (a copy when not aligned for it)."""
    size = move.itemsize
    if not x.is_contiguous() or (x.storage_offset() * x.element_size()) % size:
        x = x.contiguous().clone()  # a fresh tensor is aligned
    return x.view(move) if x.numel() else x.new_empty(x.shape[0], 0, dtype=move)


def pack_combine(
    layer: Any, expert_y: torch.Tensor, handle: MoEHandle, grad: bool
) -> torch.Tensor:
    """The output rows going back, in return order (``[rows, H]`` in ``expert_y``'s dtype).

    With gradients a fresh, differentiable gather; without, into a reused buffer.
    """
    H = layer.hidden_dim
    assert handle.ret_gather is not None
    flat = expert_y.reshape(-1, H)
    if grad:
        return flat.index_select(0, handle.ret_gather)
    rows = int(handle.ret_gather.numel())
    send = layer._pool.get("c_send", rows, H * expert_y.element_size(), expert_y.device)
    out = send.view(expert_y.dtype).view(rows, H) if rows else flat[:0]
    if rows:
        torch.index_select(flat, 0, handle.ret_gather, out=out)
    return out
