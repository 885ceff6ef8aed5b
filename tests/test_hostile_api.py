"""Hostile input through the API: the size boundary, input and output files, spec parsers.

Property tests (hypothesis) feed the spec parsers and the topology loaders
arbitrary text and bytes: each either returns a valid result or raises
pathweave's own error (a ``ValueError`` subclass) naming the problem, never
anything else.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pathweave as pw
from pathweave import _files
from pathweave.errors import (
    FabricError,
    FabricFileError,
    OutputFileError,
    PathweaveError,
    WorkloadError,
)
from pathweave.fabric import _limits
from pathweave.fabric.presets import PRESETS
from pathweave.traffic.generators import MAX_TOTAL_BYTES

INT64_MAX = 2**63 - 1


def test_limits_name_value_and_limit():
    with pytest.raises(WorkloadError, match=r"bytes 1e30 exceeds the int64 byte range"):
        pw.traffic.parse_size("1e30", what="bytes")
    with pytest.raises(WorkloadError, match=r"x 8 ranks exceeds the int64 byte range"):
        pw.traffic.uniform(8, 2**61)
    with pytest.raises(FabricError, match=r"dgx-h100:nodes=100000 would need about [\d,.e+]+ GB "
                                          r"for candidate paths .* the limit on this machine is"):
        pw.fabric.preset("dgx-h100:nodes=100000")
    with pytest.raises(WorkloadError, match=r"tokens=99999999999 .* exceed the limit"):
        pw.traffic.moe(8, tokens=99_999_999_999, hidden=4096)
    with pytest.raises(FabricError, match="nodes given twice"):
        pw.fabric.resolve("dgx-h100:nodes=2,nodes=3")


def test_sizes_at_the_int64_edge():
    assert pw.traffic.parse_size(str(INT64_MAX - 1023)) <= INT64_MAX
    # The largest payload 8 ranks may carry in all is accepted and sums without overflow.
    d = pw.traffic.uniform(8, MAX_TOTAL_BYTES // 8 // 2)
    assert np.isfinite(d).all() and d.sum() < INT64_MAX


def test_path_estimate_matches_compiled_path_sets():
    """The estimate the size check uses, against real path counts (within 15 %)."""
    for spec in ("h100-2x4", "dgx-h100:nodes=4", "cluster:nodes=4,spines=2",
                 "cluster:nodes=3,gpus_per_node=4,node_kind=nvlink-mesh"):
        fab = pw.fabric.preset(spec)
        spines = int(fab.vertices_of_kind(pw.fabric.VertexKind.SPINE).size)
        est = _limits.estimate_paths(fab.num_nodes, fab.gpus_per_node, len(fab.rails), spines,
                                     relays=fab.nvlink_kind != "nvswitch")
        got = pw.fabric.compile_paths(fab).num_paths
        assert got * 0.85 <= est <= got * 1.15, (spec, est, got)


def test_candidate_paths_checks_memory_before_building(monkeypatch):
    fab = pw.fabric.preset("dgx-h100:nodes=4")
    monkeypatch.setenv(_limits.MEMORY_ENV, "0.001")  # 1 MB
    with pytest.raises(FabricError, match=r"would need about .* the limit on this machine is 1 MB"):
        pw.fabric.candidate_paths(fab)
    assert "_path_cache" not in fab.__dict__ or not fab.__dict__["_path_cache"]


def test_input_files_must_be_regular(tmp_path):
    for bad in ("/dev/zero", str(tmp_path)):
        with pytest.raises(FabricFileError, match="not a regular file"):
            pw.fabric.resolve(bad)
        with pytest.raises(FabricFileError, match="not a regular file"):
            pw.fabric.load(bad)
    with pytest.raises(FabricFileError, match="not a regular file"):
        pw.fabric.from_nccl_xml(Path("/dev/zero"))


def test_topology_kind_is_read_from_content(tmp_path):
    xml = Path("/work/shared/fixtures/topology/azure_ndv5_h100_nccl-topo.xml")
    if not xml.exists():
        pytest.skip("topology fixtures not present")
    renamed = tmp_path / "topology.yaml"  # a misleading suffix
    renamed.write_bytes(xml.read_bytes())
    assert pw.fabric.resolve(renamed) == pw.fabric.from_nccl_xml(xml)
    saved = pw.fabric.save(pw.fabric.preset("h100-2x4"), tmp_path / "f.json")
    with pytest.raises(FabricError, match="option 'nodes' does not apply to a fabric file"):
        pw.fabric.resolve(f"{saved}:nodes=2")


def test_bad_file_errors_quote_a_short_excerpt(tmp_path):
    bad = tmp_path / "big.yaml"
    bad.write_text("vertices: " + "x" * 10_000 + "\n")
    with pytest.raises(FabricFileError) as info:
        pw.fabric.resolve(bad)
    assert len(str(info.value)) < 300


@pytest.mark.parametrize("target", ["/dev/null", "/dev/full"])
def test_writer_refuses_devices(target):
    with pytest.raises(OutputFileError, match="not a regular file"):
        _files.atomic_write(target, b"x")
    assert stat.S_ISCHR(os.stat(target).st_mode)


def test_writer_writes_through_a_symlink(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert _files.atomic_write(link, b"new") == real
    assert link.is_symlink() and real.read_text() == "new"


# ------------------------------------------------------------ properties
_SETTINGS = settings(max_examples=150, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
_VALUE = st.one_of(
    st.integers(-5, 70).map(str),
    st.sampled_from(["1e9", "1e30", "nan", "inf", "-1", "0", "2.5", "", "x", "nvswitch",
                     "nvlink-mesh", "pcie", "1e-300"]),
)
_KEYS = st.sampled_from(["nodes", "gpus_per_node", "rails", "spines", "node_kind", "nic_Bps",
                         "nvlink_Bps", "name", "colour", ""])


@_SETTINGS
@given(st.text(max_size=30))
def test_parse_size_returns_a_valid_size_or_raises_workload_error(text):
    try:
        v = pw.traffic.parse_size(text)
    except WorkloadError:
        return
    assert math.isfinite(v) and 0 <= v <= INT64_MAX


@_SETTINGS
@given(st.sampled_from(list(PRESETS)),
       st.lists(st.tuples(_KEYS, _VALUE), max_size=4))
def test_fabric_specs_build_or_raise_fabric_error(base, items):
    spec = base + (":" + ",".join(f"{k}={v}" for k, v in items) if items else "")
    try:
        fab = pw.fabric.resolve(spec)
    except FabricError:
        return
    assert fab.num_ranks >= 1 and np.isfinite(fab.capacity_Bps).all()
    assert (fab.capacity_Bps > 0).all()


@_SETTINGS
@given(st.sampled_from(["uniform", "hotspot", "zipf", "many_to_few", "moe", "stencil", "nope"]),
       st.lists(st.tuples(st.sampled_from(["ratio", "bytes", "tokens", "hidden", "top_k", "s",
                                           "sinks", "dims", "seed", "skew"]), _VALUE),
                max_size=3))
def test_workload_specs_give_valid_demand_or_raise_workload_error(name, items):
    spec = name + (":" + ",".join(f"{k}={v}" for k, v in items) if items else "")
    try:
        d = pw.traffic.parse_workload(spec, 8, bytes_per_rank=1 << 20)
    except WorkloadError:
        return
    assert np.isfinite(d).all() and (d >= 0).all() and d.sum() <= INT64_MAX


@_SETTINGS
@given(st.binary(max_size=400) | st.text(max_size=400).map(str.encode)
       | st.sampled_from([b"<system>", b"<system><gpu/></system>", b"\tGPU0\tGPU1\nGPU0\t X\n",
                          b"format: pathweave-fabric\nversion: 1\n", b"{}", b"[]",
                          b"<!DOCTYPE x>"]))
def test_topology_files_load_or_raise_fabric_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("topo") / "f"
    path.write_bytes(data)
    try:
        fab = pw.fabric.resolve(path)
    except FabricError:
        return
    except PathweaveError as exc:  # pragma: no cover - the message names the bug
        pytest.fail(f"{type(exc).__name__} instead of FabricError: {exc}")
    assert fab.num_ranks >= 1
