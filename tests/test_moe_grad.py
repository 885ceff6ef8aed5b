"""Gradients through MoE dispatch/combine and the all-to-all, on 4 gloo ranks (issue 12).

Every rank draws the inputs of all ranks from one seed, runs a small expert
layer (expert ``e``: ``tanh(x @ W_e)``) through :class:`pathweave.moe.MoEAllToAll`
with its own loss ``sum(out * G_rank)``, and returns its gradients; the test
process computes the same total loss densely in one process (no pathweave
code) and compares the gradients of ``x``, ``topk_weights`` and every
``W_e`` (relative error <= 1e-4 in float32), for every layout, with and
without DP groups, with ``-1`` slots, a rank without tokens, a rank without
experts, the async halves, and a forced multi-path orchestrator (the
backward's exchanges relayed too).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from pathweave.moe.routing import LAYOUTS
from pathweave.runtime.launch import run_local

WORLD, E, K, H = 4, 8, 3, 16
MS = [12, 0, 9, 16]  # tokens per DP group's first rank (a rank with none included)


def _data(dp: int, seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    groups = WORLD // dp
    xs, idxs, ws = [], [], []
    for gi in range(groups):
        m = MS[gi]
        idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(m)] or
                          [torch.zeros(K, dtype=torch.int64)])[:m]
        idx[torch.rand(m, K, generator=g) < 0.25] = -1  # "no expert" slots
        xs.append(torch.randn(m, H, generator=g))
        idxs.append(idx)
        ws.append(torch.rand(m, K, generator=g))
    experts = torch.randn(E, H, H, generator=g) / H**0.5
    loss_w = [torch.randn(MS[r // dp], H, generator=g) for r in range(WORLD)]
    return {"x": xs, "idx": idxs, "w": ws, "W": experts, "G": loss_w}


def _expert(x: torch.Tensor, w_e: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ w_e)


def _expert_outputs(moe: Any, expert_x: torch.Tensor, counts: torch.Tensor, handle: Any,
                    weights: dict[int, torch.Tensor]) -> torch.Tensor:
    """Run the local experts on their valid rows only (padding rows may hold anything)."""
    ids = moe.local_expert_ids.tolist()
    if moe.layout == "compact":
        pieces = [expert_x[handle.expert_rows[:0]]]  # keeps expert_x in the graph when empty
        for l_, e in enumerate(ids):
            a, b = int(handle.expert_offsets[l_]), int(handle.expert_offsets[l_ + 1])
            pieces.append(_expert(expert_x[handle.expert_rows[a:b]], weights[e]))
        return torch.cat(pieces)
    cap = moe.expert_capacity
    rows = [expert_x[:0].reshape(0, cap, H)]
    for l_, e in enumerate(ids):
        n = int(counts[l_])
        y = _expert(expert_x[l_, :n], weights[e])
        rows.append(torch.cat([y, y.new_zeros(cap - n, H)]).unsqueeze(0))
    return torch.cat(rows)


NO_EXPERTS_ON_3 = [0, 0, 0, 1, 1, 1, 2, 2]  # rank 3 holds no expert


def _grad_job(rank: int, world: int, cases: list[tuple[Any, ...]],
              device: str = "cpu", mode: str = "normal") -> list[dict[str, Any]]:
    """One rank's outputs and gradients for every case; tensors live on ``device``.

    ``mode``: the layer's mode (``"normal"``, ``"low_latency"``): the same experts,
    loss and dense reference serve both.
    """
    import pathweave as pw
    from pathweave.moe import MoEAllToAll

    out = []
    for layout, dp, placement, async_op, multipath in cases:
        d = _data(dp, seed=11 + dp)
        d = {k: [t.to(device) for t in v] if isinstance(v, list) else v.to(device)
             for k, v in d.items()}
        gi = rank // dp
        orch = None
        if multipath:  # every pair split over several paths, relays included, both directions
            orch = pw.Orchestrator(fabric="h100-2x4:gpus_per_node=2", enabled=True,
                                   min_split_bytes=1, chunk_bytes=4096)
        moe = MoEAllToAll(E, K, H, max(MS), torch.float32, dp_size=dp, layout=layout,
                          placement=placement, orchestrator=orch, mode=mode)
        x = d["x"][gi].clone().requires_grad_()
        w = d["w"][gi].clone().requires_grad_()
        weights = {e: d["W"][e].clone().requires_grad_() for e in moe.local_expert_ids.tolist()}
        res = moe.dispatch(x, d["idx"][gi], async_op=async_op)
        expert_x, counts, handle = res.wait() if async_op else res
        y = _expert_outputs(moe, expert_x, counts, handle, weights)
        res = moe.combine(y, handle, w, async_op=async_op)
        res = res.wait() if async_op else res
        before = dict(orch.stats.bytes_per_path_kind) if orch else {}
        (res * d["G"][rank]).sum().backward()
        relayed = 0
        if orch:
            after = orch.stats.bytes_per_path_kind
            relayed = sum(v - before.get(kk, 0) for kk, v in after.items()
                          if kk not in ("direct", "torch"))
        # numpy: tensors would travel back through shared memory of a process that has exited
        out.append({"layout": layout, "dp": dp, "relayed": relayed,
                    "out": res.detach().cpu().numpy(), "x": x.grad.cpu().numpy(),
                    "w": w.grad.cpu().numpy(),
                    "W": {e: t.grad.cpu().numpy() for e, t in weights.items()}})
    return out


def _dense(dp: int) -> dict[str, Any]:
    """The same total loss (sum over ranks) in one process, plain torch."""
    d = _data(dp, seed=11 + dp)
    xs = [x.clone().requires_grad_() for x in d["x"]]
    ws = [w.clone().requires_grad_() for w in d["w"]]
    experts = d["W"].clone().requires_grad_()
    loss = torch.zeros(())
    outs = []
    for r in range(WORLD):
        gi = r // dp
        x, idx, w = xs[gi], d["idx"][gi], ws[gi]
        acc = torch.zeros(x.shape[0], H)
        for j in range(K):
            for e in range(E):
                mask = (idx[:, j] == e).unsqueeze(1)
                acc = acc + torch.where(mask, w[:, j : j + 1] * _expert(x, experts[e]), 0.0)
        outs.append(acc.detach())
        loss = loss + (acc * d["G"][r]).sum()
    loss.backward()
    return {"out": outs, "x": [x.grad for x in xs], "w": [w.grad for w in ws], "W": experts.grad}


def _rel(got: Any, want: torch.Tensor) -> float:
    got = torch.as_tensor(got)
    den = float(want.norm())
    return float((got - want).norm()) / den if den else float(got.norm())


#: Every layout with and without DP groups; a rank without experts and the async halves in
#: every layout; then a forced multi-path orchestrator, whose backward exchanges must move
#: bytes over relay/rail paths too. ``(layout, dp, placement, async_op, multipath)``.
GRAD_CASES = [(layout, dp, None, False, False) for layout in LAYOUTS for dp in (1, 2)]
GRAD_CASES += [(layout, 1, NO_EXPERTS_ON_3, True, False) for layout in LAYOUTS]
GRAD_CASES += [(layout, 2, None, False, True) for layout in LAYOUTS]


def assert_equal_dense(per_rank: list[list[dict[str, Any]]], cases: list[tuple[Any, ...]]) -> None:
    """Every rank's outputs and gradients (``_grad_job``'s) against :func:`_dense`'s."""
    for c, (layout, dp, _, _, multipath) in enumerate(cases):
        if multipath:
            assert sum(per_rank[r][c]["relayed"] for r in range(WORLD)) > 0, (layout, "relay")
        ref = _dense(dp)
        got = [per_rank[r][c] for r in range(WORLD)]
        errs = {}
        for r in range(WORLD):
            errs[f"out{r}"] = _rel(got[r]["out"], ref["out"][r])
        for gi in range(WORLD // dp):
            members = range(gi * dp, gi * dp + dp)  # DP replicas: their gradients add up
            errs[f"x{gi}"] = _rel(sum(got[r]["x"] for r in members), ref["x"][gi])
            errs[f"w{gi}"] = _rel(sum(got[r]["w"] for r in members), ref["w"][gi])
            assert got[gi * dp]["x"].shape == tuple(ref["x"][gi].shape)
        seen = {}
        for r in range(WORLD):
            seen.update(got[r]["W"])
        assert sorted(seen) == list(range(E)), (layout, dp, sorted(seen))
        for e in range(E):
            errs[f"W{e}"] = _rel(seen[e], ref["W"][e])
        worst = max(errs, key=errs.get)
        assert errs[worst] <= 1e-4, (layout, dp, worst, errs[worst])


def test_gradients_through_dispatch_and_combine_equal_dense() -> None:
    assert_equal_dense(run_local(_grad_job, WORLD, (GRAD_CASES,), timeout_s=180), GRAD_CASES)


# ----------------------------------------------------------- the all-to-all alone
def _a2a_job(rank: int, world: int) -> bool:
    """pathweave.nn.functional.all_to_all_single against torch.distributed.nn's, uneven splits."""
    import torch.distributed.nn.functional as tnf

    from pathweave.nn.functional import all_to_all_single

    g = torch.Generator().manual_seed(5)
    splits = torch.randint(0, 4, (world, world), generator=g)  # [src, dst] rows
    x_all = [torch.randn(int(splits[s].sum()), 3, generator=g) for s in range(world)]
    gy_all = [torch.randn(int(splits[:, d].sum()), 3, generator=g) for d in range(world)]
    send, recv = splits[rank].tolist(), splits[:, rank].tolist()
    grads = []
    for fn in (all_to_all_single, tnf.all_to_all_single):
        x = x_all[rank].clone().requires_grad_()
        with warnings.catch_warnings():  # torch deprecates its own in favour of a private API
            warnings.simplefilter("ignore", FutureWarning)
            y = fn(torch.empty(sum(recv), 3), x, recv, send)
        (y * gy_all[rank]).sum().backward()
        grads.append((y.detach(), x.grad))
    (y0, g0), (y1, g1) = grads
    return torch.equal(y0, y1) and torch.equal(g0, g1)


def test_differentiable_all_to_all_matches_torch() -> None:
    assert all(run_local(_a2a_job, WORLD, timeout_s=120))


# ----------------------------------------------------------- what crosses to the host
_READS = ("cpu", "numpy", "tolist", "item", "__array__", "__int__", "__float__", "__index__",
          "__bool__")


def step(moe: Any, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, layout: str) -> None:
    """One training step's MoE calls: dispatch, a stand-in expert, combine, backward."""
    expert_x, _, handle = moe.dispatch(x, idx)
    y = expert_x * 2 if layout != "compact" else expert_x[handle.expert_rows] * 2
    moe.combine(y, handle, w).sum().backward()


def _host_job(rank: int, world: int, layout: str) -> list[tuple[str, int]]:
    """Every tensor read back to Python/numpy during a training step's MoE calls: (how, numel)."""
    from pathweave.moe import MoEAllToAll

    m, k = 64, 4
    g = torch.Generator().manual_seed(rank)
    moe = MoEAllToAll(E, k, H, m, torch.float32, layout=layout)
    x = torch.randn(m, H, generator=g, requires_grad=True)
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(m)])
    idx[0, 1] = -1
    w = torch.rand(m, k, generator=g, requires_grad=True)
    seen: list[tuple[str, int]] = []
    # One step first: the data plane checks a new configuration once (one metadata
    # exchange with the settings' fingerprint); the steady state is what is watched.
    step(moe, x, idx, w, layout)
    saved = {name: getattr(torch.Tensor, name) for name in _READS}

    def spy(name: str) -> Any:
        orig = saved[name]

        def read(self: torch.Tensor, *a: Any, **kw: Any) -> Any:
            seen.append((name, self.numel()))
            return orig(self, *a, **kw)
        return read

    for name in _READS:
        setattr(torch.Tensor, name, spy(name))
    try:
        step(moe, x, idx, w, layout)
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
    return seen


def test_only_counts_cross_to_the_host() -> None:
    """The routing table (m x k = 256 ids), payloads and index tables stay on the device;
    what is read back is the count row (routing check, digest, pairs per expert, rows per
    rank) and the gathered count matrix of the metadata exchange (with the data plane's
    state words)."""
    from pathweave.moe._checks import PROBLEM_WORDS
    from pathweave.runtime.orchestrator import PLANE_WORDS

    n = WORLD
    count_matrix = n * (PROBLEM_WORDS + 6 + E + n + PLANE_WORDS)
    assert count_matrix < 64 * 4  # the bound would catch a routing table read back
    for layout in LAYOUTS:
        seen = run_local(_host_job, WORLD, (layout,), timeout_s=120)
        for r in range(WORLD):
            too_big = [s for s in seen[r] if s[1] > count_matrix]
            assert not too_big, (layout, r, too_big)
