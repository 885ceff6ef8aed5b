"""Flow traces for the dynamic simulator: flows that arrive over time.

A :class:`FlowTrace` lists flows as parallel arrays (arrival time, source
rank, destination rank, bytes) sorted by arrival; a flow's id is its index.
:func:`poisson_trace` draws the classic data-centre workload: Poisson
arrivals at a target load with heavy-tailed sizes.

Load. ``load`` is the offered load per source NIC: with ``N`` ranks of line
rate ``host_Bps`` and mean flow size ``m``, flows arrive at the rate
``load * host_Bps * N / m`` per second (one Poisson process for the whole
fabric), each from a uniformly random source to a uniformly random other
rank. A long trace then offers ``load * host_Bps`` to every NIC on average.

Sizes.

``websearch``
    A piecewise-linear CDF shaped like the web-search workload of the DCTCP
    paper as used by RDMA load-balancing simulations (HPCC, ConWeave,
    Hopper's AliCloud-like traces): 60 % of flows under 200 KB, a tail to
    30 MB, mean about 1.7 MB, so a few percent of the flows carry most of
    the bytes. The CDF points are :data:`WEBSEARCH_CDF`; sizes are drawn by
    inverse transform with linear interpolation between points.
``pareto``
    A Pareto distribution of shape ``pareto_shape`` (default 1.2, infinite
    variance) truncated at ``max_bytes``, with its scale chosen so the
    truncated mean is ``mean_bytes``.

Everything draws from ``numpy.random.default_rng(seed)``: a seed gives the
same trace on every machine.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pathweave.errors import WorkloadError

__all__ = [
    "SIZE_DISTRIBUTIONS",
    "WEBSEARCH_CDF",
    "FlowTrace",
    "pareto_sizes",
    "poisson_trace",
    "websearch_sizes",
]

#: ``(bytes, cumulative probability)`` points of the web-search-like size CDF.
WEBSEARCH_CDF: tuple[tuple[float, float], ...] = (
    (1e3, 0.0),
    (10e3, 0.15),
    (20e3, 0.20),
    (30e3, 0.30),
    (50e3, 0.40),
    (80e3, 0.53),
    (200e3, 0.60),
    (1e6, 0.70),
    (2e6, 0.80),
    (5e6, 0.90),
    (10e6, 0.97),
    (30e6, 1.00),
)

SIZE_DISTRIBUTIONS = ("websearch", "pareto")


@dataclass(frozen=True, eq=False)
class FlowTrace:
    """Flows that arrive over time; flow ``i`` is entry ``i`` of every array.

    Attributes
    ----------
    start_s : float64[F]
        Arrival times in seconds, non-decreasing.
    src, dst : int64[F]
        Source and destination ranks (different).
    size_bytes : int64[F]
        Bytes of each flow, at least 1.
    num_ranks : int
        Ranks of the fabric the trace is for.

    Examples
    --------
    >>> t = FlowTrace.from_flows([(0.0, 0, 1, 1000), (1e-6, 2, 0, 500)], num_ranks=4)
    >>> len(t), t.total_bytes
    (2, 1500)
    >>> FlowTrace.from_flows([(0.0, 1, 1, 10)], num_ranks=4)
    Traceback (most recent call last):
    ...
    pathweave.errors.WorkloadError: flow 0 goes from rank 1 to itself
    """

    start_s: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    size_bytes: np.ndarray
    num_ranks: int

    def __post_init__(self) -> None:
        n = int(self.num_ranks)
        if n < 2:
            raise WorkloadError(f"num_ranks must be >= 2, got {self.num_ranks!r}")
        arrs = {}
        for name, dtype in (
            ("start_s", np.float64),
            ("src", np.int64),
            ("dst", np.int64),
            ("size_bytes", np.int64),
        ):
            raw = np.asarray(getattr(self, name))
            if raw.ndim != 1:
                raise WorkloadError(f"trace {name} must be 1-d, got shape {raw.shape}")
            if dtype is np.int64 and raw.size and raw.dtype.kind == "f":
                bad = np.flatnonzero(raw != np.rint(raw))
                if bad.size:
                    i = int(bad[0])
                    raise WorkloadError(f"flow {i}: {name} = {raw[i]!r} is not a whole number")
            arr = raw.astype(dtype)
            arr.setflags(write=False)
            arrs[name] = arr
            object.__setattr__(self, name, arr)
        f = arrs["start_s"].size
        for name, arr in arrs.items():
            if arr.size != f:
                raise WorkloadError(
                    f"trace arrays disagree: {name} has {arr.size} entries, not {f}"
                )
        st = arrs["start_s"]
        bad = np.flatnonzero(~np.isfinite(st) | (st < 0))
        if bad.size:
            i = int(bad[0])
            raise WorkloadError(f"flow {i} starts at {float(st[i])!r}; times must be >= 0")
        if f > 1 and np.any(np.diff(st) < 0):
            i = int(np.flatnonzero(np.diff(st) < 0)[0]) + 1
            raise WorkloadError(
                f"flow {i} starts at {float(st[i])!r}, before flow {i - 1} "
                f"({float(st[i - 1])!r}); sort the trace by start time"
            )
        for name in ("src", "dst"):
            arr = arrs[name]
            bad = np.flatnonzero((arr < 0) | (arr >= n))
            if bad.size:
                i = int(bad[0])
                raise WorkloadError(f"flow {i}: {name} = {int(arr[i])} is not a rank in [0, {n})")
        same = np.flatnonzero(arrs["src"] == arrs["dst"])
        if same.size:
            i = int(same[0])
            raise WorkloadError(f"flow {i} goes from rank {int(arrs['src'][i])} to itself")
        bad = np.flatnonzero(arrs["size_bytes"] < 1)
        if bad.size:
            i = int(bad[0])
            raise WorkloadError(f"flow {i} has {int(arrs['size_bytes'][i])} bytes; need >= 1")
        object.__setattr__(self, "num_ranks", n)

    @classmethod
    def from_flows(
        cls, flows: Iterable[tuple[float, int, int, int]], *, num_ranks: int
    ) -> FlowTrace:
        """A trace from ``(start_s, src, dst, size_bytes)`` tuples, in arrival order."""
        rows = list(flows)
        cols: list[Any] = [[r[k] for r in rows] for k in range(4)] if rows else [[], [], [], []]
        return cls(
            np.asarray(cols[0], dtype=np.float64),
            np.asarray(cols[1], dtype=np.int64),
            np.asarray(cols[2], dtype=np.int64),
            np.asarray(cols[3], dtype=np.int64),
            num_ranks,
        )

    def __len__(self) -> int:
        return int(self.start_s.size)

    @property
    def total_bytes(self) -> int:
        return int(self.size_bytes.sum())

    @property
    def duration_s(self) -> float:
        """Time from the first to the last arrival."""
        return float(self.start_s[-1] - self.start_s[0]) if len(self) else 0.0


# ----------------------------------------------------------------- sizes
def _websearch_mean() -> float:
    # Linear interpolation between CDF points = uniform within each segment.
    pts = WEBSEARCH_CDF
    return sum((p1 - p0) * (x0 + x1) / 2 for (x0, p0), (x1, p1) in itertools.pairwise(pts))


def websearch_sizes(n: int, *, seed: int = 0, rng: np.random.Generator | None = None) -> np.ndarray:
    """``n`` flow sizes (int64 bytes) from the web-search-like CDF.

    Examples
    --------
    >>> s = websearch_sizes(20000, seed=1)
    >>> bool(s.min() >= 1000 and s.max() <= 30_000_000)
    True
    >>> round(float(s.mean()) / 1.71e6, 1)      # analytic mean 1.71 MB
    1.0
    """
    rng = np.random.default_rng(seed) if rng is None else rng
    xs = np.array([p[0] for p in WEBSEARCH_CDF])
    ps = np.array([p[1] for p in WEBSEARCH_CDF])
    u = rng.random(int(n))
    return np.maximum(np.rint(np.interp(u, ps, xs)), 1).astype(np.int64)


def _pareto_scale(mean_bytes: float, shape: float, max_bytes: float) -> float:
    """Scale ``x_m`` whose Pareto(shape) truncated at ``max_bytes`` has mean ``mean_bytes``."""

    def mean(xm: float) -> float:
        # E[min(X, M)] for X ~ Pareto(xm, a): xm a/(a-1) - xm^a M^(1-a)/(a-1)
        a = shape
        if abs(a - 1.0) < 1e-12:
            return xm * (1.0 + math.log(max_bytes / xm))
        return (xm * a - xm**a * max_bytes ** (1 - a)) / (a - 1)

    lo, hi = 1e-9, mean_bytes
    for _ in range(200):  # mean(xm) is increasing in xm on (0, M]
        mid = math.sqrt(lo * hi)
        if mean(mid) < mean_bytes:
            lo = mid
        else:
            hi = mid
    return hi


def pareto_sizes(
    n: int,
    *,
    mean_bytes: float = 1e6,
    shape: float = 1.2,
    max_bytes: float | None = None,
    seed: int = 0,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """``n`` Pareto flow sizes (int64 bytes), truncated at ``max_bytes``, mean ``mean_bytes``.

    ``max_bytes`` defaults to ``1000 * mean_bytes``.

    Examples
    --------
    >>> s = pareto_sizes(50000, mean_bytes=1e5, shape=1.5, seed=2)
    >>> round(float(s.mean()) / 1e5, 1), bool(s.max() <= 1e8)
    (1.0, True)
    """
    if not (mean_bytes >= 1 and math.isfinite(mean_bytes)):
        raise WorkloadError(f"mean_bytes must be a finite number >= 1, got {mean_bytes!r}")
    if not (shape > 0 and math.isfinite(shape)):
        raise WorkloadError(f"pareto shape must be > 0, got {shape!r}")
    cap = 1000.0 * mean_bytes if max_bytes is None else float(max_bytes)
    if not cap > mean_bytes:
        raise WorkloadError(f"max_bytes={max_bytes!r} must exceed mean_bytes={mean_bytes!r}")
    rng = np.random.default_rng(seed) if rng is None else rng
    xm = _pareto_scale(float(mean_bytes), float(shape), cap)
    u = rng.random(int(n))
    x = xm * (1.0 - u) ** (-1.0 / shape)  # inverse CDF of Pareto(xm, shape)
    return np.maximum(np.rint(np.minimum(x, cap)), 1).astype(np.int64)


# ----------------------------------------------------------------- traces
def poisson_trace(
    num_ranks: int,
    *,
    load: float,
    host_Bps: float,
    num_flows: int,
    sizes: str = "websearch",
    mean_bytes: float = 1e6,
    pareto_shape: float = 1.2,
    start_s: float = 0.0,
    seed: int = 0,
) -> FlowTrace:
    """Poisson flow arrivals offering ``load`` of every NIC's line rate.

    Parameters
    ----------
    num_ranks
        Ranks (hosts) of the fabric.
    load
        Offered load per NIC, in ``(0, 1]`` of ``host_Bps`` (e.g. 0.5).
    host_Bps
        NIC line rate per direction.
    num_flows
        Flows to draw; the trace lasts about ``num_flows * mean / (load *
        host_Bps * num_ranks)`` seconds.
    sizes
        ``"websearch"`` or ``"pareto"`` (see the module docstring).
    mean_bytes, pareto_shape
        Mean and shape of ``"pareto"`` sizes (ignored for ``"websearch"``).
    start_s
        Time of the first possible arrival.
    seed
        Seed of ``numpy.random.default_rng``.

    Examples
    --------
    >>> t = poisson_trace(16, load=0.5, host_Bps=12.5e9, num_flows=4000, seed=3)
    >>> offered = t.total_bytes / t.duration_s / (16 * 12.5e9)
    >>> round(offered, 1)
    0.5
    >>> bool((t.src != t.dst).all())
    True
    """
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, (int, np.integer)) or num_ranks < 2:
        raise WorkloadError(f"num_ranks must be an integer >= 2, got {num_ranks!r}")
    if not (0 < load <= 1.0):
        raise WorkloadError(f"load must lie in (0, 1], got {load!r}")
    if not (host_Bps > 0 and math.isfinite(host_Bps)):
        raise WorkloadError(f"host_Bps must be positive and finite, got {host_Bps!r}")
    if isinstance(num_flows, bool) or not isinstance(num_flows, (int, np.integer)) or num_flows < 0:
        raise WorkloadError(f"num_flows must be an integer >= 0, got {num_flows!r}")
    if sizes not in SIZE_DISTRIBUTIONS:
        raise WorkloadError(f"sizes must be one of {SIZE_DISTRIBUTIONS}, got {sizes!r}")
    rng = np.random.default_rng(seed)
    if sizes == "websearch":
        size = websearch_sizes(num_flows, rng=rng)
        mean = _websearch_mean()
    else:
        size = pareto_sizes(num_flows, mean_bytes=mean_bytes, shape=pareto_shape, rng=rng)
        mean = float(mean_bytes)
    rate_per_s = load * host_Bps * num_ranks / mean
    start = start_s + np.cumsum(rng.exponential(1.0 / rate_per_s, num_flows))
    src = rng.integers(0, num_ranks, num_flows)
    # a uniformly random other rank: shift by 1..N-1
    dst = (src + rng.integers(1, num_ranks, num_flows)) % num_ranks
    return FlowTrace(start, src, dst, size, int(num_ranks))
