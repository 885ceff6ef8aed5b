"""What every paper reproduction returns, and how it writes its CSV.

Each figure is one module of :mod:`pathweave.bench.paper` with a ``NAME``, a
``TITLE`` and ``run(out_dir, *, quick=False, progress=None) -> FigureResult``.
``run`` writes ``<NAME>.csv`` and ``<NAME>.png`` into ``out_dir``; the CLI
renders the result, so figure modules never print.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pathweave._files import atomic_write
from pathweave.bench._report import Progress as Progress  # re-exported to the figures


@dataclass(frozen=True)
class Comparison:
    """One number the paper reports, beside ours (``paper`` is None where it gives none)."""

    label: str
    ours: float
    paper: float | None = None
    unit: str = ""

    @property
    def ratio(self) -> float | None:
        """``ours / paper``, or None without a paper value."""
        if self.paper is None or self.paper == 0:
            return None
        return self.ours / self.paper


@dataclass
class FigureResult:
    """Rows of one reproduction, the files written, and the key numbers."""

    name: str
    title: str
    rows: list[dict[str, Any]]
    csv_path: Path | None = None
    png_path: Path | None = None
    comparisons: list[Comparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Write ``rows`` (dicts with the same keys) as CSV, atomically.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.csv"
    >>> _ = write_csv(p, [{"size_bytes": 1024, "bw_GBps": 1.5}])
    >>> p.read_text().splitlines()
    ['size_bytes,bw_GBps', '1024,1.5']
    """
    if not rows:
        raise ValueError(f"no rows to write to {path}")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(Path(path), buf.getvalue().encode())
    return Path(path)


def no_progress(done: int, total: int, what: str) -> None:
    """A :data:`Progress` that ignores its calls."""
