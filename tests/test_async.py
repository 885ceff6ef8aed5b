"""``async_op=True`` on the multi-path data plane: the call returns before any transfer.

On 4 gloo ranks, with plans that forward (a relay through a third GPU, a
rail hop then an NVLink hop) and ``split_matrix=`` given (no metadata
exchange), bytes are compared with torch's own
``all_to_all_single``, and ``Work.get_future()`` with the future of torch's
own work. That the call returns before any transfer is checked by order,
not by clock: rank 0 joins the exchange only after rank 1 tells it, by a
plain ``torch.distributed.send`` made after rank 1's call returned. A call
that moved bytes (or forwarded) before returning would wait for rank 0
forever, and run into its timeout.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.distributed as dist

import pathweave as pw
import pathweave.distributed as pwd
from pathweave.errors import CommError
from pathweave.runtime.launch import run_local

MESH4 = "cluster:nodes=1,gpus_per_node=4,node_kind=nvlink-mesh"
RAILS4 = "cluster:nodes=2,gpus_per_node=2,node_kind=nvlink-mesh"
CASES = [(MESH4, ("relay",)), (RAILS4, ("rd",)), (RAILS4, None)]
GO_TAG = 4242


def _orch(fabric, roles):
    policy = "mwu" if roles is None else functools.partial(pw.plan.pinned, roles=roles)
    return pw.Orchestrator(fabric=fabric, policy=policy, enabled=True, chunk_bytes=4096,
                           window=2, min_split_bytes=0, timeout_s=30)


def _rows(ws, seed):
    rng = np.random.default_rng(seed)
    rows = rng.integers(50, 400, (ws, ws))
    rows[1:, 0] *= 4  # a hot column: forwarding pays
    return rows


def job_async(rank, ws, grouped):
    out = []
    for i, (fabric, roles) in enumerate(CASES):
        orch = _orch(fabric, roles)
        orch._state(None).transport.grouped_rounds = grouped
        rows = _rows(ws, i)
        in_s, out_s = rows[rank].tolist(), rows[:, rank].tolist()
        g = torch.Generator().manual_seed(100 * i + rank)
        inp = torch.randn(sum(in_s), 24, generator=g)
        got = torch.full((sum(out_s), 24), float("nan"))
        go = torch.zeros(1)
        if rank == 0:
            dist.recv(go, 1, tag=GO_TAG)  # rank 1's call has returned
        # split_matrix and config_digests (as the MoE layer passes them): no
        # metadata exchange, whose collective would wait for rank 0 too.
        digests = np.full(ws, orch.config_digest(), dtype=np.int64)
        work = pwd.all_to_all_single(got, inp, out_s, in_s, async_op=True, orchestrator=orch,
                                     split_matrix=rows, config_digests=digests)
        if rank == 1:
            dist.send(go, 0, tag=GO_TAG)
        fut = work.get_future()
        chained = fut.then(lambda f: f.value()[0].sum())
        assert work.wait() is True
        completed = work.is_completed()
        value = fut.wait()
        ref = torch.empty_like(got)
        ref_value = dist.all_to_all_single(ref, inp, out_s, in_s, async_op=True).get_future().wait()
        out.append({
            "bytes equal": torch.equal(got.view(torch.uint8), ref.view(torch.uint8)),
            "completed": completed,
            "future is [output]": len(value) == len(ref_value) == 1 and value[0] is got,
            "future bytes": torch.equal(value[0].view(torch.uint8),
                                        ref_value[0].view(torch.uint8)),
            "chained": bool(chained.wait() == got.sum()),
            "multipath": orch.stats.last_call.multipath,
            "forwarded": sum(v for k, v in orch.stats.bytes_per_path_kind.items()
                             if k not in ("direct", "torch")),
        })
    return out


def _check(results):
    for rank, res in enumerate(results):
        for case, r in zip(CASES, res, strict=True):
            assert r.pop("multipath"), (rank, case)
            forwarded = r.pop("forwarded")
            if case[1] is not None:
                assert forwarded > 0, (rank, case)
            assert all(r.values()), (rank, case, r)


def test_async_returns_before_any_transfer_and_its_future_matches_torchs():
    _check(run_local(job_async, 4, (False,), timeout_s=180))


def test_async_with_rounds_posted_as_groups():
    # The NCCL way of posting, run on gloo: the worker posts round by round.
    _check(run_local(job_async, 4, (True,), timeout_s=180))


def job_async_failure(rank, ws):
    orch = _orch(MESH4, ("relay",))
    orch.timeout_s = 3.0
    rows = _rows(ws, 7)
    in_s, out_s = rows[rank].tolist(), rows[:, rank].tolist()
    got = torch.zeros(sum(out_s), 4)
    digests = np.full(ws, orch.config_digest(), dtype=np.int64)  # every rank: a collective
    if rank == 3:
        return "skipped the call"  # its peers' receives never complete
    work = pwd.all_to_all_single(got, torch.ones(sum(in_s), 4), out_s, in_s, async_op=True,
                                 orchestrator=orch, split_matrix=rows, config_digests=digests)
    fut = work.get_future()
    try:
        fut.wait()
        future = "no error"
    except Exception as exc:  # torch wraps the exception of a future's callback
        future = type(exc).__name__
    try:
        work.wait()
        waited = "no error"
    except CommError:
        waited = "CommError"
    return future, waited, work.is_completed(), bool(torch.all(got == 0))


def test_an_async_call_that_fails_raises_in_wait_and_in_its_future():
    res = run_local(job_async_failure, 4, timeout_s=120)
    assert res[3] == "skipped the call"
    for future, waited, completed, untouched in res[:3]:
        assert future != "no error" and waited == "CommError" and completed and untouched
