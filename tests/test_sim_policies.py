"""Dynamic policies: each decision rule checked on hand-built observations, then end to end.

A policy sees an :class:`~pathweave.sim.policies.Observation`; the tests
build observations whose RTTs and loads are set by hand (queue delays on
chosen links), so the expected decision follows from the policy's stated
rule: Hopper's 1.5x probe threshold and 0.8x switch ratio, FlowBender's
patience, nimble-online's gain threshold.
"""

from __future__ import annotations

import numpy as np
import pytest

from pathweave import plan as pw_plan
from pathweave.errors import PlanError
from pathweave.fabric import candidate_paths, preset
from pathweave.fabric.builders import leaf_spine
from pathweave.fabric.paths import DEFAULT_KINDS
from pathweave.sim import LinkEvent, run_dynamic
from pathweave.sim.policies import (
    Observation,
    PathChoice,
    PolicyContext,
    ecmp_hash,
    make,
    policies,
    policy_info,
)
from pathweave.traffic.trace import FlowTrace

#: The dynamic simulator's rules (run_dynamic's default): every spine path.
ECMP_KINDS = (*DEFAULT_KINDS, "ecmp")

C = 12.5e9


def context(fab, flows, seed=0):
    tr = FlowTrace.from_flows(flows, num_ranks=fab.num_ranks)
    return PolicyContext.build(fab, candidate_paths(fab, ECMP_KINDS), tr, seed=seed)


def observe(ctx, *, queue_s=None, subs=(), epoch=1, alive=None, pending=None):
    """An observation with per-link queue delays and running subflows (flow, path, rem, rate)."""
    fab, ps = ctx.fabric, ctx.paths
    rows = sorted(subs)
    arr = np.array(rows, dtype=float).reshape(-1, 4)
    sub_path = arr[:, 1].astype(np.int64)
    rates = arr[:, 3]
    own = np.zeros(fab.num_links)
    for p, r in zip(sub_path, rates, strict=True):
        own[ps.path_links(int(p))] += r
    return Observation(
        time_s=epoch * ctx.epoch_s,
        epoch=epoch,
        paths=ps,
        path_alive=np.ones(ps.num_paths, bool) if alive is None else alive,
        base_rtt_s=ctx.base_rtt_s,
        link_queue_s=np.zeros(fab.num_links) if queue_s is None else queue_s,
        link_capacity_Bps=fab.capacity_Bps.copy(),
        link_load_Bps=own,
        sub_flow=arr[:, 0].astype(np.int64),
        sub_path=sub_path,
        sub_remaining_bytes=arr[:, 2],
        sub_rate_Bps=rates,
        sub_pending=np.zeros(len(rows), bool) if pending is None else np.asarray(pending),
    )


def slowed(fab, path_link, ctx, delay_s, queue_s=None):
    """Queue delays with ``delay_s`` added on one link."""
    q = np.zeros(fab.num_links) if queue_s is None else queue_s.copy()
    q[path_link] += delay_s
    return q


# ------------------------------------------------------------------ registry
def test_registry_and_option_errors():
    assert policies() == ["ecmp", "flowbender", "hopper", "nimble-online", "spray"]
    fab = leaf_spine(2, 1, 2)
    ctx = context(fab, [(0.0, 0, 1, 10)])
    assert isinstance(make("hopper", ctx), policy_info("hopper"))
    with pytest.raises(PlanError, match="unknown dynamic policy 'rps'"):
        policy_info("rps")
    with pytest.raises(PlanError, match=r"hopper option probes must be in \[1, 64\], got 0"):
        make("hopper", ctx, probes=0)
    with pytest.raises(TypeError, match="hopper option probes must be a real number, got str '2'"):
        make("hopper", ctx, probes="2")
    with pytest.raises(PlanError, match=r"'flowbender' got unknown option 'gain'.*patience_epochs"):
        make("flowbender", ctx, gain=1)
    with pytest.raises(PlanError, match=r"option min_gain must be in \[0.0, 1.0\], got 2"):
        make("nimble-online", ctx, min_gain=2)
    # its re-plans' options are mwu's: mwu's defaults and mwu's checks
    assert {k: v for k, v in policy_info("nimble-online").options.items()
            if k in pw_plan.policy_info("mwu").options} == pw_plan.policy_info("mwu").options
    with pytest.raises(PlanError, match=r"nimble-online \(its mwu re-plans\): mwu option "
                                        r"fraction must be in \(0.0, 1.0\], got 1.5"):
        make("nimble-online", ctx, fraction=1.5)
    with pytest.raises(TypeError, match="policy must be a name"):
        make(3, ctx)


# ------------------------------------------------------------------ ecmp
def test_ecmp_hash_is_deterministic_and_spreads_evenly():
    fab = leaf_spine(2, 1, 4)
    n = 4000
    ctx = context(fab, [(0.0, 0, 1, 10)] * n)
    pol = make("ecmp", ctx)
    flows = np.arange(n)
    obs = observe(ctx)
    a = [c.paths[0] for c in pol.assign(flows, obs)]
    b = [c.paths[0] for c in pol.assign(flows, obs)]
    assert a == b
    counts = np.bincount(np.array(a) - min(a), minlength=4)
    assert counts.size == 4
    # binomial(4000, 1/4): sd 27, so +-100 is a 3.7-sigma band
    assert np.all(np.abs(counts - n / 4) < 100)
    # another seed salts the hash: a different assignment
    other = make("ecmp", context(fab, [(0.0, 0, 1, 10)] * n, seed=1))
    assert [c.paths[0] for c in other.assign(flows, obs)] != a
    # the raw hash: same inputs, same value; flows differ
    assert np.array_equal(ecmp_hash([1, 2], [3, 4], [5, 6]), ecmp_hash([1, 2], [3, 4], [5, 6]))


def test_ecmp_hashes_over_the_shortest_paths_and_never_moves():
    fab = preset("h100-2x4")  # pair (0, 1): a direct NVLink and two 2-hop relays
    ctx = context(fab, [(0.0, 0, 1, 10)] * 50)
    pol = make("ecmp", ctx)
    obs = observe(ctx)
    direct = ctx.pair_paths(0, 1)[0]
    assert {c.paths for c in pol.assign(np.arange(50), obs)} == {(int(direct),)}
    # with the direct link dead, the relays are the equal-cost group
    alive = np.ones(ctx.paths.num_paths, bool)
    alive[direct] = False
    got = {c.paths[0] for c in pol.assign(np.arange(50), observe(ctx, alive=alive))}
    assert got == set(ctx.pair_paths(0, 1)[1:].tolist())
    q = np.full(fab.num_links, 1e-3)  # heavy congestion everywhere: still no move
    assert pol.on_epoch(observe(ctx, queue_s=q, subs=[(0, direct, 1e6, 1e9)])) == []


# ------------------------------------------------------------------ spray
def test_spray_splits_equally_over_all_paths():
    fab = leaf_spine(2, 1, 4)
    ctx = context(fab, [(0.0, 0, 1, 4_000_000)])
    (c,) = make("spray", ctx).assign(np.array([0]), observe(ctx))
    assert c.paths == tuple(ctx.pair_paths(0, 1).tolist())
    assert c.weights == (0.25,) * 4
    r = run_dynamic(fab, ctx.trace, "spray")
    ups = [fab.link_id("leaf0", f"spine{k}") for k in range(4)]
    np.testing.assert_allclose(r.link_in_bytes[ups], 1_000_000, rtol=1e-12)


def test_spray_waits_for_its_slowest_path():
    # a quarter of the bytes on a spine at 10 % speed: that share sets the FCT
    fab = leaf_spine(2, 1, 4)
    slow = fab.with_links({("leaf0", "spine3"): 0.1, ("spine3", "leaf1"): 0.1})
    size = 4_000_000
    r = run_dynamic(
        slow,
        FlowTrace.from_flows([(0.0, 0, 1, size)], num_ranks=2),
        "spray",
        queue_target_bytes=0.0,
    )
    slow_Bps = float(slow.capacity_Bps[slow.link_id("leaf0", "spine3")])
    assert r.fct_s[0] >= size / 4 / slow_Bps
    assert r.fct_s[0] == pytest.approx(size / 4 / slow_Bps + 6e-6, rel=0.05)
    assert r.ooo_bytes[0] > 0  # the fast paths overtake the slow one


# ------------------------------------------------------------------ flowbender
def test_flowbender_rehashes_only_after_the_signal_stays_high():
    fab = leaf_spine(2, 1, 4)
    ctx = context(fab, [(0.0, 0, 1, 10**7)] * 20)
    pol = make("flowbender", ctx, patience_epochs=2)
    p0 = int(ctx.pair_paths(0, 1)[0])
    subs = [(f, p0, 1e6, 1e9) for f in range(20)]
    base = ctx.base_rtt_s[p0]
    hot = slowed(fab, ctx.paths.path_links(p0)[2], ctx, 1.0 * base)  # RTT = 2x base
    cool = slowed(fab, ctx.paths.path_links(p0)[2], ctx, 0.4 * base)  # RTT = 1.4x base
    assert pol.on_epoch(observe(ctx, queue_s=hot, subs=subs)) == []
    assert pol.on_epoch(observe(ctx, queue_s=cool, subs=subs)) == []  # streak broken
    assert pol.on_epoch(observe(ctx, queue_s=hot, subs=subs)) == []
    assert pol.stats()["rehashes"] == 0
    moves = pol.on_epoch(observe(ctx, queue_s=hot, subs=subs))  # second high epoch in a row
    assert pol.stats()["rehashes"] == 20
    # a random re-hash: some land on the same path (no move), the rest elsewhere
    assert 0 < len(moves) < 20 and all(c.paths[0] != p0 and c.delay_s == 0 for c in moves)
    assert pol.stats()["moves"] == len(moves)
    # counters restart after a re-hash
    assert pol.on_epoch(observe(ctx, queue_s=hot, subs=subs)) == []


# ------------------------------------------------------------------ hopper
@pytest.fixture()
def hopper_case():
    fab = leaf_spine(2, 1, 4)
    ctx = context(fab, [(0.0, 0, 1, 10**7)])
    paths = ctx.pair_paths(0, 1)
    cur = int(paths[0])
    return fab, ctx, cur, [int(p) for p in paths[1:]]


def _queues(fab, ctx, delays):
    """Queue delays putting ``delays[path]`` of queueing on each path's leaf->spine hop."""
    q = np.zeros(fab.num_links)
    for p, d in delays.items():
        q[ctx.paths.path_links(p)[2]] = d
    return q


def test_hopper_switches_on_a_clear_win_after_the_rtt_difference(hopper_case):
    fab, ctx, cur, alts = hopper_case
    base = ctx.base_rtt_s[cur]  # 12 us
    pol = make("hopper", ctx)
    # current RTT 3x base; alternatives 1.1x base (clear win: < 0.8 x current)
    q = _queues(fab, ctx, {cur: 2.0 * base, **{p: 0.1 * base for p in alts}})
    (c,) = pol.on_epoch(observe(ctx, queue_s=q, subs=[(0, cur, 1e6, 1e9)]))
    assert c.paths[0] in alts and c.weights == (1.0,)
    assert c.delay_s == pytest.approx(3.0 * base - 1.1 * base)
    assert pol.stats() == {"probe_rounds": 1, "probes": 2, "switches": 1}


def test_hopper_keeps_its_path_for_a_small_win(hopper_case):
    fab, ctx, cur, alts = hopper_case
    base = ctx.base_rtt_s[cur]
    pol = make("hopper", ctx)
    # current 3x base, best alternative 2.5x base: 2.5 > 0.8 * 3 = 2.4, no switch
    q = _queues(fab, ctx, {cur: 2.0 * base, **{p: 1.5 * base for p in alts}})
    assert pol.on_epoch(observe(ctx, queue_s=q, subs=[(0, cur, 1e6, 1e9)])) == []
    assert pol.stats()["probe_rounds"] == 1 and pol.stats()["switches"] == 0


def test_hopper_does_not_probe_below_the_threshold(hopper_case):
    fab, ctx, cur, _alts = hopper_case
    base = ctx.base_rtt_s[cur]
    pol = make("hopper", ctx)
    q = _queues(fab, ctx, {cur: 0.45 * base})  # 1.45x base < 1.5x
    assert pol.on_epoch(observe(ctx, queue_s=q, subs=[(0, cur, 1e6, 1e9)])) == []
    assert pol.stats()["probe_rounds"] == 0


def test_hopper_averages_rtt_before_it_reacts(hopper_case):
    fab, ctx, cur, _alts = hopper_case
    base = ctx.base_rtt_s[cur]
    pol = make("hopper", ctx, gain=0.5)
    calm = _queues(fab, ctx, {cur: 0.0})
    spike = _queues(fab, ctx, {cur: 1.4 * base})  # instantaneous 2.4x base
    sub = [(0, cur, 1e6, 1e9)]
    pol.on_epoch(observe(ctx, queue_s=calm, subs=sub))  # average 1.0x
    (c,) = pol.on_epoch(observe(ctx, queue_s=spike, subs=sub))  # average 1.7x: probe, switch
    # the delay is the averaged RTT's lead over the probe, not the spike's
    assert c.delay_s == pytest.approx((1.7 - 1.0) * base)
    pol2 = make("hopper", ctx, gain=0.25)
    pol2.on_epoch(observe(ctx, queue_s=calm, subs=sub))
    pol2.on_epoch(observe(ctx, queue_s=spike, subs=sub))  # average 1.35x: no probe yet
    assert pol2.stats()["probe_rounds"] == 0


def test_hopper_skips_paused_flows_and_can_switch_at_once(hopper_case):
    fab, ctx, cur, _alts = hopper_case
    base = ctx.base_rtt_s[cur]
    q = _queues(fab, ctx, {cur: 2.0 * base})
    sub = [(0, cur, 1e6, 1e9)]
    pol = make("hopper", ctx)
    assert pol.on_epoch(observe(ctx, queue_s=q, subs=sub, pending=[True])) == []
    (c,) = make("hopper", ctx, delay_switch=False).on_epoch(
        observe(ctx, queue_s=q, subs=sub)
    )
    assert c.delay_s == 0.0


def _slow_spine_flow(fab, ps, slow_spine: int) -> int:
    """A flow id that ECMP (seed 0) hashes onto the slow spine for pair (0, 1)."""
    paths = ps.pair_paths(0, 1)
    for f in range(1000):
        h = int(ecmp_hash(0, 1, f, 0)[0])
        if ps.via[paths[h % len(paths)]] == slow_spine:
            return f
    raise AssertionError("no flow hashes onto the slow spine")


def test_hopper_moves_a_flow_off_a_slow_spine_end_to_end():
    fab = leaf_spine(2, 1, 4, spine_Bps=C)
    fab = fab.with_links({("leaf0", "spine3"): 0.1, ("spine3", "leaf1"): 0.1})
    ps = candidate_paths(fab, ECMP_KINDS)
    f = _slow_spine_flow(fab, ps, 3)
    flows = [(0.0, 1, 0, 1000)] * f + [(0.0, 0, 1, 12_500_000)]
    tr = FlowTrace.from_flows(flows, num_ranks=2)
    ecmp = run_dynamic(fab, tr, "ecmp")
    hop = run_dynamic(fab, tr, "hopper")
    hop_now = run_dynamic(fab, tr, "hopper", delay_switch=False)
    assert ps.via[ecmp.first_path[f]] == 3 and hop.switches[f] >= 1
    # the whole flow on the slow spine takes 10 ms; hopper finishes near line rate
    assert ecmp.fct_s[f] > 9e-3 and hop.fct_s[f] < 1.3e-3
    # delaying the switch by the RTT difference avoids most reordering
    assert hop_now.ooo_bytes[f] > 0
    assert hop.ooo_bytes[f] < 0.5 * hop_now.ooo_bytes[f]


# ------------------------------------------------------------------ nimble-online
@pytest.fixture()
def nimble_case():
    fab = leaf_spine(2, 1, 2)  # spines at 6.25 GB/s, the NIC at 12.5
    ctx = context(fab, [(0.0, 0, 1, 100_000_000)])
    p0, p1 = (int(p) for p in ctx.pair_paths(0, 1))
    return fab, ctx, p0, p1


def test_nimble_online_adopts_a_plan_for_a_clear_gain(nimble_case):
    _fab, ctx, p0, p1 = nimble_case
    pol = make("nimble-online", ctx, replan_epochs=1)
    # 100 MB all on spine 0: 16 ms there; split evenly it is 8 ms (the NIC's bound)
    (c,) = pol.on_epoch(observe(ctx, subs=[(0, p0, 1e8, 6.25e9)]))
    assert set(c.paths) == {p0, p1}
    np.testing.assert_allclose(c.weights, 0.5, atol=0.02)
    assert pol.stats()["adopted"] == 1


@pytest.mark.parametrize(("min_gain", "adopt"), [(0.1, False), (0.05, True)])
def test_nimble_online_hysteresis_keeps_the_plan_for_a_small_gain(nimble_case, min_gain, adopt):
    _fab, ctx, p0, p1 = nimble_case
    pol = make("nimble-online", ctx, replan_epochs=1, min_gain=min_gain)
    # a 45/55 split: 8.8 ms on spine 1 against the even plan's 8 ms, a 9.1 % gain
    obs = observe(ctx, subs=[(0, p0, 4.5e7, 5e9), (0, p1, 5.5e7, 6e9)])
    got = pol.on_epoch(obs)
    assert bool(got) == adopt
    assert pol.stats()["kept"] == (0 if adopt else 1)


def test_nimble_online_replans_only_every_few_epochs(nimble_case):
    _fab, ctx, p0, _p1 = nimble_case
    pol = make("nimble-online", ctx, replan_epochs=4)
    assert pol.on_epoch(observe(ctx, subs=[(0, p0, 1e8, 6.25e9)], epoch=3)) == []
    assert pol.stats()["replans"] == 0
    assert pol.on_epoch(observe(ctx, subs=[(0, p0, 1e8, 6.25e9)], epoch=4))


def test_nimble_online_places_new_flows_by_available_capacity():
    # background eats 3/4 of spine 0: a new elephant goes mostly over spine 1
    fab = leaf_spine(2, 1, 2)
    ctx = context(fab, [(0.0, 0, 1, 64_000_000)])
    p0, p1 = (int(p) for p in ctx.pair_paths(0, 1))
    obs = observe(ctx)
    load = obs.link_load_Bps.copy()
    load[ctx.paths.path_links(p0)[2]] = 0.75 * 6.25e9
    obs = Observation(**{**obs.__dict__, "link_load_Bps": load, "_single": {}})
    (c,) = make("nimble-online", ctx).assign(np.array([0]), obs)
    w = dict(zip(c.paths, c.weights, strict=True))
    # available 1.5625 and 6.25 GB/s: the balanced split puts 20 % on spine 0
    assert w.get(p0, 0.0) == pytest.approx(0.2, abs=0.04)
    assert w[p1] == pytest.approx(0.8, abs=0.04)


# ------------------------------------------------------------------ interface
def test_path_choice_defaults_to_one_path_no_pause():
    c = PathChoice(3, (9,))
    assert (c.weights, c.delay_s) == ((1.0,), 0.0)


# ------------------------------------------------------------------ the figure
def test_hopper_figure_ranks_the_policies_on_a_small_fabric(tmp_path):
    from pathweave.bench.paper import hopper as fig
    from pathweave.bench.paper._common import write_csv

    rows = fig.measure((0.5,), hosts_per_leaf=2, num_flows=400)
    by = {r["policy"]: r for r in rows}
    assert set(by) == set(fig.POLICIES) and all(r["finished"] == 400 for r in rows)
    # the figure's claim: hopper beats ECMP and FlowBender on the asymmetric fabric
    assert by["hopper"]["avg_fct_us"] < by["flowbender"]["avg_fct_us"] < by["ecmp"]["avg_fct_us"]
    assert by["ecmp"]["switches_per_flow"] == 0 and by["ecmp"]["ooo_flows_pct"] == 0
    comps, _ = fig.summarize(rows)
    gain = next(c for c in comps if c.label.startswith("hopper avg FCT below flowbender"))
    want = 100 * (1 - by["hopper"]["avg_fct_us"] / by["flowbender"]["avg_fct_us"])
    assert gain.ours == pytest.approx(want) and gain.paper == fig.PAPER_AVG_GAIN_PCT
    png = fig.plot(rows, tmp_path / "hopper.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert write_csv(tmp_path / "hopper.csv", rows).read_text().startswith("load,policy,")


# ------------------------------------------------------------------ stranded flows
@pytest.mark.parametrize("name", policies())
def test_a_flow_stranded_on_its_only_dead_path_waits_for_the_restore(name):
    # One spine: failing its cables strands the flow on a dead path with no
    # alternative. No policy may try to move it (flowbender used to draw a
    # random index from an empty candidate list); it resumes on the restore.
    fab = leaf_spine(2, 1, 1)
    tr = FlowTrace.from_flows([(0.0, 0, 1, 2_000_000)], num_ranks=2)
    events = [LinkEvent.cable(20e-6, "leaf0", "spine0"),
              LinkEvent.cable(300e-6, "leaf0", "spine0", 1.0)]
    options = {"patience_epochs": 1, "threshold": 1.0} if name == "flowbender" else {}
    r = run_dynamic(fab, tr, name, events=events, **options)
    assert r.finished == 1 and r.info["stalled_flows"] == 1
    assert r.finish_s[0] > 300e-6
    assert r.sent_bytes[0] == pytest.approx(2_000_000 + r.resent_bytes[0])
