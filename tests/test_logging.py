"""Log lines (PATHWEAVE_DEBUG, the pathweave.* tree) and the default fabric from the hosts."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist

import pathweave as pw
import pathweave.distributed as pwd
from pathweave import _log
from pathweave.errors import FabricError
from pathweave.runtime import orchestrator as orch_mod
from pathweave.runtime.launch import run_local

ORCH = "pathweave.runtime.orchestrator"


@pytest.fixture
def fake_group():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    yield
    dist.destroy_process_group()


def _messages(caplog, level):
    return [r.getMessage() for r in caplog.records if r.name == ORCH and r.levelno == level]


def test_debug_levels_are_read_in_one_place():
    try:
        for word, level in (("WARN", logging.WARNING), ("info", logging.INFO),
                            ("Trace", _log.TRACE)):
            assert _log.configure({"PATHWEAVE_DEBUG": word}) == level
            assert logging.getLogger("pathweave.runtime").getEffectiveLevel() == level
        assert _log.configure({"PATHWEAVE_DEBUG": "loud"}) == logging.WARNING
        assert _log.configure({}) is None
        assert logging.getLogger("pathweave").level == logging.NOTSET
    finally:
        _log.configure(os.environ)


def test_fabric_decisions_and_timings_are_logged(fake_group, caplog, monkeypatch):
    monkeypatch.delenv("PATHWEAVE_FABRIC", raising=False)
    caplog.set_level(_log.TRACE, logger="pathweave")
    rows = np.full((8, 8), 1 << 16, dtype=np.int64)
    np.fill_diagonal(rows, 0)
    send, recv = rows[0].tolist(), rows[:, 0].tolist()
    inp, out = torch.zeros(sum(send)), torch.zeros(sum(recv))
    for kw in ({"fabric": "h100-2x4"}, {"fabric": "h100-2x4", "enabled": True}):
        orch = pw.Orchestrator(adapt=False, chunk_bytes=1 << 16, **kw)
        digests = np.full(8, orch.config_digest(), dtype=np.int64)
        for _ in range(2):
            pwd.all_to_all_single(out, inp, recv, send, orchestrator=orch, split_matrix=rows,
                                  config_digests=digests)
    info = _messages(caplog, logging.INFO)
    assert info == [
        "fabric h100-2x4 (8 ranks) from the orchestrator's fabric argument",
        "all_to_all_single: torch's collective (small: every pair below min_split_bytes "
        "(1048576 B))",
        "fabric h100-2x4 (8 ranks) from the orchestrator's fabric argument",
        info[3],
    ], info  # each decision once, not once per call
    assert info[3].startswith("all_to_all_single: multi-path plan #1 (predicted ")
    trace = _messages(caplog, _log.TRACE)
    assert len(trace) == 4 and all(f"all_to_all_single {56 * 4 << 16} B " in t for t in trace)
    assert "torch (cached)" in trace[0] and "multi-path" in trace[2] and "meta " in trace[2]


def test_default_fabric_from_the_ranks_per_host(caplog, monkeypatch):
    monkeypatch.delenv("PATHWEAVE_FABRIC", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    caplog.set_level(logging.INFO, logger="pathweave")
    fab = orch_mod.default_fabric(8, hosts=[5] * 4 + [3] * 4)
    assert (fab.num_nodes, fab.gpus_per_node) == (2, 4)
    assert "from no PATHWEAVE_FABRIC: 2 dgx-h100 node(s) of 4 GPUs from 2 host(s) x 4 rank(s)" \
        in _messages(caplog, logging.INFO)[-1]
    # One host standing in for nodes of LOCAL_WORLD_SIZE (tests, the emulator).
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert orch_mod.default_fabric(4, hosts=[5] * 4).num_nodes == 2
    assert orch_mod.default_fabric(4, hosts=[5] * 4, is_world=False).num_nodes == 1
    # A LOCAL_WORLD_SIZE that does not divide a host's ranks: the hosts decide.
    assert orch_mod.default_fabric(6, hosts=[5] * 3 + [3] * 3).gpus_per_node == 3
    with pytest.raises(FabricError, match=r"rank 0's host 2, rank 2's host 1\).*--nproc-per-n"):
        orch_mod.default_fabric(3, hosts=[5, 5, 3])
    with pytest.raises(FabricError, match="rank 2 is on the host of rank 0, rank 1 is not"):
        orch_mod.default_fabric(4, hosts=[5, 3, 5, 3])


def job_default_fabric(rank, ws):
    return pw.Orchestrator().group_fabric().name


def test_default_orchestrator_finds_its_shape_at_init(monkeypatch):
    monkeypatch.delenv("PATHWEAVE_FABRIC", raising=False)
    # run_local's ranks share one host; LOCAL_WORLD_SIZE=2 splits it in two nodes.
    assert run_local(job_default_fabric, 4, timeout_s=120) == ["dgx-h100-1n"] * 4
    assert run_local(job_default_fabric, 4, env={"LOCAL_WORLD_SIZE": "2"},
                     timeout_s=120) == ["dgx-h100-2n"] * 4
