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
from rich import box
from rich.table import Table

import pathweave
from pathweave import fabric as pwfabric
from pathweave import plan as pwplan
from pathweave import traffic, viz
from pathweave.cli._common import (
    EXIT_BAD_INPUT,
    BytesPerRank,
    FabricSpec,
    JsonOut,
    OneLineErrors,
    Steps,
    console,
    fail,
    fmt_bytes,
    fmt_duration,
    fmt_ms,
    fmt_time,
    handles_user_errors,
    human_console,
    load_fabric,
    ordered_policies,
    out_folder,
    out_image,
    parse_bytes,
    parse_policies,
    rule,
    workload_header,
    write_json,
    wrote,
)
from pathweave.cli._compare import compare
from pathweave.cli.calibrate import calibrate_cmd
from pathweave.cli.dataplane import bench_dataplane
from pathweave.cli.emulate import bench_emulate, emulate_app
from pathweave.cli.hostcost import bench_hostcost
from pathweave.cli.moe import bench_moe
from pathweave.cli.paper import bench_paper
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
app.add_typer(topo_app, name="topo")
app.add_typer(bench_app, name="bench")
app.add_typer(emulate_app, name="emulate")
app.command("simulate")(simulate_cmd)
app.command("perf", context_settings=PERF_SETTINGS, add_help_option=False)(perf_cmd)
app.command("calibrate", context_settings=PERF_SETTINGS, add_help_option=False)(calibrate_cmd)

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
@app.command("plan")
@handles_user_errors
def plan_cmd(
    fabric: FabricSpec,
    workload: Annotated[
        str, typer.Option("--workload", "-w", metavar="SPEC",
                          help="Workload spec: hotspot:0.8, moe:tokens=16384,hidden=4096, "
                          "many_to_few:2, stencil:dims=2, uniform, zipf:1.2, ...; or a "
                          "demand file: .npz/.json (save_demand), .npy or .csv (one row per "
                          "sender, bytes).",
                          show_default=False)
    ],
    policy: Annotated[
        str, typer.Option("--policy", "-p", metavar="P[,P...]",
                          help="Policies to compare, comma-separated, or 'all'.")
    ] = "all",
    bytes_per_rank: BytesPerRank = "256M",
    time_limit: Annotated[
        float, typer.Option("--time-limit", min=0.001, metavar="SECONDS",
                            help="HiGHS time limit for the LP optimum.")
    ] = 120.0,
    no_lp: Annotated[
        bool, typer.Option("--no-lp", help="Skip the LP optimum (no 'x optimal'); at 1024 GPUs "
                           "it needs ~16 GB and minutes.")
    ] = False,
    groups: Annotated[
        str | None, typer.Option("--groups", "-g", metavar="COUNTxSIZE[:layout=...,stagger=S]",
                                 help="Concurrent groups, each running the workload on its own "
                                 "ranks (layout=block|strided): plan every group alone and "
                                 "all jointly, side by side.", show_default=False)
    ] = None,
    json_out: JsonOut = None,
    png: Annotated[
        Path | None, typer.Option("--png", metavar="FILE", callback=out_image,
                                  help="Bar chart of congestion per policy (- for stdout).")
    ] = None,
) -> None:
    """Plan one workload with several policies and compare them with the LP optimum."""
    names = parse_policies(policy)
    size = parse_bytes(bytes_per_rank)
    fab = load_fabric(fabric)
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
@bench_app.command("planner")
@handles_user_errors
def bench_planner(
    quick: Annotated[
        bool, typer.Option("--quick", help="Skip the 1024-GPU fabric and the LP at 256 GPUs.")
    ] = False,
    repeat: Annotated[
        int | None, typer.Option("--repeat", min=1, metavar="N",
                                 help="Timing repeats per policy and case "
                                 "(default: 200/20/5/3 at 8/64/256/1024 GPUs).",
                                 show_default=False)
    ] = None,
    bytes_per_rank: BytesPerRank = "256M",
    time_limit: Annotated[
        float, typer.Option("--time-limit", min=0.001, metavar="SECONDS",
                            help="HiGHS time limit per LP.")
    ] = 120.0,
    lp_max_ranks: Annotated[
        int, typer.Option("--lp-max-ranks", min=2, metavar="N",
                          help="Skip the LP on fabrics with more GPUs than N. At 1024 GPUs "
                          "HiGHS needed ~16 GB and ran past its 120 s limit here; raise N "
                          "to try anyway.")
    ] = 256,
    json_out: JsonOut = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", metavar="DIR", callback=out_folder,
                                  help="Write bench_planner.png (ratio to optimal) here.")
    ] = None,
    speed: Annotated[
        bool, typer.Option("--speed", help="Only the planning times: mwu and the default "
                           "policy (replanning included), no LP, no simulation.")
    ] = False,
    scale: Annotated[
        bool, typer.Option("--scale", help="Instead: concurrent 64-GPU groups at 512-8192 GPUs "
                           "(plan, simulate, peak memory) and joint against per-group planning.")
    ] = False,
    scale_ranks: Annotated[
        str, typer.Option("--scale-ranks", metavar="N,N,...", help="GPU counts of --scale.")
    ] = "512,1024,2048,4096,8192",
) -> None:
    """Congestion and planning time of every policy on 8 to 1024 GPUs, against the LP."""
    from pathweave.bench import planner

    if scale:
        return _bench_scale(scale_ranks, json_out)
    size = parse_bytes(bytes_per_rank)
    with Steps("bench") as steps:
        records = planner.run(
            quick=quick, repeat=repeat, bytes_per_rank=size, time_limit_s=time_limit,
            lp_max_ranks=lp_max_ranks, speed=speed,
            on_progress=lambda done, total, text: steps.update(text, done, total),
        )
    out = human_console(json_out)
    out.print(_bench_table(records))
    summary = planner.summarize(records)
    for check in summary.checks:
        mark = {True: "[green]PASS[/]", False: "[red]MISS[/]", None: "[dim]  - [/]"}[check.passed]
        out.print(f"{mark} {check.text}")
    if json_out is not None:
        wrote(out, write_json(json_out, records))
    if out_dir is not None:
        labels = {r["workload"]: planner.workload_label(r["workload"]) for r in records}
        written = viz.plot_bench_ratios(records, Path(out_dir) / "bench_planner.png",
                                        labels=labels)
        out.print(f"wrote {written}")


def _bench_scale(ranks_text: str, json_out: Path | None) -> None:
    from pathweave.bench import groups as bench_groups
    from pathweave.cli._groups import scale_tables

    try:
        ranks = [int(t) for t in ranks_text.split(",")]
    except ValueError:
        fail(f"--scale-ranks {ranks_text!r} is not a list of GPU counts such as 512,1024")
    if any(n < 64 or n % 64 for n in ranks):
        fail(f"--scale-ranks {ranks_text!r}: every count must be a multiple of 64")
    with Steps("bench") as steps:
        def progress(done: int, total: int, text: str) -> None:
            steps.update(text, done, total)

        scale_rows = bench_groups.run_scale(ranks, on_progress=progress)
        joint_rows = bench_groups.run_joint(on_progress=progress)
    out = human_console(json_out)
    for table in scale_tables(scale_rows, joint_rows):
        out.print(table)
    for check in [*bench_groups.scale_checks(scale_rows), *bench_groups.joint_checks(joint_rows)]:
        mark = {True: "[green]PASS[/]", False: "[red]MISS[/]", None: "[dim]  - [/]"}[check.passed]
        out.print(f"{mark} {check.text}")
    if json_out is not None:
        wrote(out, write_json(json_out, {"scale": scale_rows, "joint": joint_rows}))


@bench_app.command("sim")
@handles_user_errors
def bench_sim(
    quick: Annotated[
        bool, typer.Option("--quick", help="Only 64, 128 and 256 GPUs.")
    ] = False,
    ranks: Annotated[
        str | None, typer.Option("--ranks", metavar="N,N,...",
                                 help="GPU counts, multiples of 8 (default: 64,128,256,512,1024).",
                                 show_default=False)
    ] = None,
    repeat: Annotated[
        int | None, typer.Option("--repeat", min=1, metavar="N",
                                 help="Timing repeats (default: 5/3/1 at <=64/<=256/more GPUs).",
                                 show_default=False)
    ] = None,
    json_out: JsonOut = None,
) -> None:
    """Simulator wall time for a uniform all-to-all (mwu plan) on 64 to 1024 GPUs."""
    from pathweave.bench import sim as bench_sim_mod

    sizes = bench_sim_mod.QUICK_RANKS if quick else bench_sim_mod.RANKS
    if ranks is not None:
        try:
            sizes = tuple(int(x) for x in ranks.split(",") if x.strip())
        except ValueError:
            fail(f"--ranks {ranks!r}: expected GPU counts like 64,128")
        bad = [n for n in sizes if n <= 0 or n % bench_sim_mod.GPUS_PER_NODE]
        if bad or not sizes:
            fail(f"--ranks {ranks!r}: GPU counts must be positive multiples of "
                 f"{bench_sim_mod.GPUS_PER_NODE}")
    with Steps("bench") as steps:
        records = bench_sim_mod.run(
            sizes, repeat=repeat,
            on_progress=lambda done, total, text: steps.update(text, done, total),
        )
    table = Table(title="simulator benchmark: uniform all-to-all, 256 MiB per rank, mwu plan",
                  title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1))
    for col in ("GPUs", "flows", "events", "sim (median)", "CPU", "makespan", "/ congestion",
                "unbatched sim", "unbatched events"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in records:
        table.add_row(
            str(r["ranks"]), f"{r['flows']:,}", str(r["events"]), fmt_duration(r["sim_s_median"]),
            fmt_duration(r["sim_cpu_s_median"]), fmt_ms(r["makespan_s"]) + " ms",
            f"{r['makespan_over_congestion']:.3f}",
            fmt_duration(r["exact_sim_s"]) if r["exact_sim_s"] is not None else "",
            str(r["exact_events"] or ""),
        )
    out = human_console(json_out)
    out.print(table)
    for check in bench_sim_mod.summarize(records):
        mark = {True: "[green]PASS[/]", False: "[red]MISS[/]", None: "[dim]  - [/]"}[check.passed]
        out.print(f"{mark} {check.text}")
    if json_out is not None:
        wrote(out, write_json(json_out, records))


bench_app.command("paper")(bench_paper)
bench_app.command("dataplane")(bench_dataplane)
bench_app.command("emulate")(bench_emulate)
bench_app.command("moe")(bench_moe)
bench_app.command("hostcost")(bench_hostcost)


def _bench_table(records: list[dict]) -> Table:
    """One row per (fabric, workload): each policy's congestion relative to the optimum."""
    from pathweave.bench import planner

    pols = [p for p in ordered_policies(list(dict.fromkeys(r["policy"] for r in records)))
            if p != "optimal"]
    table = Table(title="planner benchmark: congestion / LP optimum, and planning times",
                  title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1))
    table.add_column("fabric", no_wrap=True)
    table.add_column("GPUs", justify="right")
    table.add_column("workload", no_wrap=True)
    table.add_column("opt (ms)", justify="right", no_wrap=True)
    for p in pols:
        table.add_column(p, justify="right", no_wrap=True)
    table.add_column("mwu time", justify="right", no_wrap=True)
    table.add_column("LP time", justify="right", no_wrap=True)
    cells: dict[tuple[str, str], dict[str, dict]] = {}
    for r in records:
        cells.setdefault((r["fabric"], r["workload"]), {})[r["policy"]] = r
    for (fname, workload), row in cells.items():
        first = next(iter(row.values()))
        opt = first["optimal_s"]
        got = {p: row[p]["congestion_s"] for p in pols if p in row}
        known = [c for c in got.values() if c is not None]
        # Without an LP optimum the best policy of the row stands in for it, marked "~".
        base = opt or (min(known) if known else None)
        ratios = []
        for p in pols:
            c = got.get(p)
            if c is None or not base:
                ratios.append("n/a")
            else:
                ratios.append(f"{c / base:.3f}" if opt else f"[dim]~{c / base:.3f}[/]")
        mwu, lp = row.get("mwu"), row.get("optimal")
        if lp is None:
            lp_time = ""
        elif lp["plan_s_median"] is None:
            lp_time = "skipped"
        else:
            lp_time = fmt_duration(lp["plan_s_median"]) + ("" if opt else " failed")
        table.add_row(
            fname, str(first["ranks"]), planner.workload_label(workload), fmt_ms(opt), *ratios,
            fmt_duration(mwu["plan_s_median"]) if mwu else "", lp_time,
        )
    table.caption = ("congestion / LP optimum, 1.000 = optimal; ~: no LP optimum, relative to "
                     "the best policy of the row")
    table.caption_justify = "left"
    return table


# ------------------------------------------------------------------- demo
@app.command("demo")
@handles_user_errors
def demo(
    out_dir: Annotated[
        Path, typer.Option("--out", metavar="DIR", callback=out_folder,
                           help="Where to write the plots.")
    ] = Path("pathweave-demo"),
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
@app.command("policies")
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


__all__ = ["EXIT_BAD_INPUT", "app"]
