"""pathweave: plan skewed GPU communication over every path the hardware has.

Layers (imports only point down): ``cli`` > ``moe`` > ``runtime`` >
``sim`` > ``plan`` > ``traffic`` > ``fabric``. ``import pathweave`` loads
``fabric``, ``traffic``, ``plan`` and ``sim`` and never imports torch; the
torch-based layers (``distributed``, ``runtime``, ``moe``, ``Orchestrator``)
load on first use.

Examples
--------
>>> import pathweave as pw
>>> fab = pw.fabric.preset("h100-2x4")
>>> D = pw.traffic.hotspot(fab.num_ranks, bytes_per_rank=64 << 20, ratio=0.8)
>>> plan = pw.plan.make(fab, D, policy="mwu")
>>> plan.congestion_s < pw.plan.make(fab, D, policy="static").congestion_s
True
>>> pw.sim.simulate(fab, plan).makespan_s >= plan.congestion_s
True
"""

from typing import Any

from pathweave import _log, errors, fabric, plan, sim, traffic

_log.configure()  # PATHWEAVE_DEBUG: the one place logging is set up

__version__ = "0.1.0"
__all__ = ["Orchestrator", "__version__", "errors", "fabric", "plan", "sim", "traffic"]


def __getattr__(name: str) -> Any:
    # The data plane needs torch; load it on first use so that
    # ``import pathweave`` stays torch-free.
    if name == "Orchestrator":
        from pathweave.runtime.orchestrator import Orchestrator

        return Orchestrator
    if name in ("distributed", "runtime", "moe", "emulate"):
        import importlib

        return importlib.import_module(f"pathweave.{name}")
    raise AttributeError(f"module 'pathweave' has no attribute {name!r}")
