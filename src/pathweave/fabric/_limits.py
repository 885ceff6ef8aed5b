"""How large a fabric pathweave will build, and what hardware can physically be.

Candidate paths grow with the square of the rank count (every ordered pair
gets a direct or relayed path per rail and spine), so a spec such as
``dgx-h100:nodes=100000`` would take minutes and far more memory than the
machine has before failing. :func:`check_size` estimates the path set from
the fabric's shape and refuses, naming the estimate and the limit, before
anything is built. The same check runs for presets (from their parameters),
for files (once loaded) and in :func:`pathweave.fabric.candidate_paths`.

:func:`check_physical` refuses fabrics no hardware can be: more NVLinks per
GPU than its model has (``NV99`` between two H100s), NVLink or NIC rates
above the fastest made, more NICs per GPU than any system ships. Every
loader runs it (:func:`pathweave.fabric.resolve` through
:func:`~pathweave.fabric.presets.preset` and
:func:`~pathweave.fabric.presets.load_topology`); the sources of the
figures are in docs/fabric-schema.md, "Physical limits".
"""

from __future__ import annotations

import os

from pathweave.errors import FabricError

#: Peak bytes per candidate path while compiling (tracemalloc, dgx-h100 at 2
#: to 64 nodes and cluster with spines: 178-216 bytes); rounded up.
BYTES_PER_PATH = 220
#: Most directed links a fabric may have (the builders need ~4 s per million).
MAX_LINKS = 1 << 20
#: Environment variable that sets the memory limit in GB instead of half the RAM.
MEMORY_ENV = "PATHWEAVE_MEMORY_LIMIT_GB"
#: Fastest NIC port made, per direction: 800 Gb/s (NVIDIA ConnectX-8 SuperNIC).
MAX_NIC_Bps = 800e9 / 8
#: Most NICs per GPU any system ships: 4 (AWS p5.48xlarge, 32 EFA NICs for 8 H100s).
MAX_NICS_PER_GPU = 4
#: Relative slack on rate comparisons, for capacities that went through a file as text.
_SLACK = 1e-6


def memory_limit_bytes() -> int:
    """Bytes a path set may take: ``$PATHWEAVE_MEMORY_LIMIT_GB``, else half the machine's RAM."""
    text = os.environ.get(MEMORY_ENV, "").strip()
    if text:
        try:
            gb = float(text)
        except ValueError:
            raise FabricError(f"{MEMORY_ENV}={text!r} is not a number of GB") from None
        if gb > 0:
            return int(gb * 1e9)
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2)
    except (OSError, ValueError):  # pragma: no cover - sysconf is there on Linux
        return 8 << 30


def estimate_paths(nodes: int, gpus_per_node: int, rails: int, spines: int,
                   relays: bool = True) -> int:
    """About how many candidate paths a cluster of this shape has (within ~15 %).

    Inside a node every ordered pair has a direct path and, without an
    NVSwitch (``relays``), up to ``gpus_per_node - 2`` relays; across nodes
    one path per rail and, with spines, at most one spine path (the default
    ``spine`` rule; the ``ecmp`` modelling rule has one per spine).

    >>> estimate_paths(2, 4, 4, 0)   # h100-2x4 has exactly 200
    200
    """
    g = int(gpus_per_node)
    ranks = int(nodes) * g
    intra = int(nodes) * g * (g - 1) * (max(1, g - 1) if relays else 1)
    inter = ranks * (ranks - g) * (max(1, int(rails)) + min(int(spines), 1))
    return intra + inter


def estimate_path_bytes(nodes: int, gpus_per_node: int, rails: int, spines: int,
                        relays: bool = True) -> int:
    """About how many bytes compiling this shape's candidate paths takes at its peak.

    :func:`estimate_paths` times :data:`BYTES_PER_PATH`: what :func:`check_size`
    holds against the memory limit, and what a dense path set would cost where
    a caller builds smaller ones instead (``bench groups``).

    >>> estimate_path_bytes(2, 4, 4, 0) == 200 * BYTES_PER_PATH
    True
    """
    return estimate_paths(nodes, gpus_per_node, rails, spines, relays) * BYTES_PER_PATH


def check_size(label: str, *, nodes: int, gpus_per_node: int, rails: int, spines: int,
               links: int, relays: bool = True, paths: bool = True) -> None:
    """Raise :class:`FabricError` if a fabric of this shape is too large to plan here.

    Parameters
    ----------
    label
        What the user named (``dgx-h100:nodes=100000``), quoted in the message.
    nodes, gpus_per_node, rails, spines
        The fabric's shape.
    links
        Its number of directed links (an estimate is fine).
    relays
        Whether GPU pairs inside a node have relay paths (no NVSwitch).
    paths
        Whether the fabric's *dense* candidate paths (every rank pair's) must
        fit too. False where only smaller path sets will be built (concurrent
        groups compile their own subsets'); :func:`~pathweave.fabric.paths.candidate_paths`
        still holds the dense set against memory before compiling it.
    """
    need = estimate_path_bytes(nodes, gpus_per_node, rails, spines, relays) if paths else 0
    limit = memory_limit_bytes()
    if need > limit:
        how = f"{MEMORY_ENV}" if os.environ.get(MEMORY_ENV) else "half its memory"
        raise FabricError(
            f"{label} would need about {_gb(need)} for candidate paths "
            f"({nodes * gpus_per_node:,} GPUs); the limit on this machine is {_gb(limit)} ({how})"
        )
    if links > MAX_LINKS:
        raise FabricError(
            f"{label} would have about {links:,} links; the limit is {MAX_LINKS:,}"
        )


def check_fabric(fab: object, label: str | None = None, *, paths: bool = True) -> None:
    """:func:`check_size` for a built :class:`~pathweave.fabric.Fabric`."""
    from pathweave.fabric._core import Fabric, VertexKind

    assert isinstance(fab, Fabric)
    check_size(
        label or fab.name, nodes=fab.num_nodes, gpus_per_node=fab.gpus_per_node,
        rails=len(fab.rails), spines=int(fab.vertices_of_kind(VertexKind.SPINE).size),
        links=fab.num_links, relays=fab.nvlink_kind != "nvswitch", paths=paths,
    )


def check_physical(fab: object, label: str | None = None) -> None:
    """Raise :class:`FabricError` if no hardware can be ``fab``, naming the value and the limit.

    The NVLink of each GPU (the sum of its NVLink links' capacities) is
    counted in links of its model when discovery or a preset recorded one
    (``meta["discovery"]["gpu"]``, per-link rate ``nvlink_Bps_per_link``;
    else ``meta["gpu"]`` at its model's link rate) and
    must be at most that model's link count (:data:`pathweave.fabric.discovery.GPU_GENERATIONS`);
    a fabric of unknown model is held to the fastest GPU listed there. NIC
    links are held to :data:`MAX_NIC_Bps`, NICs per node to
    :data:`MAX_NICS_PER_GPU` per GPU.

    Examples
    --------
    >>> from pathweave.fabric.builders import cluster
    >>> check_physical(cluster(nodes=2))   # 18 links x 25 GB/s per H100: fine
    >>> try:
    ...     check_physical(cluster(nodes=2, nvlink_Bps=2e12), "fast")
    ... except ValueError as exc:
    ...     print(str(exc)[:57])
    fast: GPU n0.gpu0 has 2,000 GB/s of NVLink per direction;
    """
    from pathweave.fabric._core import Fabric

    assert isinstance(fab, Fabric)
    label = label or fab.name
    _check_nvlink(fab, label)
    _check_nics(fab, label)


def _check_nvlink(fab: object, label: str) -> None:
    import numpy as np

    from pathweave.fabric._core import Fabric, LinkKind, VertexKind
    from pathweave.fabric.discovery import GPU_GENERATIONS

    assert isinstance(fab, Fabric)
    gpus = fab.vertices_of_kind(VertexKind.GPU)
    nvlink = fab.link_kind == int(LinkKind.NVLINK)
    per_gpu = np.bincount(fab.link_src[nvlink], weights=fab.capacity_Bps[nvlink],
                          minlength=fab.num_vertices)[gpus]
    if not per_gpu.size:
        return
    worst = int(np.argmax(per_gpu))
    have, who = float(per_gpu[worst]), fab.vertex_name(int(gpus[worst]))
    disc = fab.meta.get("discovery") or {}
    gen = GPU_GENERATIONS.get(str(disc.get("gpu") or fab.meta.get("gpu") or "").lower())
    if gen is None:
        top = max(GPU_GENERATIONS.values(), key=lambda g: g.max_links * g.link_Bps)
        most = top.max_links * top.link_Bps
        if have > most * (1 + _SLACK):
            raise FabricError(
                f"{label}: GPU {who} has {_rate(have)} of NVLink per direction; the fastest "
                f"GPU made ({top.name}: {top.max_links} {top.nvlink} links) has {_rate(most)}"
            )
        return
    per_link = float(disc.get("nvlink_Bps_per_link") or gen.link_Bps)
    if per_link > gen.link_Bps * (1 + _SLACK):
        raise FabricError(
            f"{label}: {_rate(per_link)} per NVLink is faster than one {gen.nvlink} link of "
            f"an {gen.name} ({_rate(gen.link_Bps)})"
        )
    links = have / per_link
    if links > gen.max_links * (1 + _SLACK):
        raise FabricError(
            f"{label}: GPU {who} has {links:.4g} NVLinks ({_rate(have)} per direction at "
            f"{_rate(per_link)} per link); an {gen.name} has at most {gen.max_links}"
        )


def _check_nics(fab: object, label: str) -> None:
    import numpy as np

    from pathweave.fabric._core import Fabric, LinkKind, VertexKind

    assert isinstance(fab, Fabric)
    is_nic = fab.vertex_kind == int(VertexKind.NIC)
    network = fab.link_kind == int(LinkKind.NETWORK)
    nic_links = np.flatnonzero(network & (is_nic[fab.link_src] | is_nic[fab.link_dst]))
    if nic_links.size:
        fastest = int(nic_links[np.argmax(fab.capacity_Bps[nic_links])])
        rate = float(fab.capacity_Bps[fastest])
        if rate > MAX_NIC_Bps * (1 + _SLACK):
            raise FabricError(
                f"{label}: NIC link {fab.link_name(fastest)} runs at {_rate(rate)}; the fastest "
                f"NIC made (ConnectX-8, 800 Gb/s) is {_rate(MAX_NIC_Bps)}"
            )
    nodes = fab.vertex_node[is_nic]
    if nodes.size and fab.gpus_per_node:
        counts = np.bincount(nodes[nodes >= 0])
        if counts.size and counts.max() > MAX_NICS_PER_GPU * fab.gpus_per_node:
            raise FabricError(
                f"{label}: node {int(np.argmax(counts))} has {int(counts.max())} NICs for "
                f"{fab.gpus_per_node} GPUs; no system has more than {MAX_NICS_PER_GPU} per GPU"
            )


def _rate(Bps: float) -> str:
    return f"{Bps / 1e9:,.0f} GB/s" if Bps >= 10e9 else f"{Bps / 1e9:,.3g} GB/s"


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:,.3g} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:,.3g} MB"
