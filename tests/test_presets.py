"""The dgx-a100 and gb200-nvl72 presets against figures worked out by hand from NVIDIA's documents.

Every expected number below is computed here from the documents' own figures
(docs/fabric-schema.md cites them), not read from pathweave's constants.
"""

from __future__ import annotations

import numpy as np
import pytest

from pathweave.errors import FabricError
from pathweave.fabric import LinkKind, PathKind, VertexKind, candidate_paths, preset
from pathweave.fabric.paths import DEFAULT_KINDS

# DGX A100: 12 NVLink 3 links of 50 GB/s bidirectional (600 GB/s) per GPU.
A100_NVLINK_Bps = 600e9 / 2
HDR200_Bps = 200e9 / 8
GEN4_X16_Bps = 16e9 * 16 * 128 / 130 / 8
# EPYC 7742 pair: 4 xGMI-2 links of 16 lanes at 18 GT/s, one bit a lane a transfer.
XGMI_Bps = 4 * 16 * 18e9 / 8
# GB200 NVL72: 1.8 TB/s bidirectional NVLink 5 per GPU, NVLink-C2C 900 GB/s bidirectional,
# ConnectX-7 at 400 Gb/s, PCIe Gen5 x16 between a NIC and its Grace.
B200_NVLINK_Bps = 1.8e12 / 2
C2C_Bps = 900e9 / 2
NDR400_Bps = 400e9 / 8
GEN5_X16_Bps = 32e9 * 16 * 128 / 130 / 8


def _count(fab, kind):
    return int((fab.vertex_kind == int(kind)).sum())


def _links(fab, kind):
    return int((fab.link_kind == int(kind)).sum())


def _cap(fab, a, b):
    return float(fab.capacity_Bps[fab.link_id(a, b)])


def _route(ps, src, dst, rail):
    """The vertex names of the rail path of ``(src, dst)`` over ``rail``."""
    for p in ps.pair_paths(src, dst):
        if ps.kind[p] == PathKind.RAIL and ps.via[p] == rail:
            return ps.path_vertices(p)
    raise AssertionError(f"no rail{rail} path {src}->{dst}")


def test_dgx_a100_counts_and_capacities():
    fab = preset("dgx-a100")                       # 2 nodes
    # Per node: 8 GPUs, the 6 NVSwitches as one vertex, 8 ConnectX-6, 4 PCIe
    # switches, 2 sockets; one rail per NIC index.
    assert [_count(fab, k) for k in (VertexKind.GPU, VertexKind.NVSWITCH, VertexKind.NIC,
                                     VertexKind.PCIE_SWITCH, VertexKind.HOST, VertexKind.RAIL)] \
        == [16, 2, 16, 8, 4, 8]
    # Per node, both directions: 8 GPU-NVSwitch; 8 GPU + 8 NIC to switch, 4
    # uplinks, 1 inter-socket; 8 NIC-rail.
    assert _links(fab, LinkKind.NVLINK) == 2 * 2 * 8
    assert _links(fab, LinkKind.PCIE) == 2 * 2 * (8 + 8 + 4 + 1)
    assert _links(fab, LinkKind.NETWORK) == 2 * 2 * 8
    assert _cap(fab, "n0.gpu5", "n0.nvswitch") == pytest.approx(A100_NVLINK_Bps)
    assert _cap(fab, "n0.nic3", "rail3") == pytest.approx(HDR200_Bps)
    for a, b in [("n0.gpu0", "n0.pcie0"), ("n0.nic1", "n0.pcie0"), ("n1.pcie3", "n1.cpu1")]:
        assert _cap(fab, a, b) == pytest.approx(GEN4_X16_Bps)
    assert _cap(fab, "n0.cpu0", "n0.cpu1") == pytest.approx(XGMI_Bps)
    # nvidia-smi topo -m on a DGX A100: GPU0/1 PXB to NIC0/1, GPUs 0-3 on one
    # socket's NUMA nodes and 4-7 on the other's.
    for k in range(4):
        for g in (2 * k, 2 * k + 1):
            assert fab.has_link(f"n0.gpu{g}", f"n0.pcie{k}")
        for j in (2 * k, 2 * k + 1):
            assert fab.has_link(f"n0.nic{j}", f"n0.pcie{k}")
        assert fab.has_link(f"n0.pcie{k}", f"n0.cpu{k // 2}")
    assert candidate_paths(fab).num_paths == 2 * 8 * 7 + 16 * 8 * 8


def test_dgx_a100_traffic_crosses_the_pcie_switch_and_xgmi():
    fab = preset("dgx-a100")
    ps = candidate_paths(fab)
    # The two GPUs under a switch share its two NICs (PXB), one each as NCCL
    # assigns them (device index mod 2): GPU 2 uses rail 2, GPU 3 rail 3.
    assert ps.rank_rails[:4] == ((0,), (1,), (2,), (3,))
    assert _route(ps, 3, 11, 3) == ["n0.gpu3", "n0.pcie1", "n0.nic3", "rail3", "n1.nic3",
                                    "n1.pcie1", "n1.gpu3"]
    # GPU 2 reaches rail 3 through GPU 3 (NVLink), not through NIC 3 itself.
    assert _route(ps, 2, 11, 3)[:3] == ["n0.gpu2", "n0.nvswitch", "n0.gpu3"]
    # UCX into n1.gpu4 from rail 0: the receiving NIC is on socket 0, the GPU on
    # socket 1, so the bytes cross the switch uplinks and the xGMI link.
    ucx = candidate_paths(fab, (*DEFAULT_KINDS, "pcie"))
    (drop,) = [p for p in ucx.pair_paths(0, 12) if ucx.kind[p] == PathKind.PCIE and ucx.via[p] == 0]
    assert ucx.path_vertices(drop) == ["n0.gpu0", "n0.pcie0", "n0.nic0", "rail0", "n1.nic0",
                                       "n1.pcie0", "n1.cpu0", "n1.cpu1", "n1.pcie2", "n1.gpu4"]


def test_gb200_nvl72_counts_and_capacities():
    fab = preset("gb200-nvl72")                    # one rack
    # 18 compute trays x (2 Grace + 4 Blackwell + 4 ConnectX-7); the 9 switch
    # trays as one NVSwitch vertex; one rail per NIC index.
    assert [_count(fab, k) for k in (VertexKind.GPU, VertexKind.NVSWITCH, VertexKind.NIC,
                                     VertexKind.PCIE_SWITCH, VertexKind.HOST, VertexKind.RAIL)] \
        == [18 * 4, 1, 18 * 4, 0, 18 * 2, 18 * 4]
    assert _links(fab, LinkKind.NVLINK) == 2 * 72
    assert _links(fab, LinkKind.PCIE) == 2 * (72 + 72)      # C2C per GPU, PCIe per NIC
    assert _links(fab, LinkKind.NETWORK) == 2 * 72
    assert _cap(fab, "n0.gpu71", "n0.nvswitch") == pytest.approx(B200_NVLINK_Bps)
    assert _cap(fab, "n0.gpu3", "n0.cpu1") == pytest.approx(C2C_Bps)
    assert _cap(fab, "n0.nic3", "n0.cpu1") == pytest.approx(GEN5_X16_Bps)
    assert _cap(fab, "n0.nic70", "rail70") == pytest.approx(NDR400_Bps)
    assert not fab.has_link("n0.cpu0", "n0.cpu1")
    ps = candidate_paths(fab)
    assert ps.num_paths == 72 * 71
    # Two GPUs of one Grace talk over NVLink (900 GB/s), not over C2C (450).
    assert ps.path_vertices(ps.pair_paths(0, 1)[0]) == ["n0.gpu0", "n0.nvswitch", "n0.gpu1"]


def test_gb200_racks_reach_their_nics_over_c2c():
    fab = preset("gb200-nvl72:nodes=2,spines=2")
    assert _links(fab, LinkKind.NETWORK) == 2 * (2 * 72 + 72 * 2)
    ps = candidate_paths(fab)
    # GPUs 2 and 3 share the two NICs of their Grace (cpu1), NCCL's P2C path,
    # one each (device index mod 2): GPU 3 uses NIC 3.
    assert ps.rank_rails[2:4] == ((2,), (3,))
    assert _route(ps, 3, 75, 3) == ["n0.gpu3", "n0.cpu1", "n0.nic3", "rail3", "n1.nic3",
                                    "n1.cpu1", "n1.gpu3"]
    # Every rail reaches every node (PXN), so no pair gets a spine path; the
    # ecmp rule (a model: each GPU owns both NICs of its Grace, as UCX picks
    # NICs by distance) adds both spines for each pair on different first rails.
    assert ps.num_paths == 2 * 72 * 71 + 144 * 72 * 72
    every = candidate_paths(fab, (*ps.kinds, "ecmp"))
    assert every.num_paths == ps.num_paths + sum(
        2 for s in range(144) for d in range(144)
        if s // 72 != d // 72 and every.rank_rails[s][0] != every.rank_rails[d][0])


@pytest.mark.parametrize("spec, model, most", [
    ("dgx-a100:nvlink_Bps=325e9", "a100", 12),      # 13 NVLink 3 links
    ("gb200-nvl72:nvlink_Bps=950e9", "gb200", 18),  # 19 NVLink 5 links
])
def test_presets_are_held_to_their_gpu_model(spec, model, most):
    with pytest.raises(FabricError, match=f"{model} has at most {most}"):
        preset(spec)


@pytest.mark.parametrize("spec, match", [
    ("gb200-nvl72:gpus_per_node=3", "gpus_per_cpu=2 must divide gpus_per_node=3"),
    ("dgx-a100:pcie_switches=3", "pcie_switches=3 must divide"),
])
def test_bad_shapes_name_the_value(spec, match):
    with pytest.raises(FabricError, match=match):
        preset(spec)


def test_small_a100_nodes_keep_the_switch_shape():
    # Two GPUs: the four-switch layout cannot hold; two switches, one per socket.
    fab = preset("dgx-a100:nodes=1,gpus_per_node=2")
    assert _count(fab, VertexKind.PCIE_SWITCH) == 2 and _count(fab, VertexKind.HOST) == 2
    assert np.isclose(_cap(fab, "n0.cpu0", "n0.cpu1"), XGMI_Bps)


@pytest.mark.parametrize("gpus, nics, switches, want", [
    # NCCL's ncclTopoGetLocalNet (AUTO): G GPUs sharing N nearest NICs use ceil(N/G)
    # each, from NIC dev % G, its bits mirrored when N is a power of two.
    (4, 4, 1, ((0,), (2,), (1,), (3,))),            # dev 1 -> 0b01 mirrored -> NIC 2
    (8, 8, 2, ((0,), (2,), (1,), (3,), (4,), (6,), (5,), (7,))),
    (2, 4, 1, ((0, 1), (2, 3))),                    # 2 NICs each: dev 1 -> 0b01 -> 0b10
])
def test_gpus_sharing_nics_take_nccls_share(gpus, nics, switches, want):
    from pathweave.fabric import cluster

    fab = cluster(nodes=2, gpus_per_node=gpus, node_kind="nvswitch", rails=nics,
                  pcie_tree=True, pcie_switches=switches, sockets=1)
    assert candidate_paths(fab).rank_rails[:gpus] == want
    # UCX's model (a model rule in the set) sees every nearest NIC, by distance.
    ucx = candidate_paths(fab, (*DEFAULT_KINDS, "pcie"))
    per_switch = nics // switches
    assert ucx.rank_rails[0] == tuple(range(per_switch))
