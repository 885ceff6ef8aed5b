"""The immutable :class:`Fabric`: vertices, directed links and the rank map."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property
from typing import Any

import numpy as np

from pathweave._cache import Cache
from pathweave.errors import FabricError


class Kind(IntEnum):
    """An enumeration of kinds whose :attr:`label` (the lower-case name) files and messages use."""

    @property
    def label(self) -> str:
        return self.name.lower()


class VertexKind(Kind):
    """What a vertex of the fabric is."""

    GPU = 0
    NIC = 1
    NVSWITCH = 2
    RAIL = 3  # a rail (leaf) switch: connects the NICs of one rail across nodes
    SPINE = 4
    HOST = 5  # a PCIe root complex / CPU socket: the top of a node's PCIe tree
    PCIE_SWITCH = 6  # a PCIe switch between devices (GPUs, NICs) and a root complex


class LinkKind(Kind):
    """The technology of a link: it decides which path rules may use it."""

    NVLINK = 0
    PCIE = 1
    NETWORK = 2


#: Vertex kinds that belong to a node (the others are shared switches).
NODE_LOCAL_KINDS = frozenset({VertexKind.GPU, VertexKind.NIC, VertexKind.NVSWITCH, VertexKind.HOST,
                              VertexKind.PCIE_SWITCH})

_GPU_NAME = re.compile(r"^n(\d+)\.gpu(\d+)$")


@dataclass(frozen=True)
class Vertex:
    """One vertex as seen by users; the fabric stores vertices as arrays."""

    id: int
    name: str
    kind: VertexKind
    node: int  # -1 for switches shared by nodes (rails, spines)


@dataclass(frozen=True)
class Link:
    """One directed link as seen by users; the fabric stores links as arrays."""

    id: int
    src: str
    dst: str
    kind: LinkKind
    capacity_Bps: float
    latency_s: float


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


def _pickle_state(obj: Any) -> dict[str, Any]:
    """``obj.__dict__`` without the caches kept beside its fields (``Cache.on``).

    The caches hold this process's tables (path sets, planner tables): the
    receiver of a pickle (a rank process) builds its own, read-only, rather
    than unpickle writable copies of them (and a smaller pickle goes over).
    """
    return {k: v for k, v in obj.__dict__.items() if not isinstance(v, Cache)}


def _unpickle_state(obj: Any, state: dict[str, Any]) -> None:
    """Set ``state`` (from :func:`_pickle_state`) with its arrays read-only again.

    Pickle drops numpy's write flag, and numba compiles every kernel anew for
    writable copies of arrays it has seen read-only (seconds a kernel when
    its cache is cold, in every process that unpickled a fabric).
    """
    for v in state.values():
        for a in v if isinstance(v, tuple) else (v,):
            if isinstance(a, np.ndarray):
                a.setflags(write=False)
    obj.__dict__.update(state)


class Fabric:
    """An immutable description of the hardware a job runs on.

    Vertices are GPUs, NICs, NVSwitches, PCIe switches, PCIe root complexes
    (hosts), rail switches and spines, each with a stable name (``n0.gpu3``,
    ``n0.nic3``, ``n0.nvswitch``, ``n0.pcie3``, ``n0.cpu1``, ``rail3``,
    ``spine0``). Links are directed; a full-duplex cable is two
    links. Link attributes live in numpy arrays indexed by link id, so
    planners work on arrays and never on Python objects.

    Ranks are GPUs numbered node-major: ``rank = node * gpus_per_node + local``
    where ``local`` is the GPU's index inside its node (the ``3`` of
    ``n0.gpu3``).

    Build fabrics with :mod:`pathweave.fabric.builders`, a preset
    (:func:`pathweave.fabric.preset`), a file (:func:`pathweave.fabric.load`)
    or discovery (:func:`pathweave.fabric.from_nvidia_smi`,
    :func:`pathweave.fabric.from_nccl_xml`); the constructor validates
    everything it is given.

    Examples
    --------
    >>> import pathweave as pw
    >>> fab = pw.fabric.preset("h100-2x4")
    >>> fab.num_ranks, fab.num_nodes, fab.gpus_per_node
    (8, 2, 4)
    >>> fab.vertex_name(fab.rank_vertex[5])
    'n1.gpu1'
    >>> lid = fab.link_id("n0.gpu0", "n0.gpu1")
    >>> float(fab.capacity_Bps[lid]) / 1e9
    120.0
    """

    def __init__(
        self,
        *,
        name: str,
        vertex_names: Sequence[str],
        vertex_kind: Sequence[int] | np.ndarray,
        vertex_node: Sequence[int] | np.ndarray,
        link_src: Sequence[int] | np.ndarray,
        link_dst: Sequence[int] | np.ndarray,
        link_kind: Sequence[int] | np.ndarray,
        capacity_Bps: Sequence[float] | np.ndarray,
        latency_s: Sequence[float] | np.ndarray,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self._name = str(name)
        self._vertex_names = tuple(str(v) for v in vertex_names)
        nv = len(self._vertex_names)
        self._vertex_kind = _readonly(np.asarray(vertex_kind, dtype=np.int8))
        self._vertex_node = _readonly(np.asarray(vertex_node, dtype=np.int32))
        self._link_src = _readonly(np.asarray(link_src, dtype=np.int32))
        self._link_dst = _readonly(np.asarray(link_dst, dtype=np.int32))
        self._link_kind = _readonly(np.asarray(link_kind, dtype=np.int8))
        self._capacity = _readonly(np.asarray(capacity_Bps, dtype=np.float64))
        self._latency = _readonly(np.asarray(latency_s, dtype=np.float64))
        self._meta = dict(meta or {})
        if self._vertex_kind.shape != (nv,) or self._vertex_node.shape != (nv,):
            raise FabricError(
                f"vertex arrays disagree: {nv} names, kind shape {self._vertex_kind.shape}, "
                f"node shape {self._vertex_node.shape}"
            )
        nl = self._link_src.shape[0]
        for label, arr in (
            ("link_dst", self._link_dst),
            ("link_kind", self._link_kind),
            ("capacity_Bps", self._capacity),
            ("latency_s", self._latency),
        ):
            if arr.shape != (nl,):
                raise FabricError(f"{label} has shape {arr.shape}, expected ({nl},)")
        self._validate()

    # ------------------------------------------------------------------ checks
    def _validate(self) -> None:
        names = self._vertex_names
        seen: dict[str, int] = {}
        for i, n in enumerate(names):
            if n in seen:
                raise FabricError(f"duplicate vertex name {n!r} (vertices {seen[n]} and {i})")
            seen[n] = i
        valid_kinds = {int(k) for k in VertexKind}
        for i, k in enumerate(self._vertex_kind.tolist()):
            if k not in valid_kinds:
                raise FabricError(f"vertex {names[i]!r} has unknown kind {k}")
        nv = len(names)
        for arr, label in ((self._link_src, "source"), (self._link_dst, "destination")):
            bad = np.flatnonzero((arr < 0) | (arr >= nv))
            if bad.size:
                raise FabricError(
                    f"link {int(bad[0])} has unknown {label} vertex {int(arr[bad[0]])}"
                )
        loops = np.flatnonzero(self._link_src == self._link_dst)
        if loops.size:
            raise FabricError(f"link {self._link_desc(int(loops[0]))} is a self-loop")
        bad = np.flatnonzero(~np.isfinite(self._capacity) | (self._capacity <= 0))
        if bad.size:
            i = int(bad[0])
            raise FabricError(
                f"link {self._link_desc(i)} has capacity_Bps={float(self._capacity[i])!r}; "
                "capacities must be positive and finite"
            )
        bad = np.flatnonzero(~np.isfinite(self._latency) | (self._latency < 0))
        if bad.size:
            i = int(bad[0])
            raise FabricError(
                f"link {self._link_desc(i)} has latency_s={float(self._latency[i])!r}; "
                "latencies must be non-negative and finite"
            )
        valid_links = {int(k) for k in LinkKind}
        for i, k in enumerate(self._link_kind.tolist()):
            if k not in valid_links:
                raise FabricError(f"link {self._link_desc(i)} has unknown kind {k}")
        pairs: dict[tuple[int, int], int] = {}
        for i, (u, v) in enumerate(
            zip(self._link_src.tolist(), self._link_dst.tolist(), strict=False)
        ):
            if (u, v) in pairs:
                raise FabricError(
                    f"duplicate link {names[u]} -> {names[v]} (links {pairs[(u, v)]} and {i})"
                )
            pairs[(u, v)] = i
        self._link_index = pairs
        self._name_index = seen
        # Node-local vertices must name their node; shared switches must not.
        for i, (k, node) in enumerate(
            zip(self._vertex_kind.tolist(), self._vertex_node.tolist(), strict=False)
        ):
            if VertexKind(k) in NODE_LOCAL_KINDS and node < 0:
                raise FabricError(f"vertex {names[i]!r} ({VertexKind(k).label}) needs a node >= 0")
            if VertexKind(k) not in NODE_LOCAL_KINDS and node != -1:
                raise FabricError(
                    f"vertex {names[i]!r} ({VertexKind(k).label}) is shared by nodes: "
                    f"its node must be -1, got {node}"
                )
        # The rank map: GPUs named n<node>.gpu<local>, dense in both indices.
        gpus = np.flatnonzero(self._vertex_kind == VertexKind.GPU)
        if gpus.size == 0:
            raise FabricError(f"fabric {self._name!r} has no GPU")
        coords = {}
        for g in gpus.tolist():
            m = _GPU_NAME.match(names[g])
            if not m:
                raise FabricError(f"GPU vertex {names[g]!r} must be named n<node>.gpu<index>")
            node, local = int(m.group(1)), int(m.group(2))
            if node != int(self._vertex_node[g]):
                raise FabricError(
                    f"GPU vertex {names[g]!r} is in node {int(self._vertex_node[g])}, "
                    f"but its name says node {node}"
                )
            coords[(node, local)] = g
        nodes = sorted({c[0] for c in coords})
        if nodes != list(range(len(nodes))):
            raise FabricError(f"nodes must be numbered 0..N-1 without gaps, got {nodes}")
        per_node = [sorted(loc for (n, loc) in coords if n == node) for node in nodes]
        g0 = len(per_node[0])
        for node, locs in zip(nodes, per_node, strict=False):
            if locs != list(range(g0)):
                raise FabricError(
                    f"node {node} has GPUs {locs}; every node must have GPUs 0..{g0 - 1}"
                )
        self._num_nodes = len(nodes)
        self._gpus_per_node = g0
        self._rank_vertex = _readonly(
            np.array(
                [coords[(n, loc)] for n in range(self._num_nodes) for loc in range(g0)],
                dtype=np.int32,
            )
        )
        vr = np.full(nv, -1, dtype=np.int32)
        vr[self._rank_vertex] = np.arange(self._rank_vertex.size, dtype=np.int32)
        self._vertex_rank = _readonly(vr)
        # Per-vertex-kind link rules: which endpoints a link kind may join.
        for i, (u, v, k) in enumerate(
            zip(
                self._link_src.tolist(),
                self._link_dst.tolist(),
                self._link_kind.tolist(),
                strict=False,
            )
        ):
            ku, kv = VertexKind(int(self._vertex_kind[u])), VertexKind(int(self._vertex_kind[v]))
            if LinkKind(k) != LinkKind.NETWORK and (
                ku not in NODE_LOCAL_KINDS
                or kv not in NODE_LOCAL_KINDS
                or int(self._vertex_node[u]) != int(self._vertex_node[v])
            ):
                raise FabricError(
                    f"link {self._link_desc(i)} is {LinkKind(k).label} but joins vertices "
                    "that are not in one node"
                )

    def _link_desc(self, i: int) -> str:
        u, v = int(self._link_src[i]), int(self._link_dst[i])
        names = self._vertex_names
        un = names[u] if 0 <= u < len(names) else str(u)
        vn = names[v] if 0 <= v < len(names) else str(v)
        return f"{un} -> {vn}"

    def __getstate__(self) -> dict[str, Any]:
        return _pickle_state(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        _unpickle_state(self, state)

    # ------------------------------------------------------------- attributes
    @property
    def name(self) -> str:
        return self._name

    @property
    def meta(self) -> dict[str, Any]:
        """Free-form provenance (source figures, discovery notes); a copy."""
        return dict(self._meta)

    @property
    def vertex_names(self) -> tuple[str, ...]:
        return self._vertex_names

    @property
    def vertex_kind(self) -> np.ndarray:
        """``int8[num_vertices]``: :class:`VertexKind` codes."""
        return self._vertex_kind

    @property
    def vertex_node(self) -> np.ndarray:
        """``int32[num_vertices]``: node of each vertex, -1 for shared switches."""
        return self._vertex_node

    @property
    def link_src(self) -> np.ndarray:
        return self._link_src

    @property
    def link_dst(self) -> np.ndarray:
        return self._link_dst

    @property
    def link_kind(self) -> np.ndarray:
        """``int8[num_links]``: :class:`LinkKind` codes."""
        return self._link_kind

    @property
    def capacity_Bps(self) -> np.ndarray:
        """``float64[num_links]``: capacity of each directed link in bytes/s."""
        return self._capacity

    @property
    def latency_s(self) -> np.ndarray:
        """``float64[num_links]``: one-way latency of each link in seconds."""
        return self._latency

    @property
    def num_vertices(self) -> int:
        return len(self._vertex_names)

    @property
    def num_links(self) -> int:
        return int(self._link_src.shape[0])

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @property
    def gpus_per_node(self) -> int:
        return self._gpus_per_node

    @property
    def num_ranks(self) -> int:
        return int(self._rank_vertex.shape[0])

    @property
    def rank_vertex(self) -> np.ndarray:
        """``int32[num_ranks]``: the GPU vertex of each rank."""
        return self._rank_vertex

    @property
    def vertex_rank(self) -> np.ndarray:
        """``int32[num_vertices]``: the rank of each GPU vertex, -1 for other vertices."""
        return self._vertex_rank

    def node_of_rank(self, rank: int | np.ndarray) -> int | np.ndarray:
        return rank // self._gpus_per_node

    # ---------------------------------------------------------------- lookups
    def vertex_id(self, name: str) -> int:
        """The id of the vertex called ``name``; :class:`FabricError` if unknown."""
        try:
            return self._name_index[name]
        except KeyError:
            raise FabricError(f"unknown vertex {name!r} in fabric {self._name!r}") from None

    def vertex_name(self, vid: int | np.integer) -> str:
        return self._vertex_names[int(vid)]

    def vertex(self, v: int | str) -> Vertex:
        vid = self.vertex_id(v) if isinstance(v, str) else int(v)
        return Vertex(
            vid,
            self._vertex_names[vid],
            VertexKind(int(self._vertex_kind[vid])),
            int(self._vertex_node[vid]),
        )

    def vertices_of_kind(self, kind: VertexKind) -> np.ndarray:
        """Ids of all vertices of ``kind``, in id order."""
        return np.flatnonzero(self._vertex_kind == int(kind)).astype(np.int32)

    def link_id(self, src: int | str, dst: int | str) -> int:
        """The id of the link ``src -> dst``; :class:`FabricError` if there is none."""
        u = self.vertex_id(src) if isinstance(src, str) else int(src)
        v = self.vertex_id(dst) if isinstance(dst, str) else int(dst)
        try:
            return self._link_index[(u, v)]
        except KeyError:
            raise FabricError(
                f"no link {self._vertex_names[u]} -> {self._vertex_names[v]} "
                f"in fabric {self._name!r}"
            ) from None

    def has_link(self, src: int | str, dst: int | str) -> bool:
        u = self.vertex_id(src) if isinstance(src, str) else int(src)
        v = self.vertex_id(dst) if isinstance(dst, str) else int(dst)
        return (u, v) in self._link_index

    def link(self, lid: int) -> Link:
        lid = int(lid)
        return Link(
            lid,
            self._vertex_names[int(self._link_src[lid])],
            self._vertex_names[int(self._link_dst[lid])],
            LinkKind(int(self._link_kind[lid])),
            float(self._capacity[lid]),
            float(self._latency[lid]),
        )

    def link_name(self, lid: int) -> str:
        return self._link_desc(int(lid))

    @cached_property
    def out_links(self) -> tuple[np.ndarray, ...]:
        """Per vertex, the ids of its outgoing links (sorted)."""
        order = np.argsort(self._link_src, kind="stable")
        bounds = np.searchsorted(self._link_src[order], np.arange(self.num_vertices + 1))
        return tuple(_readonly(order[bounds[i] : bounds[i + 1]]) for i in range(self.num_vertices))

    @cached_property
    def rails(self) -> tuple[str, ...]:
        """Names of the rail switches, in rail-index order."""
        return tuple(self._vertex_names[v] for v in self.vertices_of_kind(VertexKind.RAIL))

    # --------------------------------------------------------------- changes
    def with_links(
        self,
        factors: Mapping[int | tuple[str, str], float] | None = None,
        *,
        remove: Iterable[int | tuple[str, str]] = (),
        name: str | None = None,
    ) -> Fabric:
        """A copy with some links degraded (capacity scaled) or removed.

        Parameters
        ----------
        factors
            Map from a link (id or ``(src, dst)`` names) to a factor in
            ``(0, 1]`` that multiplies its capacity; ``0`` removes the link.
        remove
            Links to remove (ids or ``(src, dst)`` names), e.g. a failed cable:
            pass both directions.
        name
            Name of the new fabric; defaults to ``"<name>-degraded"``.

        Examples
        --------
        >>> import pathweave as pw
        >>> fab = pw.fabric.preset("h100-2x4")
        >>> slow = fab.with_links({("n0.gpu0", "n0.gpu1"): 0.5})
        >>> float(slow.capacity_Bps[slow.link_id("n0.gpu0", "n0.gpu1")]) / 1e9
        60.0
        >>> cut = fab.with_links(remove=[("n0.gpu0", "n0.gpu1")])
        >>> cut.num_links == fab.num_links - 1
        True
        """
        cap = self._capacity.copy()
        keep = np.ones(self.num_links, dtype=bool)

        def resolve(key: int | tuple[str, str]) -> int:
            if isinstance(key, tuple):
                return self.link_id(key[0], key[1])
            k = int(key)
            if not 0 <= k < self.num_links:
                raise FabricError(f"link id {k} out of range [0, {self.num_links})")
            return k

        for key, f in (factors or {}).items():
            lid = resolve(key)
            f = float(f)
            if not (0.0 <= f <= 1.0) or not np.isfinite(f):
                raise FabricError(
                    f"degradation factor for link {self._link_desc(lid)} is {f!r}; "
                    "it must lie in [0, 1] (0 removes the link)"
                )
            if f == 0.0:
                keep[lid] = False
            else:
                cap[lid] *= f
        for key in remove:
            keep[resolve(key)] = False
        return Fabric(
            name=name or f"{self._name}-degraded",
            vertex_names=self._vertex_names,
            vertex_kind=self._vertex_kind,
            vertex_node=self._vertex_node,
            link_src=self._link_src[keep],
            link_dst=self._link_dst[keep],
            link_kind=self._link_kind[keep],
            capacity_Bps=cap[keep],
            latency_s=self._latency[keep],
            meta={**self._meta, "derived_from": self._name},
        )

    def subset(self, ranks: Iterable[int], *, name: str | None = None) -> Fabric:
        """The part of the fabric that a process group of ``ranks`` runs on.

        Every shared switch, every NIC and NVSwitch of a node that holds a
        member, and the member GPUs stay with the links between what stays;
        the other GPUs go (no path may relay through a rank outside the
        group), and so do nodes without a member. Nodes and GPUs are then
        numbered densely in the old order, so group rank ``i`` (torch
        numbers a group's ranks in ascending global order) is rank ``i`` of
        the result.

        Raises
        ------
        FabricError
            A rank out of range or given twice, or nodes that hold different
            numbers of members (a fabric has the same GPUs on every node).

        Examples
        --------
        >>> import pathweave as pw
        >>> sub = pw.fabric.preset("h100-2x4").subset([0, 2, 4, 6])
        >>> sub.num_ranks, sub.num_nodes, sub.vertex_name(sub.rank_vertex[3])
        (4, 2, 'n1.gpu1')
        """
        r = np.array([int(v) for v in ranks], dtype=np.int64)
        if r.size == 0 or np.unique(r).size != r.size:
            raise FabricError(f"subset needs distinct ranks, got {r.tolist()}")
        bad = r[(r < 0) | (r >= self.num_ranks)]
        if bad.size:
            raise FabricError(f"rank {int(bad[0])} is outside fabric {self._name!r} "
                              f"({self.num_ranks} ranks)")
        r.sort()
        nodes, per_node = np.unique(r // self._gpus_per_node, return_counts=True)
        if (per_node != per_node[0]).any():
            held = ", ".join(f"node {int(n)}: {int(c)}" for n, c in zip(nodes, per_node,
                                                                       strict=True))
            raise FabricError(f"ranks {r.tolist()} hold different numbers of GPUs per node "
                              f"({held}); a fabric has the same number on every node")
        new_node = {int(n): i for i, n in enumerate(nodes)}
        members = set(r.tolist())
        names, kinds, vnodes, old_ids = [], [], [], []
        gpu = int(VertexKind.GPU)
        for v, (vn, k, node) in enumerate(zip(self._vertex_names, self._vertex_kind.tolist(),
                                              self._vertex_node.tolist(), strict=True)):
            if node >= 0 and node not in new_node:
                continue
            if k == gpu:
                rank = int(self._vertex_rank[v])
                if rank not in members:
                    continue
                first = np.searchsorted(r, node * self._gpus_per_node)
                vn = f"n{new_node[node]}.gpu{int(np.searchsorted(r, rank) - first)}"
            elif node >= 0 and vn.startswith(f"n{node}."):
                vn = f"n{new_node[node]}." + vn[len(f"n{node}."):]
            names.append(vn)
            kinds.append(k)
            vnodes.append(new_node.get(node, -1) if node >= 0 else -1)
            old_ids.append(v)
        remap = np.full(self.num_vertices, -1, dtype=np.int64)
        remap[old_ids] = np.arange(len(old_ids))
        keep = (remap[self._link_src] >= 0) & (remap[self._link_dst] >= 0)
        return Fabric(
            name=name or f"{self._name}-ranks{len(r)}",
            vertex_names=names, vertex_kind=kinds, vertex_node=vnodes,
            link_src=remap[self._link_src[keep]], link_dst=remap[self._link_dst[keep]],
            link_kind=self._link_kind[keep], capacity_Bps=self._capacity[keep],
            latency_s=self._latency[keep],
            meta={**self._meta, "derived_from": self._name, "ranks": r.tolist()},
        )

    # ---------------------------------------------------------------- output
    def summary(self) -> dict[str, Any]:
        """Counts and capacities by kind, for display and tests."""
        kinds = {k.label: int(np.sum(self._vertex_kind == k)) for k in VertexKind}
        by_kind: dict[str, dict[str, float]] = {}
        for lk in LinkKind:
            sel = self._link_kind == lk
            if sel.any():
                by_kind[lk.label] = {
                    "links": int(sel.sum()),
                    "min_capacity_Bps": float(self._capacity[sel].min()),
                    "max_capacity_Bps": float(self._capacity[sel].max()),
                }
        return {
            "name": self._name,
            "nodes": self._num_nodes,
            "gpus_per_node": self._gpus_per_node,
            "ranks": self.num_ranks,
            "vertices": kinds,
            "links": by_kind,
            "rails": len(self.rails),
            "nvlink_kind": self.nvlink_kind,
        }

    @cached_property
    def nvlink_kind(self) -> str:
        """``"nvswitch"``, ``"nvlink-mesh"``, ``"pcie"`` or ``"none"`` (one GPU a node).

        Judged from node 0: an NVSwitch vertex, else GPU-GPU NVLinks, else a
        PCIe host.
        """
        node0 = self._vertex_node == 0
        if np.any(node0 & (self._vertex_kind == VertexKind.NVSWITCH)):
            return "nvswitch"
        nv = self._link_kind == LinkKind.NVLINK
        gpu = self._vertex_kind == VertexKind.GPU
        if np.any(nv & gpu[self._link_src] & gpu[self._link_dst]):
            return "nvlink-mesh"
        if np.any(node0 & (self._vertex_kind == VertexKind.HOST)):
            return "pcie"
        return "none"

    def __repr__(self) -> str:
        return (
            f"Fabric(name={self._name!r}, nodes={self._num_nodes}, "
            f"gpus_per_node={self._gpus_per_node}, vertices={self.num_vertices}, "
            f"links={self.num_links})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Fabric):
            return NotImplemented
        return (
            self._name == other._name
            and self._vertex_names == other._vertex_names
            and np.array_equal(self._vertex_kind, other._vertex_kind)
            and np.array_equal(self._vertex_node, other._vertex_node)
            and np.array_equal(self._link_src, other._link_src)
            and np.array_equal(self._link_dst, other._link_dst)
            and np.array_equal(self._link_kind, other._link_kind)
            and np.array_equal(self._capacity, other._capacity)
            and np.array_equal(self._latency, other._latency)
        )

    __hash__ = object.__hash__
