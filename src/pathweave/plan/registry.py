"""One registry for every policy, and :func:`make`, the one way to plan."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from pathweave._registry import Registry
from pathweave.errors import PlanError, WorkloadError
from pathweave.fabric import Fabric, PathSet, candidate_paths, resolve
from pathweave.fabric.paths import DEFAULT_KINDS, MODEL_KINDS, check_rules
from pathweave.plan._flows import whole_bytes
from pathweave.plan._plan import Plan
from pathweave.traffic import validate_demand

#: Options every policy accepts: which path rules to use (never ``pcie`` or
#: ``ecmp`` by default: :data:`pathweave.fabric.paths.DEFAULT_KINDS`).
COMMON_OPTIONS: dict[str, Any] = {"kinds": DEFAULT_KINDS, "max_hops": None}

#: The policy used wherever none is given (:func:`make`, the Orchestrator, the
#: CLI). The name lives here, beside the registry that resolves it; the policy
#: itself registers under it in :mod:`pathweave.plan.mintime`.
DEFAULT_POLICY = "mintime"

Planner = Callable[..., Plan]


@dataclass(frozen=True)
class Policy:
    """A registered policy: its function, its options with defaults, one line of help.

    ``baseline``: the policy stands for what other libraries do (NCCL, UCX,
    h-score); the default policy plans every baseline as a candidate and is
    never predicted slower than any of them.

    ``stripes``: for a policy whose plan splits every pair's bytes evenly
    over a fixed list of paths whatever the load, ``stripes(paths)`` returns
    that list as a CSR ``(ptr, pid)`` over all flat pairs; the default
    policy then scores it without building the plan
    (:func:`pathweave.plan.timemodel.stripe_time`).

    ``check``: ``check(**options)`` raises for a bad option value without
    planning (:func:`check_options`); None: values are checked when planning.

    ``executable``: False for a baseline whose plan models a peer that routes
    in a way pathweave's data plane cannot (``multirail``: UCX's GPUDirect
    RDMA across the destination node's PCIe tree, with no GPU forwarding).
    Such a plan is simulated and compared, never run: the default policy
    never takes it as a candidate and the data plane refuses the policy
    (:func:`check_options`).

    ``below``: for a policy that places each pair's bytes once, in a fixed
    order, and never moves them (loads only grow as it plans),
    ``below(fabric, demand, paths, stop_s, model)`` returns its plan, or
    None as soon as the loads placed so far prove that the plan's predicted
    time (:func:`pathweave.plan.timemodel.predict_time` under ``model``)
    is at least ``stop_s``. The default policy passes its best candidate's
    time so far and skips the policy on None.
    """

    name: str
    func: Planner
    options: dict[str, Any]
    summary: str
    baseline: bool = False
    check: Callable[..., None] | None = None
    stripes: Callable[[PathSet], tuple[np.ndarray, np.ndarray]] | None = None
    executable: bool = True
    below: Callable[..., Plan | None] | None = None


#: Every policy, in the order of its module here (then of registration within
#: one): the order of :func:`policies`. A policy is one module that registers
#: itself with :func:`register`; its module is imported when the registry is
#: first read.
POLICIES: Registry[Policy] = Registry(
    "policy", plural="policies", error=PlanError,
    modules=tuple(f"pathweave.plan.{m}" for m in (
        "static", "deepep", "multirail", "mwu", "optimal", "hscore", "mintime")),
)


def register(
    name: str,
    *,
    summary: str,
    baseline: bool = False,
    check: Callable[..., None] | None = None,
    stripes: Callable[[PathSet], tuple[np.ndarray, np.ndarray]] | None = None,
    executable: bool = True,
    below: Callable[..., Plan | None] | None = None,
) -> Callable[[Planner], Planner]:
    """Register ``func(fabric, demand, paths, **options) -> Plan`` under ``name``.

    The policy's options are ``func``'s keyword-only parameters, each with
    its default: declared once, in the signature (:func:`signature_options`).
    ``check(**options)``, if given, validates every option's value without
    planning, so a bad value fails where it is set (:func:`check_options`).
    A name already taken raises :class:`~pathweave.errors.PlanError`.
    """

    def deco(func: Planner) -> Planner:
        POLICIES.add(name, Policy(name, func, signature_options(func), summary, baseline, check,
                                  stripes, executable, below), module=func.__module__)
        return func

    return deco


def signature_options(func: Callable[..., Any]) -> dict[str, Any]:
    """``func``'s options: its keyword-only parameters and their defaults, in order.

    Examples
    --------
    >>> def planner(fabric, demand, paths, *, fraction: float = 0.5, refine: int = 1):
    ...     pass
    >>> signature_options(planner)
    {'fraction': 0.5, 'refine': 1}
    >>> signature_options(lambda fabric, demand, paths, *, knob: None)
    Traceback (most recent call last):
    ...
    pathweave.errors.PlanError: policy option 'knob' of <lambda> has no default
    """
    opts: dict[str, Any] = {}
    for p in inspect.signature(func).parameters.values():
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            if p.default is inspect.Parameter.empty:
                raise PlanError(f"policy option {p.name!r} of {func.__qualname__} has no "
                                "default")
            opts[p.name] = p.default
    return opts


def policies(*, executable_only: bool = False) -> list[str]:
    """Names of the registered policies, in registration order.

    ``executable_only``: only those whose plans the data plane runs
    (:attr:`Policy.executable`; not a model of a peer's own routing).
    """
    return [n for n, p in POLICIES.items() if p.executable or not executable_only]


def baselines(*, executable_only: bool = False) -> list[str]:
    """Names of the registered baseline policies (``static``, ``multirail``, ...).

    ``executable_only``: only those whose plans the data plane runs
    (:attr:`Policy.executable`), e.g. for the default policy's candidates or
    a comparison on real bytes.

    Examples
    --------
    >>> baselines()
    ['static', 'deepep', 'multirail', 'hscore']
    >>> baselines(executable_only=True)
    ['static', 'deepep', 'hscore']
    """
    return list(baseline_names(executable_only))


def baseline_names(executable_only: bool = False) -> tuple[str, ...]:
    """:func:`baselines` as a tuple kept with the registry: the same object until a
    policy registers (the default policy reads it on every plan; a list copy and
    keyword call were a third of that read)."""
    # The default policy lists them three times a plan: 2.5 us each, built.
    return POLICIES.derived(("baselines", executable_only), lambda: tuple(
        p.name for p in POLICIES.values()
        if p.baseline and (p.executable or not executable_only)))


def policy_info(name: str) -> Policy:
    """The registered policy ``name``.

    Raises
    ------
    PlanError
        No policy has that name; the message names the closest and lists every one.

    Examples
    --------
    >>> policy_info("optimal").baseline
    False
    >>> policy_info("mwu-time")
    Traceback (most recent call last):
    ...
    pathweave.errors.PlanError: unknown policy 'mwu-time' (did you mean 'mwu_time'?); known ...
    """
    return POLICIES[name]


def check_options(policy: str, options: dict[str, Any], *, execute: bool = True) -> None:
    """Raise unless ``policy`` is registered and takes ``options`` (names, and values where
    the policy registered a check), without planning anything.

    With ``execute`` (the data plane's check, made by the Orchestrator and
    the emulator before any byte moves), also raise unless the data plane
    can run the policy's plans: the policy is executable
    (:attr:`Policy.executable`) and ``kinds`` has no modelling rule
    (:data:`pathweave.fabric.paths.MODEL_KINDS`: a ``pcie`` path has no
    forwarding GPU and ``ecmp``'s spine paths of a pair are one send
    ``[s, d]``, so the transport, not the plan, would pick their route).

    Raises
    ------
    PlanError
        Unknown policy, unknown option (the message lists the valid ones), an
        option value out of range or, with ``execute``, a plan the data plane
        cannot run.
    FabricError
        A bad value of a path-rule option every policy takes (``kinds``,
        ``max_hops``: :func:`pathweave.fabric.paths.check_rules`).
    TypeError
        An option value of the wrong type.

    Examples
    --------
    >>> check_options("multirail", {}, execute=False)
    >>> check_options("multirail", {})
    Traceback (most recent call last):
    ...
    pathweave.errors.PlanError: policy 'multirail' models a peer's routing that pathweave's ...
    """
    pol = policy_info(policy)
    valid = {**COMMON_OPTIONS, **pol.options}
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise PlanError(
            f"policy {policy!r} got unknown option {unknown[0]!r}; valid options: "
            + ", ".join(sorted(valid))
        )
    kinds = check_rules(options.get("kinds", COMMON_OPTIONS["kinds"]),
                        options.get("max_hops", COMMON_OPTIONS["max_hops"]))
    if pol.check is not None:
        pol.check(**{k: options.get(k, v) for k, v in pol.options.items()})
    if not execute:
        return
    if not pol.executable:
        # The summary names the peer ("MPI/UCX: ..."): its first part, to keep one short line.
        raise PlanError(
            f"policy {policy!r} models a peer's routing that pathweave's data plane cannot "
            f"run ({pol.summary.split(':')[0]}); simulate it or compare against it, and run "
            "one of " + ", ".join(policies(executable_only=True))
        )
    model = [k for k in MODEL_KINDS if k in kinds]
    if model:
        raise PlanError(f"kinds={tuple(kinds)!r}: the data plane cannot run {model[0]!r} paths "
                        f"({MODEL_KINDS[model[0]]})")


def as_demand(demand: Any, num_ranks: int) -> np.ndarray:
    """Validate a demand matrix and return it as read-only ``int64`` bytes.

    Planners route whole bytes, so every entry must be a whole number.
    """
    plain = _plain_bytes(demand, num_ranks)
    # NOTE: no DemandBytes and no sum views on the usual path (~0.6 us a plan).
    return demand_bytes(demand, num_ranks).bytes if plain is None else plain[0]


class DemandBytes(NamedTuple):
    """A checked demand (:func:`as_demand`) and what the same pass read off it."""

    bytes: np.ndarray
    largest: int
    #: ``int64[N]``: bytes out of / into each GPU (the cut bound's sums).
    rows: np.ndarray
    cols: np.ndarray


#: Character codes of the dtypes :func:`demand_bytes` checks in one kernel pass.
_PLAIN_CODES = np.dtype(np.float64).char + np.dtype(np.int64).char


def _plain_bytes(demand: Any, num_ranks: int) -> tuple[np.ndarray, int, np.ndarray] | None:
    """A float64 or int64 C-contiguous square matrix of plain bytes checked in one kernel
    pass (:func:`~pathweave.plan._flows.whole_bytes`): ``(read-only int64 copy, largest,
    sums)``; None for anything else (the general checks name the bad entry)."""
    arr = demand if isinstance(demand, np.ndarray) else None
    # NOTE: the dtype by its character code: comparing dtypes cost more than a
    # microsecond of an 8-GPU plan.
    if (arr is not None and arr.shape == (num_ranks, num_ranks) and arr.flags.c_contiguous
            and arr.dtype.char in _PLAIN_CODES):
        out = np.empty(arr.shape, dtype=np.int64)  # always a copy: no later edit reaches the plan
        sums = np.zeros((2, num_ranks), dtype=np.int64)
        largest = int(whole_bytes(arr, out, sums))
        if largest >= 0:
            out.setflags(write=False)
            return out, largest, sums
    return None


def demand_bytes(demand: Any, num_ranks: int) -> DemandBytes:
    """:func:`as_demand`, with the largest pair and the row and column sums."""
    plain = _plain_bytes(demand, num_ranks)
    if plain is not None:
        out, largest, sums = plain
        return DemandBytes(out, largest, sums[0], sums[1])
    arr = demand if isinstance(demand, np.ndarray) else None
    # NOTE: fast path for the runtime's per-call planning: a well-formed
    # float or int matrix passes with a handful of vectorised checks; anything
    # else goes through validate_demand, which names the bad entry.
    if (
        arr is not None
        and arr.shape == (num_ranks, num_ranks)
        and arr.dtype.kind in "fiu"
        and (arr.dtype.kind != "f" or np.isfinite(arr).all())
        and arr.min() >= 0
        and not arr.diagonal().any()
    ):
        d = arr
    else:
        d = validate_demand(demand, num_ranks)
    if d.dtype.kind == "f":
        di = np.rint(d)
        if not np.array_equal(di, d):
            bad = np.flatnonzero(di != d)
            s, t = divmod(int(bad[0]), num_ranks)
            raise WorkloadError(f"D[{s}, {t}] = {float(d[s, t])!r} is not a whole number of bytes")
        d = di
    out = d.astype(np.int64)  # always a copy: the plan must not see later edits
    out.setflags(write=False)
    return DemandBytes(out, int(out.max(initial=0)), out.sum(axis=1), out.sum(axis=0))


def make(
    fabric: Fabric | str,
    demand: Any,
    policy: str | None = None,
    *,
    paths: PathSet | None = None,
    **options: Any,
) -> Plan:
    """Plan ``demand`` on ``fabric`` with ``policy``; every policy returns a :class:`Plan`.

    Parameters
    ----------
    fabric
        A :class:`~pathweave.fabric.Fabric`, a preset spec or a fabric file.
    demand
        ``D[src, dst]`` in whole bytes, shape ``(num_ranks, num_ranks)``.
    policy
        A registered policy (see :func:`policies`); default
        :data:`pathweave.plan.DEFAULT_POLICY`, the plan of least predicted
        completion time.
    paths
        Candidate paths to use; default ``candidate_paths(fabric, kinds,
        max_hops)`` (cached on the fabric).
    **options
        Policy options, plus ``kinds`` and ``max_hops`` for the path rules.
        An option the policy does not know is an error.

    Examples
    --------
    >>> import pathweave as pw
    >>> fab = pw.fabric.preset("h100-2x4")
    >>> D = pw.traffic.hotspot(8, bytes_per_rank=256 << 20, ratio=0.9)
    >>> s = pw.plan.make(fab, D, "static").congestion_s
    >>> o = pw.plan.make(fab, D, "optimal").congestion_s
    >>> round(s / o, 2)
    3.79
    >>> pw.plan.make(fab, D, "mwu", lam=0.5)
    Traceback (most recent call last):
    ...
    pathweave.errors.PlanError: policy 'mwu' got unknown option 'lam'; valid options: ...
    """
    if isinstance(fabric, str) and fabric in POLICIES:
        raise PlanError(f"make(fabric, demand, policy): {fabric!r} is a policy, given as the "
                        f"fabric; e.g. make('h100-2x4', demand, {fabric!r})")
    fab = resolve(fabric)
    if policy is None:
        policy = DEFAULT_POLICY
    pol = policy_info(policy)
    # NOTE: no option given (the usual call): no merging, and none passed: the
    # policy's defaults are its options' (signature_options); ~0.4 us a plan.
    opts: dict[str, Any] = {}
    if options:
        valid = {**COMMON_OPTIONS, **pol.options}
        if set(options) - set(valid):
            check_options(policy, options, execute=False)  # raises, naming the option
        opts = {k: options.get(k, v) for k, v in pol.options.items()}
    t0 = time.perf_counter()
    d = as_demand(demand, fab.num_ranks)
    if paths is None:
        paths = candidate_paths(
            fab,
            options.get("kinds", COMMON_OPTIONS["kinds"]),
            options.get("max_hops", COMMON_OPTIONS["max_hops"]),
        )
    elif paths.fabric is not fab:
        raise PlanError("paths were compiled for another fabric")
    plan = pol.func(fab, d, paths, **opts)
    # The plan was made here and nobody else holds it yet: stamping the time
    # in place is safe and cheaper than dataclasses.replace.
    object.__setattr__(plan, "plan_s", time.perf_counter() - t0)
    return plan
