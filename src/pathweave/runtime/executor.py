"""Executes a :class:`~pathweave.runtime.schedule.RankSchedule` on ``torch.distributed``.

The executor knows nothing about plans: it takes one rank's schedule, the
rank's send and receive buffers as flat ``uint8`` tensors, and moves bytes
with the backend's own point-to-point operations.

* **gloo** (CPU): every operation is an ``isend``/``irecv``; a round's
  receives are posted before its sends (gloo is about twice as fast on a pair
  when the receive is waiting), and the tag of a message is ``tag_base`` plus
  its order on its rank pair, so concurrent streams never mix.
* **NCCL** (CUDA): a round's operations go out as one ``batch_isend_irecv``
  group, because NCCL matches point-to-point messages per pair in issue order
  and needs a rank's sends and receives of a step in one group to avoid
  blocking on each other; ``wait`` on NCCL orders the current CUDA stream
  after the round, which is what the next round's forwards need.

Before round ``t`` a rank waits only for its staging operations of round
``t - 1`` (see the deadlock-freedom argument in
:mod:`pathweave.runtime.schedule`); everything else is waited for at the end.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pathweave.errors import CommError
from pathweave.runtime.schedule import STAGING, RankSchedule

__all__ = ["Handle", "Transport", "as_bytes"]

#: Tags of pathweave messages: [2**30, 2**31), clear of small user tags.
_TAG_BASE = 1 << 30
_TAG_CALL_BITS = 21  # messages per rank pair per call before tags repeat
_TAG_CALLS = 1 << (30 - _TAG_CALL_BITS - 1)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat ``uint8`` view of a contiguous tensor (any dtype, incl. bool and fp8)."""
    flat = t.reshape(-1)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


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


class Transport:
    """One process group as the executor sees it: ranks, backend, metadata exchange.

    Parameters
    ----------
    group
        A process group, or ``None`` for the default group.
    """

    def __init__(self, group: Any = None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialised: call init_process_group first "
                "(or start the job with torchrun or pathweave.runtime.launch.run_local)"
            )
        self.group = group
        pg = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(pg)
        self.size = dist.get_world_size(pg)
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

    def next_tag_base(self) -> int:
        base = _TAG_BASE + (self.calls % _TAG_CALLS) * (1 << _TAG_CALL_BITS)
        self.calls += 1
        return base

    # ---------------------------------------------------------- metadata
    def exchange(self, row: np.ndarray, deadline: float) -> np.ndarray:
        """All-gather one ``int64`` row per rank; returns ``int64[size, len(row)]``.

        On gloo this is an all-to-all of the row repeated (one step; gloo's
        ring all-gather takes ``size - 1`` dependent steps, several times
        slower on a loaded host); on NCCL a plain all-gather.
        """
        n = self.size
        width = row.size
        mine = torch.from_numpy(np.ascontiguousarray(row, dtype=np.int64))
        try:
            if self.nccl:
                inp = mine.to(self.meta_device)
                out = torch.empty(n * width, dtype=torch.int64, device=self.meta_device)
                work = dist.all_gather_into_tensor(out, inp, group=self.group, async_op=True)
            else:
                inp = mine.repeat(n)
                out = torch.empty(n * width, dtype=torch.int64)
                work = dist.all_to_all_single(out, inp, group=self.group, async_op=True)
        except Exception as exc:
            raise _wrap(exc, self.rank, "metadata exchange") from exc
        _wait_all([work], deadline, self.rank, "metadata exchange", host_wait=not self.nccl)
        return out.cpu().numpy().reshape(n, width)

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
    ) -> Handle:
        """Execute ``sched``; returns a handle (already waited for if ``wait``).

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
        rounds = _rounds(sched)
        run_round = self._round_nccl if self.nccl else self._round_gloo
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

    def _round_gloo(
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
        for peer, order, buf, off, nb in recvs:
            if buf == STAGING:
                w = dist.irecv(staging[off : off + nb], granks[peer], g, tag_base + order)
                staged.append(w)
            else:
                w = dist.irecv(recv_bufs[buf][off : off + nb], granks[peer], g, tag_base + order)
                final.append(w)
        for peer, order, buf, off, nb in sends:
            if buf == STAGING:
                w = dist.isend(staging[off : off + nb], granks[peer], g, tag_base + order)
                staged.append(w)
            else:
                w = dist.isend(send_bufs[buf][off : off + nb], granks[peer], g, tag_base + order)
                final.append(w)

    def _round_nccl(
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


def _rounds(sched: RankSchedule) -> list[tuple[list[tuple[int, ...]], list[tuple[int, ...]]]]:
    cached = sched.__dict__.get("_rounds")
    if cached is None:
        cached = sched.rounds()
        object.__setattr__(sched, "_rounds", cached)
    return cached
