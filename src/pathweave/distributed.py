"""Drop-in collectives that spread skewed traffic over every path of the fabric.

Same names, argument order and return conventions as ``torch.distributed``;
inside a job started with ``torchrun``::

    import pathweave.distributed as pwd
    pwd.all_to_all_single(out, inp, out_splits, in_splits)

Each function uses a per-group default :class:`~pathweave.Orchestrator`
(created on first use with the fabric from ``PATHWEAVE_FABRIC`` or the launch
environment, see :func:`pathweave.runtime.orchestrator.default_fabric`), or
the one passed as ``orchestrator=``.

No code change at all: after ``import pathweave.distributed`` the
``pathweave`` backend is registered, and a job that calls
``torch.distributed.init_process_group("pathweave")`` sends its plain
``torch.distributed.all_to_all_single``/``all_to_all`` through pathweave
(:mod:`pathweave.runtime.backend`); everything else runs on gloo or NCCL.

``send``/``recv``/``isend``/``irecv`` are torch's own: single-path
point-to-point between two ranks, no other rank joins (on a ``pathweave``
group they run on its inner gloo/NCCL backend).
``batch_isend_irecv`` is the multi-path form and a **collective** here:
every rank of the group calls it, possibly with an empty list. A large
message is split over several paths, some through forwarding ranks, and
those ranks must take part in the step even if they send nothing
themselves (NIMBLE hooks into NCCL group calls the same way). torch's own
``batch_isend_irecv`` only needs the ranks that have messages.

Examples
--------
>>> import pathweave.distributed as pwd
>>> pwd.P2POp is __import__("torch").distributed.P2POp
True
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import P2POp, irecv, isend, recv, send

from pathweave.runtime import backend as _backend
from pathweave.runtime.orchestrator import Orchestrator

_backend.register()

__all__ = [
    "Orchestrator",
    "P2POp",
    "absorb_plane_words",
    "all_to_all",
    "all_to_all_single",
    "batch_isend_irecv",
    "config_digest",
    "default_orchestrator",
    "irecv",
    "isend",
    "plane_words",
    "recv",
    "run_group",
    "send",
    "set_default_orchestrator",
]

class _World:
    """The key of the default group's default orchestrator (whichever group is the default)."""


_WORLD = _World()
#: Weak keys: a subgroup destroyed by its owner is freed, not kept alive (its
#: backend's threads running) by its default orchestrator until interpreter exit.
_DEFAULTS: weakref.WeakKeyDictionary[Any, Orchestrator] = weakref.WeakKeyDictionary()


def _key(group: Any) -> Any:
    return _WORLD if group is None or group is dist.group.WORLD else group


def _pathweave_group(group: Any) -> _backend.ProcessGroupPathweave | None:
    """``group`` (``None``: the default group) if it is a ``pathweave`` backend group."""
    if group is None and dist.is_initialized():
        group = dist.group.WORLD
    return group if isinstance(group, _backend.ProcessGroupPathweave) else None


def default_orchestrator(group: Any = None) -> Orchestrator:
    """The default orchestrator of ``group`` (created with default settings on first use).

    For a group of the ``pathweave`` backend (``init_process_group("pathweave")``)
    it is the group's own orchestrator, the one plain ``torch.distributed``
    all-to-alls on the group use, configured from the environment; its
    ``stats`` count those calls.
    """
    pw = _pathweave_group(group)
    if pw is not None and _key(group) not in _DEFAULTS:
        return pw.orchestrator
    key = _key(group)
    orch = _DEFAULTS.get(key)
    if orch is None:
        orch = _DEFAULTS[key] = Orchestrator()
    return orch


def set_default_orchestrator(orchestrator: Orchestrator | None, group: Any = None) -> None:
    """Make ``orchestrator`` the default of ``group`` (``None``: forget it)."""
    if orchestrator is not None and not isinstance(orchestrator, Orchestrator):
        raise TypeError(f"orchestrator must be an Orchestrator, got {type(orchestrator).__name__}")
    key = _key(group)
    if orchestrator is None:
        _DEFAULTS.pop(key, None)
    else:
        _DEFAULTS[key] = orchestrator


def _resolve(
    orchestrator: Orchestrator | None, group: Any, device: Any = "cpu"
) -> tuple[Orchestrator, Any]:
    """The orchestrator of a call and the group it runs on.

    A ``pathweave`` backend group runs its orchestrator on its inner gloo or
    NCCL group (by the tensors' ``device``), never on itself.
    """
    if orchestrator is None:
        orchestrator = default_orchestrator(group)
    elif not isinstance(orchestrator, Orchestrator):
        raise TypeError(f"orchestrator must be an Orchestrator, got {type(orchestrator).__name__}")
    return orchestrator, run_group(group, device)


def run_group(group: Any = None, device: Any = "cpu") -> Any:
    """The process group a pathweave exchange on ``group`` runs on.

    A ``pathweave`` backend group hands its exchanges to its inner gloo or
    NCCL group (chosen by the tensors' ``device``); any other group runs
    them itself. Layers that exchange on their own (the MoE layer's
    low-latency mode without an orchestrator) use this group.

    >>> run_group("some group") == "some group"
    True
    """
    pw = _pathweave_group(group)
    if pw is not None:
        _, group = pw.route(device)
    return group


def all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Any = None,
    async_op: bool = False,
    *,
    orchestrator: Orchestrator | None = None,
    split_matrix: Any = None,
    config: Any = None,
    config_digests: Any = None,
) -> Any:
    """Split ``input``, scatter the pieces to all ranks, gather theirs into ``output``.

    Same semantics as :func:`torch.distributed.all_to_all_single`: rows
    (first dimension) ``input_split_sizes[j]`` go to rank ``j``, rows from
    rank ``i`` land in ``output`` in rank order; ``None`` splits the first
    dimension equally. Every dtype moves as bytes, so bool, bfloat16 and fp8
    (as ``uint8``) work on every backend.

    Parameters
    ----------
    output, input
        Tensors on the group's device (CPU for gloo, CUDA for NCCL) with the
        same dtype and row shape on every rank.
    output_split_sizes, input_split_sizes
        Rows per peer; ``None``: equal split.
    group
        Process group (``None``: the default group).
    async_op
        Return a handle whose ``wait()`` completes the exchange. With
        forwarding ranks the forwarding finishes before returning (the
        handle then covers this rank's own sends and receives); direct-only
        plans and torch's path overlap entirely.
    orchestrator
        The :class:`~pathweave.Orchestrator` to use; default: the group's.
    split_matrix
        ``int[N, N]`` (array or tensor): rows rank ``s`` sends to rank ``d``
        for every pair, for a caller that already holds every rank's splits
        from a collective of its own (so the matrix is the same on every
        rank). Only this rank's arguments are checked against it (its splits
        against row ``rank`` and column ``rank``, sums, dtype and row shape
        of its tensors); a mismatch raises on this rank only, before any data
        moves, and its peers then fail with ``CommError`` at the timeout.
        The configuration is still checked on every rank by a metadata
        exchange (one small collective), unless ``config_digests`` vouch for
        it. Every rank must pass it or none.
    config
        More named settings (``{"moe.num_experts": 64}``) for the
        configuration fingerprint every rank checks against rank 0's.
    config_digests
        With ``split_matrix``: ``int64[N]``, every rank's :func:`config_digest`
        of this call, gathered by the caller's own collective with the
        matrix. The call then skips its metadata exchange; digests that
        differ make every rank exchange once and raise the same
        ``ValueError`` naming the setting.

    Returns
    -------
    None, or a handle with ``wait()`` when ``async_op`` is true.

    Raises
    ------
    ValueError, TypeError
        Bad arguments on any rank, or a configuration (fabric, policy,
        chunk_bytes, ...) that differs from rank 0's, raised on every rank
        before data moves; the message names the rank, the pair or setting
        and the values.
    pathweave.errors.CommError
        A transfer failed or ran past the orchestrator's ``timeout_s``, on
        either path. ``output`` is written only after every byte arrived, so
        a failed call leaves it untouched.
    """
    orch, group = _resolve(orchestrator, group, getattr(input, "device", "cpu"))
    return orch.all_to_all_single(
        output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op,
        split_matrix=split_matrix, config=config, config_digests=config_digests,
    )


def config_digest(
    group: Any = None, *, orchestrator: Orchestrator | None = None, config: Any = None,
    device: Any = "cpu",
) -> int:
    """This rank's configuration digest of an :func:`all_to_all_single` on ``group``.

    A caller that gathers the split matrix in a collective of its own
    gathers this number with it and passes every rank's as
    ``config_digests``: the call then needs no exchange of its own, and a
    configuration that differs on some rank still raises on every rank at
    once. ``device``: the tensors' device (a ``pathweave`` group runs its
    orchestrator on the inner group of that device).
    """
    orch, group = _resolve(orchestrator, group, device)
    return orch.config_digest(group, config)


def plane_words(
    group: Any = None, *, orchestrator: Orchestrator | None = None, device: Any = "cpu",
) -> np.ndarray:
    """This rank's data-plane state words, for a caller's own row exchange.

    A caller that passes ``split_matrix`` skips the data plane's metadata
    exchange, and with it the words by which the group learns from its
    transfers (:mod:`pathweave.runtime.telemetry`) and checks that its ranks
    are in step. It appends these words (``int64``, a fixed width) to the
    row it gathers anyway and passes every rank's to
    :func:`absorb_plane_words`. ``device``: the tensors' device, as for
    :func:`config_digest`.
    """
    orch, group = _resolve(orchestrator, group, device)
    return orch.plane_words(group)


def absorb_plane_words(
    rows: Any, group: Any = None, *, orchestrator: Orchestrator | None = None,
    device: Any = "cpu",
) -> None:
    """Every rank's :func:`plane_words` (``int64[N, width]``, in rank order), gathered.

    A collective: every rank calls it after the same exchange.
    """
    orch, group = _resolve(orchestrator, group, device)
    orch.absorb_plane_words(rows, group)


def all_to_all(
    output_tensor_list: Sequence[torch.Tensor],
    input_tensor_list: Sequence[torch.Tensor],
    group: Any = None,
    async_op: bool = False,
    *,
    orchestrator: Orchestrator | None = None,
) -> Any:
    """Send ``input_tensor_list[j]`` to rank ``j``; rank ``i``'s lands in ``output_tensor_list[i]``.

    Same semantics as :func:`torch.distributed.all_to_all` (tensors of any
    shape, one dtype, one device, as many as ranks), run as one
    :meth:`~pathweave.Orchestrator.all_to_all_single` of the flattened
    tensors (a copy of the inputs in and of the outputs out), so it plans,
    validates and accounts exactly like it. A tensor whose size does not
    match its peer's raises the same ``ValueError`` on every rank before
    data moves (the split sizes it names are element counts), and so do
    lists that break the rules above on any rank.

    Returns
    -------
    None, or a handle with ``wait()`` when ``async_op`` is true.
    """
    device = _backend.list_device(input_tensor_list, output_tensor_list)
    orch, group = _resolve(orchestrator, group, device)
    work = _backend.all_to_all_list(orch, output_tensor_list, input_tensor_list, group,
                                    async_op=async_op)
    return work if async_op else None


def batch_isend_irecv(
    p2p_op_list: Sequence[P2POp], group: Any = None, *, orchestrator: Orchestrator | None = None
) -> list[Any]:
    """Send and receive a batch of messages as one collective step over many paths.

    Every rank of ``group`` must call it (an empty list is fine). Ops are
    ``P2POp(isend | irecv, tensor, peer, group, tag)`` (torch's own type, also
    exported here); a send matches the receive on its peer with the same tag,
    in list order, and both must have the same byte size and dtype.

    Returns
    -------
    list
        One handle per op, like torch's; ``wait()`` on any completes all.
    """
    ops = list(p2p_op_list)
    device = next((op.tensor.device for op in ops if isinstance(op, P2POp)), "cpu")
    orch, run_group = _resolve(orchestrator, group, device)
    pw = _pathweave_group(group)
    if pw is not None:
        ops = [_onto(op, pw, run_group) for op in ops]
    return orch.batch_isend_irecv(ops, group=run_group)


def _onto(op: Any, pw: Any, inner: Any) -> Any:
    """``op`` of the ``pathweave`` group ``pw`` moved onto its inner group (same peer, tag)."""
    if isinstance(op, P2POp) and _pathweave_group(op.group) is pw:
        return P2POp(op.op, op.tensor, op.peer, inner, op.tag)
    return op  # not ours to move: the orchestrator names the problem
