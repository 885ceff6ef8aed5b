"""The decision of a call: multi-path flows or torch's collective, for a demand.

Every rank decides alike from the same metadata and the same history: the
demand is quantised (:func:`quantise`) and a decision per quantised demand
is cached in the group's state; a new pattern is planned (:func:`plan`,
with ``enabled="auto"`` kept only for a predicted gain over ``static``) and,
by hysteresis, replaces the current decision only when its predicted time
(:func:`predict`) is better by a clear margin (:func:`decide`). Plain
functions of a group's state (:class:`~pathweave.runtime._group._GroupState`),
the :class:`~pathweave.runtime.Config` and the orchestrator's counters.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pathweave.errors import PlanError
from pathweave.plan import Plan
from pathweave.runtime._group import TORCH_ONLY, _GroupState
from pathweave.runtime._stats import OrchestratorStats
from pathweave.runtime.config import Config
from pathweave.runtime.schedule import split_fragments

# The orchestrator's logger: its log lines keep the name users filter on.
log = logging.getLogger("pathweave.runtime.orchestrator")


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


def split_options(policy: str, min_split_bytes: int, chunk_bytes: int, *,
                  model: Any = None,
                  set_already: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The data plane's size threshold and chunk, and the time model, as options of ``policy``.

    Each where ``policy`` takes it (``model`` only if given). What the
    :class:`~pathweave.runtime.Orchestrator` passes its planner (options in ``set_already``
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


def plan(st: _GroupState, demand: np.ndarray, cfg: Config,
         stats: OrchestratorStats) -> _Decision:
    """A new decision for the quantised ``demand``: ``cfg.policy``'s plan or the fallback."""
    from pathweave.plan import make

    stats.plans_made += 1
    static = make(st.plan_fabric, demand, "static", paths=st.plan_paths)
    if callable(cfg.policy):
        plan = cfg.policy(st.fabric, demand)
        if not isinstance(plan, Plan):
            raise PlanError(f"policy callable returned {type(plan).__name__}, not a Plan")
        if plan.paths.fabric is not st.fabric or plan.paths.num_paths != st.paths.num_paths:
            raise PlanError("policy callable returned a plan for another fabric or path set")
        plan.validate()
    else:
        # min_split_bytes/chunk_bytes/model for a registered policy that takes them
        split = split_options(cfg.policy, cfg.min_split_bytes, cfg.chunk_bytes,
                              model=cfg.model, set_already=cfg.policy_options)
        plan = make(st.plan_fabric, demand, cfg.policy, paths=st.plan_paths, **split,
                    **cfg.policy_options)
    from pathweave.plan import predict_time

    plan_s = predict_time(plan, cfg.model)
    # The fallback is torch's own collective: none of pathweave's per-round host cost.
    static_s = predict_time(static, _without_rounds(cfg.model))
    log.debug("planned %s: predicted %.1f us, static %.1f us", plan.policy, plan_s * 1e6,
              static_s * 1e6)
    if cfg.enabled == "auto" and not plan_s * cfg.min_gain <= static_s:
        return fallback(static_s, (
            f"no gain: {plan.policy} predicted {plan_s * 1e6:.1f} us against static's "
            f"{static_s * 1e6:.1f} us, less than min_gain {cfg.min_gain}x"))
    keep = plan.flow_bytes > 0
    ps = st.paths
    fp = plan.flow_path[keep].astype(np.int64)
    pair = ps.src[fp].astype(np.int64) * ps.num_ranks + ps.dst[fp]
    ident = st.next_ident
    st.next_ident += 1
    return _Decision(ident, True, pair, fp, plan.flow_bytes[keep].astype(np.float64),
                     plan_s, static_s)


def fallback(static_s: float, reason: str) -> _Decision:
    """Torch's collective, for ``reason``."""
    empty = np.zeros(0, dtype=np.int64)
    return _Decision(0, False, empty, empty, np.zeros(0), static_s, static_s, reason)


def log_decision(st: _GroupState, dec: _Decision, op: str) -> None:
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


def predict(st: _GroupState, dec: _Decision, demand: np.ndarray, cfg: Config) -> float:
    """Predicted time (time model) of ``dec``'s splits applied to ``demand``."""
    covered = np.bincount(dec.flow_pair, weights=dec.flow_weight, minlength=demand.size) > 0
    if (demand.reshape(-1)[~covered] > 0).any():
        return float("inf")  # the plan has no path for some pair of this demand
    _, fpath, fbytes = split_fragments(
        dec.flow_pair, dec.flow_path, dec.flow_weight, demand,
        min_split_bytes=cfg.min_split_bytes,
    )
    from pathweave.plan.timemodel import time_terms

    fbytes = np.asarray(fbytes, dtype=np.int64)
    # Read-only, as a plan's flows are (predict_time): numba then runs both
    # through one compiled time model instead of compiling it again.
    fpath.setflags(write=False)
    fbytes.setflags(write=False)
    return max(time_terms(st.plan_paths, fpath, fbytes, cfg.model))


def decide(st: _GroupState, pair_bytes: np.ndarray, cfg: Config,
           stats: OrchestratorStats) -> tuple[_Decision, bool]:
    """The decision for this call and whether it cost no planning."""
    if cfg.enabled is False:
        return fallback(0.0, "disabled: enabled=False"), True
    if TORCH_ONLY in st.fabric.meta:
        why = f"torch-only fabric: {st.fabric.meta[TORCH_ONLY]}"
        return fallback(0.0, why), True
    q = quantise(pair_bytes)
    np.fill_diagonal(q, 0)
    if cfg.enabled == "auto" and int(q.max(initial=0)) < cfg.min_split_bytes:
        # Small exchanges: splitting costs more than it gains (NIMBLE's
        # size threshold); no planning, and the current plan stays for
        # the next large call.
        return fallback(0.0, "small: every pair below min_split_bytes "
                        f"({cfg.min_split_bytes} B)"), True
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
    cand = plan(st, q, cfg, stats)
    cur = st.current
    if cur is not None and cur is not cand:
        # Hysteresis: a new plan must beat the current one by a clear margin.
        cur_s = predict(st, cur, q, cfg) if cur.multipath else cand.static_s
        if not cand.predicted_s < cur_s * (1.0 - cfg.hysteresis):
            log.debug("hysteresis keeps the current decision: new %.1f us, current %.1f us",
                      cand.predicted_s * 1e6, cur_s * 1e6)
            cand = cur
        else:
            stats.plan_switches += 1
            log.info("plan switch: %s (%.1f us) replaces %s (%.1f us) on a new demand",
                     _decision_text(cand), cand.predicted_s * 1e6, _decision_text(cur),
                     cur_s * 1e6)
    st.current = cand
    st.last_qkey = key
    st.plans.put(key, cand)
    return cand, False


def _decision_text(dec: _Decision) -> str:
    return f"multi-path plan #{dec.ident}" if dec.multipath else "torch's collective"


def _without_rounds(model: Any) -> Any:
    """``model`` without pathweave's per-round host cost (torch's collective has none)."""
    import dataclasses

    return model if model is None or not model.round_s else dataclasses.replace(model,
                                                                                 round_s=0.0)
