"""Concurrent-groups benchmark (``pathweave bench planner --scale``).

Two parts, both planning every group per group (each alone on its subset
fabric, as its runtime does) and jointly (the union demand at once), with
:mod:`pathweave.plan.groups`, and simulating the fabric-wide plan:

Scale
    ``dgx-h100:nodes=N/8,spines=4`` at 512 to 8192 GPUs, groups of
    64 in blocks (whole nodes, as a scheduler hands them out), each group
    one skewed MoE dispatch (:data:`SCALE_WORKLOAD`: 2048 tokens per rank,
    hidden 4096 in bf16, 64 experts, top-2, 90 % of tokens pick expert 0).
    Each (size, mode) runs in a fresh process so that its peak resident
    memory (``ru_maxrss``) is its own; the time (wall and CPU) and peak
    memory of candidate paths, plan and simulate, and the path set's size
    are recorded. :func:`scale_checks`: the 8192-GPU targets, and 16384
    GPUs by :func:`memory_model` (fitted to the measured sizes).
Joint against per group
    Fabrics where groups share links, because GPUs share NICs (two GPUs per
    NIC, as on 4-NIC 8-GPU servers): one group holds the even GPUs of every
    node (all the node's NICs), one small group per odd GPU index (its
    NIC only), each a skewed MoE dispatch with its own seed; plus the scale
    fabric's block layout, where groups share only spine uplinks.
    :func:`joint_checks`: joint planning's simulated makespan is never
    above per-group planning's (0.1 % tie) and below it wherever the
    per-group plan's bottleneck link carries bytes of two or more groups.

Examples
--------
>>> from pathweave.bench import groups
>>> groups.shared_nic_placement(4, 4)
[(0, 2, 4, 6, 8, 10, 12, 14), (1, 5, 9, 13), (3, 7, 11, 15)]
"""

from __future__ import annotations

import multiprocessing
import resource
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pathweave import fabric as pwfabric
from pathweave import sim
from pathweave.bench._report import Check, Progress
from pathweave.plan import DEFAULT_POLICY
from pathweave.plan.groups import MODES, group_paths, plan_groups, shared_links
from pathweave.traffic.groups import GroupWorkload, groups
from pathweave.traffic.groups import placement as placement_of

__all__ = ["JOINT_CASES", "SCALE_RANKS", "SCALE_WORKLOAD", "joint_checks", "memory_model",
           "run_joint", "run_scale", "scale_case", "scale_checks", "scale_fabric",
           "shared_nic_placement"]

SCALE_RANKS = (512, 1024, 2048, 4096, 8192)
#: The issue's targets: at TARGET_RANKS GPUs, candidate paths + plan +
#: simulate within TARGET_S seconds and TARGET_RSS_BYTES of peak memory;
#: at MODEL_RANKS, the memory model's peak within MODEL_RSS_BYTES.
TARGET_RANKS, TARGET_S, TARGET_RSS_BYTES = 8192, 60.0, 8e9
MODEL_RANKS, MODEL_RSS_BYTES = 16384, 24e9
GROUP_SIZE = 64
SCALE_WORKLOAD = "moe:tokens=131072,hidden=4096,experts=64,topk=2,hot=0.9"
#: (fabric, placement, workload, hot expert of each group or None): placement
#: "shared-nic" (:func:`shared_nic_placement`) or a layout name. Groups 0 and
#: 1 share node 0's first NIC and are hot there; the others are hot on their
#: last rank (node 15), so only group 0 can move bytes off the shared NIC.
JOINT_CASES = (
    ("cluster:nodes=16,gpus_per_node=4,node_kind=nvlink-mesh,rails=2", "shared-nic",
     "moe:tokens=32768,hidden=4096,topk=2,hot=0.9,hot_expert={hot}", (0, 0, 15)),
    ("cluster:nodes=16,gpus_per_node=8,node_kind=nvswitch,rails=4", "shared-nic",
     "moe:tokens=65536,hidden=4096,topk=2,hot=0.9,hot_expert={hot}", (0, 0, 15, 15, 15)),
    ("dgx-h100:nodes=32,spines=4", "block", SCALE_WORKLOAD, None),
)
JOINT_POLICIES = (DEFAULT_POLICY, "mwu")


def shared_nic_placement(nodes: int, gpus_per_node: int) -> list[tuple[int, ...]]:
    """One group on the even GPUs of every node, one per odd GPU index.

    With two GPUs per NIC, GPU ``2j + 1`` shares GPU ``2j``'s NIC: the big
    group reaches every NIC, each small group only its own.
    """
    ranks = np.arange(nodes * gpus_per_node).reshape(nodes, gpus_per_node)
    out = [tuple(ranks[:, 0::2].reshape(-1).tolist())]
    out += [tuple(ranks[:, j].tolist()) for j in range(1, gpus_per_node, 2)]
    return out


def _workload(fab: pwfabric.Fabric, placement: str, spec: str,
              hot: Sequence[int] | None) -> GroupWorkload:
    if placement == "shared-nic":
        ranks = shared_nic_placement(fab.num_nodes, fab.gpus_per_node)
    else:
        ranks = placement_of(fab.num_ranks, fab.num_ranks // GROUP_SIZE, GROUP_SIZE, placement)
    specs = [spec] * len(ranks) if hot is None else [spec.format(hot=h) for h in hot]
    return groups(fab.num_ranks, specs, ranks=ranks)


def scale_fabric(ranks: int) -> pwfabric.Fabric:
    """``dgx-h100:nodes=ranks/8,spines=4``, built for group subsets' paths only.

    Its *dense* candidate paths would not fit (``dense_paths=False``,
    :func:`pathweave.fabric.preset`); groups compile only their own subsets'
    paths (:func:`~pathweave.plan.groups.group_paths`), which the scale case
    measures.
    """
    return pwfabric.preset(f"dgx-h100:nodes={ranks // 8},spines=4", dense_paths=False)


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def scale_case(ranks: int, mode: str, policy: str | None = None) -> dict[str, Any]:
    """Plan and simulate the scale case of ``ranks`` GPUs in ``mode``; in this process.

    Each stage (candidate paths, plan, simulate) is timed in wall-clock and
    in this process's CPU time (the figure that transfers from a loaded
    machine: the kernels run on one thread), with the peak resident memory
    so far after it (``ru_maxrss`` only grows: each stage's figure is the
    peak up to its end).
    """
    fab = scale_fabric(ranks)
    wl = groups(fab.num_ranks, SCALE_WORKLOAD, ranks // GROUP_SIZE, GROUP_SIZE, "block")
    row: dict[str, Any] = {"ranks": ranks, "groups": len(wl.groups), "mode": mode,
                           "rss_before_bytes": _peak_rss_bytes()}
    t0, c0 = time.perf_counter(), time.process_time()
    gp = group_paths(fab, wl.ranks)
    t1, c1 = time.perf_counter(), time.process_time()
    row |= {"paths_s": t1 - t0, "paths_cpu_s": c1 - c0, "rss_paths_bytes": _peak_rss_bytes()}
    plan = plan_groups(fab, wl, policy, mode=mode)  # type: ignore[arg-type]
    t2, c2 = time.perf_counter(), time.process_time()
    row |= {"plan_s": plan.plan_s, "plan_wall_s": t2 - t1, "plan_cpu_s": c2 - c1,
            "rss_plan_bytes": _peak_rss_bytes()}
    res = sim.simulate(fab, plan)
    t3, c3 = time.perf_counter(), time.process_time()
    row |= {"sim_s": res.sim_s, "sim_wall_s": t3 - t2, "sim_cpu_s": c3 - c2}
    ps = gp.paths
    path_bytes = sum(a.nbytes for a in (ps.links, ps.length, ps.kind, ps.via, ps.src, ps.dst))
    return row | {
        "policy": plan.policy,
        "paths": ps.num_paths, "pairs": int(sum(len(g.ranks) ** 2 for g in wl.groups)),
        "shapes": len({id(s) for s in gp.sub_paths}),
        "path_bytes": path_bytes, "pair_ptr_bytes": ps.pair_ptr.nbytes,
        "total_s": t3 - t0, "total_cpu_s": c3 - c0,
        "congestion_s": plan.congestion_s, "makespan_s": res.makespan_s,
        "fragments": plan.fragments, "events": res.events,
        # What the whole fabric's dense path set would take to compile (the
        # preset's own size check), which group path sets never build.
        "dense_paths_bytes": pwfabric.estimate_path_bytes(ranks // 8, 8, 8, 4, False),
        "peak_rss_bytes": _peak_rss_bytes(),
    }


def _warm_then(ranks: int, mode: str, policy: str | None) -> dict[str, Any]:
    from pathweave.bench.sim import warm_up

    warm_up()  # numba kernels compiled or loaded before the clock starts
    return scale_case(ranks, mode, policy)


def run_scale(ranks: Sequence[int] = SCALE_RANKS, policy: str | None = None,
              on_progress: Progress | None = None) -> list[dict[str, Any]]:
    """:func:`scale_case` for every size and mode, each in a fresh process."""
    ctx = multiprocessing.get_context("spawn")
    out = []
    todo = [(n, m) for n in ranks for m in MODES]
    for i, (n, mode) in enumerate(todo):
        if on_progress:
            on_progress(i, len(todo), f"scale: {n} GPUs, {mode}")
        with ctx.Pool(1) as pool:
            out.append(pool.apply(_warm_then, (n, mode, policy)))
    return out


def run_joint(policies: Sequence[str] = JOINT_POLICIES,
              on_progress: Progress | None = None) -> list[dict[str, Any]]:
    """Every :data:`JOINT_CASES` case and policy, planned both ways and simulated."""
    out = []
    for i, (spec, placement, workload, hot) in enumerate(JOINT_CASES):
        if on_progress:
            on_progress(i, len(JOINT_CASES), f"joint: {spec}")
        fab = pwfabric.resolve(spec)
        wl = _workload(fab, placement, workload, hot)
        lp = plan_groups(fab, wl, "optimal", mode="joint").congestion_s
        for policy in policies:
            row: dict[str, Any] = {"fabric": spec, "placement": placement, "workload": workload,
                                   "groups": len(wl.groups), "ranks": fab.num_ranks,
                                   "policy": policy, "lp_joint_congestion_s": lp}
            for mode in MODES:
                plan = plan_groups(fab, wl, policy, mode=mode)  # type: ignore[arg-type]
                row[f"{mode}_makespan_s"] = sim.simulate(fab, plan).makespan_s
                row[f"{mode}_congestion_s"] = plan.congestion_s
                if mode == "per_group":
                    shared = shared_links(plan, wl)
                    row["shared_links"] = int(shared.sum())
                    # Room for a joint plan: the per-group bottleneck carries
                    # two groups and the union's LP optimum lies below it.
                    row["bottleneck_shared"] = bool(shared[plan.bottleneck_link])
                    row["room"] = row["bottleneck_shared"] and lp < plan.congestion_s * (1 - 1e-3)
            row["ratio"] = row["per_group_makespan_s"] / row["joint_makespan_s"]
            out.append(row)
    return out


def joint_checks(rows: Sequence[Mapping[str, Any]], tie: float = 1e-3) -> list[Check]:
    """PASS/MISS lines: joint never slower; faster where the bottleneck is shared."""
    worst = min(r["ratio"] for r in rows)
    never = Check("joint_never_slower", worst, 1.0, worst >= 1 - tie,
                  f"joint planning never slower than per-group (simulated makespan): worst "
                  f"per-group / joint {worst:.3f} over {len(rows)} cases (>= {1 - tie:.3f})")
    shared = [r for r in rows if r["room"]]
    if not shared:
        return [never, Check("joint_beats_shared", None, 1.0, None,
                             "joint beats per-group where groups share the bottleneck and "
                             "the union LP is below it: no such case")]
    least = min(r["ratio"] for r in shared)
    return [never, Check(
        "joint_beats_shared", least, 1.0, least > 1 + tie,
        f"joint beats per-group where the per-group bottleneck carries 2+ groups and the "
        f"union LP optimum is below it: "
        f"per-group / joint {least:.3f} (least) to {max(r['ratio'] for r in shared):.3f} "
        f"over {len(shared)} cases (> {1 + tie:.3f})")]


def memory_model(rows: Sequence[Mapping[str, Any]], mode: str = "joint"
                 ) -> tuple[float, float, float] | None:
    """``(base, per_rank, per_pair)`` bytes: peak RSS ~ base + per_rank N + per_pair N^2.

    Least squares over the scale rows of ``mode`` (three sizes or more, else
    None). With groups of a fixed size the path set, fragments and flows grow
    with ``N`` (``per_rank``); the whole-fabric tables (pair pointer, union
    demand, the planners' ``N x N`` arrays, ``pair_finish_s``) with ``N^2``:
    ``per_pair / 8`` is about how many ``N x N`` 8-byte arrays are alive at
    the peak.
    """
    pts = sorted({(int(r["ranks"]), float(r["peak_rss_bytes"])) for r in rows
                  if r["mode"] == mode})
    if len({n for n, _ in pts}) < 3:
        return None
    n = np.array([p[0] for p in pts], dtype=np.float64)
    a = np.stack([np.ones_like(n), n, n * n], axis=1)
    coef = np.linalg.lstsq(a, np.array([p[1] for p in pts]), rcond=None)[0]
    return float(coef[0]), float(coef[1]), float(coef[2])


def scale_checks(rows: Sequence[Mapping[str, Any]]) -> list[Check]:
    """PASS/MISS lines of the scale targets (:data:`TARGET_RANKS`, :data:`MODEL_RANKS`).

    The time is wall-clock (paths + plan + simulate), as the target states;
    each line also prints the CPU time, which is what transfers from a
    loaded machine (every kernel runs on one thread).
    """
    out = []
    at = [r for r in rows if r["ranks"] == TARGET_RANKS]
    if not at:
        out.append(Check("scale_time", None, TARGET_S, None,
                         f"{TARGET_RANKS} GPUs: not measured (add it to the sizes)"))
    for r in at:
        wall = r["paths_s"] + r["plan_wall_s"] + r["sim_wall_s"]
        cpu = r["paths_cpu_s"] + r["plan_cpu_s"] + r["sim_cpu_s"]
        out.append(Check(
            f"scale_time_{r['mode']}", wall, TARGET_S, wall <= TARGET_S,
            f"{TARGET_RANKS} GPUs, {r['groups']} groups of {GROUP_SIZE}, {r['mode']}: paths + "
            f"plan + simulate {wall:.1f} s wall ({cpu:.1f} s CPU) (<= {TARGET_S:.0f} s)"))
        rss = r["peak_rss_bytes"]
        out.append(Check(
            f"scale_memory_{r['mode']}", rss, TARGET_RSS_BYTES, rss <= TARGET_RSS_BYTES,
            f"{TARGET_RANKS} GPUs, {r['mode']}: peak memory {rss / 1e9:.2f} GB "
            f"(<= {TARGET_RSS_BYTES / 1e9:.0f} GB)"))
    for mode in MODES:
        fit = memory_model(rows, mode)
        if fit is None:
            continue
        base, per_rank, per_pair = fit
        want = base + per_rank * MODEL_RANKS + per_pair * MODEL_RANKS ** 2
        out.append(Check(
            f"scale_model_{mode}", want, MODEL_RSS_BYTES, want <= MODEL_RSS_BYTES,
            f"{MODEL_RANKS} GPUs, {mode}, by the memory model ({base / 1e6:.0f} MB + "
            f"{per_rank / 1e3:.0f} kB per GPU + {per_pair:.1f} B per GPU pair, fitted "
            f"to the measured sizes): {want / 1e9:.1f} GB (<= {MODEL_RSS_BYTES / 1e9:.0f} GB)"))
    return out
