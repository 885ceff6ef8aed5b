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
    and links have no modelled latency: the fluid model. Its one addition is
    the pipeline fill: a forwarding rank passes bytes on in units of
    ``pipeline_bytes`` (one chunk of the data plane: a forwarding rank sends
    a chunk on once all of it has arrived), so each forwarding rank on a
    path delays the flow's start by one unit over a node-local hop
    (``relay_setup_s``; see :func:`forward_delay_s`). A start
    delay, not an end delay: while one flow fills its pipeline, others keep
    a shared bottleneck busy, as on the wire. NICs are kernel forwarding
    here, not store-and-forward stages, so the model's ``chunk_bytes`` is 0.

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
    ``model`` defaults to :func:`emulator_model` with one chunk,
    ``chunk_bytes``, as the pipeline unit: on gloo the data plane advances
    each forwarded stream on its own, forwarding a chunk as soon as it has
    arrived, and stages the whole stream (a slot per chunk,
    ``docs/runtime.md``), so ``window`` does not change the prediction.
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
    rail starts once the first 256 KiB chunk crossed the 12 MB/s NVLink:

    >>> D[:] = 0; D[0, 5] = 5_000_000
    >>> sim_s, bound_s, _ = predict(fab, D, "static", chunk_bytes=262144)
    >>> round(bound_s, 6), round(sim_s - bound_s, 6), round(262144 / 12e6, 6)
    (1.0, 0.021845, 0.021845)
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
    if model is None:
        # On gloo each forwarded stream advances on its own (Transport._run_streams):
        # a forwarding rank sends chunk c on as soon as all of it has arrived, so
        # the pipeline unit is one chunk. (The schedule's rounds, window // 2
        # chunks each, pace only the NCCL executor, which the emulator does not run.)
        unit = 0 if policy == "torch" else int(chunk_bytes)
        model = emulator_model(fabric, unit)
    res = simulate(fabric, eff, model)
    return float(res.makespan_s), float(eff.congestion_s), eff
