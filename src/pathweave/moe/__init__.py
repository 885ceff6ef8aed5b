"""Mixture-of-Experts dispatch and combine on the multi-path data plane.

:class:`MoEAllToAll` moves each token to the ranks of its top-k experts
(:meth:`~MoEAllToAll.dispatch`) and brings the expert outputs back, summed
with the router weights (:meth:`~MoEAllToAll.combine`). The bytes move with
:func:`pathweave.distributed.all_to_all_single`, so a hot expert's traffic is
spread over relay and rail paths. Two layouts, as users know them from
pplx-kernels and DeepEP: ``"expert-major"`` (``[L, capacity, H]``) and
``"compact"`` (one row per token and destination rank).

:mod:`pathweave.moe.reference` is an independent single-process twin in plain
torch (tests and the example compare against it); :mod:`pathweave.moe.routing`
holds the index math. See ``docs/moe.md``.

Examples
--------
>>> from pathweave.moe import MoEAllToAll, reference
>>> MoEAllToAll.dispatch.__name__, callable(reference.reference_combine)
('dispatch', True)
"""

from pathweave.moe import reference
from pathweave.moe.layer import CombineWork, DispatchWork, MoEAllToAll, MoEHandle, scale_columns

__all__ = [
    "CombineWork",
    "DispatchWork",
    "MoEAllToAll",
    "MoEHandle",
    "reference",
    "scale_columns",
]
