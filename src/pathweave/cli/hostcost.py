"""``pathweave bench hostcost``: run :mod:`pathweave.bench.hostcost` and print its lines."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pathweave.cli._common import (
    BENCHES,
    console,
    handles_user_errors,
    out_file,
    print_checks,
    write_json,
)


@BENCHES.register("hostcost")
@handles_user_errors
def bench_hostcost(
    ranks: Annotated[list[int] | None, typer.Option(
        "--ranks", min=2, help="Group sizes to measure (repeatable; default 8, 64, 256).")] = None,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Timed calls per size.")] = 20,
    device: Annotated[str, typer.Option(
        "--device", help="meta (no memory moved; default) or cpu.")] = "meta",
    issue: Annotated[list[str] | None, typer.Option(
        "--issue", help="rounds (NCCL's posting; the targets) or streams (gloo's); "
        "repeatable, default both.")] = None,
    no_async: Annotated[bool, typer.Option(
        "--no-async", help="Skip the async overlap on 4 local gloo ranks.")] = False,
    json_out: Annotated[Path | None, typer.Option(
        "--json", callback=out_file, help="Also write the records and checks as JSON.")] = None,
) -> None:
    """Host work per all_to_all_single call on torch's fake process group, beside torch's own."""
    from pathweave.bench import hostcost

    if device not in ("meta", "cpu"):
        raise typer.BadParameter(f"--device must be meta or cpu, got {device!r}")
    issues = tuple(issue or hostcost.ISSUES)
    bad = [i for i in issues if i not in hostcost.ISSUES]
    if bad:
        raise typer.BadParameter(f"--issue must be rounds or streams, got {bad[0]!r}")
    records, checks = hostcost.run(tuple(ranks or (8, 64, 256)), repeat, device,
                                   issues=issues, overlap=not no_async)
    out = console()
    out.print(f"host work (CPU time) per call, fake process group ({device} tensors), "
              f"median of {repeat}:")
    for r in records:
        if r.get("async"):
            continue
        out.print(f"  {r['ranks']:>5} ranks ({r['fabric']}), {r['issue']:>7}: pathweave "
                  f"{r['pathweave_s'] * 1e6:>9,.0f} us CPU ({r['pathweave_wall_s'] * 1e6:,.0f} "
                  f"wall; {r['pathweave_noop_s'] * 1e6:,.0f} with a no-op transport), "
                  f"torch {r['torch_s'] * 1e6:>6,.0f} us, {r['ops']:>5} ops of "
                  f"{r['schedule_ops']} coalesced (fake "
                  f"group's own {r['floor_s'] * 1e6:>7,.0f} us), first call "
                  f"{r['first_call_s'] * 1e3:,.0f} ms")
    print_checks(out, checks)
    if json_out is not None:
        write_json(json_out, {"records": records, "checks": [c.__dict__ for c in checks]})
