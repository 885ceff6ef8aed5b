"""What the ``pathweave demo`` steps share: the inputs, :class:`DemoContext`, :class:`DemoStep`.

Kept apart from :mod:`pathweave.cli.demo` (which lists the steps) so that the
step modules (``_demo_execute``, ``_demo_emulate``) import it without importing
the list that imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console

from pathweave import fabric as pwfabric
from pathweave import plan as pwplan
from pathweave import sim
from pathweave.cli._compare import Comparison

FABRIC = "h100-2x4"
#: A 1-D halo exchange with heavy ends: the default policy's multi-path plan
#: beats every baseline here (in simulation 2.2x the best, static), where a
#: hotspot all-to-all is won by plain rail striping (``multirail``) already.
WORKLOAD = "stencil:dims=1"
BYTES_PER_RANK = 256 << 20


@dataclass
class DemoContext:
    """What the steps share: inputs, intermediate results and the files written."""

    out_dir: Path
    console: Console
    fabric_spec: str = FABRIC
    workload: str = WORKLOAD
    gloss: str = ("a 1-D halo exchange: every GPU sends to its two neighbours, the two "
                  "ends four times as much to their one")
    bytes_per_rank: int = BYTES_PER_RANK
    fabric: pwfabric.Fabric | None = None
    demand: np.ndarray | None = None
    comparison: Comparison | None = None
    simulations: dict[str, sim.SimResult] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class DemoStep:
    """One step of the demo: a name, a heading, and what it does."""

    name: str
    heading: str
    run: Callable[[DemoContext], None]


def best_baseline(makespans_s: dict[str, float]) -> str | None:
    """The registered baseline with the least makespan among ``makespans_s`` (``None``: none).

    >>> best_baseline({"static": 2.0, "multirail": 1.5, "mwu": 1.0})
    'multirail'
    """
    base = [n for n in pwplan.baselines() if n in makespans_s]
    return min(base, key=lambda n: makespans_s[n]) if base else None
