"""Guardrails of dispatch and combine that raise the same error on every rank.

A rank that finds a problem in its own arguments does not raise on the spot:
its peers would wait forever in the next collective. It writes an error code
and a few numbers into its metadata row instead; after the one metadata
exchange every rank holds every row and raises the error of the lowest
failing rank, with the same message, before any data moves. Checks that need
several ranks' facts (scales on some ranks only, DP replicas that differ,
expert capacity) run on the gathered rows the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# One dtype numbering for every metadata row pathweave exchanges.
from pathweave.runtime._validate import dtype_code, dtype_name

__all__ = [
    "CONFIG_FIELDS",
    "ERR_FIELDS",
    "MoEArgError",
    "check_config",
    "check_handle_ids",
    "check_same_layer",
    "dtype_code",
    "dtype_name",
    "raise_first",
    "type_code",
]

#: Error code plus this many numbers per row.
ERR_FIELDS = 8

_TYPES = ("None", "list", "tuple", "int", "float", "str", "ndarray", "Tensor")

#: Integer dtypes accepted for ``topk_idx``; floating dtypes accepted for outputs and weights.
INDEX_DTYPES = ("int64", "int32", "int16", "uint8", "int8")
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")


def type_code(x: Any) -> int:
    name = type(x).__name__
    return _TYPES.index(name) if name in _TYPES else len(_TYPES)


def type_name(code: int) -> str:
    return _TYPES[code] if 0 <= code < len(_TYPES) else "another type"


class MoEArgError(Exception):
    """A local problem found on this rank: an error code and up to 7 numbers."""

    def __init__(self, code: int, *nums: int):
        super().__init__(code, *nums)
        self.code = code
        self.nums = tuple(int(v) for v in nums)

    def row(self) -> np.ndarray:
        out = np.zeros(ERR_FIELDS, dtype=np.int64)
        out[0] = self.code
        out[1 : 1 + len(self.nums)] = self.nums
        return out


def _shape(nums: tuple[int, ...]) -> str:
    nd = nums[0]
    if nd > len(nums) - 1:
        return f"a {nd}-D tensor"
    return "[" + ", ".join(str(v) for v in nums[1 : 1 + nd]) + "]"


# code -> (exception type, message template). Templates get ``rank``, the
# numbers ``a..g``, the layer's fields (``k``, ``E``, ``H``, ``max_m``) and
# preformatted helpers (``dt_a`` dtype name of a, ``ty_a`` type name of a,
# ``shape`` a shape from the numbers, ``expected`` another).
_MESSAGES: dict[int, tuple[type[Exception], str]] = {
    1: (TypeError, "rank {rank}: x must be a torch.Tensor, got {ty_a}"),
    2: (TypeError, "rank {rank}: x has dtype {dt_a}, expected {dt_b} (the layer's dtype)"),
    3: (ValueError, "rank {rank}: x has shape {shape}, expected [m, hidden_dim={H}]"),
    4: (ValueError, "rank {rank}: x has {a} tokens, more than max_num_tokens={max_m}"),
    5: (TypeError, "rank {rank}: topk_idx must be a torch.Tensor, got {ty_a}"),
    6: (TypeError, "rank {rank}: topk_idx has dtype {dt_a}, expected an integer dtype"),
    7: (
        ValueError,
        "rank {rank}: topk_idx has shape {shape}, expected [{g}, experts_per_token={k}] "
        "(one row per token of x)",
    ),
    8: (ValueError, "rank {rank}: topk_idx[{a}, {b}] = {c} is out of range [-1, {E})"),
    9: (
        ValueError,
        "rank {rank}: token {a} is routed to expert {c} twice (topk_idx[{a}, {b}] repeats an "
        "earlier slot)",
    ),
    10: (TypeError, "rank {rank}: x_scale must be a torch.Tensor or None, got {ty_a}"),
    11: (TypeError, "rank {rank}: x_scale has dtype {dt_a}, expected float32"),
    12: (
        ValueError,
        "rank {rank}: x_scale has shape {shape}, expected [{g}, S] (one row of block scales "
        "per token)",
    ),
    13: (ValueError, "rank {rank}: x and {which} are on different devices"),
    20: (TypeError, "rank {rank}: handle must be the handle of a dispatch of this layer, "
                    "got {ty_a}"),
    21: (TypeError, "rank {rank}: expert_y must be a torch.Tensor, got {ty_a}"),
    22: (
        TypeError,
        "rank {rank}: expert_y has dtype {dt_a}, expected a floating dtype "
        "(float32, float64, float16, bfloat16)",
    ),
    23: (ValueError, "rank {rank}: expert_y has shape {shape}, expected {expected}"),
    24: (TypeError, "rank {rank}: topk_weights must be a torch.Tensor (weighted=True), got {ty_a}"),
    25: (TypeError, "rank {rank}: topk_weights has dtype {dt_a}, expected a floating dtype"),
    26: (
        ValueError,
        "rank {rank}: topk_weights has shape {shape}, expected [{g}, experts_per_token={k}]",
    ),
    27: (ValueError, "rank {rank}: expert_y and topk_weights are on different devices"),
    28: (
        ValueError,
        "rank {rank}: handle comes from another MoEAllToAll layer; combine takes the handle "
        "of a dispatch of this layer",
    ),
    29: (
        ValueError,
        "rank {rank}: the handle of dispatch call {a} was already combined (a stale or reused "
        "handle); each dispatch's handle serves exactly one combine",
    ),
}
_WHICH = {1: "topk_idx", 2: "x_scale"}


def message(code: int, rank: int, nums: np.ndarray, fields: dict[str, Any]) -> tuple[type, str]:
    exc, tmpl = _MESSAGES[code]
    a, b, c, d, e, f, g = (int(v) for v in nums[:7])
    text = tmpl.format(
        rank=rank, a=a, b=b, c=c, d=d, e=e, f=f, g=g,
        dt_a=dtype_name(a), dt_b=dtype_name(b), ty_a=type_name(a),
        shape=_shape((a, b, c, d)), expected=_expected(e, f, fields),
        which=_WHICH.get(a, "?"), **fields,
    )  # fmt: skip
    return exc, text


def _expected(rows: int, compact: int, fields: dict[str, Any]) -> str:
    if compact:
        return f"[{rows}, hidden_dim={fields['H']}] (one row per (token, local expert) pair)"
    return f"[{rows}, expert_capacity={fields['cap']}, hidden_dim={fields['H']}]"


def raise_first(meta: np.ndarray, fields: dict[str, Any]) -> None:
    """Raise the error of the lowest rank whose row reports one (columns ``0..ERR_FIELDS``)."""
    bad = np.flatnonzero(meta[:, 0])
    if bad.size:
        r = int(bad[0])
        exc, text = message(int(meta[r, 0]), r, meta[r, 1:ERR_FIELDS], fields)
        raise exc(text)


def shape_nums(t: Any) -> tuple[int, int, int, int]:
    """``(ndim, d0, d1, d2)`` of a tensor, -1 where the tensor has fewer dims."""
    dims = list(t.shape)[:3]
    return (t.dim(), *(dims + [-1] * (3 - len(dims))))  # type: ignore[return-value]


#: Layer parameters every rank must agree on, in the order a mismatch is reported.
CONFIG_FIELDS = (
    "num_experts", "experts_per_token", "hidden_dim", "max_num_tokens", "dtype", "layout",
    "dp_size", "expert_capacity", "placement", "group size",
)


def _config_value(name: str, value: int, layouts: tuple[str, ...]) -> str:
    if name == "dtype":
        return dtype_name(value)
    if name == "layout":
        return repr(layouts[value]) if 0 <= value < len(layouts) else f"<layout {value}>"
    if name == "placement":
        return f"an expert placement with digest {value:#x}"
    return str(value)


def check_config(rows: np.ndarray, layouts: tuple[str, ...]) -> None:
    """Raise if any rank's layer parameters (one row per rank) differ from rank 0's.

    Every rank holds the same ``rows`` after the exchange, so every rank
    raises the same error, naming the lowest differing rank and the first
    differing parameter in :data:`CONFIG_FIELDS` order.

    Examples
    --------
    >>> rows = np.array([[8, 2, 32, 8, 1, 0, 1, 32, 7, 4]] * 4)
    >>> rows[3, 0] = 16
    >>> check_config(rows, ("expert-major", "compact"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: rank 3 uses num_experts=16 but rank 0 uses num_experts=8; every rank must ...
    """
    diff = rows != rows[0]
    bad = np.flatnonzero(diff.any(axis=1))
    if not bad.size:
        return
    r = int(bad[0])
    c = int(np.flatnonzero(diff[r])[0])
    name = CONFIG_FIELDS[c]
    mine, first = (_config_value(name, int(rows[i, c]), layouts) for i in (r, 0))
    sep = " " if name == "placement" else "="
    raise ValueError(
        f"rank {r} uses {name}{sep}{mine} but rank 0 uses {name}{sep}{first}; every rank "
        "must build the MoE layer with the same parameters"
    )


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
