"""The command line, driven through typer's test runner as a user would drive it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import scipy.optimize
from typer.testing import CliRunner

import pathweave as pw
from pathweave.bench import planner
from pathweave.cli import _demo_emulate
from pathweave.cli.main import app

runner = CliRunner()

#: static / optimal on h100-2x4 at hotspot 0.9, worked out by hand: static puts
#: 4 * 0.9 payload units on rail 0 into node 0 (50 GB/s); the optimum spreads
#: the node's inbound 4 * 0.9 + 4 * 3 * 0.1 / 6 = 3.8 units over 4 rails, or
#: 0.95 per rail, so the ratio is 3.6 / 0.95.
STATIC_OVER_OPTIMAL_HOTSPOT_09 = 3.6 / 0.95


def invoke(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.output.strip() == f"pathweave {pw.__version__}"


def test_topo_show_prints_node_and_gpu_counts(tmp_path: Path, assert_drawn):
    png = tmp_path / "fabric.png"
    result = invoke("topo", "show", "h100-2x4", "--png", png)
    assert result.exit_code == 0, result.output
    assert re.search(r"nodes\W+2\b", result.output)
    assert re.search(r"GPUs per node\W+4\b", result.output)
    assert re.search(r"rails\W+4\b", result.output)
    assert "nvlink-mesh" in result.output
    assert "rail drd" in result.output  # candidate paths by kind
    assert_drawn(png)


def test_topo_validate_accepts_a_preset():
    result = invoke("topo", "validate", "dgx-h100:nodes=2")
    assert result.exit_code == 0
    assert result.output.startswith("OK dgx-h100-2n")


def test_topo_validate_names_a_bad_file(tmp_path: Path):
    bad = tmp_path / "broken-fabric.yaml"
    bad.write_text("nodes: [\n")
    result = invoke("topo", "validate", bad)
    assert result.exit_code == 1
    assert "broken-fabric.yaml" in result.output
    assert result.output.startswith("error: invalid fabric")


def test_plan_json_static_to_optimal_ratio(tmp_path: Path):
    out = tmp_path / "plan.json"
    result = invoke(
        "plan", "--fabric", "h100-2x4", "--workload", "hotspot:0.9",
        "--policy", "static,mwu", "--json", out,
    )
    assert result.exit_code == 0, result.output
    records = {r["policy"]: r for r in json.loads(out.read_text())}
    assert set(records) == {"static", "mwu"}  # optimal runs for the ratio but is not a row
    static = records["static"]
    assert static["ratio"] == pytest.approx(STATIC_OVER_OPTIMAL_HOTSPOT_09, rel=0.02)
    assert static["congestion_s"] / static["optimal_s"] == pytest.approx(static["ratio"])
    assert records["mwu"]["ratio"] <= 1.02
    assert "static" in result.output and "3.789x" in result.output


def test_plan_unknown_policy_exits_2_naming_it():
    result = invoke("plan", "-f", "h100-2x4", "-w", "hotspot:0.9", "-p", "static,warp-drive")
    assert result.exit_code == 2
    assert "'warp-drive'" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_plan_bad_workload_exits_2():
    result = invoke("plan", "-f", "h100-2x4", "-w", "hotspt:0.9")
    assert result.exit_code == 2
    assert "hotspt" in result.output and "hotspot" in result.output


def test_plan_unsolvable_lp_marks_ratio_na(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # HiGHS stopping at its time limit (status 1, no solution) is replayed rather
    # than provoked, so the outcome does not depend on how fast the machine is.
    seen: dict[str, float] = {}

    def out_of_time(*args, options, **kwargs):
        seen["time_limit"] = options["time_limit"]
        return scipy.optimize.OptimizeResult(
            x=None, fun=None, status=1, message="Time limit reached. (HiGHS Status 13)"
        )

    monkeypatch.setattr(scipy.optimize, "linprog", out_of_time)
    out = tmp_path / "plan.json"
    result = invoke(
        "plan", "-f", "h100-2x4", "-w", "hotspot:0.5", "-p", "static",
        "--time-limit", "0.001", "--json", out,
    )
    assert result.exit_code == 0, result.output
    assert seen["time_limit"] == 0.001
    assert "LP optimum not available" in result.output
    (record,) = json.loads(out.read_text())
    assert record["ratio"] is None and record["optimal_s"] is None
    assert record["congestion_s"] > 0


def test_policies_lists_every_policy():
    result = invoke("policies")
    assert result.exit_code == 0
    for name in pw.plan.policies():
        assert name in result.output


def test_demo_writes_plot_and_prints_every_policy(tmp_path: Path, assert_drawn):
    # Every step but the emulator's (that one: the test below, with the emulator's tests).
    result = invoke("demo", "--no-emulate", "--out", tmp_path / "demo")
    assert result.exit_code == 0, result.output
    assert_drawn(tmp_path / "demo" / "policies.png")
    for name in pw.plan.policies():
        assert re.search(rf"^\W*{name}\b", result.output, re.MULTILINE), name


@pytest.mark.emulator  # brings it up: scripts/test.sh runs these one at a time
@pytest.mark.skipif(_demo_emulate.skip_reason() is not None,
                    reason=str(_demo_emulate.skip_reason()))
def test_demo_emulate_step_measures_the_default_against_a_baseline(tmp_path: Path):
    from rich.console import Console

    from pathweave.cli._demo_context import DemoContext

    con = Console(record=True, width=200)
    _demo_emulate.emulate_step(DemoContext(out_dir=tmp_path, console=con))
    text = con.export_text()
    # No simulate step ran, so the baseline is static; every byte was checked.
    default = pw.plan.DEFAULT_POLICY
    assert f"{default} over the best baseline (static)" in text, text
    assert "every byte verified" in text
    ratio = re.search(r"\((static)\): ([\d.]+)x measured on real bytes, ([\d.]+)x simulated", text)
    assert ratio is not None and float(ratio.group(2)) > 0 and float(ratio.group(3)) > 0


@pytest.mark.slow
def test_bench_planner_quick(tmp_path: Path, assert_drawn):
    out = tmp_path / "bench.json"
    # One timing repeat: the same cases, policies, LP, simulation and records
    # (nothing here reads a time); the median of 1 runs the same code as of 200.
    result = invoke("bench", "planner", "--quick", "--repeat", "1", "--json", out,
                    "--out", tmp_path)
    assert result.exit_code == 0, result.output
    records = json.loads(out.read_text())
    assert all(set(r) == set(planner.RECORD_KEYS) for r in records)
    cells: dict[tuple[str, str], set[str]] = {}
    for r in records:
        cells.setdefault((r["fabric"], r["workload"]), set()).add(r["policy"])
    assert len(cells) == len(planner.cases(quick=True))
    assert all(p == set(pw.plan.policies()) for p in cells.values())
    assert {r["ranks"] for r in records} == {8, 64, 256}  # quick: no 1024-GPU fabric
    # The LP is solved up to 64 GPUs and skipped at 256 in quick mode.
    assert all(r["optimal_s"] is not None for r in records if r["ranks"] <= 64)
    assert all(r["optimal_s"] is None for r in records if r["ranks"] == 256)
    assert "mwu/optimal median" in result.output
    assert_drawn(tmp_path / "bench_planner.png")
