"""State of a dynamic run: the subflows, the links, and the per-flow and per-link tallies.

Everything :func:`pathweave.sim.dynamic.run_dynamic` changes from epoch to
epoch lives in the four objects here; the steps that change them live in
``_dynamic_events`` (link events, failures), ``_dynamic_place`` (policy
choices), ``_dynamic_cc`` (rates, sending) and ``_dynamic_account``
(exposure, completions, counters).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pathweave.fabric import Fabric, LinkKind, PathSet
from pathweave.sim._queue import path_sums
from pathweave.traffic.trace import FlowTrace


class Subflows:
    """Running subflows as parallel arrays, kept sorted by flow id."""

    FIELDS = (
        ("flow", np.int64),
        ("path", np.int64),
        ("rem", np.float64),  # bytes left
        ("ready", np.float64),  # sends from this time on (arrival, or end of a pause)
        ("rate", np.float64),  # last sending rate (carried into a fresh epoch)
        ("fresh", np.bool_),  # no CC feedback yet: sends at `rate` instead of its share
        ("ooo_until", np.float64),  # bytes sent before this time overtake older bytes
    )

    def __init__(self) -> None:
        for name, dt in self.FIELDS:
            setattr(self, name, np.zeros(0, dtype=dt))

    def __len__(self) -> int:
        return int(self.flow.size)

    def keep(self, mask: np.ndarray) -> None:
        for name, _ in self.FIELDS:
            setattr(self, name, getattr(self, name)[mask])

    def add(self, **cols: np.ndarray) -> None:
        for name, dt in self.FIELDS:
            setattr(self, name, np.concatenate([getattr(self, name), np.asarray(cols[name], dt)]))

    def sort(self) -> None:
        order = np.argsort(self.flow, kind="stable")
        for name, _ in self.FIELDS:
            setattr(self, name, getattr(self, name)[order])


def path_line_rate(fab: Fabric, ps: PathSet) -> np.ndarray:
    """Capacity of each path's first network link (a NIC's line rate), else its first link."""
    lk = ps.links.astype(np.int64)
    valid = lk >= 0
    safe = np.where(valid, lk, 0)
    net = valid & (fab.link_kind[safe] == int(LinkKind.NETWORK))
    col = np.where(net.any(axis=1), net.argmax(axis=1), 0)
    return fab.capacity_Bps[safe[np.arange(lk.shape[0]), col]]


@dataclass(eq=False)
class Network:
    """The links as the flows see them: capacity, background, queues, live paths.

    ``cap`` and ``path_alive`` are replaced (not written) when a link event
    changes them, so an observation handed to a policy keeps what it saw.
    """

    ps: PathSet
    cap0: np.ndarray  # the fabric's capacities, B/s
    factor: np.ndarray  # capacity factor set by link events
    cap: np.ndarray  # cap0 * factor
    bg: np.ndarray  # background traffic, B/s
    queue: np.ndarray  # bytes queued per link
    path_alive: np.ndarray
    link_load: np.ndarray  # bytes fed per second over the last epoch
    base_rtt: np.ndarray  # per path, no queues
    base_owd: np.ndarray
    line_rate: np.ndarray  # per path: its first network link's capacity

    @classmethod
    def build(cls, fab: Fabric, ps: PathSet, base_rtt_s: np.ndarray) -> Network:
        nl = fab.num_links
        cap0 = fab.capacity_Bps.astype(np.float64)
        return cls(
            ps=ps, cap0=cap0, factor=np.ones(nl), cap=cap0.copy(), bg=np.zeros(nl),
            queue=np.zeros(nl), path_alive=np.ones(ps.num_paths, dtype=bool),
            link_load=np.zeros(nl), base_rtt=base_rtt_s, base_owd=0.5 * base_rtt_s,
            line_rate=path_line_rate(fab, ps),
        )

    @property
    def num_links(self) -> int:
        return int(self.cap0.size)

    @property
    def links2d(self) -> np.ndarray:
        return self.ps.links

    @property
    def plen(self) -> np.ndarray:
        return self.ps.length

    def queue_s(self) -> np.ndarray:
        """Queueing delay of each link (0 on a failed one)."""
        qs = np.zeros(self.num_links)
        up = self.cap > 0
        qs[up] = self.queue[up] / self.cap[up]
        return qs

    def owd(self, pids: np.ndarray) -> np.ndarray:
        """One-way delay of paths ``pids`` with the queues as they stand."""
        return self.base_owd[pids] + path_sums(self.links2d, self.plen, pids, self.queue_s())


def ideal_fct_s(ps: PathSet, trace: FlowTrace, net: Network) -> np.ndarray:
    """Each flow alone on its pair's fastest path: bytes / line rate + one-way latency."""
    pair_of = trace.src * ps.num_ranks + trace.dst
    best_time = np.full(len(trace), np.inf)
    for k, p in enumerate(pair_of.tolist()):
        lo, hi = int(ps.pair_ptr[p]), int(ps.pair_ptr[p + 1])
        best_time[k] = np.min(trace.size_bytes[k] / net.line_rate[lo:hi] + net.base_owd[lo:hi])
    return best_time


@dataclass(eq=False)
class FlowStats:
    """Per-flow tallies, indexed by flow id (see :class:`~pathweave.sim.DynamicResult`)."""

    sent: np.ndarray
    resent: np.ndarray  # bytes sent again after a failure dropped them
    last_send: np.ndarray  # when the latest-finishing subflow sent its last byte
    last_owd: np.ndarray  # the one-way delay that byte sees
    finish: np.ndarray
    fct: np.ndarray
    switches: np.ndarray
    failovers: np.ndarray
    ooo: np.ndarray
    first_path: np.ndarray
    stalled: np.ndarray  # had to wait for an alive path

    @classmethod
    def zeros(cls, num_flows: int) -> FlowStats:
        n = num_flows
        return cls(
            sent=np.zeros(n), resent=np.zeros(n), last_send=np.full(n, -np.inf),
            last_owd=np.zeros(n), finish=np.full(n, np.nan), fct=np.full(n, np.nan),
            switches=np.zeros(n, dtype=np.int64), failovers=np.zeros(n, dtype=np.int64),
            ooo=np.zeros(n), first_path=np.full(n, -1, dtype=np.int64),
            stalled=np.zeros(n, dtype=bool),
        )


@dataclass(eq=False)
class LinkStats:
    """Per-link tallies over the run."""

    fed: np.ndarray  # bytes fed (flows and background)
    served: np.ndarray
    captime: np.ndarray  # capacity x time offered, bytes
    qmax: np.ndarray
    dropped: np.ndarray  # bytes dropped by failures

    @classmethod
    def zeros(cls, num_links: int) -> LinkStats:
        return cls(*(np.zeros(num_links) for _ in range(5)))

    def count(self, fed: np.ndarray, served: np.ndarray, captime: np.ndarray) -> None:
        self.fed += fed
        self.served += served
        self.captime += captime
