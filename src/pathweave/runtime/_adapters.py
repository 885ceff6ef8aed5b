"""The op adapters: each op's buffers and byte layout as the pipeline's ``_Call``.

An op (:meth:`~pathweave.runtime.Orchestrator.all_to_all_single`,
:meth:`~pathweave.runtime.Orchestrator.batch_isend_irecv`) exchanges and
validates its own metadata, then hands the pipeline
(:mod:`pathweave.runtime._pipeline`) a :class:`_Call`: a metadata key,
``decode()`` (its layout: ``pair_bytes`` and whatever its segments need),
``segments(layout)`` (its buffers' byte ranges per pair,
:class:`~pathweave.runtime.schedule.Segments`) and ``buffers(multipath)``
(normalised send and receive buffers, torch's own collective on them, the
copy back). :func:`a2a_call` and :func:`p2p_call` build them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pathweave.runtime import _validate as V
from pathweave.runtime._group import _dist, _GroupState, _is_world
from pathweave.runtime.schedule import Segments


@dataclass(eq=False)
class _Call:
    """One call as the op pipeline sees it, built by an op's adapter.

    ``decode()`` validates the exchanged metadata and returns the call's
    layout (anything with ``pair_bytes``); it is skipped when ``mkey`` is the
    previous call's. ``buffers(multipath)``, called once the arguments are
    known to be good, returns ``(send_bufs, recv_bufs, post_torch, finish)``:
    dense ``uint8`` views (``send_bufs`` hold the caller's input,
    ``recv_bufs`` are scratch, or on torch's path a dense output itself),
    ``post_torch(layout)`` starting torch's own collective on those buffers
    and returning its works, and ``finish`` copying the scratch into the
    caller's outputs once every byte has arrived.
    """

    op: str
    mkey: bytes
    decode: Callable[[], Any]
    segments: Callable[[Any], Segments]
    buffers: Callable[[bool], tuple[list[Any], list[Any], Callable[[Any], list[Any]],
                                    Callable[[], None] | None]]
    #: ``timing(layout)``: a key per receive op for live adaptation (None: not timed).
    timing: Callable[[Any], Callable[[tuple[int, ...]], Any]] | None = None
    #: What the call writes: the value of its handle's ``get_future()``.
    outputs: Sequence[Any] = ()
    #: Whether a multi-path call's receive buffers are the group's reused
    #: scratch (the executor then keeps their views: ``Transport.run(keep=)``).
    keep_recvs: bool = False


@dataclass(frozen=True, eq=False)
class _P2PLayout:
    matches: list[tuple[int, int, int, int, int]]
    pair_bytes: np.ndarray




def a2a_call(
    st: _GroupState, output: Any, input: Any, mkey: bytes, decode: Callable[[], Any],
    *, reuse: bool,
) -> _Call:
    """``all_to_all_single`` on normalised buffers: a dense input, a scratch output."""
    from pathweave.runtime.executor import as_bytes, dense, is_dense

    tr = st.transport

    def buffers(multipath: bool) -> tuple[list[Any], list[Any], Any, Any]:
        src = as_bytes(dense(input))
        if not multipath and is_dense(output):
            # torch's path into the output itself, as torch's own call: no
            # copy (docs/runtime.md, "Outputs of a failed call").
            dst = as_bytes(output)
            finish = None
        else:
            scratch = st.scratch(output, reuse=reuse)
            dst = as_bytes(scratch)

            def finish() -> None:
                output.copy_(scratch)

        def post_torch(layout: V.A2ALayout) -> list[Any]:
            rows = layout.in_rows
            # Splits in bytes on the byte views: every dtype on every backend.
            send = (rows[tr.rank] * layout.row_bytes).tolist()
            recv = (rows[:, tr.rank] * layout.row_bytes).tolist()
            return [_dist().all_to_all_single(dst, src, recv, send, group=tr.group,
                                              async_op=True)]

        return [src], [dst], post_torch, finish

    def timing(layout: V.A2ALayout) -> Callable[[tuple[int, ...]], tuple[int, int]]:
        # A receive at offset off of the output holds bytes of the source whose
        # segment it lies in: key (source, the peer it came from).
        starts = np.concatenate([[0], np.cumsum(layout.pair_bytes[:, tr.rank])])
        return lambda op: (int(np.searchsorted(starts, op[3], side="right") - 1), int(op[0]))

    return _Call("all_to_all_single", mkey, decode,
                 lambda layout: Segments.all_to_all(layout.pair_bytes), buffers,
                 timing, [output], keep_recvs=reuse)

def p2p_call(
    st: _GroupState, ops: list[Any], mkey: bytes, decode: Callable[[], Any]
) -> _Call:
    """``batch_isend_irecv`` on normalised buffers: dense sends, scratch receives."""
    import torch

    from pathweave.runtime.executor import as_bytes, dense, is_dense

    dist = _dist()

    def buffers(multipath: bool) -> tuple[list[Any], list[Any], Any, Any]:
        bufs, outs = [], []
        for op in ops:
            if op.op is dist.isend:
                bufs.append(as_bytes(dense(op.tensor)))
            elif not multipath and is_dense(op.tensor):
                bufs.append(as_bytes(op.tensor))
            else:
                t = op.tensor
                tmp = torch.empty(t.shape, dtype=t.dtype, device=t.device)
                bufs.append(as_bytes(tmp))
                outs.append((t, tmp))

        def post_torch(layout: _P2PLayout) -> list[Any]:
            mine = [dist.P2POp(op.op, b, op.peer, op.group, op.tag)
                    for op, b in zip(ops, bufs, strict=True)]
            return list(dist.batch_isend_irecv(mine)) if mine else []

        def finish() -> None:
            for t, tmp in outs:
                t.copy_(tmp)

        return bufs, bufs, post_torch, finish

    return _Call("batch_isend_irecv", mkey, decode,
                 lambda layout: _p2p_segments(layout.matches, st.transport.size), buffers,
                 outputs=[op.tensor for op in ops if op.op is not dist.isend])


def p2p_peer(op: Any, group: Any, tr: Any) -> int | None:
    """The group rank ``op`` (a ``P2POp``, None: this rank) talks to; None: another group's op."""
    n = tr.size
    if op is None:
        return tr.rank
    og = getattr(op, "group", None)
    if og is not None and og is not group and not (group is None and _is_world(og)):
        return None
    gp = getattr(op, "group_peer", None)
    if gp is not None:
        return int(gp)
    peer = int(op.peer)
    if peer in tr.global_ranks:
        return tr.global_ranks.index(peer)
    return peer if group is None else n + peer  # out of range: reported as such


def p2p_layout(meta: np.ndarray, counts: np.ndarray, n: int) -> _P2PLayout:
    """Every rank's exchanged ``batch_isend_irecv`` table matched: messages, bytes per pair."""
    tables = [
        meta[r, 4 : 4 + V.P2P_FIELDS * int(counts[r])].reshape(-1, V.P2P_FIELDS)
        for r in range(n)
    ]
    matches = V.match_p2p(tables)
    pair_bytes = np.zeros((n, n), dtype=np.int64)
    for s, d, _, _, nb in matches:
        pair_bytes[s, d] += nb
    return _P2PLayout(matches, pair_bytes)


def _p2p_segments(matches: list[tuple[int, int, int, int, int]], n: int) -> Segments:
    """Segments of a batch of messages: one per message, in pair-stream order."""
    rows = sorted((s * n + d, i, si, ri, nb) for i, (s, d, si, ri, nb) in enumerate(matches)
                  if nb > 0)
    pair = np.array([r[0] for r in rows], dtype=np.int64)
    ptr = np.searchsorted(pair, np.arange(n * n + 1)) if rows else np.zeros(n * n + 1, np.int64)
    col = np.array([r[2:] for r in rows], dtype=np.int64).reshape(-1, 3)
    zeros = np.zeros(len(rows), dtype=np.int64)
    return Segments(n, ptr.astype(np.int64), col[:, 2], col[:, 0], zeros, col[:, 1], zeros.copy())
