"""``pathweave bench planner`` and ``bench sim``: the planners against the LP; the simulator.

The two benchmarks of the model side (no data plane, no torch); the others
have a module each (``paper``, ``dataplane``, ``emulate``, ``moe``, ``hostcost``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from pathweave import viz
from pathweave.cli._common import (
    BENCHES,
    BytesPerRank,
    JsonOut,
    Steps,
    add_columns,
    fail,
    fmt_duration,
    fmt_ms,
    handles_user_errors,
    human_console,
    ordered_policies,
    out_dir_option,
    parse_bytes,
    print_checks,
    quick_option,
    repeat_option,
    time_limit_option,
    write_json,
    wrote,
)


@BENCHES.register("planner")
@handles_user_errors
def bench_planner(
    quick: Annotated[
        bool, quick_option("Skip the 1024-GPU fabric and the LP at 256 GPUs.")
    ] = False,
    repeat: Annotated[
        int | None, repeat_option("Timing repeats per policy and case "
                                  "(default: 200/20/5/3 at 8/64/256/1024 GPUs).")
    ] = None,
    bytes_per_rank: BytesPerRank = "256M",
    time_limit: Annotated[float, time_limit_option("HiGHS time limit per LP.")] = 120.0,
    lp_max_ranks: Annotated[
        int, typer.Option("--lp-max-ranks", min=2, metavar="N",
                          help="Skip the LP on fabrics with more GPUs than N. At 1024 GPUs "
                          "HiGHS needed ~16 GB and ran past its 120 s limit here; raise N "
                          "to try anyway.")
    ] = 256,
    json_out: JsonOut = None,
    out_dir: Annotated[
        Path | None, out_dir_option("Write bench_planner.png (ratio to optimal) here.")
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
    print_checks(out, summary.checks)
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
    print_checks(out, [*bench_groups.scale_checks(scale_rows),
                       *bench_groups.joint_checks(joint_rows)])
    if json_out is not None:
        wrote(out, write_json(json_out, {"scale": scale_rows, "joint": joint_rows}))


@BENCHES.register("sim")
@handles_user_errors
def bench_sim(
    quick: Annotated[bool, quick_option("Only 64, 128 and 256 GPUs.")] = False,
    ranks: Annotated[
        str | None, typer.Option("--ranks", metavar="N,N,...",
                                 help="GPU counts, multiples of 8 (default: 64,128,256,512,1024).",
                                 show_default=False)
    ] = None,
    repeat: Annotated[
        int | None, repeat_option("Timing repeats (default: 5/3/1 at <=64/<=256/more GPUs).")
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
    add_columns(table, ("GPUs", "flows", "events", "sim (median)", "CPU", "makespan",
                        "/ congestion", "unbatched sim", "unbatched events"), no_wrap=True)
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
    print_checks(out, bench_sim_mod.summarize(records))
    if json_out is not None:
        wrote(out, write_json(json_out, records))


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
