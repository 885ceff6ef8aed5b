"""``bench hostcost``: its records on torch's fake group and its PASS/MISS lines."""

from __future__ import annotations

import math

import pytest
import torch.distributed as dist

from pathweave.bench import hostcost


def _record(n, pw_s, torch_s, noop_s, issue="rounds"):
    return {"ranks": n, "issue": issue, "pathweave_s": pw_s, "torch_s": torch_s,
            "pathweave_noop_s": noop_s, "floor_s": 0.0, "ops": 10}


def test_checks_hold_each_target_against_its_own_number():
    records = [
        _record(8, 99e-6, 50e-6, 80e-6),         # under 100 us: PASS both
        _record(64, 2e-3, 3e-3, 1e-3),           # no time target at 64; 2 ms < torch's 3 ms
        _record(256, 1.5e-3, 1e-3, 0.9e-3),      # over 1 ms and over torch; no-op line passes
        _record(256, 9.0, 9.0, 9.0, "streams"),  # informative only
    ]
    got = {c.name: c.passed for c in hostcost.checks(records)}
    assert got == {"floor_8": None, "host_8": True, "host_noop_8": True,
                   "floor_64": None, "vs_torch_64": True,
                   "floor_256": None, "host_256": False, "host_noop_256": True,
                   "vs_torch_256": False, "streams_256": None,
                   # 1024 ranks: (meta_width + plane words) * 8 bytes, from the protocol
                   "metadata": hostcost.metadata_bytes(1024) <= 16 << 10}


@pytest.mark.parametrize("issue", hostcost.ISSUES)
def test_a_measured_call_runs_the_multipath_executor_and_times_both_calls(issue):
    rec = hostcost.measure(8, repeats=2, issue=issue)
    assert not dist.is_initialized()  # the fake group is gone again
    assert rec["multipath"] and rec["ranks"] == 8 and rec["issue"] == issue
    # rank 1 sends 16 MiB to rank 0 and 1 MiB to each of the six others
    assert rec["send_bytes"] == (16 + 6) << 20
    assert rec["ops"] > 0 and rec["rounds"] >= 1
    # NCCL's way coalesces a round's operations with one peer: rank 1 sends the
    # rail peer of the other node its chunks for that node's GPUs in one message.
    if issue == "rounds":
        assert rec["ops"] < rec["schedule_ops"]
    else:
        assert rec["ops"] == rec["schedule_ops"]
    for key in ("pathweave_s", "torch_s", "pathweave_noop_s", "floor_s"):
        assert math.isfinite(rec[key]) and rec[key] >= 0, key


def test_a_bad_way_of_posting_is_named():
    with pytest.raises(ValueError, match="'batched'"):
        hostcost.measure(8, repeats=1, issue="batched")
