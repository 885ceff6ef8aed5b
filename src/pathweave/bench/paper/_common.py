"""What every paper reproduction returns, and how it writes its CSV.

Each figure is one module of :mod:`pathweave.bench.paper` with a ``NAME``, a
``TITLE`` and ``run(out_dir, *, quick=False, progress=None) -> FigureResult``.
``run`` writes ``<NAME>.csv`` and ``<NAME>.png`` into ``out_dir``; the CLI
renders the result, so figure modules never print.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pathweave.bench._report import Progress as Progress  # re-exported to the figures
from pathweave.bench._report import write_csv as write_csv  # re-exported to the figures


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


def no_progress(done: int, total: int, what: str) -> None:
    """A :data:`Progress` that ignores its calls."""
