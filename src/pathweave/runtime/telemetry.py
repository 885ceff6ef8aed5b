"""Live link telemetry from the data plane's own transfers, and when to re-plan on it.

Three pieces, all deterministic functions of int64 words every rank holds,
so every rank reaches the same estimates and the same plans:

* :func:`encode_times` / :func:`decode_times`: what one rank observed in one
  call, the completion time (microseconds after its transfer started) of
  the last chunk it received of every ``(source, last forwarder)`` stream,
  as int64 words that ride along the next call's metadata row, one per
  stream the call's plan defines into the rank (:func:`streams_into`);
* :func:`link_ratios`: the per-link *effective capacity ratio* those times
  imply, and how noisy each is (greedy tomography: the most slowed link
  explains every stream that crosses it; slowdowns are relative to the
  typical stream, so a machine that is uniformly slower than the fabric
  model sees no change, and to the other streams of the same receiver and
  forwarder, so a host slow as a whole is not read as slow links);
* :class:`LinkEstimator`: a median over the last ``window`` observations per
  link (outlier-robust), quantised to ``1 / levels`` of nominal, forgotten
  after ``ttl`` calls without an observation (the link is then tried again:
  Hopper's probe of an alternative);
* :class:`SwitchPolicy`: Hopper's rule for when to probe, behind a
  confidence test: a link's estimate is planned on only when its window's
  samples show it moved ``probe_threshold`` x from what the current plan
  assumed beyond their own spread (several agreeing samples, a majority, a
  MAD bound), or, for a link's first observation, beyond many times the
  noise its call measured (evidence needed scales with the move against
  the noise); the new plan is taken only on a clear predicted win;
* :func:`round_ends`: where a call is timed by rounds (NCCL), when each
  stream's last round should end on the nominal fabric, which its measured
  round end is scaled by (round times as they come blame healthy links);
* :class:`Adaptation`: all of it for one process group of an orchestrator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pathweave._cache import Cache
from pathweave.fabric import Fabric

__all__ = [
    "Adaptation",
    "LinkEstimator",
    "SwitchPolicy",
    "adapt_auto",
    "decode_times",
    "encode_times",
    "host_word",
    "link_ratios",
    "stream_links",
    "stream_times",
    "streams_into",
]

#: Time words are microseconds; 0 means "no observation".
_US = 1e6


def encode_times(times_s: np.ndarray) -> np.ndarray:
    """Completion times (seconds, NaN = none) as int64 microsecond words (0 = none, else >= 1).

    Examples
    --------
    >>> encode_times(np.array([np.nan, 0.0, 0.25])).tolist()
    [0, 1, 250000]
    """
    t = np.asarray(times_s, dtype=np.float64).reshape(-1)
    w = np.zeros(t.size, dtype=np.int64)
    ok = np.isfinite(t)
    w[ok] = np.maximum(1, np.round(t[ok] * _US)).astype(np.int64)
    return w


def decode_times(words: np.ndarray) -> np.ndarray:
    """Inverse of :func:`encode_times` (NaN where a word is <= 0)."""
    w = np.asarray(words, dtype=np.int64)
    out = w.astype(np.float64) / _US
    out[w <= 0] = np.nan
    return out


def stream_links(paths: object, flow_path: np.ndarray, num_ranks: int) -> dict[int, np.ndarray]:
    """Fabric links of every ``(source, last forwarder, destination)`` stream of some paths.

    Returns ``{key: links}`` with ``key = (src * N + last) * N + dst``; a
    stream that several paths end in holds the union of their links.
    """
    from pathweave.runtime.schedule import path_routes

    routes = path_routes(paths)
    out: dict[int, set[int]] = {}
    n = int(num_ranks)
    for p in np.unique(np.asarray(flow_path, dtype=np.int64)).tolist():
        r = [int(x) for x in routes[p] if x >= 0]
        key = (r[0] * n + r[-2]) * n + r[-1]
        ls = paths.links[p]
        out.setdefault(key, set()).update(int(x) for x in ls[ls >= 0])
    return {k: np.array(sorted(v), dtype=np.int64) for k, v in out.items()}


def link_ratios(
    streams: dict[int, np.ndarray],
    times_s: dict[int, float],
    link_bytes: np.ndarray,
    nominal_Bps: np.ndarray,
    *,
    slow: float = 2.0 / 3.0,
    reference_quantile: float = 0.3,
    num_ranks: int | None = None,
    credit: float = np.inf,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Effective-capacity ratios per link implied by stream completion times.

    Returns ``(ratio, floor, noise, reference)``: ``ratio`` where a link
    explains slowed streams, ``floor`` (a lower bound) where a link is
    crossed only by unslowed ones; NaN where nothing is known.
    ``reference`` is the typical stream's lateness (its time over expected,
    below) that slowdowns are measured against. Floors credit every link
    with it, up to ``credit``: :class:`Adaptation` passes the reference of
    the last call on a plan made on nominal capacities, since an adapted
    plan's lock-step makes its streams late without any link being faster
    (docs/runtime.md, "Live adaptation", measured there).
    ``noise`` is, per link, how
    uncertain its ``ratio`` or ``floor`` is, in units of ``log(ratio)``
    (``inf`` where nothing is known), from the call's own measurement noise:
    the robust spread (``1.4826 * MAD``) of ``log(slowdown)`` over the
    streams that ended within ``1 / slow`` of their expected time (``inf``
    with fewer than :data:`NOISE_STREAMS` of them). A floor has the call's
    noise; a ratio has it scaled by ``log(ratio) / log(lateness)``, where
    lateness is how much the slowest stream it explains was slowed: that
    stream is what was measured, and a link that was not its bottleneck
    gets a ratio far below it. :class:`SwitchPolicy` weighs a lone
    observation with it.

    ``streams`` maps a stream key to the links it crosses, ``times_s`` the
    key to when its last byte arrived, ``link_bytes`` is what each link
    carried in the call. A stream's *expected* time is the congestion time
    of its busiest link at nominal capacity; its *slowdown* is measured over
    expected, relative to the ``reference_quantile`` of all streams (so a
    machine uniformly slower than the fabric model sees no change; not the
    least slowed stream: streams that share a link are served in some
    order, and in the emulator the first one served ended at 0.56 of its
    link's time, which made every other stream look 1.8x slowed). A stream
    slowed beyond ``1 / slow`` is explained by one link: the link that the
    most slowed streams cross (ties: the busiest), which gets the ratio that
    makes its time match the slowest of them; its streams are then removed
    and the next link is sought. A link crossed by an unslowed stream carried
    its bytes within that stream's time: a lower bound of its ratio (it may
    have had slack), ``min(1, busy / time)``.

    With ``num_ranks`` (the keys are then :func:`stream_links` keys), a
    rank is a resource too: a host that is slow as a whole (CPU-bound)
    finishes *all* its streams late, which no link explains. A stream is
    then slowed only if it also ended ``1 / slow`` x later than the earliest
    of the other streams into its receiver, and than the earliest of the
    other streams its last forwarder sent: a link is blamed only for
    slowing some streams of a host but not others. (Measured in the
    emulator: every stream into the hot receiver of ``hotspot:0.6`` ended
    at the same moment, 1 to 14 x its expected time.)

    Examples
    --------
    Three links of 10 B/s, each carrying 10 B (1 s busy). Stream 0 crosses
    link 0 and ends at 1 s; streams 1 and 2 cross links 0 and 2, and 1 and 2,
    and end at 4 s: link 2, common to both slow streams, is at a quarter
    and explains them; link 0 is at least at full speed; nothing is known of
    link 1 (its one stream is explained).

    >>> streams = {0: np.array([0]), 1: np.array([0, 2]), 2: np.array([1, 2])}
    >>> r, lo, noise, _ = link_ratios(streams, {0: 1.0, 1: 4.0, 2: 4.0}, np.full(3, 10.0),
    ...                               np.full(3, 10.0), reference_quantile=0.0)
    >>> r.tolist(), lo.tolist(), noise.tolist()
    ([nan, nan, 0.25], [1.0, nan, nan], [inf, inf, inf])

    Six on-time streams 1.00, 1.00, 1.02, 1.04, 1.06, 1.10 x their expected
    time (one busy second each) and one 3 x late: the noise is the spread of
    the six, 1.4826 times the median of their log-distances from their
    median, about 0.04; link 6 is its late stream's bottleneck (ratio 1/3,
    lateness 3), so its ratio's noise is the call's:

    >>> keys = {k: np.array([k]) for k in range(7)}
    >>> t = dict(enumerate([1.0, 1.0, 1.02, 1.04, 1.06, 1.10, 3.0]))
    >>> r, lo, noise, _ = link_ratios(keys, t, np.full(7, 10.), np.full(7, 10.),
    ...                               reference_quantile=0.0)
    >>> round(float(noise[6]), 4), round(float(r[6]), 4)
    (0.0432, 0.3333)

    Three ranks, one link per pair (link ``3 s + d`` from ``s`` to ``d``),
    10 B on each. Rank 0 is slow as a whole: both its streams end at 4 s;
    the others end at 1 s. Without ranks as resources, the links into rank
    0 look slow; with them nothing is blamed (ratios are lower bounds only):

    >>> n = 3
    >>> keys = {(s * n + s) * n + d: np.array([3 * s + d]) for s in range(n) for d in range(n)
    ...         if s != d}
    >>> t = {k: 4.0 if k % n == 0 else 1.0 for k in keys}
    >>> np.flatnonzero(np.isfinite(link_ratios(keys, t, np.full(9, 10.), np.full(9, 10.))[0]))
    array([3, 6])
    >>> r, lo, *_ = link_ratios(keys, t, np.full(9, 10.0), np.full(9, 10.0), num_ranks=n)
    >>> bool(np.isnan(r).all()), lo[[3, 6]].tolist()
    (True, [0.25, 0.25])
    """
    nom = np.asarray(nominal_Bps, dtype=np.float64)
    busy_s = np.asarray(link_bytes, dtype=np.float64) / nom
    out = np.full(nom.size, np.nan)
    floor = np.full(nom.size, np.nan)
    keys = [k for k in streams if np.isfinite(times_s.get(k, np.nan)) and times_s[k] > 0
            and busy_s[streams[k]].max(initial=0) > 0]
    if not keys:
        return out, floor, np.full(nom.size, np.inf), np.nan
    # crosses[i, l]: stream i crosses link l
    crosses = np.zeros((len(keys), nom.size), dtype=bool)
    for i, k in enumerate(keys):
        crosses[i, streams[k]] = True
    expect = np.where(crosses, busy_s, 0.0).max(axis=1)
    took = np.array([times_s[k] for k in keys])
    scale = float(np.quantile(took / expect, reference_quantile))
    took = took / scale                           # in nominal-fabric seconds
    ref = np.maximum(expect, _host_reference(np.array(keys), took, num_ranks))
    slowed = took * slow > ref
    on_time = took * slow <= expect
    noise = np.full(nom.size, np.inf)
    call_noise = _noise(took[on_time] / expect[on_time])
    left = np.ones(len(keys), dtype=bool)
    while (slowed & left).any():
        m = crosses[slowed & left]
        count = m.sum(axis=0)
        latest = np.where(m, took[slowed & left][:, None], 0.0).max(axis=0)
        best = np.flatnonzero(count == count.max())
        link = int(best[np.argmax(busy_s[best])])
        out[link] = min(1.0, busy_s[link] / latest[link])
        # the evidence is the slowest stream's lateness (> 1 / slow), not the
        # ratio: a link that was not that stream's bottleneck gets a ratio far
        # below its lateness; the noise is rescaled to the ratio's log units
        i = np.flatnonzero(slowed & left & crosses[:, link])
        j = i[np.argmax(took[i])]
        noise[link] = call_noise * (-np.log(out[link]) / np.log(took[j] / ref[j])
                                    if out[link] < 1.0 else 1.0)
        left &= ~crosses[:, link]
    # An unslowed stream bounds its links from below only: a link it crosses
    # carried its bytes within the stream's time (at least).
    m = crosses[left]
    if m.size:
        real = took[left][:, None] * (scale / max(min(scale, credit), 1e-300))
        lb = np.where(m, np.minimum(1.0, busy_s[None, :] / real), np.nan)
        seen = m.any(axis=0) & np.isnan(out)
        floor[seen] = np.nanmax(lb[:, seen], axis=0)
        noise[seen] = call_noise
    return out, floor, noise, scale


#: :func:`link_ratios` measures a call's noise only over at least this many on-time streams.
NOISE_STREAMS = 5


def _noise(slowdown: np.ndarray) -> float:
    """Robust spread of ``log(slowdown)``: ``1.4826 * MAD`` (the standard deviation for
    normal noise), ``inf`` for fewer than :data:`NOISE_STREAMS` values."""
    if slowdown.size < NOISE_STREAMS:
        return np.inf
    x = np.log(slowdown)
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def _host_reference(keys: np.ndarray, took: np.ndarray, num_ranks: int | None) -> np.ndarray:
    """Per stream, the earliest time among the streams into its receiver and from its forwarder.

    The groups are its receiver's streams and its last forwarder's (the
    ranks whose own slowness would delay every stream of the group); a
    group of one stream is no reference (0).
    """
    ref = np.zeros(keys.size)
    if num_ranks is None:
        return ref
    n = int(num_ranks)
    for host in (keys % n, keys // n % n):  # receiver, last forwarder
        first = np.full(n, np.inf)
        np.minimum.at(first, host, took)
        size = np.bincount(host, minlength=n)
        ref = np.maximum(ref, np.where(size[host] > 1, first[host], 0.0))
    return ref


def _quantise(ratio: np.ndarray, levels: int) -> np.ndarray:
    """Capacity ratios as ``int64`` steps of ``1 / levels`` of nominal, in ``[1, levels]``."""
    return np.clip(np.round(ratio * levels), 1, levels).astype(np.int64)


class LinkEstimator:
    """Median-of-window effective-capacity ratio per link, quantised, with expiry.

    Parameters
    ----------
    num_links
        Links of the fabric.
    window
        Observations kept per link; the estimate is their median.
    levels
        Quantisation: estimates are multiples of ``1 / levels`` in
        ``[1 / levels, 1]``.
    ttl
        Calls without an observation after which a link is assumed back at
        nominal (and so tried again by the next plan).
    vote
        A lower bound at least this share of nominal is an observation
        (:meth:`update`).

    Examples
    --------
    >>> est = LinkEstimator(2, window=3)
    >>> for r in (0.4, 0.4, 5e-3):               # one outlier does not move a median
    ...     est.update(np.array([1.0, r]))
    >>> est.ratio_q().tolist()
    [64, 26]
    """

    def __init__(self, num_links: int, *, window: int = 5, levels: int = 64, ttl: int = 64,
                 vote: float = 2.0 / 3.0):
        if window < 1 or levels < 2 or ttl < 1:
            raise ValueError(f"window, levels, ttl must be >= 1, 2, 1; got {window}, {levels}, "
                             f"{ttl}")
        self.levels = int(levels)
        self.vote = float(vote)
        self.ttl = int(ttl)
        self._hist = np.full((int(window), num_links), np.nan)  # a ring per link
        self._noise = np.full((int(window), num_links), np.inf)  # each sample's call noise
        self._next = np.zeros(num_links, dtype=np.int64)
        self._age = np.zeros(num_links, dtype=np.int64)
        # ratio_q of the current windows: they change only in update(), and the
        # orchestrator asks every call (a NaN median per link costs a rank about
        # a millisecond, 8 ranks on 2 cores several per call).
        self._q: np.ndarray | None = None
        #: Bumped by every :meth:`update`: what the switch test computed on is still current.
        self.version = 0

    @property
    def samples(self) -> np.ndarray:
        """The windows, ``float[window, num_links]``: each link's last observations
        (NaN: none), in ring order. Read-only."""
        v = self._hist.view()
        v.setflags(write=False)
        return v

    @property
    def noise(self) -> np.ndarray:
        """Beside :attr:`samples`: the noise of the call each sample came from
        (:func:`link_ratios`' per-link noise; ``inf``: unknown, or no sample). Read-only."""
        v = self._noise.view()
        v.setflags(write=False)
        return v

    def _median(self) -> np.ndarray:
        """Median of each link's window (NaN for an empty one)."""
        empty = np.isnan(self._hist).all(axis=0)
        out = np.full(self._hist.shape[1], np.nan)
        if (~empty).any():
            out[~empty] = np.nanmedian(self._hist[:, ~empty], axis=0)
        return out

    def update(self, ratios: np.ndarray, floors: np.ndarray | None = None,
               noise: np.ndarray | None = None) -> None:
        """Add one call's ratios (NaN: not observed), lower bounds (``floors``) and noise.

        A lower bound above a link's estimate (the link proved faster) is
        taken as an observation. One of at least ``vote`` of nominal
        (:func:`link_ratios`' ``slow``: what an unslowed stream bounds its
        own bottleneck link by) but below the estimate is taken as an
        observation at the estimate: the call agreed with it, a vote that
        :class:`SwitchPolicy` counts (dropped, a link that noise made look
        slow in two calls of five looked slow in two of two). Others say
        nothing (a link with slack in the call). A lower bound
        of a link without an estimate (no stream of it was slowed) is taken
        as an observation at nominal: one slow call after it moves the
        median only halfway (a single late call, measured in the emulator
        without any co-tenant, is no reason to re-plan), while a link slow
        from its first call on is learned in that call. ``noise`` per link
        (:func:`link_ratios`; ``None``: unknown) is kept beside each sample.
        """
        r = np.array(ratios, dtype=np.float64)
        if floors is not None:
            lo = np.asarray(floors, dtype=np.float64)
            med = self._median()
            up = np.isnan(r) & np.isfinite(lo) & np.isfinite(med) & ((lo > med) | (lo >= self.vote))
            r[up] = np.maximum(lo[up], med[up])
            r[np.isnan(r) & np.isfinite(lo) & np.isnan(med)] = 1.0
        seen = np.flatnonzero(np.isfinite(r))
        slot = self._next[seen] % self._hist.shape[0]
        self._hist[slot, seen] = np.clip(r[seen], 0.0, 1.0)
        self._noise[slot, seen] = np.inf if noise is None else np.asarray(noise)[seen]
        self._next[seen] += 1
        self._age[seen] = 0
        unseen = np.isnan(r)
        self._age[unseen] += 1
        stale = unseen & (self._age > self.ttl)
        self._hist[:, stale] = np.nan
        self._noise[:, stale] = np.inf
        self._q = None
        self.version += 1

    def ratio_q(self) -> np.ndarray:
        """Quantised estimate per link: ``int64`` in ``[1, levels]`` (``levels`` = nominal).

        Read-only, and the same array until the next :meth:`update`.
        """
        if self._q is None:
            med = self._median()
            q = np.full(med.size, self.levels, dtype=np.int64)
            ok = np.isfinite(med)
            q[ok] = _quantise(med[ok], self.levels)
            q.setflags(write=False)
            self._q = q
        return self._q

    def capacity_Bps(self, nominal_Bps: np.ndarray) -> np.ndarray:
        """Estimated effective capacity per link."""
        return np.asarray(nominal_Bps, dtype=np.float64) * self.ratio_q() / self.levels


@dataclass
class SwitchPolicy:
    """When learned capacities are sure enough to plan on: a confidence test per link.

    Hopper probes when a path's time exceeds ``probe_threshold`` x its
    baseline. One observation is not enough for that here: a call's receive
    times are noisy (a descheduled rank, a first call that sets up
    connections), and a plan made on one noisy call is a switch paid for by
    every call after it. So a link's estimate replaces the value the current
    plan was made with (``planned_q``) only when its window of observations
    (:attr:`LinkEstimator.samples`) shows a ``probe_threshold``-fold move
    beyond their own spread:

    * a sign test: at least ``agree`` observations moved that far the same
      way, and they are a strict majority of the window (one outlier moves
      nothing; nor do one nominal and one slow call);
    * a one-sided bound: the window's median (of logarithms: ratios are
      multiplicative), moved back towards the planned value by ``z`` robust
      standard errors (``1.4826 * MAD / sqrt(n)``), is still
      ``probe_threshold``-fold away (samples that agree but scatter widely
      around the threshold move nothing).

    The evidence needed scales with the size of the move against the noise
    the samples were measured with: a window of *one* observation moves the
    link when that observation is, besides ``probe_threshold``-fold away,
    ``single_z`` times its noise away from the planned value (the noise
    :func:`link_ratios` measures on the call's on-time streams, floored at
    ``noise_floor``). A link found at 0.55 of nominal in a call whose other
    streams ended within a few percent of their model is learned from that
    call; one found at 0.4 in a call whose streams scatter by 15 % waits
    for a second observation, as does every observation of a link whose
    window holds earlier ones (the majority rule then weighs the earlier
    against the latest). Why ``single_z`` is large: stream times are not
    normal (a late process delays a whole stream), so a lone observation
    gets no credit for the normal tail. At 8 the emulator's co-tenant at
    60 % on a rail was learned from the warm-up call in 5 of 10 runs (its
    links 8 to 26 of the call's noise away, noise 0.03-0.07; in the others
    the noise was 0.08-0.23 and two calls decided), and a first call with a
    link's streams 1.8x late on 15 % noise (3.9 of it) moves nothing. The
    price: a one-off 2.5x lag on such a call is 8 to 10 of its noise, as
    far out as that co-tenant, and may move the link until the window's
    next two samples outvote it. Without a co-tenant the emulator showed
    such a lag (a link at 0.53-0.59, 9.5-9.7 of the noise) in 2 of 24
    sampled calls, both on links whose windows held earlier observations,
    until a rank's own queue stopped dropping its packets (main 8aa37a4);
    since, no stream was slowed at all in 24 such calls.

    A link whose window expired (unobserved for the estimator's ``ttl``
    calls) returns to nominal, so the next plan tries it again (Hopper's
    probe of an alternative). The plan made on the settled values replaces
    the current one only on a clear predicted win (the orchestrator's
    ``hysteresis``), and only a new confident move in the other direction
    can take a settled value back. Hopper's delayed switch, which keeps a
    flow's packets in order, has nothing to do in a collective: a plan
    changes between calls, never within one.

    Examples
    --------
    A link at nominal (64 of 64 levels) in the plan. One slow observation,
    or one nominal and one slow, settle nothing; a second slow one does:

    >>> pol, planned = SwitchPolicy(), np.array([64])
    >>> [pol.settle(np.array(w)[:, None], planned, 64).tolist()
    ...  for w in ([0.4], [1.0, 0.4], [1.0, 0.4, 0.42])]
    [[64], [64], [27]]

    Two slow observations far apart (0.6 and 0.2): the bound from their
    spread reaches back past the threshold, and the plan stays:

    >>> pol.settle(np.array([[0.6], [0.2]]), planned, 64).tolist()
    [64]

    One observation at 0.55 (``log(0.55) = -0.598``), with its call's
    noise: at 0.05 it is 12 noise scales from nominal and settles at once
    (``round(0.55 * 64) = 35``); at 0.1 it is 6, and waits:

    >>> [pol.settle(np.array([[0.55]]), planned, 64, np.array([[x]])).tolist()
    ...  for x in (0.05, 0.1)]
    [[35], [64]]
    """

    probe_threshold: float = 1.5
    agree: int = 2
    z: float = 1.645
    single_z: float = 8.0
    noise_floor: float = 0.02

    def settle(self, samples: np.ndarray, planned_q: np.ndarray, levels: int,
               noise: np.ndarray | None = None) -> np.ndarray:
        """``planned_q`` with each link that ``samples`` confidently moved set to their median.

        ``samples``: ``float[window, links]`` capacity ratios (NaN: none);
        ``planned_q``: the quantised ratios (``levels`` = nominal) the current
        plan was made with; ``noise``: beside ``samples``, each one's call
        noise (:attr:`LinkEstimator.noise`; ``None``: unknown, so no window of
        one moves). Returns new quantised ratios (``planned_q``
        itself where nothing moved); deterministic in its arguments.
        """
        h = np.asarray(samples, dtype=np.float64)
        planned = np.asarray(planned_q, dtype=np.int64)
        out = planned.copy()
        n = np.isfinite(h).sum(axis=0)
        out[(n == 0) & (planned != levels)] = levels  # expired: try it again
        if noise is not None:
            self._settle_one(h, np.asarray(noise, dtype=np.float64), planned, levels, out,
                             np.flatnonzero(n == 1))
        cols = np.flatnonzero(n >= self.agree)
        if cols.size == 0:
            return out
        x = np.log(np.clip(h[:, cols], 1.0 / levels, 1.0))
        m = np.nanmedian(x, axis=0)
        half = self.z * 1.4826 * np.nanmedian(np.abs(x - m), axis=0) / np.sqrt(n[cols])
        lp, lf = np.log(planned[cols] / levels), np.log(self.probe_threshold) - 1e-9
        slow, fast = (x <= lp - lf).sum(axis=0), (x >= lp + lf).sum(axis=0)
        # the sign test (enough votes, and a strict majority), then the bound
        moved = (((slow >= self.agree) & (2 * slow > n[cols]) & (m + half <= lp - lf))
                 | ((fast >= self.agree) & (2 * fast > n[cols]) & (m - half >= lp + lf)))
        q = _quantise(np.exp(m), levels)
        out[cols[moved]] = q[moved]
        return out

    def _settle_one(self, h: np.ndarray, noise: np.ndarray, planned: np.ndarray, levels: int,
                    out: np.ndarray, cols: np.ndarray) -> None:
        """Set ``out`` where a window holds one observation (the links ``cols``), far beyond
        its noise, to it."""
        if cols.size == 0:
            return
        row = np.argmax(np.isfinite(h[:, cols]), axis=0)
        x = np.log(np.clip(h[row, cols], 1.0 / levels, 1.0))
        sd = np.maximum(noise[row, cols], self.noise_floor)
        d = np.abs(x - np.log(planned[cols] / levels))
        moved = (d >= np.log(self.probe_threshold) - 1e-9) & (d >= self.single_z * sd)
        q = _quantise(np.exp(x), levels)
        out[cols[moved]] = q[moved]


def round_ends(
    hops: dict[str, np.ndarray], frag_path: np.ndarray, paths: Any, capacity_Bps: np.ndarray,
    rank: int | None = None,
) -> dict[int, float]:
    """Stream key -> predicted end of the round of its last receive, rounds posted in lock-step.

    Where a call's rounds are posted as groups (NCCL), a rank's round ends
    once all its operations of the round have, and its next round starts
    then: a stream's measured time is the end of the round that carries its
    last receive (:class:`~pathweave.runtime.executor.RoundClock`), which in a
    paced call is about the last round for every stream. Measured against
    the stream's own busiest link (:func:`link_ratios`' expected time) such
    times blamed healthy links (docs/runtime.md, "Live adaptation"); against
    this prediction a call on the nominal fabric is on time.

    The model: ``hops`` is the call's table of messages (every rank's, as
    :mod:`pathweave.runtime.schedule` builds it: round, sender, receiver,
    bytes, fragment, hop, last); ``frag_path`` each fragment's path in
    ``paths`` (the fragments with bytes). In a round each fabric link
    carries that round's bytes over it at ``capacity_Bps``; a message,
    posted once both its ranks have begun the round, ends when the busiest
    link of its hop has carried them; a rank's round ends with its last
    message. Keys are :func:`stream_links`' ``(src * N + last) * N + dst``;
    with ``rank``, only the streams into it.
    Checked against a loop over the round rule (``tests/test_round_timing.py``).

    Examples
    --------
    4 MiB from rank 0 to rank 5 of ``h100-2x4`` through rank 1 (NVLink, then
    rank 1's rail), 1 MiB chunks, window 4: two chunks enter per round.
    Round 0 moves 2 MiB over NVLink (120 GB/s: 17.5 us), round 1 forwards
    them through rank 1's NIC (50 GB/s: 41.9 us) while the next two cross
    NVLink, round 2 forwards those: the stream ends at 101.4 us.

    >>> import pathweave as pw
    >>> from pathweave.fabric import candidate_paths
    >>> from pathweave.runtime.schedule import Fragments, Segments, _global_hops, path_routes
    >>> fab = pw.fabric.preset("h100-2x4")
    >>> ps = candidate_paths(fab)
    >>> p = np.array([ps.pair_paths(0, 5)[1]])
    >>> path_routes(ps)[p[0]][:3].tolist()
    [0, 1, 5]
    >>> d = np.zeros((8, 8), dtype=np.int64)
    >>> d[0, 5] = 4 << 20
    >>> frags = Fragments([5], [4 << 20], path_routes(ps)[p], ps.links[p])
    >>> hops = _global_hops(Segments.all_to_all(d), frags, 1 << 20, 4)
    >>> hops["round"].tolist(), hops["sender"].tolist()
    ([0, 1, 1, 2], [0, 1, 0, 1])
    >>> {k: round(t * 1e6, 1) for k, t in round_ends(hops, p, ps, fab.capacity_Bps).items()}
    {13: 101.4}
    """
    n = int(hops["n"])
    fab = paths.fabric
    fpath = np.asarray(frag_path, dtype=np.int64)
    links = paths.links[fpath]  # per fragment, padded with -1
    safe = np.maximum(links, 0)
    at_rank = (links >= 0) & (fab.vertex_rank[fab.link_dst[safe]] >= 0)
    hop_of = np.cumsum(at_rank, axis=1) - at_rank  # each link's hop along its path
    fr, h, rnd = hops["frag"], hops["hop"], hops["round"]
    snd, rcv, nbytes = hops["sender"], hops["receiver"], hops["bytes"].astype(np.float64)
    on = (hop_of[fr] == h[:, None]) & (links[fr] >= 0)  # [message, K]: the hop's links
    lk = np.where(on, links[fr], 0)
    nr = int(rnd.max(initial=-1)) + 1
    m, k = np.nonzero(on)
    load = np.bincount(rnd[m] * fab.num_links + lk[m, k], weights=nbytes[m],
                       minlength=nr * fab.num_links).reshape(nr, fab.num_links)
    busy = load / np.asarray(capacity_Bps, dtype=np.float64)
    took = np.where(on, busy[rnd[:, None], lk], 0.0).max(axis=1, initial=0.0)
    end = np.zeros((nr + 1, n))
    by_round = np.argsort(rnd, kind="stable")
    cuts = np.searchsorted(rnd[by_round], np.arange(nr + 1))
    for u in range(nr):
        i = by_round[cuts[u] : cuts[u + 1]]
        start = end[u].copy()
        done = np.maximum(start[snd[i]], start[rcv[i]]) + took[i]
        np.maximum.at(start, snd[i], done)
        np.maximum.at(start, rcv[i], done)
        end[u + 1] = start
    last = np.flatnonzero(hops["last"] & ((rcv == rank) if rank is not None else True))
    key = (hops["routes"][fr[last], 0] * n + snd[last]) * n + rcv[last]
    keys, inv = np.unique(key, return_inverse=True)
    at = np.zeros(keys.size)
    np.maximum.at(at, inv, end[rnd[last] + 1, rcv[last]])
    return dict(zip(keys.tolist(), at.tolist(), strict=True))


def streams_into(streams: dict[int, np.ndarray], num_ranks: int) -> list[np.ndarray]:
    """Per destination, the keys of the :func:`stream_links` streams into it, ascending.

    Every rank derives it from the same plan, so the position of a stream
    in its destination's list names it in the telemetry words without
    sending the key: rank ``d``'s word ``i`` is the time of stream
    ``streams_into(...)[d][i]``.

    Examples
    --------
    >>> streams = {(0 * 3 + 0) * 3 + 2: None, (1 * 3 + 0) * 3 + 2: None, (2 * 3 + 2) * 3 + 1: None}
    >>> [k.tolist() for k in streams_into(streams, 3)]
    [[], [25], [2, 11]]
    """
    n = int(num_ranks)
    keys = np.array(sorted(streams), dtype=np.int64)
    return [keys[keys % n == d] for d in range(n)]


def stream_times(into: Sequence[np.ndarray], words: np.ndarray) -> dict[int, float]:
    """Stream key -> completion time (seconds) from every rank's words (row ``d``: rank ``d``'s).

    ``into`` is :func:`streams_into` of the call's plan; words past a
    destination's streams, and words ``<= 0``, carry nothing.
    """
    w = np.asarray(words, dtype=np.int64)
    out: dict[int, float] = {}
    for d, keys in enumerate(into):
        t = decode_times(w[d, : keys.size])
        out.update((int(k), float(x)) for k, x in zip(keys, t, strict=True) if np.isfinite(x))
    return out


def host_word() -> int:
    """This machine as one int64 word (a hash of its host name) for :func:`adapt_auto`."""
    import hashlib
    import socket

    digest = hashlib.blake2b(socket.gethostname().encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # non-negative int64


def adapt_auto(host_words: np.ndarray, *, nccl: bool) -> bool:
    """``adapt="auto"``: adapt where the receive times measure real links.

    That is a gloo group whose ranks run on more than one host
    (``host_words``: every rank's :func:`host_word`, the same array on every
    rank, so every rank decides alike). On one host the "links" are
    loopback: receive times measure the CPU scheduler, and learning them
    would re-plan on noise. NCCL calls are timed per round (CUDA events,
    :class:`~pathweave.runtime.executor.CudaRoundClock`), but round times
    do not tell the links apart: rounds run in lock-step, so one slow rail
    makes every rail's streams late. In the emulator, with rounds posted as
    groups, a co-tenant on one of four rails was learned as all four rails
    at 0.53-0.61 of nominal (docs/runtime.md, "Live adaptation"). So NCCL
    groups adapt only when asked (``adapt=True``).

    >>> adapt_auto(np.array([7, 7, 9, 9]), nccl=False), adapt_auto(np.array([7, 7]), nccl=False)
    (True, False)
    >>> adapt_auto(np.array([7, 7, 9, 9]), nccl=True)
    False
    """
    return not nccl and np.unique(np.asarray(host_words)).size > 1


class Adaptation:
    """Live adaptation of one process group: observations, estimates, the fabric to plan on.

    Per call: :meth:`words` is this rank's observation of the previous
    multi-path call, one int64 word per stream its plan defines into this
    rank (:func:`streams_into`), padded to :attr:`width` (the most streams
    any rank receives: every rank that ran the plan knows it); they follow
    the next metadata exchange (:meth:`pathweave.Orchestrator.plane_words`).
    :meth:`absorb` takes every rank's words after the exchange and updates
    the estimates the same way on every rank; :meth:`replan` says whether to plan again, and
    :attr:`fabric` / :attr:`paths` are what to plan on. Every call the
    pipeline runs is given to :meth:`note` on every rank (what the next
    words describe); :meth:`observe` fills in this rank's receive completion times
    where the call was timed, :meth:`observe_later` where they are read later
    (rounds timed by CUDA events, read by :meth:`words`).
    """

    #: A plan's first ``FIRST_SAMPLES`` calls are timed, then every
    #: ``SAMPLE_EVERY``-th: timing and absorbing a call cost about 1.5 % of a
    #: call in the emulator (every rank computes the same estimates on 2 shared
    #: cores), sampling makes that 0.2 %. Timing only a plan's first call let one
    #: noisy observation decide a short job (the median of a link's window needs
    #: a second agreeing sample to move past an earlier nominal one, and that
    #: sample came 8 calls later): the first few calls are where a job learns.
    FIRST_SAMPLES = 3
    #: On a plan made on learned capacities, floors credit the typical
    #: stream's lateness up to this many times the last blind call's
    #: (:func:`link_ratios`' ``credit``): the reference's own scatter between
    #: calls is a few percent (sd 2.5 % over 40 seeds of the 15 % noise tests;
    #: 17 of the emulator's 20 traced blind calls within 0.97-1.07x), the
    #: adapted plan's lock-step up to 1.98x in the emulator.
    CREDIT = 1.1
    SAMPLE_EVERY = 8

    def __init__(self, fabric: Fabric, paths: object, rank: int, **estimator: int):
        self.nominal = fabric
        self.fabric = fabric
        self.paths = paths
        self.n = fabric.num_ranks
        self.rank = int(rank)
        self.est = LinkEstimator(fabric.num_links, **estimator)
        self.policy = SwitchPolicy()
        self.planned_q = np.full(fabric.num_links, self.est.levels, dtype=np.int64)
        self._checked = self.est.version  # the estimator update replan() last saw
        self._reference = np.inf  # link_ratios' reference on the last blind plan's call
        self._mine = np.zeros(0, dtype=np.int64)
        self._last: tuple[np.ndarray, np.ndarray] | None = None
        self._pending: Callable[[], Sequence[tuple[int, int, float]] | None] | None = None
        self._scale = np.ones(0)  # per word: a round-timed stream's expected over predicted
        # plan key -> [stream links, streams into each rank, this rank's stream -> word,
        # calls of the plan before this one], for the last few plans
        # the last 16 plans' streams: calls that alternate plans keep theirs
        self._plans: Cache[list[Any]] = Cache(16)
        self._plan: list = [{}, [], {}, 0]

    @property
    def cap_key(self) -> bytes:
        """Part of the plan-cache key: the estimates the plans are made on."""
        return self.planned_q.tobytes()

    @property
    def width(self) -> int:
        """Telemetry words this rank has to send (alike on ranks that ran the same calls)."""
        return int(self._mine.size)

    def words(self) -> np.ndarray:
        """This rank's words of the noted call (an observation given late is read now)."""
        read, self._pending = self._pending, None
        if read is not None:
            times = read()
            if times is not None:  # None: not complete yet, nothing observed (zeros)
                self.observe(times)
        return self._mine

    def note(self, fpath: np.ndarray | None, link_bytes: np.ndarray | None,
             round_ends: Callable[[], dict[int, float]] | None = None) -> None:
        """The call that the next words describe: its flows' paths and link bytes.

        ``round_ends`` (where the call's rounds are timed, not its streams):
        returns :func:`round_ends` of its plan on the nominal fabric (called
        only if the call is sampled); :meth:`observe`
        then scales each stream's time by its expected time (its busiest
        link's, as :func:`link_ratios` expects it) over that prediction, so
        a call on time is on time for every stream.

        ``None``: a call without telemetry (torch's path, an op that is not
        timed): the next row carries no words. A plan's first
        :attr:`FIRST_SAMPLES` calls are sampled, then every
        :attr:`SAMPLE_EVERY`-th; the others are not
        (:attr:`sampled` is false, no words). Called on every rank with the
        same plans in the same order, so every rank agrees on :attr:`width`;
        a rank that did not time a sampled call (``async_op``) sends zeros
        (nothing observed).
        """
        self._last, self._mine, self._pending = None, np.zeros(0, dtype=np.int64), None
        if fpath is None or link_bytes is None:
            return
        key = np.asarray(fpath).tobytes()
        plan = self._plans.get(key)
        if plan is None:  # a plan's streams serve every call of it
            streams = stream_links(self.paths, fpath, self.n)
            into = streams_into(streams, self.n)
            pos = {int(k) // self.n: i for i, k in enumerate(into[self.rank])}
            plan = [streams, into, pos, -1]
            self._plans.put(key, plan)
        plan[3] += 1
        self._plan = plan
        if plan[3] >= self.FIRST_SAMPLES and plan[3] % self.SAMPLE_EVERY:
            return
        width = max((k.size for k in plan[1]), default=0)
        self._last = (np.asarray(fpath), np.asarray(link_bytes))
        self._mine = np.zeros(width, dtype=np.int64)
        self._scale = np.ones(width)
        if round_ends is not None:
            busy_s = np.asarray(link_bytes, dtype=np.float64) / self.nominal.capacity_Bps
            ends = round_ends()
            for i, k in enumerate(plan[1][self.rank].tolist()):
                pred = ends.get(k, 0.0)
                expect = busy_s[plan[0][k]].max(initial=0.0)
                self._scale[i] = expect / pred if pred > 0 and expect > 0 else np.nan

    @property
    def sampled(self) -> bool:
        """Whether the call just noted is to be timed."""
        return self._last is not None

    def observe(self, recv_times: Sequence[tuple[int, int, float]]) -> None:
        """This rank's times of the noted call: ``(source, last forwarder, seconds)`` per receive.

        A stream's time is its latest receive's.
        """
        if self._last is None:
            return
        pos = self._plan[2]
        t = np.full(self._mine.size, np.nan)
        for src, last, sec in recv_times:
            i = pos.get(int(src) * self.n + int(last))
            if i is not None and not sec <= t[i]:  # NaN or later
                t[i] = sec
        self._mine = encode_times(t * self._scale[: t.size])

    def observe_later(self, read: Callable[[], Sequence[tuple[int, int, float]] | None]) -> None:
        """:meth:`observe` what ``read()`` returns when :meth:`words` is next read.

        For rounds timed on the device (NCCL's CUDA events): reading them at
        once would sync the host with the stream inside the call; by the next
        call's metadata exchange the host has synced past it. ``read()``
        returns ``None`` while the times are not complete: then nothing is
        observed (zeros, as a rank that did not time the call sends).
        """
        if self._last is not None:
            self._pending = read

    def absorb(self, words: np.ndarray) -> None:
        """Every rank's words of the noted call (``int64[N, width]``); nothing is noted after."""
        last = self._last
        self.note(None, None)
        w = np.asarray(words)
        if last is None or not (w > 0).any():
            return
        streams, into = self._plan[:2]
        blind = bool((self.planned_q == self.est.levels).all())
        *seen, ref = link_ratios(streams, stream_times(into, w), last[1],
                                 self.nominal.capacity_Bps, num_ranks=self.n,
                                 credit=np.inf if blind else self._reference * self.CREDIT)
        if blind and np.isfinite(ref):
            self._reference = ref  # the machine's own lateness (link_ratios' credit)
        self.est.update(*seen)

    def learned(self) -> dict[int, float]:
        """Link id -> its share of nominal capacity that plans are made on, for the links
        below nominal (quantised to the estimator's levels; settled by :meth:`replan`)."""
        q = self.planned_q
        f = q.astype(np.float64) / self.est.levels
        return {int(i): float(f[i]) for i in np.flatnonzero(q < self.est.levels)}

    def replan(self) -> bool:
        """Whether some link's estimate moved confidently (:class:`SwitchPolicy`); if so,
        :attr:`fabric` follows the settled estimates.

        Checked once per estimator update: the settled values are a function
        of the windows and the previous settled values, and settling them
        again moves nothing.
        """
        if self._checked == self.est.version:
            return False
        self._checked = self.est.version
        q = self.policy.settle(self.est.samples, self.planned_q, self.est.levels,
                               self.est.noise)
        if (q == self.planned_q).all():
            return False
        self.planned_q = q
        moved = self.learned()
        self.fabric = (self.nominal.with_links(moved, name=f"{self.nominal.name}-live")
                       if moved else self.nominal)
        return True
