"""Matplotlib drawings of fabrics, plans and benchmark results, written to files.

Every function builds its own :class:`matplotlib.figure.Figure` (no pyplot
state, no interactive backend) and writes it to ``path``; the file format
follows the suffix (``.png``, ``.svg``, ``.pdf``). Matplotlib is imported
on first use so that ``import pathweave`` stays light.

Examples
--------
>>> import pathlib, tempfile, pathweave as pw
>>> from pathweave import viz
>>> fab = pw.fabric.preset("h100-2x4")
>>> out = pathlib.Path(tempfile.mkdtemp()) / "fab.png"
>>> viz.draw_fabric(fab, out) == out and out.stat().st_size > 0
True
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pathweave.fabric import Fabric, LinkKind, VertexKind

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from pathweave.plan import Plan

#: Colour of each link kind, shared by every drawing so the legends agree.
LINK_COLOURS = {
    LinkKind.NVLINK: "#2e8b57",
    LinkKind.PCIE: "#6a6a9a",
    LinkKind.NETWORK: "#e07b00",
}
_VERTEX_STYLE = {
    VertexKind.GPU: ("#76b900", "GPU"),
    VertexKind.NIC: ("#4f81bd", "NIC"),
    VertexKind.NVSWITCH: ("#8064a2", "NVSwitch"),
    VertexKind.HOST: ("#a5a5a5", "host"),
    VertexKind.RAIL: ("#f2a541", "rail switch"),
    VertexKind.SPINE: ("#c0504d", "spine"),
}
#: One colour per policy, stable across drawings; unknown policies cycle the rest.
POLICY_COLOURS = {
    "static": "#c0504d",
    "multirail": "#f2a541",
    "hscore": "#8064a2",
    "mwu": "#2e8b57",
    "optimal": "#4f81bd",
}
_SPARE_COLOURS = ("#9bbb59", "#4bacc6", "#7f7f7f", "#d99694")


def policy_colour(policy: str, index: int = 0) -> str:
    return POLICY_COLOURS.get(policy, _SPARE_COLOURS[index % len(_SPARE_COLOURS)])


def _figure(width_in: float, height_in: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), layout="constrained")


def save_figure(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Render ``fig`` in the format of the suffix (``.png`` if none) and write it.

    ``-`` writes a PNG to standard output.

    Rendered into memory first, then written by the one writer
    (:func:`pathweave._files.atomic_write`), so a device or directory is
    refused and a failed render leaves no half-written file.
    """
    import io

    from pathweave._files import IMAGE_SUFFIXES, atomic_write, output_path

    out = output_path(path, suffixes=IMAGE_SUFFIXES, default_suffix=".png")
    buf = io.BytesIO()
    # Standard output (``-``) has no suffix to go by: PNG.
    fig.savefig(buf, format=out.suffix.lstrip(".").lower() or "png", dpi=130)
    return atomic_write(out, buf.getvalue())


# ----------------------------------------------------------------- fabrics
def _short(name: str) -> str:
    """``n0.gpu3`` -> ``gpu3``: the node is already shown by the box around it."""
    return name.split(".", 1)[1] if "." in name else name


Point = tuple[float, float]


def _layout(fab: Fabric, nodes: int) -> tuple[dict[int, Point], list[Point]]:
    """Positions of the drawn vertices and the ``(x0, width)`` of each node box.

    Inside a node: NICs on top, GPUs in the middle, the NVSwitch or PCIe
    host below them. Rail switches sit in a row above all nodes, spines in a
    row above the rails.
    """
    kind = fab.vertex_kind
    node = fab.vertex_node
    pos: dict[int, Point] = {}
    boxes = []
    gap = 0.8
    x0 = 0.0
    rows = {
        VertexKind.NIC: 2.0, VertexKind.GPU: 1.0, VertexKind.NVSWITCH: 0.0, VertexKind.HOST: 0.0
    }
    for n in range(nodes):
        members = {k: [v for v in np.flatnonzero(node == n).tolist() if kind[v] == k] for k in rows}
        # NVSwitch and host share the bottom row when a node has both.
        members[VertexKind.NVSWITCH] = members[VertexKind.NVSWITCH] + members.pop(VertexKind.HOST)
        width = float(max(1, *(len(m) for m in members.values())))
        for k, vs in members.items():
            for i, v in enumerate(sorted(vs, key=lambda v: _natural(fab.vertex_name(v)))):
                pos[v] = (x0 + (i + 0.5) * width / len(vs), rows[k])
        boxes.append((x0, width))
        x0 += width + gap
    total = x0 - gap
    for k, y in ((VertexKind.RAIL, 3.6), (VertexKind.SPINE, 5.0)):
        vs = fab.vertices_of_kind(k).tolist()
        for i, v in enumerate(vs):
            pos[v] = ((i + 0.5) * total / len(vs), y)
    return pos, boxes


def _natural(name: str) -> tuple[Any, ...]:
    """Sort key that puts ``gpu10`` after ``gpu9``."""
    import re

    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def draw_fabric(
    fab: Fabric, path: str | os.PathLike[str], *, max_nodes: int = 4
) -> Path:
    """Draw ``fab``: node boxes with their GPUs, NICs and NVSwitch, rails and spines above.

    Each full-duplex pair of links is one line, coloured by link kind, its
    width growing with capacity. Fabrics with more than ``max_nodes`` nodes
    are drawn with their first ``max_nodes`` nodes only, which the title says.

    Parameters
    ----------
    fab
        The fabric.
    path
        Output file; the suffix picks the format (``.png`` is added if none).
    max_nodes
        Most nodes to draw.

    Returns
    -------
    pathlib.Path
        The file written (``path``, with ``.png`` added if it had no suffix).
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    shown = min(fab.num_nodes, max(1, int(max_nodes)))
    pos, boxes = _layout(fab, shown)
    total_w = boxes[-1][0] + boxes[-1][1]
    fig = _figure(max(6.0, min(18.0, 1.1 * total_w + 1.5)), 5.2)
    ax = fig.add_subplot()
    for n, (x0, w) in enumerate(boxes):
        ax.add_patch(
            FancyBboxPatch(
                (x0 - 0.05, -0.45), w + 0.1, 2.9, boxstyle="round,pad=0.05",
                facecolor="#f4f4f4", edgecolor="#888888", zorder=0,
            )
        )
        ax.text(x0 + 0.02, -0.4, f"node {n}", fontsize=8, va="bottom", color="#555555")

    cap = fab.capacity_Bps
    cap_max = float(cap.max())
    seen: set[tuple[int, int]] = set()
    legend: dict[tuple[int, float], str] = {}
    for e in range(fab.num_links):
        u, v = int(fab.link_src[e]), int(fab.link_dst[e])
        key = (min(u, v), max(u, v))
        if u not in pos or v not in pos or key in seen:
            continue
        seen.add(key)
        lk = LinkKind(int(fab.link_kind[e]))
        c = float(cap[e])
        lw = 0.6 + 2.4 * math.sqrt(c / cap_max)
        legend[(int(lk), round(c / 1e9, 1))] = ""
        (xa, ya), (xb, yb) = sorted([pos[u], pos[v]])
        both_gpu = fab.vertex_kind[u] == VertexKind.GPU and fab.vertex_kind[v] == VertexKind.GPU
        # GPU-GPU NVLinks share one row; arcs below it keep them apart.
        style = "arc3,rad=0.35" if both_gpu and ya == yb else "arc3,rad=0"
        ax.add_patch(
            FancyArrowPatch(
                (xa, ya), (xb, yb), connectionstyle=style, arrowstyle="-",
                color=LINK_COLOURS[lk], lw=lw, alpha=0.8, zorder=1,
            )
        )
    for v, (x, y) in pos.items():
        colour, _ = _VERTEX_STYLE[VertexKind(int(fab.vertex_kind[v]))]
        ax.text(
            x, y, _short(fab.vertex_name(v)), ha="center", va="center", fontsize=7, zorder=3,
            bbox={"boxstyle": "round,pad=0.3", "facecolor": colour, "edgecolor": "black",
                  "linewidth": 0.5},
        )
    handles = [
        Line2D([], [], color=LINK_COLOURS[LinkKind(k)],
               lw=0.6 + 2.4 * math.sqrt(gbps * 1e9 / cap_max),
               label=f"{LinkKind(k).label} {gbps:g} GB/s")
        for (k, gbps) in sorted(legend)
    ]
    ax.legend(handles=handles, loc="upper left", fontsize=7, frameon=False,
              bbox_to_anchor=(1.0, 1.0), title="per direction", title_fontsize=7)
    title = (
        f"{fab.name}: {fab.num_nodes} nodes x {fab.gpus_per_node} GPUs, "
        f"{fab.nvlink_kind}, {len(fab.rails)} rails"
    )
    spines = fab.vertices_of_kind(VertexKind.SPINE).size
    if spines:
        title += f", {spines} spines"
    if shown < fab.num_nodes:
        title += f"\n(showing {shown} of {fab.num_nodes} nodes)"
    ax.set_title(title, fontsize=10)
    ax.set_xlim(-0.4, total_w + 0.4)
    ax.set_ylim(-0.9, 5.5 if spines else 4.1)
    ax.set_axis_off()
    return save_figure(fig, path)


# ----------------------------------------------------------------- plans
def _bar_congestion(
    ax: Axes, congestion_s: Mapping[str, float | None], optimum_s: float | None
) -> None:
    names = list(congestion_s)
    vals = [congestion_s[n] for n in names]
    xs = np.arange(len(names))
    heights = [0.0 if v is None else v * 1e3 for v in vals]
    bars = ax.bar(xs, heights, color=[policy_colour(n, i) for i, n in enumerate(names)])
    for b, v in zip(bars, vals, strict=True):
        label = "n/a" if v is None else (
            f"{v * 1e3:.2f} ms" + (f"\n{v / optimum_s:.2f}x" if optimum_s else "")
        )
        ax.annotate(label, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                    va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    if optimum_s:
        ax.axhline(optimum_s * 1e3, color="#4f81bd", ls="--", lw=1, label="LP optimum")
        ax.legend(fontsize=8, loc="upper right")
    ax.set_xticks(xs, names)
    ax.set_ylabel("congestion bound (ms)")
    ax.margins(y=0.2)


def plot_policy_comparison(
    congestion_s: Mapping[str, float | None],
    path: str | os.PathLike[str],
    *,
    optimum_s: float | None = None,
    link_plans: Sequence[Plan] = (),
    title: str = "",
) -> Path:
    """Bar chart of congestion per policy and, optionally, per-link busy time of some plans.

    Parameters
    ----------
    congestion_s
        Congestion bound of each policy in seconds (``None``: not available).
    path
        Output file.
    optimum_s
        LP optimum, drawn as a dashed line; bars are labelled with their ratio to it.
    link_plans
        Plans (typically ``static`` and ``mwu``) whose per-link busy time
        ``load / capacity`` is drawn side by side in a second panel, one
        group of bars per link. The tallest bar of each plan is its
        congestion: spreading lowers it by loading more links.
    title
        Figure title.
    """
    fig = _figure(13.0 if link_plans else 6.5, 4.8)
    if link_plans:
        ax1, ax2 = fig.subplots(1, 2, width_ratios=[1, 2.2])
    else:
        ax1, ax2 = fig.add_subplot(), None
    _bar_congestion(ax1, congestion_s, optimum_s)
    ax1.set_title("congestion per policy", fontsize=10)
    if ax2 is not None:
        _link_panel(ax2, link_plans)
    if title:
        fig.suptitle(title, fontsize=11)
    return save_figure(fig, path)


def _link_panel(ax: Axes, plans: Sequence[Plan]) -> None:
    fab = plans[0].fabric
    busy = np.vstack([p.link_time_s for p in plans]) * 1e3
    used = np.flatnonzero(busy.max(axis=0) > 0)
    # Links grouped by kind (NVLink, PCIe, network), then by name, so the
    # rails sit together at the right where skew piles up.
    used = np.array(
        sorted(used.tolist(), key=lambda e: (int(fab.link_kind[e]), _natural(fab.link_name(e)))),
        dtype=np.int64,
    )
    xs = np.arange(used.size)
    width = 0.8 / len(plans)
    for i, p in enumerate(plans):
        colour = policy_colour(p.policy, i)
        ax.bar(xs + (i - (len(plans) - 1) / 2) * width, busy[i, used], width,
               color=colour, label=f"{p.policy} (max {p.congestion_s * 1e3:.2f} ms)")
        ax.axhline(p.congestion_s * 1e3, color=colour, ls=":", lw=1)
    names = [fab.link_name(e).replace(" -> ", ">") for e in used]
    ax.set_xticks(xs, names, rotation=90, fontsize=5)
    ax.set_xlim(-0.6, used.size - 0.4)
    ax.set_ylabel("link busy time = load / capacity (ms)")
    ax.set_title("per-link utilisation", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")


# ----------------------------------------------------------------- benchmarks
def plot_bench_ratios(
    records: Sequence[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    labels: Mapping[str, str] | None = None,
) -> Path:
    """Congestion ratio to the LP optimum per policy per workload, one panel per fabric.

    ``records`` are :func:`pathweave.bench.planner.run` records; cases and
    fabrics without an optimum are left out, and the title names the
    fabrics left out. ``labels`` maps workload specs to tick labels.
    """
    labels = dict(labels or {})
    fabrics: list[str] = []
    skipped: list[str] = []
    for r in records:
        if r["fabric"] not in fabrics + skipped:
            solved = any(x["optimal_s"] for x in records if x["fabric"] == r["fabric"])
            (fabrics if solved else skipped).append(r["fabric"])
    if not fabrics:
        fabrics = skipped[:1]  # one panel that says there is nothing to show
    pols = [p for p in dict.fromkeys(r["policy"] for r in records) if p != "optimal"]
    fig = _figure(6.0 * min(len(fabrics), 2) + 0.5, 4.2 * math.ceil(len(fabrics) / 2))
    axes = np.atleast_1d(fig.subplots(math.ceil(len(fabrics) / 2), min(len(fabrics), 2))).ravel()
    for ax, fname in zip(axes, fabrics, strict=False):  # spare axes stay blank
        rows = [r for r in records if r["fabric"] == fname]
        workloads = list(dict.fromkeys(r["workload"] for r in rows))
        ranks = rows[0]["ranks"]
        ratio = {
            (r["workload"], r["policy"]): r["congestion_s"] / r["optimal_s"]
            for r in rows
            if r["optimal_s"] and r["congestion_s"] is not None
        }
        solved = [w for w in workloads if any((w, p) in ratio for p in pols)]
        ax.set_title(f"{fname} ({ranks} ranks)", fontsize=10)
        if not solved:
            ax.text(0.5, 0.5, "no LP optimum", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        xs = np.arange(len(solved))
        width = 0.8 / max(1, len(pols))
        for i, p in enumerate(pols):
            vals = [ratio.get((w, p), np.nan) for w in solved]
            ax.bar(xs + (i - (len(pols) - 1) / 2) * width, vals, width,
                   color=policy_colour(p, i), label=p)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks(xs, [_wrap_spec(labels.get(w, w)) for w in solved], fontsize=7)
        ax.set_ylabel("congestion / LP optimum")
        ax.yaxis.set_major_formatter("{x:g}x")
        ax.legend(fontsize=7)
    for ax in axes[len(fabrics):]:
        ax.set_axis_off()
    title = "planner congestion relative to the LP optimum (lower is better, 1x is optimal)"
    if skipped:
        title += f"\nnot shown (no LP optimum): {', '.join(skipped)}"
    fig.suptitle(title, fontsize=11)
    return save_figure(fig, path)


def _wrap_spec(spec: str) -> str:
    """Workload specs can be long; break them after the name and at commas."""
    name, _, rest = spec.partition(":")
    return name + ("\n" + rest.replace(",", ",\n") if rest else "")


# ----------------------------------------------------------------- simulation
def plot_link_utilisation(
    results: Mapping[str, Any],
    fabric: Fabric,
    path: str | os.PathLike[str],
    *,
    title: str = "",
) -> Path:
    """Heatmap of link utilisation over time, one panel per policy (links x time).

    Parameters
    ----------
    results
        Policy name -> :class:`pathweave.sim.SimResult`; each needs
        ``times_s`` (``float64[T + 1]`` breakpoints), ``link_util``
        (``float64[T, L]``, the fraction of each link's capacity in use
        between breakpoints) and ``makespan_s``.
    fabric
        The fabric the results were simulated on (names the links).
    path
        Output file.
    title
        Figure title.

    Only links some policy uses are drawn, grouped by kind (NVLink, PCIe,
    network) and then by name, the same rows in every panel; the panels
    share the time axis, so a shorter makespan shows as a shorter band.
    """
    from matplotlib.colors import Normalize

    if not results:
        raise ValueError("plot_link_utilisation needs at least one result")
    names = list(results)
    used_mask = np.zeros(fabric.num_links, dtype=bool)
    for r in results.values():
        util = np.asarray(r.link_util, dtype=np.float64)
        if util.ndim != 2 or util.shape[1] != fabric.num_links:
            raise ValueError(
                f"link_util has shape {util.shape}, expected (T, {fabric.num_links})"
            )
        used_mask |= util.max(axis=0, initial=0.0) > 0
    used = sorted(np.flatnonzero(used_mask).tolist(),
                  key=lambda e: (int(fabric.link_kind[e]), _natural(fabric.link_name(e))))
    end_ms = max(float(r.makespan_s) for r in results.values()) * 1e3
    fig = _figure(6.0 * len(names) + 1.0, max(3.5, 0.12 * len(used) + 1.6))
    axes = np.atleast_1d(fig.subplots(1, len(names), sharey=True)).ravel()
    norm = Normalize(0.0, 1.0)
    mesh = None
    for ax, name in zip(axes, names, strict=True):
        r = results[name]
        edges_ms = np.asarray(r.times_s, dtype=np.float64) * 1e3
        util = np.asarray(r.link_util, dtype=np.float64)[:, used].T
        if used and edges_ms.size > 1:
            mesh = ax.pcolormesh(edges_ms, np.arange(len(used) + 1), util, cmap="viridis",
                                 norm=norm, shading="flat")
        ax.set_xlim(0.0, end_ms if end_ms > 0 else 1.0)
        ax.set_xlabel("time (ms)")
        ax.set_title(f"{name}: makespan {float(r.makespan_s) * 1e3:.2f} ms", fontsize=10)
    axes[0].set_yticks(np.arange(len(used)) + 0.5,
                       [fabric.link_name(e).replace(" -> ", ">") for e in used], fontsize=5)
    axes[0].set_ylim(len(used), 0)
    if mesh is not None:
        fig.colorbar(mesh, ax=list(axes), label="link utilisation (fraction of capacity)",
                     shrink=0.8)
    if title:
        fig.suptitle(title, fontsize=11)
    return save_figure(fig, path)
