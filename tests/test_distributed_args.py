"""No silent wrong results: argument forms, output views and rank-consistent configuration.

Every exchange is compared bitwise with ``torch.distributed.all_to_all_single``
on dense copies of the same arguments, on every path the orchestrator can
take (each value of ``enabled``), on 4 and 8 gloo ranks. Outputs that are
views must get torch's result without any other element of their base
changing; a configuration that differs between ranks must raise the same
error on every rank before any byte moves.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.distributed as dist

import pathweave as pw
import pathweave.distributed as pwd
from pathweave.runtime import _validate as V
from pathweave.runtime.launch import run_local

#: Every value of ``Orchestrator(enabled=...)``: torch's path, the automatic choice, multi-path.
ENABLED = ("auto", True, False)
FABRICS = {4: "cluster:nodes=1,gpus_per_node=4,node_kind=nvlink-mesh", 8: "h100-2x4"}
OTHER_FABRICS = {4: "cluster:nodes=2,gpus_per_node=2,node_kind=nvlink-mesh",
                 8: "dgx-h100:nodes=1,gpus_per_node=8"}
SENTINEL = -7.0


def _orch(ws, enabled, **kw):
    kw.setdefault("chunk_bytes", 4096)
    kw.setdefault("min_split_bytes", 0)
    kw.setdefault("timeout_s", 60)
    kw.setdefault("policy", "mwu")
    return pw.Orchestrator(fabric=kw.pop("fabric", FABRICS[ws]), enabled=enabled, **kw)


def _rows(ws, seed, scale=300):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, scale, (ws, ws))
    rows[int(rng.integers(ws))] = 0
    return rows


def _reference(out_shape, dtype, inp, out_s, in_s):
    """torch's own result on dense arguments (byte views: gloo lacks some dtypes)."""
    ref = torch.zeros(out_shape, dtype=dtype)
    src = inp.resolve_conj().resolve_neg().clone(memory_format=torch.contiguous_format)
    row_bytes = int(np.prod(src.shape[1:], dtype=np.int64)) * src.element_size()
    dist.all_to_all_single(ref.reshape(-1).view(torch.uint8), src.reshape(-1).view(torch.uint8),
                           [int(x) * row_bytes for x in out_s],
                           [int(x) * row_bytes for x in in_s])
    return ref


def _same(a, b):
    # clone: contiguous() returns a one-element stride-2 view as it is
    a, b = (t.resolve_conj().clone(memory_format=torch.contiguous_format) for t in (a, b))
    return a.dtype == b.dtype and a.shape == b.shape and bool(
        torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def _forms(rank, ws, seed):
    """(name, output base, output view, input, out splits, in splits) per argument form."""
    rows = _rows(ws, seed)
    in_s, out_s = rows[rank].tolist(), rows[:, rank].tolist()
    nin, nout = sum(in_s), sum(out_s)
    g = torch.Generator().manual_seed(seed * 131 + rank)
    data = torch.randn(nin, 16, 2, generator=g)
    forms = []
    # the output is every other column of a wider tensor
    base = torch.full((nout, 16, 2), SENTINEL)
    forms.append(("strided output", base, base[:, ::2], data[:, :8].contiguous(), out_s, in_s))
    # the input is a column slice; splits as tensors
    base = torch.full((nout, 8), SENTINEL)
    forms.append(("strided input, tensor splits", base, base, data[:, :8, 0],
                  torch.tensor(out_s), torch.tensor(in_s)))
    # a transposed output, numpy splits
    base = torch.full((10, nout), SENTINEL)
    forms.append(("transposed output, numpy splits", base, base.t(), data[:, :10, 1],
                  np.array(out_s), np.array(in_s)))
    # a conjugate view: its memory holds other values than it shows
    cplx = torch.complex(data[:, :4, 0], data[:, :4, 1]).conj()
    base = torch.full((nout, 4), SENTINEL, dtype=torch.complex64)
    forms.append(("conjugate input", base, base, cplx, out_s, in_s))
    # bool and bfloat16 through the strided forms
    base = torch.zeros((nout, 6), dtype=torch.bool)
    forms.append(("bool strided", base, base[:, ::2], data[:, :3, 0] > 0, out_s, in_s))
    base = torch.full((nout, 2, 3), SENTINEL, dtype=torch.bfloat16)
    forms.append(("bfloat16 strided", base, base[:, 1], data.to(torch.bfloat16)[:, :3, 1],
                  out_s, in_s))
    # one element each way, a view with stride 2 that reports is_contiguous()
    one_in = torch.arange(3.0)[1::2] + 10 * rank
    base = torch.full((3,), SENTINEL)
    send = [1 if d == (rank + 1) % ws else 0 for d in range(ws)]
    recv = [1 if s == (rank - 1) % ws else 0 for s in range(ws)]
    forms.append(("one element, stride 2", base, base[1::2], one_in, recv, send))
    return forms


def job_forms(rank, ws, enabled_values):
    res = {}
    for enabled in enabled_values:
        orch = _orch(ws, enabled)
        for seed, (name, base, out, inp, out_s, in_s) in enumerate(_forms(rank, ws, 3)):
            before = base.clone()
            outside = torch.ones_like(base, dtype=torch.bool)
            outside_view = outside.as_strided(out.shape, out.stride(),
                                              out.storage_offset() - base.storage_offset())
            outside_view.fill_(False)
            pwd.all_to_all_single(out, inp, out_s, in_s, orchestrator=orch)
            ref = _reference(out.shape, out.dtype, inp, out_s, in_s)
            res[(enabled, name)] = (
                _same(out, ref),
                bool(torch.equal(base[outside], before[outside])),
                orch.stats.last_call.multipath,
                seed,
            )
        # async: the output is written when wait() returns
        base = torch.full((4 * ws, 6), SENTINEL)
        inp = torch.randn(4 * ws, 3)
        h = pwd.all_to_all_single(base[:, ::2], inp, async_op=True, orchestrator=orch)
        h.wait()
        ref = _reference((4 * ws, 3), torch.float32, inp, [4] * ws, [4] * ws)
        res[(enabled, "async strided")] = (_same(base[:, ::2], ref),
                                          bool((base[:, 1::2] == SENTINEL).all()), None, 0)
    return res


@pytest.mark.parametrize("ws", [4, 8])
def test_every_argument_form_gives_torchs_result_on_every_path(ws):
    results = run_local(job_forms, ws, (ENABLED,), timeout_s=240)
    for rank, res in enumerate(results):
        for (enabled, name), (same, outside_kept, multipath, _) in res.items():
            assert same, f"rank {rank}, enabled={enabled}: {name} differs from torch"
            assert outside_kept, f"rank {rank}, enabled={enabled}: {name} wrote outside its view"
            if multipath is not None and enabled is False:
                assert not multipath
        # the forced path really was multi-path
        assert any(res[(True, n)][2] for n in ("strided output", "conjugate input"))


# ------------------------------------------------------- configuration
def _changed_capacity(spec):
    """The fabric of ``spec`` with one link 1% slower, under the same name."""
    d = pw.fabric.to_dict(pw.fabric.resolve(spec))
    d["links"][0]["capacity_Bps"] = float(d["links"][0]["capacity_Bps"]) * 0.99
    return pw.fabric.from_dict(d)


def _config_cases(ws):
    """(setting, rank 0's options, the last rank's options, words in the message)."""
    fab0 = pw.fabric.resolve(FABRICS[ws])
    fab1 = pw.fabric.resolve(OTHER_FABRICS[ws])
    return [
        ("fabric", {}, {"fabric": OTHER_FABRICS[ws]},
         [f"uses fabric {fab1.name} (content", f"but rank 0 uses {fab0.name} (content"]),
        ("fabric content", {}, {"fabric": _changed_capacity(FABRICS[ws])},
         [f"uses fabric {fab0.name} (content", f"but rank 0 uses {fab0.name} (content"]),
        ("policy", {}, {"policy": "static"}, ["uses policy static but rank 0 uses mwu"]),
        ("policy callable", {"policy": functools.partial(pw.plan.pinned, roles=("relay",))},
         {"policy": functools.partial(pw.plan.pinned, roles=("direct",))},
         ["uses policy pathweave.plan.pinned.pinned(roles=('direct',))"]),
        ("chunk_bytes", {}, {"chunk_bytes": 8192},
         ["uses chunk_bytes 8192 but rank 0 uses 4096"]),
        ("window", {}, {"window": 2}, ["uses window 2 but rank 0 uses 4"]),
        ("enabled", {"enabled": True}, {"enabled": False},
         ["uses enabled False but rank 0 uses True"]),
        ("min_split_bytes", {}, {"min_split_bytes": 1 << 20},
         ["uses min_split_bytes 1048576 but rank 0 uses 0"]),
    ]


def job_config(rank, ws):
    res = {}
    last = ws - 1
    for setting, opts0, opts1, _ in _config_cases(ws):
        opts = dict(opts0)
        if rank == last:
            opts.update(opts1)
        enabled = opts.pop("enabled", True)
        orch = _orch(ws, enabled, **opts)
        rows = _rows(ws, 5)
        in_s, out_s = rows[rank].tolist(), rows[:, rank].tolist()
        inp = torch.randn(sum(in_s), 4)
        for how in ("exchange", "split_matrix", "batch_isend_irecv"):
            out = torch.full((sum(out_s), 4), SENTINEL)
            try:
                if how == "batch_isend_irecv":
                    peer = (rank + 1) % ws
                    ops = [pwd.P2POp(pwd.isend, torch.ones(3, 4), peer),
                           pwd.P2POp(pwd.irecv, out[:3], (rank - 1) % ws)]
                    pwd.batch_isend_irecv(ops, orchestrator=orch)
                else:
                    mat = rows if how == "split_matrix" else None
                    pwd.all_to_all_single(out, inp, out_s, in_s, orchestrator=orch,
                                          split_matrix=mat)
                res[(setting, how)] = ("no error", "", False)
            except (ValueError, TypeError) as exc:
                res[(setting, how)] = (type(exc).__name__, str(exc),
                                       bool((out == SENTINEL).all()))
        # the group still works, with one configuration again
        good = _orch(ws, True)
        out = torch.zeros(ws * 2, 3)
        inp = torch.full((ws * 2, 3), float(rank))
        pwd.all_to_all_single(out, inp, orchestrator=good)
        res[(setting, "after")] = bool(torch.equal(
            out, torch.arange(ws).repeat_interleave(2)[:, None].float().expand(-1, 3)))
    return res


@pytest.mark.parametrize("ws", [4, 8])
def test_a_configuration_mismatch_raises_the_same_error_on_every_rank(ws):
    results = run_local(job_config, ws, timeout_s=240)
    for setting, _, _, parts in _config_cases(ws):
        for how in ("exchange", "split_matrix", "batch_isend_irecv"):
            msgs = {res[(setting, how)][1] for res in results}
            assert len(msgs) == 1, f"{setting} ({how}): ranks disagree: {msgs}"
            for rank, res in enumerate(results):
                etype, msg, untouched = res[(setting, how)]
                assert etype == "ValueError", (setting, how, rank, etype, msg)
                assert f"rank {ws - 1} " in msg and "every rank of the group" in msg, msg
                for p in parts:
                    assert p in msg, (setting, how, msg)
                assert untouched, f"{setting} ({how}): rank {rank}'s output was written"
            assert all(res[(setting, "after")] for res in results), setting


def job_new_orchestrator(rank, ws):
    """Every rank runs calls on an adapting orchestrator; then the last rank alone
    switches to a fresh one: of the same configuration, then of another chunk_bytes."""
    rows = _rows(ws, 9)
    in_s, out_s = rows[rank].tolist(), rows[:, rank].tolist()
    inp = torch.randn(sum(in_s), 4)
    ref = torch.empty(sum(out_s), 4)
    torch.distributed.all_to_all_single(ref, inp, out_s, in_s)
    res = []
    old = _orch(ws, True, adapt=True)
    # The last None: every rank back on the old orchestrator, in step again (the
    # out-of-step words of the call that raised the configuration error must not
    # make a later call raise on some ranks only).
    for fresh in (None, {}, {"chunk_bytes": 8192}, None):
        orch = old
        if fresh is not None and rank == ws - 1:
            orch = _orch(ws, True, adapt=True, **fresh)
        out = torch.full((sum(out_s), 4), SENTINEL)
        try:
            # Twice: the first call leaves telemetry words to send (a plan's first
            # call is sampled); the fresh orchestrator has none.
            for _ in range(2):
                pwd.all_to_all_single(out, inp, out_s, in_s, orchestrator=orch)
            res.append(("ok", bool(torch.equal(out, ref))))
        except ValueError as exc:
            res.append(("ValueError", str(exc), bool((out == SENTINEL).all())))
    # batch_isend_irecv's rows carry the same words.
    orch = _orch(ws, True, adapt=True) if rank == ws - 1 else old
    recv = torch.full((3, 4), SENTINEL)
    ops = [pwd.P2POp(pwd.isend, torch.ones(3, 4), (rank + 1) % ws),
           pwd.P2POp(pwd.irecv, recv, (rank - 1) % ws)]
    try:
        pwd.batch_isend_irecv(ops, orchestrator=orch)
        res.append(("ok", bool((recv == 1).all())))
    except ValueError as exc:
        res.append(("ValueError", str(exc), bool((recv == SENTINEL).all())))
    return res


def test_ranks_out_of_step_raise_at_once_on_every_rank():
    # A new orchestrator on one rank has no history: its rows still have its peers'
    # width (gloo aborted the processes when they did not), and since its message
    # tags would not match theirs (a timeout, a minute later) every rank raises now.
    results = run_local(job_new_orchestrator, 4, timeout_s=120)
    for res in results:
        assert res[0] == ("ok", True), res
        step = ("rank 3's data plane has run 0 multi-path calls on this group but rank 0's {}; "
                "every rank must make the same calls through the same orchestrator (was one "
                "replaced on some ranks only?)")
        assert res[1] == ("ValueError", "all_to_all_single: " + step.format(2), True), res
        assert res[3] == ("ok", True), res
        assert res[4] == ("ValueError", "batch_isend_irecv: " + step.format(4), True), res
        assert res[2] == ("ValueError", "all_to_all_single: rank 3 uses chunk_bytes 8192 but "
                          "rank 0 uses 4096; every rank of the group must use the same "
                          "configuration (fabric, policy, chunk_bytes, ...)", True), res


# --------------------------------------------------------------- caches
def test_the_most_recently_used_schedule_survives_eviction_in_every_op():
    """Both ops share one LRU: a hit refreshes an entry (batch_isend_irecv did not)."""
    from pathweave._cache import Cache as _LRU

    lru = _LRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # a is now the most recent
    lru.put("c", 3)
    assert "a" in lru and "b" not in lru and "c" in lru and len(lru) == 2


def job_p2p_lru(rank, ws):
    """Two message patterns A and B with a schedule cache of two; A, B, A (hit), C, A."""
    # A pinned plan: every pattern is predicted alike, so the first decision stays
    # (hysteresis) and a schedule's key changes only with the message sizes.
    orch = _orch(ws, True, cache_size=2,
                 policy=functools.partial(pw.plan.pinned, roles=("relay",)))
    st_ = orch._state(None)
    made = []
    real = orch._schedule

    def counting(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    orch._schedule = counting
    for n in (5000, 6000, 5000, 7000, 5000):
        ops = []
        if rank == 0:
            ops = [pwd.P2POp(pwd.isend, torch.ones(n), 1)]
        if rank == 1:
            ops = [pwd.P2POp(pwd.irecv, torch.zeros(n), 0)]
        for h in pwd.batch_isend_irecv(ops, orchestrator=orch):
            h.wait()
    return len(made), len(st_.schedules)


def test_batch_isend_irecv_refreshes_its_cache_entries():
    # A, B, A(hit: A most recent), C (evicts B), A (hit) -> three schedules built
    results = run_local(job_p2p_lru, 4, timeout_s=120)
    assert all(r == (3, 2) for r in results), results


# ------------------------------------------------------ fingerprint codec
def test_fingerprint_names_the_setting_and_both_values():
    base = {"fabric": "h100-2x4 (content f0fe40f5)", "chunk_bytes": 4096}
    same = np.stack([V.fingerprint(base)] * 3)
    V.check_fingerprints(same, "op")  # no error
    rows = np.stack([V.fingerprint(base), V.fingerprint(base),
                     V.fingerprint({**base, "chunk_bytes": 8192})])
    with pytest.raises(ValueError, match=r"^op: rank 2 uses chunk_bytes 8192 but rank 0 uses "
                                         r"4096; every rank"):
        V.check_fingerprints(rows, "op")
    extra = np.stack([V.fingerprint(base), V.fingerprint({**base, "moe.layout": "padded"})])
    with pytest.raises(ValueError, match=r"rank 1 sets moe\.layout padded where rank 0 sets "
                                         r"no such field"):
        V.check_fingerprints(extra, "op")
    # more fields than slots: a difference in the shared last slot is still found
    many = {f"f{i}": i for i in range(V.FP_SLOTS + 5)}
    rows = np.stack([V.fingerprint(many), V.fingerprint({**many, f"f{V.FP_SLOTS + 3}": -1})])
    with pytest.raises(ValueError, match=r"rank 1 uses \+6 fields"):
        V.check_fingerprints(rows, "op")
    assert V.fingerprint(many).shape == V.fingerprint({}).shape == (V.FP_WORDS,)


def _raiser(code):
    """The function an op decodes its rows with: every rank calls it on the same rows."""
    from pathweave.moe import _checks as C

    _, op, _ = V.PROBLEMS[code]
    if op.startswith("MoEAllToAll"):
        fields = {"k": 2, "E": 8, "H": 32, "max_m": 8, "cap": 16}
        return lambda words: C.raise_first(words[None, :], fields)
    if op == "batch_isend_irecv":
        return lambda words: V.raise_problem(3, words[:4])
    width = V.meta_width(4)
    return lambda words: V.decode_a2a(np.tile(np.r_[words, np.zeros(width - words.size,
                                                                     np.int64)], (4, 1)))


@pytest.mark.parametrize("code", sorted(V.PROBLEMS))
def test_every_problem_code_formats_through_its_ops_decoder(code):
    """One table for every op: each code's template gets every name it uses, and its
    message names its op and the reporting rank."""
    exc_type, op, _ = V.PROBLEMS[code]
    words = V.ArgProblem(code, 1, 2, 3).words()
    with pytest.raises(exc_type) as info:
        _raiser(code)(words)
    msg = str(info.value)
    rank = "rank 3" if op == "batch_isend_irecv" else "rank 0"
    assert msg.startswith(f"{op}: {rank}: "), msg
    assert "{" not in msg and "problem code" not in msg, msg
    with pytest.raises(KeyError, match="unknown problem code 999"):
        V.ArgProblem(999)


def job_call_config(rank, ws):
    """A caller's own ``config=`` fields, with and without ``split_matrix``."""
    from pathweave.errors import CommError

    orch = _orch(ws, True, timeout_s=5)
    tr = orch._state(None).transport
    seen = []

    def count_exchange(*args, _real=tr.exchange, **kwargs):
        seen.append(1)
        return _real(*args, **kwargs)

    tr.exchange = count_exchange
    rows = _rows(ws, 8)
    in_s, out_s = rows[rank].tolist(), rows[:, rank].tolist()
    inp = torch.randn(sum(in_s), 4)
    out = torch.zeros(sum(out_s), 4)
    res = {}
    try:
        orch.all_to_all_single(out, inp, out_s, in_s, config={"chunk_bytes": 1})
    except ValueError as exc:
        res["clash"] = str(exc)
    # without config_digests a split_matrix call checks its configuration by an
    # exchange every time, so a rank that changes its fields is seen at once
    for name, experts, mat in (("agree", 8, rows), ("agree again", 8, rows),
                               ("differ, exchanged", 8 + (rank == 2), None),
                               ("differ, split_matrix", 8 + (rank == 2), rows)):
        before = len(seen)
        try:
            pwd.all_to_all_single(out, inp, out_s, in_s, orchestrator=orch, split_matrix=mat,
                                  config={"moe.num_experts": experts})
            res[name] = ("ok", _same(out, _reference(out.shape, out.dtype, inp, out_s, in_s)))
        except (ValueError, CommError) as exc:
            res[name] = (type(exc).__name__, str(exc))
        res[name] += (len(seen) - before,)
    return res


def test_a_callers_config_fields_are_checked_on_every_rank():
    results = run_local(job_call_config, 4, timeout_s=120)
    msg = ("all_to_all_single: rank 2 uses moe.num_experts 9 but rank 0 uses 8; every rank of "
           "the group must use the same configuration (fabric, policy, chunk_bytes, ...)")
    for rank, res in enumerate(results):
        assert res["clash"] == "config names ['chunk_bytes'] clash with the orchestrator's own " \
                               "settings"
        assert res["agree"] == ("ok", True, 1)
        assert res["agree again"] == ("ok", True, 1)
        assert res["differ, exchanged"] == ("ValueError", msg, 1)
        assert res["differ, split_matrix"] == ("ValueError", msg, 1), (rank, res)


def test_same_words_kernel_matches_its_slow_twin():
    """_same_words (numba) against np.array_equal, on equal arrays and on single-word
    changes (first, last, inside word; the sign bit; a low bit); _same_matrix on layouts."""
    rng = np.random.default_rng(3)
    for size in (1, 2, 49, 4096):
        a = rng.integers(-(1 << 40), 1 << 40, size)
        variants = [a.copy(), a[::-1].copy()]
        for i in {0, size // 2, size - 1}:
            for flip in (np.int64(1), np.int64(-(1 << 63))):
                b = a.copy()
                b[i] ^= flip
                variants.append(b)
        for b in variants:
            assert V._same_words(a, b) == V._same_words_reference(a, b)
    rows = rng.integers(0, 9, (5, 5))
    kept = V.MatrixCall(None, rows, rows, None, True, b"", np.array(rows, order="C"))
    for m in (rows.copy(), np.asfortranarray(rows), rows[::-1].copy(), rows.T.copy()):
        assert V._same_matrix(kept, m) is bool(np.array_equal(rows, m))


def test_a_split_matrix_calls_checks_are_kept_only_for_the_very_same_facts():
    """check_matrix_call returns its last result for the same facts; any change is checked."""
    n, rank = 3, 1
    rows = np.array([[0, 2, 1], [3, 0, 4], [1, 5, 0]])
    words = V.fingerprint({"x": 1})
    digests = np.full(n, V.fingerprint_digest(words), dtype=np.int64)
    inp, out = torch.zeros(7, 2), torch.zeros(7, 2)  # sends 3 + 0 + 4, receives 2 + 0 + 5
    send, recv = [3, 0, 4], [2, 0, 5]

    def check(last, **kw):
        args = {"output": out, "input": inp, "output_split_sizes": recv,
                "input_split_sizes": send, "matrix": rows, "digests": digests, "words": words}
        args.update(kw)
        return V.check_matrix_call(last, args["output"], args["input"],
                                   args["output_split_sizes"], args["input_split_sizes"], rank,
                                   n, args["words"], args["matrix"], args["digests"])

    first = check(None)
    assert first.same_config and first.layout.row_bytes == 8
    assert first.layout.pair_bytes.tolist() == (rows * 8).tolist()
    again = check(first)
    assert again is first and again.mkey is first.mkey
    # The same values in new objects: kept too (facts, not identities).
    assert check(first, matrix=rows.copy(), output_split_sizes=list(recv)) is first
    # Each fact changed is checked again (and raises where it is wrong).
    send[2] = 5  # the caller's list, changed in place: 8 rows for a 7-row input
    with pytest.raises(ValueError, match="input"):
        check(first)
    send[2] = 4
    bad = rows.copy()
    bad[1, 2] = 9
    with pytest.raises(ValueError, match=r"split_matrix\[1, 2\] = 9"):
        check(first, matrix=bad)
    with pytest.raises(ValueError, match=r"split_matrix\[1, 0\] = 2"):
        check(first, matrix=rows.T.copy())
    rows[1, 2] = 9  # the very same matrix object, changed in place
    with pytest.raises(ValueError, match=r"split_matrix\[1, 2\] = 9"):
        check(first)
    rows[1, 2] = 4
    assert check(first) is first
    wider = check(first, input=torch.zeros(7, 3), output=torch.zeros(7, 3))
    assert wider is not first and wider.layout.row_bytes == 12 and wider.mkey != first.mkey
    other = V.fingerprint({"x": 2})
    assert check(first, words=other, digests=None).mkey != first.mkey
    differ = digests.copy()
    differ[0] += 1
    assert not check(first, digests=differ).same_config
    # Splits given as a tensor are not kept: checked every time.
    t = check(None, input_split_sizes=torch.tensor(send))
    assert t.key is None and check(t, input_split_sizes=torch.tensor(send)) is not t
