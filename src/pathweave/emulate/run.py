"""Run the data plane inside an emulated fabric and set it beside the simulator.

:func:`run_emulated` starts one process per rank inside that rank's namespace
(forked from a fork server that imported torch, then moved into the namespace:
:mod:`pathweave.emulate._forked`; gloo binds to
the identity interface through ``GLOO_SOCKET_IFNAME``, the rendezvous is on
rank 0's identity address), runs the all-to-all of a workload ``repeat`` times
per policy, the policies round-robin (every repetition calls each once, in
the balanced order of :func:`~pathweave.emulate._rankworker.round_robin`, so
a slow spell of the shared machine hits them alike), each
call after a pause of twice :meth:`~pathweave.emulate.topology.Layout.refill_s`
(every link's token bucket full again, whatever the call before drained),
checks every received byte, and collects per call the span from
the first rank's start to the last rank's end (one monotonic clock: one
kernel). Beside each median it puts

* the simulator's prediction for the scaled fabric: the fragments the data
  plane actually sends (the policy's plan of the quantised demand, applied to
  the exact bytes with the same size threshold, as the
  :class:`~pathweave.runtime.orchestrator.Orchestrator` does), simulated with
  :func:`emulator_model`;
* the congestion bound of those fragments (the least time they can take).

Policies are registered names run through the pathweave data plane, plus
``torch``: torch's own ``all_to_all_single``, every pair straight over the
kernel's routes (the static paths).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pathweave.emulate._forked import start_in_netns
from pathweave.emulate._ip import EmulatorError
from pathweave.emulate._predict import (
    ADAPT_SUFFIX,
    DEFAULT_CHUNK_BYTES,
    DEFAULT_MIN_SPLIT_BYTES,
    emulator_model,
    pipeline_fill_s,
    predict,
    rank_config,
)
from pathweave.emulate._probe import probe_transfer
from pathweave.emulate._rankworker import expected_bytes
from pathweave.emulate.emulator import Emulator
from pathweave.emulate.topology import DEFAULT_SHAPING
from pathweave.errors import InputError
from pathweave.fabric import Fabric, resolve
from pathweave.traffic.pattern import pattern_bytes

__all__ = [
    "EmulationResult",
    "PolicyResult",
    "emulator_model",
    "expected_bytes",
    "pattern_bytes",
    "pipeline_fill_s",
    "predict",
    "probe_transfer",
    "run_emulated",
    "run_workloads",
]

#: Default capacity scale: 120 GB/s NVLink -> 12 MB/s, 50 GB/s rail -> 5 MB/s.
DEFAULT_SCALE = 1e-4
_MASTER_PORT = 29517  # rank 0's namespace is private: no clash with anything outside


# ------------------------------------------------------------------ results
@dataclass(frozen=True)
class PolicyResult:
    """One policy's measurements and predictions (seconds).

    ``makespans_s``: each timed call; ``measured_s`` their median;
    ``predicted_s``: the simulator's makespan of the same fragments on the
    scaled fabric; ``bound_s``: their congestion bound; ``verified``: every
    rank received exactly the expected bytes in every call;
    ``path_kind_bytes``: bytes per path role the data plane sent (per call);
    ``plan_switches``: plans replaced during the calls (live adaptation);
    ``learned``: its capacity estimates below nominal (link name -> ratio);
    ``same_plan_as``: the first policy before it in the run whose fragments
    put the same bytes on the same paths ("" if none): two measurements of
    one plan, whose difference is the machine's noise; ``multipath``: some
    rank pair's bytes take more than one path.
    """

    policy: str
    makespans_s: tuple[float, ...]
    measured_s: float
    predicted_s: float
    bound_s: float
    verified: bool
    path_kind_bytes: dict[str, int] = field(default_factory=dict)
    plan_switches: int = 0
    learned: dict[str, float] = field(default_factory=dict)
    same_plan_as: str = ""
    multipath: bool = False

    @property
    def vs_predicted(self) -> float:
        """measured / predicted."""
        return self.measured_s / self.predicted_s if self.predicted_s > 0 else math.nan

    @property
    def vs_bound(self) -> float:
        """measured / congestion bound."""
        return self.measured_s / self.bound_s if self.bound_s > 0 else math.nan

    @property
    def spread(self) -> float:
        """Interquartile range of the timed calls over their median (0 for one call)."""
        q1, q3 = np.percentile(self.makespans_s, [25, 75])
        return float(q3 - q1) / self.measured_s if self.measured_s > 0 else math.nan


@dataclass(frozen=True)
class EmulationResult:
    """Everything :func:`run_emulated` measured, with its settings."""

    fabric: str
    scale: float
    workload: str
    bytes_per_rank: int
    total_bytes: int
    repeat: int
    chunk_bytes: int
    window: int
    min_split_bytes: int
    policies: tuple[PolicyResult, ...]
    wall_s: float
    background: str = ""
    shaping: str = DEFAULT_SHAPING

    def policy(self, name: str) -> PolicyResult:
        for p in self.policies:
            if p.policy == name:
                return p
        have = [p.policy for p in self.policies]
        raise KeyError(f"no policy {name!r} in this run; it has {have}")

    def speedup(self, policy: str, baseline: str | None = None) -> tuple[float, float]:
        """(measured, predicted) speed-up of ``policy`` over ``baseline`` (default: the first)."""
        base = self.policy(baseline or self.policies[0].policy)
        p = self.policy(policy)
        return base.measured_s / p.measured_s, base.predicted_s / p.predicted_s

    def records(self) -> list[dict[str, Any]]:
        """One flat JSON-ready row per policy."""
        base = self.policies[0]
        rows = []
        for p in self.policies:
            rows.append({
                "fabric": self.fabric, "scale": self.scale, "workload": self.workload,
                "bytes_per_rank": self.bytes_per_rank, "policy": p.policy,
                "measured_s": p.measured_s, "predicted_s": p.predicted_s, "bound_s": p.bound_s,
                "measured_vs_predicted": p.vs_predicted, "measured_vs_bound": p.vs_bound,
                "speedup_measured": base.measured_s / p.measured_s,
                "speedup_predicted": base.predicted_s / p.predicted_s,
                "verified": p.verified, "repeat": self.repeat, "background": self.background,
                "shaping": self.shaping,
                "spread": p.spread, "makespans_s": list(p.makespans_s),
                "plan_switches": p.plan_switches, "learned": dict(p.learned),
                "same_plan_as": p.same_plan_as, "multipath": p.multipath,
            })
        return rows

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["records"] = self.records()
        return d



# -------------------------------------------------------------------- runs
def _launch(emu: Emulator, start: Callable[[int, Path], Any], log_dir: Path, timeout_s: float,
            ranks: Sequence[int]) -> None:
    """Start every rank (``start(rank, log_path)``, a ``Popen``-like handle); wait; kill
    all on any failure."""
    procs: dict[int, Any] = {}
    try:
        for r in ranks:
            procs[r] = start(r, log_dir / f"rank{r}.log")
            emu.record_process(procs[r].pid)  # a later cleanup kills it if we die
        deadline = time.monotonic() + timeout_s
        while True:
            codes = {r: p.poll() for r, p in procs.items()}
            bad = [r for r, c in codes.items() if c not in (None, 0)]
            if bad:
                r = bad[0]
                raise EmulatorError(
                    f"rank {r} exited with code {codes[r]}; its log ends:\n"
                    + _tail(log_dir / f"rank{r}.log")
                )
            if all(c == 0 for c in codes.values()):
                return
            if time.monotonic() > deadline:
                waiting = [r for r, c in codes.items() if c is None]
                raise EmulatorError(
                    f"ranks {waiting} still running after {timeout_s:.0f} s; rank "
                    f"{waiting[0]}'s log ends:\n" + _tail(log_dir / f"rank{waiting[0]}.log")
                )
            time.sleep(0.05)
    finally:
        for p in procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def _tail(path: Path, nchars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-nchars:]
    except OSError:
        return "(no log)"


def run_emulated(
    fabric: Fabric | str,
    *,
    workload: str = "hotspot:0.8",
    demand: np.ndarray | None = None,
    **options: Any,
) -> EmulationResult:
    """Emulate ``fabric`` and run the all-to-all of one workload per policy.

    ``workload`` is a :func:`pathweave.traffic.parse_workload` spec; or pass
    ``demand`` (``int64[N, N]`` bytes) directly. Every other keyword is
    :func:`run_workloads`'s (``scale``, ``bytes_per_rank``, ``policies``,
    ``repeat``, ...), with the same defaults.

    Raises
    ------
    EmulatorError
        Not root, tools missing, a rank failed or timed out, or any output
        differed from the expected bytes.
    """
    wl = workload if demand is None else "custom"
    return run_workloads(fabric, [wl], demands=None if demand is None else [demand],
                         **options)[0]


def run_workloads(
    fabric: Fabric | str,
    workloads: Sequence[str],
    *,
    scale: float = DEFAULT_SCALE,
    bytes_per_rank: int = 8 << 20,
    policies: Sequence[str] = ("static", "mwu"),
    repeat: int = 3,
    warmup: int = 1,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    window: int = 4,
    min_split_bytes: int = DEFAULT_MIN_SPLIT_BYTES,
    timeout_s: float = 600.0,
    prefix: str = "pw",
    emulator: Emulator | None = None,
    model: Any = None,
    demands: Sequence[np.ndarray] | None = None,
    log: Callable[[str], None] | None = None,
    nice: int = 0,
    background: str | Sequence[str] | None = None,
    shaping: str | None = None,
) -> list[EmulationResult]:
    """Emulate ``fabric`` at ``scale`` and run each workload's all-to-all per policy.

    One emulator and one launch of the ranks for every workload.

    Parameters
    ----------
    fabric
        Fabric, preset spec or file.
    workloads, bytes_per_rank
        :func:`pathweave.traffic.parse_workload` specs and payload per rank.
    scale
        Capacity scale (see :class:`~pathweave.emulate.Emulator`).
    policies
        Registered policy names for the pathweave data plane, or ``torch``.
    repeat, warmup
        Timed and untimed calls per policy (the first call plans and connects).
    chunk_bytes, window, min_split_bytes
        Data-plane settings (:class:`~pathweave.runtime.Config`).
    timeout_s
        Limit of the whole run; every rank is killed past it.
    prefix, emulator, shaping
        Use a running :class:`Emulator` of this fabric and scale, or make one
        with ``prefix`` whose links are shaped as ``shaping`` (``tbf`` or
        ``ackfirst``, see :func:`~pathweave.emulate.topology.build_layout`;
        default :data:`~pathweave.emulate.topology.DEFAULT_SHAPING`, or the
        given emulator's), torn down at the end.
    model
        :class:`~pathweave.sim.SimModel` for the predictions; default
        :func:`emulator_model`.
    log
        Called with one line per stage (a log sink; the benchmarks' progress
        callbacks, ``(done, total, what)``, count work, this names stages).

    ``demands``, if given, replaces the workload specs (one matrix per entry
    of ``workloads``, which then only label them). ``nice`` (-20..19) runs the
    ranks at that scheduling priority: a negative value (root) keeps other
    work on a shared machine from stalling the forwarding ranks.
    ``background`` (``LINK:FRACTION``, see
    :func:`~pathweave.emulate.background.parse_background`) runs a co-tenant
    for the whole run; predictions and bounds are then on the residual
    capacities, blind policies planning on the nominal ones and ``+adapt``
    ones on the residual ones (what they should learn). Every policy keeps
    its own orchestrator; after the warm-up calls the timed calls run in
    rounds, each calling every policy once
    (:func:`~pathweave.emulate._rankworker.round_robin`), so a load that
    drifts during the run weighs on every policy alike.
    """
    from pathweave.emulate.background import parse_background, residual_fabric

    t_start = time.monotonic()
    fab = resolve(fabric)
    pols = [str(p) for p in policies]
    _check_run_args(pols, chunk_bytes, repeat, warmup, nice)
    tenants = parse_background(background, fab) if background else []
    mats = _demand_matrices(fab.num_ranks, workloads, demands, bytes_per_rank)
    say = log or (lambda s: None)
    own = emulator is None
    emu = emulator if emulator is not None else Emulator(
        fab, scale, prefix=prefix, shaping=shaping or DEFAULT_SHAPING)
    if emulator is not None and (emulator.fabric != fab or emulator.scale != float(scale)
                                 or emulator.layout.shaping != (shaping or emu.layout.shaping)):
        raise InputError("the emulator given runs another fabric, scale or shaping than "
                         "asked for")
    sfab = emu.layout.scaled_fabric()
    if own:
        emu.__enter__()  # raises (not root, tools missing) before anything is said or made
        say(f"emulator up: {fab.name} x {scale:g} ({len(emu.layout.namespaces)} namespaces, "
            f"{len(emu.layout.shaped)} shaped links)")
    cfg = rank_config(sfab, chunk_bytes=int(chunk_bytes), window=int(window),
                      min_split_bytes=int(min_split_bytes), timeout_s=float(timeout_s))
    spec = {
        "demands": [d.tolist() for d in mats], "policies": pols, "repeat": int(repeat),
        "warmup": int(warmup), "timeout_s": float(timeout_s), "config": cfg.to_dict(),
        # Twice the slowest bucket's refill before each timed call (_timed_call).
        "settle_s": 2 * emu.layout.refill_s(),
    }
    try:
        per_rank = _run_ranks(emu, sfab, spec, tenants, int(nice), say)
    finally:
        if own:
            emu.__exit__(None, None, None)
            say("emulator down")
    say("predicting with the simulator")
    rfab = residual_fabric(sfab, tenants, emu.scale)
    out = []
    for k, (wl, d) in enumerate(zip(workloads, mats, strict=True)):
        results = _policy_results(
            [pr[k] for pr in per_rank], wl, d, pols, int(repeat), rfab, sfab,
            dict(chunk_bytes=chunk_bytes, window=window, min_split_bytes=min_split_bytes,
                 model=model))
        out.append(EmulationResult(
            fabric=fab.name, scale=float(emu.scale), workload=wl,
            bytes_per_rank=int(bytes_per_rank), total_bytes=int(d.sum()), repeat=int(repeat),
            chunk_bytes=int(chunk_bytes), window=int(window),
            min_split_bytes=int(min_split_bytes), policies=tuple(results),
            wall_s=time.monotonic() - t_start,
            background=",".join(t.spec for t in tenants), shaping=emu.layout.shaping,
        ))
    return out


def _check_run_args(pols: Sequence[str], chunk_bytes: int, repeat: int, warmup: int,
                    nice: int) -> None:
    """:func:`run_workloads`' checks, before anything is built."""
    from pathweave.plan.registry import check_options
    from pathweave.runtime.orchestrator import MIN_CHUNK_BYTES

    if not pols:
        raise InputError("policies must name at least one policy")
    for p in pols:
        if p != "torch":
            # What the ranks' Orchestrators check, here before anything is built: a
            # policy the data plane cannot run (multirail, UCX's model) is refused.
            check_options(p.removesuffix(ADAPT_SUFFIX), {})
    # The ranks' Orchestrator refuses smaller chunks; say so before anything is built.
    if int(chunk_bytes) < MIN_CHUNK_BYTES:
        raise InputError(f"chunk_bytes must be >= {MIN_CHUNK_BYTES}, got {chunk_bytes}")
    if int(repeat) < 1 or int(warmup) < 0:
        raise InputError(f"repeat must be >= 1 and warmup >= 0, got {repeat}, {warmup}")
    if not -20 <= int(nice) <= 19:
        raise InputError(f"nice must lie in [-20, 19], got {nice}")


def _demand_matrices(n: int, workloads: Sequence[str], demands: Sequence[np.ndarray] | None,
                     bytes_per_rank: int) -> list[np.ndarray]:
    """One ``int64[n, n]`` demand per workload (its spec, or ``demands[k]``), diagonal zero."""
    from pathweave.traffic import parse_workload

    mats = []
    for k, wl in enumerate(workloads):
        if demands is None:
            d = np.asarray(parse_workload(wl, n, bytes_per_rank=bytes_per_rank), dtype=np.int64)
        else:
            d = np.array(demands[k], dtype=np.int64)
            if d.shape != (n, n) or (d < 0).any():
                raise InputError(
                    f"demand {k} must be a non-negative int64[{n}, {n}], got shape {d.shape}"
                )
        np.fill_diagonal(d, 0)
        mats.append(d)
    if not mats:
        raise InputError("workloads must name at least one workload")
    return mats


def _run_ranks(emu: Emulator, sfab: Fabric, spec: dict[str, Any], tenants: Sequence[Any],
               nice: int, say: Callable[[str], None]) -> list[Any]:
    """Launch every rank on ``spec`` (beside the co-tenants) and read back what each wrote."""
    from pathweave.emulate.background import Background
    from pathweave.fabric.io import save

    lay = emu.layout
    n = sfab.num_ranks
    gpn = sfab.gpus_per_node
    with emu.temp_dir() as work:
        os.chmod(work, 0o755)
        spec = {**spec, "fabric_file": str(save(sfab, work / "fabric.json")),
                "out_dir": str(work)}
        (work / "spec.json").write_text(json.dumps(spec))

        def start(r: int, log_path: Path) -> Any:
            return start_in_netns(lay.rank_ns[r], ["worker", str(work / "spec.json"), str(r)],
                                  log_path=log_path, env=env_of(r), nice=nice)

        def env_of(r: int) -> dict:
            env = dict(os.environ)
            env.update({
                "MASTER_ADDR": lay.rank_address[0], "MASTER_PORT": str(_MASTER_PORT),
                "RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r % gpn),
                "LOCAL_WORLD_SIZE": str(gpn), "GLOO_SOCKET_IFNAME": "id0",
                "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            })
            env.pop("PATHWEAVE_FABRIC", None)
            return env

        say(f"running {n} ranks: {len(spec['demands'])} workload(s) x "
            f"{', '.join(spec['policies'])}, {spec['warmup']} + {spec['repeat']} calls each")
        if tenants:
            say("co-tenant: " + ", ".join(
                f"{t.spec} (ranks {t.a} <-> {t.b}, {t.rate_Bps * emu.scale / 1e6:.2f} MB/s "
                "each way)" for t in tenants))
        with Background(emu, tenants, spec["timeout_s"]):
            _launch(emu, start, work, spec["timeout_s"], range(n))
        return [json.loads((work / f"rank{r}.json").read_text()) for r in range(n)]


def _policy_results(recs_of: list[dict[str, Any]], wl: str, d: np.ndarray,
                    pols: Sequence[str], repeat: int, rfab: Fabric, sfab: Fabric,
                    options: dict[str, Any]) -> list[PolicyResult]:
    """Each policy's spans (``recs_of[rank][policy]``) beside its prediction, of one workload."""
    results: list[PolicyResult] = []
    loads: dict[str, np.ndarray] = {}
    for p in pols:
        recs = [pr[p] for pr in recs_of]
        spans = [max(rc["times"][i][1] for rc in recs) - min(rc["times"][i][0] for rc in recs)
                 for i in range(repeat)]
        bad = [r for r, rc in enumerate(recs) if not rc["ok"]]
        if bad:
            raise EmulatorError(f"workload {wl!r}, policy {p!r}: ranks {bad} received "
                                "wrong bytes")
        pred_s, bound_s, eff = predict(
            rfab, d, p, plan_fabric=rfab if p.endswith(ADAPT_SUFFIX) else sfab, **options)
        # Equal bytes per path are one plan on the wire (torch's kernel
        # routes are not the data plane's: never compared).
        load = eff.path_bytes()
        same = "" if p == "torch" else next(
            (q for q, v in loads.items() if np.array_equal(v, load)), "")
        if p != "torch":
            loads.setdefault(p, load)
        results.append(PolicyResult(
            p, tuple(spans), float(np.median(spans)), pred_s, bound_s, True,
            {kk: int(v) for kk, v in recs[0].get("kinds", {}).items()},
            int(recs[0].get("switches", 0)), dict(recs[0].get("learned", {})), same,
            _multipath(eff),
        ))
    return results


def _multipath(plan: Any) -> bool:
    """Whether some rank pair's bytes take more than one path in ``plan``."""
    ps = plan.paths
    fp = np.asarray(plan.flow_path, dtype=np.int64)[np.asarray(plan.flow_bytes) > 0]
    pair = ps.src[fp].astype(np.int64) * plan.fabric.num_ranks + ps.dst[fp]
    return len(np.unique(np.stack([pair, fp]), axis=1).T) > len(np.unique(pair))
