"""The demo's ``execute`` step: the skewed all-to-all run for real, checked against torch.

One local process per GPU of the demo's fabric (gloo over loopback) runs
:func:`pathweave.distributed.all_to_all_single` with the default policy's
plan and multi-path forced on, so relay ranks really forward chunks; every rank's
output is compared bitwise with ``torch.distributed.all_to_all_single``'s.
Loopback has no NVLink or rails, so the time shown is a correctness run's,
not a speed-up.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import typer

from pathweave import fabric as pwfabric
from pathweave import plan as pwplan
from pathweave import traffic
from pathweave.cli._common import fmt_bytes, fmt_ms

if TYPE_CHECKING:
    from pathweave.cli._demo_context import DemoContext

#: Payload per rank of the real run: small enough to keep the demo quick (the
#: stencil's two ends send four times as much: 112 MiB move per call).
EXECUTE_BYTES_PER_RANK = 8 << 20
#: Path roles folded into the three kinds the demo reports.
_KIND_OF_ROLE = {"matched": "rail", "rd": "rail", "dr": "rail", "drd": "rail"}


def kinds_summary(bytes_per_kind: dict[str, int]) -> str:
    """``direct 6.2 MiB, relay 1.0 MiB, rail 9.0 MiB`` from per-role or per-kind bytes.

    >>> kinds_summary({"direct": 3 << 20, "drd": 1 << 20, "rd": 1 << 20, "relay": 0})
    'direct 3 MiB, relay 0 B, rail 2 MiB'
    """
    folded: dict[str, int] = {"direct": 0, "relay": 0, "rail": 0}
    for key, value in bytes_per_kind.items():
        kind = _KIND_OF_ROLE.get(key, key)
        folded[kind] = folded.get(kind, 0) + int(value)
    return ", ".join(f"{k} {fmt_bytes(v)}" for k, v in folded.items())


def execute_step(ctx: DemoContext) -> None:
    """Run the demo's workload on local gloo ranks; print ``verified`` and the bytes by kind."""
    out = ctx.console
    if importlib.util.find_spec("torch") is None:
        out.print("[yellow]skipped:[/] torch is not installed, so nothing can run for real "
                  "(torch is a dependency of pathweave: pip install torch).")
        return
    from pathweave.bench import dataplane

    fab = ctx.fabric if ctx.fabric is not None else pwfabric.resolve(ctx.fabric_spec)
    demand = traffic.parse_workload(
        ctx.workload, fab.num_ranks, bytes_per_rank=EXECUTE_BYTES_PER_RANK,
        gpus_per_node=fab.gpus_per_node,
    )
    out.print(
        f"{fab.num_ranks} local processes (gloo over loopback) stand in for the GPUs of "
        f"[bold]{fab.name}[/] and run [bold]{ctx.workload}[/] at "
        f"{fmt_bytes(EXECUTE_BYTES_PER_RANK)} per rank through "
        "pathweave.distributed.all_to_all_single: the default policy's plan, multi-path "
        "forced on, so chunks are forwarded by relay ranks as they would be by GPUs."
    )
    with out.status("running on local ranks"):
        result = dataplane.execute(fab, demand, policy=pwplan.DEFAULT_POLICY, enabled=True)
    if not result["verified"]:
        out.print(f"[bold red]MISMATCH[/] with torch.distributed.all_to_all_single: "
                  f"{result['mismatch']}")
        raise typer.Exit(1)
    how = "multi-path" if result["multipath"] else "single path"
    out.print(
        f"[bold green]verified[/]: every rank's output is bitwise equal to "
        f"torch.distributed.all_to_all_single's. {fmt_bytes(result['bytes_moved'])} moved "
        f"between ranks per call; by path kind ({how}, from Orchestrator.stats): "
        f"{kinds_summary(result['bytes_per_kind'])}. "
        f"Median call: pathweave {fmt_ms(result['pathweave_s'], 1)} ms, torch "
        f"{fmt_ms(result['torch_s'], 1)} ms (loopback has no links to spread over, so "
        "forwarding only costs here)."
    )


__all__ = ["EXECUTE_BYTES_PER_RANK", "execute_step", "kinds_summary"]
