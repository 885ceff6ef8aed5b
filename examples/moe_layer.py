"""A small Mixture-of-Experts layer with expert parallelism, checked against a dense one.

Run it with one process per GPU (on a machine without GPUs, CPU processes
over gloo)::

    torchrun --nproc-per-node 4 examples/moe_layer.py

or without torchrun (it then starts 4 local gloo processes itself)::

    python examples/moe_layer.py

The layer: a router (linear, softmax, top-k with renormalised weights), 16
expert FFNs (``w2 @ silu(w1 @ x)``) spread 4 per rank, and one shared expert
every rank holds. Per forward pass each rank

1. routes its own tokens,
2. starts the dispatch (``async_op=True``) and computes the shared expert
   while the tokens travel (the overlap pplx-kernels' split kernels give),
3. runs each local expert on its rows of ``expert_x`` (``[L, capacity, H]``),
4. starts the combine (``async_op=True``), adds the residual meanwhile,
   and waits for the weighted sum of its tokens' expert outputs.

Every rank then recomputes the whole layer densely in one process (all
ranks' tokens through all experts, weights from the same seed) and checks
that its share matches. The tokens are skewed (a third of them prefer
expert 0), as real routers are.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

NUM_EXPERTS, TOP_K, HIDDEN, FFN, TOKENS = 16, 2, 256, 512, 96


def make_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """All weights of the layer; every rank builds the same ones and keeps what it needs."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    return {
        "router": rnd(NUM_EXPERTS, HIDDEN, scale=HIDDEN**-0.5),
        "w1": rnd(NUM_EXPERTS, FFN, HIDDEN, scale=HIDDEN**-0.5),
        "w2": rnd(NUM_EXPERTS, HIDDEN, FFN, scale=FFN**-0.5),
        "shared1": rnd(FFN, HIDDEN, scale=HIDDEN**-0.5),
        "shared2": rnd(HIDDEN, FFN, scale=FFN**-0.5),
    }


def make_tokens(rank: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    x = torch.randn(TOKENS, HIDDEN, generator=g)
    # A third of the tokens lean towards expert 0: a hot expert.
    r0 = make_weights()["router"][0]
    x[: TOKENS // 3] += 4.0 * r0 / r0.square().sum()  # +4 on expert 0's logit
    return x


def route(x: torch.Tensor, w: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(x @ w["router"].T, dim=-1)
    weights, idx = torch.topk(probs, TOP_K, dim=-1)
    return idx, weights / weights.sum(dim=-1, keepdim=True)


def ffn(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return F.silu(x @ w1.T) @ w2.T


def moe_forward(x: torch.Tensor, w: dict[str, torch.Tensor], moe) -> torch.Tensor:
    """The expert-parallel layer on this rank's tokens."""
    idx, topk_w = route(x, w)
    pending = moe.dispatch(x, idx, async_op=True)
    shared = ffn(x, w["shared1"], w["shared2"])  # overlaps the dispatch
    expert_x, counts, handle = pending.wait()
    expert_y = torch.zeros_like(expert_x)
    for loc, e in enumerate(moe.local_expert_ids.tolist()):
        n = int(counts[loc])
        expert_y[loc, :n] = ffn(expert_x[loc, :n], w["w1"][e], w["w2"][e])
    pending = moe.combine(expert_y, handle, topk_w, async_op=True)
    residual = x + shared  # overlaps the combine
    return residual + pending.wait()


def dense_forward(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """The same layer in one process, every token through its experts one by one."""
    idx, topk_w = route(x, w)
    out = x + ffn(x, w["shared1"], w["shared2"])
    for i in range(x.shape[0]):
        for j in range(TOP_K):
            e = int(idx[i, j])
            out[i] += topk_w[i, j] * ffn(x[i : i + 1], w["w1"][e], w["w2"][e])[0]
    return out


def main(rank: int | None = None, world: int | None = None) -> float:
    from pathweave.moe import MoEAllToAll

    if not dist.is_initialized():  # under torchrun
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if NUM_EXPERTS % world:
        raise SystemExit(f"{NUM_EXPERTS} experts do not split over {world} ranks")
    torch.manual_seed(0)
    w = make_weights()
    moe = MoEAllToAll(NUM_EXPERTS, TOP_K, HIDDEN, TOKENS, torch.float32)
    x = make_tokens(rank)
    out = moe_forward(x, w, moe)

    # The dense check: all ranks' tokens, one process, no communication.
    want = dense_forward(x, w)
    err = float((out - want).abs().max())
    counts = torch.zeros(NUM_EXPERTS, dtype=torch.int64)
    for r in range(world):
        idx, _ = route(make_tokens(r), w)
        counts += torch.bincount(idx.flatten(), minlength=NUM_EXPERTS)
    if rank == 0:
        print(f"{world} ranks, {NUM_EXPERTS} experts ({NUM_EXPERTS // world} per rank), "
              f"top-{TOP_K}, hidden {HIDDEN}, {TOKENS} tokens per rank")
        print(f"tokens per expert: {counts.tolist()} (expert 0 is hot)")
    errs = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(errs, torch.tensor([err]))
    if rank == 0:
        worst = max(float(e) for e in errs)
        print(f"max |expert-parallel - dense| over all ranks: {worst:.2e}")
        print("OK: matches the dense layer" if worst < 1e-4 else "MISMATCH")
    return err


if __name__ == "__main__":
    if "RANK" in os.environ:
        err = main()
        dist.destroy_process_group()
    else:
        from pathweave.runtime.launch import run_local

        err = max(run_local(main, 4))
    sys.exit(0 if err < 1e-4 else 1)
