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



def _orchestrator(fab: Any, pol: str, spec: dict[str, Any]) -> Any:
    """A fresh orchestrator for ``pol`` (None for torch's own collective).

    Fresh per workload, so each plans its own demand (no hysteresis carried
    over); the warm-up call plans and every timed call hits the plan cache,
    as in a training loop.
    """
    from pathweave.runtime.orchestrator import Orchestrator

    if pol == "torch":
        return None
    return Orchestrator(
        fab, policy=pol.removesuffix(ADAPT_SUFFIX), enabled=True,
        adapt=pol.endswith(ADAPT_SUFFIX), chunk_bytes=spec["chunk_bytes"],
        window=spec["window"], min_split_bytes=spec["min_split_bytes"],
        timeout_s=spec["timeout_s"],
    )


def _report(fab: Any, orch: Any, calls: int) -> dict[str, Any]:
    """Bytes per path kind per call, plan switches and learned link estimates of ``orch``."""
    if orch is None:
        return {"kinds": {}, "switches": 0, "learned": {}}
    kinds = {k: v // calls for k, v in orch.stats.bytes_per_path_kind.items()}
    learned = {}
    ad = getattr(orch._groups.get(None), "adapt", None)
    if ad is not None:  # the estimates below nominal, for the report
        q = ad.est.ratio_q()
        learned = {fab.link_name(i): int(q[i]) / ad.est.levels
                   for i in np.flatnonzero(q < ad.est.levels)}
    return {"kinds": kinds, "switches": orch.stats.plan_switches, "learned": learned}


def _worker(spec_path: str, rank: int) -> None:
    """One rank: init gloo over the identity interface, run every policy, write times."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from pathweave.fabric.io import load

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
        orchs = {pol: _orchestrator(fab, pol, spec) for pol in spec["policies"]}
        times: dict[str, list] = {pol: [] for pol in orchs}
        ok = dict.fromkeys(orchs, True)
        calls = spec["warmup"] + spec["repeat"]
        # Interleaved: call i of every policy, then call i + 1 (a load that
        # drifts over the run then weighs on every policy alike); otherwise
        # every call of one policy, then the next policy's.
        order = ([(i, p) for i in range(calls) for p in orchs] if spec.get("interleave")
                 else [(i, p) for p in orchs for i in range(calls)])
        for i, pol in order:
            orch = orchs[pol]
            out.zero_()
            dist.barrier()
            t0 = clock()
            if orch is None:
                dist.all_to_all_single(out, inp, out_splits, in_splits)
            else:
                orch.all_to_all_single(out, inp, out_splits, in_splits)
            t1 = clock()
            ok[pol] = ok[pol] and bool(torch.equal(out, expected))
            if i >= spec["warmup"]:
                times[pol].append((t0, t1))
        for pol, orch in orchs.items():
            case[pol] = {"times": times[pol], "ok": ok[pol], **_report(fab, orch, calls)}
        res.append(case)
    dist.barrier()
    dist.destroy_process_group()
    Path(spec["out_dir"], f"rank{rank}.json").write_text(json.dumps(res))
