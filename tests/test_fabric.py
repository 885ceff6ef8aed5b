"""The Fabric type, builders, presets and path rules."""

from __future__ import annotations

import numpy as np
import pytest

import pathweave as pw
from pathweave.errors import FabricError
from pathweave.fabric import FabricBuilder, LinkKind, PathKind, VertexKind, cluster, preset
from pathweave.fabric.builders import NDR400_Bps, nic_attachment


def two_gpu_builder() -> FabricBuilder:
    b = FabricBuilder("t")
    b.vertex("n0.gpu0", VertexKind.GPU, 0)
    b.vertex("n0.gpu1", VertexKind.GPU, 0)
    return b


# ----------------------------------------------------------------- the type
def test_h100_2x4_matches_the_nimble_testbed():
    fab = preset("h100-2x4")
    assert (fab.num_nodes, fab.gpus_per_node, fab.num_ranks) == (2, 4, 8)
    assert fab.nvlink_kind == "nvlink-mesh"
    nv = fab.link_kind == LinkKind.NVLINK
    assert np.all(fab.capacity_Bps[nv] == 120e9)
    assert nv.sum() == 2 * 4 * 3  # 12 ordered pairs per node
    net = fab.link_kind == LinkKind.NETWORK
    assert np.all(fab.capacity_Bps[net] == 50e9)
    assert fab.rails == ("rail0", "rail1", "rail2", "rail3")
    assert fab.meta["measured_rail_Bps"] == 45.1e9


def test_rank_map_is_node_major():
    fab = preset("dgx-h100", nodes=3)
    for r in range(fab.num_ranks):
        assert fab.vertex_name(fab.rank_vertex[r]) == f"n{r // 8}.gpu{r % 8}"
        assert fab.vertex_rank[fab.rank_vertex[r]] == r


def test_dgx_h100_nvswitch_figures():
    fab = preset("dgx-h100")
    up = fab.link_id("n0.gpu3", "n0.nvswitch")
    assert fab.capacity_Bps[up] == 450e9
    assert fab.capacity_Bps[fab.link_id("n1.nic7", "rail7")] == NDR400_Bps == 50e9
    assert fab.nvlink_kind == "nvswitch"


def test_cluster_reaches_1024_ranks_with_spines():
    fab = cluster(nodes=128, gpus_per_node=8, spines=4)
    assert fab.num_ranks == 1024
    assert len(fab.vertices_of_kind(VertexKind.SPINE)) == 4
    # each spine joins each of the 8 rails in both directions
    spine_links = (fab.vertex_kind[fab.link_src] == VertexKind.SPINE).sum()
    assert spine_links == 4 * 8


def test_arrays_are_read_only():
    fab = preset("h100-2x4")
    with pytest.raises(ValueError):
        fab.capacity_Bps[0] = 1.0


def test_nic_attachment_shapes():
    assert nic_attachment(8, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(FabricError, match="rails=3"):
        nic_attachment(8, 3)


@pytest.mark.parametrize(
    ("cap", "match"),
    [(0.0, "capacity_Bps=0.0"), (-5.0, "capacity_Bps=-5.0"), (float("nan"), "capacity_Bps=nan")],
)
def test_bad_capacity_names_link_and_value(cap, match):
    b = two_gpu_builder()
    b.link("n0.gpu0", "n0.gpu1", cap, LinkKind.NVLINK)
    with pytest.raises(FabricError, match=match) as e:
        b.build()
    assert "n0.gpu0 -> n0.gpu1" in str(e.value)


def test_duplicate_link_and_unknown_vertex():
    b = two_gpu_builder()
    b.link("n0.gpu0", "n0.gpu1", 1e9, LinkKind.NVLINK)
    with pytest.raises(FabricError, match=r"duplicate link n0.gpu0 -> n0.gpu1"):
        b.link("n0.gpu0", "n0.gpu1", 1e9, LinkKind.NVLINK)
    with pytest.raises(FabricError, match=r"unknown vertex 'n0.gpu7'"):
        b.link("n0.gpu0", "n0.gpu7", 1e9, LinkKind.NVLINK)


def test_gpu_names_and_ranks_are_checked():
    b = FabricBuilder("t")
    b.vertex("gpu-a", VertexKind.GPU, 0)
    with pytest.raises(FabricError, match=r"must be named n<node>.gpu<index>"):
        b.build()
    b = FabricBuilder("t")
    b.vertex("n0.gpu0", VertexKind.GPU, 0)
    b.vertex("n0.gpu2", VertexKind.GPU, 0)
    with pytest.raises(FabricError, match=r"GPUs \[0, 2\]"):
        b.build()


def test_nvlink_across_nodes_is_rejected():
    b = FabricBuilder("t")
    b.vertex("n0.gpu0", VertexKind.GPU, 0)
    b.vertex("n1.gpu0", VertexKind.GPU, 1)
    b.duplex("n0.gpu0", "n1.gpu0", 1e9, LinkKind.NVLINK)
    with pytest.raises(FabricError, match="not in one node"):
        b.build()


def test_with_links_degrades_and_removes():
    fab = preset("h100-2x4")
    slow = fab.with_links({("n0.nic0", "rail0"): 0.25})
    assert slow.capacity_Bps[slow.link_id("n0.nic0", "rail0")] == 12.5e9
    assert fab.capacity_Bps[fab.link_id("n0.nic0", "rail0")] == 50e9  # original untouched
    cut = fab.with_links(remove=[("n0.gpu0", "n0.gpu1"), ("n0.gpu1", "n0.gpu0")])
    assert not cut.has_link("n0.gpu0", "n0.gpu1")
    with pytest.raises(FabricError, match=r"factor .* is 1.5"):
        fab.with_links({0: 1.5})


def test_preset_errors_name_the_value():
    with pytest.raises(FabricError, match="unknown fabric preset 'h200-9x9'"):
        preset("h200-9x9")
    with pytest.raises(FabricError, match="nodes='x'"):
        preset("dgx-h100:nodes=x")
    with pytest.raises(FabricError, match="node_kind must be"):
        cluster(nodes=2, node_kind="torus")


@pytest.mark.parametrize("name", pw.fabric.PRESETS)
def test_an_unknown_preset_parameter_is_named_with_the_closest(name: str):
    # the preset's words, not its builder's (no "cluster() got an unexpected ...")
    spec = f"{name}:nodes=1,spinez=1" if name == "cluster" else f"{name}:spinez=1"
    with pytest.raises(FabricError) as exc:
        preset(spec)
    assert str(exc.value) == (f"fabric preset {name!r} has no parameter 'spinez' "
                              "(did you mean 'spines'?)")


def _kernel_signatures() -> set[tuple[str, object]]:
    """Every (kernel, argument types) numba holds in this process for pathweave."""
    import sys

    from numba.core.registry import CPUDispatcher

    return {(f"{name}.{k}", sig) for name, mod in list(sys.modules.items())
            if name.startswith("pathweave.")
            for k, f in vars(mod).items() if isinstance(f, CPUDispatcher)
            for sig in f.signatures}


def test_a_pickled_fabric_and_path_set_plan_alike_read_only_and_without_caches():
    # Rank processes get their fabric by pickle; pickle drops numpy's write
    # flag, and numba compiled every planner kernel again for the writable
    # copies (seconds each with a cold cache, in every rank at once).
    import pickle

    fab = preset("h100-2x4")
    demand = np.zeros((fab.num_ranks, fab.num_ranks))
    demand[0, 5] = demand[1, 2] = demand[6, 3] = 48 << 20
    plans = {p: pw.plan.make(fab, demand, p) for p in pw.plan.policies()}
    paths = pw.fabric.candidate_paths(fab)
    assert vars(fab)["_path_cache"] and vars(paths)["_derived"]  # caches were filled
    copy_fab = pickle.loads(pickle.dumps(fab))
    copy_paths = pickle.loads(pickle.dumps(paths))
    for orig, copy in ((fab, copy_fab), (paths, copy_paths)):
        # the caches stay with the sender; every array arrives read-only
        assert not [k for k, v in vars(copy).items() if isinstance(v, pw._cache.Cache)]
        arrays = [a for v in vars(copy).values()
                  for a in (v if isinstance(v, tuple) else (v,)) if isinstance(a, np.ndarray)]
        assert len(arrays) >= 7 and not [a for a in arrays if a.flags.writeable]
        for k, v in vars(copy).items():
            if isinstance(v, np.ndarray):
                assert np.array_equal(v, vars(orig)[k]), k
    assert np.array_equal(copy_paths.links, paths.links) and copy_paths.fabric.name == fab.name
    compiled = _kernel_signatures()
    for p, want in plans.items():
        got = pw.plan.make(copy_fab, demand, p)
        assert np.array_equal(got.flow_path, want.flow_path), p
        assert np.array_equal(got.flow_bytes, want.flow_bytes), p
    assert _kernel_signatures() == compiled  # no kernel compiled again for the copy


# ------------------------------------------------------------------- paths
def roles(ps, s, d):
    return [ps.rail_role(p) for p in ps.pair_paths(s, d)]


def test_h100_2x4_candidate_paths_by_hand():
    ps = pw.fabric.candidate_paths(preset("h100-2x4"))
    # intra-node: direct + 2 relays; inter-node: one path per rail; no pcie
    # path by default (the data plane cannot run it)
    assert roles(ps, 0, 1) == ["direct", "relay", "relay"]
    assert roles(ps, 0, 5) == ["rd", "dr", "drd", "drd"]
    assert roles(ps, 2, 6) == ["drd", "drd", "matched", "drd"]
    matched = ps.pair_paths(2, 6)[2]
    assert ps.path_vertices(matched) == [
        "n0.gpu2", "n0.pcie2", "n0.nic2", "rail2", "n1.nic2", "n1.pcie2", "n1.gpu2"]
    drd = ps.pair_paths(0, 5)[3]
    assert ps.path_vertices(drd) == [
        "n0.gpu0", "n0.gpu3", "n0.pcie3", "n0.nic3", "rail3", "n1.nic3", "n1.pcie3", "n1.gpu3",
        "n1.gpu1",
    ]
    # 8 ranks: 24 intra pairs x 3 paths + 32 inter pairs x 4 rails
    assert ps.num_paths == 24 * 3 + 32 * 4
    # The pcie rule where asked for (UCX's model): after the rail paths, the
    # source's rail where the destination does not own it. GPU 0 and GPU 1
    # share socket 0 (GPUs 0-1 on cpu0, 2-3 on cpu1): NIC 0 reaches GPU 1
    # through its switch, the root complex and GPU 1's switch; GPU 3 also
    # across the inter-socket link
    ucx = pw.fabric.candidate_paths(preset("h100-2x4"), (*ps.kinds, "pcie"))
    assert roles(ucx, 0, 5) == ["rd", "dr", "drd", "drd", "pcie"]
    assert ucx.path_vertices(ucx.pair_paths(0, 5)[4]) == [
        "n0.gpu0", "n0.pcie0", "n0.nic0", "rail0", "n1.nic0", "n1.pcie0", "n1.cpu0", "n1.pcie1",
        "n1.gpu1"]
    assert ucx.path_vertices(ucx.pair_paths(0, 7)[4])[5:] == [
        "n1.pcie0", "n1.cpu0", "n1.cpu1", "n1.pcie3", "n1.gpu3"]
    assert roles(ucx, 2, 6) == roles(ps, 2, 6)  # the destination owns rail 2: matched
    # one pcie path for each of the 24 inter pairs with different local indices
    assert ucx.num_paths == ps.num_paths + 24


def test_nvswitch_has_no_relay_paths():
    ps = pw.fabric.candidate_paths(preset("dgx-h100"))
    assert roles(ps, 0, 1) == ["direct"]
    assert ps.path_vertices(ps.pair_paths(0, 1)[0]) == ["n0.gpu0", "n0.nvswitch", "n0.gpu1"]
    assert len(ps.pair_paths(0, 9)) == 8
    # with the pcie rule: the source's one NIC, across the destination's PCIe tree
    ucx = pw.fabric.candidate_paths(preset("dgx-h100"), (*ps.kinds, "pcie"))
    assert len(ucx.pair_paths(0, 9)) == 8 + 1


def test_ecmp_rule_gives_every_spine():
    fab = cluster(nodes=2, gpus_per_node=4, node_kind="nvlink-mesh", spines=2)
    ps = pw.fabric.candidate_paths(fab, (*pw.fabric.paths.DEFAULT_KINDS, "ecmp"))
    spines = [p for p in ps.pair_paths(0, 5) if ps.kind[p] == PathKind.SPINE]
    assert [ps.path_vertices(p) for p in spines] == [
        ["n0.gpu0", "n0.nic0", "rail0", f"spine{k}", "rail1", "n1.nic1", "n1.gpu1"] for k in (0, 1)
    ]
    # same rail: no spine detour
    assert not any(ps.kind[p] == PathKind.SPINE for p in ps.pair_paths(0, 4))
    # the default rule: n0.gpu1 is on rail1, so (0, 5) has PXN and no spine path
    default = pw.fabric.candidate_paths(fab)
    assert not (default.kind == PathKind.SPINE).any()
    assert roles(default, 0, 5) == roles(ps, 0, 5)[:len(default.pair_paths(0, 5))]


def _short_of_rail0(spines: int) -> pw.fabric.Fabric:
    """Node 0: gpu0 on rail0, gpu1 on rail1; node 1: both GPUs on rail1; NVLink
    inside each node; every spine joins both rails."""
    b = FabricBuilder("short-of-rail0")
    for r in ("rail0", "rail1"):
        b.vertex(r, VertexKind.RAIL)
    for n, rails in ((0, (0, 1)), (1, (1, 1))):
        for i, x in enumerate(rails):
            b.vertex(f"n{n}.gpu{i}", VertexKind.GPU, n)
            b.vertex(f"n{n}.nic{i}", VertexKind.NIC, n)
            b.duplex(f"n{n}.gpu{i}", f"n{n}.nic{i}", 64e9, LinkKind.PCIE)
            b.duplex(f"n{n}.nic{i}", f"rail{x}", 50e9, LinkKind.NETWORK)
        b.duplex(f"n{n}.gpu0", f"n{n}.gpu1", 100e9, LinkKind.NVLINK)
    for k in range(spines):
        b.vertex(f"spine{k}", VertexKind.SPINE)
        for r in ("rail0", "rail1"):
            b.duplex(f"spine{k}", r, 50e9, LinkKind.NETWORK)
    return b.build()


def test_spine_rule_by_hand():
    # Ranks 0 (rail0), 1 (rail1) in node 0; 2, 3 (rail1) in node 1.
    fab = _short_of_rail0(spines=3)
    ps = pw.fabric.candidate_paths(fab)
    got = {(s, d): [ps.describe(p) for p in ps.pair_paths(s, d)]
           for s in range(4) for d in range(4) if s // 2 != d // 2}
    # 0 -> 2, 3: PXN through n0.gpu1 (rail1), so no spine path.
    assert got[0, 2] == ["rail(dr, rail1): n0.gpu0 -> n0.gpu1 -> n0.nic1 -> rail1 -> n1.nic0 -> "
                         "n1.gpu0"]
    assert got[0, 3] == ["rail(dr, rail1): n0.gpu0 -> n0.gpu1 -> n0.nic1 -> rail1 -> n1.nic1 -> "
                         "n1.gpu1"]
    # 2, 3 -> 0: node 1 has no GPU on rail0: the forward at the far end (rd)
    # and one spine, (s + d) % 3: spine2 for 2 -> 0, spine0 for 3 -> 0.
    for s, k in ((2, 2), (3, 0)):
        assert got[s, 0] == [
            f"rail(rd, rail1): n1.gpu{s - 2} -> n1.nic{s - 2} -> rail1 -> n0.nic1 -> n0.gpu1 -> "
            "n0.gpu0",
            f"spine(spine{k}): n1.gpu{s - 2} -> n1.nic{s - 2} -> rail1 -> spine{k} -> rail0 -> "
            "n0.nic0 -> n0.gpu0"]
    # Same rail: matched only.
    for s, d in ((1, 2), (1, 3), (2, 1), (3, 1)):
        assert [t.split(":")[0] for t in got[s, d]] == ["rail(matched, rail1)"]
    # The ecmp rule: every spine for every pair on different rails, PXN or not.
    every = pw.fabric.candidate_paths(fab, (*ps.kinds, "ecmp"))
    for s, d in ((0, 2), (0, 3), (2, 0), (3, 0)):
        sp = [int(every.via[p]) for p in every.pair_paths(s, d) if every.kind[p] == PathKind.SPINE]
        assert sp == [0, 1, 2]


def test_spines_without_a_cross_rail_pair_add_no_path():
    # One rail: every inter-node pair is rail-matched, so no pair takes a spine
    # (this once failed while joining an empty block of spine paths).
    fab = cluster(nodes=2, gpus_per_node=2, rails=1, spines=1)
    ps = pw.fabric.candidate_paths(fab)
    assert not (ps.kind == PathKind.SPINE).any()
    assert roles(ps, 0, 2) == ["matched"]


def test_max_hops_and_kinds_filter():
    fab = preset("h100-2x4")
    # rd and dr: 7 links (two GPU-switch-NIC routes, two rail hops, one
    # NVLink); drd and pcie 8; matched 6
    short = pw.fabric.candidate_paths(fab, max_hops=7)
    assert roles(short, 0, 5) == ["rd", "dr"]
    no_relay = pw.fabric.candidate_paths(fab, kinds=("direct", "rail"))
    assert roles(no_relay, 0, 1) == ["direct"]
    with pytest.raises(FabricError, match="no path from rank 0"):
        pw.fabric.candidate_paths(fab, max_hops=6)


def test_unreachable_pair_is_an_error():
    b = FabricBuilder("islands")
    for n in (0, 1):
        b.vertex(f"n{n}.gpu0", VertexKind.GPU, n)
    fab = b.build()
    with pytest.raises(FabricError, match=r"no path from rank 0 \(n0.gpu0\) to rank 1"):
        pw.fabric.candidate_paths(fab)


def test_paths_are_legal_walks():
    from pathweave.fabric.paths import ALL_KINDS

    for fab in (preset("h100-2x4"), preset("dgx-h100"), cluster(2, 4, "pcie", spines=1)):
        ps = pw.fabric.candidate_paths(fab, ALL_KINDS)
        for pid in range(ps.num_paths):
            lk = ps.path_links(pid)
            assert np.all(fab.link_dst[lk[:-1]] == fab.link_src[lk[1:]])  # contiguous
            assert fab.link_src[lk[0]] == fab.rank_vertex[ps.src[pid]]
            assert fab.link_dst[lk[-1]] == fab.rank_vertex[ps.dst[pid]]
            assert len(set(fab.link_dst[lk].tolist())) == lk.size  # no vertex repeats


def test_compile_is_deterministic_and_cached():
    fab = preset("dgx-h100", nodes=4)
    a = pw.fabric.compile_paths(fab)
    b = pw.fabric.compile_paths(fab)
    assert np.array_equal(a.links, b.links) and np.array_equal(a.pair_ptr, b.pair_ptr)
    assert pw.fabric.candidate_paths(fab) is pw.fabric.candidate_paths(fab)


def test_role_codes_match_rail_role():
    from pathweave.fabric.paths import ROLES

    for fab in (preset("h100-2x4"), cluster(2, 4, "nvlink-mesh", spines=2)):
        ps = pw.fabric.candidate_paths(fab)
        assert [ROLES[c] for c in ps.role_code] == [ps.rail_role(p) for p in range(ps.num_paths)]


@pytest.mark.parametrize("ranks", [[0, 2, 4, 6], [4, 5, 6, 7], [1, 5], [0, 1, 2, 3, 4, 5, 6, 7]])
def test_subset_keeps_the_members_and_every_link_between_what_stays(ranks):
    """Against the original: each kept vertex maps back to one original vertex (GPUs by
    rank order), the links are exactly the original links between kept vertices."""
    fab = preset("h100-2x4")
    sub = fab.subset(ranks)
    assert sub.num_ranks == len(ranks)
    orig = {}  # sub vertex -> original vertex
    for v, name in enumerate(sub.vertex_names):
        if sub.vertex_kind[v] == VertexKind.GPU:
            orig[v] = int(fab.rank_vertex[sorted(ranks)[int(sub.vertex_rank[v])]])
        else:
            node = int(sub.vertex_node[v])
            old_node = sorted({r // fab.gpus_per_node for r in ranks})[node] if node >= 0 else -1
            old_name = name if node < 0 else f"n{old_node}." + name.split(".", 1)[1]
            orig[v] = fab.vertex_id(old_name)
    kept = set(orig.values())
    assert len(kept) == sub.num_vertices
    want = {(int(u), int(v)): (float(c), float(t)) for u, v, c, t in zip(
        fab.link_src, fab.link_dst, fab.capacity_Bps, fab.latency_s, strict=True)
        if int(u) in kept and int(v) in kept}
    got = {(orig[int(u)], orig[int(v)]): (float(c), float(t)) for u, v, c, t in zip(
        sub.link_src, sub.link_dst, sub.capacity_Bps, sub.latency_s, strict=True)}
    assert got == want
    gpus = {int(fab.vertex_rank[v]) for v in kept if fab.vertex_kind[v] == VertexKind.GPU}
    assert gpus == set(ranks)  # no GPU outside the group: nothing relays through one
    pw.fabric.candidate_paths(sub)  # every pair of members is reachable


@pytest.mark.parametrize(("ranks", "match"), [
    ([0, 1, 4], r"different numbers of GPUs per node \(node 0: 2, node 1: 1\)"),
    ([0, 8], "rank 8 is outside fabric 'h100-2x4' \\(8 ranks\\)"),
    ([2, 2], "distinct ranks"),
    ([], "distinct ranks"),
])
def test_subset_refuses_ranks_it_cannot_describe(ranks, match):
    with pytest.raises(FabricError, match=match):
        preset("h100-2x4").subset(ranks)


@pytest.mark.parametrize("name", ["h100-2x4", "dgx-h100", "dgx-a100"])
def test_one_gpu_nodes_get_one_socket_unless_sockets_is_given(name):
    # A one-rank job's default fabric is a one-GPU dgx-h100 node: one PCIe
    # switch, so one root complex (no inter-socket link to model).
    fab = preset(f"{name}:nodes=1,gpus_per_node=1")
    assert fab.num_ranks == 1
    assert not any(v.startswith("n0.cpu1") for v in fab.vertex_names)
    with pytest.raises(FabricError, match="sockets=2 exceeds the 1 PCIe switches"):
        preset(f"{name}:nodes=1,gpus_per_node=1,sockets=2")
