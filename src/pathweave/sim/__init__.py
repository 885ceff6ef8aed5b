"""Flow-level simulation of plans on a fabric.

:func:`simulate` runs a static plan as max-min fair fluid flows;
:class:`SimModel` holds the overheads and efficiencies (fitted to the NIMBLE
testbed), :class:`SimResult` what comes back. :func:`maxmin_rates` is the
rate kernel the simulators share. :func:`run_dynamic` plays flows that arrive
over time under a dynamic routing policy (:mod:`pathweave.sim.policies`:
``ecmp``, ``spray``, ``flowbender``, ``hopper``, ``nimble-online``) and returns
a :class:`DynamicResult`.

Examples
--------
>>> import pathweave as pw
>>> fab = pw.fabric.preset("h100-2x4")
>>> D = pw.traffic.hotspot(8, bytes_per_rank=64 << 20, ratio=0.7)
>>> plan = pw.plan.make(fab, D, policy="mwu")
>>> res = pw.sim.simulate(fab, plan)
>>> res.makespan_s >= plan.congestion_s
True
"""

from pathweave.sim._maxmin import maxmin_rates, maxmin_rates_reference
from pathweave.sim.dynamic import BackgroundEvent, DynamicResult, LinkEvent, run_dynamic
from pathweave.sim.model import SimModel, SimResult
from pathweave.sim.static import simulate

__all__ = [
    "BackgroundEvent",
    "DynamicResult",
    "LinkEvent",
    "SimModel",
    "SimResult",
    "maxmin_rates",
    "maxmin_rates_reference",
    "run_dynamic",
    "simulate",
]
