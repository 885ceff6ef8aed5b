"""An unmodified third-party MoE layer on the ``pathweave`` backend: one line changes.

FairScale's expert-parallel ``MOELayer`` (GShard's top-2 gating) calls
``torch.distributed.all_to_all_single`` for its dispatch and combine. Nothing
in it knows about pathweave; this client only selects the backend::

    import pathweave.distributed                 # registers the backend
    dist.init_process_group("pathweave")         # instead of "gloo"/"nccl"

Run it under torchrun, once per backend, and compare::

    torchrun --standalone --nproc-per-node 4 examples/torchrun_moe_backend.py \\
        --backend pathweave --out /tmp/pw
    torchrun --standalone --nproc-per-node 4 examples/torchrun_moe_backend.py \\
        --backend gloo --out /tmp/gloo

Each rank trains its experts for ``--steps`` steps (forward, backward, SGD;
the backward pass runs the all-to-alls again) on tokens that favour the
first experts, and saves its outputs, loss and expert weights to
``OUT/rank<r>.pt``; ``--compare DIR`` checks them bitwise against another
run. Each rank prints a JSON report (with ``--backend pathweave``, the
orchestrator's account from
``pathweave.distributed.default_orchestrator().stats``) and writes it to
``OUT/report<r>.json``. The backend is configured by the environment
(``PATHWEAVE_MULTIPATH``, ``PATHWEAVE_POLICY``,
``PATHWEAVE_FABRIC``; see ``docs/runtime.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from fairscale.nn.moe import MOELayer, Top2Gate

import pathweave.distributed as pwd


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="pathweave", help="torch.distributed backend")
    p.add_argument("--out", required=True, help="folder for rank<r>.pt")
    p.add_argument("--compare", help="folder of another run to compare with bitwise")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tokens", type=int, default=512, help="tokens per rank per step")
    p.add_argument("--model-dim", type=int, default=64)
    return p.parse_args(argv)


def _run(a: argparse.Namespace) -> dict[str, torch.Tensor]:
    rank, ws = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)  # the gate is replicated: same weights on every rank
    gate = Top2Gate(a.model_dim, ws)
    torch.manual_seed(100 + rank)  # one expert per rank, its own weights
    expert = torch.nn.Linear(a.model_dim, a.model_dim)
    moe = MOELayer(gate, expert)
    opt = torch.optim.SGD(moe.parameters(), lr=0.1)
    saved: dict[str, torch.Tensor] = {}
    g = torch.Generator().manual_seed(7 + rank)
    skew = torch.linspace(2.0, 0.0, a.model_dim)  # tokens lean towards the first experts
    for step in range(a.steps):
        x = torch.randn(1, a.tokens, a.model_dim, generator=g) + skew
        y = moe(x)
        loss = y.square().mean() + moe.l_aux
        opt.zero_grad()
        loss.backward()
        opt.step()
        saved[f"out{step}"] = y.detach()
        saved[f"loss{step}"] = loss.detach()
    saved.update({f"param.{k}": v.detach() for k, v in moe.named_parameters()})
    return saved


def _compare(out: str, other: str, rank: int) -> list[str]:
    mine = torch.load(os.path.join(out, f"rank{rank}.pt"))
    theirs = torch.load(os.path.join(other, f"rank{rank}.pt"))
    bad = [k for k in mine if not torch.equal(mine[k].view(-1).view(torch.uint8),
                                              theirs[k].view(-1).view(torch.uint8))]
    return bad + sorted(set(theirs) - set(mine))


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    if not dist.is_initialized():  # a launcher that joined the group first (a test's)
        dist.init_process_group(a.backend)
    if dist.get_backend() != a.backend:
        raise SystemExit(f"--backend {a.backend}, but the group runs {dist.get_backend()}")
    rank = dist.get_rank()
    os.makedirs(a.out, exist_ok=True)
    torch.save(_run(a), os.path.join(a.out, f"rank{rank}.pt"))
    report = {"rank": rank, "backend": str(dist.get_backend())}
    if report["backend"] == "pathweave":
        stats = pwd.default_orchestrator().stats
        report["stats"] = {k: v for k, v in stats.as_dict().items()
                           if k not in ("bytes_per_link", "last_call")}
    if a.compare:
        report["differs"] = _compare(a.out, a.compare, rank)
    dist.barrier()
    dist.destroy_process_group()
    text = json.dumps(report)
    with open(os.path.join(a.out, f"report{rank}.json"), "w") as f:
        f.write(text + "\n")
    print(text, flush=True)
    return 1 if report.get("differs") else 0


if __name__ == "__main__":
    sys.exit(main())
