"""The one exception tree of pathweave.

Every error pathweave raises on purpose derives from :class:`PathweaveError`.
Errors about bad values also derive from :class:`ValueError`, so code written
against plain Python conventions (``except ValueError``) keeps working.

>>> from pathweave.errors import FabricError, PathweaveError
>>> issubclass(FabricError, PathweaveError) and issubclass(FabricError, ValueError)
True
"""

from __future__ import annotations


class PathweaveError(Exception):
    """Base class of every error pathweave raises on purpose."""


class FabricError(PathweaveError, ValueError):
    """A fabric is malformed: bad capacity, unknown vertex, unreachable GPU pair."""


class FabricFileError(FabricError):
    """A fabric or topology file cannot be read; the message names the file and key."""

    def __init__(self, message: str, *, path: str | None = None, key: str | None = None):
        where = []
        if path is not None:
            where.append(f"file {path!r}")
        if key is not None:
            where.append(f"key {key!r}")
        prefix = (", ".join(where) + ": ") if where else ""
        super().__init__(prefix + message)
        self.path = path
        self.key = key


class UnsafeXMLError(FabricFileError):
    """An XML topology file uses entities or DTDs that could attack the parser."""


class WorkloadError(PathweaveError, ValueError):
    """A demand matrix or workload specification is invalid."""


class PlanError(PathweaveError, ValueError):
    """A plan is invalid (bytes not conserved, illegal path) or a policy got bad options."""


class SolverError(PathweaveError, RuntimeError):
    """An optimisation backend failed or returned a non-optimal status."""
