"""The ``pathweave`` backend of ``torch.distributed``: all-to-all through the orchestrator.

After ``import pathweave.distributed`` (which registers it),
``torch.distributed.init_process_group("pathweave")`` (or the device map
``"cpu:pathweave,cuda:pathweave"``) and ``new_group(..., backend="pathweave")``
give a :class:`ProcessGroupPathweave`:

* ``all_to_all_single`` (c10d ``alltoall_base``) and ``all_to_all``
  (``alltoall``) go through the group's :class:`~pathweave.Orchestrator`;
* every other operation (all_reduce, broadcast, all_gather, reduce_scatter,
  barrier, send/recv, batch_isend_irecv, ...) is served by the inner
  backend registered for the tensor's device (gloo for CPU tensors, NCCL for
  CUDA tensors) without passing through Python.

The orchestrator itself runs on an *inner* process group: a plain
``ProcessGroup`` front for the same gloo/NCCL backend object, so its
metadata exchange, its transfers and its fallback to torch's own all-to-all
never re-enter this backend. Configuration comes from the environment
(:meth:`Config.from_env <pathweave.runtime.Config.from_env>`, one table in
``docs/runtime.md``).
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

from pathweave.runtime._validate import ArgProblem, dtype_code, type_code
from pathweave.runtime.config import MULTIPATH_ENV, POLICY_ENV, Config
from pathweave.runtime.orchestrator import Orchestrator, default_fabric

__all__ = [
    "BACKEND_NAME",
    "MULTIPATH_ENV",
    "POLICY_ENV",
    "ProcessGroupPathweave",
    "all_to_all_list",
    "register",
]

#: Name of the backend in ``init_process_group``.
BACKEND_NAME = "pathweave"
_BT = dist.ProcessGroup.BackendType
class _Work(dist.Work):
    """A c10d ``Work`` around what the orchestrator returned (``None``, torch's work, a
    :class:`~pathweave.runtime.executor.Handle`), plus what must follow the wait.

    ``get_future()`` gives a future of ``outputs``, set once the exchange is
    done (a waiter thread calls ``wait()``; the caller need not).
    """

    def __init__(self, inner: Any = None, finish: Any = None, outputs: Sequence[Any] = ()):
        super().__init__()
        self._inner = inner
        self._finish = finish
        self._outputs = list(outputs)
        self._lock = threading.Lock()

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        with self._lock:
            if self._inner is not None:
                if timeout:
                    self._inner.wait(timeout)
                else:
                    self._inner.wait()
                self._inner = None
            if self._finish is not None:
                self._finish()
                self._finish = None
        return True

    def is_completed(self) -> bool:
        return self._inner is None and self._finish is None

    def is_success(self) -> bool:
        return self.is_completed()

    def get_future(self) -> torch.futures.Future:
        from pathweave.runtime.executor import _waiters, settler

        fut: torch.futures.Future = torch.futures.Future()
        _waiters().submit(settler(fut, self.wait, lambda: self._outputs))
        return fut


class ProcessGroupPathweave(dist.ProcessGroup):
    """A process group whose all-to-alls go through an :class:`~pathweave.Orchestrator`.

    Made by ``init_process_group("pathweave")`` or ``new_group(backend="pathweave")``,
    not by hand. ``orchestrator`` is the group's orchestrator (also
    :func:`pathweave.distributed.default_orchestrator` of the group); its
    ``stats`` count the group's all-to-alls.

    Parameters
    ----------
    store, rank, size, timeout, global_ranks
        What torch passes a backend creator (``global_ranks`` empty for the
        default group).
    config
        The orchestrator's settings (:meth:`Config.from_env
        <pathweave.runtime.Config.from_env>`).
    """

    def __init__(
        self,
        store: Any,
        rank: int,
        size: int,
        timeout: datetime.timedelta,
        global_ranks: Sequence[int],
        config: Config,
    ):
        super().__init__(rank, size)
        self._store = store
        self._is_world = len(global_ranks) == 0
        self._global_ranks = list(global_ranks)
        self._backends: dict[str, tuple[Any, Any, str]] = {}
        gloo = ProcessGroupGloo(PrefixStore("gloo/", store), rank, size, timeout=timeout)
        self._add("cpu", _BT.GLOO, gloo, "gloo")
        if torch.cuda.is_available() and dist.is_nccl_available():
            from torch._C._distributed_c10d import ProcessGroupNCCL

            opts = ProcessGroupNCCL.Options()
            opts._timeout = timeout
            opts.global_ranks_in_group = list(global_ranks)
            nccl = ProcessGroupNCCL(PrefixStore("nccl/", store), rank, size, opts)
            self._add("cuda", _BT.NCCL, nccl, "nccl")
        self._set_default_backend(_BT.NCCL if "cuda" in self._backends else _BT.GLOO)
        self._inner: dict[str, dist.ProcessGroup] = {}
        # The default group's fabric is known now, so a wrong PATHWEAVE_FABRIC
        # fails init_process_group; a subgroup's is resolved on its first
        # all-to-all (many subgroups never run one).
        fabric = default_fabric(size, is_world=True) if self._is_world else None
        self.orchestrator = Orchestrator(config=config.replace(fabric=fabric))

    def _add(self, device: str, kind: Any, backend: Any, name: str) -> None:
        self._register_backend(torch.device(device), kind, backend)
        self._backends[device] = (kind, backend, name)

    # ------------------------------------------------------------ inner
    def inner_group(self, device: torch.device | str) -> dist.ProcessGroup:
        """The gloo (``"cpu"``) or NCCL (``"cuda"``) group behind this one, for ``device``.

        A plain ``ProcessGroup`` over the same backend object, registered with
        ``torch.distributed`` so that its functions accept it; the
        orchestrator runs on it.
        """
        dev = torch.device(device).type
        pg = self._inner.get(dev)
        if pg is not None:
            return pg
        if dev not in self._backends:
            raise ValueError(
                f"the pathweave group has no backend for {dev!r} tensors "
                f"(it serves {', '.join(self._backends)})"
            )
        kind, backend, name = self._backends[dev]
        pg = dist.ProcessGroup(self._store, self.rank(), self.size())
        pg._register_backend(torch.device(dev), kind, backend)
        pg._set_default_backend(kind)
        # NOTE: torch.distributed's functions look groups up in its private
        # registry; the entries mirror those torch makes for a new group. The
        # group gets no name of its own: a name lives in the shared backend,
        # and ops dispatched from C++ by name (functional collectives) must
        # keep finding this group, not the inner one. Left out of pg_names,
        # so destroy_process_group shuts the shared backend down once.
        from torch.distributed.distributed_c10d import _world

        _world.pg_map[pg] = (name, self._store)
        _world.pg_group_ranks[pg] = dict(_world.pg_group_ranks[self])
        _world.pg_backend_config[pg] = f"{dev}:{name}"
        self._inner[dev] = pg
        return pg

    def route(self, device: torch.device | str) -> tuple[Orchestrator, dist.ProcessGroup]:
        """The group's orchestrator and the inner group it runs on for ``device`` tensors.

        A subgroup's fabric is resolved here, on its first all-to-all.
        """
        orch = self.orchestrator
        if orch.fabric is None:
            orch.fabric = default_fabric(self.size(), is_world=False,
                                         global_ranks=self._global_ranks)
        return orch, self.inner_group(device)

    def shutdown(self) -> None:
        """Forget the inner groups, then shut the backends down (torch's ``shutdown``)."""
        from torch.distributed.distributed_c10d import _world

        for pg in self._inner.values():
            for table in (_world.pg_map, _world.pg_group_ranks, _world.pg_backend_config):
                table.pop(pg, None)
        self._inner.clear()
        super().shutdown()

    # ------------------------------------------------------- all-to-all
    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        opts: Any = None,
    ) -> dist.Work:
        """c10d ``alltoall_base``: the orchestrator's ``all_to_all_single`` on the inner group."""
        orch, inner = self.route(input.device)
        handle = orch.all_to_all_single(
            output, input, list(output_split_sizes) or None, list(input_split_sizes) or None,
            group=inner, async_op=bool(getattr(opts, "asyncOp", False)),
        )
        return _Work(handle, outputs=[output])

    alltoall_base = all_to_all_single

    def alltoall(
        self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> dist.Work:
        """c10d ``alltoall``: :func:`all_to_all_list` on the inner group."""
        orch, inner = self.route(list_device(input_tensors, output_tensors))
        return all_to_all_list(
            orch, output_tensors, input_tensors, inner,
            async_op=bool(getattr(opts, "asyncOp", False)),
        )


def _list_problem(outs: Any, ins: Any, num_ranks: int) -> tuple[Any, Any, ArgProblem | None]:
    """The two lists as lists, and the first problem with them (``None``: fine).

    Found problems travel in the metadata row (:class:`ArgProblem`) instead of
    being raised here: a rank that raised alone would leave its peers waiting.
    """
    lists = []
    for which, given in ((0, ins), (1, outs)):
        if isinstance(given, (str, bytes, torch.Tensor)) or not isinstance(given, Sequence):
            return [], [], ArgProblem(20, which, type_code(given))
        lists.append(list(given))
    ins, outs = lists
    first = ins[0] if ins and isinstance(ins[0], torch.Tensor) else None
    for which, tensors in ((0, ins), (1, outs)):
        if len(tensors) != num_ranks:
            return outs, ins, ArgProblem(21, which, len(tensors), num_ranks)
        for j, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                return outs, ins, ArgProblem(22, which, j, type_code(t))
            first = t if first is None else first
            if t.dtype != first.dtype:
                return outs, ins, ArgProblem(23, which, j, dtype_code(t.dtype),
                                             dtype_code(first.dtype))
            if t.device != first.device:
                return outs, ins, ArgProblem(24, which, j)
    return outs, ins, None


def list_device(*lists: Any) -> torch.device:
    """The device of the first tensor in ``lists`` (the CPU if none holds one)."""
    for tensors in lists:
        for t in tensors if isinstance(tensors, Sequence) else ():
            if isinstance(t, torch.Tensor):
                return t.device
    return torch.device("cpu")


def all_to_all_list(
    orchestrator: Orchestrator,
    output_tensors: Sequence[torch.Tensor],
    input_tensors: Sequence[torch.Tensor],
    group: Any,
    *,
    async_op: bool = False,
) -> dist.Work:
    """``torch.distributed.all_to_all`` as one ``all_to_all_single`` of the orchestrator.

    The tensors (any shapes, one dtype, one device, as many per list as
    ranks) are flattened: ``input_tensors[j]`` becomes the elements sent to
    rank ``j``; the received elements are copied into ``output_tensors``
    when the exchange completes. Splits in elements, so a size that does not
    match its peer's raises the orchestrator's error on every rank before
    data moves; so do lists that break those rules on any rank (they ride
    the metadata row as an :class:`~pathweave.runtime._validate.ArgProblem`).
    Returns a work whose ``wait()`` finishes the exchange (already finished
    unless ``async_op``).
    """
    n = dist.get_world_size(group)
    outs, ins, problem = _list_problem(output_tensors, input_tensors, n)
    if problem is not None:
        # Still meet the peers in the metadata exchange, which raises everywhere.
        empty = torch.empty(0)
        orchestrator.all_to_all_single(empty, empty, group=group, problem=problem)
        raise AssertionError("the metadata exchange raises the problem")  # pragma: no cover
    device, dtype = ins[0].device, ins[0].dtype
    flat_in = torch.cat([t.reshape(-1) for t in ins])
    out_sizes = [t.numel() for t in outs]
    flat_out = torch.empty(sum(out_sizes), dtype=dtype, device=device)

    def unpack() -> None:
        for t, piece in zip(outs, flat_out.split(out_sizes), strict=True):
            t.copy_(piece.view(t.shape))

    handle = orchestrator.all_to_all_single(
        flat_out, flat_in, out_sizes, [t.numel() for t in ins], group=group, async_op=async_op,
    )
    work = _Work(handle, unpack, list(output_tensors))
    if not async_op:
        work.wait()
    return work


def _create(opts: Any, backend_options: Any) -> ProcessGroupPathweave:
    """The creator torch calls for ``init_process_group``/``new_group`` with this backend."""
    del backend_options  # no backend-specific options
    return ProcessGroupPathweave(
        opts.store, opts.group_rank, opts.group_size, opts.timeout,
        list(opts.global_ranks_in_group), Config.from_env(),
    )


def register() -> None:
    """Register the ``pathweave`` backend with ``torch.distributed`` (once per process)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True,
                                  devices=["cpu", "cuda"])
