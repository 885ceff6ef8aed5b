"""How large a fabric pathweave will build: checked before the memory is spent.

Candidate paths grow with the square of the rank count (every ordered pair
gets a direct or relayed path per rail and spine), so a spec such as
``dgx-h100:nodes=100000`` would take minutes and far more memory than the
machine has before failing. :func:`check_size` estimates the path set from
the fabric's shape and refuses, naming the estimate and the limit, before
anything is built. The same check runs for presets (from their parameters),
for files (once loaded) and in :func:`pathweave.fabric.candidate_paths`.
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
    one path per rail and per spine.

    >>> estimate_paths(2, 4, 4, 0)   # h100-2x4 has exactly 200
    200
    """
    g = int(gpus_per_node)
    ranks = int(nodes) * g
    intra = int(nodes) * g * (g - 1) * (max(1, g - 1) if relays else 1)
    inter = ranks * (ranks - g) * (max(1, int(rails)) + int(spines))
    return intra + inter


def check_size(label: str, *, nodes: int, gpus_per_node: int, rails: int, spines: int,
               links: int, relays: bool = True) -> None:
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
    """
    need = estimate_paths(nodes, gpus_per_node, rails, spines, relays) * BYTES_PER_PATH
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


def check_fabric(fab: object, label: str | None = None) -> None:
    """:func:`check_size` for a built :class:`~pathweave.fabric.Fabric`."""
    from pathweave.fabric._core import Fabric, VertexKind

    assert isinstance(fab, Fabric)
    check_size(
        label or fab.name, nodes=fab.num_nodes, gpus_per_node=fab.gpus_per_node,
        rails=len(fab.rails), spines=int(fab.vertices_of_kind(VertexKind.SPINE).size),
        links=fab.num_links, relays=fab.nvlink_kind != "nvswitch",
    )


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:,.3g} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:,.3g} MB"
