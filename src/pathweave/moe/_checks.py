"""Guardrails of dispatch and combine that raise the same error on every rank.

A rank that finds a problem in its own arguments does not raise on the spot:
its peers would wait forever in the next collective. The check raises an
:class:`~pathweave.runtime.protocol.ArgProblem` (the data plane's one table of
rank-consistent errors) and the layer writes its words into its metadata row
instead; after the one metadata
exchange every rank holds every row and raises the error of the lowest
failing rank, with the same message, before any data moves. Checks that need
several ranks' facts (scales on some ranks only, DP replicas that differ,
expert capacity) run on the gathered rows the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pathweave.moe._work import MoEHandle

# One numbering of dtypes and types, one table of rank-consistent errors and one
# configuration fingerprint for every metadata row pathweave exchanges.
from pathweave.runtime.protocol import (
    PROBLEM_WORDS,
    ArgProblem,
    check_fingerprints,
    dtype_code,
    dtype_name,
    fingerprint,
    raise_problem,
    register_problems,
    type_code,
    type_name,
)

#: The layer's rank-consistent errors, in the data plane's one table
#: (templates get the layer's fields ``k``, ``E``, ``H``, ``max_m``, ``cap`` and
#: the shapes :func:`raise_first` adds).
register_problems("MoEAllToAll.dispatch", range(101, 120), {
    101: (TypeError, "rank {rank}: x must be a torch.Tensor, got {ty_a}"),
    102: (TypeError, "rank {rank}: x has dtype {dt_a}, expected {dt_b} (the layer's "
                     "dtype)"),
    103: (ValueError, "rank {rank}: x has shape {shape}, expected [m, hidden_dim={H}]"),
    104: (ValueError, "rank {rank}: x has {a} tokens, more than max_num_tokens={max_m}"),
    105: (TypeError, "rank {rank}: topk_idx must be a torch.Tensor, got {ty_a}"),
    106: (TypeError, "rank {rank}: topk_idx has dtype {dt_a}, expected an integer "
                     "dtype"),
    107: (ValueError, "rank {rank}: topk_idx has shape {shape}, expected "
                      "[{g}, experts_per_token={k}] (one row per token of x)"),
    108: (ValueError, "rank {rank}: topk_idx[{a}, {b}] = {c} is out of range [-1, {E})"),
    109: (ValueError, "rank {rank}: token {a} is routed to expert {c} twice "
                      "(topk_idx[{a}, {b}] repeats an earlier slot)"),
    110: (TypeError, "rank {rank}: x_scale must be a torch.Tensor or None, got {ty_a}"),
    111: (TypeError, "rank {rank}: x_scale has dtype {dt_a}, expected float32"),
    112: (ValueError, "rank {rank}: x_scale has shape {shape}, expected [{g}, S] (one "
                      "row of block scales per token)"),
    113: (ValueError, "rank {rank}: x and {which} are on different devices"),
})  # fmt: skip
register_problems("MoEAllToAll.combine", range(120, 130), {
    120: (TypeError, "rank {rank}: handle must be the handle of a dispatch of this "
                     "layer, got {ty_a}"),
    121: (TypeError, "rank {rank}: expert_y must be a torch.Tensor, got {ty_a}"),
    122: (TypeError, "rank {rank}: expert_y has dtype {dt_a}, expected a floating dtype "
                     "(float32, float64, float16, bfloat16)"),
    123: (ValueError, "rank {rank}: expert_y has shape {shape}, expected {expected}"),
    124: (TypeError, "rank {rank}: topk_weights must be a torch.Tensor "
                     "(weighted=True), got {ty_a}"),
    125: (TypeError, "rank {rank}: topk_weights has dtype {dt_a}, expected a floating "
                     "dtype"),
    126: (ValueError, "rank {rank}: topk_weights has shape {shape}, expected "
                      "[{g}, experts_per_token={k}]"),
    127: (ValueError, "rank {rank}: expert_y and topk_weights are on different "
                      "devices"),
    128: (ValueError, "rank {rank}: handle comes from another MoEAllToAll layer; "
                      "combine takes the handle of a dispatch of this layer"),
    129: (ValueError, "rank {rank}: the handle of dispatch call {a} was already "
                      "combined (a stale or reused handle); each dispatch's handle "
                      "serves exactly one combine"),
})  # fmt: skip

__all__ = [
    "PROBLEM_WORDS",
    "ArgProblem",
    "check_config",
    "check_handle_ids",
    "check_same_layer",
    "config_fields",
    "config_fingerprint",
    "dtype_code",
    "dtype_name",
    "raise_first",
    "type_code",
    "type_name",
]

#: Integer dtypes accepted for ``topk_idx``; floating dtypes accepted for outputs and weights.
INDEX_DTYPES = ("int64", "int32", "int16", "uint8", "int8")
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")


def _shape(nums: tuple[int, ...]) -> str:
    nd = nums[0]
    if nd > len(nums) - 1:
        return f"a {nd}-D tensor"
    return "[" + ", ".join(str(v) for v in nums[1 : 1 + nd]) + "]"


_WHICH = {1: "topk_idx", 2: "x_scale"}


def _expected(rows: int, compact: int, fields: dict[str, Any]) -> str:
    if compact:
        return f"[{rows}, hidden_dim={fields['H']}] (one row per (token, local expert) pair)"
    return f"[{rows}, expert_capacity={fields['cap']}, hidden_dim={fields['H']}]"


def raise_first(meta: np.ndarray, fields: dict[str, Any]) -> None:
    """Raise the problem of the lowest rank whose row reports one (columns ``0..PROBLEM_WORDS``).

    The problems are :data:`pathweave.runtime.protocol.PROBLEMS` 101 to 129;
    their templates get the layer's ``fields`` (``k``, ``E``, ``H``,
    ``max_m``, ``cap``) and the shapes their numbers describe.
    """
    bad = np.flatnonzero(meta[:, 0])
    if bad.size:
        r = int(bad[0])
        a, b, c, d, e, f = (int(v) for v in meta[r, 1:7])
        raise_problem(r, meta[r, :PROBLEM_WORDS], shape=_shape((a, b, c, d)),
                      expected=_expected(e, f, fields), which=_WHICH.get(a, "?"), **fields)


def shape_nums(t: Any) -> tuple[int, int, int, int]:
    """``(ndim, d0, d1, d2)`` of a tensor, -1 where the tensor has fewer dims."""
    dims = list(t.shape)[:3]
    return (t.dim(), *(dims + [-1] * (3 - len(dims))))  # type: ignore[return-value]


#: Longest placement shown as a list in a mismatch message; longer ones show a digest.
_PLACEMENT_TEXT = 48


def config_fields(layer: Any) -> dict[str, Any]:
    """The layer parameters every rank must agree on, in the order a mismatch is reported.

    Each value's text is what :func:`~pathweave.runtime.protocol.fingerprint`
    compares and what the error shows.
    """
    place = ", ".join(str(int(p)) for p in layer.placement)
    if len(place) > _PLACEMENT_TEXT:
        from pathweave.moe.routing import fingerprint as digest

        place = f"digest {digest(layer.placement.reshape(1, -1)):#x}"
    else:
        place = f"[{place}]"
    return {
        "num_experts": layer.num_experts, "experts_per_token": layer.experts_per_token,
        "hidden_dim": layer.hidden_dim, "max_num_tokens": layer.max_num_tokens,
        "dtype": dtype_name(dtype_code(layer.dtype)), "layout": layer.layout,
        "dp_size": layer.dp_size, "expert_capacity": layer.expert_capacity,
        "placement": place, "group_size": layer.num_ranks,
    }  # fmt: skip


def config_fingerprint(layer: Any) -> np.ndarray:
    """The layer's :func:`config_fields` as fingerprint words (``int64[FP_WORDS]``)."""
    return fingerprint(config_fields(layer))


def check_config(rows: np.ndarray) -> None:
    """Raise if any rank's layer fingerprint (one row per rank) differs from rank 0's.

    Every rank holds the same ``rows`` after the exchange, so every rank
    raises the same error, naming the lowest differing rank, the first
    differing parameter of :func:`config_fields` and both values.

    Examples
    --------
    >>> a = fingerprint({"num_experts": 8, "hidden_dim": 32})
    >>> b = fingerprint({"num_experts": 16, "hidden_dim": 32})
    >>> check_config(np.stack([a, a, a, b]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: MoEAllToAll: rank 3 uses num_experts 16 but rank 0 uses 8; every rank ...
    """
    check_fingerprints(rows, "MoEAllToAll", "layer parameters")


def check_same_layer(layer_digests: np.ndarray, op: str) -> None:
    """Raise unless every rank called ``op`` of a layer with the same parameters.

    Examples
    --------
    >>> check_same_layer(np.array([5, 5, 6]), "dispatch")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: rank 2 called dispatch of another MoE layer than rank 0 (their parameters ...
    """
    bad = np.flatnonzero(layer_digests != layer_digests[0])
    if bad.size:
        raise ValueError(
            f"rank {int(bad[0])} called {op} of another MoE layer than rank 0 (their "
            "parameters differ); every rank must call the same layers in the same order"
        )


def check_handle_ids(call_ids: np.ndarray) -> None:
    """Raise unless every rank combines the handle of the same dispatch.

    Examples
    --------
    >>> check_handle_ids(np.array([2, 2, 1]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: rank 2 combines the handle of dispatch call 1 but rank 0 that of call 2; ...
    """
    bad = np.flatnonzero(call_ids != call_ids[0])
    if bad.size:
        r = int(bad[0])
        raise ValueError(
            f"rank {r} combines the handle of dispatch call {int(call_ids[r])} but rank 0 that "
            f"of call {int(call_ids[0])}; every rank must combine the handle of the same dispatch"
        )


# ------------------------------------------------- the layer's argument checks
def dtype_ok(t: torch.Tensor, names: Sequence[str]) -> bool:
    return str(t.dtype).removeprefix("torch.") in names


def check_dispatch(
    layer: Any, x: Any, topk_idx: Any, x_scale: Any) -> int:
    """Local checks of types, dtypes, shapes and devices; returns the scale columns (-1: none).

    The routing table's values are checked on its device
    (:func:`pathweave.moe.routing.check_topk`), with the counts.
    """
    if not isinstance(x, torch.Tensor):
        raise ArgProblem(101, type_code(x))
    if x.dtype != layer.dtype:
        raise ArgProblem(102, dtype_code(x.dtype), dtype_code(layer.dtype))
    if x.dim() != 2 or x.shape[1] != layer.hidden_dim:
        raise ArgProblem(103, *shape_nums(x))
    m = int(x.shape[0])
    if m > layer.max_num_tokens:
        raise ArgProblem(104, m)
    if not isinstance(topk_idx, torch.Tensor):
        raise ArgProblem(105, type_code(topk_idx))
    if not dtype_ok(topk_idx, INDEX_DTYPES):
        raise ArgProblem(106, dtype_code(topk_idx.dtype))
    if topk_idx.dim() != 2 or tuple(topk_idx.shape) != (m, layer.experts_per_token):
        raise ArgProblem(107, *shape_nums(topk_idx), 0, 0, m)
    if topk_idx.device != x.device:
        raise ArgProblem(113, 1)
    cols = -1
    if x_scale is not None:
        if not isinstance(x_scale, torch.Tensor):
            raise ArgProblem(110, type_code(x_scale))
        if x_scale.dtype != torch.float32:
            raise ArgProblem(111, dtype_code(x_scale.dtype))
        if x_scale.dim() != 2 or x_scale.shape[0] != m or x_scale.shape[1] < 1:
            raise ArgProblem(112, *shape_nums(x_scale), 0, 0, m)
        if x_scale.device != x.device:
            raise ArgProblem(113, 2)
        cols = int(x_scale.shape[1])
    return cols

def check_global(
    layer: Any, ms: np.ndarray, digests: np.ndarray, scols: np.ndarray, pairs: np.ndarray
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
    dp = layer.dp_size
    if dp > 1:
        for g in range(layer.num_dp_groups):
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
    over = np.flatnonzero(load > layer.expert_capacity)
    if over.size and layer.layout == "expert-major":
        e = int(over[0])
        raise ValueError(
            f"expert {e} (rank {int(layer.placement[e])}) would receive {int(load[e])} tokens, "
            f"more than expert_capacity={layer.expert_capacity}"
        )

def check_combine(
    layer: Any, expert_y: Any, handle: Any, topk_weights: Any, weighted: bool
) -> torch.Tensor | None:
    if not isinstance(handle, MoEHandle):
        raise ArgProblem(120, type_code(handle))
    if handle.owner is not layer:
        raise ArgProblem(128)
    if handle.combined:
        raise ArgProblem(129, handle.call_id)
    if not isinstance(expert_y, torch.Tensor):
        raise ArgProblem(121, type_code(expert_y))
    if not dtype_ok(expert_y, FLOAT_DTYPES):
        raise ArgProblem(122, dtype_code(expert_y.dtype))
    H = layer.hidden_dim
    if layer.layout == "compact":
        want: tuple[int, ...] = (handle.num_pairs, H)
        exp_nums = (handle.num_pairs, 1)
    else:
        want = (layer.num_local_experts, layer.expert_capacity, H)
        exp_nums = (layer.num_local_experts, 0)
    if tuple(expert_y.shape) != want:
        raise ArgProblem(123, *shape_nums(expert_y), *exp_nums)
    if not weighted:
        return None
    m = handle.num_tokens
    if not isinstance(topk_weights, torch.Tensor):
        raise ArgProblem(124, type_code(topk_weights))
    if not dtype_ok(topk_weights, FLOAT_DTYPES):
        raise ArgProblem(125, dtype_code(topk_weights.dtype))
    if tuple(topk_weights.shape) != (m, layer.experts_per_token):
        raise ArgProblem(126, *shape_nums(topk_weights), 0, 0, m)
    if topk_weights.device != expert_y.device:
        raise ArgProblem(127)
    return topk_weights.to(torch.float32)
