"""Reusable byte buffers of the MoE layer.

First-touch page faults of freshly allocated buffers cost more than the
copies themselves, so buffers used only inside a call are kept per role and
reused; a role held by a call still in flight is never handed out twice.
Buffers handed to the caller (``expert_x``) are reused only once nothing
references them any more (:meth:`Pool.output`).
"""

from __future__ import annotations

import math
import threading

import torch

__all__ = ["OUTPUTS", "Pool"]


class Pool:
    """Reusable byte buffers, one per role; a role in use by a pending call is never shared."""

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, torch.device], torch.Tensor] = {}
        self._kept: dict[tuple[torch.device, int], torch.UntypedStorage] = {}
        self.busy: set[str] = set()
        self._lock = threading.Lock()  # one check-and-hand-out at a time: layers may share

    def get(self, role: str, rows: int, row_bytes: int, device: torch.device) -> torch.Tensor:
        need = rows * row_bytes
        if role in self.busy:
            return torch.empty(rows, row_bytes, dtype=torch.uint8, device=device)
        buf = self._bufs.get((role, device))
        if buf is None or buf.numel() < need:
            buf = torch.empty(max(need, 1) * 5 // 4 + 64, dtype=torch.uint8, device=device)
            self._bufs[(role, device)] = buf
        return buf[:need].view(rows, row_bytes)

    def output(self, shape: tuple[int, ...], dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
        """An uninitialized tensor the caller keeps: on the CPU, over the memory of the
        last one of its size once no tensor references that memory any more.

        A fresh CPU buffer pays a page fault per page the call writes (the
        expert-major ``expert_x`` of one rank at 4096 tokens, top-8, hidden
        256: a quarter of the round trip); a GPU's caching allocator reuses
        freed memory by itself, so other devices allocate. One buffer per
        size and device is kept: memory still referenced anywhere (a view,
        a tensor autograd saved, a numpy array over it) counts, and then a
        new one is allocated and kept instead.
        """
        nbytes = math.prod(shape) * dtype.itemsize
        if device.type != "cpu" or not nbytes:
            return torch.empty(shape, dtype=dtype, device=device)
        with self._lock:
            kept = self._kept.get((device, nbytes))
            if kept is not None and _unreferenced(kept):
                return torch.empty(0, dtype=dtype, device=device).set_(kept, 0, shape)
            out = torch.empty(shape, dtype=dtype, device=device)
            self._kept[(device, nbytes)] = out.untyped_storage()
            return out


def _unreferenced(storage: torch.UntypedStorage) -> bool:
    """Whether ``storage`` (held by the caller) is referenced by nothing else: every
    tensor over it holds one more reference (torch's count; False where torch lacks it)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return count is not None and count(storage._cdata) == 1


#: Buffers handed to callers, shared by every layer (one per size and device: layers of
#: one shape reuse one ``expert_x`` in turn instead of keeping one each).
OUTPUTS = Pool()
