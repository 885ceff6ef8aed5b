"""The dynamic simulator: link kernels, the queue/RTT model, events, conservation, determinism.

Expected values are worked out by hand from the model in
:mod:`pathweave.sim.dynamic` (queues grow at the excess rate and drain at
capacity; RTT = base + queue / capacity; a lone flow runs at its NIC's line
rate), and every numba kernel is compared with its slow twin.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from typing import Any, ClassVar

import numpy as np
import pytest

from pathweave.errors import FabricError, PlanError, WorkloadError
from pathweave.fabric import candidate_paths
from pathweave.fabric.builders import leaf_spine
from pathweave.fabric.paths import DEFAULT_KINDS
from pathweave.sim import BackgroundEvent, LinkEvent, run_dynamic
from pathweave.sim._queue import (
    link_in_bytes,
    link_in_bytes_reference,
    path_sums,
    path_sums_reference,
    propagate,
    propagate_reference,
    queue_step,
    queue_step_reference,
)
from pathweave.sim.policies import DynamicPolicy, PathChoice, policies
from pathweave.traffic.trace import FlowTrace, poisson_trace, websearch_sizes

#: The dynamic simulator's rules (run_dynamic's default): every spine path.
ECMP_KINDS = (*DEFAULT_KINDS, "ecmp")

C = 12.5e9  # leaf_spine's default NIC line rate, B/s
LAT = 1e-6  # every link's latency


def one_flow(size: int, src: int = 0, dst: int = 1, n: int = 2, start: float = 0.0) -> FlowTrace:
    return FlowTrace.from_flows([(start, src, dst, size)], num_ranks=n)


def asym(spines: int = 4, hosts_per_leaf: int = 2, slow: int = 3, factor: float = 0.1):
    fab = leaf_spine(2, hosts_per_leaf, spines)
    deg = {}
    for j in range(2):
        deg[(f"leaf{j}", f"spine{slow}")] = factor
        deg[(f"spine{slow}", f"leaf{j}")] = factor
    return fab.with_links(deg)


# ------------------------------------------------------------------ kernels
@pytest.fixture(scope="module")
def ls_paths():
    fab = asym(hosts_per_leaf=3)
    return fab, candidate_paths(fab, ECMP_KINDS)


def test_link_kernels_match_their_slow_twins(ls_paths):
    fab, ps = ls_paths
    rng = np.random.default_rng(5)
    sub_path = rng.integers(0, ps.num_paths, 40)
    sent = rng.random(40) * 1e5
    sent[::7] = 0.0
    nl = fab.num_links
    np.testing.assert_allclose(
        link_in_bytes(ps.links, ps.length, sub_path, sent, nl),
        link_in_bytes_reference(ps.links, ps.length, sub_path, sent, nl),
        rtol=1e-12,
    )
    per_link = rng.random(nl)
    np.testing.assert_allclose(
        path_sums(ps.links, ps.length, sub_path, per_link),
        path_sums_reference(ps.links, ps.length, sub_path, per_link),
        rtol=1e-12,
    )
    q1 = rng.random(nl) * 1e4
    q2 = q1.copy()
    inb = rng.random(nl) * 2e4
    out1 = queue_step(q1, inb, fab.capacity_Bps, 1e-6)
    out2 = queue_step_reference(q2, inb, fab.capacity_Bps, 1e-6)
    np.testing.assert_allclose(out1, out2, rtol=1e-12)
    np.testing.assert_allclose(q1, q2, rtol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_propagate_matches_the_topological_twin(ls_paths, seed):
    fab, ps = ls_paths
    rng = np.random.default_rng(seed)
    sub_path = rng.integers(0, ps.num_paths, 60)
    sent = rng.random(60) * 3e5  # heavy enough that some links overflow
    bg = np.where(rng.random(fab.num_links) < 0.1, 1e4, 0.0)
    q1 = np.where(rng.random(fab.num_links) < 0.3, 5e4, 0.0)
    q2 = q1.copy()
    a1, o1 = propagate(ps.links, ps.length, sub_path, sent, bg, q1, fab.capacity_Bps, 10e-6)
    a2, o2 = propagate_reference(
        ps.links, ps.length, sub_path, sent, bg, q2, fab.capacity_Bps, 10e-6
    )
    assert (q1 > 0).any()  # the case is not trivial
    np.testing.assert_allclose(a1, a2, rtol=1e-9)
    np.testing.assert_allclose(o1, o2, rtol=1e-9)
    np.testing.assert_allclose(q1, q2, rtol=1e-9, atol=1e-6)


def test_propagate_conserves_bytes_per_link(ls_paths):
    fab, ps = ls_paths
    rng = np.random.default_rng(9)
    sub_path = rng.integers(0, ps.num_paths, 50)
    sent = rng.random(50) * 4e5
    q = np.where(rng.random(fab.num_links) < 0.3, 5e4, 0.0)
    q0 = q.copy()
    arrive, out = propagate(
        ps.links, ps.length, sub_path, sent, np.zeros(fab.num_links), q, fab.capacity_Bps, 10e-6
    )
    np.testing.assert_allclose(q0 + arrive - out, q, atol=1e-6)
    # a link never serves more than its capacity for the epoch
    assert np.all(out <= fab.capacity_Bps * 10e-6 * (1 + 1e-12))


def test_shaping_puts_the_queue_at_the_bottleneck_only():
    # one subflow over three links of capacity 10, 5, 10 B/s, offering 8 B in 1 s:
    # link 1 queues 3 B and passes 5 on; link 2 receives 5 and queues nothing
    links = np.array([[0, 1, 2]])
    q = np.zeros(3)
    arrive, out = propagate(
        links,
        np.array([3]),
        np.array([0]),
        np.array([8.0]),
        np.zeros(3),
        q,
        np.array([10.0, 5.0, 10.0]),
        1.0,
    )
    np.testing.assert_allclose(arrive, [8.0, 8.0, 5.0])
    np.testing.assert_allclose(out, [8.0, 5.0, 5.0])
    np.testing.assert_allclose(q, [0.0, 3.0, 0.0])


# ------------------------------------------------------------------ queue model
def test_queue_grows_at_the_excess_rate_and_drains_at_capacity():
    c, dt = 100.0, 0.5
    q = np.zeros(1)
    for _ in range(4):  # fed at 1.5 c: grows 0.5 c per second
        queue_step(q, np.array([1.5 * c * dt]), np.array([c]), dt)
    assert q[0] == pytest.approx(0.5 * c * 4 * dt)
    for k in range(1, 3):  # unfed: drains c per second
        queue_step(q, np.zeros(1), np.array([c]), dt)
        assert q[0] == pytest.approx(0.5 * c * 4 * dt - k * c * dt)
    out = queue_step(q, np.zeros(1), np.array([c]), dt)
    assert q[0] == 0.0 and out[0] == pytest.approx(0.0)


def test_background_above_capacity_builds_then_drains_the_queue_in_a_run():
    fab = leaf_spine(2, 1, 1)
    cap = float(fab.capacity_Bps[fab.link_id("leaf1", "spine0")])
    # background at 1.5x capacity on a link the flow does not use, stopped at 200 us
    events = [
        BackgroundEvent(0.0, (("leaf1", "spine0"),), 1.5 * cap),
        BackgroundEvent(200e-6, (("leaf1", "spine0"),), 0.0),
    ]
    r = run_dynamic(fab, one_flow(int(C * 300e-6)), "ecmp", events=events)
    lid = fab.link_id("leaf1", "spine0")
    grown = 0.5 * cap * 200e-6
    assert r.link_queue_max_bytes[lid] == pytest.approx(grown, rel=1e-9)
    expect_end = max(0.0, grown - cap * (r.end_s - 200e-6))
    assert r.link_queue_bytes[lid] == pytest.approx(expect_end, abs=1e-3)
    assert r.end_s > 200e-6 + 1e-6


def test_rtt_is_base_plus_queue_over_capacity(ls_paths):
    from pathweave.sim.policies import Observation, PolicyContext

    fab, ps = ls_paths
    tr = one_flow(1000, n=fab.num_ranks, dst=3)
    ctx = PolicyContext.build(fab, ps, tr)
    p = ps.pair_paths(0, 3)[0]
    lk = ps.path_links(p)
    q_s = np.zeros(fab.num_links)
    q_s[lk[2]] = 64e3 / fab.capacity_Bps[lk[2]]  # 64 KB queued on the leaf->spine hop
    e = np.zeros(0, dtype=np.int64)
    obs = Observation(
        0.0,
        0,
        ps,
        np.ones(ps.num_paths, bool),
        ctx.base_rtt_s,
        q_s,
        fab.capacity_Bps,
        np.zeros(fab.num_links),
        e,
        e,
        e * 1.0,
        e * 1.0,
        e.astype(bool),
    )
    base = 2 * len(lk) * LAT
    assert ctx.base_rtt_s[p] == pytest.approx(base)
    assert obs.rtt_s([p])[0] == pytest.approx(base + 64e3 / fab.capacity_Bps[lk[2]])
    assert obs.owd_s([p])[0] == pytest.approx(base / 2 + 64e3 / fab.capacity_Bps[lk[2]])


@pytest.mark.parametrize("target", [0.0, 64e3])
def test_lone_flow_runs_at_line_rate(target):
    # 12.5 MB at 12.5 GB/s = 1 ms, plus six 1 us links one way; the standing
    # queue at the NIC (if any) delays the last byte exactly as much as the
    # sender ran ahead filling it
    fab = leaf_spine(2, 1, 1)
    r = run_dynamic(fab, one_flow(12_500_000), queue_target_bytes=target)
    assert r.fct_s[0] == pytest.approx(1e-3 + 6 * LAT, rel=1e-6)
    assert r.ideal_fct_s[0] == pytest.approx(1e-3 + 6 * LAT)
    if target:
        assert r.link_queue_max_bytes.max() == pytest.approx(target)
        # only the bottleneck (the NIC's uplink) holds a queue
        assert np.count_nonzero(r.link_queue_max_bytes > 1) == 1


def test_two_flows_share_the_nic_max_min_fairly():
    # two equal flows from host 0 share its 12.5 GB/s NIC: both finish at 2 ms
    fab = leaf_spine(2, 2, 1)
    tr = FlowTrace.from_flows([(0.0, 0, 2, 12_500_000), (0.0, 0, 3, 12_500_000)], num_ranks=4)
    r = run_dynamic(fab, tr, queue_target_bytes=0.0)
    np.testing.assert_allclose(r.fct_s, 2e-3 + 6 * LAT, rtol=2e-3)


# ------------------------------------------------------------------ events
@pytest.mark.parametrize("policy", policies())
def test_link_failure_mid_run_moves_flows_off_the_dead_link(policy):
    fab = leaf_spine(2, 1, 2)
    ps = candidate_paths(fab, ECMP_KINDS)
    size = 25_000_000
    # fail (at 0.5 ms, halfway) the spine the flow starts on
    k = int(ps.via[run_dynamic(fab, one_flow(size), policy).first_path[0]])
    dead, other = f"spine{k}", f"spine{1 - k}"
    r = run_dynamic(fab, one_flow(size), policy, events=[LinkEvent.cable(500e-6, "leaf0", dead)])
    up_dead, up_other = fab.link_id("leaf0", dead), fab.link_id("leaf0", other)
    assert r.finished == 1
    if policy in ("ecmp", "spray"):  # static: only the failure moves them
        assert r.failovers[0] == 1 and r.switches[0] == 0
    if policy == "ecmp":  # alone on a 6.25 GB/s spine: its standing queue is lost
        assert r.dropped_bytes[up_dead] == pytest.approx(64e3)
    # what the dead link's queue held is sent again
    assert r.resent_bytes[0] == pytest.approx(r.dropped_bytes[up_dead])
    assert r.sent_bytes[0] - r.resent_bytes[0] == pytest.approx(size)
    assert r.link_queue_bytes[up_dead] == 0.0
    # the dead link took bytes only before the failure: what it carried then
    # plus what its queue lost; the rest went over the other spine
    assert 0 < r.link_in_bytes[up_dead] < size
    assert r.link_in_bytes[up_dead] == pytest.approx(
        r.link_bytes[up_dead] + r.dropped_bytes[up_dead]
    )
    assert r.link_in_bytes[up_dead] + r.link_in_bytes[up_other] == pytest.approx(
        size + r.resent_bytes[0], rel=1e-9
    )
    # and it finishes later than without the failure, but finishes
    assert r.fct_s[0] > run_dynamic(fab, one_flow(size), policy).fct_s[0] * (1 - 1e-9)


def test_flow_with_no_alive_path_waits_for_the_repair():
    fab = leaf_spine(2, 1, 1)
    ev = [LinkEvent.cable(100e-6, "leaf0", "spine0"), LinkEvent.cable(1e-3, "leaf0", "spine0", 1.0)]
    tr = FlowTrace.from_flows([(0.0, 0, 1, 12_500_000), (200e-6, 0, 1, 1000)], num_ranks=2)
    r = run_dynamic(fab, tr, "ecmp", events=ev)
    assert r.finished == 2
    assert r.finish_s.min() > 1e-3  # nothing completes while the only spine is down
    assert r.info["stalled_flows"] == 2
    np.testing.assert_allclose(r.sent_bytes - r.resent_bytes, tr.size_bytes)


def test_stranded_forever_ends_the_run_with_unfinished_flows():
    fab = leaf_spine(2, 1, 1)
    r = run_dynamic(fab, one_flow(12_500_000), events=[LinkEvent.cable(1e-4, "leaf0", "spine0")])
    assert r.unfinished == 1 and np.isnan(r.fct_s[0]) and np.isnan(r.avg_fct_s)


def test_max_time_stops_the_run():
    fab = leaf_spine(2, 1, 1)
    r = run_dynamic(fab, one_flow(125_000_000), max_time_s=1e-3)
    assert r.unfinished == 1 and r.end_s == pytest.approx(1e-3)
    assert r.sent_bytes[0] == pytest.approx(C * 1e-3, rel=0.02)


# ------------------------------------------------------------------ invariants
@pytest.fixture(scope="module")
def busy_case():
    fab = asym(hosts_per_leaf=4)
    tr = poisson_trace(fab.num_ranks, load=0.6, host_Bps=C, num_flows=150, seed=4)
    ev = [LinkEvent.cable(1e-3, "leaf1", "spine1", 0.0), BackgroundEvent(5e-4, (0, 5), 2e9)]
    return fab, tr, ev


@pytest.mark.parametrize("policy", policies())
def test_bytes_are_conserved(busy_case, policy):
    fab, tr, ev = busy_case
    r = run_dynamic(fab, tr, policy, events=ev, seed=3)
    assert r.finished == len(tr)
    np.testing.assert_allclose(r.sent_bytes - r.resent_bytes, tr.size_bytes, rtol=1e-9)
    # the failure's dropped queues come back as re-sent bytes
    assert r.resent_bytes.sum() == pytest.approx(r.dropped_bytes.sum(), rel=1e-9)
    # every link: bytes in = bytes out + its final queue + what a failure dropped
    np.testing.assert_allclose(
        r.link_in_bytes, r.link_bytes + r.link_queue_bytes + r.dropped_bytes, rtol=1e-9, atol=1e-3
    )
    assert np.all(r.fct_s >= r.ideal_fct_s * (1 - 1e-9))
    assert np.all(r.link_utilisation <= 1 + 1e-9)


@pytest.mark.parametrize("policy", ["hopper", "nimble-online"])
def test_runs_are_deterministic(busy_case, policy):
    fab, tr, ev = busy_case
    a = run_dynamic(fab, tr, policy, events=ev, seed=7)
    b = run_dynamic(fab, tr, policy, events=ev, seed=7)
    np.testing.assert_array_equal(a.fct_s, b.fct_s)
    np.testing.assert_array_equal(a.switches, b.switches)
    np.testing.assert_array_equal(a.link_bytes, b.link_bytes)
    if policy == "hopper":  # the seed salts the ECMP hash and drives the probes
        c = run_dynamic(fab, tr, policy, events=ev, seed=8)
        assert not np.array_equal(a.first_path, c.first_path)


def test_same_result_in_processes_with_different_hash_seeds():
    # Two processes with different hash seeds: this one and one child (a second
    # child would import pathweave and load the simulator's kernels again).
    code = (
        "from pathweave.fabric.builders import leaf_spine\n"
        "from pathweave.sim import run_dynamic\n"
        "from pathweave.traffic.trace import poisson_trace\n"
        "print(hash('pathweave'))\n"
        "fab = leaf_spine(2, 3, 3)\n"
        "tr = poisson_trace(6, load=0.5, host_Bps=12.5e9, num_flows=60, seed=2)\n"
        "r = run_dynamic(fab, tr, 'hopper', seed=1)\n"
        "print(repr(r.fct_s.tolist()), r.switches.tolist())\n"
    )
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
    ).stdout
    seed_line, child = out.splitlines()
    assert seed_line != str(hash("pathweave")), "the child hashed as this process does"
    tr = poisson_trace(6, load=0.5, host_Bps=12.5e9, num_flows=60, seed=2)
    r = run_dynamic(leaf_spine(2, 3, 3), tr, "hopper", seed=1)
    assert child == f"{r.fct_s.tolist()!r} {r.switches.tolist()}"


# ------------------------------------------------------------------ bad input
def test_bad_arguments_name_the_bad_value():
    fab = leaf_spine(2, 1, 1)
    tr = one_flow(1000)
    with pytest.raises(PlanError, match=r"unknown dynamic policy 'nope'.*ecmp"):
        run_dynamic(fab, tr, "nope")
    with pytest.raises(PlanError, match=r"unknown option 'probes'; valid options: none"):
        run_dynamic(fab, tr, "ecmp", probes=3)
    with pytest.raises(PlanError, match=r"option switch_ratio must be in \(0.0, 1.0\], got 1.5"):
        run_dynamic(fab, tr, "hopper", switch_ratio=1.5)
    with pytest.raises(ValueError, match=r"epoch_s must be positive.*-1"):
        run_dynamic(fab, tr, epoch_s=-1)
    with pytest.raises(TypeError, match=r"epoch_s must be a real number, got str '1e-6'"):
        run_dynamic(fab, tr, epoch_s="1e-6")
    with pytest.raises(ValueError, match="trace is for 4 ranks"):
        run_dynamic(fab, one_flow(10, n=4))
    with pytest.raises(TypeError, match="trace must be a FlowTrace"):
        run_dynamic(fab, [(0.0, 0, 1, 10)])
    with pytest.raises(FabricError, match="capacity factor 2"):
        run_dynamic(fab, tr, events=[LinkEvent(0.0, (0,), 2)])
    with pytest.raises(FabricError, match="link id 999"):
        run_dynamic(fab, tr, events=[LinkEvent(0.0, (999,))])
    with pytest.raises(FabricError, match="unknown vertex"):
        run_dynamic(fab, tr, events=[LinkEvent.cable(0.0, "leaf0", "spine9")])


def test_a_policy_that_breaks_the_rules_is_caught():
    fab = leaf_spine(2, 1, 2)

    class Dead(DynamicPolicy):
        name = "test-dead"

        def assign(self, flows, obs):
            return [PathChoice(int(f), (0,)) for f in flows]  # path 0 is pair (0, 1)'s ...

        def on_epoch(self, obs):
            return [
                PathChoice(int(f), (int(p),))
                for f, p in zip(*obs.single_path_flows()[:2], strict=True)
            ] * 2

    with pytest.raises(PlanError, match=r"test-dead.*flow 0 twice"):
        run_dynamic(fab, one_flow(10**6), Dead)

    class Foreign(DynamicPolicy):
        name = "test-foreign"

        def assign(self, flows, obs):
            return [PathChoice(int(f), (999,)) for f in flows]

    with pytest.raises(PlanError, match="need distinct candidate paths"):
        run_dynamic(fab, one_flow(10**6), Foreign)


def test_a_pause_delays_completion_by_its_length():
    # a custom policy (a DynamicPolicy subclass, no registration) moves the lone
    # flow to the other, equal spine at epoch 10 after a 37 us pause: the
    # flow idles exactly that long
    fab = leaf_spine(2, 1, 2, spine_Bps=C)

    class Move(DynamicPolicy):
        name = "test-move"
        options: ClassVar[dict[str, Any]] = {"pause_s": 0.0}

        def assign(self, flows, obs):
            return self.ecmp_choice(flows, obs)

        def on_epoch(self, obs):
            if obs.epoch != 10:
                return []
            f, p, _ = obs.single_path_flows()
            other = [q for q in self.ctx.flow_paths(int(f[0]), obs.path_alive) if q != p[0]]
            return [PathChoice(int(f[0]), (int(other[0]),), delay_s=self.opts["pause_s"])]

    base = run_dynamic(fab, one_flow(12_500_000), "ecmp", queue_target_bytes=0.0)
    moved = run_dynamic(fab, one_flow(12_500_000), Move, queue_target_bytes=0.0, pause_s=37e-6)
    assert moved.switches[0] == 1
    assert moved.fct_s[0] - base.fct_s[0] == pytest.approx(37e-6, rel=1e-6)


# ------------------------------------------------------------------ traces
def test_trace_is_deterministic_and_hits_the_load():
    a = poisson_trace(32, load=0.3, host_Bps=C, num_flows=5000, seed=11)
    b = poisson_trace(32, load=0.3, host_Bps=C, num_flows=5000, seed=11)
    for x, y in ((a.start_s, b.start_s), (a.src, b.src), (a.size_bytes, b.size_bytes)):
        np.testing.assert_array_equal(x, y)
    # heavy tailed: a small share of flows carries most bytes
    s = np.sort(a.size_bytes)[::-1]
    assert s[: len(s) // 10].sum() > 0.6 * s.sum()
    offered = a.total_bytes / a.duration_s / (32 * C)
    assert offered == pytest.approx(0.3, rel=0.15)
    counts = np.bincount(a.src, minlength=32)
    assert counts.min() > 0.7 * counts.mean()


def test_websearch_mean_matches_the_cdf():
    pts = [
        (1e3, 0.0),
        (10e3, 0.15),
        (20e3, 0.2),
        (30e3, 0.3),
        (50e3, 0.4),
        (80e3, 0.53),
        (200e3, 0.6),
        (1e6, 0.7),
        (2e6, 0.8),
        (5e6, 0.9),
        (10e6, 0.97),
        (30e6, 1.0),
    ]
    mean = sum((p1 - p0) * (x0 + x1) / 2 for (x0, p0), (x1, p1) in itertools.pairwise(pts))
    s = websearch_sizes(200_000, seed=3)
    assert s.mean() == pytest.approx(mean, rel=0.03)
    assert np.mean(s <= 200e3) == pytest.approx(0.6, abs=0.01)


def test_trace_validation_names_the_bad_flow():
    with pytest.raises(WorkloadError, match=r"flow 1 starts at 0.5, before flow 0"):
        FlowTrace.from_flows([(1.0, 0, 1, 5), (0.5, 1, 0, 5)], num_ranks=2)
    with pytest.raises(WorkloadError, match="flow 0: dst = 7 is not a rank"):
        FlowTrace.from_flows([(0.0, 0, 7, 5)], num_ranks=2)
    with pytest.raises(WorkloadError, match="flow 0 has 0 bytes"):
        FlowTrace.from_flows([(0.0, 0, 1, 0)], num_ranks=2)
    with pytest.raises(WorkloadError, match="load must lie in"):
        poisson_trace(4, load=1.5, host_Bps=C, num_flows=3)
    with pytest.raises(WorkloadError, match="sizes must be one of"):
        poisson_trace(4, load=0.5, host_Bps=C, num_flows=3, sizes="hadoop")


# ------------------------------------------------------------------ fabric
def test_leaf_spine_paths_are_one_per_spine_across_leaves():
    fab = leaf_spine(3, 2, 4)
    ps = candidate_paths(fab, ECMP_KINDS)
    assert fab.num_ranks == 6
    cross = ps.pair_paths(0, 2)
    assert len(cross) == 4 and set(ps.via[list(cross)].tolist()) == {0, 1, 2, 3}
    assert all(ps.length[p] == 6 for p in cross)
    same = ps.pair_paths(0, 1)
    assert len(same) == 1 and ps.rail_role(same[0]) == "matched" and ps.length[same[0]] == 4
    # default spine links make the fabric non-blocking: 2 hosts x 12.5 / 4 spines
    assert fab.capacity_Bps[fab.link_id("leaf0", "spine0")] == pytest.approx(2 * C / 4)
    with pytest.raises(FabricError, match="spines must be an integer >= 1"):
        leaf_spine(2, 2, 0)
