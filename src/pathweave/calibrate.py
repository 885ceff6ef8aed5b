"""``pathweave calibrate``: this machine's runtime costs and link rate, fitted into a model file.

Run it where the job runs, as ``pathweave perf`` is run::

    torchrun --nproc-per-node 4 -m pathweave.calibrate -o model.json
    python -m pathweave.calibrate --ranks 3 -o model.json     # local gloo ranks
    PATHWEAVE_MODEL=model.json torchrun ... train.py           # the Orchestrator uses it

Every *probe* is one exchange from rank 0 to rank 1 through pathweave's own
data plane (the metadata all-gather of a call, then the schedule of one
fragment at the job's Orchestrator ``window``, executed by
:class:`~pathweave.runtime.executor.Transport`), direct or through rank 2 as
a forwarding rank, with a chosen size and chunk. A probe's time (median over
``-n`` calls of the slowest rank's) is modelled as::

    t = call_s + round_s * rounds + relay_s * relays
        + direct_bytes / direct_Bps + relayed_bytes / relayed_Bps

(``rounds``: the schedule's ``num_rounds``, ``window // 2`` chunks entering
per round, as :func:`pathweave.plan.timemodel.executor_rounds` counts them).
The probes vary one
term each: tiny calls (``call_s``), many small chunks (``round_s``), tiny
relayed calls (``relay_s``), large direct and relayed transfers (the rates).
:func:`fit_costs` solves it by non-negative least squares on relative errors
and reports each probe's residual. :func:`fitted_model` puts the fit in the
:class:`~pathweave.sim.SimModel` fields that carry it: ``setup_s = call_s``,
``round_s = round_s``, ``relay_setup_s = relay_s``, ``relay_efficiency =
relayed_Bps / direct_Bps`` and the efficiency of the direct path's
bottleneck link kind (NVLink: ``nvlink_inject_efficiency``, network:
``network_efficiency``) as ``direct_Bps`` over its capacity in the fabric
(capped at 1); ``chunk_bytes`` and ``window`` are the job's Orchestrator's,
so the model counts rounds (and pipeline fill) as its data plane runs them.
With fewer than 3 ranks there is no relay: ``relay_s`` and
``relay_efficiency`` keep their defaults.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pathweave.errors import PathweaveError
from pathweave.runtime.launch import ToolParser

__all__ = ["FEATURES", "Fit", "Probe", "features", "fit_costs", "fitted_model", "main",
           "measure", "probes"]

#: The terms of a probe's time, in :func:`features` order.
FEATURES = ("call", "round", "relay", "direct_byte", "relayed_byte")


@dataclass(frozen=True)
class Probe:
    """One timed exchange: ``nbytes`` from rank 0 to rank 1, via ``relays`` forwarding ranks."""

    name: str
    nbytes: int
    relays: int
    chunk_bytes: int


def probes(num_ranks: int, max_bytes: int = 16 << 20) -> list[Probe]:
    """The probes run on ``num_ranks`` ranks (relayed ones need 3).

    >>> [p.name for p in probes(2)][:3]
    ['call', 'rounds-16', 'rounds-64']
    """
    small = 4096
    out = [Probe("call", 1024, 0, small), Probe("rounds-16", 16 * small, 0, small),
           Probe("rounds-64", 64 * small, 0, small)]
    out += [Probe(f"direct-{b >> 20}M", b, 0, min(b, 4 << 20))
            for b in (max_bytes // 4, max_bytes)]
    if num_ranks >= 3:
        out += [Probe("relay-call", 1024, 1, small), Probe("relay-rounds-16", 16 * small, 1, small)]
        out += [Probe(f"relayed-{b >> 20}M", b, 1, 1 << 20) for b in (max_bytes // 4, max_bytes)]
    return out


def features(rounds: int, relays: int, nbytes: int) -> np.ndarray:
    """A probe's row of the design matrix (:data:`FEATURES` order).

    >>> features(3, 1, 100).tolist()
    [1.0, 3.0, 1.0, 0.0, 100.0]
    """
    relayed = relays > 0
    return np.array([1.0, rounds, relays, 0 if relayed else nbytes, nbytes if relayed else 0],
                    dtype=np.float64)


@dataclass(frozen=True)
class Fit:
    """The fitted costs; ``residual`` holds each probe's ``(fit - measured) / measured``."""

    call_s: float
    round_s: float
    relay_s: float
    direct_Bps: float
    relayed_Bps: float
    residual: np.ndarray

    @property
    def rms_residual(self) -> float:
        return float(np.sqrt(np.mean(self.residual ** 2))) if self.residual.size else 0.0


def fit_costs(X: np.ndarray, t_s: np.ndarray) -> Fit:
    """Non-negative least squares of ``t_s ~ X @ coef`` in relative error (rows over ``t_s``).

    A column that is all zero (no relayed probe) fits to 0 (``relayed_Bps`` inf).

    >>> X = np.array([features(1, 0, 10), features(9, 0, 10), features(1, 0, 1e6)])
    >>> f = fit_costs(X, X @ [1e-4, 1e-5, 0, 1e-9, 0])
    >>> round(f.call_s * 1e6, 3), round(f.round_s * 1e6, 3), round(f.direct_Bps / 1e9, 3)
    (100.0, 10.0, 1.0)
    """
    from scipy.optimize import nnls

    X = np.asarray(X, dtype=np.float64)
    t = np.asarray(t_s, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != len(FEATURES) or t.shape != (X.shape[0],):
        raise ValueError(f"need X of shape [P, {len(FEATURES)}] and t_s of [P], got "
                         f"{X.shape} and {t.shape}")
    if not (np.isfinite(t).all() and (t > 0).all()):
        raise ValueError("every measured time must be finite and > 0")
    scale = X.max(axis=0)
    scale[scale == 0] = 1.0  # columns of similar size: nnls is then well conditioned
    coef, _ = nnls((X / scale) / t[:, None], np.ones_like(t))
    coef = coef / scale
    rate = [1.0 / float(c) if c > 0 else float("inf") for c in coef[3:]]
    return Fit(float(coef[0]), float(coef[1]), float(coef[2]), rate[0], rate[1],
               (X @ coef - t) / t)


def fitted_model(fit: Fit, fabric: Any, base: Any = None, relayed: bool = True, *,
                 chunk_bytes: int | None = None, window: int | None = None) -> Any:
    """``base`` (default ``SimModel()``) with the fit in the fields that carry it (module doc).

    ``fabric``: the fabric the probes ran on; its rank-0-to-1 direct path's
    slowest link sets the efficiency the measured rate is a share of.
    ``chunk_bytes``, ``window``: the data plane's (where given), the unit
    ``round_s`` is paid in.
    """
    from pathweave.fabric import LinkKind, candidate_paths
    from pathweave.sim import SimModel

    m = base if base is not None else SimModel()
    kw: dict[str, Any] = {"setup_s": fit.call_s, "round_s": fit.round_s}
    if chunk_bytes is not None:
        kw["chunk_bytes"] = int(chunk_bytes)
    if window is not None:
        kw["window"] = int(window)
    if relayed:
        kw["relay_setup_s"] = fit.relay_s
        if np.isfinite(fit.relayed_Bps) and np.isfinite(fit.direct_Bps):
            kw["relay_efficiency"] = max(1e-6, min(1.0, fit.relayed_Bps / fit.direct_Bps))
    ps = candidate_paths(fabric)
    pair = list(ps.pair_paths(0, 1))
    if pair and np.isfinite(fit.direct_Bps):
        links = ps.path_links(min(pair, key=lambda p: int(ps.length[p])))  # the shortest
        caps = fabric.capacity_Bps[links]
        slow = int(links[int(np.argmin(caps))])
        field = {int(LinkKind.NVLINK): "nvlink_inject_efficiency",
                 int(LinkKind.NETWORK): "network_efficiency"}.get(int(fabric.link_kind[slow]))
        if field is not None:
            kw[field] = max(1e-6, min(1.0, fit.direct_Bps / float(caps.min())))
    return replace(m, **kw)



def _probe_schedule(probe: Probe, rank: int, num_ranks: int, window: int) -> Any:
    from pathweave.runtime.schedule import Fragments, Segments, build_schedule

    D = np.zeros((num_ranks, num_ranks), dtype=np.int64)
    D[0, 1] = probe.nbytes
    route = [[0, 2, 1]] if probe.relays else [[0, 1]]
    return build_schedule(Segments.all_to_all(D), Fragments([1], [probe.nbytes], route),
                          rank=rank, chunk_bytes=probe.chunk_bytes, window=window)


def _time_probe(tr: Any, probe: Probe, iters: int, warmup: int,
                window: int) -> tuple[float, int, int]:
    """(median slowest-rank seconds, rounds, wrong bytes) of one probe on every rank."""
    import torch
    import torch.distributed as dist

    from pathweave.traffic.pattern import pattern_bytes

    sched = _probe_schedule(probe, tr.rank, tr.size, window)
    send = torch.from_numpy(pattern_bytes(0, 0, probe.nbytes)) if tr.rank == 0 else \
        torch.empty(0, dtype=torch.uint8)
    recv = torch.empty(probe.nbytes if tr.rank == 1 else 0, dtype=torch.uint8)
    row = np.full(tr.size, probe.nbytes, dtype=np.int64)  # a call's metadata all-gather
    took = torch.zeros(iters, dtype=torch.float64)
    for i in range(warmup + iters):
        dist.barrier()
        t0 = time.perf_counter()
        deadline = time.monotonic() + 300.0
        tr.exchange(row, deadline)
        tr.run(sched, [send], [recv], deadline=deadline, wait=True)
        if i >= warmup:
            took[i - warmup] = time.perf_counter() - t0
    wrong = torch.tensor([0 if tr.rank != 1 else int(
        (recv.numpy() != pattern_bytes(0, 0, probe.nbytes)).sum())])
    stat = torch.tensor([float(sched.num_rounds)])
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    dist.all_reduce(stat, op=dist.ReduceOp.MAX)
    dist.all_reduce(wrong)
    return statistics.median(took.tolist()), int(stat.item()), int(wrong.item())


def measure(iters: int = 10, warmup: int = 2, max_bytes: int = 16 << 20) -> dict[str, Any]:
    """Run every probe on the default group (every rank); the rows, fit and model (rank 0's)."""
    import torch.distributed as dist

    from pathweave.runtime.executor import Transport
    from pathweave.runtime.orchestrator import Orchestrator

    orch = Orchestrator()  # the fabric, chunk and window the job's calls run with
    fab = orch.group_fabric()
    tr = Transport(None)
    rows = []
    for p in probes(tr.size, max_bytes):
        t, rounds, wrong = _time_probe(tr, p, iters, warmup, orch.window)
        rows.append({"probe": p.name, "bytes": p.nbytes, "relays": p.relays,
                     "chunk_bytes": p.chunk_bytes, "rounds": rounds, "time_s": t,
                     "wrong": wrong})
    X = np.array([features(r["rounds"], r["relays"], r["bytes"]) for r in rows])
    fit = fit_costs(X, np.array([r["time_s"] for r in rows]))
    for r, e in zip(rows, fit.residual.tolist(), strict=True):
        r["residual"] = e
    model = fitted_model(fit, fab, relayed=tr.size >= 3, chunk_bytes=orch.chunk_bytes,
                         window=orch.window)
    return {"rows": rows, "fit": fit, "model": model, "fabric": fab.name, "ranks": tr.size,
            "backend": str(dist.get_backend()).lower()}


def _measure(rank: int, world_size: int, iters: int, warmup: int,
             max_bytes: int) -> dict[str, Any]:
    return measure(iters, warmup, max_bytes)


def report(res: dict[str, Any]) -> str:
    """The probes, their residuals and the fitted costs, as text."""
    fit: Fit = res["fit"]
    lines = [f"# pathweave calibrate: {res['ranks']} ranks, {res['backend']}, fabric "
             f"{res['fabric']}",
             f"#{'probe':>16} {'bytes':>10} {'relays':>6} {'rounds':>6} {'time_us':>10} "
             f"{'resid':>7} {'#wrong':>6}"]
    for r in res["rows"]:
        lines.append(f" {r['probe']:>16} {r['bytes']:>10} {r['relays']:>6} {r['rounds']:>6} "
                     f"{r['time_s'] * 1e6:>10.1f} {r['residual']:>+7.1%} {r['wrong']:>6}")
    lines += [f"# per call   {fit.call_s * 1e6:10.1f} us  -> setup_s",
              f"# per round  {fit.round_s * 1e6:10.1f} us  -> round_s",
              f"# per relay  {fit.relay_s * 1e6:10.1f} us  -> relay_setup_s",
              f"# direct     {fit.direct_Bps / 1e9:10.3f} GB/s",
              f"# relayed    {fit.relayed_Bps / 1e9:10.3f} GB/s",
              f"# rms residual {fit.rms_residual:.1%}"]
    return "\n".join(lines)


def _parser() -> ToolParser:
    p = ToolParser(prog="pathweave calibrate", description=__doc__.splitlines()[0])
    p.add_argument("-o", "--output", required=True, help="model file to write (.json)")
    p.add_argument("-n", "--iters", type=int, default=10, help="timed calls per probe")
    p.add_argument("-W", "--warmup-iters", type=int, default=2, help="warm-up calls per probe")
    p.add_argument("-e", "--maxbytes", default="16M", help="largest probe (default 16M)")
    p.add_argument("--ranks", type=int, help="start this many local gloo ranks (not under "
                   "torchrun); 3 or more to measure forwarding")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (``python -m pathweave.calibrate``, ``pathweave calibrate``)."""
    from pathweave.sim.modelfile import save_model
    from pathweave.traffic import parse_size

    parser = _parser()
    args = parser.parse_args(argv)
    try:
        for flag, v, lo in (("-n", args.iters, 1), ("-W", args.warmup_iters, 0),
                            ("--ranks", args.ranks, 2)):
            if v is not None and v < lo:
                raise ValueError(f"{flag} must be >= {lo}, got {v}")
        max_bytes = int(parse_size(args.maxbytes, "-e"))
        if max_bytes < 1 << 20:
            raise ValueError(f"-e must be >= 1M, got {args.maxbytes}")
        from pathweave.runtime.launch import run_tool

        rank, res = run_tool(_measure, (args.iters, args.warmup_iters, max_bytes),
                             ranks=args.ranks, backend="gloo")
        if rank == 0:
            calib = {k: res[k] for k in ("fabric", "ranks", "backend")}
            fit = res["fit"]
            calib |= {"call_s": fit.call_s, "round_s": fit.round_s, "relay_s": fit.relay_s,
                      "direct_Bps": fit.direct_Bps, "relayed_Bps": fit.relayed_Bps,
                      "rms_residual": fit.rms_residual, "probes": res["rows"]}
            print(report(res), flush=True)
            print(f"wrote {save_model(res['model'], args.output, _finite(calib))}")
    except (PathweaveError, ValueError, OSError) as exc:
        parser.fail(exc)
    return 0


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    """JSON has no infinity: an unmeasured rate becomes None."""
    return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in d.items()}


if __name__ == "__main__":
    sys.exit(main())
