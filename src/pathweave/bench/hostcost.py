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

Two ways of posting are timed (``issue``): ``"rounds"``, NCCL's (every round
posted at once, one ``batch_isend_irecv`` group on NCCL; no threads; a
round's operations with one peer in one direction coalesced into one
message, ``Transport.coalesce``), and
``"streams"``, gloo's (each forwarded stream advances on a thread of its
own, :meth:`~pathweave.runtime.executor.Transport.run`). The targets are
held against ``"rounds"``: host cost decides on NVLink and InfiniBand, where
the data plane runs on NCCL; on gloo the transport's own latency is
milliseconds. Each record also counts the call's point-to-point operations
(``ops``, as posted; ``schedule_ops`` before coalescing) and times the fake
group's own cost of one (``floor_s``: operations times that cost), the part
of the host work no executor can cut without posting fewer operations.

:func:`async_overlap` times, on local gloo ranks (real transfers), how
soon an ``async_op=True`` multi-path call returns against its ``wait()``.

Host work is the process's CPU time per call (median; ``pathweave_s``,
``torch_s``); the wall times are kept beside it (``*_wall_s``). The targets
are held against it, and, in lines of their own, against the same calls with
a no-op transport (``pathweave_noop_s``: the fake group's ``send``/``recv``,
about 10 us each in torch's Python meta registrations, replaced by a stub
that posts nothing): pathweave's own host work, the transport's cost per
operation taken out.

Targets: median host work <= 100 us at 8 ranks, <= 1 ms at 256
(<= 4 ms at 1024), and never above torch's own call on the same group from
64 ranks up; an async multi-path call returns in <= 5 % of its wait time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from pathweave.bench._report import Check, Progress

__all__ = ["FABRICS", "TARGETS_S", "async_overlap", "checks", "measure", "run"]

#: Ranks -> the fabric the group is planned on (8 GPUs per node from 64 up).
FABRICS = {8: "h100-2x4", 64: "dgx-h100:nodes=8", 256: "dgx-h100:nodes=32",
           1024: "dgx-h100:nodes=128"}
#: Ranks -> the target median host work per call (seconds).
TARGETS_S = {8: 100e-6, 256: 1e-3, 1024: 4e-3}
PAIR_BYTES = 1 << 20
HOT_BYTES = 16 << 20
#: From this many ranks pathweave's call must cost no more than torch's.
TORCH_PARITY_RANKS = 64
#: How soon an async call must return, as a fraction of its wait.
ASYNC_RETURN_FRACTION = 0.05
ISSUES = ("rounds", "streams")
#: The metadata row each rank sends at this many ranks must fit METADATA_BYTES.
METADATA_RANKS, METADATA_BYTES = 1024, 16 << 10
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


def metadata_bytes(num_ranks: int) -> int:
    """Bytes of the metadata row one rank sends per call (``all_to_all_single``, plane words).

    >>> metadata_bytes(1024) <= METADATA_BYTES
    True
    """
    from pathweave.runtime.orchestrator import PLANE_WORDS
    from pathweave.runtime.protocol import meta_width

    return (meta_width(num_ranks) + PLANE_WORDS) * 8


def _timed(fn: Any, repeats: int) -> tuple[float, float]:
    """Median wall and process CPU seconds of ``fn()``.

    The CPU time (every thread of the process) is the host work itself; the
    wall time also holds waiting for a core, which on a shared host swings
    several-fold from run to run.
    """
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


class _NoOpWork:
    """A finished work: what :class:`_NoOpGroup` returns."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _NoOpGroup:
    """A stand-in for a process group's ``send``/``recv`` that posts nothing."""

    _done = _NoOpWork()

    def send(self, tensors: Any, dst: int, tag: int = 0) -> _NoOpWork:
        return self._done

    def recv(self, tensors: Any, src: int, tag: int = 0) -> _NoOpWork:
        return self._done


def measure(num_ranks: int, repeats: int = 20, device: str = "meta",
            issue: str = "rounds") -> dict[str, Any]:
    """Median host work of one call on rank 1 of a fake group of ``num_ranks``.

    ``issue``: ``"rounds"`` (NCCL's way of posting) or ``"streams"`` (gloo's).
    """
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import pathweave as pw
    import pathweave.distributed as pwd
    if issue not in ISSUES:
        raise ValueError(f"issue must be one of {ISSUES}, got {issue!r}")
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
        orch._state(None).transport.grouped_rounds = issue == "rounds"
        t0 = time.perf_counter()

        def ours() -> None:
            pwd.all_to_all_single(out, inp, recv, send, orchestrator=orch, split_matrix=rows,
                                  config_digests=digests)

        ours()  # plans and schedules: not timed
        first_s = time.perf_counter() - t0
        pw_wall, pw_s = _timed(ours, repeats)
        torch_wall, torch_s = _timed(lambda: dist.all_to_all_single(out, inp, recv, send),
                                     repeats)
        # The same calls with the group's send/recv replaced by a no-op: the
        # host work without the (fake) transport's own cost per operation.
        tr = orch._state(None).transport
        tr.process_group = _NoOpGroup()
        try:
            noop_wall, noop_s = _timed(ours, repeats)
        finally:
            tr.process_group = None
        last = orch.stats.last_call
        sched = next(iter(orch._state(None).schedules.values()))[0]
        ops = tr.messages(sched)
        view = inp.view(torch.uint8)[:64]
        pg = dist.group.WORLD
        op_s = _timed(lambda: [pg.send([view], 2, 0) for _ in range(100)], repeats)[1] / 100
        return {"ranks": num_ranks, "fabric": fabric, "issue": issue, "pathweave_s": pw_s,
                "torch_s": torch_s, "pathweave_wall_s": pw_wall, "torch_wall_s": torch_wall,
                "pathweave_noop_s": noop_s, "pathweave_noop_wall_s": noop_wall,
                "first_call_s": first_s,
                "multipath": bool(last and last.multipath), "ops": ops,
                "schedule_ops": sched.num_sends + sched.num_recvs,
                "rounds": sched.num_rounds, "floor_s": ops * op_s,
                "send_bytes": sum(send) * ELEMENT_BYTES, "repeats": repeats, "device": device}
    finally:
        dist.destroy_process_group()


def checks(records: Sequence[dict[str, Any]],
           overlap: dict[str, Any] | None = None) -> list[Check]:
    """The PASS/MISS lines of the targets for the ranks measured (on ``"rounds"`` records).

    ``"streams"`` records and each size's floor are informative lines.
    """
    out = []
    for r in records:
        n, pw_s, t_s = r["ranks"], r["pathweave_s"], r["torch_s"]
        if r["issue"] != "rounds":
            out.append(Check(f"streams_{n}", pw_s, None, None,
                             f"host work at {n} ranks, gloo's per-stream posting: "
                             f"{pw_s * 1e6:,.0f} us (informative)"))
            continue
        out.append(Check(f"floor_{n}", r["floor_s"], None, None,
                         f"{n} ranks: {r['ops']} point-to-point ops per call, the fake group's "
                         f"own cost of them {r['floor_s'] * 1e6:,.0f} us (informative)"))
        target = TARGETS_S.get(n)
        if target is not None:
            out.append(Check(f"host_{n}", pw_s, target, pw_s <= target,
                             f"host work at {n} ranks: {pw_s * 1e6:,.0f} us (target <= "
                             f"{target * 1e6:,.0f} us)"))
        noop_s = r["pathweave_noop_s"]
        if target is not None:
            out.append(Check(f"host_noop_{n}", noop_s, target, noop_s <= target,
                             f"host work at {n} ranks with a no-op transport (the fake group's "
                             f"send/recv replaced by a stub that posts nothing): "
                             f"{noop_s * 1e6:,.0f} us (target <= {target * 1e6:,.0f} us)"))
        if n >= TORCH_PARITY_RANKS:
            out.append(Check(f"vs_torch_{n}", pw_s / t_s, 1.0, pw_s <= t_s,
                             f"host work at {n} ranks vs torch's own call: {pw_s / t_s:.2f}x "
                             f"({pw_s * 1e6:,.0f} vs {t_s * 1e6:,.0f} us; target <= 1x)"))
    m = metadata_bytes(METADATA_RANKS)
    out.append(Check("metadata", m, METADATA_BYTES, m <= METADATA_BYTES,
                     f"metadata row per rank at {METADATA_RANKS} ranks: {m / 1024:.1f} KiB "
                     f"(target <= {METADATA_BYTES >> 10} KiB; each rank then receives "
                     f"{m * METADATA_RANKS / 2**20:.1f} MiB of rows)"))
    if overlap is not None:
        f = overlap["return_fraction"]
        out.append(Check("async_return", f, ASYNC_RETURN_FRACTION, f <= ASYNC_RETURN_FRACTION,
                         f"async multi-path call on {overlap['ranks']} gloo ranks returns in "
                         f"{f:.1%} of its wait ({overlap['return_s'] * 1e3:.2f} of "
                         f"{overlap['wait_s'] * 1e3:.1f} ms; target <= "
                         f"{ASYNC_RETURN_FRACTION:.0%})"))
    return out


def _overlap_job(rank: int, world_size: int, repeats: int) -> list[tuple[float, float]]:
    """One rank's (return, wait) seconds of ``repeats`` async calls (:func:`async_overlap`)."""
    import functools

    import torch

    import pathweave as pw
    import pathweave.distributed as pwd

    orch = pw.Orchestrator(fabric=OVERLAP_FABRIC, enabled=True, min_split_bytes=0,
                           policy=functools.partial(pw.plan.pinned, roles=("relay",)))
    rows = split_matrix(world_size) // 4  # 256 KiB per pair, 4 MiB into rank 0
    send, recv = rows[rank].tolist(), rows[:, rank].tolist()
    inp, out = torch.ones(sum(send)), torch.empty(sum(recv))
    digests = np.full(world_size, orch.config_digest(), dtype=np.int64)
    took = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        work = pwd.all_to_all_single(out, inp, recv, send, async_op=True, orchestrator=orch,
                                     split_matrix=rows, config_digests=digests)
        t1 = time.perf_counter()
        work.wait()
        if i:  # the first call plans
            took.append((t1 - t0, time.perf_counter() - t1))
    return took


#: The fabric of the async timing: one node of 4 GPUs, NVLink mesh, relayed.
OVERLAP_FABRIC = "cluster:nodes=1,gpus_per_node=4,node_kind=nvlink-mesh"


def async_overlap(world_size: int = 4, repeats: int = 10) -> dict[str, Any]:
    """Median time an async multi-path call takes to return, and its ``wait()``, on gloo.

    Local gloo ranks (real transfers), the hot-column demand at a quarter of
    :func:`split_matrix`'s bytes, every byte relayed through a third GPU
    (a plan that forwards), ``split_matrix=`` given (no metadata exchange).
    """
    from pathweave.runtime.launch import run_local

    res = run_local(_overlap_job, world_size, (repeats,), timeout_s=300)
    ret = statistics.median(r for rank in res for r, _ in rank)
    wait = statistics.median(w for rank in res for _, w in rank)
    return {"ranks": world_size, "return_s": ret, "wait_s": wait,
            "return_fraction": ret / wait if wait > 0 else float("inf"), "repeats": repeats}


def run(ranks: Sequence[int] = (8, 64, 256), repeats: int = 20, device: str = "meta",
        progress: Progress | None = None, issues: Sequence[str] = ISSUES,
        overlap: bool = True) -> tuple[list[dict[str, Any]], list[Check]]:
    """Measure every rank count and way of posting in turn (and the async overlap).

    Returns the records (the overlap's last, with ``"async": True``) and their target lines.
    """
    records = []
    steps = [(int(n), issue) for n in ranks for issue in issues]
    for i, (n, issue) in enumerate(steps):
        if progress is not None:
            progress(i, len(steps) + int(overlap), f"{n} ranks, {issue}")
        records.append(measure(n, repeats, device, issue))
    lap = None
    if overlap:
        if progress is not None:
            progress(len(steps), len(steps) + 1, "async overlap on 4 gloo ranks")
        lap = async_overlap()
    return records + ([{"async": True, **lap}] if lap else []), checks(records, lap)
