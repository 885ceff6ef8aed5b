"""The low-latency mode of MoEAllToAll (issue 23) against the dense single-process model.

Outputs against :mod:`pathweave.moe.reference` (dispatch rows and fp8 block
scales bit for bit, in the layer's source order; combine within float32
rounding) on 1 and 4 gloo ranks for every layout of the registry, with and
without DP groups, for float32, bfloat16 and fp8 bytes with scales;
gradients against test_moe_grad's dense model for all of its cases (1e-4
relative); no host read-back in a steady-state step, every layout, DP
groups, a forced multi-path orchestrator; the overflow contract (eager shape
errors, ``debug_checks`` on every rank); bitwise determinism, and multi-path
results bitwise equal to the single-path ones; at most 20 torch operations
per float32 round trip in every layout.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pathweave.bench.moe import count_ops, host_reads
from pathweave.moe import MoEAllToAll, reference
from pathweave.moe.routing import LAYOUTS
from pathweave.runtime.launch import run_local
from test_moe_grad import GRAD_CASES, WORLD, _grad_job, assert_equal_dense

#: Payloads: float32, bfloat16, and fp8 bytes (``uint8``) with ``SCALES`` block scales.
PAYLOADS = (torch.float32, torch.bfloat16, torch.uint8)
SCALES = 2


def _inputs(world: int, m: int, k: int, experts: int, hidden: int, seed: int,
            dtype: torch.dtype, dp: int = 1) -> list[dict[str, torch.Tensor]]:
    """Per-rank inputs (members of a DP group hold the same); a rank (group) without
    tokens and uneven counts when there are several."""
    g = torch.Generator().manual_seed(seed)
    groups = []
    for gi in range(world // dp):
        mr = 0 if (world > dp and gi == 1) else m - gi
        idx = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(mr)]
                          or [torch.zeros(k, dtype=torch.int64)])[:mr]
        idx[torch.rand(mr, k, generator=g) < 0.2] = -1
        x = (torch.randint(0, 256, (mr, hidden), generator=g, dtype=torch.uint8)
             if dtype == torch.uint8 else torch.randn(mr, hidden, generator=g).to(dtype))
        groups.append({"x": x, "idx": idx, "w": torch.rand(mr, k, generator=g),
                       "scale": torch.rand(mr, SCALES, generator=g) + 0.5})
    return [groups[r // dp] for r in range(world)]


def _layer(layout: str, m: int, k: int, experts: int, hidden: int, dtype: torch.dtype,
           **kw: Any) -> MoEAllToAll:
    return MoEAllToAll(experts, k, hidden, m, dtype, layout=layout, mode="low_latency", **kw)


def _expert_fn(e: int, x: torch.Tensor, s: torch.Tensor | None) -> torch.Tensor:
    """Expert ``e``, row-wise: ``(e + 1) x`` (fp8 bytes: plus the first scale, in bf16)."""
    if x.dtype == torch.uint8:
        assert s is not None
        return (x.float() * (e + 1) + s[:, :1]).to(torch.bfloat16)
    return (x.float() * (e + 1)).to(x.dtype)


def _cases(world: int) -> list[tuple[str, int, torch.dtype]]:
    """Every layout of the registry, with and without DP groups, every payload."""
    return [(layout, dp, dtype) for layout in LAYOUTS for dp in ((1, 2) if world > 1 else (1,))
            for dtype in PAYLOADS]


def _valid(moe: MoEAllToAll, expert_x: torch.Tensor, counts: torch.Tensor,
           handle: Any) -> dict[int, tuple[torch.Tensor, Any]]:
    """Each local expert's valid rows (and where they sit) as the layout defines them."""
    out = {}
    for j, e in enumerate(moe.local_expert_ids.tolist()):
        if moe.layout == "compact":
            a, b = int(handle.expert_offsets[j]), int(handle.expert_offsets[j + 1])
            out[e] = (expert_x[handle.expert_rows[a:b]], handle.expert_rows[a:b])
        else:
            out[e] = (expert_x[j, : int(counts[j])], (j, int(counts[j])))
    return out


def _outputs_job(rank: int, world: int) -> list[dict[str, Any]]:
    """Dispatch and combine through ``_expert_fn`` for every case: this rank's results."""
    m, k, experts, hidden = 12, 3, 8, 32
    res = []
    for layout, dp, dtype in _cases(world):
        moe = _layer(layout, m, k, experts, hidden, dtype, dp_size=dp)
        d = _inputs(world, m, k, experts, hidden, 3, dtype, dp)[rank]
        sc = d["scale"] if dtype == torch.uint8 else None
        expert_x, counts, handle = moe.dispatch(d["x"], d["idx"], sc)
        rows, scales = {}, {}
        ys = [] if layout == "compact" else None
        y = None if layout == "compact" else torch.zeros(
            moe.num_local_experts, moe.expert_capacity, hidden,
            dtype=torch.bfloat16 if dtype == torch.uint8 else dtype)
        for e, (xe, where) in _valid(moe, expert_x, counts, handle).items():
            s = None
            if sc is not None:
                s = (handle.expert_x_scale[where] if layout == "compact"
                     else handle.expert_x_scale[where[0], : where[1]])
                scales[e] = s.numpy()
            out_e = _expert_fn(e, xe, s)
            if ys is not None:
                ys.append(out_e)
            else:
                y[where[0], : where[1]] = out_e
            # numpy (bf16 as float32, exactly): tensors would travel back through shared
            # memory of a process that has exited
            rows[e] = xe.float().numpy() if dtype != torch.uint8 else xe.numpy()
        if ys is not None:
            y = torch.cat(ys) if ys else torch.zeros(0, hidden, dtype=dtype)
        out = moe.combine(y, handle, d["w"])
        res.append({"rows": rows, "scales": scales, "out": out.float().numpy()})
    return res


def _mixed_scales_job(rank: int, world: int) -> list[float]:
    """One layer, calls with and without scales in turn (a buffer set per scale width):
    each combine must use its own dispatch's blocks."""
    # hidden 8 in bf16: 16-byte rows, 24 with the scales, so the count headers take two
    # rows in one set of blocks and one in the other
    d = _inputs(world, 12, 3, 8, 8, 4, torch.bfloat16)[rank]
    moe = _layer("expert-major", 12, 3, 8, 8, torch.bfloat16)
    errs = []
    for sc in (None, d["scale"], None, d["scale"]):
        expert_x, _, handle = moe.dispatch(d["x"], d["idx"], sc)
        out = moe.combine(expert_x, handle, d["w"])
        want = d["x"].float() * torch.where(d["idx"] >= 0, d["w"], 0).sum(1, keepdim=True)
        errs.append(float((out.float() - want).abs().sum(1).max()) if len(out) else 0.0)
    return errs


@pytest.mark.parametrize("world", [1, 4])
def test_low_latency_layer_with_and_without_scales(world: int) -> None:
    for errs in run_local(_mixed_scales_job, world, timeout_s=120):
        assert max(errs) <= 1.0, errs  # bf16 rounding of x * sum(w), summed over a row


def _source_order(src: torch.Tensor, dp: int) -> list[int]:
    """The layer's row order, source rank (the group member that owns the token) then
    token, of rows whose ids ``(DP group, token)`` the reference sorted."""
    keys = [(int(g), int(t) % dp, int(t)) for g, t in src.tolist()]
    return sorted(range(len(keys)), key=keys.__getitem__)


@pytest.mark.parametrize("world", [1, 4])
def test_low_latency_outputs_equal_reference(world: int) -> None:
    got = run_local(_outputs_job, world, timeout_s=240)
    placement = [e // (8 // world) for e in range(8)]
    for c, (layout, dp, dtype) in enumerate(_cases(world)):
        d = _inputs(world, 12, 3, 8, 32, 3, dtype, dp)
        xs, idxs, ws = [r["x"] for r in d], [r["idx"] for r in d], [r["w"] for r in d]
        scales = [r["scale"] for r in d] if dtype == torch.uint8 else None
        want_rows = reference.reference_dispatch(xs, idxs, placement, x_scales=scales,
                                                 dp_size=dp)
        want_out = reference.reference_combine(xs, idxs, ws, placement, _expert_fn,
                                               x_scales=scales, dp_size=dp)
        case = (layout, dp, dtype)
        seen = set()
        for r in range(world):
            for e, rows in got[r][c]["rows"].items():
                seen.add(e)
                order = _source_order(want_rows[e].src, dp)
                want = want_rows[e].rows[order]
                want = want if dtype == torch.uint8 else want.float()
                assert torch.equal(torch.from_numpy(rows), want), (case, r, e)
                if scales is not None:
                    assert torch.equal(torch.from_numpy(got[r][c]["scales"][e]),
                                       want_rows[e].scales[order]), (case, r, e)
            tol = 1e-6 if dtype == torch.float32 else 1e-2
            torch.testing.assert_close(torch.from_numpy(got[r][c]["out"]),
                                       want_out[r].float(), rtol=tol, atol=tol, msg=str(case))
        assert seen == set(range(8)), (case, seen)


def test_low_latency_gradients_equal_dense() -> None:
    """test_moe_grad's cases (every layout, DP groups, a rank without experts, the async
    halves, a forced multi-path orchestrator) against its dense model."""
    res = run_local(_grad_job, WORLD, (GRAD_CASES, "cpu", "low_latency"), timeout_s=240)
    assert_equal_dense(res, GRAD_CASES)


def _step(moe: MoEAllToAll, d: dict[str, torch.Tensor], grad: bool) -> torch.Tensor:
    x = d["x"].clone().requires_grad_(grad)
    w = d["w"].clone().requires_grad_(grad)
    expert_x, _, handle = moe.dispatch(x, d["idx"])
    # compact: every grouped pair's row (the first expert_offsets[L] are the valid ones)
    y = expert_x[handle.expert_rows] if moe.layout == "compact" else expert_x
    out = moe.combine(y * 2, handle, w)
    if grad:
        out.sum().backward()
    return out


def _forced_multipath() -> Any:
    """test_moe_grad's orchestrator: every pair split over paths, relays included."""
    import pathweave as pw

    return pw.Orchestrator(fabric="h100-2x4:gpus_per_node=2", enabled=True,
                           min_split_bytes=1, chunk_bytes=4096)


#: ``(layout, dp, multipath)``: every layout, with and without DP groups, and through a
#: forced multi-path orchestrator.
STEADY_CASES = [(layout, dp, False) for layout in LAYOUTS for dp in (1, 2)]
STEADY_CASES += [(layout, 1, True) for layout in LAYOUTS]


def _host_job(rank: int, world: int) -> list[list[list[tuple[str, int]]]]:
    """Host reads of a decode step and of a training step, after warm-up steps."""
    seen = []
    for layout, dp, multipath in STEADY_CASES:
        d = _inputs(world, 16, 4, 16, 32, 5, torch.float32, dp)[rank]
        moe = _layer(layout, 16, 4, 16, 32, torch.float32, dp_size=dp,
                     orchestrator=_forced_multipath() if multipath else None)
        case = []
        for grad in (False, True):
            for _ in range(3):  # the first call is the warm-up; then both buffer sets
                _step(moe, d, grad)
            with host_reads() as reads:
                _step(moe, d, grad)
            case.append(reads)
        seen.append(case)
    return seen


def test_low_latency_steady_state_reads_nothing_back() -> None:
    for r, cases in enumerate(run_local(_host_job, 4, timeout_s=240)):
        for case, (decode, train) in zip(STEADY_CASES, cases, strict=True):
            assert decode == [] and train == [], (r, case, decode, train)


def _det_job(rank: int, world: int) -> list[list[Any]]:
    res = []
    for layout, dp, multipath in STEADY_CASES:
        d = _inputs(world, 16, 4, 16, 32, 7, torch.float32, dp)[rank]
        outs = []
        for _ in range(2):  # a fresh layer each run; and repeated calls on one layer
            moe = _layer(layout, 16, 4, 16, 32, torch.float32, dp_size=dp,
                         orchestrator=_forced_multipath() if multipath else None)
            outs += [_step(moe, d, False).detach().numpy().copy() for _ in range(3)]
        if multipath:  # relayed; the constant matrices (one per direction) planned once
            stats = moe.orchestrator.stats
            assert stats.bytes_per_path_kind.keys() - {"direct", "torch"}, stats
            assert stats.plans_made <= 2 and stats.cache_hits >= 4, stats
        res.append(outs)
    return res


def test_low_latency_is_bitwise_deterministic_and_multipath_equals_single_path() -> None:
    """Repeated calls give the same bits; a forced multi-path orchestrator (relay/rail
    paths used) gives the bits of the single-path run of the same layout."""
    for cases in run_local(_det_job, 4, timeout_s=240):
        single = {}
        for (layout, dp, multipath), outs in zip(STEADY_CASES, cases, strict=True):
            assert all(o.tobytes() == outs[0].tobytes() for o in outs), (layout, dp)
            if not multipath:
                single[layout, dp] = outs[0]
            else:
                assert outs[0].tobytes() == single[layout, dp].tobytes(), layout


def _contract_job(rank: int, world: int) -> list[str]:
    msgs = []
    d = _inputs(world, 8, 2, 8, 16, 9, torch.float32)[rank]
    moe = _layer("expert-major", 8, 2, 8, 16, torch.float32)
    for bad in (torch.randn(9, 16), torch.randn(4, 12)):  # over max_num_tokens; wrong H
        try:
            moe.dispatch(bad, torch.zeros(bad.shape[0], 2, dtype=torch.int64))
        except ValueError as exc:
            msgs.append(str(exc))
    try:
        moe.dispatch(d["x"], d["idx"], stream=object())
    except ValueError as exc:
        msgs.append(str(exc))
    checked = _layer("expert-major", 8, 2, 8, 16, torch.float32, debug_checks=True)
    idx = d["idx"].clone()
    if rank == 2:
        idx[0, 0] = 8  # out of range on one rank: every rank raises
    try:
        checked.dispatch(d["x"], idx)
    except ValueError as exc:
        msgs.append(str(exc))
    small = _layer("expert-major", 8, 2, 8, 16, torch.float32, debug_checks=True,
                   expert_capacity=1)
    hot = torch.zeros(8, 2, dtype=torch.int64)
    hot[:, 1] = 1
    try:
        small.dispatch(torch.randn(8, 16), hot)
    except ValueError as exc:
        msgs.append(str(exc))
    return msgs


def test_low_latency_contract_errors() -> None:
    for msgs in run_local(_contract_job, 4, timeout_s=120):
        assert len(msgs) == 5, msgs
        assert "max_num_tokens=8" in msgs[0] and "[m, 16]" in msgs[1], msgs
        assert "stream is for CUDA tensors" in msgs[2], msgs
        assert "topk_idx[0, 0] = 8 on rank 2" in msgs[3], msgs
        assert "expert 0 receives 32 rows, more than expert_capacity=1" in msgs[4], msgs


def test_low_latency_refuses_what_it_lacks() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="mode must be one of"):
            MoEAllToAll(8, 2, 16, 4, torch.float32, mode="fast")
        with pytest.raises(ValueError, match="multiple of 8 bytes"):
            MoEAllToAll(8, 2, 3, 4, torch.float32, mode="low_latency")
    finally:
        dist.destroy_process_group()


def _round_trip_ops(moe: MoEAllToAll, d: dict[str, torch.Tensor]) -> int:
    """Torch ops of one steady-state float32 round trip (compact: less the caller's own
    gather of the grouped pairs' rows)."""
    compact = moe.layout == "compact"

    def round_trip() -> torch.Tensor:
        expert_x, _, handle = moe.dispatch(d["x"], d["idx"])
        return moe.combine(expert_x[handle.expert_rows] if compact else expert_x, handle,
                           d["w"])

    for _ in range(3):
        round_trip()
    return len(count_ops(round_trip)[1]) - compact


def _ops_job(rank: int, world: int) -> list[int]:
    d = _inputs(world, 128, 8, 256, 256, 1, torch.float32)[rank]
    return [_round_trip_ops(_layer(layout, 128, 8, 256, 256, torch.float32), d)
            for layout in LAYOUTS]


@pytest.mark.parametrize("world", [1, 4])
def test_low_latency_round_trip_is_at_most_20_torch_ops(world: int) -> None:
    for r, counts in enumerate(run_local(_ops_job, world, timeout_s=120)):
        for layout, n in zip(LAYOUTS, counts, strict=True):
            assert n <= 20, (r, layout, n)
