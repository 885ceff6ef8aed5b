"""Concurrent groups: several expert-parallel groups' demands on one fabric.

Real MoE training runs many expert-parallel groups at once, each on its own
ranks of one fabric, sharing rails, spines and nodes. A
:class:`GroupWorkload` is that, as data: per group its fabric ranks (the
placement), its own demand matrix (in group rank order) and an optional
start time. :func:`pathweave.plan.groups.plan_groups` plans it per group or
jointly; :func:`pathweave.sim.simulate` runs the fabric-wide plan.

Placement is explicit data: :func:`placement` spells out the two common
layouts, ``block`` (group ``g`` holds ranks ``g*size .. (g+1)*size - 1``:
whole nodes, as a job scheduler hands them out) and ``strided`` (rank ``r``
goes to group ``r mod count``: every group spread over many nodes, one or a
few GPUs on each, so the groups share nodes). Any other placement is a list
of rank tuples.

Spec strings (:func:`parse_groups`, the CLI's ``--groups``; grammar of
:mod:`pathweave._spec`)::

    COUNTxSIZE[:layout=block|strided,stagger=SECONDS]

``stagger`` starts group ``g`` at ``g * stagger`` seconds. Every group's
demand comes from one workload spec, built with seed ``seed + g`` so that
random workloads differ between groups (:func:`groups`).

Examples
--------
>>> from pathweave.traffic.groups import groups, placement, parse_groups
>>> placement(16, 2, 4, "strided")
[(0, 2, 4, 6), (1, 3, 5, 7)]
>>> parse_groups("2x8:layout=strided,stagger=1e-3")
GroupsSpec(count=2, size=8, layout='strided', stagger_s=0.001)
>>> wl = groups(16, "hotspot:0.5", 2, 8, bytes_per_rank=700)
>>> float(wl.union_demand()[8:, 8:].sum()), float(wl.groups[1].demand.sum())
(5600.0, 5600.0)
>>> wl.rank_group.tolist()[:10]
[0, 0, 0, 0, 0, 0, 0, 0, 1, 1]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from pathweave import _spec
from pathweave._registry import did_you_mean
from pathweave.errors import WorkloadError

from .io import validate_demand
from .spec import DEFAULT_BYTES_PER_RANK, parse_workload

__all__ = ["LAYOUTS", "Group", "GroupWorkload", "GroupsSpec", "check_placement", "groups",
           "parse_groups", "placement"]

#: Names :func:`placement` accepts.
LAYOUTS = ("block", "strided")


@dataclass(frozen=True, eq=False)
class Group:
    """One group: its fabric ranks (ascending: group rank ``i`` is ``ranks[i]``,
    as torch numbers a subgroup), its demand in group rank order, its start time."""

    ranks: tuple[int, ...]
    demand: np.ndarray
    start_s: float = 0.0


@dataclass(frozen=True, eq=False)
class GroupWorkload:
    """Groups on one fabric of ``num_ranks`` ranks; checked when made.

    Raises
    ------
    WorkloadError
        Naming the group and the bad value: a rank out of range, not
        ascending, or in two groups; a demand whose shape is not the
        group's size; a negative or non-finite start time.
    """

    num_ranks: int
    groups: tuple[Group, ...]

    def __post_init__(self) -> None:
        if not self.groups:
            raise WorkloadError("a group workload needs at least one group")
        owner = check_placement(self.num_ranks, [g.ranks for g in self.groups])
        for g, grp in enumerate(self.groups):
            n = len(grp.ranks)
            if grp.demand.shape != (n, n):
                raise WorkloadError(f"group {g}: demand is {grp.demand.shape}, expected "
                                    f"({n}, {n}) for its {n} ranks")
            if not (math.isfinite(grp.start_s) and grp.start_s >= 0):
                raise WorkloadError(f"group {g}: start_s={grp.start_s!r} must be finite and >= 0")
        object.__setattr__(self, "_owner", owner)

    @property
    def rank_group(self) -> np.ndarray:
        """``int64[num_ranks]``: each rank's group, -1 for ranks no group holds."""
        return self._owner  # type: ignore[attr-defined, no-any-return]

    @property
    def ranks(self) -> tuple[tuple[int, ...], ...]:
        """The placement: every group's fabric ranks."""
        return tuple(g.ranks for g in self.groups)

    def union_demand(self) -> np.ndarray:
        """``float64[num_ranks, num_ranks]``: every group's demand at its ranks."""
        out = np.zeros((self.num_ranks, self.num_ranks))
        for g in self.groups:
            r = np.asarray(g.ranks)
            out[np.ix_(r, r)] = g.demand
        return out

    @cached_property
    def start_s(self) -> np.ndarray:
        """``float64[num_ranks]``: each rank's group start time (0 for ranks in none)."""
        out = np.zeros(self.num_ranks)
        for g in self.groups:
            out[list(g.ranks)] = g.start_s
        out.setflags(write=False)
        return out


def check_placement(num_ranks: int, ranks: Sequence[Sequence[int]]) -> np.ndarray:
    """Check a placement; ``int64[num_ranks]``: each rank's group, -1 for none.

    Raises
    ------
    WorkloadError
        Naming the group and the rank: out of range, not ascending, in two
        groups; or a group of fewer than 2 ranks.

    >>> check_placement(4, [(0, 1), (1, 2)])
    Traceback (most recent call last):
    ...
    pathweave.errors.WorkloadError: rank 1 is in group 0 and group 1
    """
    owner = np.full(num_ranks, -1, dtype=np.int64)
    for g, ranks_g in enumerate(ranks):
        r = np.asarray(ranks_g, dtype=np.int64)
        if r.size < 2:
            raise WorkloadError(f"group {g} has {r.size} rank(s); a group needs 2 or more")
        bad = r[(r < 0) | (r >= num_ranks)]
        if bad.size:
            raise WorkloadError(f"group {g}: rank {int(bad[0])} is outside the fabric's "
                                f"{num_ranks} ranks")
        if np.any(np.diff(r) <= 0):
            i = int(np.flatnonzero(np.diff(r) <= 0)[0])
            raise WorkloadError(f"group {g}: ranks must be ascending and distinct, got "
                                f"{int(r[i])} then {int(r[i + 1])}")
        taken = owner[r] >= 0
        if taken.any():
            k = int(r[np.flatnonzero(taken)[0]])
            raise WorkloadError(f"rank {k} is in group {int(owner[k])} and group {g}")
        owner[r] = g
    owner.setflags(write=False)
    return owner


def placement(num_ranks: int, count: int, size: int, layout: str = "block"
              ) -> list[tuple[int, ...]]:
    """``count`` groups of ``size`` ranks out of ``num_ranks``, by ``layout``.

    ``block``: group ``g`` holds ranks ``g*size`` to ``(g+1)*size - 1``.
    ``strided``: rank ``r < count*size`` goes to group ``r mod count``.

    >>> placement(8, 2, 4)
    [(0, 1, 2, 3), (4, 5, 6, 7)]
    """
    for label, v in (("count", count), ("size", size), ("num_ranks", num_ranks)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise WorkloadError(f"groups: {label}={v!r} must be a positive integer")
    if layout not in LAYOUTS:
        hint = did_you_mean(str(layout), LAYOUTS)
        raise WorkloadError(f"groups: unknown layout {layout!r}{hint}; valid: {', '.join(LAYOUTS)}")
    if count * size > num_ranks:
        raise WorkloadError(f"groups: {count}x{size} = {count * size} ranks, but the fabric has "
                            f"{num_ranks}")
    r = np.arange(count * size)
    if layout == "block":
        return [tuple(r[g * size:(g + 1) * size].tolist()) for g in range(count)]
    return [tuple(r[g::count].tolist()) for g in range(count)]


@dataclass(frozen=True)
class GroupsSpec:
    """A parsed ``COUNTxSIZE[:layout=...,stagger=...]`` spec (see the module docstring)."""

    count: int
    size: int
    layout: str = "block"
    stagger_s: float = 0.0


def parse_groups(spec: str) -> GroupsSpec:
    """Parse a groups spec such as ``"8x64:layout=strided"``.

    Raises
    ------
    WorkloadError
        Naming the spec and the bad part.

    >>> parse_groups("8x64")
    GroupsSpec(count=8, size=64, layout='block', stagger_s=0.0)
    >>> parse_groups("8by64")
    Traceback (most recent call last):
    ...
    pathweave.errors.WorkloadError: groups spec '8by64': '8by64' is not COUNTxSIZE (e.g. 8x64)
    """
    head, rest = _spec.split(spec, "groups spec")
    where = f"groups spec {spec!r}"
    count_text, x, size_text = head.lower().partition("x")
    if not x:
        raise WorkloadError(f"{where}: {head!r} is not COUNTxSIZE (e.g. 8x64)")
    count = _spec.integer(count_text.strip(), f"{where}: count {count_text!r}", WorkloadError)
    size = _spec.integer(size_text.strip(), f"{where}: size {size_text!r}", WorkloadError)
    if count < 1 or size < 2:
        raise WorkloadError(f"{where}: needs COUNT >= 1 groups of SIZE >= 2 ranks")
    layout, stagger = "block", 0.0
    for key, written, text in _spec.items(rest, where=where, error=WorkloadError,
                                          canonical=str.lower):
        if key == "layout":
            layout = text.lower()
            if layout not in LAYOUTS:
                raise WorkloadError(f"{where}: layout={text!r} is not one of "
                                    f"{', '.join(LAYOUTS)}{did_you_mean(text, LAYOUTS)}")
        elif key == "stagger":
            stagger = _spec.number(text, f"{where}: stagger={text!r}", WorkloadError)
            if stagger < 0:
                raise WorkloadError(f"{where}: stagger={text!r} must be >= 0 seconds")
        else:
            raise WorkloadError(f"{where}: unknown key {written!r}"
                                f"{did_you_mean(str(written), ['layout', 'stagger'])}; "
                                "valid: layout, stagger")
    return GroupsSpec(count, size, layout, stagger)


def groups(
    num_ranks: int,
    workload: str | Sequence[str | np.ndarray],
    count: int | None = None,
    size: int | None = None,
    layout: str = "block",
    *,
    ranks: Sequence[Sequence[int]] | None = None,
    start_s: Sequence[float] | float = 0.0,
    bytes_per_rank: float = DEFAULT_BYTES_PER_RANK,
    seed: int = 0,
) -> GroupWorkload:
    """A :class:`GroupWorkload`: one workload spec for all groups, or one matrix per group.

    Parameters
    ----------
    num_ranks
        The fabric's ranks.
    workload
        A workload spec or demand file (:func:`~pathweave.traffic.parse_workload`),
        built for each group ``g`` with seed ``seed + g``; or one spec or
        demand matrix per group.
    count, size, layout
        The placement (:func:`placement`), unless ``ranks`` gives it.
    ranks
        Explicit placement: each group's fabric ranks, ascending.
    start_s
        One start time per group, or a stagger: group ``g`` starts at
        ``g * start_s``.
    bytes_per_rank, seed
        As for :func:`~pathweave.traffic.parse_workload`.
    """
    if ranks is None:
        if count is None or size is None:
            raise WorkloadError("groups: give count and size, or ranks")
        ranks = placement(num_ranks, count, size, layout)
    ranks = [tuple(int(r) for r in g) for g in ranks]
    starts = ([g * float(start_s) for g in range(len(ranks))]
              if isinstance(start_s, (int, float)) else [float(s) for s in start_s])
    if len(starts) != len(ranks):
        raise WorkloadError(f"groups: {len(starts)} start times for {len(ranks)} groups")
    each = [workload] * len(ranks) if isinstance(workload, str) else list(workload)
    if len(each) != len(ranks):
        raise WorkloadError(f"groups: {len(each)} workloads for {len(ranks)} groups")
    demands = []
    for g, (w, r) in enumerate(zip(each, ranks, strict=True)):
        try:
            demands.append(parse_workload(w, len(r), bytes_per_rank=bytes_per_rank, seed=seed + g)
                           if isinstance(w, str) else validate_demand(w, len(r)))
        except WorkloadError as exc:
            raise WorkloadError(f"group {g} ({len(r)} ranks): {exc}") from None
    return GroupWorkload(num_ranks, tuple(Group(r, d, s) for r, d, s in
                                          zip(ranks, demands, starts, strict=True)))
