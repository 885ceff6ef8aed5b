"""Hostile and careless command lines: one clear error line, exit 1 or 2, never a traceback.

Every case of issues 14 and 16 (sizes past int64, zero/NaN/negative
options, duplicate spec keys, fabrics too large to plan, devices and
directories as output files, endless input files, bad suffixes) is run
in-process through typer's runner. A case passes when the command exits
with 2 (``topo validate``: 1), prints exactly one ``error:`` line, no
traceback, and no negative or non-finite figure outside that line. A hang
guard (SIGALRM) fails a case that does not answer.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pathweave.cli.main import app

runner = CliRunner()
FIXTURES = Path("/work/shared/fixtures/topology")
if not FIXTURES.is_dir():  # the fixtures ship in the repository too
    FIXTURES = Path(__file__).parent / "fixtures" / "topology"
NCCL_XML = FIXTURES / "azure_ndv5_h100_nccl-topo.xml"
NVSMI = FIXTURES / "h100_sxm_8gpu_8nic_nvidia-smi-topo-m.txt"
#: Seconds a case may take before the guard calls it a hang.
HANG_S = 60

PLAN = ["plan", "--fabric", "h100-2x4", "--workload", "uniform"]
SIM = ["simulate", "--fabric", "h100-2x4", "--workload", "uniform", "--policy", "static"]
EMU = ["emulate", "run", "--fabric", "h100-2x4"]

#: (id, argv, expected exit code). ``{tmp}`` is a fresh folder, ``{file}`` a regular file in it.
CASES = [
    ("bytes-1e30", [*PLAN, "--bytes", "1e30"], 2),
    ("bytes-just-past-int64", [*PLAN, "--bytes", "9.3e18"], 2),
    ("bytes-times-ranks-past-int64", [*PLAN, "--bytes", "2e18"], 2),
    ("bytes-negative", [*PLAN, "--bytes", "-5"], 2),
    ("bytes-nan", [*PLAN, "--bytes", "nan"], 2),
    ("bytes-inf", [*PLAN, "--bytes", "inf"], 2),
    ("bytes-unit", [*PLAN, "--bytes", "12 parsecs"], 2),
    ("simulate-bytes-0", [*SIM, "--bytes", "0"], 2),
    ("simulate-bytes-1e30", [*SIM, "--bytes", "1e30"], 2),
    ("workload-bytes-key-1e30", ["plan", "-f", "h100-2x4", "-w", "uniform:bytes=1e30"], 2),
    ("workload-hotspot-2", ["plan", "-f", "h100-2x4", "-w", "hotspot:2"], 2),
    ("workload-zipf-nan", ["plan", "-f", "h100-2x4", "-w", "zipf:nan"], 2),
    ("workload-dup-key", ["plan", "-f", "h100-2x4", "-w", "hotspot:ratio=0.5,ratio=0.6"], 2),
    ("moe-tokens-huge", ["plan", "-f", "h100-2x4", "-w", "moe:tokens=99999999999,hidden=4096"],
     2),
    ("moe-hidden-huge", ["plan", "-f", "h100-2x4", "-w", "moe:tokens=1024,hidden=1e30"], 2),
    ("fabric-nodes-100000", ["topo", "show", "dgx-h100:nodes=100000"], 2),
    ("plan-fabric-nodes-100000", ["plan", "-f", "dgx-h100:nodes=100000", "-w", "uniform"], 2),
    ("fabric-spines-1e9", ["topo", "show", "cluster:nodes=2,spines=1e9"], 2),
    ("fabric-one-node-spines-1e9", ["topo", "show", "cluster:nodes=1,spines=1e9"], 2),
    ("fabric-dup-key", ["topo", "show", "dgx-h100:nodes=2,nodes=3"], 2),
    ("fabric-nodes-0", ["topo", "show", "dgx-h100:nodes=0"], 2),
    ("fabric-nodes-nan", ["topo", "show", "dgx-h100:nodes=nan"], 2),
    ("fabric-nodes-fraction", ["topo", "show", "dgx-h100:nodes=2.5"], 2),
    ("fabric-capacity-negative", ["topo", "show", "cluster:nodes=2,nic_Bps=-1"], 2),
    ("fabric-unknown-key", ["topo", "show", "dgx-h100:colour=red"], 2),
    ("fabric-dev-zero", ["topo", "show", "/dev/zero"], 2),
    ("plan-fabric-dev-zero", ["plan", "-f", "/dev/zero", "-w", "uniform"], 2),
    ("fabric-directory", ["topo", "show", "{tmp}"], 2),
    ("fabric-missing", ["topo", "show", "{tmp}/nope.yaml"], 2),
    ("fabric-binary", ["topo", "show", "{binary}"], 2),
    ("fabric-long-bad-yaml", ["topo", "show", "{longline}"], 2),
    ("xml-option-unknown", ["topo", "show", f"{NCCL_XML}:colour=red"], 2),
    ("xml-nodes-huge", ["topo", "show", f"{NCCL_XML}:nodes=100000"], 2),
    ("nvsmi-nodes-0", ["topo", "show", f"{NVSMI}:nodes=0"], 2),
    ("validate-dup-key", ["topo", "validate", "dgx-h100:nodes=2,nodes=3"], 1),
    ("validate-dev-zero", ["topo", "validate", "/dev/zero"], 1),
    ("validate-huge", ["topo", "validate", "dgx-h100:nodes=100000"], 1),
    ("png-bad-suffix", ["topo", "show", "h100-2x4", "--png", "{tmp}/x.bmpx"], 2),
    ("png-root", ["topo", "show", "h100-2x4", "--png", "/"], 2),
    ("png-directory", ["topo", "show", "h100-2x4", "--png", "{tmp}"], 2),
    ("png-dev-null", ["topo", "show", "h100-2x4", "--png", "/dev/null"], 2),
    ("json-dev-null", [*PLAN, "--json", "/dev/null"], 2),
    ("json-dev-full", [*PLAN, "--json", "/dev/full"], 2),
    ("json-directory", [*PLAN, "--json", "{tmp}"], 2),
    ("json-under-a-file", [*PLAN, "--json", "{file}/x.json"], 2),
    ("json-empty", [*PLAN, "--json", ""], 2),
    ("simulate-json-dev-full", [*SIM, "--json", "/dev/full"], 2),
    ("simulate-png-bad-suffix", [*SIM, "--png", "{tmp}/x.bmpx"], 2),
    ("bench-planner-json-dev-full", ["bench", "planner", "--json", "/dev/full"], 2),
    ("bench-planner-out-dev-null", ["bench", "planner", "--out", "/dev/null"], 2),
    ("bench-planner-out-file", ["bench", "planner", "--out", "{file}"], 2),
    ("bench-planner-repeat-0", ["bench", "planner", "--repeat", "0"], 2),
    ("bench-planner-bytes-0", ["bench", "planner", "--bytes", "0"], 2),
    ("bench-sim-json-dev-null", ["bench", "sim", "--json", "/dev/null"], 2),
    ("bench-sim-ranks-bad", ["bench", "sim", "--ranks", "7"], 2),
    ("bench-paper-out-dev-null", ["bench", "paper", "fig6", "--out", "/dev/null"], 2),
    ("bench-paper-json-dir", ["bench", "paper", "fig6", "--json", "{tmp}"], 2),
    ("bench-dataplane-json-dev-full", ["bench", "dataplane", "--json", "/dev/full"], 2),
    ("bench-dataplane-fabric-ranks", ["bench", "dataplane", "--ranks", "4"], 2),
    ("bench-moe-fabric-ranks", ["bench", "moe", "--quick", "--ranks", "4", "--fabric",
                                "h100-2x4"], 2),
    ("bench-moe-json-dev-full", ["bench", "moe", "--quick", "--json", "/dev/full"], 2),
    ("bench-emulate-out-dev-null", ["bench", "emulate", "--out", "/dev/null"], 2),
    ("bench-emulate-scale-nan", ["bench", "emulate", "--scale", "nan"], 2),
    ("demo-out-dev-null", ["demo", "--out", "/dev/null"], 2),
    ("emulate-prefix-upper", [*EMU, "--prefix", "CEO"], 2),
    ("emulate-scale-0", [*EMU, "--scale", "0"], 2),
    ("emulate-scale-nan", [*EMU, "--scale", "nan"], 2),
    ("emulate-scale-2", [*EMU, "--scale", "2"], 2),
    ("emulate-scale-negative", [*EMU, "--scale", "-1e-4"], 2),
    ("emulate-repeat-0", [*EMU, "--repeat", "0"], 2),
    ("emulate-chunk-0", [*EMU, "--chunk", "0"], 2),
    ("emulate-bytes-1e30", [*EMU, "--bytes", "1e30"], 2),
    ("emulate-json-dev-null", [*EMU, "--json", "/dev/null"], 2),
    ("emulate-fabric-too-big", ["emulate", "run", "--fabric", "dgx-h100:nodes=64"], 2),
    ("emulate-up-prefix-bad", ["emulate", "up", "--prefix", "pw-x"], 2),
    ("emulate-down-prefix-bad", ["emulate", "down", "--prefix", "CEO"], 2),
    ("policy-unknown", [*PLAN, "--policy", "fastest"], 2),
    ("emulate-policy-model-only", [*EMU, "--policy", "multirail"], 2),
    ("unknown-option", [*PLAN, "--colour", "red"], 2),
    ("time-limit-0", [*PLAN, "--time-limit", "0"], 2),
]

_FIGURE = re.compile(r"(?<![\w.:=-])(-\d[\d.,]*|nan|-?inf)(?![\w])", re.IGNORECASE)


@contextlib.contextmanager
def hang_guard(seconds: int) -> Iterator[None]:
    def _hang(signum, frame):
        raise AssertionError(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, _hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def places(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "file").write_text("x")
    (tmp_path / "binary.yaml").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "long.yaml").write_text("format: [" + "x" * 5000 + "\n")
    return {"tmp": str(tmp_path), "file": str(tmp_path / "file"),
            "binary": str(tmp_path / "binary.yaml"), "longline": str(tmp_path / "long.yaml")}


def check_one_error(result, code: int) -> str:
    out = result.output
    assert "Traceback" not in out, out
    assert result.exit_code == code, out
    assert result.exception is None or isinstance(result.exception, SystemExit), out
    errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, out
    # Errors quote at most a short excerpt of a bad file.
    assert len(errors[0]) < 400, errors[0]
    for line in out.splitlines():
        if not line.startswith("error:"):
            assert not _FIGURE.search(line), f"figure in {line!r}"
    return errors[0]


@pytest.mark.parametrize(("argv", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_command_line(argv, code, places, monkeypatch):
    # Whatever work a command would start must not start: a bad option is refused first.
    from pathweave.bench import planner
    from pathweave.emulate import emulator

    def no_work(*a, **k):
        raise AssertionError("the work started before the options were checked")

    monkeypatch.setattr(planner, "run", no_work)
    monkeypatch.setattr(emulator.Emulator, "up", no_work)
    args = [a.format(**places) for a in argv]
    with hang_guard(HANG_S):
        result = runner.invoke(app, args)
    line = check_one_error(result, code)
    if argv[0] == "bench" and argv[1] in ("dataplane", "moe"):
        assert result.output.strip("\n").splitlines() == [line], result.output  # no bar drawn


def test_device_nodes_stay_devices(tmp_path):
    for dev in ("/dev/null", "/dev/full"):
        result = runner.invoke(app, [*PLAN, "--json", dev])
        check_one_error(result, 2)
        assert stat.S_ISCHR(os.stat(dev).st_mode)
    assert not list(Path("/dev").glob(".null.*.tmp")) and not list(Path("/dev").glob(".full.*"))


def test_the_path_written_is_the_path_printed(tmp_path):
    result = runner.invoke(app, ["topo", "show", "h100-2x4", "--png", str(tmp_path / "fab")])
    assert result.exit_code == 0, result.output
    assert f"wrote {tmp_path / 'fab.png'}" in result.output
    assert (tmp_path / "fab.png").read_bytes()[:4] == b"\x89PNG"
    result = runner.invoke(app, [*PLAN, "--json", str(tmp_path / "sub" / "r.json")])
    assert result.exit_code == 0, result.output
    assert f"wrote {tmp_path / 'sub' / 'r.json'}" in result.output


def test_a_failed_write_is_an_error(tmp_path, monkeypatch):
    import errno

    from pathweave import _files

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_files.os, "fsync", full)
    out = tmp_path / "r.json"
    result = runner.invoke(app, [*PLAN, "--json", str(out)])
    line = check_one_error(result, 2)
    assert "No space left" in line
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("source", [NCCL_XML, NVSMI], ids=["nccl-xml", "nvidia-smi"])
def test_topology_files_work_wherever_a_fabric_is_named(source, tmp_path):
    import pathweave as pw

    reader = pw.fabric.from_nccl_xml if source.suffix == ".xml" else pw.fabric.from_nvidia_smi
    want = reader(source, 2)
    spec = f"{source}:nodes=2"
    assert pw.fabric.resolve(spec) == want
    result = runner.invoke(app, ["topo", "show", spec])
    assert result.exit_code == 0, result.output
    assert "note:" in result.output  # what discovery assumed is shown
    assert str(want.num_ranks) in result.output
    result = runner.invoke(app, ["topo", "validate", spec])
    assert result.exit_code == 0 and f"{want.num_links} links" in result.output
    result = runner.invoke(app, ["plan", "-f", spec, "-w", "hotspot:0.5", "-p", "static,mwu",
                                 "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("argv", [
    ["emulate", "up", "--prefix", "pwrb"],
    ["emulate", "run", "--prefix", "pwrb", "--policy", "static"],
    ["emulate", "status"],
    ["emulate", "down", "--prefix", "pwrb"],
    ["bench", "emulate", "--prefix", "pwrb", "--out", "{tmp}/out"],
], ids=["up", "run", "status", "down", "bench-emulate"])
def test_the_emulator_without_root_says_so_in_one_line(argv, places, monkeypatch):
    """Nothing else is printed: no 'emulator up' for an emulator that never came up."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with hang_guard(HANG_S):
        result = runner.invoke(app, [a.format(**places) for a in argv])
    line = check_one_error(result, 2)
    assert "needs root" in line and "uid 1000" in line, line
    assert result.output.strip().splitlines() == [line], result.output


@pytest.mark.parametrize(("spec", "named"), [
    ("hotspot:2", "workload 'hotspot:ratio=2"), ("zipf:-1", "workload 'zipf:alpha=-1"),
    ("moe:tokens=-1,hidden=4", "workload 'moe:tokens=-1,hidden=4'"),
])
def test_a_workload_value_error_names_the_workload(spec, named):
    result = runner.invoke(app, ["plan", "-f", "h100-2x4", "-w", spec, "-p", "static"])
    line = check_one_error(result, 2)
    assert named in line, line


@pytest.mark.parametrize(("env", "named"), [
    ({"PATHWEAVE_FABRIC": "nosuch"}, "PATHWEAVE_FABRIC='nosuch'"),
    ({"PATHWEAVE_FABRIC": "cluster:nodes=2,gpus_per_node=2,node_kind=nvlink-mesh"},
     "PATHWEAVE_FABRIC 'cluster"),
    ({"PATHWEAVE_MULTIPATH": "yes"}, "PATHWEAVE_MULTIPATH='yes'"),
])
def test_bench_dataplane_refuses_a_bad_environment_before_any_rank_starts(env, named,
                                                                          monkeypatch):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with hang_guard(HANG_S):
        result = runner.invoke(app, ["bench", "dataplane", "--quick", "--repeat", "1"])
    line = check_one_error(result, 2)
    assert named in line and "rank 0 failed" not in line, line


@pytest.mark.parametrize("argv", [["demo", "--out", "/proc/pathweave-demo"],
                                  [*PLAN, "--json", "/proc/x.json"]], ids=["demo", "plan"])
def test_an_output_folder_root_cannot_write_is_refused_first(argv):
    """os.access says yes to root even under /proc; the folder is tried before any work."""
    result = runner.invoke(app, argv)
    line = check_one_error(result, 2)
    assert "folder /proc is not writable" in line, line
    assert result.output.strip().splitlines() == [line], result.output
