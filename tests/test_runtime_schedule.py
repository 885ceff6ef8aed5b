"""The schedule layer in one process: plan -> per-rank chunked operations.

Every schedule is checked four ways: the structural checks the
deadlock-freedom argument rests on (``check_schedules``), a reference
executor that moves bytes round by round and must reproduce the obvious
all-to-all result, an asynchronous model of the round-by-round wait rule
(the NCCL way) that must run every operation to completion, and a model of
the per-stream executor (the gloo way) that runs the streams' threads and
the messages in random interleavings, moving bytes when a message completes,
and must finish with the same result.
"""

from __future__ import annotations

import dataclasses
import re
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pathweave as pw
from pathweave.fabric import PathKind
from pathweave.runtime import orchestrator as orch_mod
from pathweave.runtime.schedule import (
    STAGING,
    Fragments,
    Segments,
    build_schedules,
    check_schedules,
    path_routes,
    split_fragments,
)

FAB8 = pw.fabric.preset("h100-2x4")
PS8 = pw.fabric.candidate_paths(FAB8)
ROUTES8 = path_routes(PS8)


# ------------------------------------------------------------ references
def run_rounds(scheds, in_bufs, out_bufs):
    """Reference executor: move every round's messages with numpy, in round order."""
    stage = [np.full(s.staging_bytes, 0xEE, np.uint8) for s in scheds]
    outs = [[b.copy() for b in ob] for ob in out_bufs]
    for s in scheds:
        for sb, so, rb, ro, nb in zip(
            s.copy_send_buf, s.copy_send_off, s.copy_recv_buf, s.copy_recv_off, s.copy_bytes,
            strict=True,
        ):
            outs[s.rank][rb][ro : ro + nb] = in_bufs[s.rank][sb][so : so + nb]
    for t in range(max((s.num_rounds for s in scheds), default=0)):
        wire = {}
        for s in scheds:
            m = s.send_round == t
            for peer, o, b, off, nb in zip(
                s.send_peer[m], s.send_order[m], s.send_buf[m], s.send_off[m], s.send_bytes[m],
                strict=True,
            ):
                src = stage[s.rank] if b == STAGING else in_bufs[s.rank][b]
                wire[(s.rank, int(peer), int(o))] = src[off : off + nb].copy()
        for s in scheds:
            m = s.recv_round == t
            for peer, o, b, off, nb in zip(
                s.recv_peer[m], s.recv_order[m], s.recv_buf[m], s.recv_off[m], s.recv_bytes[m],
                strict=True,
            ):
                dst = stage[s.rank] if b == STAGING else outs[s.rank][b]
                dst[off : off + nb] = wire.pop((int(peer), s.rank, int(o)))
        assert not wire, f"round {t}: unmatched sends {sorted(wire)[:3]}"
    return outs


def run_async(scheds):
    """Model of the executor's wait rule: does every operation complete?

    A rank posts round ``t`` once its staging operations of round ``t - 1``
    completed; an operation completes once both of its ends are posted. No
    global clock: ranks advance whenever they can, in any order.
    """
    posted = set()
    done = set()
    nxt = [0] * len(scheds)
    staged_prev: list[list[tuple]] = [[] for _ in scheds]
    progress = True
    while progress:
        progress = False
        for s in scheds:
            r = s.rank
            t = nxt[r]
            if t >= s.num_rounds or not all(k in done for k in staged_prev[r]):
                continue
            staged = []
            for sel, kind in (((s.recv_round == t), "r"), ((s.send_round == t), "s")):
                peers = s.recv_peer if kind == "r" else s.send_peer
                orders = s.recv_order if kind == "r" else s.send_order
                bufs = s.recv_buf if kind == "r" else s.send_buf
                for peer, o, b in zip(peers[sel], orders[sel], bufs[sel], strict=True):
                    key = (int(peer), r, int(o)) if kind == "r" else (r, int(peer), int(o))
                    posted.add((key, kind))
                    if (key, "s" if kind == "r" else "r") in posted:
                        done.add(key)
                    if b == STAGING:
                        staged.append(key)
            staged_prev[r] = staged
            nxt[r] = t + 1
            progress = True
    total = sum(s.num_sends for s in scheds)
    return len(done) == total and all(nxt[s.rank] == s.num_rounds for s in scheds)


def run_streams(scheds, in_bufs, out_bufs, seed=0):
    """Model of the per-stream executor; returns the outputs, or None if it gets stuck.

    Every rank posts its ``first_recvs`` and ``first_sends``; each forwarded
    stream is a thread doing what ``Transport._run_streams`` does (wait for
    step j, first for the forwards up to ``after[j]`` if its receives are not
    posted yet, post its forwards, wait for the forwards of step j - 1, post
    the receives of every step whose ``after`` is done). A message completes,
    in random order, once both ends are posted; its bytes are read from the sender and written
    to the receiver at that moment, so a slot re-used too early corrupts the
    output. Threads advance in random order too.
    """
    rng = np.random.default_rng(seed)
    dfs = [s.dataflow() for s in scheds]
    stage = [np.full(s.staging_bytes, 0xEE, np.uint8) for s in scheds]
    outs = [[b.copy() for b in ob] for ob in out_bufs]
    for s in scheds:
        for sb, so, rb, ro, nb in zip(
            s.copy_send_buf, s.copy_send_off, s.copy_recv_buf, s.copy_recv_off, s.copy_bytes,
            strict=True,
        ):
            outs[s.rank][rb][ro : ro + nb] = in_bufs[s.rank][sb][so : so + nb]
    ends = {}  # message key -> {"s": (rank, j), "r": (rank, i)}
    done = set()

    def key(rank, kind, idx):
        peer, order = (dfs[rank].recvs if kind == "r" else dfs[rank].sends)[idx][:2]
        return (peer, rank, order) if kind == "r" else (rank, peer, order)

    def post(rank, kind, idx):
        k = key(rank, kind, idx)
        assert kind not in ends.get(k, {}), f"message {k} posted twice"
        ends.setdefault(k, {})[kind] = (rank, idx)

    def thread(rank, steps, after):
        n = len(steps)
        nxt = next((j for j, a in enumerate(after) if a >= 0), n)
        freed = -1

        def free(upto):
            nonlocal freed, nxt
            for j in range(freed + 1, upto + 1):
                for k in steps[j][1]:
                    yield key(rank, "s", k)
            freed = max(freed, upto)
            while nxt < n and after[nxt] <= freed:
                for i in steps[nxt][0]:
                    post(rank, "r", i)
                nxt += 1

        for c, (rs, ss) in enumerate(steps):
            if c >= nxt:
                yield from free(after[c])
            for i in rs:
                yield key(rank, "r", i)
            for j in ss:
                post(rank, "s", j)
            if c >= 1:
                yield from free(c - 1)
        yield from free(n - 1)

    for r, df in enumerate(dfs):
        for i in df.first_recvs:
            post(r, "r", i)
        for j in df.first_sends:
            post(r, "s", j)
    threads = []
    for r, df in enumerate(dfs):
        for steps, after in zip(df.streams, df.after, strict=True):
            gen = thread(r, steps, after)
            threads.append([gen, next(gen, None)])
    total = sum(s.num_sends for s in scheds)
    while True:
        ready = [k for k, e in ends.items() if len(e) == 2 and k not in done]
        runnable = [t for t in threads if t[1] is not None and t[1] in done]
        if not ready and not runnable:
            break
        pick = int(rng.integers(len(ready) + len(runnable)))
        if pick < len(ready):
            k = ready[pick]
            (sr, j), (rr, i) = ends[k]["s"], ends[k]["r"]
            _, _, sb, so, nb = dfs[sr].sends[j]
            _, _, rb, ro, nb2 = dfs[rr].recvs[i]
            assert nb == nb2
            src = stage[sr] if sb == STAGING else in_bufs[sr][sb]
            dst = stage[rr] if rb == STAGING else outs[rr][rb]
            dst[ro : ro + nb] = src[so : so + nb]
            done.add(k)
        else:
            t = runnable[pick - len(ready)]
            t[1] = next(t[0], None)
    stuck = len(done) != total or any(t[1] is not None for t in threads)
    return None if stuck else outs


def expected_a2a(rows, in_bufs):
    n = rows.shape[0]
    out = []
    for d in range(n):
        parts = []
        for s in range(n):
            lo = int(rows[s, :d].sum())
            parts.append(in_bufs[s][0][lo : lo + rows[s, d]])
        out.append(np.concatenate(parts) if parts else np.zeros(0, np.uint8))
    return out


def fragments_of(plan, pair_bytes, min_split=0):
    ps = plan.paths
    pair = ps.src[plan.flow_path].astype(np.int64) * ps.num_ranks + ps.dst[plan.flow_path]
    return split_fragments(pair, plan.flow_path, plan.flow_bytes, pair_bytes,
                           min_split_bytes=min_split)


def forced_plan(fab, demand, kinds):
    """All of each pair's bytes on its first candidate path of one of ``kinds`` (roles)."""
    return pw.plan.pinned(fab, demand, kinds)


def schedule_all(rows, plan, chunk, window, min_split=0):
    seg = Segments.all_to_all(rows)
    fpair, fpath, fbytes = fragments_of(plan, rows, min_split)
    routes = path_routes(plan.paths)
    return build_schedules(
        seg, Fragments(fpair, fbytes, routes[fpath]), chunk_bytes=chunk, window=window
    )


def random_bufs(rows, rng):
    n = rows.shape[0]
    ins = [[rng.integers(0, 256, int(rows[r].sum()), dtype=np.uint8)] for r in range(n)]
    outs = [[np.full(int(rows[:, r].sum()), 0xAB, np.uint8)] for r in range(n)]
    return ins, outs


# ------------------------------------------------------------------ routes
def test_path_routes_are_the_gpu_vertices_of_each_path():
    name_rank = {
        FAB8.vertex_names[v]: int(FAB8.vertex_rank[v])
        for v in range(FAB8.num_vertices)
        if FAB8.vertex_rank[v] >= 0
    }
    for pid in range(PS8.num_paths):
        want = [name_rank[v] for v in PS8.path_vertices(pid) if v in name_rank]
        got = ROUTES8[pid][ROUTES8[pid] >= 0].tolist()
        assert got == want, PS8.describe(pid)
        assert got[0] == PS8.src[pid] and got[-1] == PS8.dst[pid]
    # drd: source, forwarder on the source node, forwarder on the destination node, destination
    drd = [p for p in PS8.pair_paths(0, 5) if PS8.rail_role(p) == "drd"]
    assert ROUTES8[drd[0]][ROUTES8[drd[0]] >= 0].tolist() == [0, 2, 6, 5]


# --------------------------------------------------------------- fragments
def split_reference(flow_pair, flow_weight, pair_bytes):
    """Slow twin of split_fragments' proportional rounding (exact fractions)."""
    out = []
    n = pair_bytes.shape[0]
    for p in sorted(set(flow_pair)):
        idx = [i for i, q in enumerate(flow_pair) if q == p]
        total = sum(flow_weight[i] for i in idx)
        L = int(pair_bytes.reshape(-1)[p]) if p % (n + 1) else 0
        cum, prev = 0, 0
        for k, i in enumerate(idx):
            cum += flow_weight[i]
            if k == len(idx) - 1:
                hi = L
            else:
                frac = Fraction(cum, total)
                q = round(frac * (1 << 20))  # rint of the exact ratio (ties never occur here)
                hi = (L * q) >> 20
            out.append(hi - prev)
            prev = hi
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 1000)), min_size=1, max_size=10),
    st.integers(0, 10**9),
)
def test_split_fragments_matches_exact_reference(flows, seed):
    rng = np.random.default_rng(seed)
    n = 2
    pair_bytes = rng.integers(0, 10**7, (n, n))
    flows = sorted({(1 + (p % 2), i): w for i, (p, w) in enumerate(flows)}.items())
    fpair = [k[0] for k, _ in flows]
    fpath = [k[1] for k, _ in flows]
    fw = [w for _, w in flows]
    flat = pair_bytes.reshape(-1)
    flat[[p for p in range(n * n) if p not in fpair]] = 0
    got_pair, got_path, got_bytes = split_fragments(fpair, fpath, fw, pair_bytes)
    ref = split_reference(fpair, fw, pair_bytes)
    want = [(p, q, b) for p, q, b in zip(fpair, fpath, ref, strict=True) if b > 0]
    assert list(zip(got_pair.tolist(), got_path.tolist(), got_bytes.tolist(), strict=True)) == want
    # bytes conserved per pair with flows
    for p in set(fpair):
        assert got_bytes[got_pair == p].sum() == pair_bytes.reshape(-1)[p]


def test_split_fragments_threshold_and_orphans():
    L = np.array([[0, 5, 0], [100, 0, 0], [0, 0, 0]])
    # pair 1 (0->1) has two flows: below the threshold it goes whole on the heavier
    fp, fpath, fb = split_fragments([1, 1, 3], [10, 11, 12], [1, 2, 1], L, min_split_bytes=6)
    assert (fp.tolist(), fpath.tolist(), fb.tolist()) == ([1, 3], [11, 12], [5, 100])
    fp, fpath, fb = split_fragments([1, 1, 3], [10, 11, 12], [1, 2, 1], L, min_split_bytes=5)
    assert (fp.tolist(), fpath.tolist(), fb.tolist()) == ([1, 1, 3], [10, 11, 12], [1, 4, 100])
    L[1, 2] = 7
    with pytest.raises(ValueError, match=r"pair \(1, 2\) has 7 bytes but no path"):
        split_fragments([1, 1, 3], [10, 11, 12], [1, 2, 1], L)
    default = np.arange(9) + 100
    fp, fpath, fb = split_fragments([1, 3], [10, 12], [1, 1], L, default_path=default)
    assert (fp.tolist(), fpath.tolist(), fb.tolist()) == ([1, 3, 5], [10, 12, 105], [5, 100, 7])


# ---------------------------------------------------------------- schedules
def test_direct_only_plan_is_chunked_without_staging():
    # demand only inside nodes and between rail-matched GPUs: routes without forwarders
    rows = np.zeros((8, 8), dtype=np.int64)
    for s in range(8):
        for d in range(8):
            if s != d and (s // 4 == d // 4 or s % 4 == d % 4):
                rows[s, d] = 1000 + 10 * s + d
    plan = forced_plan(FAB8, np.where(np.eye(8, dtype=bool), 0, rows), ("direct", "matched"))
    assert all((ROUTES8[p] >= 0).sum() == 2 for p in plan.flow_path)
    scheds = schedule_all(rows, plan, chunk=64, window=2)
    check_schedules(scheds, 2)
    # direct fragments are chunked too: ceil(bytes / 64) messages per pair; the
    # largest pair (1000 + 77 bytes, 17 chunks) enters one chunk per round
    assert all(s.num_rounds == 17 and s.staging_bytes == 0 and not s.forwards for s in scheds)
    for s in scheds:
        want = sum(-(-int(rows[s.rank, d]) // 64) for d in range(8) if d != s.rank)
        assert s.num_sends == want and s.send_bytes.max() <= 64
    rng = np.random.default_rng(0)
    ins, outs = random_bufs(rows, rng)
    got = run_rounds(scheds, ins, outs)
    for d, want in enumerate(expected_a2a(rows, ins)):
        assert np.array_equal(got[d][0], want)
    intra = forced_plan(pw.fabric.preset("cluster:nodes=1,gpus_per_node=4,node_kind=nvlink-mesh"),
                        np.where(np.eye(4, dtype=bool), 0, 3000), ("direct",))
    sch = schedule_all(np.full((4, 4), 3000), intra, chunk=100, window=2)
    assert all(s.num_rounds == 30 and s.staging_bytes == 0 and not s.forwards for s in sch)
    assert all(s.num_sends == 90 and s.send_bytes.tolist() == [100] * 90 for s in sch)
    assert all(s.copy_bytes.tolist() == [3000] for s in sch)


def test_direct_and_relayed_parts_are_both_chunked():
    # Pair 0 -> 1 of 10 000 bytes: 7000 straight over [0, 1], 3000 relayed over [0, 2, 1].
    rows = np.zeros((3, 3), dtype=np.int64)
    rows[0, 1] = 10_000
    seg = Segments.all_to_all(rows)
    routes = [[0, 1, -1], [0, 2, 1]]
    ins, outs = random_bufs(rows, np.random.default_rng(7))
    for chunk in (9, 999, 1000, 1 << 20):  # 9: a chunk that divides neither part
        scheds = build_schedules(
            seg, Fragments([1, 1], [7000, 3000], routes), chunk_bytes=chunk, window=2
        )
        check_schedules(scheds, 2)
        src, dst = scheds[0], scheds[1]
        to_1 = src.send_peer == 1
        # the direct part: ceil(7000 / chunk) messages from offset 0, in order
        k = -(-7000 // chunk)
        assert src.send_bytes[to_1].sum() == 7000 and int(to_1.sum()) == k
        assert src.send_off[to_1].tolist() == [c * chunk for c in range(k)]
        from_0 = dst.recv_peer == 0
        assert dst.recv_bytes[from_0].sum() == 7000 and int(from_0.sum()) == k
        # the relayed part: cut into ceil(3000 / chunk) chunks on both hops
        nchunks = -(-3000 // chunk)
        assert int((src.send_peer == 2).sum()) == nchunks == scheds[2].num_sends
        assert int((dst.recv_peer == 2).sum()) == nchunks
        assert np.array_equal(run_rounds(scheds, ins, outs)[1][0], ins[0][0])
        assert np.array_equal(run_streams(scheds, ins, outs, chunk)[1][0], ins[0][0])
    # Several segments of one pair (batch_isend_irecv: one per message) on a
    # direct path: pieces cut at chunk and segment ends, each straight into its buffer.
    segs = Segments(2, np.array([0, 0, 2, 2, 2]), np.array([4000, 6000]), np.array([0, 1]),
                    np.array([0, 0]), np.array([1, 0]), np.array([0, 0]))
    for chunk, want in ((3000, [(0, 3000), (0, 1000), (1, 2000), (1, 3000), (1, 1000)]),
                        (1 << 20, [(0, 4000), (1, 6000)])):
        s0, s1 = build_schedules(
            segs, Fragments([1], [10_000], [[0, 1]]), chunk_bytes=chunk, window=2
        )
        assert list(zip(s0.send_buf.tolist(), s0.send_bytes.tolist(), strict=True)) == want
        assert list(zip(s1.recv_buf.tolist(), s1.recv_bytes.tolist(), strict=True)) == [
            (1 - b, nb) for b, nb in want]
        assert s1.staging_bytes == 0


def test_every_round_carries_each_fragment_in_proportion_to_its_bytes():
    """Per-round bytes of each fragment against the plan's shares, computed by hand."""
    rows = np.zeros((3, 3), dtype=np.int64)
    rows[0, 1] = 12_000
    seg = Segments.all_to_all(rows)
    routes = [[0, 1, -1], [0, 2, 1]]

    def per_round(s, peer):
        m = s.send_peer == peer
        return np.bincount(s.send_round[m], weights=s.send_bytes[m],
                           minlength=s.num_rounds).astype(int).tolist()

    # 8000 direct and 4000 relayed, chunks of 1000, window 4: the direct part
    # (8 chunks) enters 2 per round, so R = 4 and every round moves 2000 direct
    # and 1000 relayed bytes (2:1, the plan's shares); the relay forwards one
    # round later and holds 2 slots (its 4 chunks are half the largest's 8).
    sch = build_schedules(seg, Fragments([1, 1], [8000, 4000], routes), chunk_bytes=1000, window=4)
    check_schedules(sch, 4)
    assert per_round(sch[0], 1) == [2000, 2000, 2000, 2000, 0]
    assert per_round(sch[0], 2) == [1000, 1000, 1000, 1000, 0]
    assert per_round(sch[2], 1) == [0, 1000, 1000, 1000, 1000]
    assert sch[2].staging_bytes == 2 * 1000 and sch[2].dataflow().slots == [2]
    # 7000 direct and 3000 relayed, window 2: R = 7 rounds of one direct chunk;
    # relayed chunk c enters in round floor(c * 7 / 3) = 0, 2, 4.
    rows[0, 1] = 10_000
    sch = build_schedules(Segments.all_to_all(rows), Fragments([1, 1], [7000, 3000], routes),
                          chunk_bytes=1000, window=2)
    check_schedules(sch, 2)
    assert per_round(sch[0], 1) == [1000] * 7
    assert per_round(sch[0], 2) == [1000, 0, 1000, 0, 1000, 0, 0]
    assert per_round(sch[2], 1) == [0, 1000, 0, 1000, 0, 1000, 0]
    ins, outs = random_bufs(rows, np.random.default_rng(3))
    assert np.array_equal(run_rounds(sch, ins, outs)[1][0], ins[0][0])
    assert run_async(sch)


def test_empty_and_self_only_calls():
    none = np.zeros((0, 2), dtype=np.int64)
    for rows in (np.zeros((4, 4), dtype=np.int64), np.diag([5, 0, 7, 1])):
        scheds = build_schedules(
            Segments.all_to_all(rows), Fragments([], [], none), chunk_bytes=8, window=2
        )
        check_schedules(scheds, 2)
        assert [s.num_rounds for s in scheds] == [0] * 4
        assert [s.copy_bytes.sum() for s in scheds] == np.diag(rows).tolist()
        ins, outs = random_bufs(rows, np.random.default_rng(0))
        got = run_rounds(scheds, ins, outs)
        assert all(np.array_equal(got[r][0], ins[r][0]) for r in range(4))


def test_relay_stream_is_chunked_and_window_bounded():
    fab = pw.fabric.preset("cluster:nodes=1,gpus_per_node=4,node_kind=nvlink-mesh")
    ps = pw.fabric.candidate_paths(fab)
    rows = np.zeros((4, 4), dtype=np.int64)
    rows[0, 1] = 1000
    relay = next(p for p in ps.pair_paths(0, 1) if ps.kind[p] == PathKind.RELAY)
    via = int(ps.via[relay])
    seg = Segments.all_to_all(rows)
    for chunk, window in ((64, 2), (64, 4), (100, 6), (1000, 2), (7, 3)):
        scheds = build_schedules(
            seg, Fragments([1], [1000], path_routes(ps)[[relay]]), chunk_bytes=chunk, window=window
        )
        check_schedules(scheds, window)
        nchunks = -(-1000 // chunk)
        src, mid, dst = scheds[0], scheds[via], scheds[1]
        # pipeline: R = ceil(k / (window // 2)) rounds, chunk c enters in
        # round floor(c * R / k), hop h one round later; the chunks of one
        # round travel as one message unless they wrap around the relay's
        # slots (chunk c in slot c % w, w = min(window, k))
        rounds = -(-nchunks // max(1, window // 2))
        w = min(window, nchunks)
        msgs = []  # (entry round, first chunk, last chunk)
        for c in range(nchunks):
            t = c * rounds // nchunks
            if msgs and msgs[-1][0] == t and c % w != 0:
                msgs[-1][2] = c
            else:
                msgs.append([t, c, c])
        size = [min(chunk, 1000 - c * chunk) for c in range(nchunks)]
        want_bytes = [sum(size[a : b + 1]) for _, a, b in msgs]
        assert src.send_round.tolist() == [t for t, _, _ in msgs]
        assert mid.send_round.tolist() == [t + 1 for t, _, _ in msgs]
        assert src.send_bytes.tolist() == mid.send_bytes.tolist() == want_bytes
        assert dst.recv_bytes.tolist() == want_bytes
        assert src.send_off.tolist() == [a * chunk for _, a, _ in msgs]
        assert mid.send_off.tolist() == [(a % w) * min(chunk, 1000) for _, a, _ in msgs]
        assert src.send_order.tolist() == list(range(len(msgs)))
        # window: the relay holds at most `window` chunks of the stream
        assert mid.staging_bytes == w * min(chunk, 1000)
        assert run_async(scheds)
        rng = np.random.default_rng(chunk)
        ins, outs = random_bufs(rows, rng)
        got = run_rounds(scheds, ins, outs)
        assert np.array_equal(got[1][0], ins[0][0])
        # per stream: the relay's one stream, a step per message (keyed by
        # its last chunk); a step's slots are free once the step holding
        # chunk last - w before them was forwarded
        df = mid.dataflow()
        assert df.slots == [w] and len(df.streams[0]) == len(msgs)
        assert [len(rs) for rs, _ in df.streams[0]] == [1] * len(msgs)
        last = [b for _, _, b in msgs]
        assert df.after == [[-1 if b < w else next(j for j, e in enumerate(last) if e >= b - w)
                             for b in last]]
        assert sorted(df.first_recvs) == [j for j, b in enumerate(last) if b < w]
        for seed in range(3):
            got = run_streams(scheds, ins, outs, seed)
            assert got is not None and np.array_equal(got[1][0], ins[0][0])


def test_whole_streams_stage_every_chunk_and_keep_the_rounds():
    """gloo's staging (``whole_streams``): a slot per chunk, every staging receive
    posted first, the rounds of ``window`` unchanged; ``send_final`` marks the
    sends the peer keeps."""
    fab = pw.fabric.preset("cluster:nodes=1,gpus_per_node=4,node_kind=nvlink-mesh")
    ps = pw.fabric.candidate_paths(fab)
    rows = np.zeros((4, 4), dtype=np.int64)
    rows[0, 1], rows[0, 2] = 1000, 300
    relay = next(p for p in ps.pair_paths(0, 1) if ps.kind[p] == PathKind.RELAY
                 and ps.via[p] == 3)
    direct = next(p for p in ps.pair_paths(0, 2) if ps.kind[p] == PathKind.DIRECT)
    via = 3
    seg = Segments.all_to_all(rows)
    args = (seg, Fragments([1, 2], [1000, 300], path_routes(ps)[[relay, direct]]))
    windowed = build_schedules(*args, chunk_bytes=64, window=4)
    scheds = build_schedules(*args, chunk_bytes=64, window=4, whole_streams=True)
    check_schedules(scheds, 4)
    src, mid = scheds[0], scheds[via]
    # 16 chunks of 64 (the last 40), 2 per round over R = 8 rounds: one
    # two-chunk message per round (no slot wraps), chunk c in slot c
    msgs = [(t, 2 * t, 2 * t + 1) for t in range(8)]
    size = [64] * 15 + [40]
    relayed = src.send_peer == via
    assert src.send_round[relayed].tolist() == [t for t, _, _ in msgs]
    assert src.send_round.tolist() == windowed[0].send_round.tolist()
    assert mid.send_round.tolist() == [t + 1 for t, _, _ in msgs]
    assert mid.send_bytes.tolist() == [size[a] + size[b] for _, a, b in msgs]
    assert mid.send_off.tolist() == [a * 64 for _, a, _ in msgs]
    assert mid.staging_bytes == 16 * 64 and windowed[via].staging_bytes == 4 * 64
    df = mid.dataflow()
    assert df.after == [[-1] * 8] and sorted(df.first_recvs) == list(range(8))
    # the peer keeps: the direct fragment's sends and the relay's forwards
    assert src.send_final.tolist() == [not r for r in relayed.tolist()]
    assert mid.send_final.tolist() == [True] * 8
    assert run_async(scheds)
    ins, outs = random_bufs(rows, np.random.default_rng(7))
    for got in (run_rounds(scheds, ins, outs), run_streams(scheds, ins, outs, 1)):
        assert np.array_equal(got[1][0], ins[0][0][:1000])
        assert np.array_equal(got[2][0], ins[0][0][1000:])


def test_drd_route_has_two_forwarders_each_with_own_staging():
    rows = np.zeros((8, 8), dtype=np.int64)
    rows[0, 5] = 5000
    plan = forced_plan(FAB8, np.where(np.eye(8, dtype=bool), 0, rows), ("drd",))
    (pid,) = plan.flow_path.tolist()
    route = ROUTES8[pid][ROUTES8[pid] >= 0].tolist()
    assert len(route) == 4 and PS8.rail_role(pid) == "drd"
    scheds = schedule_all(rows, plan, chunk=512, window=4)
    check_schedules(scheds, 4)
    for r in range(8):
        want = 4 * 512 if r in route[1:3] else 0
        assert scheds[r].staging_bytes == want
    assert run_async(scheds)
    ins, outs = random_bufs(rows, np.random.default_rng(1))
    assert np.array_equal(run_rounds(scheds, ins, outs)[5][0], ins[0][0])
    for seed in range(3):
        assert np.array_equal(run_streams(scheds, ins, outs, seed)[5][0], ins[0][0])


def test_checker_and_async_model_catch_broken_schedules():
    """The two checks above can fail: break a valid schedule and watch them do so."""
    fab = pw.fabric.preset("cluster:nodes=1,gpus_per_node=4,node_kind=nvlink-mesh")
    ps = pw.fabric.candidate_paths(fab)
    relay = next(p for p in ps.pair_paths(0, 1) if ps.kind[p] == PathKind.RELAY)
    via = int(ps.via[relay])
    rows = np.zeros((4, 4), dtype=np.int64)
    rows[0, 1] = 400
    scheds = build_schedules(
        Segments.all_to_all(rows),
        Fragments([1], [400], path_routes(ps)[[relay]]),
        chunk_bytes=100,
        window=2,
    )
    mid = scheds[via]
    # forward a chunk in the round it arrives: data not there yet
    early = dataclasses.replace(mid, send_round=mid.send_round - 1)
    bad = list(scheds)
    bad[via] = early
    with pytest.raises(AssertionError):
        check_schedules(bad, 2)
    # a receive posted a round late: the sender's round has no partner
    late = dataclasses.replace(scheds[1], recv_round=scheds[1].recv_round + 1)
    bad = list(scheds)
    bad[1] = late
    with pytest.raises(AssertionError):
        check_schedules(bad, 2)
    # a cyclic wait: the relay waits on a receive that the source posts only
    # after waiting on the relay (swap the source's rounds with a later one)
    s0 = scheds[0]
    cyc = dataclasses.replace(
        s0, send_round=s0.send_round + 5, num_rounds=s0.num_rounds + 5,
        send_ptr=np.searchsorted(s0.send_round + 5, np.arange(s0.num_rounds + 6)),
        recv_ptr=np.zeros(s0.num_rounds + 6, dtype=np.int64),
    )
    # rank 0 now also forwards (fake): it waits for a receive nobody sends
    cyc = dataclasses.replace(
        cyc, recv_round=np.array([0]), recv_peer=np.array([via]), recv_order=np.array([99]),
        recv_buf=np.array([STAGING]), recv_off=np.array([0]), recv_bytes=np.array([1]),
        staging_bytes=1,
    )
    assert not run_async([cyc, *scheds[1:]])
    # per-stream model: a receive nobody sends leaves the stream stuck
    ins, outs = random_bufs(rows, np.random.default_rng(0))
    assert run_streams(scheds, ins, outs) is not None
    lost = dataclasses.replace(scheds[1], recv_order=scheds[1].recv_order + 100)
    assert run_streams([*scheds[:1], lost, *scheds[2:]], ins, outs) is None
    # ... and a relay re-using a slot before its forward is done corrupts bytes
    # (it believes it has one slot more than its staging holds)
    greedy = dataclasses.replace(mid, stream_window=mid.stream_window + 1)
    outcomes = [run_streams([*scheds[:via], greedy, *scheds[via + 1 :]], ins, outs, seed)
                for seed in range(20)]
    assert any(o is not None and not np.array_equal(o[1][0], ins[0][0]) for o in outcomes)


hypo_settings = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@hypo_settings
@given(
    seed=st.integers(0, 2**31),
    sparsity=st.floats(0, 0.9),
    policy=st.sampled_from(["static", "mwu", "deepep", "relay", "drd", "rd"]),
    chunk=st.sampled_from([50, 333, 4096]),
    window=st.integers(2, 6),
    min_split=st.sampled_from([0, 500, 10**9]),
)
def test_schedules_move_every_byte_to_its_place(seed, sparsity, policy, chunk, window, min_split):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 2000, (8, 8))
    rows[rng.random((8, 8)) < sparsity] = 0
    rows[rng.integers(8)] = 0  # a rank that sends nothing
    demand = np.where(np.eye(8, dtype=bool), 0, rows)
    if policy in ("relay", "drd", "rd"):
        plan = forced_plan(FAB8, demand, (policy,))
    else:
        plan = pw.plan.make(FAB8, demand, policy)
    scheds = schedule_all(rows, plan, chunk, window, min_split)
    check_schedules(scheds, window)
    assert run_async(scheds)
    # the window bound at every rank
    _, fpath, _ = fragments_of(plan, rows, min_split)
    for s in scheds:
        through = [
            i for i, p in enumerate(fpath)
            if s.rank in ROUTES8[p][1:][ROUTES8[p][1:] >= 0][:-1].tolist()
        ]
        assert s.staging_bytes <= len(through) * window * chunk
    ins, outs = random_bufs(rows, rng)
    got = run_rounds(scheds, ins, outs)
    streamed = run_streams(scheds, ins, outs, seed)
    for d, want in enumerate(expected_a2a(rows, ins)):
        assert np.array_equal(got[d][0], want), f"rank {d}"
        assert np.array_equal(streamed[d][0], want), f"rank {d}, per stream"


@hypo_settings
@given(seed=st.integers(0, 2**31), chunk=st.sampled_from([5, 50, 10**6]),
       policy=st.sampled_from(["mwu", "relay", "drd"]))
def test_multi_segment_pair_streams(seed, chunk, policy):
    """batch_isend_irecv layout: several messages per pair, each its own buffer."""
    rng = np.random.default_rng(seed)
    n = 8
    msgs = []  # (src, dst, nbytes)
    for _ in range(int(rng.integers(1, 20))):
        s, d = rng.choice(n, 2, replace=False)
        msgs.append((int(s), int(d), int(rng.integers(1, 300))))
    send_idx = {}
    recv_idx = {}
    matches = []
    for s, d, nb in msgs:
        si = send_idx.setdefault(s, [])
        ri = recv_idx.setdefault(d, [])
        matches.append((s, d, len(si), len(ri), nb))
        si.append(nb)
        ri.append(nb)
    segs = orch_mod._p2p_segments(matches, n)
    pair_bytes = segs.pair_bytes
    if policy == "mwu":
        plan = pw.plan.make(FAB8, pair_bytes, "mwu")
    else:
        plan = forced_plan(FAB8, pair_bytes, (policy,))
    fpair, fpath, fbytes = fragments_of(plan, pair_bytes)
    scheds = build_schedules(
        segs, Fragments(fpair, fbytes, ROUTES8[fpath]), chunk_bytes=chunk, window=2
    )
    check_schedules(scheds, 2)
    assert run_async(scheds)
    ins = [[rng.integers(0, 256, nb, dtype=np.uint8) for nb in send_idx.get(r, [])]
           for r in range(n)]
    outs = [[np.zeros(nb, np.uint8) for nb in recv_idx.get(r, [])] for r in range(n)]
    got = run_rounds(scheds, ins, outs)
    streamed = run_streams(scheds, ins, outs, seed)
    for s, d, si, ri, _ in matches:
        assert np.array_equal(got[d][ri], ins[s][si])
        assert np.array_equal(streamed[d][ri], ins[s][si])


# ------------------------------------------------------------ orchestrator
def test_quantise_keeps_five_significant_bits():
    x = np.random.default_rng(0).integers(0, 1 << 40, 10000)
    q = orch_mod.quantise(x)
    assert np.all(q <= x) and np.all(x - q <= x / 16)
    assert np.all((q > 0) == (x > 0))
    assert np.all(np.diff(q[np.argsort(x)]) >= 0)
    assert orch_mod.quantise(np.array([1000, 1020, 1024, 1056, 1088])).tolist() == [
        992, 992, 1024, 1024, 1088
    ]


def _group_state(fab):
    return orch_mod._GroupState(SimpleNamespace(rank=0, size=fab.num_ranks), fab,
                                pw.fabric.candidate_paths(fab))


def test_auto_uses_multipath_only_for_a_predicted_gain():
    orch = pw.Orchestrator(fabric=FAB8, min_split_bytes=1 << 20)
    st_ = _group_state(FAB8)
    uniform = pw.traffic.uniform(8, bytes_per_rank=64 << 20).astype(np.int64)
    dec, cached = orch._decide(st_, uniform)
    assert not dec.multipath and not cached  # mwu cannot beat static on balanced traffic
    hot = pw.traffic.hotspot(8, bytes_per_rank=64 << 20, ratio=0.8).astype(np.int64)
    dec, _ = orch._decide(st_, hot)
    static_s = pw.plan.make(FAB8, orch_mod.quantise(hot), "static").congestion_s
    assert dec.multipath and dec.predicted_s * 1.2 <= static_s
    small = (hot // (1 << 10)).astype(np.int64)  # largest pair below min_split_bytes
    assert not orch._decide(st_, small)[0].multipath
    forced = pw.Orchestrator(fabric=FAB8, enabled=True)
    assert forced._decide(_group_state(FAB8), uniform)[0].multipath
    off = pw.Orchestrator(fabric=FAB8, enabled=False)
    dec, _ = off._decide(_group_state(FAB8), hot)
    assert not dec.multipath and off.stats.plans_made == 0


def test_plan_cache_and_hysteresis():
    orch = pw.Orchestrator(fabric=FAB8, policy="mwu", enabled=True, hysteresis=0.2)
    st_ = _group_state(FAB8)
    hot = pw.traffic.hotspot(8, bytes_per_rank=64 << 20, ratio=0.8).astype(np.int64)
    d1, c1 = orch._decide(st_, hot)
    d2, c2 = orch._decide(st_, hot + 1)  # same quantised demand: no planning
    assert (c1, c2) == (False, True) and d2 is d1 and orch.stats.plans_made == 1
    # a slightly different pattern: a new plan is made but not taken (not 20% better)
    nudged = hot.copy()
    nudged[0, 1] = nudged[0, 1] * 3 // 2
    d3, _ = orch._decide(st_, nudged)
    assert orch.stats.plans_made == 2 and d3 is d1
    # a very different pattern the current plan cannot serve well: switch
    other = pw.traffic.hotspot(8, bytes_per_rank=64 << 20, ratio=0.8, hot=5).astype(np.int64)
    d4, _ = orch._decide(st_, other)
    assert d4 is not d1 and orch.stats.plan_switches == 1
    # back to the first pattern: cached plan, no planning
    made = orch.stats.plans_made
    orch._decide(st_, hot)
    assert orch.stats.plans_made == made


def test_orchestrator_argument_errors():
    with pytest.raises(ValueError, match="window must be >= 2, got 1"):
        pw.Orchestrator(window=1)
    with pytest.raises(TypeError, match="chunk_bytes must be an int"):
        pw.Orchestrator(chunk_bytes=1.5)
    for chunk in (0, 1, 3, orch_mod.MIN_CHUNK_BYTES - 1):
        with pytest.raises(ValueError, match=f"chunk_bytes must be >= 4096, got {chunk}$"):
            pw.Orchestrator(chunk_bytes=chunk)
    assert pw.Orchestrator(chunk_bytes=orch_mod.MIN_CHUNK_BYTES).chunk_bytes == 4096
    with pytest.raises(ValueError, match=r"window must be <= 64 .*got 65$"):
        pw.Orchestrator(window=orch_mod.MAX_WINDOW + 1)
    assert pw.Orchestrator(window=orch_mod.MAX_WINDOW).window == 64
    with pytest.raises(ValueError, match="enabled must be 'auto', True or False"):
        pw.Orchestrator(enabled="yes")
    with pytest.raises(pw.errors.PlanError, match="unknown policy 'fastest'"):
        pw.Orchestrator(policy="fastest")
    with pytest.raises(pw.errors.FabricError, match="neither a preset"):
        pw.Orchestrator(fabric="no-such-fabric")


def test_import_pathweave_imports_neither_torch_nor_the_lp_solver():
    # each costs every process that imports pathweave (a torchrun rank, a CLI
    # call) a few tenths of a second; scipy's LP comes with the first LP solved
    import subprocess
    import sys

    code = (
        "import sys, pathweave as pw\n"
        "assert 'torch' not in sys.modules\n"
        "orch = pw.Orchestrator(fabric='h100-2x4')\n"
        "assert 'torch' not in sys.modules\n"
        "D = pw.traffic.hotspot(8, bytes_per_rank=1 << 20, ratio=0.5)\n"
        "pw.plan.make('h100-2x4', D)\n"
        "assert 'scipy.optimize' not in sys.modules\n"
        "assert pw.plan.make('h100-2x4', D, 'optimal').info['solver_status'] == 'optimal'\n"
        "assert 'scipy.optimize' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_policy_options_with_a_callable_are_refused():
    with pytest.raises(TypeError, match=r"policy options \(fraction\) apply to registered"):
        pw.Orchestrator(policy=lambda fab, d: None, fraction=0.3)


def test_default_fabric_from_environment(monkeypatch):
    monkeypatch.delenv("PATHWEAVE_FABRIC", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    fab = orch_mod.default_fabric(8)
    assert (fab.num_nodes, fab.gpus_per_node, fab.nvlink_kind) == (2, 4, "nvswitch")
    assert orch_mod.default_fabric(8, is_world=False).num_nodes == 1
    monkeypatch.setenv("PATHWEAVE_FABRIC", "h100-2x4")
    assert orch_mod.default_fabric(8).name == "h100-2x4"
    with pytest.raises(pw.errors.FabricError, match="has 8 ranks but the process group has 4"):
        orch_mod.default_fabric(4)


# ---------------------------------------------------------- validation rows
def _decode_two(args0, args1):
    """Encode two ranks' arguments in one process and decode the rows as every rank would."""
    from pathweave.runtime import _validate as V

    outs = np.zeros((2, 2), dtype=np.int64)
    rows = [V.encode_a2a(*args, 2, outs=outs[r]) for r, args in enumerate((args0, args1))]
    return V.decode_a2a(np.stack(rows), outs)


def test_validation_rows_accept_any_int_sequence_and_name_bad_ones():
    import torch  # a hard dependency: a broken install fails here, not skips
    x = torch.zeros(4, 3)
    ok = (x, x, [2, 2], [2, 2])
    for splits in ([2, 2], (2, 2), np.array([2, 2]), torch.tensor([2, 2]), [2.0, 2.0]):
        lay = _decode_two(ok, (x, x, [2, 2], splits))
        assert lay.in_rows.tolist() == [[2, 2], [2, 2]] and lay.row_bytes == 12
    for splits, exc, msg in (
        ([2.5, 1.5], TypeError, "rank 1: input_split_sizes must be a sequence of ints, got list"),
        (4, TypeError, "rank 1: input_split_sizes must be a sequence of ints, got int"),
        ([True, False], TypeError, "must be a sequence of ints"),
        ("22", TypeError, "got str"),
        ([4], ValueError, "rank 1: input_split_sizes has 1 entries, expected 2 (group size)"),
        ([5, -1], ValueError, "rank 1: input_split_sizes[1] = -1 is negative"),
        ([1, 1], ValueError, "rank 1: input_split_sizes add up to 2 rows but input has 4 rows"),
    ):
        with pytest.raises(exc, match=re.escape(msg)):
            _decode_two(ok, (x, x, [2, 2], splits))
    with pytest.raises(ValueError, match=re.escape("rank 1's input split for rank 0 is 1 rows "
                                                   "but rank 0's output split for rank 1 is 2")):
        _decode_two(ok, (x, x, [2, 2], [1, 3]))
    with pytest.raises(ValueError, match=re.escape("input has 5 rows, not divisible by the "
                                                   "group size 2")):
        _decode_two(ok, (x, torch.zeros(5, 3), [2, 2], None))
    with pytest.raises(TypeError, match="input has dtype int64 but output has dtype float32"):
        _decode_two(ok, (x, x.long(), [2, 2], [2, 2]))
    with pytest.raises(ValueError, match=re.escape("input rows have shape (1, 3) but output rows "
                                                   "have shape (3,)")):
        _decode_two(ok, (x, torch.zeros(4, 1, 3), [2, 2], [2, 2]))
    with pytest.raises(ValueError, match="rank 1: input is a 0-dimensional tensor"):
        _decode_two(ok, (x, torch.tensor(1.0), [2, 2], [2, 2]))


def test_a_call_beyond_the_tag_range_is_refused_before_any_message(monkeypatch):
    # With the range cut to 4 messages per rank pair: 8 bytes in 2-byte chunks
    # are 4 messages (allowed), 10 bytes are 5 (refused, naming the pair).
    from pathweave.runtime import schedule as S

    monkeypatch.setattr(S, "MAX_PAIR_MESSAGES", 4)
    ok = S.build_schedules(
        S.Segments.all_to_all(np.array([[0, 8], [0, 0]])),
        S.Fragments([1], [8], [[0, 1]]),
        chunk_bytes=2,
        window=2,
    )
    assert ok[0].send_bytes.tolist() == [2, 2, 2, 2]
    with pytest.raises(ValueError, match=r"rank 0 would send rank 1 5 or more messages in "
                                         r"one call at chunk_bytes=2; at most 4 fit"):
        S.build_schedules(
            S.Segments.all_to_all(np.array([[0, 10], [0, 0]])),
            S.Fragments([1], [10], [[0, 1]]),
            chunk_bytes=2,
            window=2,
        )


def _ops(s, kind):
    rnd, peer, nb, off = (getattr(s, f"{kind}_{k}") for k in ("round", "peer", "bytes", "off"))
    return list(zip(rnd.tolist(), peer.tolist(), nb.tolist(), off.tolist(), strict=True))


def _moves_every_byte(scheds, rows, seed=0):
    ins, outs = random_bufs(rows, np.random.default_rng(seed))
    want = expected_a2a(rows, ins)
    assert run_async(scheds)
    for got in (run_rounds(scheds, ins, outs), run_streams(scheds, ins, outs, seed)):
        assert got is not None
        assert all(np.array_equal(got[d][0], want[d]) for d in range(rows.shape[0]))


def test_a_fragments_chunks_of_one_round_travel_as_one_message():
    # Hand-computed: pair 0->2 of 26 bytes, 16 direct then 10 relayed via 1;
    # chunk 4, window 4: R = ceil(4 chunks / 2) = 2 rounds. The direct
    # fragment's chunks enter in rounds 0, 0, 1, 1 (two messages of 8 bytes);
    # the relayed one's 3 chunks (4, 4, 2 bytes; w = 3 slots at the relay)
    # in rounds 0, 0, 1: chunks 0-1 as one message of 8 bytes (slots 0-1 at
    # the relay), chunk 2 alone, on the first hop in rounds 0, 1 and on the
    # second in rounds 1, 2.
    rows = np.array([[0, 0, 26], [0, 0, 0], [0, 0, 0]])
    s0, s1, s2 = build_schedules(
        Segments.all_to_all(rows),
        Fragments([2, 2], [16, 10], [[0, 2, -1], [0, 1, 2]]),
        chunk_bytes=4,
        window=4,
    )
    assert _ops(s0, "send") == [(0, 1, 8, 16), (0, 2, 8, 0), (1, 1, 2, 24), (1, 2, 8, 8)]
    assert _ops(s1, "recv") == [(0, 0, 8, 0), (1, 0, 2, 8)]
    assert _ops(s1, "send") == [(1, 2, 8, 0), (2, 2, 2, 8)]
    assert s1.staging_bytes == 12
    assert _ops(s2, "recv") == [(0, 0, 8, 0), (1, 0, 8, 8), (1, 1, 8, 16), (2, 1, 2, 24)]
    check_schedules([s0, s1, s2], window=4)
    _moves_every_byte([s0, s1, s2], rows)


def test_a_forwarded_rounds_chunks_split_where_the_slots_wrap():
    # One relayed fragment 0->2 via 1 of 6 chunks of 4 bytes, window 5: R = 3
    # rounds of 2 chunks (0-1, 2-3, 4-5); the relay's w = 5 slots hold chunk c
    # in slot c % 5, so round 2's chunks 4 and 5 (slots 4 and 0) are two
    # messages. Step j (last chunks 1, 3, 4, 5) may be received once the step
    # holding chunk last - 5 was forwarded: only chunk 5, after step 0.
    rows = np.array([[0, 0, 24], [0, 0, 0], [0, 0, 0]])
    s0, s1, s2 = build_schedules(Segments.all_to_all(rows), Fragments([2], [24], [[0, 1, 2]]),
                                 chunk_bytes=4, window=5)
    assert _ops(s0, "send") == [(0, 1, 8, 0), (1, 1, 8, 8), (2, 1, 4, 16), (2, 1, 4, 20)]
    assert _ops(s1, "recv") == [(0, 0, 8, 0), (1, 0, 8, 8), (2, 0, 4, 16), (2, 0, 4, 0)]
    assert _ops(s1, "send") == [(1, 2, 8, 0), (2, 2, 8, 8), (3, 2, 4, 16), (3, 2, 4, 0)]
    assert s1.staging_bytes == 20
    df = s1.dataflow()
    assert df.slots == [5] and df.after == [[-1, -1, -1, 0]]
    assert df.first_recvs == [0, 1, 2]
    check_schedules([s0, s1, s2], window=5)
    _moves_every_byte([s0, s1, s2], rows)


def test_direct_fragments_no_forwarded_one_touches_go_whole_in_round_0():
    # Ranks 0..4; chunk 4, window 2 (one chunk per round for the largest).
    # A: 0->1, 16 bytes direct on link 0; B: 2->4 relayed via 3 (8 bytes,
    # links 5, 6); D: 3->2, 8 bytes direct on link 7. A shares no link and no
    # rank with B: whole, one message in round 0. D's ranks are B's, so it
    # stays paced (R = 4 rounds from A's 4 chunks: its chunks enter in
    # rounds 0 and 2), as B is (rounds 0, 2; forwarded in 1, 3).
    def build(dst_d, links):
        rows = np.zeros((5, 5), dtype=np.int64)
        rows[0, 1], rows[2, 4], rows[3, dst_d] = 16, 8, 8
        sch = build_schedules(
            Segments.all_to_all(rows),
            Fragments(
                [1, 14, 15 + dst_d], [16, 8, 8], [[0, 1, -1], [2, 3, 4], [3, dst_d, -1]], links
            ),
            chunk_bytes=4,
            window=2,
        )
        check_schedules(sch, 2)
        _moves_every_byte(sch, rows)
        return sch

    paced = [(t, 1, 4, 4 * t) for t in range(4)]
    sch = build(2, [[0, -1], [5, 6], [7, -1]])
    assert _ops(sch[0], "send") == [(0, 1, 16, 0)]
    assert _ops(sch[1], "recv") == [(0, 0, 16, 0)]
    assert _ops(sch[3], "send") == [(0, 2, 4, 0), (1, 4, 4, 0), (2, 2, 4, 4), (3, 4, 4, 4)]
    assert _ops(sch[2], "send") == [(0, 3, 4, 0), (2, 3, 4, 4)]
    # A sharing a link with B (link 5): paced, one chunk per round.
    assert _ops(build(2, [[5, -1], [5, 6], [7, -1]])[0], "send") == paced
    # D: 3->0 shares rank 0 with A and rank 3 with B: A is paced too (on NCCL
    # rank 0's rounds run one after another, D's among them).
    assert _ops(build(0, [[0, -1], [5, 6], [7, -1]])[0], "send") == paced
    # No frag_links: every fragment paced, as before.
    assert _ops(build(2, None)[0], "send") == paced
    # A direct-only plan (pairs inside nodes and rail-matched ones): every
    # pair one message, all in round 0.
    s_, d_ = np.indices((8, 8))
    demand = np.where((s_ != d_) & ((s_ // 4 == d_ // 4) | (s_ % 4 == d_ % 4)),
                      1000 + 10 * s_ + d_, 0)
    plan = forced_plan(FAB8, demand, ("direct", "matched"))
    fp, fpath, fb = fragments_of(plan, demand)
    sch = build_schedules(
        Segments.all_to_all(demand),
        Fragments(fp, fb, ROUTES8[fpath], PS8.links[fpath]),
        chunk_bytes=64,
        window=2,
    )
    check_schedules(sch, 2)
    assert all(s.num_rounds == 1 and s.num_sends == s.num_recvs == 4 for s in sch)
    assert all(s.send_bytes.tolist() == demand[s.rank][demand[s.rank] > 0].tolist()
               for s in sch)
    _moves_every_byte(sch, demand)
