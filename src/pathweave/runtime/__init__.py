"""The data plane: plans executed as chunked point-to-point transfers on ``torch.distributed``.

``pathweave.runtime`` holds the :class:`Orchestrator` (metadata exchange,
planning, plan cache, statistics), the schedule builder (plan -> per-rank
chunked operations, pure numpy), the executor, and :func:`run_local`, which
starts a small local job. The public collective API is
:mod:`pathweave.distributed`.

Submodules are loaded on first use, so ``import pathweave.runtime`` stays
cheap and only the parts that need torch import it.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Config", "Orchestrator", "OrchestratorStats", "build_schedule", "run_local"]

_LAZY = {
    "Config": "pathweave.runtime.config",
    "Orchestrator": "pathweave.runtime.orchestrator",
    "OrchestratorStats": "pathweave.runtime.orchestrator",
    "build_schedule": "pathweave.runtime.schedule",
    "run_local": "pathweave.runtime.launch",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'pathweave.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
