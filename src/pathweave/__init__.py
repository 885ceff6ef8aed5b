"""pathweave: plan skewed GPU communication over every path the hardware has.

Layers (imports only point down): ``cli`` > ``plan`` > ``traffic`` >
``fabric``. ``import pathweave`` never imports torch.

Examples
--------
>>> import pathweave as pw
>>> fab = pw.fabric.preset("h100-2x4")
>>> D = pw.traffic.hotspot(fab.num_ranks, bytes_per_rank=64 << 20, ratio=0.8)
>>> plan = pw.plan.make(fab, D, policy="mwu")
>>> plan.congestion_s < pw.plan.make(fab, D, policy="static").congestion_s
True
"""

from pathweave import errors, fabric, plan, traffic

__version__ = "0.1.0"
__all__ = ["__version__", "errors", "fabric", "plan", "traffic"]
