"""The demo's ``emulate`` step: the default policy vs the best baseline, measured on real bytes.

Run as root (with iproute2), it brings up the demo's fabric as network
namespaces joined by kernel-shaped links at 1e-4 of its capacities, runs the
demo's workload through the data plane with the best baseline of the
simulate step that the data plane runs (``static`` if it did not run; UCX's
model, ``multirail``, cannot run there) and the default policy once each
(after a warm-up call), checks every byte, and prints measured makespans
beside the simulator's predictions and the measured ratio. It takes well under
a minute. Otherwise it says why it skipped.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import TYPE_CHECKING

from pathweave import fabric as pwfabric
from pathweave import plan as pwplan
from pathweave.cli._common import fmt_bytes
from pathweave.cli._demo_context import best_baseline

if TYPE_CHECKING:
    from pathweave.cli._demo_context import DemoContext

#: Capacity scale and payload per rank of the demo's emulated run (NVLink 12 MB/s, rails 5 MB/s).
EMULATE_SCALE = 1e-4
EMULATE_BYTES_PER_RANK = 2 << 20
#: A quarter of ``pathweave emulate run``'s payload, so smaller chunks keep the pipeline fill small.
EMULATE_CHUNK_BYTES = 256 << 10


def skip_reason() -> str | None:
    """Why the emulated run cannot happen here, or ``None`` when it can.

    >>> isinstance(skip_reason(), (str, type(None)))
    True
    """
    if os.geteuid() != 0:
        return ("the emulator needs root (it creates network namespaces and tc qdiscs); "
                "run `sudo pathweave demo` or `pathweave emulate run` as root to see it")
    missing = [t for t in ("ip", "tc", "sysctl") if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not found (apt-get install -y iproute2 procps)"
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (a dependency of pathweave: pip install torch)"
    return None


def emulate_step(ctx: DemoContext) -> None:
    """The default policy vs the best baseline over the emulated fabric, measured."""
    out = ctx.console
    why = skip_reason()
    if why is not None:
        out.print(f"[yellow]skipped:[/] {why}.")
        return
    from pathweave.cli.emulate import result_table
    from pathweave.emulate import run_emulated

    spans = {n: r.makespan_s for n, r in ctx.simulations.items()
             if pwplan.policy_info(n).executable}
    base = best_baseline(spans) or "static"
    default = pwplan.DEFAULT_POLICY

    fab = ctx.fabric if ctx.fabric is not None else pwfabric.resolve(ctx.fabric_spec)
    out.print(
        f"Each GPU of [bold]{fab.name}[/] becomes a network namespace; every link a veth "
        f"shaped by the kernel at {EMULATE_SCALE:g} of its capacity (NVLink 120 GB/s -> "
        f"12 MB/s). One process per rank runs [bold]{ctx.workload}[/] at "
        f"{fmt_bytes(EMULATE_BYTES_PER_RANK)} per rank through the data plane: {base} (the "
        f"best baseline it runs) and {default} (the default policy)."
    )
    with out.status("running over the emulated fabric"):
        res = run_emulated(
            fab, scale=EMULATE_SCALE, workload=ctx.workload,
            bytes_per_rank=EMULATE_BYTES_PER_RANK, policies=(base, default), repeat=1,
            chunk_bytes=EMULATE_CHUNK_BYTES, prefix="pwdemo",
        )
    out.print(result_table(res))
    meas, pred = res.speedup(default, base)
    out.print(
        f"{default} over the best baseline ({base}): [bold]{meas:.2f}x[/] measured on real "
        f"bytes, {pred:.2f}x simulated; every byte verified. (`pathweave emulate run` and "
        "`pathweave bench emulate` do more.)"
    )


__all__ = [
    "EMULATE_BYTES_PER_RANK",
    "EMULATE_CHUNK_BYTES",
    "EMULATE_SCALE",
    "emulate_step",
    "skip_reason",
]
