"""The data plane's host work per call, with the transport taken out.

torch's fake process group (``torch.testing._internal.distributed.fake_pg``,
backend ``"fake"``) completes every collective and point-to-point op at once
without moving a byte, so a call's time on it is the host work alone: for
pathweave's ``all_to_all_single`` the decision, the cached schedule, posting
every op of every round and the copy into the output; for torch's own the
argument handling and posting. One process plays one rank of ``N``; the
call passes ``split_matrix=`` and ``config_digests=`` (as the MoE layer
does), so no metadata exchange is timed; the plan is made before timing
(``enabled=True``: the multi-path executor runs, never torch's fallback).
The tensors are on torch's ``meta`` device by default: fake ops on them
move no memory either, so neither call is charged for copying bytes (on a
GPU that copy is device work; on this CPU it would dwarf the rest: 6 of
8 ms of pathweave's call at 8 ranks was the copy into the output, and
torch's own fake call on CPU tensors took 0.1 s). ``device="cpu"`` keeps it.

The demand: 1 MiB per pair and one hot column of 16 MiB (every
rank sends rank 0 16 MiB), timed on rank 1, which sends 16 MiB + (N - 2) MiB
and receives (N - 1) MiB.

Targets: median host work <= 100 us at 8 ranks, <= 1 ms at 256
(<= 4 ms at 1024), and never above torch's own call on the same group from
64 ranks up.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from pathweave.bench._report import Check, Progress

__all__ = ["FABRICS", "TARGETS_S", "checks", "measure", "run"]

#: Ranks -> the fabric the group is planned on (8 GPUs per node from 64 up).
FABRICS = {8: "h100-2x4", 64: "dgx-h100:nodes=8", 256: "dgx-h100:nodes=32",
           1024: "dgx-h100:nodes=128"}
#: Ranks -> the target median host work per call (seconds).
TARGETS_S = {8: 100e-6, 256: 1e-3, 1024: 4e-3}
PAIR_BYTES = 1 << 20
HOT_BYTES = 16 << 20
#: From this many ranks pathweave's call must cost no more than torch's.
TORCH_PARITY_RANKS = 64
ELEMENT_BYTES = 4
RANK = 1


def split_matrix(num_ranks: int) -> np.ndarray:
    """Rows (float32 elements) per pair: 1 MiB each, 16 MiB into rank 0, none to oneself.

    >>> split_matrix(3).tolist()
    [[0, 262144, 262144], [4194304, 0, 262144], [4194304, 262144, 0]]
    """
    rows = np.full((num_ranks, num_ranks), PAIR_BYTES // ELEMENT_BYTES, dtype=np.int64)
    rows[1:, 0] = HOT_BYTES // ELEMENT_BYTES
    np.fill_diagonal(rows, 0)
    return rows


def _timed(fn: Any, repeats: int) -> float:
    took = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        took.append(time.perf_counter() - t0)
    return statistics.median(took)


def measure(num_ranks: int, repeats: int = 20, device: str = "meta") -> dict[str, Any]:
    """Median host work of one call on rank 1 of a fake group of ``num_ranks``."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import pathweave as pw
    import pathweave.distributed as pwd

    if dist.is_initialized():
        raise RuntimeError("bench hostcost needs a process without a process group")
    fabric = FABRICS.get(num_ranks, f"dgx-h100:nodes={max(1, num_ranks // 8)}")
    dist.init_process_group("fake", store=FakeStore(), rank=RANK, world_size=num_ranks)
    try:
        rows = split_matrix(num_ranks)
        send, recv = rows[RANK].tolist(), rows[:, RANK].tolist()
        inp = torch.zeros(sum(send), dtype=torch.float32, device=device)
        out = torch.empty(sum(recv), dtype=torch.float32, device=device)
        orch = pw.Orchestrator(fabric=fabric, enabled=True, adapt=False)
        digests = np.full(num_ranks, orch.config_digest(), dtype=np.int64)
        t0 = time.perf_counter()

        def ours() -> None:
            pwd.all_to_all_single(out, inp, recv, send, orchestrator=orch, split_matrix=rows,
                                  config_digests=digests)

        ours()  # plans and schedules: not timed
        first_s = time.perf_counter() - t0
        pw_s = _timed(ours, repeats)
        torch_s = _timed(lambda: dist.all_to_all_single(out, inp, recv, send), repeats)
        last = orch.stats.last_call
        return {"ranks": num_ranks, "fabric": fabric, "pathweave_s": pw_s, "torch_s": torch_s,
                "first_call_s": first_s, "multipath": bool(last and last.multipath),
                "send_bytes": sum(send) * ELEMENT_BYTES, "repeats": repeats, "device": device}
    finally:
        dist.destroy_process_group()


def checks(records: Sequence[dict[str, Any]]) -> list[Check]:
    """The PASS/MISS lines of the targets for the ranks measured."""
    out = []
    for r in records:
        n, pw_s, t_s = r["ranks"], r["pathweave_s"], r["torch_s"]
        target = TARGETS_S.get(n)
        if target is not None:
            out.append(Check(f"host_{n}", pw_s, target, pw_s <= target,
                             f"host work at {n} ranks: {pw_s * 1e6:,.0f} us (target <= "
                             f"{target * 1e6:,.0f} us)"))
        if n >= TORCH_PARITY_RANKS:
            out.append(Check(f"vs_torch_{n}", pw_s / t_s, 1.0, pw_s <= t_s,
                             f"host work at {n} ranks vs torch's own call: {pw_s / t_s:.2f}x "
                             f"({pw_s * 1e6:,.0f} vs {t_s * 1e6:,.0f} us; target <= 1x)"))
    return out


def run(ranks: Sequence[int] = (8, 64, 256), repeats: int = 20, device: str = "meta",
        progress: Progress | None = None) -> tuple[list[dict[str, Any]], list[Check]]:
    """Measure every rank count in turn; the records and their target lines."""
    records = []
    for i, n in enumerate(ranks):
        if progress is not None:
            progress(i, len(ranks), f"{n} ranks")
        records.append(measure(int(n), repeats, device))
    return records, checks(records)
