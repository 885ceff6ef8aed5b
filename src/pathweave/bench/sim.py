"""Simulator benchmark: wall time of :func:`pathweave.sim.simulate` from 64 to 1024 GPUs.

What is measured
----------------
A uniform all-to-all (``bytes_per_rank`` = 256 MiB, spread evenly over the
other ranks) on ``dgx-h100`` fabrics of 8, 16, 32, 64 and 128 nodes (64 to
1024 GPUs), planned once by ``mwu``. A record holds the median and minimum
wall time of ``simulate`` over a few calls (after one untimed call that
loads the numba kernels) and the median CPU time (the kernels run on one
thread, so on a shared machine CPU time is the fairer figure), the number
of flows and rate computations (events), the makespan beside the plan's
congestion bound, and, up to :data:`EXACT_MAX_RANKS` ranks, the makespan
and time of the same simulation without batching of near-simultaneous ends
(``batch_rtol=0``), so the batching's error and speed-up are measured side
by side.

Target (:func:`summarize`): 1024 GPUs in at most 30 s on 2 cores.

Examples
--------
>>> from pathweave.bench import sim as bench_sim
>>> bench_sim.repeats_for(64), bench_sim.repeats_for(1024)
(5, 1)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pathweave import fabric as pwfabric
from pathweave import plan as pwplan
from pathweave import sim, traffic
from pathweave.bench._report import Check

BYTES_PER_RANK = 256 << 20
RANKS = (64, 128, 256, 512, 1024)
QUICK_RANKS = (64, 128, 256)
GPUS_PER_NODE = 8
#: Also simulate without batching (exact event order) up to this many ranks.
EXACT_MAX_RANKS = 128
TARGET_1024_S = 30.0
#: Timing repeats by rank count: ``(most ranks, repeats)``; larger fabrics get 1.
REPEATS: tuple[tuple[int, int], ...] = ((64, 5), (256, 3))


def repeats_for(ranks: int) -> int:
    """Timing repeats at ``ranks`` GPUs."""
    for most, n in REPEATS:
        if ranks <= most:
            return n
    return 1


def warm_up() -> None:
    """Compile (or load) every policy's and the simulator's numba kernels, untimed.

    Every kernel the simulator runs is called once on a small fabric, so no
    timed ``sim_s`` includes numba's compile time (this benchmark, ``pathweave
    simulate``, ``bench groups``).
    """
    from pathweave.bench.planner import warm_up as warm_up_planners

    warm_up_planners()
    fab = pwfabric.preset("h100-2x4")
    for workload in ("hotspot:0.9", "stencil:dims=1"):
        demand = traffic.parse_workload(workload, fab.num_ranks, bytes_per_rank=1 << 20)
        for name in pwplan.policies():
            if name != "optimal":
                sim.simulate(fab, pwplan.make(fab, demand, policy=name))


def run(
    ranks: Sequence[int] = RANKS,
    *,
    policy: str = "mwu",
    bytes_per_rank: int = BYTES_PER_RANK,
    repeat: int | None = None,
    model: sim.SimModel | None = None,
    on_progress: Callable[[int, int, str], None] | None = None,
) -> list[dict[str, Any]]:
    """One record per fabric size (JSON-ready: plain ints, floats and strings)."""
    for r in ranks:
        if r % GPUS_PER_NODE or r <= 0:
            raise ValueError(f"ranks = {r}; it must be a positive multiple of {GPUS_PER_NODE}")
    model = model or sim.SimModel()
    progress = on_progress or (lambda done, total, text: None)
    warm_up()
    records: list[dict[str, Any]] = []
    for i, n in enumerate(ranks):
        nodes = n // GPUS_PER_NODE
        progress(i, len(ranks), f"{n} GPUs: planning")
        fab = pwfabric.preset(f"dgx-h100:nodes={nodes}")
        demand = traffic.uniform(n, bytes_per_rank=bytes_per_rank)
        plan = pwplan.make(fab, demand, policy=policy)
        times: list[float] = []
        cpu: list[float] = []
        res = None
        reps = repeat or repeats_for(n)
        for k in range(reps):
            progress(i, len(ranks), f"{n} GPUs: simulating ({k + 1}/{reps})")
            t0, c0 = time.perf_counter(), time.process_time()
            res = sim.simulate(fab, plan, model)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        assert res is not None
        rec: dict[str, Any] = {
            "fabric": fab.name,
            "ranks": n,
            "policy": policy,
            "workload": "uniform",
            "bytes_per_rank": bytes_per_rank,
            "flows": int(np.count_nonzero(plan.flow_bytes)),
            "links": fab.num_links,
            "plan_s": plan.plan_s,
            "repeats": reps,
            "sim_s_median": statistics.median(times),
            "sim_s_min": min(times),
            "sim_cpu_s_median": statistics.median(cpu),
            "events": res.events,
            "makespan_s": res.makespan_s,
            "congestion_s": plan.congestion_s,
            "makespan_over_congestion": res.makespan_s / plan.congestion_s,
            "batch_rtol": model.batch_rtol,
            "exact_sim_s": None,
            "exact_events": None,
            "exact_makespan_s": None,
        }
        if n <= EXACT_MAX_RANKS and model.batch_rtol > 0:
            progress(i, len(ranks), f"{n} GPUs: simulating without batching")
            t0 = time.perf_counter()
            exact = sim.simulate(fab, plan, _replace(model, batch_rtol=0.0))
            rec["exact_sim_s"] = time.perf_counter() - t0
            rec["exact_events"] = exact.events
            rec["exact_makespan_s"] = exact.makespan_s
        records.append(rec)
    progress(len(ranks), len(ranks), "done")
    return records


def _replace(model: sim.SimModel, **kw: Any) -> sim.SimModel:
    return sim.SimModel(**{**model.to_dict(), **kw})


def summarize(records: Sequence[dict[str, Any]]) -> list[Check]:
    """Targets and side-by-side ratios, as lines with a pass mark (None: informative)."""
    checks: list[Check] = []
    for r in records:
        if r["exact_makespan_s"] is not None:
            err = r["makespan_s"] / r["exact_makespan_s"] - 1
            speed = r["exact_sim_s"] / r["sim_s_median"]
            checks.append(
                Check(
                    name=f"batching-{r['ranks']}",
                    value=err,
                    target=None,
                    passed=None,
                    text=f"{r['ranks']} GPUs: batching (rtol {r['batch_rtol']:g}) changes the "
                    f"makespan by {err:+.2e}; unbatched / batched time {speed:.1f}x "
                    f"({r['events']} vs {r['exact_events']} events)",
                )
            )
    big = [r for r in records if r["ranks"] == 1024]
    for r in big:
        ok = r["sim_s_median"] <= TARGET_1024_S
        checks.append(
            Check(
                name="sim-1024-s",
                value=r["sim_s_median"],
                target=TARGET_1024_S,
                passed=ok,
                text=f"1024 GPUs uniform all-to-all ({r['policy']}) simulated in "
                f"{r['sim_s_median']:.1f} s wall, {r['sim_cpu_s_median']:.1f} s CPU "
                f"(target <= {TARGET_1024_S:.0f} s)",
            )
        )
    return checks


__all__ = ["RANKS", "Check", "repeats_for", "run", "summarize"]
