"""The body of one rank that :func:`pathweave.emulate.run.run_workloads` starts in a namespace.

``pathweave.emulate._worker._main(["worker", SPEC, RANK])`` runs :func:`_worker`:
gloo over the identity interface, every policy's all-to-all per workload
(warm-up calls first, then the timed calls in :func:`round_robin` order),
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

__all__ = ["expected_bytes", "round_robin"]


def expected_bytes(dst: int, column: Sequence[int]) -> np.ndarray:
    """What rank ``dst`` must hold after the all-to-all: each source's pattern in rank order."""
    parts = [pattern_bytes(s, dst, int(nb)) for s, nb in enumerate(column)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)



def round_robin(policies: Sequence[str], repeat: int) -> list[str]:
    """The order of the timed calls: ``repeat`` rounds, each calling every policy once.

    The rounds follow a Williams design: over ``n`` rounds (``2 n`` for an
    odd number ``n`` of policies) every policy holds every position equally
    often *and* follows every other policy equally often within a round. So
    a slow spell of the shared machine hits all policies alike, no policy
    always runs first, and none always runs right after the same neighbour
    (a plain rotation puts ``b`` right after ``a`` in all but one round of
    ``n``, so what ``a``'s calls leave behind weighs on ``b``'s).

    Examples
    --------
    >>> round_robin(["a", "b", "c", "d"], 4)  # doctest: +NORMALIZE_WHITESPACE
    ['a', 'b', 'd', 'c',  'b', 'c', 'a', 'd',  'c', 'd', 'b', 'a',  'd', 'a', 'c', 'b']
    >>> round_robin(["a", "b"], 3)
    ['a', 'b', 'b', 'a', 'a', 'b']
    """
    pols = list(policies)
    n = len(pols)
    first = [0]  # 0, 1, n-1, 2, n-2, ...: consecutive differences take every value once
    for k in range(1, n):
        first.append((k + 1) // 2 if k % 2 else n - k // 2)
    rows = [[(j + i) % n for j in first] for i in range(n)]
    if n % 2:  # odd n: the mirrored square balances what one square cannot
        rows += [row[::-1] for row in rows]
    return [pols[j] for i in range(repeat) for j in rows[i % len(rows)]]


def _orchestrator(fab: Any, pol: str, spec: dict[str, Any]) -> Any:
    """A fresh Orchestrator for ``pol`` (None for ``torch``: torch's own collective).

    Fresh per workload, so each plans its own demand (no hysteresis carried
    over); the warm-up call plans and every timed call hits the plan cache,
    as in a training loop.
    """
    from pathweave.runtime import Config, Orchestrator

    if pol == "torch":
        return None
    # The run's config, whole (emulate._predict.rank_config: the emulator's time
    # model included, so what the ranks decide with is what predict simulates);
    # this run's policy, adaptation and the rank's fabric on top.
    cfg = Config.from_dict(spec["config"]).replace(
        fabric=fab, policy=pol.removesuffix(ADAPT_SUFFIX), adapt=pol.endswith(ADAPT_SUFFIX))
    return Orchestrator(config=cfg)


def _stats(fab: Any, orch: Any, calls: int) -> dict[str, Any]:
    """Bytes per path kind per call, plan switches and learned capacities of one policy."""
    if orch is None:
        return {"kinds": {}, "switches": 0, "learned": {}}
    kinds = {k: v // calls for k, v in orch.stats.bytes_per_path_kind.items()}
    # The estimates below nominal, for the report.
    learned = {fab.link_name(i): r for i, r in orch.learned_capacities().items()}
    return {"kinds": kinds, "switches": orch.stats.plan_switches, "learned": learned}


def _timed_call(orch: Any, inp: Any, out: Any, splits: tuple[list[int], list[int]],
                settle_s: float) -> tuple[float, float]:
    """One all-to-all from an idle fabric: its (start, end) on the monotonic clock.

    The first barrier means every byte of the call before has arrived; the
    pause of ``settle_s`` refills every link's token bucket, so no call
    starts with less burst because the one before drained its links; the
    second barrier starts all ranks together.
    """
    import torch.distributed as dist

    in_splits, out_splits = splits
    out.zero_()
    dist.barrier()
    if settle_s > 0:
        time.sleep(settle_s)
        dist.barrier()
    t0 = time.monotonic()
    if orch is None:
        dist.all_to_all_single(out, inp, out_splits, in_splits)
    else:
        orch.all_to_all_single(out, inp, out_splits, in_splits)
    return t0, time.monotonic()


def _run_case(fab: Any, d: np.ndarray, rank: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Every policy's calls on one demand: warm-ups first, then round-robin repetitions."""
    import torch

    row, col = d[rank], d[:, rank]
    inp = torch.from_numpy(np.concatenate(
        [pattern_bytes(rank, j, int(b)) for j, b in enumerate(row)]
    ))
    expected = torch.from_numpy(expected_bytes(rank, col.tolist()))
    out = torch.zeros_like(expected)
    splits = ([int(x) for x in row], [int(x) for x in col])
    orchs = {pol: _orchestrator(fab, pol, spec) for pol in spec["policies"]}
    times: dict[str, list[tuple[float, float]]] = {pol: [] for pol in orchs}
    ok = dict.fromkeys(orchs, True)

    def call(pol: str) -> tuple[float, float]:
        span = _timed_call(orchs[pol], inp, out, splits, spec.get("settle_s", 0.0))
        ok[pol] = ok[pol] and bool(torch.equal(out, expected))
        return span

    for pol in orchs:
        for _ in range(spec["warmup"]):
            call(pol)
    for pol in round_robin(list(orchs), spec["repeat"]):
        times[pol].append(call(pol))
    calls = spec["warmup"] + spec["repeat"]
    return {pol: {"times": times[pol], "ok": ok[pol], **_stats(fab, orch, calls)}
            for pol, orch in orchs.items()}


def _worker(spec_path: str, rank: int) -> None:
    """One rank: init gloo over the identity interface, run every policy, write times."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from pathweave.fabric.io import load

    torch.set_num_threads(1)
    spec = json.loads(Path(spec_path).read_text())
    fab = load(spec["fabric_file"])
    dist.init_process_group(
        "gloo", rank=rank, world_size=fab.num_ranks,
        timeout=timedelta(seconds=spec["timeout_s"]),
    )
    res = [_run_case(fab, np.asarray(dm, dtype=np.int64), rank, spec)
           for dm in spec["demands"]]
    dist.barrier()
    dist.destroy_process_group()
    Path(spec["out_dir"], f"rank{rank}.json").write_text(json.dumps(res))
