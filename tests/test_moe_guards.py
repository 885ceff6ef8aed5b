"""MoE layers that disagree across ranks, and combines with the wrong handle (issue 16).

Every case runs on 4 gloo ranks in both layouts (iterating
``pathweave.moe.routing.LAYOUTS``): one rank builds its layer with another
parameter, or passes a stale, reused or foreign handle; every rank must raise
the same error before any byte moves, nothing may hang or abort, and the good
calls afterwards must equal the dense single-process reference.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pathweave.moe.reference import reference_combine
from pathweave.moe.routing import LAYOUTS
from pathweave.runtime.launch import run_local

E, K, H, M = 8, 2, 16, 6

# parameter -> (keyword arguments of the odd rank's layer, expected message)
MISMATCH: dict[str, tuple[dict[str, Any], str]] = {
    "num_experts": ({"num_experts": 16}, "rank 3 uses num_experts 16 but rank 0 uses 8"),
    "experts_per_token": ({"experts_per_token": 3}, "rank 3 uses experts_per_token 3 but "
                                                    "rank 0 uses 2"),
    "hidden_dim": ({"hidden_dim": 32}, "rank 3 uses hidden_dim 32 but rank 0 uses 16"),
    "max_num_tokens": ({"max_num_tokens": 7}, "rank 3 uses max_num_tokens 7 but rank 0 uses 6"),
    "dtype": ({"dtype": torch.bfloat16}, "rank 3 uses dtype bfloat16 but rank 0 uses float32"),
    "layout": ({"layout": "other"}, "rank 3 uses layout "),
    "dp_size": ({"dp_size": 2}, "rank 3 uses dp_size 2 but rank 0 uses 1"),
    "expert_capacity": ({"expert_capacity": 20}, "rank 3 uses expert_capacity 20 but rank 0 "
                                                 "uses 24"),
    "placement": ({"placement": [3, 2, 1, 0, 0, 1, 2, 3]}, "rank 3 uses placement "
                                                           "[3, 2, 1, 0, 0, 1, 2, 3] but rank 0 "
                                                           "uses [0, 0, 1, 1, 2, 2, 3, 3]"),
}


def _inputs(world: int, seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(world):
        idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(M)])
        idx[torch.rand(M, K, generator=g) < 0.2] = -1
        out.append({"x": torch.randn(M, H, generator=g), "idx": idx,
                    "w": torch.rand(M, K, generator=g)})
    return out


def _experts(moe: Any, expert_x: torch.Tensor, handle: Any) -> torch.Tensor:
    """Expert ``e`` multiplies its rows by ``e + 1`` (either layout)."""
    if moe.layout == "compact":
        y = expert_x[handle.expert_rows]
        for l_, e in enumerate(moe.local_expert_ids.tolist()):
            a, b = handle.expert_offsets[l_], handle.expert_offsets[l_ + 1]
            y[a:b] *= e + 1
        return y
    scale = torch.tensor(moe.local_expert_ids + 1, dtype=expert_x.dtype)
    return expert_x * scale.view(-1, 1, 1)


def _guards(rank: int, world: int, layout: str) -> list[tuple[str, str, str]]:
    from pathweave.moe import MoEAllToAll

    seen: list[tuple[str, str, str]] = []

    def attempt(label: str, fn: Any) -> Any:
        try:
            res = fn()
        except (TypeError, ValueError) as exc:
            seen.append((label, type(exc).__name__, str(exc)))
            return None
        seen.append((label, "none", ""))
        return res

    base = {"num_experts": E, "experts_per_token": K, "hidden_dim": H, "max_num_tokens": M,
            "dtype": torch.float32, "layout": layout}
    data = _inputs(world, seed=3)
    mine = data[rank]
    for name, (change, _) in MISMATCH.items():
        kw = dict(base)
        if rank == 3:
            kw.update(change)
            if name == "layout":
                kw["layout"] = next(lo for lo in LAYOUTS if lo != layout)
        layer = MoEAllToAll(**kw)
        x = mine["x"].to(layer.dtype)[:, : layer.hidden_dim]
        if layer.hidden_dim > H:
            x = torch.cat([x, x], dim=1)
        idx = torch.full((M, layer.experts_per_token), -1)
        attempt(name, lambda f=layer.dispatch, x=x, idx=idx: f(x, idx))
    moe = MoEAllToAll(**base)
    other = MoEAllToAll(**base)
    ex1, _, h1 = moe.dispatch(mine["x"], mine["idx"])
    y1 = _experts(moe, ex1, h1)
    out1 = moe.combine(y1, h1, mine["w"])
    attempt("reused", lambda: moe.combine(y1, h1, mine["w"]))
    ex2, _, h2 = moe.dispatch(mine["x"], mine["idx"])
    y2 = _experts(moe, ex2, h2)
    attempt("reused-one-rank", lambda: moe.combine(y2, h1 if rank == 1 else h2, mine["w"]))
    ex3, _, h3 = moe.dispatch(mine["x"], mine["idx"])  # h2 and h3 both open now
    y3 = _experts(moe, ex3, h3)
    attempt("older-one-rank", lambda: moe.combine(y3, h2 if rank == 2 else h3, mine["w"]))
    exo, _, ho = other.dispatch(mine["x"], mine["idx"])
    attempt("foreign-one-rank", lambda: moe.combine(y3, ho if rank == 3 else h3, mine["w"]))
    attempt("foreign-all", lambda: moe.combine(y3, ho, mine["w"]))
    # The data plane's configuration changes on one rank between calls (its default
    # orchestrator): the digest in dispatch's row makes every rank raise at once.
    import pathweave as pw
    import pathweave.distributed as pwd

    if rank == 2:
        pwd.set_default_orchestrator(pw.Orchestrator(chunk_bytes=1 << 16))
    attempt("orchestrator-one-rank", lambda: moe.dispatch(mine["x"], mine["idx"]))
    pwd.set_default_orchestrator(None)
    # A placement naming a rank outside the group: refused by the constructor, on every rank.
    attempt("placement-out-of-group",
            lambda: MoEAllToAll(**base, placement=[0, 1, 2, 3, 0, 1, 2, world]))
    # The layer is still usable, every open handle still combines once, and the bytes agree
    # with the dense reference.
    outs = [out1, moe.combine(y3, h3, mine["w"]), moe.combine(y2, h2, mine["w"]),
            other.combine(_experts(other, exo, ho), ho, mine["w"])]
    want = reference_combine([d["x"] for d in data], [d["idx"] for d in data],
                             [d["w"] for d in data], moe.placement.tolist(),
                             lambda e, x, s: x * (e + 1))[rank]
    for out in outs:
        err = float((out - want).abs().max()) if out.numel() else 0.0
        seen.append(("good", "none" if err <= 1e-5 else f"error {err}", ""))
    return seen


EXPECT_HANDLES = {
    "reused": ("ValueError", "rank 0: the handle of dispatch call 0 was already combined"),
    "reused-one-rank": ("ValueError", "rank 1: the handle of dispatch call 0 was already "
                                      "combined"),
    "older-one-rank": ("ValueError", "rank 2 combines the handle of dispatch call 1 but rank 0 "
                                     "that of call 2"),
    "foreign-one-rank": ("ValueError", "rank 3: handle comes from another MoEAllToAll layer"),
    "foreign-all": ("ValueError", "rank 0: handle comes from another MoEAllToAll layer"),
}


EXPECT_PLANE = {
    "orchestrator-one-rank": ("ValueError", "all_to_all_single: rank 2 uses chunk_bytes 65536 "
                                            "but rank 0 uses 1048576"),
}


EXPECT_ARGS = {
    "placement-out-of-group": ("ValueError", "placement[7] = 4 is not a rank of the group "
                                             "[0, 4)"),
}


WANT = {**{k: ("ValueError", v[1]) for k, v in MISMATCH.items()}, **EXPECT_HANDLES,
        **EXPECT_PLANE, **EXPECT_ARGS}


# One 4-rank launch per layout runs every case (launches are the cost); each case
# is then its own test.
@pytest.fixture(scope="module", params=LAYOUTS)
def guards(request: pytest.FixtureRequest) -> tuple[str, list[list[tuple[str, str, str]]]]:
    return request.param, run_local(_guards, 4, (request.param,), timeout_s=120)


def test_every_rank_sees_the_same_errors(guards) -> None:
    layout, seen = guards
    labels = [s[0] for s in seen[0]]
    assert labels == [*WANT, "good", "good", "good", "good"], labels
    for r in range(1, 4):
        assert seen[r] == seen[0], (layout, r, seen[r], seen[0])


@pytest.mark.parametrize("label", list(WANT))
def test_mismatch_or_stale_handle_raises(guards, label: str) -> None:
    layout, seen = guards
    [(exc, msg)] = [(e, m) for lab, e, m in seen[0] if lab == label]
    assert exc == WANT[label][0], (layout, label, exc, msg)
    assert WANT[label][1] in msg, (layout, label, msg)


def test_good_calls_after_the_errors_match_the_reference(guards) -> None:
    layout, seen = guards
    goods = [e for lab, e, _ in seen[0] if lab == "good"]
    assert goods == ["none"] * 4, (layout, goods)
