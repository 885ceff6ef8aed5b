"""``pathweave bench emulate``: measured vs predicted makespans over a hotspot sweep.

One emulator and one launch of the ranks run ``hotspot:R`` for every ratio
``R`` (0 to 0.9 by default) under each policy; :func:`write_outputs` writes
the records as CSV and a plot of measured against predicted makespans (and
the congestion bounds) over the ratio. Needs root (see
:mod:`pathweave.emulate`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pathweave._files import atomic_write

__all__ = ["DEFAULT_RATIOS", "QUICK_RATIOS", "run", "write_outputs"]

DEFAULT_RATIOS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
QUICK_RATIOS = (0.0, 0.5, 0.9)
CSV_FIELDS = (
    "fabric", "scale", "workload", "ratio", "bytes_per_rank", "policy", "measured_s",
    "predicted_s", "bound_s", "measured_vs_predicted", "measured_vs_bound",
    "speedup_measured", "speedup_predicted", "verified", "repeat",
)


def run(
    fabric: str = "h100-2x4",
    *,
    scale: float = 1e-4,
    ratios: Sequence[float] = DEFAULT_RATIOS,
    bytes_per_rank: int = 4 << 20,
    policies: Sequence[str] = ("static", "mwu"),
    repeat: int = 3,
    prefix: str = "pw",
    progress: Callable[[str], None] | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Run the sweep; one record per (ratio, policy) (see ``EmulationResult.records``).

    ``options`` go to :func:`pathweave.emulate.run.run_workloads` (chunk_bytes,
    window, min_split_bytes, timeout_s, ...).
    """
    from pathweave.emulate.run import run_workloads

    rs = [float(r) for r in ratios]
    for r in rs:
        if not 0.0 <= r <= 1.0:
            raise ValueError(f"hotspot ratios must lie in [0, 1], got {r}")
    specs = [f"hotspot:{r:g}" for r in rs]
    results = run_workloads(
        fabric, specs, scale=scale, bytes_per_rank=bytes_per_rank, policies=policies,
        repeat=repeat, prefix=prefix, progress=progress, **options,
    )
    records = []
    for r, res in zip(rs, results, strict=True):
        for rec in res.records():
            rec["ratio"] = r
            records.append(rec)
    return records


def write_outputs(records: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """``emulate.csv`` and ``emulate.png`` (measured vs predicted over the hotspot ratio)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for rec in records:
        w.writerow(rec)
    csv_path = out_dir / "emulate.csv"
    atomic_write(csv_path, buf.getvalue().encode())

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    pols = list(dict.fromkeys(r["policy"] for r in records))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, p in enumerate(pols):
        rows = sorted((r for r in records if r["policy"] == p), key=lambda r: r["ratio"])
        x = [r["ratio"] for r in rows]
        c = colors[i % len(colors)]
        ax.plot(x, [r["measured_s"] for r in rows], "o-", color=c, label=f"{p} measured")
        ax.plot(x, [r["predicted_s"] for r in rows], "s--", color=c, mfc="none",
                label=f"{p} simulated")
        ax.plot(x, [r["bound_s"] for r in rows], ":", color=c, alpha=0.6,
                label=f"{p} congestion bound")
        if i > 0:
            ax2.plot(x, [r["speedup_measured"] for r in rows], "o-", color=c,
                     label=f"{p} measured")
            ax2.plot(x, [r["speedup_predicted"] for r in rows], "s--", color=c, mfc="none",
                     label=f"{p} simulated")
    first = records[0] if records else {}
    ax.set_xlabel("hotspot ratio")
    ax.set_ylabel("makespan (s)")
    ax.set_title(f"{first.get('fabric', '')} emulated at x{first.get('scale', 0):g}")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax2.set_xlabel("hotspot ratio")
    ax2.set_ylabel(f"speed-up over {pols[0] if pols else ''}")
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.legend(fontsize=7)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120)
    plt.close(fig)
    png_path = out_dir / "emulate.png"
    atomic_write(png_path, png.getvalue())
    return [csv_path, png_path]
