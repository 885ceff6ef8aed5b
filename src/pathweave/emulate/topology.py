"""A :class:`~pathweave.fabric.Fabric` as Linux network pieces: pure data, no root needed.

:func:`build_layout` maps a fabric, scaled in capacity, onto

* one network namespace per rank (``{prefix}-r{rank}``) and per spine
  (``{prefix}-s{k}``): these are the *routers*, each with an identity /32
  address on a veth (``id0``) whose peer (``id1``) stays in the namespace
  (the kernels this runs on have no dummy interfaces);
* one bridge per switch vertex (NVSwitch, PCIe host, rail switch, a NIC
  shared by several GPUs), all in one namespace ``{prefix}-sw``;
* one veth pair per duplex cable of the fabric: a GPU-GPU NVLink joins two
  rank namespaces; a GPU-NVSwitch link is a port of the GPU into the
  NVSwitch bridge; a NIC that serves one GPU is folded into its GPU, so its
  network cable becomes a port of the GPU into the rail bridge, shaped at the
  smaller of the PCIe and network capacities of each direction (both carry
  exactly the same bytes); spine links are ports of the spine into rail
  bridges;
* a ``tbf`` qdisc on the egress of every veth end, one per directed link
  (or, with ``shaping="ackfirst"``, an htb of the same rate and bucket that
  sends pure acknowledgements first, :func:`._ip.htb_ackfirst`): the
  interface ``l{link_id}`` shapes fabric link ``link_id``;
* host routes in every router so that traffic to a rank leaves on the link
  the fabric says: each ordered rank pair follows the path the ``static``
  policy gives it (direct inside a node, PXN across nodes), installed as
  per-destination next hops (``ip route add DST/32 dev l.. via NEXT onlink``).

Rates: the emulated link carries ``capacity_Bps * scale`` bytes of TCP
payload per second. ``tbf`` counts wire bytes, so the configured rate adds
the framing of full segments, ``(mtu + 14) / (mtu - 52)`` (Ethernet header;
IPv4 + TCP with timestamps): on a 1500-byte MTU, 4.6 % more.

Examples
--------
>>> import pathweave as pw
>>> from pathweave.emulate.topology import build_layout
>>> lay = build_layout(pw.fabric.preset("h100-2x4"), scale=1e-4)
>>> lay.rank_ns[:2], lay.rank_address[5]
(('pw-r0', 'pw-r1'), '10.211.0.6')
>>> len(lay.veths), len(lay.shaped)     # 12 NVLink cables + 8 NIC ports; 2 ends each
(20, 40)
>>> [lay.ns_name(s) for s in lay.pair_stops[0][5]]   # PXN: over GPU 1's NIC on rail 1
['pw-r0', 'pw-r1', 'pw-r5']
>>> round(lay.payload_Bps(lay.fabric.link_id("n0.nic1", "rail1")) / 1e6, 3)   # MB/s
5.0
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pathweave.emulate._ip import SHAPINGS
from pathweave.emulate._ip import queue_bytes as _queue_bytes
from pathweave.errors import FabricError, InputError
from pathweave.fabric import Fabric, VertexKind

__all__ = [
    "DEFAULT_BURST_BYTES",
    "DEFAULT_LATENCY_S",
    "DEFAULT_SHAPING",
    "MIN_OUTPUT_LIMIT_BYTES",
    "NOTSENT_LOWAT_BYTES",
    "PREFIX_RE",
    "SHAPINGS",
    "Layout",
    "Port",
    "Route",
    "Veth",
    "build_layout",
    "framing_factor",
]

#: Smallest token-bucket depth: a 64 KiB TSO segment must always fit.
DEFAULT_BURST_BYTES = 128 * 1024
#: tbf queue latency. A 50 ms queue starved one direction of a busy link here.
DEFAULT_LATENCY_S = 5e-3
#: How every directed link is shaped unless asked otherwise (:data:`SHAPINGS`).
DEFAULT_SHAPING = "ackfirst"
#: Unsent bytes a rank's TCP socket may hold (``net.ipv4.tcp_notsent_lowat``): 26 ms of a
#: 5 MB/s rail. Unbounded, autotuning grew a busy rail socket's buffer to 1.4-1.6 MB
#: (300 ms of that rail, a queue no GPU link has), and a forward or a slot credit
#: written to it waited behind all of it.
NOTSENT_LOWAT_BYTES = 128 * 1024
#: Floor of :meth:`Layout.output_limit_bytes`: two full 8 KiB-ish segments in flight below a
#: socket keep it sending on the emulator's MB/s links.
MIN_OUTPUT_LIMIT_BYTES = 16 * 1024
#: Identity networks: ranks in 10.211/16, spines in 10.212/16.
_RANK_NET, _SPINE_NET = 211, 212
#: What a pathweave emulator prefix looks like (``pw``, ``pwt``, ``pw2``...).
#: Most router namespaces (GPUs + spines) one emulator creates.
MAX_NAMESPACES = 256
PREFIX_RE = re.compile(r"^pw[a-z0-9]{0,4}$")
#: Names of every namespace an emulator creates, for any prefix.
NS_RE = re.compile(r"^(pw[a-z0-9]{0,4})-(r\d+|s\d+|sw)$")

_ROUTER_KINDS = (VertexKind.GPU, VertexKind.SPINE)


def framing_factor(mtu: int) -> float:
    """Wire bytes per TCP payload byte for full segments on ``mtu``.

    Examples
    --------
    >>> round(framing_factor(1500), 4)
    1.0456
    """
    if mtu < 576:
        raise InputError(f"mtu must be >= 576, got {mtu}")
    return (mtu + 14) / (mtu - 52)


@dataclass(frozen=True)
class Port:
    """One end of a veth pair.

    ``links`` are the fabric links this end's egress carries (a folded NIC
    port carries its PCIe and network link); ``payload_Bps`` their smallest
    scaled capacity; ``bridge`` the bridge it is a port of (in the switch
    namespace), if any.
    """

    ns: str
    dev: str
    links: tuple[int, ...]
    payload_Bps: float
    bridge: str | None = None


@dataclass(frozen=True)
class Veth:
    """A duplex cable: two ports, one per direction."""

    a: Port
    b: Port


@dataclass(frozen=True)
class Route:
    """``ip route add DST/32 dev DEV [via VIA onlink] src SRC`` in namespace ``ns``."""

    ns: str
    dst: str
    dev: str
    via: str | None
    src: str


@dataclass(frozen=True, eq=False)
class Layout:
    """Everything an emulator of ``fabric`` creates, as data.

    Attributes
    ----------
    fabric, scale, prefix, mtu, burst_bytes, latency_s, shaping
        The inputs.
    routers
        Vertex ids that get a namespace (GPUs, then spines), in that order.
    namespaces
        Every namespace name, routers first, then the switch namespace (if any).
    rank_ns, rank_address
        Namespace and identity address of each rank.
    bridges
        ``(vertex id, bridge device)`` of each switch vertex; all live in
        ``switch_ns``.
    veths
        The cables.
    routes
        Host routes, in installation order.
    pair_stops
        ``pair_stops[a][b]``: the router vertices traffic from rank ``a`` to
        rank ``b`` passes, ends included, as installed.
    link_dev
        ``link_dev[link id] = (namespace, interface)`` whose egress shapes it.
    unmodelled
        Links the emulator leaves out: a PCIe tree's uplinks and inter-socket
        links on nodes whose GPUs talk over NVLink (kernel routes are per
        destination, so the root-complex route of the ``pcie`` path rule
        cannot be installed beside a GPU's NVLink route).
    """

    fabric: Fabric
    scale: float
    prefix: str
    mtu: int
    burst_bytes: int
    latency_s: float
    routers: tuple[int, ...]
    router_ns: dict[int, str]
    router_address: dict[int, str]
    namespaces: tuple[str, ...]
    switch_ns: str | None
    bridges: tuple[tuple[int, str], ...]
    veths: tuple[Veth, ...]
    routes: tuple[Route, ...]
    pair_stops: tuple[tuple[tuple[int, ...], ...], ...]
    link_dev: dict[int, tuple[str, str]] = field(repr=False)
    unmodelled: tuple[int, ...] = ()
    shaping: str = DEFAULT_SHAPING

    # ---------------------------------------------------------------- views
    @property
    def num_ranks(self) -> int:
        return self.fabric.num_ranks

    @property
    def rank_ns(self) -> tuple[str, ...]:
        fab = self.fabric
        return tuple(self.router_ns[int(v)] for v in fab.rank_vertex)

    @property
    def rank_address(self) -> tuple[str, ...]:
        fab = self.fabric
        return tuple(self.router_address[int(v)] for v in fab.rank_vertex)

    def ns_name(self, vertex: int) -> str:
        """Namespace of a router vertex."""
        return self.router_ns[int(vertex)]

    @property
    def shaped(self) -> tuple[Port, ...]:
        """Every shaped veth end."""
        return tuple(p for v in self.veths for p in (v.a, v.b))

    def payload_Bps(self, link: int) -> float:
        """Bytes of TCP payload per second the emulated ``link`` carries."""
        ns, dev = self.link_dev[int(link)]
        for p in self.shaped:
            if p.ns == ns and p.dev == dev:
                return p.payload_Bps
        raise KeyError(link)  # unreachable: link_dev only names shaped ports

    def wire_rate_bps(self, port: Port) -> int:
        """The tbf rate of ``port`` in bits per second of wire traffic."""
        return max(8, round(port.payload_Bps * 8 * framing_factor(self.mtu)))

    def burst_for(self, port: Port) -> int:
        """tbf bucket depth: at least :data:`DEFAULT_BURST_BYTES` and 4 ms of traffic."""
        return max(self.burst_bytes, round(port.payload_Bps * framing_factor(self.mtu) * 4e-3))

    def queue_bytes(self, port: Port) -> int:
        """Bytes the qdisc of ``port`` holds before it drops (:func:`._ip.queue_bytes`)."""
        return _queue_bytes(self.wire_rate_bps(port), self.burst_for(port), self.latency_s)

    def output_limit_bytes(self) -> int:
        """``net.ipv4.tcp_limit_output_bytes`` of every router namespace.

        A rank's own packets meet its links' qdiscs with no hop between. One
        dropped there never reaches the wire: the socket is told so, halves
        its window and sends again only on an acknowledgement or a timer.
        Unbounded (1 MiB or more a socket, Linux's default), a rank's N - 1
        gloo sockets overflowed a rail's queue by themselves: 300-640 drops
        per rank port in six stencil calls, and calls on lightly shared
        links (a 2-D stencil's rail pairs) ending 5-20 % late in half the
        calls. Each socket may keep the smallest queue over N - 1 below it,
        so a rank's own sends never overflow a queue (no drops, no tails;
        docs/emulator.md, "Own-queue drops").

        Examples
        --------
        >>> import pathweave as pw
        >>> lay = build_layout(pw.fabric.preset("h100-2x4"), scale=1e-4)
        >>> lay.output_limit_bytes()   # (5 ms of a 5 MB/s rail on the wire + 128 KiB) // 7
        22458
        """
        queue = min((self.queue_bytes(p) for p in self.shaped), default=0)
        return max(MIN_OUTPUT_LIMIT_BYTES, queue // max(1, self.num_ranks - 1))

    def refill_s(self) -> float:
        """Longest time an emptied tbf bucket takes to fill again (over every shaped port).

        A link idle this long starts the next transfer with its whole burst;
        the runs wait this long before each timed call, so every call starts
        from the same full buckets, whatever the call before it drained.

        Examples
        --------
        >>> import pathweave as pw
        >>> lay = build_layout(pw.fabric.preset("h100-2x4"), scale=1e-4)
        >>> round(lay.refill_s() * 1e3, 1)   # 128 KiB over a 5 MB/s rail, on the wire, ms
        25.1
        """
        ff = framing_factor(self.mtu)
        return max((self.burst_for(p) / (p.payload_Bps * ff) for p in self.shaped), default=0.0)

    def scaled_fabric(self) -> Fabric:
        """The fabric with every capacity multiplied by ``scale``: what the emulator carries."""
        return scale_fabric(self.fabric, self.scale)

    def total_payload_Bps(self) -> float:
        """Sum of all shaped capacities (each direction counted)."""
        return float(sum(p.payload_Bps for p in self.shaped))

    # ------------------------------------------------------------ commands
    def setup_commands(self) -> list[list[str]]:
        """The argv lists that build the emulator, in order (see :mod:`._ip`)."""
        from pathweave.emulate import _ip

        cmds: list[list[str]] = []
        for ns in self.namespaces:
            cmds.append(_ip.netns_add(ns))
            cmds.append(_ip.link_up(ns, "lo"))
        for v in self.routers:
            ns = self.router_ns[v]
            # Routers forward others' traffic (PXN, spines); routes are
            # asymmetric by design, so reverse-path filtering must be off.
            cmds.append(_ip.sysctl(ns, {
                "net.ipv4.ip_forward": 1,
                "net.ipv4.conf.all.rp_filter": 0,
                "net.ipv4.conf.default.rp_filter": 0,
                "net.ipv4.conf.all.send_redirects": 0,
                "net.ipv4.conf.default.send_redirects": 0,
                "net.ipv4.tcp_notsent_lowat": NOTSENT_LOWAT_BYTES,
                "net.ipv4.tcp_limit_output_bytes": self.output_limit_bytes(),
            }))
            cmds.append(_ip.veth_add(ns, "id0", ns, "id1"))
            cmds.append(_ip.addr_add(ns, "id0", f"{self.router_address[v]}/32"))
            cmds.append(_ip.link_up(ns, "id0"))
            cmds.append(_ip.link_up(ns, "id1"))
        for _, br in self.bridges:
            assert self.switch_ns is not None
            cmds.append(_ip.bridge_add(self.switch_ns, br))
            cmds.append(_ip.link_up(self.switch_ns, br))
        for cable in self.veths:
            cmds.append(_ip.veth_add(cable.a.ns, cable.a.dev, cable.b.ns, cable.b.dev,
                                     mtu=self.mtu))
            for p in (cable.a, cable.b):
                if p.bridge is not None:
                    cmds.append(_ip.link_master(p.ns, p.dev, p.bridge))
                cmds += _ip.shape(self.shaping, p.ns, p.dev, self.wire_rate_bps(p),
                                  self.burst_for(p), self.latency_s, mtu=self.mtu)
                cmds.append(_ip.link_up(p.ns, p.dev))
        for r in self.routes:
            cmds.append(_ip.route_add(r.ns, r.dst, r.dev, via=r.via, src=r.src))
        return cmds


def scale_fabric(fabric: Fabric, scale: float) -> Fabric:
    """A copy of ``fabric`` with every capacity multiplied by ``scale`` (0 < scale <= 1).

    Examples
    --------
    >>> import pathweave as pw
    >>> fab = scale_fabric(pw.fabric.preset("h100-2x4"), 1e-4)
    >>> float(fab.capacity_Bps[0]) / 1e6
    12.0
    """
    s = _scale_arg(scale)
    return fabric.with_links({i: s for i in range(fabric.num_links)},
                             name=f"{fabric.name}-x{s:g}")


def _scale_arg(scale: float) -> float:
    s = float(scale)
    if not (0 < s <= 1) or not np.isfinite(s):
        raise InputError(f"scale must lie in (0, 1], got {scale!r}")
    return s


def _address(net: int, index: int) -> str:
    if index >= 250 * 256:
        raise FabricError(f"the emulator numbers at most {250 * 256} routers, got index {index}")
    return f"10.{net}.{index // 250}.{index % 250 + 1}"


def build_layout(
    fabric: Fabric,
    scale: float,
    *,
    prefix: str = "pw",
    mtu: int = 1500,
    burst_bytes: int = DEFAULT_BURST_BYTES,
    latency_s: float = DEFAULT_LATENCY_S,
    routes: Sequence[Sequence[int]] | None = None,
    shaping: str = DEFAULT_SHAPING,
) -> Layout:
    """The namespaces, bridges, cables, shaping and routes that emulate ``fabric``.

    Parameters
    ----------
    fabric
        Any fabric whose links come in duplex pairs; NVLink meshes, NVSwitch
        and PCIe-host nodes, rails and spines are supported. A NIC serving one
        GPU is folded into that GPU's namespace; a NIC shared by several GPUs
        becomes a bridge. A PCIe switch with one GPU below it is folded into
        that GPU's namespace with its NICs; on NVLink nodes the root
        complexes' links are left out (:attr:`Layout.unmodelled`).
    scale
        Capacity scale in ``(0, 1]``: a 120 GB/s link becomes 12 MB/s at 1e-4.
    prefix
        Start of every name created (``pw``, or ``pw`` and up to 4 more
        lower-case letters or digits), so stale pieces can be found.
    mtu, burst_bytes, latency_s
        Interface MTU; tbf bucket depth (at least 128 KiB) and queue latency.
    shaping
        How each directed link is shaped, one of :data:`SHAPINGS`:
        ``tbf`` (a token bucket and one queue) or ``ackfirst`` (the same rate,
        bucket and queue limit in an htb that sends pure TCP acknowledgements
        before queued data; see docs/emulator.md).
    routes
        Optional ``routes[a][b]``: a path id (of
        ``pathweave.fabric.candidate_paths(fabric)``) per ordered pair that the
        kernel's routes follow; default: the ``static`` policy's paths.

    Raises
    ------
    FabricError
        A link without its reverse, a NIC joined to two networks, a loop of
        bridges (spines must be the only switches with several uplinks).
    InputError
        Bad ``scale``, ``prefix``, ``mtu``, ``burst_bytes``, ``latency_s`` or ``shaping``.
    FabricError
        A fabric the emulator cannot model, or more than :data:`MAX_NAMESPACES`
        GPUs and spines.
    """
    s = _check_layout_args(fabric, scale, prefix, mtu, burst_bytes, latency_s)
    if shaping not in SHAPINGS:
        raise InputError(f"shaping must be one of {', '.join(SHAPINGS)}, got {shaping!r}")
    fab = fabric
    routers, router_ns, router_address = _routers(fab, prefix)
    reverse = _reverse_links(fab)
    # NVLink nodes: the PCIe tree above the switches carries no GPU-GPU route
    host = fab.vertex_kind == VertexKind.HOST
    unmodelled = frozenset(
        np.flatnonzero(host[fab.link_src] | host[fab.link_dst]).tolist()
        if fab.nvlink_kind in ("nvswitch", "nvlink-mesh") else ())
    neighbours: dict[int, list[int]] = {}
    for (u, v), lid in reverse.items():
        if lid not in unmodelled:
            neighbours.setdefault(u, []).append(v)

    owner, inner_up, inner_down = _fold(fab, neighbours, reverse)
    bridge_vertices = [
        v for v in range(fab.num_vertices)
        if v not in owner and fab.vertex_kind[v] not in _ROUTER_KINDS and neighbours.get(v)
    ]
    switch_ns = f"{prefix}-sw" if bridge_vertices else None
    bridges = tuple((v, f"b{v}") for v in bridge_vertices)
    cab = _Cabling(fab, fab.capacity_Bps * s, router_ns, switch_ns, dict(bridges), owner)
    veths = cab.cables(reverse, unmodelled, inner_up, inner_down)
    route_list, pair_stops = _routes(fab, routes, cab, router_address, len(routers))
    namespaces = tuple(router_ns[v] for v in routers) + ((switch_ns,) if switch_ns else ())
    return Layout(
        fabric=fab, scale=s, prefix=prefix, mtu=int(mtu), burst_bytes=int(burst_bytes),
        latency_s=float(latency_s), routers=routers, router_ns=router_ns,
        router_address=router_address, namespaces=namespaces, switch_ns=switch_ns,
        bridges=bridges, veths=veths, routes=route_list,
        pair_stops=pair_stops, link_dev=cab.link_dev, unmodelled=tuple(sorted(unmodelled)),
        shaping=shaping,
    )


def _check_layout_args(fab: Fabric, scale: float, prefix: str, mtu: int,
                       burst_bytes: int, latency_s: float) -> float:
    """:func:`build_layout`'s argument checks; returns the scale as a float."""
    s = _scale_arg(scale)
    if not isinstance(prefix, str) or not PREFIX_RE.match(prefix):
        raise InputError(f"prefix must be 'pw' followed by up to 4 of [a-z0-9], got {prefix!r}")
    framing_factor(mtu)
    if int(burst_bytes) < DEFAULT_BURST_BYTES:
        raise InputError(
            f"burst_bytes must be >= {DEFAULT_BURST_BYTES} (a TSO segment must fit), "
            f"got {burst_bytes}"
        )
    if not latency_s > 0:
        raise InputError(f"latency_s must be > 0, got {latency_s!r}")
    routers_wanted = fab.num_ranks + int(fab.vertices_of_kind(VertexKind.SPINE).size)
    if routers_wanted > MAX_NAMESPACES:
        raise FabricError(
            f"fabric {fab.name} needs {routers_wanted} namespaces (one per GPU and spine); the "
            f"emulator makes at most {MAX_NAMESPACES} (each rank is a process on this machine)"
        )
    return s


def _routers(fab: Fabric, prefix: str) -> tuple[tuple[int, ...], dict[int, str], dict[int, str]]:
    """Router vertices (GPUs, then spines), their namespaces and identity addresses."""
    gpus = [int(v) for v in fab.rank_vertex]
    spines = [int(v) for v in fab.vertices_of_kind(VertexKind.SPINE)]
    router_ns = {v: f"{prefix}-r{r}" for r, v in enumerate(gpus)}
    router_ns.update({v: f"{prefix}-s{k}" for k, v in enumerate(spines)})
    router_address = {v: _address(_RANK_NET, r) for r, v in enumerate(gpus)}
    router_address.update({v: _address(_SPINE_NET, k) for k, v in enumerate(spines)})
    return tuple(gpus + spines), router_ns, router_address


def _reverse_links(fab: Fabric) -> dict[tuple[int, int], int]:
    """``{(src vertex, dst vertex): link id}``; every link must have its reverse."""
    reverse: dict[tuple[int, int], int] = {}
    for lid in range(fab.num_links):
        reverse[(int(fab.link_src[lid]), int(fab.link_dst[lid]))] = lid
    for (u, v), lid in reverse.items():
        if (v, u) not in reverse:
            raise FabricError(
                f"link {fab.link_name(lid)} has no reverse link; the emulator needs duplex cables"
            )
    return reverse


class _Cabling:
    """The veth cables of a layout and which port's egress shapes each link."""

    def __init__(self, fab: Fabric, cap: np.ndarray, router_ns: dict[int, str],
                 switch_ns: str | None, bridge_dev: dict[int, str], owner: dict[int, int]):
        self.fab, self.cap, self.router_ns = fab, cap, router_ns
        self.switch_ns, self.bridge_dev, self.owner = switch_ns, bridge_dev, owner
        self.link_dev: dict[int, tuple[str, str]] = {}

    def entity(self, v: int) -> int:
        """The router or bridge vertex ``v`` belongs to (itself unless folded)."""
        return self.owner.get(v, v)

    def end(self, at: int, links: tuple[int, ...]) -> Port:
        """The port at entity ``at`` whose egress carries ``links`` (in path order).

        It is named after the last of them that leaves ``at`` itself (not a
        NIC folded into the far end), which is unique per direction.
        """
        fab, cap = self.fab, self.cap
        dev = f"l{[lid for lid in links if self.entity(int(fab.link_src[lid])) == at][-1]}"
        if at in self.router_ns:
            p = Port(self.router_ns[at], dev, links, float(min(cap[list(links)])))
        else:
            assert self.switch_ns is not None
            p = Port(self.switch_ns, dev, links, float(min(cap[list(links)])),
                     self.bridge_dev[at])
        for lid in links:
            self.link_dev[lid] = (p.ns, p.dev)
        return p

    def cables(self, reverse: dict[tuple[int, int], int], unmodelled: frozenset,
               inner_up: dict[int, tuple[int, ...]],
               inner_down: dict[int, tuple[int, ...]]) -> tuple[Veth, ...]:
        """Each duplex pair once; folded NIC cables merged with their PCIe hops."""
        fab = self.fab
        veths: list[Veth] = []
        done: set[int] = set()
        bridge_graph: dict[int, set[int]] = {}
        for lid in range(fab.num_links):
            if lid in done or lid in unmodelled:
                continue
            u, v = int(fab.link_src[lid]), int(fab.link_dst[lid])
            back = reverse[(v, u)]
            done.update((lid, back))
            ea, eb = self.entity(u), self.entity(v)
            if ea == eb and (u in self.owner or v in self.owner):
                continue  # a PCIe hop inside a GPU's folded NICs and switch: merged into cables
            # A folded NIC or switch at an end: that end's egress also carries the
            # PCIe hops from its GPU before it, and the other end's egress the hops
            # back to the GPU after it.
            out_a = (*inner_up.get(u, ()), lid, *inner_down.get(v, ()))
            out_b = (*inner_up.get(v, ()), back, *inner_down.get(u, ()))
            if ea == eb:
                raise FabricError(f"link {fab.link_name(lid)} joins a GPU to itself through a NIC")
            veths.append(Veth(self.end(ea, out_a), self.end(eb, out_b)))
            if ea not in self.router_ns and eb not in self.router_ns:
                bridge_graph.setdefault(ea, set()).add(eb)
                bridge_graph.setdefault(eb, set()).add(ea)
        _check_forest(bridge_graph, fab)
        return tuple(veths)


def _routes(fab: Fabric, routes: Sequence[Sequence[int]] | None, cab: _Cabling,
            router_address: dict[int, str], num_routers: int) -> tuple[tuple[Route, ...], tuple]:
    """Per-destination next hops along the chosen pair paths, and each pair's stops."""
    paths = _pair_paths(fab, routes)
    n = fab.num_ranks
    router_ns = cab.router_ns
    table: dict[tuple[int, int], tuple[str, int]] = {}  # (router, dst rank) -> (dev, next router)
    order = sorted(((len(st), a, b, st, devs) for (a, b), (st, devs) in
                    ((k, _stops(fab, p, cab.entity, cab.link_dev, router_ns))
                     for k, p in paths.items())))
    for _, _a, b, st, devs in order:
        for i in range(len(st) - 1):
            table.setdefault((st[i], b), (devs[i], st[i + 1]))
    route_list: list[Route] = []
    for (rv, b), (dev, nxt) in sorted(table.items()):
        dst_v = int(fab.rank_vertex[b])
        route_list.append(Route(
            router_ns[rv], router_address[dst_v], dev,
            None if nxt == dst_v else router_address[nxt], router_address[rv],
        ))
    pair_stops: list[tuple[tuple[int, ...], ...]] = []
    for a in range(n):
        row = []
        for b in range(n):
            if a == b:
                row.append((int(fab.rank_vertex[a]),))
                continue
            cur, dst_v, seen = int(fab.rank_vertex[a]), int(fab.rank_vertex[b]), []
            while cur != dst_v:
                seen.append(cur)
                if len(seen) > num_routers or (cur, b) not in table:
                    raise FabricError(f"routes from rank {a} to rank {b} do not reach it")
                cur = table[(cur, b)][1]
            row.append((*seen, dst_v))
        pair_stops.append(tuple(row))
    return tuple(route_list), tuple(pair_stops)


def _fold(fab: Fabric, neighbours: dict[int, list[int]], reverse: dict[tuple[int, int], int]
          ) -> tuple[dict[int, int], dict[int, tuple[int, ...]], dict[int, tuple[int, ...]]]:
    """Vertices folded into a GPU's router: its NICs and the PCIe switch between them.

    A PCIe switch with one GPU below it (the rest NICs and at most one root
    complex) belongs to that GPU; a NIC joined to one GPU, or to one such
    switch, and at most one other vertex belongs to that GPU. Returns
    ``(owner, up, down)``: each folded vertex's GPU and the links from the
    GPU to it and back, which the cables through it carry.
    """
    kind = fab.vertex_kind
    owner: dict[int, int] = {}
    up: dict[int, tuple[int, ...]] = {}
    down: dict[int, tuple[int, ...]] = {}
    for sw in fab.vertices_of_kind(VertexKind.PCIE_SWITCH).tolist():
        nb = neighbours.get(sw, [])
        gpus = [x for x in nb if kind[x] == VertexKind.GPU]
        hosts = [x for x in nb if kind[x] == VertexKind.HOST]
        if len(gpus) == 1 and len(hosts) <= 1 and all(
                kind[x] in (VertexKind.GPU, VertexKind.NIC, VertexKind.HOST) for x in nb):
            g = gpus[0]
            owner[sw], up[sw], down[sw] = g, (reverse[(g, sw)],), (reverse[(sw, g)],)
    for nic in fab.vertices_of_kind(VertexKind.NIC).tolist():
        nb = neighbours.get(nic, [])
        via = [x for x in nb if kind[x] == VertexKind.GPU or x in owner]
        rest = [x for x in nb if x not in via]
        if len(via) != 1 or len(rest) > 1:
            continue
        x = via[0]
        owner[nic] = owner.get(x, x)
        up[nic] = (*up.get(x, ()), reverse[(x, nic)])
        down[nic] = (reverse[(nic, x)], *down.get(x, ()))
    return owner, up, down


def _check_forest(graph: dict[int, set[int]], fab: Fabric) -> None:
    """Bridges joined to bridges must form no loop (no spanning tree runs here)."""
    seen: set[int] = set()
    for start in sorted(graph):
        if start in seen:
            continue
        stack = [(start, -1)]
        while stack:
            v, parent = stack.pop()
            if v in seen:
                raise FabricError(
                    f"switches around {fab.vertex_name(v)} form a loop of bridges; "
                    "the emulator needs loop-free switching (spines route, they do not bridge)"
                )
            seen.add(v)
            stack.extend((w, v) for w in graph[v] if w != parent)


def _pair_paths(fab: Fabric, routes: Sequence[Sequence[int]] | None) -> dict:
    from pathweave.fabric import candidate_paths

    ps = candidate_paths(fab)
    n = fab.num_ranks
    out: dict[tuple[int, int], np.ndarray] = {}
    if routes is None:
        from pathweave.plan.static import static_pins

        pins = static_pins(ps)
        chosen = {int(k): int(pins[k]) for k in np.flatnonzero(pins >= 0)}
    else:
        chosen = {}
        for a in range(n):
            for b in range(n):
                if a != b:
                    pid = int(routes[a][b])
                    if not (0 <= pid < ps.num_paths) or ps.src[pid] != a or ps.dst[pid] != b:
                        raise FabricError(f"routes[{a}][{b}] = {pid} is not a path from {a} to {b}")
                    chosen[a * n + b] = pid
    for key, pid in chosen.items():
        row = ps.links[pid]
        out[(key // n, key % n)] = row[row >= 0].astype(np.int64)
    return out


def _stops(fab: Fabric, links: np.ndarray, entity, link_dev, router_ns) -> tuple:
    """Routers a path passes and the device each of them sends on."""
    src = entity(int(fab.link_src[links[0]]))
    stops, devs = [src], []
    for lid in links.tolist():
        su, dv = entity(int(fab.link_src[lid])), entity(int(fab.link_dst[lid]))
        if lid not in link_dev:
            raise FabricError(f"route over {fab.link_name(lid)}: the emulator leaves out the "
                              "PCIe root complex of NVLink nodes")
        ns, dev = link_dev[lid]
        # The stop's own egress port (not the bridge-side port of a link into it).
        if su == stops[-1] and len(devs) < len(stops) and ns == router_ns[su]:
            devs.append(dev)
        if dv in router_ns and dv != stops[-1]:
            stops.append(dv)
    return tuple(stops), tuple(devs)
