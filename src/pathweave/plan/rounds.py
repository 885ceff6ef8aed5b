"""The data plane's round rule, shared by its schedule and the time model.

The executor runs a call as rounds (:mod:`pathweave.runtime.schedule`); the
time model charges ``round_s`` per round (:func:`pathweave.plan.timemodel.executor_rounds`).
Both count the rounds with the functions here, so the two cannot drift apart:

* :func:`route_ranks`: the ranks along each path (its GPU vertices);
* :func:`pacing`: the call's entry rounds ``R`` and each stream's staging window;
* :func:`entry_round`: the round chunk ``c`` of a fragment enters;
* :func:`unpaced_direct`: the direct fragments that go whole in round 0;
* :func:`pipeline_fill_s`: the store-and-forward fill of the gloo data
  plane's messages per fragment, which the emulator's prediction simulates
  and its ranks' time model decides with (``SimModel.message_fill``).

Pure numpy (scipy for the connected components); no torch.
"""

from __future__ import annotations

import numpy as np

from pathweave.fabric import PathSet

__all__ = ["entry_round", "pacing", "pipeline_fill_s", "route_ranks", "unpaced_direct"]


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


def _rounds_of(nbytes: np.ndarray, chunk_bytes: int, window: int
               ) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """``(b, k, R, r_last)``: each fragment's bytes and chunks, the call's rounds
    (:func:`pacing`) and the round of each fragment's last chunk."""
    b = np.asarray(nbytes, dtype=np.int64)
    k = np.maximum(-(-b // int(chunk_bytes)), 1)
    rounds, _ = pacing(k, window)
    return b, k, rounds, (k - 1) * rounds // k


def _entered(rnd: np.ndarray | int, b: np.ndarray, k: np.ndarray, rounds: int,
             chunk_bytes: int) -> np.ndarray:
    """Bytes of each fragment in its first ``rnd`` rounds: chunk ``c`` enters round
    ``floor(c R / k)`` (:func:`entry_round`), so ``min(b, ceil(rnd k / R) * chunk)``."""
    return np.minimum(b, -(-(rnd * k) // rounds) * int(chunk_bytes))


def _messages(b: np.ndarray, k: np.ndarray, rounds: int, r_last: np.ndarray,
              chunk_bytes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(first, prev, last, r_prev)``: bytes of each fragment's first, next-to-last and
    last message in the data plane's schedule, and the next-to-last one's round
    (``b, k, rounds, r_last``: :func:`_rounds_of`).

    The schedule (:mod:`pathweave.runtime.schedule`) cuts a fragment of ``k``
    chunks into the call's ``R`` rounds (:func:`pathweave.plan.rounds.pacing`),
    chunk ``c`` in round ``floor(c R / k)``, and one message carries a
    fragment's chunks of one round: the first message holds ``ceil(k / R)``
    chunks, the last the chunks from ``c_r = ceil(r k / R)`` on, ``r`` the last
    chunk's round (the short last chunk included), the one before it those of
    chunk ``c_r - 1``'s round. A fragment of one message has ``prev`` 0.
    """
    c_r = -(-(r_last * k) // rounds)
    r_prev = np.where(c_r > 0, (c_r - 1) * rounds // k, r_last)
    before_last = _entered(r_last, b, k, rounds, chunk_bytes)
    return (_entered(1, b, k, rounds, chunk_bytes),
            before_last - _entered(r_prev, b, k, rounds, chunk_bytes),
            b - before_last, r_prev)


def _after_last(r_i: int, shift_i: int, j: np.ndarray, shift_j: np.ndarray, ahead: np.ndarray,
                b: np.ndarray, k: np.ndarray, rounds: int, chunk_bytes: int) -> float:
    """Bytes of fragments ``j`` posted on one connection after a fragment's message of
    round ``r_i`` there, messages going out by round, then ``ahead`` (those of ``j``
    posted before it in a round they share). A hop ``shift`` of chunks that entered in
    round ``r`` is posted in ``r + shift``."""
    upto = np.maximum(r_i + shift_i - shift_j + ahead, 0)  # j's rounds before that message
    return float((b[j] - _entered(upto, b[j], k[j], rounds, chunk_bytes)).sum())


def _own_behind(first_hop: np.ndarray, b: np.ndarray, k: np.ndarray, rounds: int,
                r_msgs: tuple[np.ndarray, ...], chunk_bytes: int) -> list[np.ndarray]:
    """Per array of message rounds in ``r_msgs`` (``r_msgs[m][i]``: the round of one
    message of fragment ``i``, its last or next-to-last), per fragment, the bytes of its
    source's own messages posted after that message on its first connection
    (``first_hop[i]``: the first two ranks of its route; ``b, k, rounds``:
    :func:`_rounds_of`).

    gloo sends a connection's messages one after another, in the order they
    are posted, and a source posts its own messages at the start in the
    schedule's order: by round, then fragment (:mod:`pathweave.runtime.schedule`).
    So behind fragment ``i``'s last message (round ``r_i``) are the later
    fragments' bytes from round ``r_i`` on and the earlier ones' from round
    ``r_i + 1`` on (:func:`_entered`).
    """
    conn = first_hop.astype(np.int64)
    key = conn[:, 0] * (int(conn.max(initial=0)) + 1) + conn[:, 1]
    behind = [np.zeros(b.size) for _ in r_msgs]
    for c in np.unique(key):
        on = np.flatnonzero(key == c)
        if on.size < 2:
            continue
        for i in on:
            j = on[on != i]
            for out, r in zip(behind, r_msgs, strict=True):
                out[i] = _after_last(int(r[i]), 0, j, 0, j < i, b, k, rounds, chunk_bytes)
    return behind


def _forwards_behind(routes: np.ndarray, neck: np.ndarray, b: np.ndarray, k: np.ndarray,
                     rounds: int, r_msgs: tuple[np.ndarray, ...], chunk_bytes: int
                     ) -> list[np.ndarray]:
    """Per array of message rounds in ``r_msgs`` (as :func:`_own_behind`'s), per fragment
    ``i`` forwarded into its bottleneck (``neck[i] >= 1``, the segment from route position
    ``neck[i]``), the bytes of the other forwards on that connection posted after that
    message of ``i`` there (``b, k, rounds``: :func:`_rounds_of`).

    A rank posts a peer's forwards in one order, whichever stream's data came
    first (``executor._forward_sequence``): by round (a hop ``h`` of chunks that
    entered in round ``r`` is posted in ``r + h``), then those that go on after
    the peer before those it keeps, then by fragment.
    """
    hops = (routes >= 0).sum(axis=1) - 1
    width = int(routes.max(initial=0)) + 1
    # Every forward hop (fragment j, hop h >= 1) by its connection.
    on: dict[int, list[tuple[int, int]]] = {}
    for j in range(routes.shape[0]):
        for h in range(1, int(hops[j])):
            on.setdefault(int(routes[j, h]) * width + int(routes[j, h + 1]), []).append((j, h))
    out = [np.zeros(b.size) for _ in r_msgs]
    for i in np.flatnonzero(neck >= 1):
        h_i = int(neck[i])
        others = [(j, h) for j, h in on.get(int(routes[i, h_i]) * width
                                          + int(routes[i, h_i + 1]), []) if j != i]
        if not others:
            continue
        j = np.array([o[0] for o in others])
        h_j = np.array([o[1] for o in others])
        fin_i, fin_j = h_i == hops[i] - 1, h_j == hops[j] - 1
        ahead = (fin_j < fin_i) | ((fin_j == fin_i) & (j < i))
        for behind, r in zip(out, r_msgs, strict=True):
            behind[i] = _after_last(int(r[i]), h_i, j, h_j, ahead, b, k, rounds, chunk_bytes)
    return out


def _posted_late(paths: PathSet, flow_path: np.ndarray, flow_bytes: np.ndarray, live: np.ndarray,
                 segs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Bytes each link carries as forwards, and as fed direct messages.

    A rank posts its own messages at the start; its forwards to a peer in one
    order (:func:`_forwards_behind`); its direct messages to a peer it also
    forwards to one at a time behind the forwards (``executor._fed_sends``).
    """
    fab, ranks = paths.fabric, route_ranks(paths)
    forwarded, fed = np.zeros(fab.num_links), np.zeros(fab.num_links)
    relays = set()
    for f, (links, seg) in zip(live, segs, strict=True):
        np.add.at(forwarded, links[seg > 0], float(flow_bytes[f]))
        r = ranks[int(flow_path[f])]
        r = r[r >= 0]
        relays.update(zip(r[1:-1].tolist(), r[2:].tolist(), strict=True))
    for f, (links, seg) in zip(live, segs, strict=True):
        r = ranks[int(flow_path[f])]
        if seg[-1] == 0 and (int(r[0]), int(r[1])) in relays:
            fed[links] += float(flow_bytes[f])
    return forwarded, fed


def pipeline_fill_s(paths: PathSet, flow_path: np.ndarray, flow_bytes: np.ndarray,
                    chunk_bytes: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """``(before_s, after_s)`` per fragment: the gloo data plane's store-and-forward fill.

    A forwarding rank passes a stream on one message at a time, once all of
    it has arrived (``Transport._run_streams``: it waits for a step's
    receives, then posts its forwards), and a message is a fragment's
    chunks of one round (:func:`_messages`; ``window // 2`` chunks for the
    call's largest fragment). The forwarding ranks (GPUs inside the path; a
    NIC is kernel forwarding here) cut the path into segments. A pipeline
    of messages through them streams at its slowest segment, its
    *bottleneck*, here the segment whose most loaded link takes longest
    (its load over its capacity), and adds one message per other
    segment: the first message over each segment before the bottleneck
    before the fragment's first byte crosses it (``before_s``: other
    fragments keep the bottleneck busy meanwhile), the last message over
    each segment after it once its last byte has crossed (``after_s``: the
    forwarding rank behind a rail can send the stream's last message on
    only after the rail delivered it; when that message is a short
    remainder that arrives while the one before it is still being passed
    on, the two, less the bottleneck's time between their arrivals), less
    the time the bottleneck spends
    on bytes that cross it after the fragment's last one: gloo writes a
    connection's messages in the order they are posted, each link carries
    one connection per direction in the emulator, and a rank posts its own
    messages first, in the schedule's order (round, then fragment: a
    fragment's own later messages on its first connection are behind it,
    :func:`_own_behind`), its forwards to a peer in one order (round, those
    that go on after the peer first, then fragment: :func:`_forwards_behind`)
    and its fed direct messages behind those (:func:`_posted_late`). Direct fragments and
    ``chunk_bytes`` 0 have none.

    Examples
    --------
    6 MiB from GPU 0 to GPU 5 of the other node, half on the PXN path
    (NVLink to GPU 1, then its 5 MB/s rail), half DeepEP's way (rail 0 to
    GPU 4, then NVLink to 5): 3 MiB in 512 KiB chunks is 6 chunks, 3 rounds
    at window 4, 2 chunks (1 MiB) per message; 1 MiB over a 12 MB/s NVLink
    is 87.4 ms, before the rail on the first path, after it on the second:

    >>> import numpy as np, pathweave as pw
    >>> from pathweave.emulate import scale_fabric
    >>> fab = scale_fabric(pw.fabric.preset("h100-2x4"), 1e-4)
    >>> ps = pw.fabric.candidate_paths(fab)
    >>> via = lambda r: next(p for p in ps.pair_paths(0, 5)
    ...                      if pw.plan.rounds.route_ranks(ps)[p][1] == r)
    >>> D = np.zeros((8, 8), dtype=np.int64); D[0, 5] = 6 << 20
    >>> fp, fb = np.array([via(1), via(4)]), np.array([3 << 20, 3 << 20])
    >>> before, after = pipeline_fill_s(ps, fp, fb, 1 << 19, 4)
    >>> np.round(before * 1e3, 1).tolist(), np.round(after * 1e3, 1).tolist()
    ([87.4, 0.0], [0.0, 87.4])
    """
    from pathweave.fabric import VertexKind

    fab, ps = paths.fabric, paths
    flow_path = np.asarray(flow_path, dtype=np.int64)
    flow_bytes = np.asarray(flow_bytes, dtype=np.int64)
    nf = flow_path.size
    before, after = np.zeros(nf), np.zeros(nf)
    live = np.flatnonzero(flow_bytes > 0)
    if chunk_bytes <= 0 or live.size == 0:
        return before, after
    b, k, rounds, r_last = _rounds_of(flow_bytes[live], int(chunk_bytes), int(window))
    first, prev, last, r_prev = _messages(b, k, rounds, r_last, int(chunk_bytes))
    busy_s = ps.link_load_bytes(flow_path, flow_bytes) / fab.capacity_Bps
    gpu = fab.vertex_kind == VertexKind.GPU
    segs = []
    for f in live:
        p = int(flow_path[f])
        links = ps.links[p, : ps.length[p]]
        # segment of each hop: a new one after every forwarding GPU
        segs.append((links, np.cumsum(np.r_[0, gpu[fab.link_src[links[1:]]]])))
    forwarded, fed = _posted_late(ps, flow_path, flow_bytes, live, segs)
    routes = route_ranks(ps)[flow_path[live]]
    # Each fragment's bottleneck hop: its most loaded link's (load over capacity).
    hops = [int(np.argmax(busy_s[links])) for links, _ in segs]
    necks = np.array([seg[h] for (_, seg), h in zip(segs, hops, strict=True)])
    # Bytes posted on the bottleneck's connection after the fragment's last and
    # next-to-last messages: a source's own messages (neck 0) or a peer's forwards.
    own, own_prev = _own_behind(routes[:, :2], b, k, rounds, (r_last, r_prev), int(chunk_bytes))
    late, late_prev = _forwards_behind(routes, necks, b, k, rounds, (r_last, r_prev),
                                       int(chunk_bytes))
    for i, (f, (links, seg)) in enumerate(zip(live, segs, strict=True)):
        if seg[-1] == 0:
            continue
        cap = np.array([fab.capacity_Bps[links[seg == j]].min() for j in range(seg[-1] + 1)])
        neck, e = necks[i], links[hops[i]]
        before[f] = first[i] * (1.0 / cap[:neck]).sum()
        # The drain after the bottleneck delivered the last message: that
        # message, or the next-to-last one still going on when the last (a
        # short remainder) arrived, the bottleneck's bytes between the two
        # apart (``gap``).
        per_byte_s = (1.0 / cap[neck + 1:]).sum()
        gap = last[i] + (own_prev[i] - own[i] if neck == 0 else late_prev[i] - late[i])
        drain_s = max(last[i] * per_byte_s,
                      (prev[i] + last[i]) * per_byte_s - gap / fab.capacity_Bps[e])
        # What crosses the bottleneck after this fragment's last byte keeps it
        # busy while the drain goes on: behind a source's own message its later
        # own ones, the forwards and the fed ones; behind a forward the
        # forwards posted after it on its connection, and the fed ones.
        behind = fed[e] + (forwarded[e] + own[i] if neck == 0 else late[i])
        after[f] = max(0.0, drain_s - behind / fab.capacity_Bps[e])
    return before, after
