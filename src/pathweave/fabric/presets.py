"""Named fabrics with their source figures.

========== ====================================================================
preset     what it models
========== ====================================================================
h100-2x4   The NIMBLE paper's testbed (Sec. V-A): 2 nodes x 4 H100 SXM5,
           full-mesh NVLink 4 at 120 GB/s per GPU pair per direction (the
           paper's measured direct peak, Fig. 6a), one NDR400 HCA per GPU at
           its 400 Gb/s = 50 GB/s line rate, one rail switch per NIC index
           (rail-only). The paper's measured single-rail figure, 45.1 GB/s
           (Fig. 6d, 90.2 % of line rate), is not a capacity here: it is the
           simulator's per-rail efficiency (``pathweave.sim``), so congestion
           bounds stay in line-rate terms and efficiencies live in one place.
dgx-h100   DGX/HGX H100 nodes: 8 GPUs on NVSwitch with 18 NVLink 4 links
           x 25 GB/s = 450 GB/s per GPU per direction, 8 ConnectX-7 NICs at
           400 Gb/s (50 GB/s), one per GPU, rail-only. ``nodes`` defaults
           to 2.
cluster    :func:`pathweave.fabric.builders.cluster` with its parameters, e.g.
           ``cluster:nodes=128,gpus_per_node=8,node_kind=nvswitch,spines=4``.
========== ====================================================================

A spec string names a preset and optional parameters: ``h100-2x4``,
``dgx-h100:nodes=16``, ``cluster:nodes=8,gpus_per_node=8``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from pathweave.errors import FabricError
from pathweave.fabric._core import Fabric
from pathweave.fabric.builders import (
    NDR400_Bps,
    NVSWITCH_H100_GPU_Bps,
    PCIE_GEN5_X16_Bps,
    cluster,
)

NIMBLE_NVLINK_PAIR_Bps = 120e9
NIMBLE_MEASURED_RAIL_Bps = 45.1e9


def _h100_2x4(**kw: Any) -> Fabric:
    params: dict[str, Any] = {
        "nodes": 2,
        "gpus_per_node": 4,
        "node_kind": "nvlink-mesh",
        "nvlink_Bps": NIMBLE_NVLINK_PAIR_Bps,
        "nic_Bps": NDR400_Bps,
        "pcie_Bps": PCIE_GEN5_X16_Bps,
        "name": "h100-2x4",
    }
    params.update(kw)
    return cluster(
        **params,
        meta={
            "preset": "h100-2x4",
            "source": "NIMBLE paper Sec. V-A/V-B: 120 GB/s direct NVLink peak, NDR400 rails",
            "measured_rail_Bps": NIMBLE_MEASURED_RAIL_Bps,
        },
    )


def _dgx_h100(**kw: Any) -> Fabric:
    params: dict[str, Any] = {
        "nodes": 2,
        "gpus_per_node": 8,
        "node_kind": "nvswitch",
        "nvlink_Bps": NVSWITCH_H100_GPU_Bps,
        "nic_Bps": NDR400_Bps,
        "pcie_Bps": PCIE_GEN5_X16_Bps,
    }
    params.update(kw)
    params.setdefault("name", f"dgx-h100-{params['nodes']}n")
    return cluster(
        **params,
        meta={
            "preset": "dgx-h100",
            "source": "DGX H100: 18 x NVLink4 (25 GB/s) per GPU via NVSwitch, 8 x 400 Gb/s",
        },
    )


def _cluster(**kw: Any) -> Fabric:
    if "nodes" not in kw:
        raise FabricError("preset 'cluster' needs nodes=N")
    return cluster(**kw)


PRESETS: dict[str, Callable[..., Fabric]] = {
    "h100-2x4": _h100_2x4,
    "dgx-h100": _dgx_h100,
    "cluster": _cluster,
}


def _parse_value(key: str, text: str) -> Any:
    t = text.strip()
    if key == "node_kind" or key == "name":
        return t
    try:
        v = float(t)
    except ValueError:
        raise FabricError(f"fabric parameter {key}={text!r} is not a number") from None
    return int(v) if v.is_integer() and key not in ("nvlink_Bps", "nic_Bps", "pcie_Bps") else v


def preset(name: str, **params: Any) -> Fabric:
    """A named fabric; ``params`` override the preset's parameters.

    ``name`` may carry parameters as ``NAME:key=value,...``.

    Examples
    --------
    >>> from pathweave.fabric import preset
    >>> preset("h100-2x4").num_ranks
    8
    >>> preset("dgx-h100:nodes=4").num_ranks
    32
    """
    base, _, rest = name.partition(":")
    base = base.strip()
    if base not in PRESETS:
        raise FabricError(f"unknown fabric preset {base!r}; known presets: {', '.join(PRESETS)}")
    kw: dict[str, Any] = {}
    if rest.strip():
        for item in rest.split(","):
            key, eq, val = item.partition("=")
            key = key.strip()
            if not eq or not key:
                raise FabricError(f"fabric spec {name!r}: expected key=value, got {item!r}")
            kw[key] = _parse_value(key, val)
    kw.update(params)
    try:
        return PRESETS[base](**kw)
    except TypeError as exc:
        raise FabricError(f"fabric preset {base!r}: {exc}") from None


def resolve(spec: str | os.PathLike[str] | Fabric) -> Fabric:
    """A fabric from a preset spec, a YAML/JSON file path, or a Fabric itself.

    Examples
    --------
    >>> from pathweave.fabric import resolve
    >>> resolve("h100-2x4").name
    'h100-2x4'
    """
    if isinstance(spec, Fabric):
        return spec
    text = os.fspath(spec)
    base = text.partition(":")[0].strip()
    if base in PRESETS:
        return preset(text)
    if os.path.exists(text):
        from pathweave.fabric.io import load

        return load(text)
    raise FabricError(
        f"fabric {text!r} is neither a preset ({', '.join(PRESETS)}) nor an existing file"
    )
