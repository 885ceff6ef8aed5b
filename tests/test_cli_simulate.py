"""``pathweave simulate``: every policy's plan simulated, checked against hand-worked bounds."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

import pathweave as pw
from pathweave.cli.main import app

runner = CliRunner()


def test_simulate_writes_records_above_the_congestion_bound(tmp_path: Path, assert_drawn):
    out, png = tmp_path / "sim.json", tmp_path / "util.png"
    result = runner.invoke(app, [
        "simulate", "-f", "h100-2x4", "-w", "hotspot:0.9", "-b", "64M",
        "-p", "static,mwu", "--json", str(out), "--png", str(png),
    ])
    assert result.exit_code == 0, result.output
    records = {r["policy"]: r for r in json.loads(out.read_text())}
    demand = pw.traffic.hotspot(8, bytes_per_rank=64 << 20, ratio=0.9)
    assert set(records) == {"static", "mwu"}
    for rec in records.values():
        assert rec["makespan_s"] >= rec["congestion_s"]
        assert rec["total_bytes"] == int(demand.sum())  # every byte of the demand moves
    # Hand-worked: static puts 4 x 0.9 x 64 MiB on rail 0 into node 0 (50 GB/s), so
    # its makespan is at least that long; mwu's bound is 3.6 / 0.95 times smaller.
    static_floor_s = 4 * 0.9 * (64 << 20) / 50e9
    assert records["static"]["makespan_s"] >= static_floor_s
    assert records["static"]["makespan_s"] / records["mwu"]["makespan_s"] > 2.5
    assert_drawn(png)
    assert "vs static" in result.output


def test_simulate_names_an_unknown_policy():
    result = runner.invoke(app, ["simulate", "-f", "h100-2x4", "-w", "uniform", "-p", "nope"])
    assert result.exit_code == 2
    assert "nope" in result.output
