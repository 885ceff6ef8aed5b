"""Data-plane benchmark: pathweave's ``all_to_all_single`` against torch's, side by side.

What is measured
----------------
Eight local processes (:func:`pathweave.runtime.launch.run_local`, gloo over
loopback) run each case's all-to-all twice per repeat: once with
``torch.distributed.all_to_all_single`` and once with
:func:`pathweave.distributed.all_to_all_single`, on the same input tensors,
interleaved (torch, pathweave, torch, pathweave, ...) so both see the same
machine state. A call's time is the slowest rank's wall time from a common
barrier to the call's return; a case reports the median over its repeats and
the ratio pathweave / torch of the medians.

Every output of every call, torch's and pathweave's, is compared bitwise with
torch's first output of the case (the reference); the output buffer is filled
with a poison byte before each call, so a call that writes nothing, or only
part of the output, is caught too. A mismatch marks the record
``verified = False`` and names the rank, the byte and the sending rank.

Cases
    * ``balanced``: equal splits, 1, 4, 16 and 64 MiB per rank pair (the
      rank's own chunk included; ``quick`` stops at 4 MiB), with the default
      orchestrator (``enabled="auto"``, fabric from the launch environment:
      one 8-GPU ``dgx-h100`` node under :func:`run_local`).
    * ``hotspot:0.8`` (:func:`pathweave.traffic.hotspot`): the same input size
      per rank, 80 % of it to rank 0; once with the default orchestrator and
      once with multi-path forced (``enabled=True``) on the ``h100-2x4``
      fabric, so forwarding really happens. Loopback has no link structure,
      so forwarding through relay ranks can only cost here; the forced rows
      show how much.
    * ``balanced``, ``backend``: the same balanced sizes through the
      ``pathweave`` torch.distributed backend: plain
      ``torch.distributed.all_to_all_single`` on a group made with
      ``new_group(backend="pathweave")`` (configured by the environment,
      default ``PATHWEAVE_MULTIPATH=auto``), against the same call on gloo;
      the cost of reaching the orchestrator through torch's process-group
      API instead of calling it.
    * ``overhead``: 4 KiB per pair (the transfer is a small part of the
      call), 100 repeats: balanced with the default orchestrator (an
      exchange this small goes to torch without planning), and hotspot 0.8
      forced multi-path, once with a repeated pattern (served from the plan
      cache) and once with a pattern that changes on every call (one pair, a
      different one each time, carries a multiple of its share), so every
      call plans and builds a schedule. Reported: the orchestrator's own
      account (``meta_s``, ``plan_s`` from ``stats.last_call``), the time a
      call spends beyond its transfer (wall time minus ``transfer_s``), the
      paired difference to torch's call, and two bare collectives timed the
      same way: the collective the metadata exchange itself uses (on gloo a
      gather and a broadcast) of a zero row as wide as the metadata row, the
      least an exchange can cost on this machine; and a gloo all-to-all of
      512 bytes per pair, the smallest call of torch's own collective.

A call's time is the slowest rank's; the orchestrator's account (metadata,
planning, transfer, beyond-transfer) is the median over every rank's calls.
Calls alternate ABBA (torch first on even repeats, pathweave first on odd
ones), so neither side always runs second.

Data are float32 tensors holding :func:`~pathweave.traffic.pattern.pattern_bytes`
(the emulator's pattern), compared byte for byte, so no NaN comparison can
hide a difference.

Targets (:func:`summarize`): no loss on loopback, pathweave / torch <= 1.10 on
balanced traffic at 16 MiB per pair, called directly and through the backend;
a cached repeated call spends at most 200 us beyond its transfer (wall time
of the call minus the orchestrator's ``transfer_s``, median over ranks and
calls); every output verified.

Examples
--------
>>> from pathweave.bench import dataplane
>>> for c in dataplane.cases(quick=True)[:4]:
...     print(c.label)
transfer balanced 1 MiB/pair, auto
transfer balanced 4 MiB/pair, auto
transfer hotspot:0.8 1 MiB/pair, auto
transfer hotspot:0.8 1 MiB/pair, multipath
>>> dataplane.repeats_for(1 << 20), dataplane.repeats_for(64 << 20)
(21, 7)
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pathweave import fabric as pwfabric
from pathweave import traffic
from pathweave.bench._report import Check, Progress
from pathweave.errors import FabricError, InputError, PathweaveError
from pathweave.traffic.pattern import pattern_bytes

WORLD_SIZE = 8
BACKEND = "gloo"
#: Bytes per rank pair of the transfer cases (a rank's own chunk included).
SIZES_PER_PAIR: tuple[int, ...] = (1 << 20, 4 << 20, 16 << 20, 64 << 20)
QUICK_MAX_BYTES_PER_PAIR = 4 << 20
HOTSPOT_RATIO = 0.8
HOTSPOT = f"hotspot:{HOTSPOT_RATIO}"
#: The fabric of the forced multi-path rows (8 ranks).
MULTIPATH_FABRIC = "h100-2x4"
OVERHEAD_BYTES_PER_PAIR = 4 << 10
OVERHEAD_REPEATS = 100
#: Timing repeats by size: ``(largest bytes per pair, repeats)``; larger cases get
#: :data:`REPEATS_LARGEST`.
REPEATS: tuple[tuple[int, int], ...] = ((16 << 20, 21),)
REPEATS_LARGEST = 7
RATIO_TARGET = 1.10
RATIO_TARGET_BYTES_PER_PAIR = 16 << 20
OVERHEAD_TARGET_S = 200e-6
#: Size in bytes of the benchmark's elements (float32).
ELEMENT_BYTES = 4
#: Byte written over every output before a call, so unwritten bytes show.
POISON_BYTE = 0xA5
#: At most this many mismatch descriptions are kept per rank and case.
MAX_MISMATCHES = 3

#: Keys of every record :func:`run` returns.
RECORD_KEYS = (
    "case", "workload", "variant", "bytes_per_pair", "cached", "fabric", "ranks", "backend",
    "bytes_per_rank", "bytes_total", "repeat", "torch_s", "pathweave_s", "torch_s_median",
    "pathweave_s_median", "ratio", "diff_s", "meta_s_median", "plan_s_median",
    "transfer_s_median", "overhead_s_median", "beyond_transfer_s_median", "floor_s_median",
    "a2a_s_median",
    "cache_hits", "multipath", "bytes_per_kind", "verified", "outputs_checked", "outputs_wrong",
    "mismatches",
)


@dataclass(frozen=True)
class Case:
    """One row of the benchmark.

    ``case`` is ``"transfer"`` or ``"overhead"``; ``variant`` is ``"auto"``
    (the default orchestrator), ``"multipath"`` (``enabled=True`` on
    :data:`MULTIPATH_FABRIC`) or ``"backend"`` (plain torch calls on a
    ``pathweave`` backend group, its orchestrator from the environment);
    ``cached=False`` changes the pattern on every call (:func:`_vary`), so no
    call is served from the plan cache.
    """

    case: str
    workload: str
    bytes_per_pair: int
    variant: str
    repeat: int
    cached: bool = True

    @property
    def label(self) -> str:
        mib = self.bytes_per_pair / (1 << 20)
        size = f"{mib:g} MiB" if mib >= 1 else f"{self.bytes_per_pair >> 10} KiB"
        extra = "" if self.cached else ", new pattern every call"
        return f"{self.case} {self.workload} {size}/pair, {self.variant}{extra}"


def repeats_for(bytes_per_pair: int) -> int:
    """Timing repeats of a transfer case of ``bytes_per_pair`` (see :data:`REPEATS`)."""
    for most, reps in REPEATS:
        if bytes_per_pair <= most:
            return reps
    return REPEATS_LARGEST


def cases(
    quick: bool = False,
    repeat: int | None = None,
    sizes_per_pair: Sequence[int] | None = None,
    overhead_repeat: int | None = None,
) -> list[Case]:
    """Every case of the benchmark, in the order they run.

    ``quick`` keeps sizes up to :data:`QUICK_MAX_BYTES_PER_PAIR`; ``repeat``
    overrides the timing repeats of every case (the overhead cases included,
    unless ``overhead_repeat`` is given); ``sizes_per_pair`` replaces
    :data:`SIZES_PER_PAIR`.
    """
    sizes = tuple(SIZES_PER_PAIR if sizes_per_pair is None else sizes_per_pair)
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < ELEMENT_BYTES:
            raise ValueError(f"sizes_per_pair must be whole byte counts >= {ELEMENT_BYTES}, "
                             f"got {s!r}")
    if quick:
        sizes = tuple(s for s in sizes if s <= QUICK_MAX_BYTES_PER_PAIR)
    for name, value in (("repeat", repeat), ("overhead_repeat", overhead_repeat)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    out: list[Case] = []
    for s in sizes:
        out.append(Case("transfer", "balanced", int(s), "auto", repeat or repeats_for(s)))
    for s in sizes:
        for variant in ("auto", "multipath"):
            out.append(Case("transfer", HOTSPOT, int(s), variant, repeat or repeats_for(s)))
    for s in sizes:
        out.append(Case("transfer", "balanced", int(s), "backend", repeat or repeats_for(s)))
    ov_reps = overhead_repeat or repeat or OVERHEAD_REPEATS
    # With enabled="auto" an exchange this small goes to torch without planning,
    # so only the forced multi-path rows have a changing pattern: a plan per call.
    for workload, variant, cached in (("balanced", "auto", True), (HOTSPOT, "multipath", True),
                                      (HOTSPOT, "multipath", False)):
        out.append(Case("overhead", workload, OVERHEAD_BYTES_PER_PAIR, variant, ov_reps, cached))
    return out


def element_splits(workload: str, bytes_per_pair: int, num_ranks: int) -> np.ndarray:
    """``E[src, dst]``: elements (float32) rank ``src`` sends to ``dst`` in a case.

    Every rank's input holds ``num_ranks * bytes_per_pair`` bytes. ``balanced``
    sends an equal share to every rank, itself included; a hotspot workload
    follows :func:`pathweave.traffic.hotspot` (nothing to itself), rounded
    down to whole elements.

    Examples
    --------
    >>> element_splits("balanced", 16, 2).tolist()
    [[4, 4], [4, 4]]
    >>> element_splits("hotspot:0.5", 400, 3).tolist()
    [[0, 150, 150], [150, 0, 150], [150, 150, 0]]
    """
    n = int(num_ranks)
    if workload == "balanced":
        return np.full((n, n), bytes_per_pair // ELEMENT_BYTES, dtype=np.int64)
    demand = traffic.parse_workload(workload, n, bytes_per_rank=n * bytes_per_pair)
    return (demand // ELEMENT_BYTES).astype(np.int64)


# ------------------------------------------------------------ per-rank side
@dataclass(frozen=True)
class _Job:
    cases: tuple[Case, ...]
    multipath_fabric: pwfabric.Fabric
    #: The all-to-all under test; ``None``: :func:`pathweave.distributed.all_to_all_single`.
    all_to_all: Callable[..., Any] | None


def _pattern(torch: Any, rank: int, numel: int) -> Any:
    """A float32 tensor of :func:`~pathweave.traffic.pattern.pattern_bytes` (rank ``rank``)."""
    return torch.from_numpy(pattern_bytes(rank, 0, numel * ELEMENT_BYTES)).view(torch.float32)


def _mismatch(torch: Any, out: Any, ref: Any, recv_bytes: Sequence[int]) -> str | None:
    """``None`` if ``out`` equals ``ref`` bit for bit, else where they first differ."""
    a, b = out.view(torch.uint8), ref.view(torch.uint8)
    if torch.equal(a, b):
        return None
    byte = int((a != b).nonzero()[0, 0])
    src = int(np.searchsorted(np.cumsum(recv_bytes), byte, side="right"))
    return f"byte {byte} of {a.numel()} differs (data from rank {src})"


def _kind_totals(orch: Any) -> dict[str, int]:
    kinds = orch.stats.bytes_per_path_kind
    return {str(k): int(v) for k, v in dict(kinds).items()}


def _vary(split: np.ndarray, k: int) -> np.ndarray:
    """Repeat ``k``'s splits when the pattern must change every call.

    One off-diagonal pair, a different one each call, carries ``2 + k // P``
    times its share (``P`` pairs): every call's quantised demand differs from
    all earlier ones, so none is served from the plan cache.
    """
    n = split.shape[0]
    pairs = [(s, d) for s in range(n) for d in range(n) if s != d]
    out = split.copy()
    s, d = pairs[k % len(pairs)]
    out[s, d] *= 2 + k // len(pairs)
    return out


#: int64 words per rank pair of the bare all-to-all timed in the overhead cases
#: (512 bytes per pair, about the size of the metadata row, 42 words at 8 ranks).
ROUND_WORDS = 64


def _time_floor(transport: Any, dist: Any, width: int) -> float:
    """The metadata exchange's own collective on a zero row of ``width`` int64, from a barrier.

    :meth:`pathweave.runtime.executor.Transport.exchange` is what every call
    of the orchestrator makes (gather + broadcast on gloo); timed bare, with
    nothing to encode or decode, it is the least one exchange costs on this
    group: what a call would spend beyond its transfer if the orchestrator
    did nothing else.
    """
    row = np.zeros(width, dtype=np.int64)
    dist.barrier()
    t0 = time.perf_counter()
    transport.exchange(row, time.monotonic() + 60.0)
    return time.perf_counter() - t0


def _time_a2a(torch: Any, dist: Any, world_size: int) -> float:
    """One bare gloo all-to-all of :data:`ROUND_WORDS` int64 per pair, timed from a barrier.

    The smallest call of torch's own collective, for comparison with the
    exchange floor (:func:`_time_floor`).
    """
    send = torch.zeros(world_size * ROUND_WORDS, dtype=torch.int64)
    recv = torch.empty_like(send)
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_to_all_single(recv, send)
    return time.perf_counter() - t0


def _backend_call(out: Any, inp: Any, *sizes: Any, orchestrator: Any, group: Any) -> None:
    """Plain ``torch.distributed.all_to_all_single`` on a ``pathweave`` group, the way an
    unmodified client calls it (``orchestrator`` is the group's own, used for the stats)."""
    import torch.distributed as dist

    del orchestrator
    dist.all_to_all_single(out, inp, *sizes, group=group)


def _run_case(rank: int, world_size: int, case: Case, job: _Job, fabrics: dict) -> dict:
    import torch
    import torch.distributed as dist

    from pathweave import distributed as pwdist
    from pathweave.runtime import Orchestrator
    from pathweave.runtime.executor import Transport
    from pathweave.runtime.orchestrator import default_fabric
    from pathweave.runtime.protocol import meta_width

    impl = job.all_to_all or pwdist.all_to_all_single
    base = element_splits(case.workload, case.bytes_per_pair, world_size)
    varying = not case.cached
    splits = [_vary(base, k) if varying else base for k in range(case.repeat)]
    most_send = max(int(sp[rank].sum()) for sp in [base, *splits])
    most_recv = max(int(sp[:, rank].sum()) for sp in [base, *splits])
    # One buffer of each kind, big enough for every repeat; calls use prefixes.
    inp_all = _pattern(torch, rank, most_send)
    ref_all = torch.empty(most_recv, dtype=torch.float32)
    out_all = torch.empty_like(ref_all)

    if case.variant == "multipath":
        fabric = fabrics["multipath"]
        orch = Orchestrator(fabric=fabric, enabled=True)
    elif case.variant == "backend":
        fabric = None
        group = fabrics["backend"]
        orch = group.orchestrator
        if job.all_to_all is None:
            impl = functools.partial(_backend_call, group=group)
    else:
        fabric = None
        orch = Orchestrator()
    fabric_name = (fabric or default_fabric(world_size)).name

    mismatches: list[str] = []
    checked = failed = 0
    torch_s: list[float] = []
    pw_s: list[float] = []
    calls: list[tuple[float, float, float, bool, bool]] = []
    floor_s: list[float] = []
    a2a_s: list[float] = []
    transport = Transport() if case.case == "overhead" else None

    def exchange(split: np.ndarray) -> tuple[Any, Any, Any, tuple[Any, Any], list[int]]:
        send, recv = split[rank].tolist(), split[:, rank].tolist()
        # Balanced runs use torch's equal-split form (no split lists), as callers do.
        sizes = (None, None) if case.workload == "balanced" and not varying else (recv, send)
        return (inp_all[: sum(send)], out_all[: sum(recv)], ref_all[: sum(recv)], sizes,
                [c * ELEMENT_BYTES for c in recv])

    def reference(split: np.ndarray) -> None:
        inp, _, ref, sizes, _ = exchange(split)
        ref.view(torch.uint8).fill_(POISON_BYTE)
        dist.all_to_all_single(ref, inp, *sizes)

    def timed_call(side: str, split: np.ndarray, what: str) -> float:
        nonlocal checked, failed
        inp, out, ref, sizes, recv_bytes = exchange(split)
        out.view(torch.uint8).fill_(POISON_BYTE)
        dist.barrier()
        t0 = time.perf_counter()
        if side == "torch":
            dist.all_to_all_single(out, inp, *sizes)
        else:
            impl(out, inp, *sizes, orchestrator=orch)
        elapsed = time.perf_counter() - t0
        checked += 1
        bad = _mismatch(torch, out, ref, recv_bytes)
        if bad is not None:
            failed += 1
            if len(mismatches) < MAX_MISMATCHES:
                mismatches.append(f"rank {rank}, {what}: {bad}")
        return elapsed

    reference(base)  # also torch's warm-up
    # Untimed first call: plans (fills the cache) and warms pathweave's buffers.
    timed_call("pathweave", base, "warm-up call")
    kinds_before = _kind_totals(orch)
    for k, split in enumerate(splits):
        if varying:
            reference(split)
        # ABBA order (torch first on even repeats, pathweave first on odd ones),
        # so neither side always runs second, on caches the other just warmed.
        for side in ("torch", "pathweave") if k % 2 == 0 else ("pathweave", "torch"):
            t = timed_call(side, split, f"{side} call {k}")
            if side == "torch":
                torch_s.append(t)
                continue
            pw_s.append(t)
            last = orch.stats.last_call
            calls.append((float(last.meta_s), float(last.plan_s), float(last.transfer_s),
                          bool(last.cached), bool(last.multipath)))
        if transport is not None:
            floor_s.append(_time_floor(transport, dist, meta_width(world_size)))
            a2a_s.append(_time_a2a(torch, dist, world_size))
    after = _kind_totals(orch)
    return {
        "floor_s": floor_s,
        "a2a_s": a2a_s,
        "torch_s": torch_s,
        "pathweave_s": pw_s,
        "calls": calls,
        "kind_bytes": {k: v - kinds_before.get(k, 0) for k, v in after.items()},
        "mismatches": mismatches,
        "checked": checked,
        "failed": failed,
        "send_bytes": int(base[rank].sum()) * ELEMENT_BYTES,
        "fabric": fabric_name,
    }


def _rank_main(rank: int, world_size: int, job: _Job, progress: Any) -> list[dict]:
    import torch

    # Eight processes share the cores; one compute thread each keeps the
    # fills and comparisons from fighting gloo for them.
    torch.set_num_threads(1)
    fabrics: dict[str, Any] = {"multipath": job.multipath_fabric}
    if any(c.variant == "backend" for c in job.cases):
        import torch.distributed as dist

        import pathweave.distributed  # noqa: F401  (registers the backend)

        fabrics["backend"] = dist.new_group(backend="pathweave")
    results = []
    for i, case in enumerate(job.cases):
        if rank == 0 and progress is not None:
            progress.put((i, len(job.cases), case.label))
        # A case's tensors are freed when _run_case returns (nothing else refers to them).
        results.append(_run_case(rank, world_size, case, job, fabrics))
    return results


# --------------------------------------------------------------- parent side
def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if len(values) else None


def _record(case: Case, per_rank: Sequence[dict], world_size: int) -> dict[str, Any]:
    """Combine every rank's measurements of one case into a record (see :func:`run`)."""
    reps = range(case.repeat)
    # A collective takes as long as its slowest rank.
    torch_s = [max(r["torch_s"][k] for r in per_rank) for k in reps]
    pw_s = [max(r["pathweave_s"][k] for r in per_rank) for k in reps]
    # The orchestrator's per-call account, one sample per rank and call: what
    # a call typically spends, rather than the slowest rank's share.
    samples = [(r["calls"][k], r["pathweave_s"][k]) for r in per_rank for k in reps]
    meta = [c[0] for c, _ in samples]
    plan = [c[1] for c, _ in samples]
    transfer = [c[2] for c, _ in samples]
    overhead = [c[0] + c[1] for c, _ in samples]
    beyond = [wall - c[2] for c, wall in samples]
    cache_hits = sum(all(r["calls"][k][3] for r in per_rank) for k in reps)
    multipath = [any(r["calls"][k][4] for r in per_rank) for k in reps]
    # The orchestrator counts every rank's traffic, the same on every rank.
    kinds = per_rank[0]["kind_bytes"]
    mismatches = [m for r in per_rank for m in r["mismatches"]]
    t_med, p_med = _median(torch_s), _median(pw_s)
    send = [int(r["send_bytes"]) for r in per_rank]
    return {
        "case": case.case,
        "workload": case.workload,
        "variant": case.variant,
        "bytes_per_pair": case.bytes_per_pair,
        "cached": case.cached,
        "fabric": per_rank[0]["fabric"],
        "ranks": world_size,
        "backend": BACKEND,
        "bytes_per_rank": max(send),
        "bytes_total": sum(send),
        "repeat": case.repeat,
        "torch_s": torch_s,
        "pathweave_s": pw_s,
        "torch_s_median": t_med,
        "pathweave_s_median": p_med,
        "ratio": p_med / t_med if t_med else None,
        # Paired: each repeat's two calls ran back to back, so slow drifts cancel.
        "diff_s": _median([p - t for p, t in zip(pw_s, torch_s, strict=True)]),
        "meta_s_median": _median(meta),
        "plan_s_median": _median(plan),
        "transfer_s_median": _median(transfer),
        "overhead_s_median": _median(overhead),
        "beyond_transfer_s_median": _median(beyond),
        # Overhead cases: per repeat, the exchange's bare collective and a bare
        # all-to-all, one sample per rank and call as for beyond.
        "floor_s_median": _median([t for r in per_rank for t in r["floor_s"]]),
        "a2a_s_median": _median([t for r in per_rank for t in r["a2a_s"]]),
        "cache_hits": cache_hits,
        "multipath": all(multipath) if any(multipath) else False,
        # Per call, all ranks' traffic.
        "bytes_per_kind": {k: round(v / case.repeat) for k, v in sorted(kinds.items()) if v},
        "verified": not mismatches,
        "outputs_checked": sum(r["checked"] for r in per_rank),
        "outputs_wrong": sum(r["failed"] for r in per_rank),
        "mismatches": mismatches,
    }




def job_fabric(
    spec: str | pwfabric.Fabric, world_size: int, what: str = "multipath_fabric"
) -> pwfabric.Fabric:
    """``spec`` resolved and checked to have one rank per local process.

    The ranks' own ``pathweave`` backend groups read ``PATHWEAVE_*`` from the
    environment: those are checked here too, so a bad one is one error
    before any rank starts, not a traceback from each.

    Raises
    ------
    FabricError
        ``spec`` or ``PATHWEAVE_FABRIC`` is unknown, or its rank count is not
        ``world_size`` (the message names ``what``, both counts and the fabric).
    InputError
        Another ``PATHWEAVE_*`` variable has a bad value.
    """
    from pathweave.runtime.config import FABRIC_ENV, Config

    try:
        env = Config.from_env()
    except ValueError as exc:
        if isinstance(exc, PathweaveError):
            raise
        raise InputError(str(exc)) from None
    if env.fabric is not None and what != FABRIC_ENV:
        job_fabric(env.fabric, world_size, FABRIC_ENV)
    fab = pwfabric.resolve(spec)
    if fab.num_ranks != world_size:
        raise FabricError(
            f"{what} {fab.name!r} has {fab.num_ranks} ranks, but the benchmark runs {world_size}"
        )
    return fab


def run(
    *,
    quick: bool = False,
    repeat: int | None = None,
    world_size: int = WORLD_SIZE,
    sizes_per_pair: Sequence[int] | None = None,
    overhead_repeat: int | None = None,
    multipath_fabric: str | pwfabric.Fabric = MULTIPATH_FABRIC,
    all_to_all: Callable[..., Any] | None = None,
    timeout_s: float = 1800.0,
    on_progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Run the benchmark on ``world_size`` local gloo ranks; one record per case.

    Parameters
    ----------
    quick
        Sizes up to 4 MiB per pair only.
    repeat
        Timing repeats of every case (default: by size, :func:`repeats_for`,
        and :data:`OVERHEAD_REPEATS` for the overhead cases).
    world_size
        Number of local processes; :data:`multipath_fabric` must have as
        many ranks.
    sizes_per_pair
        Replaces :data:`SIZES_PER_PAIR` (bytes per rank pair).
    overhead_repeat
        Repeats of the overhead cases (default: ``repeat`` or 100).
    multipath_fabric
        Fabric of the forced multi-path rows.
    all_to_all
        The all-to-all under test, called as
        ``all_to_all(output, input, output_split_sizes, input_split_sizes,
        orchestrator=...)``; default
        :func:`pathweave.distributed.all_to_all_single`. It must be a
        module-level (picklable) function.
    timeout_s
        Wall-time limit of the whole job.
    on_progress
        Called as ``on_progress(done, total, description)`` as cases start.

    Returns
    -------
    list of dict
        One record per case with the keys of :data:`RECORD_KEYS`: times in
        seconds (``torch_s`` / ``pathweave_s`` per repeat, slowest rank;
        their medians; ``ratio`` = pathweave / torch of the medians;
        ``diff_s`` = median over repeats of pathweave - torch), the
        orchestrator's per-call account as medians over ranks and calls
        (``meta_s_median``, ``plan_s_median``, ``transfer_s_median``,
        ``overhead_s_median`` = meta + plan, ``beyond_transfer_s_median`` =
        wall time - transfer; overhead cases only: ``floor_s_median``, the
        metadata exchange's own collective on a zero row, and ``a2a_s_median``,
        a bare 512 B per pair all-to-all), ``cache_hits`` (timed calls that every rank
        served from the plan cache), ``multipath`` (every timed call went
        multi-path), ``bytes_per_kind`` (bytes per call by path role, all
        ranks' traffic, from ``stats.bytes_per_path_kind``; ``torch`` for
        bytes handed to torch's collective), ``fabric`` (the fabric
        pathweave planned on), ``verified``, ``outputs_checked``,
        ``outputs_wrong`` and ``mismatches`` (the first few, per rank).

    Raises
    ------
    RankError
        A rank failed (the message carries its traceback).
    FabricError
        ``multipath_fabric`` is unknown or has another number of ranks.
    """
    from pathweave.runtime.launch import run_local

    fab = job_fabric(multipath_fabric, world_size)
    todo = cases(quick, repeat, sizes_per_pair, overhead_repeat)
    job = _Job(tuple(todo), fab, all_to_all)
    with _progress_relay(on_progress, len(todo)) as queue:
        per_rank = run_local(_rank_main, world_size, (job, queue), backend=BACKEND,
                             timeout_s=timeout_s)
    return [_record(case, [r[i] for r in per_rank], world_size)
            for i, case in enumerate(todo)]


@contextlib.contextmanager
def _progress_relay(on_progress: Progress | None, total: int):
    """A queue that rank 0 reports to, read by a thread that calls ``on_progress``."""
    if on_progress is None:
        yield None
        return
    import multiprocessing as mp

    queue = mp.get_context("spawn").Queue()

    def relay() -> None:
        while True:
            item = queue.get()
            if item is None:
                return
            on_progress(*item)

    thread = threading.Thread(target=relay, daemon=True)
    thread.start()
    try:
        yield queue
    finally:
        queue.put(None)
        thread.join(5.0)
        queue.close()
        on_progress(total, total, "done")


# ---------------------------------------------------------------- one shot
def _execute_rank(rank: int, world_size: int, fabric: Any, split: np.ndarray,
                  policy: str, enabled: Any, repeat: int) -> dict:
    import torch
    import torch.distributed as dist

    from pathweave import distributed as pwdist
    from pathweave.runtime import Orchestrator

    torch.set_num_threads(1)
    send, recv = split[rank].tolist(), split[:, rank].tolist()
    inp = _pattern(torch, rank, sum(send))
    ref = torch.empty(sum(recv), dtype=torch.float32)
    out = torch.empty_like(ref)
    ref.view(torch.uint8).fill_(POISON_BYTE)
    dist.all_to_all_single(ref, inp, recv, send)
    orch = Orchestrator(fabric=pwfabric.resolve(fabric), policy=policy, enabled=enabled)
    pwdist.all_to_all_single(out, inp, recv, send, orchestrator=orch)  # plans
    bad = _mismatch(torch, out, ref, [c * ELEMENT_BYTES for c in recv])
    before = _kind_totals(orch)
    torch_s, pw_s = [], []
    for _ in range(repeat):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_to_all_single(ref, inp, recv, send)
        torch_s.append(time.perf_counter() - t0)
        out.view(torch.uint8).fill_(POISON_BYTE)
        dist.barrier()
        t0 = time.perf_counter()
        pwdist.all_to_all_single(out, inp, recv, send, orchestrator=orch)
        pw_s.append(time.perf_counter() - t0)
        bad = bad or _mismatch(torch, out, ref, [c * ELEMENT_BYTES for c in recv])
    after = _kind_totals(orch)
    return {
        "torch_s": torch_s, "pathweave_s": pw_s, "mismatch": bad,
        "kind_bytes": {k: v - before.get(k, 0) for k, v in after.items()},
        "multipath": bool(orch.stats.last_call.multipath),
    }


def execute(
    fabric: str | pwfabric.Fabric,
    demand: np.ndarray,
    *,
    policy: str = "mwu",
    enabled: bool | str = True,
    repeat: int = 3,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Run one all-to-all of ``demand`` for real on local gloo ranks, checked against torch.

    One process per rank of ``fabric``; rank ``s`` sends ``demand[s, d]``
    bytes (rounded down to whole float32 elements) to rank ``d`` with an
    :class:`~pathweave.Orchestrator` on ``fabric`` (``policy``, ``enabled``).
    After an untimed call that plans, ``repeat`` interleaved calls of torch's
    and pathweave's ``all_to_all_single`` are timed and every pathweave output
    is compared bitwise with torch's.

    Returns
    -------
    dict
        ``verified`` (bool), ``mismatch`` (first difference or ``None``),
        ``bytes_moved`` (bytes between distinct ranks per call),
        ``bytes_per_kind`` (per call, all ranks' traffic, from the
        orchestrator's ``stats``), ``multipath``, ``pathweave_s`` and
        ``torch_s`` (medians, slowest rank), ``ranks``.
    """
    from pathweave.runtime.launch import run_local

    fab = pwfabric.resolve(fabric)
    demand = np.asarray(demand)
    n = fab.num_ranks
    if demand.shape != (n, n):
        raise ValueError(f"demand has shape {demand.shape}, expected ({n}, {n}) for {fab.name}")
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be an int >= 1, got {repeat!r}")
    split = (demand // ELEMENT_BYTES).astype(np.int64)
    per_rank = run_local(_execute_rank, n, (fab, split, policy, enabled, repeat),
                         backend=BACKEND, timeout_s=timeout_s)
    kinds = per_rank[0]["kind_bytes"]  # every rank counts all ranks' traffic
    mismatch = next((f"rank {i}: {r['mismatch']}" for i, r in enumerate(per_rank)
                     if r["mismatch"]), None)
    off_diagonal = split.sum() - np.trace(split)
    return {
        "ranks": n,
        "verified": mismatch is None,
        "mismatch": mismatch,
        "bytes_moved": int(off_diagonal) * ELEMENT_BYTES,
        "bytes_per_kind": {k: round(v / repeat) for k, v in sorted(kinds.items()) if v},
        "multipath": all(r["multipath"] for r in per_rank),
        "pathweave_s": statistics.median(
            max(r["pathweave_s"][k] for r in per_rank) for k in range(repeat)),
        "torch_s": statistics.median(
            max(r["torch_s"][k] for r in per_rank) for k in range(repeat)),
    }


# ------------------------------------------------------------------ summary
def _fmt_us(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e6:.0f} us"


def summarize(records: Sequence[Mapping[str, Any]]) -> list[Check]:
    """The target checks of a run (``passed=None`` where the case did not run).

    Examples
    --------
    >>> rec = {"case": "transfer", "workload": "balanced", "variant": "auto",
    ...        "bytes_per_pair": 16 << 20, "ratio": 1.04, "verified": True,
    ...        "outputs_checked": 16, "outputs_wrong": 0, "mismatches": []}
    >>> [(c.name, c.passed) for c in summarize([rec])]  # doctest: +NORMALIZE_WHITESPACE
    [('balanced ratio', True), ('backend balanced ratio', None),
     ('cached overhead auto', None), ('cached overhead multipath', None), ('verified', True)]
    """
    checks: list[Check] = []
    size = f"{RATIO_TARGET_BYTES_PER_PAIR >> 20} MiB/pair"
    for variant, name, what in (("auto", "balanced ratio", "pathweave/torch"),
                                ("backend", "backend balanced ratio",
                                 "pathweave backend/gloo")):
        bal = [r for r in records if r["case"] == "transfer" and r["workload"] == "balanced"
               and r["variant"] == variant
               and r["bytes_per_pair"] == RATIO_TARGET_BYTES_PER_PAIR]
        ratio = bal[0]["ratio"] if bal else None
        checks.append(Check.at_most(
            name, ratio, RATIO_TARGET,
            f"{what} on balanced {size}: " + ("not run" if ratio is None else f"{ratio:.3f}")
            + f" (target <= {RATIO_TARGET:.2f})",
        ))
    for variant, what in (("auto", "default orchestrator"), ("multipath", "forced multi-path")):
        ov = [r for r in records if r["case"] == "overhead" and r["cached"]
              and r["variant"] == variant]
        beyond = ov[0]["beyond_transfer_s_median"] if ov else None
        checks.append(Check.at_most(
            f"cached overhead {variant}", beyond, OVERHEAD_TARGET_S,
            f"cached repeated call ({what}), time beyond the transfer: "
            + ("not run" if beyond is None else
               f"{_fmt_us(beyond)} median (metadata + planning per stats "
               f"{_fmt_us(ov[0]['overhead_s_median'])}; pathweave - torch, paired "
               f"{_fmt_us(ov[0]['diff_s'])}; the exchange's bare collective "
               f"{_fmt_us(ov[0].get('floor_s_median'))})")
            + f" (target <= {_fmt_us(OVERHEAD_TARGET_S)})",
        ))
    bad = [m for r in records for m in r["mismatches"]]
    checked = sum(r["outputs_checked"] for r in records)
    wrong = sum(r["outputs_wrong"] for r in records)
    checks.append(Check(
        "verified", float(wrong), 0.0, wrong == 0 and not bad,
        f"outputs bitwise equal to torch's: {checked - wrong} of {checked}"
        + (f"; first mismatch: {bad[0]}" if bad else ""),
    ))
    return checks


__all__ = [
    "MULTIPATH_FABRIC",
    "RECORD_KEYS",
    "SIZES_PER_PAIR",
    "Case",
    "cases",
    "element_splits",
    "execute",
    "repeats_for",
    "run",
    "summarize",
]
