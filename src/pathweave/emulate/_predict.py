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


def emulator_model(chunk_bytes: int = 0, window: int = 4) -> Any:
    """The :class:`~pathweave.sim.SimModel` of the emulator: fluid links plus the data plane's fill.

    The emulated links deliver exactly their scaled capacity in payload (the
    framing is added to the tbf rate), forwarding ranks lose no throughput
    and links have no modelled latency: the fluid model
    (``emulator_model()``, what ``torch``'s kernel-forwarded packets get).
    With ``chunk_bytes`` the gloo data plane's store-and-forward fill is
    added per fragment, in messages of its chunks of one round
    (``message_fill``: :func:`pathweave.plan.rounds.pipeline_fill_s` at
    ``chunk_bytes`` and ``window``; NICs are kernel forwarding here, not
    stages). The ranks' planners decide with it (:func:`rank_config`) and
    :func:`predict` simulates with it: one model, one fill rule.

    Examples
    --------
    >>> m = emulator_model(1 << 19, 4)
    >>> m.message_fill, m.chunk_bytes, m.relay_setup_s, m.relay_efficiency
    (True, 524288, 0.0, 1.0)
    >>> emulator_model().message_fill
    False
    """
    from pathweave.sim import SimModel

    if int(chunk_bytes) <= 0:
        return SimModel.ideal()
    return SimModel.ideal(chunk_bytes=int(chunk_bytes), window=int(window), message_fill=True)


def rank_config(fabric: Fabric, *, chunk_bytes: int, window: int, min_split_bytes: int,
                timeout_s: float) -> Any:
    """The :class:`~pathweave.runtime.Config` every emulated rank's data plane runs with.

    Multi-path always on (the emulator compares plans; ``auto`` would send
    small cases to torch), the given chunk, window, threshold and time limit,
    and this emulator's time model (:func:`emulator_model` at the same chunk
    and window), so what the ranks decide with is what :func:`predict`
    simulates. The ranks set the policy and ``adapt`` of each run and their
    fabric; the config goes to them whole, as data
    (:meth:`~pathweave.runtime.Config.to_dict`).

    >>> import pathweave as pw
    >>> from pathweave.emulate import scale_fabric
    >>> fab = scale_fabric(pw.fabric.preset("h100-2x4"), 1e-4)
    >>> cfg = rank_config(fab, chunk_bytes=1 << 20, window=4, min_split_bytes=1 << 16,
    ...                   timeout_s=60.0)
    >>> cfg.enabled, cfg.window, cfg.model.message_fill, cfg.model.chunk_bytes
    (True, 4, True, 1048576)
    """
    from pathweave.runtime.config import Config

    return Config(enabled=True, chunk_bytes=chunk_bytes, window=window,
                  min_split_bytes=min_split_bytes, timeout_s=timeout_s,
                  model=emulator_model(chunk_bytes, window))


def pipeline_fill_s(plan: Any, chunk_bytes: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`pathweave.plan.rounds.pipeline_fill_s` of ``plan``'s fragments.

    >>> import numpy as np, pathweave as pw
    >>> from pathweave.emulate import scale_fabric
    >>> fab = scale_fabric(pw.fabric.preset("h100-2x4"), 1e-4)
    >>> D = np.zeros((8, 8), dtype=np.int64); D[5, 0] = 3 << 20
    >>> before, after = pipeline_fill_s(pw.plan.make(fab, D, "deepep"), 1 << 19, 4)
    >>> before.tolist(), round(float(after[0]), 4)          # 1 MiB over NVLink after the rail
    ([0.0], 0.0874)
    """
    from pathweave.plan.rounds import pipeline_fill_s as fill

    return fill(plan.paths, plan.flow_path, plan.flow_bytes, chunk_bytes, window)


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
    ``model`` defaults to what the ranks decide with, :func:`emulator_model`
    at ``chunk_bytes`` and ``window``: the fluid model plus the data plane's
    store-and-forward fill per fragment
    (:func:`pathweave.plan.rounds.pipeline_fill_s`): its unit is a message
    (a fragment's chunks of one round, so ``window`` sets it), placed before or after the
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
                                model=emulator_model(int(chunk_bytes), int(window))))
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
        # What the ranks decide with: the fluid model plus the data plane's
        # fill per message (SimModel.message_fill); torch's packets are
        # forwarded by the kernel, without a pipeline.
        model = emulator_model() if policy == "torch" else emulator_model(int(chunk_bytes),
                                                                          int(window))
    res = simulate(fabric, eff, model)
    return float(res.makespan_s), float(eff.congestion_s), eff
