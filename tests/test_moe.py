"""MoE dispatch/combine on gloo ranks against the single-process reference.

Every rank draws the inputs of *all* ranks from one seed, runs the layer on
its own share, and compares with :mod:`pathweave.moe.reference` computed in
the same process: dispatch outputs as sets keyed by source id ``(DP group,
token)``, bit for bit; combine outputs against the float32 reference with a
tolerance set by the dtype. Many cases share one spawned job (spawning costs
seconds).
"""

from __future__ import annotations

import math
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch

from pathweave.moe.reference import reference_combine, reference_dispatch
from pathweave.runtime.launch import run_local

FP8 = torch.float8_e4m3fn
TOL = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


# ----------------------------------------------------------------- inputs
def make_inputs(case: dict[str, Any], world: int) -> list[dict[str, Any]]:
    """Per-rank ``x``, ``topk_idx``, ``x_scale``, ``topk_weights`` (the same on every rank)."""
    g = torch.Generator().manual_seed(case.get("seed", 0))
    E, k, H = case["E"], case["k"], case["H"]
    dp = case.get("dp", 1)
    dtype = case["dtype"]
    ms = case.get("m", [16] * world)
    hot = case.get("hot")
    out: list[dict[str, Any]] = []
    for r in range(world):
        if r % dp:  # DP replicas hold the group's tokens
            out.append(out[r - r % dp])
            continue
        m = ms[r]
        # Distinct experts per token: a random permutation's first k.
        idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(m)] or
                          [torch.zeros(0, dtype=torch.int64)]).reshape(m, k)
        if hot is not None and m:
            # About `hot` of the tokens name expert `hot_expert` in slot 0.
            he = case.get("hot_expert", 0)
            take = torch.rand(m, generator=g) < hot
            for i in torch.nonzero(take).flatten().tolist():
                row = idx[i].tolist()
                if he in row:
                    row.remove(he)
                idx[i] = torch.tensor([he, *row[: k - 1]])
        drop = case.get("drop", 0.0)
        if drop:
            idx[torch.rand(m, k, generator=g) < drop] = -1
        for e in case.get("unused", ()):
            # Experts with no tokens: re-route them to the "next" free expert.
            for i, j in torch.nonzero(idx == e).tolist():
                for alt in range(E):
                    if alt not in case["unused"] and alt not in idx[i].tolist():
                        idx[i, j] = alt
                        break
        if dtype == torch.uint8:
            x = torch.randint(0, 256, (m, H), generator=g, dtype=torch.uint8)
            scale = torch.rand(m, math.ceil(H / 128), generator=g) + 0.5
        elif dtype == torch.float8_e4m3fn:
            x = (torch.randn(m, H, generator=g) * 3).to(dtype)
            scale = torch.rand(m, math.ceil(H / 128), generator=g) + 0.5
        else:
            x = (torch.randn(m, H, generator=g) * 3).to(dtype)
            scale = None
        w = torch.rand(m, k, generator=g)
        out.append({"x": x, "idx": idx.to(case.get("idx_dtype", torch.int64)), "scale": scale,
                    "w": w})
    return out


def expert_fn(e: int, x: torch.Tensor, s: torch.Tensor | None, out_dtype: torch.dtype
              ) -> torch.Tensor:
    """A row-wise "expert": scale by (e+1)/4 and shift by e; fp8 payloads are dequantised."""
    if s is not None:
        xf = x.to(torch.float32) * s.repeat_interleave(128, dim=1)[:, : x.shape[1]]
    else:
        xf = x.to(torch.float32)
    return (xf * ((e + 1) / 4) + e).to(out_dtype)


def _out_dtype(case: dict[str, Any]) -> torch.dtype:
    return torch.bfloat16 if case["dtype"] in (torch.uint8, FP8) else case["dtype"]


# ----------------------------------------------------------------- checks
def _check_case(rank: int, world: int, case: dict[str, Any], moe: Any = None) -> None:
    import pathweave as pw
    from pathweave.moe import MoEAllToAll

    inputs = make_inputs(case, world)
    E, k, H = case["E"], case["k"], case["H"]
    dp = case.get("dp", 1)
    layout = case.get("layout", "expert-major")
    if moe is None:
        orch = None
        if case.get("multipath"):
            orch = pw.Orchestrator(fabric=case["fabric"], enabled=True, min_split_bytes=1,
                                   chunk_bytes=4096)
        moe = MoEAllToAll(E, k, H, max(case.get("m", [16] * world)) + 1, case["dtype"],
                          dp_size=dp, layout=layout, orchestrator=orch,
                          placement=case.get("placement"))
    placement = moe.placement.tolist()
    mine = inputs[rank]
    scales = [d["scale"] for d in inputs] if case["dtype"] in (torch.uint8, FP8) else None
    async_op = case.get("async", False)
    res = moe.dispatch(mine["x"], mine["idx"], mine["scale"], async_op=async_op)
    if async_op:
        res = res.wait()
    expert_x, counts, handle = res
    # Collectives first, checks after: a rank whose check fails must not skip
    # a collective its peers are in.
    out_dtype = _out_dtype(case)
    local = moe.local_expert_ids.tolist()
    sc_all = handle.expert_x_scale
    if layout == "expert-major":
        L, cap = moe.num_local_experts, moe.expert_capacity
        y = torch.zeros(L, cap, H, dtype=out_dtype)
        for l_, e in enumerate(local):
            n = int(counts[l_])
            sc = None if sc_all is None else sc_all[l_, :n]
            y[l_, :n] = expert_fn(e, expert_x[l_, :n], sc, out_dtype)
    else:
        y = torch.zeros(handle.num_pairs, H, dtype=out_dtype)
        for l_, e in enumerate(local):
            a, b = int(handle.expert_offsets[l_]), int(handle.expert_offsets[l_ + 1])
            rows = handle.expert_rows[a:b]
            sc = None if sc_all is None else sc_all[rows]
            y[a:b] = expert_fn(e, expert_x[rows], sc, out_dtype)
    weighted = case.get("weighted", True)
    w = mine["w"] if weighted else None
    out = moe.combine(y, handle, w, weighted=weighted, async_op=async_op)
    if async_op:
        out = out.wait()
    # A handle serves one combine: dispatch the same tokens again for the determinism check.
    _, _, handle2 = moe.dispatch(mine["x"], mine["idx"], mine["scale"])
    again = moe.combine(y, handle2, w, weighted=weighted)

    ref = reference_dispatch([d["x"] for d in inputs], [d["idx"] for d in inputs], placement,
                             x_scales=scales, dp_size=dp)
    src = torch.from_numpy(handle.expert_src)
    if dp > 1:
        # The sender is the member i % dp of the token's DP group.
        valid = src[..., 0] >= 0
        assert bool(((src[..., 0] % dp) == (src[..., 1] % dp))[valid].all())
        src[..., 0] = torch.where(src[..., 0] >= 0, src[..., 0] // dp, src[..., 0])
    if layout == "expert-major":
        assert tuple(expert_x.shape) == (moe.num_local_experts, moe.expert_capacity, H)
    else:
        assert handle.expert_ids is not None and handle.expert_rows is not None
        # One row per (token, this rank): source ids unique.
        ids = {tuple(v) for v in src.tolist()}
        assert len(ids) == src.shape[0]
    for l_, e in enumerate(local):
        want = ref[e]
        n = int(counts[l_])
        assert n == want.src.shape[0], (e, n, want.src.shape)
        if layout == "expert-major":
            got_src, got_rows = src[l_, :n], expert_x[l_, :n]
            got_scale = None if sc_all is None else sc_all[l_, :n]
        else:
            a, b = int(handle.expert_offsets[l_]), int(handle.expert_offsets[l_ + 1])
            rows = handle.expert_rows[a:b]
            assert b - a == n
            # The row's local expert ids name this expert.
            assert bool((handle.expert_ids[rows] == l_).any(1).all())
            got_src, got_rows = src[rows], expert_x[rows]
            got_scale = None if sc_all is None else sc_all[rows]
        order = sorted(range(n), key=lambda i: tuple(got_src[i].tolist()))
        got_src, got_rows = got_src[order], got_rows[order]
        assert torch.equal(got_src, want.src), (e, got_src, want.src)
        assert torch.equal(got_rows.view(torch.uint8), want.rows.view(torch.uint8)), e
        if scales is not None:
            assert got_scale is not None and torch.equal(got_scale[order], want.scales), e
    want_out = reference_combine(
        [d["x"] for d in inputs], [d["idx"] for d in inputs],
        [d["w"] for d in inputs], placement,
        lambda e, x, s: expert_fn(e, x, s, out_dtype),
        x_scales=scales, dp_size=dp, weighted=weighted, out_dtype=out_dtype,
    )[rank]
    assert out.dtype == out_dtype and out.shape == want_out.shape
    tol = TOL[out_dtype]
    # (torch.testing.assert_close would import torch.distributed.tensor: seconds per process.)
    err = (out.float() - want_out.float()).abs()
    assert bool((err <= tol + tol * want_out.float().abs()).all()), float(err.max())
    # Stronger: the fixed accumulation order (slot 0, 1, ... in float32) is the reference's,
    # so the bits agree too.
    assert torch.equal(out.view(torch.uint8), want_out.view(torch.uint8))
    # Deterministic: the same combine again gives the same bits.
    assert torch.equal(again.view(torch.uint8), out.view(torch.uint8))
    if case.get("multipath"):
        kinds = moe.orchestrator.stats.bytes_per_path_kind
        assert moe.orchestrator.stats.multipath_calls >= 2, moe.orchestrator.stats
        assert sum(v for kk, v in kinds.items() if kk not in ("direct", "torch")) > 0, kinds


def _run_cases(rank: int, world: int, cases: list[dict[str, Any]]) -> dict[str, str]:
    """Each case's failure on this rank (``""``: passed); one launch serves many tests."""
    failures = {}
    for case in cases:
        try:
            _check_case(rank, world, case)
            failures[case["name"]] = ""
        except Exception:
            failures[case["name"]] = traceback.format_exc()
    return failures


def _repeated(rank: int, world: int) -> list[str]:
    """One layer object, calls with changing token counts; then layers on two subgroups."""
    from pathweave.moe import MoEAllToAll

    failures = []
    moe = MoEAllToAll(8, 2, 64, 40, torch.float32)
    for t, ms in enumerate(([5, 40, 0, 7], [33, 1, 12, 0], [40, 40, 40, 40], [0, 0, 0, 3])):
        case = {"name": f"repeat{t}", "E": 8, "k": 2, "H": 64, "dtype": torch.float32,
                "m": ms, "seed": 100 + t}
        try:
            _check_case(rank, world, case, moe)
        except Exception:
            failures.append(f"repeat{t}: {traceback.format_exc()}")
    # Two process groups of two ranks, each with its own layer.
    import torch.distributed as dist

    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    g = groups[rank // 2]
    sub = MoEAllToAll(4, 2, 64, 16, torch.bfloat16, group=g, layout="compact")
    case = {"name": "subgroup", "E": 4, "k": 2, "H": 64, "dtype": torch.bfloat16,
            "m": [7, 16], "seed": 7 + rank // 2, "layout": "compact"}
    try:
        _check_case(dist.get_rank(g), 2, case, sub)
    except Exception:
        failures.append(f"subgroup: {traceback.format_exc()}")
    return failures


def _report(results: list[list[str]]) -> None:
    bad = [f"rank {r}: {f}" for r, fs in enumerate(results) for f in fs]
    assert not bad, "\n".join(bad)


CASES_4 = [
    {"name": "uniform-bf16", "E": 8, "k": 2, "H": 128, "dtype": torch.bfloat16},
    {"name": "uniform-compact", "E": 8, "k": 2, "H": 128, "dtype": torch.bfloat16,
     "layout": "compact"},
    {"name": "hot90-fp16", "E": 8, "k": 2, "H": 256, "dtype": torch.float16, "hot": 0.9,
     "hot_expert": 5, "m": [40, 40, 40, 40]},
    {"name": "hot90-compact", "E": 8, "k": 2, "H": 256, "dtype": torch.float16, "hot": 0.9,
     "layout": "compact", "m": [40, 40, 40, 40]},
    {"name": "idle-experts-zero-rank-k1", "E": 8, "k": 1, "H": 128, "dtype": torch.float32,
     "m": [12, 0, 9, 0], "unused": (1, 2, 6)},
    {"name": "k8-minus1-int32", "E": 16, "k": 8, "H": 128, "dtype": torch.float32,
     "drop": 0.3, "idx_dtype": torch.int32},
    {"name": "k8-compact", "E": 16, "k": 8, "H": 128, "dtype": torch.bfloat16, "drop": 0.2,
     "layout": "compact"},
    {"name": "fp8-scales", "E": 8, "k": 2, "H": 384, "dtype": torch.uint8},
    {"name": "fp8-scales-compact", "E": 8, "k": 4, "H": 300, "dtype": torch.uint8,
     "layout": "compact"},
    {"name": "fp8-native", "E": 8, "k": 2, "H": 256, "dtype": FP8, "m": [9, 0, 17, 4]},
    {"name": "fp8-native-compact", "E": 8, "k": 3, "H": 200, "dtype": FP8,
     "layout": "compact"},
    {"name": "hidden4096", "E": 4, "k": 2, "H": 4096, "dtype": torch.bfloat16, "m": [3, 5, 0, 2]},
    {"name": "dp2", "E": 8, "k": 2, "H": 128, "dtype": torch.bfloat16, "dp": 2,
     "m": [10, 10, 7, 7]},
    {"name": "dp2-compact", "E": 8, "k": 3, "H": 128, "dtype": torch.float32, "dp": 2,
     "layout": "compact", "m": [9, 9, 4, 4]},
    {"name": "dp4-fp8", "E": 8, "k": 2, "H": 256, "dtype": torch.uint8, "dp": 4},
    {"name": "placement", "E": 6, "k": 2, "H": 128, "dtype": torch.float32,
     "placement": [2, 0, 0, 2, 2, 1]},
    {"name": "placement-compact", "E": 6, "k": 3, "H": 128, "dtype": torch.float16,
     "placement": [3, 3, 0, 3, 1, 0], "layout": "compact"},
    {"name": "async", "E": 8, "k": 2, "H": 128, "dtype": torch.bfloat16, "async": True},
    {"name": "async-compact-dp2", "E": 8, "k": 2, "H": 128, "dtype": torch.bfloat16,
     "async": True, "layout": "compact", "dp": 2},
    {"name": "unweighted", "E": 8, "k": 2, "H": 128, "dtype": torch.float32, "weighted": False},
    {"name": "multipath-hot", "E": 8, "k": 2, "H": 512, "dtype": torch.bfloat16, "hot": 0.9,
     "m": [48, 48, 48, 48], "multipath": True, "fabric": "h100-2x4:gpus_per_node=2"},
    {"name": "multipath-compact-dp2", "E": 8, "k": 2, "H": 512, "dtype": torch.float16,
     "hot": 0.9, "dp": 2, "layout": "compact", "m": [48, 48, 48, 48], "multipath": True,
     "fabric": "h100-2x4:gpus_per_node=2"},
]

CASES_8 = [
    {"name": "8-uniform", "E": 16, "k": 4, "H": 256, "dtype": torch.bfloat16, "m": [24] * 8},
    {"name": "8-hot-compact", "E": 16, "k": 2, "H": 256, "dtype": torch.bfloat16, "hot": 0.9,
     "layout": "compact", "m": [32] * 8},
    {"name": "8-dp2-k8", "E": 32, "k": 8, "H": 128, "dtype": torch.float16, "dp": 2,
     "m": [12, 12, 0, 0, 30, 30, 5, 5]},
    {"name": "8-multipath-hot", "E": 8, "k": 2, "H": 512, "dtype": torch.bfloat16, "hot": 0.9,
     "m": [40] * 8, "multipath": True, "fabric": "h100-2x4"},
]


# Multi-rank launches are the cost of these tests: each group of cases runs in
# one launch (a module-scoped fixture) and each case is its own test.
@pytest.fixture(scope="module")
def results_4() -> list[dict[str, str]]:
    return run_local(_run_cases, 4, (CASES_4,), timeout_s=240)


@pytest.fixture(scope="module")
def results_8() -> list[dict[str, str]]:
    return run_local(_run_cases, 8, (CASES_8,), timeout_s=240)


def _report_case(results: list[dict[str, str]], name: str) -> None:
    bad = [f"rank {r}: {fs[name]}" for r, fs in enumerate(results) if fs[name]]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", [c["name"] for c in CASES_4])
def test_moe_4_ranks(results_4: list[dict[str, str]], name: str) -> None:
    _report_case(results_4, name)


@pytest.mark.parametrize("name", [c["name"] for c in CASES_8])
def test_moe_8_ranks(results_8: list[dict[str, str]], name: str) -> None:
    _report_case(results_8, name)


def test_moe_repeated_calls() -> None:
    _report(run_local(_repeated, 4, timeout_s=120))


# ----------------------------------------------------------------- errors
def _bad_calls(rank: int, world: int) -> list[tuple[str, str, str]]:
    """Each bad call: (label, exception type, message) as this rank saw it, then a good call."""
    from pathweave.moe import MoEAllToAll

    E, k, H = 8, 2, 32
    moe = MoEAllToAll(E, k, H, 8, torch.bfloat16)
    x = torch.ones(4, H, dtype=torch.bfloat16)
    idx = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7]])
    seen = []

    def attempt(label: str, fn: Any) -> None:
        try:
            fn()
        except (TypeError, ValueError) as exc:
            seen.append((label, type(exc).__name__, str(exc)))
        else:
            seen.append((label, "none", ""))

    def on(r: int, bad: Any, good: Any) -> Any:
        return bad if rank == r else good

    attempt("too-many", lambda: moe.dispatch(
        on(2, torch.ones(9, H, dtype=torch.bfloat16), x),
        on(2, torch.zeros(9, k, dtype=torch.int64), idx)))
    attempt("range", lambda: moe.dispatch(x, on(1, torch.tensor([[0, 1], [2, 8], [4, 5],
                                                                 [6, 7]]), idx)))
    attempt("negative", lambda: moe.dispatch(x, on(0, idx - 3, idx)))
    attempt("twice", lambda: moe.dispatch(x, on(3, torch.tensor([[0, 1], [2, 3], [5, 5],
                                                                 [6, 7]]), idx)))
    attempt("dtype", lambda: moe.dispatch(on(1, x.float(), x), idx))
    attempt("shape", lambda: moe.dispatch(on(2, torch.ones(4, H + 1, dtype=torch.bfloat16), x),
                                          idx))
    attempt("idx-shape", lambda: moe.dispatch(x, on(3, idx[:, :1], idx)))
    attempt("idx-float", lambda: moe.dispatch(x, on(0, idx.float(), idx)))
    attempt("not-tensor", lambda: moe.dispatch(on(1, [[1.0] * H] * 4, x), idx))
    attempt("scale-some", lambda: moe.dispatch(x, idx, on(2, torch.ones(4, 1), None)))
    attempt("scale-dtype", lambda: moe.dispatch(x, idx, on(2, torch.ones(4, 1).double(),
                                                           torch.ones(4, 1))))
    small = MoEAllToAll(E, k, H, 8, torch.bfloat16, expert_capacity=5)
    hot = torch.tensor([[0, 1]] * 2)  # 4 ranks x 2 tokens = 8 > 5 rows for expert 0
    attempt("capacity", lambda: small.dispatch(x[:2], hot))
    dpm = MoEAllToAll(E, k, H, 8, torch.bfloat16, dp_size=2)
    attempt("dp-differ", lambda: dpm.dispatch(x, on(3, idx.flip(0), idx)))
    # A good dispatch, then bad combines.
    ex, _, handle = moe.dispatch(x, idx)
    y = ex.clone()
    w = torch.full((4, k), 0.5)
    attempt("y-shape", lambda: moe.combine(on(1, y[:, :-1], y), handle, w))
    attempt("y-dtype-int", lambda: moe.combine(on(2, y.to(torch.int32), y), handle, w))
    attempt("y-dtype-mixed", lambda: moe.combine(on(3, y.float(), y), handle, w))
    attempt("w-missing", lambda: moe.combine(y, handle, on(0, None, w)))
    attempt("w-shape", lambda: moe.combine(y, handle, on(1, w[:3], w)))
    attempt("handle", lambda: moe.combine(y, on(2, "handle", handle), w))
    # Nothing hangs and the layer still works: a good round trip.
    out = moe.combine(y, handle, w)
    assert torch.equal(out, x), out
    seen.append(("good", "none", ""))
    return seen


EXPECT = {
    "too-many": ("ValueError", "rank 2: x has 9 tokens, more than max_num_tokens=8"),
    "range": ("ValueError", "rank 1: topk_idx[1, 1] = 8 is out of range [-1, 8)"),
    "negative": ("ValueError", "rank 0: topk_idx[0, 0] = -3 is out of range"),
    "twice": ("ValueError", "rank 3: token 2 is routed to expert 5 twice"),
    "dtype": ("TypeError", "rank 1: x has dtype float32, expected bfloat16"),
    "shape": ("ValueError", "rank 2: x has shape [4, 33], expected [m, hidden_dim=32]"),
    "idx-shape": ("ValueError", "rank 3: topk_idx has shape [4, 1], expected [4, "
                                "experts_per_token=2]"),
    "idx-float": ("TypeError", "rank 0: topk_idx has dtype float32, expected an integer"),
    "not-tensor": ("TypeError", "rank 1: x must be a torch.Tensor, got list"),
    "scale-some": ("ValueError", "rank 0 passed no x_scale but rank 2 passed x_scale with 1"),
    "scale-dtype": ("TypeError", "rank 2: x_scale has dtype float64, expected float32"),
    "capacity": ("ValueError", "expert 0 (rank 0) would receive 8 tokens, more than "
                               "expert_capacity=5"),
    "dp-differ": ("ValueError", "ranks 2 and 3 are in one DP group (dp_size=2) but hold "
                                "different topk_idx"),
    "y-shape": ("ValueError", "rank 1: expert_y has shape [2, 31, 32], expected [2, "
                              "expert_capacity=32, hidden_dim=32]"),
    "y-dtype-int": ("TypeError", "rank 2: expert_y has dtype int32, expected a floating"),
    "y-dtype-mixed": ("TypeError", "expert_y has dtype bfloat16 on rank 0 but float32 on "
                                   "rank 3"),
    "w-missing": ("TypeError", "rank 0: topk_weights must be a torch.Tensor"),
    "w-shape": ("ValueError", "rank 1: topk_weights has shape [3, 2], expected [4, "
                              "experts_per_token=2]"),
    "handle": ("TypeError", "rank 2: handle must be the handle of a dispatch of this layer"),
    "good": ("none", ""),
}


def test_moe_bad_input_raises_same_error_on_every_rank() -> None:
    seen = run_local(_bad_calls, 4, timeout_s=120)
    for r in range(1, 4):
        assert seen[r] == seen[0], (r, seen[r], seen[0])
    assert [s[0] for s in seen[0]] == list(EXPECT)
    for label, exc, msg in seen[0]:
        want_exc, want_msg = EXPECT[label]
        assert exc == want_exc, (label, exc, msg)
        assert want_msg in msg, (label, msg)


def test_moe_constructor_errors() -> None:
    from pathweave.moe import MoEAllToAll

    with pytest.raises(RuntimeError, match="not initialised"):
        MoEAllToAll(8, 2, 16, 4, torch.float32)
    with pytest.raises(ValueError, match="experts_per_token"):
        MoEAllToAll(8, 9, 16, 4, torch.float32)
    with pytest.raises(TypeError, match=r"dtype must be a torch\.dtype"):
        MoEAllToAll(8, 2, 16, 4, "bf16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="layout must be one of"):
        MoEAllToAll(8, 2, 16, 4, torch.float32, layout="rows")
    with pytest.raises(TypeError, match="max_num_tokens must be an int"):
        MoEAllToAll(8, 2, 16, 4.0, torch.float32)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("weighted", [True, False])
def test_slot_sum_batched_and_slot_by_slot_give_the_same_bits(dtype, weighted, monkeypatch):
    """Combine's weighted sum: all slots at once, one at a time and in groups of two (the last
    group shorter), against a plain loop."""
    from pathweave.moe import layer
    from pathweave.moe._pool import Pool

    g = torch.Generator().manual_seed(3)
    m, k, H, n = 37, 5, 24, 120
    rows = torch.cat([(torch.randn(n, H, generator=g) * 100).to(dtype),
                      torch.zeros(1, H, dtype=dtype)])              # row n: the zero row
    slot = torch.randint(0, n, (m, k), generator=g)
    slot[torch.rand(m, k, generator=g) < 0.3] = -1          # slots without a row
    w = torch.rand(m, k, generator=g) if weighted else None
    want = torch.zeros(m, H)                                 # float32, slot order j = 0, 1, ..
    for j in range(k):
        part = torch.where((slot[:, j] >= 0).unsqueeze(1), rows[slot[:, j].clamp(min=0)].float(),
                           torch.zeros(()))
        want = want + (part * w[:, j : j + 1] if weighted else part)
    got = {}
    for name, limit in (("batched", 1 << 40), ("by slot", 0),
                        ("two slots at a time", 2 * m * H * (rows.element_size() + 4))):
        monkeypatch.setattr(layer, "SLOT_SUM_BATCH_BYTES", limit)
        got[name] = layer._slot_sum(rows, slot, w, m, H, Pool(), zero_row=n)
    for name, out in got.items():
        assert torch.equal(out.view(torch.int32), want.view(torch.int32)), name


def test_example_moe_layer_matches_dense() -> None:
    """examples/moe_layer.py on 4 gloo ranks agrees with its dense single-process layer."""
    examples = str(Path(__file__).resolve().parents[1] / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)  # the ranks import the example by name, like this process
    import moe_layer

    errs = run_local(moe_layer.main, 4, timeout_s=120)
    assert max(errs) < 1e-4, errs


def test_example_one_rank_cost_checks_every_output(capsys) -> None:
    """examples/moe_one_rank_cost.py: both layouts and plain torch against x * sum(w).

    Its ``main`` runs here (a one-rank group of its own on a ``HashStore``, torn
    down when it returns), not in a fresh Python that imports torch again.
    """
    examples = str(Path(__file__).resolve().parents[1] / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    import moe_one_rank_cost

    status = moe_one_rank_cost.main(["--tokens", "48", "--hidden", "32", "--experts", "8",
                                     "--topk", "3", "--capacity", "48", "--repeat", "1"])
    out = capsys.readouterr().out
    assert status == 0, out
    lines = out.splitlines()
    assert lines[-1] == "outputs: all equal x * sum(w) within bf16 rounding", out
    from pathweave.moe.routing import LAYOUTS

    # plain torch, every layout, the low-latency mode
    rows = sum(line.startswith(("plain torch", "pathweave ")) for line in lines)
    assert rows == 2 + len(LAYOUTS), out
    assert sum(line.startswith(("PASS", "MISS")) for line in lines) == 2, out
    assert any(line.startswith("low-latency: torch ops per round trip") for line in lines)


def test_bench_moe_baselines_agree_with_pathweave() -> None:
    """The benchmark's three implementations give the same bits; padding costs bytes."""
    from pathweave.bench import moe as bench

    specs = [bench.MoECase(16, 64, "uniform"), bench.MoECase(24, 64, "hot")]
    recs = bench.run(world_size=4, num_experts=8, k=2, specs=specs, budget_s=0.01,
                     min_repeat=1, max_repeat=1, timeout_s=120)
    assert [(r["tokens"], r["routing"]) for r in recs] == [(16, "uniform"), (24, "hot")]
    for r in recs:
        assert r["outputs_equal"], r
        assert r["bytes_pathweave"] == r["bytes_exact"] < r["bytes_padded"], r
        # k * m rows per rank go out and come back: 4 ranks x 2 x k x m x H x 2 bytes.
        assert r["bytes_exact"] == 4 * 2 * 2 * r["tokens"] * 64 * 2, r
        # Forward + backward: pathweave's gradients equal torch's differentiable baseline's.
        assert r["grads_close"] and r["train_pathweave_s"] > 0 and r["train_exact_s"] > 0, r
    assert bench.summary(recs)["outputs_equal"] and bench.summary(recs)["grads_close"]


def _absent_peer(rank: int, world: int) -> str:
    """Ranks 0 and 1 dispatch; rank 2 never does: the metadata exchange must time out.

    The exchange's deadline is recorded as the layer passes it: it must be the
    orchestrator's ``timeout_s`` after the moment of the call (bracketed by
    two clock readings, so the check holds however slow the machine is).
    """
    import time

    import pathweave as pw
    from pathweave.moe import layer as moe_layer

    orch = pw.Orchestrator(timeout_s=1.0)
    moe = moe_layer.MoEAllToAll(6, 2, 8, 4, torch.float32, orchestrator=orch)
    if rank == world - 1:
        time.sleep(3.0)  # outlive the others' deadline, then leave without calling
        return "absent"
    deadlines: list[float] = []
    real = moe_layer.start_row_exchange

    def recording(row, group=None, *, deadline):
        deadlines.append(deadline)
        return real(row, group, deadline=deadline)

    moe_layer.start_row_exchange = recording
    x = torch.ones(2, 8)
    idx = torch.tensor([[0, 5], [1, 2]])
    t0 = time.monotonic()
    try:
        moe.dispatch(x, idx)
    except Exception as exc:
        t1 = time.monotonic()
        on_time = all(t0 + 1.0 <= d <= t1 + 1.0 for d in deadlines) and deadlines
        return f"{type(exc).__name__} deadline={'ok' if on_time else deadlines}: {exc}"
    return "no error"


def test_moe_exchange_keeps_the_orchestrator_deadline() -> None:
    """Both the gather's root (rank 0) and a broadcast receiver (rank 1) give up with
    CommError at the orchestrator's timeout_s when a peer never joins."""
    seen = run_local(_absent_peer, 3, timeout_s=60)
    assert seen[2] == "absent"
    for r in (0, 1):
        assert seen[r].startswith("CommError deadline=ok: "), (r, seen[r])
        assert f"rank {r}: metadata exchange" in seen[r], (r, seen[r])
