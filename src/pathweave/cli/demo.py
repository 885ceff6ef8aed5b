"""``pathweave demo``: the project's main job at a glance, as a list of steps.

Each :class:`DemoStep` reads and extends one :class:`DemoContext`, so later
parts of pathweave (simulation, real execution) add a step to :data:`STEPS`
without touching the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from pathweave import fabric as pwfabric
from pathweave import plan as pwplan
from pathweave import sim, traffic, viz
from pathweave.cli._common import fmt_bytes, fmt_ms, ordered_policies, rule
from pathweave.cli._compare import compare
from pathweave.cli._demo_context import DemoContext, DemoStep, best_baseline
from pathweave.cli._demo_emulate import emulate_step
from pathweave.cli._demo_execute import execute_step
from pathweave.cli.simulate import simulation_table

PLOT_NAME = "policies.png"
HEATMAP_NAME = "link_utilisation.png"


def _plan_step(ctx: DemoContext) -> None:
    ctx.fabric = pwfabric.resolve(ctx.fabric_spec)
    fab = ctx.fabric
    ctx.demand = traffic.parse_workload(
        ctx.workload, fab.num_ranks, bytes_per_rank=ctx.bytes_per_rank,
        gpus_per_node=fab.gpus_per_node,
    )
    ctx.console.print(
        f"Each of the {fab.num_ranks} GPUs of [bold]{fab.name}[/] ({fab.num_nodes} nodes x "
        f"{fab.gpus_per_node} GPUs, {fab.nvlink_kind}, {len(fab.rails)} NIC rails) sends "
        f"{fmt_bytes(ctx.bytes_per_rank)}: workload [bold]{ctx.workload}[/]"
        + (f" ({ctx.gloss})" if ctx.gloss else "")
        + ". Every registered policy splits this demand over the candidate paths; the LP "
        "optimum over the same paths is the yardstick."
    )
    ctx.comparison = compare(
        fab, ctx.demand, ordered_policies(), workload=ctx.workload,
        bytes_per_rank=ctx.bytes_per_rank,
    )
    ctx.console.print(ctx.comparison.table())
    cmp = ctx.comparison
    static, best = cmp.result("static").plan, cmp.result(pwplan.DEFAULT_POLICY).plan
    if static is not None and best is not None:
        ctx.console.print(
            f"static sends each pair over one fixed path, and the load piles up on "
            f"[bold]{fab.link_name(static.bottleneck_link)}[/] ({fmt_ms(static.congestion_s)} ms); "
            f"the default policy [bold]{pwplan.DEFAULT_POLICY}[/] weighs every baseline, "
            f"mwu_time and mwu and keeps the least predicted time: "
            f"[bold]{best.info['chosen']}[/], which splits {best.split_pairs()} pairs over "
            f"{best.paths_used} paths ({fmt_ms(best.congestion_s)} ms)."
        )


def _simulate_step(ctx: DemoContext) -> None:
    cmp = ctx.comparison
    assert cmp is not None and ctx.fabric is not None  # the plan step ran first
    fab = ctx.fabric
    plans = [(r.policy, r.plan) for r in cmp.results if r.plan is not None]
    ctx.simulations = {name: sim.simulate(fab, plan) for name, plan in plans}
    ctx.console.print(
        "The flow-level simulator (pathweave.sim) runs every plan: fragments share links "
        "max-min fairly and pay set-up, pipeline fill and the links' measured efficiencies, "
        "so the makespan sits above the congestion bound."
    )
    ctx.console.print(simulation_table(plans, ctx.simulations))
    versus = best_baseline_line(ctx.simulations)
    if versus:
        ctx.console.print(versus)
    shown = {n: ctx.simulations[n] for n in ("static", pwplan.DEFAULT_POLICY)
             if n in ctx.simulations}
    if shown:
        out = viz.plot_link_utilisation(
            shown, fab, ctx.out_dir / HEATMAP_NAME,
            title=f"link utilisation over time, {fab.name}, {ctx.workload}",
        )
        ctx.files.append(out)
        ctx.console.print(f"wrote {out}")


def best_baseline_line(simulations: dict[str, sim.SimResult]) -> str | None:
    """One line: the default policy's simulated makespan against the best baseline's."""
    spans = {n: r.makespan_s for n, r in simulations.items()}
    base, default = best_baseline(spans), pwplan.DEFAULT_POLICY
    if base is None or default not in spans:
        return None
    return (
        f"default policy [bold]{default}[/] against the best baseline, [bold]{base}[/]: "
        f"{fmt_ms(spans[default])} ms vs {fmt_ms(spans[base])} ms simulated, "
        f"[bold]{spans[base] / spans[default]:.2f}x[/] faster."
    )


def _plot_step(ctx: DemoContext) -> None:
    cmp = ctx.comparison
    assert cmp is not None  # the plan step ran first
    plans = [p for p in (cmp.result("static").plan, cmp.result(pwplan.DEFAULT_POLICY).plan)
             if p is not None]
    out = viz.plot_policy_comparison(
        {r.policy: r.congestion_s for r in cmp.results},
        ctx.out_dir / PLOT_NAME,
        optimum_s=cmp.optimum_s,
        link_plans=plans,
        title=f"{cmp.fabric.name}, {cmp.workload}, {fmt_bytes(cmp.bytes_per_rank)} per rank",
    )
    ctx.files.append(out)
    ctx.console.print(f"wrote {out}")


#: The demo, in order. Later stages append their own steps here.
STEPS: list[DemoStep] = [
    DemoStep("plan", "Plan a skewed exchange with every policy", _plan_step),
    DemoStep("simulate", "Simulate every plan: makespan and link utilisation", _simulate_step),
    DemoStep("plot", "Plot congestion and per-link load", _plot_step),
    DemoStep("execute", "Run it for real on local ranks, checked against torch", execute_step),
    DemoStep("emulate", "Run it over an emulated fabric: measured vs simulated", emulate_step),
]


def run_demo(
    out_dir: Path, console: Console, steps: Sequence[DemoStep] | None = None
) -> DemoContext:
    """Run ``steps`` (default :data:`STEPS`) in order and return the shared context."""
    ctx = DemoContext(out_dir=Path(out_dir), console=console)
    steps = STEPS if steps is None else steps
    for i, step in enumerate(steps, 1):
        rule(console, f"[bold]{i}/{len(steps)}  {step.heading}")
        step.run(ctx)
    return ctx


__all__ = ["STEPS", "DemoContext", "DemoStep", "best_baseline", "best_baseline_line",
           "run_demo"]
