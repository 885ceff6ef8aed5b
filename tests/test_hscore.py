"""Tests of the ``hscore`` planner: invariants, hand-computed decisions, spraying.

Hand computations use the planner's h-score of a link for a message of
``f`` bytes, ``H_e = f / (L_e + f)``, with ``L_e`` the bytes already on the
link; a set of links scores its minimum (see ``pathweave.plan.hscore``).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pathweave as pw
from pathweave.errors import PlanError
from pathweave.fabric.paths import DEFAULT_KINDS
from pathweave.plan import _hscore_kernel as hk
from pathweave.plan._flows import split_evenly

MB = 10**6


@pytest.fixture(scope="module")
def h100() -> pw.fabric.Fabric:
    return pw.fabric.preset("h100-2x4")


@pytest.fixture(scope="module")
def spine() -> pw.fabric.Fabric:
    return pw.fabric.cluster(nodes=2, gpus_per_node=4, node_kind="nvlink-mesh", spines=2)


def _fabric(name: str) -> pw.fabric.Fabric:
    if name == "spine-cluster":
        return pw.fabric.cluster(nodes=2, gpus_per_node=4, node_kind="nvlink-mesh", spines=2)
    if name == "spine-tree":  # spines and a PCIe tree: GPU -> switch -> NIC hops
        return pw.fabric.cluster(nodes=2, gpus_per_node=4, node_kind="nvlink-mesh", spines=2,
                                 pcie_tree=True)
    if name == "leaf-spine":  # one GPU per host: cross-leaf pairs have one spine path only
        return pw.fabric.leaf_spine(leaves=2, hosts_per_leaf=2, spines=3)
    return pw.fabric.preset(name)


def _demand(kind: str, n: int, seed: int = 0) -> np.ndarray:
    if kind == "hotspot":
        return pw.traffic.hotspot(n, bytes_per_rank=256 << 20, ratio=0.7, hot=seed % n)
    if kind == "random":
        return pw.traffic.random_sparse(n, bytes_per_rank=256 << 20, density=0.3, seed=seed)
    return pw.traffic.uniform(n, bytes_per_rank=(256 << 20) + 7)


def _pairs(n: int, entries: dict[tuple[int, int], int]) -> np.ndarray:
    d = np.zeros((n, n), dtype=np.int64)
    for (s, t), b in entries.items():
        d[s, t] = b
    return d


def _rail_score(fab: pw.fabric.Fabric, plan: pw.plan.Plan, pid: int, f: float) -> float:
    """H(x) of the crossing of rail path ``pid`` under ``plan``'s loads."""
    links = plan.paths.path_links(pid)
    net = links[fab.link_kind[links] == int(pw.fabric.LinkKind.NETWORK)]
    return f / (plan.link_load_bytes[net].max() + f)


# ------------------------------------------------------------------ invariants
@pytest.mark.parametrize("fab_name", ["h100-2x4", "dgx-h100", "spine-cluster"])
@pytest.mark.parametrize("kind", ["hotspot", "random", "uniform"])
@pytest.mark.parametrize("opts", [{}, {"spray_delta": 0.2}, {"order": "pair"}])
def test_plan_is_valid(fab_name: str, kind: str, opts: dict) -> None:
    fab = _fabric(fab_name)
    d = _demand(kind, fab.num_ranks, seed=3)
    plan = pw.plan.make(fab, d, "hscore", **opts).validate()
    assert plan.policy == "hscore"
    assert sum(plan.info["decisions"].values()) == np.count_nonzero(d)
    # Intra-node pairs take their direct path, whole.
    g = fab.gpus_per_node
    intra = [(s, t) for s, t in zip(*np.nonzero(d), strict=True) if s // g == t // g]
    assert intra
    for s, t in intra:
        assert [r.kind for r in plan.routes(int(s), int(t))] == ["direct"]


def test_unknown_and_bad_options(h100: pw.fabric.Fabric) -> None:
    d = _pairs(8, {(0, 5): MB})
    with pytest.raises(PlanError, match="unknown option 'bogus'"):
        pw.plan.make(h100, d, policy="hscore", bogus=1)
    with pytest.raises(PlanError, match="order"):
        pw.plan.make(h100, d, policy="hscore", order="random")
    for bad in (-0.1, float("nan"), float("inf"), "0.1", True):
        with pytest.raises(PlanError, match="spray_delta"):
            pw.plan.make(h100, d, policy="hscore", spray_delta=bad)


def test_deterministic(h100: pw.fabric.Fabric) -> None:
    d = _demand("random", 8, seed=11)
    for opts in ({}, {"spray_delta": 0.3}):
        a = pw.plan.make(h100, d, "hscore", **opts)
        b = pw.plan.make(h100, d, "hscore", **opts)
        assert np.array_equal(a.flow_path, b.flow_path)
        assert np.array_equal(a.flow_bytes, b.flow_bytes)
        assert a.info == b.info


def test_empty_demand(h100: pw.fabric.Fabric) -> None:
    plan = pw.plan.make(h100, np.zeros((8, 8)), "hscore").validate()
    assert plan.fragments == 0 and plan.congestion_s == 0.0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_never_below_lp_optimum(h100: pw.fabric.Fabric, spine: pw.fabric.Fabric, seed: int) -> None:
    # optimal is the LP lower bound over the same candidate paths; its plan is
    # rounded to whole bytes, hence the relative slack of 1e-9.
    for fab in (h100, spine):
        d = _demand("random", fab.num_ranks, seed=seed)
        opt = pw.plan.make(fab, d, "optimal")
        for opts in ({}, {"spray_delta": 0.1}):
            got = pw.plan.make(fab, d, "hscore", **opts).congestion_s
            assert got >= opt.congestion_s * (1 - 1e-9)
            assert got >= opt.info["optimum_s"] * (1 - 1e-9)


# ------------------------------------------------------------ hand-computed
def test_idle_message_takes_dr(h100: pw.fabric.Fabric) -> None:
    # Rank 0 (node 0, rail 0) -> rank 5 (node 1, rail 1): g1 = 0, g2 = 1.
    # Idle fabric: every link scores f / (0 + f) = 1, so
    #   gamma(G1) = H(g1) / H(d1) = 1 / 1 = 1,  gamma(G2) = H(g2) / H(d2) = 1.
    # Not gamma(G1) > gamma(G2): the tie goes to dr (NCCL's PXN path), and
    # m = 1 leaves no routable rail (H(x) <= 1 is never > 1).
    plan = pw.plan.make(h100, _pairs(8, {(0, 5): 64 * MB}), "hscore").validate()
    (route,) = plan.routes(0, 5)
    assert (route.kind, route.role, route.via) == ("rail", "dr", 1)
    assert route.vertices[:4] == ("n0.gpu0", "n0.gpu1", "n0.pcie1", "n0.nic1")
    assert plan.info["decisions"]["dr"] == 1


def test_idle_same_rail_is_matched(h100: pw.fabric.Fabric) -> None:
    plan = pw.plan.make(h100, _pairs(8, {(2, 6): 5 * MB}), "hscore")
    assert [(r.role, r.via) for r in plan.routes(2, 6)] == [("matched", 2)]


# Pre-load for the remote-rail cases on h100-2x4 (order="size": routed in
# this order, each on an idle rail of its own, so each takes its matched path):
#   0 -> 4, 200 MB on rail 0;  1 -> 5, 150 MB on rail 1;  3 -> 7, 50 MB on rail 3.
# Then 0 -> 5 with f = 40 MB: g1 = 0, g2 = 1, no NVLink carries anything.
#   H(g1) = H(rail 0) = 40 / (200 + 40) = 1/6,   H(d1) = 1  ->  gamma(G1) = 1/6
#   H(g2) = H(rail 1) = 40 / (150 + 40) = 4/19,  H(d2) = 1  ->  gamma(G2) = 4/19
#   m = 4/19 ~ 0.2105;  H(rail 3) = 40 / (50 + 40) = 4/9,  H(rail 2) = 1.
# Sorted rail scores: rail0 1/6, rail1 4/19, rail3 4/9, rail2 1. Routable
# (H > m): rails 3 and 2; best fit = the lowest of them = rail 3 (drd).
PRELOAD = {(0, 4): 200 * MB, (1, 5): 150 * MB, (3, 7): 50 * MB}
F = 40 * MB


def test_preloaded_scores_match_hand_values(h100: pw.fabric.Fabric) -> None:
    pre = pw.plan.make(h100, _pairs(8, PRELOAD), "hscore")
    assert [r.role for p in PRELOAD for r in pre.routes(*p)] == ["matched"] * 3
    ps = pre.paths
    by_rail = {int(ps.via[p]): p for p in ps.pair_paths(0, 5)}
    want = {0: 1 / 6, 1: 4 / 19, 2: 1.0, 3: 4 / 9}
    for x, h in want.items():
        assert _rail_score(h100, pre, by_rail[x], F) == pytest.approx(h, rel=1e-12)
    assert np.count_nonzero(pre.link_load_bytes[h100.link_kind == 0]) == 0  # no NVLink load


def test_best_fit_remote_rail(h100: pw.fabric.Fabric) -> None:
    plan = pw.plan.make(h100, _pairs(8, {**PRELOAD, (0, 5): F}), "hscore").validate()
    (route,) = plan.routes(0, 5)
    assert (route.role, route.via) == ("drd", 3)
    hops = ("n0.gpu0 -> n0.gpu3 -> n0.pcie3 -> n0.nic3 -> rail3 -> n1.nic3 -> n1.pcie3 -> "
            "n1.gpu3 -> n1.gpu1")
    assert " -> ".join(route.vertices) == hops
    assert plan.info["decisions"]["drd"] == 1 and plan.info["remote_pairs"] == 1
    # The same inputs through the decision rule give the hand-computed ratios.
    hx = np.array([1 / 6, 4 / 19, 1.0, 4 / 9])
    ones = np.ones(4)
    chosen = np.empty(4, dtype=np.int64)
    n, code, g1, g2 = hk.decide(hx, ones, ones, np.arange(4), 0, 1, -1.0, chosen)
    assert (n, code, chosen[0]) == (1, hk.CODE_REMOTE, 3)
    assert (g1, g2) == pytest.approx((1 / 6, 4 / 19))


def test_pair_order_routes_first_pairs_on_idle_rails(h100: pw.fabric.Fabric) -> None:
    # order="pair": pair 0 -> 4 (index 4) then 0 -> 5 (index 5), before 1 -> 5.
    # For 0 -> 5: gamma(G1) = (40/240) / 1 = 1/6, gamma(G2) = 1 / 1 = 1, so dr,
    # and m = 1 leaves no routable rail.
    plan = pw.plan.make(h100, _pairs(8, {**PRELOAD, (0, 5): F}), "hscore", order="pair")
    assert [(r.role, r.via) for r in plan.routes(0, 5)] == [("dr", 1)]


def test_spray_window(h100: pw.fabric.Fabric) -> None:
    f = F + 2  # an odd split: 40000002 = 3 * 13333334 on three rails
    d = _pairs(8, {**PRELOAD, (0, 5): f})
    # delta = 0.25 around m = 4/19: [-0.039, 0.461] holds rails 0, 1, 3.
    plan = pw.plan.make(h100, d, "hscore", spray_delta=0.25).validate()
    routes = plan.routes(0, 5)
    assert [(r.role, r.via) for r in routes] == [("rd", 0), ("dr", 1), ("drd", 3)]
    assert [r.bytes for r in routes] == split_evenly(np.array([f]), np.array([3])).tolist()
    assert plan.info["decisions"]["sprayed"] == 1
    # A large delta holds every rail: four shares differing by at most 1 byte.
    plan = pw.plan.make(h100, _pairs(8, {**PRELOAD, (0, 5): F + 3}), "hscore", spray_delta=10.0)
    routes = plan.routes(0, 5)
    assert [r.via for r in routes] == [0, 1, 2, 3]
    sizes = [r.bytes for r in routes]
    assert sum(sizes) == F + 3 and max(sizes) - min(sizes) <= 1
    # Spraying never starts on an idle fabric: m = 1, no rail is routable.
    plan = pw.plan.make(h100, _pairs(8, {(0, 5): F}), "hscore", spray_delta=10.0)
    assert [r.role for r in plan.routes(0, 5)] == ["dr"]


def test_spray_window_bounds_and_empty_window() -> None:
    # Binary-exact scores: g1 = 0, g2 = 1, H(d1) = 1, H(d2) = 0.75.
    #   gamma(G1) = 0.25 / 1 = 0.25, gamma(G2) = 0.375 / 0.75 = 0.5 = m.
    hx = np.array([0.25, 0.375, 1.0, 0.75])
    hsf = np.ones(4)
    hdf = np.array([0.75, 1.0, 1.0, 1.0])
    pid = np.arange(4)
    chosen = np.empty(4, dtype=np.int64)
    # Both bounds are inclusive: [0.25, 0.75] holds rails 0, 1, 3.
    n, code, _, _ = hk.decide(hx, hsf, hdf, pid, 0, 1, 0.25, chosen)
    assert code == hk.CODE_SPRAY and chosen[:n].tolist() == [0, 1, 3]
    # [0.375, 0.625] holds rail 1 only.
    n, code, _, _ = hk.decide(hx, hsf, hdf, pid, 0, 1, 0.125, chosen)
    assert code == hk.CODE_SPRAY and chosen[:n].tolist() == [1]
    # [0.4375, 0.5625] is empty: the best fit, rail 3 (0.75 is the lowest > m).
    n, code, _, _ = hk.decide(hx, hsf, hdf, pid, 0, 1, 0.0625, chosen)
    assert (n, code, chosen[0]) == (1, hk.CODE_REMOTE, 3)
    # Without rail paths via 3 and 2 nothing is routable: dr (gamma(G2) is larger).
    n, code, _, _ = hk.decide(hx, hsf, hdf, np.array([0, 1, -1, -1]), 0, 1, 0.25, chosen)
    assert (n, code, chosen[0]) == (1, hk.CODE_DR, 1)


# ------------------------------------------------------------------ corollary
_score = st.floats(min_value=1e-6, max_value=1.0)


@settings(max_examples=300, deadline=None)
@given(
    hx=st.lists(_score, min_size=4, max_size=4),
    hsf=st.lists(_score, min_size=4, max_size=4),
    hdf=st.lists(_score, min_size=4, max_size=4),
    ends=st.sampled_from([(0, 1), (1, 0), (2, 3), (3, 1)]),
    delta=st.sampled_from([-1.0, 0.0, 0.1, 2.0]),
)
def test_corollary_no_drd_when_a_ratio_exceeds_one(hx, hsf, hdf, ends, delta) -> None:
    g1, g2 = ends
    hx, hsf, hdf = np.array(hx), np.array(hsf), np.array(hdf)
    hsf[g1] = 1.0  # a GPU reaches its own rail without a forward
    hdf[g2] = 1.0
    chosen = np.empty(4, dtype=np.int64)
    n, code, gamma1, gamma2 = hk.decide(hx, hsf, hdf, np.arange(4), g1, g2, delta, chosen)
    assert gamma1 == hx[g1] / hsf[g2] and gamma2 == hx[g2] / hdf[g1]
    m = max(gamma1, gamma2)
    if gamma1 > 1 or gamma2 > 1:
        assert n == 1 and code in (hk.CODE_RD, hk.CODE_DR)
        assert chosen[0] in (g1, g2)
    if code == hk.CODE_REMOTE:  # the remote-rail theorem's condition holds
        x = int(chosen[0])
        assert x not in (g1, g2) and hx[x] > m
        assert not np.any((hx > m) & (hx < hx[x]))  # best fit: lowest above m
    if code in (hk.CODE_REMOTE, hk.CODE_SPRAY):
        assert m < 1
    if code in (hk.CODE_RD, hk.CODE_DR):
        assert chosen[0] == (g1 if gamma1 > gamma2 else g2)


def test_corollary_on_fabric_and_spine_choice(h100, spine) -> None:
    # Routed first (larger): 0 -> 1 with 300 MB and 4 -> 5 with 200 MB, both
    # direct NVLinks. Then 0 -> 5 with f = 100 MB, every rail idle:
    #   H(d1) = H(n0.gpu0 -> n0.gpu1) = 100 / 400 = 1/4  ->  gamma(G1) = 1 / (1/4) = 4
    #   H(d2) = H(n1.gpu4 -> n1.gpu5) = 100 / 300 = 1/3  ->  gamma(G2) = 3
    # gamma(G1) > 1: no drd (corollary), and 4 > 3 picks rd, product
    # H(g1) * H(d2) = 1/3.
    d = _pairs(8, {(0, 1): 300 * MB, (4, 5): 200 * MB, (0, 5): 100 * MB})
    plan = pw.plan.make(h100, d, "hscore", spray_delta=1.0).validate()
    assert [(r.role, r.via) for r in plan.routes(0, 5)] == [("rd", 0)]
    assert plan.info["remote_pairs"] == 0
    # Offered every spine (the ecmp modelling rule), spine 0's product
    # H(g1) * H(S) * H(g2) = 1 * 1 * 1 beats 1/3.
    plan = pw.plan.make(spine, d, "hscore", kinds=(*DEFAULT_KINDS, "ecmp")).validate()
    (route,) = plan.routes(0, 5)
    assert (route.kind, route.via) == ("spine", 0)
    assert plan.info["decisions"]["spine"] == 1
    # The default rules give (0, 5) no spine path (n0.gpu1 is on rail 1: PXN),
    # so the executable plan takes rd as on h100-2x4.
    plan = pw.plan.make(spine, d, "hscore").validate()
    assert [(r.role, r.via) for r in plan.routes(0, 5)] == [("rd", 0)]


def test_spine_loses_ties(spine) -> None:
    # Idle: dr scores 1 * 1, a spine 1 * 1 * 1; only a strictly better spine wins.
    plan = pw.plan.make(spine, _pairs(8, {(0, 5): MB}), "hscore", kinds=(*DEFAULT_KINDS, "ecmp"))
    assert [r.role for r in plan.routes(0, 5)] == ["dr"]


# ------------------------------------------------------------------ slow twins
@pytest.mark.parametrize("fab_name", ["h100-2x4", "dgx-h100", "spine-cluster", "spine-tree",
                                      "leaf-spine"])
def test_path_segments_match_reference(fab_name: str) -> None:
    fab = _fabric(fab_name)
    paths = pw.fabric.compile_paths(fab)
    rail_v = fab.vertex_kind == int(pw.fabric.VertexKind.RAIL)
    into_rail, from_rail = rail_v[fab.link_dst], rail_v[fab.link_src]
    gpu = fab.vertex_kind == int(pw.fabric.VertexKind.GPU)
    from_gpu, to_gpu = gpu[fab.link_src], gpu[fab.link_dst]
    segs = tuple(np.zeros(paths.num_paths, dtype=np.int32) for _ in range(4))
    hk.path_segments(paths.links, paths.length, into_rail, from_rail, from_gpu, to_gpu, *segs)
    ref = hk.segments_reference(paths.links, paths.length, into_rail, from_rail, from_gpu, to_gpu)
    for got, want in zip(segs, ref, strict=True):
        assert got.tolist() == want


@settings(max_examples=300, deadline=None)
@given(
    hx=st.lists(_score, min_size=4, max_size=4),
    hsf=st.lists(_score, min_size=4, max_size=4),
    hdf=st.lists(_score, min_size=4, max_size=4),
    has_path=st.lists(st.booleans(), min_size=4, max_size=4),
    g1=st.integers(-1, 3),
    g2=st.integers(-1, 3),
    delta=st.sampled_from([-1.0, 0.0, 0.05, 0.3, 2.0]),
)
def test_decide_matches_reference(hx, hsf, hdf, has_path, g1, g2, delta) -> None:
    rail_pid = np.where(has_path, np.arange(4) + 10, -1).astype(np.int64)
    chosen = np.empty(4, dtype=np.int64)
    hx, hsf, hdf = np.array(hx), np.array(hsf), np.array(hdf)
    n, code, gamma1, gamma2 = hk.decide(hx, hsf, hdf, rail_pid, g1, g2, delta, chosen)
    rails, ref_code, ref1, ref2 = hk.decide_reference(hx, hsf, hdf, rail_pid, g1, g2, delta)
    assert (chosen[:n].tolist(), code) == (rails, ref_code)
    np.testing.assert_array_equal([gamma1, gamma2], [ref1, ref2])


def _random_demand(n: int, seed: int) -> np.ndarray:
    # Sizes over three decades so earlier pairs leave uneven loads behind.
    rng = np.random.default_rng(seed)
    d = rng.integers(1, 1 << 24, size=(n, n)) * (rng.random((n, n)) < 0.5)
    np.fill_diagonal(d, 0)
    return d.astype(np.int64)


@pytest.mark.parametrize("fab_name", ["h100-2x4", "dgx-h100", "spine-cluster"])
@pytest.mark.parametrize("opts", [{}, {"spray_delta": 0.05}, {"spray_delta": 0.5, "order": "pair"}])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("stop_share", [None, 0.9])
def test_route_kernel_matches_reference(monkeypatch, fab_name: str, opts: dict, seed: int,
                                        stop_share: float | None) -> None:
    """The planner's kernel calls, replayed on the slow twin with copies of their outputs;
    with ``stop_share``, under the link limits of ``hscore_below`` at that share of the
    plan's predicted time (the routing may stop: both must say so, -1)."""
    from pathweave.plan.hscore import hscore_below

    kernel = hk.route_headed
    compared = []

    def both(*args):
        *inputs, out_pid, out_bytes, counts = args
        ref_out = [out_pid.copy(), out_bytes.copy(), counts.copy()]
        ref_n = hk.route_headed_reference(*inputs, *ref_out)
        n = kernel(*args)
        assert n == ref_n
        compared.append(n)
        if n < 0:  # stopped: what was placed so far is not a plan
            return n
        np.testing.assert_array_equal(out_pid[:n], ref_out[0][:n])
        np.testing.assert_array_equal(out_bytes[:n], ref_out[1][:n])
        np.testing.assert_array_equal(counts, ref_out[2])
        return n

    fused = hk.route_below

    def below_both(*args):
        # 8 ranks and fewer: hscore_below's limits, order and routing in one kernel call.
        *inputs, out = args
        ref_out = out.copy()
        want = hk.route_below_reference(*inputs, ref_out)
        got = fused(*args)
        compared.append(got)
        _assert_same_routing((got, out), (want, ref_out))
        return got

    fab = _fabric(fab_name)
    D = _random_demand(fab.num_ranks, seed)
    full = pw.plan.make(fab, D, "hscore", **opts)
    # Numba reads route_headed (patched below) when it compiles route_below: compile first.
    hscore_below(fab, full.demand, full.paths, np.inf, **opts)
    monkeypatch.setattr(hk, "route_headed", both)
    monkeypatch.setattr(hk, "route_below", below_both)
    if stop_share is None:
        pw.plan.make(fab, D, "hscore", **opts).validate()
        assert compared and compared[0] > 0
    else:
        t = pw.plan.predict_time(full)
        hscore_below(fab, full.demand, full.paths, stop_share * t, **opts)
        assert compared


def _assert_same_routing(got: tuple, want: tuple) -> None:
    """Two ``(flows or -1, out)`` of route_below agree: path ids, bytes and decision
    counts in ``out`` (buffers past the flows aside)."""
    n = got[0]
    assert n == want[0]
    if n >= 0:
        np.testing.assert_array_equal(got[1][0, :n], want[1][0, :n])
        np.testing.assert_array_equal(got[1][1, :n], want[1][1, :n])
        np.testing.assert_array_equal(got[1][2, :hk.NUM_CODES], want[1][2, :hk.NUM_CODES])


@pytest.mark.parametrize(("nodes", "seed"), [(1, s) for s in range(6)] + [(8, 0)])
@pytest.mark.parametrize("spray", [None, 0.1])
def test_route_below_matches_reference(nodes: int, seed: int, spray: float | None) -> None:
    """The one-call limits, order and routing against the twins (numpy's limits and
    stable sort, route_reference over every pair), at stops from far below the plan's
    time (routing stops at once) to above it (the whole plan), on random and bench
    demands; at 64 GPUs the kernel routes a head of the largest pairs first, which
    must stop where the whole routing does and change no plan."""
    from pathweave.plan.hscore import HEAD_PAIRS_PER_RANK, _below_tables

    fab = pw.fabric.preset("dgx-h100", nodes=nodes) if nodes > 1 else _fabric("h100-2x4")
    ps = pw.fabric.candidate_paths(fab)
    delta = -1.0 if spray is None else spray
    stopped = finished = 0
    head = HEAD_PAIRS_PER_RANK * fab.num_ranks
    demands = _bench_demands(fab, seed)
    for D in demands if nodes == 1 else [demands[i] for i in (2, 3, 6, 7)]:
        d = pw.plan.registry.as_demand(D, fab.num_ranks)
        assert nodes == 1 or np.count_nonzero(d) > 2 * head  # the head is taken
        t = pw.plan.predict_time(pw.plan.make(fab, d, "hscore", spray_delta=spray))
        for share in (0.1, 0.6, 0.95, 1.0 + 1e-6, 2.0) if nodes == 1 else (0.6, 0.999, 2.0):
            # The tables as hscore_below hands them (writable copies): numba
            # compiles a version per writability.
            kept, _ = _below_tables(ps, None)
            tables = (d, share * t, head, *kept, delta)
            width = hk.below_width(fab.num_ranks, tables[-2], delta)
            # Garbage in the buffers: every slot read back must have been written.
            out, ref_out = (np.full((3, width), -7, dtype=np.int64) for _ in range(2))
            got = hk.route_below(*tables, out)
            _assert_same_routing((got, out), (hk.route_below_reference(*tables, ref_out),
                                              ref_out))
            if got >= 0:
                assert (out[0, :got] >= 0).all() and (out[1, :got] > 0).all()
                assert out[2, :hk.NUM_CODES].sum() == np.count_nonzero(d)
            stopped += got < 0
            finished += got >= 0
    assert stopped and finished


# ------------------------------------------------------- hscore_below: a sound stop
def _bench_demands(fab: pw.fabric.Fabric, seed: int) -> list[np.ndarray]:
    """``bench planner``'s workloads on ``fab``, the MoE case's next step, and random ones."""
    from pathweave.bench import planner as bp

    n = fab.num_ranks
    out = [pw.traffic.parse_workload(w, n, bytes_per_rank=bp.BYTES_PER_RANK,
                                     gpus_per_node=fab.gpus_per_node)
           for w in bp.workloads(n)]
    out.append(pw.traffic.parse_workload(bp.workloads(n)[3], n, seed=bp.REPLAN_SEED))
    out += [_random_demand(n, seed), _demand("random", n, seed)]
    return out


@pytest.mark.parametrize("fab_name", ["h100-2x4", "dgx-h100", "spine-cluster", "spine-tree"])
def test_below_stops_only_plans_predicted_at_least_the_stop(fab_name: str) -> None:
    # Against predict_time of the full plan (the independent reference): a stop
    # at or below the prediction may return None, one above it must return the
    # plan itself, bit for bit; and the stop must fire on the losing cases.
    from pathweave.plan.hscore import hscore_below

    fab = _fabric(fab_name)
    ps = pw.fabric.candidate_paths(fab)
    stopped = 0
    for D in _bench_demands(fab, seed=3):
        d = pw.plan.registry.as_demand(D, fab.num_ranks)
        full = pw.plan.make(fab, d, "hscore", paths=ps)
        t = pw.plan.predict_time(full)
        for share in (0.3, 0.9, 0.999, 1.0, 1.000001, 1.5):
            got = hscore_below(fab, d, ps, share * t)
            if got is None:
                assert share * t <= t
                stopped += 1
            else:
                assert np.array_equal(got.flow_path, full.flow_path)
                assert np.array_equal(got.flow_bytes, full.flow_bytes)
        assert hscore_below(fab, d, ps, t * (1 + 1e-6)) is not None
    assert stopped >= 8


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), share=st.floats(0.05, 1.2),
       fab_name=st.sampled_from(["h100-2x4", "dgx-h100"]),
       spray=st.sampled_from([None, 0.1]))
def test_below_is_a_sound_stop_on_random_demands(seed, share, fab_name, spray) -> None:
    from pathweave.plan.hscore import hscore_below

    fab = FABS[fab_name]
    ps = pw.fabric.candidate_paths(fab)
    rng = np.random.default_rng(seed)
    n = fab.num_ranks
    D = rng.integers(0, 1 << int(rng.integers(10, 30)), size=(n, n)) * (rng.random((n, n)) < 0.6)
    np.fill_diagonal(D, 0)
    full = pw.plan.make(fab, D, "hscore", spray_delta=spray)
    t = pw.plan.predict_time(full)
    got = hscore_below(fab, full.demand, ps, share * t, spray_delta=spray)
    if got is None:
        assert share * t <= t
    else:
        assert np.array_equal(got.flow_path, full.flow_path)
        assert np.array_equal(got.flow_bytes, full.flow_bytes)


FABS = {"h100-2x4": pw.fabric.preset("h100-2x4"), "dgx-h100": pw.fabric.preset("dgx-h100")}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", [1, 2, 7, 300])
def test_size_head_matches_reference(seed: int, n: int) -> None:
    """The head selection (a partition, no sort of the rest) against the first ``k`` of
    numpy's stable sort, for every ``k``, on sizes with many ties (ties go by index)."""
    rng = np.random.default_rng(seed)
    nbytes = rng.integers(1, 1 + [2, 5, 1 << 40, 3][seed], size=n).astype(np.int64)
    for k in range(1, n + 1):
        np.testing.assert_array_equal(hk.size_head(nbytes, k), hk.size_head_reference(nbytes, k))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", [1, 3, 8, 16])
def test_nonzero_flat_matches_reference(seed: int, n: int) -> None:
    """The one-call pairs and bytes against numpy's nonzero, on demands with many equal
    sizes and empty ones (their order by size is route_headed's stable sort, which
    test_sort checks)."""
    rng = np.random.default_rng(seed)
    d = rng.integers(0, 4, size=(n, n)) * (rng.random((n, n)) < 0.7) << int(rng.integers(0, 40))
    if seed == 3:
        d[:] = 0
    d = np.ascontiguousarray(d, dtype=np.int64)
    d.setflags(write=False)  # as the planner hands it: numba compiles a version per writability
    for got, want in zip(hk.nonzero_flat(d), hk.nonzero_flat_reference(d), strict=True):
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want)
