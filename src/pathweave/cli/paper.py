"""``pathweave bench paper <name>|all``: run the NIMBLE paper reproductions and render them.

The figures live in :mod:`pathweave.bench.paper`; this module only drives
them (a progress bar on stderr) and prints, per figure, its rows, the
"paper vs ours" table and the files written. A figure that fails is
reported with its traceback after the others have run, and the command
exits with code 1; an unknown figure name exits with code 2.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pathweave.cli._common import (
    BENCHES,
    add_columns,
    console,
    fail,
    fmt_duration,
    handles_user_errors,
    human_console,
    json_option,
    out_dir_option,
    quick_option,
    rule,
    write_json,
    wrote,
)

#: Most rows of a figure printed; the CSV holds them all.
MAX_ROWS = 80
#: Exit code when a figure raised.
EXIT_FIGURE_FAILED = 1


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "n/a"
        return _number(value * 1e3 if key.endswith("_s") else value)
    return str(value)


def _number(value: float) -> str:
    """Four significant digits, without an exponent from 0.001 to 1e9 (keeps columns narrow)."""
    if 1e4 <= abs(value) < 1e9:
        return f"{value:.0f}"
    return f"{value:.4g}"


def _header(key: str) -> str:
    # Seconds read better as milliseconds at these scales (the CSV keeps
    # seconds); spaces for underscores let rich wrap a long header.
    if key.endswith("_s"):
        label = f"{key[:-2]} (ms)"
    elif key.endswith("_us"):
        label = f"{key[:-3]} (us)"
    else:
        label = key
    return label.replace("_", " ")


def rows_table(result: Any, max_rows: int = MAX_ROWS) -> Table:
    """A figure's rows, seconds shown as milliseconds, at most ``max_rows`` of them.

    A column holding the same value in every row is left out of the table
    and named once in the caption.
    """
    rows = result.rows
    keys = list(rows[0]) if rows else []
    constant = [k for k in keys if len(rows) > 1 and all(r.get(k) == rows[0][k] for r in rows)]
    keys = [k for k in keys if k not in constant]
    shown = rows[:max_rows]
    table = Table(title=f"{result.name}: {result.title}", title_justify="left",
                  box=box.SIMPLE_HEAD, padding=(0, 1))
    cells = [[_cell(k, row.get(k)) for k in keys] for row in shown]
    for c, key in enumerate(keys):
        longest_word = max(len(w) for w in _header(key).split())
        width = max([longest_word] + [len(line[c]) for line in cells])
        # Wrap headers to the width of their numbers, so the table fits a terminal.
        table.add_column(textwrap.fill(_header(key), width),
                         justify="left" if isinstance(rows[0][key], str) else "right")
    for line in cells:
        table.add_row(*line)
    caption = [f"{_header(k)} = {_cell(k, rows[0][k])}" for k in constant]
    if len(rows) > max_rows:
        where = f" (all in {result.csv_path})" if result.csv_path else ""
        caption.append(f"first {max_rows} of {len(rows)} rows{where}")
    if caption:
        table.caption = "; ".join(caption)
        table.caption_justify = "left"
    return table


def comparisons_table(result: Any) -> Table:
    """The "paper vs ours" table of a figure: label, ours, paper, ours / paper."""
    table = Table(title=f"{result.name}: paper vs ours", title_justify="left",
                  box=box.SIMPLE_HEAD, padding=(0, 1))
    table.add_column("quantity")
    table.add_column("ours", justify="right", no_wrap=True)
    table.add_column("paper", justify="right", no_wrap=True)
    table.add_column("ours / paper", justify="right", no_wrap=True)
    for c in result.comparisons:
        unit = f" {c.unit}" if c.unit and c.unit != "x" else c.unit
        table.add_row(
            escape(c.label),
            f"{c.ours:.4g}{unit}" if math.isfinite(c.ours) else "n/a",
            "-" if c.paper is None else f"{c.paper:.4g}{unit}",
            "-" if c.ratio is None or not math.isfinite(c.ratio) else f"{c.ratio:.2f}",
        )
    return table


def render_result(out: Console, result: Any) -> None:
    """Print one figure: its rows, the paper comparison, the notes and the files."""
    rule(out, f"[bold]{escape(result.name)}[/]  {escape(result.title)}")
    if result.rows:
        out.print(rows_table(result))
    if result.comparisons:
        out.print(comparisons_table(result))
    for note in result.notes:
        colour = "green" if note.startswith("PASS") else "red" if note.startswith("MISS") \
            else "dim"
        out.print(f"[{colour}]{escape(note)}[/]", soft_wrap=True)
    files = [str(p) for p in (result.csv_path, result.png_path) if p is not None]
    if files:
        out.print("wrote " + ", ".join(files))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN or infinity
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _json_safe(value.item())
    return value


def records(outcome: Any) -> dict[str, Any]:
    """The outcome of a run as JSON-ready data: figures, comparisons, failures."""
    figures = []
    for r in outcome.results:
        figures.append({
            "name": r.name,
            "title": r.title,
            "wall_s": outcome.wall_s.get(r.name),
            "csv": r.csv_path,
            "png": r.png_path,
            "rows": r.rows,
            "comparisons": [
                {"label": c.label, "ours": c.ours, "paper": c.paper, "unit": c.unit,
                 "ratio": c.ratio}
                for c in r.comparisons
            ],
            "notes": r.notes,
        })
    failures = [{"name": f.name, "error": f.message, "traceback": f.traceback}
                for f in outcome.failures]
    return _json_safe({"figures": figures, "failures": failures})


def _summary_table(outcome: Any, names: Sequence[str]) -> Table:
    table = Table(title="paper reproductions", title_justify="left", box=box.SIMPLE_HEAD,
                  padding=(0, 1))
    add_columns(table, ("figure", "status", "time", "files"), left={"figure", "status", "files"})
    done = {r.name: r for r in outcome.results}
    failed = {f.name: f for f in outcome.failures}
    for name in names:
        wall = fmt_duration(outcome.wall_s.get(name))
        if name in done:
            r = done[name]
            files = ", ".join(str(p) for p in (r.csv_path, r.png_path) if p is not None)
            table.add_row(name, "[green]ok[/]", wall, files)
        elif name in failed:
            table.add_row(name, "[red]failed[/]", wall, escape(failed[name].message))
    return table


@BENCHES.register("paper")
@handles_user_errors
def bench_paper(
    name: Annotated[
        str, typer.Argument(metavar="NAME|all",
                            help="Figure to reproduce: fig6, fig7, fig8, table1, hopper, or all.",
                            show_default=False)
    ],
    out_dir: Annotated[
        Path, out_dir_option("Where to write <name>.csv and .png.")
    ] = Path("pathweave-paper"),
    quick: Annotated[
        bool, quick_option("Fewer points and repeats: a first look in seconds.")
    ] = False,
    json_out: Annotated[
        Path | None, json_option("Write rows, comparisons and failures as JSON (- for stdout).")
    ] = None,
) -> None:
    """Reproduce the NIMBLE paper's figures (simulated): CSV, PNG and paper-vs-ours tables."""
    from pathweave.bench import paper

    if name == "all":
        names = list(paper.FIGURES)
    elif name in paper.FIGURES:
        names = [name]
    else:
        fail(f"unknown figure {name!r}{paper.FIGURES.suggest(name)}; known figures: "
             f"{', '.join(paper.FIGURES)}, or 'all'")
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=console(stderr=True), transient=True,
    ) as bar:
        overall = bar.add_task("figures", total=len(names), visible=len(names) > 1)
        current = bar.add_task("starting", total=None)

        def on_figure(index: int, count: int, fig: str) -> None:
            bar.update(overall, completed=index, description=f"figures ({fig})")
            bar.reset(current, total=None, description=fig)

        def on_progress(done: int, total: int, what: str) -> None:
            bar.update(current, completed=done, total=total, description=what)

        outcome = paper.run_all(out_dir, quick=quick, progress=on_progress, names=names,
                                on_figure=on_figure)
        bar.update(overall, completed=len(names))
    out = human_console(json_out)
    for result in outcome.results:
        render_result(out, result)
    if len(names) > 1:
        rule(out)
        out.print(_summary_table(outcome, names))
    if json_out is not None:
        wrote(out, write_json(json_out, records(outcome)))
    if outcome.failures:
        err = console(stderr=True)
        for f in outcome.failures:
            err.print(f"[bold red]error:[/] figure {f.name} failed: {escape(f.message)}",
                      soft_wrap=True)
            err.print(f"[dim]{escape(f.traceback.rstrip())}[/]", soft_wrap=True)
        raise typer.Exit(EXIT_FIGURE_FAILED)


__all__ = ["bench_paper", "comparisons_table", "records", "render_result", "rows_table"]
