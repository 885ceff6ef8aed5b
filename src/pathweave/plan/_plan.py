"""The :class:`Plan`: how every pair's bytes are split over candidate paths."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from pathweave.errors import PlanError
from pathweave.fabric import Fabric, PathKind, PathSet
from pathweave.fabric.paths import ROLES


@dataclass(frozen=True)
class Route:
    """One fragment of a pair's traffic: ``bytes`` on one candidate path."""

    path_id: int
    kind: str  # direct | relay | rail | spine
    role: str  # for rail paths: matched | rd | dr | drd; else the kind
    via: int
    bytes: int
    vertices: tuple[str, ...]


@dataclass(frozen=True, eq=False, init=False)
class Plan:
    """The result of every policy: per pair, a list of (path, bytes).

    Flows are stored flat: ``flow_path[i]`` is a path id of ``paths`` and
    ``flow_bytes[i]`` the whole number of bytes it carries, sorted by pair and
    then path id. Every policy returns this same type, so the simulator, the
    runtime and the CLI treat all policies alike.

    Attributes
    ----------
    fabric, paths
        The fabric and the compiled candidate paths the plan refers to.
    demand
        ``int64[N, N]`` bytes from each rank to each rank.
    flow_path, flow_bytes
        ``int64[F]`` path ids and bytes of the plan's fragments.
    policy
        Registry name of the policy that made the plan.
    plan_s
        Wall time the policy took, in seconds (set by
        :func:`pathweave.plan.make`).
    info
        Policy-specific facts (e.g. ``optimum_s`` and ``solver_status`` for
        ``optimal``, ``rounds`` for ``mwu``).

    Examples
    --------
    >>> import numpy as np, pathweave as pw
    >>> fab = pw.fabric.preset("h100-2x4")
    >>> D = np.zeros((8, 8)); D[0, 1] = 120e6   # 120 MB over one 120 GB/s NVLink
    >>> plan = pw.plan.make(fab, D, policy="static")
    >>> round(plan.congestion_s * 1e3, 6)            # ms
    1.0
    >>> [(r.kind, r.bytes) for r in plan.routes(0, 1)]
    [('direct', 120000000)]
    """

    fabric: Fabric
    paths: PathSet
    demand: np.ndarray
    flow_path: np.ndarray
    flow_bytes: np.ndarray
    policy: str
    plan_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    def __init__(self, fabric: Fabric, paths: PathSet, demand: np.ndarray,
                 flow_path: np.ndarray, flow_bytes: np.ndarray, policy: str,
                 plan_s: float = 0.0, info: dict[str, Any] | None = None) -> None:
        # NOTE: the fields go straight into __dict__: the frozen dataclass's own
        # __init__ sets each through object.__setattr__, ~1-2 us a plan (an
        # 8-GPU default plan builds two).
        self.__dict__.update(fabric=fabric, paths=paths, demand=demand, flow_path=flow_path,
                             flow_bytes=flow_bytes, policy=policy, plan_s=plan_s,
                             info={} if info is None else info)

    # ------------------------------------------------------------ link terms
    @cached_property
    def link_load_bytes(self) -> np.ndarray:
        """``float64[num_links]``: bytes the plan puts on each directed link."""
        return self.paths.link_load_bytes(self.flow_path, self.flow_bytes)

    @cached_property
    def link_time_s(self) -> np.ndarray:
        """``float64[num_links]``: load / capacity, the busy time of each link."""
        return self.link_load_bytes / self.fabric.capacity_Bps

    @cached_property
    def congestion_s(self) -> float:
        """``max_e load_e / capacity_e``: the least time the plan can take."""
        t = self.link_time_s
        return float(t.max()) if t.size else 0.0

    @property
    def bottleneck_link(self) -> int:
        """Id of the most congested link (lowest id among ties)."""
        return int(np.argmax(self.link_time_s))

    @property
    def paths_used(self) -> int:
        """Number of distinct candidate paths carrying bytes."""
        return int(np.unique(self.flow_path[self.flow_bytes > 0]).size)

    @property
    def fragments(self) -> int:
        """Number of (pair, path) fragments carrying bytes."""
        return int(np.count_nonzero(self.flow_bytes))

    @property
    def total_bytes(self) -> int:
        return int(self.flow_bytes.sum())

    @cached_property
    def _pair_of_flow(self) -> np.ndarray:
        ps = self.paths
        return ps.src[self.flow_path].astype(np.int64) * ps.num_ranks + ps.dst[self.flow_path]

    def split_pairs(self) -> int:
        """Number of pairs whose bytes go over more than one path."""
        pairs = self._pair_of_flow[self.flow_bytes > 0]
        _, counts = np.unique(pairs, return_counts=True)
        return int(np.count_nonzero(counts > 1))

    # -------------------------------------------------------------- per pair
    def routes(self, src: int, dst: int) -> list[Route]:
        """The fragments of pair ``(src, dst)``, in path-id order."""
        n = self.paths.num_ranks
        if not (0 <= src < n and 0 <= dst < n):
            raise PlanError(f"pair ({src}, {dst}) out of range for {n} ranks")
        p = src * n + dst
        lo, hi = np.searchsorted(self._pair_of_flow, [p, p + 1])
        ps = self.paths
        out = []
        for i in range(int(lo), int(hi)):
            pid = int(self.flow_path[i])
            b = int(self.flow_bytes[i])
            if b == 0:
                continue
            out.append(
                Route(
                    pid,
                    PathKind(int(ps.kind[pid])).label,
                    ps.rail_role(pid),
                    int(ps.via[pid]),
                    b,
                    tuple(ps.path_vertices(pid)),
                )
            )
        return out

    def pair_bytes(self) -> np.ndarray:
        """``int64[N, N]``: bytes the plan carries per pair (equals ``demand`` when valid)."""
        n = self.paths.num_ranks
        out = np.bincount(self._pair_of_flow, weights=self.flow_bytes, minlength=n * n)
        return np.rint(out).astype(np.int64).reshape(n, n)

    def path_bytes(self) -> np.ndarray:
        """``int64[num_paths]``: bytes the plan puts on each candidate path.

        Two plans over one path set with equal ``path_bytes`` send the same
        bytes the same way, however their fragments are cut.
        """
        out = np.bincount(self.flow_path, weights=self.flow_bytes,
                          minlength=self.paths.num_paths)
        return np.rint(out).astype(np.int64)

    def kind_bytes(self) -> dict[str, int]:
        """Bytes per path kind (rail paths split by role: matched, rd, dr, drd)."""
        codes = self.paths.role_code[self.flow_path]
        sums = np.bincount(codes, weights=self.flow_bytes, minlength=len(ROLES))
        return {ROLES[i]: round(float(v)) for i, v in enumerate(sums) if v}

    # ------------------------------------------------------------ invariants
    def validate(self) -> Plan:
        """Check the plan's invariants; raise :class:`PlanError` naming the first breach.

        * every flow names a candidate path of this plan's path set;
        * bytes are whole, non-negative numbers;
        * per pair, the bytes over all paths equal the demand exactly.

        Returns the plan, so ``plan.validate().congestion_s`` reads well.
        """
        ps = self.paths
        n = ps.num_ranks
        if self.paths.fabric is not self.fabric:
            raise PlanError("plan's path set was compiled for another fabric")
        if self.demand.shape != (n, n):
            raise PlanError(f"demand has shape {self.demand.shape}, expected ({n}, {n})")
        fp, fb = self.flow_path, self.flow_bytes
        if fp.shape != fb.shape or fp.ndim != 1:
            raise PlanError(f"flow arrays disagree: paths {fp.shape}, bytes {fb.shape}")
        if fp.size:
            bad = np.flatnonzero((fp < 0) | (fp >= ps.num_paths))
            if bad.size:
                raise PlanError(
                    f"flow {int(bad[0])} names path {int(fp[bad[0]])}, but the fabric has "
                    f"{ps.num_paths} candidate paths"
                )
        if fb.dtype.kind not in "iu":
            raise PlanError(f"flow bytes must be integers, got dtype {fb.dtype}")
        neg = np.flatnonzero(fb < 0)
        if neg.size:
            i = int(neg[0])
            raise PlanError(
                f"flow {i} on path {ps.describe(int(fp[i]))} carries {int(fb[i])} bytes (< 0)"
            )
        if fp.size > 1:
            key = self._pair_of_flow * ps.num_paths + fp
            if np.any(np.diff(key) <= 0):
                raise PlanError("flows must be sorted by pair and path id, without repeats")
        got = self.pair_bytes()
        want = self.demand
        diff = np.flatnonzero((got != want).reshape(-1))
        if diff.size:
            s, d = divmod(int(diff[0]), n)
            raise PlanError(
                f"pair ({s}, {d}): plan carries {int(got[s, d])} bytes but the demand is "
                f"{int(want[s, d])}; {diff.size} pairs differ"
            )
        return self

    # -------------------------------------------------------------- display
    def summary(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "fabric": self.fabric.name,
            "ranks": self.paths.num_ranks,
            "total_bytes": self.total_bytes,
            "congestion_s": self.congestion_s,
            "bottleneck": self.fabric.link_name(self.bottleneck_link) if self.fragments else None,
            "paths_used": self.paths_used,
            "fragments": self.fragments,
            "split_pairs": self.split_pairs(),
            "plan_s": self.plan_s,
            **{k: v for k, v in self.info.items() if isinstance(v, (int, float, str, type(None)))},
        }

    def __repr__(self) -> str:
        return (
            f"Plan(policy={self.policy!r}, fabric={self.fabric.name!r}, "
            f"congestion_s={self.congestion_s:.6g}, fragments={self.fragments}, "
            f"paths_used={self.paths_used})"
        )
