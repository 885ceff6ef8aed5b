"""Live adaptation where rounds are posted as groups (NCCL's way): round clocks, their lazy
read, and the round-granular times the estimator learns from.

On gloo the grouped posting is forced (``Transport.grouped_rounds``, as
``tests/test_distributed.py`` does); the CUDA-event twin runs only with CUDA
(the last tests, skipped elsewhere; ``scripts/gpu_check.sh`` runs them).
"""

from __future__ import annotations

import numpy as np
import pytest

import pathweave as pw
from pathweave.fabric import candidate_paths
from pathweave.plan import make
from pathweave.plan.rounds import entry_round, pacing, route_ranks, unpaced_direct
from pathweave.runtime.executor import CudaRoundClock, RoundClock
from pathweave.runtime.schedule import (
    Fragments,
    Segments,
    _global_hops,
    path_routes,
    split_fragments,
)
from pathweave.runtime.telemetry import (
    Adaptation,
    encode_times,
    link_ratios,
    round_ends,
    stream_links,
)
from pathweave.traffic import parse_workload

FAB = pw.fabric.preset("h100-2x4")
PS = candidate_paths(FAB)
N = FAB.num_ranks
CHUNK, WINDOW = 1 << 20, 4
POLICIES = pw.plan.policies(executable_only=True)


def _rail0_links() -> np.ndarray:
    v = FAB.vertex_id("rail0")
    return np.flatnonzero((FAB.link_src == v) | (FAB.link_dst == v))


def _slow_rail0(ratio: float = 0.4) -> np.ndarray:
    true = np.ones(FAB.num_links)
    true[_rail0_links()] = ratio
    return true


def _fragments(policy: str, bytes_per_rank: int = 8 << 20):
    """A real plan's fragments of a hotspot call, as the pipeline splits them."""
    d = np.asarray(parse_workload("hotspot:0.6", N, bytes_per_rank=bytes_per_rank),
                   dtype=np.int64)
    np.fill_diagonal(d, 0)
    plan = make(FAB, d, policy, paths=PS)
    keep = plan.flow_bytes > 0
    fp = plan.flow_path[keep]
    r = path_routes(PS)[fp]
    pair = r[:, 0].astype(np.int64) * N + np.array([x[x >= 0][-1] for x in r])
    order = np.argsort(pair, kind="stable")
    weight = plan.flow_bytes[keep] / d.reshape(-1)[pair]
    fpair, fpath, fbytes = split_fragments(pair[order], fp[order], weight[order], d)
    return d, fpair, fpath, fbytes


def _hops(d, fpair, fpath, fbytes):
    return _global_hops(
        Segments.all_to_all(d),
        Fragments(fpair, fbytes, path_routes(PS)[fpath], PS.links[fpath]),
        CHUNK,
        WINDOW,
    )


def _loop_round_ends(fpath, fbytes, capacity_Bps) -> dict[int, float]:
    """The slow twin of ``round_ends``, from the round rule as documented.

    Chunk ``c`` of a fragment of ``k`` enters in ``floor(c R / k)``
    (unpaced direct fragments whole in round 0), hop ``h`` moves ``h`` rounds
    later; in a round each link drains its bytes; a message starts once both
    its ranks began the round and ends when its hop's busiest link is done.
    """
    keep = fbytes > 0
    fpath, fbytes = fpath[keep], fbytes[keep]
    routes = route_ranks(PS)[fpath]
    nchunk = -(-fbytes // CHUNK)
    rounds, _ = pacing(nchunk, WINDOW)
    whole = unpaced_direct(routes, PS.links[fpath], N)
    msgs = []  # (round, sender, receiver, hop links, bytes, stream key of a last hop)
    for f in range(fpath.size):
        r = [int(x) for x in routes[f] if x >= 0]
        hops, cur = [], []
        for link in (int(x) for x in PS.links[fpath[f]] if x >= 0):
            cur.append(link)
            if FAB.vertex_rank[FAB.link_dst[link]] >= 0:
                hops.append(cur)
                cur = []
        k = int(nchunk[f])
        sizes = [CHUNK] * (k - 1) + [int(fbytes[f]) - CHUNK * (k - 1)]
        enter = [0] if whole[f] else entry_round(np.arange(k), np.full(k, k), rounds).tolist()
        if whole[f]:
            sizes = [int(fbytes[f])]
        key = (r[0] * N + r[-2]) * N + r[-1]
        for u, nb in zip(enter, sizes, strict=True):
            for h, links in enumerate(hops):
                msgs.append((u + h, r[h], r[h + 1], links, nb, key if h == len(hops) - 1 else None))
    nr = max(m[0] for m in msgs) + 1
    load = np.zeros((nr, FAB.num_links))
    for u, _, _, links, nb, _ in msgs:
        load[u, links] += nb
    end = np.zeros(N)
    ends, last = {}, {}
    for u in range(nr):
        start, done = end.copy(), end.copy()
        for v, a, b, links, _, key in msgs:
            if v != u:
                continue
            t = max(start[a], start[b]) + max(load[u, x] / capacity_Bps[x] for x in links)
            done[a], done[b] = max(done[a], t), max(done[b], t)
            if key is not None:
                last[key] = u
        end = done
        ends.update({k: float(end[k % N]) for k, v in last.items() if v == u})
    return ends


@pytest.mark.parametrize("policy", POLICIES)
def test_round_ends_equal_a_loop_over_the_round_rule(policy):
    d, fpair, fpath, fbytes = _fragments(policy)
    hops = _hops(d, fpair, fpath, fbytes)
    for true in (np.ones(FAB.num_links), _slow_rail0()):
        cap = FAB.capacity_Bps * true
        got = round_ends(hops, fpath[fbytes > 0], PS, cap)
        want = _loop_round_ends(fpath, fbytes, cap)
        assert set(got) == set(want)
        assert all(abs(got[k] - want[k]) <= 1e-12 * want[k] for k in want)
        mine = round_ends(hops, fpath[fbytes > 0], PS, cap, rank=3)  # the streams into 3
        assert mine == {k: t for k, t in got.items() if k % N == 3} and mine


# ------------------------------------------------ round-granular times, one process
def _adapt_calls(policy: str, true: np.ndarray, calls: int, scaled: bool = True):
    """Every rank's Adaptation over ``calls`` calls of one plan whose times are round
    ends on ``true`` capacities (lock-step rounds: the RoundClock's view); returns
    ``(replans per call, planned_q)``, alike on every rank."""
    d, fpair, fpath, fbytes = _fragments(policy)
    hops = _hops(d, fpair, fpath, fbytes)
    kept = fpath[fbytes > 0]
    lb = PS.link_load_bytes(fpath, fbytes)
    # The fabric scaled by 1e-4 (as the emulator's and test_telemetry's): times >> 1 us.
    measured = round_ends(hops, kept, PS, FAB.capacity_Bps * 1e-4 * true)
    pred = round_ends(hops, kept, PS, FAB.capacity_Bps) if scaled else None
    ranks = [Adaptation(FAB, PS, r) for r in range(N)]
    replans = []
    for _ in range(calls):
        for a in ranks:
            a.note(kept, lb, None if pred is None else lambda: pred)
            a.observe_later(lambda a=a: [(k // N // N, k // N % N, t)
                                         for k, t in measured.items() if k % N == a.rank])
        words = np.stack([a.words() for a in ranks])
        for a in ranks:
            a.absorb(words)
        replans.append([a.replan() for a in ranks])
    assert all((a.planned_q == ranks[0].planned_q).all() for a in ranks)
    return [r[0] for r in replans if len(set(r)) == 1], ranks[0].planned_q


def test_raw_round_ends_blame_healthy_links_and_predicted_ones_do_not():
    """At round granularity every stream of a paced call ends in its last rounds:
    against its busiest link's time a healthy fabric's streams look slowed."""
    blamed_raw = []
    for policy in POLICIES:
        d, fpair, fpath, fbytes = _fragments(policy)
        hops = _hops(d, fpair, fpath, fbytes)
        kept = fpath[fbytes > 0]
        lb = PS.link_load_bytes(fpath, fbytes)
        t = round_ends(hops, kept, PS, FAB.capacity_Bps)
        ratio, *_ = link_ratios(stream_links(PS, kept, N), t, lb, FAB.capacity_Bps,
                                num_ranks=N)
        blamed_raw.append(int(np.isfinite(ratio).sum()))
    assert max(blamed_raw) > 0, blamed_raw  # the bias the prediction removes
    for policy in POLICIES:
        replans, q = _adapt_calls(policy, np.ones(FAB.num_links), calls=4)
        assert replans == [False] * 4 and (q == 64).all(), policy


@pytest.mark.parametrize("policy", POLICIES)
def test_a_slow_rail_is_learned_from_round_times(policy):
    """rail0 at 40 %: the round-timed path learns it below nominal and re-plans."""
    replans, q = _adapt_calls(policy, _slow_rail0(), calls=3)
    assert True in replans, policy
    assert (q[_rail0_links()] <= 0.6 * 64).any(), (policy, q[_rail0_links()])


def test_a_clock_read_late_or_never_observes_nothing_after_the_next_note():
    _, _, fpath, fbytes = _fragments("mwu")
    kept, lb = fpath[fbytes > 0], PS.link_load_bytes(fpath, fbytes)
    a = Adaptation(FAB, PS, 0)
    a.note(kept, lb)
    a.observe_later(lambda: None)  # events not complete: nothing observed
    assert a.width > 0 and (a.words() == 0).all()
    reads = []
    a.note(kept, lb)
    a.observe_later(lambda: reads.append(1) or [])
    a.note(kept, lb)  # the next call: the last one's observation is gone, never read
    assert (a.words() == 0).all() and reads == []


class _Event:
    """A CUDA event's twin on the host clock: ``query()`` says whether it completed."""

    def __init__(self, t: float, done: bool = True):
        self.t, self.done = t, done

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: _Event) -> float:
        assert self.done and end.done, "read before complete"
        return (end.t - self.t) * 1e3  # milliseconds, as CUDA's


def test_the_cuda_clock_reads_seconds_when_complete_and_nothing_before():
    stamps = iter([10.0, 10.5, 11.0, 0.0, 0.0])

    class Clock(CudaRoundClock):
        done = True

        def _stamp(self):
            return _Event(next(stamps), self.done)

    c = Clock([0, 2])
    c.start()
    for t in range(3):
        c.mark(t)  # round 1 is not wanted: no event
    assert c.ends() == {0: 0.5, 2: 1.0}
    Clock.done = False
    c = Clock([0])
    c.start()
    c.mark(0)
    assert c.ends() is None


# ------------------------------------------------------ the runtime, 8 gloo ranks
def _job(rank, ws, grouped, mode, calls, hysteresis=0.1):
    """``calls`` hotspot calls of an adapting orchestrator; grouped rounds forced or not.

    ``mode``: ``"slow"`` replaces measured times by model times of rail0 at
    40 % (per stream: fluid, as tests/test_telemetry.py; per round: round
    ends in lock-step, ``round_ends``), as a fabric would show them;
    ``"count"``: the k-th round clock made reads k seconds for every round;
    ``"pending"``: clocks whose events never complete.
    """
    import torch

    from pathweave.runtime import executor, telemetry

    true = _slow_rail0()
    truth: dict[int, dict[int, float]] = {}
    real_observe, real_note, real_absorb = (Adaptation.observe, Adaptation.note,
                                            Adaptation.absorb)
    real_round_ends = telemetry.round_ends
    made: list[int] = []
    seen: list = []

    if mode == "slow":
        def ends_both(hops, frag_path, paths, cap, rank=None):
            pred = real_round_ends(hops, frag_path, paths, cap, rank)
            truth[id(pred)] = real_round_ends(hops, frag_path, paths, cap * 1e-4 * true, rank)
            return pred

        def note(self, fpath, link_bytes, ends=None):
            real_note(self, fpath, link_bytes, ends)
            # The entry's prediction, made once (by the note of a sampled call).
            self._truth = None if ends is None or not self.sampled else truth[id(ends())]

        def observe(self, recv_times):
            n, me = self.n, self.rank
            if self._truth is None:  # per stream: fluid times
                fpath, lb = self._last
                link_s = np.asarray(lb) / (self.nominal.capacity_Bps * 1e-4 * true)
                st = stream_links(self.paths, fpath, n)
                at = {k: float(link_s[ls].max()) for k, ls in st.items()}
            else:
                at = self._truth
            real_observe(self, [(s, last, at[(s * n + last) * n + me])
                                for s, last, _ in recv_times])

        telemetry.round_ends = ends_both
        Adaptation.note, Adaptation.observe = note, observe
    elif mode == "count":
        class Counting(RoundClock):
            def _stamp(self):
                return 0.0 if self._start is None else float(len(made))

            def start(self):
                made.append(1)
                super().start()

        executor.RoundClock = Counting
    elif mode == "pending":
        class Pending(CudaRoundClock):
            def _stamp(self):
                return _Event(0.0, done=False)

        executor.RoundClock = Pending

    def absorb(self, words):
        own = self._plan[1][self.rank].size if self._last is not None else 0
        seen.append((np.asarray(words).tolist(), self._scale[:own].tolist(), len(made)))
        real_absorb(self, words)

    Adaptation.absorb = absorb
    d = np.asarray(parse_workload("hotspot:0.6", ws, bytes_per_rank=1 << 20), dtype=np.int64)
    np.fill_diagonal(d, 0)
    row, col = d[rank].tolist(), d[:, rank].tolist()
    inp = torch.arange(sum(row), dtype=torch.int64).to(torch.uint8) + rank
    orch = pw.Orchestrator(fabric=FAB, policy="mwu", enabled=True, chunk_bytes=128 << 10,
                           min_split_bytes=0, timeout_s=60, adapt=True, hysteresis=hysteresis)
    st = orch._state(None)
    st.transport.grouped_rounds = grouped
    ref = torch.empty(sum(col), dtype=torch.uint8)
    torch.distributed.all_to_all_single(ref, inp, col, row)
    out, plans, ok, rail0 = torch.empty_like(ref), [], True, []
    for _ in range(calls):
        out.zero_()
        before = float(orch.stats.bytes_per_link[_rail0_links()].sum())
        orch.all_to_all_single(out, inp, col, row)
        ok = ok and bool(torch.equal(out, ref))
        plans.append((st.current.flow_path.tolist(), st.current.flow_weight.tolist()))
        rail0.append(float(orch.stats.bytes_per_link[_rail0_links()].sum()) - before)
    return {"ok": ok, "plans": plans, "q": st.adapt.planned_q.tolist(), "seen": seen,
            "switches": orch.stats.plan_switches, "version": st.adapt.est.version,
            "rail0_bytes": rail0}


def _run(grouped, mode, calls, *more):
    from pathweave.runtime.launch import run_local

    res = run_local(_job, N, (grouped, mode, calls, *more), timeout_s=300)
    assert all(r["ok"] for r in res)  # bytes equal torch's own
    for r in res[1:]:
        assert r["q"] == res[0]["q"] and r["plans"] == res[0]["plans"]
    return res


@pytest.mark.parametrize("grouped", [True, False], ids=["rounds", "streams"])
def test_a_slow_rail_is_learned_and_planned_around_by_either_timing(grouped):
    """rail0 at 40 %: learned on every rank alike, and the plan switches once to one
    that sends less over it, whether calls are timed per round (NCCL's posting) or
    per stream (gloo's).

    Hysteresis 0: round times also slow the other rails' links in one
    direction (lock-step rounds, docs/runtime.md "Live adaptation"), and on
    that picture mwu's new plan gains less than the default 10 %.
    """
    res = _run(grouped, "slow", 5, 0.0)
    q, plans = np.array(res[0]["q"]), res[0]["plans"]
    assert (q[_rail0_links()] <= 0.5 * 64).sum() >= 2, q[_rail0_links()]
    assert res[0]["switches"] == 1 and plans[1] != plans[0] and plans[-1] == plans[1]
    rail0 = np.sum([r["rail0_bytes"] for r in res], axis=0)
    assert rail0[-1] < 0.9 * rail0[0], rail0
    # A sampled call's words follow in the next exchange, as wide on every rank.
    widths = [[len(w[0]) for w, _, _ in r["seen"]] for r in res]
    assert all(w == widths[0] for w in widths) and len(widths[0]) == 5
    assert widths[0][0] == 0 and all(k > 0 for k in widths[0][1:4])


def test_a_round_timed_observation_arrives_in_the_next_calls_words():
    """The k-th clock reads k s: call j's words hold call j - 1's clock, scaled."""
    res = _run(True, "count", 4)
    for rank, r in enumerate(res):
        seen = r["seen"]
        # Calls 0 to 2 are sampled (a plan's first three, whichever plan the odd
        # times made): calls 1 to 3 carry their words.
        assert [len(w[0]) > 0 for w, _, _ in seen] == [False, True, True, True]
        for j in (1, 2, 3):
            words, scale, clocks = seen[j]
            # Clocks made before this absorb: call j - 1's was the last (call j's comes later).
            assert clocks == j
            want = encode_times(clocks * np.array(scale))
            own = np.array(words[rank])
            assert (own[: want.size] == want).all() and (own[want.size :] == 0).all()
            assert (want > 0).all()


def test_round_clocks_that_never_complete_send_zeros_and_nothing_hangs():
    res = _run(True, "pending", 4)
    for r in res:
        words = [np.array(w) for w, _, _ in r["seen"]]
        assert [w.shape[1] > 0 for w in words] == [False, True, True, True]
        assert all((w == 0).all() for w in words)
        assert r["version"] == 0 and r["switches"] == 0  # nothing learned


# ------------------------------------------------------------- CUDA only
try:
    from test_cuda_nccl import _REASON, _SHARE_HINT, WORLD, _device, forwarding_fabric
except ImportError:  # pragma: no cover - the module sits beside this one
    _REASON, _SHARE_HINT, WORLD = "test_cuda_nccl not importable", "", 0

needs_cuda = pytest.mark.skipif(bool(_REASON), reason=_REASON)


@needs_cuda
def test_cuda_round_clock_reads_stream_order_after_a_sync():
    import torch

    c = CudaRoundClock([0, 1])
    c.start()
    torch.cuda._sleep(50_000_000)
    c.mark(0)
    torch.cuda._sleep(50_000_000)
    c.mark(1)
    torch.cuda.synchronize()
    ends = c.ends()
    assert ends is not None and 0 < ends[0] < ends[1]


def _nccl_job(rank, world, backend):
    import torch

    from pathweave import traffic

    seen = []
    real = Adaptation.absorb

    def absorb(self, words):
        seen.append(np.asarray(words).tolist())
        real(self, words)

    Adaptation.absorb = absorb
    device = _device(rank, backend, world)
    fab = pw.fabric.resolve(forwarding_fabric(world))
    demand = traffic.hotspot(world, bytes_per_rank=world * (4 << 20), ratio=0.8)
    split = np.asarray(demand, dtype=np.int64)
    np.fill_diagonal(split, 0)
    inp = torch.arange(int(split[rank].sum()), device=device).to(torch.uint8)
    out = torch.empty(int(split[:, rank].sum()), dtype=torch.uint8, device=device)
    ref = torch.empty_like(out)
    torch.distributed.all_to_all_single(ref, inp, split[:, rank].tolist(),
                                        split[rank].tolist())
    orch = pw.Orchestrator(fabric=fab, policy="mwu", enabled=True, adapt=True)
    ok = True
    for _ in range(4):
        orch.all_to_all_single(out, inp, split[:, rank].tolist(), split[rank].tolist())
        ok = ok and bool(torch.equal(out, ref))
    return {"ok": ok, "multipath": orch.stats.last_call.multipath, "seen": seen}


@needs_cuda
@pytest.mark.skipif(not _REASON and WORLD < 3,
                    reason=f"forwarding needs >= 3 ranks, found {WORLD}; {_SHARE_HINT}")
def test_nccl_round_times_reach_the_next_calls_words():
    """On NCCL the CUDA events of a sampled call are complete by the next call's
    words (its metadata exchange synced the host): every rank sends real times."""
    from pathweave.runtime.launch import run_local

    res = run_local(_nccl_job, WORLD, ("nccl",), backend="nccl", timeout_s=300)
    assert all(r["ok"] and r["multipath"] for r in res)
    for r in res:
        words = [np.array(w) for w in r["seen"]]
        timed = [w for w in words if w.size]
        assert len(timed) >= 2, [w.shape for w in words]
        assert all((w > 0).any(axis=1).all() for w in timed)  # every rank observed
