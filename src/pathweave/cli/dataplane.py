"""``pathweave bench dataplane``: run :mod:`pathweave.bench.dataplane` and render it.

The benchmark returns plain records; this module turns them into rich tables
and target lines, writes ``--json`` atomically, and sets the exit code: 1 when
any output differed from torch's (a correctness failure), 0 otherwise, also
when a speed target is missed (the ``MISS`` line says so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
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
    parse_bytes,
    print_checks,
    quick_option,
    repeat_option,
    require_torch,
    write_json,
    wrote,
)

#: Path roles on which a rank between source and destination forwards the bytes.
FORWARDED_ROLES = ("relay", "rd", "dr", "drd")


def _us(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e6:,.0f}"


def forwarded_share(bytes_per_kind: Mapping[str, float]) -> float | None:
    """Share of the bytes that travel through a forwarding rank (relay, rd, dr, drd paths).

    >>> forwarded_share({"direct": 60, "drd": 30, "rd": 10})
    0.4
    >>> forwarded_share({}) is None
    True
    """
    total = float(sum(bytes_per_kind.values()))
    if total <= 0:
        return None
    return sum(float(bytes_per_kind.get(k, 0)) for k in FORWARDED_ROLES) / total


def transfer_table(records: Sequence[Mapping[str, Any]]) -> Table:
    """One row per transfer case: medians, the ratio, and how pathweave moved the bytes."""
    rows = [r for r in records if r["case"] == "transfer"]
    ranks = rows[0]["ranks"] if rows else "?"
    table = Table(
        title=f"data plane: pathweave vs torch all_to_all_single, {ranks} gloo ranks on loopback",
        title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1),
    )
    add_columns(table, ("workload", "per pair", "pathweave", "torch ms", "pw ms", "pw/torch",
                        "meta+plan us", "forwarded", "verified"),
                left={"workload", "pathweave", "verified"}, no_wrap=True)
    for r in rows:
        ratio = r["ratio"]
        fwd = forwarded_share(r["bytes_per_kind"])
        table.add_row(
            r["workload"], fmt_bytes(r["bytes_per_pair"]), _how(r),
            fmt_ms(r["torch_s_median"]), fmt_ms(r["pathweave_s_median"]),
            "n/a" if ratio is None else f"{ratio:.3f}",
            _us(r["overhead_s_median"]), "-" if fwd is None else f"{100 * fwd:.0f} %",
            "[green]yes[/]" if r["verified"] else "[red]NO[/]",
        )
    return table


def transfer_note(records: Sequence[Mapping[str, Any]]) -> str:
    """What the columns of :func:`transfer_table` mean."""
    rows = [r for r in records if r["case"] == "transfer"]
    return (
        "per pair: bytes each rank sends each rank (balanced; hotspot: the same input per rank, "
        "80 % to rank 0); torch ms, pw ms: medians of interleaved repeats, slowest rank; "
        f"{_fabrics(rows)}; meta+plan: metadata exchange + planning per call "
        "(Orchestrator.stats); forwarded: share of bytes on paths through a forwarding rank "
        "(relay, rd, dr, drd)"
    )


def _how(r: Mapping[str, Any], short: bool = False) -> str:
    """How pathweave ran a case: forced multi-path, or what ``auto`` chose."""
    if r["variant"] == "multipath":
        return "forced" if short else "forced multi-path"
    # The backend runs the default orchestrator too; say which way it went.
    where = "backend, " if r["variant"] == "backend" else ""
    if short:
        return where + ("auto: multi" if r["multipath"] else "auto: torch")
    return where + ("auto: multi-path" if r["multipath"] else "auto: torch's")


def _fabrics(rows: Sequence[Mapping[str, Any]]) -> str:
    names = {r["variant"]: r["fabric"] for r in rows}
    parts = []
    if "auto" in names:
        parts.append(f"auto: default orchestrator on {names['auto']}")
    if "multipath" in names:
        parts.append(f"forced: enabled=True on {names['multipath']}")
    if "backend" in names:
        parts.append(f"backend: init_process_group('pathweave') on {names['backend']}")
    return ", ".join(parts)


def overhead_table(records: Sequence[Mapping[str, Any]]) -> Table:
    """The per-call overhead rows: with and without the plan cache."""
    rows = [r for r in records if r["case"] == "overhead"]
    size = fmt_bytes(rows[0]["bytes_per_pair"]) if rows else "?"
    calls = f", {rows[0]['repeat']} calls each" if rows else ""
    table = Table(title=f"per-call overhead, {size} per pair{calls} (times in us)",
                  title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1))
    add_columns(table, ("workload", "pathweave", "pattern", "torch", "pw", "pw-torch", "beyond",
                        "meta", "plan", "floor", "a2a", "hits"),
                left={"workload", "pathweave", "pattern"}, no_wrap=True)
    for r in rows:
        table.add_row(
            r["workload"], _how(r, short=True), "repeated" if r["cached"] else "changing",
            _us(r["torch_s_median"]), _us(r["pathweave_s_median"]),
            _us(r["diff_s"]), _us(r["beyond_transfer_s_median"]), _us(r["meta_s_median"]),
            _us(r["plan_s_median"]), _us(r.get("floor_s_median")), _us(r.get("a2a_s_median")),
            str(r["cache_hits"]),
        )
    return table


def overhead_note() -> str:
    """What the columns of :func:`overhead_table` mean."""
    return (
        "pattern: the same splits every call (plan cache hits) or a pair changed every call "
        "(planning every call); torch, pw: median call, slowest rank; pw-torch: median over "
        "repeats of the difference of back-to-back calls; beyond: a call's wall time minus its "
        "transfer_s; meta, plan: meta_s, plan_s of stats.last_call; floor: the collective "
        "the metadata exchange uses (gather + broadcast on gloo) on a zero row, bare, the least "
        "an exchange can cost here; a2a: one bare all-to-all of 512 B per pair; beyond, meta, "
        "plan, floor and a2a are medians over ranks and calls; hits: timed calls served from "
        "the plan cache"
    )


@BENCHES.register("dataplane")
def bench_dataplane(
    json_out: JsonOut = None,
    quick: Annotated[bool, quick_option("Sizes up to 4 MiB per pair only.")] = False,
    repeat: Annotated[
        int | None, repeat_option("Timing repeats per case (default: 21 up to 16 MiB per "
                                  "pair, 7 above, 100 for the overhead rows).")
    ] = None,
    ranks: Annotated[
        int, typer.Option("--ranks", min=2, metavar="N",
                          help="Local processes; --fabric must have as many ranks.")
    ] = 8,
    sizes: Annotated[
        str | None, typer.Option("--sizes", metavar="SIZE[,SIZE...]",
                                 help="Bytes per rank pair of the transfer rows "
                                 "(default: 1M,4M,16M,64M).", show_default=False)
    ] = None,
    fabric: Annotated[
        str, typer.Option("--fabric", metavar="PRESET|FILE",
                          help="Fabric of the forced multi-path rows.")
    ] = "h100-2x4",
) -> None:
    """pathweave's all_to_all_single against torch's on local gloo ranks, bitwise checked."""
    require_torch("the data-plane benchmark")
    _run_and_render(json_out=json_out, quick=quick, repeat=repeat, world_size=ranks,
                    sizes=sizes, multipath_fabric=fabric)


@handles_user_errors
def _run_and_render(*, json_out: Path | None, quick: bool, repeat: int | None, world_size: int,
                    sizes: str | None, multipath_fabric: str) -> None:
    from pathweave.bench import dataplane

    # Before the progress bar: a refused fabric is one line, with nothing drawn above it.
    dataplane.job_fabric(multipath_fabric, world_size, "--fabric")
    sizes_per_pair = None
    if sizes is not None:
        sizes_per_pair = [parse_bytes(s, "--sizes") for s in sizes.split(",") if s.strip()]
        try:
            dataplane.cases(quick, repeat, sizes_per_pair)
        except ValueError as exc:  # e.g. --sizes 2: one red line, like other bad input
            fail(f"--sizes {sizes!r}: {exc}")
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console(stderr=True), transient=True,
    )
    with progress:
        task = progress.add_task(f"starting {world_size} ranks", total=None)

        def on_progress(done: int, total: int, text: str) -> None:
            progress.update(task, completed=done, total=total, description=text)

        records = dataplane.run(
            quick=quick, repeat=repeat, world_size=world_size, sizes_per_pair=sizes_per_pair,
            multipath_fabric=multipath_fabric, on_progress=on_progress,
        )
    out = human_console(json_out)
    out.print(transfer_table(records))
    out.print(f"[dim]{transfer_note(records)}[/]")
    out.print(overhead_table(records))
    out.print(f"[dim]{overhead_note()}[/]")
    checks = dataplane.summarize(records)
    print_checks(out, checks)
    if json_out is not None:
        wrote(out, write_json(json_out, records))
    if not all(r["verified"] for r in records):
        raise typer.Exit(EXIT_MISMATCH)


__all__ = [
    "EXIT_MISMATCH", "bench_dataplane", "forwarded_share", "overhead_note", "overhead_table",
    "transfer_note", "transfer_table",
]
