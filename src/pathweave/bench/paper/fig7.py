"""NIMBLE Fig. 7: skewed all-to-allv on two 4-GPU nodes, hotspot ratio 0 to 0.9.

Setup
-----
Fabric ``h100-2x4`` (the paper's testbed: 2 nodes x 4 H100, NVLink mesh,
one NDR400 NIC per GPU). Every rank sends :data:`BYTES_PER_RANK` (256 MiB);
a non-hot rank sends the fraction ``ratio`` of it to the hot rank 0 and
spreads the rest evenly over the other non-hot ranks
(:func:`pathweave.traffic.hotspot`). Each policy plans the demand and
:func:`pathweave.sim.simulate` gives its makespan:

=============  ==========================================
``static``     NCCL (direct NVLink, PXN across nodes)
``multirail``  OpenMPI + UCX (nearest NIC, GPUDirect into
               the destination across its PCIe tree)
``deepep``     DeepEP normal kernels (RDMA to the
               same-rail GPU, NVLink forward there)
``hscore``     h-score rail routing
``mwu``        NIMBLE (Algorithm 1)
``mintime``    the default policy: least predicted time
``optimal``    LP optimum over the same candidate paths
=============  ==========================================

Each row also holds the plan's predicted time (the time model) and the
ratio's time yardstick (:func:`pathweave.plan.optimal.time_optimum`).

Targets
-------
The default policy's simulated makespan at most every baseline's (the
registry's: ``static``, ``multirail``, ``deepep``, ``hscore``) at every
ratio; at least :data:`UCX_TARGET` times faster than ``multirail`` (UCX) at
every ratio >= 0.7 and :data:`NCCL_TARGET` times faster than ``static``
(NCCL) at 0.9 (the paper: NIMBLE beats MPI, and NCCL by up to 5.2x); its
predicted time within 2 % (median) and 5 % (worst) of the time yardstick
(:func:`pathweave.bench.planner.time_checks`). ``mwu``'s
makespan within 5 % of ``optimal``'s at every ratio, and no slowdown
against ``static`` at ratio 0 (speedup >= 0.97x). The paper reports up
to 5.2x over NCCL at ratio >= 0.7; on our fabric model the congestion
bound itself caps ``static / optimal`` near 3.8x at 0.9 (the hot node's
four rails against PXN's one), and both numbers are printed.
"""

from __future__ import annotations

from pathlib import Path

from pathweave import fabric as pwfabric
from pathweave import plan as pwplan
from pathweave import sim, traffic
from pathweave.bench.paper._common import (
    PAPER_NAMES,
    Comparison,
    Progress,
    default_lines,
    no_progress,
)
from pathweave.plan.optimal import time_optimum

NAME = "fig7"
TITLE = "Fig. 7: skewed all-to-allv on h100-2x4, makespan vs hotspot ratio"

FABRIC = "h100-2x4"
BYTES_PER_RANK = 256 << 20
HOT_RANK = 0
RATIOS = tuple(round(0.1 * i, 1) for i in range(10))
QUICK_RATIOS = (0.0, 0.5, 0.9)
#: ``measure``'s arguments in a quick run; a full run uses its defaults.
QUICK = {"ratios": QUICK_RATIOS}
POLICIES = (*pwplan.baselines(), "mwu", pwplan.DEFAULT_POLICY, "optimal")
#: The default over UCX (``multirail``) at every ratio >= 0.7, and over NCCL
#: (``static``) at 0.9: simulated makespan ratios, at least.
UCX_TARGET = 1.5
NCCL_TARGET = 3.0

PAPER_MAX_SPEEDUP = 5.2  # NIMBLE over NCCL, "up to", at hotspot ratio >= 0.7
MWU_VS_OPTIMAL_TARGET = 1.05
NO_SLOWDOWN_TARGET = 0.97


def measure(
    ratios: tuple[float, ...] = RATIOS,
    *,
    policies: tuple[str, ...] = POLICIES,
    bytes_per_rank: int = BYTES_PER_RANK,
    progress: Progress = no_progress,
) -> list[dict]:
    """One row per (ratio, policy): congestion bound, simulated makespan, speedups.

    ``speedup_vs_static`` is static's makespan over the policy's (needs
    ``static`` in ``policies``), ``vs_optimal`` the policy's makespan over
    optimal's (needs ``optimal``); both are NaN otherwise.

    Examples
    --------
    >>> rows = measure((0.9,), policies=("static", "optimal"))
    >>> round(rows[0]["congestion_s"] / rows[1]["congestion_s"], 2)  # 3.6 / 0.95 payloads
    3.79
    """
    fab = pwfabric.preset(FABRIC)
    rows: list[dict] = []
    total = len(ratios) * len(policies)
    for i, ratio in enumerate(ratios):
        demand = traffic.hotspot(fab.num_ranks, bytes_per_rank, ratio=ratio, hot=HOT_RANK)
        got: dict[str, tuple[float, sim.SimResult, float]] = {}
        for j, policy in enumerate(policies):
            progress(i * len(policies) + j, total, f"{NAME}: ratio {ratio:.1f}, {policy}")
            plan = pwplan.make(fab, demand, policy)
            got[policy] = (plan.congestion_s, sim.simulate(fab, plan), pwplan.predict_time(plan))
        yard_s = float(time_optimum(fab, demand).info["predicted_s"])
        static_s = got["static"][1].makespan_s if "static" in got else float("nan")
        optimal_s = got["optimal"][1].makespan_s if "optimal" in got else float("nan")
        for policy, (congestion_s, result, predicted_s) in got.items():
            rows.append(
                {
                    "hotspot_ratio": ratio,
                    "policy": policy,
                    "bytes_per_rank": bytes_per_rank,
                    "congestion_s": congestion_s,
                    "makespan_s": result.makespan_s,
                    "p99_s": result.p99_s,
                    "speedup_vs_static": static_s / result.makespan_s,
                    "vs_optimal": result.makespan_s / optimal_s,
                    "predicted_s": predicted_s,
                    "time_optimum_s": yard_s,
                }
            )
    progress(total, total, f"{NAME}: done")
    return rows


def _value(rows: list[dict], ratio: float, policy: str, key: str) -> float:
    for r in rows:
        if r["hotspot_ratio"] == ratio and r["policy"] == policy:
            return float(r[key])
    raise KeyError((ratio, policy))


def _bound(rows: list[dict], ratio: float) -> float:
    """The congestion bound's ceiling at ``ratio``: static's congestion over the optimum's."""
    return _value(rows, ratio, "static", "congestion_s") / _value(rows, ratio, "optimal",
                                                                  "congestion_s")


def summarize(rows: list[dict]) -> tuple[list[Comparison], list[str]]:
    """The key numbers beside the paper's, and notes on the targets."""
    ratios = sorted({r["hotspot_ratio"] for r in rows})
    worst = max(_value(rows, x, "mwu", "vs_optimal") for x in ratios)
    worst_at = max(ratios, key=lambda x: _value(rows, x, "mwu", "vs_optimal"))
    at0 = _value(rows, ratios[0], "mwu", "speedup_vs_static")
    high = [x for x in ratios if x >= 0.7] or ratios[-1:]
    best = max(_value(rows, x, "mwu", "speedup_vs_static") for x in high)
    top = ratios[-1]
    bound = _bound(rows, top)
    comps = [
        Comparison(f"NIMBLE (mwu) over NCCL (static), best at ratio >= {high[0]:.1f}", best,
                   PAPER_MAX_SPEEDUP, "x"),
        Comparison(f"congestion bound static / optimal at ratio {top:.1f} (model's ceiling)",
                   bound, PAPER_MAX_SPEEDUP, "x"),
        Comparison(f"OpenMPI/UCX (multirail) over static at ratio {top:.1f}",
                   _value(rows, top, "multirail", "speedup_vs_static"), None, "x"),
        Comparison(f"mwu / optimal makespan, worst (at {worst_at:.1f}; target <= "
                   f"{MWU_VS_OPTIMAL_TARGET:.2f})", worst, None, "x"),
        Comparison(f"mwu over static at ratio {ratios[0]:.1f} (target >= "
                   f"{NO_SLOWDOWN_TARGET:.2f})", at0, None, "x"),
    ]
    notes = [
        f"{'PASS' if worst <= MWU_VS_OPTIMAL_TARGET else 'MISS'}: mwu within "
        f"{(MWU_VS_OPTIMAL_TARGET - 1) * 100:.0f} % of optimal at every ratio "
        f"(worst {worst:.3f}x at {worst_at:.1f})",
        f"{'PASS' if at0 >= NO_SLOWDOWN_TARGET else 'MISS'}: no slowdown vs static at ratio "
        f"{ratios[0]:.1f} ({at0:.3f}x, target >= {NO_SLOWDOWN_TARGET})",
        *_default_notes(rows),
        f"The paper's up-to-{PAPER_MAX_SPEEDUP}x over NCCL exceeds what our fabric model "
        f"allows: even the LP optimum is only {bound:.2f}x faster than static by the "
        f"congestion bound at ratio {top:.1f}; see docs/simulator.md.",
    ]
    return comps, notes


def _default_notes(rows: list[dict]) -> list[str]:
    """The default's time-target and peer lines, and its targets against MPI/UCX and NCCL."""
    default = pwplan.DEFAULT_POLICY
    out, times = default_lines(
        rows, FABRIC, 8, case=lambda r: f"ratio {r['hotspot_ratio']:.1f}",
        seconds=lambda r: r["makespan_s"], workload=lambda r: f"hotspot:{r['hotspot_ratio']}",
        predicted="predicted_s", optimum="time_optimum_s")

    def over(peer: str, case: str) -> float:
        return times[case][peer] / times[case][default]

    high = [c for c in times if float(c.split()[1]) >= 0.7 and "multirail" in times[c]]
    if high and all(default in times[c] for c in high):
        worst = min(high, key=lambda c: over("multirail", c))
        v = over("multirail", worst)
        out.append(f"{'PASS' if v >= UCX_TARGET else 'MISS'}: {default} >= {UCX_TARGET}x faster "
                   f"than multirail (MPI/UCX) at every ratio >= 0.7: least {v:.2f}x at {worst}")
    top = "ratio 0.9"
    if top in times and {"static", default} <= set(times[top]):
        v = over("static", top)
        out.append(f"{'PASS' if v >= NCCL_TARGET else 'MISS'}: {default} >= {NCCL_TARGET}x "
                   f"faster than static (NCCL) at {top}: {v:.2f}x")
    return out


def plot(rows: list[dict], path: Path) -> Path:
    """Makespan per policy and speedup over static, against the hotspot ratio, with the
    congestion bound's ceiling at the highest ratio (when the rows have static and optimal)."""
    from matplotlib.figure import Figure

    from pathweave.bench.paper import save_figure
    from pathweave.viz import policy_colour

    fig = Figure(figsize=(12.0, 4.6), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    for i, policy in enumerate(policies):
        mine = sorted((r for r in rows if r["policy"] == policy),
                      key=lambda r: r["hotspot_ratio"])
        xs = [r["hotspot_ratio"] for r in mine]
        label = policy + (f" ({PAPER_NAMES[policy]})" if policy in PAPER_NAMES else "")
        colour = policy_colour(policy, i)
        ax1.plot(xs, [r["makespan_s"] * 1e3 for r in mine], "o-", color=colour, label=label,
                 ms=4)
        if policy != "static":
            ax2.plot(xs, [r["speedup_vs_static"] for r in mine], "o-", color=colour,
                     label=label, ms=4)
    ax1.set_xlabel("hotspot ratio")
    ax1.set_ylabel("simulated makespan (ms)")
    ax1.set_title("all-to-allv makespan, 256 MiB per rank", fontsize=10)
    ax1.legend(fontsize=8)
    ax2.axhline(1.0, color="black", lw=0.8)
    ax2.hlines(PAPER_MAX_SPEEDUP, 0.7, 0.9, color="#c0504d", ls="--", lw=2,
               label=f"paper: up to {PAPER_MAX_SPEEDUP}x over NCCL")
    if {"static", "optimal"} <= set(policies):
        bound_ratio = _bound(rows, max(r["hotspot_ratio"] for r in rows))
        ax2.axhline(bound_ratio, color="#7f7f7f", ls=":", lw=1,
                    label=f"congestion bound static/optimal ({bound_ratio:.2f}x)")
    ax2.set_xlabel("hotspot ratio")
    ax2.set_ylabel("speedup over static (NCCL)")
    ax2.yaxis.set_major_formatter("{x:g}x")
    ax2.set_title("speedup over static", fontsize=10)
    ax2.set_ylim(0, PAPER_MAX_SPEEDUP * 1.15)
    ax2.legend(fontsize=8, loc="upper left")
    fig.suptitle(TITLE, fontsize=11)
    return save_figure(fig, path)


__all__ = ["NAME", "POLICIES", "QUICK", "RATIOS", "TITLE", "measure", "plot", "summarize"]
