"""``bench planner``'s helpers: a plan is simulated once per case, whoever made it."""

from __future__ import annotations

import pathweave as pw
from pathweave.bench import planner


def test_plans_with_the_same_flows_are_simulated_once(monkeypatch):
    fab = pw.fabric.preset("h100-2x4")
    D = pw.traffic.hotspot(8, 256 << 20, 0.9)
    default = pw.plan.make(fab, D)  # the default policy returns one candidate's flows
    same = pw.plan.make(fab, D, default.info["chosen"])
    other = pw.plan.make(fab, D, "static")
    want = {id(p): pw.sim.simulate(fab, p).makespan_s for p in (default, same, other)}
    calls = []
    real = pw.sim.simulate
    monkeypatch.setattr(planner.sim, "simulate", lambda f, p: calls.append(p) or real(f, p))
    done: dict = {}
    for p in (default, same, other, default):
        assert planner._simulate_once(fab, p, done) == want[id(p)]
    assert calls == [default, other]
