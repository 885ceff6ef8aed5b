"""The process group a call runs on: its fabric, its hosts, what an orchestrator keeps of it.

A group's fabric is the orchestrator's ``fabric`` setting or, when none is
given, :func:`default_fabric` (``PATHWEAVE_FABRIC``, NCCL's topology file,
or DGX H100-like nodes shaped by the ranks per host, :func:`hosts_shape`).
Every member's host word is gathered once per group (:func:`_group_hosts`),
on every rank alike. :class:`_GroupState` holds the group's transport,
fabric, path set, caches (:class:`~pathweave._cache.Cache`) and live
adaptation. The public names are re-exported by
:mod:`pathweave.runtime.orchestrator`.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from pathweave._cache import Cache
from pathweave.errors import FabricError
from pathweave.fabric import Fabric, PathSet, resolve
from pathweave.runtime.config import FABRIC_ENV
from pathweave.runtime.schedule import path_routes

# The orchestrator's logger: its log lines keep the name users filter on.
log = logging.getLogger("pathweave.runtime.orchestrator")

#: NCCL's topology file, read when no :data:`FABRIC_ENV` is set.
NCCL_TOPO_ENV = "NCCL_TOPO_FILE"

#: Fabric meta key of a stand-in fabric: the group runs torch's own all-to-all
#: (the reason as its value).
TORCH_ONLY = "torch_only"


class SubgroupWarning(UserWarning):
    """A subgroup's ranks cannot form a fabric; its all-to-alls run torch's collective."""


def default_fabric(
    group_size: int, *, is_world: bool = True, global_ranks: Sequence[int] | None = None,
    hosts: Sequence[int] | None = None,
) -> Fabric:
    """The fabric a job runs on when none is given.

    ``PATHWEAVE_FABRIC`` (a preset spec or a fabric file) if set; for a
    subgroup (``global_ranks``: its members' ranks in the default group) of
    a job whose ``PATHWEAVE_FABRIC`` describes the whole job, the part of
    that fabric its members hold (:meth:`~pathweave.fabric.Fabric.subset`),
    or, where their nodes hold different numbers of members, a stand-in
    fabric on which the group always runs torch's own all-to-all (a
    :class:`SubgroupWarning` says so, once per group). Else ``NCCL_TOPO_FILE``
    if set (:func:`~pathweave.fabric.from_nccl_xml`, one node per distinct
    ``hosts`` word). Otherwise DGX
    H100-like nodes (``dgx-h100``: NVSwitch inside, one 400 Gb/s NIC per
    GPU on its own rail), shaped by the ranks per host (:func:`hosts_shape`)
    when ``hosts`` (every member's :func:`~pathweave.runtime.telemetry.host_word`,
    in group rank order; the :class:`Orchestrator` gathers them on a group's
    first use) are given, else by ``LOCAL_WORLD_SIZE`` GPUs per node (as
    ``torchrun`` sets it; one node of the whole group if unset or if the
    group is not the default group). Its ``num_ranks`` must equal the group
    size. The fabric and where it came from are logged at INFO.
    """
    spec = os.environ.get(FABRIC_ENV)
    if spec:
        fab = resolve(spec)
        where = f"{FABRIC_ENV}={spec!r}"
        ranks = None if is_world or global_ranks is None else list(global_ranks)
        if ranks and fab.num_ranks != group_size and max(ranks) < fab.num_ranks:
            fab = _subgroup_fabric(fab, ranks, where)
            where = f"the part of {where} that ranks {ranks} hold"
    elif os.environ.get(NCCL_TOPO_ENV):
        fab, where = _nccl_topo_fabric(os.environ[NCCL_TOPO_ENV], hosts)
    else:
        from pathweave.fabric import preset

        local = os.environ.get("LOCAL_WORLD_SIZE", "")
        per_node = group_size
        lws = int(local) if local.strip().isdigit() and int(local) > 0 else None
        if hosts is not None:
            per_node, where = hosts_shape(hosts, lws if is_world else None)
        else:
            if is_world and lws and group_size % lws == 0:
                per_node = lws
            where = f"LOCAL_WORLD_SIZE={local or 'unset'}"
        fab = preset("dgx-h100", nodes=group_size // per_node, gpus_per_node=per_node)
        where = (f"no {FABRIC_ENV}: {group_size // per_node} dgx-h100 node(s) of {per_node} "
                 f"GPUs from {where}; set {FABRIC_ENV} to a preset or fabric file for the "
                 "real topology")
    if fab.num_ranks != group_size:
        raise FabricError(
            f"fabric {fab.name!r} from {where} has {fab.num_ranks} ranks but the process "
            f"group has {group_size}"
        )
    log.info("fabric %s (%d ranks) from %s", fab.name, fab.num_ranks, where)
    return fab


def _nccl_topo_fabric(path: str, hosts: Sequence[int] | None) -> tuple[Fabric, str]:
    """The fabric of NCCL's topology file ``path``: one node per host (one if unknown)."""
    from pathweave.fabric import from_nccl_xml

    nodes = len(set(hosts)) if hosts is not None else 1
    where = f"{NCCL_TOPO_ENV}={path!r}, {nodes} node(s) from the ranks' hosts"
    return from_nccl_xml(path, nodes=nodes), where  # default_fabric checks the rank count


def hosts_shape(hosts: Sequence[int], local_world_size: int | None = None) -> tuple[int, str]:
    """GPUs per node of the default fabric, from every rank's host word, and how it was found.

    The ranks of each host must be consecutive (``torchrun`` numbers them
    node-major) and every host must hold as many; a host's ranks form one
    node, or nodes of ``local_world_size`` where that divides them (one
    machine standing in for several nodes, as the tests and the emulator
    do). Anything else raises :class:`~pathweave.errors.FabricError` saying
    how to name the fabric instead.

    Examples
    --------
    >>> hosts_shape([7, 7, 9, 9])
    (2, '2 host(s) x 2 rank(s)')
    >>> hosts_shape([7, 7, 7, 7], 2)
    (2, '1 host(s) x 4 rank(s), LOCAL_WORLD_SIZE=2')
    >>> hosts_shape([7, 9, 7, 9])
    Traceback (most recent call last):
    ...
    pathweave.errors.FabricError: the ranks of a host are not consecutive (rank 2 is on the host of rank 0, rank 1 is not); pathweave cannot shape a fabric from the hosts: number ranks node-major (as torchrun does) or set PATHWEAVE_FABRIC to a fabric file in this job's rank order
    """  # noqa: E501
    h = np.asarray(hosts)
    n = h.size
    starts = np.r_[0, np.flatnonzero(h[1:] != h[:-1]) + 1]
    seen: dict[int, int] = {}
    for s in starts.tolist():
        first = seen.setdefault(int(h[s]), s)
        if first != s:
            gap = int(np.flatnonzero(h[first:s] != h[s])[0]) + first
            raise FabricError(
                f"the ranks of a host are not consecutive (rank {s} is on the host of rank "
                f"{first}, rank {gap} is not); pathweave cannot shape a fabric from the hosts: "
                f"number ranks node-major (as torchrun does) or set {FABRIC_ENV} to a fabric "
                "file in this job's rank order"
            )
    counts = np.diff(np.r_[starts, n])
    if (counts != counts[0]).any():
        i = int(np.flatnonzero(counts != counts[0])[0])
        raise FabricError(
            f"hosts run different numbers of ranks (rank {int(starts[0])}'s host {int(counts[0])}, "
            f"rank {int(starts[i])}'s host {int(counts[i])}); pathweave's default fabric needs "
            f"as many on every host: start as many ranks per host (torchrun "
            f"--nproc-per-node) or set {FABRIC_ENV} to a fabric file with {n} ranks"
        )
    per_host = int(counts[0])
    text = f"{starts.size} host(s) x {per_host} rank(s)"
    if local_world_size and per_host % local_world_size == 0 and local_world_size != per_host:
        return local_world_size, f"{text}, LOCAL_WORLD_SIZE={local_world_size}"
    return per_host, text


#: Every rank's host word per process group, gathered on the group's first use
#: by an orchestrator without a fabric (hosts never change; a fresh orchestrator
#: on some ranks only must not start a collective its peers do not).
_GROUP_HOSTS: weakref.WeakKeyDictionary[Any, np.ndarray] = weakref.WeakKeyDictionary()


def _group_hosts(tr: Any, timeout_s: float) -> np.ndarray:
    """Every member's host word (:func:`~pathweave.runtime.telemetry.host_word`), once per group."""
    from pathweave.runtime.telemetry import host_word

    pg = tr.group if tr.group is not None else _dist().group.WORLD
    hosts = _GROUP_HOSTS.get(pg)
    if hosts is None:
        row = np.array([host_word()], dtype=np.int64)
        hosts = _GROUP_HOSTS[pg] = tr.exchange(row, time.monotonic() + timeout_s)[:, 0].copy()
    return hosts


def _subgroup_fabric(fab: Fabric, ranks: list[int], where: str) -> Fabric:
    """The part of the job's fabric a subgroup holds, or a torch-only stand-in."""
    try:
        return fab.subset(ranks, name=f"{fab.name}[{','.join(map(str, ranks))}]")
    except FabricError as exc:
        import warnings

        from pathweave.fabric import preset

        reason = (f"subgroup of ranks {ranks} of {where}: {exc}; its all-to-alls run torch's "
                  "own collective")
        warnings.warn(reason, SubgroupWarning, stacklevel=3)
        log.warning("%s", reason)
        stand_in = preset("dgx-h100", nodes=1, gpus_per_node=len(ranks))
        return Fabric(name=f"torch-only[{','.join(map(str, ranks))}]",
                      vertex_names=stand_in.vertex_names, vertex_kind=stand_in.vertex_kind,
                      vertex_node=stand_in.vertex_node, link_src=stand_in.link_src,
                      link_dst=stand_in.link_dst, link_kind=stand_in.link_kind,
                      capacity_Bps=stand_in.capacity_Bps, latency_s=stand_in.latency_s,
                      meta={TORCH_ONLY: reason})


# ------------------------------------------------------------ group state
class _GroupState:
    """What an orchestrator keeps per process group."""

    def __init__(self, transport: Any, fabric: Fabric, paths: PathSet, cache_size: int = 64):
        self.transport = transport
        self.fabric = fabric
        self.paths = paths
        self.routes = path_routes(paths)
        n = fabric.num_ranks
        first = paths.pair_ptr[:-1].astype(np.int64).copy()
        first[:: n + 1] = 0  # the diagonal has no paths; never used
        self.default_path = first
        #: quantised demand key -> the decision taken the last time it was seen
        self.plans = Cache(cache_size)
        self.schedules = Cache(cache_size)
        self.current: Any = None  # the decision in force (a _decision._Decision), or None
        self.last_qkey: bytes | None = None
        # (metadata key, decoded layout, decision, bytes moved) of the last call of any op
        self.last_call: tuple[Any, ...] = (None, None, None, 0)
        self.matrix_call: Any = None  # _validate.check_matrix_call's last result
        self.next_ident = 1
        self.fabric_text = f"{fabric.name} (content {_fabric_digest(fabric)})"
        self.fingerprints = Cache(cache_size)  # field values -> words
        #: (config, words) of the last call made without extra fields
        self.config_words: tuple[Any, Any] = (None, None)
        self._scratch: Any = None
        # --- live adaptation (pathweave.runtime.telemetry): plans are made on
        # plan_fabric / plan_paths, the nominal fabric until estimates move.
        self.adapt: Any = None
        #: every rank's host word, from the group's first exchange of plane words
        #: (adapt="auto" decides on it)
        self.hosts: np.ndarray | None = None
        #: why this group's ranks are out of step (raised by the next call), or None
        self.out_of_step: str | None = None
        self.plan_fabric = fabric
        self.plan_paths = paths
        #: (ident, reason category) of the last decision logged
        self.logged_decision: tuple[int, str] | None = None

    def scratch(self, like: Any, *, reuse: bool) -> Any:
        """An uninitialised tensor shaped like ``like`` that receives a call's bytes.

        With ``reuse`` (a blocking call) it is a view of one buffer kept per
        group: the call is over before the next can use it (on NCCL in stream
        order: the next call's receives wait for the current stream, which
        holds this call's copy out of it). A fresh CPU allocation of an
        output's size costs a page fault per page (about as much as copying
        it), and the executor keeps its views of the same memory from call
        to call (``Transport.run(keep=True)``).
        """
        import torch

        if not reuse:
            return torch.empty(like.shape, dtype=like.dtype, device=like.device)
        nbytes = like.numel() * like.element_size()
        buf = self._scratch
        if buf is None or buf.numel() < nbytes or buf.device != like.device:
            buf = self._scratch = torch.empty(nbytes, dtype=torch.uint8, device=like.device)
        return buf[:nbytes].view(like.dtype).view(like.shape)

    def drop_scratch(self) -> None:
        """Forget the reused scratch buffer (after a failed call)."""
        self._scratch = None


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def _live_group(group: Any) -> Any:
    """The process group object ``group`` names (``None``: the default group, when there is one)."""
    if group is not None:
        return group
    dist = _dist()
    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


def _is_world(g: Any) -> bool:
    return g is _dist().group.WORLD


def _fabric_digest(fab: Fabric) -> str:
    """A short hash of everything in ``fab`` (two fabrics with one name may differ)."""
    import hashlib
    import json

    from pathweave.fabric import to_dict

    text = json.dumps(to_dict(fab), sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()
