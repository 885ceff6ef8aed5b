"""The time model's parameters (:class:`SimModel`), shared by the planner and the simulator.

They live in the planner's layer because :mod:`pathweave.plan.timemodel`
predicts with them and the simulator (:mod:`pathweave.sim`, a layer above)
runs with the same; ``pathweave.sim.SimModel`` is the same class, re-exported.

The defaults of :class:`SimModel` are fitted to the NIMBLE paper's
point-to-point measurements on its testbed (the ``h100-2x4`` preset; Sec. V-B,
Fig. 6); ``docs/simulator.md`` gives the fit. Each efficiency is one
documented mechanism, fitted to one measured number:

======================== ============ =========================================
parameter                default      fitted to (paper, 256 MB)
======================== ============ =========================================
network_efficiency       0.909        one rail: 45.1 GB/s of a 50 GB/s NDR400
relay_efficiency         0.911        direct + 1 relay GPU: 213.1 GB/s
nvlink_inject_efficiency 0.798        direct + 2 relay GPUs: 278.2 GB/s
nic_aggregate_efficiency 0.888        four rails: 170.0 GB/s
setup_s                  20 us        saturation near 64 MB
relay_setup_s            5 us         splitting loses below ~2 MB
======================== ============ =========================================

``round_s`` (default 0: NIMBLE's CUDA runtime has no per-round host cost)
is pathweave's own runtime's: ``pathweave calibrate`` measures it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

__all__ = ["SimModel"]


@dataclass(frozen=True)
class SimModel:
    """Parameters of the fluid model beyond the fabric's capacities.

    Every fragment of a plan is a flow. Flows share each directed link
    max-min fairly; a flow on a multi-hop path moves as a pipeline at its
    bottleneck share. Timeline of a flow of ``b`` bytes::

        0 .. setup_s + relay_setup_s * relays      setting up (no bandwidth used)
        .. + b / rate (rate re-shared at every start and end of any flow)
        .. + fill: hop latencies + one chunk per store-and-forward stage

    Attributes
    ----------
    setup_s
        Per-transfer start-up cost (kernel launch, handshake), seconds.
    relay_setup_s
        Extra start-up per forwarding GPU on the path (its pipeline set-up).
    chunk_bytes
        Pipeline chunk: every store-and-forward stage inside a path (a
        forwarding GPU, a NIC) holds one chunk (or the whole flow if smaller)
        before passing it on, at the next hop's effective capacity. Switches
        (NVSwitch, rail, spine) cut through and add only their hop latency.
    hop_latency_s
        Latency of every hop; ``None`` uses the fabric's ``latency_s``.
    relay_efficiency
        A forwarding GPU passes on at most this share of the smaller effective
        capacity of its in and out links (extra memory traffic and
        synchronisation on the relay). A per-flow rate ceiling.
    network_efficiency
        Share of line rate a NETWORK link delivers (protocol overhead).
    nvlink_inject_efficiency
        Each GPU injects at most this share of the sum of its outgoing NVLink
        capacities, over all flows it sends or forwards (message-injection and
        L2 limits: NVLinks are not all saturated at once). A shared virtual
        link per GPU; 1 disables it.
    nic_aggregate_efficiency
        Each node sends (and, separately, receives) at most this share of the
        sum of its NICs' line rates (host PCIe / root-complex limit). Shared
        virtual links per node; 1 disables them.
    batch_rtol
        Flows whose projected ends lie within this relative distance of the
        next end in their component (flows that share links, directly or
        through others) finish together, at the latest of those ends
        (conservative: never earlier than exact). Fewer events on big
        uniform workloads.
    max_segments
        At most this many stored segments of the per-link utilisation
        timeline; adjacent segments are merged (time-weighted) beyond it.
    round_s
        Host cost of one round of the data plane's schedule (posting and
        waiting for its operations), seconds; serial with the transfers, so
        a plan's time grows by ``round_s`` times the rounds the executor
        runs for it (:func:`pathweave.plan.timemodel.executor_rounds`:
        every fragment cut into ``chunk_bytes`` chunks, the largest entering
        ``window // 2`` per round, plus one round per further hop; a direct
        fragment no forwarded one touches goes whole in round 0). 0 by
        default; ``pathweave calibrate`` fits it. Needs ``chunk_bytes >= 1``
        where it is above 0 (rounds are counted in chunks).
    window
        The data plane's staging window (the Orchestrator's ``window``):
        only counts rounds for ``round_s`` and, with ``message_fill``, sets
        the messages' size.
    message_fill
        Charge the fill of pathweave's own gloo data plane instead of one
        chunk per stage: a forwarding rank passes a message (a fragment's
        chunks of one round, at ``chunk_bytes`` and ``window``) on once all
        of it arrived, so each path segment between forwarding GPUs other
        than the fragment's bottleneck adds one message, before it (a start
        delay) or after it (after the fragment's last byte), less what the
        executor's message order hides
        (:func:`pathweave.plan.rounds.pipeline_fill_s`; NICs are not
        stages). The emulator's model (:func:`pathweave.emulate.emulator_model`).

    Examples
    --------
    >>> SimModel().setup_s
    2e-05
    >>> SimModel.ideal().relay_efficiency
    1.0
    >>> SimModel(relay_efficiency=1.5)
    Traceback (most recent call last):
    ...
    ValueError: SimModel.relay_efficiency = 1.5; it must lie in (0, 1]
    >>> SimModel(round_s=5e-5, chunk_bytes=0)
    Traceback (most recent call last):
    ...
    ValueError: SimModel.round_s = 5e-05 needs chunk_bytes >= 1 (rounds are counted in ...
    """

    setup_s: float = 20e-6
    relay_setup_s: float = 5e-6
    chunk_bytes: int = 512 * 1024
    hop_latency_s: float | None = None
    relay_efficiency: float = 0.911
    network_efficiency: float = 0.909
    nvlink_inject_efficiency: float = 0.798
    nic_aggregate_efficiency: float = 0.888
    batch_rtol: float = 1e-4
    max_segments: int = 256
    round_s: float = 0.0
    window: int = 4
    message_fill: bool = False

    def __hash__(self) -> int:
        # Models key the planners' cached tables, looked up several times per
        # plan; hashing fifteen fields cost ~1 us each time. Frozen: computed once.
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    def __post_init__(self) -> None:
        for name in ("setup_s", "relay_setup_s", "round_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"SimModel.{name} = {v!r}; it must be a finite number >= 0")
        if self.hop_latency_s is not None and not (
            math.isfinite(self.hop_latency_s) and self.hop_latency_s >= 0
        ):
            raise ValueError(
                f"SimModel.hop_latency_s = {self.hop_latency_s!r}; it must be None or >= 0"
            )
        for name in (
            "relay_efficiency",
            "network_efficiency",
            "nvlink_inject_efficiency",
            "nic_aggregate_efficiency",
        ):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 < v <= 1):
                raise ValueError(f"SimModel.{name} = {v!r}; it must lie in (0, 1]")
        if not (isinstance(self.chunk_bytes, (int, np.integer)) and self.chunk_bytes >= 0):
            raise ValueError(f"SimModel.chunk_bytes = {self.chunk_bytes!r}; it must be an int >= 0")
        if not (0 <= self.batch_rtol < 0.1):
            raise ValueError(f"SimModel.batch_rtol = {self.batch_rtol!r}; it must lie in [0, 0.1)")
        if not (isinstance(self.max_segments, (int, np.integer)) and self.max_segments >= 1):
            raise ValueError(f"SimModel.max_segments = {self.max_segments!r}; it must be >= 1")
        if not (isinstance(self.window, (int, np.integer)) and self.window >= 2):
            raise ValueError(f"SimModel.window = {self.window!r}; it must be an int >= 2")
        if not isinstance(self.message_fill, (bool, np.bool_)):
            raise ValueError(f"SimModel.message_fill = {self.message_fill!r}; it must be a bool")
        if self.round_s > 0 and self.chunk_bytes < 1:
            raise ValueError(f"SimModel.round_s = {self.round_s!r} needs chunk_bytes >= 1 "
                             f"(rounds are counted in chunks), got {self.chunk_bytes}")

    @classmethod
    def ideal(cls, **overrides: Any) -> SimModel:
        """The pure fluid model: no set-up, no latency, no fill, every efficiency 1.

        A single flow then takes exactly ``bytes / bottleneck capacity``, and a
        plan's makespan is never below its ``congestion_s``.
        """
        base: dict[str, Any] = {
            "setup_s": 0.0,
            "relay_setup_s": 0.0,
            "chunk_bytes": 0,
            "hop_latency_s": 0.0,
            "relay_efficiency": 1.0,
            "network_efficiency": 1.0,
            "nvlink_inject_efficiency": 1.0,
            "nic_aggregate_efficiency": 1.0,
            "batch_rtol": 0.0,
        }
        base.update(overrides)
        return cls(**base)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
