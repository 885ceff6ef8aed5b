"""The simulator's prediction of what the data plane sends inside the emulator.

:func:`emulator_model` is the :class:`~pathweave.sim.SimModel` of the emulated
links; :func:`predict` plans a policy, applies the plan to the exact bytes as
the :class:`~pathweave.runtime.orchestrator.Orchestrator` does and simulates
the fragments. :func:`pathweave.emulate.run.run_workloads` sets the result
beside what it measured.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pathweave.fabric import Fabric

__all__ = [
    "ADAPT_SUFFIX",
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_MIN_SPLIT_BYTES",
    "emulator_model",
    "forward_delay_s",
    "pipeline_fill_s",
    "predict",
]

#: Pipeline chunk of forwarded transfers in the emulator: 0.1 s on a 5 MB/s rail. With the
#: per-stream executor, 256 KiB to 1 MiB measured the same on h100-2x4, hotspot 0.8
#: (docs/emulator.md); smaller chunks cost more messages, larger ones a longer pipeline fill.
DEFAULT_CHUNK_BYTES = 512 * 1024
#: ``NAME+adapt``: policy NAME with live adaptation (the plain name runs blind).
ADAPT_SUFFIX = "+adapt"
#: Size threshold of splitting in the emulator.
DEFAULT_MIN_SPLIT_BYTES = 64 * 1024


def emulator_model(fabric: Fabric | None = None, pipeline_bytes: int = 0) -> Any:
    """The :class:`~pathweave.sim.SimModel` of the emulator for the scaled ``fabric``.

    The emulated links deliver exactly their scaled capacity in payload (the
    framing is added to the tbf rate), forwarding ranks lose no throughput
    and links have no modelled latency: the fluid model. What the ranks'
    planners decide with (:func:`rank_config`) adds the pipeline fill per
    path, as the time model can: a forwarding rank passes bytes on in units
    of ``pipeline_bytes`` (one chunk), so each forwarding rank on a path
    delays the flow's start by one unit over a node-local hop
    (``relay_setup_s``; see :func:`forward_delay_s`). NICs are kernel
    forwarding here, not store-and-forward stages, so the model's
    ``chunk_bytes`` is 0. :func:`predict` simulates with the fluid model
    (``emulator_model()``) and the data plane's fill per fragment instead
    (:func:`pipeline_fill_s`: a message, placed around the bottleneck).

    Examples
    --------
    >>> import pathweave as pw
    >>> from pathweave.emulate import scale_fabric
    >>> fab = scale_fabric(pw.fabric.preset("h100-2x4"), 1e-4)
    >>> m = emulator_model(fab, 1_200_000)      # 1.2 MB over a 12 MB/s NVLink
    >>> round(m.relay_setup_s, 6), m.chunk_bytes, m.relay_efficiency
    (0.1, 0, 1.0)
    """
    from pathweave.sim import SimModel

    delay = 0.0 if fabric is None else forward_delay_s(fabric, pipeline_bytes)
    return SimModel.ideal(relay_setup_s=delay)


def rank_config(fabric: Fabric, *, chunk_bytes: int, window: int, min_split_bytes: int,
                timeout_s: float) -> Any:
    """The :class:`~pathweave.runtime.Config` every emulated rank's data plane runs with.

    Multi-path always on (the emulator compares plans; ``auto`` would send
    small cases to torch), the given chunk, window, threshold and time limit,
    and this emulator's time model (:func:`emulator_model`), so what the
    ranks decide with is what :func:`predict` simulates. The ranks set the
    policy and ``adapt`` of each run and their fabric; the config goes to
    them whole, as data (:meth:`~pathweave.runtime.Config.to_dict`).

    >>> import pathweave as pw
    >>> from pathweave.emulate import scale_fabric
    >>> fab = scale_fabric(pw.fabric.preset("h100-2x4"), 1e-4)
    >>> cfg = rank_config(fab, chunk_bytes=1 << 20, window=4, min_split_bytes=1 << 16,
    ...                   timeout_s=60.0)
    >>> cfg.enabled, cfg.window, round(cfg.model.relay_setup_s, 4)
    (True, 4, 0.0874)
    """
    from pathweave.runtime.config import Config

    return Config(enabled=True, chunk_bytes=chunk_bytes, window=window,
                  min_split_bytes=min_split_bytes, timeout_s=timeout_s,
                  model=emulator_model(fabric, chunk_bytes))


def forward_delay_s(fabric: Fabric, pipeline_bytes: int) -> float:
    """Time one pipeline unit takes over the slowest node-local hop out of a GPU.

    The segments a forwarding rank joins are node-local hops (NVLink,
    NVSwitch, PCIe), or rails, which are then the bottleneck that the fill
    does not add to; 0 for a fabric without node-local GPU links.

    Examples
    --------
    >>> import pathweave as pw
    >>> forward_delay_s(pw.fabric.preset("h100-2x4"), 120_000_000)
    0.001
    """
    from pathweave.fabric import LinkKind, VertexKind

    if pipeline_bytes <= 0:
        return 0.0
    gpu = fabric.vertex_kind == VertexKind.GPU
    # a GPU's links towards its NICs (directly or through a PCIe switch) are
    # not the forwarding hop
    nic = np.isin(fabric.vertex_kind, (VertexKind.NIC, VertexKind.PCIE_SWITCH))
    local = (gpu[fabric.link_src] & ~nic[fabric.link_dst]
             & (fabric.link_kind != LinkKind.NETWORK))
    if not local.any():
        return 0.0
    return float(pipeline_bytes) / float(fabric.capacity_Bps[local].min())


def _messages(nbytes: np.ndarray, chunk_bytes: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes of each fragment's first and last message in the data plane's schedule.

    The schedule (:mod:`pathweave.runtime.schedule`) cuts a fragment of ``k``
    chunks into the call's ``R`` rounds (:func:`pathweave.plan.rounds.pacing`),
    chunk ``c`` in round ``floor(c R / k)``, and one message carries a
    fragment's chunks of one round: the first message holds ``ceil(k / R)``
    chunks, the last the chunks from ``ceil(r k / R)`` on, ``r`` the last
    chunk's round (the short last chunk included).
    """
    from pathweave.plan.rounds import pacing

    b = np.asarray(nbytes, dtype=np.int64)
    k = np.maximum(-(-b // int(chunk_bytes)), 1)
    rounds, _ = pacing(k, window)
    first = np.minimum(b, -(-k // rounds) * int(chunk_bytes))
    r_last = (k - 1) * rounds // k
    last = b - (-(-(r_last * k) // rounds)) * int(chunk_bytes)
    return first, last


def _posted_late(plan: Any, live: np.ndarray,
                 segs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Bytes each link carries as forwards, and as fed direct messages.

    A rank posts its own messages at the start; its forwards as they arrive;
    its direct messages to a peer it also forwards to one at a time behind
    the forwards (``executor._fed_sends``).
    """
    from pathweave.plan.rounds import route_ranks

    fab, ranks = plan.fabric, route_ranks(plan.paths)
    forwarded, fed = np.zeros(fab.num_links), np.zeros(fab.num_links)
    relays = set()
    for f, (links, seg) in zip(live, segs, strict=True):
        np.add.at(forwarded, links[seg > 0], float(plan.flow_bytes[f]))
        r = ranks[int(plan.flow_path[f])]
        r = r[r >= 0]
        relays.update(zip(r[1:-1].tolist(), r[2:].tolist(), strict=True))
    for f, (links, seg) in zip(live, segs, strict=True):
        r = ranks[int(plan.flow_path[f])]
        if seg[-1] == 0 and (int(r[0]), int(r[1])) in relays:
            fed[links] += float(plan.flow_bytes[f])
    return forwarded, fed


def pipeline_fill_s(plan: Any, chunk_bytes: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """``(before_s, after_s)`` per fragment: the gloo data plane's store-and-forward fill.

    A forwarding rank passes a stream on one message at a time, once all of
    it has arrived (``Transport._run_streams``: it waits for a step's
    receives, then posts its forwards), and a message is a fragment's
    chunks of one round (:func:`_messages`; ``window // 2`` chunks for the
    call's largest fragment). The forwarding ranks (GPUs inside the path; a
    NIC is kernel forwarding here) cut the path into segments. A pipeline
    of messages through them streams at its slowest segment, its
    *bottleneck*, here the segment whose most loaded link takes longest
    (``plan.link_load_bytes / capacity``), and adds one message per other
    segment: the first message over each segment before the bottleneck
    before the fragment's first byte crosses it (``before_s``: other
    fragments keep the bottleneck busy meanwhile), the last message over
    each segment after it once its last byte has crossed (``after_s``: the
    forwarding rank behind a rail can send the stream's last message on
    only after the rail delivered it), less the time the bottleneck spends
    on bytes that cross it after the fragment's last one: gloo writes a
    connection's messages in the order they are posted, each link carries
    one connection per direction in the emulator, and a rank posts its own
    messages first, its forwards as they arrive and its fed direct messages
    behind those (:func:`_posted_late`). Direct fragments and
    ``chunk_bytes`` 0 have none.

    Examples
    --------
    6 MiB from GPU 0 to GPU 5 of the other node, half on the PXN path
    (NVLink to GPU 1, then its 5 MB/s rail), half DeepEP's way (rail 0 to
    GPU 4, then NVLink to 5): 3 MiB in 512 KiB chunks is 6 chunks, 3 rounds
    at window 4, 2 chunks (1 MiB) per message; 1 MiB over a 12 MB/s NVLink
    is 87.4 ms, before the rail on the first path, after it on the second:

    >>> import numpy as np, pathweave as pw
    >>> from pathweave.emulate import scale_fabric
    >>> fab = scale_fabric(pw.fabric.preset("h100-2x4"), 1e-4)
    >>> ps = pw.fabric.candidate_paths(fab)
    >>> via = lambda r: next(p for p in ps.pair_paths(0, 5)
    ...                      if pw.plan.rounds.route_ranks(ps)[p][1] == r)
    >>> D = np.zeros((8, 8), dtype=np.int64); D[0, 5] = 6 << 20
    >>> plan = pw.plan.Plan(fabric=fab, paths=ps, demand=D, policy="hand",
    ...     flow_path=np.array([via(1), via(4)]),
    ...     flow_bytes=np.array([3 << 20, 3 << 20]))
    >>> before, after = pipeline_fill_s(plan, 1 << 19, 4)
    >>> np.round(before * 1e3, 1).tolist(), np.round(after * 1e3, 1).tolist()
    ([87.4, 0.0], [0.0, 87.4])
    """
    from pathweave.fabric import VertexKind

    fab, ps = plan.fabric, plan.paths
    nf = plan.flow_path.size
    before, after = np.zeros(nf), np.zeros(nf)
    live = np.flatnonzero(plan.flow_bytes > 0)
    if chunk_bytes <= 0 or live.size == 0:
        return before, after
    first, last = _messages(plan.flow_bytes[live], int(chunk_bytes), int(window))
    busy_s = np.asarray(plan.link_load_bytes, dtype=np.float64) / fab.capacity_Bps
    gpu = fab.vertex_kind == VertexKind.GPU
    segs = []
    for f in live:
        p = int(plan.flow_path[f])
        links = ps.links[p, : ps.length[p]]
        # segment of each hop: a new one after every forwarding GPU
        segs.append((links, np.cumsum(np.r_[0, gpu[fab.link_src[links[1:]]]])))
    forwarded, fed = _posted_late(plan, live, segs)
    for i, (f, (links, seg)) in enumerate(zip(live, segs, strict=True)):
        if seg[-1] == 0:
            continue
        cap = np.array([fab.capacity_Bps[links[seg == j]].min() for j in range(seg[-1] + 1)])
        hop = int(np.argmax(busy_s[links]))
        neck, e = seg[hop], links[hop]
        before[f] = first[i] * (1.0 / cap[:neck]).sum()
        # What crosses the bottleneck after this fragment's last byte keeps it
        # busy while that last message drains: behind the source's own
        # messages the forwards and fed ones, behind a forward the fed ones.
        behind = fed[e] + (forwarded[e] if neck == 0 else 0.0)
        after[f] = max(0.0, last[i] * (1.0 / cap[neck + 1:]).sum()
                       - behind / fab.capacity_Bps[e])
    return before, after


# --------------------------------------------------------------- prediction
def predict(
    fabric: Fabric,
    demand: np.ndarray,
    policy: str,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    window: int = 4,
    min_split_bytes: int = DEFAULT_MIN_SPLIT_BYTES,
    model: Any = None,
    plan_fabric: Fabric | None = None,
) -> tuple[float, float, Any]:
    """Simulated makespan and congestion bound of what the data plane sends for ``policy``.

    Returns ``(predicted_s, bound_s, plan)`` where ``plan`` holds the
    fragments (the policy's plan of the quantised demand applied to the exact
    bytes, pairs below ``min_split_bytes`` whole on their heaviest path).
    ``model`` defaults to the fluid model (:func:`emulator_model` without
    fill) plus the data plane's store-and-forward fill per fragment,
    :func:`pipeline_fill_s`: its unit is a message (a fragment's chunks of
    one round, so ``window`` sets it), placed before or after the
    fragment's bottleneck and hidden where the executor's message order
    puts other bytes behind it. A ``model`` given is used alone.
    ``torch`` is predicted as ``static`` (its kernel routes are the static paths)
    without pipelining; ``NAME+adapt`` as ``NAME``. ``plan_fabric`` (same
    topology, other capacities): the policy plans on it, the fragments are
    simulated on ``fabric`` (a blind plan on a fabric with a co-tenant).

    Examples
    --------
    >>> import numpy as np, pathweave as pw
    >>> from pathweave.emulate import scale_fabric
    >>> fab = scale_fabric(pw.fabric.preset("h100-2x4"), 1e-4)
    >>> D = np.zeros((8, 8), dtype=np.int64); D[0, 1] = 12_000_000
    >>> sim_s, bound_s, _ = predict(fab, D, "static")
    >>> round(bound_s, 6), round(sim_s, 6)        # 12 MB over a 12 MB/s link
    (1.0, 1.0)

    Across nodes ``static`` forwards through GPU 1 to its 5 MB/s rail; the
    rail starts once the first message crossed the 12 MB/s NVLink: 20
    chunks of 256 KiB in 10 rounds at window 4, 2 chunks a message:

    >>> D[:] = 0; D[0, 5] = 5_000_000
    >>> sim_s, bound_s, _ = predict(fab, D, "static", chunk_bytes=262144)
    >>> round(bound_s, 6), round(sim_s - bound_s, 6), round(2 * 262144 / 12e6, 6)
    (1.0, 0.043691, 0.043691)
    """
    from pathweave.fabric import candidate_paths
    from pathweave.plan import Plan, make
    from pathweave.plan.registry import check_options
    from pathweave.runtime.orchestrator import quantise, split_options
    from pathweave.runtime.schedule import split_fragments
    from pathweave.sim import simulate

    d = np.asarray(demand, dtype=np.int64)
    n = fabric.num_ranks
    ps = candidate_paths(fabric)
    name = "static" if policy == "torch" else policy.removesuffix(ADAPT_SUFFIX)
    check_options(name, {})  # a plan the data plane runs: its flows are on ``ps``
    q = quantise(d)
    np.fill_diagonal(q, 0)
    pf = fabric if plan_fabric is None else plan_fabric
    # The ranks' Orchestrator hands its threshold, chunk and time model (the
    # emulator's, emulate._rankworker) to the planner: so does this.
    plan = make(pf, q, name, paths=ps if pf is fabric else candidate_paths(pf),
                **split_options(name, min_split_bytes, chunk_bytes,
                                model=emulator_model(pf, int(chunk_bytes))))
    keep = plan.flow_bytes > 0
    fp = plan.flow_path[keep].astype(np.int64)
    pair = ps.src[fp].astype(np.int64) * n + ps.dst[fp]
    first = ps.pair_ptr[:-1].astype(np.int64).copy()
    first[:: n + 1] = 0
    _, fpath, fbytes = split_fragments(
        pair, fp, plan.flow_bytes[keep].astype(np.float64), d,
        min_split_bytes=int(min_split_bytes), default_path=first,
    )
    dd = d.copy()
    np.fill_diagonal(dd, 0)
    eff = Plan(fabric=fabric, paths=ps, demand=dd, flow_path=fpath.astype(np.int64),
               flow_bytes=fbytes.astype(np.int64), policy=policy)
    eff.validate()
    fill = None
    if model is None:
        # The fluid model plus the store-and-forward fill of the data plane's
        # messages, placed per hop (pipeline_fill_s); torch's packets are
        # forwarded by the kernel, without a pipeline.
        model = emulator_model()
        if policy != "torch":
            fill = pipeline_fill_s(eff, int(chunk_bytes), int(window))
    res = simulate(fabric, eff, model, fill_s=fill)
    return float(res.makespan_s), float(eff.congestion_s), eff
