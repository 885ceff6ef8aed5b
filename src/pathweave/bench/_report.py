"""What every benchmark reports: one :class:`Check` per target line.

The CLI prints a check as ``PASS``/``MISS``/``-`` followed by its text, so a
benchmark's summary reads the same whichever benchmark produced it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

#: ``progress(done, total, what)``: how every benchmark reports headway.
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Check:
    """One target line: what was measured, the target, and whether it was met.

    Parameters
    ----------
    name
        Short identifier of the line (stable across runs; used in JSON).
    value
        The measured figure, or None when nothing was measured.
    target
        The figure ``value`` is held against, or None for an informative line.
    passed
        True/False for a target met or missed; None for an informative line
        (or a target with nothing to measure, e.g. a skipped LP).
    text
        The line as printed.
    """

    name: str
    value: float | None
    target: float | None
    passed: bool | None
    text: str


__all__ = ["Check", "Progress"]
