"""The body of one rank that :func:`pathweave.emulate.run.run_workloads` starts in a namespace.

``python -m pathweave.emulate._worker worker SPEC RANK`` runs :func:`_worker`:
gloo over the identity interface, every policy's all-to-all per workload,
every received byte checked, the call times written to ``rank{RANK}.json``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pathweave.emulate._predict import ADAPT_SUFFIX
from pathweave.traffic.pattern import pattern_bytes

__all__ = ["expected_bytes"]


def expected_bytes(dst: int, column: Sequence[int]) -> np.ndarray:
    """What rank ``dst`` must hold after the all-to-all: each source's pattern in rank order."""
    parts = [pattern_bytes(s, dst, int(nb)) for s, nb in enumerate(column)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)



def _worker(spec_path: str, rank: int) -> None:
    """One rank: init gloo over the identity interface, run every policy, write times."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from pathweave.fabric.io import load
    from pathweave.runtime.orchestrator import Orchestrator

    torch.set_num_threads(1)
    spec = json.loads(Path(spec_path).read_text())
    fab = load(spec["fabric_file"])
    n = fab.num_ranks
    dist.init_process_group(
        "gloo", rank=rank, world_size=n, timeout=timedelta(seconds=spec["timeout_s"]),
    )
    clock = time.monotonic
    res: list[dict[str, Any]] = []
    for dm in spec["demands"]:
        d = np.asarray(dm, dtype=np.int64)
        row, col = d[rank], d[:, rank]
        inp = torch.from_numpy(np.concatenate(
            [pattern_bytes(rank, j, int(b)) for j, b in enumerate(row)]
        ))
        expected = torch.from_numpy(expected_bytes(rank, col.tolist()))
        out = torch.zeros_like(expected)
        in_splits, out_splits = [int(x) for x in row], [int(x) for x in col]
        case: dict[str, Any] = {}
        for pol in spec["policies"]:
            orch = None
            if pol != "torch":
                # A fresh orchestrator per workload, so each plans its own
                # demand (no hysteresis carried over); the warm-up call plans
                # and every timed call hits the plan cache, as in a training loop.
                orch = Orchestrator(
                    fab, policy=pol.removesuffix(ADAPT_SUFFIX), enabled=True,
                    adapt=pol.endswith(ADAPT_SUFFIX), chunk_bytes=spec["chunk_bytes"],
                    window=spec["window"], min_split_bytes=spec["min_split_bytes"],
                    timeout_s=spec["timeout_s"],
                )
            times, ok = [], True
            for i in range(spec["warmup"] + spec["repeat"]):
                out.zero_()
                dist.barrier()
                t0 = clock()
                if orch is None:
                    dist.all_to_all_single(out, inp, out_splits, in_splits)
                else:
                    orch.all_to_all_single(out, inp, out_splits, in_splits)
                t1 = clock()
                ok = ok and bool(torch.equal(out, expected))
                if i >= spec["warmup"]:
                    times.append((t0, t1))
            kinds = {}
            if orch is not None:
                calls = spec["warmup"] + spec["repeat"]
                kinds = {k: v // calls for k, v in orch.stats.bytes_per_path_kind.items()}
            switches = 0 if orch is None else orch.stats.plan_switches
            learned = {}
            ad = None if orch is None else getattr(orch._groups.get(None), "adapt", None)
            if ad is not None:  # the estimates below nominal, for the report
                q = ad.est.ratio_q()
                learned = {fab.link_name(i): int(q[i]) / ad.est.levels
                           for i in np.flatnonzero(q < ad.est.levels)}
            case[pol] = {"times": times, "ok": ok, "kinds": kinds, "switches": switches,
                         "learned": learned}
        res.append(case)
    dist.barrier()
    dist.destroy_process_group()
    Path(spec["out_dir"], f"rank{rank}.json").write_text(json.dumps(res))
