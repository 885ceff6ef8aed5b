"""From a plan to per-rank schedules of chunked point-to-point operations.

Pure numpy: no torch, no communication, so every part can be checked in one
process. Every rank builds the same global tables from the same inputs and
keeps the rows that concern it.

Vocabulary
----------
*pair stream*
    The bytes rank ``s`` sends to rank ``d`` in one call, numbered
    ``0 .. L[s, d]``. Its *segments* say where each run of them lives: in
    which send buffer of ``s`` and at which byte offset, and in which receive
    buffer of ``d`` (one segment per pair for ``all_to_all_single``; one per
    message for ``batch_isend_irecv``).
*fragment*
    A contiguous run of a pair stream that travels on one path; its *route*
    is the path's sequence of ranks (the GPU vertices along it: the source,
    any forwarding GPUs, the destination).
*chunk*
    Every fragment, direct or forwarded, is cut into chunks of
    ``chunk_bytes`` that move hop by hop as a pipeline.
*piece*
    A chunk, further cut where a segment ends (a piece has one source
    address and one destination address). Pieces of one chunk move together.
*message*
    One hop of a fragment's pieces that move in the same round, lie in one
    segment and, for a forwarded fragment, in consecutive staging slots (no
    slot wrap): they are contiguous at both ends of every hop. A direct
    fragment that rounds do not pace
    (:func:`pathweave.plan.rounds.unpaced_direct`) moves whole in round 0,
    one message per segment.
*round*
    Every round is a slice of the whole call: with ``R`` entry rounds (the
    largest fragment enters ``window // 2`` chunks per round), hop ``h`` of
    chunk ``c`` of a fragment of ``k`` chunks moves in round
    ``floor(c * R / k) + h``. Each fragment so moves about ``1/R`` of its
    bytes per round, and the links it shares carry it in proportion to its
    bytes, as the plan and the simulator assume. Every send of a round has
    its matching receive in the same round on the peer.
*staging*
    A forwarding rank holds ``w_f`` chunk slots per stream ``f`` it
    forwards (the stream's window: ``window`` for the largest fragment, in
    proportion to the chunks for smaller ones, at least 2 or all of them);
    chunk ``c`` uses slot ``c % w_f``. This is the credit window: a sender
    can only push chunk ``c + w_f`` once the forwarding rank has re-posted a
    receive into the slot chunk ``c`` left, and in the rounds chunk
    ``c + w_f`` enters at least two rounds after chunk ``c``.

Why it is deadlock-free
-----------------------
Rounds serve two executors. Round by round (NCCL): a rank executes rounds
in order and, before posting round ``t``, waits only for operations of
round ``t - 1`` that touch its staging memory. Round 0 needs no wait, so
every rank posts it; each of its operations is matched by one posted on the
peer, so all of them complete; by induction every round completes. Per
stream (gloo, :meth:`RankSchedule.dataflow`): everything that depends on
nothing is posted first, and a forwarding rank's wait at chunk ``c`` is
always on a message whose other end is posted at a smaller chunk, or at the
same chunk one hop upstream, so by induction over (chunk, hop) every
message completes. The schedule checks both rest on are
:func:`check_schedules`; ``docs/runtime.md`` has the full argument.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pathweave.errors import PlanError
from pathweave.fabric import PathKind, PathSet
from pathweave.plan.rounds import entry_round, pacing, route_ranks, unpaced_direct

__all__ = [
    "Dataflow",
    "Fragments",
    "RankSchedule",
    "Segments",
    "build_schedule",
    "build_schedules",
    "check_schedules",
    "path_routes",
    "split_fragments",
]

#: Buffer codes in op tables: ``buf >= 0`` is a user buffer index, STAGING is the staging area.
STAGING = -1
#: Messages one directed rank pair may carry in one call: the executor's tag
#: range per call (a message's tag is the call's base plus its order on the pair).
MAX_PAIR_MESSAGES = 1 << 21


@dataclass(frozen=True, eq=False)
class Fragments:
    """The pieces of one call's pair streams, sorted by pair (int64 arrays, made so).

    Attributes
    ----------
    pair : int64[F]
        ``s * N + d`` of each fragment. Per pair, the fragments' bytes add up to
        the pair stream and take consecutive runs of it in the given order;
        pairs ``s == d`` have none (their segments are local copies).
    nbytes : int64[F]
        Bytes of each fragment (``0``: dropped).
    route : int64[F, K]
        Ranks each fragment crosses, padded with -1: ``route[i, 0] = s``, the
        last entry ``d``.
    links : int64[F, K] or None
        Each fragment's fabric links (its path's, padded with -1). Given, a
        direct fragment that rounds do not pace goes whole in round 0
        (:func:`pathweave.plan.rounds.unpaced_direct`); ``None``: every
        fragment is paced.
    """

    pair: np.ndarray
    nbytes: np.ndarray
    route: np.ndarray
    links: np.ndarray | None = None

    def __post_init__(self) -> None:
        for name in ("pair", "nbytes", "route", "links"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, np.asarray(v, dtype=np.int64))


@dataclass(frozen=True, eq=False)
class Segments:
    """Where each pair stream's bytes live, as flat arrays sorted by pair, then stream position.

    Attributes
    ----------
    num_ranks : int
    pair_ptr : int64[num_ranks**2 + 1]
        Segments of pair ``p = s * num_ranks + d`` are rows ``pair_ptr[p]:pair_ptr[p+1]``,
        in stream order; they tile ``[0, L[s, d])`` without gaps.
    length : int64[S]
        Bytes of each segment (> 0).
    send_buf, send_off : int64[S]
        Send buffer index on ``s`` and byte offset in it.
    recv_buf, recv_off : int64[S]
        Receive buffer index on ``d`` and byte offset in it.
    """

    num_ranks: int
    pair_ptr: np.ndarray
    length: np.ndarray
    send_buf: np.ndarray
    send_off: np.ndarray
    recv_buf: np.ndarray
    recv_off: np.ndarray

    @property
    def pair_bytes(self) -> np.ndarray:
        """``int64[N, N]``: bytes of every pair stream."""
        n = self.num_ranks
        pair = np.repeat(np.arange(n * n), np.diff(self.pair_ptr))
        out = np.bincount(pair, weights=self.length, minlength=n * n)
        return out.astype(np.int64).reshape(n, n)

    @classmethod
    def all_to_all(cls, in_bytes: np.ndarray, out_bytes: np.ndarray | None = None) -> Segments:
        """Segments of ``all_to_all_single``: one per pair with bytes, buffer 0 on both ends.

        ``in_bytes[s, d]`` is the byte count rank ``s`` sends to ``d`` (its input
        split times the row size); ``out_bytes[d, s]`` is what ``d`` expects from
        ``s`` (defaults to ``in_bytes.T``; they must agree). Offsets are the
        running sums along each rank's split list.

        Examples
        --------
        >>> import numpy as np
        >>> seg = Segments.all_to_all(np.array([[2, 3], [0, 4]]))
        >>> seg.send_off.tolist(), seg.recv_off.tolist()
        ([0, 2, 0], [0, 0, 3])
        """
        ib = np.asarray(in_bytes, dtype=np.int64)
        n = ib.shape[0]
        ob = ib.T if out_bytes is None else np.asarray(out_bytes, dtype=np.int64)
        if not np.array_equal(ob, ib.T):
            raise ValueError("out_bytes must be the transpose of in_bytes")
        send_off = np.cumsum(ib, axis=1) - ib  # [s, d]: offset of d's block in s's input
        recv_off = (np.cumsum(ob, axis=1) - ob).T  # [s, d]: offset of s's block in d's output
        flat = ib.reshape(-1)
        keep = np.flatnonzero(flat > 0)
        ptr = np.zeros(n * n + 1, dtype=np.int64)
        ptr[1:] = np.cumsum(flat > 0)
        zeros = np.zeros(keep.size, dtype=np.int64)
        return cls(
            n,
            ptr,
            flat[keep],
            zeros,
            send_off.reshape(-1)[keep],
            zeros.copy(),
            recv_off.reshape(-1)[keep],
        )


@dataclass(frozen=True, eq=False)
class RankSchedule:
    """What one rank does in one call.

    Operation tables hold one row per message, sorted by ``(round, order)``;
    ``order`` is the message's index among all messages of its directed rank
    pair, so both ends of a pair post their messages in the same order (NCCL
    matches point-to-point messages by order; gloo by tag, and the tag is
    ``tag_base + order``).

    Attributes
    ----------
    rank, num_rounds : int
    send_round, send_peer, send_order, send_buf, send_off, send_bytes : int64[S]
        Sends; ``send_buf`` is a send-buffer index or :data:`STAGING`.
    recv_round, recv_peer, recv_order, recv_buf, recv_off, recv_bytes : int64[R]
        Receives; ``recv_buf`` is a receive-buffer index or :data:`STAGING`.
    send_ptr, recv_ptr : int64[num_rounds + 1]
        Rows of round ``t`` are ``ptr[t]:ptr[t + 1]``.
    copy_send_buf, copy_send_off, copy_recv_buf, copy_recv_off, copy_bytes : int64[C]
        Local copies (a rank's bytes to itself).
    staging_bytes : int
        Size of this rank's staging area.
    forwards : bool
        Whether any rank forwards in this call (the same on every rank).
    window : int
        Staging slots of the call's largest forwarded stream.
    stream_window : int64[F]
        Staging slots of each fragment's stream (:func:`pathweave.plan.rounds.pacing`: in
        proportion to its chunks, at least 2 or all of them; the same on
        every rank).
    send_stream, send_chunk, recv_stream, recv_chunk : int64[S], int64[S], int64[R], int64[R]
        For staged operations, the forwarded stream (a fragment id, the same on
        every rank) and the last chunk of it the operation carries (a message
        carries a stream's chunks of one round up to a slot wrap); -1 for
        operations on user buffers. Chunk ``c`` of stream ``f`` sits in slot
        ``c % stream_window[f]``.
    send_final : bool[S] or None
        Whether the peer receives the send into its receive buffer (its last
        hop) rather than into its staging area; None where not known (a
        schedule made by hand), which the gloo executor then posts at once.
    """

    rank: int
    num_rounds: int
    send_round: np.ndarray
    send_peer: np.ndarray
    send_order: np.ndarray
    send_buf: np.ndarray
    send_off: np.ndarray
    send_bytes: np.ndarray
    recv_round: np.ndarray
    recv_peer: np.ndarray
    recv_order: np.ndarray
    recv_buf: np.ndarray
    recv_off: np.ndarray
    recv_bytes: np.ndarray
    send_ptr: np.ndarray
    recv_ptr: np.ndarray
    copy_send_buf: np.ndarray
    copy_send_off: np.ndarray
    copy_recv_buf: np.ndarray
    copy_recv_off: np.ndarray
    copy_bytes: np.ndarray
    staging_bytes: int
    forwards: bool
    window: int
    stream_window: np.ndarray
    send_stream: np.ndarray
    send_chunk: np.ndarray
    recv_stream: np.ndarray
    recv_chunk: np.ndarray
    send_final: np.ndarray | None = None

    def __repr__(self) -> str:
        return (
            f"RankSchedule(rank={self.rank}, rounds={self.num_rounds}, sends={self.num_sends}, "
            f"recvs={self.num_recvs}, copies={self.copy_bytes.size}, "
            f"staging_bytes={self.staging_bytes})"
        )

    @property
    def num_sends(self) -> int:
        return int(self.send_peer.size)

    @property
    def num_recvs(self) -> int:
        return int(self.recv_peer.size)

    def rounds(self) -> list[tuple[list[tuple[int, ...]], list[tuple[int, ...]]]]:
        """Per round, the receives and sends as plain tuples ``(peer, order, buf, off, bytes)``.

        The executor walks these; plain ints keep its per-operation cost low.
        """
        cols_r = (self.recv_peer, self.recv_order, self.recv_buf, self.recv_off, self.recv_bytes)
        cols_s = (self.send_peer, self.send_order, self.send_buf, self.send_off, self.send_bytes)
        recvs = list(zip(*(c.tolist() for c in cols_r), strict=True))
        sends = list(zip(*(c.tolist() for c in cols_s), strict=True))
        rp, sp = self.recv_ptr.tolist(), self.send_ptr.tolist()
        return [
            (recvs[rp[t] : rp[t + 1]], sends[sp[t] : sp[t + 1]]) for t in range(self.num_rounds)
        ]

    def dataflow(self) -> Dataflow:
        """The operations with their dependencies, for executing each stream on its own.

        See :class:`Dataflow`. Computed once per schedule and kept with it.
        """
        cached = self.__dict__.get("_dataflow")
        if cached is None:
            cached = _dataflow(self)
            object.__setattr__(self, "_dataflow", cached)
        return cached


@dataclass(frozen=True, eq=False)
class Dataflow:
    """One rank's operations grouped for executing each forwarded stream on its own.

    Operations are plain tuples ``(peer, order, buf, off, bytes)`` (``buf``:
    a buffer index or :data:`STAGING`), receives and sends each in schedule
    order (round, then order). ``streams`` holds, per stream this rank
    forwards, its *steps* in chunk order: step ``c`` is ``(receives, sends)``,
    the indices of the pieces of chunk ``c`` arriving into its staging slot
    and of their forwards (same bytes, same boundaries); ``slots`` is the
    stream's number of staging slots (chunk ``c`` uses slot ``c % slots``).

    The executor (:meth:`pathweave.runtime.executor.Transport.run`) posts
    ``first_recvs`` (every receive into a user buffer, and the receives of
    each stream's first ``slots`` chunks), then ``first_sends`` (every send
    from a user buffer); then each stream advances on its own: wait for the
    receives of chunk ``c``, post their forwards, wait for the forwards of
    chunk ``c - 1``, post the receives of chunk ``c - 1 + slots`` into the
    slot that chunk ``c - 1`` left.
    """

    recvs: list[tuple[int, ...]]
    sends: list[tuple[int, ...]]
    first_recvs: list[int]
    first_sends: list[int]
    streams: list[list[tuple[tuple[int, ...], tuple[int, ...]]]]
    slots: list[int]
    after: list[list[int]]


def _dataflow(s: RankSchedule) -> Dataflow:
    cols_r = (s.recv_peer, s.recv_order, s.recv_buf, s.recv_off, s.recv_bytes)
    cols_s = (s.send_peer, s.send_order, s.send_buf, s.send_off, s.send_bytes)
    recvs = list(zip(*(c.tolist() for c in cols_r), strict=True))
    sends = list(zip(*(c.tolist() for c in cols_s), strict=True))
    steps_r: dict[int, dict[int, list[int]]] = {}
    steps_s: dict[int, dict[int, list[int]]] = {}
    for i in np.flatnonzero(s.recv_stream >= 0).tolist():
        steps_r.setdefault(int(s.recv_stream[i]), {}).setdefault(int(s.recv_chunk[i]), []).append(i)
    for j in np.flatnonzero(s.send_stream >= 0).tolist():
        steps_s.setdefault(int(s.send_stream[j]), {}).setdefault(int(s.send_chunk[j]), []).append(j)
    if sorted(steps_r) != sorted(steps_s):
        raise ValueError(f"rank {s.rank}: staged receives and forwards are of different streams")
    streams, slots, after = [], [], []
    first_recvs = [i for i, op in enumerate(recvs) if op[2] != STAGING]
    for f in sorted(steps_r):
        rs, ss = steps_r[f], steps_s[f]
        keys = sorted(rs)
        if sorted(ss) != keys:
            raise ValueError(f"rank {s.rank}: stream {f} forwards other chunks than it receives")
        for c in keys:
            got = sorted((s.recv_off[i], s.recv_bytes[i]) for i in rs[c])
            put = sorted((s.send_off[j], s.send_bytes[j]) for j in ss[c])
            if got != put:
                raise ValueError(f"rank {s.rank}: chunk {c} of stream {f} is forwarded "
                                 "with other bytes than it arrived with")
        w = int(s.stream_window[f])
        # Step j (its last chunk keys[j]) fills slots that chunks up to
        # keys[j] - w held: it may be received once the step carrying chunk
        # keys[j] - w (the first step whose last chunk is at least that) was
        # forwarded. A message spans at most w chunks, so that step is earlier.
        need = np.searchsorted(keys, np.asarray(keys) - w, side="left")
        dep = np.where(np.asarray(keys) - w < 0, -1, need).tolist()
        streams.append([(tuple(rs[c]), tuple(ss[c])) for c in keys])
        slots.append(min(w, keys[-1] + 1))
        after.append(dep)
        first_recvs += [i for c, d in zip(keys, dep, strict=True) if d < 0 for i in rs[c]]
    first_recvs.sort()
    first_sends = [j for j, op in enumerate(sends) if op[2] != STAGING]
    return Dataflow(recvs, sends, first_recvs, first_sends, streams, slots, after)


# ------------------------------------------------------------------- routes
def path_routes(paths: PathSet) -> np.ndarray:
    """``int32[num_paths, K]``: the ranks along each path, for paths the data plane runs.

    The routes are :func:`pathweave.plan.rounds.route_ranks` (the GPU
    vertices of each path: ``[s, x, y, d]`` for a rail path via forwarding
    GPUs ``x`` and ``y``, ``[s, d]`` for a spine path), checked.

    A route is all the data plane controls: a send ``[s, d]`` takes the
    transport's route. So a path set whose paths the data plane cannot
    run raises: paths of a modelling rule (``pcie``, UCX's route with no
    GPU forward; ``ecmp``, every spine: :data:`pathweave.fabric.paths.MODEL_KINDS`),
    or a spine path sharing its route with another path of its pair.

    Examples
    --------
    A path set the data plane runs gets its routes unchanged; one with a
    modelling rule's paths is refused:

    >>> import pathweave as pw
    >>> from pathweave.plan.rounds import route_ranks
    >>> ps = pw.fabric.candidate_paths(pw.fabric.preset("h100-2x4"))
    >>> bool((path_routes(ps) == route_ranks(ps)).all())
    True
    >>> path_routes(pw.fabric.candidate_paths(ps.fabric, (*ps.kinds, "pcie")))
    Traceback (most recent call last):
    ...
    pathweave.errors.PlanError: 24 'pcie' paths of rule 'pcie' (kinds ('direct', ..., 'pcie')): ...
    """
    from pathweave.fabric.paths import MODEL_KINDS

    def build() -> np.ndarray:
        out = route_ranks(paths)
        _refuse_shared_spine_routes(paths, out)
        return out

    model = {"pcie": paths.kind == PathKind.PCIE,
             "ecmp": (paths.kind == PathKind.SPINE) & ("ecmp" in paths.kinds)}
    for rule, bad in model.items():
        if bad.any():
            raise PlanError(f"{int(bad.sum())} {PathKind(paths.kind[bad][0]).label!r} paths of "
                            f"rule {rule!r} (kinds {paths.kinds}): the data plane cannot run "
                            f"them ({MODEL_KINDS[rule]})")

    return paths.derived("runtime.path_routes", build)


def _refuse_shared_spine_routes(paths: PathSet, routes: np.ndarray) -> None:
    # A spine path's route is [s, d]: beside another [s, d] path of its pair
    # (a second spine, a PXN or matched rail path), the split between them is
    # the transport's, not the plan's.
    spine = paths.kind == PathKind.SPINE
    if not spine.any():
        return
    n = paths.num_ranks
    pair = paths.src.astype(np.int64) * n + paths.dst
    plain = routes[:, 2] < 0 if routes.shape[1] > 2 else np.ones(paths.num_paths, dtype=bool)
    shared = spine & (np.bincount(pair[plain], minlength=n * n)[pair] > 1)
    if shared.any():
        s, d = int(paths.src[shared][0]), int(paths.dst[shared][0])
        same = [p for p in paths.pair_paths(s, d) if plain[p]]
        raise PlanError(
            f"pair ({s}, {d}): paths {same} ("
            + "; ".join(paths.describe(p).split(":")[0] for p in same)
            + f") share the route [{s}, {d}], so the transport, not the plan, would split "
            f"their bytes; {int(shared.sum())} spine paths are like that (kinds {paths.kinds})")


# ---------------------------------------------------------------- fragments
#: Fixed-point precision of a pair's split fractions (integer arithmetic keeps
#: every rank's byte counts identical).
_FRAC_BITS = 20


def split_fragments(
    flow_pair: np.ndarray,
    flow_path: np.ndarray,
    flow_weight: np.ndarray,
    pair_bytes: np.ndarray,
    *,
    min_split_bytes: int = 0,
    default_path: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split each pair's actual bytes over its planned paths in the planned proportions.

    A plan made for one demand (e.g. a quantised one) serves any demand with
    the same pairs: pair ``p`` gets ``floor(L_p * F_i)`` bytes up to its
    ``i``-th flow, ``F_i`` the flow's cumulative share in 20-bit fixed point.
    A pair with fewer than ``min_split_bytes`` goes whole on its heaviest
    path (the NIMBLE size threshold: splitting small messages costs more
    than it gains). A pair with bytes but no flow uses ``default_path[p]``.

    Parameters
    ----------
    flow_pair, flow_path, flow_weight
        The plan's flows sorted by pair then path: pair ``s * N + d``, path id,
        and weight (bytes in the plan).
    pair_bytes
        ``int64[N, N]`` actual bytes; the diagonal is ignored.

    Returns
    -------
    frag_pair, frag_path, frag_bytes : int64 arrays, sorted by pair then path

    Examples
    --------
    >>> import numpy as np
    >>> L = np.array([[0, 10], [3, 0]])
    >>> split_fragments([1, 1, 2], [7, 8, 9], [1, 3, 5], L)
    (array([1, 1, 2]), array([7, 8, 9]), array([2, 8, 3]))
    >>> split_fragments([1, 1, 2], [7, 8, 9], [1, 3, 5], L, min_split_bytes=16)[2]
    array([10,  3])
    """
    fp = np.asarray(flow_pair, dtype=np.int64)
    fpath = np.asarray(flow_path, dtype=np.int64)
    w = np.asarray(flow_weight, dtype=np.float64)
    lb = np.asarray(pair_bytes, dtype=np.int64)
    n = lb.shape[0]
    flat = lb.reshape(-1).copy()
    flat[:: n + 1] = 0
    live = w > 0
    fp, fpath, w = fp[live], fpath[live], w[live]
    tot = np.bincount(fp, weights=w, minlength=n * n)
    csum = np.cumsum(w)
    first = np.r_[True, fp[1:] != fp[:-1]] if fp.size else np.zeros(0, dtype=bool)
    base = np.maximum.accumulate(np.where(first, csum - w, 0.0)) if fp.size else csum
    cum = csum - base
    q_hi = np.rint(cum / tot[fp] * (1 << _FRAC_BITS)).astype(np.int64)
    last = np.r_[fp[1:] != fp[:-1], True] if fp.size else first
    q_hi[last] = 1 << _FRAC_BITS  # the last flow of a pair ends exactly at the pair's end
    q_lo = np.where(first, 0, np.r_[0, q_hi[:-1]])
    lp = flat[fp]
    nb = ((lp * q_hi) >> _FRAC_BITS) - ((lp * q_lo) >> _FRAC_BITS)
    # Size threshold: small pairs go whole on their heaviest path (lowest id on ties).
    small = (lp > 0) & (lp < min_split_bytes)
    if small.any():
        order = np.lexsort((fpath, -w, fp))
        head = np.r_[True, fp[order][1:] != fp[order][:-1]]
        heavy = np.zeros(fp.size, dtype=bool)
        heavy[order[head]] = True
        nb = np.where(small, np.where(heavy, lp, 0), nb)
    # Pairs with bytes the plan never saw.
    orphan = np.flatnonzero((flat > 0) & (tot == 0))
    if orphan.size:
        if default_path is None:
            s, d = divmod(int(orphan[0]), n)
            raise ValueError(f"pair ({s}, {d}) has {int(flat[orphan[0]])} bytes but no path")
        fp = np.r_[fp, orphan]
        fpath = np.r_[fpath, np.asarray(default_path, dtype=np.int64)[orphan]]
        nb = np.r_[nb, flat[orphan]]
        key = np.lexsort((fpath, fp))
        fp, fpath, nb = fp[key], fpath[key], nb[key]
    keep = nb > 0
    return fp[keep], fpath[keep], nb[keep]


# ------------------------------------------------------------------- building
def _global_hops(
    segments: Segments,
    frags: Fragments,
    chunk_bytes: int,
    window: int,
    whole_streams: bool = False,
) -> dict[str, np.ndarray]:
    """The table of every message of the call: one row per (piece, hop)."""
    n = segments.num_ranks
    keep = frags.nbytes > 0
    frag_pair, frag_bytes, route = frags.pair[keep], frags.nbytes[keep], frags.route[keep]
    nf = frag_pair.size
    hops = (route >= 0).sum(axis=1) - 1 if nf else np.zeros(0, dtype=np.int64)
    whole = None
    if frags.links is not None:
        whole = unpaced_direct(route, frags.links[keep], n)
    # Fragment start inside its pair stream: running sum within each pair.
    csum = np.cumsum(frag_bytes) - frag_bytes
    first = np.r_[True, frag_pair[1:] != frag_pair[:-1]] if nf else np.zeros(0, bool)
    pair_base = np.maximum.accumulate(np.where(first, csum, 0)) if nf else csum
    frag_start = csum - pair_base
    # Chunks: every fragment, direct or forwarded, is cut every chunk_bytes.
    fwd = hops > 1
    step = np.full(nf, chunk_bytes, dtype=np.int64)
    nchunk = -(-frag_bytes // step)
    rounds, stream_window = pacing(nchunk, window)
    if whole_streams:
        stream_window = nchunk.astype(np.int64)
    cf = np.repeat(np.arange(nf), nchunk)
    cidx = np.arange(cf.size) - np.repeat(np.cumsum(nchunk) - nchunk, nchunk)
    c_lo = frag_start[cf] + cidx * step[cf]
    # Cut chunks where segments start inside them.
    seg_pair = np.repeat(np.arange(n * n), np.diff(segments.pair_ptr))
    seg_start = np.cumsum(segments.length) - segments.length
    seg_first = segments.pair_ptr[seg_pair]
    seg_start = seg_start - (np.cumsum(segments.length) - segments.length)[seg_first]
    # Piece boundaries per pair: chunk starts plus segment starts (stream
    # positions); the diagonal's segments are local copies, not pieces.
    off_diag = seg_pair % (n + 1) != 0
    b_pair = np.concatenate([frag_pair[cf], seg_pair[off_diag]])
    b_pos = np.concatenate([c_lo, seg_start[off_diag]])
    order = np.lexsort((b_pos, b_pair))
    b_pair, b_pos = b_pair[order], b_pos[order]
    uniq = np.ones(b_pair.size, dtype=bool)
    uniq[1:] = (b_pair[1:] != b_pair[:-1]) | (b_pos[1:] != b_pos[:-1])
    b_pair, b_pos = b_pair[uniq], b_pos[uniq]
    pb = segments.pair_bytes.reshape(-1)
    nxt_same = np.zeros(b_pair.size, dtype=bool)
    nxt_same[:-1] = b_pair[1:] == b_pair[:-1]
    p_lo = b_pos
    p_hi = np.where(nxt_same, np.r_[b_pos[1:], 0][: b_pos.size], pb[b_pair])
    live = p_hi > p_lo
    p_pair, p_lo, p_hi = b_pair[live], p_lo[live], p_hi[live]
    # Which chunk and which segment each piece belongs to.
    ckey = np.argsort(frag_pair[cf], kind="stable")  # chunks are already pair-sorted
    ck_pair, ck_lo = frag_pair[cf][ckey], c_lo[ckey]
    ci = _locate(ck_pair, ck_lo, p_pair, p_lo)
    ci = ckey[ci]
    si = _locate(seg_pair, seg_start, p_pair, p_lo)
    f = cf[ci]
    c = cidx[ci]
    # Every round is a slice of the whole call: chunk c of a fragment of k
    # chunks enters in round floor(c * R / k), so each fragment moves about
    # 1/R of its bytes per round and shares its links in proportion to them.
    rnd0 = entry_round(c, nchunk[f], rounds, None if whole is None else whole[f])
    # Pieces of one fragment that move in the same rounds, lie in one segment
    # and are contiguous in staging (forwarded fragments: no slot wrap in
    # between) are contiguous at every end of every hop: one message carries
    # them (each link carries the same bytes in the same rounds; the host
    # posts one operation instead of one per chunk). Such a message's
    # ``chunk`` is the last chunk it carries.
    slot_off = (c % stream_window[f]) * chunk_bytes + (p_lo - c_lo[ci])
    run = np.zeros(p_lo.size, dtype=bool)
    run[1:] = ((f[1:] == f[:-1]) & (rnd0[1:] == rnd0[:-1]) & (si[1:] == si[:-1])
               & ((hops[f[1:]] == 1) | (slot_off[1:] == slot_off[:-1] + (p_hi - p_lo)[:-1])))
    if run.any():
        head = np.flatnonzero(~run)
        tail = np.r_[head[1:] - 1, p_lo.size - 1]
        p_hi, c = p_hi[tail], c[tail]
        p_pair, p_lo, ci, si, f, rnd0, slot_off = (
            a[head] for a in (p_pair, p_lo, ci, si, f, rnd0, slot_off))
    # Expand pieces into hops.
    h_n = hops[f]
    row = np.repeat(np.arange(p_lo.size), h_n)
    h = np.arange(row.size) - np.repeat(np.cumsum(h_n) - h_n, h_n)
    fr = f[row]
    sender = route[fr, h]
    receiver = route[fr, h + 1]
    last = h == hops[fr] - 1
    seg = si[row]
    within = p_lo[row] - seg_start[seg]
    rnd = rnd0[row] + h
    # Message order per directed pair: by round, then fragment, chunk, position.
    link = sender * n + receiver
    okey = np.lexsort((p_lo[row], c[row], fr, rnd, link))
    lk = link[okey]
    grp = np.zeros(lk.size, dtype=np.int64)
    if lk.size:
        starts = np.r_[0, np.flatnonzero(lk[1:] != lk[:-1]) + 1]
        grp[starts] = starts
        grp = np.maximum.accumulate(grp)
    order = np.empty(lk.size, dtype=np.int64)
    order[okey] = np.arange(lk.size) - grp
    return {
        "order": order,
        "frag": fr,
        "chunk": c[row],
        "lo": p_lo[row],
        "hop": h,
        "round": rnd,
        "sender": sender,
        "receiver": receiver,
        "bytes": (p_hi - p_lo)[row],
        "first": h == 0,
        "last": last,
        "send_buf": np.where(h == 0, segments.send_buf[seg], STAGING),
        "send_off_user": segments.send_off[seg] + within,
        "recv_buf": np.where(last, segments.recv_buf[seg], STAGING),
        "recv_off_user": segments.recv_off[seg] + within,
        "slot_off": slot_off[row],
        "frag_bytes": frag_bytes[fr],
        "nchunk": nchunk[fr],
        "n": np.int64(n),
        "num_frags": np.int64(nf),
        "routes": route,
        "frag_fwd": fwd,
        "frag_nchunk": nchunk,
        "frag_bytes_all": frag_bytes,
        "frag_hops": hops,
        "stream_window": stream_window,
    }


def _locate(
    key_pair: np.ndarray, key_lo: np.ndarray, pair: np.ndarray, lo: np.ndarray
) -> np.ndarray:
    """Index of the last row with ``(key_pair, key_lo) <= (pair, lo)``; keys sorted."""
    if key_pair.size == 0:
        return np.zeros(pair.size, dtype=np.int64)
    # Map (pair, pos) onto one sortable float-free key: rank of pair, then pos.
    big = int(max(int(key_lo.max(initial=0)), int(lo.max(initial=0)))) + 1
    if big * (int(max(key_pair.max(initial=0), pair.max(initial=0))) + 1) < (1 << 62):
        kk = key_pair * big + key_lo
        q = pair * big + lo
        return np.searchsorted(kk, q, side="right") - 1
    out = np.empty(pair.size, dtype=np.int64)  # pragma: no cover - needs > 2**62 bytes
    for i in range(pair.size):
        lo_i = np.searchsorted(key_pair, pair[i], side="left")
        hi_i = np.searchsorted(key_pair, pair[i], side="right")
        out[i] = lo_i + np.searchsorted(key_lo[lo_i:hi_i], lo[i], side="right") - 1
    return out


def _empty() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


def _rank_schedule(g: dict[str, np.ndarray], segments: Segments, rank: int, window: int,
                   chunk_bytes: int) -> RankSchedule:
    n = int(g["n"])
    sender, receiver = g["sender"], g["receiver"]
    # Staging layout of this rank: the streams it forwards, in fragment order.
    routes = g["routes"]
    cols = np.arange(routes.shape[1])
    inner = (cols >= 1) & (cols < g["frag_hops"][:, None])
    fwd_frags = np.flatnonzero(((routes == rank) & inner).any(axis=1))
    slots = g["stream_window"][fwd_frags]
    slot_size = np.minimum(chunk_bytes, g["frag_bytes_all"][fwd_frags])
    size = slots * slot_size
    base = np.zeros(routes.shape[0], dtype=np.int64)
    base[fwd_frags] = np.cumsum(size) - size
    staging = int(size.sum())
    # Slot offsets use chunk_bytes strides; a stream of one short chunk has
    # slot_size < chunk_bytes but only slot 0, so offsets stay inside it.
    stage_off = base[g["frag"]] + g["slot_off"]

    nr = int(g["round"].max()) + 1 if g["round"].size else 0
    # Sends leave the user's buffer on a fragment's first hop, receives land in it on
    # its last; every other hop is a staging slot.
    send, s_rows = _side(g, sender == rank, receiver, "first", "send", stage_off, nr)
    recv, _ = _side(g, receiver == rank, sender, "last", "recv", stage_off, nr)
    # Self traffic: segments of the diagonal pair become local copies.
    p = rank * n + rank
    lo, hi = int(segments.pair_ptr[p]), int(segments.pair_ptr[p + 1])
    return RankSchedule(
        rank=rank,
        num_rounds=nr,
        **{f"send_{k}": v for k, v in send.items()},
        **{f"recv_{k}": v for k, v in recv.items()},
        copy_send_buf=segments.send_buf[lo:hi],
        copy_send_off=segments.send_off[lo:hi],
        copy_recv_buf=segments.recv_buf[lo:hi],
        copy_recv_off=segments.recv_off[lo:hi],
        copy_bytes=segments.length[lo:hi],
        staging_bytes=staging,
        forwards=bool(g["frag_fwd"].any()),
        window=window,
        stream_window=g["stream_window"],
        send_final=g["last"][s_rows],
    )


def _side(g: dict[str, np.ndarray], mine: np.ndarray, peer: np.ndarray, user_hop: str,
          name: str, stage_off: np.ndarray,
          num_rounds: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One side (``name``: ``"send"`` or ``"recv"``) of a rank's schedule: the message rows
    ``mine`` in round, peer, pair order, and :class:`RankSchedule`'s columns of that side
    from them; ``user_hop`` (``"first"`` or ``"last"``) marks the rows at the user's
    buffer."""
    rows = np.flatnonzero(mine)
    rows = rows[np.lexsort((g["order"][rows], peer[rows], g["round"][rows]))]
    rnd = g["round"][rows]
    user = g[user_hop][rows]
    return {
        "round": rnd, "peer": peer[rows], "order": g["order"][rows],
        "buf": g[f"{name}_buf"][rows],
        "off": np.where(user, g[f"{name}_off_user"][rows], stage_off[rows]),
        "bytes": g["bytes"][rows], "ptr": np.searchsorted(rnd, np.arange(num_rounds + 1)),
        "stream": np.where(user, -1, g["frag"][rows]),
        "chunk": np.where(user, -1, g["chunk"][rows]),
    }, rows


def _check_args(segments: Segments, chunk_bytes: int, window: int) -> None:
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    if window < 2:
        raise ValueError(f"window must be >= 2 chunks, got {window}")


def _check_messages(g: dict[str, np.ndarray], chunk_bytes: int) -> None:
    """Refuse a call whose busiest rank pair would outrun the tag range (every rank alike)."""
    order = g["order"]
    if order.size and int(order.max()) >= MAX_PAIR_MESSAGES:
        i = int(np.argmax(order))
        raise ValueError(
            f"rank {int(g['sender'][i])} would send rank {int(g['receiver'][i])} "
            f"{int(order[i]) + 1} or more messages in one call at chunk_bytes={chunk_bytes}; "
            f"at most {MAX_PAIR_MESSAGES} fit a call's tag range: use larger chunks")


def build_schedules(
    segments: Segments,
    frags: Fragments,
    *,
    chunk_bytes: int,
    window: int,
    ranks: list[int] | None = None,
    whole_streams: bool = False,
) -> list[RankSchedule]:
    """Schedules of ``ranks`` (default all) for one call.

    Parameters
    ----------
    segments
        Where each pair stream's bytes live (:class:`Segments`).
    frags
        The pieces of the pair streams and their routes (:class:`Fragments`).
    chunk_bytes
        Chunk size of every fragment.
    window
        Staging slots of the largest forwarded stream at each forwarding rank
        (>= 2); the call's largest fragment enters ``window // 2`` chunks per
        round, and smaller ones in proportion (module docstring).
    whole_streams
        Every forwarded stream gets a staging slot per chunk (its window is
        all its chunks; the rounds stay ``window``'s): a forwarding rank can
        post all its receives at once, so no sender waits for a slot. For
        the gloo executor, whose slot credits travel behind the reverse
        direction's data (``docs/runtime.md``, "Execution"); staging then
        holds every byte the rank forwards, rounded up to chunks.

    Examples
    --------
    >>> import numpy as np
    >>> seg = Segments.all_to_all(np.array([[0, 10], [0, 0]]))
    >>> s0, s1 = build_schedules(seg, Fragments([1], [10], [[0, 1]]), chunk_bytes=4, window=2)
    >>> s0.send_bytes.tolist(), s1.recv_bytes.tolist(), s0.num_rounds
    ([4, 4, 2], [4, 4, 2], 3)
    """
    _check_args(segments, chunk_bytes, window)
    g = _global_hops(segments, frags, chunk_bytes, window, whole_streams)
    _check_messages(g, chunk_bytes)
    todo = range(segments.num_ranks) if ranks is None else ranks
    return [_rank_schedule(g, segments, int(r), window, chunk_bytes) for r in todo]


def build_schedule(
    segments: Segments,
    frags: Fragments,
    *,
    rank: int,
    chunk_bytes: int,
    window: int,
    whole_streams: bool = False,
) -> RankSchedule:
    """The schedule of one rank (see :func:`build_schedules`)."""
    return build_schedules(segments, frags, chunk_bytes=chunk_bytes, window=window,
                           ranks=[rank], whole_streams=whole_streams)[0]


# ------------------------------------------------------------------ checking
def check_schedules(scheds: list[RankSchedule], window: int) -> None:
    """Check the properties the deadlock-freedom argument rests on; raise AssertionError.

    * every send has exactly one receive on its peer with the same round,
      order and size, and vice versa;
    * per directed pair, messages are posted in the same order on both ends;
    * a forwarding rank sends a staged chunk only in a later round than it
      received it, and re-uses a slot only after the round that emptied it;
    * staging offsets stay inside the staging area.
    """
    sends = {}
    for s in scheds:
        for t, peer, o, nb in zip(
            s.send_round.tolist(), s.send_peer.tolist(), s.send_order.tolist(),
            s.send_bytes.tolist(), strict=True
        ):
            key = (s.rank, peer, o)
            assert key not in sends, f"duplicate message {key}"
            sends[key] = (t, nb)
    recvs = {}
    for s in scheds:
        for t, peer, o, nb in zip(
            s.recv_round.tolist(), s.recv_peer.tolist(), s.recv_order.tolist(),
            s.recv_bytes.tolist(), strict=True
        ):
            recvs[(peer, s.rank, o)] = (t, nb)
    assert sends == recvs, "sends and receives do not match one to one"
    for s in scheds:
        for peer_col, order_col, round_col in (
            (s.send_peer, s.send_order, s.send_round),
            (s.recv_peer, s.recv_order, s.recv_round),
        ):
            for peer in np.unique(peer_col):
                m = peer_col == peer
                assert np.all(np.diff(order_col[m]) > 0), "posting order differs from order"
                assert np.all(np.diff(round_col[m]) >= 0), "rounds out of order"
        # Staging: receive round of each slot byte range vs forward round.
        st_r = s.recv_buf == STAGING
        st_s = s.send_buf == STAGING
        if s.staging_bytes == 0:
            assert not st_r.any() and not st_s.any()
            continue
        assert np.all(s.recv_off[st_r] + s.recv_bytes[st_r] <= s.staging_bytes)
        assert np.all(s.send_off[st_s] + s.send_bytes[st_s] <= s.staging_bytes)
        # Each staged piece is written in round w and read in round r > w (it
        # is forwarded with the same boundaries it arrived with); two pieces
        # whose bytes overlap must use them in disjoint round intervals.
        w_key = list(zip(s.recv_off[st_r].tolist(), s.recv_bytes[st_r].tolist(),
                         s.recv_round[st_r].tolist(), strict=True))
        r_key = list(zip(s.send_off[st_s].tolist(), s.send_bytes[st_s].tolist(),
                         s.send_round[st_s].tolist(), strict=True))
        assert len(w_key) == len(r_key), "a staged piece is not forwarded exactly once"
        w_key.sort()
        r_key.sort()
        life = []
        for (o, nb, w), (o2, nb2, r) in zip(w_key, r_key, strict=True):
            assert (o, nb) == (o2, nb2), f"staged piece {o}+{nb} is forwarded as {o2}+{nb2}"
            assert r > w, f"staged piece {o}+{nb} forwarded in round {r}, received in {w}"
            life.append((o, o + nb, w, r))
        for i, (lo1, hi1, w1, r1) in enumerate(life):
            for lo2, hi2, w2, r2 in life[i + 1 :]:
                if lo1 < hi2 and lo2 < hi1:
                    assert r1 < w2 or r2 < w1, (
                        f"staging bytes {max(lo1, lo2)}.. reused in round {max(w1, w2)} "
                        f"while live in rounds {w1}-{r1} and {w2}-{r2}"
                    )
