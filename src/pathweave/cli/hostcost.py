"""``pathweave bench hostcost``: run :mod:`pathweave.bench.hostcost` and print its lines."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pathweave.cli._common import console, handles_user_errors, out_file, write_json


@handles_user_errors
def bench_hostcost(
    ranks: Annotated[list[int] | None, typer.Option(
        "--ranks", min=2, help="Group sizes to measure (repeatable; default 8, 64, 256).")] = None,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Timed calls per size.")] = 20,
    device: Annotated[str, typer.Option(
        "--device", help="meta (no memory moved; default) or cpu.")] = "meta",
    json_out: Annotated[Path | None, typer.Option(
        "--json", callback=out_file, help="Also write the records and checks as JSON.")] = None,
) -> None:
    """Host work per all_to_all_single call on torch's fake process group, beside torch's own."""
    from pathweave.bench import hostcost

    if device not in ("meta", "cpu"):
        raise typer.BadParameter(f"--device must be meta or cpu, got {device!r}")
    records, checks = hostcost.run(tuple(ranks or (8, 64, 256)), repeat, device)
    out = console()
    out.print(f"host work per call, fake process group ({device} tensors), median of {repeat}:")
    for r in records:
        out.print(f"  {r['ranks']:>5} ranks ({r['fabric']}): pathweave "
                  f"{r['pathweave_s'] * 1e6:>10,.0f} us, torch {r['torch_s'] * 1e6:>8,.0f} us, "
                  f"first call {r['first_call_s'] * 1e3:,.0f} ms")
    for c in checks:
        out.print(f"{'PASS' if c.passed else 'MISS'} {c.text}")
    if json_out is not None:
        write_json(json_out, {"records": records, "checks": [c.__dict__ for c in checks]})
