"""Executes a :class:`~pathweave.runtime.schedule.RankSchedule` on ``torch.distributed``.

The executor knows nothing about plans: it takes one rank's schedule, the
rank's send and receive buffers as flat ``uint8`` tensors, and moves bytes
with the backend's own point-to-point operations.

* **gloo** (CPU): every operation is an ``isend``/``irecv`` whose tag is
  ``tag_base`` plus its order on its rank pair, so concurrent streams never
  mix and messages match whatever order they are posted in. Each forwarded
  stream advances on its own (:class:`~pathweave.runtime.schedule.Dataflow`):
  the rank posts every receive it can (into user buffers, and into each
  stream's staging slots: its window, which follows its bytes) before any
  send (in round order, so each rank pair's connection carries every
  fragment in proportion to its bytes), then one thread
  per forwarded stream waits for chunk ``c``, forwards it, waits for the
  forward of chunk ``c - 1`` and re-posts a receive into the slot it left.
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
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pathweave.errors import CommError
from pathweave.runtime.schedule import STAGING, RankSchedule

__all__ = ["Handle", "Transport", "as_bytes", "dense", "is_dense", "start_row_exchange"]

#: Tags of pathweave messages: [2**30, 2**31), clear of small user tags.
_TAG_BASE = 1 << 30
_TAG_CALL_BITS = 21  # messages per rank pair per call before tags repeat
_TAG_CALLS = 1 << (30 - _TAG_CALL_BITS - 1)
#: Streams one rank may forward in one call (one thread each).
_MAX_STREAMS = 4096


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


class Handle:
    """What an ``async_op=True`` call returns: ``wait()`` finishes the exchange.

    Mirrors ``torch.distributed.Work``: ``wait()`` returns ``True`` and raises
    if the exchange failed; ``is_completed()`` tells whether it is done.
    """

    def __init__(
        self,
        works: Sequence[Any],
        *,
        rank: int,
        deadline: float,
        finish: Callable[[], None] | None = None,
        host_wait: bool = True,
    ):
        self._works = list(works)
        self._host_wait = host_wait
        self._rank = rank
        self._deadline = deadline
        self._finish = finish
        self._done = False
        #: Receive completion times by key (``Transport.run(timing=...)``).
        self.timings: dict[Any, float] = {}

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if self._done:
            return True
        deadline = self._deadline
        if timeout is not None:
            deadline = min(deadline, time.monotonic() + timeout.total_seconds())
        _wait_all(self._works, deadline, self._rank, "waiting for the exchange",
                  host_wait=self._host_wait)
        self._works = []
        if self._finish is not None:
            self._finish()
            self._finish = None
        self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done or all(w.is_completed() for w in self._works)

    def is_success(self) -> bool:
        return self._done

    def __repr__(self) -> str:
        return f"Handle(completed={self.is_completed()}, pending={len(self._works)})"


def _wait_all(
    works: Sequence[Any], deadline: float, rank: int, what: str, *, host_wait: bool = True
) -> None:
    """Wait for ``works``; ``host_wait=False`` (NCCL) orders the CUDA stream instead.

    A timeout makes NCCL's ``wait`` block the host until the work is done;
    without one it only makes the current stream wait, and NCCL's own
    watchdog enforces the process group's timeout.
    """
    for w in works:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CommError(f"rank {rank}: {what} ran past the timeout")
        try:
            if host_wait:
                w.wait(datetime.timedelta(seconds=left))
            else:
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
        self.group = group
        self.rank, self.size = group_rank_size(group)
        pg = group if group is not None else dist.group.WORLD
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

    def _stream_pool(self) -> ThreadPoolExecutor:
        # Threads persist across calls; one per concurrently forwarded stream
        # (the pool starts a new thread whenever none is idle, up to the cap,
        # and a stream waiting for a thread could stall its peers).
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=_MAX_STREAMS,
                                            thread_name_prefix="pathweave-forward")
        return self._pool

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
    ) -> Handle:
        """Execute ``sched``; returns a handle (already waited for if ``wait``).

        ``timing`` (gloo, ``wait``): a key of each receive op into a user
        buffer; the handle's ``timings`` then map each key to when the last
        of its receives completed, in seconds after this call started
        (:mod:`pathweave.runtime.telemetry`; no extra messages).

        A schedule with forwarding always runs to completion here: forwarding
        needs this process to act between rounds, and a later blocking call
        of the caller's could otherwise stall the peers whose chunks it
        relays.
        """
        # A rank with no buffers of its own may still forward (batch_isend_irecv
        # with an empty list): its staging lives on the group's device.
        bufs = list(recv_bufs) or list(send_bufs)
        device = bufs[0].device if bufs else self.meta_device
        for sb, so, rb, ro, nb in zip(
            sched.copy_send_buf.tolist(),
            sched.copy_send_off.tolist(),
            sched.copy_recv_buf.tolist(),
            sched.copy_recv_off.tolist(),
            sched.copy_bytes.tolist(),
            strict=True,
        ):
            recv_bufs[rb][ro : ro + nb].copy_(send_bufs[sb][so : so + nb])
        staging = (
            torch.empty(sched.staging_bytes, dtype=torch.uint8, device=device)
            if sched.staging_bytes
            else None
        )
        tag_base = self.next_tag_base()
        if not self.grouped_rounds:
            t0 = time.monotonic()
            final = self._run_streams(sched, send_bufs, recv_bufs, staging, tag_base, deadline)
            handle = Handle(final, rank=self.rank, deadline=deadline, finish=finish)
            if wait and timing is not None:
                user = [op for op in sched.dataflow().recvs if op[2] != STAGING]
                groups: dict[Any, list[Any]] = {}
                for op, w in zip(user, final, strict=False):
                    groups.setdefault(timing(op), []).append(w)
                handle.timings = self._time_groups(groups, t0, deadline)
                # A gloo work waited for once must not be waited for again.
                handle._works = final[len(user):]
            if wait:
                handle.wait()
            return handle
        rounds = _rounds(sched)
        run_round = self._round_grouped
        final: list[Any] = []
        staged: list[Any] = []
        for recvs, sends in rounds:
            if staged:
                _wait_all(staged, deadline, self.rank, "forwarding", host_wait=not self.nccl)
                staged = []
            try:
                run_round(recvs, sends, send_bufs, recv_bufs, staging, tag_base, final, staged)
            except CommError:
                raise
            except Exception as exc:
                raise _wrap(exc, self.rank, "posting transfers") from exc
        final.extend(staged)
        handle = Handle(
            final, rank=self.rank, deadline=deadline, finish=finish, host_wait=not self.nccl
        )
        if wait or sched.forwards:
            handle.wait()
        return handle

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
        self,
        sched: RankSchedule,
        send_bufs: Sequence[torch.Tensor],
        recv_bufs: Sequence[torch.Tensor],
        staging: torch.Tensor | None,
        tag_base: int,
        deadline: float,
    ) -> list[Any]:
        """Post what needs nothing, forward each stream on its own thread; returns the works
        still to wait for (when forwarding, the threads are done and joined already)."""
        df = sched.dataflow()
        g, granks, rank = self.group, self.global_ranks, self.rank

        def recv(i: int) -> Any:
            peer, order, buf, off, nb = df.recvs[i]
            t = staging if buf == STAGING else recv_bufs[buf]
            return dist.irecv(t[off : off + nb], granks[peer], g, tag_base + order)

        def send(j: int) -> Any:
            peer, order, buf, off, nb = df.sends[j]
            t = staging if buf == STAGING else send_bufs[buf]
            return dist.isend(t[off : off + nb], granks[peer], g, tag_base + order)

        try:
            posted = {i: recv(i) for i in df.first_recvs}
            final = [w for i, w in posted.items() if df.recvs[i][2] != STAGING]
            final += [send(j) for j in df.first_sends]
        except Exception as exc:
            raise _wrap(exc, rank, "posting transfers") from exc
        if not df.streams:
            return final
        failed = threading.Event()

        def stream(steps: list[tuple[tuple[int, ...], tuple[int, ...]]], slots: int) -> None:
            rwork = {c: [posted[i] for i in steps[c][0]] for c in range(slots)}
            fwd: dict[int, list[Any]] = {}
            for c, (_, sends_c) in enumerate(steps):
                if failed.is_set():
                    return
                _wait_all(rwork.pop(c), deadline, rank, "forwarding")
                fwd[c] = [send(j) for j in sends_c]
                # The forward of chunk c - 1 went out first on the same link:
                # once it is done its slot takes chunk c - 1 + slots.
                if c >= 1:
                    _wait_all(fwd.pop(c - 1), deadline, rank, "forwarding")
                    nxt = c - 1 + slots
                    if nxt < len(steps):
                        rwork[nxt] = [recv(i) for i in steps[nxt][0]]
            for works in fwd.values():
                _wait_all(works, deadline, rank, "forwarding")

        def guarded(steps: Any, slots: int) -> None:
            try:
                stream(steps, slots)
            except CommError:
                failed.set()
                raise
            except Exception as exc:
                failed.set()
                raise _wrap(exc, rank, "forwarding") from exc

        pool = self._stream_pool()
        futures = [pool.submit(guarded, st, k) for st, k in zip(df.streams, df.slots,
                                                                 strict=True)]
        first_error: BaseException | None = None
        for fut in futures:
            left = max(0.0, deadline - time.monotonic())
            try:
                fut.result(timeout=left + 1.0)  # the stream's own waits end at the deadline
            except BaseException as exc:
                failed.set()
                if first_error is None:
                    first_error = exc
        if first_error is not None:
            if isinstance(first_error, CommError):
                raise first_error
            raise CommError(f"rank {rank}: forwarding failed: {first_error}") from first_error
        return final

    def _round_grouped(
        self,
        recvs: list[tuple[int, ...]],
        sends: list[tuple[int, ...]],
        send_bufs: Sequence[torch.Tensor],
        recv_bufs: Sequence[torch.Tensor],
        staging: torch.Tensor | None,
        tag_base: int,
        final: list[Any],
        staged: list[Any],
    ) -> None:
        g, granks = self.group, self.global_ranks
        ops = []
        for peer, order, buf, off, nb in recvs:
            t = staging if buf == STAGING else recv_bufs[buf]
            ops.append(dist.P2POp(dist.irecv, t[off : off + nb], granks[peer], g, tag_base + order))
        for peer, order, buf, off, nb in sends:
            t = staging if buf == STAGING else send_bufs[buf]
            ops.append(dist.P2POp(dist.isend, t[off : off + nb], granks[peer], g, tag_base + order))
        if not ops:
            return
        works = dist.batch_isend_irecv(ops)
        # The next round may forward what this one received: order the stream.
        staged.extend(w for w in works if w is not None)


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


def _rounds(sched: RankSchedule) -> list[tuple[list[tuple[int, ...]], list[tuple[int, ...]]]]:
    cached = sched.__dict__.get("_rounds")
    if cached is None:
        cached = sched.rounds()
        object.__setattr__(sched, "_rounds", cached)
    return cached
