"""Plan concurrent groups on one fabric: per group (each alone) or jointly.

A :class:`~pathweave.traffic.groups.GroupWorkload` puts several groups'
demands on one fabric. Each group's runtime sees only its own ranks: its
:class:`~pathweave.runtime.Orchestrator` plans on
:meth:`Fabric.subset(ranks) <pathweave.fabric.Fabric.subset>`, where no path
forwards through a GPU outside the group (another group's process cannot
forward bytes). So the candidate paths of a group's pair are its subset's,
and :func:`group_paths` maps every group's subset paths onto the whole
fabric's links, one :class:`~pathweave.fabric.PathSet` over the fabric with
paths for intra-group pairs only (pairs across groups have none and carry
nothing). Both modes plan over it, so their plans are directly comparable:

``per_group``
    Each group planned alone on its subset, as its Orchestrator does
    (blind to the others' load); the plans are then put side by side.
``joint``
    The union of the groups' demands planned at once over the shared path
    set with the same policy: every group's choice sees the others' load on
    shared links (spine uplinks, rails a NIC shares, PCIe trees).

Either way the result is one fabric-wide :class:`~pathweave.plan.Plan`:
:func:`pathweave.sim.simulate` runs all groups together (``start_s`` staggers
them).

Examples
--------
Two groups on a fabric whose GPUs share NICs in pairs: group A holds GPUs
0 and 2 of both nodes (rails 0 and 1), group B GPU 1 (rail 0 only). Alone,
A splits its bytes over both rails; jointly, it leaves rail 0 to B:

>>> import numpy as np, pathweave as pw
>>> from pathweave.plan.groups import plan_groups
>>> from pathweave.traffic.groups import groups
>>> fab = pw.fabric.resolve("cluster:nodes=2,gpus_per_node=4,node_kind=nvlink-mesh,rails=2")
>>> a = np.zeros((4, 4)); a[0, 2] = 200e6          # A: n0.gpu0 -> n1.gpu0
>>> b = np.zeros((2, 2)); b[0, 1] = 100e6          # B: n0.gpu1 -> n1.gpu1
>>> wl = groups(8, [a, b], ranks=[(0, 2, 4, 6), (1, 5)])
>>> for mode in ("per_group", "joint"):
...     plan = plan_groups(fab, wl, "optimal", mode=mode)
...     print(mode, round(plan.congestion_s * 1e3, 3), "ms")
per_group 4.0 ms
joint 3.0 ms
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from pathweave.errors import FabricError, PlanError, WorkloadError
from pathweave.fabric import Fabric, PathKind, PathSet, VertexKind
from pathweave.fabric.paths import DEFAULT_KINDS, candidate_paths, fabric_path_cache
from pathweave.fabric.presets import resolve
from pathweave.plan._plan import Plan
from pathweave.plan.registry import (
    COMMON_OPTIONS,
    DEFAULT_POLICY,
    as_demand,
    make,
    policies,
    policy_info,
)
from pathweave.traffic.groups import GroupWorkload, check_placement

__all__ = ["MODES", "GroupPaths", "group_paths", "plan_groups", "shared_links"]

#: Planning modes of :func:`plan_groups`.
MODES = ("per_group", "joint")


@dataclass(frozen=True, eq=False)
class GroupPaths:
    """The groups' candidate paths on the whole fabric (:func:`group_paths`).

    Attributes
    ----------
    paths
        One path set over the fabric: every group's subset paths, on the
        fabric's links and ranks; pairs across groups have none.
    subsets, sub_paths
        Each group's fabric (:meth:`Fabric.subset`) and its candidate paths.
        Groups of one *shape* (subsets equal but for the node numbers in
        their names and ``meta["ranks"]``, e.g. blocks of whole identical
        nodes) share one: the first such group's, compiled once.
    path_ids
        Per group, ``int64[sub_paths.num_paths]``: the id in ``paths`` of
        each of its subset's paths.
    """

    paths: PathSet
    subsets: tuple[Fabric, ...]
    sub_paths: tuple[PathSet, ...]
    path_ids: tuple[np.ndarray, ...]


def _subset_shape(fab: Fabric, ranks: np.ndarray, suffix: np.ndarray
                  ) -> tuple[np.ndarray, tuple[bytes, ...]]:
    """``(links, shape)``: the fabric link of each link of ``fab.subset(ranks)``,
    and the subset's structure as a key, computed without building it.

    :meth:`Fabric.subset` keeps, in the old order, every vertex outside a
    node, the non-GPU vertices of member nodes and the member GPUs, and the
    links between kept vertices, renumbering nodes densely. Two placements
    with equal keys have equal subset fabrics but for their names' node
    numbers (``suffix``: each vertex's name without its ``n<node>.``),
    so the same candidate paths in subset ids.
    """
    nodes = np.unique(ranks // fab.gpus_per_node)
    vnode = np.asarray(fab.vertex_node, dtype=np.int64)
    gpu = fab.vertex_kind == int(VertexKind.GPU)
    member = np.zeros(fab.num_vertices, dtype=bool)
    member[fab.rank_vertex[ranks]] = True
    keep_v = ((vnode < 0) | np.isin(vnode, nodes)) & (~gpu | member)
    keep_l = keep_v[fab.link_src] & keep_v[fab.link_dst]
    old = np.flatnonzero(keep_l)
    new_id = np.cumsum(keep_v) - 1
    kept = np.flatnonzero(keep_v)
    node_new = np.where(vnode[kept] >= 0, np.searchsorted(nodes, vnode[kept]), -1)
    # A member GPU's subset name is its node-local index among the members.
    local = np.where(gpu[kept], np.searchsorted(ranks, fab.vertex_rank[kept])
                     - np.searchsorted(ranks, np.maximum(vnode[kept], 0) * fab.gpus_per_node),
                     suffix[kept])
    shape = tuple(np.ascontiguousarray(a).tobytes() for a in (
        fab.vertex_kind[kept], node_new, local, gpu[kept], new_id[fab.link_src[old]],
        new_id[fab.link_dst[old]], fab.link_kind[old], fab.capacity_Bps[old],
        fab.latency_s[old]))
    return old, shape


def _name_suffixes(fab: Fabric) -> np.ndarray:
    """``int64[num_vertices]``: an id of each vertex's name less its ``n<node>.`` prefix
    (``-1 -`` the vertex's id where the name carries no such prefix: unique)."""
    names = fab.vertex_names
    node = np.asarray(fab.vertex_node, dtype=np.int64)
    ids: dict[str, int] = {}
    out = np.empty(len(names), dtype=np.int64)
    for v, (nm, k) in enumerate(zip(names, node.tolist(), strict=True)):
        head = f"n{k}."
        out[v] = ids.setdefault(nm[len(head):], len(ids)) if k >= 0 and nm.startswith(head) \
            else -1 - v
    return out


def _group_block(fab: Fabric, g: int, ranks: np.ndarray, lmap: np.ndarray, sub: Fabric,
                 sps: PathSet) -> dict[str, np.ndarray]:
    """Group ``g``'s paths (``sps``, its shape's) on the fabric's links and ranks."""
    if not (lmap.size == sub.num_links and np.array_equal(fab.link_kind[lmap], sub.link_kind)
            and np.array_equal(fab.capacity_Bps[lmap], sub.capacity_Bps)):
        raise PlanError(f"subset of ranks {ranks.tolist()} does not match fabric {fab.name!r}")
    relay = sps.kind == int(PathKind.RELAY)
    return {
        "links": np.where(sps.links >= 0, lmap[np.maximum(sps.links, 0)], -1).astype(np.int32),
        "length": sps.length, "kind": sps.kind,
        "via": np.where(relay, ranks[np.maximum(sps.via, 0)], sps.via).astype(np.int32),
        "src": ranks[sps.src].astype(np.int32), "dst": ranks[sps.dst].astype(np.int32),
    }


def _shape_paths(fab: Fabric, g: int, ranks: np.ndarray, kinds: tuple[str, ...],
                 max_hops: int | None) -> tuple[Fabric, PathSet]:
    """The subset fabric of group ``g`` and its candidate paths (compiled once per shape)."""
    try:
        sub = fab.subset(ranks, name=f"{fab.name}[group {g}]")
    except FabricError as exc:
        raise WorkloadError(f"group {g} cannot run on fabric {fab.name!r}: {exc}") from None
    if sub.rails != fab.rails:
        raise PlanError(f"group {g}: its fabric's rails {sub.rails} are not {fab.rails}")
    return sub, candidate_paths(sub, kinds, max_hops)


def group_paths(
    fabric: Fabric | str,
    ranks: Sequence[Sequence[int]],
    kinds: Sequence[str] = DEFAULT_KINDS,
    max_hops: int | None = None,
) -> GroupPaths:
    """Every group's candidate paths (its subset's) on the whole fabric; cached on it.

    Parameters
    ----------
    fabric
        The fabric all groups run on.
    ranks
        The placement: each group's fabric ranks, ascending, disjoint.
    kinds, max_hops
        Path rules (:func:`~pathweave.fabric.candidate_paths`).

    Raises
    ------
    WorkloadError
        A group whose nodes hold different numbers of its ranks (no subset
        fabric; its runtime would fall back to torch's all-to-all).
    """
    fab = resolve(fabric)
    kinds_t = tuple(sorted(set(kinds)))
    placed = tuple(tuple(int(r) for r in g) for g in ranks)
    check_placement(fab.num_ranks, placed)
    key = ("groups", placed, kinds_t, max_hops)
    return fabric_path_cache(fab).get_or_build(  # type: ignore[no-any-return]
        key, lambda: _build_group_paths(fab, placed, kinds_t, max_hops))


def _build_group_paths(fab: Fabric, placed: tuple[tuple[int, ...], ...],
                       kinds: tuple[str, ...], max_hops: int | None) -> GroupPaths:
    n = fab.num_ranks
    subs, sub_paths, lmaps = [], [], []
    shapes: dict[tuple[bytes, ...], tuple[Fabric, PathSet]] = {}
    suffix = _name_suffixes(fab)
    for g, placed_g in enumerate(placed):
        r = np.asarray(placed_g, dtype=np.int64)
        lmap, shape = _subset_shape(fab, r, suffix)
        if shape not in shapes:  # groups of one shape share its subset and paths
            shapes[shape] = _shape_paths(fab, g, r, kinds, max_hops)
        subs.append(shapes[shape][0])
        sub_paths.append(shapes[shape][1])
        lmaps.append(lmap)
    rank_of = [np.asarray(r, dtype=np.int64) for r in placed]
    pair = np.concatenate([r[sps.src] * n + r[sps.dst] for r, sps in zip(rank_of, sub_paths,
                                                                         strict=True)])
    # Groups' pairs are disjoint: a stable sort by pair keeps each group's
    # own path order inside a pair, so ids are the same on every process.
    order = np.argsort(pair, kind="stable")
    pair_ptr = _pair_ptr(pair[order], n * n)
    del pair
    inverse = np.empty(order.size, dtype=np.int64)
    inverse[order] = np.arange(order.size)
    del order
    bounds = np.cumsum([0] + [sps.num_paths for sps in sub_paths])
    path_ids = tuple(inverse[bounds[g]:bounds[g + 1]] for g in range(len(placed)))
    # Each group's block written straight to its rows: no concatenated copy.
    width = max(sps.links.shape[1] for sps in sub_paths)
    arrays = {"links": np.full((bounds[-1], width), -1, dtype=np.int32)}
    for k in ("length", "kind", "via", "src", "dst"):
        arrays[k] = np.empty(bounds[-1], dtype=np.int32 if k in ("via", "src", "dst")
                             else getattr(sub_paths[0], k).dtype)
    for g, (r, lmap, sub, sps) in enumerate(zip(rank_of, lmaps, subs, sub_paths, strict=True)):
        block = _group_block(fab, g, r, lmap, sub, sps)
        rows = path_ids[g]
        arrays["links"][rows, : block["links"].shape[1]] = block["links"]
        for k in ("length", "kind", "via", "src", "dst"):
            arrays[k][rows] = block[k]
    rank_rails: list[tuple[int, ...]] = [() for _ in range(n)]
    for r, sps in zip(placed, sub_paths, strict=True):
        for i, rank in enumerate(r):
            rank_rails[rank] = sps.rank_rails[i]
    for a in (pair_ptr, *arrays.values(), *path_ids):
        a.setflags(write=False)
    paths = PathSet(fabric=fab, num_ranks=n, pair_ptr=pair_ptr, **arrays, kinds=kinds,
                    max_hops=max_hops, rank_rails=tuple(rank_rails))
    return GroupPaths(paths, tuple(subs), tuple(sub_paths), path_ids)


def _pair_ptr(sorted_pair: np.ndarray, npairs: int, chunk: int = 1 << 22) -> np.ndarray:
    """``int64[npairs + 1]``: where each pair's run starts in ``sorted_pair``.

    Counted a chunk of pairs at a time: at 8192 ranks the table alone is
    537 MB, and ``cumsum(bincount(...))`` over all pairs would hold two.
    """
    out = np.empty(npairs + 1, dtype=np.int64)
    out[0] = 0
    for lo in range(0, npairs, chunk):
        hi = min(lo + chunk, npairs)
        a, b = np.searchsorted(sorted_pair, [lo, hi])
        counts = np.bincount(sorted_pair[a:b] - lo, minlength=hi - lo)
        np.cumsum(counts, out=out[lo + 1:hi + 1])
        out[lo + 1:hi + 1] += a
    return out


def plan_groups(
    fabric: Fabric | str,
    workload: GroupWorkload,
    policy: str | None = None,
    *,
    mode: Literal["per_group", "joint"] = "joint",
    **options: Any,
) -> Plan:
    """Plan every group of ``workload`` with ``policy``: per group or jointly.

    Parameters
    ----------
    fabric
        The fabric all groups share (its ``num_ranks`` is the workload's).
    workload
        The groups: placement, demands (:mod:`pathweave.traffic.groups`).
    policy
        Any registered policy; default :data:`pathweave.plan.DEFAULT_POLICY`.
    mode
        ``"per_group"``: each group planned alone on its subset fabric, as
        its runtime does; ``"joint"``: the union demand planned at once.
    **options
        Policy options and the path rules (``kinds``, ``max_hops``), as for
        :func:`pathweave.plan.make`.

    Returns
    -------
    Plan
        One plan over the whole fabric and :func:`group_paths`' path set;
        ``info`` holds ``mode``, ``groups`` and, per group,
        ``group_plan_s`` (``per_group``: each group's own planning time; the
        groups plan in parallel in a real job, ``plan_s`` is their sum).
    """
    fab = resolve(fabric)
    if not isinstance(workload, GroupWorkload):
        raise TypeError(f"workload must be a GroupWorkload, got {type(workload).__name__}")
    if workload.num_ranks != fab.num_ranks:
        raise WorkloadError(f"the workload has {workload.num_ranks} ranks but fabric "
                            f"{fab.name!r} has {fab.num_ranks}")
    if mode not in MODES:
        raise PlanError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    policy = DEFAULT_POLICY if policy is None else policy
    if not policy_info(policy).executable:
        # Its plan runs on a path set of its own (a peer's routing the data plane
        # cannot take), which the groups' shared path set cannot hold.
        raise PlanError(f"policy {policy!r} models a peer's own routing, not a plan a "
                        "group's runtime runs; use one of "
                        + ", ".join(policies(executable_only=True)))
    gp = group_paths(fab, workload.ranks, options.get("kinds", COMMON_OPTIONS["kinds"]),
                     options.get("max_hops", COMMON_OPTIONS["max_hops"]))
    t0 = time.perf_counter()
    if mode == "joint":
        # make checks the union and keeps its own int64 copy: no third N x N array.
        plan = make(fab, workload.union_demand(), policy, paths=gp.paths, **options)
        info = {**plan.info, "mode": mode, "groups": len(workload.groups)}
        object.__setattr__(plan, "info", info)
        return plan
    fps, fbs, times = [], [], []
    name = policy
    for g, grp in enumerate(workload.groups):
        sub_plan = make(gp.subsets[g], grp.demand, policy, paths=gp.sub_paths[g], **options)
        name = sub_plan.policy
        fps.append(gp.path_ids[g][sub_plan.flow_path])
        fbs.append(sub_plan.flow_bytes)
        times.append(sub_plan.plan_s)
    union = as_demand(workload.union_demand(), fab.num_ranks)
    fp = np.concatenate(fps)
    order = np.argsort(fp, kind="stable")  # merged ids run by pair, then path
    plan = Plan(fab, gp.paths, union, fp[order], np.concatenate(fbs)[order], str(name),
                plan_s=time.perf_counter() - t0,
                info={"mode": mode, "groups": len(workload.groups), "group_plan_s": times})
    return plan.validate()


def shared_links(plan: Plan, workload: GroupWorkload) -> np.ndarray:
    """``bool[num_links]``: links that carry bytes of two or more groups in ``plan``.

    >>> import numpy as np, pathweave as pw
    >>> from pathweave.traffic.groups import groups
    >>> fab = pw.fabric.resolve("cluster:nodes=2,gpus_per_node=4,node_kind=nvlink-mesh,rails=2")
    >>> a = np.zeros((4, 4)); a[0, 2] = 200e6
    >>> b = np.zeros((2, 2)); b[0, 1] = 100e6
    >>> wl = groups(8, [a, b], ranks=[(0, 2, 4, 6), (1, 5)])
    >>> plan = plan_groups(fab, wl, "optimal", mode="per_group")
    >>> [fab.link_name(e) for e in np.flatnonzero(shared_links(plan, wl))]
    ['n0.nic0 -> rail0', 'rail0 -> n1.nic0']
    """
    owner = workload.rank_group[plan.paths.src[plan.flow_path]]
    count = np.zeros(plan.fabric.num_links, dtype=np.int64)
    for g in range(len(workload.groups)):
        sel = (owner == g) & (plan.flow_bytes > 0)
        count += plan.paths.link_load_bytes(plan.flow_path[sel], plan.flow_bytes[sel]) > 0
    return count >= 2
