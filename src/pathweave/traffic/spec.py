"""Workload spec strings: a compact, command-line friendly way to name a workload.

Grammar (:mod:`pathweave._spec`, shared with fabric specs; whitespace
around tokens is ignored, names and keys are case-insensitive, ``-`` and
``_`` are interchangeable in names, each key once)::

    spec   := name [ ":" items ]
    items  := item ( "," item )*
    item   := VALUE | key "=" VALUE      (a bare VALUE only as the first item)
    list   := VALUE ( ";" VALUE )*       (for keys that take several ranks)

A bare value sets the workload's main knob: ``hotspot`` ratio, ``zipf``
alpha, ``random_sparse`` density, ``stencil`` dims, ``many_to_few`` sinks.
Every workload also accepts ``bytes=SIZE`` to override ``bytes_per_rank``
(``moe`` accepts and ignores it: its size comes from tokens and hidden).

Sizes are a number with an optional unit, case-insensitive: none or ``B`` for
bytes; ``K``, ``M``, ``G``, ``T`` and ``KiB``, ``MiB``, ``GiB``, ``TiB`` are
binary (powers of 1024); ``KB``, ``MB``, ``GB``, ``TB`` are decimal (powers
of 1000). Values are parsed by type, never evaluated.

Examples
--------
>>> from pathweave.traffic import parse_workload, WorkloadSpec
>>> parse_workload("hotspot:ratio=0.5,hot=3,bytes=1K", 4)[0].tolist()
[0.0, 256.0, 256.0, 512.0]
>>> spec = WorkloadSpec.parse("moe:tokens=16384,hidden=4096,experts=8,topk=2,hot=0.9")
>>> spec.name, spec.params["num_experts"], spec.params["hot_ratio"]
('moe', 8, 0.9)
>>> str(spec)
'moe:tokens=16384,hidden=4096,num_experts=8,top_k=2,hot_ratio=0.9'
"""

from __future__ import annotations

import inspect
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pathweave import _spec
from pathweave._registry import Registry, did_you_mean
from pathweave.errors import WorkloadError

from . import generators
from .generators import MAX_TOTAL_BYTES

__all__ = ["WORKLOAD_NAMES", "WorkloadSpec", "parse_size", "parse_workload"]

DEFAULT_BYTES_PER_RANK = 256 * 2**20

# --------------------------------------------------------------------------
# Value parsers: each takes (workload, key, text) so errors can name all three.
# --------------------------------------------------------------------------

_SIZE_RE = re.compile(r"^([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)$")
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kib": 2**10,
    "m": 2**20,
    "mib": 2**20,
    "g": 2**30,
    "gib": 2**30,
    "t": 2**40,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}


def parse_size(text: str, what: str = "size") -> float:
    """Parse a byte size such as ``"64M"``, ``"1.5GiB"``, ``"100KB"`` or ``"4096"``.

    Parameters
    ----------
    text : str
        A non-negative number with an optional unit (see the module docstring),
        at most the int64 byte range.
    what : str
        What the size is, for error messages (``"bytes"``, ``"--chunk"``).

    Returns
    -------
    float
        The size in bytes.

    Examples
    --------
    >>> from pathweave.traffic import parse_size
    >>> parse_size("64M"), parse_size("1KB"), parse_size("2 KiB")
    (67108864.0, 1000.0, 2048.0)
    """
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a size string such as 64M, got {text!r}")
    match = _SIZE_RE.match(text.strip())
    if match is None:
        raise WorkloadError(f"{what} {text!r} is not a size such as 4096, 64M, 1.5GiB or 100KB")
    number, unit = match.groups()
    scale = _SIZE_UNITS.get(unit.lower())
    if scale is None:
        valid = ", ".join(u for u in ("B", "K", "M", "G", "T", "KiB", "MiB", "GiB", "KB", "MB"))
        raise WorkloadError(
            f"{what} {text!r} has unknown size unit {unit!r}; use one of {valid}, ..."
        )
    value = float(number) * scale
    if not math.isfinite(value):
        raise WorkloadError(f"{what} {text!r} is not a finite size")
    if value > MAX_TOTAL_BYTES:
        raise WorkloadError(
            f"{what} {text.strip()} exceeds the int64 byte range ({MAX_TOTAL_BYTES:.3g} bytes)"
        )
    return value


def _where(workload: str, key: str, text: str) -> str:
    return f"workload {workload!r}: {key}={text!r}"


def _as_float(workload: str, key: str, text: str) -> float:
    return _spec.number(text, _where(workload, key, text), WorkloadError)


def _as_int(workload: str, key: str, text: str) -> int:
    # Integral floats such as 1e4 or 16384.0 are accepted: people type them.
    return _spec.integer(text, _where(workload, key, text), WorkloadError)


def _as_bool(workload: str, key: str, text: str) -> bool:
    return _spec.boolean(text, _where(workload, key, text), WorkloadError)


def _as_size(workload: str, key: str, text: str) -> float:
    try:
        return parse_size(text)
    except WorkloadError as exc:
        raise WorkloadError(f"{_where(workload, key, text)}: {exc}") from None


def _as_rank_list(workload: str, key: str, text: str) -> tuple[int, ...]:
    # One trailing ';' is allowed so that a one-element list ("5;") can be told
    # apart from a bare number where the two mean different things (sinks=5).
    body = text[:-1] if text.endswith(";") else text
    parts = [p.strip() for p in body.split(";")]
    if any(p == "" for p in parts):
        raise WorkloadError(f"{_where(workload, key, text)} has an empty list entry")
    return tuple(_as_int(workload, key, p) for p in parts)


def _as_rank_or_list(workload: str, key: str, text: str) -> int | tuple[int, ...]:
    ranks = _as_rank_list(workload, key, text)
    return ranks if ";" in text else ranks[0]


def _as_shape(workload: str, key: str, text: str) -> tuple[int, ...]:
    return _as_rank_list(workload, key, re.sub(r"[xX]", ";", text))


# --------------------------------------------------------------------------
# The workload table
# --------------------------------------------------------------------------

_Parser = Callable[[str, str, str], Any]


#: How a generator parameter's value is read, by its annotation (``| None`` dropped).
_READERS: dict[str, _Parser] = {
    "float": _as_float,
    "int": _as_int,
    "bool": _as_bool,
    "int | Sequence[int]": _as_rank_or_list,
    "Sequence[int] | np.ndarray": _as_rank_list,
    "tuple[int, int]": _as_shape,
}


@dataclass(frozen=True)
class _Kind:
    func: Callable[..., np.ndarray]
    keys: dict[str, _Parser]  # canonical key (the generator's parameter) -> parser
    positional: str | None = None
    aliases: dict[str, str] = field(default_factory=dict)
    sized: bool = True  # takes bytes_per_rank
    required: tuple[str, ...] = ()

    @classmethod
    def of(cls, func: Callable[..., np.ndarray], positional: str | None = None,
           **aliases: str) -> _Kind:
        """A workload's keys read off ``func``'s signature: declared once, in the generator.

        Every parameter after ``num_ranks`` (and ``bytes_per_rank``, which makes
        it sized) is a key, read by its annotation (:data:`_READERS`); one
        without a default is required.
        """
        params = list(inspect.signature(func).parameters.values())[1:]
        sized = bool(params) and params[0].name == "bytes_per_rank"
        keys = {p.name: _READERS[str(p.annotation).removesuffix(" | None")]
                for p in params[sized:]}
        required = tuple(p.name for p in params[sized:] if p.default is inspect.Parameter.empty)
        return cls(func, keys, positional, aliases, sized, required)


#: Values an error shows for a required key the spec left out (a first spec to edit).
_EXAMPLE_VALUES = {"tokens": "16384", "hidden": "4096"}

#: Every workload: its generator and how its spec keys read, in the order listed.
_KINDS: Registry[_Kind] = Registry("workload", error=WorkloadError)
for _kind in (
    _Kind.of(generators.uniform),
    _Kind.of(generators.hotspot, "ratio"),
    _Kind.of(generators.zipf, "alpha"),
    _Kind.of(generators.moe, experts="num_experts", topk="top_k", k="top_k", hot="hot_ratio"),
    _Kind.of(generators.many_to_few, "sinks"),
    _Kind.of(generators.stencil, "dims", boundary="boundary_factor"),
    _Kind.of(generators.random_sparse, "density"),
):
    _KINDS.add(_kind.func.__name__, _kind, module=__name__)

WORKLOAD_NAMES: tuple[str, ...] = tuple(_KINDS)
"""Names accepted by :func:`parse_workload` and :meth:`WorkloadSpec.parse`."""

_BYTES_KEYS = ("bytes", "bytes_per_rank")


def _unknown(what: str, given: str, valid: list[str]) -> WorkloadError:
    hint = did_you_mean(given, valid)
    return WorkloadError(f"unknown {what} {given!r}{hint}; valid: {', '.join(valid)}")


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list, np.ndarray)):
        # A one-element list keeps a trailing ';' so it parses back as a list:
        # "sinks=5;" is rank 5, while "sinks=5" means the first five ranks.
        items = [_format_value(v) for v in value]
        return ";".join(items) + (";" if len(items) == 1 else "")
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class WorkloadSpec:
    """A parsed workload spec: a generator name and its keyword parameters.

    ``params`` uses the generator's own parameter names (aliases resolved)
    and typed values; ``bytes_per_rank`` is set only when the spec said
    ``bytes=``. ``str(spec)`` gives a canonical spec string that parses back
    to an equal object.

    Examples
    --------
    >>> from pathweave.traffic import WorkloadSpec
    >>> spec = WorkloadSpec.parse("hotspot:0.8")
    >>> spec
    WorkloadSpec(name='hotspot', params={'ratio': 0.8}, bytes_per_rank=None)
    >>> spec.build(4, bytes_per_rank=300).astype(int).tolist()[1]
    [240, 0, 30, 30]
    """

    name: str
    params: dict[str, Any] = field(default_factory=dict, hash=False)
    bytes_per_rank: float | None = None

    @classmethod
    def parse(cls, spec: str) -> WorkloadSpec:
        """Parse a spec string; see the module docstring for the grammar.

        Raises
        ------
        TypeError
            ``spec`` is not a string.
        WorkloadError
            Naming the unknown workload or key, or the value that does not
            parse, and listing what is valid.
        """
        head, rest = _spec.split(spec, "workload spec")
        name = head.lower().replace("-", "_")
        if name not in _KINDS:
            raise _KINDS.unknown(head)  # as written; the closest name and every one
        kind = _KINDS[name]

        def canonical(key: str) -> str:
            key = key.lower()
            return "bytes" if key in _BYTES_KEYS else kind.aliases.get(key, key)

        items = _spec.items(
            rest, where=f"workload spec {spec!r}", error=WorkloadError, canonical=canonical,
            positional=kind.positional,
            hint=f"; write key=value with keys {', '.join(cls._keys(name))}",
        )
        params: dict[str, Any] = {}
        size: float | None = None
        for key, written, text in items:
            as_written = key if written is None else written.lower()
            if key == "bytes":
                size = _as_size(name, as_written, text)
            elif key in kind.keys:
                params[key] = kind.keys[key](name, as_written, text)
            else:
                raise _unknown(f"key for workload {name!r}:", as_written, cls._keys(name))
        missing = [k for k in kind.required if k not in params]
        if missing:
            more = ",".join(f"{k}={_EXAMPLE_VALUES.get(k, 'N')}" for k in missing)
            raise WorkloadError(
                f"workload {name!r} needs {', '.join(k + '=' for k in missing)} in {spec!r}, "
                f"e.g. {spec.rstrip(':,')}{',' if rest else ':'}{more}"
            )
        return cls(name, params, size)

    @staticmethod
    def _keys(name: str) -> list[str]:
        kind = _KINDS[name]
        return sorted([*kind.keys, *kind.aliases, "bytes"])

    def build(
        self,
        num_ranks: int,
        bytes_per_rank: float = DEFAULT_BYTES_PER_RANK,
        *,
        gpus_per_node: int | None = None,
        seed: int | None = None,
    ) -> np.ndarray:
        """The demand matrix for ``num_ranks`` ranks.

        The arguments and the result are those of :func:`parse_workload`,
        which calls this for every spec that is not a demand file.
        """
        kind = _KINDS[self.name]
        if gpus_per_node is not None:
            if (
                isinstance(gpus_per_node, bool)
                or not isinstance(gpus_per_node, (int, np.integer))
                or gpus_per_node < 1
            ):
                raise WorkloadError(
                    f"gpus_per_node must be a positive integer, got {gpus_per_node!r}"
                )
            if isinstance(num_ranks, (int, np.integer)) and num_ranks % gpus_per_node:
                raise WorkloadError(
                    f"num_ranks = {num_ranks} is not a multiple of gpus_per_node = {gpus_per_node}"
                )
        unknown = [k for k in self.params if k not in kind.keys]
        if unknown:
            raise _unknown(f"key for workload {self.name!r}:", unknown[0], sorted(kind.keys))
        params = dict(self.params)
        if seed is not None and "seed" in kind.keys:
            params.setdefault("seed", seed)
        size = bytes_per_rank if self.bytes_per_rank is None else self.bytes_per_rank
        try:
            if not kind.sized:
                return kind.func(num_ranks, **params)
            return kind.func(num_ranks, size, **params)
        except (WorkloadError, ValueError, TypeError) as exc:
            # The generator names the parameter and value; the spec says which workload.
            raise type(exc)(f"workload {str(self)!r}: {exc}") from None

    def __str__(self) -> str:
        items = [f"{k}={_format_value(v)}" for k, v in self.params.items()]
        if self.bytes_per_rank is not None:
            items.append(f"bytes={_format_value(float(self.bytes_per_rank))}")
        return self.name + (":" + ",".join(items) if items else "")


def is_demand_file(spec: str) -> bool:
    """Whether ``spec`` names a demand file (by its suffix) rather than a generator.

    >>> is_demand_file("measured.npz"), is_demand_file("hotspot:0.8")
    (True, False)
    """
    from .io import LOAD_SUFFIXES

    return os.path.splitext(spec.strip())[1].lower() in LOAD_SUFFIXES


def _load_file(path: str, num_ranks: int) -> np.ndarray:
    from .io import load_demand

    demand = load_demand(path.strip())
    if demand.shape[0] != num_ranks:
        raise WorkloadError(
            f"demand file {path!r} is {demand.shape[0]} x {demand.shape[0]}; "
            f"the fabric has {num_ranks} ranks"
        )
    return demand


def parse_workload(
    spec: str,
    num_ranks: int,
    *,
    bytes_per_rank: float = DEFAULT_BYTES_PER_RANK,
    gpus_per_node: int | None = None,
    seed: int | None = None,
) -> np.ndarray:
    """Build the demand matrix a spec string describes.

    Parameters
    ----------
    spec : str
        Workload spec, e.g. ``"hotspot:0.8"`` or ``"stencil:dims=2"``, or a
        demand file (``.npz``, ``.json``, ``.npy``, ``.csv``; see
        :func:`~pathweave.traffic.load_demand`), whose matrix is used as it is.
    num_ranks : int
        Number of ranks.
    bytes_per_rank : float, default 256 MiB
        Payload per rank, unless the spec sets ``bytes=`` (ignored by
        ``moe``).
    gpus_per_node : int, optional
        If given, checked to divide ``num_ranks`` so that a spec meant for
        one cluster shape is not silently built for another.
    seed : int, optional
        Seed for random workloads, unless the spec sets ``seed=``; ignored
        by deterministic ones.

    Returns
    -------
    numpy.ndarray
        The demand matrix.

    Examples
    --------
    >>> from pathweave.traffic import parse_workload
    >>> parse_workload("many_to_few:sinks=2", 4, bytes_per_rank=100).astype(int).tolist()
    [[0, 0, 0, 0], [0, 0, 0, 0], [50, 50, 0, 0], [50, 50, 0, 0]]
    """
    if is_demand_file(spec):
        return _load_file(spec, num_ranks)
    return WorkloadSpec.parse(spec).build(
        num_ranks, bytes_per_rank, gpus_per_node=gpus_per_node, seed=seed
    )
