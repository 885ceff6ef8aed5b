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


def test_speed_mode_times_mwu_and_the_default_policy_only(monkeypatch):
    """``speed``: every case, only ``mwu`` and the default policy, timed and replanned,
    without the LP, the simulator or the time yardstick (their lines say so)."""
    monkeypatch.setattr(planner, "FABRICS", (("h100-2x4", None), ("dgx-h100", 8)))
    solved = []
    monkeypatch.setattr(planner, "_solve", lambda *a: solved.append(a))
    records = planner.run(speed=True, repeat=1)
    assert not solved
    default = pw.plan.DEFAULT_POLICY
    assert {r["policy"] for r in records} == {"mwu", default}
    assert len(records) == 2 * len(planner.cases())
    for r in records:
        assert r["plan_s_median"] > 0 and r["congestion_s"] > 0
        assert r["optimal_s"] is r["sim_s"] is r["time_optimum_s"] is None
    replans = [r for r in records if r["replan_s"] is not None]
    assert [(r["ranks"], r["policy"]) for r in replans] == [(8, default), (64, default)]
    assert all(r["workload"].startswith("moe") for r in replans)
    checks = {c.name: c for c in planner.summarize(records).checks}
    assert checks["mwu/optimal median"].passed is None
    assert checks["mwu time 8"].value > 0 and checks[f"{default} time 64"].value > 0
    assert checks["replan 64"].value > 0
