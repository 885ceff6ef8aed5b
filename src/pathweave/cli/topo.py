"""``pathweave topo``: readable summaries of a fabric and its candidate paths."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rich.table import Table

from pathweave.cli._common import add_columns
from pathweave.fabric import Fabric, LinkKind, PathSet, VertexKind
from pathweave.fabric.paths import ROLES


@dataclass(frozen=True)
class LinkGroup:
    """Directed links of one kind between two kinds of vertex (both directions counted)."""

    kind: str
    between: str
    links: int
    min_Bps: float
    max_Bps: float
    total_Bps: float


def link_groups(fab: Fabric) -> list[LinkGroup]:
    """Links grouped by kind and endpoint kinds, e.g. ``network`` between ``nic-rail``.

    >>> import pathweave as pw
    >>> [(g.kind, g.between, g.links) for g in link_groups(pw.fabric.preset("h100-2x4"))]
    ... # doctest: +NORMALIZE_WHITESPACE
    [('nvlink', 'gpu-gpu', 24), ('pcie', 'gpu-pcie_switch', 16), ('pcie', 'nic-pcie_switch', 16),
     ('pcie', 'host-host', 4), ('pcie', 'host-pcie_switch', 16), ('network', 'nic-rail', 16)]
    """
    vk = fab.vertex_kind
    a = vk[fab.link_src].astype(np.int64)
    b = vk[fab.link_dst].astype(np.int64)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    key = (fab.link_kind.astype(np.int64) * 64 + lo) * 64 + hi
    out = []
    for k in np.unique(key).tolist():
        sel = key == k
        caps = fab.capacity_Bps[sel]
        lk, rest = divmod(k, 64 * 64)
        u, v = divmod(rest, 64)
        out.append(
            LinkGroup(
                LinkKind(lk).label,
                f"{VertexKind(u).label}-{VertexKind(v).label}",
                int(sel.sum()),
                float(caps.min()),
                float(caps.max()),
                float(caps.sum()),
            )
        )
    return out


def path_counts(paths: PathSet) -> list[tuple[str, int, int]]:
    """``(kind, paths, pairs with such a path)`` per path kind, rail paths split by role.

    Rail roles (see :mod:`pathweave.fabric.paths`): ``matched`` (both ends on
    the rail), ``rd``/``dr`` (one end forwards inside its node), ``drd``
    (both ends forward: a remote rail).

    >>> import pathweave as pw
    >>> ps = pw.fabric.candidate_paths(pw.fabric.preset("h100-2x4"))
    >>> path_counts(ps)[:2]
    [('direct', 24, 24), ('relay', 48, 24)]
    """
    n = paths.num_ranks
    names = [r if r in ("direct", "relay", "spine", "pcie") else f"rail {r}" for r in ROLES]
    label = paths.role_code
    pair = paths.src.astype(np.int64) * n + paths.dst
    out = []
    for i, name in enumerate(names):
        sel = label == i
        if sel.any():
            out.append((name, int(sel.sum()), int(np.unique(pair[sel]).size)))
    return out


#: Printed under the path table when it has rail paths.
RAIL_ROLES_NOTE = (
    "rail roles: matched = both ends on the rail; rd / dr = the destination / source node "
    "forwards; drd = both do; pcie = a rail, then the destination node's PCIe tree (no GPU "
    "forwards)"
)


def _gbps(bps: float) -> str:
    return f"{bps / 1e9:,.1f}"


def summary_tables(fab: Fabric, paths: PathSet) -> list[Table]:
    """The three tables of ``topo show``: the fabric, its links, its candidate paths."""
    s = fab.summary()
    vertices = s["vertices"]
    overview = Table(title=f"fabric {fab.name}", title_justify="left", show_header=False)
    overview.add_column("", style="bold")
    overview.add_column("")
    overview.add_row("nodes", str(fab.num_nodes))
    overview.add_row("GPUs per node", str(fab.gpus_per_node))
    overview.add_row("GPUs (ranks)", str(fab.num_ranks))
    overview.add_row("NVLink", fab.nvlink_kind)
    overview.add_row("NICs", str(vertices.get("nic", 0)))
    overview.add_row("rails", str(len(fab.rails)))
    overview.add_row("spines", str(vertices.get("spine", 0)))
    overview.add_row("vertices / directed links", f"{fab.num_vertices} / {fab.num_links}")
    source = fab.meta.get("source")
    if source:
        overview.add_row("source", str(source))

    links = Table(title="links (directed; a cable is two)", title_justify="left")
    add_columns(links, ("kind", "between", "links", "GB/s each", "GB/s total"),
                left={"kind", "between"})
    for g in link_groups(fab):
        each = (
            _gbps(g.min_Bps)
            if g.min_Bps == g.max_Bps
            else (f"{_gbps(g.min_Bps)}-{_gbps(g.max_Bps)}")
        )
        links.add_row(g.kind, g.between, str(g.links), each, _gbps(g.total_Bps))

    cands = Table(
        title="candidate paths",
        title_justify="left",
        caption=f"{paths.num_paths} paths, {fab.num_ranks * (fab.num_ranks - 1)} ordered pairs",
        caption_justify="left",
    )
    add_columns(cands, ("kind", "paths", "pairs using it"), left={"kind"})
    for name, count, pairs in path_counts(paths):
        cands.add_row(name, str(count), str(pairs))
    return [overview, links, cands]
