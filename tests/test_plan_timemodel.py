"""The time model, the default policy ``mintime`` and the time yardstick.

References: hand-computed times from the fabric's capacities and the model's
parameters, the simulator (an independent max-min fluid engine), the
congestion bound, and every registered baseline (through the registry).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import pathweave as pw
from pathweave.plan._flows import plan_from_flows
from pathweave.plan.mintime import MINTIME_DEFAULTS
from pathweave.plan.optimal import time_optimum
from pathweave.plan.timemodel import path_costs, predict_time
from pathweave.runtime import orchestrator as orch_mod
from pathweave.sim import SimModel

H100 = pw.fabric.preset("h100-2x4")
DGX2 = pw.fabric.preset("dgx-h100", nodes=2, gpus_per_node=4)
MB = 10**6


def _one_path_plan(fab, src, dst, nbytes, vertices):
    """A plan that sends ``nbytes`` from ``src`` to ``dst`` on the path through ``vertices``."""
    ps = pw.fabric.candidate_paths(fab)
    n = fab.num_ranks
    k = src * n + dst
    pid = [p for p in range(ps.pair_ptr[k], ps.pair_ptr[k + 1])
           if tuple(ps.path_vertices(p)) == vertices]
    assert len(pid) == 1, vertices
    D = np.zeros((n, n), dtype=np.int64)
    D[src, dst] = nbytes
    return plan_from_flows(fab, D, ps, np.array(pid), np.array([nbytes]), "hand").validate()


# ---------------------------------------------------------------- hand cases
def test_direct_transfer_is_setup_plus_bytes_plus_latency():
    plan = _one_path_plan(H100, 0, 1, 120 * MB, ("n0.gpu0", "n0.gpu1"))
    want = 20e-6 + 120e6 / 120e9 + 1e-6
    assert predict_time(plan) == pytest.approx(want, rel=1e-12)
    assert pw.sim.simulate(H100, plan).makespan_s == pytest.approx(want, rel=1e-9)


def test_relay_transfer_pays_relay_setup_efficiency_and_one_chunk_of_fill():
    plan = _one_path_plan(H100, 0, 1, 240 * MB, ("n0.gpu0", "n0.gpu2", "n0.gpu1"))
    m = SimModel()
    rate = m.relay_efficiency * 120e9  # the forwarding GPU's ceiling
    fill = 2 * 1e-6 + m.chunk_bytes / 120e9  # two hops, one chunk out of GPU 2
    want = m.setup_s + m.relay_setup_s + 240e6 / rate + fill
    assert predict_time(plan) == pytest.approx(want, rel=1e-12)
    assert pw.sim.simulate(H100, plan).makespan_s == pytest.approx(want, rel=1e-9)


def test_rail_transfer_pays_network_efficiency_and_nic_stages():
    # PXN: GPU0 -> GPU1 (NVLink) -> NIC1 -> rail1 -> NIC1 -> GPU1 of node 1.
    ps = pw.fabric.candidate_paths(H100)
    verts = ("n0.gpu0", "n0.gpu1", "n0.nic1", "rail1", "n1.nic1", "n1.gpu1")
    plan = _one_path_plan(H100, 0, 5, 100 * MB, verts)
    m = SimModel()
    pid = int(plan.flow_path[0])
    caps = [H100.capacity_Bps[e] * (m.network_efficiency if H100.link_kind[e] == 2 else 1.0)
            for e in ps.links[pid, : ps.length[pid]]]
    kinds = [int(H100.link_kind[e]) for e in ps.links[pid, : ps.length[pid]]]
    assert kinds.count(2) == 2  # NIC -> rail switch -> NIC
    # Stages: GPU1 (out on its PCIe link), NIC1 of node 0 (out on the rail) and
    # NIC1 of node 1 (out on its PCIe link); the rail switch cuts through.
    stage_caps = [caps[1], caps[2], caps[4]]
    rate = min(m.relay_efficiency * min(caps[0], caps[1]), *caps)
    fill = len(caps) * 1e-6 + sum(m.chunk_bytes / c for c in stage_caps)
    want = m.setup_s + m.relay_setup_s + 100e6 / rate + fill
    assert predict_time(plan) == pytest.approx(want, rel=1e-9)
    assert pw.sim.simulate(H100, plan).makespan_s == pytest.approx(want, rel=1e-9)


def test_link_term_counts_the_nvlink_injection_limit():
    # GPU0 sends 360 MB over its three NVLinks at once: 120 MB each, but the
    # GPU injects at most 0.798 of 360 GB/s, so the link term is 360 MB / 287 GB/s.
    ps = pw.fabric.candidate_paths(H100)
    D = np.zeros((8, 8), dtype=np.int64)
    D[0, 1] = D[0, 2] = D[0, 3] = 120 * MB
    direct = [p for k in (1, 2, 3) for p in range(ps.pair_ptr[k], ps.pair_ptr[k + 1])
              if ps.length[p] == 1]
    plan = plan_from_flows(H100, D, ps, np.array(direct), np.full(3, 120 * MB), "hand")
    m = SimModel()
    want = m.setup_s + 360e6 / (m.nvlink_inject_efficiency * 360e9)
    assert predict_time(plan) == pytest.approx(want, rel=1e-12)
    assert pw.sim.simulate(H100, plan).makespan_s >= want


@pytest.mark.parametrize("policy", pw.plan.policies())
def test_ideal_model_predicts_the_congestion_bound(policy):
    D = pw.traffic.hotspot(8, bytes_per_rank=64 << 20, ratio=0.7)
    plan = pw.plan.make(H100, D, policy)
    assert predict_time(plan, SimModel.ideal()) == pytest.approx(plan.congestion_s, rel=1e-12)


@pytest.mark.parametrize("policy", pw.plan.policies())
@pytest.mark.parametrize("fab", [H100, DGX2], ids=["h100-2x4", "dgx-2x4"])
def test_prediction_is_a_close_lower_bound_of_the_simulator(policy, fab):
    D = pw.traffic.hotspot(8, bytes_per_rank=64 << 20, ratio=0.5)
    plan = pw.plan.make(fab, D, policy)
    sim_s = pw.sim.simulate(fab, plan).makespan_s
    pred_s = predict_time(plan)
    assert pred_s <= sim_s * (1 + 1e-9)
    assert pred_s >= 0.85 * sim_s


def test_path_costs_are_cached_per_model():
    ps = pw.fabric.candidate_paths(H100)
    assert path_costs(ps) is path_costs(ps, SimModel())
    assert path_costs(ps, SimModel.ideal()) is not path_costs(ps)


# ------------------------------------------------------------ default policy
CASES = [(fab, r) for fab in (H100, DGX2) for r in (0.0, 0.3, 0.6, 0.9)]


def test_default_policy_is_registered_and_used_by_make():
    assert pw.plan.DEFAULT_POLICY in pw.plan.policies()
    D = pw.traffic.hotspot(8, bytes_per_rank=64 << 20, ratio=0.9)
    assert pw.plan.make(H100, D).policy == pw.plan.DEFAULT_POLICY
    assert set(pw.plan.baselines()) >= {"static", "multirail", "hscore"}


@pytest.mark.parametrize(("fab", "ratio"), CASES)
def test_default_policy_never_predicted_slower_than_any_baseline(fab, ratio):
    D = pw.traffic.hotspot(8, bytes_per_rank=256 << 20, ratio=ratio)
    # Baselines within the tie tolerance count as equal (the simplest is taken).
    best = pw.plan.make(fab, D).validate()
    tie = MINTIME_DEFAULTS["tie"]
    for name in pw.plan.baselines():
        assert predict_time(best) <= predict_time(pw.plan.make(fab, D, name)) * (1 + tie)


@pytest.mark.parametrize(("fab", "ratio"), CASES)
def test_default_policy_never_simulated_slower_than_any_baseline(fab, ratio):
    # The promise, in the simulator: within its tie noise (0.1 %).
    D = pw.traffic.hotspot(8, bytes_per_rank=256 << 20, ratio=ratio)
    got = pw.sim.simulate(fab, pw.plan.make(fab, D)).makespan_s
    for name in pw.plan.baselines():
        assert got <= pw.sim.simulate(fab, pw.plan.make(fab, D, name)).makespan_s * 1.001


def test_default_policy_takes_multipath_where_it_pays():
    # A 2-D stencil with heavy borders: static and multirail leave the NVLink
    # mesh's relays unused; the chosen plan is a multi-path one and faster.
    D = pw.traffic.parse_workload("stencil:dims=2", 8, bytes_per_rank=256 << 20)
    plan = pw.plan.make(H100, D)
    assert plan.info["chosen"] in ("mwu", "mwu_time")
    base = min(pw.sim.simulate(H100, pw.plan.make(H100, D, b)).makespan_s
               for b in pw.plan.baselines())
    assert pw.sim.simulate(H100, plan).makespan_s < 0.95 * base


def test_mintime_option_errors_name_the_value():
    D = pw.traffic.hotspot(8, bytes_per_rank=64 << 20, ratio=0.5)
    with pytest.raises(pw.errors.PlanError, match=r"margin=1\.5"):
        pw.plan.make(H100, D, margin=1.5)


# ---------------------------------------------------------- mwu size threshold
def test_mwu_small_pairs_go_whole_on_their_static_path():
    D = pw.traffic.hotspot(8, bytes_per_rank=2 << 20, ratio=0.9)  # pairs below 1 MiB
    D[1, 0] = 64 << 20
    mwu = pw.plan.make(H100, D, "mwu").validate()
    static = pw.plan.make(H100, D, "static")
    for s in range(8):
        for d in range(8):
            if 0 < D[s, d] < (1 << 20):
                assert mwu.routes(s, d) == static.routes(s, d)
    assert len(mwu.routes(1, 0)) > 1  # the large pair is still split


# -------------------------------------------------------------- orchestrator
def _state(fab):
    return orch_mod._GroupState(SimpleNamespace(rank=0, size=fab.num_ranks), fab,
                                pw.fabric.candidate_paths(fab))


def test_orchestrator_defaults_to_the_default_policy_and_passes_its_options():
    assert pw.Orchestrator().policy == pw.plan.DEFAULT_POLICY
    orch = pw.Orchestrator(fabric=H100, policy="mwu", enabled=True, min_split_bytes=1 << 40)
    D = pw.traffic.hotspot(8, bytes_per_rank=256 << 20, ratio=0.9).astype(np.int64)
    dec = orch._plan(_state(H100), D)
    # every pair below the threshold: one path per pair, its static path
    assert np.unique(dec.flow_pair).size == dec.flow_pair.size
    static = pw.plan.make(H100, D, "static")
    assert np.array_equal(np.sort(dec.flow_path), np.sort(static.flow_path))


def test_orchestrator_auto_compares_predicted_times():
    orch = pw.Orchestrator(fabric=H100, enabled="auto")
    st = _state(H100)
    hot = pw.traffic.hotspot(8, bytes_per_rank=256 << 20, ratio=0.9).astype(np.int64)
    dec = orch._plan(st, hot)
    assert dec.multipath
    static = pw.plan.make(H100, hot, "static", paths=st.paths)
    assert dec.static_s == pytest.approx(predict_time(static))
    plan = pw.plan.make(H100, hot, paths=st.paths)
    assert dec.predicted_s == pytest.approx(predict_time(plan))
    uniform = pw.traffic.uniform(8, bytes_per_rank=256 << 20).astype(np.int64)
    assert not orch._plan(st, uniform).multipath


# ------------------------------------------------------------- time yardstick
@pytest.mark.parametrize(("fab", "ratio"), CASES[::2])
def test_time_yardstick_is_at_most_every_policy(fab, ratio):
    D = pw.traffic.hotspot(8, bytes_per_rank=256 << 20, ratio=ratio)
    yard = time_optimum(fab, D).validate()
    assert yard.info["predicted_s"] == pytest.approx(predict_time(yard))
    for name in pw.plan.policies():
        got = predict_time(pw.plan.make(fab, D, name))
        assert yard.info["predicted_s"] <= got * (1 + 1e-6), name


def test_time_yardstick_in_the_ideal_model_is_the_congestion_optimum():
    # Without forwarding costs the time model is the congestion bound, so the
    # yardstick must meet the min-congestion LP's optimum (an independent LP).
    for D in (pw.traffic.hotspot(8, bytes_per_rank=256 << 20, ratio=0.8),
              np.where(np.eye(8) > 0, 0, 0).astype(np.int64) + np.diag(np.ones(7), 1) * 360 * MB):
        yard = time_optimum(H100, D, model=SimModel.ideal())
        opt = pw.plan.make(H100, D, "optimal")
        assert yard.info["predicted_s"] == pytest.approx(opt.info["optimum_s"], rel=1e-6)


# ------------------------------------------------------------------ replan
@pytest.mark.parametrize("fab", [H100, DGX2], ids=["h100-2x4", "dgx-2x4"])
def test_replan_is_valid_and_never_predicted_slower_than_a_baseline(fab):
    spec = "moe:tokens=65536,hidden=4096,experts=8,topk=2,hot=0.9"
    step1 = pw.traffic.parse_workload(spec, 8, seed=0)
    step2 = pw.traffic.parse_workload(spec, 8, seed=1)
    plan = pw.plan.replan(pw.plan.make(fab, step1), step2).validate()
    assert plan.policy == pw.plan.DEFAULT_POLICY
    tie = MINTIME_DEFAULTS["tie"]
    for name in pw.plan.baselines():
        assert predict_time(plan) <= predict_time(pw.plan.make(fab, step2, name)) * (1 + tie)


def test_warm_start_keeps_the_previous_split_of_an_unchanged_demand():
    # Same demand, no refinement pass: the warm start is the previous plan.
    from pathweave.plan.mintime import warm_start

    D = pw.traffic.parse_workload("stencil:dims=2", 8, bytes_per_rank=256 << 20)
    prev = pw.plan.make(H100, D, "mwu_time")
    d = pw.plan.registry.as_demand(D, 8)
    again = warm_start(prev, d, chunk_bytes=1 << 20, min_split_bytes=1 << 20, refine=0)
    assert np.array_equal(again.flow_path, prev.flow_path)
    assert np.array_equal(again.flow_bytes, prev.flow_bytes)
    # Twice the bytes: the same paths, every fragment doubled.
    twice = warm_start(prev, d * 2, chunk_bytes=1 << 20, min_split_bytes=1 << 20, refine=0)
    assert np.array_equal(twice.flow_path, prev.flow_path)
    assert np.array_equal(twice.flow_bytes, prev.flow_bytes * 2)
    assert twice.validate() is twice
