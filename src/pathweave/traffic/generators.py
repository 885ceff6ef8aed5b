"""Workload generators: functions that return demand matrices.

Every generator returns a ``float64`` array ``D[src_rank, dst_rank]`` of bytes
with a zero diagonal (a rank never sends to itself) and whole-byte entries.
Ranks are numbered node-major (``rank = node * gpus_per_node + local``); the
generators themselves do not care about nodes, the fabric does.

Payloads are whole bytes: a rank's payload is ``floor(bytes_per_rank)`` and its
share to each destination is rounded so that the row still adds up to exactly
that payload (largest-remainder rounding; leftover bytes go to the
destinations with the largest fractional share, ties to the lowest rank).

Random generators take ``seed: int = 0`` and draw from
``numpy.random.default_rng(seed)``, so a given seed gives the same matrix on
every machine and in every process.

Arguments are checked by :mod:`pathweave._check`: an argument of the wrong
type (``num_ranks=4.0``, ``periodic="yes"``) raises TypeError, a value out of
range raises :class:`~pathweave.errors.WorkloadError`; both name the argument
and the value.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pathweave import _check
from pathweave.errors import WorkloadError

__all__ = [
    "hotspot",
    "many_to_few",
    "moe",
    "random_sparse",
    "stencil",
    "uniform",
    "zipf",
]


# --------------------------------------------------------------------------
# Argument validation (once, at the public boundary)
# --------------------------------------------------------------------------


# The generators' argument checks: pathweave._check with WorkloadError for bad values.
_int_arg = functools.partial(_check.integer, error=WorkloadError)
_real_arg = functools.partial(_check.real, error=WorkloadError)


def _num_ranks_arg(num_ranks: Any) -> int:
    return _int_arg("num_ranks", num_ranks, minimum=2)


#: Largest byte count a demand matrix may hold in all: plans and the data plane
#: count bytes in int64.
MAX_TOTAL_BYTES = 2**63 - 1
#: Most routing keys :func:`moe` draws: token x expert for a Zipf draw, token x slot
#: otherwise (about 15 s of CPU here at the limit).
MAX_MOE_ROUTING_KEYS = 2**30


def _payload_arg(bytes_per_rank: Any, num_ranks: int = 1) -> float:
    total = math.floor(_real_arg("bytes_per_rank", bytes_per_rank, low=0.0))
    if total * num_ranks > MAX_TOTAL_BYTES:
        raise WorkloadError(
            f"bytes {bytes_per_rank:g} per rank x {num_ranks} ranks exceeds the int64 byte "
            f"range ({MAX_TOTAL_BYTES:.3g} bytes in all)"
        )
    return total


def _rank_set_arg(name: str, value: Any, num_ranks: int) -> tuple[int, ...]:
    """Normalise one rank or a sequence of distinct ranks to a sorted tuple."""
    items = [value] if isinstance(value, numbers.Integral) else value
    if isinstance(items, (str, bytes)) or not isinstance(items, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a rank or a sequence of ranks, got {value!r}")
    ranks: list[int] = []
    for item in items:
        rank = _int_arg(name, item)
        if not 0 <= rank < num_ranks:
            raise WorkloadError(f"{name} = {rank!r} is not a rank in [0, {num_ranks})")
        if rank in ranks:
            raise WorkloadError(f"{name} lists rank {rank!r} twice: {value!r}")
        ranks.append(rank)
    if not ranks:
        raise WorkloadError(f"{name} must name at least one rank, got {value!r}")
    return tuple(sorted(ranks))


def _seed_arg(seed: Any) -> int:
    return _int_arg("seed", seed, minimum=0)


# --------------------------------------------------------------------------
# Rounding to whole bytes
# --------------------------------------------------------------------------


def _whole_bytes(shares: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Round fractional byte shares to whole bytes, keeping row sums at ``totals``.

    Flooring alone would silently lose up to ``num_ranks - 1`` bytes per row,
    which breaks the "a rank sends exactly its payload" invariant that
    planners check conservation against, hence largest-remainder rounding.
    """
    shares = np.asarray(shares, dtype=np.float64)
    base = np.floor(shares)
    frac = shares - base
    # A pair with no share must never receive a leftover byte; this also keeps
    # the diagonal at zero.
    frac[shares <= 0.0] = -1.0
    deficit = np.rint(totals - base.sum(axis=1)).astype(np.int64)
    eligible = (shares > 0.0).sum(axis=1)
    deficit = np.clip(deficit, 0, eligible)
    # Stable sort keeps tie-breaking by rank index, so rounding is reproducible.
    order = np.argsort(-frac, axis=1, kind="stable")
    for row in np.flatnonzero(deficit):
        base[row, order[row, : deficit[row]]] += 1.0
    return base


def _finish(shares: np.ndarray, totals: np.ndarray | float) -> np.ndarray:
    n = shares.shape[0]
    np.fill_diagonal(shares, 0.0)
    totals_arr = np.broadcast_to(np.asarray(totals, dtype=np.float64), (n,))
    out = _whole_bytes(shares, totals_arr)
    np.fill_diagonal(out, 0.0)
    return out


# --------------------------------------------------------------------------
# Generators
# --------------------------------------------------------------------------


def uniform(num_ranks: int, bytes_per_rank: float) -> np.ndarray:
    """Balanced all-to-all: every rank splits its payload evenly over all peers.

    Parameters
    ----------
    num_ranks : int
        Number of ranks (GPUs), at least 2.
    bytes_per_rank : float
        Payload each rank sends in total, in bytes (floored to whole bytes).

    Returns
    -------
    numpy.ndarray
        ``(num_ranks, num_ranks)`` float64 demand matrix with zero diagonal;
        every row sums to ``floor(bytes_per_rank)``.

    Examples
    --------
    >>> from pathweave.traffic import uniform
    >>> uniform(3, 10).astype(int).tolist()
    [[0, 5, 5], [5, 0, 5], [5, 5, 0]]
    """
    n = _num_ranks_arg(num_ranks)
    total = _payload_arg(bytes_per_rank, n)
    shares = np.full((n, n), total / (n - 1))
    return _finish(shares, total)


def hotspot(
    num_ranks: int,
    bytes_per_rank: float,
    ratio: float,
    hot: int | Sequence[int] = 0,
) -> np.ndarray:
    """Skewed all-to-all with one or more hot destinations (NIMBLE Fig. 7).

    Every non-hot rank sends the fraction ``ratio`` of its payload to the hot
    rank(s), split evenly among them, and spreads the remaining
    ``1 - ratio`` evenly over the other non-hot ranks (everyone except itself
    and the hot ranks). A hot rank spreads its own payload evenly over all
    ``num_ranks - 1`` peers.

    So ``ratio = 0`` means nothing at all goes to the hot rank(s), ``ratio = 1``
    means non-hot ranks send only to the hot rank(s), and
    ``ratio = len(hot) / (num_ranks - 1)`` reproduces :func:`uniform`
    (``1 / (num_ranks - 1)`` for a single hot rank).

    Parameters
    ----------
    num_ranks : int
        Number of ranks, at least 2.
    bytes_per_rank : float
        Payload each rank sends in total, in bytes.
    ratio : float
        Fraction of each non-hot rank's payload sent to the hot rank(s), in
        ``[0, 1]``.
    hot : int or sequence of int, default 0
        The hot rank, or several distinct hot ranks.

    Returns
    -------
    numpy.ndarray
        Demand matrix; every row sums to ``floor(bytes_per_rank)``.

    Raises
    ------
    TypeError
        On an argument of the wrong type.
    WorkloadError
        On a bad value, or when ``ratio < 1`` but every peer of a non-hot
        rank is hot, so the ``1 - ratio`` share has nowhere to go.

    Examples
    --------
    >>> from pathweave.traffic import hotspot
    >>> hotspot(4, 1200, ratio=0.5, hot=0).astype(int).tolist()
    [[0, 400, 400, 400], [600, 0, 300, 300], [600, 300, 0, 300], [600, 300, 300, 0]]
    """
    n = _num_ranks_arg(num_ranks)
    total = _payload_arg(bytes_per_rank, n)
    ratio = _real_arg("ratio", ratio, low=0.0, high=1.0)
    hot_ranks = _rank_set_arg("hot", hot, n)
    num_cold_peers = n - 1 - len(hot_ranks)
    if ratio < 1.0 and num_cold_peers == 0:
        raise WorkloadError(
            f"hotspot with hot={hot!r} on {n} ranks leaves non-hot ranks no non-hot peer "
            f"for the remaining 1 - ratio of their payload; use ratio=1 or fewer hot ranks "
            f"(ratio={ratio!r})"
        )

    is_hot = np.zeros(n, dtype=bool)
    is_hot[list(hot_ranks)] = True
    shares = np.zeros((n, n))
    if num_cold_peers > 0:
        shares[np.ix_(~is_hot, ~is_hot)] = total * (1.0 - ratio) / num_cold_peers
    shares[np.ix_(~is_hot, is_hot)] = total * ratio / len(hot_ranks)
    shares[is_hot, :] = total / (n - 1)
    return _finish(shares, total)


def zipf(
    num_ranks: int,
    bytes_per_rank: float,
    alpha: float = 1.2,
    seed: int = 0,
) -> np.ndarray:
    """Heavy-tailed all-to-all: each sender favours a few destinations.

    Each sender ranks its ``num_ranks - 1`` peers in an order drawn at random
    (independently per sender) and sends the peer at position ``k`` (1-based)
    a share proportional to ``k ** -alpha``. ``alpha = 0`` is :func:`uniform`;
    larger ``alpha`` concentrates more of each payload on the first peers.

    Parameters
    ----------
    num_ranks : int
        Number of ranks, at least 2.
    bytes_per_rank : float
        Payload each rank sends in total, in bytes.
    alpha : float, default 1.2
        Zipf exponent, ``>= 0``.
    seed : int, default 0
        Seed of ``numpy.random.default_rng`` for the per-sender orders.

    Returns
    -------
    numpy.ndarray
        Demand matrix; every row sums to ``floor(bytes_per_rank)``.

    Examples
    --------
    >>> from pathweave.traffic import zipf
    >>> D = zipf(4, 1000, alpha=1.0, seed=1)
    >>> D.sum(axis=1).tolist()
    [1000.0, 1000.0, 1000.0, 1000.0]
    >>> sorted(D[0].astype(int).tolist())
    [0, 182, 273, 545]
    """
    n = _num_ranks_arg(num_ranks)
    total = _payload_arg(bytes_per_rank, n)
    alpha = _real_arg("alpha", alpha, low=0.0)
    rng = np.random.default_rng(_seed_arg(seed))
    weights = np.arange(1, n, dtype=np.float64) ** -alpha
    weights /= weights.sum()
    shares = np.zeros((n, n))
    for src in range(n):
        peers = np.delete(np.arange(n), src)
        shares[src, rng.permutation(peers)] = total * weights
    return _finish(shares, total)


def _zipf_inverse_weights(num_experts: int, skew: float, hot_expert: int) -> np.ndarray:
    # Popularity order is a rotation of expert ids so that ``hot_expert`` is the
    # most popular one; with contiguous placement that makes its rank the hot spot.
    position = (np.arange(num_experts) - hot_expert) % num_experts
    return (position + 1.0) ** skew  # 1 / weight, weight = (position + 1) ** -skew


def _uniform_subsets(rng: np.random.Generator, rows: int, pool: int, k: int) -> np.ndarray:
    """``rows`` independent uniform ``k``-subsets of ``range(pool)``, as ``(rows, k)``.

    With ``k`` small against ``pool`` (MoE top-k among many experts), draw
    ``k`` values per row with replacement and redraw the rows that repeat
    one: accepting only distinct rows makes every ordered distinct tuple, so
    every subset, equally likely. That costs ``O(rows * k)`` instead of the
    ``O(rows * pool)`` random keys of the general method below.
    """
    if k == 0:
        return np.zeros((rows, 0), dtype=np.int64)
    if 4 * k <= pool:
        out = rng.integers(0, pool, size=(rows, k))
        while True:
            srt = np.sort(out, axis=1)
            bad = np.flatnonzero((srt[:, 1:] == srt[:, :-1]).any(axis=1))
            if bad.size == 0:
                return out
            out[bad] = rng.integers(0, pool, size=(bad.size, k))
    # The k smallest of i.i.d. uniform keys form a uniform k-subset.
    keys = rng.random((rows, pool))
    return np.argpartition(keys, k - 1, axis=1)[:, :k]


@dataclass(frozen=True)
class _Routing:
    """How every token picks its experts (checked arguments of :func:`moe`).

    ``inverse_weights`` is set for Zipf popularity, ``hot_ratio`` for a hot
    expert; neither means a uniform choice.
    """

    num_experts: int
    top_k: int
    hot_expert: int
    inverse_weights: np.ndarray | None = None
    hot_ratio: float | None = None


def _route_chunk(rng: np.random.Generator, num_tokens: int, routing: _Routing) -> np.ndarray:
    """Pick ``top_k`` distinct experts for each of ``num_tokens`` tokens.

    Returns an int array of shape ``(num_tokens, top_k)``.
    """
    num_experts, top_k, hot_expert = routing.num_experts, routing.top_k, routing.hot_expert
    if routing.hot_ratio is None:
        if routing.inverse_weights is None:
            return _uniform_subsets(rng, num_tokens, num_experts, top_k)
        else:
            # The k smallest of Exp(1) / weight are a weighted sample without
            # replacement (Efraimidis-Spirakis); exponentials are cheaper than
            # the equivalent Gumbel-top-k.
            keys = rng.standard_exponential((num_tokens, num_experts)) * routing.inverse_weights
        return np.argpartition(keys, top_k - 1, axis=1)[:, :top_k]

    others = np.delete(np.arange(num_experts), hot_expert)
    picks = np.full((num_tokens, top_k), hot_expert, dtype=np.int64)
    hit = rng.random(num_tokens) < routing.hot_ratio
    width = min(top_k, others.size)
    if width > 0:
        cand = others[_uniform_subsets(rng, num_tokens, others.size, width)]
        picks[:, : min(width, top_k - 1)] = cand[:, : min(width, top_k - 1)]
        if width == top_k:
            # Tokens that did not draw the hot expert take one more non-hot one.
            picks[~hit, top_k - 1] = cand[~hit, top_k - 1]
    return picks


def _moe_placement(placement: Any, num_experts: Any, n: int) -> np.ndarray:
    """``placement`` checked (or the contiguous default): the rank of each expert."""
    if placement is not None:
        place = np.asarray(placement)
        if place.ndim != 1 or place.size == 0:
            raise WorkloadError(
                f"placement must be a non-empty 1-D sequence of ranks, got {placement!r}"
            )
        if num_experts is None:
            num_experts = int(place.size)
    num_experts = n if num_experts is None else _int_arg("num_experts", num_experts, minimum=1)

    if placement is None:
        if num_experts % n != 0:
            raise WorkloadError(
                f"num_experts = {num_experts} is not a multiple of num_ranks = {n}; "
                f"pass an explicit placement"
            )
        return np.arange(num_experts) // (num_experts // n)
    if place.size != num_experts:
        raise WorkloadError(f"placement has {place.size} entries but num_experts = {num_experts}")
    if not (np.issubdtype(place.dtype, np.integer) or place.dtype == object):
        raise WorkloadError(f"placement must hold integer ranks, got {placement!r}")
    checked = []
    for e, r in enumerate(place.tolist()):
        if isinstance(r, bool) or not isinstance(r, numbers.Integral) or not 0 <= r < n:
            raise WorkloadError(f"placement[{e}] = {r!r} is not a rank in [0, {n})")
        checked.append(int(r))
    return np.asarray(checked, dtype=np.int64)


def _moe_routing(num_experts: int, tokens: int, copy_bytes: float, top_k: Any, skew: Any,
                 hot_ratio: Any, hot_expert: Any) -> _Routing:
    """Check the routing arguments of :func:`moe` and the sizes they imply."""
    top_k = _int_arg("top_k", top_k, minimum=1)
    if top_k > num_experts:
        raise WorkloadError(f"top_k = {top_k} exceeds num_experts = {num_experts}")
    if tokens * top_k * copy_bytes > MAX_TOTAL_BYTES:
        raise WorkloadError(
            f"moe: tokens={tokens} x top_k={top_k} x {copy_bytes:g} bytes per copy exceeds the "
            f"int64 byte range ({MAX_TOTAL_BYTES:.3g} bytes in all)"
        )
    # A Zipf draw ranks one key per (token, expert); the hot and uniform
    # draws take one per (token, slot), rejections aside.
    per_token, what = (num_experts, "num_experts") if skew is not None else (top_k, "top_k")
    if tokens * per_token > MAX_MOE_ROUTING_KEYS:
        raise WorkloadError(
            f"moe: tokens={tokens} x {what}={per_token} routing draws exceed the limit "
            f"{MAX_MOE_ROUTING_KEYS} (minutes of CPU); the demand scales with tokens, so use "
            "fewer tokens and a larger hidden size for the same bytes"
        )
    hot_expert = _int_arg("hot_expert", hot_expert)
    if not 0 <= hot_expert < num_experts:
        raise WorkloadError(f"hot_expert = {hot_expert} is not an expert in [0, {num_experts})")
    if skew is not None and hot_ratio is not None:
        raise WorkloadError(
            f"give skew or hot_ratio, not both (skew={skew!r}, hot_ratio={hot_ratio!r})"
        )
    routing = _Routing(num_experts, top_k, hot_expert)
    if skew is not None:
        skew = _real_arg("skew", skew, low=0.0)
        return replace(routing, inverse_weights=_zipf_inverse_weights(num_experts, skew,
                                                                      hot_expert))
    if hot_ratio is not None:
        hot_ratio = _real_arg("hot_ratio", hot_ratio, low=0.0, high=1.0)
        if hot_ratio < 1.0 and top_k > num_experts - 1:
            raise WorkloadError(
                f"hot_ratio = {hot_ratio!r} < 1 needs top_k <= num_experts - 1 so tokens "
                f"missing the hot expert can fill their slots; got top_k = {top_k}, "
                f"num_experts = {num_experts}"
            )
        return replace(routing, hot_ratio=hot_ratio)
    return routing


def moe(
    num_ranks: int,
    tokens: int,
    hidden: int,
    bytes_per_elem: float = 2,
    num_experts: int | None = None,
    top_k: int = 2,
    skew: float | None = None,
    hot_ratio: float | None = None,
    hot_expert: int = 0,
    placement: Sequence[int] | np.ndarray | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Mixture-of-experts token dispatch (expert parallelism).

    ``tokens`` is the global token count, spread evenly over the ranks
    (``tokens // num_ranks`` each, one more for each of the first
    ``tokens % num_ranks`` ranks). Every token picks ``top_k`` distinct
    experts and is copied once to each chosen expert's rank; a copy is
    ``hidden * bytes_per_elem`` bytes. Copies whose expert lives on the
    sending rank stay local and produce no traffic.

    Routing, per token:

    * ``hot_ratio`` given: the token picks ``hot_expert`` with probability
      ``hot_ratio`` and fills its other slots uniformly from the remaining
      experts, so with ``top_k = 1`` a fraction ``hot_ratio`` of all copies
      goes to the hot expert (with ``top_k > 1``, a fraction ``hot_ratio``
      of tokens visit it).
    * ``skew`` given: experts are drawn without replacement with Zipf
      popularity ``(position + 1) ** -skew``, where ``hot_expert`` has
      position 0, ``hot_expert + 1`` position 1, and so on cyclically.
    * neither: a uniformly random set of ``top_k`` experts.

    The result is the dispatch matrix; its transpose ``D.T`` is the matching
    combine matrix (every copy returns to the token's owner).

    Parameters
    ----------
    num_ranks : int
        Number of ranks, at least 2.
    tokens : int
        Global number of tokens, ``>= 0``.
    hidden : int
        Hidden size (elements per token), ``>= 1``.
    bytes_per_elem : float, default 2
        Bytes per element (2 for bf16); ``hidden * bytes_per_elem`` must be a
        whole number of bytes.
    num_experts : int, optional
        Number of experts; defaults to ``len(placement)`` if a placement is
        given, else ``num_ranks``.
    top_k : int, default 2
        Distinct experts per token, ``1 <= top_k <= num_experts``.
    skew : float, optional
        Zipf exponent ``>= 0`` of expert popularity. Exclusive with
        ``hot_ratio``.
    hot_ratio : float, optional
        Probability in ``[0, 1]`` that a token picks ``hot_expert``.
    hot_expert : int, default 0
        The hot (or most popular) expert.
    placement : sequence of int, optional
        ``placement[e]`` is the rank hosting expert ``e``. By default experts
        are placed contiguously, ``num_experts // num_ranks`` per rank (expert
        ``e`` on rank ``e // (num_experts // num_ranks)``), which requires
        ``num_experts % num_ranks == 0``.
    seed : int, default 0
        Seed of ``numpy.random.default_rng`` for routing.

    Returns
    -------
    numpy.ndarray
        Dispatch demand matrix; every entry is a multiple of
        ``hidden * bytes_per_elem``.

    Examples
    --------
    >>> from pathweave.traffic import moe
    >>> D = moe(4, tokens=400, hidden=8, top_k=1, hot_ratio=1.0, hot_expert=2)
    >>> D.astype(int).tolist()  # every token goes to expert 2 on rank 2
    [[0, 0, 1600, 0], [0, 0, 1600, 0], [0, 0, 0, 0], [0, 0, 1600, 0]]
    >>> combine = D.T
    """
    n = _num_ranks_arg(num_ranks)
    tokens = _int_arg("tokens", tokens, minimum=0)
    hidden = _int_arg("hidden", hidden, minimum=1)
    bytes_per_elem = _real_arg("bytes_per_elem", bytes_per_elem, low=0.0, low_open=True)
    copy_bytes = hidden * bytes_per_elem
    if copy_bytes != math.floor(copy_bytes):
        raise WorkloadError(
            f"hidden * bytes_per_elem must be a whole number of bytes, got "
            f"{hidden} * {bytes_per_elem!r} = {copy_bytes!r}"
        )
    place = _moe_placement(placement, num_experts, n)
    routing = _moe_routing(place.size, tokens, copy_bytes, top_k, skew, hot_ratio, hot_expert)
    rng = np.random.default_rng(_seed_arg(seed))

    per_rank = np.full(n, tokens // n, dtype=np.int64)
    per_rank[: tokens % n] += 1
    # Bound the (chunk, num_experts) key matrix to ~32 MiB whatever the size.
    chunk = max(1, (1 << 22) // routing.num_experts)
    copies = np.zeros((n, n), dtype=np.int64)
    for src in range(n):
        for start in range(0, int(per_rank[src]), chunk):
            count = min(chunk, int(per_rank[src]) - start)
            experts = _route_chunk(rng, count, routing)
            copies[src] += np.bincount(place[experts].ravel(), minlength=n)
    np.fill_diagonal(copies, 0)
    return copies.astype(np.float64) * float(copy_bytes)


def many_to_few(
    num_ranks: int,
    bytes_per_rank: float,
    sinks: int | Sequence[int] = (0,),
    seed: int = 0,
) -> np.ndarray:
    """Aggregation: every non-sink rank sends its payload to a few sinks.

    Each non-sink rank splits its payload evenly over the sinks; sinks send
    nothing (NIMBLE Sec. III-A b, parameter servers and reductions).

    Parameters
    ----------
    num_ranks : int
        Number of ranks, at least 2.
    bytes_per_rank : float
        Payload of each non-sink rank, in bytes.
    sinks : int or sequence of int, default (0,)
        A sequence of distinct sink ranks, or an int ``K`` meaning the first
        ``K`` ranks ``0 .. K-1``. At least one rank must not be a sink.
    seed : int, default 0
        Unused: the pattern is deterministic. Accepted so that every
        generator can be called with ``seed=``.

    Returns
    -------
    numpy.ndarray
        Demand matrix; non-sink rows sum to ``floor(bytes_per_rank)``, sink
        rows are zero.

    Examples
    --------
    >>> from pathweave.traffic import many_to_few
    >>> many_to_few(4, 100, sinks=(0, 3)).astype(int).tolist()
    [[0, 0, 0, 0], [50, 0, 0, 50], [50, 0, 0, 50], [0, 0, 0, 0]]
    >>> many_to_few(3, 100, sinks=1).astype(int).tolist()  # first rank only
    [[0, 0, 0], [100, 0, 0], [100, 0, 0]]
    """
    n = _num_ranks_arg(num_ranks)
    total = _payload_arg(bytes_per_rank, n)
    _seed_arg(seed)
    if isinstance(sinks, numbers.Integral) and not isinstance(sinks, bool):
        count = int(sinks)
        if not 1 <= count < n:
            raise WorkloadError(
                f"sinks = {count} must count between 1 and num_ranks - 1 = {n - 1} ranks"
            )
        sink_ranks: tuple[int, ...] = tuple(range(count))
    else:
        sink_ranks = _rank_set_arg("sinks", sinks, n)
        if len(sink_ranks) == n:
            raise WorkloadError(f"sinks = {sinks!r} makes every rank a sink; nobody sends")
    is_sink = np.zeros(n, dtype=bool)
    is_sink[list(sink_ranks)] = True
    shares = np.zeros((n, n))
    shares[np.ix_(~is_sink, is_sink)] = total / len(sink_ranks)
    return _finish(shares, np.where(is_sink, 0.0, total))


def _most_square(num_ranks: int) -> tuple[int, int]:
    rows = math.isqrt(num_ranks)
    while num_ranks % rows:
        rows -= 1
    return rows, num_ranks // rows


def stencil(
    num_ranks: int,
    bytes_per_rank: float,
    dims: int = 1,
    shape: tuple[int, int] | None = None,
    boundary_factor: float = 4.0,
    periodic: bool = False,
) -> np.ndarray:
    """Neighbour exchange with boundary hotspots (NIMBLE Sec. III-A c).

    Ranks form a line (``dims=1``, neighbours ``r - 1`` and ``r + 1``) or a
    row-major grid (``dims=2``, up/down/left/right neighbours). Each rank
    splits its payload evenly over its actual neighbours; ranks on the
    domain boundary (ends of the line, edges of the grid) send
    ``boundary_factor`` times as much to each neighbour. A periodic domain
    wraps around and so has no boundary: ``boundary_factor`` then has no
    effect.

    Parameters
    ----------
    num_ranks : int
        Number of ranks, at least 2.
    bytes_per_rank : float
        Payload of an interior rank, in bytes.
    dims : {1, 2}, default 1
        Dimensionality of the domain.
    shape : (int, int), optional
        Grid ``(rows, cols)`` for ``dims=2``, with ``rows * cols == num_ranks``;
        defaults to the most square factorisation (``rows <= cols``).
    boundary_factor : float, default 4.0
        Multiplier ``>= 0`` for boundary ranks' messages.
    periodic : bool, default False
        Wrap the domain around (ring or torus).

    Returns
    -------
    numpy.ndarray
        Demand matrix; interior rows sum to ``floor(bytes_per_rank)``,
        boundary rows to ``floor(boundary_factor * bytes_per_rank)``.

    Examples
    --------
    >>> from pathweave.traffic import stencil
    >>> stencil(4, 100, boundary_factor=2.0).astype(int).tolist()
    [[0, 200, 0, 0], [50, 0, 50, 0], [0, 50, 0, 50], [0, 0, 200, 0]]
    """
    n = _num_ranks_arg(num_ranks)
    total = _payload_arg(bytes_per_rank, n)
    dims = _int_arg("dims", dims)
    if dims not in (1, 2):
        raise WorkloadError(f"dims must be 1 or 2, got {dims!r}")
    boundary_factor = _real_arg("boundary_factor", boundary_factor, low=0.0)
    if not isinstance(periodic, (bool, np.bool_)):
        raise TypeError(f"periodic must be a bool, got {periodic!r}")

    if dims == 1:
        if shape is not None:
            raise WorkloadError(f"shape is only meaningful with dims=2, got shape={shape!r}")
        rows, cols = 1, n
    elif shape is None:
        rows, cols = _most_square(n)
    else:
        if isinstance(shape, (str, bytes)) or not isinstance(shape, (Sequence, np.ndarray)):
            raise WorkloadError(f"shape must be a pair (rows, cols), got {shape!r}")
        if len(shape) != 2:
            raise WorkloadError(f"shape must be a pair (rows, cols), got {shape!r}")
        rows = _int_arg("shape rows", shape[0], minimum=1)
        cols = _int_arg("shape cols", shape[1], minimum=1)
        if rows * cols != n:
            raise WorkloadError(
                f"shape = {tuple(shape)!r} has {rows * cols} cells but num_ranks = {n}"
            )

    shares = np.zeros((n, n))
    totals = np.zeros(n)
    # A 1-D line is a 1 x n grid whose rows have no up/down neighbours.
    steps = [(0, -1), (0, 1)] if dims == 1 else [(-1, 0), (1, 0), (0, -1), (0, 1)]
    for rank in range(n):
        i, j = divmod(rank, cols)
        neighbours = set()
        on_boundary = False
        for di, dj in steps:
            ni, nj = i + di, j + dj
            if periodic:
                ni, nj = ni % rows, nj % cols
            elif not (0 <= ni < rows and 0 <= nj < cols):
                on_boundary = True
                continue
            other = ni * cols + nj
            # Small periodic domains wrap onto the same peer or onto oneself.
            if other != rank:
                neighbours.add(other)
        if not neighbours:
            continue
        payload = total * boundary_factor if on_boundary else total
        totals[rank] = math.floor(payload)
        shares[rank, sorted(neighbours)] = payload / len(neighbours)
    return _finish(shares, totals)


def random_sparse(
    num_ranks: int,
    bytes_per_rank: float,
    density: float = 0.1,
    seed: int = 0,
) -> np.ndarray:
    """Irregular point-to-point traffic: each rank talks to a few random peers.

    Each sender picks ``max(1, round(density * (num_ranks - 1)))`` distinct
    peers at random (rounding half up) and splits its payload among them in
    random proportions drawn from a flat Dirichlet distribution.

    Parameters
    ----------
    num_ranks : int
        Number of ranks, at least 2.
    bytes_per_rank : float
        Payload each rank sends in total, in bytes.
    density : float, default 0.1
        Fraction of peers each rank sends to, in ``(0, 1]``.
    seed : int, default 0
        Seed of ``numpy.random.default_rng`` for peers and proportions.

    Returns
    -------
    numpy.ndarray
        Demand matrix; every row sums to ``floor(bytes_per_rank)``.

    Examples
    --------
    >>> from pathweave.traffic import random_sparse
    >>> D = random_sparse(8, 1000, density=0.3, seed=3)
    >>> (D > 0).sum(axis=1).tolist()  # round(0.3 * 7) = 2 peers each
    [2, 2, 2, 2, 2, 2, 2, 2]
    >>> D.sum(axis=1).tolist() == [1000.0] * 8
    True
    """
    n = _num_ranks_arg(num_ranks)
    total = _payload_arg(bytes_per_rank, n)
    density = _real_arg("density", density, low=0.0, high=1.0, low_open=True)
    rng = np.random.default_rng(_seed_arg(seed))
    fanout = max(1, math.floor(density * (n - 1) + 0.5))
    shares = np.zeros((n, n))
    for src in range(n):
        peers = rng.choice(np.delete(np.arange(n), src), size=fanout, replace=False)
        shares[src, peers] = total * rng.dirichlet(np.ones(fanout))
    return _finish(shares, total)
