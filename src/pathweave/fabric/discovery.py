"""Build fabrics from what a machine reports about itself.

Two sources are understood:

* :func:`from_nvidia_smi` reads the text of ``nvidia-smi topo -m``;
* :func:`from_nccl_xml` reads an NCCL topology file (``NCCL_TOPO_FILE``) or
  dump (``NCCL_TOPO_DUMP_FILE``).

Both describe one node. The fabric repeats that node ``nodes`` times (ranks
are ``node * G + local``), gives every NIC a PCIe link to the GPU(s) it
serves and joins NIC ``j`` of every node through rail switch ``rail{j}``
(a rail-only network). Neither source states everything a fabric needs, so
the gaps are filled with documented defaults and every such decision is
recorded in ``fab.meta["discovery"]``:

``source``, ``file``
    Which reader built the fabric, and from which file (``None`` for text).
``gpu``, ``nvlink_generation``, ``nvlink_Bps_per_link``
    The GPU assumed, its NVLink generation and the NVLink bandwidth per link
    and direction.
``nvlink_kind``
    ``"nvswitch"``, ``"nvlink-mesh"``, ``"pcie"`` or ``"none"`` (one GPU).
``nvlink_gpu_Bps`` / ``nvlink_pair_Bps``
    Per-GPU NVSwitch capacity, or the GPU x GPU mesh capacities.
``nic_names``, ``gpu_nic``
    Device name (``mlx5_7``, or the PCI bus id) of each NIC vertex, and of
    the NIC(s) each GPU uses (a string, or a list when a GPU has several).
``nic_Bps``, ``pcie_Bps``
    Line rate of each NIC vertex and the GPU-NIC PCIe capacity.
``skipped_nics``, ``notes``
    NICs left out (storage or management NICs that share no PCIe switch
    with a GPU; each also raises a :class:`DiscoveryWarning`) and free-text
    notes on everything that was inferred or assumed.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from pathweave._files import read_input
from pathweave.errors import FabricError, FabricFileError, InputError
from pathweave.fabric import _nccl_xml, _nvsmi
from pathweave.fabric._core import Fabric
from pathweave.fabric.builders import (
    FabricBuilder,
    NDR400_Bps,
    PCIE_GEN5_X16_Bps,
    add_gpus,
    add_nics,
    add_nvlink_mesh,
    add_nvswitch,
    add_pcie_host,
    add_pcie_tree,
    add_rails,
    gpu_name,
    nic_name,
    switch_groups,
)


class DiscoveryWarning(UserWarning):
    """A device found by discovery was left out of the fabric."""


@dataclass(frozen=True)
class GpuGeneration:
    """NVLink figures of one GPU generation (per link, per direction)."""

    name: str
    nvlink: str
    link_Bps: float
    max_links: int


_V100 = GpuGeneration("v100", "NVLink2", 25e9, 6)
_A100 = GpuGeneration("a100", "NVLink3", 25e9, 12)
_H100 = GpuGeneration("h100", "NVLink4", 25e9, 18)
_B200 = GpuGeneration("b200", "NVLink5", 50e9, 18)

#: Known GPU names and their NVLink generation.
GPU_GENERATIONS: dict[str, GpuGeneration] = {
    g.name: g
    for g in (
        _V100,
        _A100,
        _H100,
        replace(_H100, name="h200"),
        replace(_H100, name="gh200"),
        _B200,
        replace(_B200, name="gb200"),
    )
}

#: Compute capability major version (``sm`` / 10) in NCCL files -> GPU name.
_SM_MAJOR = {7: "v100", 8: "a100", 9: "h100", 10: "b200"}

_NVLINK_KINDS = ("nvlink-mesh", "nvswitch", "pcie")


def _generation(gpu: str) -> GpuGeneration:
    key = str(gpu).strip().lower()
    if key not in GPU_GENERATIONS:
        raise FabricError(
            f"unknown GPU {gpu!r}; known GPUs: {', '.join(GPU_GENERATIONS)} "
            "(or pass nvlink_Bps_per_link)"
        )
    return GPU_GENERATIONS[key]


def _check_overrides(
    nodes: int,
    nvlink_kind: str | None,
    nvlink_Bps_per_link: float | None,
    nic_Bps: float | None,
    pcie_Bps: float | None,
) -> None:
    if isinstance(nodes, bool) or not isinstance(nodes, (int, np.integer)) or nodes < 1:
        raise FabricError(f"nodes must be an integer >= 1, got {nodes!r}")
    if nvlink_kind is not None and nvlink_kind not in _NVLINK_KINDS:
        raise FabricError(
            f"nvlink_kind must be None or one of {', '.join(_NVLINK_KINDS)}, got {nvlink_kind!r}"
        )
    for label, v in (
        ("nvlink_Bps_per_link", nvlink_Bps_per_link),
        ("nic_Bps", nic_Bps),
        ("pcie_Bps", pcie_Bps),
    ):
        if v is not None and not (np.isfinite(v) and v > 0):
            raise FabricError(f"{label} must be a positive number, got {v!r}")


def _gb(x: float) -> str:
    return f"{x / 1e9:g} GB/s"


@dataclass
class _NodeModel:
    """One node as inferred from a file; :func:`_assemble` repeats it."""

    gpus: int
    kind: str
    gpu_Bps: list[float] | None = None  # nvswitch: per GPU
    pair_Bps: np.ndarray | None = None  # nvlink-mesh: G x G, 0 = no NVLink
    host_too: bool = False  # mesh with holes: those pairs go over PCIe
    nic_attach: list[list[int]] = field(default_factory=list)
    #: Socket (root complex) of each GPU where the file tells: the node then
    #: gets its PCIe tree, a switch per NIC and the GPUs it serves.
    gpu_socket: list[int] | None = None
    nic_devices: list[str | None] = field(default_factory=list)
    nic_Bps: list[float] = field(default_factory=list)


def _mesh_or_host(pair: np.ndarray, per_link: float, notes: list[str]) -> tuple[np.ndarray, bool]:
    g = pair.shape[0]
    holes = [
        (i, j) for i in range(g) for j in range(i + 1, g) if pair[i, j] <= 0 or pair[j, i] <= 0
    ]
    if holes:
        shown = ", ".join(f"GPU{i}-GPU{j}" for i, j in holes[:6])
        notes.append(
            f"{len(holes)} GPU pairs have no NVLink ({shown}{', ...' if len(holes) > 6 else ''}); "
            "a PCIe host vertex carries their traffic"
        )
    return pair * per_link, bool(holes)


def _assemble(
    model: _NodeModel, nodes: int, name: str, pcie_Bps: float, info: dict[str, Any]
) -> Fabric:
    g = model.gpus
    b = FabricBuilder(name)
    nics_by_node: list[list[str]] = []
    groups = switch_groups(model.nic_attach, g) if model.gpu_socket is not None else []
    # A switch per NIC group keeps each GPU's own NICs only where every NIC of
    # a group serves every GPU of it; else the tree is left out (noted).
    tree = bool(groups) and bool(model.nic_attach) and all(
        sorted(model.nic_attach[j]) == sorted(gs) for gs, js in groups for j in js)
    if groups and not tree:
        info = {**info, "notes": [*info.get("notes", []),
                                  "NICs serve overlapping GPU sets: PCIe tree not modelled"]}
    if tree:
        assert model.gpu_socket is not None
        dense = {s: i for i, s in enumerate(sorted(set(model.gpu_socket)))}
        socket_of = [dense[model.gpu_socket[min(gs)]] for gs, _ in groups]
        info = {**info, "sockets": len(dense), "pcie_switches": len(groups)}
    for n in range(nodes):
        add_gpus(b, n, g)
        if model.kind == "nvswitch":
            assert model.gpu_Bps is not None
            add_nvswitch(b, n, g, model.gpu_Bps)
        elif model.kind == "nvlink-mesh":
            assert model.pair_Bps is not None
            add_nvlink_mesh(b, n, g, model.pair_Bps)
            if model.host_too and not tree:
                add_pcie_host(b, n, g, pcie_Bps)
        elif model.kind == "pcie" and not tree:
            add_pcie_host(b, n, g, pcie_Bps)
        nics = add_nics(b, n, model.nic_attach, pcie_Bps, gpu_links=not tree)
        nics_by_node.append(nics)
        if tree:
            add_pcie_tree(b, n, [(gs, [nics[j] for j in js]) for gs, js in groups], socket_of,
                          pcie_Bps=pcie_Bps, uplink_Bps=pcie_Bps)
    if model.nic_attach:
        add_rails(b, nics_by_node, model.nic_Bps)

    nic_names: dict[str, str] = {}
    gpu_nic: dict[str, Any] = {}
    nic_rate: dict[str, float] = {}
    for n in range(nodes):
        for j, (gpus, dev) in enumerate(zip(model.nic_attach, model.nic_devices, strict=True)):
            nic_rate[nic_name(n, j)] = float(model.nic_Bps[j])
            if dev is None:
                continue
            nic_names[nic_name(n, j)] = dev
            for i in gpus:
                key = gpu_name(n, i)
                if key not in gpu_nic:
                    gpu_nic[key] = dev
                elif isinstance(gpu_nic[key], list):
                    gpu_nic[key].append(dev)
                else:
                    gpu_nic[key] = [gpu_nic[key], dev]
    disc = {
        **info,
        "gpus_per_node": g,
        "nvlink_kind": model.kind,
        "nics": len(model.nic_attach),
        "nic_names": nic_names,
        "gpu_nic": gpu_nic,
        "nic_Bps": nic_rate,
        "pcie_Bps": float(pcie_Bps),
    }
    if model.gpu_Bps is not None:
        disc["nvlink_gpu_Bps"] = [float(x) for x in model.gpu_Bps]
    if model.pair_Bps is not None:
        disc["nvlink_pair_Bps"] = model.pair_Bps.tolist()
    # Provenance first, so a saved file says up front where the fabric came from.
    ordered = {k: disc[k] for k in ("source", "file") if k in disc}
    ordered.update({k: v for k, v in disc.items() if k not in ordered})
    return b.build(meta={"discovery": ordered})


def _smi_sockets(topo: _nvsmi.SmiTopology) -> list[int]:
    """Socket of each GPU from ``nvidia-smi topo -m`` cells.

    Two GPUs share a socket when some NIC is not ``SYS`` (across the SMP
    interconnect) from either of them, or their own cell is a PCIe code below
    ``SYS``; sockets are numbered by their lowest GPU.
    """
    g = len(topo.gpu_labels)
    parent = list(range(g))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    def join(i: int, j: int) -> None:
        a, c = root(i), root(j)
        parent[max(a, c)] = min(a, c)

    for k in range(len(topo.nic_labels)):
        near = [i for i in range(g) if topo.gpu_nic[i][k] in ("PIX", "PXB", "PHB", "NODE")]
        for i in near[1:]:
            join(near[0], i)
    for i in range(g):
        for j in range(g):
            if topo.gpu_gpu[i][j] in ("PIX", "PXB", "PHB", "NODE"):
                join(i, j)
    roots = sorted({root(i) for i in range(g)})
    return [roots.index(root(i)) for i in range(g)]


def _pick_kind(gpus: int, nvlink_kind: str | None, has_nvlink: bool, switched: bool) -> str:
    """The node's NVLink kind: asked for, or inferred from what the file shows."""
    if gpus == 1:
        return "none"
    if nvlink_kind == "pcie" or (nvlink_kind is None and not has_nvlink):
        return "pcie"
    if nvlink_kind == "nvswitch" or (nvlink_kind is None and switched):
        return "nvswitch"
    return "nvlink-mesh"


@dataclass(frozen=True)
class _Reading:
    """What a reader found besides the node model, for ``meta["discovery"]``."""

    info: dict[str, Any]  # source, file
    gen: GpuGeneration
    per_link_Bps: float
    skipped: list[tuple[str, str]]  # (NIC device, why it was left out)
    notes: list[str]


def _finish(model: _NodeModel, nodes: int, name: str, pcie_Bps: float | None,
            reading: _Reading) -> Fabric:
    """Note and warn of the NICs left out, then build the fabric."""
    notes = reading.notes
    for dev, reason in reading.skipped:
        notes.append(f"left out NIC {dev}: {reason}")
    for dev, reason in reading.skipped:
        # stacklevel 3: point at the caller of from_nvidia_smi / from_nccl_xml.
        warnings.warn(f"NIC {dev} left out of the fabric: {reason}", DiscoveryWarning, stacklevel=3)
    info = {
        **reading.info,
        "gpu": reading.gen.name,
        "nvlink_generation": reading.gen.nvlink,
        "nvlink_Bps_per_link": reading.per_link_Bps,
        "skipped_nics": [dev for dev, _ in reading.skipped],
        "notes": notes,
    }
    pcie = float(pcie_Bps) if pcie_Bps else PCIE_GEN5_X16_Bps
    return _assemble(model, nodes, name, pcie, info)


def _require_network(model: _NodeModel, nodes: int, what: str) -> None:
    if nodes > 1 and not model.nic_attach:
        raise FabricError(f"nodes={nodes} needs NICs for inter-node paths, but {what}")


def _read_file(p: Path) -> bytes:
    try:
        return read_input(p, "topology file")
    except OSError as exc:
        raise FabricFileError(f"cannot read: {exc.strerror or exc}", path=str(p)) from None
    except InputError as exc:
        raise FabricFileError(str(exc)) from None


# ------------------------------------------------------------- nvidia-smi
def _read_text(text: str | os.PathLike[str]) -> tuple[str, str | None]:
    if isinstance(text, os.PathLike):
        p = Path(text)
        return _read_file(p).decode("utf-8", errors="replace"), str(p)
    return str(text), None


def from_nvidia_smi(
    text: str | os.PathLike[str],
    nodes: int = 1,
    *,
    gpu: str = "h100",
    nvlink_kind: str | None = None,
    nvlink_Bps_per_link: float | None = None,
    nic_Bps: float | None = None,
    pcie_Bps: float | None = None,
    nics_per_gpu: int | None = None,
    name: str | None = None,
) -> Fabric:
    """A fabric of ``nodes`` identical nodes from ``nvidia-smi topo -m`` output.

    How the matrix is read:

    * ``NV<n>`` cells count bonded NVLinks. If no GPU's row adds up to more
      links than its generation has (``v100`` 6, ``a100`` 12, ``h100`` 18,
      ``b200`` 18), the GPUs are wired directly: a mesh where each pair with
      ``NV<n>`` gets ``n x`` the per-link bandwidth. Otherwise the links are
      NVSwitch ports (``NV18`` to all 7 peers of an H100 is an HGX board):
      each GPU gets ``max n in its row x`` per-link to the NVSwitch. GPU pairs
      of a mesh with no NVLink talk over a PCIe host vertex. No ``NV`` cell at
      all means a PCIe-only node.
    * A NIC serves the GPUs whose cell is ``PIX`` (or, if none, ``PXB``); a
      NIC with neither (storage, management) is left out with a
      :class:`DiscoveryWarning`. NICs keep column order: the ``k``-th kept
      NIC is ``n{node}.nic{k}`` on ``rail{k}``.
    * The text gives no NIC speed: NDR400 (50 GB/s) is assumed unless
      ``nic_Bps`` says otherwise.

    Parameters
    ----------
    text
        The output itself, or a path (:class:`os.PathLike`) to a file holding
        it. Tabs or runs of two or more spaces separate the columns.
    nodes
        How many identical nodes.
    gpu
        GPU name, for NVLink figures: ``v100``, ``a100``, ``h100``, ``h200``,
        ``gh200``, ``b200``, ``gb200``.
    nvlink_kind
        Force ``"nvlink-mesh"``, ``"nvswitch"`` or ``"pcie"`` instead of
        inferring it.
    nvlink_Bps_per_link, nic_Bps, pcie_Bps
        Override NVLink bandwidth per link, NIC line rate and GPU-NIC (and
        GPU-host) PCIe capacity, all per direction in bytes/s.
    nics_per_gpu
        Only for output without NIC columns (e.g. a GH200 node): assume this
        many NICs per GPU, NIC ``j`` serving GPU ``j // nics_per_gpu``.
        Without it such output gives a single node only.
    name
        Fabric name; default ``nvidia-smi-<gpu>-<nodes>x<G>``.

    Returns
    -------
    Fabric
        With discovery notes in ``meta["discovery"]`` (see the module doc).

    Raises
    ------
    FabricFileError
        Malformed text: no header, a ragged row, an unknown cell (the row,
        column and cell are named).
    FabricError
        Unknown ``gpu``, bad overrides, or ``nodes > 1`` without NICs.

    Examples
    --------
    >>> from pathweave.fabric import from_nvidia_smi
    >>> text = '''
    ...         GPU0    GPU1    NIC0    NIC1    CPU Affinity    NUMA Affinity
    ... GPU0     X      NV4     PIX     SYS     0-15            0
    ... GPU1    NV4      X      SYS     PIX     16-31           1
    ... NIC0    PIX     SYS      X      SYS
    ... NIC1    SYS     PIX     SYS      X
    ...
    ... NIC Legend:
    ...
    ...   NIC0: mlx5_0
    ...   NIC1: mlx5_1
    ... '''
    >>> fab = from_nvidia_smi(text, nodes=2, gpu="a100")
    >>> fab.nvlink_kind, fab.num_ranks, fab.rails
    ('nvlink-mesh', 4, ('rail0', 'rail1'))
    >>> float(fab.capacity_Bps[fab.link_id("n0.gpu0", "n0.gpu1")]) / 1e9
    100.0
    >>> fab.meta["discovery"]["gpu_nic"]["n1.gpu1"]
    'mlx5_1'
    """
    _check_overrides(nodes, nvlink_kind, nvlink_Bps_per_link, nic_Bps, pcie_Bps)
    gen = _generation(gpu)
    raw, source = _read_text(text)
    topo = _nvsmi.parse(raw, source)
    _smi_check_columns(topo, source)
    notes = list(topo.notes)
    g = len(topo.gpu_labels)
    per_link = float(nvlink_Bps_per_link) if nvlink_Bps_per_link else gen.link_Bps
    counts = np.array(
        [[_nvsmi.nv_count(c) for c in row] for row in topo.gpu_gpu], dtype=float
    ).reshape(g, g)
    model = _NodeModel(gpus=g, kind="none")
    _smi_nvlink(model, counts, nvlink_kind, gen, per_link, notes)
    skipped = _smi_network(model, topo, nodes, nics_per_gpu, notes)
    rate = float(nic_Bps) if nic_Bps else NDR400_Bps
    if model.nic_attach and not nic_Bps:
        notes.append(f"nvidia-smi topo -m does not report NIC speed: assumed NDR400, {_gb(rate)}")
    model.nic_Bps = [rate] * len(model.nic_attach)
    info = {"source": "nvidia-smi topo -m", "file": source}
    return _finish(model, nodes, name or f"nvidia-smi-{gen.name}-{nodes}x{g}", pcie_Bps,
                   _Reading(info, gen, per_link, skipped, notes))


def _smi_check_columns(topo: _nvsmi.SmiTopology, source: str | None) -> None:
    g = len(topo.gpu_labels)
    for i, label in enumerate(topo.gpu_labels):
        if label != f"GPU{i}":
            raise FabricFileError(
                f"GPU columns must be GPU0..GPU{g - 1} in order, found {label!r} at position {i}",
                path=source,
                key="header",
            )


def _smi_nvlink(model: _NodeModel, counts: np.ndarray, nvlink_kind: str | None,
                gen: GpuGeneration, per_link: float, notes: list[str]) -> None:
    """Set the node's NVLink kind and capacities from the ``NV<n>`` counts."""
    any_nv = bool(counts.any())
    row_sum = counts.sum(axis=1)
    model.kind = _pick_kind(model.gpus, nvlink_kind, any_nv, bool((row_sum > gen.max_links).any()))
    if model.kind == "none":
        notes.append("one GPU per node: no intra-node links")
    elif model.kind == "pcie":
        notes.append(
            "nvlink_kind='pcie' requested"
            if nvlink_kind
            else "no NV# cells: GPUs talk over PCIe through a host vertex"
        )
    elif model.kind == "nvswitch" and any_nv:
        per_gpu = counts.max(axis=1)
        if (per_gpu == 0).any():
            lonely = [f"GPU{i}" for i in np.flatnonzero(per_gpu == 0).tolist()]
            raise FabricError(
                f"{', '.join(lonely)} have no NVLink while other GPUs reach an NVSwitch; "
                "pass nvlink_kind='pcie' or 'nvlink-mesh' to model this node"
            )
        model.gpu_Bps = (per_gpu * per_link).tolist()
        if nvlink_kind is None:
            notes.append(
                f"NVLink counts per GPU row add up to {int(row_sum.max())} > the "
                f"{gen.max_links} links of one {gen.name}: links go through NVSwitch; "
                f"per-GPU capacity = max NV# in the row x {_gb(per_link)}"
            )
    elif model.kind == "nvswitch":
        model.gpu_Bps = [gen.max_links * per_link] * model.gpus
        notes.append(
            f"no NV# cells; nvlink_kind='nvswitch' requested: assumed {gen.max_links} "
            f"{gen.nvlink} links of {_gb(per_link)} per GPU"
        )
    elif not any_nv:
        raise FabricError(
            "nvlink_kind='nvlink-mesh' needs NV# cells to size the pairs; "
            "this output has none (use 'nvswitch' or 'pcie')"
        )
    else:
        model.pair_Bps, model.host_too = _mesh_or_host(counts, per_link, notes)
        if nvlink_kind is None:
            notes.append(
                f"NVLink counts per GPU row add up to at most {int(row_sum.max())} <= "
                f"{gen.max_links} links of one {gen.name}: a direct mesh; "
                f"pair capacity = NV# x {_gb(per_link)}"
            )


def _smi_assumed_nics(model: _NodeModel, topo: _nvsmi.SmiTopology, nics_per_gpu: int,
                      notes: list[str]) -> None:
    """``nics_per_gpu`` NICs per GPU, for output without NIC columns."""
    if isinstance(nics_per_gpu, bool) or int(nics_per_gpu) != nics_per_gpu or nics_per_gpu < 1:
        raise FabricError(f"nics_per_gpu must be an integer >= 1, got {nics_per_gpu!r}")
    if topo.nic_labels:
        raise FabricError(
            f"nics_per_gpu applies to output without NIC columns; this one lists "
            f"{len(topo.nic_labels)} NICs ({', '.join(topo.nic_devices)})"
        )
    k = int(nics_per_gpu)
    g = model.gpus
    model.nic_attach = [[j // k] for j in range(g * k)]
    model.nic_devices = [None] * (g * k)
    notes.append(
        f"no NIC columns: assumed {k} NIC(s) per GPU (nics_per_gpu={k}), "
        "NIC j serving GPU j // nics_per_gpu"
    )


def _smi_listed_nics(model: _NodeModel, topo: _nvsmi.SmiTopology,
                     notes: list[str]) -> list[tuple[str, str]]:
    """Attach each NIC column to the GPUs it serves; return the NICs left out."""
    skipped: list[tuple[str, str]] = []
    served_by: list[str] = []
    order = {c: r for r, c in enumerate(_nvsmi.PCIE_CELLS)}
    for k, dev in enumerate(topo.nic_devices):
        cells = [row[k] for row in topo.gpu_nic]
        pix = [i for i, c in enumerate(cells) if c == "PIX"]
        served = pix or [i for i, c in enumerate(cells) if c == "PXB"]
        if not served:
            nearest = min(cells, key=lambda c: order.get(c, 99)) if cells else "none"
            skipped.append((dev, f"no GPU behind the same PCIe switch (nearest GPU is {nearest}); "
                                 "probably a storage or management NIC"))
            continue
        model.nic_attach.append(served)
        model.nic_devices.append(dev)
        served_by.append(f"{topo.nic_labels[k]} ({dev}) " + "+".join(f"GPU{i}" for i in served)
                         + ("" if pix else " (PXB)"))
    if served_by:  # one line for all: a note per NIC was eight lines on every load
        notes.append("NICs serve the GPUs behind their PCIe switch (PIX; PXB where none is): "
                     + ", ".join(served_by))
    return skipped


def _smi_network(model: _NodeModel, topo: _nvsmi.SmiTopology, nodes: int,
                 nics_per_gpu: int | None, notes: list[str]) -> list[tuple[str, str]]:
    """The node's NICs and PCIe tree; return the NICs left out."""
    skipped: list[tuple[str, str]] = []
    if nics_per_gpu is not None:
        _smi_assumed_nics(model, topo, nics_per_gpu, notes)
    else:
        skipped = _smi_listed_nics(model, topo, notes)
    if not topo.nic_labels and nics_per_gpu is None:
        _require_network(
            model,
            nodes,
            "this nvidia-smi output has no NIC columns; pass nics_per_gpu=1 to assume "
            "one NIC per GPU",
        )
    else:
        _require_network(model, nodes, "every NIC in this output was left out")
    if topo.nic_labels and model.nic_attach:
        model.gpu_socket = _smi_sockets(topo)
        notes.append(
            f"PCIe tree: a switch per NIC and the GPUs it serves, "
            f"{len(set(model.gpu_socket))} socket(s) by the NODE/SYS cells; uplinks at the "
            f"GPU-NIC PCIe rate, sockets joined by 4 UPI 2.0 links (128 GB/s) assumed"
        )
    return skipped


# --------------------------------------------------------------- NCCL XML
def _read_xml(path_or_text: str | bytes | os.PathLike[str]) -> tuple[str | bytes, str | None]:
    if isinstance(path_or_text, bytes):
        return path_or_text, None
    if isinstance(path_or_text, str) and path_or_text.lstrip().startswith("<"):
        return path_or_text, None
    p = Path(path_or_text)
    return _read_file(p), str(p)


def from_nccl_xml(
    path_or_text: str | bytes | os.PathLike[str],
    nodes: int = 1,
    *,
    gpu: str | None = None,
    nvlink_kind: str | None = None,
    nvlink_Bps_per_link: float | None = None,
    nic_Bps: float | None = None,
    pcie_Bps: float | None = None,
    name: str | None = None,
) -> Fabric:
    """A fabric of ``nodes`` identical nodes from an NCCL topology XML file.

    How the file is read:

    * GPUs are ``<gpu>`` elements (ordered by ``dev``) or childless
      ``<pci>`` elements of class 0x030200/0x030000 (document order).
    * NICs are ``<net>`` elements of a ``<nic>`` or childless ``<pci>``
      elements of class 0x020700 (InfiniBand) / 0x020000 (Ethernet). Speed
      is the ``speed`` attribute in Mb/s; without one NDR400 (50 GB/s) is
      assumed and noted.
    * ``<nvlink tclass="0x068000">`` links go to NVSwitches: a GPU gets the
      sum of their counts x per-link bandwidth to the NVSwitch. Links with a
      GPU ``tclass`` (0x030200) form a mesh, ``count x`` per-link per pair.
      Per-link bandwidth follows the GPU's ``sm`` (70 V100, 80 A100, 90 H100,
      100 B200) unless ``gpu`` or ``nvlink_Bps_per_link`` says otherwise.
    * No ``<nvlink>`` at all (many hand-written files) is modelled as a PCIe
      node, with a note, unless ``nvlink_kind`` asks for NVLink; then
      ``nvswitch`` assumes the generation's full link count per GPU.
    * A NIC serves the GPU(s) under its innermost shared PCI switch; several
      on one switch pair up in order. A NIC sharing no switch with a GPU is
      left out with a :class:`DiscoveryWarning`. NIC vertices are numbered in
      the order of the GPUs they serve, so with one NIC per GPU, GPU ``i``'s
      NIC is ``n{node}.nic{i}`` on ``rail{i}``.

    Parameters
    ----------
    path_or_text
        A path, or the XML itself (a string starting with ``<``, or bytes).
    nodes
        How many identical nodes.
    gpu
        GPU name (see :func:`from_nvidia_smi`) overriding the one implied by
        ``sm``; with neither, ``h100`` is assumed and noted.
    nvlink_kind, nvlink_Bps_per_link, nic_Bps, pcie_Bps, name
        As for :func:`from_nvidia_smi`.

    Returns
    -------
    Fabric
        With discovery notes in ``meta["discovery"]`` (see the module doc).

    Raises
    ------
    UnsafeXMLError
        The document declares a DTD, entities or external references.
    FabricFileError
        Malformed XML (with line and column), no GPU, bad attributes.
    FabricError
        Bad overrides, or ``nodes > 1`` with no usable NIC.

    Examples
    --------
    >>> from pathweave.fabric import from_nccl_xml
    >>> xml = '''<system version="1"><cpu numaid="0">
    ...   <pci busid="0000:10:00.0" class="0x060400">
    ...     <pci busid="0000:11:00.0" class="0x020700">
    ...       <nic><net name="mlx5_0" dev="0" speed="400000"/></nic></pci>
    ...     <pci busid="0000:12:00.0" class="0x030200">
    ...       <gpu dev="0" sm="90"><nvlink target="0000:99:00.0" count="18"
    ...                                    tclass="0x068000"/></gpu></pci>
    ...   </pci></cpu></system>'''
    >>> fab = from_nccl_xml(xml, nodes=2)
    >>> fab.num_ranks, fab.rails
    (2, ('rail0',))
    >>> fab.meta["discovery"]["gpu_nic"]["n0.gpu0"], fab.meta["discovery"]["nic_Bps"]["n0.nic0"]
    ('mlx5_0', 50000000000.0)
    """
    _check_overrides(nodes, nvlink_kind, nvlink_Bps_per_link, nic_Bps, pcie_Bps)
    data, source = _read_xml(path_or_text)
    topo = _nccl_xml.parse(data, source)
    notes = list(topo.notes)
    g = len(topo.gpus)
    gen = _generation(gpu) if gpu is not None else _xml_generation(topo, notes)
    per_link = float(nvlink_Bps_per_link) if nvlink_Bps_per_link else gen.link_Bps
    model = _NodeModel(gpus=g, kind="none")
    _xml_nvlink(model, *_xml_link_counts(topo, notes), nvlink_kind, gen, per_link, notes)
    skipped = _xml_nics(model, topo, nic_Bps, notes)
    _require_network(
        model,
        nodes,
        "the file has no NIC that shares a PCI switch with a GPU"
        + (f" (left out: {', '.join(d for d, _ in skipped)})" if skipped else ""),
    )
    info = {"source": "nccl topology xml", "file": source}
    return _finish(model, nodes, name or f"nccl-xml-{nodes}x{g}", pcie_Bps,
                   _Reading(info, gen, per_link, skipped, notes))


def _xml_generation(topo: _nccl_xml.XmlTopology, notes: list[str]) -> GpuGeneration:
    """The GPU generation implied by the GPUs' ``sm`` (h100 where it says none)."""
    sms = [x.sm for x in topo.gpus if x.sm is not None]
    guess = _SM_MAJOR.get(sms[0] // 10) if sms else None
    if guess is None:
        notes.append(
            ("GPU generation not in the file (no sm attribute)" if not sms
             else f"unknown GPU sm={sms[0]}")
            + "; assumed h100 (NVLink4, 25 GB/s per link, 18 links)"
        )
        return _H100
    if len(set(sms)) > 1:
        notes.append(f"GPUs report different sm values {sorted(set(sms))}; used {sms[0]}")
    return GPU_GENERATIONS[guess]


def _xml_link_counts(topo: _nccl_xml.XmlTopology,
                     notes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """NVLinks per GPU to NVSwitches (G,) and between GPU pairs (G, G)."""
    g = len(topo.gpus)
    by_busid = {x.busid: i for i, x in enumerate(topo.gpus) if x.busid}
    switch_links = np.zeros(g)
    direct = np.zeros((g, g))
    for i, x in enumerate(topo.gpus):
        for target, count, tclass in x.nvlinks:
            if tclass == _nccl_xml.NVSWITCH_TCLASS:
                switch_links[i] += count
            elif tclass in _nccl_xml.GPU_TCLASSES or (tclass is None and target in by_busid):
                if target not in by_busid:
                    notes.append(f"GPU {i}: NVLink to unknown GPU {target} ignored")
                    continue
                direct[i, by_busid[target]] += count
            else:
                notes.append(
                    f"GPU {i}: NVLink to {target} "
                    f"(tclass {tclass if tclass is None else hex(tclass)}) "
                    "is neither a GPU nor an NVSwitch; ignored"
                )
    return switch_links, direct


def _xml_nvlink(model: _NodeModel, switch_links: np.ndarray, direct: np.ndarray,
                nvlink_kind: str | None, gen: GpuGeneration, per_link: float,
                notes: list[str]) -> None:
    """Set the node's NVLink kind and capacities from the link counts."""
    has_switch = bool(switch_links.any())
    has_direct = bool(direct.any())
    model.kind = _pick_kind(model.gpus, nvlink_kind, has_switch or has_direct, has_switch)
    if model.kind == "none":
        notes.append("one GPU per node: no intra-node links")
    elif model.kind == "pcie":
        if nvlink_kind is None:
            notes.append(
                "the file does not describe NVLink (no <nvlink> elements): modelled as "
                "PCIe through a host vertex; pass nvlink_kind='nvswitch' or 'nvlink-mesh' "
                "if the GPUs have NVLink"
            )
    elif model.kind == "nvswitch":
        _xml_nvswitch(model, switch_links, direct, gen, per_link, notes)
    elif has_direct:
        model.pair_Bps, model.host_too = _mesh_or_host(direct, per_link, notes)
        notes.append(f"direct GPU-GPU NVLinks: pair capacity = count x {_gb(per_link)}")
    elif has_switch:
        caps = switch_links * per_link
        model.pair_Bps = np.minimum.outer(caps, caps)
        np.fill_diagonal(model.pair_Bps, 0.0)
        notes.append(
            "nvlink_kind='nvlink-mesh' requested on NVSwitch links: each pair gets the "
            "smaller of the two GPUs' NVSwitch capacity"
        )
    else:
        raise FabricError(
            "nvlink_kind='nvlink-mesh' needs NVLink counts to size the pairs; this file "
            "has none (use 'nvswitch' or 'pcie')"
        )


def _xml_nvswitch(model: _NodeModel, switch_links: np.ndarray, direct: np.ndarray,
                  gen: GpuGeneration, per_link: float, notes: list[str]) -> None:
    if switch_links.any():
        if (switch_links == 0).any():
            lonely = np.flatnonzero(switch_links == 0).tolist()
            raise FabricError(
                f"GPUs {lonely} have no NVLink to an NVSwitch while the others do; "
                "pass nvlink_kind='pcie' to model this node"
            )
        model.gpu_Bps = (switch_links * per_link).tolist()
        notes.append(
            f"NVLinks go to NVSwitches (tclass 0x068000): per-GPU capacity = "
            f"sum of counts ({', '.join(str(int(c)) for c in switch_links)}) "
            f"x {_gb(per_link)}"
        )
        if direct.any():
            notes.append("direct GPU-GPU NVLinks next to NVSwitch links ignored")
    elif direct.any():
        model.gpu_Bps = (direct.max(axis=1) * per_link).tolist()
        notes.append("nvlink_kind='nvswitch' requested: per-GPU capacity = max pair count")
    else:
        model.gpu_Bps = [gen.max_links * per_link] * model.gpus
        notes.append(
            f"no NVLink counts in the file; nvlink_kind='nvswitch' requested: assumed "
            f"{gen.max_links} {gen.nvlink} links x {_gb(per_link)} per GPU"
        )


def _xml_nics(model: _NodeModel, topo: _nccl_xml.XmlTopology, nic_Bps: float | None,
              notes: list[str]) -> list[tuple[str, str]]:
    """The node's NICs, their rates and PCIe tree; return the NICs left out."""
    attached, left_out = _nccl_xml.pair_nics(topo)
    if attached and all(x.socket >= 0 for x in topo.gpus):
        model.gpu_socket = [x.socket for x in topo.gpus]
        notes.append(
            f"PCIe tree from the <cpu>/<pci> nesting: a switch per NIC and the GPUs it "
            f"serves, {len(set(model.gpu_socket))} socket(s); uplinks at the GPU-NIC PCIe "
            f"rate, sockets joined by 4 UPI 2.0 links (128 GB/s) assumed"
        )
    unrated: dict[str, list[str]] = {}
    for nic, gpus_served in attached:
        model.nic_attach.append(gpus_served)
        model.nic_devices.append(nic.device)
        if nic_Bps:
            model.nic_Bps.append(float(nic_Bps))
        elif nic.speed_mbps is not None:
            model.nic_Bps.append(nic.speed_mbps * 1e6 / 8)
        else:
            model.nic_Bps.append(NDR400_Bps)
            kind = {_nccl_xml.IB_CLASS: "InfiniBand", _nccl_xml.ETHERNET_CLASS: "Ethernet"}.get(
                nic.pci_class or -1, "unclassified"
            )
            unrated.setdefault(kind, []).append(nic.device)
    for kind, devices in unrated.items():  # one line per class, not one per NIC
        notes.append(f"{len(devices)} {kind} NIC{'s' if len(devices) > 1 else ''} without a "
                     f"speed attribute ({', '.join(devices)}): assumed NDR400, "
                     f"{_gb(NDR400_Bps)}")
    return [
        (n.device, "shares no PCI switch with a GPU; probably a storage or management NIC")
        for n in left_out
    ]
