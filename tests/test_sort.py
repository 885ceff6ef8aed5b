"""The kernels' stable argsort and selection against numpy's (their slow twins are numpy's
own)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathweave._sort import (
    RADIX_MIN_KEYS,
    argsort_int64,
    argsort_stable,
    argsort_stable_reference,
    select,
    select_reference,
    unique,
)

# Few distinct values: many ties, which only a stable sort orders one way.
VALUES = {
    np.float64: st.sampled_from([-np.inf, -2.5, 0.0, 1e-300, 1.0, 3.0, 7.25, np.inf]),
    np.int64: st.integers(-3, 3) | st.sampled_from([-(2**63), 2**63 - 1]),
    np.uint64: st.integers(0, 4) | st.just(2**64 - 1),
}


@pytest.mark.parametrize("dtype", list(VALUES), ids=lambda d: d.__name__)
@settings(max_examples=150, deadline=None)
@given(data=st.data(), n=st.integers(0, 140))
def test_matches_numpys_stable_argsort(dtype, data, n):
    keys = np.array(data.draw(st.lists(VALUES[dtype], min_size=n, max_size=n)), dtype=dtype)
    got = argsort_stable(keys)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, argsort_stable_reference(keys))
    np.testing.assert_array_equal(got, np.argsort(keys, kind="stable"))
    np.testing.assert_array_equal(unique(keys), np.unique(keys))


@pytest.mark.parametrize("n", [1, 15, 16, 17, 33, 1000, 4099])
@pytest.mark.parametrize("order", ["sorted", "reversed", "equal", "random"])
def test_runs_and_merges_of_every_shape(n, order):
    rng = np.random.default_rng(n)
    keys = {"sorted": np.arange(n, dtype=np.float64), "reversed": np.arange(n, 0, -1.0),
            "equal": np.zeros(n), "random": rng.integers(0, n // 3 + 1, n).astype(float)}[order]
    before = keys.copy()
    np.testing.assert_array_equal(argsort_stable(keys), np.argsort(keys, kind="stable"))
    np.testing.assert_array_equal(keys, before)  # the input is not touched


@pytest.mark.parametrize("n", [0, 1, RADIX_MIN_KEYS - 1, RADIX_MIN_KEYS, 70_000])
@pytest.mark.parametrize("keys", ["ties", "extremes", "one_digit", "wide", "sizes"])
def test_the_int64_radix_sort_matches_numpys_stable_argsort(n, keys):
    # below RADIX_MIN_KEYS it is the merge sort; above, the radix passes: ties
    # (stability), the int64 extremes (the sign flip), keys differing in one
    # 16-bit digit only (the skipped passes), full-width keys, and pair sizes
    rng = np.random.default_rng(n)
    a = {"ties": rng.integers(-3, 4, n),
         "extremes": rng.choice([-(2**63), -1, 0, 1, 2**63 - 1], n),
         "one_digit": (rng.integers(0, 3, n) << 32) - (7 << 48),
         "wide": rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64),
         "sizes": -rng.integers(1, 1 << 30, n)}[keys].astype(np.int64)
    before = a.copy()
    got = argsort_int64(a)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, argsort_stable_reference(a))
    np.testing.assert_array_equal(a, before)  # the input is not touched


@pytest.mark.parametrize("dtype", [np.float64, np.int64], ids=lambda d: d.__name__)
@settings(max_examples=100, deadline=None)
@given(data=st.data(), n=st.integers(1, 90))
def test_select_is_the_kth_smallest(dtype, data, n):
    keys = np.array(data.draw(st.lists(VALUES[dtype], min_size=n, max_size=n)), dtype=dtype)
    before = keys.copy()
    for k in range(n):
        assert select(keys, k) == select_reference(keys, k) == np.sort(keys)[k]
    np.testing.assert_array_equal(keys, before)  # the input is not touched


@pytest.mark.parametrize("n", [1, 2, 3, 1000, 4099])
@pytest.mark.parametrize("order", ["sorted", "reversed", "equal", "random", "organ"])
def test_select_on_inputs_of_every_shape(n, order):
    rng = np.random.default_rng(n)
    half = np.arange(n // 2 + n % 2, dtype=np.int64)
    keys = {"sorted": np.arange(n, dtype=np.int64), "reversed": np.arange(n, 0, -1),
            "equal": np.zeros(n, dtype=np.int64),
            "random": rng.integers(0, n // 3 + 1, n),
            "organ": np.concatenate([half, half[::-1]])[:n]}[order]
    want = np.sort(keys)
    for k in sorted({0, 1 % n, n // 2, n - 2 if n > 1 else 0, n - 1}):
        assert select(keys, k) == want[k]
