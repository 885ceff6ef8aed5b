"""Planners against hand-computed cases and the LP optimum."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pathweave as pw
from pathweave.errors import FabricError, PlanError, WorkloadError
from pathweave.plan._mwu_kernel import (
    link_classes,
    link_classes_reference,
    route_kernel,
    route_reference,
)
from pathweave.plan.optimal import round_within_pairs

H100 = pw.fabric.preset("h100-2x4")
DGX = pw.fabric.preset("dgx-h100")
SPINE = pw.fabric.cluster(nodes=2, gpus_per_node=4, node_kind="nvlink-mesh", spines=2)
# Every registered policy but the LP optimum itself: a new policy joins the invariant tests.
HEURISTICS = [p for p in pw.plan.policies() if p != "optimal"]
MB = 10**6


def one_pair(n, s, d, nbytes):
    D = np.zeros((n, n))
    D[s, d] = nbytes
    return D


# ---------------------------------------------------------------- analytic
@pytest.mark.parametrize("policy", pw.plan.policies())
def test_one_flow_on_one_link(policy):
    # Two GPUs, one NVLink each way: nothing to split, time = bytes / capacity.
    b = pw.fabric.FabricBuilder("pair")
    for i in (0, 1):
        b.vertex(f"n0.gpu{i}", pw.fabric.VertexKind.GPU, 0)
    b.duplex("n0.gpu0", "n0.gpu1", 100e9, pw.fabric.LinkKind.NVLINK)
    fab = b.build()
    plan = pw.plan.make(fab, one_pair(2, 0, 1, 300 * MB), policy).validate()
    assert plan.congestion_s == pytest.approx(300e6 / 100e9, rel=1e-12)


def test_static_single_intra_pair_uses_the_direct_nvlink():
    plan = pw.plan.make(H100, one_pair(8, 0, 1, 120 * MB), "static").validate()
    assert plan.congestion_s == pytest.approx(1e-3)
    assert [r.kind for r in plan.routes(0, 1)] == ["direct"]


def test_intra_pair_optimum_uses_three_disjoint_paths():
    # direct, via GPU2, via GPU3: link-disjoint, each 120 GB/s -> 360 GB/s.
    D = one_pair(8, 0, 1, 360 * MB)
    opt = pw.plan.make(H100, D, "optimal").validate()
    assert opt.info["optimum_s"] == pytest.approx(1e-3, rel=1e-9)
    mwu = pw.plan.make(H100, D, "mwu").validate()
    assert mwu.congestion_s <= 1.01e-3
    assert {r.kind for r in mwu.routes(0, 1)} == {"direct", "relay"}


def test_inter_pair_optimum_uses_all_four_rails():
    # rank 0 -> rank 5 has one rail path per rail, pairwise link-disjoint.
    D = one_pair(8, 0, 5, 400 * MB)
    opt = pw.plan.make(H100, D, "optimal")
    assert opt.info["optimum_s"] == pytest.approx(400e6 / (4 * 50e9), rel=1e-9)
    static = pw.plan.make(H100, D, "static")
    assert static.congestion_s == pytest.approx(400e6 / 50e9)
    assert [r.role for r in static.routes(0, 5)] == ["dr"]  # NCCL PXN: destination's rail
    mwu = pw.plan.make(H100, D, "mwu")
    assert mwu.congestion_s <= 1.01 * opt.congestion_s


def test_uniform_exchange_optimum_is_the_nic_bound():
    # Uniform: every rank sends B/7 to each of 7 peers, 4 of them remote.
    # Node 0 -> node 1 carries 4 * 4 * B/7 over 4 rails of 50 GB/s.
    B = 7 * 64 * MB
    D = pw.traffic.uniform(8, B)
    nic_bound = 16 * (B / 7) / (4 * 50e9)
    opt = pw.plan.make(H100, D, "optimal")
    assert opt.info["optimum_s"] == pytest.approx(nic_bound, rel=1e-9)
    # static puts each pair on the destination's rail: 4 pairs per rail, also the bound
    assert pw.plan.make(H100, D, "static").congestion_s == pytest.approx(nic_bound)


@pytest.mark.parametrize(("ratio", "static_over_opt"), [(0.9, 3.6 / 0.95), (0.5, 2.0 / 0.75)])
def test_hotspot_by_hand(ratio, static_over_opt):
    # Each non-hot rank sends ratio*B to rank 0 and (1-ratio)*B/6 to each other.
    # static: the 4 remote senders all use rail 0 -> 4*ratio*B on one 50 GB/s NIC.
    # optimal: node 1 -> node 0 carries 4*ratio*B + 4*3*(1-ratio)*B/6 over 4 rails.
    B = 600 * MB
    D = pw.traffic.hotspot(8, B, ratio)
    static = pw.plan.make(H100, D, "static").validate()
    opt = pw.plan.make(H100, D, "optimal").validate()
    assert static.congestion_s == pytest.approx(4 * ratio * B / 50e9, rel=1e-6)
    cross = 4 * ratio * B + 2 * (1 - ratio) * B
    assert opt.info["optimum_s"] == pytest.approx(cross / 200e9, rel=1e-6)
    assert static.congestion_s / opt.congestion_s == pytest.approx(static_over_opt, rel=1e-3)


def test_small_messages_stay_on_one_path():
    D = pw.traffic.hotspot(8, 4 * MB, 0.9)  # the largest pair is 3.6 MB
    plan = pw.plan.make(H100, D, "mwu", min_split_bytes=4 * MB).validate()
    assert plan.split_pairs() == 0
    plan = pw.plan.make(H100, D, "mwu", min_split_bytes=1 * MB, chunk_bytes=256 << 10)
    assert plan.split_pairs() > 0


#: Policies that keep pairs below ``min_split_bytes`` whole on their static path.
PINNING = [p for p in pw.plan.policies() if "min_split_bytes" in pw.plan.policy_info(p).options
           and p not in ("optimal",)]


@pytest.mark.parametrize("policy", PINNING)
def test_threshold_pins_only_the_pairs_below_it(policy):
    # Pairs on both sides of the threshold in one demand: each small pair is one
    # flow on its static path (the hand-picked reference: static_pins), and
    # the 64 MB pairs 0->5 and 1->4 still split, so the pin table the kernel
    # gets does not reach pairs at or above the threshold.
    from pathweave.plan.static import static_pins

    D = np.zeros((8, 8))
    D[0, 5] = D[1, 4] = 64 * MB
    D[2, 7] = D[3, 6] = D[6, 1] = 512 << 10
    D[7, 0] = 1 << 20  # exactly the threshold: free to split
    plan = pw.plan.make(H100, D, policy, min_split_bytes=1 << 20).validate()
    pins = static_pins(plan.paths)
    for s, d in ((2, 7), (3, 6), (6, 1)):
        assert [r.path_id for r in plan.routes(s, d)] == [int(pins[s * 8 + d])], (s, d)
    big = [len(plan.routes(s, d)) for s, d in ((0, 5), (1, 4))]
    if policy != pw.plan.DEFAULT_POLICY:  # mintime may pick a one-path baseline
        assert min(big) > 1, big


def test_option_checks_still_refuse_after_an_equal_valid_value():
    # Option sets found valid are remembered; the key holds each value's type,
    # so refine=True (== 1) and fraction=1.5 after 0.5 are still refused.
    D = pw.traffic.hotspot(8, 4 * MB, 0.9)
    pw.plan.make(H100, D, "mwu", refine=1, fraction=0.5)
    with pytest.raises(TypeError, match="refine"):
        pw.plan.make(H100, D, "mwu", refine=True)
    with pytest.raises(PlanError, match="fraction"):
        pw.plan.make(H100, D, "mwu", fraction=1.5)
    with pytest.raises(TypeError, match="fraction"):
        pw.plan.make(H100, D, "mwu", fraction=[0.5])


def test_hop_penalty_keeps_tiny_messages_on_the_shortest_path():
    D = one_pair(8, 0, 1, 64 << 10)  # 64 KiB: ~0.5 us on NVLink, penalty 2 us
    plan = pw.plan.make(H100, D, "mwu", min_split_bytes=0, chunk_bytes=4096)
    assert [r.kind for r in plan.routes(0, 1)] == ["direct"]


# ------------------------------------------------- against the LP optimum
demands = st.integers(min_value=0, max_value=2**31).map(float)


@st.composite
def demand_matrices(draw, n):
    density = draw(st.sampled_from([0.2, 0.6, 1.0]))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    D = np.floor(rng.pareto(1.2, (n, n)) * 64 * MB) * (rng.random((n, n)) < density)
    np.fill_diagonal(D, 0)
    return D


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), which=st.sampled_from(["h100", "dgx", "spine"]))
def test_optimal_is_a_lower_bound_and_every_plan_is_valid(data, which):
    fab = {"h100": H100, "dgx": DGX, "spine": SPINE}[which]
    D = data.draw(demand_matrices(fab.num_ranks))
    opt = pw.plan.make(fab, D, "optimal").validate()
    optima = {opt.paths.kinds: opt.info["optimum_s"]}
    for policy in HEURISTICS:
        plan = pw.plan.make(fab, D, policy).validate()
        # A peer model routes over rules of its own (UCX: `pcie`): the LP over
        # those paths is its bound, not the LP over the default ones.
        kinds = plan.paths.kinds
        if kinds not in optima:
            optima[kinds] = pw.plan.make(fab, D, "optimal", kinds=kinds).info["optimum_s"]
        assert plan.congestion_s >= optima[kinds] * (1 - 1e-9), policy
    # rounding to whole bytes moves the optimum by bytes, not by percent
    assert opt.congestion_s == pytest.approx(opt.info["optimum_s"], rel=1e-6, abs=1e-12)


def test_mwu_is_close_to_optimal_on_skewed_exchanges():
    for fab in (H100, DGX, SPINE):
        for ratio in (0.1, 0.5, 0.9):
            D = pw.traffic.hotspot(fab.num_ranks, 256 << 20, ratio)
            o = pw.plan.make(fab, D, "optimal").info["optimum_s"]
            assert pw.plan.make(fab, D, "mwu").congestion_s <= 1.05 * o, (fab.name, ratio)


def _readonly(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """``arrays`` made read-only, as the planner hands its tables to the kernel: numba
    compiles a kernel once more for writable arrays (seconds with a cold cache)."""
    for a in arrays:
        a.setflags(write=False)
    return arrays


@pytest.mark.parametrize(
    ("scale", "lam", "refine", "stop_s"),
    [(40 * MB, 0.4, 2, 0.0), (600 * MB, 0.5, 1, 0.0), (600 * MB, 0.75, 0, 0.0),
     (600 * MB, 0.5, 3, 0.02), (600 * MB, 0.5, 3, 1e-9)],
)
def test_mwu_kernel_matches_the_reference(scale, lam, refine, stop_s):
    rng = np.random.default_rng(7)
    ps = pw.fabric.candidate_paths(H100)
    D = np.floor(rng.random((8, 8)) * scale)
    np.fill_diagonal(D, 0)
    pairs = np.flatnonzero(D.reshape(-1))
    dem = D.reshape(-1)[pairs].astype(np.int64)
    lo, hi = ps.pair_ptr[pairs], ps.pair_ptr[pairs + 1]
    pen, inv = _readonly((ps.length - 1) * 1e-6, 1.0 / H100.capacity_Bps)
    args = (lo, hi, dem, ps.links, ps.length, pen, inv, lam, 1 << 20, 2 << 20, refine)
    load_ref, flow_ref = route_reference(*args, stop_s)
    load = np.zeros(H100.num_links)
    flow = np.zeros(int((hi - lo).sum()), dtype=np.int64)
    route_kernel(*args[:8], np.int64(args[8]), np.int64(args[9]), np.int64(args[10]), load, flow,
                 stop_s)
    assert np.array_equal(flow, flow_ref)
    np.testing.assert_allclose(load, load_ref)


@pytest.mark.parametrize("which", ["h100", "dgx", "spine"])
@pytest.mark.parametrize("tables", ["real", "effective"])
def test_link_classes_group_links_on_the_same_paths(which, tables):
    """Links in one class lie on exactly the same paths (a brute-force twin), and the
    kernel over the classes routes exactly as the reference over every link."""
    from pathweave.plan import timemodel as tm

    fab = {"h100": H100, "dgx": DGX, "spine": SPINE}[which]
    ps = pw.fabric.candidate_paths(fab)
    if tables == "real":
        links, length, inv = ps.links, ps.length, 1.0 / fab.capacity_Bps
    else:
        pc = tm.path_costs(ps)
        links, length, inv = pc.links, pc.length, 1.0 / pc.capacity_Bps
    cls, clinks, clength, n = link_classes(links, length, np.int64(inv.size))
    ref = link_classes_reference(links, length, inv.size)
    assert np.array_equal(cls, ref[0]) and n == ref[3]
    assert np.array_equal(clinks, ref[1]) and np.array_equal(clength, ref[2])
    assert n < int((np.bincount(links[links >= 0], minlength=inv.size) > 0).sum())
    cinv = pw.plan.mwu.class_inv(cls, inv)
    rng = np.random.default_rng(11)
    N = fab.num_ranks
    D = np.floor(rng.random((N, N)) * 300 * MB) * (rng.random((N, N)) < 0.5)
    np.fill_diagonal(D, 0)
    pairs = np.flatnonzero(D.reshape(-1))
    dem = D.reshape(-1)[pairs].astype(np.int64)
    lo, hi = ps.pair_ptr[pairs], ps.pair_ptr[pairs + 1]
    pen = (ps.length - 1) * 1e-6
    _, flow_ref = route_reference(lo, hi, dem, links, length, pen, inv, 0.5, 1 << 20, 2 << 20, 1)
    clinks, clength, pen, cinv = _readonly(clinks, clength, pen, cinv)
    load = np.zeros(n)
    flow = np.zeros(int((hi - lo).sum()), dtype=np.int64)
    route_kernel(lo, hi, dem, clinks, clength, pen, cinv, 0.5, np.int64(1 << 20),
                 np.int64(2 << 20), np.int64(1), load, flow, 0.0)
    assert np.array_equal(flow, flow_ref)


def _congestion(ps, inv, pid, nbytes):
    rows = ps.links[pid]
    used = rows >= 0
    load = np.bincount(rows[used], weights=np.broadcast_to(nbytes[:, None], rows.shape)[used],
                       minlength=inv.size)
    return float((load * inv).max())


@pytest.mark.parametrize("policy", ["mwu", "mwu_time"])
@pytest.mark.parametrize("which", ["h100", "dgx", "spine"])
def test_refinement_early_stop_certifies_its_gap_against_the_lp(which, policy):
    """The early stop's bound is below the LP optimum, and a plan whose refinement
    stopped early is within the certified gap of that optimum (HiGHS's LP over the
    real links for mwu; over the effective links mwu_time prices, the LP's plan is
    one plan, so the bound must stay under its maximum)."""
    from pathweave.plan import timemodel as tm
    from pathweave.plan._mwu_kernel import route_pinned
    from pathweave.plan.mintime import _time_tables
    from pathweave.plan.mwu import CERTIFIED_GAP, _derived
    from pathweave.plan.static import static_pins

    fab = {"h100": H100, "dgx": DGX, "spine": SPINE}[which]
    stopped = 0
    for workload in ("hotspot:0.5", "stencil:dims=1", "zipf", "many_to_few:sinks=0;",
                     "uniform", "random_sparse"):
        D = pw.traffic.parse_workload(workload, fab.num_ranks, bytes_per_rank=256 * MB,
                                      gpus_per_node=fab.gpus_per_node)
        opt = pw.plan.make(fab, D, "optimal")
        ps, dem = opt.paths, opt.demand
        if policy == "mwu":
            links, length = ps.links, ps.length
            pen, inv = _derived(ps, pw.plan.mwu.DEFAULTS["hop_penalty_s"])
            bound = tm.lower_bound_s(ps, dem, tm.ideal_model())
            lp = opt.info["optimum_s"]
        else:
            pc = tm.path_costs(ps)
            links, length = pc.links, pc.length
            pen, inv = _time_tables(ps, None)
            bound = tm.lower_bound_s(ps, dem) - pc.setup_s
            lp = _congestion(SimpleNamespace(links=links), inv, opt.flow_path, opt.flow_bytes)
        assert bound <= lp * (1 + 1e-9), workload
        refine = 4
        args = (dem.reshape(-1), ps.pair_ptr, links, length, pen, inv, 0.5, np.int64(MB),
                np.int64(MB))
        tail = (np.int64(inv.size), static_pins(ps))
        pid, nb, sweeps = route_pinned(*args, np.int64(refine), *tail,
                                       bound * (1 + CERTIFIED_GAP))
        phase1 = int(route_pinned(*args, np.int64(0), *tail, 0.0)[2])
        got = _congestion(SimpleNamespace(links=links), inv, pid, nb)
        if int(sweeps) - phase1 < refine:  # stopped early: certified within the gap
            stopped += 1
            assert got <= bound * (1 + CERTIFIED_GAP) * (1 + 1e-12), workload
            if policy == "mwu":
                assert got <= lp * (1 + CERTIFIED_GAP) * (1 + 1e-12), workload
    assert stopped  # the rule was exercised


@pytest.mark.parametrize("which", ["h100", "dgx", "spine"])
def test_route_cut_stops_where_the_cut_bound_says(which):
    """``route_cut`` computes refinement's stop from the cut tables itself: the same
    flows and sweeps as ``route_pinned`` given ``lower_bound_s`` of the same model,
    less the same set-up, times one plus the gap (and no stop where nothing moves)."""
    from pathweave.plan import timemodel as tm
    from pathweave.plan._mwu_kernel import route_cut, route_pinned
    from pathweave.plan.mwu import CERTIFIED_GAP, _derived
    from pathweave.plan.static import static_pins

    fab = {"h100": H100, "dgx": DGX, "spine": SPINE}[which]
    ps = pw.fabric.candidate_paths(fab)
    pen, inv = _derived(ps, 2e-6)
    tail = (ps.pair_ptr, ps.links, ps.length, pen, inv, 0.5, MB, MB, 3, inv.size,
            static_pins(ps))
    n = fab.num_ranks
    stopped = 0
    for workload in ("hotspot:0.5", "stencil:dims=1", "zipf", "many_to_few:sinks=0;"):
        D = pw.plan.registry.as_demand(pw.traffic.parse_workload(
            workload, n, bytes_per_rank=256 * MB, gpus_per_node=fab.gpus_per_node), n)
        D.setflags(write=False)  # as mwu hands it: numba compiles a version per writability
        for model, less in ((tm.ideal_model(), 0.0), (None, 2e-5), (pw.sim.SimModel(), 1.0)):
            cut, setup = tm.cut_tables(ps, model)
            bound = max(tm.lower_bound_s(ps, D, model) - less, 0.0)
            want = route_pinned(D.reshape(-1), *tail, bound * (1.0 + CERTIFIED_GAP))
            got = route_cut(D, *tail, *cut, setup, less, CERTIFIED_GAP)
            assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)), workload
            stopped += int(got[2]) < int(route_pinned(D.reshape(-1), *tail, 0.0)[2])
    assert stopped  # some bound stopped refinement: the stop was exercised
    nothing = np.zeros((n, n), dtype=np.int64)
    nothing.setflags(write=False)
    cut, setup = tm.cut_tables(ps, None)
    assert route_cut(nothing, *tail, *cut, setup, 0.0, CERTIFIED_GAP)[0].size == 0


def test_round_within_pairs_conserves_bytes():
    rng = np.random.default_rng(3)
    which = np.sort(rng.integers(0, 50, 400))
    totals = rng.integers(0, 10**9, 50)
    x = rng.random(400)
    out = round_within_pairs(which, x, totals)
    present = np.bincount(which, minlength=50) > 0
    assert np.array_equal(np.bincount(which, weights=out, minlength=50)[present], totals[present])
    assert out.min() >= 0


# ------------------------------------------------------------- determinism
SNIPPET = """
import hashlib, numpy as np, pathweave as pw
print(hash("pathweave"))
fab = pw.fabric.preset("dgx-h100", nodes=2)
D = pw.traffic.zipf(16, 512 << 20, alpha=1.1, seed=5)
for pol in pw.plan.policies():
    p = pw.plan.make(fab, D, pol)
    print(pol, hashlib.sha256(p.flow_path.tobytes() + p.flow_bytes.tobytes()).hexdigest())
"""


def test_plans_are_identical_across_processes():
    # Two processes with different hash seeds: this one and one child (each
    # extra child would import pathweave and load every kernel again).
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    out = subprocess.run(
        [sys.executable, "-c", SNIPPET],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": seed},
        check=True,
    ).stdout
    fab = pw.fabric.preset("dgx-h100", nodes=2)
    D = pw.traffic.zipf(16, 512 << 20, alpha=1.1, seed=5)
    here = []
    for pol in pw.plan.policies():
        p = pw.plan.make(fab, D, pol)
        here.append(
            f"{pol} " + hashlib.sha256(p.flow_path.tobytes() + p.flow_bytes.tobytes()).hexdigest()
        )
    seed_line, *plans = out.splitlines()
    assert seed_line != str(hash("pathweave")), "the child hashed as this process does"
    assert plans == here


# --------------------------------------------------------------- bad input
def test_unknown_policy_and_option():
    D = pw.traffic.uniform(8, 8 * MB)
    with pytest.raises(PlanError, match=r"unknown policy 'nccl'.*static"):
        pw.plan.make(H100, D, "nccl")
    with pytest.raises(PlanError, match="unknown option 'lam'"):
        pw.plan.make(H100, D, "mwu", lam=0.3)
    with pytest.raises(PlanError, match=r"mwu option fraction must be in \(0.0, 1.0\], got 1.5"):
        pw.plan.make(H100, D, "mwu", fraction=1.5)
    with pytest.raises(PlanError, match="time_limit_s must be positive, got 0"):
        pw.plan.make(H100, D, "optimal", time_limit_s=0)


@pytest.mark.parametrize("policy", pw.plan.policies())
def test_a_policy_given_as_the_fabric_names_the_argument_order(policy):
    # make(fabric, demand, policy): a policy first read as a fabric that is no preset
    with pytest.raises(PlanError, match=rf"{policy!r} is a policy, given as the fabric"):
        pw.plan.make(policy, H100, pw.traffic.uniform(8, 8 * MB))


@pytest.mark.parametrize("policy", pw.plan.policies())
def test_orchestrator_checks_policy_options_at_construction(policy):
    # Defaults pass (for planning; for the data plane where it can run the
    # policy); an unknown option fails where it is set, before any call.
    pw.plan.registry.check_options(policy, {}, execute=False)
    if pw.plan.policy_info(policy).executable:
        pw.plan.registry.check_options(policy, {})
    with pytest.raises(PlanError, match=f"{policy!r} got unknown option 'lam'"):
        pw.Orchestrator(fabric="h100-2x4", policy=policy, lam=0.5)


#: A bad value of each policy's own options; a policy with options missing here fails
#: the test below. (Options every policy takes are checked for every policy.)
BAD_OPTION_VALUES = {
    "mwu": {"fraction": 1.5, "refine": -1, "hop_penalty_s": "0.1"},
    "mwu_time": {"refine": -1, "fraction": 0.0},
    "mintime": {"margin": 1.0, "tie": 2.0},
    "optimal": {"time_limit_s": 0, "method": "simplex"},
    "hscore": {"spray_delta": -1.0, "order": "random"},
}
COMMON_BAD_VALUES = {"kinds": "relay", "max_hops": 0}


@pytest.mark.parametrize("policy", pw.plan.policies())
def test_orchestrator_refuses_bad_option_values_at_construction(policy):
    """Every policy with options checks their values where they are set (a registry
    ``check=`` hook), not at the first plan."""
    info = pw.plan.policy_info(policy)
    own = BAD_OPTION_VALUES.get(policy, {})
    assert set(own) <= set(info.options), (policy, sorted(info.options))
    if info.options:
        assert info.check is not None, f"{policy} takes options but registers no check"
        assert own, f"{policy} takes options {sorted(info.options)}: add a bad value"
    for option, value in {**own, **COMMON_BAD_VALUES}.items():
        with pytest.raises((PlanError, FabricError, TypeError), match=option):
            pw.Orchestrator(fabric="h100-2x4", policy=policy, **{option: value})


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda D: D.__setitem__((2, 5), -3.0), r"D\[2, 5\] = -3.0"),
        (lambda D: D.__setitem__((1, 4), 0.5), r"D\[1, 4\] = 0.5 is not a whole number"),
        (lambda D: D.__setitem__((3, 3), 8.0), r"D\[3, 3\]"),
        (lambda D: D.__setitem__((0, 1), np.nan), r"D\[0, 1\]"),
    ],
)
def test_bad_demand_names_the_entry(mutate, match):
    D = pw.traffic.uniform(8, 8 * MB)
    mutate(D)
    with pytest.raises(WorkloadError, match=match):
        pw.plan.make(H100, D, "mwu")


def test_wrong_shape_demand():
    with pytest.raises(WorkloadError, match="4"):
        pw.plan.make(H100, np.zeros((4, 4)), "static")


def test_validate_catches_broken_plans():
    from dataclasses import replace

    plan = pw.plan.make(H100, pw.traffic.uniform(8, 8 * MB), "mwu")
    short = replace(plan, flow_bytes=plan.flow_bytes - (np.arange(plan.flow_bytes.size) == 0))
    with pytest.raises(PlanError, match=r"pair \(0, 1\): plan carries"):
        short.validate()
    bad_path = replace(plan, flow_path=plan.flow_path + 10**6)
    with pytest.raises(PlanError, match="names path"):
        bad_path.validate()


def test_plan_does_not_alias_the_callers_demand():
    D = pw.traffic.uniform(8, 8 * MB)
    plan = pw.plan.make(H100, D, "static")
    D[0, 1] = 0
    plan.validate()
    assert plan.demand[0, 1] > 0


def test_kind_bytes_by_hand():
    # static on hotspot 0.9: intra-node pairs go direct, inter-node pairs use the
    # destination's rail (dr), or the shared rail when both ends own it (matched).
    D = pw.traffic.hotspot(8, 600 * MB, 0.9)
    kb = pw.plan.make(H100, D, "static").kind_bytes()
    n0, n1 = range(4), range(4, 8)
    same_node = sum(D[s, d] for s in range(8) for d in range(8) if (s < 4) == (d < 4))
    matched = sum(D[s, s + 4] + D[s + 4, s] for s in n0)
    assert kb == {"direct": same_node, "matched": matched, "dr": D.sum() - same_node - matched}
    del n1


@pytest.mark.parametrize("roles", [("relay",), ("drd",), ("relay", "drd"), ("rd", "dr")])
def test_pinned_puts_each_pair_on_one_path_of_the_roles(roles):
    fab = pw.fabric.preset("h100-2x4")
    demand = pw.traffic.uniform(8, bytes_per_rank=7 << 20)
    plan = pw.plan.pinned(fab, demand, roles)
    ps = plan.paths
    for s in range(8):
        for d in range(8):
            if s == d:
                continue
            routes = plan.routes(s, d)
            assert len(routes) == 1 and routes[0].bytes == demand[s, d]
            # Walked by hand over the pair's candidates, in path-id order.
            wanted = [p for p in ps.pair_paths(s, d) if ps.rail_role(p) in roles]
            expect = wanted[0] if wanted else ps.pair_paths(s, d)[0]
            assert routes[0].path_id == expect


def test_pinned_names_bad_roles():
    fab = pw.fabric.preset("h100-2x4")
    with pytest.raises(PlanError, match="bogus"):
        pw.plan.pinned(fab, np.zeros((8, 8)), ["relay", "bogus"])


# ------------------------------------------------ the peers, link by link (hand-drawn)
def _one_pair(fab: pw.fabric.Fabric, s: int, d: int, nbytes: int = 1 << 20) -> np.ndarray:
    D = np.zeros((fab.num_ranks, fab.num_ranks))
    D[s, d] = nbytes
    return D


def _hops(route) -> list[str]:
    return list(route.vertices)


def test_ucx_enters_the_destination_through_its_pcie_link():
    # h100-2x4: GPU k and NIC k share switch n?.pcie{k}; GPUs 0-1 on cpu0, 2-3 on
    # cpu1. n1.gpu0 (rank 4) -> n0.gpu1 (rank 1): UCX uses rank 4's nearest NIC
    # (nic0, PIX), crosses rail 0 to n0.nic0, and GPUDirect RDMA writes into
    # n0.gpu1 through switch 0, the root complex and switch 1: no GPU relays it.
    fab = pw.fabric.preset("h100-2x4")
    (r,) = pw.plan.make(fab, _one_pair(fab, 4, 1), "multirail").routes(4, 1)
    assert (r.role, r.via) == ("pcie", 0)
    assert _hops(r) == ["n1.gpu0", "n1.pcie0", "n1.nic0", "rail0", "n0.nic0", "n0.pcie0",
                        "n0.cpu0", "n0.pcie1", "n0.gpu1"]
    # n0.gpu3 sits on the other socket: the bytes also cross the inter-socket link
    (r,) = pw.plan.make(fab, _one_pair(fab, 4, 3), "multirail").routes(4, 3)
    assert _hops(r)[5:] == ["n0.pcie0", "n0.cpu0", "n0.cpu1", "n0.pcie3", "n0.gpu3"]
    # the destination's own rail: the rail-matched path, no detour
    (r,) = pw.plan.make(fab, _one_pair(fab, 5, 1), "multirail").routes(5, 1)
    assert r.role == "matched" and _hops(r)[-2:] == ["n0.pcie1", "n0.gpu1"]


def test_deepep_forwards_over_nvlink_from_the_same_rail_gpu():
    # DeepEP normal kernels: RDMA to the GPU on the source's rail in the
    # destination node (n0.gpu0 for rank 4), NVLink from there to n0.gpu1.
    fab = pw.fabric.preset("h100-2x4")
    (r,) = pw.plan.make(fab, _one_pair(fab, 4, 1), "deepep").routes(4, 1)
    assert r.role == "rd"
    assert _hops(r) == ["n1.gpu0", "n1.pcie0", "n1.nic0", "rail0", "n0.nic0", "n0.pcie0",
                        "n0.gpu0", "n0.gpu1"]


def test_ucx_stripes_over_at_most_two_nearest_nics():
    # 4 GPUs, 8 NICs: GPU g has NICs g and g + 4 under its switch (both PIX).
    # UCX_MAX_RNDV_RAILS = 2: rank 0 -> rank 4 (n1.gpu0 owns rails 0 and 4 too)
    # is split evenly over the two matched rails.
    fab = pw.fabric.cluster(nodes=2, gpus_per_node=4, node_kind="nvlink-mesh", rails=8,
                            pcie_tree=True)
    routes = pw.plan.make(fab, _one_pair(fab, 0, 4, 1000), "multirail").routes(0, 4)
    assert [(r.role, r.via, r.bytes) for r in routes] == [("matched", 0, 500),
                                                          ("matched", 4, 500)]
    # to n1.gpu1: both lanes land on a NIC it does not own and cross the tree
    routes = pw.plan.make(fab, _one_pair(fab, 0, 5, 1000), "multirail").routes(0, 5)
    assert [(r.role, r.via) for r in routes] == [("pcie", 0), ("pcie", 4)]
    assert all(_hops(r)[-3:] == ["n1.cpu0", "n1.pcie1", "n1.gpu1"] for r in routes)


def test_ucx_takes_the_spines_to_the_destinations_own_nic():
    fab = pw.fabric.cluster(nodes=2, gpus_per_node=4, node_kind="nvlink-mesh", spines=2,
                            pcie_tree=True)
    routes = pw.plan.make(fab, _one_pair(fab, 0, 5, 1000), "multirail").routes(0, 5)
    assert [(r.role, r.bytes) for r in routes] == [("spine", 500), ("spine", 500)]
    assert all(_hops(r)[-3:] == ["n1.nic1", "n1.pcie1", "n1.gpu1"] for r in routes)


def test_ucx_without_a_pcie_tree_falls_back_to_the_forward():
    # No tree: the NIC-to-GPU hop through the root complex cannot be drawn;
    # multirail then takes deepep's receive-side forward, for every pair.
    fab = pw.fabric.cluster(nodes=2, gpus_per_node=4, node_kind="nvlink-mesh")
    D = pw.traffic.hotspot(8, bytes_per_rank=1 << 20, ratio=0.5)
    a, b = pw.plan.make(fab, D, "multirail"), pw.plan.make(fab, D, "deepep")
    assert np.array_equal(a.flow_path, b.flow_path) and np.array_equal(a.flow_bytes,
                                                                       b.flow_bytes)


@pytest.mark.parametrize("policy", ["multirail", "static"])
def test_ucx_and_nccl_never_relay_through_a_gpu(policy):
    # Every fragment of an inter-node pair has GPUs only at its two ends under
    # UCX; NCCL's PXN forwards only inside the source node.
    fab = pw.fabric.preset("dgx-h100")
    D = pw.traffic.hotspot(16, bytes_per_rank=1 << 20, ratio=0.7)
    plan = pw.plan.make(fab, D, policy)
    for s in range(16):
        for d in range(16):
            if s // 8 == d // 8:
                continue
            for r in plan.routes(s, d):
                gpus = [i for i, v in enumerate(r.vertices) if ".gpu" in v]
                if policy == "multirail":
                    assert gpus == [0, len(r.vertices) - 1], r.vertices
                else:
                    assert all(r.vertices[i].startswith(f"n{s // 8}.") for i in gpus[:-1])


# ------------------------------------- what the data plane runs never crosses a PCIe tree
#: Policies whose plans the data plane runs, and baselines that only model a peer.
EXECUTED = [p for p in pw.plan.policies() if pw.plan.policy_info(p).executable]
MODELS = [p for p in pw.plan.policies() if not pw.plan.policy_info(p).executable]


def _cross_rail_shift(fab: pw.fabric.Fabric, nbytes: int = 64 << 20) -> np.ndarray:
    """Node 0's GPU k sends to node 1's GPU k + 1: no pair shares a rail, so a pcie path
    (the source's own NIC, then the destination's PCIe tree) needs no GPU forward."""
    n, g = fab.num_ranks, fab.gpus_per_node
    D = np.zeros((n, n))
    for k in range(g):
        D[k, g + (k + 1) % g] = nbytes
    return D


#: A hot GPU: a second way into it (its PCIe link, from another NIC of its node) pays.
HOT = pw.traffic.hotspot(8, bytes_per_rank=256 << 20, ratio=0.9)


@pytest.mark.parametrize("policy", ["mwu_time", "optimal"])
def test_pcie_paths_would_carry_bytes_where_offered(policy):
    # Offered the pcie rule, the time-aware planner and the LP put bytes on it
    # for HOT: the test below is not vacuous.
    from pathweave.fabric.paths import ALL_KINDS

    offered = pw.plan.make(H100, HOT, policy, kinds=ALL_KINDS)
    on_pcie = offered.paths.kind[offered.flow_path] == pw.fabric.PathKind.PCIE
    assert offered.flow_bytes[on_pcie].sum() > 0.01 * HOT.sum()


@pytest.mark.parametrize("policy", EXECUTED)
def test_no_policy_the_data_plane_runs_routes_over_pcie(policy):
    from pathweave.runtime.schedule import path_routes

    for D in (HOT, _cross_rail_shift(H100)):
        plan = pw.plan.make(H100, D, policy).validate()
        assert "pcie" not in plan.paths.kinds
        assert not (plan.paths.kind == pw.fabric.PathKind.PCIE).any()
        assert path_routes(plan.paths).shape[0] == plan.paths.num_paths  # the routes it runs


@pytest.mark.parametrize("policy", MODELS)
def test_a_model_only_peer_plans_on_its_own_paths_and_is_simulated(policy):
    # UCX's plan carries the path set it needs (the default rules plus pcie);
    # the simulator runs it on those paths, link by link.
    D = _cross_rail_shift(H100)
    plan = pw.plan.make(H100, D, policy).validate()
    assert "pcie" in plan.paths.kinds
    assert (plan.paths.kind[plan.flow_path] == pw.fabric.PathKind.PCIE).all()
    res = pw.sim.simulate(H100, plan)
    assert res.makespan_s >= plan.congestion_s > 0


def test_default_policy_never_takes_a_model_only_peers_plan():
    from pathweave.plan import predict_time

    D = _cross_rail_shift(H100)
    times = {b: predict_time(pw.plan.make(H100, D, b)) for b in pw.plan.baselines()}
    best = min(times, key=times.get)
    # UCX's plan (no NVLink forward) is predicted the fastest baseline here,
    # by more than mintime's tie: were it a candidate, it would be chosen.
    assert best in MODELS
    others = min(t for b, t in times.items() if b not in MODELS)
    assert times[best] * (1 + pw.plan.mintime.MINTIME_DEFAULTS["tie"]) < others
    for prune in (True, False):
        plan = pw.plan.make(H100, D, prune=prune).validate()
        assert plan.info["chosen"] in EXECUTED
        assert not set(plan.info["candidates_s"]) & set(MODELS)
        assert not (plan.paths.kind == pw.fabric.PathKind.PCIE).any()
    again = pw.plan.replan(plan, D)
    assert again.info["chosen"] not in MODELS and not set(again.info["candidates_s"]) & set(MODELS)


@pytest.mark.parametrize("policy", MODELS)
def test_the_data_plane_refuses_a_model_only_peer(policy):
    from pathweave.emulate import predict
    from pathweave.emulate.run import run_workloads

    msg = f"policy {policy!r} models a peer's routing that pathweave's data plane cannot run"
    pw.plan.registry.check_options(policy, {}, execute=False)  # planning it is fine
    with pytest.raises(PlanError, match=msg):
        pw.Orchestrator(fabric="h100-2x4", policy=policy)
    # The emulator says so before it builds anything (no root needed to get here).
    with pytest.raises(PlanError, match=msg):
        run_workloads("h100-2x4", ["hotspot:0.5"], policies=("static", f"{policy}+adapt"))
    with pytest.raises(PlanError, match=msg):
        predict(H100, _cross_rail_shift(H100).astype(np.int64), policy)


#: Fabrics with spines: PXN everywhere (dgx-h100), a PCIe tree and GPUs without
#: a NIC (cluster), single-GPU hosts where a spine is a pair's only way.
SPINE_FABRICS = {
    "dgx-spines": lambda: pw.fabric.resolve("dgx-h100:nodes=2,spines=2"),
    "cluster-spines": lambda: pw.fabric.resolve("cluster:nodes=4,gpus_per_node=4,rails=2,"
                                                "spines=2,pcie_tree=1"),
    "leaf-spine": lambda: pw.fabric.leaf_spine(leaves=3, hosts_per_leaf=2, spines=2),
}


def _gpu_route(paths, pid):
    """Ranks along a path from its vertex names (GPU vertices only)."""
    fab = paths.fabric
    names = paths.path_vertices(pid)
    return tuple(int(fab.vertex_rank[fab.vertex_names.index(v)]) for v in names
                 if fab.vertex_kind[fab.vertex_names.index(v)] == pw.fabric.VertexKind.GPU)


@pytest.mark.parametrize("which", sorted(SPINE_FABRICS))
@pytest.mark.parametrize("policy", EXECUTED)
def test_every_executed_plan_puts_a_pair_on_distinct_routes_the_transport_takes(which, policy):
    # The data plane controls only a fragment's route (its GPUs): two
    # fragments of one pair on one route would be split by the transport, and
    # a fragment sent plainly ([s, d]) takes the emulator's per-destination
    # route, the static (NCCL: PXN, else the hashed spine) path.
    from pathweave.plan.static import static_pins
    from pathweave.runtime.schedule import path_routes

    fab = SPINE_FABRICS[which]()
    n = fab.num_ranks
    D = pw.traffic.hotspot(n, bytes_per_rank=256 << 20, ratio=0.8)
    plan = pw.plan.make(fab, D, policy).validate()
    path_routes(plan.paths)  # runs
    pins = static_pins(plan.paths)
    seen: dict[tuple[int, ...], int] = {}
    for pid in plan.flow_path.tolist():
        route = _gpu_route(plan.paths, pid)
        assert seen.setdefault(route, pid) == pid, (route, plan.paths.describe(pid))
        if len(route) == 2:
            s, d = route
            assert pid == pins[s * n + d], plan.paths.describe(pid)


def test_path_routes_refuses_paths_of_one_pair_on_one_route():
    import dataclasses

    from pathweave.runtime.schedule import path_routes

    fab = pw.fabric.leaf_spine(leaves=2, hosts_per_leaf=1, spines=2)
    ps = pw.fabric.candidate_paths(fab)
    assert path_routes(ps)[ps.pair_paths(0, 1)[0]].tolist() == [0, 1]
    every = pw.fabric.candidate_paths(fab, (*ps.kinds, "ecmp"))
    with pytest.raises(PlanError, match="4 'spine' paths of rule 'ecmp'"):
        path_routes(every)
    # The same rows labelled with the default rules: caught by the routes.
    forged = dataclasses.replace(every, kinds=ps.kinds)
    with pytest.raises(PlanError, match=r"pair \(0, 1\): paths \[0, 1\] \(spine\(spine0\); "
                                        r"spine\(spine1\)\) share the route \[0, 1\]"):
        path_routes(forged)
    with pytest.raises(PlanError, match="cannot run 'ecmp' paths"):
        pw.Orchestrator(fabric=fab, policy="mwu", kinds=every.kinds)


def test_the_data_plane_refuses_pcie_paths():
    from pathweave.fabric.paths import ALL_KINDS
    from pathweave.runtime.schedule import path_routes

    with pytest.raises(PlanError, match="the data plane cannot run 'pcie' paths"):
        pw.Orchestrator(fabric="h100-2x4", policy="mwu", kinds=ALL_KINDS)
    # The routes the executor sends along cannot hold one (24 on h100-2x4: the
    # inter-node pairs with different local indices).
    with pytest.raises(PlanError, match="24 'pcie' paths"):
        path_routes(pw.fabric.candidate_paths(H100, ALL_KINDS))
