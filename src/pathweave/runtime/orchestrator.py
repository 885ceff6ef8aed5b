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
   completion times of this rank's receives (a plan's first calls, then
   every 8th; on NCCL the end of the round of each stream's last receive,
   CUDA events read at the next exchange), one word per stream into the
   rank, follow the next metadata
   exchange (an ``all_to_all_single``'s, or the MoE layer's own: every row
   says how many words its rank has, :meth:`Orchestrator.plane_words`, and
   one more small exchange carries them when every rank has them); every
   rank turns all ranks' times
   into the same per-link capacity estimates
   (:mod:`pathweave.runtime.telemetry`) and plans on them once they move
   1.5-fold beyond their noise (Hopper's probe rule behind a confidence
   test); hysteresis still decides the switch.

The pieces live in private modules of :mod:`pathweave.runtime`; this
module keeps the :class:`Orchestrator` (its settings, groups, metadata
exchange and plane words) and re-exports their public names:

- ``_group.py``: the group a call runs on, its fabric when none is given
  (:func:`default_fabric`, :func:`hosts_shape`), its hosts and the state
  kept per group (caches, live adaptation);
- ``_decision.py``: step 2 (:func:`quantise`, plan, hysteresis, ``auto``);
- ``_adapters.py``: each op's buffers as the pipeline's ``_Call``: a metadata
  key, ``decode()`` (its layout: ``pair_bytes`` and whatever its segments
  need), ``segments(layout)`` (its buffers' byte ranges per pair,
  :class:`~pathweave.runtime.schedule.Segments`) and ``buffers(multipath)``
  (normalised send and receive buffers, torch's own collective on them, the
  copy back); ``all_to_all_single`` and ``batch_isend_irecv`` are the two
  adapters today;
- ``_pipeline.py``: steps 2 to 5, one pipeline for every op;
- ``_stats.py``: :class:`OrchestratorStats` and :class:`CallStats` (step 5).

Every rank holds the same metadata and the same history of calls, so every
rank makes the same decisions without talking about them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from pathweave.errors import FabricError
from pathweave.fabric import Fabric, candidate_paths
from pathweave.plan import Plan
from pathweave.runtime import _adapters, _decision, _pipeline
from pathweave.runtime import _validate as V
from pathweave.runtime._adapters import _p2p_segments as _p2p_segments  # tests read it here
from pathweave.runtime._decision import _Decision, quantise, split_options
from pathweave.runtime._group import (
    NCCL_TOPO_ENV,
    TORCH_ONLY,
    SubgroupWarning,
    _group_hosts,
    _GroupState,
    _live_group,
    default_fabric,
    hosts_shape,
)
from pathweave.runtime._pipeline import Entry
from pathweave.runtime._stats import CallStats, OrchestratorStats
from pathweave.runtime.config import MAX_WINDOW, MIN_CHUNK_BYTES, Config
from pathweave.runtime.schedule import Segments

# The pieces' public names, re-exported: users (docs/runtime.md) reach them here.
__all__ = [
    "MAX_WINDOW", "MIN_CHUNK_BYTES", "NCCL_TOPO_ENV", "TORCH_ONLY", "CallStats", "Orchestrator",
    "OrchestratorStats", "SubgroupWarning", "default_fabric", "hosts_shape", "quantise",
    "split_options",
]

log = logging.getLogger(__name__)

PolicyArg = str | Callable[[Fabric, np.ndarray], Plan]
#: Words of data-plane state every metadata row carries (:meth:`Orchestrator.plane_words`):
#: the rank's host word, how many telemetry words it has to send, its multi-path calls.
PLANE_WORDS = 3


class _Setting:
    """An :class:`Orchestrator` setting: reads its :class:`Config` field; setting it replaces
    the config with one that has the new value (checked as any config)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        return self if obj is None else getattr(obj.config, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        obj.config = obj.config.replace(**{self.name: value})


def _with_settings(cls: type) -> type:
    """``cls`` with a :class:`_Setting` for every :class:`Config` field: the list of
    settings is Config's, written once."""
    for f in dataclasses.fields(Config):
        if f.name in vars(cls):  # a new Config field must not replace a method silently
            raise TypeError(f"{cls.__name__}.{f.name} is defined; the Config field of that "
                            "name would replace it")
        setattr(cls, f.name, _Setting(f.name))
    return cls


@_with_settings
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
        links are loopback; NCCL's round times do not tell links apart).
        Default: ``PATHWEAVE_ADAPT`` (``1``, ``0`` or ``auto``), else ``"auto"``.
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
        """A new decision for ``demand``: :func:`._decision.plan`."""
        return _decision.plan(st, demand, self.config, self.stats)

    def _decide(self, st: _GroupState, pair_bytes: np.ndarray) -> tuple[_Decision, bool]:
        """The decision and whether it cost no planning: :func:`._decision.decide`."""
        return _decision.decide(st, pair_bytes, self.config, self.stats)

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
        call = _adapters.a2a_call(st, output, input, mkey, decode, reuse=not async_op)
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
            return _adapters.p2p_peer(op, group, tr)

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

        def decode() -> _adapters._P2PLayout:
            return _adapters.p2p_layout(meta, counts, n)

        call = _adapters.p2p_call(st, list(ops), b"P" + words.tobytes() + meta.tobytes(), decode)
        handle = self._pipeline(st, call, t0, deadline, wait=False)
        return [handle] * len(ops)

    # ------------------------------------------------------- op pipeline
    def _pipeline(
        self, st: _GroupState, call: _adapters._Call, t0: float, deadline: float, *, wait: bool
    ) -> Any:
        """decide -> schedule (cached) -> run -> account: :func:`._pipeline.run`."""
        return _pipeline.run(st, call, t0, deadline, wait=wait, decide=self._decide,
                             schedule=self._schedule, stats=self.stats)

    def _fingerprint(self, st: _GroupState, extra: Mapping[str, Any] | None) -> np.ndarray:
        """This call's configuration as :func:`~pathweave.runtime._validate.fingerprint` words.

        Everything that shapes what a call does with the bytes: two ranks
        that differ in any of it would move different bytes (or wait for
        messages that never come).
        """
        if not extra and st.config_words[0] is self.config:
            # The same (frozen) config as the last call's: a cached call's
            # fingerprint was 10-15 % of its host work at 8 ranks.
            return st.config_words[1]
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
        if not extra:
            st.config_words = (self.config, words)
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
    ) -> Entry:
        """``dec``'s schedule of this call (:func:`~pathweave.runtime._pipeline.schedule`)."""
        return _pipeline.schedule(st, dec, segs, pair_bytes, self.config)

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
            st.last_call = (None, None, None, 0)


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




def _callable_text(fn: Any) -> str:
    """A policy callable as text that is the same in every process (no addresses)."""
    import functools

    if isinstance(fn, functools.partial):
        args = [repr(a) for a in fn.args] + [f"{k}={v!r}" for k, v in sorted(fn.keywords.items())]
        return f"{_callable_text(fn.func)}({', '.join(args)})"
    mod = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{mod}.{name}"
