"""The ``pathweave`` typer application: ``topo``, ``plan``, ``simulate``, ``emulate``, ``bench``,
``demo``, ``policies``.

Commands parse their arguments, call the library and render with rich.
Errors pathweave raises on purpose become one red line on stderr and exit
code 2 (``topo validate`` reports an invalid fabric with exit code 1);
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

import pathweave
from pathweave import fabric as pwfabric
from pathweave import plan as pwplan
from pathweave import traffic, viz
from pathweave.cli._common import (
    BENCHES,
    EXIT_BAD_INPUT,
    BytesPerRank,
    FabricSpec,
    FabricWorkloadArgs,
    JsonOut,
    OneLineErrors,
    Steps,
    announce_compiles,
    console,
    fabric_and_workload,
    fail,
    fmt_bytes,
    fmt_time,
    groups_option,
    handles_user_errors,
    human_console,
    load_fabric,
    out_dir_option,
    out_image,
    parse_bytes,
    parse_policies,
    policy_option,
    rule,
    time_limit_option,
    workload_header,
    workload_option,
    write_json,
    wrote,
)
from pathweave.cli._compare import compare
from pathweave.cli.calibrate import calibrate_cmd
from pathweave.cli.emulate import emulate_app
from pathweave.cli.perf import PERF_SETTINGS, perf_cmd
from pathweave.cli.simulate import simulate_cmd
from pathweave.errors import PathweaveError

app = typer.Typer(
    name="pathweave",
    help="Skew-aware multi-path planning for GPU communication.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    cls=OneLineErrors,
)
topo_app = typer.Typer(help="Inspect and check fabrics: presets, fabric YAML/JSON files, "
                       "`nvidia-smi topo -m` text or NCCL topology XML.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks of pathweave's own parts.", no_args_is_help=True)
#: `pathweave --help` in three panels, first-look commands first.
PLAN_PANEL, RUN_PANEL, MEASURE_PANEL = ("Plan and predict", "Run on torch.distributed",
                                        "Measure pathweave")
app.add_typer(topo_app, name="topo", rich_help_panel=PLAN_PANEL)
app.add_typer(bench_app, name="bench", rich_help_panel=MEASURE_PANEL)
app.add_typer(emulate_app, name="emulate", rich_help_panel=MEASURE_PANEL)
app.command("simulate", rich_help_panel=PLAN_PANEL)(simulate_cmd)
app.command("perf", context_settings=PERF_SETTINGS, add_help_option=False,
            rich_help_panel=RUN_PANEL)(perf_cmd)
app.command("calibrate", context_settings=PERF_SETTINGS, add_help_option=False,
            rich_help_panel=RUN_PANEL)(calibrate_cmd)

FabricArg = Annotated[
    str,
    typer.Argument(
        metavar="PRESET|FILE",
        help="A preset spec (h100-2x4, dgx-h100:nodes=4, cluster:nodes=8,...) or a topology "
        "file: a fabric YAML/JSON file, the text of `nvidia-smi topo -m` or an NCCL topology "
        "XML (NCCL_TOPO_DUMP_FILE), optionally with options: FILE:nodes=4,gpu=h100.",
        show_default=False,
    ),
]


def _version(value: bool) -> None:
    if value:
        console().print(f"pathweave {pathweave.__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Skew-aware multi-path planning for GPU all-to-all and send/recv."""
    announce_compiles()


# ------------------------------------------------------------------- topo
@topo_app.command("show")
@handles_user_errors
def topo_show(
    fabric: FabricArg,
    png: Annotated[
        Path | None, typer.Option("--png", callback=out_image,
                                  help="Also draw the fabric to this image file (.png, .svg, "
                                  ".pdf, ...; .png if no suffix; - for a PNG on stdout).")
    ] = None,
    max_nodes: Annotated[
        int, typer.Option("--max-nodes", min=1, help="Most nodes to draw in --png.")
    ] = 4,
    save: Annotated[
        Path | None, typer.Option("--save", help="Also write the fabric shown to this fabric "
                                  "file (.yaml, .yml or .json), e.g. one read from NCCL XML.")
    ] = None,
) -> None:
    """Summarise a fabric: nodes, GPUs, NVLink, rails, spines, links and candidate paths."""
    from pathweave.cli.topo import RAIL_ROLES_NOTE, summary_tables

    fab = load_fabric(fabric)
    paths = pwfabric.candidate_paths(fab)
    out = human_console(png)
    for table in summary_tables(fab, paths):
        out.print(table)
    if len(fab.rails) and fab.num_nodes > 1:
        out.print(f"[dim]{RAIL_ROLES_NOTE}[/]")
    if png is not None:
        written = viz.draw_fabric(fab, png, max_nodes=max_nodes)
        shown = min(fab.num_nodes, max_nodes)
        if shown < fab.num_nodes:
            out.print(f"{shown} of {fab.num_nodes} nodes drawn")
        wrote(out, written)
    if save is not None:
        wrote(out, pwfabric.save(fab, save))


@topo_app.command("validate")
def topo_validate(fabric: FabricArg) -> None:
    """Load a fabric and compile its candidate paths; print OK or the problem (exit 1)."""
    try:
        fab = load_fabric(fabric)
        paths = pwfabric.candidate_paths(fab)
    except (PathweaveError, OSError) as exc:
        message = str(exc) if not isinstance(exc, OSError) else f"{exc.filename}: {exc.strerror}"
        if fabric not in message:
            message = f"{fabric}: {message}"  # always name what was checked
        fail(f"invalid fabric: {message}", code=1)
    console().print(
        f"[green]OK[/] {fab.name}: {fab.num_nodes} nodes x {fab.gpus_per_node} GPUs, "
        f"{fab.num_links} links, {paths.num_paths} candidate paths"
    )


# ------------------------------------------------------------------- plan
@app.command("plan", rich_help_panel=PLAN_PANEL)
@handles_user_errors
def plan_cmd(
    args: FabricWorkloadArgs = None,
    fabric: FabricSpec = None,
    workload: Annotated[
        str | None, workload_option("Workload spec: hotspot:0.8, moe:tokens=16384,hidden=4096, "
                             "many_to_few:2, stencil:dims=2, uniform, zipf:1.2, ...; or a "
                             "demand file: .npz/.json (save_demand), .npy or .csv (one row per "
                             "sender, bytes).")
    ] = None,
    policy: Annotated[
        str, policy_option("Policies to compare, comma-separated, or 'all'.")
    ] = "all",
    bytes_per_rank: BytesPerRank = "256M",
    time_limit: Annotated[float, time_limit_option("HiGHS time limit for the LP optimum.")] = 120.0,
    no_lp: Annotated[
        bool, typer.Option("--no-lp", help="Skip the LP optimum (no 'x optimal'); at 1024 GPUs "
                           "it needs ~16 GB and minutes.")
    ] = False,
    groups: Annotated[
        str | None, groups_option("(layout=block|strided): plan every group alone and all "
                                  "jointly, side by side.")
    ] = None,
    json_out: JsonOut = None,
    png: Annotated[
        Path | None, typer.Option("--png", metavar="FILE", callback=out_image,
                                  help="Bar chart of congestion per policy (- for stdout).")
    ] = None,
) -> None:
    """Plan one workload with several policies and compare them with the LP optimum."""
    fabric, workload = fabric_and_workload("plan", fabric, workload, args)
    names = parse_policies(policy)
    size = parse_bytes(bytes_per_rank)
    fab = load_fabric(fabric, dense_paths=groups is None)
    if groups is not None:
        from pathweave.cli._groups import run_groups

        return run_groups(human_console(json_out), fab, workload, groups,
                          [n for n in names if not (no_lp and n == "optimal")], size,
                          simulate=False, json_out=json_out)
    demand = traffic.parse_workload(
        workload, fab.num_ranks, bytes_per_rank=size, gpus_per_node=fab.gpus_per_node
    )
    lp = not no_lp
    with Steps("planning", len(names) + (lp and "optimal" not in names)) as steps:
        cmp = compare(
            fab, demand, names, workload=workload, bytes_per_rank=size, time_limit_s=time_limit,
            on_policy=steps.update, lp=lp,
        )
    out = human_console(json_out, png)
    out.print(workload_header(fab, workload, demand))
    out.print(cmp.table())
    legend = ("congestion = max over links of load / capacity; time = predicted completion "
              "(pathweave.plan.predict_time: congestion + forwarding, set-up, pipeline fill)")
    if cmp.optimum_s is not None:
        out.print(f"{legend}; x optimal = congestion / LP optimum ({fmt_time(cmp.optimum_s)})")
    elif no_lp:
        out.print(f"{legend}; LP optimum skipped (--no-lp)")
    else:
        out.print(f"[yellow]LP optimum not available:[/] {cmp.optimum_error}", soft_wrap=True)
    if json_out is not None:
        wrote(out, write_json(json_out, cmp.records()))
    if png is not None:
        wrote(out, viz.plot_policy_comparison(
            {r.policy: r.congestion_s for r in cmp.results}, png, optimum_s=cmp.optimum_s,
            title=f"{fab.name}, {workload}, {fmt_bytes(float(demand.sum()))} in all",
        ))


# ------------------------------------------------------------------ bench
for _name, _bench in BENCHES.items():  # cli/bench.py (planner, sim), cli/paper.py, ...
    bench_app.command(_name)(_bench)


# ------------------------------------------------------------------- demo
@app.command("demo", rich_help_panel=PLAN_PANEL)
@handles_user_errors
def demo(
    out_dir: Annotated[Path, out_dir_option("Where to write the plots.")] = Path("pathweave-demo"),
    no_emulate: Annotated[
        bool, typer.Option("--no-emulate", help="Leave out the emulator step (it needs root "
                           "and takes under a minute).")
    ] = False,
) -> None:
    """A skewed all-to-all on the NIMBLE testbed, planned by every policy, with plots."""
    from pathweave.cli import demo as demo_mod

    out = console()
    steps = [s for s in demo_mod.STEPS if not (no_emulate and s.name == "emulate")]
    ctx = demo_mod.run_demo(out_dir, out, steps)
    rule(out)
    if len(steps) < len(demo_mod.STEPS):
        out.print("emulate step left out (--no-emulate)")
    out.print("files: " + ", ".join(str(f) for f in ctx.files))


# --------------------------------------------------------------- policies
@app.command("policies", rich_help_panel=PLAN_PANEL)
def policies_cmd() -> None:
    """List the registered planning policies."""
    table = Table(title="policies", title_justify="left")
    table.add_column("policy", style="bold")
    table.add_column("what it does")
    table.add_column("options (defaults)")
    for name in pwplan.policies():
        info = pwplan.policy_info(name)
        opts = ", ".join(f"{k}={v!r}" for k, v in info.options.items()) or "-"
        model = "" if info.executable else " (a model to compare against; not run by pathweave)"
        table.add_row(name, info.summary + model, opts)
    console().print(table)


#: The order of the commands in `pathweave --help` (their panels' order follows).
COMMAND_ORDER = ("demo", "plan", "simulate", "policies", "perf", "calibrate")
app.registered_commands.sort(
    key=lambda c: COMMAND_ORDER.index(c.name) if c.name in COMMAND_ORDER else len(COMMAND_ORDER))

__all__ = ["EXIT_BAD_INPUT", "app"]
