"""pathweave's data plane and MoE layer on CUDA tensors over NCCL, checked against torch.

These tests need a machine with CUDA GPUs and NCCL; elsewhere they are
skipped with the reason (how many GPUs were found). They start one process
per GPU (up to 8) with :func:`pathweave.runtime.launch.run_local`, or
``PATHWEAVE_TEST_NCCL_WORLD`` processes when that is set. Ranks that share a
GPU (more ranks than GPUs, as on a one-GPU machine) each pose as their own
host (``NCCL_HOSTID``), since NCCL refuses two ranks of one host on one GPU;
NCCL then joins them by its socket transport. That checks bytes and
gradients, not speed. The MoE test always starts 4 ranks (it runs when
there are 4 GPUs or ``PATHWEAVE_TEST_NCCL_WORLD`` is at least 4).

The rank functions take the backend as an argument and put tensors on the
rank's GPU for ``"nccl"`` or on the CPU for ``"gloo"``, so the same checks
can be run on gloo to debug them on a machine without GPUs.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

try:
    import torch
    import torch.distributed as dist

    NUM_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
    HAVE_NCCL = dist.is_available() and dist.is_nccl_available()
except ImportError:  # no torch: nothing here can run
    torch = None
    NUM_GPUS, HAVE_NCCL = 0, False


def _world(gpus: int) -> int:
    """Ranks to start: ``PATHWEAVE_TEST_NCCL_WORLD`` if set, else one per GPU, at most 8."""
    raw = os.environ.get("PATHWEAVE_TEST_NCCL_WORLD", "")
    if not raw:
        return min(gpus, 8)
    if not raw.isdigit() or not 2 <= int(raw) <= 64:
        raise ValueError(f"PATHWEAVE_TEST_NCCL_WORLD={raw!r}: expected a rank count in 2..64")
    return int(raw)


WORLD = _world(NUM_GPUS)
MOE_WORLD = 4  # test_moe_grad's ranks

if torch is None:
    _REASON = "needs torch with CUDA; torch is not installed"
elif NUM_GPUS < 1:
    _REASON = "needs CUDA GPUs, found 0"
elif not HAVE_NCCL:
    _REASON = f"needs NCCL; this torch build has none ({NUM_GPUS} GPUs found)"
else:
    _REASON = ""

pytestmark = pytest.mark.skipif(bool(_REASON), reason=_REASON)
_SHARE_HINT = "set PATHWEAVE_TEST_NCCL_WORLD to run more ranks than GPUs"
needs_world = pytest.mark.skipif(
    not _REASON and WORLD < 2, reason=f"needs >= 2 ranks, found {NUM_GPUS} GPU(s); {_SHARE_HINT}")

#: Path roles on which some rank between source and destination forwards the bytes.
FORWARDED_ROLES = ("relay", "rd", "dr", "drd")
DTYPES = ("float32", "bfloat16", "float16", "int64", "int8", "uint8")


# ------------------------------------------------------------------ helpers
def forwarding_fabric(world: int) -> str:
    """A fabric of ``world`` ranks on which pairs have paths through a forwarding rank.

    Two nodes when the ranks split evenly into nodes of two or more (rail
    paths forward on one or both sides), else one NVLink-mesh node (relay
    paths need a third GPU). Two ranks on one node have no such path.

    >>> forwarding_fabric(8)
    'cluster:nodes=2,gpus_per_node=4,node_kind=nvlink-mesh'
    >>> forwarding_fabric(3)
    'cluster:nodes=1,gpus_per_node=3,node_kind=nvlink-mesh'
    """
    if world >= 4 and world % 2 == 0:
        return f"cluster:nodes=2,gpus_per_node={world // 2},node_kind=nvlink-mesh"
    return f"cluster:nodes=1,gpus_per_node={world},node_kind=nvlink-mesh"


def forward_everything(fabric, demand):
    """A policy that sends every pair's bytes over its forwarded paths, evenly.

    Pairs without such a path keep their direct path. Used as the
    orchestrator's ``policy`` so that every call forwards chunks.
    """
    from pathweave.fabric import candidate_paths
    from pathweave.fabric.paths import ROLES
    from pathweave.plan._flows import plan_from_flows, split_evenly

    paths = candidate_paths(fabric)
    forwarded = np.isin(np.asarray(ROLES)[paths.role_code], FORWARDED_ROLES)
    n = fabric.num_ranks
    flow_path, flow_bytes = [], []
    for s in range(n):
        for d in range(n):
            nbytes = int(demand[s, d])
            if s == d or nbytes == 0:
                continue
            ids = list(paths.pair_paths(s, d))
            chosen = [p for p in ids if forwarded[p]] or ids[:1]
            flow_path.extend(chosen)
            flow_bytes.extend(split_evenly(np.array([nbytes]), np.array([len(chosen)])).tolist())
    plan = plan_from_flows(fabric, np.asarray(demand, dtype=float), paths,
                           np.array(flow_path, dtype=np.int64),
                           np.array(flow_bytes, dtype=np.int64), "forward-everything")
    return plan.validate()


def _device(rank: int, backend: str, world: int):
    """The rank's device; called before the rank's first NCCL call.

    A rank that shares its GPU poses as its own host: NCCL reads
    ``NCCL_HOSTID`` once, when the process makes its first communicator.
    """
    if backend != "nccl":
        return torch.device("cpu")
    gpus = torch.cuda.device_count()
    if world > gpus:
        os.environ["NCCL_HOSTID"] = f"pathweave-test-rank{rank}"
    return torch.device("cuda", rank % gpus)


def _random_tensor(shape: tuple[int, ...], dtype, seed: int, device):
    """Random bits of any dtype (NaN patterns included: comparisons are bitwise)."""
    gen = torch.Generator().manual_seed(seed)
    elem = torch.empty((), dtype=dtype).element_size()
    numel = int(np.prod(shape))
    raw = torch.randint(0, 256, (numel * elem,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape).to(device)


def _bits(t):
    return t.detach().contiguous().cpu().reshape(-1).view(torch.uint8)


def _assert_same(out, ref, what: str) -> None:
    a, b = _bits(out), _bits(ref)
    if not torch.equal(a, b):
        first = int((a != b).nonzero()[0, 0])
        raise AssertionError(f"{what}: output differs from torch's at byte {first} of {a.numel()}")


def _splits(rng: np.random.Generator, world: int, trial: int) -> np.ndarray:
    """Uneven splits with zeros; one rank sends nothing at all."""
    split = rng.integers(0, 7, size=(world, world)) * (rng.random((world, world)) < 0.8)
    split[trial % world, :] = 0
    return split.astype(np.int64)


def _exchange(split, dtype, trailing, seed, device, rank, orchestrator=None, async_op=False):
    """torch's and pathweave's all_to_all_single on the same input: ``(out, ref)``."""
    from pathweave import distributed as pwdist

    send, recv = split[rank].tolist(), split[:, rank].tolist()
    inp = _random_tensor((sum(send), *trailing), getattr(torch, dtype), seed, device)
    ref = torch.zeros((sum(recv), *trailing), dtype=inp.dtype, device=device)
    out = torch.ones_like(ref)
    dist.all_to_all_single(ref, inp, recv, send)
    work = pwdist.all_to_all_single(out, inp, recv, send, async_op=async_op,
                                    orchestrator=orchestrator)
    if async_op:
        work.wait()
    elif work is not None:
        raise AssertionError(f"a synchronous call returned {work!r}, expected None")
    return out, ref


# --------------------------------------------------------------- rank bodies
def check_matches_torch(rank: int, world: int, backend: str) -> int:
    """Random uneven splits, several dtypes and shapes, default orchestrator."""
    device = _device(rank, backend, world)
    rng = np.random.default_rng(7)  # same draws on every rank
    checked = 0
    for trial, dtype in enumerate(DTYPES * 2):
        trailing = ((), (3,), (2, 5))[trial % 3]
        split = _splits(rng, world, trial)
        out, ref = _exchange(split, dtype, trailing, 1000 * trial + rank, device, rank)
        _assert_same(out, ref, f"trial {trial} ({dtype}, trailing {trailing})")
        checked += 1
    # Equal splits (no split lists) on a large tensor.
    inp = _random_tensor((world * (1 << 18),), torch.bfloat16, 99 + rank, device)
    ref, out = torch.empty_like(inp), torch.zeros_like(inp)
    dist.all_to_all_single(ref, inp)
    from pathweave import distributed as pwdist

    pwdist.all_to_all_single(out, inp)
    _assert_same(out, ref, "equal splits")
    return checked + 1


def check_forced_multipath(rank: int, world: int, backend: str) -> dict:
    """Every byte forwarded (forced plan), then mwu with ``enabled=True`` on a hotspot."""
    from pathweave import fabric as pwfabric
    from pathweave import traffic
    from pathweave.runtime import Orchestrator

    device = _device(rank, backend, world)
    fab = pwfabric.resolve(forwarding_fabric(world))
    rng = np.random.default_rng(11)
    forced = Orchestrator(fabric=fab, policy=forward_everything, enabled=True)
    for trial, dtype in enumerate(("float32", "bfloat16", "uint8", "int64")):
        split = _splits(rng, world, trial) * 4096  # several chunks per path
        out, ref = _exchange(split, dtype, (), 2000 * trial + rank, device, rank, forced)
        _assert_same(out, ref, f"forced forwarding, trial {trial} ({dtype})")
        if not forced.stats.last_call.multipath:
            raise AssertionError(f"trial {trial}: the forced plan did not run multi-path")
    demand = traffic.hotspot(world, bytes_per_rank=world * (4 << 20), ratio=0.8)
    split = (demand // 2).astype(np.int64)  # bfloat16 elements
    mwu = Orchestrator(fabric=fab, policy="mwu", enabled=True)
    for k in range(2):  # the second call comes from the plan cache
        out, ref = _exchange(split, "bfloat16", (), 3000 + k * 10 + rank, device, rank, mwu)
        _assert_same(out, ref, f"mwu hotspot call {k}")
    last = mwu.stats.last_call
    return {
        "forced_kinds": {k: int(v) for k, v in dict(forced.stats.bytes_per_path_kind).items()},
        "mwu_kinds": {k: int(v) for k, v in dict(mwu.stats.bytes_per_path_kind).items()},
        "mwu_multipath": bool(last.multipath),
        "mwu_cached": bool(last.cached),
    }


def check_async_handle(rank: int, world: int, backend: str) -> int:
    """``async_op=True`` returns a handle whose ``wait()`` completes the exchange."""
    from pathweave import fabric as pwfabric
    from pathweave.runtime import Orchestrator

    device = _device(rank, backend, world)
    rng = np.random.default_rng(5)
    orchestrators = [None]
    if world >= 3:
        fab = pwfabric.resolve(forwarding_fabric(world))
        orchestrators.append(Orchestrator(fabric=fab, policy=forward_everything, enabled=True))
    checked = 0
    for orch in orchestrators:
        for trial in range(3):
            split = _splits(rng, world, trial) * 1024
            out, ref = _exchange(split, "float32", (4,), 4000 * trial + rank, device, rank,
                                 orch, async_op=True)
            _assert_same(out, ref, f"async trial {trial}, orchestrator {orch is not None}")
            checked += 1
    return checked


# -------------------------------------------------------------------- tests
def check_pathweave_backend(rank: int, world: int, backend: str) -> dict:
    """A job started with ``init_process_group("pathweave")``: plain torch calls on CUDA
    tensors (CPU tensors for ``"gloo"``) against the same calls on an NCCL (gloo) group."""
    import torch.distributed as tdist

    from pathweave import distributed as pwdist

    device = _device(rank, backend, world)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    ref_group = tdist.new_group(backend=backend)
    rng = np.random.default_rng(17)
    res = {}
    for trial, dtype in enumerate(("bfloat16", "float32", "int64")):
        rows = rng.integers(0, 9, (world, world)) * 1024
        rows[:, trial % world] *= 8  # one hot rank: worth forwarding
        send, recv = rows[rank].tolist(), rows[:, rank].tolist()
        inp = _random_tensor((sum(send), 2), getattr(torch, dtype), 70 + 10 * trial + rank,
                             device)
        out = torch.zeros((sum(recv), 2), dtype=inp.dtype, device=device)
        ref = torch.ones_like(out)
        tdist.all_to_all_single(out, inp, recv, send)              # the pathweave backend
        tdist.all_to_all_single(ref, inp, recv, send, group=ref_group)
        _assert_same(out, ref, f"backend all_to_all_single, {dtype}")
    def size(r: int) -> int:  # what every rank sends rank r: uneven on NCCL (gloo: equal)
        return 3 + (r if backend == "nccl" else 0)

    ins = [_random_tensor((size(r),), torch.float16, 90 + rank * world + r, device)
           for r in range(world)]
    outs = [torch.zeros(size(rank), dtype=torch.float16, device=device) for _ in range(world)]
    refs = [torch.ones_like(t) for t in outs]
    tdist.all_to_all(outs, ins)
    tdist.all_to_all(refs, ins, group=ref_group)
    for r in range(world):
        _assert_same(outs[r], refs[r], f"backend all_to_all from rank {r}")
    x = torch.arange(4, device=device, dtype=torch.int64) + rank
    tdist.all_reduce(x)                                             # delegated to NCCL/gloo
    res["all_reduce"] = x.tolist() == [sum(range(world)) + world * i for i in range(4)]
    stats = pwdist.default_orchestrator().stats
    res["multipath_calls"] = int(stats.multipath_calls)
    res["forwarded"] = int(sum(v for k, v in stats.bytes_per_path_kind.items()
                               if k in FORWARDED_ROLES))
    return res


def check_moe_gradients(rank: int, world: int, backend: str) -> list:
    """test_moe_grad's cases (every layout, DP groups, async, forced multi-path) on ``backend``."""
    from test_moe_grad import GRAD_CASES, _grad_job

    return _grad_job(rank, world, GRAD_CASES, device=str(_device(rank, backend, world)))


def _run(fn, *args, world: int = WORLD, backend: str = "nccl", env=None):
    from pathweave.runtime.launch import run_local

    return run_local(fn, world, ("nccl", *args), backend=backend, env=env, timeout_s=300)


@needs_world
def test_matches_torch_bitwise_on_nccl():
    checked = _run(check_matches_torch)
    assert checked == [2 * len(DTYPES) + 1] * WORLD


@pytest.mark.skipif(not _REASON and WORLD < 3,
                    reason=f"forwarding needs >= 3 ranks, found {NUM_GPUS} GPU(s); {_SHARE_HINT}")
def test_forced_multipath_on_nccl_forwards_and_matches_torch():
    results = _run(check_forced_multipath)
    forced = {}
    for r in results:
        for k, v in r["forced_kinds"].items():
            forced[k] = forced.get(k, 0) + v
    # The forced plan leaves nothing on a direct path where a forwarded one exists.
    assert sum(forced.get(k, 0) for k in FORWARDED_ROLES) > 0, forced
    assert all(r["mwu_multipath"] and r["mwu_cached"] for r in results)


@needs_world
def test_async_handle_on_nccl():
    checked = _run(check_async_handle)
    assert checked == [3 * (1 + (WORLD >= 3))] * WORLD


@pytest.mark.skipif(not _REASON and WORLD < 3,
                    reason=f"forwarding needs >= 3 ranks, found {NUM_GPUS} GPU(s); {_SHARE_HINT}")
def test_pathweave_backend_on_cuda_tensors_matches_nccl():
    """``init_process_group("pathweave")``: CUDA all-to-alls forwarded, bytes as NCCL's."""
    env = {"PATHWEAVE_MULTIPATH": "on", "PATHWEAVE_FABRIC": forwarding_fabric(WORLD)}
    results = _run(check_pathweave_backend, backend="pathweave", env=env)
    assert all(r["all_reduce"] and r["multipath_calls"] >= 4 for r in results), results
    assert sum(r["forwarded"] for r in results) > 0, results


@pytest.mark.skipif(not _REASON and max(NUM_GPUS, WORLD) < MOE_WORLD,
                    reason=f"needs {MOE_WORLD} ranks, found {NUM_GPUS} GPU(s); {_SHARE_HINT}")
def test_moe_gradients_on_nccl_equal_dense():
    """MoE dispatch/combine forward and backward on CUDA tensors, against one dense process."""
    from test_moe_grad import GRAD_CASES, assert_equal_dense

    assert_equal_dense(_run(check_moe_gradients, world=MOE_WORLD), GRAD_CASES)


def check_low_latency_graph(rank: int, world: int, backend: str) -> bool:
    """A low-latency dispatch + combine captured in one CUDA graph replays bitwise (issue 23),
    in every layout."""
    from pathweave.moe.routing import LAYOUTS

    return all(_low_latency_graph(rank, world, backend, layout) for layout in LAYOUTS)


def _low_latency_graph(rank: int, world: int, backend: str, layout: str) -> bool:
    from pathweave.moe import MoEAllToAll

    dev = _device(rank, backend, world) if backend == "nccl" else torch.device("cpu")
    g = torch.Generator().manual_seed(rank)
    m, k, E, H = 128, 8, 256, 256
    x = torch.randn(m, H, generator=g).to(dev)
    w, idx = (t.to(dev) for t in torch.randn(m, E, generator=g).softmax(-1).topk(k))
    moe = MoEAllToAll(E, k, H, m, torch.float32, mode="low_latency", layout=layout)

    def step():
        expert_x, _, handle = moe.dispatch(x, idx)
        if layout == "compact":  # every grouped pair's row; the valid ones come first
            expert_x = expert_x[handle.expert_rows]
        return moe.combine(expert_x * 2, handle, w)

    for _ in range(3):  # warm-up: the first call's checks, both buffer sets
        eager = step()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    results = []
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        results.append(out.clone())
    want = (x * w.sum(-1, keepdim=True)) * 2
    return (all(torch.equal(r, eager) for r in results)
            and bool(torch.allclose(eager, want, rtol=1e-5, atol=1e-5)))


def test_low_latency_moe_replays_in_a_cuda_graph_bitwise():
    assert all(_run(check_low_latency_graph, world=1))
