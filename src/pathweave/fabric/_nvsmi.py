"""Parser for the text of ``nvidia-smi topo -m``.

The output is a square matrix of GPU and NIC columns followed by a few
affinity columns, then a legend and, on newer drivers, a "NIC Legend" that
maps ``NIC<k>`` to device names such as ``mlx5_0``. Columns are separated by
tabs, or by runs of spaces once tabs have been expanded; column titles such
as ``CPU Affinity`` contain single spaces, so only runs of two or more spaces
separate cells.

This module only reads the text into :class:`SmiTopology`; deciding what
the matrix means for the fabric is done in :mod:`pathweave.fabric.discovery`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pathweave.errors import FabricFileError

#: PCIe distance codes, nearest first. ``SOC`` is what old drivers printed for
#: ``SYS``.
PCIE_CELLS = ("PIX", "PXB", "PHB", "NODE", "SYS", "SOC")

_SPLIT = re.compile(r"\s*\t\s*|\s{2,}")
_NV = re.compile(r"^NV(\d+)$")
_GPU_COL = re.compile(r"^GPU(\d+)$")
_NIC_COL = re.compile(r"^NIC(\d+)$")
_LEGEND_ENTRY = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")


@dataclass
class SmiTopology:
    """The matrix of one ``nvidia-smi topo -m`` output.

    ``gpu_gpu[i][j]`` and ``gpu_nic[i][k]`` are the cells of GPU row ``i``
    (``"X"``, ``"NV<n>"`` or a PCIe code from :data:`PCIE_CELLS`);
    ``nic_devices[k]`` is the device name of NIC column ``k`` (from the NIC
    Legend, or the column title itself on drivers that print ``mlx5_0``).
    """

    gpu_labels: list[str]
    nic_labels: list[str]
    nic_devices: list[str]
    gpu_gpu: list[list[str]]
    gpu_nic: list[list[str]]
    notes: list[str] = field(default_factory=list)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in _SPLIT.split(line.strip())]


def _is_info_column(title: str) -> bool:
    # "CPU Affinity", "NUMA Affinity", "GPU NUMA ID": per-row facts, not a device.
    return " " in title or "affinity" in title.lower() or "numa" in title.lower()


def _check_cell(cell: str, row: str, col: str, lineno: int, source: str | None) -> str:
    if cell == "X" or cell in PCIE_CELLS or _NV.match(cell):
        return cell
    raise FabricFileError(
        f"line {lineno}: unknown topology cell {cell!r} in row {row!r}, column {col!r}; "
        "expected X, NV<n>, PIX, PXB, PHB, NODE or SYS",
        path=source,
        key=f"row {row}, column {col}",
    )


def parse(text: str, source: str | None = None) -> SmiTopology:
    """Read the matrix, the column titles and the NIC legend.

    Raises :class:`FabricFileError` naming the row, column and cell for
    anything that is not a well-formed matrix.
    """
    lines = text.splitlines()
    header_at = None
    for i, line in enumerate(lines):
        cells = _cells(line)
        # Matrix rows start with GPU<k> too, but every row holds its X.
        if cells and _GPU_COL.match(cells[0]) and "X" not in cells:
            header_at = i
            break
    if header_at is None:
        raise FabricFileError(
            "no header row found: expected a line starting with GPU0 "
            "(the output of `nvidia-smi topo -m`)",
            path=source,
        )
    header = _cells(lines[header_at])
    matrix_cols: list[str] = []
    info_cols: list[str] = []
    for title in header:
        if info_cols or _is_info_column(title):
            info_cols.append(title)
        else:
            matrix_cols.append(title)
    if len(set(matrix_cols)) != len(matrix_cols):
        dup = next(c for c in matrix_cols if matrix_cols.count(c) > 1)
        raise FabricFileError(
            f"line {header_at + 1}: column {dup!r} appears twice in the header",
            path=source,
            key="header",
        )
    gpu_cols = [c for c in matrix_cols if _GPU_COL.match(c)]
    # Anything else in the square part is a NIC: NIC<k> on new drivers,
    # the device name (mlx5_0, ib0, ...) on old ones.
    nic_cols = [c for c in matrix_cols if not _GPU_COL.match(c)]

    rows: dict[str, list[str]] = {}
    end = len(lines)
    for i in range(header_at + 1, len(lines)):
        raw = lines[i]
        if not raw.strip() or raw.strip().rstrip(":").lower() in ("legend", "nic legend"):
            end = i
            break
        cells = _cells(raw)
        label = cells[0]
        if label not in matrix_cols:
            raise FabricFileError(
                f"line {i + 1}: row {label!r} is not one of the header's columns "
                f"({', '.join(matrix_cols)})",
                path=source,
                key=f"row {label}",
            )
        if label in rows:
            raise FabricFileError(
                f"line {i + 1}: row {label!r} appears twice", path=source, key=f"row {label}"
            )
        values = cells[1:]
        if not len(matrix_cols) <= len(values) <= len(matrix_cols) + len(info_cols):
            raise FabricFileError(
                f"line {i + 1}: row {label!r} has {len(values)} cells, expected "
                f"{len(matrix_cols)} matrix cells (plus up to {len(info_cols)} affinity cells)",
                path=source,
                key=f"row {label}",
            )
        checked = []
        for col, cell in zip(matrix_cols, values[: len(matrix_cols)], strict=True):
            cell = _check_cell(cell, label, col, i + 1, source)
            if (cell == "X") != (col == label):
                what = (
                    "the diagonal must be X" if col == label else "X only belongs on the diagonal"
                )
                raise FabricFileError(
                    f"line {i + 1}: cell {cell!r} in row {label!r}, column {col!r}: {what}",
                    path=source,
                    key=f"row {label}, column {col}",
                )
            checked.append(cell)
        rows[label] = checked
    missing = [g for g in gpu_cols if g not in rows]
    if missing:
        raise FabricFileError(
            f"GPU rows {missing} are missing below the header", path=source, key=f"row {missing[0]}"
        )

    legend: dict[str, str] = {}
    for line in lines[end:]:
        m = _LEGEND_ENTRY.match(line)
        if m:
            legend[m.group(1)] = m.group(2)
    notes: list[str] = []
    nic_devices = []
    for c in nic_cols:
        if _NIC_COL.match(c):
            if c not in legend:
                notes.append(f"{c} has no entry in the NIC Legend; its device name is unknown")
            nic_devices.append(legend.get(c, c))
        else:
            nic_devices.append(c)

    col_index = {c: k for k, c in enumerate(matrix_cols)}
    gpu_gpu = [[rows[g][col_index[h]] for h in gpu_cols] for g in gpu_cols]
    gpu_nic = [[rows[g][col_index[n]] for n in nic_cols] for g in gpu_cols]
    return SmiTopology(
        gpu_labels=gpu_cols,
        nic_labels=nic_cols,
        nic_devices=nic_devices,
        gpu_gpu=gpu_gpu,
        gpu_nic=gpu_nic,
        notes=notes,
    )


def nv_count(cell: str) -> int:
    """Bonded NVLinks in a cell: ``NV18`` -> 18, anything else -> 0."""
    m = _NV.match(cell)
    return int(m.group(1)) if m else 0
