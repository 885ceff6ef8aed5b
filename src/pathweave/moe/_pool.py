"""Reusable byte buffers of the MoE layer.

First-touch page faults of freshly allocated buffers cost more than the
copies themselves, so buffers used only inside a call are kept per role and
reused; a role held by a call still in flight is never handed out twice.
"""

from __future__ import annotations

import torch

__all__ = ["Pool"]


class Pool:
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
