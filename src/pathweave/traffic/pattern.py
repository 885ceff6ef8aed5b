"""Payload bytes whose value tells where they belong: one pattern for every end-to-end check.

The data-plane benchmark and the emulator both fill send buffers with
:func:`pattern_bytes` and compare what arrives bit for bit, so a byte
delivered to the wrong rank or at the wrong offset shows.
"""

from __future__ import annotations

import numpy as np

__all__ = ["pattern_bytes"]


def pattern_bytes(src: int, dst: int, nbytes: int) -> np.ndarray:
    """The bytes rank ``src`` sends rank ``dst``: a ramp mod 251 offset by the pair.

    Chunks are powers of two long and 251 is prime, so a chunk written at a
    wrong offset (a shift that is never a multiple of 251) does not match.

    Parameters
    ----------
    src, dst
        Sending and receiving rank (``dst`` may be any fixed number when one
        buffer serves every destination).
    nbytes
        Length of the pattern.

    Returns
    -------
    numpy.ndarray
        ``uint8[nbytes]``.

    Examples
    --------
    >>> pattern_bytes(1, 2, 5).tolist()
    [33, 34, 35, 36, 37]
    """
    period = ((np.arange(251) + 7 * int(src) + 13 * int(dst)) % 251).astype(np.uint8)
    # Repeating one period costs a byte per byte (a ramp in int64 would cost eight).
    return np.resize(period, int(nbytes))
