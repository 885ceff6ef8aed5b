"""Validate, save and load demand matrices.

Two file formats, chosen by suffix:

``.npz``
    ``numpy.savez`` archive with arrays ``format`` (the string
    ``"pathweave-demand"``), ``version`` (1), ``bytes`` (the matrix) and
    ``meta`` (a JSON string). It is loaded with ``allow_pickle=False``; an
    archive without a ``format`` entry is accepted if it has ``bytes``.
``.json``
    ``{"format": "pathweave-demand", "version": 1, "num_ranks": N,
    "bytes": [[...], ...], "meta": {...}}``.

:func:`load_demand` also reads a bare matrix measured elsewhere: ``.npy``
(``numpy.save``, no pickles) or ``.csv`` (one row per sender, comma
separated, ``#`` comments).

Files are written atomically (a temporary file in the same folder, then
``os.replace``), so a reader never sees half a file.
"""

from __future__ import annotations

import io
import json
import numbers
import os
import zipfile
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np

from pathweave._files import atomic_write
from pathweave.errors import WorkloadError

__all__ = ["FORMAT_TAG", "FORMAT_VERSION", "load_demand", "save_demand", "validate_demand"]

FORMAT_TAG = "pathweave-demand"
FORMAT_VERSION = 1
_SUFFIXES = (".npz", ".json")
#: Suffixes :func:`load_demand` reads: the two above and bare matrices.
LOAD_SUFFIXES = (*_SUFFIXES, ".npy", ".csv")

PathLike = str | os.PathLike[str]


def validate_demand(D: Any, num_ranks: int | None = None) -> np.ndarray:
    """Check that ``D`` is a demand matrix and return it as C-contiguous float64.

    A demand matrix is square, finite, non-negative and has a zero diagonal.
    The result is a view of ``D`` when it already is a C-contiguous float64
    array, otherwise a converted copy.

    Parameters
    ----------
    D : array_like
        Candidate matrix ``D[src_rank, dst_rank]`` of bytes.
    num_ranks : int, optional
        Required size; checked when given.

    Returns
    -------
    numpy.ndarray
        ``D`` as a ``(N, N)`` C-contiguous float64 array.

    Raises
    ------
    WorkloadError
        Naming the first offending entry, e.g. ``D[2, 5] = -3.0 is negative``.

    Examples
    --------
    >>> from pathweave.traffic import validate_demand
    >>> validate_demand([[0, 1], [2, 0]]).tolist()
    [[0.0, 1.0], [2.0, 0.0]]
    >>> validate_demand([[0, -3], [2, 0]])
    Traceback (most recent call last):
    ...
    pathweave.errors.WorkloadError: D[0, 1] = -3.0 is negative
    """
    try:
        arr = np.asarray(D)
    except (ValueError, TypeError) as exc:
        raise WorkloadError(f"demand is not a numeric array: {exc}") from None
    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.integer)
        or np.issubdtype(arr.dtype, np.floating)
        or arr.dtype == np.bool_
    ):
        raise WorkloadError(f"demand must hold real numbers, got dtype {arr.dtype}")
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise WorkloadError(f"demand must be a square 2-D matrix, got shape {arr.shape}")
    n = arr.shape[0]
    if n == 0:
        raise WorkloadError("demand matrix is empty (0 ranks)")
    if num_ranks is not None and n != num_ranks:
        raise WorkloadError(f"demand is {n} x {n} but num_ranks = {num_ranks}")
    out = np.ascontiguousarray(arr, dtype=np.float64)

    def first(mask: np.ndarray) -> tuple[int, int, float] | None:
        hits = np.argwhere(mask)
        if hits.size == 0:
            return None
        i, j = (int(v) for v in hits[0])
        return i, j, float(out[i, j])

    if (bad := first(~np.isfinite(out))) is not None:
        raise WorkloadError(f"D[{bad[0]}, {bad[1]}] = {bad[2]!r} is not finite")
    if (bad := first(out < 0)) is not None:
        raise WorkloadError(f"D[{bad[0]}, {bad[1]}] = {bad[2]!r} is negative")
    if (bad := first(np.diag(np.diag(out)) != 0)) is not None:
        raise WorkloadError(
            f"D[{bad[0]}, {bad[1]}] = {bad[2]!r} is on the diagonal and must be zero "
            f"(a rank never sends to itself)"
        )
    return out


def _suffix(path: Path, known: tuple[str, ...] = _SUFFIXES) -> str:
    suffix = path.suffix.lower()
    if suffix not in known:
        raise WorkloadError(
            f"demand file {str(path)!r}: unsupported suffix {path.suffix!r}; "
            f"use one of {', '.join(known)}"
        )
    return suffix


def _json_number(value: float) -> int | float:
    # Whole byte counts are written as JSON integers for readability; they
    # load back to the same float64 because they are below 2**53.
    if value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def save_demand(path: PathLike, D: Any, meta: dict[str, Any] | None = None) -> Path:
    """Write a demand matrix to ``.npz`` or ``.json``, atomically.

    Parameters
    ----------
    path : str or os.PathLike
        Destination; the suffix (``.npz`` or ``.json``) picks the format.
    D : array_like
        Demand matrix; validated with :func:`validate_demand` first.
    meta : dict, optional
        JSON-serialisable metadata stored alongside (e.g. the workload spec).

    Returns
    -------
    pathlib.Path
        The path written.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from pathweave.traffic import save_demand, load_demand, uniform
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = save_demand(pathlib.Path(tmp) / "d.json", uniform(3, 10), {"spec": "uniform"})
    ...     D, meta = load_demand(path, with_meta=True)
    >>> D.tolist(), meta
    ([[0.0, 5.0, 5.0], [5.0, 0.0, 5.0], [5.0, 5.0, 0.0]], {'spec': 'uniform'})
    """
    target = Path(path)
    suffix = _suffix(target)
    demand = validate_demand(D)
    meta = {} if meta is None else meta
    if not isinstance(meta, dict):
        raise WorkloadError(f"meta must be a dict, got {type(meta).__name__}")
    try:
        meta_text = json.dumps(meta, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise WorkloadError(f"meta is not JSON-serialisable: {exc}") from None

    if suffix == ".json":
        document = {
            "format": FORMAT_TAG,
            "version": FORMAT_VERSION,
            "num_ranks": int(demand.shape[0]),
            "bytes": [[_json_number(v) for v in row] for row in demand.tolist()],
            "meta": json.loads(meta_text),
        }
        payload = (json.dumps(document, allow_nan=False) + "\n").encode()
    else:
        buffer = io.BytesIO()
        np.savez(
            buffer,
            format=np.array(FORMAT_TAG),
            version=np.array(FORMAT_VERSION),
            bytes=demand,
            meta=np.array(meta_text),
        )
        payload = buffer.getvalue()
    atomic_write(target, payload)
    return target


def _fail(path: Path, problem: str) -> WorkloadError:
    return WorkloadError(f"demand file {str(path)!r}: {problem}")


def _check_header(path: Path, tag: Any, version: Any) -> None:
    if tag != FORMAT_TAG:
        raise _fail(path, f"format tag is {tag!r}, expected {FORMAT_TAG!r}")
    if isinstance(version, bool) or not isinstance(version, numbers.Integral):
        raise _fail(path, f"version {version!r} is not an integer")
    if version != FORMAT_VERSION:
        raise _fail(path, f"unsupported version {version!r} (this reader knows {FORMAT_VERSION})")


def _load_npz(path: Path) -> tuple[Any, dict[str, Any]]:
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise _fail(path, "holds a single array, not an .npz archive")
        with loaded as archive:
            names = set(archive.files)
            if "bytes" not in names:
                raise _fail(path, f"has no 'bytes' array (found: {sorted(names)})")
            if "format" in names:
                tag = archive["format"]
                version = archive["version"] if "version" in names else None
                _check_header(
                    path,
                    tag.item() if tag.ndim == 0 else tag.tolist(),
                    version.item() if version is not None and version.ndim == 0 else version,
                )
            matrix = archive["bytes"]
            meta_text = archive["meta"].item() if "meta" in names else "{}"
    except WorkloadError:
        raise
    except FileNotFoundError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise _fail(path, f"cannot be read as .npz: {exc}") from None
    try:
        meta = json.loads(meta_text)
    except (TypeError, ValueError) as exc:
        raise _fail(path, f"meta is not valid JSON: {exc}") from None
    return matrix, meta


def _load_bare(path: Path, suffix: str) -> tuple[Any, dict[str, Any]]:
    """A matrix without header: ``.npy`` or ``.csv``."""
    import warnings

    try:
        if suffix == ".npy":
            matrix = np.load(path, allow_pickle=False)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # an empty file is an error, not a warning
                matrix = np.loadtxt(path, delimiter=",", dtype=np.float64, ndmin=2)
    except FileNotFoundError:
        raise
    except (OSError, ValueError, UserWarning) as exc:
        raise _fail(path, f"cannot be read as {suffix}: {exc}") from None
    if not isinstance(matrix, np.ndarray) or matrix.ndim != 2:
        raise _fail(path, "does not hold a two-dimensional matrix")
    if matrix.shape[0] != matrix.shape[1]:
        raise _fail(path, f"matrix is not square: {matrix.shape[0]} x {matrix.shape[1]}")
    return matrix, {}


def _load_json(path: Path) -> tuple[Any, dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise _fail(path, f"malformed JSON: {exc}") from None
    if not isinstance(document, dict):
        raise _fail(path, f"top level is a {type(document).__name__}, expected an object")
    _check_header(path, document.get("format"), document.get("version"))
    rows = document.get("bytes")
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
        raise _fail(path, "'bytes' must be a list of rows (lists of numbers)")
    n = len(rows)
    for i, row in enumerate(rows):
        if len(row) != n:
            raise _fail(path, f"matrix is not square: row {i} has {len(row)} entries, not {n}")
        for j, value in enumerate(row):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _fail(path, f"D[{i}, {j}] = {value!r} is not a number")
    declared = document.get("num_ranks")
    if declared is not None and declared != n:
        raise _fail(path, f"num_ranks is {declared!r} but the matrix has {n} rows")
    meta = document.get("meta", {})
    if not isinstance(meta, dict):
        raise _fail(path, f"meta is a {type(meta).__name__}, expected an object")
    matrix = np.array(rows, dtype=np.float64) if n else np.zeros((0, 0))
    return matrix, meta


@overload
def load_demand(path: PathLike, *, with_meta: Literal[False] = ...) -> np.ndarray: ...
@overload
def load_demand(
    path: PathLike, *, with_meta: Literal[True]
) -> tuple[np.ndarray, dict[str, Any]]: ...
def load_demand(
    path: PathLike, *, with_meta: bool = False
) -> np.ndarray | tuple[np.ndarray, dict[str, Any]]:
    """Read and validate a demand matrix written by :func:`save_demand`.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.npz`` or ``.json`` demand file, or a bare ``.npy`` or ``.csv`` matrix
        (empty metadata).
    with_meta : bool, default False
        Also return the stored metadata dict.

    Returns
    -------
    numpy.ndarray or (numpy.ndarray, dict)
        The float64 demand matrix, and the metadata if ``with_meta``.

    Raises
    ------
    WorkloadError
        If the file is malformed or the matrix is not square, finite,
        non-negative with a zero diagonal; the message names the file.
    OSError
        If the file cannot be opened (e.g. ``FileNotFoundError``).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from pathweave.traffic import save_demand, load_demand, hotspot
    >>> D = hotspot(4, 1 << 20, ratio=0.7)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     loaded = load_demand(save_demand(pathlib.Path(tmp) / "d.npz", D))
    >>> bool((loaded == D).all())
    True
    """
    source = Path(path)
    suffix = _suffix(source, LOAD_SUFFIXES)
    if suffix == ".npz":
        matrix, meta = _load_npz(source)
    elif suffix == ".json":
        matrix, meta = _load_json(source)
    else:
        matrix, meta = _load_bare(source, suffix)
    try:
        demand = validate_demand(matrix)
    except WorkloadError as exc:
        raise _fail(source, str(exc)) from None
    demand = np.array(demand, dtype=np.float64, order="C")  # own the memory
    return (demand, meta) if with_meta else demand
