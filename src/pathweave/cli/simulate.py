"""``pathweave simulate``: plan one workload with several policies and simulate every plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pathweave import plan as pwplan
from pathweave import sim, traffic, viz
from pathweave.cli._common import (
    console,
    fmt_bytes,
    fmt_ms,
    handles_user_errors,
    load_fabric,
    ordered_policies,
    out_file,
    out_image,
    parse_bytes,
    parse_policies,
    write_json,
)
from pathweave.plan import Plan

DEFAULT_POLICIES = "static,multirail,hscore,mwu,mintime"


def simulation_table(
    plans: Sequence[tuple[str, Plan]], results: Mapping[str, sim.SimResult]
) -> Table:
    """One row per policy: congestion bound, simulated makespan, p99 pair finish, speedup."""
    base = results.get("static")
    table = Table()
    table.add_column("policy")
    table.add_column("congestion (ms)", justify="right")
    table.add_column("makespan (ms)", justify="right")
    table.add_column("/ congestion", justify="right")
    table.add_column("p99 pair (ms)", justify="right")
    table.add_column("vs static", justify="right")
    for name, plan in plans:
        res = results[name]
        table.add_row(
            name, fmt_ms(plan.congestion_s), fmt_ms(res.makespan_s),
            f"{res.makespan_s / plan.congestion_s:.3f}" if plan.congestion_s else "n/a",
            fmt_ms(res.p99_s),
            f"{base.makespan_s / res.makespan_s:.2f}x" if base is not None else "n/a",
        )
    return table


@handles_user_errors
def simulate_cmd(
    fabric: Annotated[
        str, typer.Option("--fabric", "-f", metavar="PRESET|FILE", help="Preset spec or file.",
                          show_default=False)
    ],
    workload: Annotated[
        str, typer.Option("--workload", "-w", metavar="SPEC",
                          help="Workload spec: hotspot:0.8, moe:..., uniform, ...",
                          show_default=False)
    ],
    policy: Annotated[
        str, typer.Option("--policy", "-p", metavar="P[,P...]",
                          help="Policies to simulate, comma-separated, or 'all'.")
    ] = DEFAULT_POLICIES,
    bytes_per_rank: Annotated[
        str, typer.Option("--bytes", "-b", metavar="SIZE", help="Payload per rank.")
    ] = "256M",
    json_out: Annotated[
        Path | None, typer.Option("--json", metavar="FILE", callback=out_file,
                                  help="Write the records as JSON.")
    ] = None,
    png: Annotated[
        Path | None, typer.Option("--png", metavar="FILE", callback=out_image,
                                  help="Link-utilisation heatmap (links x time per policy).")
    ] = None,
) -> None:
    """Simulate each policy's plan: makespan, p99 pair finish, link utilisation."""
    names = ordered_policies(parse_policies(policy))
    size = parse_bytes(bytes_per_rank)
    fab = load_fabric(fabric)
    demand = traffic.parse_workload(
        workload, fab.num_ranks, bytes_per_rank=size, gpus_per_node=fab.gpus_per_node
    )
    out = console()
    plans = [(name, pwplan.make(fab, demand, policy=name)) for name in names]
    results = {name: sim.simulate(fab, p) for name, p in plans}
    out.print(
        f"[bold]{fab.name}[/] ({fab.num_ranks} GPUs), workload [bold]{workload}[/], "
        f"{fmt_bytes(size)} per rank, simulated with the default SimModel"
    )
    out.print(simulation_table(plans, results))
    if json_out is not None:
        written = write_json(json_out, [
            {**results[name].summary(), "policy": name, "congestion_s": p.congestion_s}
            for name, p in plans
        ])
        out.print(f"wrote {written}")
    if png is not None:
        written = viz.plot_link_utilisation(
            results, fab, png, title=f"link utilisation, {fab.name}, {workload}"
        )
        out.print(f"wrote {written}")
