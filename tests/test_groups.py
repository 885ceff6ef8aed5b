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
from pathweave.errors import FabricError, PlanError, WorkloadError
from pathweave.fabric import VertexKind
from pathweave.fabric._limits import MEMORY_ENV
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


def _on_fabric(fab: pw.fabric.Fabric, sub: pw.fabric.Fabric, ranks: tuple[int, ...]
               ) -> np.ndarray:
    """Each link of ``sub = fab.subset(ranks)`` as a fabric link, found by vertex names."""
    nodes = sorted({r // fab.gpus_per_node for r in ranks})

    def vertex(v: int) -> int:
        rank = int(sub.vertex_rank[v])
        if rank >= 0:
            return int(fab.rank_vertex[ranks[rank]])
        head, dot, rest = sub.vertex_name(v).partition(".")
        if dot and head[0] == "n" and head[1:].isdigit():
            return fab.vertex_id(f"n{nodes[int(head[1:])]}.{rest}")
        return fab.vertex_id(sub.vertex_name(v))

    return np.array([fab.link_id(vertex(int(a)), vertex(int(b)))
                     for a, b in zip(sub.link_src, sub.link_dst, strict=True)], dtype=np.int64)


@pytest.mark.parametrize(("spec", "count", "size", "layout"), [
    ("h100-2x4", 2, 4, "strided"),
    ("dgx-h100:nodes=4,spines=2", 4, 8, "block"),
    ("dgx-h100:nodes=4,spines=2", 2, 16, "strided"),
    ("cluster:nodes=4,gpus_per_node=4,node_kind=nvlink-mesh,rails=2", 4, 4, "strided"),
])
def test_group_paths_are_each_groups_own_subset_paths(spec, count, size, layout):
    """Groups of one shape share a compiled path set; every group's paths are still
    exactly those of its own subset fabric (built alone), mapped by vertex names."""
    fab = pw.fabric.resolve(spec)
    wl = groups(fab.num_ranks, "uniform", count, size, layout)
    kinds = pw.fabric.paths.DEFAULT_KINDS  # what plan_groups plans with
    gp = group_paths(fab, wl.ranks, kinds)
    for g, ranks in enumerate(wl.ranks):
        sub = fab.subset(ranks)
        own = pw.fabric.candidate_paths(sub, kinds)
        lmap = _on_fabric(fab, sub, ranks)
        r = np.asarray(ranks)
        for i in range(len(ranks)):
            for j in range(len(ranks)):
                want = [lmap[own.path_links(p)].tolist() for p in own.pair_paths(i, j)]
                got = [gp.paths.path_links(p).tolist()
                       for p in gp.paths.pair_paths(int(r[i]), int(r[j]))]
                assert got == want, (g, i, j)
    if layout == "block":  # whole identical nodes: one shape, compiled once
        assert len({id(s) for s in gp.sub_paths}) == 1


@pytest.mark.parametrize("spec", ["h100-2x4", "dgx-h100:nodes=2,spines=2",
                                  "cluster:nodes=4,gpus_per_node=4,node_kind=nvlink-mesh,rails=2"])
def test_time_model_tables_match_their_numpy_twin(spec):
    """timemodel's per-path kernel against its numpy twin, on dense and group path sets."""
    from pathweave.plan import timemodel

    fab = pw.fabric.resolve(spec)
    sets = [pw.fabric.candidate_paths(fab),
            group_paths(fab, groups(fab.num_ranks, "uniform", 2, fab.num_ranks // 2,
                                    "strided").ranks).paths]
    for ps in sets:
        for model in (pw.sim.SimModel(), pw.sim.SimModel.ideal(),
                      pw.sim.SimModel(relay_efficiency=0.5, hop_latency_s=3e-6)):
            got = timemodel._build(ps, model)
            want = timemodel._build_reference(ps, model)
            for name in ("links", "length", "capacity_Bps", "rate_cap_Bps", "relays",
                         "start_s", "latency_s", "stage_s_per_byte"):
                np.testing.assert_array_equal(getattr(got, name), getattr(want, name),
                                              err_msg=name)


def test_link_disjoint_groups_simulate_each_as_alone():
    """Two groups on their own nodes share no link: simulated together, each
    finishes exactly (bit for bit) as it does alone; the timeline carries both."""
    fab = pw.fabric.resolve("dgx-h100:nodes=4,spines=2")
    wl = groups(32, "moe:tokens=4096,hidden=1024,hot=0.8", 2, 16, "block", seed=5)
    plan = plan_groups(fab, wl, "mwu", mode="per_group")
    assert not shared_links(plan, wl).any()
    both = pw.sim.simulate(fab, plan)
    ends = []
    for grp in wl.groups:
        alone = plan_groups(fab, groups(32, [grp.demand], ranks=[grp.ranks]), "mwu",
                            mode="per_group")
        res = pw.sim.simulate(fab, alone)
        r = np.asarray(grp.ranks)
        np.testing.assert_array_equal(both.pair_finish_s[np.ix_(r, r)],
                                      res.pair_finish_s[np.ix_(r, r)])
        ends.append(res.makespan_s)
    assert both.makespan_s == max(ends)
    carried = (both.link_util * fab.capacity_Bps * np.diff(both.times_s)[:, None]).sum(axis=0)
    np.testing.assert_allclose(carried, plan.link_load_bytes, rtol=1e-5, atol=1.0)


def test_scale_memory_model_and_checks_by_hand():
    """The memory model recovers a peak built from known coefficients, and the
    scale checks PASS or MISS on each side of the 8192-GPU targets."""
    from pathweave.bench import groups as bench_groups

    def row(n, rss, wall=10.0):
        return {"ranks": n, "groups": n // 64, "mode": "joint", "peak_rss_bytes": rss,
                "paths_s": wall, "plan_wall_s": wall, "sim_wall_s": wall,
                "paths_cpu_s": 1.0, "plan_cpu_s": 1.0, "sim_cpu_s": 1.0}

    base, per_rank, per_pair = 3e8, 2e5, 40.0
    rows = [row(n, base + per_rank * n + per_pair * n * n) for n in (1024, 2048, 4096, 8192)]
    fit = bench_groups.memory_model(rows)
    assert fit is not None
    np.testing.assert_allclose(fit, (base, per_rank, per_pair), rtol=1e-6)
    assert bench_groups.memory_model(rows[:2]) is None  # two sizes cannot fix three terms
    checks = {c.name: c for c in bench_groups.scale_checks(rows)}
    # 8192: 30 s <= 60 s; 300 MB + 1.64 GB + 2.68 GB = 4.6 GB <= 8 GB.
    assert checks["scale_time_joint"].passed and checks["scale_memory_joint"].passed
    # 16384: 0.3 + 3.3 + 10.7 = 14.3 GB <= 24 GB.
    assert checks["scale_model_joint"].value == pytest.approx(14.3e9, rel=1e-2)
    assert checks["scale_model_joint"].passed
    slow = bench_groups.scale_checks([row(8192, 9e9, wall=25.0)])
    assert [c.passed for c in slow] == [False, False]
    assert bench_groups.scale_checks(rows[:1])[0].passed is None  # 8192 not measured


def test_groups_plan_where_the_dense_paths_would_not_fit(monkeypatch):
    # 100 kB: a 16-GPU fabric's dense path set does not fit, an 8-GPU group's subset does.
    monkeypatch.setenv(MEMORY_ENV, "0.0001")
    with pytest.raises(FabricError, match=r"would need about .* for candidate paths"):
        pw.fabric.preset("dgx-h100:nodes=2")
    fab = pw.fabric.preset("dgx-h100:nodes=2", dense_paths=False)
    with pytest.raises(FabricError, match="for candidate paths"):
        pw.fabric.candidate_paths(fab)  # the dense set is still held against memory
    wl = groups(fab.num_ranks, "hotspot:0.8", 2, 8, "block")
    plan = plan_groups(fab, wl, "mintime", mode="joint")
    assert plan.congestion_s > 0
    result = runner.invoke(app, ["plan", "-f", "dgx-h100:nodes=2", "-w", "uniform",
                                 "--groups", "2x8", "--no-lp", "-p", "static,multirail"])
    assert result.exit_code == 0, result.output
    assert "left out multirail" in result.output and "congestion joint" in result.output
    result = runner.invoke(app, ["plan", "-f", "dgx-h100:nodes=2", "-w", "uniform"])
    assert result.exit_code == 2 and "for candidate paths" in result.output
    result = runner.invoke(app, ["plan", "-f", "dgx-h100:nodes=2", "-w", "uniform",
                                 "--groups", "2x8", "-p", "multirail"])
    assert result.exit_code == 2 and "models a peer's own routing" in result.output
