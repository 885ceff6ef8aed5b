"""Path rules: a small set of candidate paths per ordered rank pair.

Rules (NIMBLE Sec. IV-B, h-score blog):

``direct``
    The GPU-to-GPU route inside a node: one NVLink on a mesh, up and down
    through the NVSwitch, or through the PCIe host.
``relay``
    One intermediate GPU ``i`` inside the node: ``s -> i -> d``. Only where
    both hops are direct GPU-GPU links (an NVLink mesh): on an NVSwitch or
    PCIe node the relay path contains the direct path's links and can never
    be better (NIMBLE Sec. VII).
``rail``
    Via rail ``x``: forward inside the source node to a GPU with a NIC on rail
    ``x`` (no forward if ``s`` has one), cross rail ``x`` to the destination
    node, forward inside it to ``d``. ``x`` = the source's own rail is the
    h-score blog's *rd* path; ``x`` = the destination's rail is its *dr*
    path (NCCL's PXN); both own rail ``x`` is the rail-matched path; any
    other ``x`` is the remote-rail *drd* path.
``spine``
    On rail-optimised fabrics, for ranks on different rails: the source's
    NIC, its rail switch, spine ``k``, the destination's rail switch, its NIC.
    Only where the pair has no PXN path (no GPU of the source's node on the
    destination's rail: single-GPU hosts of a leaf-spine, a node short of
    rails), and then one path, on spine ``k = (s + d) % K`` of ``K``. The
    data plane sends a spine path as a plain send ``[s, d]``
    (``runtime.schedule.path_routes``), and a plain send takes the
    transport's route: PXN where it exists (NCCL's default; the emulator's
    static routes), else the source's own NIC and one spine, picked by the
    switches' ECMP hash of the connection (RFC 2992: one flow, one next
    hop). A spine path beside a PXN path, or two spine paths of one pair,
    would plan bytes on links they never cross.
``ecmp``
    Every spine path of every pair on different rails, one per spine: the
    equal-cost group the switches hash flows over (or spray packets over).
    A modelling rule (:data:`MODEL_KINDS`), for what the network chooses
    itself: UCX's lanes (``pathweave.plan.multirail``) and the flow-level
    simulator's ECMP, spraying and flowlet policies (``pathweave.sim``).
    Given with ``spine``, it replaces it.
``pcie``
    Via rail ``x`` of a NIC the source owns, to the destination node's NIC
    on ``x``, then through that node's PCIe tree (PCIe switches, root
    complexes, the inter-socket link) into the destination GPU: GPUDirect
    RDMA into a GPU that does not sit under the receiving NIC, no GPU
    forwards the bytes (what MPI/UCX does, ``pathweave.plan.multirail``).
    Only where the destination does not own rail ``x`` (else the
    rail-matched path is that route) and only on fabrics with a PCIe tree.
    Not a default rule (:data:`DEFAULT_KINDS`): pathweave's data plane cannot
    send over it (a send straight to another node's GPU leaves on the NIC
    the transport picks), so only the UCX model compiles it.

A rank's own NICs are its nearest ones below the root complex: joined to
its GPU directly or through PCIe switches only (``nvidia-smi topo -m``: PIX
or PXB), or below a CPU the GPU joins itself (Grace over NVLink-C2C), the
fewest hops among them.

The compiled :class:`PathSet` stores every candidate path as a row of link
ids (padded with -1), grouped by pair ``p = src * num_ranks + dst``:
paths of pair ``p`` are rows ``pair_ptr[p]:pair_ptr[p + 1]``. Order inside a
pair is fixed (direct, relays by relay rank, rails by rail index, spines by
spine index, pcie by rail index) so every process derives the same ids.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

import numpy as np

from pathweave import _check as _args
from pathweave._cache import Cache
from pathweave.errors import FabricError
from pathweave.fabric._core import (
    Fabric,
    Kind,
    LinkKind,
    VertexKind,
    _pickle_state,
    _unpickle_state,
)


class PathKind(Kind):
    DIRECT = 0
    RELAY = 1
    RAIL = 2
    SPINE = 3
    PCIE = 4


ALL_KINDS = ("direct", "relay", "rail", "spine", "ecmp", "pcie")

#: The rules planners use unless told otherwise: every rule whose paths the
#: data plane can run, each path of a pair on a route of its own.
DEFAULT_KINDS = ("direct", "relay", "rail", "spine")
_DEFAULT_RULES = tuple(sorted(DEFAULT_KINDS))

#: Rules whose paths the data plane cannot run, with why: models of routes
#: that the network or a peer library picks, never pathweave's data plane.
MODEL_KINDS: dict[str, str] = {
    "pcie": "no GPU forwards them, so the transport would pick the route; that rule models "
            "UCX ('multirail') only",
    "ecmp": "all spine paths of a pair are the one send [s, d], and the switches' hash, "
            "not the plan, picks the spine; that rule models UCX ('multirail') and the "
            "flow-level simulator only",
}

T = TypeVar("T")

#: Planner tables a path set keeps (:meth:`PathSet.derived`), most recently used.
DERIVED_ENTRIES = 64
#: Path sets a fabric keeps (:func:`fabric_path_cache`), most recently used.
PATH_SETS = 16

#: Path roles: the kind, with rail paths split as in the h-score blog.
ROLES = ("direct", "relay", "matched", "rd", "dr", "drd", "spine", "pcie")


@dataclass(frozen=True, eq=False)
class PathSet:
    """Candidate paths of every ordered rank pair, as flat arrays.

    Attributes
    ----------
    num_ranks : int
    pair_ptr : int64[num_ranks**2 + 1]
        Paths of pair ``s * num_ranks + d`` are ``pair_ptr[p]:pair_ptr[p+1]``.
    links : int32[num_paths, width]
        Link ids of each path in hop order, padded with -1.
    length : int32[num_paths]
        Number of links of each path.
    kind : int8[num_paths]
        :class:`PathKind` code.
    via : int32[num_paths]
        Relay rank (relay), rail index (rail, pcie), spine index (spine), -1
        (direct).
    src, dst : int32[num_paths]
        Ranks at the two ends.
    """

    fabric: Fabric
    num_ranks: int
    pair_ptr: np.ndarray
    links: np.ndarray
    length: np.ndarray
    kind: np.ndarray
    via: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    kinds: tuple[str, ...]
    max_hops: int | None
    rank_rails: tuple[tuple[int, ...], ...]

    def __getstate__(self) -> dict[str, Any]:
        return _pickle_state(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        _unpickle_state(self, state)

    @property
    def num_paths(self) -> int:
        return int(self.links.shape[0])

    def pair_paths(self, src: int, dst: int) -> range:
        """Path ids of the ordered pair ``(src, dst)``."""
        p = int(src) * self.num_ranks + int(dst)
        return range(int(self.pair_ptr[p]), int(self.pair_ptr[p + 1]))

    def path_links(self, pid: int) -> np.ndarray:
        return self.links[pid, : self.length[pid]]

    def link_load_bytes(self, path_ids: np.ndarray, path_bytes: np.ndarray) -> np.ndarray:
        """Bytes on each directed link when ``path_bytes[i]`` crosses path ``path_ids[i]``.

        Parameters
        ----------
        path_ids
            Path id of each flow (repeats allowed).
        path_bytes
            Bytes of each flow, the same length as ``path_ids``.

        Returns
        -------
        numpy.ndarray
            ``float64[fabric.num_links]``.
        """
        rows = self.links[np.asarray(path_ids, dtype=np.int64)]
        w = np.broadcast_to(np.asarray(path_bytes, dtype=np.float64)[:, None], rows.shape)
        m = rows >= 0
        return np.bincount(rows[m], weights=w[m], minlength=self.fabric.num_links)

    def path_vertices(self, pid: int) -> list[str]:
        """Vertex names along path ``pid``, source GPU first."""
        fab = self.fabric
        lk = self.path_links(pid)
        names = [fab.vertex_name(fab.link_src[lk[0]])]
        names.extend(fab.vertex_name(fab.link_dst[e]) for e in lk)
        return names

    def derived(self, key: Hashable, build: Callable[[], T]) -> T:
        """``build()`` once per ``key``, then kept with this path set.

        Planners keep their per-fabric tables here (read-only arrays), so a
        repeated plan on the same fabric pays no set-up. The
        :data:`DERIVED_ENTRIES` most recently used keys are kept
        (:class:`pathweave._cache.Cache`).
        """
        return Cache.on(self, "_derived", DERIVED_ENTRIES).get_or_build(key, build)

    @cached_property
    def first_rail(self) -> np.ndarray:
        """``int64[num_ranks]``: each rank's lowest own rail (its NIC's), -1 if none."""
        out = np.array([r[0] if r else -1 for r in self.rank_rails], dtype=np.int64)
        out.setflags(write=False)
        return out

    @cached_property
    def owns_rail(self) -> np.ndarray:
        """``bool[num_ranks, num_rails]``: whether a rank has a NIC on each rail."""
        nr = max((max(r) for r in self.rank_rails if r), default=-1) + 1
        own = np.zeros((self.num_ranks, max(nr, 1)), dtype=bool)
        for r, rails in enumerate(self.rank_rails):
            own[r, list(rails)] = True
        own.setflags(write=False)
        return own

    @cached_property
    def role_code(self) -> np.ndarray:
        """``int8[num_paths]``: index into :data:`ROLES` of each path's role."""
        code = np.where(self.kind == PathKind.RELAY, 1, 0).astype(np.int8)
        code[self.kind == PathKind.SPINE] = 6
        code[self.kind == PathKind.PCIE] = 7
        rail = self.kind == PathKind.RAIL
        x = np.where(rail, self.via, 0)
        os_, od = self.owns_rail[self.src, x], self.owns_rail[self.dst, x]
        code[rail & os_ & od] = 2
        code[rail & os_ & ~od] = 3
        code[rail & ~os_ & od] = 4
        code[rail & ~os_ & ~od] = 5
        code.setflags(write=False)
        return code

    def rail_role(self, pid: int) -> str:
        """For rail paths: ``matched``, ``rd``, ``dr`` or ``drd``; else the kind."""
        k = PathKind(int(self.kind[pid]))
        if k != PathKind.RAIL:
            return k.label
        x = int(self.via[pid])
        own_s = x in self.rank_rails[int(self.src[pid])]
        own_d = x in self.rank_rails[int(self.dst[pid])]
        if own_s and own_d:
            return "matched"
        if own_s:
            return "rd"
        if own_d:
            return "dr"
        return "drd"

    def describe(self, pid: int) -> str:
        """A one-line description, e.g. ``rail(dr, rail1): n0.gpu0 -> ... -> n1.gpu1``."""
        k = PathKind(int(self.kind[pid]))
        tag = k.label
        if k == PathKind.RELAY:
            tag = f"relay(via rank {int(self.via[pid])})"
        elif k == PathKind.RAIL:
            tag = f"rail({self.rail_role(pid)}, {self.fabric.rails[int(self.via[pid])]})"
        elif k == PathKind.SPINE:
            tag = f"spine(spine{int(self.via[pid])})"
        elif k == PathKind.PCIE:
            tag = f"pcie({self.fabric.rails[int(self.via[pid])]})"
        return f"{tag}: " + " -> ".join(self.path_vertices(pid))


# --------------------------------------------------------------------- helpers
_NVSWITCH, _HOST, _PCIE_SW = (int(VertexKind.NVSWITCH), int(VertexKind.HOST),
                              int(VertexKind.PCIE_SWITCH))


def _routes_from(
    fab: Fabric, s: int, transit: tuple[int, ...], pcie_only: bool = False
) -> dict[int, list[int]]:
    """Best route from vertex ``s`` to every vertex of its node it can reach.

    Breadth-first over the node's non-network links (only PCIe ones if
    ``pcie_only``), passing through vertices whose kind is in ``transit``
    only (every other vertex ends a route): fewest hops, then the largest
    bottleneck capacity, then the lowest link ids, so every process derives
    the same routes. Returns ``{vertex: [link ids]}`` without ``s`` itself.
    """
    kind, node = fab.vertex_kind, fab.vertex_node
    n = int(node[s])
    best: dict[int, tuple[int, float, list[int]]] = {s: (0, -np.inf, [])}
    queue = deque([s])
    while queue:
        u = queue.popleft()
        hops, negb, path = best[u]
        if u != s and int(kind[u]) not in transit:
            continue
        for e in fab.out_links[u].tolist():
            v = int(fab.link_dst[e])
            lk = int(fab.link_kind[e])
            if int(node[v]) != n or lk == LinkKind.NETWORK or (pcie_only and lk != LinkKind.PCIE):
                continue
            cand = (hops + 1, max(negb, -float(fab.capacity_Bps[e])), [*path, e])
            old = best.get(v)
            if old is None:
                best[v] = cand
                queue.append(v)
            elif cand < old:
                best[v] = cand
    return {v: p for v, (_, _, p) in best.items() if v != s}


def _intra_routes(fab: Fabric) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Direct intra-node route between every GPU pair of each node.

    :func:`_routes_from` each GPU over its node's NVSwitch, PCIe switch and
    host vertices (never through another GPU or a NIC).

    Returns ``(links[R, G, W], length[R, G], direct_nvlink[R, G])`` where
    ``length`` is -1 where no route exists and 0 on the diagonal.
    """
    g = fab.gpus_per_node
    nr = fab.num_ranks
    vr = fab.vertex_rank
    routes: dict[tuple[int, int], list[int]] = {}
    width = 1
    for r in range(nr):
        found = _routes_from(fab, int(fab.rank_vertex[r]), (_NVSWITCH, _HOST, _PCIE_SW))
        for v, path in found.items():
            if int(fab.vertex_kind[v]) == VertexKind.GPU:
                routes[(r, int(vr[v]))] = path
                width = max(width, len(path))
    links = np.full((nr, g, width), -1, dtype=np.int32)
    length = np.full((nr, g), -1, dtype=np.int32)
    direct = np.zeros((nr, g), dtype=bool)
    for r in range(nr):
        length[r, r % g] = 0
    for (a, b), path in routes.items():
        links[a, b % g, : len(path)] = path
        length[a, b % g] = len(path)
        direct[a, b % g] = len(path) == 1 and int(fab.link_kind[path[0]]) == LinkKind.NVLINK
    return links, length, direct


def _reverse(fab: Fabric, links: list[int]) -> tuple[int, ...] | None:
    """The links of the reverse route, or None if a link has no reverse."""
    out = []
    for e in reversed(links):
        u, v = int(fab.link_src[e]), int(fab.link_dst[e])
        if not fab.has_link(v, u):
            return None
        out.append(fab.link_id(v, u))
    return tuple(out)


#: A rank's NIC: ``(rail, GPU->NIC links, NIC->rail link, NIC->GPU links)``.
OwnNic = tuple[int, tuple[int, ...], int, tuple[int, ...]]


def _nic_rails(fab: Fabric) -> dict[int, int]:
    """Rail index of each NIC vertex that joins a rail switch both ways."""
    rails = {int(v): i for i, v in enumerate(fab.vertices_of_kind(VertexKind.RAIL))}
    nic_rail: dict[int, int] = {}
    for nic in fab.vertices_of_kind(VertexKind.NIC).tolist():
        rs = [
            rails[int(fab.link_dst[e])]
            for e in fab.out_links[nic].tolist()
            if int(fab.link_dst[e]) in rails
        ]
        if len(rs) > 1:
            raise FabricError(
                f"NIC {fab.vertex_name(nic)} connects to {len(rs)} rail switches; "
                "a NIC belongs to one rail"
            )
        if rs and fab.has_link(int(fab.vertices_of_kind(VertexKind.RAIL)[rs[0]]), nic):
            nic_rail[nic] = rs[0]
    return nic_rail


def _nic_table(fab: Fabric, share: bool = True) -> tuple[dict[int, int], list[list[OwnNic]]]:
    """Rail index per NIC and, per rank, its own NICs.

    A rank's nearest NICs are those below the root complex reached through
    PCIe switches only (``nvidia-smi``'s PIX/PXB), or below a host the GPU
    joins by a link of its own (a Grace CPU over NVLink-C2C, NCCL's P2C), the
    fewest hops among them; a NIC joined to the GPU by a link of its own is
    one hop away. Where GPUs share their nearest NICs, each uses its share
    of them, as NCCL does (:func:`_share_nics`), unless ``share`` is False
    (a model of a peer that picks NICs by distance alone, as UCX does).
    Returns ``(nic_rail, rank_nics)``, ``rank_nics[r]`` sorted by rail.
    """
    rail_vs = fab.vertices_of_kind(VertexKind.RAIL)
    nic_rail = _nic_rails(fab)
    rank_nics: list[list[OwnNic]] = [[] for _ in range(fab.num_ranks)]
    for r in range(fab.num_ranks):
        gpu = int(fab.rank_vertex[r])
        routes = _routes_from(fab, gpu, (_PCIE_SW,), pcie_only=True)
        for e in fab.out_links[gpu].tolist():  # a host joined to the GPU itself (Grace C2C)
            h = int(fab.link_dst[e])
            if int(fab.vertex_kind[h]) == _HOST and int(fab.link_kind[e]) == LinkKind.PCIE:
                for v, p in _routes_from(fab, h, (_PCIE_SW,), pcie_only=True).items():
                    routes.setdefault(v, [e, *p])
        near = {v: p for v, p in routes.items() if v in nic_rail}
        if not near:
            continue
        hops = min(len(p) for p in near.values())
        for v, up in near.items():
            down = _reverse(fab, up)
            if len(up) == hops and down is not None:
                x = nic_rail[v]
                rank_nics[r].append((x, tuple(up), fab.link_id(v, int(rail_vs[x])), down))
        rank_nics[r].sort()
    return nic_rail, (_share_nics(fab, rank_nics) if share else rank_nics)


def _mirror_bits(i: int, n: int) -> int:
    """``i``'s lowest ``log2(n)`` bits reversed (``n`` a power of two)."""
    bits = n.bit_length() - 1
    return int(f"{i:0{bits}b}"[::-1], 2) if bits else 0


def _share_nics(fab: Fabric, rank_nics: list[list[OwnNic]]) -> list[list[OwnNic]]:
    """Each GPU's share of the nearest NICs it has in common with other GPUs.

    NCCL (``ncclTopoGetLocalNet``, src/graph/paths.cc, ``NCCL_NETDEVS_POLICY``
    AUTO): the ``G`` GPUs whose nearest NICs are the same ``N`` use
    ``ceil(N / G)`` of them each, starting at NIC ``dev % G`` (its bits
    mirrored when ``N`` is a power of two; ``dev``: the CUDA device, here
    the node-local rank), so two GPUs under one switch with two NICs (DGX
    A100) use one NIC each. A GPU alone with its NICs keeps all of them.

    >>> _mirror_bits(1, 4), _mirror_bits(2, 4), _mirror_bits(3, 8)
    (2, 1, 6)
    """
    groups: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for r, nics in enumerate(rank_nics):
        if len(nics) > 1:
            key = (r // fab.gpus_per_node, tuple(n[2] for n in nics))
            groups.setdefault(key, []).append(r)
    out = list(rank_nics)
    for ranks in groups.values():
        g, n = len(ranks), len(rank_nics[ranks[0]])
        per = -(-n // g)
        for r in ranks:
            start = (r % fab.gpus_per_node) % g
            if n & (n - 1) == 0:
                start = _mirror_bits(start, n)
            out[r] = sorted(rank_nics[r][(start + c) % n] for c in range(per))
    return out


def _rail_segments(
    fab: Fabric,
    intra_links: np.ndarray,
    intra_len: np.ndarray,
    rank_nics: list[list[OwnNic]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Source and destination halves of every rail path.

    ``src_seg[r, x]``: links from rank ``r`` to rail switch ``x`` (forwarding
    inside the node if ``r`` has no NIC on ``x``); ``dst_seg[r, x]``: links
    from rail switch ``x`` to rank ``r``. Lengths are -1 where impossible.
    The forwarding GPU is the one on ``x`` with the shortest (then
    lowest-local) intra-node route, so the choice is deterministic.
    """
    g = fab.gpus_per_node
    nr = fab.num_ranks
    nrails = len(fab.rails)
    wi = intra_links.shape[2]
    wup = max((len(n[1]) for nics in rank_nics for n in nics), default=1)
    width = wi + wup + 1
    src_seg = np.full((nr, nrails, width), -1, dtype=np.int32)
    src_len = np.full((nr, nrails), -1, dtype=np.int32)
    dst_seg = np.full((nr, nrails, width), -1, dtype=np.int32)
    dst_len = np.full((nr, nrails), -1, dtype=np.int32)
    rail_vertices = fab.vertices_of_kind(VertexKind.RAIL)
    for n in range(fab.num_nodes):
        ranks = range(n * g, (n + 1) * g)
        # gateways[x] = list of (rank, gpu->nic, nic->rail, nic->gpu) on rail x in node n
        gateways: dict[int, list[tuple[int, tuple[int, ...], int, tuple[int, ...]]]] = {}
        for r in ranks:
            for x, up, rup, down in rank_nics[r]:
                gateways.setdefault(x, []).append((r, up, rup, down))
        for x, gws in gateways.items():
            rail_v = int(rail_vertices[x])
            for r in ranks:
                # source side: r -> gw -> nic -> rail
                best = min(((int(intra_len[r, gw % g]), gw, up, rup)
                            for gw, up, rup, _ in gws if intra_len[r, gw % g] >= 0),
                           default=None)
                if best is not None:
                    ln, gw, up, rup = best
                    seg = [*intra_links[r, gw % g, :ln].tolist(), *up, rup]
                    src_seg[r, x, : len(seg)] = seg
                    src_len[r, x] = len(seg)
                # destination side: rail -> nic -> gw -> r
                best = min(((int(intra_len[gw, r % g]), gw, down)
                            for gw, _, _, down in gws if intra_len[gw, r % g] >= 0),
                           default=None)
                if best is not None:
                    ln, gw, down = best
                    nic = int(fab.link_src[down[0]])
                    seg = [fab.link_id(rail_v, nic), *down, *intra_links[gw, r % g, :ln].tolist()]
                    dst_seg[r, x, : len(seg)] = seg
                    dst_len[r, x] = len(seg)
    return src_seg, src_len, dst_seg, dst_len


def _pcie_drops(
    fab: Fabric, nic_rail: dict[int, int], rank_rails: tuple[tuple[int, ...], ...]
) -> dict[tuple[int, int], list[int]]:
    """``{(rank, rail): links}``: rail switch -> the node's NIC -> PCIe tree -> rank.

    For every rank and every rail it does not own whose NIC in its node
    reaches the rank's GPU over PCIe alone (switches, root complexes, the
    inter-socket link; never a GPU or NVLink): the lowest-id such NIC.
    """
    rail_vs = fab.vertices_of_kind(VertexKind.RAIL)
    g = fab.gpus_per_node
    out: dict[tuple[int, int], list[int]] = {}
    for nic in sorted(nic_rail):
        x = nic_rail[nic]
        routes = _routes_from(fab, nic, (_PCIE_SW, _HOST), pcie_only=True)
        n = int(fab.vertex_node[nic])
        for r in range(n * g, (n + 1) * g):
            path = routes.get(int(fab.rank_vertex[r]))
            if path is not None and x not in rank_rails[r] and (r, x) not in out:
                out[(r, x)] = [fab.link_id(int(rail_vs[x]), nic), *path]
    return out


def _join(parts: list[tuple[np.ndarray, np.ndarray]], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate ``-1``-padded link rows: ``parts`` of ``(rows[M, w], length[M])``.

    Returns the ``int32[M, width]`` block and the total lengths.
    """
    m = parts[0][0].shape[0]
    lk = np.full((m, width), -1, dtype=np.int32)
    at = np.zeros(m, dtype=np.int64)
    if m == 0:  # e.g. spines but no pair on different rails: reshape(0, -1) is ambiguous
        return lk, at
    rows = np.arange(m)
    for seg, ln in parts:
        seg = seg.reshape(m, -1)
        for c in range(seg.shape[1]):
            put = c < ln
            lk[rows[put], at[put] + c] = seg[put, c]
        at = at + ln
    return lk, at


@dataclass(frozen=True)
class _Halves:
    """What the rules of :func:`compile_paths` build on: routes and path halves.

    ``intra_*`` from :func:`_intra_routes`, ``src_*``/``dst_*`` from
    :func:`_rail_segments`, ``drops`` from :func:`_pcie_drops`; ``width``
    is the widest rule's row.
    """

    intra_links: np.ndarray
    intra_len: np.ndarray
    direct_nv: np.ndarray
    src_seg: np.ndarray
    src_len: np.ndarray
    dst_seg: np.ndarray
    dst_len: np.ndarray
    rank_rails: tuple[tuple[int, ...], ...]
    drops: dict[tuple[int, int], list[int]]
    width: int


#: One rule's paths: (src, dst, kind, via, links[M, width], length[M]).
_Block = tuple[np.ndarray, np.ndarray, PathKind, np.ndarray, np.ndarray, np.ndarray]


def _halves(fab: Fabric, kinds: tuple[str, ...]) -> _Halves:
    intra_links, intra_len, direct_nv = _intra_routes(fab)
    # The data plane's sends leave on the NICs NCCL gives each GPU; a model rule's
    # path set is a peer's (UCX: every nearest NIC, by distance).
    nic_rail, rank_nics = _nic_table(fab, share=not set(kinds) & set(MODEL_KINDS))
    src_seg, src_len, dst_seg, dst_len = _rail_segments(fab, intra_links, intra_len, rank_nics)
    rank_rails = tuple(tuple(sorted({n[0] for n in rank_nics[r]})) for r in range(fab.num_ranks))
    drops = _pcie_drops(fab, nic_rail, rank_rails) if "pcie" in kinds else {}
    # widest rule: a rail path (two halves), a spine path (own NIC halves and
    # two spine hops) or a pcie path (own NIC half and a drop)
    width = max(src_seg.shape[2] + dst_seg.shape[2],
                src_seg.shape[2] + max((len(p) for p in drops.values()), default=0))
    return _Halves(intra_links, intra_len, direct_nv, src_seg, src_len, dst_seg, dst_len,
                   rank_rails, drops, width)


def _intra_pairs(fab: Fabric) -> tuple[np.ndarray, np.ndarray]:
    """Every ordered pair of distinct ranks in one node, node by node."""
    g = fab.gpus_per_node
    s_loc, d_loc = np.meshgrid(np.arange(g), np.arange(g), indexing="ij")
    off = s_loc != d_loc
    nodes = np.arange(fab.num_nodes)
    s_all = (nodes[:, None, None] * g + s_loc[None]).reshape(-1)
    d_all = (nodes[:, None, None] * g + d_loc[None]).reshape(-1)
    keep = np.tile(off.reshape(-1), fab.num_nodes)
    return s_all[keep], d_all[keep]


def _direct_blocks(h: _Halves, s_i: np.ndarray, d_i: np.ndarray, g: int) -> list[_Block]:
    ln = h.intra_len[s_i, d_i % g]
    ok = ln > 0
    if not ok.any():
        return []
    lk = np.full((int(ok.sum()), h.width), -1, dtype=np.int32)
    lk[:, : h.intra_links.shape[2]] = h.intra_links[s_i[ok], d_i[ok] % g]
    return [(s_i[ok], d_i[ok], PathKind.DIRECT, np.full(ok.sum(), -1), lk, ln[ok])]


def _relay_blocks(h: _Halves, s_i: np.ndarray, d_i: np.ndarray, g: int) -> list[_Block]:
    """Relays through one GPU where both hops are single NVLinks."""
    blocks = []
    for i_loc in range(g):
        sel = (s_i % g != i_loc) & (d_i % g != i_loc)
        ss, dd = s_i[sel], d_i[sel]
        ii = (ss // g) * g + i_loc
        ok = h.direct_nv[ss, i_loc] & h.direct_nv[ii, dd % g]
        if not ok.any():
            continue
        ss, dd, ii = ss[ok], dd[ok], ii[ok]
        lk = np.full((ss.size, h.width), -1, dtype=np.int32)
        lk[:, 0] = h.intra_links[ss, i_loc, 0]
        lk[:, 1] = h.intra_links[ii, dd % g, 0]
        blocks.append((ss, dd, PathKind.RELAY, ii, lk, np.full(ss.size, 2)))
    return blocks


def _rail_blocks(h: _Halves, S: np.ndarray, D: np.ndarray, nrails: int) -> list[_Block]:
    blocks = []
    for x in range(nrails):
        ls, ld = h.src_len[S, x], h.dst_len[D, x]
        ok = (ls >= 0) & (ld >= 0)
        if not ok.any():
            continue
        ss, dd, ls, ld = S[ok], D[ok], ls[ok], ld[ok]
        lk = np.full((ss.size, h.width), -1, dtype=np.int32)
        lk[:, : h.src_seg.shape[2]] = h.src_seg[ss, x]
        rows = np.arange(ss.size)
        for c in range(h.dst_seg.shape[2]):
            vals = h.dst_seg[dd, x, c]
            m = vals >= 0
            lk[rows[m], ls[m] + c] = vals[m]
        blocks.append((ss, dd, PathKind.RAIL, np.full(ss.size, x), lk, ls + ld))
    return blocks


def _spine_blocks(fab: Fabric, h: _Halves, S: np.ndarray, D: np.ndarray,
                  every: bool) -> list[_Block]:
    """Spine paths of the pairs on different rails (``every``: the ``ecmp`` rule).

    A spine path starts and ends on the endpoints' own NICs: the rail path's
    source half and destination half where those halves need no forward.
    Without ``every`` (the ``spine`` rule) a pair with a PXN path (a rail
    path on the destination's rail, ``static``'s choice) gets none, and any
    other pair the one on spine ``(s + d) % K``, so that its route ``[s, d]``
    is the route the bytes take.
    """
    rail_vs = fab.vertices_of_kind(VertexKind.RAIL)
    spines = fab.vertices_of_kind(VertexKind.SPINE).tolist()
    first_rail = np.array([rr[0] if rr else -1 for rr in h.rank_rails])
    rs, rd = first_rail[S], first_rail[D]
    ok = (rs >= 0) & (rd >= 0) & (rs != rd)
    if not every:
        ok &= h.src_len[S, np.maximum(rd, 0)] < 0
    ss, dd, rs, rd = S[ok], D[ok], rs[ok], rd[ok]
    # up[k, x], down[k, x]: rail switch x -> spine k, and back
    up = np.array([[fab.link_id(int(v), sp) for v in rail_vs] for sp in spines])
    down = np.array([[fab.link_id(sp, int(v)) for v in rail_vs] for sp in spines])
    if every:
        picks = [(np.full(ss.size, k), ss, dd, rs, rd) for k in range(len(spines))]
    else:
        picks = [((ss + dd) % len(spines), ss, dd, rs, rd)]
    blocks: list[_Block] = []
    for k, s_, d_, x_, y_ in picks:
        one = np.ones(s_.size, dtype=np.int64)
        lk, ln = _join([(h.src_seg[s_, x_], h.src_len[s_, x_]), (up[k, x_], one),
                        (down[k, y_], one), (h.dst_seg[d_, y_], h.dst_len[d_, y_])], h.width)
        blocks.append((s_, d_, PathKind.SPINE, k, lk, ln))
    return blocks


def _pcie_blocks(h: _Halves, S: np.ndarray, D: np.ndarray, nr: int, nrails: int) -> list[_Block]:
    wd = max(len(p) for p in h.drops.values())
    drop = np.full((nr, nrails, wd), -1, dtype=np.int32)
    drop_len = np.full((nr, nrails), -1, dtype=np.int64)
    for (r, x), p in h.drops.items():
        drop[r, x, : len(p)] = p
        drop_len[r, x] = len(p)
    own = np.zeros((nr, max(nrails, 1)), dtype=bool)
    for r, rr in enumerate(h.rank_rails):
        own[r, list(rr)] = True
    blocks = []
    for x in range(nrails):
        # the source owns x (its half has no forward), the destination does
        # not and its node's NIC on x reaches it over PCIe
        ok = own[S, x] & (drop_len[D, x] >= 0)
        if not ok.any():
            continue
        ss, dd = S[ok], D[ok]
        lk, ln = _join([(h.src_seg[ss, x], h.src_len[ss, x]),
                        (drop[dd, x], drop_len[dd, x])], h.width)
        blocks.append((ss, dd, PathKind.PCIE, np.full(ss.size, x), lk, ln))
    return blocks


def _rule_blocks(fab: Fabric, kinds: tuple[str, ...], h: _Halves) -> list[_Block]:
    """Every rule's paths, in rule order, each block in (src, dst) order."""
    g = fab.gpus_per_node
    nrails = len(fab.rails)
    s_i, d_i = _intra_pairs(fab)
    blocks = _direct_blocks(h, s_i, d_i, g)
    if "relay" in kinds and g > 2:
        blocks += _relay_blocks(h, s_i, d_i, g)
    if fab.num_nodes > 1:
        ranks = np.arange(fab.num_ranks)
        S, D = np.meshgrid(ranks, ranks, indexing="ij")
        inter = (S // g) != (D // g)
        S, D = S[inter], D[inter]
        if "rail" in kinds:
            blocks += _rail_blocks(h, S, D, nrails)
        if ({"spine", "ecmp"} & set(kinds) and fab.vertices_of_kind(VertexKind.SPINE).size
                and nrails):
            blocks += _spine_blocks(fab, h, S, D, every="ecmp" in kinds)
        if "pcie" in kinds and h.drops:
            blocks += _pcie_blocks(h, S, D, fab.num_ranks, nrails)
    if not blocks:
        zero = np.zeros(0)
        blocks.append((zero, zero, PathKind.DIRECT, zero, np.zeros((0, h.width), dtype=np.int32),
                       zero))
    return blocks


def _path_set(fab: Fabric, blocks: list[_Block], kinds: tuple[str, ...], max_hops: int | None,
              rank_rails: tuple[tuple[int, ...], ...]) -> PathSet:
    """Join the rule blocks into one :class:`PathSet`, grouped by pair."""
    nr = fab.num_ranks
    src = np.concatenate([b[0] for b in blocks]).astype(np.int32)
    dst = np.concatenate([b[1] for b in blocks]).astype(np.int32)
    kind = np.concatenate([np.full(b[0].size, int(b[2]), dtype=np.int8) for b in blocks])
    via = np.concatenate([b[3] for b in blocks]).astype(np.int32)
    links = np.concatenate([b[4] for b in blocks])
    length = np.concatenate([b[5] for b in blocks]).astype(np.int32)
    if max_hops is not None:
        keep = length <= max_hops
        src, dst, kind, via, links, length = (a[keep] for a in (src, dst, kind, via, links, length))
    width_used = max(int(length.max()) if length.size else 1, 1)
    links = links[:, :width_used]
    pair = src.astype(np.int64) * nr + dst
    # Blocks are in rule order, each block in (src, dst) order; a stable sort
    # by pair keeps rule order within a pair, hence identical ids everywhere.
    order = np.argsort(pair, kind="stable")
    src, dst, kind, via, links, length, pair = (
        a[order] for a in (src, dst, kind, via, links, length, pair)
    )
    counts = np.bincount(pair, minlength=nr * nr)
    pair_ptr = np.zeros(nr * nr + 1, dtype=np.int64)
    np.cumsum(counts, out=pair_ptr[1:])
    _check_reachable(fab, counts, max_hops)
    for a in (pair_ptr, links, length, kind, via, src, dst):
        a.setflags(write=False)
    return PathSet(
        fabric=fab,
        num_ranks=nr,
        pair_ptr=pair_ptr,
        links=np.ascontiguousarray(links),
        length=length,
        kind=kind,
        via=via,
        src=src,
        dst=dst,
        kinds=kinds,
        max_hops=max_hops,
        rank_rails=rank_rails,
    )


def _check_reachable(fab: Fabric, counts: np.ndarray, max_hops: int | None) -> None:
    nr = fab.num_ranks
    missing = np.flatnonzero(counts == 0)
    missing = missing[missing // nr != missing % nr]
    if missing.size:
        s, d = divmod(int(missing[0]), nr)
        raise FabricError(
            f"fabric {fab.name!r}: no path from rank {s} ({fab.vertex_name(fab.rank_vertex[s])}) "
            f"to rank {d} ({fab.vertex_name(fab.rank_vertex[d])})"
            + (f" within max_hops={max_hops}" if max_hops is not None else "")
            + f"; {missing.size} ordered pairs have none"
        )


def check_rules(kinds: Any, max_hops: Any) -> tuple[str, ...]:
    """``kinds`` as a tuple in rule order, after checking both path-rule options.

    Raises
    ------
    FabricError
        ``kinds`` is not a sequence of known rule names, or ``max_hops`` is
        below 1.
    TypeError
        ``max_hops`` is neither ``None`` nor an integer.
    """
    if isinstance(kinds, (str, bytes)) or not isinstance(kinds, (tuple, list, set, frozenset)):
        raise FabricError(f"kinds must be a sequence of path kinds from {list(ALL_KINDS)}, "
                          f"got {kinds!r}")
    unknown = set(kinds) - set(ALL_KINDS)
    if unknown:
        raise FabricError(f"unknown path kinds {sorted(map(str, unknown))}; known: "
                          f"{list(ALL_KINDS)}")
    if max_hops is not None:
        _args.integer("max_hops", max_hops, minimum=1, error=FabricError)
    return tuple(sorted(set(kinds), key=ALL_KINDS.index))


def compile_paths(
    fab: Fabric,
    kinds: tuple[str, ...] | list[str] = DEFAULT_KINDS,
    max_hops: int | None = None,
) -> PathSet:
    """Compile the candidate paths of every ordered rank pair.

    Parameters
    ----------
    fab
        The fabric.
    kinds
        Which rules to apply, a subset of ``("direct", "relay", "rail",
        "spine", "pcie")``; default :data:`DEFAULT_KINDS` (all but
        ``pcie``). ``direct`` is always applied for intra-node pairs that
        have a direct route.
    max_hops
        Drop candidate paths with more links than this.

    Results are cached on the fabric per ``(kinds, max_hops)``; use
    :func:`candidate_paths`, which does that.

    Raises
    ------
    FabricError
        If some ordered GPU pair has no candidate path.

    Examples
    --------
    >>> import pathweave as pw
    >>> ps = pw.fabric.candidate_paths(pw.fabric.preset("h100-2x4"))
    >>> [ps.describe(p).split(":")[0] for p in ps.pair_paths(0, 1)]
    ['direct', 'relay(via rank 2)', 'relay(via rank 3)']
    >>> [ps.rail_role(p) for p in ps.pair_paths(0, 5)]
    ['rd', 'dr', 'drd', 'drd']
    >>> ps.describe(ps.pair_paths(0, 5)[1]).split(":")[0]
    'rail(dr, rail1)'
    >>> ps.path_vertices(ps.pair_paths(0, 5)[1])  # doctest: +NORMALIZE_WHITESPACE
    ['n0.gpu0', 'n0.gpu1', 'n0.pcie1', 'n0.nic1', 'rail1', 'n1.nic1', 'n1.pcie1', 'n1.gpu1']

    The ``pcie`` rule only where asked for (the UCX model):

    >>> ucx = pw.fabric.candidate_paths(ps.fabric, (*ps.kinds, "pcie"))
    >>> [ucx.rail_role(p) for p in ucx.pair_paths(0, 5)]
    ['rd', 'dr', 'drd', 'drd', 'pcie']
    >>> ucx.path_vertices(ucx.pair_paths(0, 5)[4])  # doctest: +NORMALIZE_WHITESPACE
    ['n0.gpu0', 'n0.pcie0', 'n0.nic0', 'rail0', 'n1.nic0', 'n1.pcie0', 'n1.cpu0', 'n1.pcie1',
     'n1.gpu1']
    """
    kinds = check_rules(kinds, max_hops)
    h = _halves(fab, kinds)
    return _path_set(fab, _rule_blocks(fab, kinds, h), kinds, max_hops, h.rank_rails)


def candidate_paths(
    fab: Fabric,
    kinds: tuple[str, ...] | list[str] = DEFAULT_KINDS,
    max_hops: int | None = None,
) -> PathSet:
    """Cached :func:`compile_paths`: a fabric compiles each rule set once."""
    # NOTE: the default rules' key is made once: every plan looks its paths up.
    rules = _DEFAULT_RULES if kinds is DEFAULT_KINDS else tuple(sorted(set(kinds)))
    key = (rules, max_hops)

    def build() -> PathSet:
        from pathweave.fabric._limits import check_fabric

        check_fabric(fab)  # refuse a path set larger than memory before building it
        return compile_paths(fab, kinds, max_hops)

    return fabric_path_cache(fab).get_or_build(key, build)  # type: ignore[no-any-return]


def fabric_path_cache(fab: Fabric) -> Cache[Any]:
    """The path sets kept with ``fab`` (:func:`candidate_paths`'s, groups' subset paths).

    The :data:`PATH_SETS` most recently used are kept: a path set of a large
    fabric takes much memory.
    """
    return Cache.on(fab, "_path_cache", PATH_SETS)
