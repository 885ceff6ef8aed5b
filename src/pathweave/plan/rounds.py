"""The data plane's round rule, shared by its schedule and the time model.

The executor runs a call as rounds (:mod:`pathweave.runtime.schedule`); the
time model charges ``round_s`` per round (:func:`pathweave.plan.timemodel.executor_rounds`).
Both count the rounds with the functions here, so the two cannot drift apart:

* :func:`route_ranks`: the ranks along each path (its GPU vertices);
* :func:`pacing`: the call's entry rounds ``R`` and each stream's staging window;
* :func:`entry_round`: the round chunk ``c`` of a fragment enters;
* :func:`unpaced_direct`: the direct fragments that go whole in round 0.

Pure numpy (scipy for the connected components); no torch.
"""

from __future__ import annotations

import numpy as np

from pathweave.fabric import PathSet

__all__ = ["entry_round", "pacing", "route_ranks", "unpaced_direct"]


def route_ranks(paths: PathSet) -> np.ndarray:
    """``int32[num_paths, K]``: the ranks along each path (its GPU vertices), padded with -1.

    NIC, switch and host vertices involve no process, so a rail path from
    ``s`` to ``d`` via forwarding GPUs ``x`` and ``y`` is ``[s, x, y, d]``
    and a spine path is ``[s, d]``. Kept with the path set. Every path has
    one, including those the data plane refuses to run
    (:func:`pathweave.runtime.schedule.path_routes` checks that).

    Examples
    --------
    >>> import pathweave as pw
    >>> ps = pw.fabric.candidate_paths(pw.fabric.preset("h100-2x4"))
    >>> r = route_ranks(ps)
    >>> [r[p][r[p] >= 0].tolist() for p in ps.pair_paths(0, 5)]
    [[0, 4, 5], [0, 1, 5], [0, 2, 6, 5], [0, 3, 7, 5]]
    """

    def build() -> np.ndarray:
        fab = paths.fabric
        links = paths.links
        pad = links < 0
        safe = np.where(pad, 0, links)
        heads = np.where(pad, -1, fab.link_dst[safe])
        verts = np.concatenate([fab.link_src[safe[:, :1]], heads], axis=1)
        ranks = np.where(verts >= 0, fab.vertex_rank[np.maximum(verts, 0)], -1)
        # Keep GPU vertices in order: a stable sort pushes the -1 holes to the end.
        key = np.argsort(ranks < 0, axis=1, kind="stable")
        out = np.take_along_axis(ranks, key, axis=1)
        width = int((out >= 0).sum(axis=1).max()) if out.size else 2
        out = np.ascontiguousarray(out[:, :width]).astype(np.int32)
        out.setflags(write=False)
        return out

    return paths.derived("plan.route_ranks", build)


def pacing(nchunk: np.ndarray, window: int) -> tuple[int, np.ndarray]:
    """``(R, w)``: the call's entry rounds and each fragment's staging window.

    ``R = max(1, ceil(k_max / (window // 2)))``: the largest fragment enters
    ``window // 2`` chunks per round, as a lone forwarded stream always did;
    a fragment of ``k_f`` chunks enters ``k_f / R`` per round
    (:func:`entry_round`). Its window ``w_f = min(k_f, max(2, ceil(window *
    k_f / k_max)))`` follows its bytes (chunks in flight per round in
    proportion to the chunks it moves per round), and is large enough for
    slot re-use: chunk ``c + w_f`` enters ``floor(w_f * R / k_f) >= window /
    (window // 2) >= 2`` rounds after chunk ``c``, so after chunk ``c`` was
    forwarded (one round after it arrived). Every fragment counts, paced or
    not.

    Examples
    --------
    >>> R, w = pacing(np.array([16, 4, 1]), 4)
    >>> R, w.tolist()
    (8, [4, 2, 1])
    """
    nchunk = np.asarray(nchunk, dtype=np.int64)
    if nchunk.size == 0:
        return 1, np.zeros(0, dtype=np.int64)
    per_round = max(1, int(window) // 2)
    kmax = int(nchunk.max())
    rounds = max(1, -(-kmax // per_round))
    want = -(-(int(window) * nchunk) // max(kmax, 1))
    return rounds, np.minimum(nchunk, np.maximum(2, want)).astype(np.int64)


def entry_round(
    chunk: np.ndarray, nchunk: np.ndarray, rounds: int, whole: np.ndarray | None = None
) -> np.ndarray:
    """The round chunk ``chunk`` of a fragment of ``nchunk`` chunks enters: ``floor(c R / k)``.

    Every round is a slice of the whole call: each fragment moves about
    ``1/R`` of its bytes per round, so the links it shares carry it in
    proportion to its bytes. Hop ``h`` of the chunk moves ``h`` rounds later.
    Where ``whole`` (the chunk's fragment is :func:`unpaced_direct`) it is 0.

    Examples
    --------
    >>> entry_round(np.arange(4), np.full(4, 4), 8).tolist()
    [0, 2, 4, 6]
    >>> entry_round(np.arange(4), np.full(4, 4), 8, np.ones(4, dtype=bool)).tolist()
    [0, 0, 0, 0]
    """
    rnd = (np.asarray(chunk, dtype=np.int64) * rounds) // np.maximum(nchunk, 1)
    return rnd if whole is None else np.where(whole, 0, rnd)


def unpaced_direct(routes: np.ndarray, links: np.ndarray, num_ranks: int) -> np.ndarray:
    """``bool[F]``: the direct fragments that rounds need not pace, sent whole in round 0.

    Fragments are connected where they share a fabric link (``links``,
    ``int[F, K]`` padded with -1) or a rank of their route (``routes``). A
    direct fragment whose connected set of fragments holds no forwarded one
    is unpaced: every link it uses carries only such fragments, all whole in
    round 0, so each moves its bytes in proportion to them there as in every
    paced round (and nothing else is posted on its ranks, which on NCCL run a
    rank's rounds one after another).

    Examples
    --------
    >>> routes = np.array([[0, 1, -1], [2, 3, -1], [2, 0, 3]])
    >>> unpaced_direct(routes, np.array([[0], [1], [2]]), 4).tolist()
    [False, False, False]
    >>> unpaced_direct(routes[:2], np.array([[0], [1]]), 4).tolist()
    [True, True]
    >>> unpaced_direct(routes[[0, 2]], np.array([[0], [0]]), 5).tolist()
    [False, False]
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    routes = np.asarray(routes, dtype=np.int64)
    links = np.asarray(links, dtype=np.int64)
    nf = routes.shape[0]
    if nf == 0:
        return np.zeros(0, dtype=bool)
    num_links = int(links.max(initial=-1)) + 1
    res = np.concatenate([links, np.where(routes >= 0, routes + num_links, -1)], axis=1)
    fi, col = np.nonzero(res >= 0)
    m = nf + num_links + num_ranks
    graph = coo_matrix((np.ones(fi.size), (fi, nf + res[fi, col])), shape=(m, m))
    _, comp = connected_components(graph, directed=False)
    forwarded = (routes >= 0).sum(axis=1) > 2
    tainted = np.zeros(m, dtype=bool)
    tainted[comp[:nf][forwarded]] = True
    return ~forwarded & ~tainted[comp[:nf]]
