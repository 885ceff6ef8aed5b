"""Train a small Mixtral (Hugging Face ``transformers``) with expert parallelism over pathweave.

A tiny ``MixtralForCausalLM`` (random weights, nothing downloaded) is built on
every rank from one seed. Each MoE block's experts are replaced by
:class:`PathweaveExperts`: the rank keeps only its own experts' slices of
``gate_up_proj`` / ``down_proj``, and tokens reach them through
:class:`pathweave.moe.MoEAllToAll` (dispatch, local SwiGLU experts,
weighted combine), so the forward and the backward (gradients of the
tokens, of the router weights and of the experts) cross ranks through
pathweave's all-to-all. Attention, embeddings and routers are replicated
(data parallel: their gradients are averaged with an all-reduce).

The same model is then trained in one process on all ranks' batches with
transformers' own experts; the loss curves and the final parameters agree
within float32 tolerance (``tests/test_moe_training.py``)::

    python examples/moe_training.py              # 4 local gloo ranks, both layouts

Requires the ``models`` extra (``pip install -e '.[models]'``).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

WORLD, BATCH, SEQ, STEPS, LR = 4, 2, 8, 6, 0.3


def tiny_mixtral(seed: int = 0) -> Any:
    """A two-layer Mixtral with 8 experts, top-2, hidden size 32: the same on every rank."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
        num_experts_per_tok=2, max_position_embeddings=64, attn_implementation="eager",
    )
    torch.manual_seed(seed)
    return MixtralForCausalLM(config)


def batches(step: int) -> torch.Tensor:
    """Token ids of every rank for one step: ``[WORLD * BATCH, SEQ + 1]``.

    The same sequences every step (the model memorises them, so the loss falls).
    """
    g = torch.Generator().manual_seed(1000)
    return torch.randint(0, 64, (WORLD * BATCH, SEQ + 1), generator=g)


class PathweaveExperts(nn.Module):
    """This rank's experts of one MoE block, reached through ``pathweave.moe``.

    Same call as transformers' ``MixtralExperts``:
    ``forward(hidden_states [m, H], top_k_index [m, k], top_k_weights [m, k])``.
    """

    def __init__(self, experts: nn.Module, top_k: int, max_tokens: int, layout: str):
        super().__init__()
        from pathweave.moe import MoEAllToAll

        self.moe = MoEAllToAll(experts.num_experts, top_k, experts.hidden_dim, max_tokens,
                               torch.float32, layout=layout)
        ids = torch.from_numpy(self.moe.local_expert_ids)
        self.global_ids = self.moe.local_expert_ids.tolist()
        self.gate_up_proj = nn.Parameter(experts.gate_up_proj.detach()[ids].clone())
        self.down_proj = nn.Parameter(experts.down_proj.detach()[ids].clone())

    def _expert(self, l_: int, rows: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(rows, self.gate_up_proj[l_]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj[l_])

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        moe = self.moe
        expert_x, _, handle = moe.dispatch(hidden_states, top_k_index)
        counts = handle.expert_num_tokens  # known on the host from the metadata exchange
        if moe.layout == "compact":
            pieces = [expert_x[handle.expert_rows[:0]]]  # keeps expert_x in the graph
            for l_ in range(moe.num_local_experts):
                a, b = int(handle.expert_offsets[l_]), int(handle.expert_offsets[l_ + 1])
                pieces.append(self._expert(l_, expert_x[handle.expert_rows[a:b]]))
            expert_y = torch.cat(pieces)
        else:
            cap, H = moe.expert_capacity, moe.hidden_dim
            rows = [expert_x[:0]]
            for l_ in range(moe.num_local_experts):
                n = int(counts[l_])
                y = self._expert(l_, expert_x[l_, :n])  # padding rows are never computed
                rows.append(torch.cat([y, y.new_zeros(cap - n, H)]).unsqueeze(0))
            expert_y = torch.cat(rows)
        return moe.combine(expert_y, handle, top_k_weights)


def shard(model: Any, layout: str) -> list[PathweaveExperts]:
    """Swap every MoE block's experts for this rank's :class:`PathweaveExperts`."""
    out = []
    for layer in model.model.layers:
        block = layer.mlp
        mine = PathweaveExperts(block.experts, block.top_k, BATCH * SEQ, layout)
        block.experts = mine
        out.append(mine)
    return out


def _loss(model: Any, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _expert_tensors(experts: Any, ids: list[int], grads: bool) -> dict[int, tuple]:
    """``{global expert: (gate_up_proj, down_proj)}`` (or their gradients) as numpy."""
    a, b = experts.gate_up_proj, experts.down_proj
    if grads:
        a, b = a.grad, b.grad
    return {g: (a.detach()[i].numpy().copy(), b.detach()[i].numpy().copy())
            for i, g in enumerate(ids)}


def _snapshot(model: Any, grads: bool, local: bool) -> dict[str, Any]:
    """Expert weights (or gradients) of every layer, and the routers', as numpy."""
    out: dict[str, Any] = {}
    for li, layer in enumerate(model.model.layers):
        ex = layer.mlp.experts
        ids = ex.global_ids if local else list(range(ex.num_experts))
        for g, t in _expert_tensors(ex, ids, grads).items():
            out[f"layer{li}.expert{g}"] = t
        w = layer.mlp.gate.weight
        out[f"layer{li}.router"] = ((w.grad if grads else w).detach().numpy().copy(),)
    return out


def train_expert_parallel(rank: int, world: int, layouts: tuple[str, ...] = ("expert-major",),
                          steps: int = STEPS) -> dict[str, Any]:
    """One rank's training runs (one per layout): loss curves, first-step gradients, final
    weights of its expert shards and of the (replicated) routers, as numpy."""
    assert world == WORLD, world
    runs = {}
    for layout in layouts:
        model = tiny_mixtral()
        experts = shard(model, layout)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        replicated = [p for n, p in model.named_parameters() if ".experts." not in n]
        losses, grads0 = [], {}
        for step in range(steps):
            ids = batches(step)[rank * BATCH : (rank + 1) * BATCH]
            opt.zero_grad()
            loss = _loss(model, ids)
            loss.backward()
            # Replicated parameters: average over ranks. Experts: every rank's loss already
            # sent its share of each expert's gradient through the all-to-all; average alike.
            for p in replicated:
                dist.all_reduce(p.grad)
                p.grad /= world
            for e in experts:
                e.gate_up_proj.grad /= world
                e.down_proj.grad /= world
            if step == 0:
                grads0 = _snapshot(model, grads=True, local=True)
            total = loss.detach().clone()
            dist.all_reduce(total)
            losses.append(float(total) / world)
            opt.step()
        runs[layout] = {"losses": losses, "grads0": grads0,
                        "final": _snapshot(model, grads=False, local=True)}
    return runs


def train_single_process(steps: int = STEPS) -> dict[str, Any]:
    """The same model and steps in one process, transformers' own experts, all ranks' data."""
    model = tiny_mixtral()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses, grads0 = [], {}
    for step in range(steps):
        opt.zero_grad()
        loss = _loss(model, batches(step))  # equal tokens per rank: the mean of rank means
        loss.backward()
        if step == 0:
            grads0 = _snapshot(model, grads=True, local=False)
        losses.append(float(loss.detach()))
        opt.step()
    return {"losses": losses, "grads0": grads0, "final": _snapshot(model, grads=False,
                                                                  local=False)}


def compare(runs: list[dict[str, Any]], ref: dict[str, Any]) -> dict[str, float]:
    """Largest relative differences: the loss curve, every first-step gradient (experts and
    routers), every weight after training."""
    def rel(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.linalg.norm(a - b) / max(float(np.linalg.norm(b)), 1e-30))

    got_losses = np.array(runs[0]["losses"])
    out = {"loss": float(np.max(np.abs(got_losses - ref["losses"]) / np.abs(ref["losses"])))}
    for what in ("grads0", "final"):
        merged: dict[str, Any] = {}
        for r in runs:
            merged.update(r[what])
        assert sorted(merged) == sorted(ref[what]), "every expert lives on exactly one rank"
        out[what] = max(rel(merged[key][i], ref[what][key][i])
                        for key in merged for i in range(len(merged[key])))
    return out


def main() -> int:
    from pathweave.moe.routing import LAYOUTS
    from pathweave.runtime.launch import run_local

    ref = train_single_process()
    print("single process losses:", " ".join(f"{v:.6f}" for v in ref["losses"]))
    worst = 0.0
    per_rank = run_local(train_expert_parallel, WORLD, (tuple(LAYOUTS),), timeout_s=300)
    for layout in LAYOUTS:
        runs = [r[layout] for r in per_rank]
        errs = compare(runs, ref)
        print(f"{layout:>12} losses:", " ".join(f"{v:.6f}" for v in runs[0]["losses"]),
              " rel. err:", ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
        worst = max(worst, *errs.values())
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
