"""The data-plane benchmark, its command, the demo's execute step and the torchrun example.

Everything runs for real on 4 local gloo ranks with tiny sizes: the records
are checked against numbers worked out independently (bytes from the demand
matrix, medians from the per-call times), and a deliberately broken
all-to-all shows that the benchmark's bitwise verification catches both a
flipped byte and an output that was never written.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from pathweave import fabric as pwfabric
from pathweave import traffic
from pathweave.bench import dataplane
from pathweave.cli.main import app

RANKS = 4
FABRIC_4 = "cluster:nodes=2,gpus_per_node=2,node_kind=nvlink-mesh"
PAIR_BYTES = 64 << 10
REPEAT = 2
ROOT = Path(__file__).resolve().parents[1]
FORWARDED_ROLES = {"relay", "rd", "dr", "drd"}

runner = CliRunner()


def _corrupting_all_to_all(output, input, output_split_sizes=None, input_split_sizes=None,
                           *, orchestrator=None):
    """pathweave's all-to-all, broken on purpose: rank 1 flips a bit, rank 2 writes nothing."""
    import torch.distributed as dist

    from pathweave import distributed as pwdist

    rank = dist.get_rank()
    target = torch.empty_like(output) if rank == 2 else output
    pwdist.all_to_all_single(target, input, output_split_sizes, input_split_sizes,
                             orchestrator=orchestrator)
    if rank == 1:
        output.view(torch.uint8)[-1] ^= 1


def _expected_bytes_total(workload: str) -> int:
    if workload == "balanced":
        return RANKS * RANKS * PAIR_BYTES
    demand = traffic.hotspot(RANKS, RANKS * PAIR_BYTES, dataplane.HOTSPOT_RATIO)
    return int((demand // 4).sum()) * 4


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dataplane") / "sub" / "records.json"
    result = runner.invoke(app, [
        "bench", "dataplane", "--ranks", str(RANKS), "--sizes", "64K", "--repeat", str(REPEAT),
        "--fabric", FABRIC_4, "--json", str(out),
    ])
    return result, out


@pytest.fixture(scope="module")
def corrupted_records():
    return dataplane.run(world_size=RANKS, sizes_per_pair=[PAIR_BYTES], repeat=REPEAT,
                         multipath_fabric=FABRIC_4, all_to_all=_corrupting_all_to_all,
                         timeout_s=120)


def test_cli_writes_records_that_add_up(cli_run):
    result, out = cli_run
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    records = json.loads(out.read_text())
    assert [(r["case"], r["workload"], r["variant"], r["cached"]) for r in records] == [
        ("transfer", "balanced", "auto", True),
        ("transfer", dataplane.HOTSPOT, "auto", True),
        ("transfer", dataplane.HOTSPOT, "multipath", True),
        ("transfer", "balanced", "backend", True),
        ("overhead", "balanced", "auto", True),
        ("overhead", dataplane.HOTSPOT, "multipath", True),
        ("overhead", dataplane.HOTSPOT, "multipath", False),
    ]
    for r in records:
        assert set(r) == set(dataplane.RECORD_KEYS)
        assert r["ranks"] == RANKS and r["repeat"] == REPEAT
        assert len(r["torch_s"]) == len(r["pathweave_s"]) == REPEAT
        assert r["torch_s_median"] == pytest.approx(statistics.median(r["torch_s"]))
        assert r["pathweave_s_median"] == pytest.approx(statistics.median(r["pathweave_s"]))
        assert r["ratio"] == pytest.approx(r["pathweave_s_median"] / r["torch_s_median"])
        assert r["diff_s"] == pytest.approx(r["pathweave_s_median"] - r["torch_s_median"])
        # Every rank checks the warm-up call and both calls of every repeat.
        assert r["outputs_checked"] == RANKS * (1 + 2 * REPEAT)
        assert r["verified"] and r["outputs_wrong"] == 0 and r["mismatches"] == []
        assert r["overhead_s_median"] >= max(r["meta_s_median"], r["plan_s_median"]) >= 0
    transfer = [r for r in records if r["case"] == "transfer"]
    for r in transfer:
        assert r["bytes_per_pair"] == PAIR_BYTES
        assert r["bytes_total"] == _expected_bytes_total(r["workload"])
        assert r["cache_hits"] == REPEAT  # the warm-up call planned; the timed ones hit
    forced = transfer[2]
    assert forced["multipath"] and forced["fabric"] == pwfabric.resolve(FABRIC_4).name
    # Forced multi-path on 2 nodes x 2 GPUs: some bytes travel through a forwarding rank.
    assert FORWARDED_ROLES & {k for k, v in forced["bytes_per_kind"].items() if v > 0}
    assert not transfer[0]["multipath"]  # 64 KiB balanced: no gain to plan for
    for r in records:
        # Only the overhead rows time the bare collectives beside the calls.
        for key in ("floor_s_median", "a2a_s_median"):
            assert (r[key] is not None) == (r["case"] == "overhead")
            assert r[key] is None or r[key] > 0
    # Through the pathweave backend, balanced 64 KiB: its orchestrator hands it to gloo.
    assert transfer[3]["variant"] == "backend" and not transfer[3]["multipath"]
    small, cached, changing = records[4:]
    assert not small["multipath"] and small["cache_hits"] == REPEAT  # small: torch, no planning
    # A repeated pattern is served from the plan cache; a changing one plans every call.
    assert cached["multipath"] and changing["multipath"]
    assert cached["cache_hits"] == REPEAT and changing["cache_hits"] == 0
    assert changing["plan_s_median"] > cached["plan_s_median"]
    assert "PASS" in result.output and "outputs bitwise equal to torch's" in result.output


def test_cli_tables_show_every_case(cli_run):
    result, _ = cli_run
    text = " ".join(result.output.split())  # notes wrap at the console width
    assert "pathweave vs torch all_to_all_single, 4 gloo ranks" in text
    assert "forced multi-path" in text and "auto: torch's" in text
    assert "per-call overhead" in text and "changing" in text and "repeated" in text
    assert f"forced: enabled=True on {pwfabric.resolve(FABRIC_4).name}" in text


def test_corrupted_outputs_are_caught(corrupted_records):
    recs = corrupted_records
    assert recs and not any(r["verified"] for r in recs)
    for r in recs:
        # Ranks 1 and 2 are wrong after every pathweave call (warm-up + repeats);
        # torch's outputs and the other ranks' stay right.
        assert r["outputs_wrong"] == 2 * (1 + REPEAT)
        text = " | ".join(r["mismatches"])
        assert "rank 1, warm-up call" in text and "rank 2, warm-up call" in text
        # Rank 1's flipped byte is its last one, which came from the last rank.
        assert f"(data from rank {RANKS - 1})" in text
        assert "byte 0 of" in text  # rank 2's output was never written
    verified = next(c for c in dataplane.summarize(recs) if c.name == "verified")
    assert verified.passed is False and "first mismatch: rank 1" in verified.text


def test_cli_exits_1_when_an_output_is_wrong(corrupted_records, monkeypatch, tmp_path):
    monkeypatch.setattr(dataplane, "run", lambda **kw: corrupted_records)
    result = runner.invoke(app, ["bench", "dataplane", "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 1, result.output
    assert "MISS" in result.output and "NO" in result.output
    assert json.loads((tmp_path / "r.json").read_text())[0]["verified"] is False


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--ranks", "4"], "has 8 ranks, but the benchmark runs 4"),
        (["--sizes", "2"], "--sizes '2'"),
        (["--fabric", "no-such-fabric"], "no-such-fabric"),
    ],
)
def test_cli_bad_input_exits_2(args, needle):
    result = runner.invoke(app, ["bench", "dataplane", *args])
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output


def test_demo_execute_step_verifies_and_reports_kinds(tmp_path):
    from pathweave.cli._demo_execute import execute_step
    from pathweave.cli.demo import DemoContext

    console = Console(record=True, width=200)
    ctx = DemoContext(out_dir=tmp_path, console=console, fabric_spec=FABRIC_4)
    execute_step(ctx)
    text = console.export_text()
    assert "verified" in text and "MISMATCH" not in text
    assert "(multi-path, from Orchestrator.stats)" in text
    # Across 2 nodes with multi-path forced, some bytes cross the rails.
    assert re.search(r"rail [1-9][\d.]* (KiB|MiB)", text), text


def test_execute_rejects_a_demand_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"shape \(3, 3\), expected \(8, 8\)"):
        dataplane.execute("h100-2x4", np.zeros((3, 3)))


def test_torchrun_example_runs_and_verifies():
    # Three processes keep it quick: the point is that the example runs under torchrun.
    fabric = "cluster:nodes=1,gpus_per_node=3"
    env = dict(os.environ, PATHWEAVE_FABRIC=fabric, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "3", str(ROOT / "examples" / "torchrun_all_to_all.py"),
           "--mib", "2", "--repeat", "1"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The example names the fabric the group resolved (PATHWEAVE_FABRIC's preset).
    name = pwfabric.preset(fabric).name
    assert f"3 ranks on gloo, fabric {name}, hotspot 0.8" in proc.stdout
    assert "verified: bitwise equal" in proc.stdout


def _without_torch(monkeypatch, module) -> None:
    real = module.importlib.util.find_spec
    monkeypatch.setattr(module.importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))


def test_without_torch_the_command_exits_2_and_the_demo_step_skips(monkeypatch, tmp_path):
    from pathweave.cli import _common, _demo_execute
    from pathweave.cli.demo import DemoContext

    _without_torch(monkeypatch, _common)
    for bench, what in (("dataplane", "the data-plane benchmark"), ("moe", "the MoE benchmark")):
        result = runner.invoke(app, ["bench", bench, "--quick"])
        assert result.exit_code == 2 and f"{what} needs torch" in result.output, result.output
    _without_torch(monkeypatch, _demo_execute)
    console = Console(record=True, width=200)
    _demo_execute.execute_step(DemoContext(out_dir=tmp_path, console=console))
    text = console.export_text()
    assert "skipped" in text and "torch is not installed" in text and "verified" not in text
