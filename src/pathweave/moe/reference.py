"""A single-process twin of MoE dispatch and combine, in plain torch.

Independent of :mod:`pathweave.moe.layer` and :mod:`pathweave.moe.routing`:
it walks the routing tables of all ranks with Python loops and boolean masks,
the slow obvious way. Tests run the distributed layer on several processes
and compare with it the way DeepEP's own tests do: every dispatched row is
tagged with its global source id ``(DP group, token)``, dispatch outputs are
compared as sets keyed by that id, bit for bit; combine outputs against the
float32 computation here.

Examples
--------
>>> import torch
>>> xs = [torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0]])]
>>> idx = [torch.tensor([[1, 0]]), torch.tensor([[1, -1]])]
>>> got = reference_dispatch(xs, idx, placement=[0, 1])
>>> got[1].src.tolist(), got[1].rows.tolist()
([[0, 0], [1, 0]], [[1.0, 2.0], [3.0, 4.0]])
>>> out = reference_combine(xs, idx, [torch.tensor([[0.5, 0.5]])] * 2, placement=[0, 1],
...                         expert_fn=lambda e, x, s: x * (e + 1))
>>> out[0].tolist(), out[1].tolist()
([[1.5, 3.0]], [[3.0, 4.0]])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["ExpertRows", "reference_combine", "reference_dispatch"]

#: ``expert_fn(expert, rows, scales_or_None) -> output rows``, row-wise (batch-independent).
ExpertFn = Callable[[int, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


@dataclass
class ExpertRows:
    """What one expert receives: source ids ``(DP group, token)`` sorted, and their rows."""

    src: torch.Tensor  # int64[n, 2]
    rows: torch.Tensor  # [n, H]
    scales: torch.Tensor | None  # float32[n, S]


def _sources(xs: Sequence[torch.Tensor], dp_size: int) -> range:
    if len(xs) % dp_size:
        raise ValueError(f"dp_size={dp_size} does not divide the {len(xs)} ranks")
    return range(0, len(xs), dp_size)  # one representative rank per DP group


def reference_dispatch(
    xs: Sequence[torch.Tensor],
    topk_idxs: Sequence[torch.Tensor],
    placement: Sequence[int],
    *,
    x_scales: Sequence[torch.Tensor] | None = None,
    dp_size: int = 1,
) -> dict[int, ExpertRows]:
    """Rows every expert should receive, keyed by expert id.

    ``xs[r]``, ``topk_idxs[r]`` (and ``x_scales[r]``) are rank ``r``'s
    arguments; ranks of one DP group hold the same tokens, so each group's
    pairs are counted once (from its first rank). Rows are sorted by source
    id; experts with no rows map to empty tensors.
    """
    num_experts = len(placement)
    per_expert: dict[int, list[tuple[int, int]]] = {e: [] for e in range(num_experts)}
    for g, r in enumerate(_sources(xs, dp_size)):
        idx = topk_idxs[r].to(torch.int64)
        for i in range(idx.shape[0]):
            for e in idx[i].tolist():
                if e >= 0:
                    per_expert[e].append((g, i))
    out = {}
    for e, srcs in per_expert.items():
        srcs.sort()
        rows = [xs[g * dp_size][i] for g, i in srcs]
        h = xs[0].shape[1]
        out[e] = ExpertRows(
            src=torch.tensor(srcs, dtype=torch.int64).reshape(-1, 2),
            rows=torch.stack(rows) if rows else xs[0].new_empty((0, h)),
            scales=None if x_scales is None else (
                torch.stack([x_scales[g * dp_size][i] for g, i in srcs]) if srcs
                else x_scales[0].new_empty((0, x_scales[0].shape[1]))
            ),
        )
    return out


def reference_combine(
    xs: Sequence[torch.Tensor],
    topk_idxs: Sequence[torch.Tensor],
    topk_weights: Sequence[torch.Tensor] | None,
    placement: Sequence[int],
    expert_fn: ExpertFn,
    *,
    x_scales: Sequence[torch.Tensor] | None = None,
    dp_size: int = 1,
    weighted: bool = True,
    out_dtype: torch.dtype | None = None,
) -> list[torch.Tensor]:
    """What combine should return on every rank after experts apply ``expert_fn``.

    ``out[r][i] = sum_j w[i, j] * expert_fn(e_ij, x[i])`` over slots with an
    expert, accumulated in float32 in slot order, cast to ``out_dtype``
    (default: the dtype ``expert_fn`` returns). ``placement`` only fixes the
    number of experts here: where an expert lives does not change the math.
    """
    num_experts = len(placement)
    outs: list[torch.Tensor] = []
    for r, x in enumerate(xs):
        src = r - r % dp_size  # the group's tokens, identical on every member
        x = xs[src]
        idx = topk_idxs[src].to(torch.int64)
        s = None if x_scales is None else x_scales[src]
        m, k = idx.shape
        acc = torch.zeros(m, x.shape[1], dtype=torch.float32)
        dt = out_dtype
        for j in range(k):
            for e in range(num_experts):
                mask = idx[:, j] == e
                if not bool(mask.any()):
                    continue
                y = expert_fn(e, x[mask], None if s is None else s[mask])
                dt = dt or y.dtype
                part = y.to(torch.float32)
                if weighted:
                    assert topk_weights is not None
                    part = part * topk_weights[src][mask, j].to(torch.float32).unsqueeze(1)
                acc[mask] += part
        outs.append(acc.to(dt or torch.float32))
    return outs
