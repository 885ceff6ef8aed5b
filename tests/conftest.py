"""Fixtures shared by the test files."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest


def pytest_sessionstart(session: pytest.Session) -> None:
    """The second pytest-xdist worker loads the simulator's kernels before it collects.

    Collecting the doctest modules imports ``pathweave.runtime._preload``,
    which loads the planners' kernels under a lock: with a cold numba cache
    the first worker compiles them (about 30 s of CPU) while the second waits
    for the lock, one core idle. The second compiles the simulator's kernels
    meanwhile (``run_flows``, about 20 s of CPU), so neither worker compiles
    them again later: with a cold cache both did, side by side, in their first
    simulation. With a warm cache this loads them (well under a second).
    """
    if os.environ.get("PYTEST_XDIST_WORKER") != "gw1":
        return
    import pathweave as pw

    fab = pw.fabric.preset("h100-2x4")
    demand = pw.traffic.hotspot(fab.num_ranks, bytes_per_rank=64 << 20, ratio=0.7)
    pw.sim.simulate(fab, pw.plan.make(fab, demand, policy="static"))


def _assert_drawn(path: Path, min_px: int = 200) -> None:
    """``path`` is a PNG of at least ``min_px`` square with data drawn in colour on it.

    Axes, ticks and text are grey; lines, bars and heatmap cells are in
    colour. A figure whose data failed to draw (an empty axes, a blank
    canvas) has no coloured pixel, so it fails here however large the file.
    """
    import matplotlib.image

    img = matplotlib.image.imread(str(path))
    assert img.ndim == 3 and min(img.shape[:2]) >= min_px, (path, img.shape)
    rgb = img[..., :3].astype(np.float64)
    colour = (rgb.max(axis=2) - rgb.min(axis=2)) > 0.15
    assert colour.mean() > 1e-3, f"{path}: no data drawn ({colour.sum()} coloured pixels)"


@pytest.fixture
def assert_drawn() -> Callable[..., None]:
    """A check that a saved figure has content, not only that the file exists."""
    return _assert_drawn


@pytest.fixture(autouse=True, scope="session")
def _no_terminal_width() -> Iterator[None]:
    """Tests (and module fixtures) see no ``COLUMNS`` unless they set it.

    The CLI sizes piped tables from ``COLUMNS`` (pathweave.cli._common), and
    several tests check that a piped table keeps every column; a ``COLUMNS``
    exported by the caller's shell, or set in pytest-xdist's workers, would
    otherwise fold those tables and fail them.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("COLUMNS", raising=False)
        yield
