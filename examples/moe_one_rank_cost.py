"""One rank's MoE dispatch + combine against plain torch indexing: the layer's own cost.

With one rank nothing crosses a wire, so what is timed is what
:class:`pathweave.moe.MoEAllToAll` does around its exchange: the argument
checks, the routing tables, packing, the metadata row (and the one read of
counts back to the host), the copy through ``all_to_all_single`` and the
weighted sum. Plain torch does the same local work in four ops (``argsort``,
``index_select``, ``index_add_`` and a cast) without any exchange::

    python examples/moe_one_rank_cost.py            # CUDA and NCCL if there is a GPU, else gloo
    python examples/moe_one_rank_cost.py --tokens 256 --hidden 256 --experts 32 --topk 4

It prints the median time of one dispatch + combine with identity experts for
both layouts, for the low-latency mode (``mode="low_latency"``) and for plain
torch, PASS/MISS lines for the low-latency targets (ratio, host reads, torch
ops per round trip), the host's share of it (time until the
call returns, before the device finishes), and checks every output against
``x * sum(topk_weights)`` (exit status 1 if one differs by more than bf16
rounding). Measured on one H200 in docs/moe.md ("On one GPU").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--capacity", type=int, default=1024, help="rows per expert (expert-major)")
    p.add_argument("--repeat", type=int, default=20)
    return p.parse_args(argv)


def _timed(fn: Callable[[], torch.Tensor], repeat: int, cuda: bool) -> tuple[torch.Tensor, float,
                                                                             float]:
    """``(last output, median host s, median total s)`` after three untimed calls."""
    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for _ in range(3):
        fn()
    sync()
    host, total = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        sync()
        host.append(t1 - t0)
        total.append(time.perf_counter() - t0)
    return out, statistics.median(host), statistics.median(total)


def main(argv: list[str] | None = None) -> int:
    from pathweave.bench.moe import count_ops, host_reads
    from pathweave.moe import MoEAllToAll
    from pathweave.moe.routing import LAYOUTS

    a = _args(argv)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0,
                            world_size=1)
    try:
        g = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(a.tokens, a.hidden, device=dev, dtype=torch.bfloat16, generator=g)
        logits = torch.randn(a.tokens, a.experts, device=dev, generator=g)
        w, idx = logits.softmax(-1).topk(a.topk)
        want = (x.float() * w.sum(-1, keepdim=True)).to(torch.bfloat16).float()
        scale = float(want.abs().max())

        def plain() -> torch.Tensor:
            order = torch.argsort(idx.reshape(-1), stable=True)
            rows = order // a.topk
            y = x.index_select(0, rows).float() * w.reshape(-1)[order].unsqueeze(1)
            out = torch.zeros(a.tokens, a.hidden, device=dev, dtype=torch.float32)
            return out.index_add_(0, rows, y).to(torch.bfloat16)

        print(f"one rank on {torch.cuda.get_device_name(dev) if cuda else 'CPU'}: "
              f"{a.tokens} tokens, hidden {a.hidden}, top-{a.topk} of {a.experts} experts, bf16")
        results = {"plain torch": _timed(plain, a.repeat, cuda)}
        for layout in LAYOUTS:
            moe = MoEAllToAll(a.experts, a.topk, a.hidden, a.tokens, torch.bfloat16,
                              layout=layout, expert_capacity=a.capacity)

            def step(moe: MoEAllToAll = moe, layout: str = layout) -> torch.Tensor:
                ex, _, handle = moe.dispatch(x, idx)
                y = ex.index_select(0, handle.expert_rows) if layout == "compact" else ex
                return moe.combine(y, handle, w)  # identity experts

            results[f"pathweave {layout}"] = _timed(step, a.repeat, cuda)
        # The low-latency (decode) mode: fixed shapes, no host sync; expert-major only.
        ll = MoEAllToAll(a.experts, a.topk, a.hidden, a.tokens, torch.bfloat16,
                         mode="low_latency")

        def ll_step() -> torch.Tensor:
            ex, _, handle = ll.dispatch(x, idx)
            return ll.combine(ex, handle, w)

        results["pathweave low_latency"] = _timed(ll_step, a.repeat, cuda)
        ops = {"plain torch": plain, "pathweave low_latency": ll_step}
        ops = {name: len(count_ops(fn)[1]) for name, fn in ops.items()}
        with host_reads() as reads:
            ll_step()
        base = results["plain torch"][2]
        ok = True
        for name, (out, host_s, total_s) in results.items():
            err = float((out.float() - want).abs().max()) / scale
            ok &= err <= 2.0**-7  # bf16 rounding of the sum
            print(f"{name:24s} {total_s * 1e3:8.3f} ms  (host {host_s * 1e3:7.3f} ms)  "
                  f"{total_s / base:5.2f}x plain torch  max rel. error {err:.2g}")
        ratio = results["pathweave low_latency"][2] / base
        mark = {True: "PASS", False: "MISS"}
        print(f"{mark[ratio <= 3.0]} low-latency round trip <= 3x plain torch: {ratio:.2f}x "
              "(the CPU target: 128 tokens, hidden 256, fp32, in `pathweave bench moe`)")
        print(f"{mark[not reads]} low-latency: no host read-back per round trip: {len(reads)}")
        n = ops["pathweave low_latency"]
        # The <= 20 target is float32's (`pathweave bench moe`), whose weighted sum is one
        # embedding_bag; bf16 rows are gathered, cast and summed by bmm instead.
        print(f"low-latency: torch ops per round trip in bf16: {n} "
              f"(plain torch: {ops['plain torch']})")
        print("outputs: " + ("all equal x * sum(w) within bf16 rounding" if ok else "DIFFER"))
        return 0 if ok else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
