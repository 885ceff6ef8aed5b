"""A skewed all-to-all through pathweave under torchrun, checked against torch's own.

Run it with one process per GPU (or, on a machine without GPUs, one CPU
process per would-be GPU over gloo)::

    PATHWEAVE_FABRIC=h100-2x4 torchrun --nproc-per-node 8 examples/torchrun_all_to_all.py

``PATHWEAVE_FABRIC`` names the fabric the planner routes over (a preset or a
fabric file, with as many GPUs as the job has ranks); without it pathweave
takes DGX H100-like nodes, one per host, of as many GPUs as the host runs
ranks (``PATHWEAVE_DEBUG=INFO`` logs which). One node has a single path per
pair, so there multi-path does not engage; ``PATHWEAVE_FABRIC=h100-2x4`` with
8 ranks on one machine routes as over the NIMBLE testbed (2 nodes x 4 H100).
With CUDA GPUs for every local rank it uses NCCL, otherwise gloo on CPU.

Every rank sends ``--mib`` MiB of bfloat16 data, 80 % of it to rank 0
(``pathweave.traffic.hotspot``), with ``pathweave.distributed.all_to_all_single``
(the same arguments as ``torch.distributed.all_to_all_single``). The output
is compared bitwise with torch's ``all_to_all_single`` on the same input, and
rank 0 prints how the bytes travelled (from ``Orchestrator.stats``) and the
median time of both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import pathweave as pw
from pathweave import distributed as pwdist


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=float, default=64.0, help="MiB each rank sends (default 64)")
    p.add_argument("--ratio", type=float, default=0.8,
                   help="share of each rank's payload that goes to rank 0 (default 0.8)")
    p.add_argument("--repeat", type=int, default=5, help="timed calls of each (default 5)")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= local_world
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")

    # Every rank computes the same demand matrix; row `rank` is what it sends.
    element_bytes = 2  # bfloat16
    demand = pw.traffic.hotspot(world, bytes_per_rank=args.mib * (1 << 20), ratio=args.ratio)
    splits = (demand // element_bytes).astype(int)
    send, recv = splits[rank].tolist(), splits[:, rank].tolist()
    gen = torch.Generator().manual_seed(1234 + rank)
    inp = torch.randn(sum(send), generator=gen).to(torch.bfloat16).to(device)
    out = torch.empty(sum(recv), dtype=torch.bfloat16, device=device)
    ref = torch.empty_like(out)

    # Fabric from PATHWEAVE_FABRIC, else shaped by the ranks per host; the default
    # policy mintime, enabled="auto".
    orch = pw.Orchestrator()
    fabric = orch.group_fabric()  # PATHWEAVE_DEBUG=INFO logs it and where it came from

    def pathweave_a2a(output, input, output_split_sizes, input_split_sizes) -> None:
        pwdist.all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                 orchestrator=orch)

    dist.all_to_all_single(ref, inp, recv, send)
    pathweave_a2a(out, inp, recv, send)  # plans; the timed calls below hit the plan cache
    ok = torch.equal(out.view(torch.int16), ref.view(torch.int16))  # bitwise

    def timed(fn, output) -> float:
        dist.barrier()
        if use_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(output, inp, recv, send)
        if use_cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    kinds_before = dict(orch.stats.bytes_per_path_kind)
    torch_s, pw_s = [], []
    for _ in range(args.repeat):
        torch_s.append(timed(dist.all_to_all_single, ref))
        out.zero_()
        pw_s.append(timed(pathweave_a2a, out))
        ok = ok and torch.equal(out.view(torch.int16), ref.view(torch.int16))
    kinds = {k: (v - kinds_before.get(k, 0)) // args.repeat
             for k, v in dict(orch.stats.bytes_per_path_kind).items()}

    # Every rank's view, gathered on all (the slowest rank sets a collective's time).
    report = {"ok": bool(ok), "kinds": kinds, "torch_s": statistics.median(torch_s),
              "pw_s": statistics.median(pw_s), "multipath": bool(orch.stats.last_call.multipath)}
    reports: list = [None] * world
    dist.all_gather_object(reports, report)
    all_ok = all(r["ok"] for r in reports)
    if rank == 0:
        total = reports[0]["kinds"]  # the orchestrator counts every rank's traffic
        moved = int(demand.sum()) // element_bytes * element_bytes
        print(f"{world} ranks on {'NCCL' if use_cuda else 'gloo'}, fabric "
              f"{fabric.name}, hotspot {args.ratio}: "
              f"{moved / (1 << 20):.1f} MiB per call")
        by_kind = ", ".join(f"{k} {v / (1 << 20):.1f} MiB" for k, v in total.items() if v)
        print(f"multi-path: {all(r['multipath'] for r in reports)}; bytes per call by path "
              f"kind: {by_kind}")
        print(f"median call: pathweave {max(r['pw_s'] for r in reports) * 1e3:.2f} ms, torch "
              f"{max(r['torch_s'] for r in reports) * 1e3:.2f} ms")
        print("verified: bitwise equal to torch.distributed.all_to_all_single on every rank"
              if all_ok else "MISMATCH: pathweave's output differs from torch's")
    dist.destroy_process_group()
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
