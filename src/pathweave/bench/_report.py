"""What every benchmark reports: one :class:`Check` per target line.

The CLI prints a check as ``PASS``/``MISS``/``-`` followed by its text, so a
benchmark's summary reads the same whichever benchmark produced it.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pathweave._files import atomic_write

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

    @classmethod
    def at_most(cls, name: str, value: float | None, target: float, text: str) -> Check:
        """The line of a target ``value <= target``; nothing measured (None) passes nothing.

        >>> Check.at_most("t", 0.8, 1.0, "t 0.8").passed, Check.at_most("t", None, 1.0, "-").passed
        (True, None)
        """
        return cls(name, value, target, None if value is None else value <= target, text)


def write_csv(
    path: Path, rows: Sequence[dict[str, Any]], fields: Sequence[str] | None = None
) -> Path:
    """Write ``rows`` as CSV, atomically; every benchmark's CSV goes through here.

    ``fields``: the columns, in order (keys of a row outside them are left
    out); default: the first row's keys, all rows having the same.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.csv"
    >>> _ = write_csv(p, [{"size_bytes": 1024, "bw_GBps": 1.5}])
    >>> p.read_text().splitlines()
    ['size_bytes,bw_GBps', '1024,1.5']
    """
    if fields is None:
        if not rows:
            raise ValueError(f"no rows to write to {path}")
        fields = list(rows[0])
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(fields), extrasaction="ignore",
                            lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(Path(path), buf.getvalue().encode())
    return Path(path)


__all__ = ["Check", "Progress", "write_csv"]
