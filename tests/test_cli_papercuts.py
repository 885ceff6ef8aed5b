"""What a new user hits first: physical limits, ``-`` for stdout, demand files, units, help."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import pathweave as pw
from pathweave.cli.main import app
from pathweave.fabric.discovery import GPU_GENERATIONS

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path("/work/shared/fixtures/topology")


def invoke(*args: object):
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def _smi_pair(path: Path, cell: str) -> Path:
    """``nvidia-smi topo -m`` of two GPUs joined by ``cell`` (``NV18``)."""
    path.write_text(f"\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
                    f"GPU0\t X \t{cell}\t0-15\t0\nGPU1\t{cell}\t X \t0-15\t0\n")
    return path


# ------------------------------------------------------------ physical limits
@pytest.mark.parametrize("gpu", sorted(GPU_GENERATIONS))
def test_more_nvlinks_than_the_gpu_has_are_refused_naming_both(tmp_path: Path, gpu: str):
    most = GPU_GENERATIONS[gpu].max_links
    ok = _smi_pair(tmp_path / "ok.txt", f"NV{most}")
    assert invoke("topo", "validate", f"{ok}:gpu={gpu}").exit_code == 0
    bad = _smi_pair(tmp_path / "bad.txt", f"NV{most + 81}")
    result = invoke("topo", "validate", f"{bad}:gpu={gpu}")
    assert result.exit_code == 1, result.output
    assert str(most + 81) in result.stderr and f"at most {most}" in result.stderr
    # Every loader refuses it, not only validate: plan exits 2 with one line.
    result = invoke("plan", "-f", f"{bad}:gpu={gpu}", "-w", "uniform", "--no-lp")
    assert result.exit_code == 2 and str(most + 81) in result.stderr


def test_nv99_between_two_h100s_names_99_and_18(tmp_path: Path):
    result = invoke("topo", "validate", _smi_pair(tmp_path / "nv99.txt", "NV99"))
    assert result.exit_code == 1
    assert "99" in result.stderr and "18" in result.stderr and "h100" in result.stderr.lower()


def test_real_topology_files_pass_the_physical_limits():
    files = sorted(p for p in FIXTURES.glob("*") if p.suffix in (".txt", ".xml"))
    if not files:
        pytest.skip(f"no topology fixtures under {FIXTURES}")
    for path in files:
        result = invoke("topo", "validate", path)
        assert result.exit_code == 0, (path, result.stderr)


def test_a_nic_faster_than_any_made_is_refused():
    # 8 Tb/s per NIC: ten times ConnectX-8's 800 Gb/s.
    result = invoke("topo", "validate", "dgx-h100:nic_Bps=1e12")
    assert result.exit_code == 1
    assert "1,000 GB/s" in result.stderr or "1000 GB/s" in result.stderr
    assert "100 GB/s" in result.stderr  # the limit, 800 Gb/s


def test_a_fabric_file_with_superhuman_nvlink_is_refused(tmp_path: Path):
    # A saved fabric carries no GPU model: the fastest NVLink made (B200, 18 x 50 GB/s) bounds it.
    fab = pw.fabric.builders.cluster(nodes=1, gpus_per_node=2, node_kind="nvswitch",
                                     nvlink_Bps=2e12)
    path = tmp_path / "fast.yaml"
    pw.fabric.save(fab, path)
    result = invoke("topo", "validate", path)
    assert result.exit_code == 1
    assert "2,000 GB/s" in result.stderr and "900 GB/s" in result.stderr


# ------------------------------------------------------------ "-" is stdout
def test_json_dash_is_standard_output(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("plan", "-f", "h100-2x4", "-w", "hotspot:0.9", "-p", "static",
                    "--json", "-")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "-").exists()
    records = json.loads(result.stdout)  # stdout is the JSON alone; the table went to stderr
    assert records[0]["policy"] == "static"
    assert "congestion" in result.stderr
    result = invoke("simulate", "-f", "h100-2x4", "-w", "hotspot:0.9", "-p", "static",
                    "--json", "-")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["policy"] == "static"
    assert not (tmp_path / "-").exists()


# ------------------------------------------- the fabric and workload as arguments
@pytest.mark.parametrize("command", ["plan", "simulate"])
@pytest.mark.parametrize("form", [("h100-2x4", "hotspot:0.9"), ("-f", "h100-2x4", "hotspot:0.9"),
                                  ("-w", "hotspot:0.9", "h100-2x4")])
def test_the_fabric_and_workload_may_be_arguments(command: str, form: tuple[str, ...]):
    # what `topo show PRESET` teaches a new user to type: the same records as the options
    named = invoke(command, "-f", "h100-2x4", "-w", "hotspot:0.9", "-p", "static",
                   "--json", "-")
    positional = invoke(command, *form, "-p", "static", "--json", "-")
    assert named.exit_code == positional.exit_code == 0, positional.output

    def strip(records: list[dict]) -> list[dict]:  # wall times differ run to run
        return [{k: v for k, v in r.items() if k not in ("plan_s", "sim_s")} for r in records]

    assert strip(json.loads(positional.stdout)) == strip(json.loads(named.stdout))


@pytest.mark.parametrize("args, says", [
    ((), "missing the fabric and the workload"),
    (("h100-2x4",), "missing the workload"),
    (("-w", "uniform"), "missing the fabric"),
    (("h100-2x4", "uniform", "static"), "unexpected argument static (expected at most"),
    (("-f", "h100-2x4", "uniform", "dgx-h100"), "unexpected argument dgx-h100 (--fabric given"),
])
@pytest.mark.parametrize("command", ["plan", "simulate"])
def test_a_missing_or_extra_fabric_or_workload_is_one_line(command: str, args, says: str):
    result = invoke(command, *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"pathweave {command}: {says}" in result.stderr, result.stderr
    if says.startswith("missing"):  # and how to give it
        assert "--fabric dgx-h100:nodes=2 --workload hotspot:0.8" in result.stderr


# ------------------------------------------------------------ demand files
def _single_pair_demand(n: int = 8) -> np.ndarray:
    demand = np.zeros((n, n))
    demand[0, 4] = 1e9  # GPU 0 of node 0 to GPU 0 of node 1
    return demand


@pytest.mark.parametrize("suffix", [".npz", ".npy", ".csv", ".json"])
def test_a_demand_file_is_a_workload(tmp_path: Path, suffix: str):
    demand = _single_pair_demand()
    path = tmp_path / f"demand{suffix}"
    if suffix == ".npy":
        np.save(path, demand)
    elif suffix == ".csv":
        np.savetxt(path, demand, delimiter=",")
    else:
        pw.traffic.save_demand(path, demand)
    out = tmp_path / "plan.json"
    result = invoke("plan", "-f", "h100-2x4", "-w", path, "-p", "static", "--no-lp",
                    "--json", out)
    assert result.exit_code == 0, result.output
    # Hand-worked: static sends the 1 GB over rail 0 alone, a 50 GB/s NDR400 link.
    assert json.loads(out.read_text())[0]["congestion_s"] == pytest.approx(1e9 / 50e9)
    assert "1e+09 B in all" in result.stdout or "953.67 MiB in all" in result.stdout


def test_a_demand_file_of_the_wrong_size_names_both_sizes(tmp_path: Path):
    path = tmp_path / "d.npy"
    np.save(path, _single_pair_demand(16))
    result = invoke("simulate", "-f", "h100-2x4", "-w", path)
    assert result.exit_code == 2
    assert "16" in result.stderr and "8" in result.stderr and "d.npy" in result.stderr


# ------------------------------------------------------------ headers, units, --no-lp
def test_the_header_states_the_workloads_own_size():
    # moe sizes itself: 64 tokens x 1 KiB hidden x 2 bytes x top-2 = 256 KiB routed in all,
    # less the copies that stay on their own rank; never the --bytes default.
    spec = "moe:tokens=64,hidden=1024,experts=8,topk=2,hot=0.5"
    result = invoke("plan", "-f", "h100-2x4", "-w", spec, "-p", "static", "--no-lp")
    assert result.exit_code == 0, result.output
    total = float(re.search(r"([\d.]+) KiB in all", result.stdout).group(1)) * 1024
    assert 0 < total <= 64 * 1024 * 2 * 2
    per_rank = float(re.search(r"([\d.]+) KiB per rank", result.stdout).group(1)) * 1024
    assert per_rank == pytest.approx(total / 8, abs=8)
    assert "256 MiB" not in result.stdout


def test_no_lp_skips_the_optimum(tmp_path: Path):
    out = tmp_path / "plan.json"
    result = invoke("plan", "-f", "h100-2x4", "-w", "uniform", "-p", "static", "--no-lp",
                    "--json", out)
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())[0]
    assert record["optimal_s"] is None and record["ratio"] is None
    assert "--no-lp" in result.stdout


def test_tiny_payloads_get_a_unit_that_shows_them():
    result = invoke("plan", "-f", "h100-2x4", "-w", "uniform", "-b", "1", "-p", "static")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if "│ static " in line)
    assert not re.search(r"(?<![\d.])0\.000 ", row), row
    assert re.search(r"\d+(\.\d+)? ns", row)  # 1 B at 50 GB/s is a fraction of a ns
    result = invoke("simulate", "-f", "h100-2x4", "-w", "uniform", "-b", "1", "-p", "static")
    assert result.exit_code == 0, result.output
    assert not re.search(r"(?<![\d.])0\.000 ", result.stdout), result.stdout


def test_piped_tables_keep_every_column(capsys):
    from rich.table import Table

    from pathweave.cli._common import console

    table = Table()
    cells = [f"column-{i}-" + "x" * 12 for i in range(14)]  # ~280 characters wide
    for cell in cells:
        table.add_column(cell)
    table.add_row(*cells)
    console().print(table)  # stdout is captured: not a terminal
    printed = capsys.readouterr().out
    assert "…" not in printed
    for cell in cells:
        assert printed.count(cell) == 2, cell  # header and row, whole


def test_slow_work_reports_progress_on_stderr(monkeypatch):
    from pathweave.cli import _common

    monkeypatch.setattr(_common, "PROGRESS_AFTER_S", 0.0)  # everything counts as slow
    result = invoke("simulate", "-f", "h100-2x4", "-w", "uniform", "-p", "static,mwu")
    assert result.exit_code == 0, result.output
    assert "mwu" in result.stderr and "static" in result.stderr
    assert "simulating" in result.stderr


# ------------------------------------------------------------ simulate --json
def test_simulate_json_records_name_fabric_and_workload(tmp_path: Path):
    out = tmp_path / "sim.json"
    result = invoke("simulate", "-f", "h100-2x4", "-w", "hotspot:0.9", "-b", "1M",
                    "-p", "static,mwu", "--json", out)
    assert result.exit_code == 0, result.output
    for record in json.loads(out.read_text()):
        assert record["fabric"] == "h100-2x4" and record["workload"] == "hotspot:0.9"
        assert record["ranks"] == 8 and record["bytes_per_rank"] == 1 << 20


SPY = """
import numba, sys
from pathweave import sim
from pathweave.sim import _maxmin, _queue
from pathweave.cli.main import app
kernels = [f for m in (_maxmin, _queue) for f in vars(m).values()
           if isinstance(f, numba.core.registry.CPUDispatcher)]
real, seen = sim.simulate, []
def compiled():
    return [len(f.signatures) for f in kernels]
def spy(fab, plan, *a, **k):
    before = compiled()
    out = real(fab, plan, *a, **k)
    seen.append((fab.num_ranks, before == compiled()))
    return out
sim.simulate = spy
try:
    app(["simulate", "-f", "dgx-h100:nodes=2", "-w", "uniform", "-p", "static,mwu"])
except SystemExit:
    pass
print("SEEN", seen)
"""


def test_simulate_times_no_numba_compile():
    # A fresh process (its dispatchers start empty) with the suite's own numba
    # cache: a signature loaded from the cache is counted as one compiled, so a
    # timed call that loads a kernel fails this as a compiling one would, and a
    # clean clone pays no second cold compile of every simulator kernel here.
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", SPY], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)
    seen = eval(done.stdout.split("SEEN", 1)[1])  # a list of (int, bool) tuples we printed
    timed = [compiled for ranks, compiled in seen if ranks == 16]
    assert len(timed) == 2, done.stdout + done.stderr
    assert all(timed), seen  # no timed call compiled a kernel


# ------------------------------------------------------------ demo, names, help
def test_demo_no_emulate_leaves_out_the_emulator(monkeypatch, tmp_path: Path):
    from pathweave.cli import demo

    ran: list[str] = []
    steps = [demo.DemoStep(name, name, lambda ctx, name=name: ran.append(name))
             for name in ("plan", "emulate")]
    monkeypatch.setattr(demo, "STEPS", steps)
    result = invoke("demo", "--no-emulate", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    assert ran == ["plan"]
    assert "emulate" in result.stdout  # one line says it was left out
    result = invoke("demo", "--out", tmp_path)
    assert ran == ["plan", "plan", "emulate"]


@pytest.mark.parametrize("typo, meant", [("dgx_h100", "dgx-h100"), ("h100-2x8", "h100-2x4"),
                                         ("dgx-h100:nodes=2x", None)])
def test_fabric_names_get_a_suggestion(typo: str, meant: str | None):
    result = invoke("topo", "show", typo)
    assert result.exit_code == 2
    if meant is not None:
        assert f"did you mean {meant!r}" in result.stderr


def _commands(group, path=()):
    import typer.main

    click_group = typer.main.get_command(app) if group is None else group
    for name, cmd in getattr(click_group, "commands", {}).items():
        yield (*path, name), cmd
        yield from _commands(cmd, (*path, name))


@pytest.mark.parametrize("group", [(), ("topo",), ("bench",), ("emulate",)])
def test_a_group_without_a_command_prints_its_help_once(group: tuple[str, ...]):
    result = invoke(*group)
    assert result.output.count("Usage:") == 1, result.output
    names = [path[-1] for path, _ in _commands(None) if path[:-1] == group]
    assert names and all(re.search(rf"\b{n}\b", result.output) for n in names), result.output


def test_top_level_help_lists_first_look_commands_first():
    out = invoke("--help").output
    first_look = ["demo", "plan", "simulate", "policies", "topo", "perf", "calibrate", "bench",
                  "emulate"]
    assert sorted(path[0] for path, _ in _commands(None) if len(path) == 1) == sorted(first_look)
    at = [re.search(rf"│ {n}\s", out).start() for n in first_look]
    assert at == sorted(at), out


def test_help_mentions_topology_files_and_no_internal_issue_numbers():
    assert "nvidia-smi" in invoke("topo", "show", "--help").stdout
    assert "NCCL" in invoke("topo", "show", "--help").stdout
    for path, _ in _commands(None):
        text = invoke(*path, "--help").stdout
        assert not re.search(r"\bissue \d+", text, re.I), (path, text)


def test_docs_name_no_internal_issue_numbers():
    # The package's docstrings are docs too (help(), the API pages).
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "src" / "pathweave").rglob("*.py"))]
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            assert not re.search(r"\bissue \d+", line, re.I), f"{path.name}:{n}: {line}"


def test_docs_list_simulates_default_policies():
    from pathweave.cli.simulate import DEFAULT_POLICIES

    text = (ROOT / "docs" / "cli.md").read_text()
    assert DEFAULT_POLICIES in text


_FIRST_COMPILE = """
import io
import numpy as np
from pathweave.cli._common import announce_compiles
from pathweave._sort import select

buf = io.StringIO()
announce_compiles(buf)
announce_compiles(buf)  # once per process and stream
assert select(np.arange(5), 2) == 2 and select(np.arange(5.0), 4) == 4.0
print(buf.getvalue(), end="")
"""


def test_the_first_compile_says_so_once_and_a_cached_run_says_nothing(tmp_path):
    # A fresh numba cache: the two kernels compile (one notice); then the same cache
    # again: both load, nothing compiles, nothing is said.
    from pathweave.cli._common import COMPILE_NOTICE

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    outs = [subprocess.run([sys.executable, "-c", _FIRST_COMPILE], env=env, check=True,
                           capture_output=True, text=True).stdout for _ in range(2)]
    assert outs == [COMPILE_NOTICE + "\n", ""]
