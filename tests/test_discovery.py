"""Discovery from nvidia-smi and NCCL XML, checked against facts read by hand.

The fixtures live in ``shared/fixtures/topology`` next to the repository
(see SOURCES.md there). Every expected value below was read off the files
themselves, not produced by the code under test.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from pathweave.errors import FabricError, FabricFileError, UnsafeXMLError
from pathweave.fabric import PathKind, VertexKind
from pathweave.fabric._core import Fabric
from pathweave.fabric.builders import NDR400_Bps, PCIE_GEN5_X16_Bps
from pathweave.fabric.discovery import DiscoveryWarning, from_nccl_xml, from_nvidia_smi
from pathweave.fabric.paths import ALL_KINDS, candidate_paths

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "topology"
H100_SMI = "h100_sxm_8gpu_8nic_nvidia-smi-topo-m.txt"
GH200_SMI = "gh200_quad_4gpu_nv6_nvidia-smi-topo-m.txt"
AZURE_XML = "azure_ndv5_h100_nccl-topo.xml"
IBM_XML = "ibm_cloud_gx3d_8xh100_nccl-topo-dump.xml"


def fixture(name: str) -> Path:
    path = FIXTURES / name
    if not path.is_file():
        pytest.fail(
            f"topology fixture {name} not found at {path}; the tests expect the shared "
            "fixtures checked out beside the repository (…/shared/fixtures/topology)"
        )
    return path


def disc(fab: Fabric) -> dict:
    return fab.meta["discovery"]


def cap(fab: Fabric, src: str, dst: str) -> float:
    return float(fab.capacity_Bps[fab.link_id(src, dst)])


@contextmanager
def no_warnings() -> Iterator[None]:
    """Fail if discovery warns (i.e. leaves out a NIC)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiscoveryWarning)
        yield


# ------------------------------------------------------- H100 nvidia-smi dump
def test_h100_nvidia_smi_fixture() -> None:
    # By hand: 8 GPU rows and 8 NIC columns; every GPU-GPU cell is NV18 (7 peers x
    # 18 = 126 links > 18 per H100, so NVSwitch at 18 x 25 GB/s = 450 GB/s); NICk is
    # PIX to GPUk only; NIC Legend NICk -> mlx5_k; no NIC is left without PIX.
    text = fixture(H100_SMI).read_text()
    with no_warnings():
        fab = from_nvidia_smi(text, nodes=2)
    d = disc(fab)
    assert fab.gpus_per_node == 8 and fab.num_nodes == 2 and fab.num_ranks == 16
    assert fab.vertices_of_kind(VertexKind.NIC).size == 16
    assert fab.nvlink_kind == "nvswitch" and d["nvlink_kind"] == "nvswitch"
    for i in range(8):
        assert cap(fab, f"n0.gpu{i}", "n0.nvswitch") == 450e9
        assert cap(fab, "n1.nvswitch", f"n1.gpu{i}") == 450e9
        assert d["gpu_nic"][f"n0.gpu{i}"] == f"mlx5_{i}"
        assert d["nic_names"][f"n1.nic{i}"] == f"mlx5_{i}"
        # PIX: GPUk and NICk under one PCIe switch; NODE to NIC0..3 puts GPU0..3 on
        # one socket, SYS to NIC4..7 on the other
        assert cap(fab, f"n0.gpu{i}", f"n0.pcie{i}") == PCIE_GEN5_X16_Bps
        assert cap(fab, f"n0.pcie{i}", f"n0.nic{i}") == PCIE_GEN5_X16_Bps
        assert fab.has_link(f"n0.pcie{i}", f"n0.cpu{i // 4}")
        # NIC speed is not in nvidia-smi output: the NDR400 default.
        assert cap(fab, f"n0.nic{i}", f"rail{i}") == NDR400_Bps
    assert fab.vertices_of_kind(VertexKind.PCIE_SWITCH).size == 16
    assert fab.vertices_of_kind(VertexKind.HOST).size == 4 and fab.has_link("n0.cpu0", "n0.cpu1")
    # NIC4 is SYS to GPU0..3 and NODE to GPU5..7: it serves GPU4 alone.
    assert not fab.has_link("n0.nic4", "n0.gpu5") and not fab.has_link("n0.nic4", "n0.pcie5")
    assert fab.rails == tuple(f"rail{j}" for j in range(8))
    assert d["skipped_nics"] == []
    assert any("does not report NIC speed" in n for n in d["notes"])
    ps = candidate_paths(fab, ALL_KINDS)  # with UCX's pcie rule: the tree's routes show
    assert len(ps.pair_paths(0, 1)) == 1  # through the NVSwitch
    assert len(ps.pair_paths(0, 9)) == 8 + 1  # one per rail, one through the PCIe tree
    assert ps.describe(ps.pair_paths(0, 8)[0]) == (
        "rail(matched, rail0): n0.gpu0 -> n0.pcie0 -> n0.nic0 -> rail0 -> n1.nic0 -> n1.pcie0 "
        "-> n1.gpu0"
    )
    # n1.gpu5 is SYS from NIC0: the pcie path crosses the inter-socket link
    (pcie,) = [p for p in ps.pair_paths(0, 13) if ps.kind[p] == PathKind.PCIE]
    assert ps.path_vertices(pcie)[4:] == [
        "n1.nic0", "n1.pcie0", "n1.cpu0", "n1.cpu1", "n1.pcie5", "n1.gpu5"]


def _tabbed(text: str) -> str:
    """The fixture as nvidia-smi prints it: cells separated by tabs."""
    out = []
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if line.startswith(("GPU", "NIC", " " * 8)) and len(cells) > 2:
            prefix = "\t" if line.startswith(" ") else ""
            out.append(prefix + "\t".join(" X " if c == "X" else c for c in cells))
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def test_tabs_and_spaces_give_the_same_fabric() -> None:
    text = fixture(H100_SMI).read_text()
    tabbed = _tabbed(text)
    assert "\t" in tabbed and "NV18\tNV18" in tabbed and "CPU Affinity\tNUMA Affinity" in tabbed
    a = from_nvidia_smi(text, nodes=2)
    b = from_nvidia_smi(tabbed, nodes=2)
    assert a == b
    assert disc(a)["gpu_nic"] == disc(b)["gpu_nic"]


def test_path_input_equals_text_input() -> None:
    path = fixture(H100_SMI)
    a = from_nvidia_smi(path)
    assert a == from_nvidia_smi(path.read_text())
    assert disc(a)["file"] == str(path)


# ------------------------------------------------------ GH200 nvidia-smi dump
def test_gh200_nvidia_smi_fixture() -> None:
    # By hand: 4 GPUs, NV6 between every pair (row sum 18 <= 18): a direct mesh at
    # 6 x 25 GB/s = 150 GB/s per pair; no NIC columns at all.
    text = fixture(GH200_SMI).read_text()
    fab = from_nvidia_smi(text, gpu="gh200")
    d = disc(fab)
    assert fab.gpus_per_node == 4 and fab.num_nodes == 1
    assert fab.vertices_of_kind(VertexKind.NIC).size == 0 and fab.rails == ()
    assert fab.nvlink_kind == "nvlink-mesh" and d["nvlink_kind"] == "nvlink-mesh"
    assert d["gpu"] == "gh200" and d["nvlink_generation"] == "NVLink4"
    for i in range(4):
        for j in range(4):
            if i != j:
                assert cap(fab, f"n0.gpu{i}", f"n0.gpu{j}") == 150e9
    assert fab.num_links == 12  # 4 x 3 directed NVLinks, nothing else
    assert d["skipped_nics"] == [] and d["nic_names"] == {}
    assert len(candidate_paths(fab).pair_paths(0, 1)) == 3  # direct + 2 relays


def test_gh200_needs_nics_for_two_nodes() -> None:
    text = fixture(GH200_SMI).read_text()
    with pytest.raises(FabricError, match=r"no NIC columns.*nics_per_gpu=1"):
        from_nvidia_smi(text, nodes=2, gpu="gh200")
    fab = from_nvidia_smi(text, nodes=2, gpu="gh200", nics_per_gpu=1)
    assert fab.vertices_of_kind(VertexKind.NIC).size == 8 and len(fab.rails) == 4
    assert fab.has_link("n1.gpu3", "n1.nic3")
    assert any("nics_per_gpu=1" in n for n in disc(fab)["notes"])
    ps = candidate_paths(fab)
    assert len(ps.pair_paths(0, 4)) == 4
    assert len(ps.pair_paths(0, 1)) == 3


# ------------------------------------------------------------ Azure NCCL XML
AZURE_GPU_BUSIDS = [
    "0001:00:00.0", "0002:00:00.0", "0003:00:00.0", "0008:00:00.0",
    "0009:00:00.0", "000a:00:00.0", "000b:00:00.0", "000c:00:00.0",
]  # fmt: skip
AZURE_NIC_BUSIDS = [f"010{k}:00:00.0" for k in range(1, 9)]


def test_azure_xml_fixture() -> None:
    # By hand: 8 pci class 0x030200 (GPU) and 8 class 0x020700 (IB) elements, one of
    # each under each of the 8 bridges ffff:ff:0k.0; no <gpu>, <nic> or <nvlink>
    # elements, no speed attributes.
    with no_warnings():
        fab = from_nccl_xml(fixture(AZURE_XML), nodes=2)
    d = disc(fab)
    assert fab.gpus_per_node == 8 and fab.num_ranks == 16
    assert fab.vertices_of_kind(VertexKind.NIC).size == 16
    assert fab.nvlink_kind == "pcie" and d["nvlink_kind"] == "pcie"
    assert any("does not describe NVLink" in n for n in d["notes"])
    assert any("assumed h100" in n for n in d["notes"])
    for i in range(8):
        # GPUs in document order, each with the NIC beside it on its bridge.
        assert d["gpu_nic"][f"n0.gpu{i}"] == AZURE_NIC_BUSIDS[i]
        assert d["nic_names"][f"n0.nic{i}"] == AZURE_NIC_BUSIDS[i]
        assert cap(fab, f"n0.gpu{i}", f"n0.pcie{i}") == PCIE_GEN5_X16_Bps
        assert fab.has_link(f"n0.nic{i}", f"n0.pcie{i}")
        assert fab.has_link(f"n0.pcie{i}", f"n0.cpu{i // 4}")  # bridges 1-4 in cpu 0
        assert cap(fab, f"n1.nic{i}", f"rail{i}") == NDR400_Bps  # no speed: NDR400
        assert d["nic_Bps"][f"n0.nic{i}"] == 50e9
    assert any("8 InfiniBand NICs without a speed attribute (0101:00:00.0, " in n
               and "0108:00:00.0): assumed NDR400" in n for n in d["notes"])
    assert d["skipped_nics"] == []
    ps = candidate_paths(fab, ALL_KINDS)
    # GPU-GPU through switch, root complex, switch
    assert ps.path_vertices(ps.pair_paths(0, 1)[0]) == [
        "n0.gpu0", "n0.pcie0", "n0.cpu0", "n0.pcie1", "n0.gpu1"]
    assert len(ps.pair_paths(0, 1)) == 1
    assert len(ps.pair_paths(3, 12)) == 8 + 1  # 8 rails and the pcie path on rail 3


def test_azure_xml_with_nvswitch_override() -> None:
    fab = from_nccl_xml(fixture(AZURE_XML), nvlink_kind="nvswitch")
    assert fab.nvlink_kind == "nvswitch"
    # No counts in the file: 18 NVLink4 links x 25 GB/s of the assumed H100.
    assert cap(fab, "n0.gpu5", "n0.nvswitch") == 450e9
    fab = from_nccl_xml(fixture(AZURE_XML), nvlink_kind="nvswitch", gpu="a100")
    assert cap(fab, "n0.gpu5", "n0.nvswitch") == 12 * 25e9


# -------------------------------------------------------------- IBM NCCL dump
# By hand: GPU dev d sits under the same PCI bridge as mlx5_(7-d) (e.g. bridge
# 0000:a1:00.0 holds NIC 0000:a3:00.0 = mlx5_7 and GPU 0000:a4:00.0 = dev 0).
IBM_GPU_NIC = {d: f"mlx5_{7 - d}" for d in range(8)}


def test_ibm_xml_fixture() -> None:
    # By hand: 8 <gpu dev=0..7 sm=90>, each with 4 <nvlink tclass=0x068000> of
    # counts 5, 5, 4, 4 (= 18 links -> 450 GB/s per GPU to the NVSwitches);
    # 8 <net name=mlx5_k speed=200000> (200 Gb/s = 25 GB/s) on class 0x020000.
    with no_warnings():
        fab = from_nccl_xml(fixture(IBM_XML), nodes=2)
    d = disc(fab)
    assert fab.gpus_per_node == 8 and fab.num_ranks == 16
    assert fab.vertices_of_kind(VertexKind.NIC).size == 16
    assert fab.nvlink_kind == "nvswitch" and d["nvlink_kind"] == "nvswitch"
    assert d["gpu"] == "h100"  # from sm="90"
    for i in range(8):
        assert cap(fab, f"n0.gpu{i}", "n0.nvswitch") == 450e9
        assert cap(fab, "n1.nvswitch", f"n1.gpu{i}") == 450e9
        assert d["gpu_nic"][f"n0.gpu{i}"] == IBM_GPU_NIC[i]
        assert d["gpu_nic"][f"n1.gpu{i}"] == IBM_GPU_NIC[i]
        assert d["nic_names"][f"n0.nic{i}"] == IBM_GPU_NIC[i]
        # each bridge holds one GPU and one NIC: a switch; dev 0-3 in the first <cpu>
        assert fab.has_link(f"n0.gpu{i}", f"n0.pcie{i}")
        assert fab.has_link(f"n0.nic{i}", f"n0.pcie{i}")
        assert fab.has_link(f"n0.pcie{i}", f"n0.cpu{i // 4}")
        assert cap(fab, f"n0.nic{i}", f"rail{i}") == 25e9
        assert cap(fab, f"rail{i}", f"n1.nic{i}") == 25e9
    assert d["skipped_nics"] == []
    ps = candidate_paths(fab)
    assert len(ps.pair_paths(0, 1)) == 1
    assert len(ps.pair_paths(0, 8)) == 8  # rank 8 owns rail 0: no pcie path
    assert "n0.nic0 -> rail0 -> n1.nic0" in ps.describe(ps.pair_paths(0, 8)[0])


def test_xml_text_equals_path() -> None:
    path = fixture(IBM_XML)
    text = "\n  " + path.read_text()
    assert from_nccl_xml(text) == from_nccl_xml(path) == from_nccl_xml(path.read_bytes())
    assert disc(from_nccl_xml(text))["file"] is None


def test_xml_overrides() -> None:
    fab = from_nccl_xml(
        fixture(IBM_XML),
        nodes=2,
        nic_Bps=50e9,
        pcie_Bps=32e9,
        nvlink_Bps_per_link=20e9,
        name="ibm",
    )
    assert fab.name == "ibm"
    assert cap(fab, "n0.gpu0", "n0.nvswitch") == 18 * 20e9
    assert cap(fab, "n0.nic0", "rail0") == 50e9
    assert cap(fab, "n0.gpu0", "n0.pcie0") == 32e9 and cap(fab, "n0.pcie0", "n0.cpu0") == 32e9
    assert from_nccl_xml(fixture(IBM_XML), nvlink_kind="pcie").nvlink_kind == "pcie"


# --------------------------------------------------------- nvidia-smi by hand
LEGACY = """\
        GPU0    GPU1    GPU2    GPU3    mlx5_0  mlx5_1  CPU Affinity
GPU0     X      NV2     NV1     SYS     PIX     SYS     0-11
GPU1    NV2      X      SYS     NV1     PIX     SYS     0-11
GPU2    NV1     SYS      X      NV2     SYS     PXB     12-23
GPU3    SYS     NV1     NV2      X      SYS     PXB     12-23
mlx5_0  PIX     PIX     SYS     SYS      X      SYS
mlx5_1  SYS     SYS     PXB     PXB     SYS      X

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def test_legacy_header_with_device_names() -> None:
    with no_warnings():
        fab = from_nvidia_smi(LEGACY, nodes=2, gpu="v100")
    d = disc(fab)
    assert d["nic_names"] == {
        "n0.nic0": "mlx5_0", "n0.nic1": "mlx5_1", "n1.nic0": "mlx5_0", "n1.nic1": "mlx5_1",
    }  # fmt: skip
    # mlx5_0 is PIX to GPU0 and GPU1; mlx5_1 only PXB, to GPU2 and GPU3.
    assert d["gpu_nic"]["n0.gpu1"] == "mlx5_0" and d["gpu_nic"]["n0.gpu3"] == "mlx5_1"
    # one PCIe switch per NIC and the GPUs it serves; sockets by the SYS cells
    assert [fab.vertex_name(fab.link_dst[e]) for e in fab.out_links[fab.vertex_id("n0.pcie1")]] \
        == ["n0.gpu2", "n0.gpu3", "n0.nic1", "n0.cpu1"]
    # Row sums 3 <= 6 NVLink2 links: a mesh with holes (GPU0-GPU3, GPU1-GPU2).
    assert fab.nvlink_kind == "nvlink-mesh"
    assert cap(fab, "n0.gpu0", "n0.gpu1") == 50e9 and cap(fab, "n0.gpu0", "n0.gpu2") == 25e9
    assert not fab.has_link("n0.gpu0", "n0.gpu3")
    # the holes go over PCIe, across the sockets
    ps = candidate_paths(fab)
    assert ps.path_vertices(ps.pair_paths(0, 3)[0]) == [
        "n0.gpu0", "n0.pcie0", "n0.cpu0", "n0.cpu1", "n0.pcie1", "n0.gpu3"]
    assert any("2 GPU pairs have no NVLink (GPU0-GPU3, GPU1-GPU2)" in n for n in d["notes"])
    ps = candidate_paths(fab, ALL_KINDS)
    assert [ps.describe(p).split(":")[0] for p in ps.pair_paths(0, 3)][:1] == ["direct"]
    # rd via rail 0, dr via rail 1, and rail 0's NIC into n1.gpu2 over the tree
    assert [ps.rail_role(p) for p in ps.pair_paths(0, 6)] == ["rd", "dr", "pcie"]


STORAGE = """\
\tGPU0\tGPU1\tNIC0\tNIC1\tNIC2\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV12\tPIX\tPXB\tNODE\t0-31\t0\t\tN/A
GPU1\tNV12\t X \tPXB\tPXB\tNODE\t0-31\t0\t\tN/A
NIC0\tPIX\tPXB\t X \tPXB\tNODE
NIC1\tPXB\tPXB\tPXB\t X \tNODE
NIC2\tNODE\tNODE\tNODE\tNODE\t X

Legend:

  X    = Self

NIC Legend:

  NIC0: mlx5_0
  NIC1: mlx5_1
  NIC2: mlx5_bond_0
"""


def test_storage_nic_is_skipped_with_a_warning() -> None:
    with pytest.warns(DiscoveryWarning, match="NIC mlx5_bond_0 left out.*NODE"):
        fab = from_nvidia_smi(STORAGE, nodes=2, gpu="a100")
    d = disc(fab)
    assert d["skipped_nics"] == ["mlx5_bond_0"]
    assert any("mlx5_bond_0" in n for n in d["notes"])
    # NIC0 has a PIX GPU, so only that one; NIC1 has only PXB, so both GPUs.
    assert d["gpu_nic"] == {
        "n0.gpu0": ["mlx5_0", "mlx5_1"], "n0.gpu1": "mlx5_1",
        "n1.gpu0": ["mlx5_0", "mlx5_1"], "n1.gpu1": "mlx5_1",
    }  # fmt: skip
    assert not fab.has_link("n0.gpu1", "n0.nic0")
    assert fab.rails == ("rail0", "rail1")
    # NV12 to the only peer: 12 <= 12 links of an A100, a direct pair at 300 GB/s.
    assert cap(fab, "n0.gpu1", "n0.gpu0") == 300e9


def test_no_nvlink_means_pcie_and_overrides_apply() -> None:
    text = STORAGE.replace("NV12", "SYS")
    with pytest.warns(DiscoveryWarning):
        fab = from_nvidia_smi(text, nic_Bps=25e9, pcie_Bps=16e9, name="pcie-box")
    assert fab.name == "pcie-box" and fab.nvlink_kind == "pcie"
    assert cap(fab, "n0.gpu0", "n0.host") == 16e9
    assert cap(fab, "n0.nic1", "rail1") == 25e9
    with pytest.warns(DiscoveryWarning):
        fab = from_nvidia_smi(STORAGE, gpu="b200", nvlink_kind="nvswitch")
    assert cap(fab, "n0.gpu0", "n0.nvswitch") == 12 * 50e9


def test_unknown_gpu_lists_known_names() -> None:
    with pytest.raises(FabricError, match=r"unknown GPU 'p100'.*v100.*a100.*h100.*b200"):
        from_nvidia_smi(LEGACY, gpu="p100")


@pytest.mark.parametrize(
    ("bad", "pattern"),
    [
        (
            LEGACY.replace("NV2      X      SYS     NV1", "NV2      X      SYS     NVX"),
            r"unknown topology cell 'NVX' in row 'GPU1', column 'GPU3'",
        ),
        (
            LEGACY.replace("GPU2    NV1     SYS      X      NV2     SYS", "GPU2    NV1     SYS"),
            r"line 4: row 'GPU2' has \d+ cells, expected 6",
        ),
        (
            LEGACY.replace(
                "GPU3    SYS     NV1     NV2      X", "GPU3    SYS     NV1     NV2     NV2"
            ),
            r"row 'GPU3', column 'GPU3'.*diagonal must be X",
        ),
        (
            "\n".join(LEGACY.splitlines()[1:]),
            r"no header row",
        ),
        (
            LEGACY.replace("mlx5_1  SYS     SYS     PXB", "mlx5_9  SYS     SYS     PXB"),
            r"row 'mlx5_9' is not one of the header's columns",
        ),
    ],
    ids=["unknown-cell", "ragged-row", "diagonal", "no-header", "unknown-row"],
)
def test_malformed_nvidia_smi(bad: str, pattern: str) -> None:
    with pytest.raises(FabricFileError, match=pattern):
        from_nvidia_smi(bad)


def test_malformed_nvidia_smi_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "topo.txt"
    path.write_text(LEGACY.replace("NV2     NV1     SYS     PIX", "NV2     NV1     SYS     PIY"))
    with pytest.raises(FabricFileError, match=re.escape(str(path)) + ".*'PIY'"):
        from_nvidia_smi(path)


def test_bad_overrides() -> None:
    with pytest.raises(FabricError, match="nvlink_kind"):
        from_nvidia_smi(LEGACY, nvlink_kind="torus")
    with pytest.raises(FabricError, match="nodes"):
        from_nvidia_smi(LEGACY, nodes=0)
    with pytest.raises(FabricError, match="nic_Bps"):
        from_nccl_xml(fixture(IBM_XML), nic_Bps=-1.0)
    with pytest.raises(FabricError, match="nics_per_gpu applies to output without NIC columns"):
        from_nvidia_smi(LEGACY, nics_per_gpu=1)


# --------------------------------------------------------------- XML by hand
def _xml(body: str) -> str:
    return f'<system version="1"><cpu numaid="0">{body}</cpu></system>'


def test_xml_nic_without_gpu_switch_is_skipped() -> None:
    body = (
        '<pci busid="0000:10:00.0" class="0x060400">'
        '  <pci busid="0000:11:00.0" class="0x030200"><gpu dev="1" sm="80"/></pci>'
        '  <pci busid="0000:12:00.0" class="0x020700"><nic><net name="mlx5_1" speed="200000"/>'
        "  </nic></pci>"
        "</pci>"
        '<pci busid="0000:20:00.0" class="0x060400">'
        '  <pci busid="0000:21:00.0" class="0x030200"><gpu dev="0" sm="80"/></pci>'
        '  <pci busid="0000:22:00.0" class="0x020700"><nic><net name="mlx5_0" speed="400000"/>'
        "  </nic></pci>"
        "</pci>"
        '<pci busid="0000:30:00.0" class="0x020000"><nic><net name="eth_storage"/></nic></pci>'
    )
    with pytest.warns(DiscoveryWarning, match="NIC eth_storage left out"):
        fab = from_nccl_xml(_xml(body), nodes=2)
    d = disc(fab)
    assert d["skipped_nics"] == ["eth_storage"]
    # GPU order follows dev, and NICs follow their GPU: dev 0's mlx5_0 is nic0.
    assert d["gpu_nic"]["n0.gpu0"] == "mlx5_0" and d["nic_names"]["n0.nic0"] == "mlx5_0"
    assert cap(fab, "n0.nic0", "rail0") == 50e9 and cap(fab, "n0.nic1", "rail1") == 25e9
    assert fab.nvlink_kind == "pcie"  # no <nvlink> elements
    candidate_paths(fab)


def test_xml_direct_nvlinks_make_a_mesh() -> None:
    gpus = ""
    for i in range(3):
        links = "".join(
            f'<nvlink target="0000:1{j}:00.0" count="{4 if abs(i - j) == 1 else 2}" '
            'tclass="0x030200"/>'
            for j in range(3)
            if j != i
        )
        gpus += (
            f'<pci busid="0000:1{i}:00.0" class="0x030200">'
            f'<gpu dev="{i}" sm="70">{links}</gpu></pci>'
        )
    fab = from_nccl_xml(_xml(f'<pci busid="0000:01:00.0" class="0x060400">{gpus}</pci>'))
    assert fab.nvlink_kind == "nvlink-mesh"
    assert disc(fab)["gpu"] == "v100"
    assert cap(fab, "n0.gpu0", "n0.gpu1") == 4 * 25e9
    assert cap(fab, "n0.gpu0", "n0.gpu2") == 2 * 25e9
    with pytest.raises(FabricError, match="needs NICs"):
        from_nccl_xml(_xml(f'<pci busid="0000:01:00.0" class="0x060400">{gpus}</pci>'), nodes=2)


def test_xml_shared_switch_pairs_in_order() -> None:
    # Two GPUs and two NICs under one switch: NIC k serves GPU k, in order.
    body = (
        '<pci busid="0000:10:00.0" class="0x060400">'
        '<pci busid="0000:11:00.0" class="0x020700"/>'
        '<pci busid="0000:12:00.0" class="0x030200"/>'
        '<pci busid="0000:13:00.0" class="0x020700"/>'
        '<pci busid="0000:14:00.0" class="0x030200"/>'
        "</pci>"
    )
    d = disc(from_nccl_xml(_xml(body)))
    assert d["gpu_nic"] == {"n0.gpu0": "0000:11:00.0", "n0.gpu1": "0000:13:00.0"}


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol9 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
]>
<system version="1"><cpu numaid="0"><pci busid="&lol9;" class="0x030200"/></cpu></system>
"""

EXTERNAL_ENTITY = """<?xml version="1.0"?>
<!DOCTYPE system [ <!ENTITY xxe SYSTEM "file:///etc/passwd"> ]>
<system version="1"><cpu numaid="0"><pci busid="&xxe;" class="0x030200"/></cpu></system>
"""


@pytest.mark.parametrize("doc", [BILLION_LAUGHS, EXTERNAL_ENTITY], ids=["billion-laughs", "xxe"])
def test_hostile_xml_is_refused(tmp_path: Path, doc: str) -> None:
    with pytest.raises(UnsafeXMLError, match="refusing XML with a DTD/entity declaration"):
        from_nccl_xml(doc)
    path = tmp_path / "evil.xml"
    path.write_text(doc)
    with pytest.raises(UnsafeXMLError, match=re.escape(str(path))):
        from_nccl_xml(path)


def test_malformed_xml_names_position(tmp_path: Path) -> None:
    path = tmp_path / "broken.xml"
    path.write_text('<system version="1">\n  <cpu numaid="0">\n    <pci busid="x">\n</system>\n')
    with pytest.raises(FabricFileError, match=re.escape(str(path)) + ".*line 4, column"):
        from_nccl_xml(path)


@pytest.mark.parametrize(
    ("doc", "pattern"),
    [
        ("<topology/>", r"root element is <topology>"),
        (_xml('<pci busid="0000:01:00.0" class="0x020700"/>'), r"no GPU found"),
        (
            _xml('<pci busid="0000:01:00.0" class="0x030200"><gpu dev="zero"/></pci>'),
            r"dev='zero'",
        ),
        (
            _xml(
                '<pci busid="0000:01:00.0" class="0x060400">'
                '<pci busid="0000:02:00.0" class="0x030200"><gpu dev="0"/></pci>'
                '<pci busid="0000:03:00.0" class="0x020000"><nic><net name="m" speed="fast"/>'
                "</nic></pci></pci>"
            ),
            r"speed='fast'",
        ),
    ],
    ids=["root", "no-gpu", "bad-dev", "bad-speed"],
)
def test_bad_xml_content(doc: str, pattern: str) -> None:
    with pytest.raises(FabricFileError, match=pattern):
        from_nccl_xml(doc)


def test_missing_xml_file(tmp_path: Path) -> None:
    with pytest.raises(FabricFileError, match="cannot read"):
        from_nccl_xml(tmp_path / "absent.xml")


def test_discovery_meta_survives_save_and_load(tmp_path: Path) -> None:
    from pathweave.fabric import io

    fab = from_nccl_xml(fixture(IBM_XML), nodes=2)
    for suffix in (".yaml", ".json"):
        back = io.load(io.save(fab, tmp_path / f"ibm{suffix}"))
        assert back == fab
        assert back.meta == fab.meta
        assert np.array_equal(back.capacity_Bps, fab.capacity_Bps)
