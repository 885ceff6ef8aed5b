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


class RankError(PathweaveError, RuntimeError):
    """A rank of a locally launched job failed (raised, crashed or timed out).

    Attributes
    ----------
    rank
        The rank blamed: one that crashed if any did (the others' errors
        follow from it), else the one that raised first.
    traceback
        That rank's remote traceback text (or why it stopped, if it crashed).
    failures
        ``{rank: traceback text or reason}`` for every rank that failed.
    exc_type
        Class name of the remote exception, ``""`` if the rank did not raise.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int,
        traceback: str = "",
        failures: dict[int, str] | None = None,
        exc_type: str = "",
    ):
        super().__init__(message)
        self.rank = rank
        self.traceback = traceback
        self.failures = dict(failures) if failures else {rank: traceback}
        self.exc_type = exc_type

    @property
    def others_failed(self) -> bool:
        """Whether ranks other than :attr:`rank` failed too."""
        return any(r != self.rank for r in self.failures)


class LaunchTimeoutError(RankError, TimeoutError):
    """A locally launched job ran past its time limit; every process was killed."""


class CommError(PathweaveError, RuntimeError):
    """A data-plane transfer failed: a peer died, or an operation ran past its timeout."""


class EmulatorError(PathweaveError, RuntimeError):
    """The emulator cannot run here (no root, no ``ip``/``tc``) or a command failed."""


class InputError(PathweaveError, ValueError):
    """A value given to pathweave is out of range: a size, a count, an option, a path."""


class OutputFileError(InputError):
    """pathweave will not write here: a device, a directory, an unwritable folder, a bad suffix."""
