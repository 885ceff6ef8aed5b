"""``pathweave simulate``: plan one workload with several policies and simulate every plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pathweave import plan as pwplan
from pathweave import sim, traffic, viz
from pathweave.bench.sim import warm_up
from pathweave.cli._common import (
    BytesPerRank,
    FabricSpec,
    FabricWorkloadArgs,
    JsonOut,
    Steps,
    add_columns,
    fabric_and_workload,
    fmt_time,
    groups_option,
    handles_user_errors,
    human_console,
    load_fabric,
    ordered_policies,
    out_image,
    parse_bytes,
    parse_policies,
    policy_option,
    workload_header,
    workload_option,
    write_json,
    wrote,
)
from pathweave.plan import DEFAULT_POLICY, Plan, baselines

#: Every baseline (the model-only ones too: simulation is where they compare), mwu, the default.
DEFAULT_POLICIES = ",".join([*baselines(), "mwu", DEFAULT_POLICY])


def simulation_table(
    plans: Sequence[tuple[str, Plan]], results: Mapping[str, sim.SimResult]
) -> Table:
    """One row per policy: congestion bound, simulated makespan, p99 pair finish, speedup."""
    base = results.get("static")
    table = add_columns(
        Table(), ("policy", "congestion", "makespan", "/ congestion", "p99 pair", "vs static"),
        left={"policy"},
    )
    for name, plan in plans:
        res = results[name]
        table.add_row(
            name, fmt_time(plan.congestion_s), fmt_time(res.makespan_s),
            f"{res.makespan_s / plan.congestion_s:.3f}" if plan.congestion_s else "n/a",
            fmt_time(res.p99_s),
            f"{base.makespan_s / res.makespan_s:.2f}x" if base is not None else "n/a",
        )
    return table


@handles_user_errors
def simulate_cmd(
    args: FabricWorkloadArgs = None,
    fabric: FabricSpec = None,
    workload: Annotated[
        str | None, workload_option("Workload spec: hotspot:0.8, moe:..., uniform, ...")
    ] = None,
    policy: Annotated[
        str, policy_option("Policies to simulate, comma-separated, or 'all'.")
    ] = DEFAULT_POLICIES,
    bytes_per_rank: BytesPerRank = "256M",
    json_out: JsonOut = None,
    png: Annotated[
        Path | None, typer.Option("--png", metavar="FILE", callback=out_image,
                                  help="Link-utilisation heatmap (links x time per policy; "
                                  "- for a PNG on stdout).")
    ] = None,
    groups: Annotated[
        str | None, groups_option("(layout=block|strided, stagger: seconds between group "
                                  "starts): simulate per-group and joint plans side by side.")
    ] = None,
) -> None:
    """Simulate each policy's plan: makespan, p99 pair finish, link utilisation."""
    fabric, workload = fabric_and_workload("simulate", fabric, workload, args)
    names = ordered_policies(parse_policies(policy))
    size = parse_bytes(bytes_per_rank)
    fab = load_fabric(fabric, dense_paths=groups is None)
    if groups is not None:
        from pathweave.cli._groups import run_groups

        warm_up()  # the simulator's kernels too
        return run_groups(human_console(json_out, png), fab, workload, groups, names, size,
                          simulate=True, json_out=json_out)
    demand = traffic.parse_workload(
        workload, fab.num_ranks, bytes_per_rank=size, gpus_per_node=fab.gpus_per_node
    )
    out = human_console(json_out, png)
    with Steps("simulating", 2 * len(names) + 1) as steps:
        steps.update("loading the simulator's kernels")
        warm_up()  # numba compiles (or loads) here, not inside the first policy's sim_s
        plans, results = [], {}
        for name in names:
            steps.update(f"planning {name}")
            plans.append((name, pwplan.make(fab, demand, policy=name)))
            # the fragment count says why a dense 512-GPU case takes a minute
            steps.update(f"simulating {name} ({plans[-1][1].flow_path.size:,} fragments)")
            results[name] = sim.simulate(fab, plans[-1][1])
    out.print(workload_header(fab, workload, demand) + ", simulated with the default SimModel")
    out.print(simulation_table(plans, results))
    if json_out is not None:
        head = {"fabric": fab.name, "ranks": fab.num_ranks, "workload": workload,
                "bytes_per_rank": size}
        wrote(out, write_json(json_out, [
            {**head, "policy": name, **results[name].summary(), "congestion_s": p.congestion_s}
            for name, p in plans
        ]))
    if png is not None:
        wrote(out, viz.plot_link_utilisation(
            results, fab, png, title=f"link utilisation, {fab.name}, {workload}"
        ))
