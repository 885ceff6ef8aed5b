"""The ``pathweave`` torch.distributed backend on real gloo jobs.

Jobs start with ``init_process_group("pathweave")`` (through ``run_local``)
and call plain ``torch.distributed`` functions; every result is compared
bitwise with the same call on a gloo group of the same ranks made in the same
job (``new_group(backend="gloo")``), torch's own implementation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

import pathweave.distributed as pwd
from pathweave.errors import PlanError, RankError
from pathweave.fabric.paths import ROLES
from pathweave.plan import DEFAULT_POLICY, policies
from pathweave.runtime import backend as B
from pathweave.runtime.config import Config
from pathweave.runtime.launch import run_local

FORCED = {"PATHWEAVE_MULTIPATH": "on", "PATHWEAVE_FABRIC": "h100-2x4"}
FORCED4 = FORCED | {"PATHWEAVE_FABRIC": "cluster:nodes=2,gpus_per_node=2,node_kind=nvlink-mesh"}
FORWARDED = [r for r in ROLES if r != "direct"]


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and bool(
        torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def _data(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 1 << 62, shape, generator=g, dtype=torch.int64)
    if dtype == torch.bool:
        return (bits & 1).bool()
    width = torch.empty(0, dtype=dtype).element_size()
    raw = bits.reshape(-1, 1).view(torch.uint8)[:, :width].contiguous()
    return raw.view(dtype).reshape(shape)


def _rows(ws, seed, hot=0):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 3000, (ws, ws))
    rows[:, hot] *= 20  # skewed towards one rank: worth forwarding
    return rows


# ------------------------------------------------------------ 8-rank job
def _a2a_single(rank, ws, gloo, seed, dtype, trail, async_op=False):
    rows = _rows(ws, seed, hot=seed % ws)
    inp = _data(dtype, (int(rows[rank].sum()), *trail), seed * 31 + rank)
    outs, ins = rows[:, rank].tolist(), rows[rank].tolist()
    out = torch.zeros((sum(outs), *trail), dtype=dtype)
    ref = torch.ones_like(out)
    w = dist.all_to_all_single(out, inp, outs, ins, async_op=bool(async_op))
    value = None
    if async_op == "future":
        value = w.get_future().wait()  # no wait(): the future is set when the bytes are in
    elif async_op:
        w.wait()
    dist.all_to_all_single(ref, inp, outs, ins, group=gloo)
    if async_op == "future":
        # As torch's gloo work: the future's value is [output]
        ref_value = dist.all_to_all_single(torch.empty_like(ref), inp, outs, ins, group=gloo,
                                           async_op=True).get_future().wait()
        return (len(value) == len(ref_value) == 1 and value[0] is out
                and _same(value[0], ref_value[0]))
    return _same(out, ref)


def _a2a_list(rank, ws, gloo, seed, async_op=False, equal=False):
    """List form; gloo's own ``all_to_all`` needs equal sizes, so unequal ones are checked
    against gloo's point-to-point messages."""
    rows = np.full((ws, ws), 700) if equal else _rows(ws, seed)
    ins = [_data(torch.float32, (int(rows[rank, j]), 2), seed + 9 * rank + j) for j in range(ws)]
    outs = [torch.zeros(int(rows[j, rank]), 2) for j in range(ws)]
    refs = [torch.ones_like(t) for t in outs]
    w = dist.all_to_all(outs, ins, async_op=async_op)
    if async_op:
        w.wait()
    if equal:
        dist.all_to_all(refs, ins, group=gloo)
    else:
        ops = [dist.P2POp(dist.isend, ins[j], j, gloo) for j in range(ws) if j != rank]
        ops += [dist.P2POp(dist.irecv, refs[j], j, gloo) for j in range(ws) if j != rank]
        for wk in dist.batch_isend_irecv(ops):
            wk.wait()
        refs[rank] = ins[rank]
    return all(_same(a, b) for a, b in zip(outs, refs, strict=True))


def _a2a_functional(rank, ws, gloo, seed):
    """torch's functional collective (DTensor, torch.compile): C++ dispatch into the group."""
    import torch.distributed._functional_collectives as fc

    rows = _rows(ws, seed)
    inp = _data(torch.float32, (int(rows[rank].sum()), 3), seed + rank)
    outs, ins = rows[:, rank].tolist(), rows[rank].tolist()
    out = fc.wait_tensor(fc.all_to_all_single(inp, outs, ins, dist.group.WORLD))
    ref = torch.zeros(sum(outs), 3)
    dist.all_to_all_single(ref, inp, outs, ins, group=gloo)
    return _same(out, ref)


def _others(rank, ws, gloo):
    """Every delegated operation against the same one on gloo."""
    res = {}
    x = _data(torch.float32, (5,), rank).abs() % 100
    for name, op in {
        "all_reduce": lambda t, g: dist.all_reduce(t, group=g),
        "broadcast": lambda t, g: dist.broadcast(t, 3, group=g),
    }.items():
        a, b = x.clone(), x.clone()
        op(a, None)
        op(b, gloo)
        res[name] = _same(a, b)
    a = [torch.zeros(5) for _ in range(ws)]
    b = [torch.ones(5) for _ in range(ws)]
    dist.all_gather(a, x)
    dist.all_gather(b, x, group=gloo)
    res["all_gather"] = all(_same(p, q) for p, q in zip(a, b, strict=True))
    big = _data(torch.int64, (ws * 3,), 50 + rank) % 1000
    a, b = torch.zeros(3, dtype=torch.int64), torch.ones(3, dtype=torch.int64)
    dist.reduce_scatter_single(a, big)
    dist.reduce_scatter_single(b, big, group=gloo)
    res["reduce_scatter"] = _same(a, b)
    dist.barrier()
    # point to point on a ring, blocking and batched
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    got = torch.zeros(5)
    if rank % 2:
        dist.send(x, nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(x, nxt)
    res["send/recv"] = _same(got, _data(torch.float32, (5,), prv).abs() % 100)
    got2 = torch.zeros(5)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, nxt),
                                    dist.P2POp(dist.irecv, got2, prv)])
    for w in works:
        w.wait()
    res["batch_isend_irecv"] = _same(got2, got)
    # a subgroup of the backend: delegated ops and its own orchestrator
    sub = dist.new_group([0, 2, 4, 6])
    res["subgroup type"] = type(sub).__name__ if rank % 2 == 0 else "ProcessGroupPathweave"
    if rank % 2 == 0:
        t = torch.ones(2) * rank
        dist.all_reduce(t, group=sub)
        res["subgroup all_reduce"] = t.tolist() == [12.0, 12.0]
        res["subgroup orchestrator"] = pwd.default_orchestrator(sub) is sub.orchestrator
    res.update(_subgroup_a2a(rank, ws))
    return res


def _subgroup_a2a(rank, ws):
    """PATHWEAVE_FABRIC names the 8-rank world. A subgroup whose nodes hold equal numbers
    of members plans on its part of that fabric; one whose nodes differ runs torch's
    collective after one warning. Both against the same call on gloo subgroups."""
    import warnings

    res = {}
    for name, members in (("even", [0, 2, 4, 6]), ("uneven", [1, 2, 3, 4])):
        sub, gsub = dist.new_group(members), dist.new_group(members, backend="gloo")
        if rank not in members:
            continue
        me, n = members.index(rank), len(members)
        rows = _rows(n, 60 + len(name), hot=1)
        inp = _data(torch.float32, (int(rows[me].sum()), 3), 70 + rank)
        outs, ins = rows[:, me].tolist(), rows[me].tolist()
        out, ref = torch.zeros(sum(outs), 3), torch.ones(sum(outs), 3)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(2):
                dist.all_to_all_single(out, inp, outs, ins, group=sub)
        dist.all_to_all_single(ref, inp, outs, ins, group=gsub)
        stats = sub.orchestrator.stats
        res[f"subgroup {name}"] = (
            _same(out, ref), sub.orchestrator.fabric.num_ranks, stats.multipath_calls,
            sorted(stats.bytes_per_path_kind), [str(w.message) for w in seen])
    return res


def job_eight(rank, ws):
    gloo = dist.new_group(backend="gloo")
    orch = pwd.default_orchestrator()
    res = {"orchestrator": (orch.enabled, orch.fabric.name, type(dist.group.WORLD).__name__)}
    cases = [(torch.float32, (3,)), (torch.bfloat16, (2, 2)), (torch.int8, ()), (torch.bool, (4,))]
    for i, (dtype, trail) in enumerate(cases):
        res[f"single {dtype}"] = all(_a2a_single(rank, ws, gloo, 10 * i + k, dtype, trail)
                                     for k in range(2))
    res["single async"] = _a2a_single(rank, ws, gloo, 99, torch.float32, (2,), True)
    res["single async future"] = _a2a_single(rank, ws, gloo, 98, torch.float32, (2,), "future")
    res["list"] = _a2a_list(rank, ws, gloo, 5) and _a2a_list(rank, ws, gloo, 6, equal=True)
    res["list async"] = _a2a_list(rank, ws, gloo, 7, True)
    res["single functional"] = _a2a_functional(rank, ws, gloo, 8)
    res["stats"] = {k: v for k, v in orch.stats.as_dict().items() if k != "last_call"}
    res.update(_others(rank, ws, gloo))
    res["calls after others"] = orch.stats.calls  # delegated ops never reach it
    return res


@pytest.fixture(scope="module")
def eight():
    return run_local(job_eight, 8, timeout_s=180, backend="pathweave", env=FORCED)


def test_plain_all_to_alls_are_bitwise_gloo_and_forwarded(eight):
    for rank, res in enumerate(eight):
        assert res["orchestrator"] == (True, "h100-2x4", "ProcessGroupPathweave")
        for key in [k for k in res if k.startswith(("single", "list"))]:
            assert res[key] is True, (rank, key)
    stats = [r["stats"] for r in eight]
    assert all(s == stats[0] for s in stats[1:]), "stats differ between ranks"
    s = stats[0]
    assert s["calls"] == 14 and s["multipath_calls"] == 14
    forwarded = sum(s["bytes_per_path_kind"].get(k, 0) for k in FORWARDED)
    assert forwarded > 0, s["bytes_per_path_kind"]
    assert "torch" not in s["bytes_per_path_kind"]


def test_every_other_operation_is_gloos(eight):
    for rank, res in enumerate(eight):
        for key in ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "send/recv",
                    "batch_isend_irecv"):
            assert res[key] is True, (rank, key)
        assert res["subgroup type"] == "ProcessGroupPathweave"
        if rank % 2 == 0:
            assert res["subgroup all_reduce"] is True and res["subgroup orchestrator"]
            same, ranks, multipath, kinds, warned = res["subgroup even"]
            assert same and ranks == 4 and multipath == 2 and "torch" not in kinds, res
            assert warned == []
        if rank in (1, 2, 3, 4):
            same, ranks, multipath, kinds, warned = res["subgroup uneven"]
            assert same and ranks == 4 and multipath == 0 and kinds == ["torch"], res
            assert len(warned) == 1 and "ranks [1, 2, 3, 4] of PATHWEAVE_FABRIC='h100-2x4'" in \
                warned[0] and "torch's own collective" in warned[0], warned
        assert res["calls after others"] == res["stats"]["calls"]


# ------------------------------------------------------------- bad input
def _bad(rank, ws, case):
    rows = np.full((ws, ws), 3)
    ins, outs = rows[rank].tolist(), rows[:, rank].tolist()
    inp, out = torch.ones(sum(ins), 2), torch.full((sum(outs), 2), 7.0)
    if case == "mismatch" and rank == 1:
        ins[2] += 1
        inp = torch.ones(sum(ins), 2)
    elif case == "sums" and rank == 3:
        inp = torch.ones(sum(ins) + 2, 2)
    elif case == "dtype" and rank == 2:
        inp, out = inp.double(), out.double()
    elif case == "length" and rank == 2:
        outs = outs[:-1]
    return out, inp, outs, ins


def job_bad(rank, ws):
    res = {}
    for case in ("mismatch", "sums", "dtype", "length"):
        out, inp, outs, ins = _bad(rank, ws, case)
        try:
            dist.all_to_all_single(out, inp, outs, ins)
            res[case] = ("no error", "", False)
        except (ValueError, TypeError) as exc:
            res[case] = (type(exc).__name__, str(exc), bool((out == 7.0).all()))
    good, got = torch.full((ws, 2), float(rank)), torch.zeros(ws, 2)
    dist.all_to_all_single(got, good)
    res["after"] = got[:, 0].tolist() == [float(r) for r in range(ws)]
    return res


def test_bad_input_through_plain_torch_raises_the_same_error_everywhere():
    results = run_local(job_bad, 4, timeout_s=120, backend="pathweave", env=FORCED4)
    expect = {"mismatch": ("ValueError", "rank 1's input split for rank 2 is 4 rows"),
              "sums": ("ValueError", "rank 3"),
              "dtype": ("TypeError", "rank 2 has dtype float64 but rank 0 has float32"),
              "length": ("ValueError", "output_split_sizes has 3 entries, expected 4")}
    for case, (etype, part) in expect.items():
        assert len({r[case][1] for r in results}) == 1, case
        for rank, r in enumerate(results):
            assert r[case][0] == etype and part in r[case][1], (case, rank, r[case])
            assert r[case][2], f"{case}: rank {rank}'s output was written"
    assert all(r["after"] for r in results)


def _bad_list(rank, ws, case):
    ins = [torch.full((2, 3), float(rank)) for _ in range(ws)]
    outs = [torch.full((2, 3), 7.0) for _ in range(ws)]
    if case == "dtype" and rank == 1:
        ins[2] = ins[2].double()
    elif case == "count" and rank == 2:
        outs = outs[:-1]
    elif case == "type" and rank == 3:
        ins[0] = [1.0, 2.0]
    elif case == "container" and rank == 0:
        outs = torch.full((ws, 2, 3), 7.0)
    return outs, ins


def job_bad_list(rank, ws):
    """Bad ``all_to_all`` lists on one rank: every rank raises, nobody waits. torch's own
    ``all_to_all`` checks list types and dtypes itself, on the calling rank only, before
    the backend sees the call: those cases go through pwd."""
    res = {}
    for case, call in (("dtype", pwd.all_to_all), ("count", dist.all_to_all),
                       ("type", pwd.all_to_all), ("container", pwd.all_to_all)):
        outs, ins = _bad_list(rank, ws, case)
        try:
            call(outs, ins)
            res[case] = ("no error", "", False)
        except (ValueError, TypeError) as exc:
            kept = all(bool((t == 7.0).all()) for t in outs if isinstance(t, torch.Tensor))
            res[case] = (type(exc).__name__, str(exc), kept)
    outs = [torch.zeros(2) for _ in range(ws)]
    dist.all_to_all(outs, [torch.full((2,), float(rank)) for _ in range(ws)])
    res["after"] = [t[0].item() for t in outs] == [float(r) for r in range(ws)]
    return res


def test_bad_lists_raise_the_same_error_everywhere():
    results = run_local(job_bad_list, 4, timeout_s=120, backend="pathweave", env=FORCED4)
    expect = {
        "dtype": ("TypeError", "all_to_all: rank 1: input_tensors[2] has dtype float64 but "
                               "input_tensors[0] has float32"),
        "count": ("ValueError", "all_to_all: rank 2: output_tensors has 3 tensors, expected 4"),
        "type": ("TypeError", "all_to_all: rank 3: input_tensors[0] must be a torch.Tensor, "
                              "got list"),
        "container": ("TypeError", "all_to_all: rank 0: output_tensors must be a sequence of "
                                   "tensors, got Tensor"),
    }
    for case, (etype, part) in expect.items():
        assert len({r[case][1] for r in results}) == 1, (case, [r[case] for r in results])
        for rank, r in enumerate(results):
            assert r[case][0] == etype and part in r[case][1], (case, rank, r[case])
            assert r[case][2], f"{case}: rank {rank}'s output was written"
    assert all(r["after"] for r in results)


# -------------------------------------------------------- point to point
def job_pair(rank, ws):
    """Ranks 0 and 1 talk; 2 and 3 talk; nobody else joins (a join would hang)."""
    peer = rank ^ 1
    mine = torch.arange(6, dtype=torch.float32) + 10 * rank
    got, got_i, got_b = torch.zeros(6), torch.zeros(6), torch.zeros(6)
    if rank % 2 == 0:
        pwd.send(mine, peer)
        pwd.recv(got, peer)
    else:
        pwd.recv(got, peer)
        pwd.send(mine, peer)
    for w in (pwd.isend(mine, peer), pwd.irecv(got_i, peer)):
        w.wait()
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer),
                                     dist.P2POp(dist.irecv, got_b, peer)]):
        w.wait()
    expect = torch.arange(6, dtype=torch.float32) + 10 * peer
    return [_same(t, expect) for t in (got, got_i, got_b)]


def test_point_to_point_needs_only_its_two_ranks():
    for res in run_local(job_pair, 4, timeout_s=60, backend="pathweave", env=FORCED4):
        assert res == [True, True, True]


# ---------------------------------------------------------- environment
def test_config_accepts_every_policy_and_multipath_value():
    for name in policies(executable_only=True):
        assert Config.from_env({B.POLICY_ENV: name}).policy == name
    for name in set(policies()) - set(policies(executable_only=True)):
        with pytest.raises(PlanError, match=f"^PATHWEAVE_POLICY={name!r}: policy {name!r}"):
            Config.from_env({B.POLICY_ENV: name})
    for raw, enabled in {"auto": "auto", "ON": True, " off ": False, "": "auto"}.items():
        assert Config.from_env({B.MULTIPATH_ENV: raw}).enabled == enabled
    assert Config.from_env({}) == Config(None, DEFAULT_POLICY, enabled="auto", adapt="auto")


@pytest.mark.parametrize("env, message", [
    ({B.MULTIPATH_ENV: "always"}, "PATHWEAVE_MULTIPATH='always' is not one of auto, on, off"),
    ({B.POLICY_ENV: "fastest"}, "PATHWEAVE_POLICY='fastest': unknown policy 'fastest'"),
    ({"PATHWEAVE_FABRIC": "nosuchfabric"}, "PATHWEAVE_FABRIC='nosuchfabric'"),
])
def test_bad_environment_names_variable_and_value(env, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        Config.from_env(env)


def _noop(rank, ws):
    return rank


def test_bad_environment_fails_init_on_every_rank():
    with pytest.raises(RankError) as info:
        run_local(_noop, 2, timeout_s=60, backend="pathweave",
                  env={B.MULTIPATH_ENV: "sometimes"})
    text = "\n".join(info.value.failures.values())
    assert text.count("PATHWEAVE_MULTIPATH='sometimes' is not one of auto, on, off") == 2


# ------------------------------------------- pathweave.distributed.all_to_all
def job_list_gloo(rank, ws):
    """``pwd.all_to_all`` on a plain gloo job, and a size mismatch in the list form."""
    orch = pwd.Orchestrator(fabric=FORCED4["PATHWEAVE_FABRIC"], enabled=True,
                            min_split_bytes=0, chunk_bytes=4096)
    ins = [_data(torch.int64, (3 + rank + j, 2), 40 + 7 * rank + j) for j in range(ws)]
    outs = [torch.zeros(3 + j + rank, 2, dtype=torch.int64) for j in range(ws)]
    pwd.all_to_all(outs, ins, orchestrator=orch)
    refs = [torch.ones_like(t) for t in outs]
    ops = [dist.P2POp(dist.isend, ins[j], j) for j in range(ws) if j != rank]
    ops += [dist.P2POp(dist.irecv, refs[j], j) for j in range(ws) if j != rank]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    refs[rank] = ins[rank]
    same = all(_same(a, b) for a, b in zip(outs, refs, strict=True))
    if rank == 2:
        outs[0] = torch.zeros(1, 2, dtype=torch.int64)  # expects 1 row, rank 0 sends 5
    try:
        pwd.all_to_all(outs, ins, orchestrator=orch)
        err = "no error"
    except ValueError as exc:
        err = str(exc)
    return same, err, orch.stats.multipath_calls


def test_list_all_to_all_on_gloo_and_its_errors():
    results = run_local(job_list_gloo, 4, timeout_s=60)
    assert {r[1] for r in results} != {"no error"}
    assert len({r[1] for r in results}) == 1, results
    assert "rank 2" in results[0][1]
    for same, _, multipath in results:
        assert same and multipath == 1
