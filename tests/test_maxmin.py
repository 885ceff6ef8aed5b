"""Max-min fair rates: the numba kernel against hand cases and its slow twin."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pathweave.sim._maxmin import (
    FlowNet,
    maxmin_rates,
    maxmin_rates_reference,
    maxmin_subset_into,
)

INF = np.inf


def _csr(flows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(flows) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(f) for f in flows])
    links = np.array([e for f in flows for e in f], dtype=np.int64)
    return ptr, links


def _both(flows, cap, fcap=None, weight=None):
    ptr, links = _csr(flows)
    cap = np.asarray(cap, dtype=np.float64)
    fcap = np.full(len(flows), INF) if fcap is None else np.asarray(fcap, dtype=np.float64)
    fast = maxmin_rates(ptr, links, cap, fcap, weight)
    slow = maxmin_rates_reference(ptr, links, cap, fcap, weight)
    # Taking a heavy flow's rate off a link leaves its light flows a
    # difference of large numbers: exact up to rounding of the capacity.
    finite = cap[np.isfinite(cap)]
    np.testing.assert_allclose(fast, slow, rtol=1e-9, atol=1e-12 * finite.max(initial=0.0))
    return fast


# ------------------------------------------------------------------ hand cases
def test_one_flow_gets_the_link():
    assert _both([[0]], [7.0]).tolist() == [7.0]


def test_equal_flows_split_a_link_evenly():
    np.testing.assert_allclose(_both([[0]] * 4, [12.0]), [3.0] * 4)


def test_classic_parking_lot():
    # Links 0 and 1 of capacity 1; flow 0 crosses both, flows 1 and 2 one each.
    # Max-min: every flow gets 1/2.
    np.testing.assert_allclose(_both([[0, 1], [0], [1]], [1.0, 1.0]), [0.5, 0.5, 0.5])


def test_two_bottlenecks_by_hand():
    # Link 0 (cap 10) carries a, b, c; link 1 (cap 3) carries c and d.
    # Link 1's fair share 1.5 < link 0's 10/3: c = d = 1.5. Then link 0 has
    # 8.5 left for a and b: 4.25 each.
    r = _both([[0], [0], [0, 1], [1]], [10.0, 3.0])
    np.testing.assert_allclose(r, [4.25, 4.25, 1.5, 1.5])


def test_caps_are_private_links():
    # Flow 1 is capped at 1, so flow 0 takes the rest of link 0; flow 2 has
    # no links and gets exactly its cap; flow 3 has neither and is unbounded.
    r = _both([[0], [0], [], []], [10.0], [INF, 1.0, 5.0, INF])
    np.testing.assert_allclose(r, [9.0, 1.0, 5.0, INF])


def test_a_link_listed_twice_counts_twice():
    # Flow 0 crosses link 0 twice (there and back), flow 1 once: 2x + x = 6
    # with equal rates -> x = 2 each.
    np.testing.assert_allclose(_both([[0, 0], [0]], [6.0]), [2.0, 2.0])


def test_infinite_capacity_links_do_not_bind():
    np.testing.assert_allclose(_both([[0, 1], [1]], [INF, 4.0]), [2.0, 2.0])
    np.testing.assert_allclose(_both([[0]], [INF]), [INF])


def test_weights_split_a_shared_bottleneck_in_proportion():
    # Link 0 (cap 12) carries a (weight 3) and b (weight 1): 9 and 3.
    np.testing.assert_allclose(_both([[0], [0]], [12.0], weight=[3.0, 1.0]), [9.0, 3.0])
    # Weighted parking lot: links 0 and 1 of capacity 6; flow 0 (weight 2)
    # crosses both, flows 1 (weight 1) and 2 (weight 4) one each. Link 1's
    # level 6 / 6 = 1 is below link 0's 6 / 3 = 2: it fills first (flows 0
    # and 2: rates 2 and 4); link 0 then has 4 left for flow 1 alone.
    np.testing.assert_allclose(_both([[0, 1], [0], [1]], [6.0, 6.0], weight=[2.0, 1.0, 4.0]),
                               [2.0, 4.0, 4.0])
    # A cap binds at cap / weight: flow 0 (weight 4, cap 2) stops at level
    # 0.5; flow 1 (weight 1) takes the remaining 8 of link 0.
    np.testing.assert_allclose(_both([[0], [0]], [10.0], [2.0, INF], weight=[4.0, 1.0]),
                               [2.0, 8.0])
    # Equal weights are plain max-min, whatever their scale.
    np.testing.assert_allclose(_both([[0, 1], [0], [1]], [1.0, 1.0], weight=[5e8] * 3),
                               [0.5, 0.5, 0.5])


def test_no_flows():
    r = maxmin_rates(np.zeros(1, np.int64), np.zeros(0, np.int64), np.ones(3), np.zeros(0))
    assert r.size == 0


# ----------------------------------------------------------------- properties
@st.composite
def instances(draw):
    nlinks = draw(st.integers(1, 6))
    nflows = draw(st.integers(1, 10))
    flows = [
        draw(st.lists(st.integers(0, nlinks - 1), min_size=0, max_size=4)) for _ in range(nflows)
    ]
    caps = draw(
        st.lists(st.sampled_from([1.0, 2.0, 3.0, 5.0, 7.5, 10.0]), min_size=nlinks, max_size=nlinks)
    )
    fcap = draw(
        st.lists(st.sampled_from([INF, INF, 0.5, 1.0, 4.0]), min_size=nflows, max_size=nflows)
    )
    weight = draw(
        st.lists(st.sampled_from([1.0, 1.0, 0.5, 2.0, 7.0, 3e8]), min_size=nflows,
                 max_size=nflows)
    )
    return flows, caps, fcap, weight


@settings(max_examples=300, deadline=None)
@given(instances())
# Found by hypothesis: weights 3e8 and 1 on one link; a tolerance of 1e-9 on the
# levels failed on float rounding, not on the allocation.
@example(([[], [], [0, 2, 2], [2], [0]], [1.0, 1.0, 2.0], [INF, INF, INF, 0.5, INF],
          [1.0, 1.0, 3e8, 1.0, 0.5]))
def test_kernel_matches_reference(inst):
    flows, caps, fcap, weight = inst
    r = _both(flows, caps, fcap, weight)
    level = r / np.asarray(weight)
    # Feasible: no link over capacity, no flow over its cap.
    load = np.zeros(len(caps))
    for f, ls in enumerate(flows):
        for e in ls:
            load[e] += r[f]
    assert np.all(load <= np.asarray(caps) * (1 + 1e-9))
    assert np.all(r <= np.asarray(fcap) * (1 + 1e-9))
    # Weighted max-min: every flow is held by a full link where its level
    # (rate / weight) is among the largest, or by its own cap.
    for f, ls in enumerate(flows):
        if r[f] == INF:
            assert all(caps[e] == INF for e in ls) and fcap[f] == INF
            continue
        if abs(r[f] - fcap[f]) <= 1e-9 * fcap[f]:
            continue
        held = False
        for e in set(ls):
            full = load[e] >= caps[e] * (1 - 1e-9)
            on_e = [g for g, lg in enumerate(flows) if e in lg]
            biggest = max(level[g] for g in on_e)
            # A light flow's level is the link's remaining capacity over the
            # weights still on it: float rounding scales with that weight sum
            # over its own weight (3e8 against 1 gives ~5e-8 relative).
            tol = 1e-9 + 1e-13 * sum(weight[g] * lg.count(e) for g in on_e
                                     for lg in [flows[g]]) / weight[f]
            held |= full and level[f] >= biggest * (1 - tol)
        assert held, (f, r)


def test_large_random_instance_matches_reference():
    rng = np.random.default_rng(7)
    nlinks, nflows = 40, 300
    flows = [list(rng.integers(0, nlinks, size=rng.integers(1, 6))) for _ in range(nflows)]
    caps = rng.uniform(1.0, 50.0, size=nlinks)
    fcap = np.where(rng.random(nflows) < 0.2, rng.uniform(0.05, 1.0, nflows), INF)
    _both(flows, caps, fcap)
    _both(flows, caps, fcap, rng.uniform(1e3, 1e9, nflows))


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("ptr", "links", "cap", "fcap", "match"),
    [
        ([0, 2], [0], [1.0], [INF], "flow_ptr must run"),
        ([0, 1], [3], [1.0], [INF], r"flow_links\[0\] = 3"),
        ([0, 1], [0], [0.0], [INF], r"capacity_Bps\[0\] = 0.0"),
        ([0, 1], [0], [1.0], [-1.0], r"flow_cap_Bps\[0\] = -1.0"),
        ([0, 1], [0], [1.0], [INF, INF], "flow_cap_Bps has shape"),
        ([0, 2, 1], [0, 0], [1.0], [INF, INF], "flow_ptr decreases"),
    ],
)
def test_bad_input_names_the_value(ptr, links, cap, fcap, match):
    with pytest.raises(ValueError, match=match):
        maxmin_rates(np.array(ptr), np.array(links), np.array(cap), np.array(fcap))


@pytest.mark.parametrize(("weight", "match"), [
    ([0.0], r"flow_weight\[0\] = 0.0"), ([np.nan], r"flow_weight\[0\] = nan"),
    ([INF], r"flow_weight\[0\] = inf"), ([1.0, 1.0], "flow_weight has shape"),
])
def test_bad_weight_names_the_value(weight, match):
    with pytest.raises(ValueError, match=match):
        maxmin_rates(np.array([0, 1]), np.array([0]), np.array([1.0]), np.array([INF]),
                     np.array(weight))


def test_subset_kernel_ignores_flows_outside_the_subset():
    rng = np.random.default_rng(11)
    nlinks, nflows = 12, 60
    flows = [list(rng.integers(0, nlinks, size=rng.integers(1, 4))) for _ in range(nflows)]
    ptr, links = _csr(flows)
    caps = rng.uniform(1.0, 9.0, size=nlinks)
    fcap = np.where(rng.random(nflows) < 0.3, 0.4, INF)
    subset = np.sort(rng.choice(nflows, size=25, replace=False)).astype(np.int64)
    weight = rng.uniform(0.5, 4.0, size=nflows)
    out = np.full(nflows, -1.0)
    maxmin_subset_into(FlowNet(ptr, links, caps, fcap, weight), subset, out)
    sub_ptr, sub_links = _csr([flows[f] for f in subset])
    want = maxmin_rates_reference(sub_ptr, sub_links, caps, fcap[subset], weight[subset])
    np.testing.assert_allclose(out[subset], want, rtol=1e-9)
    rest = np.setdiff1d(np.arange(nflows), subset)
    assert np.all(out[rest] == -1.0)
