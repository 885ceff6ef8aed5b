"""Paper reproductions: the registry, quick runs of the figures, the CLI and the demo step.

Figure numbers are checked against facts worked out independently of the
figure code: hand-computed congestion bounds, the LP optimum's minimality,
the simulator never beating the congestion bound, FLOP counts by hand.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

import pathweave as pw
from pathweave import viz
from pathweave.bench import paper
from pathweave.bench.paper import fig7, fig8, table1
from pathweave.bench.paper._common import FigureResult
from pathweave.cli.main import app
from pathweave.fabric.builders import NDR400_Bps

runner = CliRunner()
S = 256 << 20  # fig7's bytes per rank
#: Relative slack for "makespan >= congestion bound" (float summation order).
EPS = 1e-9


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def fig7_quick(tmp_path_factory) -> FigureResult:
    return paper.run_figure("fig7", tmp_path_factory.mktemp("fig7"), quick=True)


@pytest.fixture(scope="module")
def table1_quick(tmp_path_factory) -> FigureResult:
    return paper.run_figure("table1", tmp_path_factory.mktemp("table1"), quick=True)


# ----------------------------------------------------------------- registry
def test_registry_lists_the_figures_in_paper_order():
    assert list(paper.FIGURES) == ["fig6", "fig7", "fig8", "table1", "hopper"]


@pytest.mark.parametrize("bad", ["fig9", "FIG7", "", "all"])
def test_unknown_figure_is_a_value_error_naming_it(bad, tmp_path):
    with pytest.raises(ValueError, match=f"unknown figure {bad!r}.*fig7"):
        paper.run_figure(bad, tmp_path)
    assert not any(tmp_path.iterdir())


def _fake_figure(name: str, *, fails: bool) -> str:
    """Register a throw-away figure module; returns its module path."""
    module = types.ModuleType(f"_pathweave_test_{name}")
    module.NAME, module.TITLE, module.QUICK = name, f"fake {name}", {"quick": True}

    def measure(*, quick=False, progress):
        progress(0, 1, f"{name}: start")
        if fails:
            raise RuntimeError(f"{name} broke on purpose")
        return [{"x": 1, "makespan_s": 0.5, "quick": quick}]

    def plot(rows, path):
        path.write_text(str(len(rows)))
        return path

    module.measure, module.plot = measure, plot
    module.summarize = lambda rows: ([], [])
    sys.modules[module.__name__] = module
    return module.__name__


@pytest.fixture
def fake_figures(monkeypatch):
    figures = {
        "broken": _fake_figure("broken", fails=True),
        "missing": "pathweave.bench.paper.no_such_module",
        "good": _fake_figure("good", fails=False),
    }
    monkeypatch.setattr(paper, "FIGURES", figures)
    yield figures
    for path in figures.values():
        sys.modules.pop(path, None)


def test_run_all_keeps_going_past_failing_figures(fake_figures, tmp_path):
    seen = []
    outcome = paper.run_all(tmp_path, quick=True,
                            on_figure=lambda i, n, name: seen.append((i, n, name)))
    assert seen == [(0, 3, "broken"), (1, 3, "missing"), (2, 3, "good")]
    assert [r.name for r in outcome.results] == ["good"]
    assert outcome.results[0].rows[0]["quick"] is True
    assert [f.name for f in outcome.failures] == ["broken", "missing"]
    assert "broke on purpose" in outcome.failures[0].message
    assert isinstance(outcome.failures[1].error, ModuleNotFoundError)
    assert "Traceback" in outcome.failures[0].traceback
    assert not outcome.ok
    assert read_csv(tmp_path / "good.csv") == [{"x": "1", "makespan_s": "0.5", "quick": "True"}]
    assert set(outcome.wall_s) == {"broken", "missing", "good"}


# ----------------------------------------------------------------- fig7
def _by(rows, *keys):
    return {tuple(r[k] for k in keys[:-1]): r[keys[-1]] for r in rows}


def test_fig7_writes_csv_and_png_matching_its_rows(fig7_quick):
    res = fig7_quick
    assert res.csv_path.name == "fig7.csv" and res.png_path.name == "fig7.png"
    assert res.png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = read_csv(res.csv_path)
    assert len(written) == len(res.rows) == len(fig7.QUICK_RATIOS) * len(fig7.POLICIES)
    for got, row in zip(written, res.rows, strict=True):
        assert got["policy"] == row["policy"]
        assert float(got["makespan_s"]) == pytest.approx(row["makespan_s"], rel=1e-12)


def test_fig7_makespans_respect_the_congestion_bound_and_the_optimum(fig7_quick):
    rows = fig7_quick.rows
    for r in rows:
        assert r["makespan_s"] >= r["congestion_s"] * (1 - EPS), r
    congestion = _by(rows, "hotspot_ratio", "policy", "congestion_s")
    for ratio in fig7.QUICK_RATIOS:
        opt = congestion[(ratio, "optimal")]
        for policy in fig7.POLICIES:
            assert opt <= congestion[(ratio, policy)] * (1 + 1e-6), (ratio, policy)


def test_fig7_static_congestion_is_the_hand_computed_rail_load(fig7_quick):
    # At ratio r, PXN sends every remote rank's r * S to rank 0 over rail 0
    # into node 0 (the four remote ranks each send r * S): 4 r S / 50 GB/s.
    # Nothing else crosses that link (cold traffic avoids rank 0).
    congestion = _by(fig7_quick.rows, "hotspot_ratio", "policy", "congestion_s")
    assert congestion[(0.9, "static")] == pytest.approx(4 * 0.9 * S / NDR400_Bps, rel=1e-6)
    assert congestion[(0.5, "static")] == pytest.approx(4 * 0.5 * S / NDR400_Bps, rel=1e-6)
    # The optimum spreads node 0's inbound 4 * 0.9 + 12 * 0.1 / 6 = 3.8 S over 4 rails.
    assert congestion[(0.9, "optimal")] == pytest.approx(0.95 * S / NDR400_Bps, rel=1e-3)


def test_fig7_speedups_and_comparisons_follow_from_the_makespans(fig7_quick):
    rows = fig7_quick.rows
    makespan = _by(rows, "hotspot_ratio", "policy", "makespan_s")
    for r in rows:
        x = r["hotspot_ratio"]
        assert r["speedup_vs_static"] == pytest.approx(makespan[(x, "static")] / r["makespan_s"])
        assert r["vs_optimal"] == pytest.approx(r["makespan_s"] / makespan[(x, "optimal")])
    comps = {c.label.split(" (")[0]: c for c in fig7_quick.comparisons}
    worst = max(makespan[(x, "mwu")] / makespan[(x, "optimal")] for x in fig7.QUICK_RATIOS)
    assert comps["mwu / optimal makespan, worst"].ours == pytest.approx(worst)
    bound = next(c for c in fig7_quick.comparisons if c.label.startswith("congestion bound"))
    assert bound.ours == pytest.approx(3.6 / 0.95, rel=1e-3)
    assert bound.paper == 5.2
    assert any("5.2x" in n for n in fig7_quick.notes)


# ----------------------------------------------------------------- fig8
def test_fig8_ffn_flops_and_compute_time_by_hand():
    h = 4096
    # Two GEMMs, h x 4h and 4h x h, 2 FLOPs per multiply-add.
    assert fig8.ffn_flops_per_copy(h) == 2 * (h * 4 * h) + 2 * (4 * h * h)
    copy = h * 2
    demand = np.zeros((8, 8))
    demand[:, 3] = 2 * copy  # every other rank sends rank 3 two copies: 14 received
    demand[3, 3] = 0
    demand[0, 5] = copy
    # Rank 3 also holds its own copies: estimated as 14 / 7 = 2 more.
    assert fig8.expert_copies(demand, copy)[3] == pytest.approx(16)
    rate = 989e12 * fig8.ACHIEVED_FRACTION
    assert fig8.compute_s(demand) == pytest.approx(16 * 16 * h * h / rate)


def test_fig8_rows_add_up_and_never_beat_the_bound(tmp_path, assert_drawn):
    rows = fig8.measure(tokens=(2048,), hotspots=(0.9,))
    assert [r["policy"] for r in rows] == list(fig8.POLICIES)
    static = rows[0]
    for r in rows:
        assert r["dispatch_s"] >= r["dispatch_congestion_s"] * (1 - EPS)
        assert r["combine_s"] >= r["combine_congestion_s"] * (1 - EPS)
        assert r["step_s"] == pytest.approx(r["dispatch_s"] + r["compute_s"] + r["combine_s"])
        assert r["compute_s"] == static["compute_s"]  # compute is policy-independent
        assert r["speedup_vs_static"] == pytest.approx(static["step_s"] / r["step_s"])
    # The hot expert takes about 90 % of 2048 tokens (one copy each):
    # roughly 1840 copies of 268 MFLOP.
    hot_copies = static["compute_s"] * 989e12 * fig8.ACHIEVED_FRACTION / (16 * 4096**2)
    assert 0.85 * 2048 < hot_copies < 0.95 * 2048
    path = fig8.plot(rows, tmp_path / "fig8.png")
    assert_drawn(path)


# ----------------------------------------------------------------- table1
def test_table1_demands_stay_inside_a_node_or_cross_nodes():
    fab = pw.fabric.preset("h100-2x4")
    node = fab.vertex_node[fab.rank_vertex]
    intra = table1.stencil_demand("intra-node", 8, 1 << 20)
    inter = table1.stencil_demand("inter-node", 8, 1 << 20)
    src, dst = np.nonzero(intra)
    assert set(src) | set(dst) == {0, 1, 2, 3}
    assert np.all(node[src] == node[dst])
    src, dst = np.nonzero(inter)
    assert np.all(node[src] != node[dst]) and len(src) == 14  # 7 neighbour pairs, both ways
    # The line's interior ranks send half their payload to each neighbour.
    assert inter[4, 1] == inter[4, 0] == (1 << 20) / 2
    with pytest.raises(ValueError, match="'sideways'"):
        table1.stencil_demand("sideways", 8, 1)


def test_table1_rows_hold_times_and_the_papers_numbers(table1_quick, assert_drawn):
    rows = table1_quick.rows
    assert [(r["case"], r["size_MiB"]) for r in rows] == [
        (c, s) for c in table1.CASES for s in table1.QUICK_SIZES_MIB
    ]
    for r in rows:
        assert r["plan_s"] > 0
        assert r["comm_s"] >= r["congestion_s"] * (1 - EPS)
        assert r["plan_over_comm"] == pytest.approx(r["plan_s"] / r["comm_s"])
        # mwu's plan is at least as good as static's by the bound, so it never
        # needs much longer than static in the simulator.
        assert r["comm_s"] <= r["static_comm_s"] * 1.05
    paper_256 = {r["case"]: (r["paper_algo_s"], r["paper_comm_s"]) for r in rows
                 if r["size_MiB"] == 256}
    assert paper_256 == {"intra-node": (pytest.approx(0.0363e-3), pytest.approx(2.0464e-3)),
                         "inter-node": (pytest.approx(0.0480e-3), pytest.approx(6.5390e-3))}
    worst = max(rows, key=lambda r: r["plan_over_comm"])
    [comp] = [c for c in table1_quick.comparisons if c.label.startswith("largest planning")]
    assert comp.ours == pytest.approx(worst["plan_over_comm"] * 100)
    assert comp.paper == pytest.approx(worst["paper_algo_s"] / worst["paper_comm_s"] * 100)
    # Comm time grows with size: 16x the bytes is at least 8x the time.
    comm = _by(rows, "case", "size_MiB", "comm_s")
    for case in table1.CASES:
        assert comm[(case, 256)] > 8 * comm[(case, 16)]
    assert_drawn(table1_quick.png_path)


# ----------------------------------------------------------------- CLI
def test_cli_runs_a_figure_and_writes_json(tmp_path):
    out = tmp_path / "paper"
    js = tmp_path / "paper.json"
    result = invoke("bench", "paper", "table1", "--quick", "--out", out, "--json", js)
    assert result.exit_code == 0, result.output
    assert "paper vs ours" in result.output
    assert "table1.csv" in result.output and "table1.png" in result.output
    assert (out / "table1.csv").exists() and (out / "table1.png").exists()
    data = json.loads(js.read_text())  # strict JSON: NaN would not parse back as a number
    assert data["failures"] == []
    [fig] = data["figures"]
    assert fig["name"] == "table1"
    assert len(fig["rows"]) == 4
    labels = [c["label"] for c in fig["comparisons"]]
    assert any("inter-node, 256 MiB" in label for label in labels)


def test_cli_unknown_figure_exits_2_naming_it(tmp_path):
    result = invoke("bench", "paper", "fig9", "--out", tmp_path / "x")
    assert result.exit_code == 2
    assert "unknown figure 'fig9'" in result.output
    assert "fig7" in result.output and "table1" in result.output
    assert not (tmp_path / "x").exists()


def test_cli_all_reports_a_failing_figure_and_exits_1(fake_figures, tmp_path):
    js = tmp_path / "all.json"
    result = invoke("bench", "paper", "all", "--out", tmp_path, "--json", js)
    assert result.exit_code == 1
    assert "figure broken failed: RuntimeError: broken broke on purpose" in result.output
    assert "figure missing failed: ModuleNotFoundError" in result.output
    assert (tmp_path / "good.csv").exists()  # the good figure's results were kept
    data = json.loads(js.read_text())
    assert [f["name"] for f in data["figures"]] == ["good"]
    assert [f["name"] for f in data["failures"]] == ["broken", "missing"]


# ----------------------------------------------------------------- viz + demo
def test_link_utilisation_heatmap_checks_its_input(tmp_path):
    fab = pw.fabric.preset("h100-2x4")
    util = np.zeros((2, fab.num_links))
    util[0, 3] = 1.0
    util[1, 5] = 0.5
    res = SimpleNamespace(times_s=np.array([0.0, 1e-3, 3e-3]), link_util=util, makespan_s=3e-3)
    out = viz.plot_link_utilisation({"static": res, "mwu": res}, fab, tmp_path / "h.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
    bad = SimpleNamespace(times_s=res.times_s, link_util=util[:, :5], makespan_s=3e-3)
    with pytest.raises(ValueError, match=r"link_util has shape \(2, 5\)"):
        viz.plot_link_utilisation({"static": bad}, fab, tmp_path / "bad.png")
    with pytest.raises(ValueError, match="at least one"):
        viz.plot_link_utilisation({}, fab, tmp_path / "none.png")


def test_demo_simulate_step_prints_makespans_and_writes_the_heatmap(tmp_path, assert_drawn):
    from rich.console import Console

    from pathweave.cli import demo

    steps = [s for s in demo.STEPS if s.name in ("plan", "simulate")]
    assert [s.name for s in steps] == ["plan", "simulate"]
    con = Console(width=160, record=True, file=io.StringIO())
    ctx = demo.run_demo(tmp_path, con, steps)
    assert set(ctx.simulations) == {r.policy for r in ctx.comparison.results}
    for r in ctx.comparison.results:
        assert ctx.simulations[r.policy].makespan_s >= r.plan.congestion_s * (1 - EPS)
    heatmap = tmp_path / demo.HEATMAP_NAME
    assert heatmap in ctx.files
    assert_drawn(heatmap)
    text = con.export_text()
    mwu = ctx.simulations["mwu"].makespan_s
    assert f"{mwu * 1e3:.3f}" in text
    assert math.isfinite(mwu)
    # The demo's workload is one where the default policy beats every baseline, and says so.
    default = ctx.simulations[pw.plan.DEFAULT_POLICY].makespan_s
    base = min(ctx.simulations[b].makespan_s for b in pw.plan.baselines())
    assert default < base
    assert f"{base / default:.2f}x faster" in text
