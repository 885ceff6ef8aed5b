"""Hopper's headline experiment: FCT on an asymmetric leaf-spine fabric.

Setup
-----
A leaf-spine fabric of single-GPU hosts (:func:`pathweave.fabric.builders.leaf_spine`):
8 leaves, 8 hosts per leaf (4 with ``quick``), 4 spines, 100 Gb/s NICs, a
non-blocking spine layer, 1 us per link; every link of ``spine3`` runs 10x
slower (:data:`SLOW_FACTOR`), the asymmetry of Hopper's testbed (10 Gb/s
beside 1 Gb/s paths). Flows arrive as a Poisson process at 30, 50 and 80 %
of every NIC's line rate with web-search-like heavy-tailed sizes
(:func:`pathweave.traffic.trace.poisson_trace`); every policy plays the same
trace in :func:`pathweave.sim.run_dynamic` (10 us epochs, 64 KB standing
queue target).

Policies: ``ecmp``, ``spray``, ``flowbender``, ``hopper`` and
``nimble-online`` (:mod:`pathweave.sim.policies`). Rows report average and
p99 FCT, slowdown against the ideal FCT, path switches and out-of-order
exposure.

The paper (ns-3, 128 servers, DCQCN, ML-training and AliCloud/Hadoop
traces) reports up to 20 % lower average and 14 % lower p99 FCT than
FlowBender in simulation. Our setting differs (fluid model, our congestion
control abstraction, web-search sizes, a 10x slower spine), so the
comparison is qualitative: the order of the policies and the size of the
gap.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pathweave import sim
from pathweave.bench.paper._common import (
    Comparison,
    Progress,
    no_progress,
)
from pathweave.fabric import Fabric
from pathweave.fabric.builders import leaf_spine
from pathweave.traffic.trace import poisson_trace

NAME = "hopper"
TITLE = "Hopper: FCT on an asymmetric leaf-spine (one spine 10x slower), 30/50/80 % load"

LEAVES = 8
HOSTS_PER_LEAF = 8
QUICK_HOSTS_PER_LEAF = 4
SPINES = 4
SLOW_SPINE = 3
SLOW_FACTOR = 0.1
HOST_Bps = 100e9 / 8
LOADS = (0.3, 0.5, 0.8)
FLOWS = 6000
QUICK_FLOWS = 800
#: ``measure``'s arguments in a quick run; a full run uses its defaults.
QUICK = {"hosts_per_leaf": QUICK_HOSTS_PER_LEAF, "num_flows": QUICK_FLOWS}
POLICIES = ("ecmp", "spray", "flowbender", "hopper", "nimble-online")
SEED = 1
#: Bar colours: the static baselines warm, the adaptive ones cool, nimble as mwu.
COLOURS = {
    "ecmp": "#c0504d",
    "spray": "#f2a541",
    "flowbender": "#8064a2",
    "hopper": "#4f81bd",
    "nimble-online": "#2e8b57",
}

#: Hopper's simulation result over FlowBender: up to this much lower FCT (%).
PAPER_AVG_GAIN_PCT = 20.0
PAPER_P99_GAIN_PCT = 14.0


def fabric(hosts_per_leaf: int = HOSTS_PER_LEAF) -> Fabric:
    """The asymmetric leaf-spine: every link of ``spine3`` at 10 % capacity.

    Examples
    --------
    >>> fab = fabric(2)
    >>> fab.num_ranks
    16
    >>> round(float(fab.capacity_Bps[fab.link_id("leaf0", "spine3")] / 1e9), 3)  # GB/s
    0.625
    """
    fab = leaf_spine(LEAVES, hosts_per_leaf, SPINES, host_Bps=HOST_Bps)
    slow = {}
    for j in range(LEAVES):
        slow[(f"leaf{j}", f"spine{SLOW_SPINE}")] = SLOW_FACTOR
        slow[(f"spine{SLOW_SPINE}", f"leaf{j}")] = SLOW_FACTOR
    return fab.with_links(slow, name=f"{fab.name}-slow-spine{SLOW_SPINE}")


def measure(
    loads: tuple[float, ...] = LOADS,
    *,
    hosts_per_leaf: int = HOSTS_PER_LEAF,
    num_flows: int = FLOWS,
    policies: tuple[str, ...] = POLICIES,
    progress: Progress = no_progress,
) -> list[dict]:
    """One row per (load, policy)."""
    fab = fabric(hosts_per_leaf)
    rows: list[dict] = []
    total = len(loads) * len(policies)
    done = 0
    for load in loads:
        trace = poisson_trace(
            fab.num_ranks, load=load, host_Bps=HOST_Bps, num_flows=num_flows, seed=SEED
        )
        for policy in policies:
            progress(done, total, f"{NAME}: load {load:.0%}, {policy}")
            done += 1
            r = sim.run_dynamic(fab, trace, policy, seed=SEED)
            slow = r.slowdown[~np.isnan(r.fct_s)]
            rows.append(
                {
                    "load": load,
                    "policy": policy,
                    "flows": r.num_flows,
                    "finished": r.finished,
                    "avg_fct_us": r.avg_fct_s * 1e6,
                    "p99_fct_us": r.p99_fct_s * 1e6,
                    "avg_slowdown": float(slow.mean()) if slow.size else float("nan"),
                    "p99_slowdown": float(np.percentile(slow, 99)) if slow.size else float("nan"),
                    "switches_per_flow": float(r.switches.sum()) / max(r.num_flows, 1),
                    "ooo_flows_pct": 100.0 * r.ooo_flows / max(r.num_flows, 1),
                    "ooo_bytes_pct": 100.0 * float(r.ooo_bytes.sum()) / float(r.size_bytes.sum()),
                    "net_util_mean": r.link_summary()["net_util_mean"],
                    "sim_ms": r.end_s * 1e3,
                    "wall_s": r.wall_s,
                }
            )
    progress(total, total, f"{NAME}: done")
    return rows


def _gain_pct(rows: list[dict], load: float, key: str, base: str, policy: str) -> float | None:
    by = {r["policy"]: r for r in rows if r["load"] == load}
    if base not in by or policy not in by:
        return None
    return 100.0 * (by[base][key] - by[policy][key]) / by[base][key]


def summarize(rows: list[dict]) -> tuple[list[Comparison], list[str]]:
    """Hopper's gain over FlowBender beside the paper's, and the distance to nimble-online."""
    comps: list[Comparison] = []
    loads = sorted({r["load"] for r in rows})
    for load in loads:
        g = _gain_pct(rows, load, "avg_fct_us", "flowbender", "hopper")
        if g is not None:
            comps.append(
                Comparison(
                    f"hopper avg FCT below flowbender, load {load:.0%}", g, PAPER_AVG_GAIN_PCT, "%"
                )
            )
        g = _gain_pct(rows, load, "p99_fct_us", "flowbender", "hopper")
        if g is not None:
            comps.append(
                Comparison(
                    f"hopper p99 FCT below flowbender, load {load:.0%}", g, PAPER_P99_GAIN_PCT, "%"
                )
            )
    notes = []
    for load in loads:
        by = {r["policy"]: r for r in rows if r["load"] == load}
        if {"hopper", "ecmp"} <= set(by):
            comps.append(
                Comparison(
                    f"hopper avg FCT below ecmp, load {load:.0%}",
                    _gain_pct(rows, load, "avg_fct_us", "ecmp", "hopper"),
                    None,
                    "%",
                )
            )
        if {"hopper", "nimble-online"} <= set(by):
            ratio = by["hopper"]["avg_fct_us"] / by["nimble-online"]["avg_fct_us"]
            comps.append(
                Comparison(f"hopper / nimble-online avg FCT, load {load:.0%}", ratio, None, "x")
            )
    notes.append(
        "paper: ns-3, 128 servers, DCQCN, ML-training traces, up to 20 % (avg) / 14 % (p99) "
        "below FlowBender; ours: fluid model, web-search sizes, one spine at 10 % capacity"
    )
    notes.append(
        "FlowBender's signal here is RTT above 1.5x base (stand-in for its ECN fraction); "
        "nimble-online re-plans with mwu from link telemetry (a global view Hopper lacks)"
    )
    return comps, notes


def plot(rows: list[dict], path: Path) -> Path:
    """Average and p99 FCT per load, one bar per policy (log scale)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    from pathweave.bench.paper import save_figure

    loads = sorted({r["load"] for r in rows})
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    by = {(r["load"], r["policy"]): r for r in rows}
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    axes = fig.subplots(1, 2)
    xs = np.arange(len(loads))
    width = 0.8 / len(policies)
    for ax, key, label in zip(
        axes, ("avg_fct_us", "p99_fct_us"), ("average FCT", "p99 FCT"), strict=True
    ):
        for i, policy in enumerate(policies):
            vals = [by[(ld, policy)][key] / 1e3 for ld in loads]
            ax.bar(
                xs + (i - (len(policies) - 1) / 2) * width,
                vals,
                width,
                color=COLOURS.get(policy, "#7f7f7f"),
                label=policy,
            )
        ax.set_xticks(xs, [f"{ld:.0%}" for ld in loads])
        ax.set_xlabel("offered load per NIC")
        ax.set_ylabel(f"{label} (ms)")
        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.set_title(label, fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=8)
    fig.suptitle(TITLE, fontsize=10)
    return save_figure(fig, path)


__all__ = ["NAME", "QUICK", "TITLE", "fabric", "measure", "plot", "summarize"]
