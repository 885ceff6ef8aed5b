"""Tests of pathweave.traffic: generators, spec strings and demand files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathweave.errors import WorkloadError
from pathweave.traffic import (
    WORKLOAD_NAMES,
    WorkloadSpec,
    hotspot,
    load_demand,
    many_to_few,
    moe,
    parse_size,
    parse_workload,
    random_sparse,
    save_demand,
    stencil,
    uniform,
    validate_demand,
    zipf,
)

FAST = settings(max_examples=25, deadline=None)


def assert_demand(D: np.ndarray, n: int) -> None:
    """The invariants every generator promises."""
    assert isinstance(D, np.ndarray)
    assert D.dtype == np.float64
    assert D.shape == (n, n)
    assert np.all(np.diag(D) == 0)
    assert np.all(D >= 0)
    assert np.all(D == np.floor(D)), "entries must be whole bytes"
    validate_demand(D, n)


# --------------------------------------------------------------------------
# uniform
# --------------------------------------------------------------------------


def test_uniform_by_hand() -> None:
    D = uniform(4, 1200)
    expected = np.full((4, 4), 400.0)
    np.fill_diagonal(expected, 0.0)
    np.testing.assert_array_equal(D, expected)


def test_uniform_keeps_row_sums_when_payload_does_not_divide() -> None:
    D = uniform(4, 10)
    assert D.sum(axis=1).tolist() == [10.0] * 4
    off = D[~np.eye(4, dtype=bool)]
    assert set(off.tolist()) <= {3.0, 4.0}


def test_uniform_floors_fractional_payload() -> None:
    assert uniform(3, 10.9).sum(axis=1).tolist() == [10.0, 10.0, 10.0]


# --------------------------------------------------------------------------
# hotspot
# --------------------------------------------------------------------------


def test_hotspot_by_hand_four_ranks_ratio_half() -> None:
    # Non-hot ranks: half of 1200 to rank 0, the other 600 split over the two
    # remaining non-hot peers. Rank 0 spreads its 1200 over all three peers.
    expected = np.array(
        [
            [0, 400, 400, 400],
            [600, 0, 300, 300],
            [600, 300, 0, 300],
            [600, 300, 300, 0],
        ],
        dtype=float,
    )
    np.testing.assert_array_equal(hotspot(4, 1200, ratio=0.5, hot=0), expected)


def test_hotspot_other_hot_rank_by_hand() -> None:
    expected = np.array(
        [
            [0, 90, 90, 120],
            [90, 0, 90, 120],
            [90, 90, 0, 120],
            [100, 100, 100, 0],
        ],
        dtype=float,
    )
    np.testing.assert_array_equal(hotspot(4, 300, ratio=0.4, hot=3), expected)


def test_hotspot_several_hot_ranks_by_hand() -> None:
    # ratio 0.8 of 600 = 480 split over hot ranks 0 and 1; the other 120 over
    # the two non-hot peers; hot ranks send 150 to each of their 4 peers.
    D = hotspot(5, 600, ratio=0.8, hot=[0, 1])
    expected = np.array(
        [
            [0, 150, 150, 150, 150],
            [150, 0, 150, 150, 150],
            [240, 240, 0, 60, 60],
            [240, 240, 60, 0, 60],
            [240, 240, 60, 60, 0],
        ],
        dtype=float,
    )
    np.testing.assert_array_equal(D, expected)


@pytest.mark.parametrize("n", [3, 4, 8, 9])
def test_hotspot_uniform_ratio_reproduces_uniform(n: int) -> None:
    payload = 7 * 8 * 9 * 1024
    np.testing.assert_array_equal(hotspot(n, payload, ratio=1 / (n - 1)), uniform(n, payload))
    np.testing.assert_array_equal(
        hotspot(n, payload, ratio=2 / (n - 1), hot=(0, 2)), uniform(n, payload)
    )


def test_hotspot_ratio_extremes() -> None:
    D0 = hotspot(6, 1000, ratio=0.0, hot=2)
    assert D0[:, 2].sum() == 0.0
    assert D0[2].sum() == 1000.0
    D1 = hotspot(6, 1000, ratio=1.0, hot=2)
    cold = [0, 1, 3, 4, 5]
    assert D1[np.ix_(cold, cold)].sum() == 0.0
    assert D1[cold, 2].tolist() == [1000.0] * 5


def test_hotspot_two_ranks() -> None:
    np.testing.assert_array_equal(hotspot(2, 8, ratio=1.0), [[0, 8], [8, 0]])
    with pytest.raises(WorkloadError, match=r"ratio=0\.5"):
        hotspot(2, 8, ratio=0.5)


@given(
    n=st.integers(2, 12),
    payload=st.integers(0, 10**7),
    ratio=st.floats(0.0, 1.0),
    data=st.data(),
)
@FAST
def test_hotspot_invariants(n: int, payload: int, ratio: float, data: st.DataObject) -> None:
    hot = data.draw(st.integers(0, n - 1))
    if n == 2:
        ratio = 1.0
    D = hotspot(n, payload, ratio=ratio, hot=hot)
    assert_demand(D, n)
    assert D.sum(axis=1).tolist() == [float(payload)] * n


# --------------------------------------------------------------------------
# zipf
# --------------------------------------------------------------------------


def test_zipf_shares_follow_zipf_weights() -> None:
    # Weights 1, 1/2, 1/3 normalise to 6/11, 3/11, 2/11 of 1100 bytes.
    D = zipf(4, 1100, alpha=1.0, seed=5)
    for row in range(4):
        values = sorted(np.delete(D[row], row).tolist(), reverse=True)
        assert values == [600.0, 300.0, 200.0]


def test_zipf_alpha_zero_is_uniform() -> None:
    np.testing.assert_array_equal(zipf(5, 4000, alpha=0.0, seed=3), uniform(5, 4000))


def test_zipf_seeded() -> None:
    a = zipf(16, 1 << 20, alpha=1.5, seed=1)
    np.testing.assert_array_equal(a, zipf(16, 1 << 20, alpha=1.5, seed=1))
    assert not np.array_equal(a, zipf(16, 1 << 20, alpha=1.5, seed=2))
    assert_demand(a, 16)
    assert np.all(a.sum(axis=1) == 1 << 20)


# --------------------------------------------------------------------------
# moe
# --------------------------------------------------------------------------

COPY = 64 * 2  # hidden=64, bf16


def test_moe_all_experts_per_token_is_exact() -> None:
    # With top_k == num_experts every token visits every expert once, so the
    # matrix is determined: tokens_s * experts_on_r copies from s to r.
    placement = [0, 0, 0, 1, 2, 2]
    tokens = 10  # 4, 3, 3 tokens on ranks 0, 1, 2
    D = moe(3, tokens, hidden=64, top_k=6, placement=placement)
    per_rank = np.array([4, 3, 3])
    on_rank = np.array([3, 1, 2])
    expected = np.outer(per_rank, on_rank) * COPY
    np.fill_diagonal(expected, 0)
    np.testing.assert_array_equal(D, expected)
    off_rank_pairs = sum(int(per_rank[s]) * (6 - int(on_rank[s])) for s in range(3))
    assert D.sum() == off_rank_pairs * COPY


def test_moe_token_remainder_goes_to_first_ranks() -> None:
    D = moe(4, 10, hidden=64, top_k=4)  # one expert per rank, every token to all
    assert (D.sum(axis=1) / COPY).tolist() == [9.0, 9.0, 6.0, 6.0]


def test_moe_experts_on_one_rank() -> None:
    # Everything lives on rank 0: its own tokens stay local, every other
    # (token, expert) pair is off-rank.
    tokens, top_k = 1001, 3
    D = moe(4, tokens, hidden=64, num_experts=5, top_k=top_k, placement=[0] * 5, seed=4)
    assert_demand(D, 4)
    on_rank0 = tokens // 4 + 1
    assert D.sum() == (tokens - on_rank0) * top_k * COPY
    assert D[:, 1:].sum() == 0


@given(
    n=st.integers(2, 6),
    per=st.integers(1, 3),
    tokens=st.integers(0, 300),
    data=st.data(),
)
@FAST
def test_moe_invariants(n: int, per: int, tokens: int, data: st.DataObject) -> None:
    experts = n * per
    top_k = data.draw(st.integers(1, experts))
    mode = data.draw(st.sampled_from(["uniform", "skew", "hot"]))
    kwargs: dict = {}
    if mode == "skew":
        kwargs["skew"] = data.draw(st.floats(0.0, 3.0))
    elif mode == "hot" and top_k < experts:
        kwargs["hot_ratio"] = data.draw(st.floats(0.0, 1.0))
    D = moe(n, tokens, hidden=64, num_experts=experts, top_k=top_k, seed=7, **kwargs)
    assert_demand(D, n)
    copies = D / COPY
    assert np.all(copies == np.floor(copies))
    # Distinct experts: a token reaches rank r at most once per expert on r.
    per_rank = np.full(n, tokens // n)
    per_rank[: tokens % n] += 1
    assert np.all(copies <= per_rank[:, None] * min(per, top_k))
    # Each token sends at most top_k copies and at least top_k - per off-rank.
    sent = copies.sum(axis=1)
    assert np.all(sent <= per_rank * top_k)
    assert np.all(sent >= per_rank * max(0, top_k - per))


def test_moe_hot_ratio_concentrates_on_hot_rank() -> None:
    n, tokens, h = 8, 16384, 0.9
    D = moe(n, tokens, hidden=64, top_k=1, hot_ratio=h, hot_expert=3, seed=0)
    senders = [s for s in range(n) if s != 3]
    # A miss picks one of the 7 other experts; 1 in 7 of those is the sender's
    # own and stays local, so the off-rank share on rank 3 is a bit above h.
    expected = h / (h + (1 - h) * (n - 2) / (n - 1))
    share = D[senders, 3].sum() / D[senders].sum()
    assert share == pytest.approx(expected, abs=0.02)
    assert D[senders, 3].sum() / (COPY * tokens * 7 / 8) == pytest.approx(h, abs=0.02)


def test_moe_hot_ratio_top2_fraction_of_tokens() -> None:
    D = moe(8, 16384, hidden=64, top_k=2, hot_ratio=0.9, seed=1)
    per_rank = 16384 // 8
    np.testing.assert_allclose(D[1:, 0] / (per_rank * COPY), 0.9, atol=0.03)


def test_moe_hot_ratio_one_is_exact() -> None:
    D = moe(4, 40, hidden=64, top_k=1, hot_ratio=1.0, hot_expert=1)
    expected = np.zeros((4, 4))
    expected[[0, 2, 3], 1] = 10 * COPY
    np.testing.assert_array_equal(D, expected)
    # top_k == num_experts is allowed when every token takes the hot expert.
    D = moe(4, 40, hidden=64, top_k=4, hot_ratio=1.0)
    np.testing.assert_array_equal(D, (np.ones((4, 4)) - np.eye(4)) * 10 * COPY)


def test_moe_skew_favours_hot_expert_rank() -> None:
    D = moe(4, 8000, hidden=64, num_experts=8, top_k=2, skew=1.5, hot_expert=5, seed=2)
    received = D.sum(axis=0)
    assert int(np.argmax(received)) == 2  # expert 5 lives on rank 5 // 2 = 2
    flat = moe(4, 8000, hidden=64, num_experts=8, top_k=2, skew=0.0, seed=2)
    assert flat.sum(axis=0).std() < received.std()


def test_moe_seeded_and_combine_is_transpose() -> None:
    a = moe(4, 4000, hidden=64, num_experts=8, seed=3)
    np.testing.assert_array_equal(a, moe(4, 4000, hidden=64, num_experts=8, seed=3))
    assert not np.array_equal(a, moe(4, 4000, hidden=64, num_experts=8, seed=4))
    assert_demand(a.T, 4)


def test_moe_default_placement_is_contiguous() -> None:
    # Experts 2, 3 live on rank 1: with hot_expert=2, top_k=1 everything
    # lands on rank 1.
    D = moe(4, 400, hidden=64, num_experts=8, top_k=1, hot_ratio=1.0, hot_expert=2)
    assert D[:, 1].sum() == D.sum() == 300 * COPY


# --------------------------------------------------------------------------
# many_to_few, stencil, random_sparse
# --------------------------------------------------------------------------


def test_many_to_few_by_hand() -> None:
    expected = np.array(
        [
            [0, 0, 0, 0, 0],
            [30, 0, 0, 0, 30],
            [30, 0, 0, 0, 30],
            [30, 0, 0, 0, 30],
            [0, 0, 0, 0, 0],
        ],
        dtype=float,
    )
    np.testing.assert_array_equal(many_to_few(5, 60, sinks=(4, 0)), expected)
    np.testing.assert_array_equal(many_to_few(5, 60, sinks=[0, 4]), expected)
    D = many_to_few(5, 60, sinks=2)
    assert D[:, :2].sum() == 3 * 60 and D[:2].sum() == 0


def test_stencil_1d_by_hand() -> None:
    expected = np.array(
        [
            [0, 400, 0, 0, 0],
            [50, 0, 50, 0, 0],
            [0, 50, 0, 50, 0],
            [0, 0, 50, 0, 50],
            [0, 0, 0, 400, 0],
        ],
        dtype=float,
    )
    np.testing.assert_array_equal(stencil(5, 100), expected)


def test_stencil_1d_periodic_is_a_ring() -> None:
    D = stencil(5, 100, periodic=True, boundary_factor=9.0)
    for r in range(5):
        assert D[r, (r + 1) % 5] == D[r, (r - 1) % 5] == 50
    assert D.sum() == 500
    np.testing.assert_array_equal(stencil(2, 100, periodic=True), [[0, 100], [100, 0]])


def test_stencil_2d_by_hand() -> None:
    # 3 x 3 grid; only the centre (rank 4) is interior.
    D = stencil(9, 400, dims=2, boundary_factor=2.0)
    assert D[4].tolist() == [0, 100, 0, 100, 0, 100, 0, 100, 0]
    # corner 0 has neighbours 1 and 3: 2 * 400 / 2 each
    assert D[0].tolist() == [0, 400, 0, 400, 0, 0, 0, 0, 0]
    # edge 1 has neighbours 0, 2, 4: 2 * 400 / 3 each, rounded to whole bytes
    assert sorted(D[1, [0, 2, 4]].tolist()) == [266, 267, 267]
    assert D[1].sum() == 800


def test_stencil_2d_shape() -> None:
    D = stencil(8, 100, dims=2, boundary_factor=1.0, periodic=True)  # 2 x 4 torus
    # rank 0 at (0, 0): up and down are both rank 4, left 3, right 1.
    assert np.flatnonzero(D[0]).tolist() == [1, 3, 4]
    E = stencil(8, 120, dims=2, shape=(4, 2), boundary_factor=1.0)
    assert np.flatnonzero(E[2]).tolist() == [0, 3, 4]  # (1, 0): up, right, down


def test_random_sparse() -> None:
    D = random_sparse(21, 10**6, density=0.25, seed=9)
    assert_demand(D, 21)
    assert ((D > 0).sum(axis=1) <= 5).all()
    assert (D.sum(axis=1) == 10**6).all()
    np.testing.assert_array_equal(D, random_sparse(21, 10**6, density=0.25, seed=9))
    assert not np.array_equal(D, random_sparse(21, 10**6, density=0.25, seed=10))
    assert ((random_sparse(50, 100, density=0.001) > 0).sum(axis=1) == 1).all()
    full = random_sparse(6, 6000, density=1.0, seed=1)
    assert ((full > 0).sum(axis=1) == 5).all()


@given(n=st.integers(2, 10), payload=st.integers(0, 10**6), seed=st.integers(0, 2**16))
@FAST
def test_generators_common_invariants(n: int, payload: int, seed: int) -> None:
    for D in (
        uniform(n, payload),
        zipf(n, payload, alpha=1.2, seed=seed),
        random_sparse(n, payload, density=0.5, seed=seed),
    ):
        assert_demand(D, n)
        assert (D.sum(axis=1) == payload).all()
    assert_demand(many_to_few(n, payload, sinks=1), n)
    assert_demand(stencil(n, payload), n)
    assert_demand(stencil(n, payload, dims=2, periodic=True), n)


# --------------------------------------------------------------------------
# argument validation
# --------------------------------------------------------------------------

BAD_CALLS = [
    (lambda: uniform(1, 10), "num_ranks", "1"),
    (lambda: uniform(4, -1), "bytes_per_rank", "-1"),
    (lambda: uniform(4, float("nan")), "bytes_per_rank", "nan"),
    (lambda: hotspot(4, 10, ratio=1.5), "ratio", "1.5"),
    (lambda: hotspot(4, 10, ratio=-0.1), "ratio", "-0.1"),
    (lambda: hotspot(4, 10, ratio=0.5, hot=4), "hot", "4"),
    (lambda: hotspot(4, 10, ratio=0.5, hot=[1, 1]), "hot", "1"),
    (lambda: hotspot(4, 10, ratio=0.5, hot=[]), "hot", "[]"),
    (lambda: zipf(4, 10, alpha=-1.0), "alpha", "-1.0"),
    (lambda: zipf(4, 10, seed=-3), "seed", "-3"),
    (lambda: moe(4, -5, 64), "tokens", "-5"),
    (lambda: moe(4, 10, 0), "hidden", "0"),
    (lambda: moe(4, 10, 3, bytes_per_elem=0.5), "bytes_per_elem", "0.5"),
    (lambda: moe(4, 10, 64, num_experts=6), "num_experts", "6"),
    (lambda: moe(4, 10, 64, top_k=5), "top_k", "5"),
    (lambda: moe(4, 10, 64, skew=1.0, hot_ratio=0.5), "skew", "1.0"),
    (lambda: moe(4, 10, 64, hot_ratio=1.2), "hot_ratio", "1.2"),
    (lambda: moe(4, 10, 64, top_k=4, hot_ratio=0.5), "top_k", "4"),
    (lambda: moe(4, 10, 64, hot_expert=7), "hot_expert", "7"),
    (lambda: moe(4, 10, 64, placement=[0, 1, 9]), "placement", "9"),
    (lambda: moe(4, 10, 64, num_experts=2, placement=[0, 1, 2]), "num_experts", "2"),
    (lambda: moe(4, 10, 64, skew=-1.0), "skew", "-1.0"),
    (lambda: many_to_few(4, 10, sinks=4), "sinks", "4"),
    (lambda: many_to_few(4, 10, sinks=(0, 1, 2, 3)), "sinks", "3"),
    (lambda: many_to_few(4, 10, sinks=(5,)), "sinks", "5"),
    (lambda: stencil(4, 10, dims=3), "dims", "3"),
    (lambda: stencil(6, 10, dims=2, shape=(4, 2)), "shape", "(4, 2)"),
    (lambda: stencil(6, 10, dims=1, shape=(2, 3)), "shape", "(2, 3)"),
    (lambda: stencil(6, 10, boundary_factor=-2.0), "boundary_factor", "-2.0"),
    (lambda: random_sparse(4, 10, density=0.0), "density", "0.0"),
    (lambda: random_sparse(4, 10, density=1.5), "density", "1.5"),
]


@pytest.mark.parametrize(("call", "param", "value"), BAD_CALLS)
def test_bad_arguments_name_parameter_and_value(call, param: str, value: str) -> None:
    with pytest.raises(WorkloadError) as info:
        call()
    message = str(info.value)
    assert param in message
    assert value in message


BAD_TYPES = [
    (lambda: uniform(True, 10), "num_ranks", "True"),
    (lambda: uniform(4.0, 10), "num_ranks", "4.0"),
    (lambda: uniform(4, "10"), "bytes_per_rank", "'10'"),
    (lambda: zipf(4, 10, seed=1.5), "seed", "1.5"),
    (lambda: hotspot(4, 10, ratio=0.5, hot="0"), "hot", "'0'"),
    (lambda: stencil(4, 10, periodic="yes"), "periodic", "'yes'"),
]


@pytest.mark.parametrize(("call", "param", "value"), BAD_TYPES)
def test_wrong_types_raise_type_error_naming_parameter_and_value(call, param, value) -> None:
    # A wrong type is a programming error (TypeError), not a bad workload value.
    with pytest.raises(TypeError) as info:
        call()
    assert not isinstance(info.value, WorkloadError)
    assert param in str(info.value) and value in str(info.value)


def test_workload_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="num_ranks"):
        uniform(0, 10)


# --------------------------------------------------------------------------
# spec strings
# --------------------------------------------------------------------------

SPEC_EXAMPLES = {
    "uniform": lambda n, b: uniform(n, b),
    "hotspot:0.8": lambda n, b: hotspot(n, b, ratio=0.8),
    "hotspot:ratio=0.5,hot=3": lambda n, b: hotspot(n, b, ratio=0.5, hot=3),
    "zipf:1.1": lambda n, b: zipf(n, b, alpha=1.1),
    "moe:tokens=16384,hidden=4096,experts=8,topk=2,hot=0.9": lambda n, b: moe(
        n, 16384, 4096, num_experts=8, top_k=2, hot_ratio=0.9
    ),
    "many_to_few:sinks=2": lambda n, b: many_to_few(n, b, sinks=(0, 1)),
    "many_to_few:sinks=0;5": lambda n, b: many_to_few(n, b, sinks=(0, 5)),
    "stencil:dims=2": lambda n, b: stencil(n, b, dims=2, shape=(2, 4)),
    "stencil:1": lambda n, b: stencil(n, b, dims=1),
    "random_sparse:0.2": lambda n, b: random_sparse(n, b, density=0.2),
    "uniform:bytes=64M": lambda n, b: uniform(n, 64 * 2**20),
    "hotspot:0.3,hot=1;2,bytes=1KB": lambda n, b: hotspot(n, 1000, ratio=0.3, hot=(1, 2)),
    "stencil:dims=2,shape=4x2,periodic=true,boundary=2": lambda n, b: stencil(
        n, b, dims=2, shape=(4, 2), periodic=True, boundary_factor=2.0
    ),
    "many_to_few:5;": lambda n, b: many_to_few(n, b, sinks=(5,)),
    "random-sparse:density=0.5,seed=3": lambda n, b: random_sparse(n, b, 0.5, seed=3),
    "moe:tokens=1e3,hidden=64,k=1,skew=1.2,placement=0;0;1;2;3;4;5;6;7;7": lambda n, b: moe(
        n, 1000, 64, top_k=1, skew=1.2, placement=[0, 0, 1, 2, 3, 4, 5, 6, 7, 7]
    ),
}


@pytest.mark.parametrize("spec", list(SPEC_EXAMPLES))
def test_spec_examples_build_and_round_trip(spec: str) -> None:
    n, payload = 8, 48 * 1024
    parsed = WorkloadSpec.parse(spec)
    assert WorkloadSpec.parse(str(parsed)) == parsed
    assert str(WorkloadSpec.parse(str(parsed))) == str(parsed)
    D = parse_workload(spec, n, bytes_per_rank=payload, gpus_per_node=4)
    np.testing.assert_array_equal(D, SPEC_EXAMPLES[spec](n, payload))
    np.testing.assert_array_equal(D, parsed.build(n, payload))


def test_spec_params_are_typed_and_canonical() -> None:
    spec = WorkloadSpec.parse(" MoE : tokens=16384, hidden=4096, experts=8, topk=2, hot=0.9 ")
    assert spec == WorkloadSpec(
        "moe",
        {"tokens": 16384, "hidden": 4096, "num_experts": 8, "top_k": 2, "hot_ratio": 0.9},
    )
    assert WorkloadSpec.parse("hotspot:ratio=0.5,hot=3").params == {"ratio": 0.5, "hot": 3}
    assert WorkloadSpec.parse("many_to_few:sinks=0;5").params == {"sinks": (0, 5)}
    assert WorkloadSpec.parse("stencil:periodic=no").params == {"periodic": False}
    assert WorkloadSpec.parse("uniform:bytes=1.5K").bytes_per_rank == 1536.0
    assert set(WORKLOAD_NAMES) == {
        "uniform",
        "hotspot",
        "zipf",
        "moe",
        "many_to_few",
        "stencil",
        "random_sparse",
    }
    hash(spec)  # frozen specs can be used as dict keys


def test_spec_moe_ignores_bytes_and_seed_override() -> None:
    D = parse_workload("moe:tokens=800,hidden=64,bytes=1G", 4, bytes_per_rank=5)
    np.testing.assert_array_equal(D, moe(4, 800, 64))
    a = parse_workload("zipf:1.0", 6, bytes_per_rank=600, seed=4)
    np.testing.assert_array_equal(a, zipf(6, 600, 1.0, seed=4))
    b = parse_workload("zipf:1.0,seed=2", 6, bytes_per_rank=600, seed=4)
    np.testing.assert_array_equal(b, zipf(6, 600, 1.0, seed=2))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4096", 4096.0),
        ("64M", 64 * 2**20),
        ("64MiB", 64 * 2**20),
        ("1.5G", 1.5 * 2**30),
        ("2gib", 2 * 2**30),
        ("100KB", 100_000.0),
        ("3 MB", 3_000_000.0),
        ("1GB", 1e9),
        ("7B", 7.0),
        ("2T", 2.0 * 2**40),
    ],
)
def test_parse_size(text: str, value: float) -> None:
    assert parse_size(text) == value


BAD_SPECS = [
    ("ring", "ring", "uniform"),  # unknown workload; lists the valid ones
    ("hotspt:0.5", "hotspt", "hotspot"),
    ("hotspot:ratio=0.5,hott=1", "hott", "ratio"),
    ("hotspot:ratio=abc", "abc", "ratio"),
    ("hotspot:ratio=nan", "nan", "ratio"),
    ("hotspot:ratio=1.5", "1.5", "ratio"),
    ("hotspot:hot=1", "ratio=", "hotspot"),
    ("hotspot:ratio=0.5,hot=x", "x", "hot"),
    ("hotspot:ratio=0.5,ratio=0.6", "ratio", "twice"),
    ("hotspot:ratio=0.5,0.6", "0.6", "first"),
    ("uniform:0.5", "0.5", "uniform"),
    ("uniform:", "uniform", "nothing"),
    ("uniform:bytes=12Q", "12Q", "unit"),
    ("uniform:bytes=-5", "-5", "bytes"),
    ("uniform:bytes=", "bytes", "empty"),
    ("zipf:1.0,,seed=1", "zipf", "empty"),
    ("zipf:seed=1.5", "1.5", "integer"),
    ("moe:tokens=100", "hidden=", "moe"),
    ("moe:tokens=100,hidden=64,experts=3", "num_experts = 3", "multiple"),
    ("stencil:periodic=maybe", "maybe", "boolean"),
    ("stencil:dims=2,shape=3x3", "(3, 3)", "shape"),
    ("many_to_few:sinks=8", "sinks = 8", "num_ranks"),
    ("random_sparse:2", "2.0", "density"),
]


@pytest.mark.parametrize(("spec", "needle", "needle2"), BAD_SPECS)
def test_bad_specs_raise_workload_error(spec: str, needle: str, needle2: str) -> None:
    with pytest.raises(WorkloadError, match=re.escape(needle)) as info:
        parse_workload(spec, 8)
    assert needle2 in str(info.value)


def test_spec_gpus_per_node_must_divide() -> None:
    with pytest.raises(WorkloadError, match="gpus_per_node = 3"):
        parse_workload("uniform", 8, gpus_per_node=3)
    with pytest.raises(WorkloadError, match="gpus_per_node"):
        parse_workload("uniform", 8, gpus_per_node=0)


def test_spec_not_a_string() -> None:
    with pytest.raises(TypeError, match="workload spec must be a string, got int 42"):
        WorkloadSpec.parse(42)  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# validate_demand and files
# --------------------------------------------------------------------------


def test_validate_demand_messages() -> None:
    D = np.zeros((6, 6))
    D[2, 5] = -3.0
    with pytest.raises(WorkloadError, match=re.escape("D[2, 5] = -3.0 is negative")):
        validate_demand(D)
    D[2, 5] = np.nan
    with pytest.raises(WorkloadError, match=re.escape("D[2, 5] = nan is not finite")):
        validate_demand(D)
    D[2, 5] = 0.0
    D[3, 3] = 5.0
    with pytest.raises(WorkloadError, match=re.escape("D[3, 3] = 5.0 is on the diagonal")):
        validate_demand(D)
    with pytest.raises(WorkloadError, match=re.escape("(2, 3)")):
        validate_demand(np.zeros((2, 3)))
    with pytest.raises(WorkloadError, match="num_ranks = 4"):
        validate_demand(np.zeros((3, 3)), num_ranks=4)
    with pytest.raises(WorkloadError, match="complex"):
        validate_demand(np.zeros((2, 2), dtype=complex))


def test_validate_demand_view_or_copy() -> None:
    D = uniform(4, 100)
    assert validate_demand(D) is D or np.shares_memory(validate_demand(D), D)
    F = np.asfortranarray(np.array([[0, 1], [2, 0]], dtype=np.int32))
    out = validate_demand(F)
    assert out.dtype == np.float64 and out.flags.c_contiguous
    assert out.tolist() == [[0.0, 1.0], [2.0, 0.0]]


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_io_round_trip_exact(tmp_path: Path, suffix: str) -> None:
    D = zipf(7, 123456789, alpha=1.3, seed=2)
    D[1, 2] = 0.1  # non-integral values must survive too
    D[3, 4] = 2.0**60
    meta = {"spec": "zipf:1.3", "nested": {"a": [1, 2.5]}}
    path = save_demand(tmp_path / f"demand{suffix}", D, meta=meta)
    assert path == tmp_path / f"demand{suffix}"
    loaded, loaded_meta = load_demand(path, with_meta=True)
    assert loaded.dtype == np.float64 and loaded.flags.c_contiguous
    np.testing.assert_array_equal(loaded, D)
    assert loaded_meta == meta
    np.testing.assert_array_equal(load_demand(str(path)), D)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp files left


def test_json_file_layout(tmp_path: Path) -> None:
    path = save_demand(tmp_path / "d.json", uniform(3, 30))
    document = json.loads(path.read_text())
    assert document == {
        "format": "pathweave-demand",
        "version": 1,
        "num_ranks": 3,
        "bytes": [[0, 15, 15], [15, 0, 15], [15, 15, 0]],
        "meta": {},
    }


def test_save_is_atomic_on_failure(tmp_path: Path) -> None:
    path = save_demand(tmp_path / "d.json", uniform(3, 30))
    before = path.read_bytes()
    with pytest.raises(WorkloadError, match="meta"):
        save_demand(path, uniform(3, 60), meta={"bad": object()})
    with pytest.raises(WorkloadError, match="negative"):
        save_demand(path, -uniform(3, 60))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["d.json"]


def test_save_rejects_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=r"\.csv"):
        save_demand(tmp_path / "d.csv", uniform(3, 30))


def _json_doc(rows, **overrides) -> str:
    doc = {"format": "pathweave-demand", "version": 1, "num_ranks": len(rows), "bytes": rows}
    doc.update(overrides)
    return json.dumps(doc)


BAD_JSON = [
    ("nonsquare", _json_doc([[0, 1, 2], [1, 0]]), "not square"),
    ("negative", _json_doc([[0, -1], [1, 0]]), "D[0, 1] = -1.0 is negative"),
    ("nan", _json_doc([[0, float("nan")], [1, 0]]), "D[0, 1] = nan is not finite"),
    ("diag", _json_doc([[4, 1], [1, 0]]), "diagonal"),
    ("tag", _json_doc([[0, 1], [1, 0]], format="other-thing"), "other-thing"),
    ("notag", json.dumps({"bytes": [[0]]}), "format tag"),
    ("version", _json_doc([[0, 1], [1, 0]], version=2), "version 2"),
    ("malformed", '{"format": "pathweave-demand", "bytes": [[0, 1]', "malformed JSON"),
    ("list", "[[0, 1], [1, 0]]", "expected an object"),
    ("string", _json_doc([[0, "1"], [1, 0]]), "'1' is not a number"),
    ("count", _json_doc([[0, 1], [1, 0]], num_ranks=3), "num_ranks is 3"),
    ("flat", _json_doc([0, 1]), "list of rows"),
]


@pytest.mark.parametrize(("name", "text", "problem"), BAD_JSON)
def test_bad_json_files_name_file_and_problem(
    tmp_path: Path, name: str, text: str, problem: str
) -> None:
    path = tmp_path / f"{name}.json"
    path.write_text(text)
    with pytest.raises(WorkloadError, match=re.escape(str(path))) as info:
        load_demand(path)
    assert problem in str(info.value)


def _write_npz(path: Path, **arrays) -> Path:
    with path.open("wb") as handle:
        np.savez(handle, **arrays)
    return path


def test_bad_npz_files_name_file_and_problem(tmp_path: Path) -> None:
    cases = {
        "nonsquare": (dict(bytes=np.zeros((2, 3))), "(2, 3)"),
        "negative": (dict(bytes=np.array([[0.0, -2.0], [1.0, 0.0]])), "-2.0 is negative"),
        "nan": (dict(bytes=np.array([[0.0, np.nan], [1.0, 0.0]])), "nan is not finite"),
        "tag": (dict(format=np.array("nope"), version=np.array(1), bytes=np.zeros((2, 2))), "nope"),
        "nobytes": (dict(other=np.zeros((2, 2))), "no 'bytes'"),
        "objects": (dict(bytes=np.array([[0, None], [1, 0]], dtype=object)), "cannot be read"),
    }
    for name, (arrays, problem) in cases.items():
        path = _write_npz(tmp_path / f"{name}.npz", **arrays)
        with pytest.raises(WorkloadError, match=re.escape(str(path))) as info:
            load_demand(path)
        assert problem in str(info.value), name
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"this is not a zip archive")
    with pytest.raises(WorkloadError, match=re.escape(str(garbage))):
        load_demand(garbage)
    single = tmp_path / "single.npz"
    with single.open("wb") as handle:
        np.save(handle, np.zeros((2, 2)))
    with pytest.raises(WorkloadError, match="single array"):
        load_demand(single)


def test_plain_npz_without_header_is_accepted(tmp_path: Path) -> None:
    path = _write_npz(tmp_path / "plain.npz", bytes=uniform(3, 9))
    np.testing.assert_array_equal(load_demand(path), uniform(3, 9))


def test_missing_file_raises_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_demand(tmp_path / "absent.json")


def test_traffic_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, pathweave.traffic; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_spec_keys_are_generator_parameters() -> None:
    import inspect

    from pathweave.traffic.spec import _KINDS

    for name, kind in _KINDS.items():
        accepted = set(inspect.signature(kind.func).parameters)
        assert set(kind.keys) <= accepted, name
        assert set(kind.aliases.values()) <= set(kind.keys), name


def test_uniform_subsets_are_distinct_and_uniform():
    from pathweave.traffic.generators import _uniform_subsets

    rng = np.random.default_rng(11)
    rows = _uniform_subsets(rng, 56_000, 8, 2)  # rejection path: 4 * 2 <= 8
    assert rows.shape == (56_000, 2)
    assert np.all(rows[:, 0] != rows[:, 1])
    # 28 unordered pairs, 2000 expected each; the chi-square statistic with
    # 27 degrees of freedom exceeds 60 with probability < 1e-3.
    keys = np.sort(rows, axis=1) @ np.array([8, 1])
    counts = np.bincount(keys, minlength=64)[np.bincount(keys, minlength=64) > 0]
    assert counts.size == 28
    chi2 = float(((counts - 2000.0) ** 2 / 2000.0).sum())
    assert chi2 < 60.0, chi2
