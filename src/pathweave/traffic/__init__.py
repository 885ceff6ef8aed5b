"""Demand matrices and workload generators.

A demand matrix is a ``numpy`` float64 array ``D[src_rank, dst_rank]`` of
bytes with a zero diagonal; ranks are numbered node-major
(``rank = node * gpus_per_node + local``).

* :mod:`~pathweave.traffic.generators`: :func:`uniform`, :func:`hotspot`,
  :func:`zipf`, :func:`moe`, :func:`many_to_few`, :func:`stencil`,
  :func:`random_sparse`.
* :mod:`~pathweave.traffic.spec`: spec strings such as ``"hotspot:0.8"``
  (:func:`parse_workload`, :class:`WorkloadSpec`).
* :mod:`~pathweave.traffic.io`: :func:`validate_demand`, :func:`save_demand`,
  :func:`load_demand` for ``.npz`` and ``.json`` files.

Examples
--------
>>> import pathweave.traffic as traffic
>>> D = traffic.hotspot(8, bytes_per_rank=256 << 20, ratio=0.7)
>>> D.shape, D.dtype, float(D.trace())
((8, 8), dtype('float64'), 0.0)
"""

from .generators import hotspot, many_to_few, moe, random_sparse, stencil, uniform, zipf
from .io import FORMAT_TAG, FORMAT_VERSION, load_demand, save_demand, validate_demand
from .spec import WORKLOAD_NAMES, WorkloadSpec, parse_size, parse_workload
from .trace import FlowTrace, poisson_trace

__all__ = [
    "FORMAT_TAG",
    "FORMAT_VERSION",
    "WORKLOAD_NAMES",
    "FlowTrace",
    "WorkloadSpec",
    "hotspot",
    "load_demand",
    "many_to_few",
    "moe",
    "parse_size",
    "parse_workload",
    "poisson_trace",
    "random_sparse",
    "save_demand",
    "stencil",
    "uniform",
    "validate_demand",
    "zipf",
]
