"""The hardware graph: the :class:`Fabric` type, builders, presets, path rules,
file loaders and topology discovery.

Examples
--------
>>> import pathweave as pw
>>> fab = pw.fabric.preset("h100-2x4")
>>> fab
Fabric(name='h100-2x4', nodes=2, gpus_per_node=4, vertices=32, links=92)
>>> paths = pw.fabric.candidate_paths(fab)
>>> len(paths.pair_paths(0, 1)), len(paths.pair_paths(0, 4)), len(paths.pair_paths(0, 5))
(3, 4, 4)
"""

from pathweave.fabric._core import Fabric, Link, LinkKind, Vertex, VertexKind
from pathweave.fabric._limits import check_physical, estimate_path_bytes
from pathweave.fabric.builders import FabricBuilder, cluster, leaf_spine
from pathweave.fabric.discovery import from_nccl_xml, from_nvidia_smi
from pathweave.fabric.io import from_dict, load, save, to_dict
from pathweave.fabric.paths import PathKind, PathSet, candidate_paths, compile_paths
from pathweave.fabric.presets import PRESETS, preset, resolve

__all__ = [
    "PRESETS",
    "Fabric",
    "FabricBuilder",
    "Link",
    "LinkKind",
    "PathKind",
    "PathSet",
    "Vertex",
    "VertexKind",
    "candidate_paths",
    "check_physical",
    "cluster",
    "compile_paths",
    "estimate_path_bytes",
    "from_dict",
    "from_nccl_xml",
    "from_nvidia_smi",
    "leaf_spine",
    "load",
    "preset",
    "resolve",
    "save",
    "to_dict",
]
