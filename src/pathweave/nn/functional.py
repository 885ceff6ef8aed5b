"""Differentiable collectives on the multi-path data plane.

:func:`all_to_all_single` has the semantics of
``torch.distributed.nn.functional.all_to_all_single``: the forward is
:func:`pathweave.distributed.all_to_all_single`, the backward the transposed
exchange (the gradient of the rows rank ``i`` sent rank ``j`` comes back from
``j`` to ``i``), itself one call of the data plane, so both directions are
spread over relay and rail paths alike.

Examples
--------
>>> from pathweave.runtime.launch import run_local
>>> from pathweave.nn.functional import _doc_example
>>> run_local(_doc_example, 2)
[[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.autograd.function import once_differentiable

__all__ = ["all_to_all_single"]


@dataclass
class _Exchange:
    """One exchange's arguments; ``backward`` runs the transpose."""

    output: torch.Tensor
    output_split_sizes: list[int] | None
    input_split_sizes: list[int] | None
    group: Any
    orchestrator: Any
    split_matrix: np.ndarray | None
    config_digests: np.ndarray | None
    done: bool  # the forward bytes already moved (an async exchange the caller waited for)

    def run(self, output: torch.Tensor, inp: torch.Tensor, transpose: bool) -> None:
        from pathweave import distributed as pwd

        out_s, in_s = self.output_split_sizes, self.input_split_sizes
        sm = self.split_matrix
        if transpose:
            out_s, in_s = in_s, out_s
            sm = None if sm is None else sm.T.copy()
        pwd.all_to_all_single(output, inp, out_s, in_s, group=self.group,
                              orchestrator=self.orchestrator, split_matrix=sm,
                              config_digests=self.config_digests)


class _AllToAllSingle(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, inp: torch.Tensor, ex: _Exchange) -> torch.Tensor:  # type: ignore[override]
        ctx.ex = ex
        ctx.in_shape, ctx.in_dtype = inp.shape, inp.dtype
        if not ex.done:
            ex.run(ex.output, inp.contiguous(), transpose=False)
        return ex.output

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        grad_in = torch.empty(ctx.in_shape, dtype=grad.dtype, device=grad.device)
        ctx.ex.run(grad_in, grad.contiguous(), transpose=True)
        return grad_in, None


def _exchange(
    output: torch.Tensor, output_split_sizes: Sequence[int] | None,
    input_split_sizes: Sequence[int] | None, group: Any, orchestrator: Any,
    split_matrix: Any, done: bool, config_digests: Any = None,
) -> _Exchange:
    def as_list(s: Sequence[int] | None) -> list[int] | None:
        return None if s is None else [int(v) for v in s]

    sm = None if split_matrix is None else np.asarray(
        split_matrix.cpu() if isinstance(split_matrix, torch.Tensor) else split_matrix,
        dtype=np.int64,
    )
    return _Exchange(output, as_list(output_split_sizes), as_list(input_split_sizes), group,
                     orchestrator, sm, config_digests, done)


def all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Any = None,
    *,
    orchestrator: Any = None,
    split_matrix: Any = None,
    config_digests: Any = None,
) -> torch.Tensor:
    """:func:`pathweave.distributed.all_to_all_single` that autograd can differentiate.

    Arguments as there (``output`` is filled and returned, as by
    ``torch.distributed.nn.functional.all_to_all_single``). In the backward
    pass every rank sends the gradient of its output rows back to their
    sources with the splits swapped (and ``split_matrix`` transposed): the
    transposed exchange, through the same orchestrator. Every rank must run
    the backward, as every rank ran the forward.

    Parameters
    ----------
    output, input
        Tensors on the group's device; ``input`` may require grad.
    output_split_sizes, input_split_sizes
        Rows per peer; ``None``: equal split.
    group
        Process group (``None``: the default group).
    orchestrator
        The :class:`~pathweave.Orchestrator` to use; default: the group's.
    split_matrix
        ``int[N, N]`` rows rank ``s`` sends rank ``d`` (the same on every
        rank), as in :func:`pathweave.distributed.all_to_all_single`; the
        backward uses its transpose, so neither direction exchanges sizes.
    config_digests
        With ``split_matrix``: every rank's configuration digest, as in
        :func:`pathweave.distributed.all_to_all_single`; both directions use
        them, so neither exchanges metadata.

    Returns
    -------
    torch.Tensor
        ``output``, part of the autograd graph of ``input``.
    """
    ex = _exchange(output, output_split_sizes, input_split_sizes, group, orchestrator,
                   split_matrix, done=False, config_digests=config_digests)
    return _AllToAllSingle.apply(input, ex)


def attach(
    output: torch.Tensor, input: torch.Tensor, output_split_sizes: Sequence[int] | None,
    input_split_sizes: Sequence[int] | None, group: Any = None, *, orchestrator: Any = None,
    split_matrix: Any = None, config_digests: Any = None,
) -> torch.Tensor:
    """``output`` of an exchange that already ran (async, waited for), joined to ``input``'s graph.

    The backward is the same transposed exchange as :func:`all_to_all_single`'s.
    """
    ex = _exchange(output, output_split_sizes, input_split_sizes, group, orchestrator,
                   split_matrix, done=True, config_digests=config_digests)
    return _AllToAllSingle.apply(input, ex)


def _doc_example(rank: int, world_size: int) -> list[float]:
    """Every rank sends one row to each rank; the loss sums twice the outputs."""
    x = torch.full((world_size, 3), float(rank), requires_grad=True)
    out = all_to_all_single(torch.empty(world_size, 3), x)
    (2 * out).sum().backward()
    assert x.grad is not None
    return x.grad[0].tolist()
