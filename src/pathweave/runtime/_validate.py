"""Argument checks of the data plane: one private helper per argument kind.

Checks come in two halves. Local facts about a rank's arguments (tensor
types, split list lengths, negative sizes, sums) are *encoded* into the rank's
metadata row instead of being raised on the spot: a rank that raised alone
would leave its peers waiting in the exchange. After the exchange every rank
holds every row and *decodes* them the same way, so bad input raises the same
exception with the same message on every rank, before any data moves.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from pathweave import _check
from pathweave._cache import Cache

__all__ = [
    "PROBLEMS", "PROBLEM_RANGES", "PROBLEM_WORDS", "A2ALayout", "ArgProblem", "MatrixCall",
    "check_fingerprints", "check_matrix_call", "check_split_matrix", "decode_a2a", "encode_a2a",
    "fingerprint", "fingerprint_digest", "raise_first_problem", "raise_problem",
    "register_problems", "same_digests", "type_code", "type_name",
]

# ------------------------------------------------------------------ dtypes
_DTYPE_NAMES = (
    "float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64",
    "bool", "complex64", "complex128", "uint16", "uint32", "uint64",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
)  # fmt: skip


#: Code of each dtype name (its place in ``_DTYPE_NAMES`` plus one; 0: unknown).
_DTYPE_CODES = {name: i + 1 for i, name in enumerate(_DTYPE_NAMES)}


def dtype_code(dtype: Any) -> int:
    """A small integer naming ``dtype``, the same in every process (0: unknown)."""
    # By name: a torch.dtype prints as "torch.<name>" (an alias such as torch.half
    # as its canonical name), so no table of torch's objects is built and kept.
    kind = type(dtype)
    if kind.__name__ != "dtype" or kind.__module__ != "torch":
        return 0
    return _DTYPE_CODES.get(str(dtype).removeprefix("torch."), 0)


def dtype_name(code: int) -> str:
    return _DTYPE_NAMES[code - 1] if 0 < code <= len(_DTYPE_NAMES) else f"<dtype code {code}>"


# ------------------------------------------------- rank-consistent errors
# One mechanism for every op that exchanges a metadata row (all_to_all_single
# and its list form, batch_isend_irecv, MoEAllToAll dispatch and combine): a
# local check raises ArgProblem(code, numbers); the op catches it and writes
# its words into the row instead of raising alone (its peers would wait in
# the exchange); after the exchange every rank calls raise_problem on the
# lowest failing rank's words, so every rank raises the same exception with
# the same message before any data moves.

#: Words of a problem in a metadata row: its code and up to 7 numbers.
PROBLEM_WORDS = 8


class ArgProblem(Exception):
    """A problem in this rank's own arguments: a :data:`PROBLEMS` code and its numbers."""

    def __init__(self, code: int, *nums: int):
        super().__init__(code, *nums)
        if code not in PROBLEMS:
            raise KeyError(f"unknown problem code {code}")
        self.code = code
        self.nums = tuple(int(v) for v in nums)

    def words(self, width: int = PROBLEM_WORDS) -> np.ndarray:
        """The problem as ``int64[width]`` row words: the code, then the numbers."""
        if len(self.nums) >= width:
            raise ValueError(f"problem {self.code} has {len(self.nums)} numbers; "
                             f"{width - 1} fit in the row")
        out = np.zeros(width, dtype=np.int64)
        out[0] = self.code
        out[1 : 1 + len(self.nums)] = self.nums
        return out


_A2A, _A2A_LIST, _P2P = "all_to_all_single", "all_to_all", "batch_isend_irecv"
#: code -> (exception type, op, message template): every op's rank-consistent
#: errors in one table, each op's codes registered by the op itself
#: (:func:`register_problems`). Templates get ``rank``, the numbers ``a`` to
#: ``g``, their dtype names ``dt_a`` .. (:func:`dtype_name`), their type
#: names ``ty_a`` .. (:func:`type_name`) and what the op's caller of
#: :func:`raise_problem` adds (``which``, shapes, a layer's parameters).
PROBLEMS: dict[int, tuple[type[Exception], str, str]] = {}
#: op -> the code range it registered.
PROBLEM_RANGES: dict[str, range] = {}


def register_problems(op: str, codes: range,
                      problems: Mapping[int, tuple[type[Exception], str]]) -> None:
    """Register ``op``'s rank-consistent errors: ``code -> (exception type, template)``.

    Each op owns a range of codes (``codes``) that no other op's overlaps;
    its problems must lie in it. Registering the same op with the same
    table again (a module imported twice) changes nothing.

    >>> register_problems("all_to_all_single", range(1, 30), {})
    Traceback (most recent call last):
    ...
    ValueError: problem codes of 'all_to_all_single' are registered already (range(1, 20))
    """
    table = {int(c): (exc, op, text) for c, (exc, text) in problems.items()}
    if op in PROBLEM_RANGES:
        if PROBLEM_RANGES[op] == codes and all(PROBLEMS.get(c) == v for c, v in table.items()):
            return
        raise ValueError(f"problem codes of {op!r} are registered already "
                         f"({PROBLEM_RANGES[op]})")
    for other, rng in PROBLEM_RANGES.items():
        if codes.start < rng.stop and rng.start < codes.stop:
            raise ValueError(f"problem codes {codes} of {op!r} overlap {rng} of {other!r}")
    outside = sorted(c for c in table if c not in codes)
    if outside or codes.start < 1:
        raise ValueError(f"problem codes {outside or [codes.start]} of {op!r} are outside "
                         f"its range {codes} (codes start at 1)")
    PROBLEM_RANGES[op] = codes
    PROBLEMS.update(table)


register_problems(_A2A, range(1, 20), {
    1: (TypeError, "rank {rank}: {which} must be a torch.Tensor, got {ty_b}"),
    2: (TypeError, "rank {rank}: {which}_split_sizes must be a sequence of ints, got {ty_b}"),
    3: (ValueError, "rank {rank}: {which}_split_sizes has {b} entries, expected {c} "
                    "(group size)"),
    4: (ValueError, "rank {rank}: {which}_split_sizes[{b}] = {c} is negative"),
    5: (ValueError, "rank {rank}: {which}_split_sizes add up to {b} rows but {which} has "
                    "{c} rows (size of dim 0)"),
    6: (ValueError, "rank {rank}: {which} has {b} rows, not divisible by the group size "
                    "{c}; pass {which}_split_sizes"),
    7: (ValueError, "rank {rank}: {which} is a 0-dimensional tensor; it needs a first "
                    "dimension"),
    8: (ValueError, "rank {rank}: input and output are on different devices"),
    9: (TypeError, "rank {rank}: input has dtype {dt_b} but output has dtype {dt_c}"),
    10: (ValueError, "rank {rank}: input rows have shape {in_shape} but output rows have "
                     "shape {out_shape}"),
})  # fmt: skip
register_problems(_A2A_LIST, range(20, 40), {
    20: (TypeError, "rank {rank}: {which}_tensors must be a sequence of tensors, got {ty_b}"),
    21: (ValueError, "rank {rank}: {which}_tensors has {b} tensors, expected {c} "
                     "(group size)"),
    22: (TypeError, "rank {rank}: {which}_tensors[{b}] must be a torch.Tensor, got {ty_c}"),
    23: (TypeError, "rank {rank}: {which}_tensors[{b}] has dtype {dt_c} but "
                    "input_tensors[0] has {dt_d}; all tensors must share one dtype"),
    24: (ValueError, "rank {rank}: {which}_tensors[{b}] is on another device than "
                     "input_tensors[0]"),
})  # fmt: skip
register_problems(_P2P, range(40, 60), {
    41: (TypeError, "rank {rank}: ops[{a}] is not a torch.distributed.P2POp"),
    42: (ValueError, "rank {rank}: ops[{a}] uses another op; only isend and irecv are "
                     "supported"),
    43: (ValueError, "rank {rank}: ops[{a}] has peer {b}, outside the group of {c} ranks"),
    44: (ValueError, "rank {rank}: ops[{a}] has itself (rank {b}) as its peer"),
    45: (ValueError, "rank {rank}: ops[{a}] belongs to another process group"),
    46: (ValueError, "rank {rank}: ops[{a}] has a tensor on another device than ops[0]"),
    47: (ValueError, "rank {rank}: ops[{a}] has tag {b}; tags must be in [0, 2**31)"),
})  # fmt: skip


def raise_problem(rank: int, words: np.ndarray, **extra: Any) -> None:
    """Raise the problem in ``words`` (:meth:`ArgProblem.words`) that ``rank`` reported.

    ``extra`` fills the template's op-specific names. Every rank holds the
    same words after the exchange, so every rank raises the same exception
    with the same message.
    """
    code = int(words[0])
    exc, op, template = PROBLEMS.get(
        code, (ValueError, "pathweave", "rank {rank}: invalid arguments (problem code {code})"))
    nums = [int(v) for v in words[1:PROBLEM_WORDS]]
    letters = dict(zip("abcdefg", nums + [0] * (7 - len(nums)), strict=True))
    names: dict[str, Any] = {"rank": rank, "code": code, **letters}
    for k, v in letters.items():
        names[f"dt_{k}"] = dtype_name(v)
        names[f"ty_{k}"] = type_name(v)
    names.update(extra)
    raise exc(f"{op}: " + template.format(**names))


def raise_first_problem(rows: np.ndarray, **extra: Any) -> None:
    """Raise the problem of the lowest rank whose row (problem words first) reports one."""
    bad = np.flatnonzero(rows[:, 0])
    if bad.size:
        raise_problem(int(bad[0]), rows[int(bad[0])], **extra)


_WHICH = ("input", "output")
#: Type names a row can carry: ``type_code(x)`` is the index of ``type(x).__name__``.
_TYPE_NAMES = ("None", "list", "tuple", "int", "float", "str", "ndarray", "Tensor")


def type_code(x: Any) -> int:
    """A small integer naming ``type(x)`` in a metadata row (one numbering for every row)."""
    name = type(x).__name__
    return _TYPE_NAMES.index(name) if name in _TYPE_NAMES else len(_TYPE_NAMES)


def type_name(code: int) -> str:
    """The type name of :func:`type_code` ``code`` (``"another type"`` if none)."""
    return _TYPE_NAMES[code] if 0 <= code < len(_TYPE_NAMES) else "another type"


_MAX_TRAIL = 6
# Row layout: problem words, header fields, trailing shapes, the two split lists.
_IN_DT, _IN_ES, _OUT_DT, _OUT_ES = (PROBLEM_WORDS + i for i in range(4))
_IN_ROWS, _OUT_ROWS, _IN_ND, _OUT_ND = (PROBLEM_WORDS + i for i in range(4, 8))
_IN_ROWEL, _OUT_ROWEL = PROBLEM_WORDS + 8, PROBLEM_WORDS + 9
_IN_TRAIL = PROBLEM_WORDS + 10
_OUT_TRAIL = _IN_TRAIL + _MAX_TRAIL
_HEADER = _OUT_TRAIL + _MAX_TRAIL
# After the header: the input splits (N words), then one word, a digest of the
# output splits (:func:`split_digests`): a row is O(N), 8.3 KiB at 1024 ranks
# where both split lists took 18 KiB. The output splits themselves travel only
# when a digest disagrees (every rank sees it, so every rank exchanges them).
_OUT_DIGEST = 1


def meta_width(num_ranks: int) -> int:
    """Length of one rank's metadata row for ``all_to_all_single`` (fingerprint included)."""
    return _HEADER + num_ranks + _OUT_DIGEST + FP_WORDS


#: Digest weights per group size (deterministic; kept for the hot path).
_DIGEST_WEIGHTS: Cache[np.ndarray] = Cache(16)


def split_digests(splits: np.ndarray) -> np.ndarray:
    """A 64-bit digest of each column of ``splits`` (``int[N]`` or ``int[N, M]``), as ``int64``.

    ``sum_s splits[s] * w[s]`` modulo ``2**64`` with fixed odd weights ``w``
    (the same in every process): a change of one entry always changes it, and
    column ``d`` of every rank's input splits digests to rank ``d``'s output
    splits' digest exactly when they are equal, but for chance (``2**-64``).

    >>> a = np.array([[0, 3], [5, 0]])
    >>> bool(split_digests(a)[1] == split_digests(np.array([3, 0])))
    True
    """
    n = splits.shape[0]
    w = _DIGEST_WEIGHTS.get_or_build(
        n, lambda: np.random.default_rng(0x9E3779B9).integers(0, 2**63, n, dtype=np.uint64) * 2 + 1)
    u = np.ascontiguousarray(splits, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        d = (u.T * w).sum(axis=-1, dtype=np.uint64) if u.ndim == 2 else (u * w).sum(
            dtype=np.uint64)
    return np.asarray(d, dtype=np.uint64).view(np.int64)


def _tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def _splits(
    splits: Any, rows: int, n: int, which: int, row: np.ndarray, col: int
) -> tuple[int, int, int]:
    """Write a split list into ``row[col:col+n]``; return an error triple (0 if fine)."""
    if splits is None:
        if rows % n:
            return 6, rows, n
        row[col : col + n] = rows // n
        return 0, 0, 0
    if isinstance(splits, (str, bytes)):
        return 2, type_code(splits), 0
    try:
        arr = np.asarray(splits)  # torch accepts any sequence of ints (a list, a tensor)
    except Exception:
        return 2, type_code(splits), 0
    if arr.ndim != 1:
        return 2, type_code(splits), 0
    if arr.size != n:
        return 3, arr.size, n
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind != "f" or not np.array_equal(arr, np.floor(arr)):
            return 2, type_code(splits), 0
        arr = arr.astype(np.int64)
    neg = np.flatnonzero(arr < 0)
    if neg.size:
        return 4, int(neg[0]), int(arr[neg[0]])
    total = int(arr.sum())
    if total != rows:
        return 5, total, rows
    row[col : col + n] = arr
    return 0, 0, 0


def _trail(t: Any, row: np.ndarray, col: int) -> None:
    dims = list(t.shape[1:])
    row[col : col + _MAX_TRAIL] = -1
    for i, v in enumerate(dims[:_MAX_TRAIL]):
        row[col + i] = v


def encode_a2a(
    output: Any, input: Any, output_split_sizes: Any, input_split_sizes: Any, num_ranks: int,
    config: np.ndarray | None = None, problem: ArgProblem | None = None,
    outs: np.ndarray | None = None,
) -> np.ndarray:
    """This rank's metadata row for ``all_to_all_single`` (``int64[meta_width(n)]``).

    ``config`` is the call's :func:`fingerprint` (default: no fields); it
    travels at the end of the row. Never raises on bad arguments: it records
    the first problem in the row, or ``problem``, one its caller found (the
    list form's). The output splits travel as a digest; ``outs``
    (``int64[n]``), if given, receives them, for :func:`decode_a2a` and
    :func:`check_split_matrix`.
    """
    n = num_ranks
    row = np.zeros(meta_width(n), dtype=np.int64)
    row[_HEADER + n + _OUT_DIGEST :] = fingerprint({}) if config is None else config
    mine = np.zeros(n, dtype=np.int64) if outs is None else outs

    def fail(code: int, which: int, b: int = 0, c: int = 0) -> np.ndarray:
        row[:PROBLEM_WORDS] = ArgProblem(code, which, b, c).words()
        return row

    if problem is not None:
        row[:PROBLEM_WORDS] = problem.words()
        return row

    for which, t in ((0, input), (1, output)):
        if not _tensor(t):
            return fail(1, which, type_code(t))
        if t.dim() == 0:
            return fail(7, which)
    if input.device != output.device:
        return fail(8, 0)
    ci, co = dtype_code(input.dtype), dtype_code(output.dtype)
    if input.dtype != output.dtype:
        return fail(9, 0, ci, co)
    if tuple(input.shape[1:]) != tuple(output.shape[1:]):
        _trail(input, row, _IN_TRAIL)
        _trail(output, row, _OUT_TRAIL)
        return fail(10, 0)
    row[_IN_DT], row[_IN_ES] = ci, input.element_size()
    row[_OUT_DT], row[_OUT_ES] = co, output.element_size()
    row[_IN_ROWS], row[_OUT_ROWS] = input.shape[0], output.shape[0]
    row[_IN_ND], row[_OUT_ND] = input.dim(), output.dim()
    row[_IN_ROWEL] = math.prod(input.shape[1:])
    row[_OUT_ROWEL] = math.prod(output.shape[1:])
    _trail(input, row, _IN_TRAIL)
    _trail(output, row, _OUT_TRAIL)
    for which, splits, rows, dst, col in (
        (0, input_split_sizes, input.shape[0], row, _HEADER),
        (1, output_split_sizes, output.shape[0], mine, 0),
    ):
        code, b, c = _splits(splits, int(rows), n, which, dst, col)
        if code:
            return fail(code, which, b, c)
    row[_HEADER + n] = split_digests(mine)
    return row


@dataclass(frozen=True, eq=False)
class A2ALayout:
    """The validated facts of one ``all_to_all_single`` call, the same on every rank.

    Attributes
    ----------
    in_rows : int64[N, N]
        ``in_rows[s, d]``: rows rank ``s`` sends to ``d`` (equals ``d``'s output split for ``s``).
    row_bytes : int
        Bytes per row (element size times trailing elements).
    """

    in_rows: np.ndarray
    row_bytes: int

    @functools.cached_property
    def pair_bytes(self) -> np.ndarray:
        """``int64[N, N]``: bytes of every pair (made once: a cached call reads it each time)."""
        return self.in_rows * self.row_bytes


def _shape_text(row: np.ndarray, col: int, nd: int) -> str:
    dims = [int(v) for v in row[col : col + min(nd - 1, _MAX_TRAIL)]]
    return "(" + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"


def _raise_local(rank: int, row: np.ndarray) -> None:
    """Raise the problem an ``all_to_all_single`` row of ``rank`` reports."""
    which = int(row[1])
    shapes = {}
    for key, col in (("in_shape", _IN_TRAIL), ("out_shape", _OUT_TRAIL)):
        nd = int((row[col : col + _MAX_TRAIL] >= 0).sum()) + 1
        shapes[key] = _shape_text(row, col, nd)
    raise_problem(rank, row[:PROBLEM_WORDS], which=_WHICH[which] if which in (0, 1) else which,
                  **shapes)


def decode_a2a(meta: np.ndarray,
               outs: np.ndarray | Callable[[], np.ndarray] | None = None) -> A2ALayout:
    """Check every rank's row and return the call's layout; raise on the first problem.

    The rows are the same on every rank, so every rank raises the same
    exception with the same message. ``outs``: every rank's output splits
    (``int64[N, N]``, rank order), or a collective that gathers them (each
    rank's :func:`encode_a2a` ``outs``); asked for only when a rank's digest
    disagrees with what the ranks send it, to name the pair and both numbers.
    """
    n = meta.shape[0]
    check_fingerprints(meta[:, _HEADER + n + _OUT_DIGEST :], "all_to_all_single")
    bad = np.flatnonzero(meta[:, 0])
    if bad.size:
        _raise_local(int(bad[0]), meta[int(bad[0])])
    for col, what in ((_IN_DT, "dtype"), (_IN_ES, "element size")):
        diff = np.flatnonzero(meta[:, col] != meta[0, col])
        if diff.size:
            r = int(diff[0])
            a, b = int(meta[r, col]), int(meta[0, col])
            if col == _IN_DT:
                a_s, b_s = dtype_name(a), dtype_name(b)
            else:
                a_s, b_s = str(a), str(b)
            raise TypeError(
                f"all_to_all_single: rank {r} has {what} {a_s} but rank 0 has {b_s}; "
                "every rank must exchange the same dtype"
            )
    trail = meta[:, np.r_[_IN_ND, _IN_ROWEL, _IN_TRAIL : _IN_TRAIL + _MAX_TRAIL]]
    diff = np.flatnonzero((trail != trail[0]).any(axis=1))
    if diff.size:
        r = int(diff[0])
        raise ValueError(
            f"all_to_all_single: rank {r}'s rows have shape "
            f"{_shape_text(meta[r], _IN_TRAIL, int(meta[r, _IN_ND]))} but rank 0's have "
            f"{_shape_text(meta[0], _IN_TRAIL, int(meta[0, _IN_ND]))}; every rank must "
            "exchange rows of the same shape"
        )
    ins = meta[:, _HEADER : _HEADER + n]
    if not np.array_equal(split_digests(ins), meta[:, _HEADER + n]):
        _raise_split_mismatch(ins, meta[:, _HEADER + n], outs() if callable(outs) else outs)
    row_bytes = int(meta[0, _IN_ES]) * int(meta[0, _IN_ROWEL])
    return A2ALayout(np.ascontiguousarray(ins), row_bytes)


def _raise_split_mismatch(ins: np.ndarray, digests: np.ndarray,
                          outs: np.ndarray | None) -> None:
    """Name the first pair whose splits disagree (only a rank's digest, without ``outs``)."""
    n = ins.shape[0]
    if outs is None:
        d = int(np.flatnonzero(split_digests(ins) != digests)[0])
        raise ValueError(f"all_to_all_single: rank {d}'s output splits disagree with what the "
                         f"ranks send it ({ins[:, d].tolist()[:8]} rows from ranks 0, 1, ...)")
    outs = np.asarray(outs)
    mism = np.flatnonzero((ins != outs.T).reshape(-1))
    s, d = divmod(int(mism[0]), n)
    raise ValueError(
        f"all_to_all_single: rank {s}'s input split for rank {d} is {int(ins[s, d])} rows "
        f"but rank {d}'s output split for rank {s} is {int(outs[d, s])} rows "
        f"({mism.size} pair(s) disagree)"
    )


def check_split_matrix(matrix: Any, row: np.ndarray, rank: int, num_ranks: int,
                       outs: np.ndarray) -> A2ALayout:
    """The layout of a call whose caller passed every rank's splits; local checks only.

    ``matrix[s, d]`` is the rows rank ``s`` sends to rank ``d``. ``row`` is
    this rank's :func:`encode_a2a` row and ``outs`` its output splits: a
    local problem in the row is raised, then this rank's input splits must
    equal ``matrix[rank]`` and its output splits ``matrix[:, rank]``. Raises
    ``TypeError``/``ValueError`` naming the entry and the numbers.
    """
    n = num_ranks
    if row[0]:
        _raise_local(rank, row)
    if hasattr(matrix, "detach"):
        matrix = matrix.detach().cpu().numpy()
    try:
        m = np.asarray(matrix)
    except Exception as exc:
        raise TypeError(f"all_to_all_single: split_matrix must be an int array, got "
                        f"{type(matrix).__name__}") from exc
    if m.dtype.kind not in "iu":
        raise TypeError(f"all_to_all_single: split_matrix must hold integers, got dtype {m.dtype}")
    if m.shape != (n, n):
        raise ValueError(f"all_to_all_single: split_matrix has shape {m.shape}, expected "
                         f"({n}, {n}) (group size)")
    neg = np.argwhere(m < 0)
    if neg.size:
        s, d = (int(v) for v in neg[0])
        raise ValueError(f"all_to_all_single: split_matrix[{s}, {d}] = {int(m[s, d])} is negative")
    ins = row[_HEADER : _HEADER + n]
    bad = np.flatnonzero(ins != m[rank])
    if bad.size:
        d = int(bad[0])
        raise ValueError(f"all_to_all_single: rank {rank}'s input split for rank {d} is "
                         f"{int(ins[d])} rows but split_matrix[{rank}, {d}] = {int(m[rank, d])}")
    bad = np.flatnonzero(outs != m[:, rank])
    if bad.size:
        s = int(bad[0])
        raise ValueError(f"all_to_all_single: rank {rank}'s output split for rank {s} is "
                         f"{int(outs[s])} rows but split_matrix[{s}, {rank}] = {int(m[s, rank])}")
    row_bytes = int(row[_IN_ES]) * int(row[_IN_ROWEL])
    return A2ALayout(np.ascontiguousarray(m, dtype=np.int64), row_bytes)


@dataclass(frozen=True, eq=False)
class MatrixCall:
    """What a ``split_matrix`` call's local checks found (:func:`check_matrix_call`).

    Attributes
    ----------
    key : tuple | None
        The arguments' facts the checks read (``None``: not kept).
    row, outs : int64 arrays
        This rank's :func:`encode_a2a` row and output splits.
    layout : A2ALayout
    same_config : bool
        Whether ``config_digests`` vouch for every rank's configuration.
    mkey : bytes
        The call's metadata key: all splits, the row size, the configuration.
    matrix : int64 array or None
        A copy of the split matrix the checks read (``None``: not kept).
    """

    key: tuple[Any, ...] | None
    row: np.ndarray
    outs: np.ndarray
    layout: A2ALayout
    same_config: bool
    mkey: bytes
    #: a copy of the split matrix checked (compared with the next call's; None: not kept)
    matrix: np.ndarray | None = None


def _matrix_call_key(output: Any, input: Any, output_split_sizes: Any, input_split_sizes: Any,
                     words: np.ndarray, matrix: Any, digests: Any) -> tuple[Any, ...] | None:
    """Every fact of a ``split_matrix`` call its checks read, or ``None`` where one is hard to
    pin down cheaply (splits or matrix given as tensors, non-tensor buffers)."""
    if not (_tensor(input) and _tensor(output)):
        return None
    facts: list[Any] = [input.dtype, input.shape, input.device, output.dtype, output.shape,
                        output.device, words.tobytes()]
    for splits in (input_split_sizes, output_split_sizes):
        if splits is not None and not isinstance(splits, (list, tuple)):
            return None
        facts.append(None if splits is None else tuple(splits))
    if any(a is not None and not isinstance(a, np.ndarray) for a in (matrix, digests)):
        return None
    # The matrix's values are compared apart (_same_matrix): N * N words
    # copied into bytes for every call was ~0.7 ms at 1024 ranks.
    facts.append(None if matrix is None else (matrix.dtype.str, matrix.shape))
    facts.append(None if digests is None else (digests.dtype.str, digests.shape,
                                               digests.tobytes()))
    return tuple(facts)


@njit(cache=True, nogil=True)
def _same_words(a, b):  # pragma: no cover - numba
    """Whether two ``int64`` arrays of one size hold the same words (no early exit:
    a cached call's matrix is the same, so every word is read anyway)."""
    diff = 0
    for i in range(a.size):
        diff |= a[i] ^ b[i]
    return diff == 0


def _same_words_reference(a: np.ndarray, b: np.ndarray) -> bool:
    """:func:`_same_words`'s slow twin."""
    return bool(np.array_equal(a, b))


def _same_matrix(last: MatrixCall, matrix: Any) -> bool:
    """Whether ``matrix`` holds the values of the one ``last`` was checked with (a kept copy).

    Its dtype and shape are the kept copy's (the call's key). A C-ordered
    matrix is compared word by word (:func:`_same_words`: at 1024 ranks
    ``np.array_equal`` took 2-3 ms of a cached call, a fifth of its host work);
    equal bytes are equal values, and unequal bytes of equal values (a float
    ``-0.0``) only make the call be checked again.
    """
    if matrix is None or last.matrix is None:
        return matrix is None and last.matrix is None
    kept = last.matrix
    if matrix.flags.c_contiguous and matrix.nbytes % 8 == 0 and matrix.nbytes == kept.nbytes:
        return bool(_same_words(matrix.reshape(-1).view(np.int64),
                                kept.reshape(-1).view(np.int64)))
    return bool(np.array_equal(matrix, kept))


def check_matrix_call(
    last: MatrixCall | None, output: Any, input: Any, output_split_sizes: Any,
    input_split_sizes: Any, rank: int, num_ranks: int, words: np.ndarray, matrix: Any,
    digests: Any, problem: ArgProblem | None = None,
) -> MatrixCall:
    """A ``split_matrix`` call's local checks (:func:`encode_a2a`,
    :func:`check_split_matrix`, :func:`same_digests` if ``digests`` are given).

    ``last``, the previous call's result: if this call's arguments hold the
    same facts (dtypes, shapes, devices, splits, matrix, digests, the
    configuration's ``words``) and no ``problem``, it passed these checks
    already and is returned as it is, its ``mkey`` the very same object (a dictionary key
    whose hash is kept). A cached MoE step calls with the same facts every
    time; checking them again cost a fifth of the call's host work.
    Raises as the checks do.
    """
    key = None if problem is not None else _matrix_call_key(
        output, input, output_split_sizes, input_split_sizes, words, matrix, digests)
    if key is not None and last is not None and last.key == key and _same_matrix(last, matrix):
        return last
    outs = np.zeros(num_ranks, dtype=np.int64)
    row = encode_a2a(output, input, output_split_sizes, input_split_sizes, num_ranks, words,
                     problem, outs)
    given = check_split_matrix(matrix, row, rank, num_ranks, outs)
    same = digests is not None and same_digests(digests, words, rank)
    # What every rank would have exchanged: all splits, the row size (dtype and
    # row shape only enter through it), the configuration.
    mkey = (b"M" + given.in_rows.tobytes() + given.row_bytes.to_bytes(8, "little")
            + words.tobytes())
    kept = None if key is None or matrix is None else np.array(matrix, copy=True, order="C")
    return MatrixCall(key, row, outs, given, same, mkey, kept)


# ---------------------------------------------------- configuration fingerprint
# Each field takes one slot: a hash of ``name=value`` (what is compared) and
# the text itself, cut to _FP_TEXT_BYTES (what the error shows). The row has
# a fixed number of slots whatever the fields, so ranks that disagree on the
# set of fields still exchange rows of one width (gloo aborts the process on a
# size mismatch); fields beyond the last slot share it, hashed together.
FP_SLOTS = 20
_FP_TEXT_BYTES = 64
_FP_SLOT_WORDS = 1 + _FP_TEXT_BYTES // 8
#: Words of a fingerprint in a metadata row.
FP_WORDS = FP_SLOTS * _FP_SLOT_WORDS


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little",
                          signed=True)


def fingerprint(fields: Mapping[str, Any]) -> np.ndarray:
    """The configuration of a call as ``int64[FP_WORDS]`` words for a metadata row.

    ``fields`` maps a name (``"fabric"``, ``"chunk_bytes"``, a layer's
    ``"moe.num_experts"``) to a value whose ``str`` is the same on every rank
    exactly when the setting is: a string, an int, a bool, a tuple of them.
    Every rank puts its words in the row it exchanges and
    :func:`check_fingerprints` compares them. Field order matters: build the
    mapping the same way on every rank.

    Examples
    --------
    >>> a = fingerprint({"fabric": "h100-2x4", "chunk_bytes": 1 << 20})
    >>> b = fingerprint({"fabric": "h100-2x4", "chunk_bytes": 4096})
    >>> a.shape == (FP_WORDS,), bool((a == b).all()), bool((a[:9] == b[:9]).all())
    (True, False, True)
    """
    items = [f"{name}={value}" for name, value in fields.items()]
    if len(items) > FP_SLOTS:
        rest = items[FP_SLOTS - 1 :]
        items = [*items[: FP_SLOTS - 1], f"+{len(rest)} fields={_hash64(chr(0).join(rest)):x}"]
    words = np.zeros((FP_SLOTS, _FP_SLOT_WORDS), dtype=np.int64)
    for i, text in enumerate(items):
        raw = text.encode()[:_FP_TEXT_BYTES].ljust(_FP_TEXT_BYTES, b"\0")
        words[i, 0] = _hash64(text)
        words[i, 1:] = np.frombuffer(raw, dtype="<i8")
    return words.reshape(-1)


def fingerprint_digest(words: np.ndarray) -> int:
    """A 63-bit digest of :func:`fingerprint` words (one ``int64`` for a caller's row)."""
    raw = hashlib.blake2b(np.ascontiguousarray(words, dtype="<i8").tobytes(), digest_size=8)
    return int.from_bytes(raw.digest(), "little") >> 1


def same_digests(digests: Any, words: np.ndarray, rank: int) -> bool:
    """Whether every rank's :func:`fingerprint_digest` in ``digests`` is the same.

    ``digests`` (``int64[N]``) come from the caller's own collective, so the
    answer is the same on every rank. Raises (on this rank only: a caller's
    bug) if they are equal but not this rank's own ``words``' digest.
    """
    if hasattr(digests, "detach"):
        digests = digests.detach().cpu().numpy()
    d = np.asarray(digests)
    if d.ndim != 1 or d.dtype.kind not in "iu" or not 0 <= rank < d.size:
        raise TypeError(f"config_digests must be a 1-D integer array with one digest per rank, "
                        f"got {type(digests).__name__} of shape {d.shape}")
    if (d != d[0]).any():
        return False
    mine = fingerprint_digest(words)
    if int(d[rank]) != mine:
        raise ValueError(f"config_digests[{rank}] = {int(d[rank])} but this call's configuration "
                         f"digest on rank {rank} is {mine}; gather config_digest() of the same "
                         "group and config")
    return True


def _fp_text(slot: np.ndarray) -> tuple[str, str]:
    raw = slot[1:].astype("<i8").tobytes().rstrip(b"\0").decode(errors="ignore")
    name, _, value = raw.partition("=")
    return name, value


def check_fingerprints(
    words: np.ndarray, op: str, what: str = "configuration (fabric, policy, chunk_bytes, ...)"
) -> None:
    """Raise ``ValueError`` if any rank's :func:`fingerprint` differs from rank 0's.

    ``words`` is ``int64[N, FP_WORDS]``, one row per rank (the same on every
    rank after an exchange), so every rank raises the same message naming
    the field, the first rank that differs and both values. ``what`` names
    the settings in the message's advice.
    """
    slots = words.reshape(words.shape[0], FP_SLOTS, _FP_SLOT_WORDS)
    diff = slots[:, :, 0] != slots[0, :, 0]
    if not diff.any():
        return
    rank, k = (int(v) for v in np.argwhere(diff.T)[0][::-1])
    name_r, value_r = _fp_text(slots[rank, k])
    name_0, value_0 = _fp_text(slots[0, k])
    if name_r == name_0:
        differs = f"uses {name_r} {value_r} but rank 0 uses {value_0}"
    else:
        def setting(name: str, value: str) -> str:
            return f"{name} {value}" if name else "no such field"

        differs = f"sets {setting(name_r, value_r)} where rank 0 sets {setting(name_0, value_0)}"
    raise ValueError(f"{op}: rank {rank} {differs}; every rank of the group must use the same "
                     f"{what}")


# ----------------------------------------------------------- p2p op lists
#: Fields per op in a batch_isend_irecv row: kind (1 send, 2 recv), peer, bytes, tag, dtype.
P2P_FIELDS = 5
def encode_p2p(ops: Any, group_rank_of: Any, num_ranks: int, width: int) -> np.ndarray:
    """This rank's row for ``batch_isend_irecv``: ``[problem, a, b, count, ops...]``.

    ``group_rank_of(op)`` returns the op's peer as a group rank, or raises
    ValueError if the peer is not in the group. ``width`` ops fit in the row;
    the count tells the others when a second, wider exchange is needed.
    """
    import torch.distributed as dist

    row = np.zeros(4 + P2P_FIELDS * width, dtype=np.int64)
    ops = list(ops)
    row[3] = len(ops)
    device = None
    for i, op in enumerate(ops):
        code, b, c = 0, 0, 0
        if not isinstance(op, dist.P2POp) or not _tensor(op.tensor):
            code = 41
        elif op.op not in (dist.isend, dist.irecv):
            code = 42
        else:
            peer = group_rank_of(op)
            if peer is None:
                code = 45
            elif not 0 <= peer < num_ranks:
                code, b, c = 43, peer, num_ranks
            elif peer == group_rank_of(None):
                code, b = 44, peer
            elif device is not None and op.tensor.device != device:
                code = 46
            elif not 0 <= int(op.tag) < (1 << 31):
                code, b = 47, int(op.tag)
            device = op.tensor.device if device is None else device
        if code:
            row[:4] = ArgProblem(code, i, b, c).words(4)  # the count gives way to c
            return row
        if i < width:
            t = op.tensor
            base = 4 + P2P_FIELDS * i
            row[base : base + P2P_FIELDS] = (
                1 if op.op is dist.isend else 2,
                peer,
                t.numel() * t.element_size(),
                int(op.tag),
                dtype_code(t.dtype),
            )
    return row


def match_p2p(tables: list[np.ndarray]) -> list[tuple[int, int, int, int, int]]:
    """Pair every send with its receive; raise ValueError naming the first mismatch.

    ``tables[r]`` is ``int64[k_r, P2P_FIELDS]`` (kind, peer, bytes, tag, dtype)
    of rank ``r``'s ops in list order. Sends and receives between two ranks
    with the same tag match in list order, as in torch. Returns
    ``(src, dst, send_index, recv_index, bytes)`` sorted by pair, tag, then
    order: the order messages take in their pair stream.
    """
    sends: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}
    recvs: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}
    for r, tab in enumerate(tables):
        for i, (kind, peer, nb, tag, dt) in enumerate(tab.tolist()):
            if kind == 1:
                sends.setdefault((r, peer, tag), []).append((i, nb, dt))
            else:
                recvs.setdefault((peer, r, tag), []).append((i, nb, dt))
    out = []
    for key in sorted(set(sends) | set(recvs)):
        s_list, r_list = sends.get(key, []), recvs.get(key, [])
        src, dst, tag = key
        if len(s_list) != len(r_list):
            raise ValueError(
                f"batch_isend_irecv: rank {src} sends {len(s_list)} message(s) to rank {dst} "
                f"with tag {tag} but rank {dst} receives {len(r_list)} from rank {src}"
            )
        for k, ((si, sb, sdt), (ri, rb, rdt)) in enumerate(zip(s_list, r_list, strict=True)):
            if sb != rb:
                raise ValueError(
                    f"batch_isend_irecv: message {k} from rank {src} to rank {dst} (tag {tag}): "
                    f"rank {src} sends {sb} bytes but rank {dst} receives {rb} bytes"
                )
            if sdt != rdt:
                raise TypeError(
                    f"batch_isend_irecv: message {k} from rank {src} to rank {dst} (tag {tag}): "
                    f"rank {src} sends {dtype_name(sdt)} but rank {dst} receives "
                    f"{dtype_name(rdt)}"
                )
            out.append((src, dst, si, ri, sb))
    return out


# ------------------------------------------------------------ other kinds
def positive_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum`` (:func:`pathweave._check.integer`)."""
    return _check.integer(name, value, minimum=minimum)


def nonnegative_float(name: str, value: Any, *, positive: bool = False) -> float:
    """``value`` as a finite float >= 0 (> 0 if ``positive``) (:func:`pathweave._check.real`)."""
    return _check.real(name, value, low=0.0, low_open=positive)
