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
           PCIe tree: two Xeon Platinum 8470 sockets (Sec. V-A) joined by
           4 UPI links at 16 GT/s; each HCA "attaches to one GPU": GPU and
           HCA share a PCIe Gen5 switch, two switches per socket (the paper
           does not say which GPUs sit on which socket; halves are assumed).
dgx-h100   DGX/HGX H100 nodes: 8 GPUs on NVSwitch with 18 NVLink 4 links
           x 25 GB/s = 450 GB/s per GPU per direction, 8 ConnectX-7 NICs at
           400 Gb/s (50 GB/s), one per GPU, rail-only. ``nodes`` defaults
           to 2. PCIe tree as ``nvidia-smi topo -m`` shows it on an 8-GPU
           H100 SXM board (GPU and NIC PIX, NODE within a socket, SYS
           across): one Gen5 switch per GPU-NIC pair, GPUs 0-3 under socket
           0 and 4-7 under socket 1 (two Xeon Platinum 8480C, 4 UPI links).
dgx-h200   DGX H200: the DGX H100 system with H200 GPUs (same NVLink 4
           NVSwitch fabric, ConnectX-7 NICs and PCIe tree).
dgx-a100   DGX A100 nodes: 8 A100 SXM4 on six NVSwitches, 12 NVLink 3 links
           x 25 GB/s = 300 GB/s per GPU per direction, 8 ConnectX-6 HDR
           NICs at 200 Gb/s (25 GB/s), rail-only. PCIe tree: four Gen4
           switches of two GPUs and two NICs each (``nvidia-smi topo -m``:
           PXB to both), switches 0-1 under socket 0 and 2-3 under socket 1
           (two EPYC 7742 joined by 4 xGMI-2 links). ``nodes`` defaults to 2.
gb200-nvl72
           GB200 NVL72 racks (:func:`~pathweave.fabric.builders.grace_rack`):
           one node per rack, 72 Blackwell GPUs in one NVLink 5 domain
           (18 links x 50 GB/s = 900 GB/s per GPU per direction through
           the NVLink switch trays), 36 Grace CPUs each joined to its two
           GPUs by NVLink-C2C (450 GB/s per direction) and to two of the
           rack's 72 ConnectX-7 NICs (400 Gb/s, 4 per compute tray, one per
           GPU) by PCIe Gen5 x16. Racks are joined by the rails (NIC ``j``
           of every rack on rail ``j``) and ``spines`` if given. ``nodes``
           defaults to 1.
cluster    :func:`pathweave.fabric.builders.cluster` with its parameters, e.g.
           ``cluster:nodes=128,gpus_per_node=8,node_kind=nvswitch,spines=4``.
========== ====================================================================

A spec string names a preset and optional parameters: ``h100-2x4``,
``dgx-h100:nodes=16``, ``cluster:nodes=8,gpus_per_node=8`` (each key once).
:func:`resolve` also takes a topology file, ``PATH[:key=value,...]``: a
fabric file, NCCL topology XML or ``nvidia-smi topo -m`` text, told apart by
content. Sizes are checked before anything is built (see
:mod:`pathweave.fabric._limits`).
"""

from __future__ import annotations

import inspect
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pathweave import _spec
from pathweave._registry import Registry, did_you_mean
from pathweave.errors import FabricError
from pathweave.fabric import discovery, io
from pathweave.fabric._core import Fabric
from pathweave.fabric._limits import check_fabric, check_physical, check_size
from pathweave.fabric.builders import (
    HDR200_Bps,
    NDR400_Bps,
    NVSWITCH_A100_GPU_Bps,
    NVSWITCH_H100_GPU_Bps,
    PCIE_GEN4_X16_Bps,
    PCIE_GEN5_X16_Bps,
    UPI2_SPR_Bps,
    XGMI2_ROME_Bps,
    cluster,
    grace_rack,
)

NIMBLE_NVLINK_PAIR_Bps = 120e9
NIMBLE_MEASURED_RAIL_Bps = 45.1e9


def _fit_tree(params: dict[str, Any], kw: dict[str, Any]) -> dict[str, Any]:
    """A node smaller than the preset's keeps its PCIe tree's shape as far as it can.

    A preset that names its PCIe switches keeps the most of them, up to its own
    count, that divide the GPUs and the NICs (``dgx-a100:gpus_per_node=2``);
    the others have one switch per GPU. Sockets follow the switches: each holds
    one at least, so a one-GPU node (``dgx-h100:gpus_per_node=1``, a one-rank
    default fabric) has one socket. What ``kw`` sets is kept.
    """
    gpus = int(params["gpus_per_node"])
    if "pcie_switches" in params and "pcie_switches" not in kw:
        nics = int(params.get("rails", gpus))
        params["pcie_switches"] = max(k for k in range(1, int(params["pcie_switches"]) + 1)
                                      if gpus % k == 0 and nics % k == 0)
    if "sockets" not in kw:
        switches = int(params.get("pcie_switches") or gpus)
        params["sockets"] = max(1, min(params["sockets"], switches))
    return params


@dataclass(frozen=True)
class _TreePreset:
    """A preset built by :func:`cluster` with a PCIe tree: its parameters, name and sources.

    Calling it builds the fabric: ``kw`` overrides ``params``, the tree is fitted
    to a smaller node (:func:`_fit_tree`), and ``name`` (``{nodes}`` filled in)
    is the fabric's name unless ``kw`` gives one.
    """

    params: dict[str, Any]
    name: str
    meta: dict[str, Any]

    def __call__(self, **kw: Any) -> Fabric:
        params = {**self.params, **kw}
        _fit_tree(params, kw)
        params.setdefault("name", self.name.format(nodes=params["nodes"]))
        return cluster(**params, meta=dict(self.meta))


_H100_2X4 = _TreePreset(
    params={
        "nodes": 2,
        "gpus_per_node": 4,
        "node_kind": "nvlink-mesh",
        "nvlink_Bps": NIMBLE_NVLINK_PAIR_Bps,
        "nic_Bps": NDR400_Bps,
        "pcie_Bps": PCIE_GEN5_X16_Bps,
        "pcie_tree": True,
        "sockets": 2,
        "intersocket_Bps": UPI2_SPR_Bps,
    },
    name="h100-2x4",
    meta={
        "preset": "h100-2x4",
        "source": "NIMBLE paper Sec. V-A/V-B: 120 GB/s direct NVLink peak, NDR400 rails, "
                  "2 x Xeon Platinum 8470, one HCA per GPU",
        "measured_rail_Bps": NIMBLE_MEASURED_RAIL_Bps,
    },
)


def _dgx_h(preset: str, gpu: str) -> _TreePreset:
    # DGX H100 and H200 share the NVLink 4 NVSwitch fabric, NICs and PCIe tree.
    return _TreePreset(
        params={
            "nodes": 2,
            "gpus_per_node": 8,
            "node_kind": "nvswitch",
            "nvlink_Bps": NVSWITCH_H100_GPU_Bps,
            "nic_Bps": NDR400_Bps,
            "pcie_Bps": PCIE_GEN5_X16_Bps,
            "pcie_tree": True,
            "sockets": 2,
            "intersocket_Bps": UPI2_SPR_Bps,
        },
        name=preset + "-{nodes}n",
        meta={
            "preset": preset,
            "source": f"DGX {gpu}: 18 x NVLink4 (25 GB/s) per GPU via NVSwitch, 8 x 400 Gb/s "
                      "ConnectX-7, one Gen5 PCIe switch per GPU-NIC pair, 2 x Xeon 8480C",
        },
    )


_DGX_A100 = _TreePreset(
    params={
        "nodes": 2,
        "gpus_per_node": 8,
        "node_kind": "nvswitch",
        "nvlink_Bps": NVSWITCH_A100_GPU_Bps,
        "nic_Bps": HDR200_Bps,
        "pcie_Bps": PCIE_GEN4_X16_Bps,
        "uplink_Bps": PCIE_GEN4_X16_Bps,
        "pcie_tree": True,
        "pcie_switches": 4,
        "sockets": 2,
        "intersocket_Bps": XGMI2_ROME_Bps,
    },
    name="dgx-a100-{nodes}n",
    meta={
        "preset": "dgx-a100",
        "gpu": "a100",
        "source": "DGX A100 user guide: 8 x A100 SXM4 (12 x NVLink3, 25 GB/s) on 6 NVSwitches, "
                  "8 x 200 Gb/s ConnectX-6, 4 Gen4 PCIe switches (2 GPUs + 2 NICs each), "
                  "2 x EPYC 7742",
    },
)


def _gb200_nvl72(**kw: Any) -> Fabric:
    params: dict[str, Any] = {"nodes": 1}
    params.update(kw)
    params.setdefault("name", f"gb200-nvl72-{params['nodes']}r")
    return grace_rack(
        **params,
        meta={
            "preset": "gb200-nvl72",
            "gpu": "gb200",
            "source": "DGX GB200 user guide: 18 compute trays of 2 Grace + 4 Blackwell and "
                      "4 x 400 Gb/s ConnectX-7, 9 NVLink switch trays; 18 x NVLink5 (1.8 TB/s) "
                      "per GPU; NVLink-C2C 900 GB/s",
        },
    )


def _cluster(**kw: Any) -> Fabric:
    if "nodes" not in kw:
        raise FabricError("preset 'cluster' needs nodes=N")
    return cluster(**kw)


#: Every preset: name -> ``build(**params) -> Fabric``, in the order listed.
PRESETS: Registry[Callable[..., Fabric]] = Registry("fabric preset", plural="presets",
                                                    error=FabricError)
for _name, _build in (("h100-2x4", _H100_2X4), ("dgx-h100", _dgx_h("dgx-h100", "H100")),
                      ("dgx-h200", _dgx_h("dgx-h200", "H200")), ("dgx-a100", _DGX_A100),
                      ("gb200-nvl72", _gb200_nvl72), ("cluster", _cluster)):
    PRESETS.add(_name, _build, module=__name__)


#: Integer parameters of the presets and the least value each may take.
_COUNT_KEYS = {"nodes": 1, "gpus_per_node": 1, "rails": 0, "spines": 0, "nics_per_gpu": 1,
               "sockets": 1, "pcie_tree": 0, "pcie_switches": 1, "gpus_per_cpu": 1,
               "nics_per_cpu": 1}
_TEXT_KEYS = ("node_kind", "name", "gpu", "nvlink_kind")
#: Shape defaults of each preset, for the size check made before building (the
#: PCIe-tree presets' own parameters).
_SHAPES = {
    **{name: p.params for name, p in PRESETS.items() if isinstance(p, _TreePreset)},
    "gb200-nvl72": {"nodes": 1, "gpus_per_node": 72, "node_kind": "nvswitch", "pcie_tree": 1,
                    "sockets": 1},
    "cluster": {"gpus_per_node": 8, "node_kind": "nvswitch"},
}
def _parse_value(where: str, key: str, text: str) -> Any:
    if key in _TEXT_KEYS:
        return text
    if key in _COUNT_KEYS:
        v = _spec.integer(text, where, FabricError)
        if v < _COUNT_KEYS[key]:
            raise FabricError(f"{where} must be >= {_COUNT_KEYS[key]}")
        return v
    v = _spec.number(text, where, FabricError)
    if v <= 0:
        raise FabricError(f"{where} must be positive")
    return v


def parse_options(spec: str, text: str) -> dict[str, Any]:
    """``key=value,...`` of a spec string as a dict; a key given twice is an error.

    The grammar is :mod:`pathweave._spec`'s; keys are case-sensitive
    (``nic_Bps``).

    >>> parse_options("dgx-h100:nodes=4", "nodes=4")
    {'nodes': 4}
    """
    if not text.strip():
        return {}
    found = _spec.items(text, where=f"fabric spec {spec!r}", error=FabricError)
    return {key: _parse_value(f"fabric spec {spec!r}: {key}={val!r}", key, val)
            for key, _, val in found}


def _check_shape(spec: str, base: str, kw: dict[str, Any], dense_paths: bool) -> None:
    shape = {**_SHAPES[base], **kw}
    nodes = int(shape.get("nodes", 1))
    gpus = int(shape["gpus_per_node"])
    rails = int(shape.get("rails", gpus))
    spines = int(shape.get("spines", 0))
    node_links = gpus * (gpus - 1) if shape["node_kind"] == "nvlink-mesh" else 2 * gpus
    if shape.get("pcie_tree"):  # switch uplinks and inter-socket links, at most
        sockets = int(shape.get("sockets", 2))
        node_links += 2 * (gpus + rails) + sockets * (sockets - 1)
    links = nodes * (node_links + 4 * rails) + 2 * rails * spines
    check_size(spec, nodes=nodes, gpus_per_node=gpus, rails=rails, spines=spines, links=links,
               relays=shape["node_kind"] != "nvswitch", paths=dense_paths)


def preset(name: str, *, dense_paths: bool = True, **params: Any) -> Fabric:
    """A named fabric; ``params`` override the preset's parameters.

    ``name`` may carry parameters as ``NAME:key=value,...``; each key once.
    The size is checked before anything is built (see
    :func:`pathweave.fabric._limits.check_size`): the fabric's links and,
    with ``dense_paths`` (the default), the candidate paths of every rank
    pair. ``dense_paths=False`` where only smaller path sets will be
    compiled (concurrent groups' subsets, ``--groups``).

    Examples
    --------
    >>> from pathweave.fabric import preset
    >>> preset("h100-2x4").num_ranks
    8
    >>> preset("dgx-h100:nodes=4").num_ranks
    32
    """
    base, rest = _spec.split(name, "fabric spec")
    build = PRESETS[base]  # an unknown name raises, naming the closest and every preset
    kw = parse_options(name, rest or "")
    kw.update(params)
    try:
        _check_shape(name, base, kw, dense_paths)
        fab = build(**kw)
    except TypeError as exc:
        raise _preset_error(base, exc) from None
    check_physical(fab, name)
    return fab


def _preset_error(base: str, exc: TypeError) -> FabricError:
    """A builder's TypeError in the preset's words: the unknown key and the closest
    parameter, not the builder's own name (``cluster() got an unexpected ...``)."""
    bad = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
    if bad is None:
        return FabricError(f"fabric preset {base!r}: {exc}")
    keys = [*_COUNT_KEYS, *_TEXT_KEYS, *inspect.signature(cluster).parameters]
    return FabricError(f"fabric preset {base!r} has no parameter {bad[1]!r}"
                       f"{did_you_mean(bad[1], [k for k in keys if k != 'meta'])}")


@dataclass(frozen=True)
class TopologyFormat:
    """A topology file format: how its content is told apart, and its reader.

    ``detect(raw)``: whether the file's bytes are in this format (formats are
    tried in :data:`FORMATS`' order; the last, ``fabric``, takes any file).
    ``reader(path, nodes, **options)``: the fabric of ``nodes`` identical
    nodes; ``nodes`` and its keyword-only parameters are the format's spec
    keys (:attr:`keys`, declared once, in the signature). None: a pathweave
    fabric file (:func:`pathweave.fabric.io.load`), which takes no options.
    """

    name: str
    detect: Callable[[bytes], bool]
    reader: Callable[..., Fabric] | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        """The spec keys the format takes: ``nodes`` and the reader's options, in order.

        >>> FORMATS["nvidia-smi"].keys[:3], FORMATS["fabric"].keys
        (('nodes', 'gpu', 'nvlink_kind'), ())
        """
        if self.reader is None:
            return ()
        params = inspect.signature(self.reader).parameters.values()
        return ("nodes", *(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY))


#: Topology file formats, in the order they are tried on a file's content
#: (:func:`sniff`); adding one is one entry here and its reader.
FORMATS: Registry[TopologyFormat] = Registry("topology file format", error=FabricError)
for _fmt in (
    TopologyFormat("nccl-xml", lambda raw: raw.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"<"),
                   discovery.from_nccl_xml),
    TopologyFormat("nvidia-smi", lambda raw: bool(re.search(rb"^[ \t]*GPU0[ \t]+\S", raw, re.M)),
                   discovery.from_nvidia_smi),
    TopologyFormat("fabric", lambda raw: True),
):
    FORMATS.add(_fmt.name, _fmt, module=__name__)


def sniff(raw: bytes) -> str:
    r"""What a topology file holds, by its content: the first of :data:`FORMATS` that detects it.

    >>> sniff(b"<system version='1'/>"), sniff(b"\tGPU0\tGPU1\nGPU0\t X \tNV18\n")
    ('nccl-xml', 'nvidia-smi')
    >>> sniff(b"format: pathweave-fabric")
    'fabric'
    """
    return next(f.name for f in FORMATS.values() if f.detect(raw))


def load_topology(path: str | os.PathLike[str], label: str | None = None, *,
                  dense_paths: bool = True, **options: Any) -> Fabric:
    """A fabric from any topology file, its kind detected by content.

    Parameters
    ----------
    path
        A pathweave fabric file (YAML/JSON), an NCCL topology XML file or the
        output of ``nvidia-smi topo -m``.
    label
        What to call it in errors (default: the path).
    **options
        Discovery options of the last two kinds (``nodes``, ``gpu``,
        ``nvlink_kind``, ``nic_Bps``, ...; see
        :func:`~pathweave.fabric.from_nccl_xml`). A fabric file takes none.

    Raises
    ------
    FabricFileError
        The file is not a regular file, too large, or does not parse.
    FabricError
        An unknown option, or a fabric too large to plan here.
    """
    from pathweave._files import read_input
    from pathweave.errors import FabricFileError, InputError

    label = label or os.fspath(path)
    try:
        raw = read_input(path, "topology file")
    except OSError as exc:
        raise FabricFileError(f"cannot read: {exc.strerror or exc}", path=os.fspath(path)) from None
    except InputError as exc:
        raise FabricFileError(str(exc)) from None
    fmt = FORMATS[sniff(raw)]
    bad = [k for k in options if k not in fmt.keys]
    if bad:
        allowed = ", ".join(fmt.keys) or "none"
        raise FabricError(f"{label}: option {bad[0]!r} does not apply to a {fmt.name} file "
                          f"(options: {allowed})")
    reader = fmt.reader
    if reader is None:
        fab = io.load(path)
        check_fabric(fab, label, paths=dense_paths)
        check_physical(fab, label)
        return fab
    nodes = int(options.pop("nodes", 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", discovery.DiscoveryWarning)
        one = reader(Path(path), 1, **options)
        check_size(label, nodes=nodes, gpus_per_node=one.gpus_per_node, rails=len(one.rails),
                   spines=0, links=one.num_links * nodes, relays=one.nvlink_kind != "nvswitch",
                   paths=dense_paths)
        check_physical(one, label)
        fab = one if nodes == 1 else reader(Path(path), nodes, **options)
    for text in dict.fromkeys(str(w.message) for w in caught):
        warnings.warn(text, discovery.DiscoveryWarning, stacklevel=2)
    return fab


def _file_spec(text: str) -> tuple[str, dict[str, Any]] | None:
    """``PATH`` or ``PATH:key=value,...`` naming an existing file, else ``None``."""
    if os.path.lexists(text):
        return text, {}
    head, sep, tail = text.rpartition(":")
    if sep and "=" in tail and os.path.lexists(head):
        return head, parse_options(text, tail)
    return None


def resolve(spec: str | os.PathLike[str] | Fabric, *, dense_paths: bool = True) -> Fabric:
    """A fabric from a preset spec, a topology file (``PATH[:key=value,...]``) or a Fabric.

    Files are YAML/JSON fabric files, NCCL topology XML or ``nvidia-smi
    topo -m`` text, told apart by content (:func:`sniff`); the last two take
    discovery options as spec keys, e.g. ``node.xml:nodes=4,gpu=h100``.
    ``dense_paths``: as :func:`preset`'s.

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
        return preset(text, dense_paths=dense_paths)
    found = _file_spec(text)
    if found is None:
        raise FabricError(
            f"fabric {text!r} is neither a preset ({', '.join(PRESETS)}) nor an existing file"
            + PRESETS.suggest(base)
        )
    return load_topology(found[0], text, dense_paths=dense_paths, **found[1])
