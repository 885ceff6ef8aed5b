"""NIMBLE Fig. 8: one MoE block (dispatch, expert FFN, combine) on two 4-GPU nodes.

Setup
-----
Fabric ``h100-2x4``; 8 experts, one per GPU (expert parallelism);
:data:`TOKENS` global tokens (2K to 64K, spread evenly over the ranks),
hidden size 4096 in bf16 (8 KiB per token copy). The paper does not give
its top-k; we use ``top_k = 2``. A token picks the hot expert 0 with
probability ``hotspot`` (0.4 to 0.9) and fills its other slot uniformly from
the remaining experts (:func:`pathweave.traffic.moe` with ``hot_ratio``).

Phases
------
dispatch
    The token copies that leave their owner's GPU: the demand from
    :func:`pathweave.traffic.moe`, planned by each policy and simulated by
    :func:`pathweave.sim.simulate`.
compute
    The expert FFN, two GEMMs with 4x expansion: ``16 * hidden**2`` FLOPs per
    token copy, at :data:`ACHIEVED_FRACTION` of the H100 SXM dense bf16 peak
    (:data:`H100_BF16_DENSE_FLOPS`, 989 TFLOP/s). The step waits for the
    busiest expert, so compute time is the largest per-GPU copy count times
    the per-copy time. The generator drops copies that stay on their owner's
    GPU; a GPU's own copies are counted as the mean of what each other GPU
    sends it (tokens are routed independently of their owner). Compute is
    the same for every policy, as in the paper.
combine
    The transpose of dispatch (every copy returns to its owner), planned and
    simulated the same way.

The paper compares NCCL and NIMBLE: here ``static`` and ``mwu``, beside the
other baselines (the registry's: ``multirail`` for MPI/UCX, ``deepep`` for
DeepEP's normal kernels, ``hscore``) and the default policy ``mintime``,
whose dispatch + combine time is checked against each baseline's and the
time yardstick's (PASS/MISS lines). It reports
average speedups of about 1.13x at hotspot 0.4 and 1.26x at 0.9, peaking at
1.35x with 16K tokens at hotspot 0.9.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

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

NAME = "fig8"
TITLE = "Fig. 8: MoE block on h100-2x4, dispatch / compute / combine per token"

FABRIC = "h100-2x4"
TOKENS = (2048, 4096, 8192, 16384, 32768, 65536)
QUICK_TOKENS = (2048, 16384)
HOTSPOTS = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
QUICK_HOTSPOTS = (0.4, 0.9)
#: ``measure``'s arguments in a quick run; a full run uses its defaults.
QUICK = {"tokens": QUICK_TOKENS, "hotspots": QUICK_HOTSPOTS}
POLICIES = (*pwplan.baselines(), "mwu", pwplan.DEFAULT_POLICY)

HIDDEN = 4096
BYTES_PER_ELEM = 2  # bf16
NUM_EXPERTS = 8
TOP_K = 2  # not stated in the paper; the common choice (Mixtral, GShard)
HOT_EXPERT = 0
FFN_EXPANSION = 4
SEED = 0

#: H100 SXM5 dense bf16 tensor-core peak, FLOP/s (NVIDIA datasheet: 1979 with sparsity).
H100_BF16_DENSE_FLOPS = 989e12
#: Fraction of that peak the expert GEMMs achieve (large bf16 GEMMs reach 60-75 %).
ACHIEVED_FRACTION = 0.6

#: Paper's numbers: mean speedup per hotspot, and the 1.35x peak (16K tokens, 0.9).
PAPER_MEAN_SPEEDUP = {0.4: 1.13, 0.9: 1.26}
PAPER_PEAK = (16384, 0.9, 1.35)


def ffn_flops_per_copy(hidden: int = HIDDEN, expansion: int = FFN_EXPANSION) -> float:
    """FLOPs of one token copy through the two-layer FFN (two GEMMs, 2 FLOPs per MAC).

    Examples
    --------
    >>> ffn_flops_per_copy(4096) == 2 * 2 * 4096 * 4 * 4096
    True
    """
    return 2.0 * 2.0 * hidden * expansion * hidden


def expert_copies(dispatch_bytes: np.ndarray, copy_bytes: float) -> np.ndarray:
    """Token copies each GPU's expert processes: received ones plus an estimate of its own.

    The dispatch matrix lacks the copies that stay on their owner's GPU; they
    are estimated as the mean of what each other GPU sends (``N / (N - 1)``
    times the received copies).

    Examples
    --------
    >>> D = np.array([[0, 3, 0], [4, 0, 0], [2, 1, 0]]) * 10.0
    >>> expert_copies(D, 10.0).tolist()   # column sums 6, 4, 0 copies, times 3/2
    [9.0, 6.0, 0.0]
    """
    n = dispatch_bytes.shape[0]
    received = dispatch_bytes.sum(axis=0) / copy_bytes
    return received * n / (n - 1)


def compute_s(dispatch_bytes: np.ndarray, *, hidden: int = HIDDEN,
              bytes_per_elem: int = BYTES_PER_ELEM) -> float:
    """FFN time of the busiest expert, in seconds."""
    copies = expert_copies(dispatch_bytes, hidden * bytes_per_elem)
    rate = H100_BF16_DENSE_FLOPS * ACHIEVED_FRACTION
    return float(copies.max()) * ffn_flops_per_copy(hidden) / rate


def measure(
    tokens: tuple[int, ...] = TOKENS,
    hotspots: tuple[float, ...] = HOTSPOTS,
    *,
    policies: tuple[str, ...] = POLICIES,
    progress: Progress = no_progress,
) -> list[dict]:
    """One row per (hotspot, tokens, policy): the three phases and the speedup over static."""
    fab = pwfabric.preset(FABRIC)
    n = fab.num_ranks
    rows: list[dict] = []
    total = len(tokens) * len(hotspots) * len(policies)
    done = 0
    for hot in hotspots:
        for count in tokens:
            dispatch = traffic.moe(
                n, tokens=count, hidden=HIDDEN, bytes_per_elem=BYTES_PER_ELEM,
                num_experts=NUM_EXPERTS, top_k=TOP_K, hot_ratio=hot, hot_expert=HOT_EXPERT,
                seed=SEED,
            )
            ffn_s = compute_s(dispatch)
            phases: dict[str, dict] = {}
            for policy in policies:
                progress(done, total, f"{NAME}: hotspot {hot:.1f}, {count} tokens, {policy}")
                done += 1
                plan_d = pwplan.make(fab, dispatch, policy)
                plan_c = pwplan.make(fab, np.ascontiguousarray(dispatch.T), policy)
                phases[policy] = {
                    "comm_predicted_s": pwplan.predict_time(plan_d) + pwplan.predict_time(plan_c),
                    "dispatch_s": sim.simulate(fab, plan_d).makespan_s,
                    "combine_s": sim.simulate(fab, plan_c).makespan_s,
                    "dispatch_congestion_s": plan_d.congestion_s,
                    "combine_congestion_s": plan_c.congestion_s,
                }
            yard_s = sum(float(time_optimum(fab, d).info["predicted_s"])
                         for d in (dispatch, np.ascontiguousarray(dispatch.T)))
            base = phases.get("static")
            for policy, ph in phases.items():
                step_s = ph["dispatch_s"] + ffn_s + ph["combine_s"]
                static_step = (base["dispatch_s"] + ffn_s + base["combine_s"]) if base else np.nan
                rows.append(
                    {
                        "hotspot": hot,
                        "tokens": count,
                        "policy": policy,
                        "dispatch_s": ph["dispatch_s"],
                        "compute_s": ffn_s,
                        "combine_s": ph["combine_s"],
                        "step_s": step_s,
                        "step_per_token_us": step_s / count * 1e6,
                        "dispatch_congestion_s": ph["dispatch_congestion_s"],
                        "combine_congestion_s": ph["combine_congestion_s"],
                        "speedup_vs_static": static_step / step_s,
                        "comm_predicted_s": ph["comm_predicted_s"],
                        "comm_time_optimum_s": yard_s,
                    }
                )
    progress(total, total, f"{NAME}: done")
    return rows


def _speedups(rows: list[dict], policy: str = "mwu") -> dict[tuple[float, int], float]:
    return {(r["hotspot"], r["tokens"]): r["speedup_vs_static"] for r in rows
            if r["policy"] == policy}


def summarize(rows: list[dict]) -> tuple[list[Comparison], list[str]]:
    """Mean speedup per hotspot beside the paper's, and the peak."""
    sp = _speedups(rows)
    hotspots = sorted({h for h, _ in sp})
    comps = []
    for hot in hotspots:
        mean = float(np.mean([v for (h, _), v in sp.items() if h == hot]))
        comps.append(Comparison(f"mwu over static, mean over tokens, hotspot {hot:.1f}", mean,
                                PAPER_MEAN_SPEEDUP.get(hot), "x"))
    tok, hot, paper_peak = PAPER_PEAK
    if (hot, tok) in sp:
        comps.append(Comparison(f"mwu over static, {tok} tokens, hotspot {hot:.1f} "
                                "(paper's peak)", sp[(hot, tok)], paper_peak, "x"))
    (best_h, best_t), best = max(sp.items(), key=lambda kv: kv[1])
    comps.append(Comparison(f"mwu over static, our peak ({best_t} tokens, hotspot "
                            f"{best_h:.1f})", best, paper_peak, "x"))
    # The communication alone, where skew is largest: how much of the step it is.
    by = {(r["hotspot"], r["tokens"], r["policy"]): r for r in rows}
    hot, tok = max(hotspots), max(t for _, t in sp)
    st, mw = by.get((hot, tok, "static")), by.get((hot, tok, "mwu"))
    if st is not None and mw is not None:
        comm = st["dispatch_s"] + st["combine_s"]
        comps.append(Comparison(f"mwu over static, dispatch + combine only ({tok} tokens, "
                                f"hotspot {hot:.1f})", comm / (mw["dispatch_s"] + mw["combine_s"]),
                                None, "x"))
        comps.append(Comparison(f"compute share of static's step ({tok} tokens, hotspot "
                                f"{hot:.1f})", st["compute_s"] / st["step_s"] * 100, None, "%"))
    notes = [
        *default_lines(
            rows, FABRIC, 8, case=lambda r: f"hotspot {r['hotspot']:.1f}, {r['tokens']} tokens",
            seconds=lambda r: r["dispatch_s"] + r["combine_s"],
            workload=lambda r: f"moe:hot={r['hotspot']},tokens={r['tokens']}",
            predicted="comm_predicted_s", optimum="comm_time_optimum_s")[0],
        f"compute: {ffn_flops_per_copy() / 1e6:.0f} MFLOP per token copy at "
        f"{ACHIEVED_FRACTION:.0%} of {H100_BF16_DENSE_FLOPS / 1e12:.0f} TFLOP/s (H100 dense "
        f"bf16), busiest expert; top_k = {TOP_K} (the paper does not say)",
    ]
    return comps, notes


_PHASE_COLOURS = {  # the paper's colours: NCCL blues, NIMBLE orange/red, compute green
    ("static", "dispatch_s"): "#4f81bd", ("static", "combine_s"): "#9dc3e6",
    ("mwu", "dispatch_s"): "#f28e2b", ("mwu", "combine_s"): "#c0504d",
    (pwplan.DEFAULT_POLICY, "dispatch_s"): "#8064a2",
    (pwplan.DEFAULT_POLICY, "combine_s"): "#b3a2c7",
}


def plot(rows: list[dict], path: Path) -> Path:
    """Per-token latency stacked by phase, one panel per hotspot, speedup line on top."""
    from matplotlib.figure import Figure

    from pathweave.bench.paper import save_figure

    hotspots = sorted({r["hotspot"] for r in rows})
    tokens = sorted({r["tokens"] for r in rows})
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    cols = min(3, len(hotspots))
    nrows = -(-len(hotspots) // cols)
    fig = Figure(figsize=(4.6 * cols, 3.6 * nrows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, cols)).ravel()
    width = 0.8 / len(policies)
    xs = np.arange(len(tokens))
    by = {(r["hotspot"], r["tokens"], r["policy"]): r for r in rows}
    # One speedup scale for every panel, so the panels compare at a glance.
    speedups = [r["speedup_vs_static"] for r in rows if r["policy"] == "mwu"] or [1.0]
    span = (min(1.0, min(speedups)) - 0.01, max(speedups) + 0.02)
    for ax, hot in zip(axes, hotspots, strict=False):
        for i, policy in enumerate(policies):
            x = xs + (i - (len(policies) - 1) / 2) * width
            bottom = np.zeros(len(tokens))
            for phase in ("dispatch_s", "compute_s", "combine_s"):
                vals = np.array([by[(hot, t, policy)][phase] / t * 1e6 for t in tokens])
                colour = "#2e8b57" if phase == "compute_s" else _PHASE_COLOURS.get(
                    (policy, phase), "#7f7f7f")
                if phase == "compute_s":  # the same for every policy: one legend entry
                    label = "compute (same for all)" if i == 0 else None
                else:
                    label = f"{PAPER_NAMES.get(policy, policy)} {phase[:-2]}"
                ax.bar(x, vals, width, bottom=bottom, color=colour, edgecolor="white", lw=0.3,
                       label=label)
                bottom += vals
        ax.set_xticks(xs, [f"{t // 1024}K" for t in tokens])
        ax.set_xlabel("global tokens")
        ax.set_ylabel("latency per token (us)")
        ax.set_title(f"hotspot {hot:.1f}", fontsize=10)
        if "mwu" in policies and "static" in policies:
            twin = ax.twinx()
            twin.plot(xs, [by[(hot, t, "mwu")]["speedup_vs_static"] for t in tokens], "o-",
                      color="#7030a0", ms=4, label="speedup")
            twin.set_ylabel("mwu speedup over static", color="#7030a0")
            twin.set_ylim(*span)
            twin.yaxis.set_major_formatter("{x:.2f}x")
    for ax in axes[len(hotspots):]:
        ax.set_axis_off()
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=8)
    fig.suptitle(TITLE, fontsize=11)
    return save_figure(fig, path)


__all__ = [
    "ACHIEVED_FRACTION",
    "H100_BF16_DENSE_FLOPS",
    "NAME",
    "QUICK",
    "TITLE",
    "compute_s",
    "expert_copies",
    "ffn_flops_per_copy",
    "measure",
    "plot",
    "summarize",
]
