"""Parser for NCCL topology XML (``NCCL_TOPO_FILE`` / ``NCCL_TOPO_DUMP_FILE``).

The document is a tree: ``<system>`` holds ``<cpu>`` elements (NUMA nodes),
which hold ``<pci>`` elements for bridges and devices. A device is either a
``<pci>`` with a ``<gpu>`` or ``<nic>`` child (what NCCL dumps) or a childless
``<pci>`` known only by its class code (what hand-written topology files such
as Azure's contain). ``<nvlink>`` children of a ``<gpu>`` name the peer by
bus id and say with ``tclass`` whether it is a GPU or an NVSwitch.

The file is parsed with :mod:`defusedxml` and any DTD is refused: topology
files never need one, and entity expansion is the classic way to make an XML
parser eat all memory or read local files.

This module only reads the tree into :class:`XmlTopology` and pairs NICs
with GPUs; the fabric is assembled in :mod:`pathweave.fabric.discovery`.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import defusedxml
import defusedxml.ElementTree as DET

from pathweave.errors import FabricFileError, UnsafeXMLError

GPU_CLASSES = frozenset({0x030200, 0x030000})  # 3D controller, VGA controller
IB_CLASS = 0x020700
ETHERNET_CLASS = 0x020000
NIC_CLASSES = frozenset({IB_CLASS, ETHERNET_CLASS})
NVSWITCH_TCLASS = 0x068000  # "bridge, other": how NVSwitches enumerate
GPU_TCLASSES = GPU_CLASSES


@dataclass
class XmlGpu:
    busid: str | None
    dev: int | None
    sm: int | None
    chain: tuple[int, ...]  # enclosing PCI bridges, outermost first
    nvlinks: list[tuple[str, int, int | None]]  # (target busid, count, tclass)
    order: int
    socket: int = -1  # index of the enclosing <cpu> in document order, -1 if none


@dataclass
class XmlNic:
    device: str  # net name, or the PCI bus id when the file names none
    busid: str | None
    pci_class: int | None
    speed_mbps: float | None
    chain: tuple[int, ...]
    order: int
    socket: int = -1


@dataclass
class XmlTopology:
    gpus: list[XmlGpu]  # sorted by dev where every GPU has one, else document order
    nics: list[XmlNic]  # document order
    bridge_depth: dict[int, int]
    notes: list[str] = field(default_factory=list)


def _hex(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


def _desc(el: ET.Element) -> str:
    keys = ("busid", "dev", "name", "target")
    attrs = " ".join(f'{k}="{el.get(k)}"' for k in keys if el.get(k) is not None)
    return f"<{el.tag}{' ' + attrs if attrs else ''}>"


def _int_attr(el: ET.Element, attr: str, source: str | None) -> int | None:
    raw = el.get(attr)
    if raw is None:
        return None
    try:
        return int(raw.strip(), 0) if raw.strip().lower().startswith("0x") else int(raw.strip())
    except ValueError:
        raise FabricFileError(
            f"attribute {attr}={raw!r} of {_desc(el)} is not an integer",
            path=source,
            key=f"{_desc(el)}.{attr}",
        ) from None


def _float_attr(el: ET.Element, attr: str, source: str | None) -> float | None:
    raw = el.get(attr)
    if raw is None:
        return None
    try:
        v = float(raw.strip())
    except ValueError:
        v = float("nan")
    if not v > 0 or v == float("inf"):
        raise FabricFileError(
            f"attribute {attr}={raw!r} of {_desc(el)} is not a positive number",
            path=source,
            key=f"{_desc(el)}.{attr}",
        )
    return v


def parse_document(data: str | bytes, source: str | None = None) -> ET.Element:
    """Parse safely: DTDs, entities and external references are refused."""
    try:
        return DET.fromstring(data, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except (
        defusedxml.DTDForbidden,
        defusedxml.EntitiesForbidden,
        defusedxml.ExternalReferenceForbidden,
    ) as exc:
        raise UnsafeXMLError(
            "refusing XML with a DTD/entity declaration or external reference "
            f"({type(exc).__name__}: {exc}); NCCL topology files never need one, and "
            "they are how entity-expansion and external-entity attacks work",
            path=source,
        ) from None
    except ET.ParseError as exc:
        line, col = getattr(exc, "position", (None, None))
        raise FabricFileError(
            f"malformed XML at line {line}, column {col}: {exc}", path=source
        ) from None


def parse(data: str | bytes, source: str | None = None) -> XmlTopology:
    """Read GPUs, NICs and the PCI bridges above them."""
    root = parse_document(data, source)
    if root.tag != "system":
        raise FabricFileError(
            f"root element is <{root.tag}>, expected <system> (an NCCL topology file)",
            path=source,
            key=f"<{root.tag}>",
        )
    gpus: list[XmlGpu] = []
    nics: list[XmlNic] = []
    depth: dict[int, int] = {}
    notes: list[str] = []
    counter = [0]
    cpus = [0]
    socket = [-1]  # the <cpu> being walked

    def add_gpu(gpu_el: ET.Element | None, pci_el: ET.Element | None, chain: tuple[int, ...]):
        el = gpu_el if gpu_el is not None else pci_el
        assert el is not None
        links = []
        if gpu_el is not None:
            for nv in gpu_el.iter("nvlink"):
                count = _int_attr(nv, "count", source)
                target = nv.get("target")
                if count is None or count < 0 or target is None:
                    raise FabricFileError(
                        f"{_desc(nv)} needs a target and a count >= 0, "
                        f"got target={target!r}, count={nv.get('count')!r}",
                        path=source,
                        key=_desc(nv),
                    )
                links.append((target.lower(), count, _hex(nv.get("tclass"))))
        busid = pci_el.get("busid") if pci_el is not None else None
        gpus.append(
            XmlGpu(
                busid=busid.lower() if busid else None,
                dev=_int_attr(gpu_el, "dev", source) if gpu_el is not None else None,
                sm=_int_attr(gpu_el, "sm", source) if gpu_el is not None else None,
                chain=chain,
                nvlinks=links,
                order=len(gpus),
                socket=socket[0],
            )
        )

    def add_nics(nic_el: ET.Element | None, pci_el: ET.Element | None, chain: tuple[int, ...]):
        busid = pci_el.get("busid") if pci_el is not None else None
        cls = _hex(pci_el.get("class")) if pci_el is not None else None
        nets = list(nic_el.iter("net")) if nic_el is not None else []
        if not nets:
            nics.append(XmlNic(busid or "?", busid, cls, None, chain, len(nics), socket[0]))
            return
        for net in nets:
            # A dual-port card lists one <net> per port; each is its own NIC.
            nics.append(
                XmlNic(
                    device=net.get("name") or busid or "?",
                    busid=busid,
                    pci_class=cls,
                    speed_mbps=_float_attr(net, "speed", source),
                    chain=chain,
                    order=len(nics),
                    socket=socket[0],
                )
            )

    def walk(el: ET.Element, chain: tuple[int, ...]) -> None:
        for child in el:
            if child.tag == "pci":
                kids = list(child)
                gpu_el = next((k for k in kids if k.tag == "gpu"), None)
                nic_el = next((k for k in kids if k.tag == "nic"), None)
                cls = _hex(child.get("class"))
                if gpu_el is not None:
                    add_gpu(gpu_el, child, chain)
                elif nic_el is not None:
                    add_nics(nic_el, child, chain)
                elif not kids and cls in GPU_CLASSES:
                    add_gpu(None, child, chain)
                elif not kids and cls in NIC_CLASSES:
                    add_nics(None, child, chain)
                else:
                    bid = counter[0]
                    counter[0] += 1
                    depth[bid] = len(chain)
                    walk(child, (*chain, bid))
            elif child.tag == "gpu":
                add_gpu(child, None, chain)
            elif child.tag == "nic":
                add_nics(child, None, chain)
            elif child.tag == "cpu":
                outer, socket[0] = socket[0], cpus[0]
                cpus[0] += 1
                walk(child, chain)
                socket[0] = outer
            else:
                walk(child, chain)

    walk(root, ())
    if not gpus:
        raise FabricFileError(
            "no GPU found: expected <gpu> elements or <pci> elements of class 0x030200/0x030000",
            path=source,
        )
    devs = [g.dev for g in gpus]
    if all(d is not None for d in devs):
        if len(set(devs)) != len(devs):
            dup = next(d for d in devs if devs.count(d) > 1)
            raise FabricFileError(f"two GPUs have dev={dup}", path=source, key=f'<gpu dev="{dup}">')
        gpus.sort(key=lambda g: g.dev)  # type: ignore[arg-type, return-value]
    else:
        notes.append("GPUs carry no dev attribute; numbered in document order")
    return XmlTopology(gpus=gpus, nics=nics, bridge_depth=depth, notes=notes)


def pair_nics(topo: XmlTopology) -> tuple[list[tuple[XmlNic, list[int]]], list[XmlNic]]:
    """Attach each NIC to the GPUs behind its innermost shared PCI switch.

    Bridges are visited deepest first; under each, the NICs and GPUs not yet
    paired deeper down are matched in order: NIC ``k`` with GPU ``k`` when
    there are at least as many GPUs as NICs, the GPUs split into consecutive
    groups when there are fewer NICs, and extra NICs wrapping around to GPU
    ``k mod g``. NICs that share no switch with any GPU are returned as left
    out. Returns ``(attached, left_out)``: ``attached`` in rail order (by the
    first GPU served, then document order).
    """
    paired: dict[int, list[int]] = {}  # nic order -> GPU indices
    gpu_done: set[int] = set()
    for bid in sorted(topo.bridge_depth, key=lambda b: (-topo.bridge_depth[b], b)):
        g_here = [i for i, g in enumerate(topo.gpus) if bid in g.chain and i not in gpu_done]
        n_here = [n.order for n in topo.nics if bid in n.chain and n.order not in paired]
        if not g_here or not n_here:
            continue
        g, r = len(g_here), len(n_here)
        for k, nic in enumerate(n_here):
            if r >= g:
                paired[nic] = [g_here[k % g]]
            else:
                paired[nic] = [g_here[i] for i in range(g) if i * r // g == k]
        gpu_done.update(g_here)
    attached = [(n, paired[n.order]) for n in topo.nics if n.order in paired]
    attached.sort(key=lambda item: (min(item[1]), item[0].order))
    left_out = [n for n in topo.nics if n.order not in paired]
    return attached, left_out
