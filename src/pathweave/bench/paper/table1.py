"""NIMBLE Table I: planning time against communication time for a 1-D stencil.

Setup
-----
Fabric ``h100-2x4``; a plain 1-D stencil (:func:`pathweave.traffic.stencil`
with ``boundary_factor=1``: the paper mentions no boundary hot spot), every
rank sending 16 to 256 MiB split evenly over its line neighbours:

intra-node
    The line is the four GPUs of node 0 (the other node is idle), so all
    traffic stays on NVLink.
inter-node
    The line is all eight GPUs, ordered ``0, 4, 1, 5, 2, 6, 3, 7`` so that
    every pair of neighbours sits on different nodes and all traffic
    crosses the NICs, as in the paper's inter-node column.

"Algo" is the wall time of ``mwu`` planning (:attr:`Plan.plan_s
<pathweave.plan.Plan>`, median of :data:`REPEATS` calls after a warm-up
call); "comm" is the ``mwu`` plan's makespan from
:func:`pathweave.sim.simulate`. The paper's numbers stand beside ours.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from pathweave import fabric as pwfabric
from pathweave import plan as pwplan
from pathweave import sim, traffic
from pathweave.bench.paper._common import (
    Comparison,
    Progress,
    no_progress,
)

NAME = "table1"
TITLE = "Table I: mwu planning time vs simulated communication, 1-D stencil on h100-2x4"

FABRIC = "h100-2x4"
SIZES_MIB = (16, 32, 64, 128, 256)
QUICK_SIZES_MIB = (16, 256)
REPEATS = 101
QUICK_REPEATS = 5
#: ``measure``'s arguments in a quick run; a full run uses its defaults.
QUICK = {"sizes_mib": QUICK_SIZES_MIB, "repeats": QUICK_REPEATS}
CASES = ("intra-node", "inter-node")
BOUNDARY_FACTOR = 1.0
#: Line order of the inter-node case: neighbours alternate between the nodes.
INTER_NODE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)

#: The paper's Table I, milliseconds: size (MB) -> (algo, comm) per case.
PAPER_MS: dict[str, dict[int, tuple[float, float]]] = {
    "intra-node": {16: (0.0321, 0.1973), 32: (0.0344, 0.3662), 64: (0.0347, 0.6512),
                   128: (0.0343, 1.0689), 256: (0.0363, 2.0464)},
    "inter-node": {16: (0.0374, 0.4860), 32: (0.0325, 0.7361), 64: (0.0350, 1.7701),
                   128: (0.0426, 3.2270), 256: (0.0480, 6.5390)},
}


def stencil_demand(case: str, num_ranks: int, bytes_per_rank: int) -> np.ndarray:
    """The demand of ``case`` on a fabric of ``num_ranks`` (8 for ``h100-2x4``).

    Examples
    --------
    >>> D = stencil_demand("inter-node", 8, 100)
    >>> [(int(s), int(d)) for s, d in zip(*np.nonzero(D)) if s < d]  # all cross nodes
    [(0, 4), (1, 4), (1, 5), (2, 5), (2, 6), (3, 6), (3, 7)]
    """
    demand = np.zeros((num_ranks, num_ranks))
    if case == "intra-node":
        ranks = list(range(num_ranks // 2))  # the GPUs of node 0
    elif case == "inter-node":
        ranks = list(INTER_NODE_ORDER)
    else:
        raise ValueError(f"unknown case {case!r}; use one of {', '.join(CASES)}")
    line = traffic.stencil(len(ranks), bytes_per_rank, dims=1, boundary_factor=BOUNDARY_FACTOR)
    demand[np.ix_(ranks, ranks)] = line
    return demand


def measure(
    sizes_mib: tuple[int, ...] = SIZES_MIB,
    *,
    repeats: int = REPEATS,
    progress: Progress = no_progress,
) -> list[dict]:
    """One row per (case, size): mwu planning time, simulated times, the paper's numbers."""
    fab = pwfabric.preset(FABRIC)
    rows: list[dict] = []
    total = len(CASES) * len(sizes_mib)
    for i, case in enumerate(CASES):
        for j, mib in enumerate(sizes_mib):
            progress(i * len(sizes_mib) + j, total, f"{NAME}: {case}, {mib} MiB")
            demand = stencil_demand(case, fab.num_ranks, mib << 20)
            pwplan.make(fab, demand, "mwu")  # untimed: path compilation, kernel load
            times = []
            for _ in range(repeats):
                plan = pwplan.make(fab, demand, "mwu")
                times.append(plan.plan_s)
            static = pwplan.make(fab, demand, "static")
            paper = PAPER_MS[case].get(mib)
            comm_s = sim.simulate(fab, plan).makespan_s
            plan_s = statistics.median(times)
            rows.append(
                {
                    "case": case,
                    "size_MiB": mib,
                    "plan_s": plan_s,
                    "comm_s": comm_s,
                    "plan_over_comm": plan_s / comm_s,
                    "congestion_s": plan.congestion_s,
                    "static_comm_s": sim.simulate(fab, static).makespan_s,
                    "paper_algo_s": paper[0] * 1e-3 if paper else float("nan"),
                    "paper_comm_s": paper[1] * 1e-3 if paper else float("nan"),
                }
            )
    progress(total, total, f"{NAME}: done")
    return rows


def summarize(rows: list[dict]) -> tuple[list[Comparison], list[str]]:
    """Planning and communication time at the largest size, per case, beside the paper's."""
    comps = []
    for case in CASES:
        mine = [r for r in rows if r["case"] == case]
        if not mine:
            continue
        top = max(mine, key=lambda r: r["size_MiB"])
        paper = PAPER_MS[case].get(top["size_MiB"])
        label = f"{case}, {top['size_MiB']} MiB"
        comps.append(Comparison(f"{label}: mwu planning (algo)", top["plan_s"] * 1e3,
                                paper[0] if paper else None, "ms"))
        comps.append(Comparison(f"{label}: communication (comm)", top["comm_s"] * 1e3,
                                paper[1] if paper else None, "ms"))
    worst = max(rows, key=lambda r: r["plan_over_comm"])
    paper = PAPER_MS[worst["case"]].get(worst["size_MiB"])
    comps.append(Comparison(f"largest planning / communication ({worst['case']}, "
                            f"{worst['size_MiB']} MiB)", worst["plan_over_comm"] * 100,
                            paper[0] / paper[1] * 100 if paper else None, "%"))
    notes = [
        "sizes are MiB per rank (the paper says MB); algo is the median mwu planning time "
        "in this process (numba kernel, 2 shared CPU cores here), comm the simulated makespan",
    ]
    return comps, notes


def plot(rows: list[dict], path: Path) -> Path:
    """Planning and communication time against size, ours and the paper's, per case."""
    from matplotlib.figure import Figure

    from pathweave.bench.paper import save_figure

    cases = list(dict.fromkeys(r["case"] for r in rows))
    fig = Figure(figsize=(5.4 * len(cases), 4.2), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(cases))).ravel()
    for ax, case in zip(axes, cases, strict=True):
        mine = sorted((r for r in rows if r["case"] == case), key=lambda r: r["size_MiB"])
        xs = [r["size_MiB"] for r in mine]
        ax.plot(xs, [r["comm_s"] * 1e3 for r in mine], "o-", color="#2e8b57",
                label="comm, ours (simulated)")
        ax.plot(xs, [r["plan_s"] * 1e3 for r in mine], "s-", color="#f28e2b",
                label="algo, ours (mwu planning)")
        paper = sorted(PAPER_MS[case].items())
        ax.plot([p[0] for p in paper], [p[1][1] for p in paper], "o--", color="#2e8b57",
                mfc="none", label="comm, paper")
        ax.plot([p[0] for p in paper], [p[1][0] for p in paper], "s--", color="#f28e2b",
                mfc="none", label="algo, paper")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("size per rank (MiB)")
        ax.set_ylabel("time (ms)")
        ax.set_title(case, fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle(TITLE, fontsize=11)
    return save_figure(fig, path)


__all__ = ["CASES", "NAME", "PAPER_MS", "QUICK", "TITLE", "measure", "plot", "stencil_demand",
           "summarize"]
