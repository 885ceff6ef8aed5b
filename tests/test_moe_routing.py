"""The index math of MoE dispatch/combine (one process) against slow loop twins."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pathweave.moe import routing as R


def _t(a) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a), dtype=torch.int64)


def check(idx: np.ndarray, num_experts: int):
    """The device check, read back and decoded as the loop twin reports it."""
    got = R.topk_problem(R.check_topk(_t(idx), num_experts).tolist(), *idx.shape)
    return None if got[0] == 0 else got


def plan(idx, placement, local, n, **kw) -> SimpleNamespace:
    """The device send plan, trimmed and read back as numpy."""
    p = R.send_plan(_t(idx), _t(placement), _t(local), _t(R.expert_order(placement)), n, **kw)
    p = p.trim()
    return SimpleNamespace(**{f: None if getattr(p, f) is None else getattr(p, f).numpy()
                              for f in R.SendPlan.FIELDS})


# ----------------------------------------------------------- slow twins
def slow_check(idx: np.ndarray, num_experts: int):
    for i, row in enumerate(idx.tolist()):
        for j, e in enumerate(row):
            if not -1 <= e < num_experts:
                return 1, i, j, e
    for i, row in enumerate(idx.tolist()):
        for j, e in enumerate(row):
            if e >= 0 and e in row[:j]:
                return 2, i, j, e
    return None


def slow_positions(block: np.ndarray, capacity: int) -> list[int]:
    num_src, num_local = block.shape
    pos = []
    # Arrival order: source, then local expert; each expert fills by source.
    start = {}
    for s in range(num_src):
        for loc in range(num_local):
            start[s, loc] = loc * capacity + sum(block[t, loc] for t in range(s))
    for s in range(num_src):
        for loc in range(num_local):
            for r in range(block[s, loc]):
                pos.append(start[s, loc] + r)
    return pos


def slow_pairs(idx: np.ndarray, dp: int, member: int) -> list[tuple[int, int, int]]:
    return [
        (i, j, e)
        for i, row in enumerate(idx.tolist())
        for j, e in enumerate(row)
        if e >= 0 and i % dp == member
    ]


@st.composite
def routing(draw):
    num_ranks = draw(st.sampled_from([1, 2, 3, 4]))
    num_experts = draw(st.integers(1, 9))
    k = draw(st.integers(1, min(num_experts, 4)))
    m = draw(st.integers(0, 12))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    idx = np.array([rng.permutation(num_experts)[:k] for _ in range(m)], dtype=np.int64)
    idx = idx.reshape(m, k)
    idx[rng.random((m, k)) < draw(st.sampled_from([0.0, 0.3]))] = -1
    placement = rng.integers(0, num_ranks, num_experts)
    dp = draw(st.sampled_from([d for d in (1, 2, 3) if num_ranks % d == 0]))
    member = draw(st.integers(0, dp - 1))
    layout = draw(st.sampled_from(R.LAYOUTS))
    return idx, placement, num_ranks, dp, member, layout


# ----------------------------------------------------------------- tests
def test_default_placement_and_local_experts():
    assert R.default_placement(6, 3).tolist() == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="multiple of the group size"):
        R.default_placement(6, 4)
    place = np.array([2, 0, 2, 1, 0, 2])
    local, per_rank = R.local_experts(place, 4)
    for e in range(6):
        # Slow twin: position among the same rank's experts by global id.
        assert local[e] == sum(1 for f in range(e) if place[f] == place[e])
    assert per_rank.tolist() == [2, 1, 3, 0]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 8), st.integers(1, 5), st.integers(0, 10))
def test_check_topk_matches_loop(seed, num_experts, k, m):
    rng = np.random.default_rng(seed)
    idx = rng.integers(-2, num_experts + 1, (m, k))
    if rng.random() < 0.5:  # mostly valid tables too
        idx = np.clip(idx, -1, num_experts - 1)
    assert check(idx, num_experts) == slow_check(idx, num_experts)


def test_check_topk_reports_first_problem_in_row_major_order():
    idx = np.array([[0, 0], [1, 9]])  # duplicate in row 0, range error in row 1
    assert check(idx, 4) == (1, 1, 1, 9)  # range errors win: checked on the whole table
    assert check(np.array([[1, -1, 1]]), 4) == (2, 0, 2, 1)
    assert check(np.array([[-1, -1, 2]]), 4) is None
    assert check(np.zeros((0, 2), dtype=np.int64), 4) is None


@settings(max_examples=300, deadline=None)
@given(routing())
def test_send_plan_orders_and_counts(args):
    idx, placement, n, dp, member, layout = args
    local, _ = R.local_experts(placement, n)
    k = idx.shape[1]
    p = plan(idx, placement, local, n, layout=layout, dp_size=dp, member=member)
    pairs = slow_pairs(idx, dp, member)
    # Pairs per expert.
    want_ppe = np.zeros(placement.size, dtype=np.int64)
    for _, _, e in pairs:
        want_ppe[e] += 1
    assert p.pairs_per_expert.tolist() == want_ppe.tolist()
    # Return order: every pair exactly once, grouped by rank.
    ret = list(zip(p.ret_token.tolist(), p.ret_slot.tolist(), strict=True))
    assert sorted(ret) == sorted((i, j) for i, j, _ in pairs)
    for q in range(n):
        for i, j in ret[p.ret_ptr[q] : p.ret_ptr[q + 1]]:
            assert placement[idx[i, j]] == q
    if layout == "expert-major":
        rows = list(zip(p.row_token.tolist(), p.row_local.tolist(), strict=True))
        want = sorted((placement[e], local[e], i) for i, _, e in pairs)
        got = []
        for q in range(n):
            for i, loc in rows[p.row_ptr[q] : p.row_ptr[q + 1]]:
                got.append((q, loc, i))
        assert got == want  # sorted by (rank, local expert, token)
        # Combine returns pairs in dispatch order.
        assert p.ret_token.tolist() == p.row_token.tolist()
    else:
        want_rows = sorted({(placement[e], i) for i, _, e in pairs})
        got_rows = [(q, i) for q in range(n) for i in p.row_token[p.row_ptr[q]:p.row_ptr[q + 1]]]
        assert got_rows == want_rows  # one row per (rank, token), sorted
        for r, (q, i) in enumerate(got_rows):
            for j in range(k):
                e = idx[i, j]
                want_local = local[e] if e >= 0 and placement[e] == q and i % dp == member else -1
                assert p.row_local[r, j] == want_local
        want_ret = sorted((placement[e], i, j) for i, j, e in pairs)
        assert ret == [(i, j) for _, i, j in want_ret]
    # slot_row: the send row of each pair (compact: named by the token's first slot on a rank),
    # every row named exactly once.
    named = []
    for i, j, e in pairs:
        r = int(p.slot_row[i, j])
        q = int(placement[e])
        first = all(idx[i, jj] < 0 or placement[idx[i, jj]] != q for jj in range(j))
        if layout == "compact" and not first:
            assert r == -1
            continue
        assert p.row_token[r] == i and p.row_ptr[q] <= r < p.row_ptr[q + 1]
        named.append(r)
    assert sorted(named) == list(range(len(p.row_token)))
    kept = {(i, j) for i, j, _ in pairs}
    assert all(p.slot_row[i, j] == -1 for i in range(idx.shape[0]) for j in range(k)
               if (i, j) not in kept)


@settings(max_examples=300, deadline=None)
@given(routing())
def test_return_slots_match_member_plans(args):
    """Combine's receive rows: per expert rank, every DP member's pairs in its return order."""
    idx, placement, n, dp, _, layout = args
    local, _ = R.local_experts(placement, n)
    plans = [plan(idx, placement, local, n, layout=layout, dp_size=dp, member=d)
             for d in range(dp)]
    want = np.full(idx.shape, -1)
    row = 0
    for q in range(n):
        for p in plans:
            for i, j in zip(p.ret_token[p.ret_ptr[q]:p.ret_ptr[q + 1]],
                            p.ret_slot[p.ret_ptr[q]:p.ret_ptr[q + 1]], strict=True):
                want[i, j] = row
                row += 1
    got = R.return_slots(_t(idx), _t(placement), _t(R.expert_order(placement)), layout=layout,
                         dp_size=dp)
    assert got.tolist() == want.tolist()
    if dp == 1:  # the send plan's own answer, which the layer uses without DP groups
        assert plans[0].ret_row.tolist() == want.tolist()
    else:
        assert plans[0].ret_row is None


def test_routing_digest_tells_tables_apart():
    a = torch.tensor([[0, 1], [2, -1], [3, 4]])
    seen = {int(R.routing_digest(a))}
    for i in range(3):
        for j in range(2):
            b = a.clone()
            b[i, j] += 1
            seen.add(int(R.routing_digest(b)))
    assert len(seen) == 7
    assert int(R.routing_digest(a[:0])) != int(R.routing_digest(a[:1]))


def test_send_plan_dp_members_partition_the_pairs():
    rng = np.random.default_rng(3)
    idx = np.stack([rng.permutation(8)[:3] for _ in range(11)])
    place = R.default_placement(8, 4)
    local, _ = R.local_experts(place, 4)
    seen = []
    for d in range(2):
        p = plan(idx, place, local, 4, dp_size=2, member=d)
        seen += list(zip(p.ret_token.tolist(), p.ret_slot.tolist(), strict=True))
    assert sorted(seen) == sorted((i, j) for i in range(11) for j in range(3))


def test_send_plan_rejects_unknown_layout():
    with pytest.raises(ValueError, match="layout must be one of"):
        plan(np.zeros((1, 1), dtype=np.int64), np.zeros(1), np.zeros(1), 1, layout="x")


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 4), st.integers(0, 3))
def test_expert_major_positions_match_loop(seed, num_src, num_local):
    rng = np.random.default_rng(seed)
    block = rng.integers(0, 4, (num_src, num_local))
    cap = int(block.sum(axis=0).max(initial=0)) + int(rng.integers(0, 3))
    got = R.expert_major_positions(block, cap).tolist()
    assert got == slow_positions(block, cap)
    assert len(set(got)) == len(got)  # no two rows land on one slot


def test_fingerprint_tells_tables_apart():
    rng = np.random.default_rng(0)
    a = rng.integers(-1, 16, (50, 4))
    seen = {R.fingerprint(a)}
    for t in range(200):
        b = a.copy()
        i, j = rng.integers(0, 50), rng.integers(0, 4)
        b[i, j] = (b[i, j] + 1 + t % 15) % 17 - 1
        if not np.array_equal(a, b):
            assert R.fingerprint(b) != R.fingerprint(a)
        seen.add(R.fingerprint(b))
    assert R.fingerprint(a[:0]) != R.fingerprint(a[:1])
    assert 0 <= R.fingerprint(a) < 2**62
