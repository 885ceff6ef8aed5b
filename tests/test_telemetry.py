"""Link telemetry: tomography of synthetic stream timings, the estimator, Hopper's rules."""

import numpy as np
import pytest

import pathweave as pw
from pathweave.fabric import candidate_paths
from pathweave.plan import make
from pathweave.runtime.orchestrator import PLANE_WORDS
from pathweave.runtime.telemetry import (
    LinkEstimator,
    SwitchPolicy,
    adapt_auto,
    decode_times,
    encode_times,
    link_ratios,
    stream_links,
)
from pathweave.traffic import parse_workload

FAB = pw.fabric.preset("h100-2x4")
PS = candidate_paths(FAB)
N = FAB.num_ranks


def _case(policy: str, true_ratio: np.ndarray, noise: float = 0.0, seed: int = 0,
          slow_host: tuple[int, float] | None = None):
    """A real plan, and fluid stream times on capacities ``true_ratio * nominal``.

    ``slow_host = (rank, f)``: that rank is slow as a whole (CPU-bound): every
    stream into it ends no earlier than ``f`` x the latest link time into it.
    """
    d = np.asarray(parse_workload("hotspot:0.6", N, bytes_per_rank=4 << 20), dtype=np.int64)
    np.fill_diagonal(d, 0)
    plan = make(FAB, d, policy, paths=PS)
    keep = plan.flow_bytes > 0
    fp = plan.flow_path[keep]
    rows = PS.links[fp]
    w = np.broadcast_to(plan.flow_bytes[keep][:, None].astype(float), rows.shape)
    lb = np.bincount(rows[rows >= 0], weights=w[rows >= 0], minlength=FAB.num_links)
    link_s = lb / (FAB.capacity_Bps * true_ratio)
    streams = stream_links(PS, fp, N)
    rng = np.random.default_rng(seed)
    # A stream ends when the slowest link it crosses has carried all its bytes.
    ends = {k: float(link_s[ls].max()) for k, ls in streams.items()}
    if slow_host is not None:
        host, f = slow_host
        floor = f * max(t for k, t in ends.items() if k % N == host)
        ends = {k: max(t, floor) if k % N == host else t for k, t in ends.items()}
    times = {k: t * (1 + noise * rng.random()) for k, t in ends.items()}
    return streams, times, lb


def _rail0_links() -> np.ndarray:
    v = FAB.vertex_id("rail0")
    return np.flatnonzero((FAB.link_src == v) | (FAB.link_dst == v))


@pytest.mark.parametrize("policy", pw.plan.policies(executable_only=True))
@pytest.mark.parametrize("slow_host", [None, (0, 1.0)], ids=["", "hot-receiver-cpu-bound"])
def test_slow_rail_is_found_and_nothing_else(policy, slow_host):
    true = np.ones(FAB.num_links)
    rail0 = _rail0_links()
    true[rail0] = 0.4
    # The hot receiver 0 CPU-bound as well: no stream into it ends before the
    # slowest one into it would on the links alone (rail0's streams, 2.5x late).
    streams, times, lb = _case(policy, true, noise=0.02, slow_host=slow_host)
    r, lo, *_ = link_ratios(streams, times, lb, FAB.capacity_Bps, num_ranks=N)
    seen_slow = np.flatnonzero(np.isfinite(r))
    assert set(seen_slow.tolist()) <= set(rail0.tolist()) and seen_slow.size
    assert np.allclose(r[seen_slow], 0.4, atol=0.03)
    # Every other observed link is only bounded from below, never above its truth
    # (up to the 2 % noise: times are scaled by a quantile of noisy streams), and
    # the links that are some stream's bottleneck are found at full speed.
    seen = np.isfinite(lo)
    assert (lo[seen] <= true[seen] * 1.02).all() and (lo[seen] > 0.97).any()


@pytest.mark.parametrize("policy", pw.plan.policies(executable_only=True))
def test_a_uniformly_slow_receiver_blames_no_link(policy):
    # Rank 0, the hot receiver, 3x slower than its links as a whole: every stream
    # into it ends at about the same time. Only with ranks as resources is no link
    # blamed; without them its links into rank 0 look slow.
    streams, times, lb = _case(policy, np.ones(FAB.num_links), noise=0.05, seed=2,
                               slow_host=(0, 3.0))
    r, lo, *_ = link_ratios(streams, times, lb, FAB.capacity_Bps, num_ranks=N)
    assert np.isnan(r).all() and np.isfinite(lo).any()
    r_blind, *_ = link_ratios(streams, times, lb, FAB.capacity_Bps)
    into0 = FAB.link_dst == FAB.vertex_id("n0.gpu0")
    assert np.isfinite(r_blind).any() and np.isfinite(r_blind[into0]).any()


def test_uniformly_slow_machine_sees_no_change():
    # The whole machine 20x slower than the fabric model: relative ratios stay 1.
    streams, times, lb = _case("mwu", np.full(FAB.num_links, 0.05), noise=0.05, seed=3)
    r, lo, *_ = link_ratios(streams, times, lb, FAB.capacity_Bps)
    assert np.isnan(r).all() and np.isfinite(lo).any() and np.nanmax(lo) == 1.0


def test_time_words_round_trip_and_mark_missing():
    t = np.array([np.nan, 1e-7, 0.5, 12.25])
    back = decode_times(encode_times(t))
    assert np.isnan(back[0]) and back[1] == 1e-6 and back[2:].tolist() == [0.5, 12.25]


def test_estimator_takes_a_floor_only_above_its_estimate():
    est = LinkEstimator(1, window=3)
    est.update(np.array([0.4]))
    est.update(np.array([np.nan]), np.array([0.3]))   # a link with slack: says nothing
    assert est.ratio_q().tolist() == [26]
    for _ in range(2):                                 # proved faster: the estimate follows
        est.update(np.array([np.nan]), np.array([0.9]))
    assert est.ratio_q().tolist() == [58]


def test_estimator_median_quantised_and_expires():
    est = LinkEstimator(3, window=5, levels=64, ttl=2)
    for r in (0.4, 0.41, 0.39, 0.01, 0.4):   # one outlier among five
        est.update(np.array([r, 1.0, np.nan]))
    q = est.ratio_q()
    assert q.tolist() == [round(0.4 * 64), 64, 64]
    with pytest.raises(ValueError):   # kept between updates: callers cannot change it
        q[0] = 1
    assert est.ratio_q().tolist() == [26, 64, 64]
    assert est.capacity_Bps(np.array([64.0, 64.0, 64.0])).tolist() == [26.0, 64.0, 64.0]
    for _ in range(3):                         # unobserved past ttl: back to nominal
        est.update(np.array([np.nan, 1.0, np.nan]))
    assert est.ratio_q().tolist() == [64, 64, 64]


def test_switch_rule_settles_only_confident_moves():
    pol = SwitchPolicy()
    planned = np.full(8, 64)
    rng = np.random.default_rng(1)
    for _ in range(200):  # +-15 % noise on a steady fabric, windows of 1 to 5
        w = 1 - 0.15 * rng.random((int(rng.integers(1, 6)), 8))
        assert (pol.settle(w, planned, 64) == planned).all()
    # Link 2 at 0.4 in two of three samples (median 0.4 = 25.6 levels); link 5 in one.
    w = np.ones((3, 8))
    w[1:, 2] = 0.4
    w[0, 5] = 0.4
    slow = pol.settle(w, planned, 64)
    assert slow.tolist() == [64, 64, 26, 64, 64, 64, 64, 64]
    assert (pol.settle(w, slow, 64) == slow).all()          # the plan made on it stays
    w[:, 2] = [1.0, 1.0, 0.4]                               # recovered in two of three
    assert pol.settle(w, slow, 64).tolist() == [64] * 8     # try it again
    w[:, 2] = [1.0, 0.4, np.nan]                            # one each way: no majority
    assert (pol.settle(w, slow, 64) == slow).all()
    w[:, 2] = np.nan                                        # expired: back at nominal
    assert pol.settle(w, slow, 64).tolist() == [64] * 8


def test_a_lone_observation_moves_only_far_beyond_its_noise():
    """Windows of one observation with known noise, against the bound worked by hand.

    ``SwitchPolicy()``: 1.5-fold, ``single_z = 8``, noise floored at 0.02.
    0.6 of nominal is ``|log 0.6| = 0.511`` from it: beyond ``8 * 0.06 = 0.48``
    (moves, to ``round(0.6 * 64) = 38``), short of ``8 * 0.065 = 0.52``.
    0.7 is not 1.5-fold away whatever the noise; with no noise the floor
    (``8 * 0.02 = 0.16``) applies. A window of two (nominal, then 0.55)
    waits for the majority, and unknown noise moves nothing alone.
    """
    pol, nominal = SwitchPolicy(), np.array([64])

    def one(x, noise, planned=nominal):
        return pol.settle(np.array([[x]]), planned, 64, np.array([[noise]])).tolist()

    assert one(0.6, 0.06) == [38] and one(0.6, 0.065) == [64]
    assert one(0.7, 0.0) == [64] and one(0.6, 0.0) == [38] and one(0.6, np.inf) == [64]
    assert one(1.0, 0.02, planned=np.array([32])) == [64]     # proved back at nominal
    assert one(0.5, 0.02, planned=np.array([32])) == [32]     # where the plan has it
    two = np.array([[1.0], [0.55]])
    assert pol.settle(two, nominal, 64, np.full((2, 1), 0.01)).tolist() == [64]
    assert pol.settle(np.array([[0.55]]), nominal, 64).tolist() == [64]


def test_a_sequence_of_observations_switches_when_its_evidence_suffices():
    """An estimator fed calls of known noise: when the policy first moves the link.

    Quiet calls (noise 0.03): 0.55 is 20 noise scales out, the first call
    decides. Noisy calls (0.15, 4 scales): the second agreeing call does.
    Noisy calls mostly at nominal (0.55, 1.0, 1.0, 0.55, 1.0): never.
    """
    pol = SwitchPolicy()

    def first_move(seq, noise):
        est, planned = LinkEstimator(1), np.array([64])
        for call, x in enumerate(seq):
            est.update(np.array([x]), noise=np.array([noise]))
            q = pol.settle(est.samples, planned, est.levels, est.noise)
            if (q != planned).any():
                return call, q.tolist()
        return None

    assert first_move([0.55, 0.55], 0.03) == (0, [35])
    assert first_move([0.55, 0.55], 0.15) == (1, [35])
    assert first_move([0.55, 1.0, 1.0, 0.55, 1.0], 0.15) is None


def test_floors_credit_the_typical_streams_lateness_only_up_to_credit():
    """A call whose typical stream was 2x late (a paced plan's lock-step): floors by hand.

    Links 0-5, 1 s busy each, one stream each of 2.0-2.2 s; link 6, 0.5 s
    busy, one stream of 1.0 s. The reference (``reference_quantile=0``) is
    2x, so all are on time. A floor is the link's busy time over its
    stream's, the stream's divided by the lateness credited,
    ``min(2, credit)``: fully credited, links 0-5 read ``2 / 2.0 .. 2 / 2.2``
    and link 6 ``min(1, 0.5 * 2 / 1.0) = 1``; credited 1x (the blind
    plan's reference), ``1 / 2.0 .. 1 / 2.2`` and 0.5; credited 1.6x, 0.8.
    """
    keys = {k: np.array([k]) for k in range(7)}
    took = np.array([2.0, 2.0, 2.04, 2.08, 2.12, 2.2, 1.0])
    busy = np.array([1.0] * 6 + [0.5])
    for credit, link6 in ((np.inf, 1.0), (2.0, 1.0), (1.0, 0.5), (1.6, 0.8)):
        r, lo, _, ref = link_ratios(keys, dict(enumerate(took)), busy * 10.0,
                                    np.full(7, 10.0), reference_quantile=0.0, credit=credit)
        assert ref == 2.0 and np.isnan(r).all()
        c = min(2.0, credit)
        assert lo[:6] == pytest.approx(c / took[:6]) and lo[6] == pytest.approx(link6), credit


@pytest.mark.parametrize("policy", pw.plan.policies(executable_only=True))
def test_an_adapted_plans_late_streams_do_not_move_the_plan_back(policy, monkeypatch):
    """rail0's links at 0.4; on the adapted plan every stream off rail0 is 1.7x late.

    As in the emulator, where the adapted plan's typical stream ended
    1.3-2.0x after its busiest link's time and rail0's at theirs.
    Noise-free, so the first call settles rail0 alone. Credited with the
    typical stream's lateness (``CREDIT`` unbounded, the rule before), a
    floor of rail0's links reads ``0.4 * 1.7 = 0.68``, 1.5-fold above the
    plan's 0.4, and three such calls move the plan back onto them;
    credited only the blind call's lateness, it reads 0.4 and nothing moves.
    """
    from pathweave.runtime.telemetry import Adaptation

    true = np.ones(FAB.num_links)
    true[_rail0_links()] = 0.4
    late = (_rail0_links(), 1.7)
    rail0 = _rail0_links().tolist()
    sw = _noisy_job(policy, lambda c: true, 12, 0.0, 0, late_off=late)
    assert [c for c, *_ in sw] == [0], [(c, x) for c, x, *_ in sw]
    assert any(sw[0][1].get(i, 1.0) <= 0.45 for i in rail0), sw[0][1]
    monkeypatch.setattr(Adaptation, "CREDIT", np.inf)
    sw = _noisy_job(policy, lambda c: true, 12, 0.0, 0, late_off=late)
    back = [i for i in rail0 if sw[0][1].get(i, 1.0) <= 0.45 < sw[-1][1].get(i, 1.0)]
    assert len(sw) > 1 and back, [(c, x) for c, x, *_ in sw]


def test_call_noise_is_the_on_time_streams_spread_and_scaled_to_a_ratio():
    """:func:`link_ratios`' noise: hand-computed, and tracking injected noise.

    Six on-time streams (1.00 .. 1.10 x their one-second link) give the
    call's noise 1.4826 * median |log x - median| = 0.0432. Two streams 2x
    late (4 s busy links 0 and 2, each also crossing link 1, 1 s busy): link
    1 explains both (the link most slowed streams cross), ratio 1/8; the
    streams were 2x late, so its noise is the call's times log 8 / log 2.
    """
    keys = {k: np.array([k + 3]) for k in range(6)}
    keys |= {6: np.array([0, 1]), 7: np.array([2, 1])}
    times = dict(enumerate([1.0, 1.0, 1.02, 1.04, 1.06, 1.10, 8.0, 8.0]))
    busy = np.array([40.0, 10.0, 40.0, *[10.0] * 6])
    r, lo, noise, _ = link_ratios(keys, times, busy, np.full(9, 10.0), reference_quantile=0.0)
    x = np.log([1.0, 1.0, 1.02, 1.04, 1.06, 1.10])
    call = 1.4826 * np.median(np.abs(x - np.median(x)))
    assert r[1] == 1 / 8 and np.isnan(r[[0, 2]]).all()
    assert noise[1] == pytest.approx(call * np.log(8) / np.log(2))
    assert noise[3:] == pytest.approx([call] * 6) and np.isinf(noise[[0, 2]]).all()
    # Log-normal noise of spread 0.03 and 0.15 on a real plan's streams
    for sigma in (0.03, 0.15):
        streams, t, lb = _case("mwu", np.ones(FAB.num_links), seed=4)
        rng = np.random.default_rng(5)
        t = {k: v * np.exp(sigma * rng.standard_normal()) for k, v in t.items()}
        _, lo, noise, _ = link_ratios(streams, t, lb, FAB.capacity_Bps, num_ranks=N)
        assert 0.6 * sigma < np.unique(noise[np.isfinite(lo)]).item() < 1.3 * sigma


def test_a_late_slowdown_is_learned_from_a_plans_first_calls():
    """A co-tenant that arrives after a plan's first call is learned by its third.

    Every rank's :class:`Adaptation` sees fluid stream times (the plan's link
    bytes over the true capacities): the first call on the nominal fabric,
    the next ones with rail0 at 40 %. One nominal observation and one slow one
    leave the median halfway (no probe); the third call decides. Sampling
    only a plan's first call and then every 8th left the estimate at nominal
    until call 8.
    """
    from pathweave.runtime.telemetry import Adaptation

    d = np.asarray(parse_workload("hotspot:0.6", N, bytes_per_rank=4 << 20), dtype=np.int64)
    np.fill_diagonal(d, 0)
    plan = make(FAB, d, "mwu", paths=PS)
    keep = plan.flow_bytes > 0
    fp = plan.flow_path[keep]
    rows = PS.links[fp]
    w = np.broadcast_to(plan.flow_bytes[keep][:, None].astype(float), rows.shape)
    lb = np.bincount(rows[rows >= 0], weights=w[rows >= 0], minlength=FAB.num_links)
    streams = stream_links(PS, fp, N)
    ranks = [Adaptation(FAB, PS, r) for r in range(N)]
    slow = np.ones(FAB.num_links)
    slow[_rail0_links()] = 0.4
    replans = []
    for call, ratio in enumerate([np.ones(FAB.num_links), slow, slow]):
        link_s = lb / (FAB.capacity_Bps * 1e-4 * ratio)
        for a in ranks:
            a.note(fp, lb)
            assert a.sampled, f"call {call} of a new plan is not timed"
            a.observe([(k // N // N, k // N % N, float(link_s[ls].max()))
                       for k, ls in streams.items() if k % N == a.rank])
        words = np.stack([a.words() for a in ranks])
        for a in ranks:
            a.absorb(words)
        replans.append([a.replan() for a in ranks])
    # Every rank decides alike: no probe after 1 nominal + 1 slow sample, a probe after 2 slow.
    assert replans == [[False] * N, [False] * N, [True] * N]
    q = ranks[0].planned_q  # what the plans are made on
    assert (q[_rail0_links()] <= 0.45 * 64).any() and (np.delete(q, _rail0_links()) == 64).all()
    assert all((a.est.ratio_q() == ranks[0].est.ratio_q()).all() for a in ranks)
    assert all((a.planned_q == q).all() for a in ranks)


# ------------------------------------------------- the runtime, 8 gloo ranks
def _synthetic_observe(true_ratio):
    """An ``Adaptation.observe`` that replaces measured times by fluid times on ``true_ratio``.

    Loopback gloo has no fabric to measure; the fluid times make every rank
    see one known slow link, deterministically (on the fabric scaled by 1e-4,
    as in the emulator, so that times are far above a microsecond).
    """
    from pathweave.runtime.telemetry import Adaptation

    real = Adaptation.observe

    def observe(self, recv_times):
        fpath, link_bytes = self._last
        link_s = np.asarray(link_bytes) / (self.nominal.capacity_Bps * 1e-4 * true_ratio)
        streams = stream_links(self.paths, fpath, self.n)
        fake = [(s, last, float(link_s[streams[(s * self.n + last) * self.n + self.rank]].max()))
                for s, last, _ in recv_times]
        real(self, fake)

    return observe


def _adapt_job(rank, ws, slow_rail, calls):
    import torch

    from pathweave.runtime.telemetry import Adaptation

    true = np.ones(FAB.num_links)
    if slow_rail:
        true[_rail0_links()] = 0.4
    if slow_rail is not None:
        Adaptation.observe = _synthetic_observe(true)
    d = np.asarray(parse_workload("hotspot:0.6", ws, bytes_per_rank=1 << 20), dtype=np.int64)
    np.fill_diagonal(d, 0)
    row, col = d[rank].tolist(), d[:, rank].tolist()
    inp = torch.arange(sum(row), dtype=torch.int64).to(torch.uint8) + rank
    orch = pw.Orchestrator(fabric=FAB, policy="mwu", enabled=True, chunk_bytes=128 << 10,
                           min_split_bytes=0, timeout_s=30, adapt=True)
    ref = torch.empty(sum(col), dtype=torch.uint8)
    torch.distributed.all_to_all_single(ref, inp, col, row)
    out, plans, ok = torch.empty_like(ref), [], True
    ok = orch.learned_capacities() == {}  # nothing learned before the first call
    for _ in range(calls):
        out.zero_()
        orch.all_to_all_single(out, inp, col, row)
        ok = ok and bool(torch.equal(out, ref))
        st = orch._state(None)
        dec = st.current
        plans.append((dec.flow_path.tolist(), dec.flow_weight.tolist()))
    rail_bytes = float(orch.stats.bytes_per_link[_rail0_links()].sum())
    return {"ok": ok, "plans": plans, "q": st.adapt.planned_q.tolist(),
            "learned": orch.learned_capacities(),
            "switches": orch.stats.plan_switches, "rail0_bytes_last": rail_bytes}


@pytest.mark.parametrize("slow_rail", [True, False, None],
                         ids=["slow-rail0", "steady-fluid", "real-loopback-timings"])
def test_runtime_estimates_and_plans_are_the_same_on_every_rank(slow_rail):
    from pathweave.runtime.launch import run_local

    calls = 6
    res = run_local(_adapt_job, 8, (slow_rail, calls), timeout_s=240)
    assert all(r["ok"] for r in res)                       # bytes equal torch's own
    for r in res[1:]:                                      # every rank: same numbers, same plans
        assert r["q"] == res[0]["q"] and r["plans"] == res[0]["plans"]
    plans = res[0]["plans"]
    # What the orchestrator reports learned: the links planned on below nominal (64 levels).
    assert res[0]["learned"] == {i: v / 64 for i, v in enumerate(res[0]["q"]) if v < 64}
    if slow_rail:
        q = np.array(res[0]["q"])
        assert (q[_rail0_links()] < 64).any() and (np.delete(q, _rail0_links()) == 64).all()
        # Noise-free times: the first call's lone observation is far beyond its
        # noise (the floor, 0.02), so the second call runs the new plan; one
        # switch, and the plan stays (no oscillation).
        assert plans[1] != plans[0]
        assert all(p == plans[1] for p in plans[2:]) and res[0]["switches"] == 1
    elif slow_rail is False:
        # A steady fabric: the plan of the first call stays (hysteresis).
        assert all(p == plans[0] for p in plans) and res[0]["switches"] == 0


# ------------------------------------- metadata rows: width and adapt mismatch
def _hotspot_call(rank, ws):
    """This rank's splits, input and torch's own result of a ``hotspot:0.6`` exchange."""
    import torch

    d = np.asarray(parse_workload("hotspot:0.6", ws, bytes_per_rank=1 << 20), dtype=np.int64)
    np.fill_diagonal(d, 0)
    row, col = d[rank].tolist(), d[:, rank].tolist()
    inp = torch.arange(sum(row), dtype=torch.int64).to(torch.uint8) + rank
    ref = torch.empty(sum(col), dtype=torch.uint8)
    torch.distributed.all_to_all_single(ref, inp, col, row)
    return row, col, inp, ref


def _width_job(rank, ws):
    import torch

    from pathweave.runtime import _validate as V
    from pathweave.runtime.telemetry import Adaptation

    # Fluid times on the nominal fabric (loopback times are CPU noise): the plan stays.
    Adaptation.observe = _synthetic_observe(np.ones(FAB.num_links))
    row, col, inp, ref = _hotspot_call(rank, ws)
    out = {}
    for adapt in (False, True):
        orch = pw.Orchestrator(fabric=FAB, policy="mwu", enabled=True, chunk_bytes=128 << 10,
                               min_split_bytes=0, timeout_s=30, adapt=adapt)
        st = orch._state(None)
        widths = []

        def spy(r, deadline, _real=st.transport.exchange, _seen=widths):
            _seen.append(int(np.asarray(r).size))
            return _real(r, deadline)

        st.transport.exchange = spy
        ok, streams, plans = True, [], []
        for _ in range(10):
            res = torch.empty_like(ref)
            orch.all_to_all_single(res, inp, col, row)
            ok = ok and bool(torch.equal(res, ref))
            # Streams into each rank of the plan just run: (source, last forwarder) of
            # every path it uses, counted from the routes.
            fp = np.unique(st.current.flow_path)
            into = {}
            for p in fp.tolist():
                hops = [int(x) for x in st.routes[p] if x >= 0]
                into.setdefault(hops[-1], set()).add((hops[0], hops[-2]))
            streams.append(max(len(v) for v in into.values()))
            plans.append(fp.tolist())
        out[adapt] = {"ok": ok, "widths": widths, "base": V.meta_width(ws), "streams": streams,
                      "plans": plans}
    # A rank that adapts and ranks that do not: the same clear error on every rank,
    # call after call (rows of one width: nothing hangs, nothing is misread).
    orch = pw.Orchestrator(fabric=FAB, policy="mwu", timeout_s=30, adapt=rank == 0)
    errs = []
    for _ in range(2):
        try:
            orch.all_to_all_single(torch.empty_like(ref), inp, col, row)
            errs.append(None)
        except ValueError as exc:
            errs.append(str(exc))
    out["mismatch"] = errs
    return out


def test_telemetry_words_follow_only_when_adapting_one_word_per_stream_into_a_rank():
    from pathweave.runtime.launch import run_local

    res = run_local(_width_job, N, (), timeout_s=240)
    for r in res:
        off, on = r[False], r[True]
        assert off["ok"] and on["ok"]
        # Every row carries the plane words (host, telemetry words, calls) and
        # nothing more: one exchange per call without adaptation.
        row = off["base"] + PLANE_WORDS
        assert off["widths"] == [row] * 10
        # The first call has no previous call to report. A plan's first three
        # calls and every 8th after them are sampled: the next call's exchange
        # is followed by one more, of one word per stream into the rank that
        # receives the most streams of that plan.
        assert on["plans"] == [on["plans"][0]] * 10               # a steady plan
        words = on["streams"][0]
        assert on["widths"] == [row, row, words, row, words, row, words, *[row] * 5, row,
                                words]
        assert 0 < max(on["streams"]) < N * N                    # not N * N words
        assert r["mismatch"] == [
            "all_to_all_single: rank 1 uses adapt False but rank 0 uses True; every rank of "
            "the group must use the same configuration (fabric, policy, chunk_bytes, ...)"] * 2


# ---------------------------------------------------------- adapt="auto"
#: (ranks spread over two hosts, PATHWEAVE_ADAPT, expected: the group adapts)
AUTO_CASES = (
    (False, None, False),   # one host: loopback times are CPU noise
    (True, None, True),     # ranks on two hosts: real links, learn them
    (True, "0", False),     # PATHWEAVE_ADAPT=0 turns it off
    (False, "1", True),     # PATHWEAVE_ADAPT=1 turns it on anywhere
)


def _auto_job(rank, ws):
    import os
    import socket

    import torch

    row, col, inp, ref = _hotspot_call(rank, ws)
    out = []
    for spread, env_value, _ in AUTO_CASES:
        # One host, or ranks spread over hosts as a multi-node job has them.
        socket.gethostname = lambda spread=spread: f"node{rank // 4 if spread else 0}"
        if env_value is None:
            os.environ.pop("PATHWEAVE_ADAPT", None)
        else:
            os.environ["PATHWEAVE_ADAPT"] = env_value
        orch = pw.Orchestrator(fabric=FAB, policy="mwu", enabled=True, chunk_bytes=128 << 10,
                               min_split_bytes=0, timeout_s=30)
        ok = True
        for _ in range(3):
            res = torch.empty_like(ref)
            orch.all_to_all_single(res, inp, col, row)
            ok = ok and bool(torch.equal(res, ref))
        out.append((ok, orch.adapt, orch._state(None).adapt is not None))
    return out


def test_adapt_auto_learns_only_where_ranks_span_hosts():
    from pathweave.runtime.launch import run_local

    res = run_local(_auto_job, N, (), timeout_s=240)
    for i, (_, env_value, expect) in enumerate(AUTO_CASES):
        setting = {None: "auto", "0": False, "1": True}[env_value]
        assert [r[i] for r in res] == [(True, setting, expect)] * N, AUTO_CASES[i]


def test_adapt_default_and_auto_rule():
    from pathweave.runtime import Config

    def adapt_default(env):
        return Config.from_env(env).adapt

    assert adapt_default({}) == "auto" and adapt_default({"PATHWEAVE_ADAPT": " Auto "}) == "auto"
    assert adapt_default({"PATHWEAVE_ADAPT": "off"}) is False
    assert adapt_default({"PATHWEAVE_ADAPT": "YES"}) is True
    with pytest.raises(ValueError, match="PATHWEAVE_ADAPT='2'"):
        adapt_default({"PATHWEAVE_ADAPT": "2"})
    assert adapt_auto(np.array([5, 5, 6, 6]), nccl=False)
    assert not adapt_auto(np.array([5] * 8), nccl=False)
    # NCCL's round times blame every rail for one slow rail (the emulator,
    # docs/runtime.md): asked for only, never by "auto"
    assert not adapt_auto(np.array([5, 5, 6, 6]), nccl=True)
    with pytest.raises(ValueError, match="adapt must be True, False, 'auto' or None, got 'yes'"):
        pw.Orchestrator(fabric=FAB, adapt="yes")


# ---------------------------------------------- MoE dispatch/combine learn too
def _moe_inputs(ws, E, k, H, m, hot_expert):
    """Every rank's tokens and routing (drawn alike on every rank): most tokens
    name ``hot_expert`` first, so one rank receives most of the bytes."""
    import torch

    g = torch.Generator().manual_seed(5)
    xs, idxs, ws_ = [], [], []
    for _ in range(ws):
        idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(m)])
        for i in range(m):
            if hot_expert not in idx[i].tolist():
                idx[i, 0] = hot_expert
        xs.append(torch.randn(m, H, generator=g))
        idxs.append(idx)
        ws_.append(torch.rand(m, k, generator=g))
    return xs, idxs, ws_


def _moe_step(moe, x, idx, w):
    """Dispatch, a row-wise expert (``(e + 1) * x``), combine: this rank's output."""
    expert_x, counts, handle = moe.dispatch(x, idx)
    y = expert_x.clone()
    for li, e in enumerate(moe.local_expert_ids.tolist()):
        y[li, : int(counts[li])] *= e + 1
    return moe.combine(y, handle, w)


#: The fabric at a thousandth of its speed: a step's ~1 MB then takes milliseconds
#: in the time model, so where the bytes go matters more than the set-up.
SLOW = FAB.with_links({i: 1e-3 for i in range(FAB.num_links)}, name="h100-2x4-x1e-3")


def _moe_adapt_job(rank, ws, steps):
    import socket

    import torch

    from pathweave.moe import MoEAllToAll
    from pathweave.moe.reference import reference_combine
    from pathweave.runtime.telemetry import Adaptation

    true = np.ones(FAB.num_links)
    true[_rail0_links()] = 0.4
    Adaptation.observe = _synthetic_observe(true)
    E, k, H, m = 16, 2, 256, 48
    xs, idxs, wts = _moe_inputs(ws, E, k, H, m, hot_expert=0)
    want = reference_combine(xs, idxs, wts, list(range(E)),
                             lambda e, x, s: x.float() * (e + 1))[rank]
    out = {}
    for name, adapt in (("on", True), ("auto-two-hosts", None), ("off", False)):
        # Ranks on two hosts: adapt="auto" must learn from the layer's own rows.
        socket.gethostname = lambda: f"node{rank // 4}"
        orch = pw.Orchestrator(fabric=SLOW, policy="mwu", enabled=True, chunk_bytes=16 << 10,
                               min_split_bytes=0, timeout_s=60, adapt=adapt)
        moe = MoEAllToAll(E, k, H, m, torch.float32, orchestrator=orch)
        st = orch._state(None)
        ok, rail0 = True, []
        for _ in range(steps):
            before = orch.stats.bytes_per_link.copy()
            got = _moe_step(moe, xs[rank], idxs[rank], wts[rank])
            ok = ok and bool(torch.allclose(got, want, rtol=1e-6, atol=1e-5))
            rail0.append(float((orch.stats.bytes_per_link - before)[_rail0_links()].sum()))
        try:  # rows of another shape are refused, before anything is absorbed
            orch.absorb_plane_words(np.zeros((ws - 1, 3), dtype=np.int64))
            bad = None
        except ValueError as exc:
            bad = str(exc)
        out[name] = {"ok": ok, "rail0": rail0, "switches": orch.stats.plan_switches, "bad": bad,
                     "calls": orch.stats.multipath_calls, "adapts": st.adapt is not None,
                     "q": None if st.adapt is None else st.adapt.planned_q.tolist()}
    return out


def test_moe_dispatch_and_combine_learn_from_their_own_transfers():
    # The layer passes split_matrix (no metadata exchange in the data plane): its
    # own rows carry the telemetry words. A slow rail0 (fluid times, as in the
    # runtime test above) is found from dispatch/combine alone, alike on every
    # rank, and the next steps move bytes off it; outputs stay the reference's.
    from pathweave.runtime.launch import run_local

    res = run_local(_moe_adapt_job, N, (4,), timeout_s=300)
    blind = [r["off"] for r in res]
    assert all(r["ok"] and not r["adapts"] for r in blind)
    assert blind[0]["bad"] == ("absorb_plane_words: rows must be int64 of shape (8, 3), got "
                               "int64 (7, 3)")
    # Without adaptation every step sends the same bytes over rail0.
    base = blind[0]["rail0"]
    assert base[0] > 0 and base == [base[0]] * len(base)
    for name in ("on", "auto-two-hosts"):
        runs = [r[name] for r in res]
        assert all(r["ok"] for r in runs), name
        assert all(r["adapts"] for r in runs), name
        first = runs[0]
        assert first["calls"] == 8                                   # every call multi-path
        for r in runs[1:]:                                           # the same on every rank
            assert (r["q"], r["switches"]) == (first["q"], first["switches"])
        q = np.array(first["q"])
        assert (q[_rail0_links()] < 64).any() and (np.delete(q, _rail0_links()) == 64).all()
        # The first dispatch runs blind and reports rail0 slow (in the combine's
        # row); noise-free times are far beyond their noise, so that one sample
        # settles it: the first step's combine already sends less over rail0
        # (the step between blind and adapted), every later step as little.
        assert base[0] > first["rail0"][0] > first["rail0"][1], (first["rail0"], base)
        assert first["rail0"][1:] == [first["rail0"][1]] * (len(base) - 1), first["rail0"]


# --------------------------------------- the switch rule under noisy samples
#: The link a co-tenant slows in the noisy-sample tests: rail0 into node 0, the hot
#: receiver's node (the busiest rail link of every plan of hotspot:0.6).
NOISY_LINK = FAB.link_id("rail0", "n0.nic0")


def _noisy_job(policy, true_of_call, calls, sigma, seed, outlier=None, late_off=None):
    """Drive one :class:`Adaptation` through ``calls`` calls of ``hotspot:0.6``; its replans.

    Each sampled call's words are fluid stream times (a stream ends when the
    slowest link it crosses has carried the plan's bytes on it, at capacity
    ``true_of_call(call) * nominal``) times seeded log-normal noise of spread
    ``sigma``; ``outlier = (call, links, factor)`` makes every stream across
    ``links`` ``factor`` x late in that call only; ``late_off = (links,
    factor)``: after the first replan, every stream that crosses none of
    ``links`` is ``factor`` x late. Every rank absorbs the same
    words (the metadata exchange), so one rank's object stands for all.
    A replan is made as the orchestrator makes it: the policy's plan on the
    settled capacities. Returns ``[(call, learned, old plan's link bytes, new
    plan's)]`` per replan.
    """
    from pathweave.runtime.telemetry import Adaptation, encode_times, streams_into

    d = np.asarray(parse_workload("hotspot:0.6", N, bytes_per_rank=4 << 20), dtype=np.int64)
    np.fill_diagonal(d, 0)

    def plan_on(fab):
        plan = make(fab, d, policy, paths=candidate_paths(fab))
        keep = plan.flow_bytes > 0
        rows = PS.links[plan.flow_path[keep]]
        w = np.broadcast_to(plan.flow_bytes[keep][:, None].astype(float), rows.shape)
        return plan.flow_path[keep], np.bincount(rows[rows >= 0], weights=w[rows >= 0],
                                                 minlength=FAB.num_links)

    rng = np.random.default_rng(seed)
    a = Adaptation(FAB, PS, 0)
    fp, lb = plan_on(FAB)
    out = []
    for call in range(calls):
        a.note(fp, lb)
        words = np.zeros((N, 0), dtype=np.int64)
        if a.sampled:
            streams = stream_links(PS, fp, N)
            into = streams_into(streams, N)
            link_s = lb / (FAB.capacity_Bps * 1e-4 * true_of_call(call))
            words = np.zeros((N, max(k.size for k in into)), dtype=np.int64)
            for dst, keys in enumerate(into):
                t = np.array([link_s[streams[int(k)]].max() for k in keys])
                if late_off is not None and out:
                    t *= [1.0 if np.isin(streams[int(k)], late_off[0]).any() else late_off[1]
                          for k in keys]
                t *= np.exp(sigma * rng.standard_normal(t.size))
                if outlier is not None and outlier[0] == call:
                    t *= [outlier[2] if np.isin(streams[int(k)], outlier[1]).any() else 1.0
                          for k in keys]
                words[dst, : t.size] = encode_times(t)
        a.absorb(words)
        if a.replan():
            new_fp, new_lb = plan_on(a.fabric)
            out.append((call, a.learned(), lb, new_lb))
            fp, lb = new_fp, new_lb
    return out


#: Log-normal spread of every stream's time in the noisy-sample tests: a stream
#: 1.5x late (what the tomography calls slowed) is 2.7 of it.
SIGMA = 0.15
SEEDS = range(16)


@pytest.mark.parametrize("policy", pw.plan.policies(executable_only=True))
def test_a_real_slowdown_switches_within_three_calls_in_every_seed(policy):
    """A 40 % slowdown of one link from the first call on, seeded noise.

    Within three calls (the switch decided on the words of calls 0 to 2, a
    plan's first samples) the plan is made on the link below nominal, once:
    no flip back while the link stays slow. The new plan is faster on the
    true capacities than the blind one (fluid time: the busiest link's bytes
    over its true capacity). The previous rule (a link's window median,
    planned on once it moved 1.5-fold) switched at call 0, but flipped again
    on noise in 4 of these 16 seeds with the default policy.
    """
    from pathweave.plan import DEFAULT_POLICY

    true = np.ones(FAB.num_links)
    true[NOISY_LINK] = 0.6
    for seed in SEEDS:
        sw = _noisy_job(policy, lambda c: true, 24, SIGMA, seed)
        assert sw and sw[0][0] <= 2, f"seed {seed}: switches {[(c, x) for c, x, *_ in sw]}"
        _, learned, old_lb, new_lb = sw[0]
        assert NOISY_LINK in learned and learned[NOISY_LINK] <= 0.7, (seed, learned)
        assert len(sw) == 1, f"seed {seed}: flipped: {[(c, x) for c, x, *_ in sw]}"
        cap = FAB.capacity_Bps * true
        new_s, old_s = (new_lb / cap).max(), (old_lb / cap).max()
        # never worse; better with the default policy (static, deepep, hscore keep
        # the bottleneck: one path per pair, or a fixed rail striping)
        assert new_s < old_s if policy == DEFAULT_POLICY else new_s <= old_s, (seed, new_s, old_s)


@pytest.mark.parametrize("policy", pw.plan.policies(executable_only=True))
def test_noise_of_the_same_spread_never_switches(policy):
    """No slowdown, the same noise: 40 calls (the first 3 and every 8th sampled), no replan.

    The previous rule replanned in 5 to 9 of these 16 seeds, by policy:
    a link a noisy stream made look 1.5x slow in the first call was learned at
    once, and floors (an unslowed stream's bound on its links) below the median
    were dropped, so two noisy calls of five outvoted three clean ones.
    """
    for seed in SEEDS:
        sw = _noisy_job(policy, lambda c: np.ones(FAB.num_links), 40, SIGMA, seed)
        assert sw == [], f"seed {seed}: switches {[(c, x) for c, x, *_ in sw]}"


@pytest.mark.parametrize(("at", "factor"), [(0, 1.8), (8, 2.5)],
                         ids=["first-call", "later-sample"])
def test_a_single_outlier_sample_never_switches(at, factor):
    """One sampled call with the link's streams ``factor`` x late, noise otherwise: no replan.

    A plan's first call is where outliers are likeliest (connections are set
    up). There the link's window holds that one observation, and a lone
    observation moves the link only when it is far beyond its call's noise
    (``SwitchPolicy.single_z``): 1.8x late on 15 % noise (3.9 of it) is
    not. Later (call 8) the window holds earlier calls too, so one outlier
    meets the majority rule even at 2.5x. The rule before the confidence
    test replanned on the 2.5x outlier in 16 of these 16 seeds as a plan's
    first call and in 13 of 16 at call 8.
    """
    from pathweave.plan import DEFAULT_POLICY

    for seed in SEEDS:
        sw = _noisy_job(DEFAULT_POLICY, lambda c: np.ones(FAB.num_links), 24, SIGMA, seed,
                        outlier=(at, [NOISY_LINK], factor))
        assert sw == [], f"seed {seed}: switches {[(c, x) for c, x, *_ in sw]}"


def test_a_far_first_call_outlier_is_undone_by_the_plans_first_samples():
    """A 2.5x outlier on a plan's first call, 15 % noise: 8 to 10 of its call's noise.

    That is as far beyond the noise as the emulator's co-tenant (a rail at
    0.49-0.56 of nominal in calls with noise 0.05-0.07), so a lone
    observation may move the link (it did in 8 of these 16 seeds). What
    the rule guarantees is the price: the next samples (calls 1 and 2, a
    plan's first three are all timed) outvote it, so the plan is made on
    the link at no less than ``1 / probe_threshold`` of nominal again by
    call 2, and nothing switches after that.
    """
    from pathweave.plan import DEFAULT_POLICY

    undone = 0
    for seed in SEEDS:
        sw = _noisy_job(DEFAULT_POLICY, lambda c: np.ones(FAB.num_links), 24, SIGMA, seed,
                        outlier=(0, [NOISY_LINK], 2.5))
        if not sw:
            continue
        calls = [c for c, *_ in sw]
        assert calls == [0, 2], f"seed {seed}: switches {[(c, x) for c, x, *_ in sw]}"
        assert sw[1][1].get(NOISY_LINK, 1.0) >= 1 / 1.5, (seed, sw[1][1])
        undone += 1
    assert undone, "no seed moved on the far outlier: the case tests nothing"


@pytest.mark.parametrize("policy", pw.plan.policies(executable_only=True))
def test_on_a_quiet_fabric_one_call_decides_and_noise_never_does(policy):
    """Stream noise of 3 %: a 40 % slowdown is planned on after the first call.

    Its streams are then about 1.7x late, 18 of the call's noise and more,
    so the lone first observation settles the link (on 15 % noise, two
    calls: the test above). The same noise on a steady fabric never
    replans in 40 calls (no stream comes near 1.5x late).
    """
    true = np.ones(FAB.num_links)
    true[NOISY_LINK] = 0.6
    for seed in SEEDS[:8]:
        sw = _noisy_job(policy, lambda c: true, 12, 0.03, seed)
        assert [c for c, *_ in sw] == [0], f"seed {seed}: {[(c, x) for c, x, *_ in sw]}"
        assert sw[0][1].get(NOISY_LINK, 1.0) <= 0.7, (seed, sw[0][1])
        assert _noisy_job(policy, lambda c: np.ones(FAB.num_links), 40, 0.03, seed) == []
