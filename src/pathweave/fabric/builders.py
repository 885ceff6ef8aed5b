"""Builders that compose fabrics from nodes, NICs, rails and spines.

The builders encode the vertex and link naming every other part of pathweave
relies on:

============  ====================  ==========================================
vertex        name                  links (each direction a separate link)
============  ====================  ==========================================
GPU           ``n{node}.gpu{i}``    NVLink to peers (mesh) or to the NVSwitch
NVSwitch      ``n{node}.nvswitch``  one up and one down link per GPU
PCIe host     ``n{node}.host``      one PCIe link each way per GPU
PCIe switch   ``n{node}.pcie{k}``   PCIe to its GPUs and NICs, uplink to a CPU
root complex  ``n{node}.cpu{s}``    uplinks of its switches, inter-socket links;
                                    a Grace CPU: NVLink-C2C to its GPUs, PCIe
                                    to its NICs (:func:`grace_rack`)
NIC           ``n{node}.nic{j}``    PCIe to its GPU(s) or switch, network to
                                    its rail
rail switch   ``rail{j}``           network to NIC ``j`` of every node
spine         ``spine{k}``          network to every rail switch
============  ====================  ==========================================

Defaults (documented figures, overridable everywhere):

* NVLink 4 (H100): 25 GB/s per link per direction; 18 links per GPU, so an
  NVSwitch port carries 450 GB/s per direction. NVLink 3 (A100): 12 links
  of 25 GB/s, 300 GB/s; NVLink 5 (B200, GB200): 18 links of 50 GB/s,
  900 GB/s.
* NDR400 InfiniBand: 400 Gb/s = 50 GB/s line rate per direction; HDR200
  (ConnectX-6): 25 GB/s.
* PCIe Gen5 x16 between a GPU and its NIC: 32 GT/s x 16 lanes x 128/130
  encoding / 8 = 63.0 GB/s per direction.
* A PCIe switch's uplink to its root complex: PCIe Gen5 x16 as well.
* The inter-socket link of two Xeon Scalable 4th gen (Sapphire Rapids)
  sockets: 4 UPI 2.0 links x 16 GT/s x 2 bytes per transfer per direction
  = 128 GB/s per direction.
* The inter-socket link of two AMD EPYC 7002 (Rome) sockets: 4 xGMI-2
  links x 16 lanes x 18 GT/s / 8 = 144 GB/s per direction.
* NVLink-C2C between a Grace CPU and its GPUs (GB200): 900 GB/s both
  directions together, 450 GB/s per direction.
* Latencies: 1 us per NVLink or PCIe hop, 1 us per network hop (NIC to
  switch, switch to NIC), 1 us per spine hop.

Without ``pcie_tree`` a NIC joins its GPUs by one PCIe link each (the PCIe
switch between them folded away); with it the node gets its PCIe tree: one
switch per group of GPUs and NICs that share one, each switch's uplink to
the root complex of its socket, and the sockets joined by their
inter-socket link. Sources of every figure: docs/fabric-schema.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from pathweave.errors import FabricError
from pathweave.fabric._core import Fabric, LinkKind, VertexKind

NVLINK4_LINK_Bps = 25e9
NVSWITCH_H100_GPU_Bps = 18 * NVLINK4_LINK_Bps  # 450 GB/s
NVLINK3_LINK_Bps = 25e9
NVSWITCH_A100_GPU_Bps = 12 * NVLINK3_LINK_Bps  # 300 GB/s
NVLINK5_LINK_Bps = 50e9
NVSWITCH_B200_GPU_Bps = 18 * NVLINK5_LINK_Bps  # 900 GB/s
NDR400_Bps = 400e9 / 8  # 50 GB/s
HDR200_Bps = 200e9 / 8  # 25 GB/s
PCIE_GEN5_X16_Bps = 32e9 * 16 * (128 / 130) / 8  # 63.0 GB/s
PCIE_GEN4_X16_Bps = 16e9 * 16 * (128 / 130) / 8  # 31.5 GB/s
UPI2_SPR_Bps = 4 * 16e9 * 2  # 4 UPI 2.0 links at 16 GT/s, 2 bytes a transfer: 128 GB/s
XGMI2_ROME_Bps = 4 * 16 * 18e9 / 8  # 4 xGMI-2 links x16 at 18 GT/s: 144 GB/s
NVLINK_C2C_Bps = 900e9 / 2  # NVLink-C2C, 900 GB/s both directions together: 450 GB/s
DEFAULT_LATENCY_S = 1e-6

NodeKind = Literal["nvlink-mesh", "nvswitch", "pcie"]


class FabricBuilder:
    """Accumulates vertices and links, then builds a validated :class:`Fabric`.

    Examples
    --------
    >>> from pathweave.fabric.builders import FabricBuilder
    >>> from pathweave.fabric import VertexKind, LinkKind
    >>> b = FabricBuilder("two-gpus")
    >>> a = b.vertex("n0.gpu0", VertexKind.GPU, node=0)
    >>> c = b.vertex("n0.gpu1", VertexKind.GPU, node=0)
    >>> b.duplex("n0.gpu0", "n0.gpu1", 100e9, LinkKind.NVLINK)
    >>> fab = b.build()
    >>> fab.num_ranks, fab.num_links
    (2, 2)
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._names: list[str] = []
        self._kind: list[int] = []
        self._node: list[int] = []
        self._index: dict[str, int] = {}
        self._links: dict[tuple[int, int], tuple[int, float, float]] = {}

    def vertex(self, name: str, kind: VertexKind, node: int = -1) -> int:
        """Add a vertex and return its id; a duplicate name is an error."""
        if name in self._index:
            raise FabricError(f"duplicate vertex name {name!r}")
        self._index[name] = len(self._names)
        self._names.append(name)
        self._kind.append(int(kind))
        self._node.append(int(node))
        return self._index[name]

    def has_vertex(self, name: str) -> bool:
        return name in self._index

    def _vid(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise FabricError(f"unknown vertex {name!r}") from None

    def link(
        self,
        src: str,
        dst: str,
        capacity_Bps: float,
        kind: LinkKind,
        latency_s: float = DEFAULT_LATENCY_S,
    ) -> None:
        """Add the directed link ``src -> dst``; a duplicate is an error."""
        key = (self._vid(src), self._vid(dst))
        if key in self._links:
            raise FabricError(f"duplicate link {src} -> {dst}")
        self._links[key] = (int(kind), float(capacity_Bps), float(latency_s))

    def duplex(
        self,
        a: str,
        b: str,
        capacity_Bps: float,
        kind: LinkKind,
        latency_s: float = DEFAULT_LATENCY_S,
    ) -> None:
        """Add both directions of a full-duplex cable with the same capacity."""
        self.link(a, b, capacity_Bps, kind, latency_s)
        self.link(b, a, capacity_Bps, kind, latency_s)

    def build(self, meta: Mapping[str, Any] | None = None) -> Fabric:
        keys = list(self._links)
        vals = [self._links[k] for k in keys]
        return Fabric(
            name=self.name,
            vertex_names=self._names,
            vertex_kind=self._kind,
            vertex_node=self._node,
            link_src=np.array([k[0] for k in keys], dtype=np.int32),
            link_dst=np.array([k[1] for k in keys], dtype=np.int32),
            link_kind=np.array([v[0] for v in vals], dtype=np.int8),
            capacity_Bps=np.array([v[1] for v in vals], dtype=np.float64),
            latency_s=np.array([v[2] for v in vals], dtype=np.float64),
            meta=meta,
        )


def gpu_name(node: int, local: int) -> str:
    return f"n{node}.gpu{local}"


def nic_name(node: int, j: int) -> str:
    return f"n{node}.nic{j}"


def add_gpus(b: FabricBuilder, node: int, gpus: int) -> None:
    for i in range(gpus):
        b.vertex(gpu_name(node, i), VertexKind.GPU, node)


def add_nvlink_mesh(
    b: FabricBuilder,
    node: int,
    gpus: int,
    pair_Bps: float | np.ndarray,
    latency_s: float = DEFAULT_LATENCY_S,
) -> None:
    """Full-mesh NVLink between the GPUs of ``node``.

    ``pair_Bps`` is the capacity of each GPU pair per direction, a scalar or
    a ``gpus x gpus`` matrix (zero where two GPUs have no NVLink).
    """
    cap = np.broadcast_to(np.asarray(pair_Bps, dtype=float), (gpus, gpus))
    for i in range(gpus):
        for j in range(gpus):
            if i != j and cap[i, j] > 0:
                b.link(gpu_name(node, i), gpu_name(node, j), cap[i, j], LinkKind.NVLINK, latency_s)


def add_nvswitch(
    b: FabricBuilder,
    node: int,
    gpus: int,
    gpu_Bps: float | Sequence[float],
    latency_s: float = DEFAULT_LATENCY_S,
) -> None:
    """One NVSwitch vertex per node with an up and a down link per GPU.

    The NVSwitch planes of a real baseboard are merged into one vertex: every
    GPU spreads its links evenly over the planes, so the merge preserves each
    GPU's injection and ejection capacity, which is what limits traffic.
    """
    sw = f"n{node}.nvswitch"
    b.vertex(sw, VertexKind.NVSWITCH, node)
    caps = np.broadcast_to(np.asarray(gpu_Bps, dtype=float), (gpus,))
    for i in range(gpus):
        b.duplex(gpu_name(node, i), sw, caps[i], LinkKind.NVLINK, latency_s)


def add_pcie_host(
    b: FabricBuilder,
    node: int,
    gpus: int,
    gpu_Bps: float = PCIE_GEN5_X16_Bps,
    latency_s: float = DEFAULT_LATENCY_S,
) -> None:
    """GPUs without NVLink: GPU-GPU traffic crosses the PCIe host ``n{node}.host``."""
    host = f"n{node}.host"
    b.vertex(host, VertexKind.HOST, node)
    for i in range(gpus):
        b.duplex(gpu_name(node, i), host, gpu_Bps, LinkKind.PCIE, latency_s)


def add_nics(
    b: FabricBuilder,
    node: int,
    attach: Sequence[Sequence[int]],
    pcie_Bps: float = PCIE_GEN5_X16_Bps,
    latency_s: float = DEFAULT_LATENCY_S,
    names: Sequence[str] | None = None,
    gpu_links: bool = True,
) -> list[str]:
    """NICs of ``node``; ``attach[j]`` lists the local GPUs NIC ``j`` serves.

    Each NIC joins each of its GPUs with a PCIe link per direction (GPUDirect
    RDMA), unless ``gpu_links`` is false: then the caller puts the NICs in a
    PCIe tree (:func:`add_pcie_tree`). Returns the NIC names.
    """
    out = []
    for j, gpus in enumerate(attach):
        name = names[j] if names is not None else nic_name(node, j)
        b.vertex(name, VertexKind.NIC, node)
        if len(gpus) == 0:
            raise FabricError(f"NIC {name} is attached to no GPU")
        for g in gpus if gpu_links else ():
            b.duplex(gpu_name(node, g), name, pcie_Bps, LinkKind.PCIE, latency_s)
        out.append(name)
    return out


def pcie_switch_name(node: int, k: int) -> str:
    return f"n{node}.pcie{k}"


def cpu_name(node: int, s: int) -> str:
    return f"n{node}.cpu{s}"


def add_pcie_tree(
    b: FabricBuilder,
    node: int,
    switches: Sequence[tuple[Sequence[int], Sequence[str]]],
    socket_of: Sequence[int],
    *,
    pcie_Bps: float = PCIE_GEN5_X16_Bps,
    uplink_Bps: float = PCIE_GEN5_X16_Bps,
    intersocket_Bps: float = UPI2_SPR_Bps,
    latency_s: float = DEFAULT_LATENCY_S,
) -> None:
    """The PCIe tree of ``node``: switches, root complexes, inter-socket links.

    ``switches[k] = (gpus, nics)``: the local GPU indices and the (existing)
    NIC vertices under PCIe switch ``n{node}.pcie{k}``, each joined to it by
    a ``pcie_Bps`` link per direction; ``socket_of[k]``: the root complex
    ``n{node}.cpu{s}`` (a :attr:`VertexKind.HOST`) its uplink of
    ``uplink_Bps`` goes to. Every two sockets are joined by ``intersocket_Bps``
    per direction (UPI/xGMI, :attr:`LinkKind.PCIE`: the technology class of
    the node's host fabric).

    Examples
    --------
    >>> from pathweave.fabric.builders import FabricBuilder, add_gpus, add_pcie_tree
    >>> from pathweave.fabric import VertexKind
    >>> b = FabricBuilder("tree")
    >>> add_gpus(b, 0, 2)
    >>> nic = b.vertex("n0.nic0", VertexKind.NIC, 0)
    >>> add_pcie_tree(b, 0, [([0], ["n0.nic0"]), ([1], [])], [0, 1])
    >>> fab = b.build()
    >>> fab.num_links, fab.vertex_name(fab.link_dst[fab.out_links[fab.vertex_id("n0.gpu1")][0]])
    (12, 'n0.pcie1')
    """
    if len(socket_of) != len(switches):
        raise FabricError(f"socket_of has {len(socket_of)} entries for {len(switches)} switches")
    sockets = sorted(set(int(s) for s in socket_of))
    if sockets != list(range(len(sockets))):
        raise FabricError(f"sockets must be numbered 0..S-1 without gaps, got {sockets}")
    for s in sockets:
        b.vertex(cpu_name(node, s), VertexKind.HOST, node)
    for k, ((gpus, nics), s) in enumerate(zip(switches, socket_of, strict=True)):
        sw = pcie_switch_name(node, k)
        b.vertex(sw, VertexKind.PCIE_SWITCH, node)
        for g in gpus:
            b.duplex(gpu_name(node, g), sw, pcie_Bps, LinkKind.PCIE, latency_s)
        for nic in nics:
            b.duplex(nic, sw, pcie_Bps, LinkKind.PCIE, latency_s)
        b.duplex(sw, cpu_name(node, int(s)), uplink_Bps, LinkKind.PCIE, latency_s)
    for a in sockets:
        for c in sockets[a + 1:]:
            b.duplex(cpu_name(node, a), cpu_name(node, c), intersocket_Bps, LinkKind.PCIE,
                     latency_s)


def switch_groups(attach: Sequence[Sequence[int]], gpus: int) -> list[tuple[list[int], list[int]]]:
    """PCIe switches for a NIC attachment: ``(local GPUs, NIC indices)`` each.

    A NIC and the GPUs it serves share a switch; a GPU with several NICs
    has them all under its switch; a GPU without a NIC gets a switch of its
    own.

    >>> switch_groups([[0, 1], [2, 3]], 4)
    [([0, 1], [0]), ([2, 3], [1])]
    >>> switch_groups([[0], [1], [0], [1]], 2)
    [([0], [0, 2]), ([1], [1, 3])]
    >>> switch_groups([], 2)
    [([0], []), ([1], [])]
    """
    groups: list[tuple[list[int], list[int]]] = []
    where: dict[int, int] = {}
    for j, gs in enumerate(attach):
        k = next((where[g] for g in gs if g in where), None)
        if k is None:
            k = len(groups)
            groups.append(([], []))
        for g in gs:
            if g not in where:
                where[g] = k
                groups[k][0].append(g)
        groups[k][1].append(j)
    for g in range(gpus):
        if g not in where:
            where[g] = len(groups)
            groups.append(([g], []))
    return sorted(groups, key=lambda grp: min(grp[0]))


def switch_attachment(gpus: int, nics: int, switches: int) -> list[list[int]]:
    """NIC attachment of ``switches`` PCIe switches per node, each holding an equal block
    of the GPUs and of the NICs; every NIC serves all GPUs of its switch.

    DGX A100: four switches, two GPUs and two NICs each.

    >>> switch_attachment(8, 8, 4)
    [[0, 1], [0, 1], [2, 3], [2, 3], [4, 5], [4, 5], [6, 7], [6, 7]]
    >>> switch_groups(switch_attachment(8, 8, 4), 8)[1]
    ([2, 3], [2, 3])
    """
    if switches < 1 or gpus % switches or nics % switches:
        raise FabricError(f"pcie_switches={switches} must divide both gpus_per_node={gpus} "
                          f"and the NIC count {nics}")
    g, r = gpus // switches, nics // switches
    return [list(range(j // r * g, (j // r + 1) * g)) for j in range(nics)]


def add_grace_hosts(
    b: FabricBuilder,
    node: int,
    groups: Sequence[tuple[Sequence[int], Sequence[str]]],
    *,
    c2c_Bps: float = NVLINK_C2C_Bps,
    pcie_Bps: float = PCIE_GEN5_X16_Bps,
    latency_s: float = DEFAULT_LATENCY_S,
) -> None:
    """Grace CPUs of ``node``: ``groups[s] = (gpus, nics)`` under CPU ``n{node}.cpu{s}``.

    Each GPU joins its CPU by NVLink-C2C (``c2c_Bps`` per direction), the
    link that is PCIe on an x86 node, so it is a :attr:`LinkKind.PCIE` link:
    the GPU's host link, never counted as GPU-to-GPU NVLink. Each NIC hangs
    off a root port of the CPU by ``pcie_Bps``; there is no PCIe switch, so
    GPUDirect RDMA crosses C2C and the CPU (NCCL's ``P2C`` path). The CPUs are
    not joined to each other.

    Examples
    --------
    >>> from pathweave.fabric.builders import FabricBuilder, add_gpus, add_grace_hosts
    >>> from pathweave.fabric import VertexKind
    >>> b = FabricBuilder("superchip")
    >>> add_gpus(b, 0, 2)
    >>> nic = b.vertex("n0.nic0", VertexKind.NIC, 0)
    >>> add_grace_hosts(b, 0, [([0, 1], ["n0.nic0"])])
    >>> b.build().num_links   # 2 GPUs and 1 NIC, each both ways
    6
    """
    for s, (gpus, nics) in enumerate(groups):
        cpu = cpu_name(node, s)
        b.vertex(cpu, VertexKind.HOST, node)
        for g in gpus:
            b.duplex(gpu_name(node, g), cpu, c2c_Bps, LinkKind.PCIE, latency_s)
        for nic in nics:
            b.duplex(nic, cpu, pcie_Bps, LinkKind.PCIE, latency_s)


def add_rails(
    b: FabricBuilder,
    nics_by_node: Sequence[Sequence[str]],
    nic_Bps: float | Sequence[float] = NDR400_Bps,
    latency_s: float = DEFAULT_LATENCY_S,
) -> list[str]:
    """Rail switches: rail ``j`` joins NIC ``j`` of every node (rail-only fabric)."""
    rails = max(len(n) for n in nics_by_node)
    caps = np.broadcast_to(np.asarray(nic_Bps, dtype=float), (rails,))
    names = [f"rail{j}" for j in range(rails)]
    for j in range(rails):
        b.vertex(names[j], VertexKind.RAIL)
    for nics in nics_by_node:
        for j, nic in enumerate(nics):
            b.duplex(nic, names[j], caps[j], LinkKind.NETWORK, latency_s)
    return names


def add_spines(
    b: FabricBuilder,
    rails: Sequence[str],
    spines: int,
    spine_Bps: float,
    latency_s: float = DEFAULT_LATENCY_S,
) -> list[str]:
    """A spine layer: every spine joins every rail switch (rail-optimised fabric)."""
    names = [f"spine{k}" for k in range(spines)]
    for s in names:
        b.vertex(s, VertexKind.SPINE)
        for r in rails:
            b.duplex(r, s, spine_Bps, LinkKind.NETWORK, latency_s)
    return names


def nic_attachment(gpus_per_node: int, nics_per_node: int) -> list[list[int]]:
    """Which local GPUs each NIC serves, spreading NICs evenly over GPUs.

    With as many NICs as GPUs, NIC ``j`` serves GPU ``j``. With fewer NICs,
    consecutive GPUs share one (``G / R`` GPUs per NIC, as on PCIe switches
    that hold two GPUs and one NIC). With more, GPU ``j mod G`` gets several.

    >>> nic_attachment(4, 4)
    [[0], [1], [2], [3]]
    >>> nic_attachment(8, 4)
    [[0, 1], [2, 3], [4, 5], [6, 7]]
    >>> nic_attachment(2, 4)
    [[0], [1], [0], [1]]
    """
    g, r = gpus_per_node, nics_per_node
    if r <= 0:
        return []
    if r <= g:
        if g % r:
            raise FabricError(f"rails={r} must divide gpus_per_node={g} (or be a multiple of it)")
        per = g // r
        return [list(range(j * per, (j + 1) * per)) for j in range(r)]
    if r % g:
        raise FabricError(f"rails={r} must be a multiple of gpus_per_node={g} (or divide it)")
    return [[j % g] for j in range(r)]


def cluster(
    nodes: int,
    gpus_per_node: int = 8,
    node_kind: NodeKind = "nvswitch",
    *,
    nvlink_Bps: float | None = None,
    rails: int | None = None,
    nic_Bps: float = NDR400_Bps,
    pcie_Bps: float = PCIE_GEN5_X16_Bps,
    spines: int = 0,
    spine_Bps: float | None = None,
    pcie_tree: bool = False,
    sockets: int = 2,
    pcie_switches: int | None = None,
    uplink_Bps: float = PCIE_GEN5_X16_Bps,
    intersocket_Bps: float = UPI2_SPR_Bps,
    nvlink_latency_s: float = DEFAULT_LATENCY_S,
    pcie_latency_s: float = DEFAULT_LATENCY_S,
    net_latency_s: float = DEFAULT_LATENCY_S,
    name: str | None = None,
    meta: Mapping[str, Any] | None = None,
) -> Fabric:
    """A cluster of identical nodes joined by rail switches (and spines).

    Parameters
    ----------
    nodes, gpus_per_node
        Size of the cluster; ranks are ``node * gpus_per_node + local``.
    node_kind
        ``"nvlink-mesh"`` (every GPU pair joined by NVLink of ``nvlink_Bps``
        per direction, default 120 GB/s as measured on the NIMBLE testbed),
        ``"nvswitch"`` (each GPU joins one NVSwitch with ``nvlink_Bps`` up and
        down, default 450 GB/s) or ``"pcie"`` (no NVLink).
    rails
        NICs per node, each on its own rail switch; default one per GPU.
        ``0`` gives isolated nodes (allowed only with ``nodes == 1``).
    nic_Bps, pcie_Bps
        NIC line rate and GPU-NIC PCIe capacity, per direction.
    spines, spine_Bps
        Spine switches above the rails (rail-optimised fabric); each spine
        joins every rail switch with ``spine_Bps`` per direction (default
        ``nic_Bps * nodes / spines``, a non-blocking spine layer).
    pcie_tree, sockets, uplink_Bps, intersocket_Bps
        With ``pcie_tree``, each node gets its PCIe tree
        (:func:`add_pcie_tree`): one switch per group of a NIC and its GPUs
        (:func:`switch_groups`), the switches split evenly over ``sockets``
        root complexes in order, each uplink ``uplink_Bps``, the sockets
        joined by ``intersocket_Bps`` per direction. On a ``"pcie"`` node
        GPU-GPU traffic then crosses the tree instead of one host vertex.
    pcie_switches
        PCIe switches per node, each with an equal block of the GPUs and
        NICs, every NIC serving all GPUs of its switch
        (:func:`switch_attachment`); default: one per NIC and its GPUs
        (:func:`nic_attachment`).

    Examples
    --------
    >>> from pathweave.fabric import cluster
    >>> fab = cluster(nodes=128, gpus_per_node=8)
    >>> fab.num_ranks, len(fab.rails), fab.nvlink_kind
    (1024, 8, 'nvswitch')
    >>> cluster(nodes=2, gpus_per_node=4, node_kind="nvlink-mesh", spines=2).num_vertices
    22
    >>> tree = cluster(nodes=1, gpus_per_node=4, node_kind="nvlink-mesh", rails=2,
    ...                pcie_tree=True)
    >>> [tree.vertex_name(v) for v in tree.vertices_of_kind(VertexKind.PCIE_SWITCH)]
    ['n0.pcie0', 'n0.pcie1']
    """
    if nodes < 1:
        raise FabricError(f"nodes must be >= 1, got {nodes}")
    if gpus_per_node < 1:
        raise FabricError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
    if node_kind not in ("nvlink-mesh", "nvswitch", "pcie"):
        raise FabricError(
            f"node_kind must be 'nvlink-mesh', 'nvswitch' or 'pcie', got {node_kind!r}"
        )
    rails = gpus_per_node if rails is None else int(rails)
    if rails < 0:
        raise FabricError(f"rails must be >= 0, got {rails}")
    if rails == 0 and nodes > 1:
        raise FabricError(f"rails=0 leaves {nodes} nodes unconnected")
    if spines < 0:
        raise FabricError(f"spines must be >= 0, got {spines}")
    if pcie_tree and not 1 <= sockets:
        raise FabricError(f"sockets must be >= 1, got {sockets}")
    for label, v in (("nic_Bps", nic_Bps), ("pcie_Bps", pcie_Bps), ("uplink_Bps", uplink_Bps),
                     ("intersocket_Bps", intersocket_Bps)):
        if not v > 0:
            raise FabricError(f"{label} must be positive, got {v!r}")
    if nvlink_Bps is None:
        nvlink_Bps = NVSWITCH_H100_GPU_Bps if node_kind == "nvswitch" else 120e9
    attach = (nic_attachment(gpus_per_node, rails) if pcie_switches is None
              else switch_attachment(gpus_per_node, rails, int(pcie_switches)))
    groups = switch_groups(attach, gpus_per_node) if pcie_tree else []
    if pcie_tree and sockets > len(groups):
        raise FabricError(f"sockets={sockets} exceeds the {len(groups)} PCIe switches of a node")
    socket_of = [k * sockets // len(groups) for k in range(len(groups))]
    b = FabricBuilder(name or f"cluster-{nodes}x{gpus_per_node}-{node_kind}")
    nics_by_node = []
    for n in range(nodes):
        add_gpus(b, n, gpus_per_node)
        if gpus_per_node > 1:
            if node_kind == "nvlink-mesh":
                add_nvlink_mesh(b, n, gpus_per_node, nvlink_Bps, nvlink_latency_s)
            elif node_kind == "nvswitch":
                add_nvswitch(b, n, gpus_per_node, nvlink_Bps, nvlink_latency_s)
            elif not pcie_tree:
                add_pcie_host(b, n, gpus_per_node, pcie_Bps, pcie_latency_s)
        nics = add_nics(b, n, attach, pcie_Bps, pcie_latency_s, gpu_links=not pcie_tree)
        nics_by_node.append(nics)
        if pcie_tree:
            add_pcie_tree(b, n, [(g, [nics[j] for j in js]) for g, js in groups], socket_of,
                          pcie_Bps=pcie_Bps, uplink_Bps=uplink_Bps,
                          intersocket_Bps=intersocket_Bps, latency_s=pcie_latency_s)
    if rails:
        rail_names = add_rails(b, nics_by_node, nic_Bps, net_latency_s)
        if spines:
            sb = spine_Bps if spine_Bps is not None else nic_Bps * nodes / spines
            add_spines(b, rail_names, spines, sb, net_latency_s)
    info = {
        "builder": "cluster",
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "node_kind": node_kind,
        "nvlink_Bps": float(nvlink_Bps),
        "rails": rails,
        "nic_Bps": float(nic_Bps),
        "pcie_Bps": float(pcie_Bps),
        "spines": spines,
    }
    if pcie_tree:
        info.update(pcie_tree=True, sockets=sockets, uplink_Bps=float(uplink_Bps),
                    intersocket_Bps=float(intersocket_Bps))
    if pcie_switches is not None:
        info["pcie_switches"] = int(pcie_switches)
    info.update(meta or {})
    return b.build(meta=info)


def grace_rack(
    nodes: int = 1,
    gpus_per_node: int = 72,
    *,
    gpus_per_cpu: int = 2,
    nics_per_cpu: int = 2,
    nvlink_Bps: float = NVSWITCH_B200_GPU_Bps,
    c2c_Bps: float = NVLINK_C2C_Bps,
    nic_Bps: float = NDR400_Bps,
    pcie_Bps: float = PCIE_GEN5_X16_Bps,
    spines: int = 0,
    spine_Bps: float | None = None,
    latency_s: float = DEFAULT_LATENCY_S,
    name: str | None = None,
    meta: Mapping[str, Any] | None = None,
) -> Fabric:
    """Grace-Blackwell racks (GB200 NVL72): one NVLink domain per rack, racks on rails.

    Node ``n`` is rack ``n``: its ``gpus_per_node`` GPUs share one NVSwitch
    vertex (the rack's NVLink switch trays merged, as :func:`add_nvswitch`
    merges a baseboard's planes) with ``nvlink_Bps`` up and down per GPU.
    Every ``gpus_per_cpu`` consecutive GPUs and ``nics_per_cpu`` consecutive
    NICs sit under one Grace CPU (:func:`add_grace_hosts`): C2C to the GPUs,
    PCIe to the NICs. NIC ``j`` of every rack is on rail ``j``; ``spines``
    join the rails as in :func:`cluster` (default ``spine_Bps``:
    ``nic_Bps * nodes / spines``, non-blocking).

    Examples
    --------
    >>> from pathweave.fabric.builders import grace_rack
    >>> fab = grace_rack()
    >>> fab.num_ranks, len(fab.rails), fab.nvlink_kind
    (72, 72, 'nvswitch')
    >>> fab.vertex_name(fab.link_dst[fab.link_id("n0.gpu3", "n0.cpu1")])
    'n0.cpu1'
    """
    for label, v, least in (("nodes", nodes, 1), ("gpus_per_node", gpus_per_node, 1),
                            ("gpus_per_cpu", gpus_per_cpu, 1), ("nics_per_cpu", nics_per_cpu, 1),
                            ("spines", spines, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
            raise FabricError(f"{label} must be an integer >= {least}, got {v!r}")
    if gpus_per_node % gpus_per_cpu:
        raise FabricError(f"gpus_per_cpu={gpus_per_cpu} must divide gpus_per_node={gpus_per_node}")
    for label, c in (("nvlink_Bps", nvlink_Bps), ("c2c_Bps", c2c_Bps), ("nic_Bps", nic_Bps),
                     ("pcie_Bps", pcie_Bps)):
        if not (np.isfinite(c) and c > 0):
            raise FabricError(f"{label} must be positive and finite, got {c!r}")
    cpus = gpus_per_node // gpus_per_cpu
    b = FabricBuilder(name or f"grace-rack-{nodes}x{gpus_per_node}")
    nics_by_node = []
    for n in range(nodes):
        add_gpus(b, n, gpus_per_node)
        if gpus_per_node > 1:
            add_nvswitch(b, n, gpus_per_node, nvlink_Bps, latency_s)
        gpus_of = [list(range(s * gpus_per_cpu, (s + 1) * gpus_per_cpu)) for s in range(cpus)]
        nics = add_nics(b, n, [gpus_of[j // nics_per_cpu] for j in range(cpus * nics_per_cpu)],
                        pcie_Bps, latency_s, gpu_links=False)
        add_grace_hosts(b, n, [(gpus_of[s], nics[s * nics_per_cpu:(s + 1) * nics_per_cpu])
                               for s in range(cpus)],
                        c2c_Bps=c2c_Bps, pcie_Bps=pcie_Bps, latency_s=latency_s)
        nics_by_node.append(nics)
    rail_names = add_rails(b, nics_by_node, nic_Bps, latency_s)
    sb = None
    if spines:
        sb = spine_Bps if spine_Bps is not None else nic_Bps * nodes / spines
        add_spines(b, rail_names, spines, sb, latency_s)
    info: dict[str, Any] = {
        "builder": "grace_rack", "nodes": int(nodes), "gpus_per_node": int(gpus_per_node),
        "gpus_per_cpu": int(gpus_per_cpu), "nics_per_cpu": int(nics_per_cpu),
        "nvlink_Bps": float(nvlink_Bps), "c2c_Bps": float(c2c_Bps), "nic_Bps": float(nic_Bps),
        "pcie_Bps": float(pcie_Bps), "rails": len(rail_names), "spines": int(spines),
    }
    if sb is not None:
        info["spine_Bps"] = float(sb)
    info.update(meta or {})
    return b.build(meta=info)


def leaf_spine(
    leaves: int = 8,
    hosts_per_leaf: int = 8,
    spines: int = 4,
    *,
    host_Bps: float = 100e9 / 8,
    spine_Bps: float | None = None,
    pcie_Bps: float = PCIE_GEN5_X16_Bps,
    latency_s: float = DEFAULT_LATENCY_S,
    name: str | None = None,
    meta: Mapping[str, Any] | None = None,
) -> Fabric:
    """A two-tier leaf-spine data-centre fabric of single-GPU hosts.

    Host ``h`` is node ``h`` (one GPU ``n{h}.gpu0`` and one NIC ``n{h}.nic0``)
    under leaf ``h // hosts_per_leaf``; every spine joins every leaf. Leaves
    are rail-switch vertices named ``leaf{j}``, so the path rules give a
    same-leaf pair its one rail path through the shared leaf and a cross-leaf
    pair one ``spine`` path, the spine ECMP hashes its connection to; the
    ``ecmp`` rule gives it one per spine, the equal-cost group that ECMP
    hashes over (what the dynamic simulator uses). Degrade a spine with
    :meth:`Fabric.with_links` for an asymmetric fabric.

    Parameters
    ----------
    leaves, hosts_per_leaf, spines
        Size of the fabric; ``leaves * hosts_per_leaf`` ranks.
    host_Bps
        NIC line rate per direction (default 100 Gb/s).
    spine_Bps
        Each leaf-spine link per direction; default
        ``hosts_per_leaf * host_Bps / spines`` (non-blocking).
    pcie_Bps, latency_s
        GPU-NIC capacity and the latency of every link.

    Examples
    --------
    >>> from pathweave.fabric import candidate_paths
    >>> from pathweave.fabric.builders import leaf_spine
    >>> fab = leaf_spine(leaves=2, hosts_per_leaf=2, spines=2)
    >>> fab.num_ranks, fab.rails
    (4, ('leaf0', 'leaf1'))
    >>> ps = candidate_paths(fab, ("direct", "rail", "ecmp"))
    >>> len(ps.pair_paths(0, 1)), len(ps.pair_paths(0, 2))   # same leaf, cross leaf
    (1, 2)
    >>> ps.describe(ps.pair_paths(0, 2)[1])
    'spine(spine1): n0.gpu0 -> n0.nic0 -> leaf0 -> spine1 -> leaf1 -> n2.nic0 -> n2.gpu0'
    >>> [candidate_paths(fab).describe(p)[:13] for p in candidate_paths(fab).pair_paths(0, 3)]
    ['spine(spine1)']
    >>> slow = fab.with_links({(u, v): 0.1 for u, v in
    ...     [("leaf0", "spine1"), ("spine1", "leaf0"), ("leaf1", "spine1"), ("spine1", "leaf1")]})
    >>> float(slow.capacity_Bps[slow.link_id("leaf0", "spine1")]) / 1e9
    1.25
    """
    for label, v in (("leaves", leaves), ("hosts_per_leaf", hosts_per_leaf), ("spines", spines)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise FabricError(f"{label} must be an integer >= 1, got {v!r}")
    if leaves > 1 and spines < 1:
        raise FabricError(f"spines must be >= 1 to join {leaves} leaves, got {spines}")
    for label, c in (("host_Bps", host_Bps), ("pcie_Bps", pcie_Bps)):
        if not (np.isfinite(c) and c > 0):
            raise FabricError(f"{label} must be positive and finite, got {c!r}")
    sb = hosts_per_leaf * host_Bps / spines if spine_Bps is None else float(spine_Bps)
    if not (np.isfinite(sb) and sb > 0):
        raise FabricError(f"spine_Bps must be positive and finite, got {spine_Bps!r}")
    b = FabricBuilder(name or f"leaf-spine-{leaves}x{hosts_per_leaf}-s{spines}")
    leaf_names = [f"leaf{j}" for j in range(leaves)]
    for leaf in leaf_names:
        b.vertex(leaf, VertexKind.RAIL)
    for h in range(leaves * hosts_per_leaf):
        add_gpus(b, h, 1)
        (nic,) = add_nics(b, h, [[0]], pcie_Bps, latency_s)
        b.duplex(nic, leaf_names[h // hosts_per_leaf], host_Bps, LinkKind.NETWORK, latency_s)
    if leaves > 1:
        add_spines(b, leaf_names, spines, sb, latency_s)
    info = {
        "builder": "leaf_spine",
        "leaves": int(leaves),
        "hosts_per_leaf": int(hosts_per_leaf),
        "spines": int(spines),
        "host_Bps": float(host_Bps),
        "spine_Bps": float(sb),
    }
    info.update(meta or {})
    return b.build(meta=info)
