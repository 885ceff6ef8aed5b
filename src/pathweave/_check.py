"""Argument checks shared by every layer: one rule for types, one for ranges.

A value of the wrong type raises :class:`TypeError`; a value of the right
type outside its range raises ``error``, the calling package's own error
(:class:`~pathweave.errors.WorkloadError` in ``traffic``,
:class:`~pathweave.errors.PlanError` for policy options, :class:`ValueError`
where no package error applies). Every message names the argument and the
offending value, in one form: ``NAME must be REQUIREMENT, got VALUE``.

``bool`` is refused where a number is expected (it is an ``int`` subclass,
but ``True`` as a rank count is a bug). numpy scalars are accepted.

This module sits at the bottom of the layer picture (it imports nothing from
pathweave), so any package may use it: ``traffic``, ``sim``,
``plan.mwu._check``, ``runtime._validate.positive_int`` /
``nonnegative_float`` and the MoE layer's constructor all call
:func:`integer` and :func:`real`; id arrays (the MoE layer's expert
placement, the max-min solver's flow links) go through :func:`indices`.

Examples
--------
>>> from pathweave import _check
>>> _check.integer("nodes", 4, minimum=1)
4
>>> _check.real("ratio", 1.5, low=0.0, high=1.0)
Traceback (most recent call last):
...
ValueError: ratio must be in [0.0, 1.0], got 1.5
>>> _check.integer("nodes", 4.0)
Traceback (most recent call last):
...
TypeError: nodes must be an integer, got float 4.0
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np


def _got(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def integer(
    name: str,
    value: Any,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    error: type[Exception] = ValueError,
) -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]`` (either bound optional).

    Parameters
    ----------
    name
        What the value is, as the message names it (``"num_ranks"``,
        ``"hopper option probes"``).
    value
        Any integral number but ``bool``.
    minimum, maximum
        Inclusive bounds; ``None`` leaves that side open.
    error
        Raised for a value out of range.

    Raises
    ------
    TypeError
        ``value`` is not an integral number (``4.0`` included).
    error
        ``value`` lies outside the bounds.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {_got(value)}")
    v = int(value)
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        raise error(f"{name} must be {_interval(minimum, maximum, False, False)}, got {value!r}")
    return v


def real(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    error: type[Exception] = ValueError,
) -> float:
    """``value`` as a finite ``float`` between ``low`` and ``high``.

    Parameters
    ----------
    name
        What the value is, as the message names it.
    value
        Any real number but ``bool``; NaN and infinities are out of range.
    low, high
        Bounds; ``None`` leaves that side open (but finite).
    low_open, high_open
        Exclude the bound itself (``> low``, ``< high``).
    error
        Raised for a value out of range.

    Raises
    ------
    TypeError
        ``value`` is not a real number.
    error
        ``value`` is not finite or lies outside the bounds.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {_got(value)}")
    v = float(value)
    if not math.isfinite(v):
        raise error(f"{name} must be finite, got {value!r}")
    below = low is not None and (v <= low if low_open else v < low)
    above = high is not None and (v >= high if high_open else v > high)
    if below or above:
        raise error(f"{name} must be {_interval(low, high, low_open, high_open)}, got {value!r}")
    return v


def _interval(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    """The requirement in words: ``positive``, ``>= 1``, ``in (0, 1]``, ``finite``."""
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    if lo is not None:
        if lo == 0:
            return "positive" if lo_open else "non-negative"
        return f"{'>' if lo_open else '>='} {lo}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {hi}"
    return "finite"


def indices(name: str, ids: np.ndarray, n: int, what: str,
            error: type[Exception] = ValueError) -> None:
    """Raise ``error`` unless every entry of the integer array ``ids`` lies in ``[0, n)``.

    The message names the first entry out of range, in one form:
    ``NAME[i] = VALUE is not WHAT [0, n)``.

    >>> indices("placement", np.array([0, 1]), 2, "a rank of the group")
    >>> indices("placement", np.array([0, 3, 1]), 2, "a rank of the group")
    Traceback (most recent call last):
    ...
    ValueError: placement[1] = 3 is not a rank of the group [0, 2)
    """
    bad = np.flatnonzero((ids < 0) | (ids >= n))
    if bad.size:
        i = int(bad[0])
        raise error(f"{name}[{i}] = {int(ids[i])} is not {what} [0, {n})")


__all__ = ["indices", "integer", "real"]


def env_choice(
    environ: Mapping[str, str], name: str, table: Mapping[str, Any], default: str,
    choices: str | None = None,
) -> Any:
    """The value ``table`` gives environment variable ``name`` (case and spaces ignored).

    Unset or empty reads as ``default``; another word raises ``ValueError``
    naming the variable, its value and ``choices`` (default: the table's
    words).

    >>> env_choice({"X": " On "}, "X", {"auto": "auto", "on": True, "off": False}, "auto")
    True
    >>> env_choice({"X": "yes"}, "X", {"auto": "auto", "on": True, "off": False}, "auto")
    Traceback (most recent call last):
    ...
    ValueError: X='yes' is not one of auto, on, off
    """
    raw = environ.get(name, "")
    word = raw.strip().lower() or default
    if word not in table:
        raise ValueError(f"{name}={raw!r} is not one of {choices or ', '.join(table)}")
    return table[word]
