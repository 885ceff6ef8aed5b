"""The op pipeline: decide -> schedule (cached) -> run -> account, the steps every op shares.

An op's adapter (:mod:`pathweave.runtime._adapters`) hands :func:`run` a
``_Call`` once its metadata is exchanged and validated. :func:`run` takes
the decision (:func:`pathweave.runtime._decision.decide`), builds the
per-rank schedule of a multi-path decision once per metadata key
(:func:`schedule`, :mod:`pathweave.runtime.schedule`), runs it on the
group's transport (:mod:`pathweave.runtime.executor`) or torch's own
collective on the same buffers, and counts the call in
:class:`~pathweave.runtime._stats.OrchestratorStats` (:func:`account`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pathweave._log import TRACE
from pathweave.errors import CommError
from pathweave.fabric.paths import ROLES
from pathweave.runtime._adapters import _Call
from pathweave.runtime._decision import _Decision, log_decision
from pathweave.runtime._group import _GroupState
from pathweave.runtime._stats import CallStats, OrchestratorStats
from pathweave.runtime.config import Config
from pathweave.runtime.schedule import (
    Fragments,
    RankSchedule,
    Segments,
    build_schedule,
    split_fragments,
)

# The orchestrator's logger: its log lines keep the name users filter on.
log = logging.getLogger("pathweave.runtime.orchestrator")

#: A multi-path call's schedule: (this rank's schedule, bytes per link, bytes per path
#: role, the fragments' paths, where rounds are timed the predicted round ends of its
#: streams, made on first use: :func:`~pathweave.runtime.telemetry.round_ends`, else None).
Entry = tuple[RankSchedule, np.ndarray, dict[str, int], np.ndarray,
              Callable[[], dict[int, float]] | None]


def run(
    st: _GroupState, call: _Call, t0: float, deadline: float, *, wait: bool,
    decide: Callable[[_GroupState, np.ndarray], tuple[_Decision, bool]],
    schedule: Callable[[_GroupState, _Decision, Segments, np.ndarray], Entry],
    stats: OrchestratorStats,
) -> Any:
    """decide -> schedule (cached) -> run -> account: the steps every op shares.

    The call's metadata is exchanged already (``t0`` is when the call
    began). ``decide`` and ``schedule`` are the orchestrator's (its
    :func:`~pathweave.runtime._decision.decide` and :func:`schedule` with its
    config). Returns the handle, waited for if ``wait``.
    """
    from pathweave.runtime.executor import Handle

    tr = st.transport
    t1 = time.perf_counter()
    if call.mkey == st.last_call[0]:
        # The very same call as the last one: validated and decided then.
        _, layout, dec, total = st.last_call
        cached = True
    else:
        layout = call.decode()
        t1 = time.perf_counter()
        dec, cached = decide(st, layout.pair_bytes)
        total = int(layout.pair_bytes.sum() - np.trace(layout.pair_bytes))
        st.last_call = (call.mkey, layout, dec, total)
        log_decision(st, dec, call.op)
    if st.out_of_step is not None:
        # Every rank read the same plane words: every rank raises here.
        msg, st.out_of_step = st.out_of_step, None
        raise ValueError(f"{call.op}: {msg}")
    pair_bytes = layout.pair_bytes
    entry = None
    if dec.multipath:
        key = (call.mkey, dec.ident)
        entry = st.schedules.get(key)
        if entry is None:
            cached = False
            entry = schedule(st, dec, call.segments(layout), pair_bytes)
            st.schedules.put(key, entry)
    if st.adapt is not None:
        # On every rank alike (whether this rank times the call or not): the
        # plan of what the next row's words describe sets their number.
        timed = entry is not None and call.timing is not None
        st.adapt.note(entry[3] if timed else None, entry[1] if timed else None,
                      entry[4] if timed else None)
    t2 = time.perf_counter()
    send_bufs, recv_bufs, post_torch, finish = call.buffers(entry is not None)
    try:
        if entry is None:
            try:
                works = post_torch(layout)
            except Exception as exc:  # a dead peer surfaces as torch's RuntimeError
                raise CommError(f"rank {tr.rank}: torch's {call.op} failed: {exc}") from exc
            handle = Handle(works, rank=tr.rank, deadline=deadline, finish=finish,
                            host_wait=not tr.nccl, outputs=call.outputs)
        else:
            timing = None
            if st.adapt is not None and wait and st.adapt.sampled:
                timing = call.timing(layout)
            handle = tr.run(entry[0], send_bufs, recv_bufs, deadline=deadline,
                            wait=wait, finish=finish, timing=timing, outputs=call.outputs,
                            keep=call.keep_recvs)
            if timing is not None:
                _observe(st.adapt, handle)
        if wait:
            handle.wait()
    except CommError:
        # Receives of this call may still be posted into the group's reused
        # scratch; a later call must not share that memory with them.
        st.drop_scratch()
        tr.drop_kept()
        raise
    account(stats, call.op, total, entry, t0, t1, t2, cached)
    return handle


def _observe(adapt: Any, handle: Any) -> None:
    """Give ``adapt`` a timed call's receive times: now, or (rounds timed on the
    device) when its next words are read (:meth:`Adaptation.observe_later`)."""

    def recv_times(timings: dict[Any, float]) -> list[tuple[int, int, float]]:
        return [(s, last, sec) for (s, last), sec in timings.items()]

    later = handle.timings_later
    if later is None:
        adapt.observe(recv_times(handle.timings))
        return

    def read() -> list[tuple[int, int, float]] | None:
        t = later()
        return None if t is None else recv_times(t)

    adapt.observe_later(read)


def schedule(
    st: _GroupState, dec: _Decision, segs: Segments, pair_bytes: np.ndarray, cfg: Config
) -> Entry:
    """``dec``'s splits of ``pair_bytes`` as this rank's schedule, with what they load."""
    fpair, fpath, fbytes = split_fragments(
        dec.flow_pair, dec.flow_path, dec.flow_weight, pair_bytes,
        min_split_bytes=cfg.min_split_bytes, default_path=st.default_path,
    )
    grouped = st.transport.grouped_rounds
    frags = Fragments(fpair, fbytes, st.routes[fpath], st.paths.links[fpath])
    sched = build_schedule(segs, frags, rank=st.transport.rank, chunk_bytes=cfg.chunk_bytes,
                           window=cfg.window, whole_streams=not grouped)
    link_bytes = st.paths.link_load_bytes(fpath, fbytes)
    roles = np.bincount(st.paths.role_code[fpath], weights=fbytes, minlength=len(ROLES))
    kinds = {ROLES[i]: int(v) for i, v in enumerate(roles) if v}
    ends = None
    if grouped and st.adapt is not None:
        ends = _round_ends(st, segs, frags, fpath, cfg)
    return sched, link_bytes, kinds, fpath, ends


def _round_ends(st: _GroupState, segs: Segments, frags: Fragments, fpath: np.ndarray,
                cfg: Config) -> Callable[[], dict[int, float]]:
    """When each stream's last round should end on the nominal fabric (rounds are timed:
    :func:`~pathweave.runtime.telemetry.round_ends`), worked out on the first sampled call
    of the schedule, then kept: every rank's messages again, about the schedule's own cost
    (256 ranks, 157k messages: 0.1 s for the messages, 0.1 s for the rounds, the schedule
    0.1 s, on 2 shared cores)."""
    kept: list[dict[int, float]] = []
    # Not the group state itself: the schedule cache holding this would hold it.
    # st.fabric is the nominal fabric (the adaptation's own nominal; plans on
    # learned capacities use st.plan_fabric).
    paths, rank = st.paths, st.transport.rank
    nominal = st.fabric.capacity_Bps

    def ends() -> dict[int, float]:
        if not kept:
            from pathweave.runtime.schedule import _global_hops
            from pathweave.runtime.telemetry import round_ends

            hops = _global_hops(segs, frags, cfg.chunk_bytes, cfg.window)
            kept.append(round_ends(hops, fpath[frags.nbytes > 0], paths, nominal, rank))
        return kept[0]

    return ends


def account(
    stats: OrchestratorStats, op: str, total: int, entry: Entry | None, t0: float, t1: float,
    t2: float, cached: bool,
) -> None:
    """Count a call of ``op`` (``entry``: its schedule, None: torch's collective) in ``stats``."""
    s = stats
    s.calls += 1
    s.cache_hits += int(cached)
    s.bytes_total += total
    if entry is None:
        s.bytes_per_path_kind["torch"] = s.bytes_per_path_kind.get("torch", 0) + total
    else:
        s.multipath_calls += 1
        if len(s.bytes_per_link) != len(entry[1]):
            s.bytes_per_link = np.zeros(len(entry[1]))
        s.bytes_per_link += entry[1]
        for k, v in entry[2].items():
            s.bytes_per_path_kind[k] = s.bytes_per_path_kind.get(k, 0) + v
    t3 = time.perf_counter()
    s.last_call = CallStats(op, total, t1 - t0, t2 - t1, t3 - t2, cached, entry is not None)
    if log.isEnabledFor(TRACE):
        log.log(TRACE, "%s %d B %s%s: meta %.1f us, plan %.1f us, transfer %.1f us", op, total,
                "multi-path" if entry is not None else "torch", " (cached)" if cached else "",
                (t1 - t0) * 1e6, (t2 - t1) * 1e6, (t3 - t2) * 1e6)
