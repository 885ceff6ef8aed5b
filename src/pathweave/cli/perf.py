"""``pathweave perf``: the command-line face of :mod:`pathweave.perf` (its flags, its help)."""

from __future__ import annotations

import typer

#: The flags are :mod:`pathweave.perf`'s own (one parser for ``pathweave perf``
#: and ``python -m pathweave.perf``), so typer passes every argument through.
PERF_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True,
                 "help_option_names": []}


def perf_cmd(ctx: typer.Context) -> None:
    """nccl-tests for skew: pathweave's all-to-all beside torch's (`pathweave perf --help`)."""
    from pathweave.perf import main

    raise typer.Exit(main(list(ctx.args)))
