"""``pathweave calibrate``: the command-line face of :mod:`pathweave.calibrate`."""

from __future__ import annotations

import typer


def calibrate_cmd(ctx: typer.Context) -> None:
    """Measure this machine's runtime costs and link rate into a model file (`--help`)."""
    from pathweave.calibrate import main

    raise typer.Exit(main(list(ctx.args)))
