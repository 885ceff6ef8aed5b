"""The low-latency mode of MoEAllToAll (issue 23) against the dense single-process model.

Outputs against :mod:`pathweave.moe.reference` (dispatch rows bit for bit, in
the reference's source order; combine within float32 rounding) on 1 and 4
gloo ranks for every layout of the registry (a layout the mode lacks must be
refused by name); gradients against test_moe_grad's dense model (1e-4
relative); no host read-back in a steady-state step; the overflow contract
(eager shape errors, ``debug_checks`` on every rank); bitwise determinism;
at most 20 torch operations per float32 round trip.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pathweave.bench.moe import count_ops, host_reads
from pathweave.moe import MoEAllToAll, reference
from pathweave.moe._routing import LAYOUTS
from pathweave.runtime.launch import run_local
from test_moe_grad import (
    MS,
    NO_EXPERTS_ON_3,
    WORLD,
    E,
    H,
    K,
    _data,
    _expert_outputs,
    assert_equal_dense,
)


def _inputs(world: int, m: int, k: int, experts: int, hidden: int, seed: int,
            dtype: torch.dtype) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for r in range(world):
        mr = 0 if (world > 1 and r == 1) else m - r  # a rank without tokens, uneven counts
        idx = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(mr)]
                          or [torch.zeros(k, dtype=torch.int64)])[:mr]
        idx[torch.rand(mr, k, generator=g) < 0.2] = -1
        out.append({"x": torch.randn(mr, hidden, generator=g).to(dtype), "idx": idx,
                    "w": torch.rand(mr, k, generator=g)})
    return out


def _layer(layout: str, m: int, k: int, experts: int, hidden: int, dtype: torch.dtype,
           **kw: Any) -> MoEAllToAll:
    return MoEAllToAll(experts, k, hidden, m, dtype, layout=layout, mode="low_latency", **kw)


def _outputs_job(rank: int, world: int, dtype: torch.dtype) -> dict[str, Any]:
    """Dispatch (expert ``e`` scales by ``e + 1``) and combine, per layout: this rank's results."""
    m, k, experts, hidden = 12, 3, 8, 32
    res: dict[str, Any] = {}
    for layout in LAYOUTS:
        try:
            moe = _layer(layout, m, k, experts, hidden, dtype)
        except ValueError as exc:
            res[layout] = str(exc)
            continue
        d = _inputs(world, m, k, experts, hidden, 3, dtype)[rank]
        expert_x, counts, handle = moe.dispatch(d["x"], d["idx"])
        scale = torch.tensor([e + 1.0 for e in moe.local_expert_ids]).view(-1, 1, 1)
        out = moe.combine((expert_x.float() * scale).to(dtype), handle, d["w"])
        # numpy (bf16 as float32, exactly): tensors would travel back through shared memory
        # of a process that has exited
        rows = {int(e): expert_x[j, : int(counts[j])].float().numpy()
                for j, e in enumerate(moe.local_expert_ids)}
        res[layout] = {"rows": rows, "out": out.float().numpy()}
    return res


@pytest.mark.parametrize("world", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_latency_outputs_equal_reference(world: int, dtype: torch.dtype) -> None:
    got = run_local(_outputs_job, world, (dtype,), timeout_s=120)
    d = _inputs(world, 12, 3, 8, 32, 3, dtype)
    placement = [e // (8 // world) for e in range(8)]
    xs, idxs, ws = [r["x"] for r in d], [r["idx"] for r in d], [r["w"] for r in d]
    want_rows = reference.reference_dispatch(xs, idxs, placement)
    want_out = reference.reference_combine(xs, idxs, ws, placement,
                                           lambda e, x, s: (x.float() * (e + 1)).to(dtype))
    for layout in LAYOUTS:
        if layout != "expert-major":  # the peers' low-latency kernels have one layout too
            assert all(f"layout={layout!r}" in g[layout] for g in got), got[0][layout]
            continue
        for r in range(world):
            for e, rows in got[r][layout]["rows"].items():
                assert torch.equal(torch.from_numpy(rows), want_rows[e].rows.float()), (r, e)
            tol = 1e-6 if dtype == torch.float32 else 1e-2
            torch.testing.assert_close(torch.from_numpy(got[r][layout]["out"]),
                                       want_out[r].float(), rtol=tol, atol=tol)


def _grad_job(rank: int, world: int, cases: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """test_moe_grad's experts and loss through the low-latency mode."""
    out = []
    for layout, dp, placement, async_op, _ in cases:
        d = _data(dp, seed=11 + dp)
        moe = MoEAllToAll(E, K, H, max(MS), torch.float32, layout=layout, placement=placement,
                          mode="low_latency")
        x = d["x"][rank].clone().requires_grad_()
        w = d["w"][rank].clone().requires_grad_()
        weights = {e: d["W"][e].clone().requires_grad_() for e in moe.local_expert_ids.tolist()}
        res = moe.dispatch(x, d["idx"][rank], async_op=async_op)
        expert_x, counts, handle = res.wait() if async_op else res
        y = _expert_outputs(moe, expert_x, counts, handle, weights)
        res = moe.combine(y, handle, w, async_op=async_op)
        res = res.wait() if async_op else res
        (res * d["G"][rank]).sum().backward()
        out.append({"layout": layout, "dp": dp, "relayed": 0, "out": res.detach().numpy(),
                    "x": x.grad.numpy(), "w": w.grad.numpy(),
                    "W": {e: t.grad.numpy() for e, t in weights.items()}})
    return out


#: ``(layout, dp, placement, async_op, multipath)`` as test_moe_grad's cases: the layout of
#: the mode, a rank without experts, the async halves.
LL_GRAD_CASES = [("expert-major", 1, None, False, False),
                 ("expert-major", 1, NO_EXPERTS_ON_3, True, False)]


def test_low_latency_gradients_equal_dense() -> None:
    assert_equal_dense(run_local(_grad_job, WORLD, (LL_GRAD_CASES,), timeout_s=180),
                       LL_GRAD_CASES)


def _step(moe: MoEAllToAll, d: dict[str, torch.Tensor], grad: bool) -> torch.Tensor:
    x = d["x"].clone().requires_grad_(grad)
    w = d["w"].clone().requires_grad_(grad)
    expert_x, _, handle = moe.dispatch(x, d["idx"])
    out = moe.combine(expert_x * 2, handle, w)
    if grad:
        out.sum().backward()
    return out


def _host_job(rank: int, world: int) -> list[list[tuple[str, int]]]:
    """Host reads of a decode step and of a training step, after warm-up steps."""
    d = _inputs(world, 16, 4, 16, 32, 5, torch.float32)[rank]
    moe = _layer("expert-major", 16, 4, 16, 32, torch.float32)
    seen = []
    for grad in (False, True):
        for _ in range(3):  # the first call is the warm-up; then both buffer sets
            _step(moe, d, grad)
        with host_reads() as reads:
            _step(moe, d, grad)
        seen.append(reads)
    return seen


def test_low_latency_steady_state_reads_nothing_back() -> None:
    for r, (decode, train) in enumerate(run_local(_host_job, 4, timeout_s=120)):
        assert decode == [] and train == [], (r, decode, train)


def _det_job(rank: int, world: int) -> list[Any]:
    d = _inputs(world, 16, 4, 16, 32, 7, torch.float32)[rank]
    outs = []
    for _ in range(2):  # a fresh layer each run; and repeated calls on one layer
        moe = _layer("expert-major", 16, 4, 16, 32, torch.float32)
        outs += [_step(moe, d, False).detach().numpy().copy() for _ in range(3)]
    return outs


def test_low_latency_is_bitwise_deterministic() -> None:
    for outs in run_local(_det_job, 4, timeout_s=120):
        assert all(o.tobytes() == outs[0].tobytes() for o in outs)


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
        for kw, word in (({"dp_size": 1, "mode": "fast"}, "mode must be one of"),
                         ({"mode": "low_latency", "layout": "compact"}, "layout='compact'")):
            with pytest.raises(ValueError, match=word):
                MoEAllToAll(8, 2, 16, 4, torch.float32, **kw)
        with pytest.raises(ValueError, match="multiple of 8 bytes"):
            MoEAllToAll(8, 2, 3, 4, torch.float32, mode="low_latency")
    finally:
        dist.destroy_process_group()


def _ops_job(rank: int, world: int) -> list[int]:
    d = _inputs(world, 128, 8, 256, 256, 1, torch.float32)[rank]
    moe = _layer("expert-major", 128, 8, 256, 256, torch.float32)

    def round_trip() -> torch.Tensor:
        expert_x, _, handle = moe.dispatch(d["x"], d["idx"])
        return moe.combine(expert_x, handle, d["w"])

    for _ in range(3):
        round_trip()
    return [len(count_ops(round_trip)[1])]


@pytest.mark.parametrize("world", [1, 4])
def test_low_latency_round_trip_is_at_most_20_torch_ops(world: int) -> None:
    for (n,) in run_local(_ops_job, world, timeout_s=120):
        assert n <= 20, n
