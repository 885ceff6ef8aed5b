"""The counters of an orchestrator: :class:`OrchestratorStats` and each call's :class:`CallStats`.

The op pipeline (:mod:`pathweave.runtime._pipeline`) and the decision
(:mod:`pathweave.runtime._decision`) count in them; both are re-exported by
:mod:`pathweave.runtime.orchestrator`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


@dataclass
class CallStats:
    """Timing breakdown of one call, in seconds.

    ``meta_s``: metadata exchange and validation; ``plan_s``: planning and
    scheduling (near 0 when cached); ``transfer_s``: moving the bytes (for an
    ``async_op`` call that returned before the bytes arrived, the time to
    post them); ``cached``: no planning was needed; ``multipath``: the
    pathweave executor ran (else torch's own collective did).
    """

    op: str
    bytes: int
    meta_s: float
    plan_s: float
    transfer_s: float
    cached: bool
    multipath: bool

    @property
    def total_s(self) -> float:
        return self.meta_s + self.plan_s + self.transfer_s


@dataclass
class OrchestratorStats:
    """Counters of an :class:`Orchestrator`, the same on every rank of its group.

    ``bytes_per_link`` counts the bytes each directed fabric link carried
    (every hop of every multi-path transfer, all ranks' traffic);
    ``bytes_per_path_kind`` the bytes per path role (direct, relay, matched,
    rd, dr, drd, spine) and ``torch`` for calls handed to torch.
    ``bytes_total`` counts bytes between distinct ranks (a rank's bytes to
    itself are a local copy and counted nowhere).
    """

    calls: int = 0
    plans_made: int = 0
    cache_hits: int = 0
    multipath_calls: int = 0
    plan_switches: int = 0
    bytes_total: int = 0
    bytes_per_link: np.ndarray = field(default_factory=lambda: np.zeros(0))
    bytes_per_path_kind: dict[str, int] = field(default_factory=dict)
    last_call: CallStats | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view: every field, the link vector as a list and ``total_s`` added to
        the last call's."""
        out = asdict(self)  # the last call's fields included
        out["bytes_per_link"] = self.bytes_per_link.tolist()
        if self.last_call is not None:
            out["last_call"]["total_s"] = self.last_call.total_s
        return out
