"""Load and save fabrics as YAML or JSON files.

The file format is described in ``docs/fabric-schema.md``. In short::

    format: pathweave-fabric
    version: 1
    name: tiny
    vertices:
    - {name: n0.gpu0, kind: gpu, node: 0}
    - {name: n0.gpu1, kind: gpu, node: 0}
    links:
    - {src: n0.gpu0, dst: n0.gpu1, kind: nvlink, capacity_Bps: 1.2e+11, duplex: true}

Saving then loading gives back an equal fabric: vertex and link order are
kept and every float is written in a form the loader reads back bit for bit.
Every problem in a file is reported as a
:class:`~pathweave.errors.FabricFileError` that names the file, the key
(``links[3].capacity_Bps``) and the offending value.

:func:`load` shows reading such a file, :func:`save` a round trip.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from pathweave._files import atomic_write, excerpt, read_input
from pathweave.errors import FabricError, FabricFileError, InputError
from pathweave.fabric._core import NODE_LOCAL_KINDS, Fabric, LinkKind, VertexKind

FORMAT = "pathweave-fabric"
VERSION = 1
DEFAULT_LATENCY_S = 1e-6

_VERTEX_KINDS = {k.label: k for k in VertexKind}
_LINK_KINDS = {k.label: k for k in LinkKind}
_TOP_KEYS = ("format", "version", "name", "meta", "vertices", "links")
_VERTEX_KEYS = ("name", "kind", "node")
_LINK_KEYS = ("src", "dst", "kind", "capacity_Bps", "capacity_GBps", "latency_s", "duplex")
# PyYAML follows YAML 1.1, which reads ``50e9`` (no dot) as a string; people
# write capacities that way, so numeric-looking strings are accepted as numbers.
_NUMBER_TEXT = re.compile(r"^[-+]?(?:\d[\d_]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")
_YAML_SUFFIXES = (".yaml", ".yml")


# ----------------------------------------------------------------- writing
def _plain(x: Any) -> Any:
    """``x`` as plain YAML/JSON data: numpy scalars unwrapped, tuples as lists."""
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        items = sorted(x, key=repr) if isinstance(x, (set, frozenset)) else x
        return [_plain(v) for v in items]
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    if isinstance(x, np.generic):
        return x.item()
    if x is None or isinstance(x, (str, bool, int, float)):
        return x
    return str(x)


def to_dict(fab: Fabric) -> dict[str, Any]:
    """The fabric as plain data following the file schema.

    A link followed by its exact reverse (same kind, capacity and latency) is
    written once with ``duplex: true``; the loader expands it back in the same
    place, so link ids survive the round trip. ``latency_s`` is left out where
    it equals the default, 1 us.

    Parameters
    ----------
    fab
        The fabric to describe.

    Returns
    -------
    dict
        ``format``, ``version``, ``name``, ``meta`` (only if non-empty),
        ``vertices`` and ``links``.

    Examples
    --------
    >>> import pathweave as pw
    >>> d = pw.fabric.to_dict(pw.fabric.preset("h100-2x4"))
    >>> d["format"], d["version"], len(d["vertices"])
    ('pathweave-fabric', 1, 32)
    >>> first = d["links"][0]
    >>> first["src"], first["dst"], first["kind"], first["capacity_Bps"]
    ('n0.gpu0', 'n0.gpu1', 'nvlink', 120000000000.0)
    >>> pw.fabric.to_dict(pw.fabric.preset("dgx-h100"))["links"][0]["duplex"]
    True
    """
    vertices: list[dict[str, Any]] = []
    for name, kind, node in zip(
        fab.vertex_names, fab.vertex_kind.tolist(), fab.vertex_node.tolist(), strict=True
    ):
        vk = VertexKind(kind)
        v: dict[str, Any] = {"name": name, "kind": vk.label}
        if vk in NODE_LOCAL_KINDS or node != -1:
            v["node"] = int(node)
        vertices.append(v)
    src, dst = fab.link_src.tolist(), fab.link_dst.tolist()
    kind, cap, lat = fab.link_kind.tolist(), fab.capacity_Bps.tolist(), fab.latency_s.tolist()
    names = fab.vertex_names
    links: list[dict[str, Any]] = []
    i, n = 0, fab.num_links
    while i < n:
        link: dict[str, Any] = {
            "src": names[src[i]],
            "dst": names[dst[i]],
            "kind": LinkKind(kind[i]).label,
            "capacity_Bps": float(cap[i]),
        }
        if lat[i] != DEFAULT_LATENCY_S:
            link["latency_s"] = float(lat[i])
        j = i + 1
        if (
            j < n
            and src[j] == dst[i]
            and dst[j] == src[i]
            and kind[j] == kind[i]
            and cap[j] == cap[i]
            and lat[j] == lat[i]
        ):
            link["duplex"] = True
            i += 2
        else:
            i += 1
        links.append(link)
    out: dict[str, Any] = {"format": FORMAT, "version": VERSION, "name": fab.name}
    meta = _plain(fab.meta)
    if meta:
        out["meta"] = meta
    out["vertices"] = vertices
    out["links"] = links
    return out


def _yaml_flow(item: Mapping[str, Any]) -> str:
    # One flow mapping per line keeps files short and diff-friendly, while
    # PyYAML takes care of quoting names and of floats that must re-read exactly.
    return yaml.safe_dump(
        dict(item), default_flow_style=True, sort_keys=False, width=1 << 30
    ).strip()


def _dump_yaml(d: Mapping[str, Any]) -> str:
    head = {k: d[k] for k in ("format", "version", "name", "meta") if k in d}
    parts = [yaml.safe_dump(head, sort_keys=False, default_flow_style=False, width=100)]
    for key in ("vertices", "links"):
        items = d[key]
        if not items:
            parts.append(f"{key}: []\n")
            continue
        parts.append(f"{key}:\n")
        parts.extend(f"- {_yaml_flow(item)}\n" for item in items)
    return "".join(parts)


def _dump_json(d: Mapping[str, Any]) -> str:
    lines = ["{"]
    head = [k for k in ("format", "version", "name", "meta") if k in d]
    for k in head:
        value = json.dumps(d[k], indent=2).replace("\n", "\n  ")
        lines.append(f"  {json.dumps(k)}: {value},")
    for key, last in (("vertices", False), ("links", True)):
        items = d[key]
        tail = "" if last else ","
        if not items:
            lines.append(f"  {json.dumps(key)}: []{tail}")
            continue
        lines.append(f"  {json.dumps(key)}: [")
        lines.extend(
            f"    {json.dumps(item)}{',' if i + 1 < len(items) else ''}"
            for i, item in enumerate(items)
        )
        lines.append(f"  ]{tail}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def save(fab: Fabric, path: str | os.PathLike[str]) -> Path:
    """Write ``fab`` to ``path``; the suffix picks the format.

    The file is written to a temporary file in the same folder and then moved
    over ``path``, so a reader never sees a half-written file and a failed
    write leaves any previous file intact.

    Parameters
    ----------
    fab
        The fabric.
    path
        Destination ending in ``.yaml``, ``.yml`` or ``.json``.

    Returns
    -------
    pathlib.Path
        ``path``, so ``load(save(fab, p)) == fab``.

    Raises
    ------
    FabricFileError
        If the suffix is not one of the above, ``path`` is not a place for a
        regular file (a device, a directory) or the folder is not writable.
        Missing folders are created.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> import pathweave as pw
    >>> fab = pw.fabric.preset("dgx-h100")
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     p = pw.fabric.save(fab, pathlib.Path(tmp) / "dgx.json")
    ...     pw.fabric.load(p) == fab
    True
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in _YAML_SUFFIXES:
        text = _dump_yaml(to_dict(fab))
    elif suffix == ".json":
        text = _dump_json(to_dict(fab))
    else:
        raise FabricFileError(
            f"unknown fabric file suffix {p.suffix!r}; use .yaml, .yml or .json", path=str(p)
        )
    try:
        atomic_write(p, text.encode("utf-8"))
    except OSError as exc:
        raise FabricFileError(f"cannot write: {exc.strerror or exc}", path=str(p)) from None
    except InputError as exc:  # a device, a directory, an unwritable folder
        raise FabricFileError(str(exc)) from None
    return p


# ----------------------------------------------------------------- reading
class _Reader:
    """Checks one parsed document and raises errors that point into it."""

    def __init__(self, source: str | None) -> None:
        self.source = source

    def fail(self, key: str | None, message: str) -> FabricFileError:
        return FabricFileError(message, path=self.source, key=key or None)

    def mapping(self, x: Any, key: str, what: str) -> Mapping[str, Any]:
        if not isinstance(x, Mapping):
            raise self.fail(key, f"{what} must be a mapping, got {type(x).__name__} {excerpt(x)}")
        return x

    def keys(self, m: Mapping[str, Any], key: str, allowed: tuple[str, ...]) -> None:
        for k in m:
            if k not in allowed:
                where = f"{key}.{k}" if key else str(k)
                raise self.fail(where, f"unknown key {k!r}; allowed keys: {', '.join(allowed)}")

    def required(self, m: Mapping[str, Any], key: str, name: str) -> Any:
        if name not in m:
            where = f"{key}.{name}" if key else name
            raise self.fail(where, f"missing required key {name!r}")
        return m[name]

    def string(self, x: Any, key: str) -> str:
        if not isinstance(x, str) or not x:
            raise self.fail(key, f"expected a non-empty string, got {excerpt(x)}")
        return x

    def integer(self, x: Any, key: str) -> int:
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
            raise self.fail(key, f"expected an integer, got {excerpt(x)}")
        return int(x)

    def number(self, x: Any, key: str) -> float:
        if isinstance(x, str) and _NUMBER_TEXT.match(x.strip()):
            x = float(x.strip().replace("_", ""))
        if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
            raise self.fail(key, f"expected a number, got {excerpt(x)}")
        v = float(x)
        if not math.isfinite(v):
            raise self.fail(key, f"expected a finite number, got {excerpt(x)}")
        return v

    def boolean(self, x: Any, key: str) -> bool:
        if not isinstance(x, bool):
            raise self.fail(key, f"expected true or false, got {excerpt(x)}")
        return x

    def choice(self, x: Any, key: str, options: Mapping[str, Any]) -> Any:
        if not isinstance(x, str) or x.lower() not in options:
            raise self.fail(key, f"unknown kind {excerpt(x)}; expected one of {', '.join(options)}")
        return options[x.lower()]


def from_dict(d: Mapping[str, Any], *, source: str | os.PathLike[str] | None = None) -> Fabric:
    """Build a fabric from data following the file schema.

    Parameters
    ----------
    d
        Parsed YAML/JSON data (see ``docs/fabric-schema.md``).
    source
        File the data came from; error messages name it.

    Returns
    -------
    Fabric
        The validated fabric. Its candidate paths have been compiled (and
        cached), which proves every GPU pair can reach every other.

    Raises
    ------
    FabricFileError
        For any schema violation, and for errors found by :class:`Fabric` or
        :func:`~pathweave.fabric.paths.candidate_paths`, with ``source`` named.

    Examples
    --------
    >>> from pathweave.fabric import from_dict
    >>> fab = from_dict({
    ...     "format": "pathweave-fabric", "version": 1, "name": "pair",
    ...     "vertices": [{"name": "n0.gpu0", "kind": "gpu", "node": 0},
    ...                  {"name": "n0.gpu1", "kind": "gpu", "node": 0}],
    ...     "links": [{"src": "n0.gpu0", "dst": "n0.gpu1", "kind": "nvlink",
    ...                "capacity_GBps": 120, "duplex": True}]})
    >>> fab.num_links, float(fab.capacity_Bps[1])
    (2, 120000000000.0)
    """
    src_name = os.fspath(source) if source is not None else None
    r = _Reader(src_name)
    top = r.mapping(d, "", "the document")
    name, meta = _read_header(r, top)
    names, kinds, nodes, index = _read_vertices(r, top)
    links = _read_links(r, top, names, index)
    try:
        fab = Fabric(
            name=name,
            vertex_names=names,
            vertex_kind=kinds,
            vertex_node=nodes,
            link_src=np.array(links.src, dtype=np.int32),
            link_dst=np.array(links.dst, dtype=np.int32),
            link_kind=np.array(links.kind, dtype=np.int8),
            capacity_Bps=np.array(links.capacity_Bps, dtype=np.float64),
            latency_s=np.array(links.latency_s, dtype=np.float64),
            meta=meta,
        )
    except FabricError as exc:
        raise FabricFileError(str(exc), path=src_name) from exc
    if fab.num_ranks > 1:
        # Imported here: paths depends on nothing in io, but keeping the
        # import local avoids a cycle if paths ever learns to load files.
        from pathweave.fabric.paths import candidate_paths

        try:
            candidate_paths(fab)
        except FabricError as exc:
            raise FabricFileError(str(exc), path=src_name) from exc
    return fab


def _read_header(r: _Reader, top: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Check the top-level keys, format and version; return (name, meta)."""
    r.keys(top, "", _TOP_KEYS)
    fmt = r.required(top, "", "format")
    if fmt != FORMAT:
        raise r.fail("format", f"expected {FORMAT!r}, got {fmt!r}")
    version = r.integer(r.required(top, "", "version"), "version")
    if version != VERSION:
        raise r.fail(
            "version",
            f"unsupported version {version!r}; this pathweave reads version {VERSION}",
        )
    name = r.string(r.required(top, "", "name"), "name")
    meta = top.get("meta")
    if meta is None:
        meta = {}
    return name, dict(r.mapping(meta, "meta", "meta"))


def _read_node(r: _Reader, v: Mapping[str, Any], key: str, kind: VertexKind) -> int:
    """A vertex's node: required (>= 0) inside a node, -1 or absent for shared ones."""
    if kind in NODE_LOCAL_KINDS:
        node = r.integer(r.required(v, key, "node"), f"{key}.node")
        if node < 0:
            raise r.fail(f"{key}.node", f"a {kind.label} vertex needs a node >= 0, got {node!r}")
        return node
    node = r.integer(v.get("node", -1), f"{key}.node")
    if node != -1:
        raise r.fail(
            f"{key}.node",
            f"a {kind.label} is shared by all nodes: leave node out or set -1, got {node!r}",
        )
    return node


def _read_vertices(
    r: _Reader, top: Mapping[str, Any]
) -> tuple[list[str], list[int], list[int], dict[str, int]]:
    """Vertex names, kinds, nodes and the index of each name."""
    raw_vertices = r.required(top, "", "vertices")
    if not isinstance(raw_vertices, list) or not raw_vertices:
        raise r.fail("vertices", f"expected a non-empty list of vertices, got {raw_vertices!r}")
    names: list[str] = []
    kinds: list[int] = []
    nodes: list[int] = []
    index: dict[str, int] = {}
    for i, raw in enumerate(raw_vertices):
        key = f"vertices[{i}]"
        v = r.mapping(raw, key, "a vertex")
        r.keys(v, key, _VERTEX_KEYS)
        vname = r.string(r.required(v, key, "name"), f"{key}.name")
        kind = r.choice(r.required(v, key, "kind"), f"{key}.kind", _VERTEX_KINDS)
        node = _read_node(r, v, key, kind)
        if vname in index:
            raise r.fail(
                f"{key}.name",
                f"duplicate vertex {vname!r} (first defined at vertices[{index[vname]}])",
            )
        index[vname] = i
        names.append(vname)
        kinds.append(int(kind))
        nodes.append(node)
    return names, kinds, nodes, index


@dataclass
class _LinkColumns:
    """The directed links read so far, one list per :class:`Fabric` column."""

    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    capacity_Bps: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)


def _read_capacity(r: _Reader, lk: Mapping[str, Any], key: str) -> float:
    """``capacity_Bps``, or ``capacity_GBps`` x 1e9: exactly one, positive."""
    if "capacity_Bps" in lk and "capacity_GBps" in lk:
        raise r.fail(f"{key}.capacity_GBps", "give capacity_Bps or capacity_GBps, not both")
    if "capacity_Bps" in lk:
        cap_key = f"{key}.capacity_Bps"
        cap = r.number(lk["capacity_Bps"], cap_key)
        shown = lk["capacity_Bps"]
    elif "capacity_GBps" in lk:
        cap_key = f"{key}.capacity_GBps"
        shown = lk["capacity_GBps"]
        cap = r.number(shown, cap_key) * 1e9
    else:
        raise r.fail(f"{key}.capacity_Bps", "missing required key 'capacity_Bps'")
    if cap <= 0:
        raise r.fail(cap_key, f"capacity must be positive, got {shown!r}")
    return cap


def _read_links(
    r: _Reader, top: Mapping[str, Any], names: list[str], index: dict[str, int]
) -> _LinkColumns:
    """Every link entry, a duplex one as two directed links."""
    raw_links = r.required(top, "", "links")
    if raw_links is None:
        raw_links = []
    if not isinstance(raw_links, list):
        raise r.fail("links", f"expected a list of links, got {raw_links!r}")
    out = _LinkColumns()
    seen: dict[tuple[int, int], str] = {}
    for i, raw in enumerate(raw_links):
        key = f"links[{i}]"
        lk = r.mapping(raw, key, "a link")
        r.keys(lk, key, _LINK_KEYS)
        ends = []
        for end in ("src", "dst"):
            vname = r.string(r.required(lk, key, end), f"{key}.{end}")
            if vname not in index:
                raise r.fail(f"{key}.{end}", f"unknown vertex {vname!r}")
            ends.append(index[vname])
        u, v = ends
        if u == v:
            raise r.fail(f"{key}.dst", f"link from {names[u]!r} to itself")
        kind = r.choice(r.required(lk, key, "kind"), f"{key}.kind", _LINK_KINDS)
        cap = _read_capacity(r, lk, key)
        lat = r.number(lk.get("latency_s", DEFAULT_LATENCY_S), f"{key}.latency_s")
        if lat < 0:
            raise r.fail(f"{key}.latency_s", f"latency must be >= 0, got {lk['latency_s']!r}")
        duplex = r.boolean(lk.get("duplex", False), f"{key}.duplex")
        pairs = [(u, v, key)]
        if duplex:
            pairs.append((v, u, f"{key} (reverse direction added by duplex)"))
        for a, b, where in pairs:
            if (a, b) in seen:
                raise r.fail(
                    key,
                    f"duplicate link {names[a]} -> {names[b]} in {where}; "
                    f"already defined by {seen[(a, b)]}",
                )
            seen[(a, b)] = where
            out.src.append(a)
            out.dst.append(b)
            out.kind.append(int(kind))
            out.capacity_Bps.append(cap)
            out.latency_s.append(lat)
    return out


def _parse_text(text: str, path: str, suffix: str) -> Any:
    if suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise FabricFileError(
                f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
                path=path,
            ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise FabricFileError(f"malformed YAML{where}: {problem}", path=path) from None


def load(path: str | os.PathLike[str]) -> Fabric:
    """Read a fabric file written by :func:`save` or by hand.

    ``.json`` files are read as JSON; anything else (normally ``.yaml`` or
    ``.yml``) with ``yaml.safe_load``, which also reads JSON.

    Parameters
    ----------
    path
        The file.

    Returns
    -------
    Fabric

    Raises
    ------
    FabricFileError
        If the file cannot be read, does not parse or breaks the schema; the
        message names the file, the key and the bad value.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from pathweave.fabric import load
    >>> text = '''
    ... format: pathweave-fabric
    ... version: 1
    ... name: pair
    ... vertices:
    ... - {name: n0.gpu0, kind: gpu, node: 0}
    ... - {name: n0.gpu1, kind: gpu, node: 0}
    ... links:
    ... - {src: n0.gpu0, dst: n0.gpu1, kind: nvlink, capacity_GBps: 50, duplex: true}
    ... '''
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     p = pathlib.Path(tmp) / "pair.yaml"
    ...     _ = p.write_text(text)
    ...     load(p).num_links
    2
    """
    p = Path(path)
    name = str(p)
    try:
        raw = read_input(p, "fabric file")
    except OSError as exc:
        raise FabricFileError(f"cannot read: {exc.strerror or exc}", path=name) from None
    except InputError as exc:
        raise FabricFileError(str(exc)) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FabricFileError(
            f"not UTF-8 text (byte {exc.start}: {raw[exc.start : exc.start + 1]!r})", path=name
        ) from None
    data = _parse_text(text, name, p.suffix.lower())
    return from_dict(data, source=name)
