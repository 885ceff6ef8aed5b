"""What every paper reproduction returns, and how it writes its CSV.

Each figure is one module of :mod:`pathweave.bench.paper` with a ``NAME``, a
``TITLE``, ``QUICK``, ``measure``, ``summarize`` and ``plot``;
:func:`pathweave.bench.paper.run_figure` writes ``<NAME>.csv`` and
``<NAME>.png`` into the output folder; the CLI renders the result, so figure
modules never print.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pathweave.bench._report import Progress as Progress  # re-exported to the figures
from pathweave.bench._report import write_csv as write_csv  # re-exported to the figures


@dataclass(frozen=True)
class Comparison:
    """One number the paper reports, beside ours (``paper`` is None where it gives none)."""

    label: str
    ours: float
    paper: float | None = None
    unit: str = ""

    @property
    def ratio(self) -> float | None:
        """``ours / paper``, or None without a paper value."""
        if self.paper is None or self.paper == 0:
            return None
        return self.ours / self.paper


@dataclass
class FigureResult:
    """Rows of one reproduction, the files written, and the key numbers."""

    name: str
    title: str
    rows: list[dict[str, Any]]
    csv_path: Path | None = None
    png_path: Path | None = None
    comparisons: list[Comparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def no_progress(done: int, total: int, what: str) -> None:
    """A :data:`Progress` that ignores its calls."""


#: What users run that each baseline policy stands for (plot and table labels).
PEER_NAMES = {"static": "NCCL", "multirail": "MPI/UCX", "deepep": "DeepEP", "hscore": "h-score"}
#: The paper's names: the peers', and NIMBLE for ``mwu`` (its Algorithm 1).
PAPER_NAMES = {**PEER_NAMES, "mwu": "NIMBLE"}


def peer_lines(times: Mapping[Any, Mapping[str, float]], *, tie_rtol: float) -> list[str]:
    """PASS/MISS lines: the default policy at most 1.00x every baseline on every case.

    ``times[case][policy]`` is a simulated time; the baselines are the
    registry's (:func:`pathweave.plan.baselines`), so a new peer is checked
    without a change here. A ratio within ``tie_rtol`` above 1 is a tie.
    """
    from pathweave import plan as pwplan

    default = pwplan.DEFAULT_POLICY
    out = []
    for peer in pwplan.baselines():
        ratios = {case: row[default] / row[peer] for case, row in times.items()
                  if default in row and peer in row}
        if not ratios:
            continue
        worst = max(ratios, key=ratios.__getitem__)
        best = min(ratios, key=ratios.__getitem__)
        v = ratios[worst]
        out.append(
            f"{'PASS' if v <= 1.0 + tie_rtol else 'MISS'}: {default} <= 1.00x {peer} "
            f"({PEER_NAMES.get(peer, peer)}) on every case: worst {v:.3f}x at {worst}, "
            f"best {1 / ratios[best]:.2f}x faster at {best}"
        )
    return out


def time_target_lines(fabric: str, ranks: int, rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """PASS/MISS lines of the default policy's time targets over a figure's rows.

    Each row gives ``workload``, ``policy``, ``sim_s``, ``predicted_s`` and
    ``time_optimum_s`` (the last two may be None); the lines are
    :func:`pathweave.bench.planner.time_checks`'s that hold a target (a
    figure does not time planning, so no planning-time line).
    """
    from pathweave.bench.planner import time_checks

    recs = [{**r, "fabric": fabric, "ranks": ranks, "plan_s_median": None} for r in rows]
    return [f"{'PASS' if c.passed else 'MISS'}: {c.text}" for c in time_checks(recs)
            if c.passed is not None]


def default_lines(
    rows: Iterable[Mapping[str, Any]], fabric: str, ranks: int, *,
    case: Callable[[Mapping[str, Any]], str], seconds: Callable[[Mapping[str, Any]], float],
    workload: Callable[[Mapping[str, Any]], str], predicted: str, optimum: str,
) -> tuple[list[str], dict[str, dict[str, float]]]:
    """The default policy's PASS/MISS lines over a figure's rows, and its times.

    Each row is one policy's (``row["policy"]``) on one case (``case(row)``,
    its workload spec ``workload(row)``) that took ``seconds(row)`` simulated,
    with the predicted and the time-yardstick seconds under the keys
    ``predicted`` and ``optimum``. The lines are the time targets'
    (:func:`time_target_lines`) then the peers' (:func:`peer_lines`); the
    times are ``times[case][policy]``, for a figure's own lines.
    """
    from pathweave.bench.planner import SIM_TIE_RTOL

    rows = list(rows)
    times: dict[str, dict[str, float]] = {}
    for r in rows:
        times.setdefault(case(r), {})[r["policy"]] = seconds(r)
    lines = time_target_lines(fabric, ranks, (
        {"workload": workload(r), "policy": r["policy"], "sim_s": seconds(r),
         "predicted_s": r.get(predicted), "time_optimum_s": r.get(optimum)}
        for r in rows
    ))
    return [*lines, *peer_lines(times, tie_rtol=SIM_TIE_RTOL)], times
