"""``pathweave bench sim``: the simulator's wall time on 64 to 1024 GPUs."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.table import Table

from pathweave.cli._common import (
    BENCHES,
    JsonOut,
    Steps,
    fail,
    fmt_duration,
    fmt_ms,
    handles_user_errors,
    human_console,
    print_checks,
    quick_option,
    repeat_option,
    write_json,
    wrote,
)


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
    print_checks(out, bench_sim_mod.summarize(records))
    if json_out is not None:
        wrote(out, write_json(json_out, records))
