"""Emulate a fabric on one Linux machine and run the real data plane over it.

One network namespace per rank, every link of a :class:`~pathweave.fabric.Fabric`
a veth shaped by the kernel (``tc tbf``) at ``capacity * scale``, host routes
along the fabric's paths. :class:`Emulator` brings it up and down;
:func:`run_emulated` starts one ``torch.distributed`` rank per namespace, runs
the data plane's all-to-all per policy, checks every byte, and sets the
measured makespans beside the simulator's predictions and the plans'
congestion bounds. Needs root and iproute2; see ``docs/emulator.md``.

Examples
--------
>>> import pathweave as pw
>>> from pathweave.emulate import build_layout
>>> lay = build_layout(pw.fabric.preset("h100-2x4"), scale=1e-4)
>>> len(lay.namespaces)       # 8 ranks and one namespace for the rail bridges
9
"""

from pathweave.emulate._ip import EmulatorError
from pathweave.emulate.emulator import Emulator, cleanup, list_namespaces, status
from pathweave.emulate.run import (
    EmulationResult,
    PolicyResult,
    emulator_model,
    pipeline_fill_s,
    predict,
    probe_transfer,
    run_emulated,
    run_workloads,
)
from pathweave.emulate.topology import Layout, build_layout, framing_factor, scale_fabric

__all__ = [
    "EmulationResult",
    "Emulator",
    "EmulatorError",
    "Layout",
    "PolicyResult",
    "build_layout",
    "cleanup",
    "emulator_model",
    "framing_factor",
    "list_namespaces",
    "pipeline_fill_s",
    "predict",
    "probe_transfer",
    "run_emulated",
    "run_workloads",
    "scale_fabric",
    "status",
]
