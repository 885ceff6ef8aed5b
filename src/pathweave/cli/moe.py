"""``pathweave bench moe``: run :mod:`pathweave.bench.moe` and render it.

Prints one table (medians of dispatch+combine, ratios, bytes on the wire),
one of forward + backward (pathweave's autograd against torch's
differentiable exact all-to-all), the two target lines, the decode target
lines of the low-latency mode (:func:`pathweave.bench.moe.decode_checks`), writes ``--json``
atomically, and exits with code 1 when the implementations disagree on an
output or a gradient (a correctness failure);
a missed speed target is reported (``MISS``) but keeps exit code 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from pathweave.cli._common import (
    BENCHES,
    EXIT_MISMATCH,
    JsonOut,
    add_columns,
    console,
    fail,
    fmt_bytes,
    fmt_ms,
    handles_user_errors,
    human_console,
    print_checks,
    quick_option,
    require_torch,
    write_json,
    wrote,
)

__all__ = ["EXIT_MISMATCH", "bench_moe", "moe_table", "moe_train_table"]

def _ratio(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def moe_table(records: Sequence[Mapping[str, Any]]) -> Table:
    """One row per case: medians (ms), ratios and bytes moved per round trip.

    >>> t = moe_table([{"tokens": 128, "hidden": 1024, "routing": "uniform", "ranks": 4,
    ...     "num_experts": 32, "k": 4, "dtype": "bfloat16", "repeats": 5,
    ...     "pathweave_s": 0.010, "exact_s": 0.009, "padded_s": None,
    ...     "pathweave_over_exact": 1.11, "padded_over_pathweave": None,
    ...     "bytes_pathweave": 1 << 20, "bytes_exact": 1 << 20, "bytes_padded": None,
    ...     "outputs_equal": True, "multipath_calls": 0, "calls": 4}])
    >>> t.row_count
    1
    """
    r0 = next((r for r in records if "skipped" not in r), records[0] if records else {})
    table = Table(
        title=(
            f"MoE dispatch+combine, {r0.get('ranks', '?')} gloo ranks, "
            f"{r0.get('num_experts', '?')} experts, top-{r0.get('k', '?')}, "
            f"{r0.get('dtype', '?')} (median ms, slowest rank)"
        ),
        title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1),
    )
    add_columns(table, ("tokens", "hidden", "routing", "pw ms", "exact ms", "padded ms",
                        "pw/exact", "pad/pw", "bytes pw", "bytes pad", "reps", "same"),
                left={"routing"})
    for r in records:
        if "skipped" in r:
            table.add_row(str(r["tokens"]), str(r["hidden"]), r["routing"], "[dim]skipped[/]",
                          *[""] * 8)
            continue
        table.add_row(
            str(r["tokens"]), str(r["hidden"]), r["routing"],
            fmt_ms(r["pathweave_s"], 2), fmt_ms(r["exact_s"], 2), fmt_ms(r["padded_s"], 2),
            _ratio(r["pathweave_over_exact"]), _ratio(r["padded_over_pathweave"]),
            fmt_bytes(r["bytes_pathweave"]),
            "n/a" if r["bytes_padded"] is None else fmt_bytes(r["bytes_padded"]),
            str(r["repeats"]), "yes" if r["outputs_equal"] else "[red]NO[/]",
        )
    return table


def moe_train_table(records: Sequence[Mapping[str, Any]]) -> Table:
    """Forward + backward rows: pathweave's autograd against torch's differentiable exact
    all-to-all (median ms), and whether the gradients agree.

    >>> t = moe_train_table([{"tokens": 128, "hidden": 1024, "routing": "hot",
    ...     "train_pathweave_s": 0.03, "train_exact_s": 0.025, "train_pathweave_over_exact": 1.2,
    ...     "train_repeats": 5, "grad_rel_err": 0.0, "grads_close": True}])
    >>> t.row_count
    1
    """
    table = Table(
        title="forward + backward (identity experts, loss sum(out * G); median ms, slowest rank)",
        title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1),
    )
    add_columns(table, ("tokens", "hidden", "routing", "pw ms", "exact ms", "pw/exact",
                        "grad err", "reps", "grads"),
                left={"routing"})
    for r in records:
        if "train_pathweave_s" not in r:
            table.add_row(str(r["tokens"]), str(r["hidden"]), r["routing"], "[dim]skipped[/]",
                          *[""] * 5)
            continue
        table.add_row(
            str(r["tokens"]), str(r["hidden"]), r["routing"],
            fmt_ms(r["train_pathweave_s"], 2), fmt_ms(r["train_exact_s"], 2),
            _ratio(r["train_pathweave_over_exact"]), f"{r['grad_rel_err']:.1e}",
            str(r["train_repeats"]), "yes" if r["grads_close"] else "[red]NO[/]",
        )
    return table


@BENCHES.register("moe")
def bench_moe(
    json_out: JsonOut = None,
    quick: Annotated[bool, quick_option("128 and 1024 tokens, hidden 1024 only.")] = False,
    ranks: Annotated[int, typer.Option("--ranks", min=2, metavar="N",
                                       help="Local gloo processes.")] = 4,
    experts: Annotated[int, typer.Option("--experts", min=1, metavar="E",
                                         help="Experts (a multiple of --ranks).")] = 32,
    topk: Annotated[int, typer.Option("--topk", min=1, metavar="K",
                                      help="Experts per token.")] = 4,
    fabric: Annotated[
        str | None, typer.Option("--fabric", metavar="PRESET|FILE",
                                 help="Fabric of pathweave's orchestrator (default: one node "
                                 "of --ranks GPUs, from the launch environment).",
                                 show_default=False)
    ] = None,
    budget: Annotated[float, typer.Option("--budget", min=0.1, metavar="SECONDS",
                                          help="Timing budget per case.")] = 3.0,
    backward: Annotated[bool, typer.Option("--backward/--no-backward",
                                           help="Also time forward + backward.")] = True,
) -> None:
    """MoE dispatch+combine: pathweave vs torch all_to_all_single (exact and padded)."""
    require_torch("the MoE benchmark")
    _run_and_render(json_out=json_out, quick=quick, ranks=ranks, experts=experts, topk=topk,
                    fabric=fabric, budget=budget, backward=backward)


@handles_user_errors
def _run_and_render(*, json_out: Path | None, quick: bool, ranks: int, experts: int, topk: int,
                    fabric: str | None, budget: float, backward: bool = True) -> None:
    from pathweave.bench import moe

    if experts % ranks:
        fail(f"--experts {experts} must be a multiple of --ranks {ranks}")
    if topk > experts:
        fail(f"--topk {topk} must be <= --experts {experts}")
    if fabric is not None:
        from pathweave.bench.dataplane import job_fabric

        job_fabric(fabric, ranks, "--fabric")
    out = human_console(json_out)
    with console(stderr=True).status(f"running {len(moe.cases(quick))} cases on {ranks} ranks"):
        records = moe.run(quick=quick, world_size=ranks, num_experts=experts, k=topk,
                          fabric=fabric, budget_s=budget, backward=backward)
    out.print(moe_table(records))
    if backward:
        out.print(moe_train_table([r for r in records if "skipped" not in r]))
    for r in records:
        if "skipped" in r:
            out.print(f"[dim]skipped {r['tokens']} tokens, hidden {r['hidden']}, "
                      f"{r['routing']}: {r['skipped']}[/]", soft_wrap=True)
    s = moe.summary(records)
    print_checks(out, moe.summary_checks(s))
    out.print("[dim]exact (b): torch all_to_all_single with exact splits; padded (a): every "
              "rank pair padded to m*min(k, L) rows. Per round trip pathweave makes one small "
              "exchange more than (b): combine's guardrails (dispatch's replaces (b)'s count "
              "exchange; the data plane takes the splits from it); see docs/moe.md.[/]",
              soft_wrap=True)
    with console(stderr=True).status("running the decode and prefill targets (1 and 4 ranks)"):
        checks, decode = moe.decode_checks()
    print_checks(out, checks)  # the decode targets: the low-latency mode against plain torch
    s["decode"] = {"checks": [vars(c) for c in checks], **decode}
    s["outputs_equal"] = s["outputs_equal"] and checks[-1].passed is True
    if json_out is not None:
        wrote(out, write_json(json_out, {"records": records, "summary": s}))
    if not (s["outputs_equal"] and s["grads_close"]):
        raise typer.Exit(EXIT_MISMATCH)
