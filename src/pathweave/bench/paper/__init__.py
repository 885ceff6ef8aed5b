"""Reproductions of the NIMBLE paper's evaluation: one module per figure or table.

Every figure module has a ``NAME``, a ``TITLE``, ``measure(..., progress=)``
returning rows (its defaults are the full run; ``QUICK`` holds the arguments
of a quick one), ``summarize(rows) -> (comparisons, notes)`` and
``plot(rows, path) -> path``; :func:`run_figure` runs those steps and writes
the files (see :mod:`pathweave.bench.paper._common`). :data:`FIGURES` names them in the
paper's order; a module is imported only when its figure runs, so one that
is missing or broken fails on its own and leaves the others runnable.

``pathweave bench paper <name>|all`` is the command-line front end.

Examples
--------
>>> from pathweave.bench import paper
>>> list(paper.FIGURES)
['fig6', 'fig7', 'fig8', 'table1', 'hopper']
>>> paper.figure_module("table_1")
Traceback (most recent call last):
...
pathweave.errors.InputError: unknown figure 'table_1' (did you mean 'table1'?); known figures: ...
"""

from __future__ import annotations

import importlib
import os
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from pathweave._registry import Registry
from pathweave.bench.paper._common import (
    Comparison,
    FigureResult,
    Progress,
    no_progress,
    write_csv,
)
from pathweave.errors import InputError
from pathweave.viz import save_figure

#: Figure name -> its module's path, in the paper's order (``hopper`` is our
#: addition). The registry holds paths, not modules: a figure's module is
#: imported only when it runs.
FIGURES: Registry[str] = Registry("figure", error=InputError)
for _name in ("fig6", "fig7", "fig8", "table1", "hopper"):
    FIGURES.add(_name, f"{__name__}.{_name}")

#: Where ``pathweave bench paper`` writes when no ``--out`` is given.
DEFAULT_OUT_DIR = Path("pathweave-paper")


def figure_module(name: str) -> ModuleType:
    """Import and return the module of figure ``name``.

    Raises :class:`~pathweave.errors.InputError` (a ``ValueError``) naming
    ``name``, the closest figure and every one when it is not registered; an
    import error of a registered module propagates.
    """
    return importlib.import_module(FIGURES[name])


def run_figure(
    name: str,
    out_dir: str | os.PathLike[str] = DEFAULT_OUT_DIR,
    *,
    quick: bool = False,
    progress: Progress | None = None,
) -> FigureResult:
    """Run one figure, writing ``<name>.csv`` and ``<name>.png`` into ``out_dir``.

    Parameters
    ----------
    name
        A key of :data:`FIGURES`.
    out_dir
        Folder for the files; created if missing.
    quick
        Fewer points and repeats (for tests and a first look).
    progress
        ``progress(done, total, what)``, called as the figure makes headway.
    """
    module = figure_module(name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = module.measure(**(module.QUICK if quick else {}), progress=progress or no_progress)
    comparisons, notes = module.summarize(rows)
    csv_path = write_csv(out / f"{module.NAME}.csv", rows)
    png_path = module.plot(rows, out / f"{module.NAME}.png")
    return FigureResult(module.NAME, module.TITLE, rows, csv_path, png_path, comparisons, notes)


@dataclass(frozen=True)
class FigureFailure:
    """A figure that raised: its name, the exception and the formatted traceback."""

    name: str
    error: BaseException
    traceback: str

    @property
    def message(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"


@dataclass
class RunAllResult:
    """Every figure's outcome: results of those that ran, failures of those that raised."""

    results: list[FigureResult] = field(default_factory=list)
    failures: list[FigureFailure] = field(default_factory=list)
    wall_s: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures


def run_all(
    out_dir: str | os.PathLike[str] = DEFAULT_OUT_DIR,
    *,
    quick: bool = False,
    progress: Progress | None = None,
    names: Sequence[str] | None = None,
    on_figure: Callable[[int, int, str], None] | None = None,
) -> RunAllResult:
    """Run every figure (or ``names``), keeping going past a figure that fails.

    A figure that raises (an ``Exception``, including a module that does not
    import) is recorded in :attr:`RunAllResult.failures` with its traceback;
    the others still run and write their files. ``on_figure(index, count,
    name)`` is called before each figure, ``progress`` is passed to each.
    """
    todo = list(FIGURES) if names is None else list(names)
    for name in todo:
        FIGURES[name]  # an unknown name raises before any figure runs
    outcome = RunAllResult()
    for i, name in enumerate(todo):
        if on_figure is not None:
            on_figure(i, len(todo), name)
        t0 = time.perf_counter()
        try:
            outcome.results.append(run_figure(name, out_dir, quick=quick, progress=progress))
        except Exception as exc:  # one broken figure must not lose the others
            outcome.failures.append(FigureFailure(name, exc, traceback.format_exc()))
        outcome.wall_s[name] = time.perf_counter() - t0
    return outcome


__all__ = [
    "DEFAULT_OUT_DIR",
    "FIGURES",
    "Comparison",
    "FigureFailure",
    "FigureResult",
    "Progress",
    "RunAllResult",
    "figure_module",
    "run_all",
    "run_figure",
    "save_figure",
    "write_csv",
]
