"""``--groups`` of ``pathweave plan``/``simulate``, and ``bench planner --scale``.

``pathweave plan -f dgx-h100:nodes=64,spines=4 -w moe:... --groups 8x64`` plans
every group per group and jointly with each policy
(:mod:`pathweave.plan.groups`); ``simulate`` also runs both fabric-wide plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pathweave import sim
from pathweave.bench.planner import warm_up
from pathweave.cli._common import Steps, add_columns, fmt_bytes, fmt_time, write_json, wrote
from pathweave.fabric import Fabric
from pathweave.plan.groups import MODES, plan_groups, shared_links
from pathweave.plan.registry import policies
from pathweave.traffic.groups import groups, parse_groups


def run_groups(out: Console, fab: Fabric, workload: str, spec: str, names: Sequence[str],
               size: int, *, simulate: bool, json_out: Path | None) -> None:
    """Plan (and simulate) ``workload`` on every group of ``spec`` with each policy.

    Peer models (policies that are not plans a runtime executes, e.g.
    ``multirail``) are left out with a note while another policy remains;
    named alone they raise :func:`~pathweave.plan.groups.plan_groups`'s error.
    """
    runnable = set(policies(executable_only=True))
    left = [n for n in names if n not in runnable]
    if left and len(left) < len(names):
        names = [n for n in names if n in runnable]
        out.print(f"[dim]note: left out {', '.join(left)}: a peer's own routing, not a plan "
                  "a group's runtime runs[/]")
    gs = parse_groups(spec)
    wl = groups(fab.num_ranks, workload, gs.count, gs.size, gs.layout,
                start_s=gs.stagger_s, bytes_per_rank=size)
    records: list[dict[str, Any]] = []
    with Steps("planning groups", len(names) * len(MODES) + 1) as steps:
        steps.update("loading the planners' kernels")
        warm_up()  # numba compiles (or loads) here, not inside the first plan_s
        for name in names:
            row: dict[str, Any] = {"fabric": fab.name, "workload": workload, "groups": spec,
                                   "policy": name}
            for mode in MODES:
                steps.update(f"{name}, {mode}")
                plan = plan_groups(fab, wl, name, mode=mode)  # type: ignore[arg-type]
                row[f"{mode}_congestion_s"] = plan.congestion_s
                row[f"{mode}_plan_s"] = plan.plan_s
                if simulate:
                    res = sim.simulate(fab, plan, start_s=wl.start_s)
                    row[f"{mode}_makespan_s"] = res.makespan_s
                if mode == "per_group":
                    row["shared_links"] = int(shared_links(plan, wl).sum())
            records.append(row)
    total = float(sum(g.demand.sum() for g in wl.groups))
    out.print(f"[bold]{fab.name}[/] ({fab.num_ranks} GPUs), {gs.count} groups of {gs.size} "
              f"({gs.layout}), each [bold]{workload}[/], {fmt_bytes(total)} in all"
              + (f", group g starts at g x {fmt_time(gs.stagger_s)}" if gs.stagger_s else ""))
    out.print(_table(records, simulate))
    out.print("per group: each group planned alone on its ranks (as its runtime does); "
              "joint: the groups' union planned at once; shared = links with 2+ groups' "
              "bytes in the per-group plan")
    if json_out is not None:
        wrote(out, write_json(json_out, records))


def _table(records: Sequence[dict[str, Any]], simulate: bool) -> Table:
    what = "makespan" if simulate else "congestion"
    table = add_columns(Table(), ("policy", f"{what} per group", f"{what} joint",
                                  "per group / joint", "plan per group", "plan joint",
                                  "shared links"), left={"policy"})
    for r in records:
        pg, jt = r[f"per_group_{what}_s"], r[f"joint_{what}_s"]
        table.add_row(r["policy"], fmt_time(pg), fmt_time(jt), f"{pg / jt:.3f}" if jt else "n/a",
                      fmt_time(r["per_group_plan_s"]), fmt_time(r["joint_plan_s"]),
                      str(r["shared_links"]))
    return table


def scale_tables(scale: Sequence[dict[str, Any]], joint: Sequence[dict[str, Any]]
                 ) -> tuple[Table, Table]:
    """The ``bench planner --scale`` tables: scaling, and joint against per group."""
    a = Table(title="concurrent groups at scale: dgx-h100 + 4 spines, 64-GPU groups in blocks, "
              "skewed MoE (fresh process per row)")
    # Wall time of each stage (what the targets state) and, beside it, CPU time:
    # the stable figure on a shared machine (every kernel runs on one thread).
    add_columns(a, ("GPUs", "groups", "mode", "paths", "path set", "dense (est.)", "paths built",
                    "plan", "simulate", "CPU (all)", "events", "peak RSS", "makespan"))
    for r in scale:
        cpu = r["paths_cpu_s"] + r["plan_cpu_s"] + r["sim_cpu_s"]
        a.add_row(str(r["ranks"]), str(r["groups"]), r["mode"], f"{r['paths']:,}",
                  fmt_bytes(r["path_bytes"] + r["pair_ptr_bytes"]),
                  fmt_bytes(r["dense_paths_bytes"]), fmt_time(r["paths_s"]),
                  fmt_time(r["plan_wall_s"]), fmt_time(r["sim_wall_s"]), fmt_time(cpu),
                  str(r["events"]), fmt_bytes(r["peak_rss_bytes"]), fmt_time(r["makespan_s"]))
    b = Table(title="joint against per-group planning (simulated makespan)")
    add_columns(b, ("fabric", "placement", "groups", "policy", "per group", "joint", "ratio",
                    "shared links", "union LP"), left={"fabric", "placement"})
    for r in joint:
        b.add_row(r["fabric"], r["placement"], str(r["groups"]), r["policy"],
                  fmt_time(r["per_group_makespan_s"]), fmt_time(r["joint_makespan_s"]),
                  f"{r['ratio']:.3f}", str(r["shared_links"]),
                  fmt_time(r["lp_joint_congestion_s"]))
    return a, b
