"""``pathweave perf``: its columns against hand-computed numbers, its byte check, its CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pathweave import perf
from pathweave.runtime.launch import run_local

SIZE = 3072  # bytes per rank on average: 768 floats


def _broken(output, input, output_split_sizes, input_split_sizes):
    """torch's all-to-all, then one element of rank 0's output damaged (the sink)."""
    torch.distributed.all_to_all_single(output, input, output_split_sizes, input_split_sizes)
    if torch.distributed.get_rank() == 0 and output.numel():
        output.view(torch.uint8)[-1] ^= 0xFF


def job_perf(rank, ws, options):
    return perf.run(rank, ws, options, extra={"broken": _broken})


def test_columns_match_a_hand_computed_case():
    # many_to_few with one sink on 4 ranks: ranks 1-3 each send rank 0 4/3 of
    # SIZE (4096 B, 1024 floats); rank 0 receives 4 * SIZE = 12288 B, the most
    # any rank moves, all of it from other ranks: algbw = busbw = 12288 B / time.
    options = perf.PerfOptions(min_bytes=SIZE, max_bytes=SIZE, step_factor=2,
                               workload="many_to_few:sinks=1", iters=2, warmup=1)
    results = run_local(job_perf, 4, (options,), timeout_s=300)
    assert all(r == results[0] for r in results)  # every rank holds the same rows
    rows = {r["impl"]: r for r in results[0]}
    assert list(rows) == [*perf.IMPLS, "broken"]
    for r in rows.values():
        assert (r["size"], r["count"], r["type"], r["ranks"]) == (SIZE, 768, "float", 4)
        assert r["time_us"] > 0
        assert r["algbw_GBps"] * 1e9 * r["time_us"] * 1e-6 == pytest.approx(12288, rel=1e-9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"], rel=1e-12)
    assert all(rows[impl]["wrong"] == 0 for impl in perf.IMPLS)
    assert rows["broken"]["wrong"] == 1  # one damaged element on one rank


def test_bus_bytes_leave_out_a_ranks_own_share():
    # 2 ranks, 4-byte elements, rank 0 keeps 1 element and sends 2; rank 1 sends 3.
    # Sent: 12, 12 B; received: 16, 8 B -> B = 16. To/from others: sent 8, 12;
    # received 12, 8 -> B_bus = 12.
    assert perf._bw_bytes(np.array([[1, 2], [3, 0]]), 4) == (16, 12)
    # nccl-tests' uniform all-to-all (size / N to every rank, itself included):
    # busbw / algbw = (N - 1) / N.
    most, bus = perf._bw_bytes(np.full((4, 4), 8), 4)
    assert (most, bus) == (128, 96) and bus / most == 3 / 4


def test_sizes_and_workload_scaling():
    assert perf.sizes(1 << 10, 1 << 20, 32) == [1 << 10, 1 << 15, 1 << 20]
    for spec in ("uniform", "hotspot:0.8", "many_to_few", "zipf:1.2", "moe:tokens=64,hidden=8"):
        D = perf.demand_bytes(spec, 8, 1 << 20)
        assert D.sum() == pytest.approx(8 << 20) and np.all(np.diag(D) == 0), spec
    with pytest.raises(ValueError, match="step factor must be > 1"):
        perf.sizes(1, 2, 1)


def test_cli_writes_rows_and_refuses_bad_input(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert perf.main(["--ranks", "2", "-b", "1K", "-e", "2K", "-f", "2", "-n", "1", "-W", "0",
                      "-d", "bfloat16", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["size"], r["impl"]) for r in rows] == [
        (size, impl) for size in (1024, 2048) for impl in perf.IMPLS]
    assert all(list(r) == list(perf.COLUMNS) and r["wrong"] == 0 and r["count"] == r["size"] // 2
               for r in rows)
    for argv, word in ((["-w", "nope"], "unknown workload 'nope'"), (["-b", "2K", "-e", "1K"],
                       "minbytes <= maxbytes"), (["-n", "0"], "-n must be >= 1")):
        with pytest.raises(SystemExit) as exc:
            perf.main(["--ranks", "2", *argv])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and word in err[0], err


@pytest.mark.parametrize("env, word", [
    ({}, "not inside a torchrun job"),
    ({"RANK": "0", "MASTER_PORT": "29500"}, "WORLD_SIZE, MASTER_ADDR are unset"),
])
def test_outside_torchrun_without_ranks_is_one_line_with_the_remedy(monkeypatch, capsys, env,
                                                                    word):
    # torch's own env:// error names RANK alone and says nothing of --ranks
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(SystemExit) as exc:
        perf.main(["-b", "1K", "-e", "1K"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and word in err[0], err
    assert ("torchrun job sets" if env else "--ranks N") in err[0]


@pytest.mark.parametrize("tool", ["perf", "calibrate"])
@pytest.mark.parametrize("argv, word", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["-n", "x"], "invalid int value: 'x'"),
])
def test_a_malformed_tool_command_line_is_one_line(capsys, tool, argv, word):
    # argparse's own error prints the usage first: two to seven lines
    from pathweave import calibrate

    main = {"perf": perf.main, "calibrate": calibrate.main}[tool]
    with pytest.raises(SystemExit) as exc:
        main(["-o", "x.json", *argv] if tool == "calibrate" else argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and word in err[0] and f"pathweave {tool} --help" in err[0], err


def test_table_has_nccl_tests_columns():
    rows = [{"size": 1024, "count": 256, "type": "float", "impl": "torch", "time_us": 10.0,
             "algbw_GBps": 0.1024, "busbw_GBps": 0.1024, "wrong": 0, "ranks": 2,
             "backend": "gloo"}]
    text = perf.format_table(rows, perf.PerfOptions())
    assert "#wrong" in text and "busbw" in text and "algbw" in text and "out-of-place" in text
    assert "1024          256    float      torch       10.0    0.102    0.102       0" in text
