"""Plan one demand with several policies and measure each against the LP optimum.

Shared by ``pathweave plan`` and ``pathweave demo``, so both print the same
table and write the same JSON records.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich.table import Table

from pathweave import fabric as pwfabric
from pathweave import plan as pwplan
from pathweave.bench.planner import warm_up
from pathweave.cli._common import add_columns, fmt_duration, fmt_ratio, fmt_time
from pathweave.errors import SolverError
from pathweave.fabric import Fabric
from pathweave.plan import Plan


@dataclass
class PolicyResult:
    """One policy's plan, or why there is none (HiGHS failed or timed out)."""

    policy: str
    plan: Plan | None
    error: str | None = None

    @property
    def congestion_s(self) -> float | None:
        return None if self.plan is None else self.plan.congestion_s

    @property
    def predicted_s(self) -> float | None:
        """Completion time by the planner's time model (bound + forwarding costs)."""
        return None if self.plan is None else pwplan.predict_time(self.plan)


@dataclass
class Comparison:
    """Every requested policy's plan of one demand, plus the LP optimum."""

    fabric: Fabric
    workload: str
    bytes_per_rank: float
    demand: np.ndarray
    results: list[PolicyResult]
    optimum_s: float | None
    optimum_error: str | None = None
    optimal_plan: Plan | None = field(default=None, repr=False)

    def result(self, policy: str) -> PolicyResult:
        for r in self.results:
            if r.policy == policy:
                return r
        raise KeyError(policy)

    def ratio(self, policy: str) -> float | None:
        """``congestion / optimum``; ``None`` where either is missing."""
        c = self.result(policy).congestion_s
        if c is None or not self.optimum_s:
            return None
        return c / self.optimum_s

    def records(self) -> list[dict[str, Any]]:
        """One JSON-ready record per requested policy (``None`` where not available)."""
        out = []
        for r in self.results:
            p = r.plan
            out.append(
                {
                    "fabric": self.fabric.name,
                    "ranks": self.fabric.num_ranks,
                    "workload": self.workload,
                    "bytes_per_rank": self.bytes_per_rank,
                    "policy": r.policy,
                    "congestion_s": None if p is None else p.congestion_s,
                    "predicted_s": r.predicted_s,
                    "optimal_s": self.optimum_s,
                    "ratio": self.ratio(r.policy),
                    "paths_used": None if p is None else p.paths_used,
                    "split_pairs": None if p is None else p.split_pairs(),
                    "plan_s": None if p is None else p.plan_s,
                    "bottleneck": None if p is None or not p.fragments
                    else self.fabric.link_name(p.bottleneck_link),
                    "error": r.error,
                }
            )
        return out

    def table(self, title: str | None = None) -> Table:
        """The policy table: congestion, ratio to optimal, predicted time, paths, split pairs,
        planning time."""
        table = add_columns(
            Table(title=title, title_justify="left"),
            ("policy", "congestion", "x optimal", "time", "paths", "split", "planned in",
             "bottleneck link"),
            left={"policy", "bottleneck link"},
        )
        for r in self.results:
            p = r.plan
            if p is None:
                table.add_row(r.policy, "n/a", "n/a", "n/a", "", "", "", f"[yellow]{r.error}[/]")
                continue
            ratio = self.ratio(r.policy)
            style = "green" if ratio is not None and ratio <= 1.02 else None
            table.add_row(
                r.policy,
                fmt_time(p.congestion_s),
                fmt_ratio(ratio),
                fmt_time(r.predicted_s),
                str(p.paths_used),
                str(p.split_pairs()),
                fmt_duration(p.plan_s),
                self.fabric.link_name(p.bottleneck_link) if p.fragments else "-",
                style=style,
            )
        return table


def compare(
    fabric: Fabric,
    demand: np.ndarray,
    policies: Sequence[str],
    *,
    workload: str,
    bytes_per_rank: float,
    time_limit_s: float = 120.0,
    on_policy: Callable[[str], None] | None = None,
    lp: bool = True,
) -> Comparison:
    """Plan ``demand`` with every policy in ``policies`` and with ``optimal``.

    ``optimal`` runs even when not requested, because every ratio is
    measured against it; if HiGHS fails or exceeds ``time_limit_s`` the
    ratios are ``None`` and the solver's message is kept. ``lp=False`` skips
    the LP (at 1024 GPUs it needs ~16 GB and minutes): no ratios then, and
    ``optimal`` is left out even when requested. Any other error
    (an unknown policy, a bad demand) propagates: it is the caller's input
    that is wrong.
    """
    warm_up()
    pwfabric.candidate_paths(fabric)  # compiled once here, not inside the first policy's time
    results: list[PolicyResult] = []
    optimal_plan: Plan | None = None
    optimum_error: str | None = None
    todo = [p for p in policies if lp or p != "optimal"]
    if lp and "optimal" not in todo:
        todo.append("optimal")
    for name in todo:
        if on_policy is not None:
            on_policy(name)
        opts = {"time_limit_s": time_limit_s} if name == "optimal" else {}
        try:
            plan = pwplan.make(fabric, demand, name, **opts)
        except SolverError as exc:
            plan = None
            optimum_error = str(exc)
        if name == "optimal":
            optimal_plan = plan
        if name in policies:
            results.append(PolicyResult(name, plan, None if plan else "LP not solved"))
    optimum = None
    if not lp:
        optimum_error = "skipped (--no-lp)"
    if optimal_plan is not None:
        # The LP's fractional optimum is the true lower bound; the rounded
        # plan's congestion can sit a few bytes above it.
        optimum = float(optimal_plan.info.get("optimum_s", optimal_plan.congestion_s))
    return Comparison(
        fabric, workload, bytes_per_rank, demand, results, optimum, optimum_error, optimal_plan
    )
