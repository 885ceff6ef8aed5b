"""Concurrent groups: placement, per-group against joint planning, the union plan, the CLI.

The reference case is computed by hand. ``cluster:nodes=2,gpus_per_node=4,
node_kind=nvlink-mesh,rails=2`` has one NIC per two GPUs (NIC 0 serves GPUs
0 and 1, NIC 1 GPUs 2 and 3). Group A holds GPUs 0 and 2 of both nodes and
sends ``a`` bytes from n0.gpu0 to n1.gpu0: over rail 0, or over rail 1 with
NVLink forwards through GPU 2 at both ends. Group B holds GPU 1 of both
nodes and sends ``b`` from n0.gpu1 to n1.gpu1: rail 0 is its only path (GPU
2 is not B's to forward through). With NICs of ``c`` bytes/s:

* per group: A alone splits evenly (``a/2`` per rail, the unique optimum),
  B adds ``b`` to rail 0: congestion ``(a/2 + b) / c``;
* jointly: A moves ``x = (a - b) / 2`` to rail 0: both rails carry
  ``(a + b) / 2``, congestion ``(a + b) / (2c)``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import pathweave as pw
from pathweave.cli.main import app
from pathweave.errors import PlanError, WorkloadError
from pathweave.fabric import VertexKind
from pathweave.plan.groups import MODES, group_paths, plan_groups, shared_links
from pathweave.traffic.groups import LAYOUTS, groups, parse_groups, placement

runner = CliRunner()
HAND = "cluster:nodes=2,gpus_per_node=4,node_kind=nvlink-mesh,rails=2"
A_BYTES, B_BYTES = 200e6, 100e6


def _hand_workload(start_s: float | list[float] = 0.0) -> tuple[pw.fabric.Fabric, object]:
    fab = pw.fabric.resolve(HAND)
    a = np.zeros((4, 4))
    a[0, 2] = A_BYTES  # group rank 0 = n0.gpu0, group rank 2 = n1.gpu0
    b = np.zeros((2, 2))
    b[0, 1] = B_BYTES
    return fab, groups(8, [a, b], ranks=[(0, 2, 4, 6), (1, 5)], start_s=start_s)


def test_hand_case_joint_beats_per_group_by_the_hand_computed_congestion():
    fab, wl = _hand_workload()
    c = fab.capacity_Bps[fab.link_id("n0.nic0", "rail0")]
    want = {"per_group": (A_BYTES / 2 + B_BYTES) / c, "joint": (A_BYTES + B_BYTES) / (2 * c)}
    for mode in MODES:
        plan = plan_groups(fab, wl, "optimal", mode=mode)
        assert plan.congestion_s == pytest.approx(want[mode], rel=1e-6)
        # The fluid simulator (no overheads) finishes when the busiest link drains.
        res = pw.sim.simulate(fab, plan, pw.sim.SimModel.ideal())
        assert res.makespan_s == pytest.approx(want[mode], rel=1e-6)
    per_group = plan_groups(fab, wl, "optimal", mode="per_group")
    shared = [fab.link_name(e) for e in np.flatnonzero(shared_links(per_group, wl))]
    assert shared == ["n0.nic0 -> rail0", "rail0 -> n1.nic0"]


def test_no_policy_plans_as_the_default_policy_named():
    """``policy=None`` is :data:`DEFAULT_POLICY`, as for :func:`pathweave.plan.make`."""
    from pathweave.plan import DEFAULT_POLICY

    fab, wl = _hand_workload()
    for mode in MODES:
        named = plan_groups(fab, wl, DEFAULT_POLICY, mode=mode)
        plan = plan_groups(fab, wl, mode=mode)
        assert plan.congestion_s == pytest.approx(named.congestion_s, rel=1e-12)
        np.testing.assert_array_equal(plan.flow_bytes, named.flow_bytes)


def test_start_times_delay_a_group_by_its_start():
    fab, wl = _hand_workload(start_s=[0.0, 0.01])
    plan = plan_groups(fab, wl, "optimal", mode="per_group")
    res = pw.sim.simulate(fab, plan, pw.sim.SimModel.ideal(), start_s=wl.start_s)
    c = fab.capacity_Bps[fab.link_id("n0.nic0", "rail0")]
    # A alone: a/2 per rail; B starts after A is done and has rail 0 to itself.
    assert res.pair_finish_s[0, 4] == pytest.approx(A_BYTES / 2 / c, rel=1e-6)
    assert res.pair_finish_s[1, 5] == pytest.approx(0.01 + B_BYTES / c, rel=1e-6)
    with pytest.raises(pw.errors.PlanError, match="start_s"):
        pw.sim.simulate(fab, plan, start_s=np.full(8, -1.0))


@pytest.mark.parametrize("policy", pw.plan.policies(executable_only=True))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_union_plan_carries_each_groups_demand_on_its_own_pairs(policy, layout):
    fab = pw.fabric.resolve("dgx-h100:nodes=2,spines=2")
    wl = groups(16, "moe:tokens=2048,hidden=1024,hot=0.9", 2, 8, layout, seed=3)
    for mode in MODES:
        plan = plan_groups(fab, wl, policy, mode=mode).validate()
        got = plan.pair_bytes()
        for g in wl.groups:
            r = np.asarray(g.ranks)
            np.testing.assert_array_equal(got[np.ix_(r, r)], g.demand.astype(np.int64))
        assert got.sum() == sum(int(g.demand.sum()) for g in wl.groups)
        assert plan.info["mode"] == mode


def test_group_paths_stay_inside_their_group_and_are_walks():
    fab = pw.fabric.resolve("h100-2x4")
    wl = groups(8, "uniform", 2, 4, "strided")
    ps = group_paths(fab, wl.ranks).paths
    owner = wl.rank_group
    gpu = fab.vertex_kind == int(VertexKind.GPU)
    assert ps.num_paths > 0
    for pid in range(ps.num_paths):
        links = ps.path_links(pid)
        s, d = int(ps.src[pid]), int(ps.dst[pid])
        assert owner[s] == owner[d] >= 0  # no path for a pair across groups
        assert fab.link_src[links[0]] == fab.rank_vertex[s]
        assert fab.link_dst[links[-1]] == fab.rank_vertex[d]
        np.testing.assert_array_equal(fab.link_dst[links[:-1]], fab.link_src[links[1:]])
        inner = fab.link_dst[links[:-1]]
        fwd = fab.vertex_rank[inner[gpu[inner]]]
        assert (owner[fwd] == owner[s]).all()  # forwards only through its own GPUs


@pytest.mark.parametrize("policy", sorted(set(pw.plan.policies())
                                           - set(pw.plan.policies(executable_only=True))))
def test_a_model_only_peer_is_refused_with_the_policies_that_run(policy):
    wl = groups(8, "hotspot:0.8", 2, 4, "strided", bytes_per_rank=1 << 20)
    with pytest.raises(PlanError, match=f"policy {policy!r} models a peer's own routing.*"
                                        "mintime"):
        plan_groups("h100-2x4", wl, policy)


def test_placement_layouts_by_hand():
    assert placement(8, 2, 4, "block") == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert placement(8, 2, 3, "strided") == [(0, 2, 4), (1, 3, 5)]
    assert parse_groups("4x16:layout=strided,stagger=2e-3").stagger_s == 0.002


@pytest.mark.parametrize(("call", "named"), [
    (lambda: groups(8, "uniform", ranks=[(0, 1, 2), (2, 3)]), "rank 2 is in group 0 and group 1"),
    (lambda: groups(8, "uniform", ranks=[(0, 9)]), "rank 9"),
    (lambda: groups(8, "uniform", ranks=[(3, 1)]), "3 then 1"),
    (lambda: groups(8, "uniform", 3, 4), "12 ranks"),
    (lambda: groups(8, "uniform", 2, 4, "diagonal"), "'diagonal'"),
    (lambda: groups(8, [np.zeros((3, 3))], ranks=[(0, 1)]), "group 0 (2 ranks): demand is 3 x 3"),
    (lambda: groups(8, "uniform", ranks=[(0, 1)], start_s=[-1.0]), "start_s=-1.0"),
    (lambda: parse_groups("8by64"), "'8by64'"),
    (lambda: parse_groups("2x4:layout=diag"), "layout='diag'"),
    (lambda: parse_groups("2x4:stagger=-1"), "stagger='-1'"),
    (lambda: parse_groups("2x4:colour=red"), "'colour'"),
    (lambda: group_paths("h100-2x4", [(0, 1, 2, 4)]), "group 0"),
])
def test_bad_placements_name_the_bad_value(call, named):
    with pytest.raises(WorkloadError) as err:
        call()
    assert named in str(err.value)


def test_cli_plan_and_simulate_groups(tmp_path: Path):
    out = tmp_path / "g.json"
    result = runner.invoke(app, ["simulate", "-f", "h100-2x4", "-w", "hotspot:0.9", "-b", "16M",
                                 "--groups", "2x4:layout=strided", "-p", "static,mwu",
                                 "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = {r["policy"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"static", "mwu"}
    for r in rows.values():
        assert r["per_group_makespan_s"] >= r["per_group_congestion_s"] > 0
        assert r["joint_makespan_s"] >= r["joint_congestion_s"] > 0
    result = runner.invoke(app, ["plan", "-f", "h100-2x4", "-w", "uniform", "--groups", "2x4",
                                 "-p", "mwu"])
    assert result.exit_code == 0, result.output
    assert "congestion joint" in result.output
    result = runner.invoke(app, ["plan", "-f", "h100-2x4", "-w", "uniform", "--groups", "4x4"])
    assert result.exit_code == 2
    assert "4x4 = 16 ranks" in result.output and "Traceback" not in result.output
