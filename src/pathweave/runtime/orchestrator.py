"""The :class:`Orchestrator`: metadata exchange, planning, plan cache, execution, statistics.

One call of :meth:`Orchestrator.all_to_all_single` on every rank of a group:

1. **exchange**: each rank encodes its arguments (splits, dtype, row shape,
   any local problem) and its configuration fingerprint in one ``int64``
   row; one all-gather gives every rank every row; every rank validates them
   the same way, so bad input or a differing configuration raises the same
   error everywhere before any data moves;
2. **plan**: the demand matrix (bytes per pair) is quantised to 5
   significant bits; a plan per quantised demand is cached, so a repeated
   pattern costs no planning and keeps its decision; for a new pattern,
   hysteresis keeps the current plan unless a new one is better by a clear
   margin; with ``enabled="auto"`` the exchange uses
   several paths only where the plan predicts a real gain over ``static``,
   otherwise torch's own ``all_to_all_single`` runs;
3. **schedule**: the plan's split of each pair is applied to the exact bytes
   and cut into a per-rank schedule of chunked point-to-point operations
   (:mod:`pathweave.runtime.schedule`), cached by the exact metadata;
4. **execute** on ``torch.distributed`` (:mod:`pathweave.runtime.executor`)
   on normalised buffers (a dense input, a scratch output copied back on
   success), or torch's own collective on the same buffers;
5. **account** in :class:`OrchestratorStats`;
6. **adapt** (``adapt=True``; by default on gloo groups that span hosts,
   :func:`~pathweave.runtime.telemetry.adapt_auto`; ``PATHWEAVE_ADAPT``): the
   completion times of this rank's receives (a plan's first call, then
   every 8th), one word per stream into the rank, follow the next metadata
   exchange (an ``all_to_all_single``'s, or the MoE layer's own: every row
   says how many words its rank has, :meth:`Orchestrator.plane_words`, and
   one more small exchange carries them when every rank has them); every
   rank turns all ranks' times
   into the same per-link capacity estimates
   (:mod:`pathweave.runtime.telemetry`) and plans on them once they move
   1.5-fold beyond their noise (Hopper's probe rule behind a confidence
   test); hysteresis still decides the switch.

Steps 2 to 5 are one pipeline (``Orchestrator._pipeline``) for every op.
An op is an adapter: it exchanges and validates its own metadata, then
hands the pipeline a ``_Call``: a metadata key, ``decode()`` (its layout:
``pair_bytes`` and whatever its segments need), ``segments(layout)`` (its
buffers' byte ranges per pair, :class:`~pathweave.runtime.schedule.Segments`)
and ``buffers(multipath)`` (normalised send and receive buffers, torch's own
collective on them, the copy back). ``all_to_all_single`` and
``batch_isend_irecv`` are the two adapters today.

Every rank holds the same metadata and the same history of calls, so every
rank makes the same decisions without talking about them.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from pathweave._log import TRACE
from pathweave.errors import CommError, FabricError, PlanError
from pathweave.fabric import Fabric, PathSet, candidate_paths, resolve
from pathweave.fabric.paths import ROLES
from pathweave.plan import Plan
from pathweave.runtime import _validate as V
from pathweave.runtime.config import FABRIC_ENV, MAX_WINDOW, MIN_CHUNK_BYTES, Config
from pathweave.runtime.schedule import (
    RankSchedule,
    Segments,
    build_schedule,
    path_routes,
    split_fragments,
)

__all__ = [
    "MAX_WINDOW", "MIN_CHUNK_BYTES", "CallStats", "Orchestrator", "OrchestratorStats",
    "default_fabric", "quantise", "split_options",
]

log = logging.getLogger(__name__)

#: NCCL's topology file, read when no :data:`FABRIC_ENV` is set.
NCCL_TOPO_ENV = "NCCL_TOPO_FILE"
PolicyArg = str | Callable[[Fabric, np.ndarray], Plan]
#: Words of data-plane state every metadata row carries (:meth:`Orchestrator.plane_words`):
#: the rank's host word, how many telemetry words it has to send, its multi-path calls.
PLANE_WORDS = 3


# ------------------------------------------------------------------- stats
@dataclass
class CallStats:
    """Timing breakdown of one call, in seconds.

    ``meta_s``: metadata exchange and validation; ``plan_s``: planning and
    scheduling (near 0 when cached); ``transfer_s``: moving the bytes (for an
    ``async_op`` call that returned before the bytes arrived, the time to
    post them); ``cached``: no planning was needed; ``multipath``: the
    pathweave executor ran (else torch's own collective did).
    """

    op: str
    bytes: int
    meta_s: float
    plan_s: float
    transfer_s: float
    cached: bool
    multipath: bool

    @property
    def total_s(self) -> float:
        return self.meta_s + self.plan_s + self.transfer_s


@dataclass
class OrchestratorStats:
    """Counters of an :class:`Orchestrator`, the same on every rank of its group.

    ``bytes_per_link`` counts the bytes each directed fabric link carried
    (every hop of every multi-path transfer, all ranks' traffic);
    ``bytes_per_path_kind`` the bytes per path role (direct, relay, matched,
    rd, dr, drd, spine) and ``torch`` for calls handed to torch.
    ``bytes_total`` counts bytes between distinct ranks (a rank's bytes to
    itself are a local copy and counted nowhere).
    """

    calls: int = 0
    plans_made: int = 0
    cache_hits: int = 0
    multipath_calls: int = 0
    plan_switches: int = 0
    bytes_total: int = 0
    bytes_per_link: np.ndarray = field(default_factory=lambda: np.zeros(0))
    bytes_per_path_kind: dict[str, int] = field(default_factory=dict)
    last_call: CallStats | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view (the link vector as a list)."""
        return {
            "calls": self.calls,
            "plans_made": self.plans_made,
            "cache_hits": self.cache_hits,
            "multipath_calls": self.multipath_calls,
            "plan_switches": self.plan_switches,
            "bytes_total": self.bytes_total,
            "bytes_per_link": self.bytes_per_link.tolist(),
            "bytes_per_path_kind": dict(self.bytes_per_path_kind),
            "last_call": None if self.last_call is None else {
                **self.last_call.__dict__, "total_s": self.last_call.total_s
            },
        }


# --------------------------------------------------------------- decisions
@dataclass(frozen=True, eq=False)
class _Decision:
    """How a demand is routed: multi-path flows, or torch's collective."""

    ident: int
    multipath: bool
    flow_pair: np.ndarray
    flow_path: np.ndarray
    flow_weight: np.ndarray
    predicted_s: float  # predicted time (time model) of this decision on its demand
    static_s: float
    #: Why torch's collective runs: ``"category: detail"`` (the log's text; the
    #: category alone marks a change of decision). Empty for a multi-path plan.
    reason: str = ""


def quantise(pair_bytes: np.ndarray) -> np.ndarray:
    """Round each entry down to 5 significant bits (relative error < 1/16); zero stays zero.

    Demands that differ only by a few percent share a cached plan.

    Examples
    --------
    >>> import numpy as np
    >>> quantise(np.array([0, 1, 17, 1000, 1 << 30])).tolist()
    [0, 1, 17, 992, 1073741824]
    """
    x = np.asarray(pair_bytes, dtype=np.int64)
    mant, exp = np.frexp(x.astype(np.float64))
    q = np.ldexp(np.floor(mant * 32) / 32, exp)  # mant in [0.5, 1): 5 bits incl. the leading 1
    return np.minimum(q.astype(np.int64), x)


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
class _LRU:
    """A cache that keeps the ``size`` most recently used entries (a hit counts as a use)."""

    def __init__(self, size: int):
        self.size = size
        self._d: OrderedDict[Any, Any] = OrderedDict()

    def get(self, key: Any) -> Any:
        value = self._d.get(key)
        if value is not None:
            self._d.move_to_end(key)
        return value

    def put(self, key: Any, value: Any) -> None:
        self._d[key] = value
        self._d.move_to_end(key)
        while len(self._d) > self.size:
            self._d.popitem(last=False)

    def __contains__(self, key: Any) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)


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
        self.plans = _LRU(cache_size)
        self.schedules = _LRU(cache_size)
        self.current: _Decision | None = None
        self.last_qkey: bytes | None = None
        # (metadata key, decoded layout, decision) of the last call of any op
        self.last_call: tuple[Any, ...] = (None, None, None)
        self.matrix_call: Any = None  # _validate.check_matrix_call's last result
        self.next_ident = 1
        self.fabric_text = f"{fabric.name} (content {_fabric_digest(fabric)})"
        self.fingerprints = _LRU(cache_size)  # field values -> words
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

        With ``reuse`` (a blocking call on the CPU) it is a view of one buffer
        kept per group: the call is over before the next can use it, and a
        fresh CPU allocation of an output's size costs a page fault per page
        (about as much as copying it). CUDA's caching allocator reuses memory
        by itself.
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


@dataclass(frozen=True, eq=False)
class _P2PLayout:
    matches: list[tuple[int, int, int, int, int]]
    pair_bytes: np.ndarray


def split_options(policy: str, min_split_bytes: int, chunk_bytes: int, *,
                  model: Any = None,
                  set_already: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The data plane's size threshold and chunk, and the time model, as options of ``policy``.

    Each where ``policy`` takes it (``model`` only if given). What the
    :class:`Orchestrator` passes its planner (options in ``set_already``
    win); :func:`pathweave.emulate.predict` plans with the same, so a
    prediction is of the plan the data plane runs.

    Examples
    --------
    >>> split_options("mwu", 65536, 524288)
    {'min_split_bytes': 65536, 'chunk_bytes': 524288}
    >>> split_options("static", 65536, 524288)
    {}
    """
    from pathweave.plan import policy_info

    opts = policy_info(policy).options
    mine: dict[str, Any] = {"min_split_bytes": int(min_split_bytes),
                            "chunk_bytes": int(chunk_bytes)}
    if model is not None:
        mine["model"] = model
    return {k: v for k, v in mine.items() if k in opts and k not in (set_already or {})}


class _Setting:
    """An :class:`Orchestrator` setting: reads its :class:`Config` field; setting it replaces
    the config with one that has the new value (checked as any config)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        return self if obj is None else getattr(obj.config, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        obj.config = obj.config.replace(**{self.name: value})


class Orchestrator:
    """Runs skewed exchanges over many paths on ``torch.distributed``.

    Parameters
    ----------
    fabric
        The hardware the group runs on (a :class:`~pathweave.fabric.Fabric`,
        a preset spec or a file); default :func:`default_fabric`. Its
        ``num_ranks`` must equal the size of every group it serves.
    policy
        A registered policy name; default :data:`pathweave.plan.DEFAULT_POLICY`
        (``"mwu"``, ``"optimal"``, ``"hscore"``, ...)
        or a callable ``(fabric, demand) -> Plan`` (``demand`` is the
        quantised ``int64[N, N]`` matrix); a callable lets tests force plans.
    min_split_bytes
        Pairs with fewer bytes go whole on their heaviest path; with
        ``enabled="auto"`` an exchange whose largest pair is below this goes
        to torch.
    chunk_bytes
        Chunk size of forwarded transfers (pipelining unit), at least
        :data:`MIN_CHUNK_BYTES` (4 KiB).
    window
        Staging slots per forwarded stream at each forwarding rank (2 to
        :data:`MAX_WINDOW`): at most ``window * chunk_bytes`` bytes of a
        stream sit at a relay.
    hysteresis
        A new plan replaces the current one only if its predicted time is
        lower by more than this fraction.
    enabled
        ``"auto"``: multi-path only where the plan's predicted time
        (:func:`pathweave.plan.predict_time`) beats ``static``'s by
        ``min_gain`` (large, skewed exchanges); ``True``: always; ``False``:
        always torch's own collectives (after the same validation).
    timeout_s
        Limit of one call; a call that cannot finish (a peer died) raises
        :class:`~pathweave.errors.CommError` on every surviving rank.
    min_gain
        Predicted speed-up over ``static`` that ``"auto"`` requires.
    cache_size
        Plans and schedules kept (least recently used are dropped).
    model
        The time model of the hardware (:class:`pathweave.sim.SimModel`):
        what ``"auto"``, hysteresis and a policy that takes a ``model``
        option (``mintime``, ``mwu_time``) predict with; default the model
        file ``PATHWEAVE_MODEL`` names (``pathweave calibrate`` writes one),
        else ``SimModel()``, fitted to the NIMBLE testbed. The emulator's ranks
        pass :func:`pathweave.emulate.emulator_model`.
    adapt
        Learn link capacities from this orchestrator's own transfers and plan
        on them (``docs/runtime.md``, "Live adaptation"): ``True``, ``False``
        or ``"auto"``, on for gloo groups whose ranks run on more than one
        host (:func:`~pathweave.runtime.telemetry.adapt_auto`: on one host the
        links are loopback). Default: ``PATHWEAVE_ADAPT`` (``1``, ``0`` or
        ``auto``), else ``"auto"``.
    config
        All of the above as one :class:`~pathweave.runtime.Config` (then pass
        no other setting); :attr:`config` is the one in use.
    **policy_options
        Options passed to a registered policy (checked by
        :func:`pathweave.plan.make`).

    Examples
    --------
    >>> import pathweave as pw
    >>> orch = pw.Orchestrator(fabric="h100-2x4", enabled=True, chunk_bytes=1 << 20)
    >>> orch.stats.calls
    0
    >>> pw.Orchestrator(window=1)
    Traceback (most recent call last):
    ...
    ValueError: window must be >= 2, got 1
    >>> pw.Orchestrator(chunk_bytes=3)
    Traceback (most recent call last):
    ...
    ValueError: chunk_bytes must be >= 4096, got 3
    """

    fabric = _Setting()
    policy = _Setting()
    policy_options = _Setting()
    min_split_bytes = _Setting()
    chunk_bytes = _Setting()
    window = _Setting()
    hysteresis = _Setting()
    enabled = _Setting()
    timeout_s = _Setting()
    min_gain = _Setting()
    cache_size = _Setting()
    adapt = _Setting()
    model = _Setting()

    def __init__(
        self,
        fabric: Fabric | str | None = None,
        policy: PolicyArg | None = None,
        min_split_bytes: int = 1 << 20,
        chunk_bytes: int = 1 << 20,
        window: int = 4,
        hysteresis: float = 0.1,
        enabled: bool | Literal["auto"] = "auto",
        timeout_s: float = 300.0,
        *,
        min_gain: float = 1.2,
        cache_size: int = 64,
        adapt: bool | str | None = None,
        model: Any = None,
        config: Config | None = None,
        **policy_options: Any,
    ):
        given = Config(fabric, policy, min_split_bytes, chunk_bytes, window, hysteresis,
                       enabled, timeout_s, min_gain, cache_size, adapt, model, policy_options)
        if config is None:
            config = given
        elif not isinstance(config, Config):
            raise TypeError(f"config must be a pathweave.runtime.Config, got "
                            f"{type(config).__name__}")
        elif given != Config():
            raise TypeError("pass the settings either as config= or as arguments, not both")
        cfg = config.with_env_defaults()
        #: Every setting, checked once; adapt and model filled from the environment, the
        #: model counting rounds as this executor runs them. The settings below read it,
        #: and setting one replaces it (checked again), so the two never disagree.
        self.config: Config = cfg.replace(model=_runtime_model(cfg))
        # Keyed by the process group itself (the default group's object, not
        # None) and weakly, so that a destroyed group is freed at once (its
        # backend's threads stopped before interpreter exit) and a group made
        # again after destroy_process_group gets a fresh state.
        self._groups: weakref.WeakKeyDictionary[Any, _GroupState] = weakref.WeakKeyDictionary()
        self.stats = OrchestratorStats()

    def __repr__(self) -> str:
        pol = self.policy if isinstance(self.policy, str) else getattr(
            self.policy, "__name__", "callable"
        )
        fab = self.fabric.name if self.fabric is not None else None
        return (
            f"Orchestrator(fabric={fab!r}, policy={pol!r}, enabled={self.enabled!r}, "
            f"chunk_bytes={self.chunk_bytes}, window={self.window})"
        )

    def reset_stats(self) -> None:
        """Zero the counters (caches stay)."""
        self.stats = OrchestratorStats()

    # ------------------------------------------------------------ groups
    def group_fabric(self, group: Any = None) -> Fabric:
        """The fabric this orchestrator plans ``group``'s calls on (found on first use).

        A collective on a group's first use (every rank gathers every rank's
        host, :func:`default_fabric`): call it on every rank.
        """
        return self._state(group).fabric

    def learned_capacities(self, group: Any = None) -> dict[int, float]:
        """Link id -> estimated share of nominal capacity for ``group``'s links that live
        adaptation (``adapt``) found below nominal; empty without adaptation or before the
        group's first call. Local: no collective.
        """
        key = _live_group(group)
        st = self._groups.get(key) if key is not None else None
        return {} if st is None or st.adapt is None else st.adapt.learned()

    def _state(self, group: Any) -> _GroupState:
        key = _live_group(group)
        st = self._groups.get(key) if key is not None else None
        if st is not None:
            return st
        from pathweave.runtime.executor import Transport

        tr = Transport(group)
        # On every rank, fabric given or not, so every rank meets the same collectives.
        hosts = _group_hosts(tr, self.timeout_s)
        if self.fabric is not None:
            fab = self.fabric
            if fab.num_ranks != tr.size:
                raise FabricError(
                    f"fabric {fab.name!r} has {fab.num_ranks} ranks but the process group "
                    f"has {tr.size}"
                )
            log.info("fabric %s (%d ranks) from the orchestrator's fabric argument",
                     fab.name, fab.num_ranks)
        else:
            fab = default_fabric(tr.size, is_world=group is None, global_ranks=tr.global_ranks,
                                 hosts=hosts)
        from pathweave.plan.registry import COMMON_OPTIONS

        kinds = self.policy_options.get("kinds", COMMON_OPTIONS["kinds"])
        max_hops = self.policy_options.get("max_hops", COMMON_OPTIONS["max_hops"])
        st = _GroupState(tr, fab, candidate_paths(fab, kinds, max_hops), self.cache_size)
        if self.adapt is True:
            from pathweave.runtime.telemetry import Adaptation

            st.adapt = Adaptation(fab, st.paths, tr.rank)
        if len(self.stats.bytes_per_link) != fab.num_links:
            self.stats.bytes_per_link = np.zeros(fab.num_links)
        self._groups[key] = st
        return st

    # ---------------------------------------------------------- planning
    def _plan(self, st: _GroupState, demand: np.ndarray) -> _Decision:
        from pathweave.plan import make

        self.stats.plans_made += 1
        static = make(st.plan_fabric, demand, "static", paths=st.plan_paths)
        if callable(self.policy):
            plan = self.policy(st.fabric, demand)
            if not isinstance(plan, Plan):
                raise PlanError(f"policy callable returned {type(plan).__name__}, not a Plan")
            if plan.paths.fabric is not st.fabric or plan.paths.num_paths != st.paths.num_paths:
                raise PlanError("policy callable returned a plan for another fabric or path set")
            plan.validate()
        else:
            plan = make(st.plan_fabric, demand, self.policy, paths=st.plan_paths,
                        **self._split_options(), **self.policy_options)
        from pathweave.plan import predict_time

        plan_s = predict_time(plan, self.model)
        # The fallback is torch's own collective: none of pathweave's per-round host cost.
        static_s = predict_time(static, _without_rounds(self.model))
        log.debug("planned %s: predicted %.1f us, static %.1f us", plan.policy, plan_s * 1e6,
                  static_s * 1e6)
        if self.enabled == "auto" and not plan_s * self.min_gain <= static_s:
            return self._fallback(st, static_s, (
                f"no gain: {plan.policy} predicted {plan_s * 1e6:.1f} us against static's "
                f"{static_s * 1e6:.1f} us, less than min_gain {self.min_gain}x"))
        keep = plan.flow_bytes > 0
        ps = st.paths
        fp = plan.flow_path[keep].astype(np.int64)
        pair = ps.src[fp].astype(np.int64) * ps.num_ranks + ps.dst[fp]
        ident = st.next_ident
        st.next_ident += 1
        return _Decision(ident, True, pair, fp, plan.flow_bytes[keep].astype(np.float64),
                         plan_s, static_s)

    def _split_options(self) -> dict[str, Any]:
        """``min_split_bytes``/``chunk_bytes``/``model`` for a registered policy that takes them."""
        return split_options(self.policy, self.min_split_bytes, self.chunk_bytes,
                             model=self.model, set_already=self.policy_options)

    @staticmethod
    def _fallback(st: _GroupState, static_s: float, reason: str) -> _Decision:
        empty = np.zeros(0, dtype=np.int64)
        return _Decision(0, False, empty, empty, np.zeros(0), static_s, static_s, reason)

    @staticmethod
    def _log_decision(st: _GroupState, dec: _Decision, op: str) -> None:
        """Log a decision that differs from the group's previous one (INFO)."""
        key = (dec.ident, dec.reason.split(":", 1)[0])
        if key == st.logged_decision:
            return
        st.logged_decision = key
        if dec.multipath:
            log.info("%s: multi-path plan #%d (predicted %.1f us, static %.1f us)", op,
                     dec.ident, dec.predicted_s * 1e6, dec.static_s * 1e6)
        else:
            log.info("%s: torch's collective (%s)", op, dec.reason)

    def _predict(self, st: _GroupState, dec: _Decision, demand: np.ndarray) -> float:
        """Predicted time (time model) of ``dec``'s splits applied to ``demand``."""
        covered = np.bincount(dec.flow_pair, weights=dec.flow_weight, minlength=demand.size) > 0
        if (demand.reshape(-1)[~covered] > 0).any():
            return float("inf")  # the plan has no path for some pair of this demand
        _, fpath, fbytes = split_fragments(
            dec.flow_pair, dec.flow_path, dec.flow_weight, demand,
            min_split_bytes=self.min_split_bytes,
        )
        from pathweave.plan.timemodel import time_terms

        return max(time_terms(st.plan_paths, fpath, np.asarray(fbytes, dtype=np.int64),
                              self.model))

    def _decide(self, st: _GroupState, pair_bytes: np.ndarray) -> tuple[_Decision, bool]:
        """The decision for this call and whether it cost no planning."""
        if self.enabled is False:
            return self._fallback(st, 0.0, "disabled: enabled=False"), True
        if TORCH_ONLY in st.fabric.meta:
            why = f"torch-only fabric: {st.fabric.meta[TORCH_ONLY]}"
            return self._fallback(st, 0.0, why), True
        q = quantise(pair_bytes)
        np.fill_diagonal(q, 0)
        if self.enabled == "auto" and int(q.max(initial=0)) < self.min_split_bytes:
            # Small exchanges: splitting costs more than it gains (NIMBLE's
            # size threshold); no planning, and the current plan stays for
            # the next large call.
            return self._fallback(st, 0.0, "small: every pair below min_split_bytes "
                                  f"({self.min_split_bytes} B)"), True
        key = q.tobytes() + (b"" if st.adapt is None else st.adapt.cap_key)
        if key == st.last_qkey and st.current is not None:
            return st.current, True
        taken = st.plans.get(key)
        if taken is not None:
            # A pattern decided before stands (MoE alternates dispatch and
            # combine): weighing it against the other pattern's plan again cost
            # a prediction per call (112 us at 8 ranks) and decided nothing new.
            st.current, st.last_qkey = taken, key
            return taken, True
        cand = self._plan(st, q)
        cur = st.current
        if cur is not None and cur is not cand:
            # Hysteresis: a new plan must beat the current one by a clear margin.
            cur_s = self._predict(st, cur, q) if cur.multipath else cand.static_s
            if not cand.predicted_s < cur_s * (1.0 - self.hysteresis):
                log.debug("hysteresis keeps the current decision: new %.1f us, current %.1f us",
                          cand.predicted_s * 1e6, cur_s * 1e6)
                cand = cur
            else:
                self.stats.plan_switches += 1
                log.info("plan switch: %s (%.1f us) replaces %s (%.1f us) on a new demand",
                         _decision_text(cand), cand.predicted_s * 1e6, _decision_text(cur),
                         cur_s * 1e6)
        st.current = cand
        st.last_qkey = key
        st.plans.put(key, cand)
        return cand, False

    # ------------------------------------------------------------ public
    def all_to_all_single(
        self,
        output: Any,
        input: Any,
        output_split_sizes: Sequence[int] | None = None,
        input_split_sizes: Sequence[int] | None = None,
        group: Any = None,
        async_op: bool = False,
        *,
        split_matrix: Any = None,
        config: Mapping[str, Any] | None = None,
        config_digests: Any = None,
        problem: V.ArgProblem | None = None,
    ) -> Any:
        """``torch.distributed.all_to_all_single`` over many paths; same arguments and result.

        Returns ``None``, or a handle with ``wait()`` if ``async_op``. Bad
        arguments, and a configuration that differs between ranks, raise the
        same ``ValueError``/``TypeError`` on every rank, naming the rank, the
        pair or setting and the values, before any data moves. ``output`` is
        written only once every byte has arrived: a call that fails leaves it
        untouched.

        ``split_matrix`` (keyword only): ``int[N, N]``, the rows every rank
        sends to every rank (``split_matrix[s, d]``), for a caller that already
        holds it from a collective of its own, hence identical on every rank.
        Only this rank's arguments are checked against it (its splits against
        its row and column of the matrix, its tensors' sums, dtypes and row
        shapes): they raise here, before any data moves, but only on this
        rank. Dtype and row shape must be the same on every rank, as the
        caller's own exchange should ensure. The configuration is still
        checked on every rank: by a metadata exchange, or, with
        ``config_digests``, without one.

        ``config_digests`` (keyword only, with ``split_matrix``): ``int64[N]``,
        every rank's :meth:`config_digest` of this call (``group`` and
        ``config``), gathered by the caller's own collective along with the
        matrix (the same on every rank). The call then skips its metadata
        exchange; if the digests differ, every rank exchanges once and raises
        the same ``ValueError`` naming the setting and both values. A
        configuration that changes on some ranks only is therefore caught at
        once on every rank, never by a timeout.

        ``config`` (keyword only): more named settings for the configuration
        fingerprint (:func:`pathweave.runtime._validate.fingerprint`), e.g. a
        layer's ``{"moe.num_experts": 64}``; names must not clash with the
        orchestrator's own.

        ``problem`` (keyword only): a problem an adapter found in this rank's
        own arguments (the list form's, :func:`pathweave.runtime.backend.all_to_all_list`);
        it travels in the metadata row instead of the tensors' facts, so every
        rank raises it.
        """
        t0 = time.perf_counter()
        st = self._state(group)
        tr = st.transport
        deadline = time.monotonic() + self.timeout_s
        words = self._fingerprint(st, config)

        def all_outs() -> np.ndarray:
            # Only when some rank's output-split digest disagrees: every rank is here.
            return tr.exchange(outs, deadline)

        if split_matrix is not None:
            # Checked once for the same arguments (_validate.check_matrix_call).
            st.matrix_call = mc = V.check_matrix_call(
                st.matrix_call, output, input, output_split_sizes, input_split_sizes, tr.rank,
                tr.size, words, split_matrix, config_digests, problem)
            row, outs, given, mkey = mc.row, mc.outs, mc.layout, mc.mkey
            if not mc.same_config:
                # Without digests, or with digests that differ (every rank holds the
                # same ones, so every rank is here): the exchange checks, and names.
                self._check_config(st, row, given, deadline, all_outs)

            def decode() -> V.A2ALayout:
                return given
        else:
            outs = np.zeros(tr.size, dtype=np.int64)
            row = V.encode_a2a(output, input, output_split_sizes, input_split_sizes, tr.size,
                               words, problem, outs)
            meta = self._exchange_rows(st, row, deadline)
            mkey = b"A" + meta.tobytes()

            def decode() -> V.A2ALayout:
                return V.decode_a2a(meta, all_outs)
        call = self._a2a_call(st, output, input, mkey, decode, reuse=not async_op)
        handle = self._pipeline(st, call, t0, deadline, wait=not async_op)
        return handle if async_op else None

    def batch_isend_irecv(self, ops: Sequence[Any], group: Any = None) -> list[Any]:
        """A collective step carrying a batch of point-to-point messages over many paths.

        Every rank of the group calls it (possibly with an empty list): large
        messages are split over several paths, and forwarding ranks must take
        part. Sends and receives match per (source, destination, tag) in list
        order, as in torch. Returns one handle per op (all complete together).
        Received tensors are written once every byte has arrived.
        """
        t0 = time.perf_counter()
        if isinstance(ops, (str, bytes)) or not isinstance(ops, Sequence):
            ops = list(ops)
        st = self._state(group)
        tr = st.transport
        deadline = time.monotonic() + self.timeout_s
        words = self._fingerprint(st, None)
        n = tr.size

        def peer_of(op: Any) -> int | None:
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

        def exchange(width: int, first: bool) -> np.ndarray:
            # The first exchange carries the plane words, as every call's does.
            row = np.r_[words, V.encode_p2p(ops, peer_of, n, width)]
            meta = self._exchange_rows(st, row, deadline) if first else tr.exchange(row, deadline)
            V.check_fingerprints(meta[:, : V.FP_WORDS], "batch_isend_irecv")
            return meta[:, V.FP_WORDS :]

        meta = exchange(8, first=True)
        bad = np.flatnonzero(meta[:, 0])
        if bad.size:
            V.raise_problem(int(bad[0]), meta[int(bad[0]), :4])
        counts = meta[:, 3]
        if int(counts.max(initial=0)) > 8:
            meta = exchange(int(counts.max()), first=False)

        def decode() -> _P2PLayout:
            tables = [
                meta[r, 4 : 4 + V.P2P_FIELDS * int(counts[r])].reshape(-1, V.P2P_FIELDS)
                for r in range(n)
            ]
            matches = V.match_p2p(tables)
            pair_bytes = np.zeros((n, n), dtype=np.int64)
            for s, d, _, _, nb in matches:
                pair_bytes[s, d] += nb
            return _P2PLayout(matches, pair_bytes)

        call = self._p2p_call(st, list(ops), b"P" + words.tobytes() + meta.tobytes(), decode)
        handle = self._pipeline(st, call, t0, deadline, wait=False)
        return [handle] * len(ops)

    # -------------------------------------------------------- op adapters
    def _a2a_call(
        self, st: _GroupState, output: Any, input: Any, mkey: bytes, decode: Callable[[], Any],
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
                scratch = st.scratch(output, reuse=reuse and output.device.type == "cpu")
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
                     timing, [output])

    def _p2p_call(
        self, st: _GroupState, ops: list[Any], mkey: bytes, decode: Callable[[], Any]
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

    # ------------------------------------------------------- op pipeline
    def _pipeline(
        self, st: _GroupState, call: _Call, t0: float, deadline: float, *, wait: bool
    ) -> Any:
        """decide -> schedule (cached) -> run -> account: the steps every op shares.

        The call's metadata is exchanged already (``t0`` is when the call
        began). Returns the handle, waited for if ``wait``.
        """
        from pathweave.runtime.executor import Handle

        tr = st.transport
        t1 = time.perf_counter()
        if call.mkey == st.last_call[0]:
            # The very same call as the last one: validated and decided then.
            _, layout, dec = st.last_call
            cached = True
        else:
            layout = call.decode()
            t1 = time.perf_counter()
            dec, cached = self._decide(st, layout.pair_bytes)
            st.last_call = (call.mkey, layout, dec)
            self._log_decision(st, dec, call.op)
        if st.out_of_step is not None:
            # Every rank read the same plane words: every rank raises here.
            msg, st.out_of_step = st.out_of_step, None
            raise ValueError(f"{call.op}: {msg}")
        pair_bytes = layout.pair_bytes
        total = int(pair_bytes.sum() - np.trace(pair_bytes))
        entry = None
        if dec.multipath:
            key = (call.mkey, dec.ident)
            entry = st.schedules.get(key)
            if entry is None:
                cached = False
                entry = self._schedule(st, dec, call.segments(layout), pair_bytes)
                st.schedules.put(key, entry)
        if st.adapt is not None:
            # On every rank alike (whether this rank times the call or not): the
            # plan of what the next row's words describe sets their number.
            # Rounds posted as groups (NCCL) are not timed.
            timed = entry is not None and call.timing is not None and not tr.grouped_rounds
            st.adapt.note(entry[3] if timed else None, entry[1] if timed else None)
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
                                wait=wait, finish=finish, timing=timing, outputs=call.outputs)
                if timing is not None:
                    st.adapt.observe([(s, last, sec) for (s, last), sec in handle.timings.items()])
            if wait:
                handle.wait()
        except CommError:
            # Receives of this call may still be posted into the group's reused
            # scratch; a later call must not share that memory with them.
            st.drop_scratch()
            raise
        self._account(call.op, total, entry, t0, t1, t2, cached)
        return handle

    def _fingerprint(self, st: _GroupState, extra: Mapping[str, Any] | None) -> np.ndarray:
        """This call's configuration as :func:`~pathweave.runtime._validate.fingerprint` words.

        Everything that shapes what a call does with the bytes: two ranks
        that differ in any of it would move different bytes (or wait for
        messages that never come).
        """
        pol = self.policy if isinstance(self.policy, str) else _callable_text(self.policy)
        fields: dict[str, Any] = {
            "fabric": st.fabric_text,
            "policy": pol,
            "policy options": sorted(self.policy_options.items()),
            "enabled": self.enabled,
            "chunk_bytes": self.chunk_bytes,
            "window": self.window,
            "min_split_bytes": self.min_split_bytes,
            "hysteresis": self.hysteresis,
            "min_gain": self.min_gain,
            "cache_size": self.cache_size,
            "adapt": self.adapt,
            "model": "default" if self.model is None else repr(self.model),
        }
        if extra:
            clash = sorted(set(extra) & set(fields))
            if clash:
                raise ValueError(f"config names {clash} clash with the orchestrator's own "
                                 "settings")
            fields.update(extra)
        key = tuple((k, str(v)) for k, v in fields.items())
        words = st.fingerprints.get(key)
        if words is None:
            words = V.fingerprint(fields)
            st.fingerprints.put(key, words)
        return words

    def config_digest(self, group: Any = None, config: Mapping[str, Any] | None = None) -> int:
        """A 63-bit digest of this rank's configuration of a call on ``group`` with ``config``.

        What a ``split_matrix`` caller gathers in its own collective and
        passes as ``config_digests`` (:meth:`all_to_all_single`): equal
        digests on every rank mean equal fingerprints.
        """
        return V.fingerprint_digest(self._fingerprint(self._state(group), config))

    def _check_config(
        self, st: _GroupState, row: np.ndarray, given: V.A2ALayout, deadline: float,
        all_outs: Callable[[], np.ndarray],
    ) -> None:
        """A ``split_matrix`` call whose configuration no digests vouch for: exchange.

        The row is the one a call without the matrix would exchange, so a
        rank that passed no matrix still meets this one in the same
        collective, and a configuration that differs raises on every rank.
        """
        layout = V.decode_a2a(self._exchange_rows(st, row, deadline), all_outs)
        if not np.array_equal(layout.in_rows, given.in_rows):
            s, d = (int(v) for v in np.argwhere(layout.in_rows != given.in_rows)[0])
            raise ValueError(
                f"all_to_all_single: split_matrix[{s}, {d}] = {int(given.in_rows[s, d])} on rank "
                f"{st.transport.rank} but rank {s} sends {int(layout.in_rows[s, d])} rows to "
                f"rank {d}; split_matrix must be the same on every rank"
            )

    # ---------------------------------------------------------- internals
    def _schedule(
        self, st: _GroupState, dec: _Decision, segs: Segments, pair_bytes: np.ndarray
    ) -> tuple[RankSchedule, np.ndarray, dict[str, int], np.ndarray]:
        fpair, fpath, fbytes = split_fragments(
            dec.flow_pair, dec.flow_path, dec.flow_weight, pair_bytes,
            min_split_bytes=self.min_split_bytes, default_path=st.default_path,
        )
        sched = build_schedule(
            segs, fpair, fbytes, st.routes[fpath], rank=st.transport.rank,
            chunk_bytes=self.chunk_bytes, window=self.window, frag_links=st.paths.links[fpath],
            whole_streams=not st.transport.grouped_rounds,
        )
        link_bytes = st.paths.link_load_bytes(fpath, fbytes)
        roles = np.bincount(st.paths.role_code[fpath], weights=fbytes, minlength=len(ROLES))
        kinds = {ROLES[i]: int(v) for i, v in enumerate(roles) if v}
        return sched, link_bytes, kinds, fpath

    # --------------------------------------------------- live adaptation
    def _exchange_rows(self, st: _GroupState, row: np.ndarray, deadline: float) -> np.ndarray:
        """Exchange a call's metadata rows with the plane words; the rows without."""
        meta = st.transport.exchange(np.concatenate([row, self._plane_words(st)]), deadline)
        self._absorb_plane_words(st, meta[:, row.size :], deadline)
        return np.ascontiguousarray(meta[:, : row.size])

    def plane_words(self, group: Any = None) -> np.ndarray:
        """The :data:`PLANE_WORDS` words of this rank's data-plane state for ``group``.

        For a caller that gathers its rows in a collective of its own and
        passes ``split_matrix`` (the MoE layer): it appends these words to
        its row and hands every rank's back to :meth:`absorb_plane_words`.
        The group then learns from its transfers (telemetry) and checks that
        its ranks are in step, as if the calls exchanged rows themselves.
        """
        return self._plane_words(self._state(group))

    def absorb_plane_words(self, rows: Any, group: Any = None) -> None:
        """Take every rank's :meth:`plane_words` (``int64[N, PLANE_WORDS]``, rank order).

        A collective: every rank of the group calls it after the same
        exchange (it may run one more small exchange: :meth:`_absorb_plane_words`).
        """
        st = self._state(group)
        want = (st.transport.size, PLANE_WORDS)
        rows = np.asarray(rows)
        if rows.shape != want or rows.dtype != np.int64:
            raise ValueError(f"absorb_plane_words: rows must be int64 of shape {want}, got "
                             f"{rows.dtype} {rows.shape}")
        self._absorb_plane_words(st, rows, time.monotonic() + self.timeout_s)

    def _plane_words(self, st: _GroupState) -> np.ndarray:
        """``[host word, telemetry words, calls]``: what every metadata row carries.

        The host word (:func:`~pathweave.runtime.telemetry.host_word`) lets
        ``adapt="auto"`` decide, alike on every rank, on the group's first
        exchange. The second word is how many telemetry words this rank has
        on the last call (:attr:`~pathweave.runtime.telemetry.Adaptation.width`,
        0 without adaptation); the words themselves follow in a second
        exchange. The third is the transport's count of multi-path calls,
        whose message tags must agree on every rank. NOTE: a fixed width: a
        rank whose state differs (a new orchestrator on some ranks only)
        must meet its peers in a collective of the same size, or gloo aborts
        the process before any check can raise.
        """
        from pathweave.runtime import telemetry

        width = 0 if st.adapt is None else st.adapt.width
        return np.array([telemetry.host_word(), width, st.transport.calls], dtype=np.int64)

    def _absorb_plane_words(self, st: _GroupState, words: np.ndarray, deadline: float) -> None:
        """Every rank's :meth:`_plane_words`: the same steps on every rank.

        Every rank reads the same words, so every rank takes the same
        branch. If all ranks report the same number of telemetry words
        (> 0), one more exchange carries them (a plan's first few calls and
        every :attr:`~pathweave.runtime.telemetry.Adaptation.SAMPLE_EVERY`-th) and
        every rank absorbs them alike; otherwise the observation is dropped
        everywhere. Ranks whose call counts differ are out of step (their
        messages' tags would not match): the next call raises, on every rank.
        """
        from pathweave.runtime import telemetry

        if st.hosts is None:
            st.hosts = words[:, 0].copy()
            if self.adapt == "auto" and telemetry.adapt_auto(st.hosts, nccl=st.transport.nccl):
                st.adapt = telemetry.Adaptation(st.fabric, st.paths, st.transport.rank)
        calls = words[:, 2]
        odd = np.flatnonzero(calls != calls[0])
        st.out_of_step = None  # what the latest words say, not an earlier call's
        if odd.size:
            r = int(odd[0])
            st.out_of_step = (
                f"rank {r}'s data plane has run {int(calls[r])} multi-path calls on this group "
                f"but rank 0's {int(calls[0])}; every rank must make the same calls through "
                "the same orchestrator (was one replaced on some ranks only?)"
            )
        widths = words[:, 1]
        if widths[0] > 0 and (widths == widths[0]).all():
            assert st.adapt is not None  # this rank's own width is one of them
            st.adapt.absorb(st.transport.exchange(st.adapt.words(), deadline))
        elif st.adapt is not None:
            st.adapt.absorb(np.zeros((words.shape[0], 0), dtype=np.int64))
        if st.adapt is not None and st.adapt.replan():
            log.info("live adaptation: learned link capacities moved; planning on them")
            st.plan_fabric = st.adapt.fabric
            st.plan_paths = candidate_paths(st.adapt.fabric, st.paths.kinds, st.paths.max_hops)
            st.last_call = (None, None, None)

    def _account(
        self, op: str, total: int, entry: Any, t0: float, t1: float, t2: float, cached: bool
    ) -> None:
        s = self.stats
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


def _decision_text(dec: _Decision) -> str:
    return f"multi-path plan #{dec.ident}" if dec.multipath else "torch's collective"


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


def _runtime_model(cfg: Config) -> Any:
    """``cfg.model``, counting rounds as this orchestrator's executor runs them.

    A model with a per-round cost (``round_s``, from ``pathweave calibrate``)
    counts a plan's rounds at its ``chunk_bytes`` and ``window``; the
    executor's are the config's, so those two are set from it.
    """
    import dataclasses

    m = cfg.model
    if m is None or not m.round_s or (m.chunk_bytes, m.window) == (cfg.chunk_bytes,
                                                                   cfg.window):
        return m
    return dataclasses.replace(m, chunk_bytes=cfg.chunk_bytes, window=cfg.window)


def _without_rounds(model: Any) -> Any:
    """``model`` without pathweave's per-round host cost (torch's collective has none)."""
    import dataclasses

    return model if model is None or not model.round_s else dataclasses.replace(model,
                                                                                 round_s=0.0)


def _fabric_digest(fab: Fabric) -> str:
    """A short hash of everything in ``fab`` (two fabrics with one name may differ)."""
    import hashlib
    import json

    from pathweave.fabric import to_dict

    text = json.dumps(to_dict(fab), sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def _callable_text(fn: Any) -> str:
    """A policy callable as text that is the same in every process (no addresses)."""
    import functools

    if isinstance(fn, functools.partial):
        args = [repr(a) for a in fn.args] + [f"{k}={v!r}" for k, v in sorted(fn.keywords.items())]
        return f"{_callable_text(fn.func)}({', '.join(args)})"
    mod = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{mod}.{name}"


def _p2p_segments(matches: list[tuple[int, int, int, int, int]], n: int) -> Segments:
    """Segments of a batch of messages: one per message, in pair-stream order."""
    rows = sorted((s * n + d, i, si, ri, nb) for i, (s, d, si, ri, nb) in enumerate(matches)
                  if nb > 0)
    pair = np.array([r[0] for r in rows], dtype=np.int64)
    ptr = np.searchsorted(pair, np.arange(n * n + 1)) if rows else np.zeros(n * n + 1, np.int64)
    col = np.array([r[2:] for r in rows], dtype=np.int64).reshape(-1, 3)
    zeros = np.zeros(len(rows), dtype=np.int64)
    return Segments(n, ptr.astype(np.int64), col[:, 2], col[:, 0], zeros, col[:, 1], zeros.copy())
