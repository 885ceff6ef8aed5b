"""Executes a :class:`~pathweave.runtime.schedule.RankSchedule` on ``torch.distributed``.

The executor knows nothing about plans: it takes one rank's schedule, the
rank's send and receive buffers as flat ``uint8`` tensors, and moves bytes
with the backend's own point-to-point operations.

* **gloo** (CPU): every operation is an ``isend``/``irecv`` whose tag is
  ``tag_base`` plus its order on its rank pair, so concurrent streams never
  mix and messages match whatever order they are posted in. Each forwarded
  stream advances on its own (:class:`~pathweave.runtime.schedule.Dataflow`):
  the rank posts every receive it can (into user buffers, and into each
  stream's staging slots: on gloo a slot per chunk, ``whole_streams``)
  before any send (in round order; direct messages to a peer the rank also
  forwards to are fed one at a time behind its forwards, :func:`_fed_sends`),
  then one thread per forwarded stream waits for chunk ``c``, forwards it,
  waits for the forward of chunk ``c - 1`` and re-posts a receive into the
  slot it left.
  The threads block in gloo's ``wait`` (which releases the GIL), so nothing
  polls and a slow stream paces only itself.
* **NCCL** (CUDA): operations go out round by round, each round as one
  ``batch_isend_irecv`` group: NCCL runs a communicator's point-to-point
  kernels in issue order on one CUDA stream and matches them per pair in
  issue order, so posting each stream on its own could make two ranks' issue
  orders wait on each other in a cycle; one group per round keeps every
  rank's issue order the same global order. ``wait`` on NCCL orders the
  current CUDA stream after the round, which is what the next round's
  forwards need. Before round ``t`` a rank waits only for its staging
  operations of round ``t - 1``.

The deadlock-freedom arguments of both are in ``docs/runtime.md``.
"""

from __future__ import annotations

import datetime
import functools
import operator
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pathweave.errors import CommError
from pathweave.runtime.schedule import MAX_PAIR_MESSAGES, STAGING, RankSchedule

__all__ = ["CudaRoundClock", "Handle", "RoundClock", "Transport", "as_bytes", "dense", "is_dense",
           "start_row_exchange"]

#: Tags of pathweave messages: [2**30, 2**31), clear of small user tags.
_TAG_BASE = 1 << 30
_TAG_CALL_BITS = MAX_PAIR_MESSAGES.bit_length() - 1  # messages per rank pair per call
_TAG_CALLS = 1 << (30 - _TAG_CALL_BITS - 1)
#: Streams one rank may forward in one call (one thread each).
_MAX_STREAMS = 4096
#: Fed sends (:func:`_fed_sends`) a pair's feeder keeps posted and not yet written out.
_FEED_DEPTH = 1
#: How often a stream waiting for its forward's turn looks at the deadline and at the
#: other streams' failures (a turn taken wakes it at once).
_TURN_POLL_S = 0.05
#: Longest a forward waits for its turn (:func:`_forward_sequence`): then it goes out
#: ahead of a forward whose data is that late, so a straggler holds up no other stream
#: for longer, and no wait can last.
_TURN_WAIT_S = 0.1


def is_dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements are its ``numel`` consecutive storage slots in row-major order.

    This is the memory layout, not the view's strides: ``is_contiguous()``
    ignores the stride of a dimension of size 1 (``torch.arange(3.)[1::2]``
    is contiguous), and a conjugate or negative view holds other values in
    memory than it shows, so its bytes are not its values.
    """
    return (t.layout == torch.strided and t.is_contiguous() and not t.is_conj()
            and not t.is_neg())


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat ``uint8`` view of a dense tensor (:func:`is_dense`; any dtype, incl. bool and fp8).

    Built from the storage offset and element count, so the strides of size-1
    dimensions do not matter.
    """
    flat = t.as_strided((t.numel(),), (1,))
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


def dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself if :func:`is_dense`, else a dense copy with the values it shows."""
    return t if is_dense(t) else t.resolve_conj().resolve_neg().contiguous()


def _wrap(exc: BaseException, rank: int, what: str) -> CommError:
    return CommError(f"rank {rank}: {what} failed: {exc}")

#: Buffer kinds of a program's slots: the staging area, a send buffer, a receive buffer,
#: the pack area of coalesced rounds (last: a call that does not coalesce cuts no views of it).
_STAGE, _SEND, _RECV, _PACK = 0, 1, 2, 3
#: A round's copies between the pack area and the operations' own views: the view
#: indices copied into, and those copied from, in pairs (one ``_foreach_copy_``), and
#: ``(into, from)`` pairs of 2-D views (a run of :data:`_MIN_RUN` pieces or more, each
#: one ``copy_``).
_Copies = tuple[list[int], list[int], list[tuple[int, int]]]
#: One round as posted: its receives and sends ``(peer, tag offset, view)``, the packs
#: made before posting and the unpacks done once its works are done.
_Round = tuple[list[tuple[int, int, int]], list[tuple[int, int, int]], _Copies, _Copies]
_NO_COPIES: _Copies = ([], [], [])
#: The fewest pieces of equal size at a constant stride in one buffer that a pack or
#: unpack copies as one 2-D view instead of one by one: on CUDA such a copy is a kernel
#: launch of its own (a few us of host time), where ``_foreach_copy_`` spends a
#: fraction of a us per piece; on other devices every piece is a copy of its own.
_MIN_RUN = 32


@dataclass(frozen=True, eq=False)
class _Program:
    """A :class:`RankSchedule` compiled for posting; made once per schedule and way of
    posting (:func:`_program`) and kept with it.

    A cached plan's calls differ only in their tensors, so everything that
    depends on the schedule alone is worked out here: every operation is
    ``(group peer, tag offset, view)``, the view an index into the list that
    :meth:`views` cuts from a call's buffers, one ``split_with_sizes`` per
    buffer (one C++ call for all of a buffer's pieces, half the host time of
    slicing each; gaps between pieces are cut too, and only where there are
    any). A plain program (``coalesced`` empty) holds each operation
    (``recvs``, ``sends``) and each round's (``rounds``: :data:`_Round`, with
    no copies); the stream steps hold operation indices. A coalesced one holds
    only ``coalesced``, the rounds with one message per peer and direction
    (:func:`_coalesce`), through ``pack_bytes`` of pack area, and cuts only
    the views those messages and copies use.
    """

    slots: list[tuple[int, int, list[int], int, Callable[[Any], tuple[Any, ...]] | None,
                      list[tuple[int, int]], list[tuple[int, int, int, int]]]]
    recvs: list[tuple[int, int, int]]
    sends: list[tuple[int, int, int]]
    user_recvs: list[int]
    rounds: list[_Round]
    coalesced: list[_Round]
    pack_bytes: int
    copies: list[tuple[int, int, int, int, int]]
    first_recvs: list[int]
    first_sends: list[int]
    streams: list[list[tuple[tuple[int, ...], tuple[int, ...]]]]
    after: list[list[int]]
    fed: list[list[int]]
    #: Per send, its place among this rank's forwards to the same peer in the schedule's
    #: order (-1: not a forward): the streams post a peer's forwards in that order.
    fwd_seq: list[int] = field(default_factory=list)

    def views(self, staging: Any, send_bufs: Sequence[torch.Tensor],
              recv_bufs: Sequence[torch.Tensor], memo: dict[int, Any] | None = None,
              pack: Any = None) -> list[torch.Tensor]:
        """Every operation's tensor for one call, in view-index order.

        ``memo`` (slot -> (buffer key, views)) keeps the views of the staging
        area, the receive buffers and the pack area from one call to the
        next: cutting ~2,000 views took a third of a cached call's host work
        at 256 ranks, and a blocking call's staging and scratch are the same
        memory every time. A slot's views are reused only for a buffer at the
        same address, of the same size, on the same device: the kept views
        hold their memory, so no other live buffer can be there. Without a
        ``pack`` area the pack views (the last) are not cut.
        """
        out: list[torch.Tensor] = []
        for i, (kind, b, sizes, end, pick, extra, runs) in enumerate(self.slots):
            if kind == _PACK:
                if pack is None:
                    break
                t = pack
            else:
                t = staging if kind == _STAGE else (send_bufs if kind == _SEND else recv_bufs)[b]
            key = None
            if memo is not None and kind != _SEND:
                key = (t.data_ptr(), t.numel(), t.device)
                hit = memo.get(i)
                if hit is not None and hit[0] == key:
                    out += hit[1]
                    continue
            vs: Sequence[torch.Tensor] = ()
            if pick is not None:
                rest = t.numel() - end
                vs = pick(t.split_with_sizes([*sizes, rest] if rest else sizes))
            if extra or runs:
                at = t.storage_offset()
                vs = [*vs, *(t[o : o + n] for o, n in extra),
                      *(t.as_strided((k, n), (s, 1), at + o) for o, k, n, s in runs)]
            if key is not None:
                memo[i] = (key, vs)
            out += vs
        return out


def _copy(views: list[torch.Tensor], copies: _Copies) -> None:
    """A round's packs or unpacks (:data:`_Copies`): the pieces in one call (one fused
    kernel on CUDA), each run of pieces in one ``copy_``."""
    dst, src, runs = copies
    if dst:
        torch._foreach_copy_([views[i] for i in dst], [views[i] for i in src])
    for d, f in runs:
        views[d].copy_(views[f])


def _first_of(i: int) -> Callable[[Any], tuple[Any, ...]]:
    """``itemgetter`` of one index, returning a 1-tuple as it does for several."""
    return lambda seq: (seq[i],)


def _program(sched: RankSchedule, coalesced: bool = False) -> _Program:
    """``sched`` compiled for posting (``coalesced``: as :func:`_coalesce` groups its
    rounds; else each operation on its own), on first use, and kept with the schedule."""
    kept = sched.__dict__.get("_programs")
    if kept is None:
        kept = {}
        object.__setattr__(sched, "_programs", kept)
    prog = kept.get(coalesced)
    if prog is None:
        prog = kept[coalesced] = _compile(sched, coalesced)
    return prog


#: A view to cut: (slot, (offset, bytes)), or (slot, (offset, count, bytes, stride)) for
#: ``count`` pieces of ``bytes`` every ``stride`` bytes as one 2-D view; a slot is
#: (buffer kind, buffer index).
_Range = tuple[tuple[int, int], tuple[int, ...]]


def _slots(wanted: list[_Range]) -> tuple[list[Any], dict[_Range, int]]:
    """The slots of :class:`_Program` that cut ``wanted``, and each range's view index.

    A slot's ranges that lie apart (in offset order, each taken if it starts
    where the last taken ends or later) come from one ``split_with_sizes``;
    the others (a staging slot's message received whole and forwarded in
    pieces, or the other way) are sliced one by one.
    """
    ranges: dict[tuple[int, int], set[tuple[int, ...]]] = {}
    for slot, rng in wanted:
        ranges.setdefault(slot, set()).add(rng)
    slots, index = [], {}
    for slot in sorted(ranges):
        apart, extra, end = [], [], 0
        runs = sorted(r for r in ranges[slot] if len(r) == 4)
        for o, n in sorted(r for r in ranges[slot] if len(r) == 2):
            if o >= end:
                apart.append((o, n))
                end = o + n
            else:
                extra.append((o, n))
        # The pieces and the gaps between them (none where pieces abut).
        sizes, at, end = [], [], 0
        for o, n in apart:
            if o > end:
                sizes.append(o - end)
            at.append(len(sizes))
            sizes.append(n)
            end = o + n
        pick: Callable[[Any], tuple[Any, ...]] | None = None  # a slot of runs only: none
        if at:
            pick = operator.itemgetter(*at) if len(at) > 1 else _first_of(at[0])
        for r in apart + extra + runs:
            index[slot, r] = len(index)
        slots.append((slot[0], slot[1], sizes, end, pick, extra, runs))
    return slots, index


def _compile(sched: RankSchedule, coalesced: bool) -> _Program:
    df = sched.dataflow()
    rp, sp = sched.recv_ptr.tolist(), sched.send_ptr.tolist()
    ops_r = [((_STAGE, 0) if b == STAGING else (_RECV, b), (o, n), p, k)
             for p, k, b, o, n in df.recvs]
    ops_s = [((_STAGE, 0) if b == STAGING else (_SEND, b), (o, n), p, k)
             for p, k, b, o, n in df.sends]
    recvs: list[tuple[int, int, int]] = []
    sends: list[tuple[int, int, int]] = []
    rounds: list[_Round] = []
    groups, pack_bytes = _coalesce(df, rp, sp, sched.num_rounds) if coalesced else ([], 0)
    if coalesced:
        slots, index = _slots([r for g in groups for r in _group_ranges(g, ops_r, ops_s)])
        coalesced_rounds = [_coalesced_round(g, ops_r, ops_s, index) for g in groups]
    else:
        slots, index = _slots([(slot, rng) for slot, rng, _, _ in ops_r + ops_s])
        coalesced_rounds = []
        recvs = [(p, k, index[slot, rng]) for slot, rng, p, k in ops_r]
        sends = [(p, k, index[slot, rng]) for slot, rng, p, k in ops_s]
        rounds = [(recvs[rp[t] : rp[t + 1]], sends[sp[t] : sp[t + 1]], _NO_COPIES, _NO_COPIES)
                  for t in range(sched.num_rounds)]
    copies = list(zip(*(c.tolist() for c in (
        sched.copy_send_buf, sched.copy_send_off, sched.copy_recv_buf, sched.copy_recv_off,
        sched.copy_bytes)), strict=True))
    user = [i for i, op in enumerate(df.recvs) if op[2] != STAGING]
    first_sends, fed = _fed_sends(sched, df)
    return _Program(slots, recvs, sends, user, rounds, coalesced_rounds, pack_bytes, copies,
                    df.first_recvs, first_sends, df.streams, df.after, fed,
                    _forward_sequence(sched, df))


def _forward_sequence(sched: RankSchedule, df: Any) -> list[int]:
    """Each send's place among this rank's forwards to its peer (-1: no forward;
    :attr:`_Program.fwd_seq`): by round, then those that go on after the peer before
    those the peer keeps (the next hops of the first overlap what follows them), then
    the schedule's message order."""
    seq = [-1] * len(df.sends)
    rnd = sched.send_round.tolist()
    final = [True] * len(rnd) if sched.send_final is None else sched.send_final.tolist()
    by_peer: dict[int, list[tuple[int, bool, int, int]]] = {}
    for steps in df.streams:
        for _, sends_c in steps:
            for j in sends_c:
                peer, order = df.sends[j][:2]
                by_peer.setdefault(peer, []).append((rnd[j], final[j], order, j))
    for ops in by_peer.values():
        for place, op in enumerate(sorted(ops)):
            seq[op[3]] = place
    return seq


_Group = tuple[bool, int, int, list[int], Any, list[Any]]


def _group_message(group: _Group, ops_r: list[Any], ops_s: list[Any]) -> _Range:
    """The range a group of :func:`_coalesce` without a pack region travels from or into:
    its one operation's, or its abutting operations' together."""
    is_recv, _, _, idx, _, _ = group
    ops = ops_r if is_recv else ops_s
    slot, (o, _), _, _ = ops[idx[0]]
    return slot, (o, sum(ops[i][1][1] for i in idx))


def _piece_copies(group: _Group, ops_r: list[Any], ops_s: list[Any]
                  ) -> list[tuple[_Range, _Range]]:
    """A packed group's copies: ``(own range, pack area range)`` per piece, or per run of
    at least :data:`_MIN_RUN` pieces of one size at one stride in one buffer (both as
    2-D ranges; its pieces lie one after another in the pack area)."""
    is_recv, _, _, idx, _, pieces = group
    own = [(ops_r if is_recv else ops_s)[i][:2] for i in idx]
    out: list[tuple[_Range, _Range]] = []
    j = 0
    while j < len(own):
        (slot, (o, n)), e = own[j], j + 1
        if e < len(own) and own[e][0] == slot and own[e][1][1] == n:
            stride = own[e][1][0] - o
            while (e < len(own) and own[e][0] == slot and own[e][1][1] == n
                   and own[e][1][0] - own[e - 1][1][0] == stride):
                e += 1
            if e - j >= _MIN_RUN and stride >= n:
                at = pieces[j][0]
                out.append(((slot, (o, e - j, n, stride)), ((_PACK, 0), (at, e - j, n, n))))
                j = e
                continue
        out.append((own[j], ((_PACK, 0), pieces[j])))
        j += 1
    return out


def _group_ranges(groups: list[_Group], ops_r: list[Any], ops_s: list[Any]) -> list[_Range]:
    """Every range a coalesced round's groups post or copy."""
    out = []
    for g in groups:
        if g[4] is None:
            out.append(_group_message(g, ops_r, ops_s))
        else:
            out.append(((_PACK, 0), g[4]))
            out += [r for pair in _piece_copies(g, ops_r, ops_s) for r in pair]
    return out


def _coalesced_round(groups: list[_Group], ops_r: list[Any], ops_s: list[Any],
                     index: dict[_Range, int]) -> _Round:
    """One round of a coalesced program (:data:`_Round`) from :func:`_coalesce`'s groups."""
    rv: list[tuple[int, int, int]] = []
    sd: list[tuple[int, int, int]] = []
    pk: _Copies = ([], [], [])
    up: _Copies = ([], [], [])
    for g in groups:
        is_recv, peer, order, _, region, _ = g
        if region is None:
            v = index[_group_message(g, ops_r, ops_s)]
        else:
            v = index[(_PACK, 0), region]
            for own, packed in _piece_copies(g, ops_r, ops_s):
                dst, src = (own, packed) if is_recv else (packed, own)
                cp = up if is_recv else pk
                if len(own[1]) == 4:
                    cp[2].append((index[dst], index[src]))
                else:
                    cp[0].append(index[dst])
                    cp[1].append(index[src])
        (rv if is_recv else sd).append((peer, order, v))
    # The shared empty copies where there are none: posting skips them by identity.
    return rv, sd, pk if pk[0] or pk[2] else _NO_COPIES, up if up[0] or up[2] else _NO_COPIES


def _coalesce(df: Any, rp: list[int], sp: list[int], num_rounds: int
              ) -> tuple[list[list[_Group]], int]:
    """Each round's operations with one peer in one direction as one message.

    A round's operations are sorted by peer, then order, and every send has
    its receive in the same round with the same order and size on its peer
    (:func:`~pathweave.runtime.schedule.check_schedules`), so both ends find
    the same groups, in the same order, with the same pieces: a group of
    several pieces travels as one message (the tag of its first order).
    Where a group's pieces abut in one buffer, in order, the message is
    posted from (or into) them as they lie; elsewhere it goes through a region
    of the pack area, packed before the round is posted and unpacked once it
    is done. Which of the two is each end's own affair: the bytes on the wire
    are the same. The region is laid out anew each round (a round is posted
    only once the last one is done, on NCCL in stream order), so the pack
    area is the largest round's packed bytes.

    Returns per round ``(is_recv, peer, order, op indices, region, piece
    ranges)`` (``region`` None for a group posted as it lies) and the pack
    area's size in bytes.
    """
    out, most = [], 0
    for t in range(num_rounds):
        at, groups = 0, []
        for is_recv, ops, lo, hi in ((True, df.recvs, rp[t], rp[t + 1]),
                                     (False, df.sends, sp[t], sp[t + 1])):
            i = lo
            while i < hi:
                j = i + 1
                while j < hi and ops[j][0] == ops[i][0]:
                    j += 1
                idx = list(range(i, j))
                region, pieces = None, []
                # ops: (peer, order, buffer, offset, bytes)
                abut = all(ops[x][2] == ops[x + 1][2] and ops[x][3] + ops[x][4] == ops[x + 1][3]
                           for x in idx[:-1])
                if not abut:
                    for x in idx:
                        pieces.append((at, ops[x][4]))
                        at += ops[x][4]
                    region = (pieces[0][0], at - pieces[0][0])
                groups.append((is_recv, ops[i][0], ops[i][1], idx, region, pieces))
                i = j
        out.append(groups)
        most = max(most, at)
    return out, most


def _fed_sends(sched: RankSchedule, df: Any) -> tuple[list[int], list[list[int]]]:
    """``(first_sends, fed)``: the sends posted at once, and per peer the sends *fed* to it.

    Direct messages (from a user buffer into the peer's receive buffer:
    ``send_final``) to a peer this rank also forwards streams to are fed:
    posted in order by one thread per peer, at most :data:`_FEED_DEPTH` of
    them not yet written to the socket. gloo writes a pair's messages in the
    order they are posted, so posting them all at the start queued every
    forward behind the whole direct fragment (emulated stencil: a relay's
    first forward crossed its rail 0.6-0.8 s into a 1.4 s call, and the hop
    after it carried every forwarded byte at the end); fed, each forward
    waits behind at most one direct message and takes its share of the link
    as it arrives, as the model's per-byte sharing has it. A fed send's
    receive is in a user buffer, which its peer posts before anything else,
    so a feeder never waits on another stream. Sends into a relay's staging
    and schedules without ``send_final`` are posted at once.
    """
    final = sched.send_final
    peers = {df.sends[j][0] for st in df.streams for _, ss in st for j in ss}
    if final is None or not peers:
        return list(df.first_sends), []
    now: list[int] = []
    fed: dict[int, list[int]] = {}
    for j in df.first_sends:
        p = df.sends[j][0]
        if p in peers and final[j]:
            fed.setdefault(p, []).append(j)
        else:
            now.append(j)
    return now, [fed[p] for p in sorted(fed)]


class Handle:
    """What an ``async_op=True`` call returns: ``wait()`` finishes the exchange.

    Mirrors ``torch.distributed.Work``: ``wait()`` returns ``True`` and raises
    if the exchange failed; ``is_completed()`` tells whether it is done (the
    output written, or the failure known); ``get_future()`` returns a
    ``torch.futures.Future`` whose value is the list of the call's outputs
    (``[output]`` for ``all_to_all_single``, as torch's gloo work gives), set
    once the exchange is done.

    The exchange runs either behind ``works`` (torch's works, waited for in
    ``wait()``, which then calls ``finish``) or, for ``pending``, on a worker
    thread that posts, forwards, waits and finishes by itself: the call
    returned before any transfer and ``wait()`` only waits for the thread.
    """

    def __init__(
        self,
        works: Sequence[Any],
        *,
        rank: int,
        deadline: float,
        finish: Callable[[], None] | None = None,
        host_wait: bool = True,
        pending: Future[Any] | None = None,
        outputs: Sequence[torch.Tensor] = (),
    ):
        self._works = list(works)
        self._host_wait = host_wait
        self._rank = rank
        self._deadline = deadline
        self._finish = finish
        self._pending = pending
        self._outputs = list(outputs)
        self._done = False
        self._lock = threading.Lock()
        self._future: torch.futures.Future[list[torch.Tensor]] | None = None
        #: Receive completion times by key (``Transport.run(timing=...)``).
        self.timings: dict[Any, float] = {}
        #: Where rounds were timed (grouped rounds): reads :attr:`timings` later, ``None``
        #: while they are not known yet (:class:`RoundClock`).
        self.timings_later: Callable[[], dict[Any, float] | None] | None = None

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        deadline = self._deadline
        if timeout is not None:
            deadline = min(deadline, time.monotonic() + timeout.total_seconds())
        with self._lock:
            if self._done:
                return True
            if self._pending is not None:
                _wait_future(self._pending, deadline, self._rank)
                self._pending = None
            _wait_all(self._works, deadline, self._rank, "waiting for the exchange",
                      host_wait=self._host_wait)
            self._works = []
            if self._finish is not None:
                self._finish()
                self._finish = None
            self._done = True
        return True

    def is_completed(self) -> bool:
        if self._done:
            return True
        if self._pending is not None:
            return self._pending.done()
        return all(w.is_completed() for w in self._works)

    def is_success(self) -> bool:
        return self._done

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        """A future of the outputs, completed (or failed) when the exchange is.

        No ``wait()`` is needed for it: on a worker-run call the worker sets
        it; otherwise a pool thread waits for the works.
        """
        with self._lock:
            if self._future is not None:
                return self._future
            fut: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
            self._future = fut

        settle = settler(fut, self.wait, lambda: self._outputs)
        if self._pending is not None:
            self._pending.add_done_callback(settle)
        else:
            _waiters().submit(settle)
        return fut

    def __repr__(self) -> str:
        return f"Handle(completed={self.is_completed()}, pending={len(self._works)})"


class RoundClock:
    """When some rounds of one call ended, in seconds after the call started (host twin).

    The executor calls :meth:`start` before posting a call's first round and
    :meth:`mark` once a round's works are waited for; :meth:`ends` reads the
    marks later. This twin reads the host clock, where waiting blocks the
    host (gloo with ``grouped_rounds`` forced); :class:`CudaRoundClock`
    records CUDA events where waiting only orders the stream (NCCL), so
    nothing here syncs the host. Only the rounds in ``wanted`` are marked
    (those that carry a stream's last receive: a CUDA event each).

    Examples
    --------
    >>> clock = RoundClock([1])
    >>> clock.start(); clock.mark(0); clock.mark(1)
    >>> ends = clock.ends()
    >>> sorted(ends), ends[1] >= 0.0
    ([1], True)
    """

    def __init__(self, wanted: Sequence[int]):
        self.wanted = frozenset(int(t) for t in wanted)
        self._start: Any = None
        self._marks: dict[int, Any] = {}

    def _stamp(self) -> Any:
        return time.perf_counter()

    def start(self) -> None:
        self._start = self._stamp()

    def mark(self, rnd: int) -> None:
        """Round ``rnd``'s works are waited for (on NCCL: in stream order)."""
        if rnd in self.wanted:
            self._marks[rnd] = self._stamp()

    def ends(self) -> dict[int, float] | None:
        """Round -> its end in seconds after :meth:`start`; ``None`` while not known yet."""
        return {t: float(m - self._start) for t, m in self._marks.items()}


class CudaRoundClock(RoundClock):
    """:class:`RoundClock` on CUDA events of the current stream (NCCL's twin).

    :meth:`ends` does not wait: while an event is not complete
    (``Event.query()``), it returns ``None`` (the caller then has nothing
    observed). The orchestrator reads it at the next call's metadata
    exchange, whose ``.cpu()`` has synced the host past this call.
    """

    def _stamp(self) -> Any:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def ends(self) -> dict[int, float] | None:
        if self._start is None or not all(e.query() for e in (self._start, *self._marks.values())):
            return None
        return {t: self._start.elapsed_time(e) / 1e3 for t, e in self._marks.items()}


def _wait_future(fut: Future[Any], deadline: float, rank: int) -> None:
    """Wait for a worker-run exchange; its own waits end at ``deadline`` already."""
    try:
        fut.result(timeout=max(0.0, deadline - time.monotonic()) + 1.0)
    except CommError:
        raise
    except TimeoutError as exc:
        raise CommError(f"rank {rank}: waiting for the exchange ran past the timeout") from exc
    except Exception as exc:
        raise _wrap(exc, rank, "the exchange") from exc


def settler(fut: torch.futures.Future, wait: Callable[[], Any],
            result: Callable[[], Any]) -> Callable[..., None]:
    """A callable that waits (``wait()``) and completes ``fut`` with ``result()`` or the error.

    The one way a pathweave work completes its future (the executor's
    handle, the backend's work): run it on a waiter thread or as a callback.
    """

    def settle(_: Any = None) -> None:
        try:
            wait()
        except BaseException as exc:  # the future carries it to its waiter
            fut.set_exception(exc)
        else:
            fut.set_result(result())

    return settle


@functools.cache
def _waiters() -> ThreadPoolExecutor:
    """Threads that wait for handles whose futures were asked for (made on first use)."""
    return ThreadPoolExecutor(max_workers=64, thread_name_prefix="pathweave-wait")


# NOTE: functools.cache, not a Cache: stream threads call this at once, and a
# Cache's eviction between another thread's hit and its move would raise. The
# keys are whole seconds up to the call's timeout, so the table stays small.
@functools.cache
def _seconds(n: int) -> datetime.timedelta:
    return datetime.timedelta(seconds=n)


def _timeout(left_s: float) -> datetime.timedelta:
    """``left_s`` rounded up to whole seconds, as a ``timedelta`` made once per value.

    A call waits once per round (NCCL's posting) and at its end; a
    ``timedelta`` made for each wait cost 6-14 us, a lookup a tenth of that.
    """
    return _seconds(int(left_s) + 1)


#: :func:`_wait_all` reads the clock before every this many works.
_CLOCK_EVERY = 16


def _wait_all(
    works: Sequence[Any], deadline: float, rank: int, what: str, *, host_wait: bool = True
) -> None:
    """Wait for ``works``; ``host_wait=False`` (NCCL) orders the CUDA stream instead.

    A timeout makes NCCL's ``wait`` block the host until the work is done;
    without one it only makes the current stream wait, and NCCL's own
    watchdog enforces the process group's timeout. The timeout handed to
    ``wait`` is the time left rounded up to whole seconds (:func:`_timeout`).
    The clock is read before every :data:`_CLOCK_EVERY` works, not before
    each: a cached call waits for every one of its operations, and reading
    the clock per work was a third of the waiting's host time at 256 ranks
    (1,385 works). Each ``wait`` ends at its own timeout, so a call may run
    past ``deadline`` by at most that many timeouts, and the next check
    raises.
    """
    n = len(works)
    for start in range(0, n, _CLOCK_EVERY):
        now = time.monotonic()
        if now >= deadline:
            raise CommError(f"rank {rank}: {what} ran past the timeout")
        td = _timeout(deadline - now)
        try:
            if host_wait:
                for w in works[start : start + _CLOCK_EVERY]:
                    w.wait(td)
            else:
                for w in works[start : start + _CLOCK_EVERY]:
                    w.wait()
        except CommError:
            raise
        except Exception as exc:  # torch raises RuntimeError / DistBackendError
            raise _wrap(exc, rank, what) from exc


def group_rank_size(group: Any = None) -> tuple[int, int]:
    """This process's rank in ``group`` (``None``: the default group) and the group's size.

    Raises a ``RuntimeError`` that says what to do when torch.distributed is
    not initialised.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialised: call init_process_group first "
            "(or start the job with torchrun or pathweave.runtime.launch.run_local)"
        )
    pg = group if group is not None else dist.group.WORLD
    return dist.get_rank(pg), dist.get_world_size(pg)


class Transport:
    """One process group as the executor sees it: ranks, backend, metadata exchange.

    Parameters
    ----------
    group
        A process group, or ``None`` for the default group.
    """

    def __init__(self, group: Any = None):
        self.rank, self.size = group_rank_size(group)
        pg = group if group is not None else dist.group.WORLD
        # Held weakly: a process group kept alive past destroy_process_group
        # keeps its gloo threads running into interpreter exit, where a work
        # they free (holding Python tensors) cannot take the GIL and the
        # process aborts ("terminate called without an active exception").
        self._pg_ref = weakref.ref(pg)
        self._is_default = group is None
        self.stand_in: Any = None
        self.backend = str(dist.get_backend(pg)).lower()
        self.nccl = "nccl" in self.backend
        self.global_ranks = (
            list(range(self.size))
            if group is None
            else [dist.get_global_rank(pg, r) for r in range(self.size)]
        )
        self.meta_device = (
            torch.device("cuda", torch.cuda.current_device()) if self.nccl else torch.device("cpu")
        )
        self.calls = 0
        #: Post round by round as NCCL does (set on gloo by tests to check that
        #: way of posting without a GPU).
        self.grouped_rounds = self.nccl
        self._pool: ThreadPoolExecutor | None = None
        #: The blocking calls' staging area, and the program whose views are kept
        #: with the views themselves (:meth:`_prepare`).
        self._staging: torch.Tensor | None = None
        self._pack: torch.Tensor | None = None
        self._memo: tuple[_Program, dict[int, Any]] | None = None
        #: In rounds posted as groups, send a round's operations with one peer in one
        #: direction as one message (:func:`_coalesce`).
        self.coalesce = True

    @property
    def coalesces(self) -> bool:
        """Whether calls post coalesced rounds (:attr:`grouped_rounds` and :attr:`coalesce`)."""
        return self.grouped_rounds and self.coalesce

    @property
    def process_group(self) -> Any:
        """The group the point-to-point operations are posted on (the group itself held weakly).

        Settable to a stand-in with the group's ``send``/``recv`` (``bench
        hostcost`` times the host work with a no-op one; tests wrap ``send``),
        held until set back to ``None`` (the group again). A stand-in should
        hold the group weakly too.
        """
        if self.stand_in is not None:
            return self.stand_in
        pg = self._pg_ref()
        if pg is None:
            raise CommError(f"rank {self.rank}: the process group of this transport was "
                            "destroyed (destroy_process_group)")
        return pg

    @process_group.setter
    def process_group(self, pg: Any) -> None:
        self.stand_in = pg

    @property
    def group(self) -> Any:
        """The group as given: ``None`` for the default group, else the (live) group."""
        if self._is_default:
            return None
        pg = self._pg_ref()
        if pg is None:
            raise CommError(f"rank {self.rank}: the process group of this transport was "
                            "destroyed (destroy_process_group)")
        return pg

    def _stream_pool(self) -> ThreadPoolExecutor:
        # Threads persist across calls; one per concurrently forwarded stream
        # (the pool starts a new thread whenever none is idle, up to the cap,
        # and a stream waiting for a thread could stall its peers).
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=_MAX_STREAMS,
                                            thread_name_prefix="pathweave-forward")
        return self._pool

    def messages(self, sched: RankSchedule) -> int:
        """The point-to-point operations a call of ``sched`` posts here (coalesced where
        rounds are posted as groups and :attr:`coalesce` is on)."""
        prog = _program(sched, self.coalesces)
        if self.coalesces:
            return sum(len(r) + len(s) for r, s, _, _ in prog.coalesced)
        return len(prog.recvs) + len(prog.sends)

    def next_tag_base(self) -> int:
        base = _TAG_BASE + (self.calls % _TAG_CALLS) * (1 << _TAG_CALL_BITS)
        self.calls += 1
        return base

    # ---------------------------------------------------------- metadata
    def exchange(self, row: np.ndarray, deadline: float) -> np.ndarray:
        """All-gather one ``int64`` row per rank; returns ``int64[size, len(row)]``.

        :func:`start_row_exchange`, waited for at once.
        """
        return start_row_exchange(row, self.group, deadline=deadline)()

    # ---------------------------------------------------------- data
    def run(
        self,
        sched: RankSchedule,
        send_bufs: Sequence[torch.Tensor],
        recv_bufs: Sequence[torch.Tensor],
        *,
        deadline: float,
        wait: bool,
        finish: Callable[[], None] | None = None,
        timing: Callable[[tuple[int, ...]], Any] | None = None,
        outputs: Sequence[torch.Tensor] = (),
        keep: bool = False,
    ) -> Handle:
        """Execute ``sched``; returns a handle (already waited for if ``wait``).

        ``timing`` (with ``wait``): a key of each receive op into a user
        buffer; the handle's ``timings`` then map each key to when the last
        of its receives completed, in seconds after this call started
        (:mod:`pathweave.runtime.telemetry`; no extra messages). Where rounds
        are posted as groups, a key's time is the end of the round of its
        last receive, read later through the handle's ``timings_later``
        (:class:`RoundClock`; on NCCL CUDA events, so no host sync here).

        Without ``wait`` on gloo the whole exchange (local copies, posting,
        forwarding, waiting, ``finish``) runs on a worker thread and this
        returns before any transfer; the message tags are taken here, in
        call order. On NCCL the rounds are posted here, and ``wait`` on
        their works orders the CUDA stream without blocking the host.
        ``outputs`` are the value of the handle's ``get_future()``.
        ``keep`` (with ``wait``): ``recv_bufs`` are the same memory every
        blocking call, so their views and the staging area are kept
        (:meth:`_prepare`).
        """
        prog = _program(sched, self.coalesces)
        tag_base = self.next_tag_base()
        if not wait and not self.nccl:
            # The work item holds the group until the exchange is done: a rank
            # with nothing of its own to wait for (it only forwards) may return
            # and destroy the group while its forwarding still runs here.
            pending = self._stream_pool().submit(
                self._run_behind, prog, sched, send_bufs, recv_bufs, tag_base, deadline, finish,
                self.process_group)
            return Handle([], rank=self.rank, deadline=deadline, pending=pending, outputs=outputs)
        views = self._prepare(prog, sched, send_bufs, recv_bufs, keep=keep and wait)
        if not self.grouped_rounds:
            t0 = time.monotonic()
            final = self._run_streams(prog, views, tag_base, deadline)
            handle = Handle(final, rank=self.rank, deadline=deadline, finish=finish,
                            outputs=outputs)
            if timing is not None:
                df = sched.dataflow()
                groups: dict[Any, list[Any]] = {}
                for i, w in zip(prog.user_recvs, final, strict=False):
                    groups.setdefault(timing(df.recvs[i]), []).append(w)
                handle.timings = self._time_groups(groups, t0, deadline)
                # A gloo work waited for once must not be waited for again.
                handle._works = final[len(prog.user_recvs):]
            handle.wait()
            return handle
        clock = stream_round = None
        # Not while a CUDA graph is being captured: an event recorded then is a node of
        # the graph, not a time (its words are zeros, nothing observed).
        if timing is not None and wait and not (self.nccl
                                                and torch.cuda.is_current_stream_capturing()):
            stream_round = _last_rounds(sched, prog, timing)
            clock = (CudaRoundClock if self.nccl else RoundClock)(set(stream_round.values()))
            clock.start()
        staged, finish = self._post_rounds(prog, views, tag_base, deadline, finish, clock)
        handle = Handle(staged, rank=self.rank, deadline=deadline, finish=finish,
                        host_wait=not self.nccl, outputs=outputs)
        if clock is not None and stream_round is not None:
            handle.timings_later = _round_reader(clock, stream_round)
        if wait or sched.forwards:
            handle.wait()
        return handle

    def _post_rounds(self, prog: _Program, views: list[torch.Tensor], tag_base: int,
                     deadline: float, finish: Callable[[], None] | None,
                     clock: RoundClock | None = None,
                     ) -> tuple[list[Any], Callable[[], None] | None]:
        """Post every round once the last is done (NCCL's way); the last round's works,
        and ``finish`` preceded by the last round's unpacks.

        With :attr:`coalesce` a round's operations with one peer in one
        direction go as one message (:func:`_coalesce`): packed into the
        pack area before the round is posted, unpacked once it is done.
        With a ``clock``, every round is marked once its works are waited for
        (before its unpacks), the last one here too (no works are returned).
        """
        staged: list[Any] = []
        unpacks = _NO_COPIES
        for t, (recvs, sends, packs, next_unpacks) in enumerate(prog.coalesced or prog.rounds):
            if staged:
                _wait_all(staged, deadline, self.rank, "forwarding", host_wait=not self.nccl)
            if clock is not None and t:
                clock.mark(t - 1)
            try:
                if unpacks is not _NO_COPIES:
                    _copy(views, unpacks)
                if packs is not _NO_COPIES:
                    _copy(views, packs)
                staged = self._post_round(views, recvs, sends, tag_base)
            except CommError:
                raise
            except Exception as exc:
                raise _wrap(exc, self.rank, "posting transfers") from exc
            unpacks = next_unpacks
        if clock is not None:
            # A gloo work waited for once must not be waited for again: none is returned.
            _wait_all(staged, deadline, self.rank, "waiting for the exchange",
                      host_wait=not self.nccl)
            clock.mark(len(prog.coalesced or prog.rounds) - 1)
            staged = []
        if unpacks is _NO_COPIES:
            return staged, finish
        last = unpacks

        def unpack_then_finish() -> None:
            _copy(views, last)
            if finish is not None:
                finish()

        return staged, unpack_then_finish

    def _prepare(self, prog: _Program, sched: RankSchedule, send_bufs: Sequence[torch.Tensor],
                 recv_bufs: Sequence[torch.Tensor], keep: bool = False) -> list[torch.Tensor]:
        """The local copies done, the staging area made: every operation's view.

        ``keep`` (a blocking call whose receive buffers are the group's
        reused scratch): the staging area is this transport's own, kept for
        the next blocking call, and the views of it and of the receive
        buffers are kept with the program (:meth:`_Program.views`). A blocking
        call is over before the next is posted, on NCCL in stream order (the
        next call's operations wait for the current stream, which holds this
        call's copy out of the scratch); an ``async_op`` call gets its own.
        """
        for sb, so, rb, ro, nb in prog.copies:
            recv_bufs[rb][ro : ro + nb].copy_(send_bufs[sb][so : so + nb])
        # A rank with no buffers of its own may still forward: its staging then
        # lives on the group's device.
        bufs = list(recv_bufs) or list(send_bufs)
        device = bufs[0].device if bufs else self.meta_device
        memo = None
        if keep:
            if self._memo is None or self._memo[0] is not prog:
                self._memo = (prog, {})
            memo = self._memo[1]
        staging = self._area("_staging", sched.staging_bytes, device, keep)
        pack = None
        if self.coalesces:
            pack = self._area("_pack", prog.pack_bytes, device, keep)
        return prog.views(staging, send_bufs, recv_bufs, memo, pack)

    def _area(self, attr: str, nbytes: int, device: Any, keep: bool) -> torch.Tensor | None:
        """``nbytes`` of scratch on ``device`` (None for none): with ``keep`` the one kept in
        ``attr`` (grown as needed), else a fresh one."""
        if not nbytes:
            return None
        kept = getattr(self, attr)
        if not keep or kept is None or kept.numel() < nbytes or kept.device != device:
            kept = torch.empty(nbytes, dtype=torch.uint8, device=device)
            if keep:
                setattr(self, attr, kept)
        return kept

    def drop_kept(self) -> None:
        """Forget the kept staging area and views (after a failed call: receives
        may still be posted into them)."""
        self._staging = None
        self._pack = None
        self._memo = None

    def _run_behind(self, prog: _Program, sched: RankSchedule, send_bufs: Sequence[torch.Tensor],
                    recv_bufs: Sequence[torch.Tensor], tag_base: int, deadline: float,
                    finish: Callable[[], None] | None, group: Any) -> None:
        """An ``async_op`` call's whole exchange on gloo, on a worker thread.

        ``group``: the process group, held (alive) until this returns.
        """
        views = self._prepare(prog, sched, send_bufs, recv_bufs)
        if self.grouped_rounds:
            final, finish = self._post_rounds(prog, views, tag_base, deadline, finish)
        else:
            final = self._run_streams(prog, views, tag_base, deadline)
        _wait_all(final, deadline, self.rank, "waiting for the exchange")
        if finish is not None:
            finish()

    def _time_groups(self, groups: dict[Any, list[Any]], t0: float,
                     deadline: float) -> dict[Any, float]:
        """When each group's works were all done (seconds after ``t0``), one thread per group.

        gloo's ``is_completed`` only turns true in ``wait``, so each group
        waits in a thread of its own (``wait`` releases the GIL); the first
        failure is raised once all groups are done.
        """

        def done(works: list[Any]) -> float:
            _wait_all(works, deadline, self.rank, "waiting for the exchange")
            return time.monotonic() - t0

        pool = self._stream_pool()
        futs = {k: pool.submit(done, ws) for k, ws in groups.items()}
        out, first_error = {}, None
        for k, f in futs.items():
            try:
                out[k] = f.result()
            except CommError as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return out

    def _run_streams(
        self, prog: _Program, views: list[torch.Tensor], tag_base: int, deadline: float
    ) -> list[Any]:
        """Post what needs nothing, forward each stream and feed each fed peer
        (:func:`_fed_sends`) on its own thread; returns the works still to wait
        for (when forwarding, the streams and feeders are done already).

        The last stream runs on the calling thread, which would otherwise
        only wait: one thread hand-off fewer per call.
        """
        pg, rank, recvs, sends = self.process_group, self.rank, prog.recvs, prog.sends

        def recv(i: int) -> Any:
            peer, order, v = recvs[i]
            return pg.recv([views[v]], peer, tag_base + order)

        def send(j: int) -> Any:
            peer, order, v = sends[j]
            return pg.send([views[v]], peer, tag_base + order)

        # A peer's forwards go out in the schedule's order, whichever stream's data came
        # first: the order the time model charges (pathweave.plan.rounds.pipeline_fill_s).
        turn: dict[int, int] = {}  # per peer, the first place not yet posted
        early: dict[int, set[int]] = {}  # per peer, places posted before their turn
        turned = threading.Condition()

        def forward(j: int) -> Any:
            if not prog.fwd_seq:  # a program made by hand: in its own order
                return send(j)
            peer, place = sends[j][0], prog.fwd_seq[j]
            give_up = time.monotonic() + _TURN_WAIT_S
            with turned:
                while turn.get(peer, 0) != place:
                    if failed.is_set():
                        raise CommError(f"rank {rank}: another stream failed")
                    now = time.monotonic()
                    if now >= deadline:
                        raise CommError(f"rank {rank}: forwarding ran past the timeout")
                    if now >= give_up:
                        break
                    turned.wait(min(_TURN_POLL_S, give_up - now))
                work = send(j)
                done = early.setdefault(peer, set())
                done.add(place)
                t = turn.get(peer, 0)
                while t in done:
                    done.discard(t)
                    t += 1
                turn[peer] = t
                turned.notify_all()
            return work

        try:
            posted = {i: recv(i) for i in prog.first_recvs}
            final = [posted[i] for i in prog.user_recvs]
            final += [send(j) for j in prog.first_sends]
        except Exception as exc:
            raise _wrap(exc, rank, "posting transfers") from exc
        if not prog.streams:
            return final
        failed = threading.Event()

        def feed(js: list[int]) -> None:
            # One peer's direct messages, _FEED_DEPTH at a time (_fed_sends).
            out: list[Any] = []
            for k, j in enumerate(js):
                if failed.is_set():
                    return
                if k >= _FEED_DEPTH:
                    _wait_all([out[k - _FEED_DEPTH]], deadline, rank, "sending")
                out.append(send(j))
            _wait_all(out[-_FEED_DEPTH:], deadline, rank, "sending")

        def stream(steps: list[tuple[tuple[int, ...], tuple[int, ...]]], after: list[int]
                   ) -> None:
            n = len(steps)
            nxt = next((j for j, a in enumerate(after) if a >= 0), n)
            rwork = {j: [posted[i] for i in steps[j][0]] for j in range(nxt)}
            fwd: dict[int, list[Any]] = {}
            freed = -1  # the forwards of steps up to this one are done

            def free(upto: int) -> None:
                # The forwards went out in step order on their links: once
                # done, their slots take the steps waiting for them.
                nonlocal freed, nxt
                for j in range(freed + 1, upto + 1):
                    _wait_all(fwd.pop(j), deadline, rank, "forwarding")
                freed = max(freed, upto)
                while nxt < n and after[nxt] <= freed:
                    rwork[nxt] = [recv(i) for i in steps[nxt][0]]
                    nxt += 1

            for c, (_, sends_c) in enumerate(steps):
                if failed.is_set():
                    return
                if c >= nxt:
                    free(after[c])
                _wait_all(rwork.pop(c), deadline, rank, "forwarding")
                fwd[c] = [forward(j) for j in sends_c]
                if c >= 1:
                    free(c - 1)
            free(n - 1)

        def guarded(job: Callable[..., None], *args: Any) -> None:
            try:
                job(*args)
            except CommError:
                failed.set()
                raise
            except Exception as exc:
                failed.set()
                raise _wrap(exc, rank, "forwarding") from exc

        jobs = list(zip(prog.streams, prog.after, strict=True))
        pool = self._stream_pool()
        futures = [pool.submit(guarded, feed, js) for js in prog.fed]
        futures += [pool.submit(guarded, stream, st, k) for st, k in jobs[:-1]]
        errors: list[BaseException] = []
        try:
            guarded(stream, *jobs[-1])
        except BaseException as exc:
            errors.append(exc)
        for fut in futures:
            left = max(0.0, deadline - time.monotonic())
            try:
                fut.result(timeout=left + 1.0)  # the stream's own waits end at the deadline
            except BaseException as exc:
                failed.set()
                errors.append(exc)
        if errors:
            first = errors[0]
            if isinstance(first, CommError):
                raise first
            raise CommError(f"rank {rank}: forwarding failed: {first}") from first
        return final

    def _post_round(
        self, views: list[torch.Tensor], recvs: list[tuple[int, int, int]],
        sends: list[tuple[int, int, int]], tag_base: int,
    ) -> list[Any]:
        """Post one round, receives first; its works.

        On NCCL one ``batch_isend_irecv`` (one NCCL group); elsewhere the
        process group's own ``recv``/``send``, which is what
        ``batch_isend_irecv`` does on a backend that cannot coalesce, minus
        ``isend``'s argument checks on views made by this module.
        """
        if self.nccl:
            g, granks = self.group, self.global_ranks
            ops = [dist.P2POp(dist.irecv, views[v], granks[p], g, tag_base + k)
                   for p, k, v in recvs]
            ops += [dist.P2POp(dist.isend, views[v], granks[p], g, tag_base + k)
                    for p, k, v in sends]
            works = dist.batch_isend_irecv(ops) if ops else []
            return [w for w in works if w is not None]
        pg = self.process_group
        works = [pg.recv([views[v]], p, tag_base + k) for p, k, v in recvs]
        works += [pg.send([views[v]], p, tag_base + k) for p, k, v in sends]
        return works


def _last_rounds(sched: RankSchedule, prog: _Program,
                 timing: Callable[[tuple[int, ...]], Any]) -> dict[Any, int]:
    """Per ``timing`` key, the round of its last receive into a user buffer of this rank."""
    df = sched.dataflow()
    rnd = np.searchsorted(sched.recv_ptr, np.asarray(prog.user_recvs, dtype=np.int64),
                          side="right") - 1
    out: dict[Any, int] = {}
    for i, t in zip(prog.user_recvs, rnd.tolist(), strict=True):
        key = timing(df.recvs[i])
        if out.get(key, -1) < t:
            out[key] = t
    return out


def _round_reader(clock: RoundClock, stream_round: dict[Any, int]
                  ) -> Callable[[], dict[Any, float] | None]:
    """``Handle.timings_later`` of a round-timed call: each key at its last round's end."""

    def read() -> dict[Any, float] | None:
        ends = clock.ends()
        if ends is None:
            return None
        return {k: ends[t] for k, t in stream_round.items() if t in ends}

    return read


def start_row_exchange(
    row: np.ndarray, group: Any = None, *, deadline: float
) -> Callable[[], np.ndarray]:
    """Start an all-gather of one ``int64`` row per rank; returns ``wait() -> int64[size, width]``.

    Every rank of ``group`` calls it with a row of the same width; the
    caller may do local work before ``wait()`` while the rows travel.

    On gloo a gather to the group's first rank (straight into the rows of
    the result) and a broadcast of the result: ``2 (N - 1)`` messages where
    an all-to-all of the row repeated takes ``N (N - 1)`` and gloo's ring
    all-gather ``N - 1`` dependent steps. Measured on 8 gloo ranks on 2
    cores (median per call): 0.85 ms, against 3.7 ms for the all-to-all and
    11.7 ms for the all-gather (``docs/runtime.md``). The other ranks post
    both steps at once; the first rank posts the broadcast in ``wait()``,
    once its gather is done (gloo may run a group's collectives on
    concurrent threads, so posting early could broadcast stale rows). On
    NCCL a plain ``all_gather_into_tensor``.

    Failures, in posting or waiting, raise :class:`~pathweave.errors.CommError`;
    so does a ``wait()`` that runs past ``deadline`` (``time.monotonic()``
    seconds).

    Examples
    --------
    >>> from pathweave.runtime.launch import run_local
    >>> from pathweave.runtime.executor import _doc_row_exchange
    >>> run_local(_doc_row_exchange, 2)
    [[[0, 10], [1, 11]], [[0, 10], [1, 11]]]
    """
    pg = group if group is not None else dist.group.WORLD
    rank, n = dist.get_rank(pg), dist.get_world_size(pg)
    nccl = "nccl" in str(dist.get_backend(pg)).lower()
    width = int(row.size)
    mine = torch.from_numpy(np.ascontiguousarray(row, dtype=np.int64).reshape(-1))
    what = "metadata exchange"
    try:
        if nccl:
            dev = torch.device("cuda", torch.cuda.current_device())
            out = torch.empty(n * width, dtype=torch.int64, device=dev)
            gathered = dist.all_gather_into_tensor(out, mine.to(dev), group=group, async_op=True)

            def wait_nccl() -> np.ndarray:
                _wait_all([gathered], deadline, rank, what, host_wait=False)
                try:
                    return out.cpu().numpy().reshape(n, width)
                except Exception as exc:
                    raise _wrap(exc, rank, what) from exc

            return wait_nccl
        res = torch.empty(n, width, dtype=torch.int64)
        root = dist.get_global_rank(pg, 0) if group is not None else 0
        rows = list(res.unbind(0)) if rank == 0 else None
        gather = dist.gather(mine, rows, dst=root, group=group, async_op=True)
        bcast = None if rank == 0 else dist.broadcast(res, root, group=group, async_op=True)
    except CommError:
        raise
    except Exception as exc:
        raise _wrap(exc, rank, what) from exc

    def wait_gloo() -> np.ndarray:
        _wait_all([gather], deadline, rank, what)
        work = bcast
        if work is None:
            try:
                work = dist.broadcast(res, root, group=group, async_op=True)
            except Exception as exc:
                raise _wrap(exc, rank, what) from exc
        _wait_all([work], deadline, rank, what)
        return res.numpy()

    return wait_gloo


def _doc_row_exchange(rank: int, world_size: int) -> list[list[int]]:
    """Every rank sends ``[rank, 10 + rank]`` (used by :func:`start_row_exchange`)."""
    wait = start_row_exchange(np.array([rank, 10 + rank]), deadline=time.monotonic() + 60)
    return wait().tolist()

