"""pathweave.distributed on real gloo process groups (4 and 8 local processes).

Every exchange is compared bitwise with ``torch.distributed``'s own
collective on the same inputs. Spawning a job costs time, so each job runs
a batch of checks and returns plain results that the test functions assert
on in the parent.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pathweave as pw
import pathweave.distributed as pwd
from pathweave.runtime.launch import run_local

MESH4 = "cluster:nodes=1,gpus_per_node=4,node_kind=nvlink-mesh"
RAILS4 = "cluster:nodes=2,gpus_per_node=2,node_kind=nvlink-mesh"


# ------------------------------------------------------------- forced plans
def _forced(roles):
    """A policy callable putting each pair's bytes on its first path of one of ``roles``."""
    return functools.partial(pw.plan.pinned, roles=tuple(roles))


def _orch(fabric, policy="mwu", **kw):
    kw.setdefault("enabled", True)
    kw.setdefault("chunk_bytes", 4096)
    kw.setdefault("window", 4)
    kw.setdefault("min_split_bytes", 0)
    kw.setdefault("timeout_s", 60)
    return pw.Orchestrator(fabric=fabric, policy=policy, **kw)


# ------------------------------------------------------------- data helpers
def _rows(ws, seed, scale=200, sparsity=0.25):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, scale, (ws, ws))
    rows[rng.random((ws, ws)) < sparsity] = 0
    rows[int(rng.integers(ws))] = 0  # one rank sends nothing
    return rows


def _tensor(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype in (torch.int8, torch.uint8, torch.int64):
        lo, hi = (-128, 128) if dtype == torch.int8 else (0, 256)
        if dtype == torch.int64:
            lo, hi = -(1 << 40), 1 << 40
        return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)
    return torch.randn(shape, generator=g).to(dtype)


def _reference(out_like, inp, out_splits, in_splits):
    """torch's all_to_all_single; on the byte view where gloo lacks the dtype."""
    ref = torch.full_like(out_like, 0)
    try:
        dist.all_to_all_single(ref, inp, out_splits, in_splits)
        return ref
    except RuntimeError:
        width = int(np.prod(inp.shape[1:], dtype=np.int64))
        rows_out = ref.reshape(ref.shape[0], width).view(torch.uint8)
        rows_in = inp.reshape(inp.shape[0], width).view(torch.uint8)
        dist.all_to_all_single(rows_out, rows_in, out_splits, in_splits)
        return ref


def _same_bits(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def _a2a_check(rank, ws, orch, rows, dtype, trail, seed, async_op=False):
    inp = _tensor(dtype, (int(rows[rank].sum()), *trail), seed * 97 + rank)
    out = torch.zeros((int(rows[:, rank].sum()), *trail), dtype=dtype)
    in_s, out_s = rows[rank].tolist(), rows[:, rank].tolist()
    h = pwd.all_to_all_single(out, inp, out_s, in_s, async_op=async_op, orchestrator=orch)
    if async_op:
        h.wait()
    return _same_bits(out, _reference(out, inp, out_s, in_s))


# --------------------------------------------------------------- 8-rank job
DTYPES = ["float32", "bfloat16", "float16", "int64", "int8", "bool", "uint8", "float8_e4m3fn"]


def job_eight(rank, ws):
    res = {}
    mwu = _orch("h100-2x4")
    # dtypes x shapes x repeated calls with changing splits
    for i, name in enumerate(DTYPES):
        dtype = getattr(torch, name, None)
        if dtype is None:
            continue
        trail = (3,) if i % 2 else (2, 5)
        res[f"dtype {name}"] = all(
            _a2a_check(rank, ws, mwu, _rows(ws, 10 * i + k), dtype, trail, 10 * i + k)
            for k in range(2)
        )
    res["mwu stats"] = mwu.stats.as_dict()
    res["async"] = _a2a_check(rank, ws, mwu, _rows(ws, 77), torch.float32, (4,), 77, True)
    # async direct-only plan: the handle is returned before the bytes arrive
    direct = _orch("h100-2x4", _forced(("direct", "matched")))
    rows = _rows(ws, 5)
    for s in range(ws):
        for d in range(ws):
            if s // 4 != d // 4 and s % 4 != d % 4:
                rows[s, d] = 0
    res["async direct"] = _a2a_check(rank, ws, direct, rows, torch.int64, (2,), 5, True)
    # forced relay-only and remote-rail (drd) plans: forwarding on every call
    for roles in (("relay",), ("drd",), ("rd",), ("dr",)):
        o = _orch("h100-2x4", _forced(roles), chunk_bytes=4096, window=2)
        ok = all(
            _a2a_check(rank, ws, o, _rows(ws, 300 + k, scale=400), torch.float32, (12,), k)
            for k in range(2)
        )
        res[f"forced {roles[0]}"] = (ok, o.stats.bytes_per_path_kind)
    # equal splits (None), non-contiguous tensors
    o = _orch("h100-2x4", _forced(("drd", "relay")))
    inp = _tensor(torch.float32, (ws * 6, 5), rank)
    out = torch.zeros_like(inp)
    pwd.all_to_all_single(out, inp, orchestrator=o)
    ref = torch.zeros_like(inp)
    dist.all_to_all_single(ref, inp)
    res["equal splits"] = _same_bits(out, ref)
    base_in = _tensor(torch.float32, (5, ws * 6), rank + 50)
    base_out = torch.zeros(5, ws * 6)
    pwd.all_to_all_single(base_out.t(), base_in.t(), orchestrator=o)
    ref = torch.zeros(ws * 6, 5)
    dist.all_to_all_single(ref, base_in.t().contiguous())
    res["non-contiguous"] = _same_bits(base_out.t().contiguous(), ref)
    # auto: balanced traffic goes to torch, skewed traffic over many paths
    auto = pw.Orchestrator(fabric="h100-2x4", min_split_bytes=4096, chunk_bytes=1 << 14)
    uni = np.full((ws, ws), 2048)
    np.fill_diagonal(uni, 0)
    ok_uni = _a2a_check(rank, ws, auto, uni, torch.uint8, (4,), 1)
    uni_multi = auto.stats.last_call.multipath
    hot = (pw.traffic.hotspot(ws, bytes_per_rank=1 << 20, ratio=0.9) // 4).astype(np.int64)
    ok_hot = _a2a_check(rank, ws, auto, hot, torch.float32, (), 2)
    hot_multi = auto.stats.last_call.multipath
    ok_hot2 = _a2a_check(rank, ws, auto, hot, torch.float32, (), 3)
    res["auto"] = (ok_uni, uni_multi, ok_hot, hot_multi, ok_hot2, auto.stats.last_call.cached,
                   auto.stats.plans_made)
    # a subgroup: group ranks are not global ranks
    sub = dist.new_group([4, 5, 6, 7])
    if rank >= 4:
        o = _orch(MESH4, _forced(("relay",)), chunk_bytes=4096)
        rows = _rows(4, 31, scale=300)
        me = rank - 4
        inp = _tensor(torch.float32, (int(rows[me].sum()), 12), rank)
        out = torch.zeros(int(rows[:, me].sum()), 12)
        ref = torch.zeros_like(out)
        pwd.all_to_all_single(out, inp, rows[:, me].tolist(), rows[me].tolist(), group=sub,
                              orchestrator=o)
        dist.all_to_all_single(ref, inp, rows[:, me].tolist(), rows[me].tolist(), group=sub)
        res["subgroup"] = (_same_bits(out, ref), o.stats.bytes_per_path_kind.get("relay", 0) > 0)
    else:
        res["subgroup"] = (True, True)
    # the default orchestrator, fabric from PATHWEAVE_FABRIC
    res["default"] = _a2a_check(rank, ws, None, _rows(ws, 9), torch.float32, (2,), 9)
    res["default fabric"] = pwd.default_orchestrator()._state(None).fabric.name
    return res


@pytest.fixture(scope="module")
def eight():
    return run_local(job_eight, 8, env={"PATHWEAVE_FABRIC": "h100-2x4"}, timeout_s=240)


def test_bitwise_equal_to_torch_for_every_dtype_and_shape(eight):
    for rank, res in enumerate(eight):
        bad = [k for k in res if k.startswith("dtype") and not res[k]]
        assert not bad, f"rank {rank}: {bad}"
        assert sum(k.startswith("dtype") for k in res) >= 7


def test_forced_forwarding_plans_match_torch_and_use_their_paths(eight):
    for res in eight:
        for role in ("relay", "drd", "rd", "dr"):
            ok, kinds = res[f"forced {role}"]
            assert ok, role
            assert kinds.get(role, 0) > 0, (role, kinds)
        assert res["equal splits"] and res["non-contiguous"]
    # only relay paths carried bytes under the relay-forced plan (pairs without a
    # relay path keep their first path: cross-node pairs use a rail path)
    assert set(eight[0]["forced relay"][1]) <= {"relay", "matched", "rd", "dr", "drd"}


def test_async_handles(eight):
    for res in eight:
        assert res["async"] and res["async direct"]


def test_subgroup(eight):
    assert all(res["subgroup"] == (True, True) for res in eight)


def test_stats_are_the_same_on_every_rank_and_count_every_byte(eight):
    s0 = eight[0]["mwu stats"]
    for res in eight[1:]:
        assert res["mwu stats"]["bytes_per_path_kind"] == s0["bytes_per_path_kind"]
        assert res["mwu stats"]["bytes_per_link"] == s0["bytes_per_link"]
        assert res["mwu stats"]["calls"] == s0["calls"]
    assert s0["multipath_calls"] == s0["calls"] > 0
    # every byte sent once per path kind; links carry each byte once per hop
    assert sum(s0["bytes_per_path_kind"].values()) == s0["bytes_total"]
    assert sum(s0["bytes_per_link"]) >= 2 * s0["bytes_total"]


def test_auto_falls_back_on_balanced_and_goes_multipath_on_skewed(eight):
    for res in eight:
        ok_uni, uni_multi, ok_hot, hot_multi, ok_hot2, cached, plans = res["auto"]
        assert ok_uni and ok_hot and ok_hot2
        assert (uni_multi, hot_multi) == (False, True)
        assert cached and plans == 2  # the repeated skewed call planned nothing
        assert res["default"] and res["default fabric"] == "h100-2x4"


# ---------------------------------------------------------- bad input job
def _bad_cases(rank, ws, orch):
    """(name, callable) pairs; each breaks the call on exactly one rank."""
    rows = np.full((ws, ws), 3)
    ins = rows[rank].tolist()
    outs = rows[:, rank].tolist()

    def inp(dtype=torch.float32, trail=(2,), n=None):
        return torch.ones((sum(ins) if n is None else n, *trail), dtype=dtype)

    def mk(which):
        def call(out):
            args = {"out": out, "inp": inp(), "outs": outs, "ins": list(ins)}
            which(args)
            return pwd.all_to_all_single(args["out"], args["inp"], args["outs"], args["ins"],
                                         orchestrator=orch)
        return call

    def mismatch(a):
        if rank == 1:
            a["ins"][2] += 1
            a["inp"] = inp(n=sum(a["ins"]))

    def sums(a):
        if rank == 3:
            a["inp"] = inp(n=sum(ins) + 2)

    def negative(a):
        if rank == 0:
            a["ins"][1] = -1

    def dtype(a):
        if rank == 2:
            a["inp"] = inp(torch.float64)
            a["out"] = a["out"].double()

    def trailing(a):
        if rank == 1:
            a["inp"] = inp(trail=(3,))
            a["out"] = torch.zeros(sum(outs), 3)

    def length(a):
        if rank == 2:
            a["outs"] = a["outs"][:-1]

    def not_tensor(a):
        if rank == 2:
            a["inp"] = a["inp"].tolist()

    def uneven(a):
        if rank == 0:
            a["ins"] = None
            a["inp"] = inp(n=ws * 3 + 1)

    return [(f.__name__, mk(f)) for f in (mismatch, sums, negative, dtype, trailing, length,
                                           not_tensor, uneven)]


def job_bad(rank, ws):
    orch = _orch("h100-2x4", _forced(("relay", "drd")))
    out_rows = 3 * ws
    res = {}
    for name, call in _bad_cases(rank, ws, orch):
        out = torch.full((out_rows, 2), 7.0)
        try:
            call(out)
            res[name] = ("no error", "", False)
        except (ValueError, TypeError) as exc:
            untouched = bool((out == 7.0).all())
            res[name] = (type(exc).__name__, str(exc), untouched)
        # the group still works after every refused call
        good = torch.ones(3 * ws, 2) * rank
        got = torch.zeros(3 * ws, 2)
        pwd.all_to_all_single(got, good, orchestrator=orch)
        res[name + " after"] = bool(
            torch.equal(got, torch.arange(ws).repeat_interleave(3)[:, None].float().expand(-1, 2))
        )
    return res


def test_bad_input_raises_the_same_error_on_every_rank_before_data_moves():
    results = run_local(job_bad, 8, timeout_s=120)
    expect = {
        "mismatch": ("ValueError", ["rank 1's input split for rank 2 is 4 rows",
                                    "rank 2's output split for rank 1 is 3 rows"]),
        "sums": ("ValueError", ["rank 3", "add up to 24 rows", "input has 26 rows"]),
        "negative": ("ValueError", ["rank 0", "input_split_sizes[1] = -1"]),
        "dtype": ("TypeError", ["rank 2 has dtype float64 but rank 0 has float32"]),
        "trailing": ("ValueError", ["rank 1's rows have shape (3,) but rank 0's have (2,)"]),
        "length": ("ValueError", ["rank 2", "output_split_sizes has 7 entries, expected 8"]),
        "not_tensor": ("TypeError", ["rank 2", "input must be a torch.Tensor, got list"]),
        "uneven": ("ValueError", ["rank 0", "25 rows, not divisible by the group size 8"]),
    }
    for name, (etype, parts) in expect.items():
        msgs = {res[name][1] for res in results}
        assert len(msgs) == 1, f"{name}: ranks disagree: {msgs}"
        for rank, res in enumerate(results):
            got_type, msg, untouched = res[name]
            assert got_type == etype, (name, rank, got_type, msg)
            for p in parts:
                assert p in msg, (name, msg)
            assert untouched, f"{name}: rank {rank}'s output was written"
            assert res[name + " after"], f"{name}: group broken afterwards on rank {rank}"


# ------------------------------------------------------ batch_isend_irecv
def _p2p_ops(rank, ws, seed, empty_ranks):
    """Random messages, the same list on every rank; ranks in empty_ranks take no part."""
    rng = np.random.default_rng(seed)
    msgs = []
    for _ in range(12):
        s, d = (int(x) for x in rng.choice(ws, 2, replace=False))
        if s in empty_ranks or d in empty_ranks:
            continue
        msgs.append((s, d, int(rng.integers(0, 3000)), int(rng.integers(0, 3))))
    sends, recvs = [], []
    for k, (s, d, n, tag) in enumerate(msgs):
        if rank == s:
            sends.append((d, _tensor(torch.float32, (n,), seed * 1000 + k), tag))
        if rank == d:
            recvs.append((s, n, tag, k))
    return sends, recvs


def job_p2p(rank, ws):
    res = []
    for seed, (orch_kind, empty) in enumerate(
        [("relay", ()), ("drd", (1, 6)), ("mwu", (0,)), ("torch", (2,)), ("relay", tuple(range(8)))]
    ):
        if orch_kind == "torch":
            o = _orch("h100-2x4", enabled=False)
        elif orch_kind == "mwu":
            o = _orch("h100-2x4")
        else:
            o = _orch("h100-2x4", _forced((orch_kind,)), chunk_bytes=4096)
        sends, recvs = _p2p_ops(rank, ws, seed, empty)
        outs = [torch.zeros(n) for _, n, _, _ in recvs]
        ops = [pwd.P2POp(pwd.isend, t, d, tag=tag) for d, t, tag in sends]
        ops += [pwd.P2POp(pwd.irecv, o_, s, tag=tag) for (s, _, tag, _), o_ in zip(recvs, outs,
                                                                                   strict=True)]
        handles = pwd.batch_isend_irecv(ops, orchestrator=o)
        for h in handles:
            h.wait()
        refs = [torch.zeros(n) for _, n, _, _ in recvs]
        rops = [dist.P2POp(dist.isend, t, d, tag=tag) for d, t, tag in sends]
        rops += [dist.P2POp(dist.irecv, r, s, tag=tag) for (s, _, tag, _), r in zip(recvs, refs,
                                                                                   strict=True)]
        if rops:
            for w in dist.batch_isend_irecv(rops):
                w.wait()
        dist.barrier()
        res.append((orch_kind, len(ops), len(handles) == len(ops),
                    all(_same_bits(a, b) for a, b in zip(outs, refs, strict=True)),
                    o.stats.last_call.multipath))
    # one message 0 -> 1 on its relay path via rank 2, which has no op of its own
    o = _orch("h100-2x4", _forced(("relay",)), chunk_bytes=4096)
    payload = _tensor(torch.float32, (5000,), 123)
    got = torch.zeros(5000)
    ops = {0: [pwd.P2POp(pwd.isend, payload, 1)], 1: [pwd.P2POp(pwd.irecv, got, 0)]}
    for h in pwd.batch_isend_irecv(ops.get(rank, []), orchestrator=o):
        h.wait()
    res.append((rank != 1 or _same_bits(got, payload),
                o.stats.bytes_per_path_kind == {"relay": 20000}))
    # mismatched sizes: every rank raises the same ValueError
    o = _orch("h100-2x4")
    ops = []
    if rank == 0:
        ops = [pwd.P2POp(pwd.isend, torch.zeros(5), 1)]
    if rank == 1:
        ops = [pwd.P2POp(pwd.irecv, torch.zeros(6), 0)]
    try:
        pwd.batch_isend_irecv(ops, orchestrator=o)
        res.append("no error")
    except ValueError as exc:
        res.append(str(exc))
    return res


def test_batch_isend_irecv_matches_torch_including_empty_lists():
    results = run_local(job_p2p, 8, timeout_s=120)
    for rank, res in enumerate(results):
        assert res[-2] == (True, True), rank  # the relay took part with an empty list
        for kind, _nops, one_per_op, same, multipath in res[:-2]:
            assert one_per_op and same, (rank, kind)
            assert multipath == (kind != "torch")
        assert res[-1] == ("batch_isend_irecv: message 0 from rank 0 to rank 1 (tag 0): "
                           "rank 0 sends 20 bytes but rank 1 receives 24 bytes")
    # some ranks really had empty lists
    assert any(res[1][1] == 0 for res in results) and all(res[4][1] == 0 for res in results)


# ---------------------------------------------------------------- 4 ranks
def job_four(rank, ws, cases, grouped=False, coalesce=True, min_run=None):
    if min_run is not None:  # runs of this many pieces packed as one 2-D copy
        from pathweave.runtime import executor

        executor._MIN_RUN = min_run
    out = []
    for fabric, roles, seed, dtype, chunk, window in cases:
        policy = "mwu" if roles is None else _forced(roles)
        o = _orch(fabric, policy, chunk_bytes=chunk, window=window)
        if grouped:
            # The NCCL way of posting a round (one batch_isend_irecv group),
            # run on gloo: the per-pair order must hold without tags' help;
            # coalesced, a round's messages to one peer travel as one.
            tr = o._state(None).transport
            tr.grouped_rounds = True
            tr.coalesce = coalesce
        # The same plan again with other bytes: blocking, async (its own
        # staging and scratch), blocking twice (the kept staging, scratch and
        # views of the first call).
        rows = _rows(ws, seed, scale=300)
        ok = all(_a2a_check(rank, ws, o, rows, getattr(torch, dtype), (48,), seed + 1000 * k,
                            async_op=k == 1) for k in range(4))
        out.append((ok, o.stats.bytes_per_path_kind, _merged(o)))
    return out


def _merged(orch):
    """Operations of the orchestrator's schedules that coalesced rounds merge away, the
    merged messages posted as their pieces lie (they abut) and through the pack area, and
    the runs of pieces packed or unpacked as one 2-D copy."""
    from pathweave.runtime.executor import _coalesce, _program

    n = as_they_lie = packed = runs = 0
    for entry in orch._state(None).schedules.values():
        sched = entry[0]
        prog, coalesced = _program(sched), _program(sched, coalesced=True)
        n += len(prog.recvs) + len(prog.sends) - sum(len(r) + len(s)
                                                     for r, s, _, _ in coalesced.coalesced)
        groups, _ = _coalesce(sched.dataflow(), sched.recv_ptr.tolist(),
                              sched.send_ptr.tolist(), sched.num_rounds)
        for g in (g for rnd in groups for g in rnd if len(g[3]) > 1):
            as_they_lie += g[4] is None
            packed += g[4] is not None
        runs += sum(len(pk[2]) + len(up[2]) for _, _, pk, up in coalesced.coalesced)
    return n, as_they_lie, packed, runs


def test_four_ranks_relay_and_rail_forwarding_gloo_and_grouped_rounds_plain_and_coalesced():
    cases = [
        (MESH4, ("relay",), 1, "float32", 4096, 2),
        (MESH4, None, 2, "bfloat16", 16384, 4),
        (RAILS4, ("rd",), 3, "int8", 5000, 3),
        (RAILS4, ("dr",), 4, "float16", 4096, 2),
        (RAILS4, None, 5, "int64", 8192, 4),
    ]
    for grouped, coalesce, min_run in ((False, False, None), (True, False, None),
                                       (True, True, None), (True, True, 2)):
        results = run_local(job_four, 4, (cases, grouped, coalesce, min_run), timeout_s=120)
        for rank, res in enumerate(results):
            for (ok, kinds, _), case in zip(res, cases, strict=True):
                assert ok, (rank, case, grouped, coalesce)
                if case[1] is not None:
                    assert kinds.get(case[1][0], 0) > 0, (case, kinds)
        # the relay cases really sent several operations to one peer as one message,
        # some from (into) pieces that abut, posted as they lie, some through the pack area
        assert sum(r[0][2][0] for r in results) > 0
        for k in (1, 2):
            assert sum(c[2][k] for r in results for c in r) > 0, k
        if min_run is not None:  # ... some runs of pieces as one 2-D copy
            assert sum(c[2][3] for r in results for c in r) > 0


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**20),
    roles=st.sampled_from([None, ("relay",), ("rd", "dr")]),
    chunk=st.integers(4096, 20000),
    window=st.integers(2, 5),
    grouped=st.booleans(),
)
def test_end_to_end_random_splits_and_plans(seed, roles, chunk, window, grouped):
    fabric = MESH4 if roles == ("relay",) else RAILS4
    res = run_local(job_four, 4, ([(fabric, roles, seed, "float32", chunk, window)], grouped),
                    timeout_s=120)
    assert all(r[0][0] for r in res)


# ------------------------------------------------------- given split matrix
def job_p2p_bad(rank, ws):
    """A bad op on one rank: every rank raises its problem, then the group still works."""
    o = _orch(MESH4)
    t = torch.zeros(4)
    cases = {
        "not an op": {2: ["isend"]},
        "bad tag": {1: [pwd.P2POp(pwd.isend, t, 0, tag=-5)]},
        "self peer": {3: [pwd.P2POp(pwd.irecv, t, 3)]},
        "outside": {0: [pwd.P2POp(pwd.isend, t, 1), pwd.P2POp(pwd.isend, t, 9)]},
    }
    res = {}
    for name, ops in cases.items():
        try:
            pwd.batch_isend_irecv(ops.get(rank, []), orchestrator=o)
            res[name] = "no error"
        except (TypeError, ValueError) as exc:
            res[name] = f"{type(exc).__name__}: {exc}"
    got = torch.zeros(4)
    ops = [pwd.P2POp(pwd.isend, torch.full((4,), float(rank)), (rank + 1) % ws),
           pwd.P2POp(pwd.irecv, got, (rank - 1) % ws)]
    for h in pwd.batch_isend_irecv(ops, orchestrator=o):
        h.wait()
    res["after"] = got.tolist() == [float((rank - 1) % ws)] * 4
    return res


def test_a_bad_op_on_one_rank_raises_on_every_rank():
    results = run_local(job_p2p_bad, 4, timeout_s=120)
    expect = {
        "not an op": "TypeError: batch_isend_irecv: rank 2: ops[0] is not a "
                     "torch.distributed.P2POp",
        "bad tag": "ValueError: batch_isend_irecv: rank 1: ops[0] has tag -5; tags must be in "
                   "[0, 2**31)",
        "self peer": "ValueError: batch_isend_irecv: rank 3: ops[0] has itself (rank 3) as its "
                     "peer",
    }
    for res in results:
        for name, msg in expect.items():
            assert res[name] == msg, (name, res[name])
        assert res["outside"].startswith("ValueError: batch_isend_irecv: rank 0: ops[1] ")
        assert res["outside"] == results[0]["outside"]
        assert res["after"]


def _gathered_digests(orch, config=None):
    """Every rank's config digest, gathered as a split_matrix caller's own collective would."""
    mine = torch.tensor([pwd.config_digest(orchestrator=orch, config=config)])
    got = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(got, mine)
    return torch.cat(got).numpy()


def job_split_matrix_config_change(rank, ws):
    """A configuration that changes on one rank only between split_matrix calls: every rank
    raises the same ValueError at once (not CommError at the timeout), with and without
    digests, and the group still works."""
    res = {}
    rows = _rows(ws, 4)
    inp = torch.ones(int(rows[rank].sum()), 2)
    in_s, out_s = rows[rank].tolist(), rows[:, rank].tolist()
    for vouched in (False, True):
        o = _orch(MESH4, timeout_s=30)
        for step, value in enumerate((1, 1, 3 if rank == 2 else 1, 1)):
            config = {"moe.experts": value}
            digests = _gathered_digests(o, config) if vouched else None
            out = torch.full((int(rows[:, rank].sum()), 2), 7.0)
            try:
                pwd.all_to_all_single(out, inp, out_s, in_s, orchestrator=o, split_matrix=rows,
                                      config=config, config_digests=digests)
                res[vouched, step] = "ok" if bool((out == 1.0).all()) else "wrong"
            except Exception as exc:
                res[vouched, step] = (f"{type(exc).__name__}: {exc}", bool((out == 7.0).all()))
    return res


def test_a_config_change_on_one_rank_raises_at_once_everywhere():
    results = run_local(job_split_matrix_config_change, 4, timeout_s=120)
    want = ("ValueError: all_to_all_single: rank 2 uses moe.experts 3 but rank 0 uses 1; "
            "every rank of the group must use the same configuration")
    for res in results:
        for vouched in (False, True):
            assert [res[vouched, s] for s in (0, 1, 3)] == ["ok"] * 3, res
            msg, untouched = res[vouched, 2]
            assert msg.startswith(want) and untouched, (vouched, msg)


def job_split_matrix(rank, ws):
    """``split_matrix=``: the configuration checked by an exchange per call, or by the
    caller's digests without one; same bytes as torch; local checks raise."""
    out = {}
    for (name, policy, enabled), vouched in itertools.product(
        (("relay", _forced(("relay",)), True), ("mwu", "mwu", True), ("torch", "mwu", False)),
        (False, True),
    ):
        o = _orch(MESH4, policy, enabled=enabled, chunk_bytes=4096, window=2)
        digests = _gathered_digests(o) if vouched else None
        tr = o._state(None).transport
        exchanges = []

        def count_exchange(*args, _real=tr.exchange, _seen=exchanges, **kwargs):
            _seen.append(1)
            return _real(*args, **kwargs)

        tr.exchange = count_exchange
        oks = []
        for seed in (1, 2, 2):  # the repeat is served from the cache
            rows = _rows(ws, seed, scale=300)
            inp = _tensor(torch.bfloat16, (int(rows[rank].sum()), 40), seed * 31 + rank)
            res = torch.zeros((int(rows[:, rank].sum()), 40), dtype=torch.bfloat16)
            in_s, out_s = rows[rank].tolist(), rows[:, rank].tolist()
            mat = torch.from_numpy(rows) if seed == 2 else rows
            pwd.all_to_all_single(res, inp, out_s, in_s, orchestrator=o, split_matrix=mat,
                                  config_digests=digests)
            oks.append(_same_bits(res, _reference(res, inp, out_s, in_s)))
        out[name, vouched] = (oks, o.stats.multipath_calls, o.stats.cache_hits, len(exchanges))
    # bad matrices every rank detects on its own: no rank waits for another
    rows = _rows(ws, 3)
    inp = torch.zeros(int(rows[rank].sum()), 2)
    res = torch.zeros(int(rows[:, rank].sum()), 2)
    before = res.clone()
    in_s, out_s = rows[rank].tolist(), rows[:, rank].tolist()
    o = _orch(MESH4)
    errs = []
    diag = rows + np.eye(ws, dtype=np.int64)
    for bad in (rows[:3], -rows - 1, diag, rows.astype(float)):
        try:
            pwd.all_to_all_single(res, inp, out_s, in_s, orchestrator=o, split_matrix=bad)
            errs.append(None)
        except (ValueError, TypeError) as exc:
            errs.append(f"{type(exc).__name__}: {exc}")
    out["errors"] = errs
    out["untouched"] = torch.equal(res, before)
    return out


def test_given_split_matrix_skips_the_exchange_and_checks_locally():
    results = run_local(job_split_matrix, 4, timeout_s=120)
    for rank, res in enumerate(results):
        for key in [k for k in res if isinstance(k, tuple)]:
            name, vouched = key
            oks, multipath, hits, exchanges = res[key]
            assert oks == [True] * 3, (rank, name)
            # digests from the caller's own collective stand for the exchange
            assert exchanges == (0 if vouched else 3), (rank, name, vouched)
            assert multipath == (0 if name == "torch" else 3), (rank, name)
            assert hits >= 1, (rank, name)
        shape, neg, diag, floats = res["errors"]
        assert shape == ("ValueError: all_to_all_single: split_matrix has shape (3, 4), "
                         "expected (4, 4) (group size)")
        assert neg.startswith("ValueError: all_to_all_single: split_matrix[0, 0] = -")
        rows = _rows(4, 3)
        assert diag == (f"ValueError: all_to_all_single: rank {rank}'s input split for rank "
                        f"{rank} is {rows[rank, rank]} rows but split_matrix[{rank}, {rank}] = "
                        f"{rows[rank, rank] + 1}")
        assert floats == "TypeError: all_to_all_single: split_matrix must hold integers, " \
                         "got dtype float64"
        assert res["untouched"]


def job_subgroup_of_the_job_fabric(rank, ws):
    """PATHWEAVE_FABRIC describes the whole job: a subgroup's default orchestrator plans on
    its members' part of it (here one GPU per node: rail paths only), against gloo."""
    members = [1, 3]
    sub = dist.new_group(members)
    if rank not in members:
        return None
    me = members.index(rank)
    rows = np.array([[0, 900], [700, 0]])
    inp = _tensor(torch.float32, (int(rows[me].sum()), 5), 40 + rank)
    outs, ins = rows[:, me].tolist(), rows[me].tolist()
    out, ref = torch.zeros(sum(outs), 5), torch.ones(sum(outs), 5)
    pwd.all_to_all_single(out, inp, outs, ins, group=sub)
    dist.all_to_all_single(ref, inp, outs, ins, group=sub)
    fab = pwd.default_orchestrator(sub)._state(sub).fabric
    return _same_bits(out, ref), fab.num_ranks, fab.num_nodes


def test_a_subgroup_plans_on_its_part_of_the_job_fabric():
    env = {"PATHWEAVE_FABRIC": "cluster:nodes=2,gpus_per_node=2,node_kind=nvlink-mesh"}
    results = run_local(job_subgroup_of_the_job_fabric, 4, timeout_s=120, env=env)
    assert results[0] is None and results[2] is None
    assert results[1] == results[3] == (True, 2, 2)


def job_time_model(rank, ws):
    """The orchestrator's ``model`` is what its planner and its decision predict with."""
    from pathweave.runtime.orchestrator import quantise
    from pathweave.sim import SimModel

    fab = pw.fabric.preset(RAILS4)
    rows = np.array([[0, 3000, 200, 4000], [100, 0, 5000, 300],
                     [2500, 100, 0, 200], [4000, 300, 100, 0]])
    outs, ins = rows[:, rank].tolist(), rows[rank].tolist()
    inp = _tensor(torch.float32, (int(rows[rank].sum()), 256), 60 + rank)
    ref = torch.zeros(sum(outs), 256)
    dist.all_to_all_single(ref, inp, outs, ins)
    q = quantise(rows * 256 * 4)
    out = {}
    # The testbed's fit, and a model where each forwarding GPU costs 50 ms.
    for name, model in (("default", None), ("slow relays", SimModel(relay_setup_s=0.05))):
        o = _orch(fab, policy="mintime", chunk_bytes=4096, min_split_bytes=0, model=model)
        res = torch.zeros_like(ref)
        pwd.all_to_all_single(res, inp, outs, ins, orchestrator=o)
        dec = o._state(None).current
        ref_plan = pw.plan.make(fab, q, "mintime", model=model, chunk_bytes=4096,
                                min_split_bytes=0)
        out[name] = (_same_bits(res, ref), dec.predicted_s,
                     pw.plan.predict_time(ref_plan, model), ref_plan.info["chosen"])
    try:
        _orch(fab, model="testbed")
    except TypeError as exc:
        out["bad"] = str(exc)
    return out


def test_the_orchestrators_time_model_reaches_planner_and_decision():
    results = run_local(job_time_model, 4, timeout_s=120)
    for res in results:
        for name in ("default", "slow relays"):
            ok, decided_s, planned_s, _ = res[name]
            assert ok and decided_s == pytest.approx(planned_s, rel=1e-12), name
        # 50 ms per forwarding GPU: no plan that forwards is predicted faster.
        assert res["slow relays"][1] > res["default"][1]
        assert res["bad"] == "model must be a pathweave.sim.SimModel or None, got str"
    assert len({(r["default"][3], r["slow relays"][3]) for r in results}) == 1


# ------------------------------------------- a destroyed group is let go
def _fake_call(orchestrator, n, group=None):
    """One multi-path call of rank 0 of a fake group of ``n`` (no exchange, no bytes moved)."""
    rows = np.full((n, n), 64, dtype=np.int64)
    np.fill_diagonal(rows, 0)
    send, recv = rows[0].tolist(), rows[:, 0].tolist()
    digests = np.full(n, orchestrator.config_digest(group), dtype=np.int64)
    pwd.all_to_all_single(torch.empty(sum(recv)), torch.zeros(sum(send)), recv, send,
                          group=group, orchestrator=orchestrator, split_matrix=rows,
                          config_digests=digests)


def test_destroy_process_group_frees_the_group_and_a_new_one_gets_a_fresh_state():
    # A group kept alive past destroy_process_group by pathweave keeps its gloo
    # threads running into interpreter exit, where freeing a work that holds
    # Python tensors aborts the process (seen in `torchrun -m pathweave.perf`).
    import gc
    import weakref

    from torch.testing._internal.distributed.fake_pg import FakeStore

    orch = pw.Orchestrator(fabric="h100-2x4", enabled=True, adapt=False)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        _fake_call(orch, 8)
        sub = dist.new_group([0, 1, 2, 3])
        sub_orch = pwd.default_orchestrator(sub)
        sub_orch.fabric = pw.fabric.resolve(MESH4)
        _fake_call(sub_orch, 4, sub)
        world, sub = weakref.ref(dist.group.WORLD), weakref.ref(sub)
        assert orch._state(None).transport.size == 8
    finally:
        dist.destroy_process_group()
    gc.collect()
    assert world() is None and sub() is None, "a destroyed process group is still referenced"
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        orch.fabric = pw.fabric.resolve(MESH4)
        _fake_call(orch, 4)
        assert orch._state(None).transport.size == 4
    finally:
        dist.destroy_process_group()


def _hand_schedule():
    """The hand-made schedule of the two tests below (their docstrings say what it does)."""
    from pathweave.runtime.schedule import STAGING, RankSchedule

    z = np.zeros(0, dtype=np.int64)

    def a(*v):
        return np.array(v, dtype=np.int64)

    return RankSchedule(
        rank=0, num_rounds=2,
        send_round=a(0, 0, 0, 1, 1), send_peer=a(1, 1, 2, 1, 1), send_order=a(0, 1, 0, 2, 3),
        send_buf=a(0, 0, 0, STAGING, STAGING), send_off=a(0, 3, 14, 0, 12),
        send_bytes=a(3, 5, 2, 8, 4),
        recv_round=a(0, 0), recv_peer=a(2, 2), recv_order=a(1, 2), recv_buf=a(STAGING, STAGING),
        recv_off=a(0, 12), recv_bytes=a(8, 4), send_ptr=a(0, 3, 5), recv_ptr=a(0, 2, 2),
        copy_send_buf=z, copy_send_off=z, copy_recv_buf=z, copy_recv_off=z, copy_bytes=z,
        staging_bytes=16, forwards=True, window=2, stream_window=a(2),
        send_stream=a(-1, -1, -1, 0, 0), send_chunk=a(-1, -1, -1, 0, 1),
        recv_stream=a(0, 0), recv_chunk=a(0, 1))


def test_a_ranks_forwards_to_one_peer_go_out_those_that_go_on_first():
    # Rank 6 forwards 4 -> 6 -> 2 (ends at 2, the lower fragment) and 5 -> 6 -> 2 -> 1
    # (goes on to 1) to rank 2 in the same round: the second is posted first, whichever
    # stream's data arrives first (the order pathweave.plan.rounds.pipeline_fill_s charges).
    from pathweave.runtime.executor import _program
    from pathweave.runtime.schedule import Fragments, Segments, build_schedules, path_routes

    fab = pw.fabric.preset("h100-2x4")
    ps = pw.fabric.candidate_paths(fab)
    routes = path_routes(ps)

    def path(r):
        return next(p for p in ps.pair_paths(r[0], r[-1])
                    if routes[p][routes[p] >= 0].tolist() == r)

    D = np.zeros((8, 8), dtype=np.int64)
    D[4, 2], D[5, 1] = 4096, 4096
    paths = [path([4, 6, 2]), path([5, 6, 2, 1])]
    frags = Fragments([4 * 8 + 2, 5 * 8 + 1], [4096, 4096], routes[paths], ps.links[paths])
    sched = build_schedules(Segments.all_to_all(D), frags, chunk_bytes=4096, window=2,
                            whole_streams=True)[6]
    prog = _program(sched)
    fwd = sorted((prog.fwd_seq[j], bool(sched.send_final[j]))
                 for j in range(len(prog.sends)) if prog.fwd_seq[j] >= 0)
    assert fwd == [(0, False), (1, True)]
    assert prog.sends[0][0] == prog.sends[1][0] == 2


#: 0 -> 2 -> 3 (ends at 3) and 1 -> 2 -> 3 -> 4 (goes on to 4), 2048 bytes each.
TURN_ROWS = np.zeros((5, 5), dtype=np.int64)
TURN_ROWS[0, 3] = TURN_ROWS[1, 4] = 2048


def job_turn(rank, ws):
    import time

    from pathweave.runtime.executor import Transport
    from pathweave.runtime.schedule import Fragments, Segments, build_schedules
    from pathweave.traffic.pattern import pattern_bytes

    frags = Fragments([0 * 5 + 3, 1 * 5 + 4], [2048, 2048], [[0, 2, 3, -1], [1, 2, 3, 4]])
    sched = build_schedules(Segments.all_to_all(TURN_ROWS), frags, chunk_bytes=4096, window=2,
                            ranks=[rank], whole_streams=True)[0]
    inp = torch.from_numpy(np.concatenate(
        [pattern_bytes(rank, d, int(TURN_ROWS[rank, d])) for d in range(ws)]))
    out = torch.zeros(int(TURN_ROWS[:, rank].sum()), dtype=torch.uint8)
    from pathweave.runtime import executor

    executor._TURN_WAIT_S = 30.0  # rank 1 is half a second late: wait for it
    transport = Transport()
    pg, posted = transport.process_group, []

    class Recorder:  # the group's send, logged
        def send(self, tensors, peer, tag):
            posted.append((peer, tag))
            return pg.send(tensors, peer, tag)

        def recv(self, tensors, peer, tag):
            return pg.recv(tensors, peer, tag)

    transport.process_group = Recorder()
    if rank == 1:
        time.sleep(0.5)  # its stream reaches rank 2 well after rank 0's
    transport.run(sched, [inp], [out], deadline=time.monotonic() + 60, wait=True).wait()
    want = np.concatenate([pattern_bytes(s, rank, int(TURN_ROWS[s, rank])) for s in range(ws)])
    return bool(np.array_equal(out.numpy(), want)), [t for p, t in posted if p == 3]


def test_a_forward_that_goes_on_waits_for_its_turn_not_for_the_first_data():
    # Rank 2 forwards both streams to rank 3 in the same round. 1 -> 2 -> 3 -> 4 goes on
    # after 3, so it goes out first although rank 1 starts half a second late and
    # 0 -> 2 -> 3 (the lower message order on the pair) is there long before.
    results = run_local(job_turn, 5, timeout_s=120)
    assert all(ok for ok, _ in results)
    tags = results[2][1]
    assert len(tags) == 2 and tags[0] > tags[1], tags


def test_a_programs_views_are_the_schedules_byte_ranges():
    """Each operation's view is exactly its (buffer, offset, bytes) of the schedule.

    Hand-made schedule: a relay receives two messages into staging slots
    0-7 and 12-15 (a gap of 4 between them, none before) and forwards them,
    a rank sends 3 + 5 abutting bytes of its input and 2 after a gap of 6.
    """
    from pathweave.runtime.executor import _program
    from pathweave.runtime.schedule import STAGING

    sched = _hand_schedule()
    prog = _program(sched)
    staging = torch.arange(16, dtype=torch.uint8)
    inp = torch.arange(100, 120, dtype=torch.uint8)
    views = prog.views(staging, [inp], [])
    for ops, tables in ((prog.sends, ("send", sched.send_buf, sched.send_off, sched.send_bytes)),
                        (prog.recvs, ("recv", sched.recv_buf, sched.recv_off, sched.recv_bytes))):
        _, bufs, offs, nbytes = tables
        for (_, _, v), b, off, nb in zip(ops, bufs.tolist(), offs.tolist(), nbytes.tolist(),
                                         strict=True):
            src = staging if b == STAGING else inp
            assert views[v].tolist() == src[off : off + nb].tolist()
            assert views[v].data_ptr() == src.data_ptr() + off  # a view, not a copy
    # Kept views: the same staging again reuses them; other memory gets its own.
    memo = {}
    first = prog.views(staging, [inp], [], memo)
    again = prog.views(staging, [inp.clone()], [], memo)
    other = torch.arange(50, 66, dtype=torch.uint8)
    moved = prog.views(other, [inp], [], memo)
    for (_, _, v), b, off, nb in zip(prog.sends, sched.send_buf.tolist(),
                                     sched.send_off.tolist(), sched.send_bytes.tolist(),
                                     strict=True):
        if b == STAGING:
            assert again[v] is first[v]
            assert moved[v].tolist() == other[off : off + nb].tolist()
        else:
            assert again[v] is not first[v]  # the caller's input: cut afresh every call


def test_a_coalesced_programs_messages_packs_and_unpacks_are_the_schedules_bytes():
    """The hand-made schedule above, coalesced: rank 1's two abutting pieces of the
    input go as one message cut from the input itself; the relay's two staging slots
    (received from 2 in round 0, forwarded to 1 in round 1) go through the pack area.
    Byte values are checked against the schedule's ranges, by hand."""
    from pathweave.runtime.executor import _copy, _program

    sched = _hand_schedule()
    prog = _program(sched, coalesced=True)
    assert prog.pack_bytes == 12 and not prog.recvs and not prog.sends
    staging = torch.arange(16, dtype=torch.uint8)
    inp = torch.arange(100, 120, dtype=torch.uint8)
    pack = torch.zeros(12, dtype=torch.uint8)
    views = prog.views(staging, [inp], [], pack=pack)
    (rv0, sd0, pk0, up0), (rv1, sd1, pk1, up1) = prog.coalesced
    assert [(p, k) for p, k, _ in sd0] == [(1, 0), (2, 0)] and not pk0[0] and not up1[0]
    to1, to2 = (views[v] for _, _, v in sd0)
    assert to1.tolist() == list(range(100, 108)) and to1.data_ptr() == inp.data_ptr()
    assert to2.tolist() == [114, 115]
    # round 0: one message from 2 (orders 1 and 2) into the pack area, then unpacked
    [(peer, order, v)] = rv0
    assert (peer, order) == (2, 1) and views[v].data_ptr() == pack.data_ptr()
    views[v].copy_(torch.arange(200, 212, dtype=torch.uint8))
    _copy(views, up0)
    assert staging.tolist() == [*range(200, 208), 8, 9, 10, 11, *range(208, 212)]
    # round 1: both slots packed and forwarded to 1 as one message (order 2)
    _copy(views, pk1)
    [(peer, order, v)] = sd1
    assert (peer, order) == (1, 2) and not rv1
    assert views[v].tolist() == [*range(200, 208), *range(208, 212)]


def test_a_slots_overlapping_ranges_are_sliced_beside_its_split():
    """_slots: ranges that overlap others (a message whole and in pieces) are cut too."""
    from pathweave.runtime.executor import _Program, _slots

    slot = (0, 0)
    wanted = [(0, 8), (0, 4), (4, 4), (10, 2), (9, 3), (0, 8), (14, 1)]
    slots, index = _slots([(slot, r) for r in wanted])
    prog = _Program(slots, [], [], [], [], [], 0, [], [], [], [], [], [])
    t = torch.arange(16, dtype=torch.uint8)
    views = prog.views(t, [], [])
    assert len(views) == len(set(wanted)) == len(index)
    for o, n in wanted:
        assert views[index[slot, (o, n)]].tolist() == list(range(o, o + n))


def test_a_run_of_equal_pieces_at_one_stride_is_packed_as_one_2d_copy():
    """_piece_copies: 40 pieces of 10 bytes every 100 bytes of one buffer are one run
    (a 2-D view of the buffer and of the pack area, copied in one); a broken stride and
    a short run stay pieces. The copies move the bytes a piece-by-piece pack would."""
    from pathweave.runtime.executor import _MIN_RUN, _copy, _piece_copies, _Program, _slots

    assert _MIN_RUN <= 40
    send = (1, 0)  # a send buffer
    offs = [100 * i for i in range(40)] + [4005, 4100, 4200]  # then a stride of 95, 100
    ops_s = [(send, (o, 10), 3, i) for i, o in enumerate(offs)]
    pieces, at = [], 0
    for _ in offs:
        pieces.append((at, 10))
        at += 10
    group = (False, 3, 0, list(range(len(offs))), (0, at), pieces)
    copies = _piece_copies(group, [], ops_s)
    assert copies[0] == ((send, (0, 40, 10, 100)), ((3, 0), (0, 40, 10, 10)))
    assert [own for own, _ in copies[1:]] == [(send, (o, 10)) for o in offs[40:]]
    assert [pk for _, pk in copies[1:]] == [((3, 0), p) for p in pieces[40:]]
    slots, index = _slots([r for pair in copies for r in pair])
    prog = _Program(slots, [], [], [], [], [], at, [], [], [], [], [], [])
    inp = torch.arange(5000, dtype=torch.int64).to(torch.uint8)
    pack = torch.zeros(at, dtype=torch.uint8)
    views = prog.views(None, [inp], [], pack=pack)
    (own, pk), rest = copies[0], copies[1:]
    _copy(views, ([index[p] for _, p in rest], [index[o] for o, _ in rest],
                  [(index[pk], index[own])]))
    want = torch.cat([inp[o : o + 10] for o in offs])
    assert pack.tolist() == want.tolist()
    # A buffer whose only view is a run (no piece cut by split_with_sizes): unpacked into.
    slots, index = _slots([copies[0][0], copies[0][1]])
    prog = _Program(slots, [], [], [], [], [], 400, [], [], [], [], [], [])
    out = torch.zeros(5000, dtype=torch.uint8)
    views = prog.views(None, [out], [], pack=pack)
    assert len(views) == 2
    _copy(views, ([], [], [(index[copies[0][0]], index[copies[0][1]])]))
    assert torch.equal(out.view(50, 100)[:40, :10].reshape(-1), want[:400])
    assert int(out.count_nonzero()) == int(want[:400].count_nonzero())


# ------------------------------------------------- fed direct messages (gloo)
#: 0 -> 2 through rank 1, which also sends its own bytes to 2 (fed behind the
#: forwards) and to 0 (posted at once: rank 1 forwards nothing to 0).
FED_ROWS = np.array([[0, 0, 3000], [700, 0, 5000], [0, 0, 0]], dtype=np.int64)


def _fed_schedule(rank):
    from pathweave.runtime.schedule import Fragments, Segments, build_schedules

    return build_schedules(
        Segments.all_to_all(FED_ROWS),
        Fragments([2, 3, 5], [3000, 700, 5000], [[0, 1, 2], [1, 0, -1], [1, 2, -1]]),
        chunk_bytes=512,
        window=2,
        ranks=[rank],
        whole_streams=True,
    )[0]


def job_fed(rank, ws):
    import time

    from pathweave.runtime.executor import Transport
    from pathweave.traffic.pattern import pattern_bytes

    sched = _fed_schedule(rank)
    inp = torch.from_numpy(np.concatenate(
        [pattern_bytes(rank, d, int(FED_ROWS[rank, d])) for d in range(ws)]))
    got = []
    for wait in (True, False):
        out = torch.full((int(FED_ROWS[:, rank].sum()),), 0xAB, dtype=torch.uint8)
        h = Transport().run(sched, [inp], [out], deadline=time.monotonic() + 60, wait=wait)
        h.wait()
        got.append(out.numpy().copy())
    return got


def test_fed_direct_messages_go_behind_forwards_and_arrive_whole():
    """Rank 1's direct messages to 2 are fed (one thread, one at a time), its
    message to 0 and every hop into a staging slot are posted at once; every
    byte lands where its source's pattern says, blocking and async."""
    from pathweave.runtime.executor import _program
    from pathweave.runtime.schedule import STAGING
    from pathweave.traffic.pattern import pattern_bytes

    s1 = _fed_schedule(1)
    prog = _program(s1)
    user_to = [[j for j in range(s1.num_sends)
                if s1.send_peer[j] == p and s1.send_buf[j] != STAGING] for p in range(3)]
    assert len(user_to[2]) == 10  # 5000 bytes in 512-byte chunks
    assert prog.fed == [user_to[2]]
    assert sorted(prog.first_sends) == user_to[0]
    # rank 0 forwards nothing: its hops into rank 1's staging go out at once
    p0 = _program(_fed_schedule(0))
    assert p0.fed == [] and len(p0.first_sends) == 6
    results = run_local(job_fed, 3, timeout_s=120)
    for r, got in enumerate(results):
        want = np.concatenate([pattern_bytes(s, r, int(FED_ROWS[s, r])) for s in range(3)])
        for out in got:
            assert np.array_equal(out, want), r
