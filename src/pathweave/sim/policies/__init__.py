"""Dynamic routing policies for :func:`pathweave.sim.run_dynamic`: one interface, one registry.

A policy decides which candidate path(s) each flow uses, from what an
endpoint could observe. The simulator calls it at epoch boundaries:

``assign(flows, obs) -> list[PathChoice]``
    Place flows that need a path: flows arriving in this epoch, and flows
    whose path just died (a failed link). Must return one choice per flow.
``on_epoch(obs) -> list[PathChoice]``
    Look at the running flows and return the ones to move (or re-split).
``stats() -> dict``
    Counters to report (probes, re-plans, ...).

A :class:`PathChoice` names a flow, the paths its remaining bytes go on with
their weights (shares of the bytes, summing to 1), and ``delay_s``: how long
the flow pauses before it sends on the new paths (Hopper's switch delay).

What a policy may look at (the :class:`Observation`): every candidate path's
RTT as a probe would measure it now (``obs.rtt_s(paths)``), the flows' own
paths, rates and remaining bytes, which paths are alive, and per-link
counters (``link_load_Bps``, ``link_capacity_Bps``) for policies that assume
telemetry. Each policy reads only what its design can observe: ECMP and spray
nothing, FlowBender its own path's RTT, Hopper its own path and two probes,
nimble-online the link counters.

Adding a policy is one file in this package: subclass
:class:`DynamicPolicy`, set ``name``, ``summary`` and ``options`` (defaults),
and decorate it with :func:`register` (:data:`POLICIES`, a
:class:`~pathweave._registry.Registry`, imports every module here when first
read), so the policy is then known by name. Randomness comes only from
``ctx.rng`` (a seeded ``numpy`` Generator), so runs are deterministic.

Examples
--------
>>> from pathweave.sim.policies import policies
>>> policies()
['ecmp', 'flowbender', 'hopper', 'nimble-online', 'spray']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from pathweave import _check
from pathweave._registry import Registry
from pathweave.errors import PlanError
from pathweave.fabric import Fabric, PathSet
from pathweave.sim._queue import path_sums
from pathweave.traffic.trace import FlowTrace

__all__ = [
    "POLICIES",
    "DynamicPolicy",
    "Observation",
    "PathChoice",
    "PolicyContext",
    "ecmp_hash",
    "make",
    "policies",
    "policy_info",
    "register",
]


@dataclass(frozen=True)
class PathChoice:
    """Send the remaining bytes of ``flow`` over ``paths`` in shares ``weights``.

    ``delay_s`` pauses the flow first (it sends nothing for that long).

    Examples
    --------
    >>> PathChoice(7, (12,))
    PathChoice(flow=7, paths=(12,), weights=(1.0,), delay_s=0.0)
    """

    flow: int
    paths: tuple[int, ...]
    weights: tuple[float, ...] = (1.0,)
    delay_s: float = 0.0


@dataclass(frozen=True, eq=False)
class PolicyContext:
    """What a policy knows from the start: the fabric, its paths, the trace, a seeded RNG.

    Attributes
    ----------
    base_rtt_s : float64[num_paths]
        Round-trip time of every candidate path without queueing (twice its
        one-way latency).
    """

    fabric: Fabric
    paths: PathSet
    trace: FlowTrace
    rng: np.random.Generator
    epoch_s: float
    seed: int
    base_rtt_s: np.ndarray

    @classmethod
    def build(
        cls,
        fabric: Fabric,
        paths: PathSet,
        trace: FlowTrace,
        *,
        seed: int = 0,
        epoch_s: float = 10e-6,
    ) -> PolicyContext:
        """The context of a run: base RTTs from the link latencies, ``default_rng(seed)``."""
        lat = np.r_[fabric.latency_s, 0.0]
        lk = paths.links
        base = 2.0 * lat[np.where(lk >= 0, lk, fabric.num_links)].sum(axis=1)
        base.setflags(write=False)
        return cls(
            fabric, paths, trace, np.random.default_rng(seed), float(epoch_s), int(seed), base
        )

    def pair_paths(self, src: int, dst: int) -> np.ndarray:
        """Candidate path ids of the pair, in path-id order."""
        r = self.paths.pair_paths(src, dst)
        return np.arange(r.start, r.stop, dtype=np.int64)

    def flow_paths(self, flow: int, alive: np.ndarray) -> np.ndarray:
        """The alive candidate paths of ``flow``'s pair."""
        c = self.pair_paths(int(self.trace.src[flow]), int(self.trace.dst[flow]))
        return c[alive[c]]

    def equal_cost(self, flow: int, alive: np.ndarray) -> np.ndarray:
        """The alive candidates of ``flow``'s pair with the fewest links (ECMP's group)."""
        c = self.flow_paths(flow, alive)
        if c.size == 0:
            return c
        ln = self.paths.length[c]
        return c[ln == ln.min()]


@dataclass(frozen=True, eq=False)
class Observation:
    """What endpoints can see at the start of an epoch.

    Attributes
    ----------
    time_s, epoch
        Start of the epoch and its index.
    paths
        The candidate paths (``paths.links``, ``paths.length``).
    path_alive : bool[num_paths]
        False where a path crosses a failed link.
    base_rtt_s : float64[num_paths]
        RTT without queueing.
    link_queue_s : float64[num_links]
        Queueing delay of each link now (queue / capacity).
    link_capacity_Bps : float64[num_links]
        Current capacity (0 for a failed link): link telemetry.
    link_load_Bps : float64[num_links]
        Bytes per second offered to each link over the last epoch, background
        included: link counters.
    sub_flow, sub_path : int64[S]
        The running subflows (a flow on one path has one), sorted by flow.
    sub_remaining_bytes, sub_rate_Bps : float64[S]
        Bytes left and last sending rate of each subflow.
    sub_pending : bool[S]
        The subflow is paused by a delayed switch that has not started yet.
    """

    time_s: float
    epoch: int
    paths: PathSet
    path_alive: np.ndarray
    base_rtt_s: np.ndarray
    link_queue_s: np.ndarray
    link_capacity_Bps: np.ndarray
    link_load_Bps: np.ndarray
    sub_flow: np.ndarray
    sub_path: np.ndarray
    sub_remaining_bytes: np.ndarray
    sub_rate_Bps: np.ndarray
    sub_pending: np.ndarray
    _single: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def rtt_s(self, pids: np.ndarray | Sequence[int]) -> np.ndarray:
        """RTT a probe sent now would measure on each path: base plus queueing."""
        p = np.asarray(pids, dtype=np.int64)
        return self.base_rtt_s[p] + path_sums(
            self.paths.links, self.paths.length, p, self.link_queue_s
        )

    def owd_s(self, pids: np.ndarray | Sequence[int]) -> np.ndarray:
        """One-way delay of each path now (queueing on the forward path only)."""
        p = np.asarray(pids, dtype=np.int64)
        return 0.5 * self.base_rtt_s[p] + path_sums(
            self.paths.links, self.paths.length, p, self.link_queue_s
        )

    def single_path_flows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(flow, path, pending)`` of the running flows that use exactly one path."""
        if "flow" not in self._single:
            f = self.sub_flow
            if f.size:
                first = np.r_[True, f[1:] != f[:-1]]
                last = np.r_[f[1:] != f[:-1], True]
                one = first & last
            else:
                one = np.zeros(0, dtype=bool)
            self._single["flow"] = f[one]
            self._single["path"] = self.sub_path[one]
            self._single["pending"] = self.sub_pending[one]
        return self._single["flow"], self._single["path"], self._single["pending"]

    def movable_flows(self) -> tuple[np.ndarray, np.ndarray]:
        """``(flow, path)`` of the :meth:`single_path_flows` a policy may move now.

        A flow paused by a delayed switch (``pending``) is mid-move already:
        its new path takes effect when the pause ends, so it is not moved again.
        """
        f, p, pending = self.single_path_flows()
        return f[~pending], p[~pending]


# ------------------------------------------------------------------- hashing
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    # splitmix64 finaliser: a fixed integer hash, the same in every process
    # (Python's hash() of tuples is salted per process).
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def ecmp_hash(src: Any, dst: Any, flow: Any, salt: int = 0) -> np.ndarray:
    """A 64-bit hash of a flow's 5-tuple stand-in ``(src, dst, flow id)``.

    Switches hash the header fields; here a flow id plays the source port.

    Examples
    --------
    >>> int(ecmp_hash(1, 2, 3)[0]) == int(ecmp_hash(1, 2, 3)[0])
    True
    >>> [int(h % 4) for h in ecmp_hash(0, 1, range(8))]   # flows of one pair over 4 paths
    [1, 2, 3, 2, 3, 1, 1, 0]
    """
    with np.errstate(over="ignore"):
        h = _mix(np.atleast_1d(np.asarray(src, dtype=np.uint64)) + np.uint64(salt))
        h = _mix(h ^ np.atleast_1d(np.asarray(dst, dtype=np.uint64)))
        return _mix(h ^ np.atleast_1d(np.asarray(flow, dtype=np.uint64)))


# ------------------------------------------------------------------- base
class DynamicPolicy:
    """Base class of dynamic policies (see the module docstring).

    Subclasses set ``name``, ``summary`` and ``options`` (option name ->
    default) and implement :meth:`assign`; :meth:`on_epoch` defaults to
    "change nothing". Options arrive validated against ``options``' keys as
    ``self.opts``; :meth:`check` helps validate their values. Each name in
    ``counters`` is an integer attribute that starts at 0 and that
    :meth:`stats` reports.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    options: ClassVar[dict[str, Any]] = {}
    counters: ClassVar[tuple[str, ...]] = ()

    def __init__(self, ctx: PolicyContext, **options: Any) -> None:
        self.ctx = ctx
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            valid = ", ".join(sorted(self.options)) or "none"
            raise PlanError(
                f"dynamic policy {self.name!r} got unknown option {unknown[0]!r}; "
                f"valid options: {valid}"
            )
        self.opts: dict[str, Any] = {**self.options, **options}
        for counter in self.counters:
            setattr(self, counter, 0)

    def check(self, key: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
        """``self.opts[key]`` as a float in ``[lo, hi]`` (``(lo, hi]``).

        Raises TypeError for a value that is not a number, PlanError for one
        out of range (see :mod:`pathweave._check`).
        """
        return _check.real(f"{self.name} option {key}", self.opts[key], low=lo, high=hi,
                           low_open=lo_open, error=PlanError)

    def assign(self, flows: np.ndarray, obs: Observation) -> list[PathChoice]:
        """Choose paths for ``flows`` (new, or stranded on a dead path)."""
        raise NotImplementedError

    def on_epoch(self, obs: Observation) -> list[PathChoice]:
        """Flows to move at this epoch boundary (default: none)."""
        return []

    def stats(self) -> dict[str, float]:
        """Counters for the result's ``info``: the value of each name in ``counters``."""
        return {counter: getattr(self, counter) for counter in self.counters}

    # shared helper: ECMP placement, used by several policies for new flows
    def ecmp_choice(self, flows: np.ndarray, obs: Observation) -> list[PathChoice]:
        """One equal-cost path per flow by :func:`ecmp_hash` (salted with the seed)."""
        tr = self.ctx.trace
        h = ecmp_hash(tr.src[flows], tr.dst[flows], flows, self.ctx.seed)
        out = []
        for f, hv in zip(flows.tolist(), h.tolist(), strict=True):
            group = self.ctx.equal_cost(f, obs.path_alive)
            out.append(PathChoice(f, (int(group[hv % group.size]),)))
        return out


#: Every dynamic policy: each module of this package registers one, imported
#: (sorted by file name) when the registry is first read.
POLICIES: Registry[type[DynamicPolicy]] = Registry(
    "dynamic policy", plural="dynamic policies", error=PlanError, package=__name__)


def register(cls: type[DynamicPolicy]) -> type[DynamicPolicy]:
    """Class decorator: make ``cls`` known by ``cls.name`` (taken by another class: PlanError)."""
    if not cls.name:
        raise PlanError(f"{cls.__qualname__} has no name")
    return POLICIES.add(cls.name, cls, module=cls.__module__)


def policies() -> list[str]:
    """Names of the registered dynamic policies, sorted."""
    return sorted(POLICIES)


def policy_info(name: str) -> type[DynamicPolicy]:
    """The registered policy class ``name`` (its ``summary`` and default ``options`` too).

    Raises
    ------
    PlanError
        No dynamic policy has that name; the message names the closest and lists every one.
    """
    return POLICIES[name]


def make(policy: str | type[DynamicPolicy], ctx: PolicyContext, **options: Any) -> DynamicPolicy:
    """An instance of ``policy`` (a registered name, or a subclass) with validated ``options``."""
    if isinstance(policy, type) and issubclass(policy, DynamicPolicy):
        return policy(ctx, **options)
    if not isinstance(policy, str):
        raise TypeError(f"policy must be a name or a DynamicPolicy subclass, got {policy!r}")
    return policy_info(policy)(ctx, **options)
