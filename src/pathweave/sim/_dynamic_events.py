"""Timed link events of a dynamic run: capacity changes, failures, background traffic."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from pathweave.errors import FabricError
from pathweave.fabric import Fabric
from pathweave.sim._dynamic_state import FlowStats, LinkStats, Network, Subflows

LinkKey = int | tuple[str, str]

_CAPACITY, _BACKGROUND = 0, 1


@dataclass(frozen=True)
class LinkEvent:
    """At ``time_s`` set the capacity of ``links`` to ``factor`` x the fabric's.

    ``factor=0`` fails them (queues dropped, flows re-placed); ``1`` restores
    them. Links are ids or ``(src, dst)`` vertex names; :meth:`cable` gives
    both directions.

    Examples
    --------
    >>> LinkEvent.cable(1e-3, "leaf0", "spine0")
    LinkEvent(time_s=0.001, links=(('leaf0', 'spine0'), ('spine0', 'leaf0')), factor=0.0)
    """

    time_s: float
    links: tuple[LinkKey, ...]
    factor: float = 0.0

    @classmethod
    def cable(cls, time_s: float, a: str, b: str, factor: float = 0.0) -> LinkEvent:
        """Both directions of the cable between vertices ``a`` and ``b``."""
        return cls(time_s, ((a, b), (b, a)), factor)


@dataclass(frozen=True)
class BackgroundEvent:
    """From ``time_s`` on, ``links`` each carry ``rate_Bps`` of background traffic.

    Background traffic does not react to congestion: it takes its rate off
    the capacity the flows share and feeds the queue when the link is full.
    ``rate_Bps=0`` stops it.
    """

    time_s: float
    links: tuple[LinkKey, ...]
    rate_Bps: float


def _resolve_links(fab: Fabric, links: Iterable[LinkKey], what: str) -> np.ndarray:
    out = []
    for k in links:
        if isinstance(k, tuple):
            out.append(fab.link_id(k[0], k[1]))
        else:
            i = int(k)
            if not 0 <= i < fab.num_links:
                raise FabricError(f"{what}: link id {i} out of range [0, {fab.num_links})")
            out.append(i)
    if not out:
        raise FabricError(f"{what} names no link")
    return np.array(out, dtype=np.int64)


def _checked(i: int, ev: object) -> tuple[int, float]:
    """``(kind, value)`` of event ``i``, or the error naming what is wrong with it."""
    if isinstance(ev, LinkEvent):
        f = float(ev.factor)
        if not (0.0 <= f <= 1.0):
            raise FabricError(f"event {i}: capacity factor {ev.factor!r} must lie in [0, 1]")
        return _CAPACITY, f
    if isinstance(ev, BackgroundEvent):
        r = float(ev.rate_Bps)
        if not (r >= 0 and math.isfinite(r)):
            raise FabricError(f"event {i}: background rate {ev.rate_Bps!r} must be >= 0")
        return _BACKGROUND, r
    raise TypeError(f"event {i} is a {type(ev).__name__}, not a LinkEvent/BackgroundEvent")


class EventQueue:
    """The events of a run, validated and sorted by time (same-time events in given order)."""

    def __init__(self, fab: Fabric, events: Sequence[LinkEvent | BackgroundEvent]) -> None:
        self.time: list[float] = []
        self.links: list[np.ndarray] = []
        self.kind: list[int] = []
        self.value: list[float] = []
        for i, ev in enumerate(events):
            kind, val = _checked(i, ev)
            if not (float(ev.time_s) >= 0 and math.isfinite(float(ev.time_s))):
                raise FabricError(f"event {i}: time_s={ev.time_s!r} must be >= 0")
            self.time.append(float(ev.time_s))
            self.links.append(_resolve_links(fab, ev.links, f"event {i}"))
            self.kind.append(kind)
            self.value.append(val)
        self.order = sorted(range(len(self.time)), key=lambda k: self.time[k])
        self.next = 0

    @property
    def exhausted(self) -> bool:
        return self.next >= len(self.order)

    def next_time(self) -> float:
        """Time of the next event not yet applied (the queue must not be exhausted)."""
        return self.time[self.order[self.next]]

    def apply_due(self, t: float, net: Network) -> bool:
        """Apply the events due by ``t`` to ``net``; True if a capacity changed."""
        changed = False
        while not self.exhausted and self.next_time() <= t + 1e-15:
            k = self.order[self.next]
            if self.kind[k] == _CAPACITY:
                net.factor[self.links[k]] = self.value[k]
            else:
                net.bg[self.links[k]] = self.value[k]
            changed = changed or self.kind[k] == _CAPACITY
            self.next += 1
        return changed


def apply_capacity(net: Network, subs: Subflows, flows: FlowStats, links: LinkStats) -> None:
    """New capacities: failed links drop their queues and the paths through them die."""
    net.cap = net.cap0 * net.factor
    dead = net.cap <= 0
    lost = dead & (net.queue > 0)
    if lost.any() and len(subs):
        _resend(net, subs, flows, lost)
    links.dropped[dead] += net.queue[dead]
    net.queue[dead] = 0.0
    links2d = net.links2d
    lk = np.where(links2d >= 0, links2d, 0)
    net.path_alive = ~np.any(dead[lk] & (links2d >= 0), axis=1)


def _resend(net: Network, subs: Subflows, flows: FlowStats, lost: np.ndarray) -> None:
    # The senders crossing a failed link re-send what its queue held, shared
    # by their rates (the fluid has no packet owners).
    sub_links = net.links2d[subs.path]
    for e in np.flatnonzero(lost).tolist():
        rows = np.flatnonzero((sub_links == e).any(axis=1))
        w = subs.rate[rows]
        if rows.size == 0 or w.sum() <= 0:
            continue
        back = net.queue[e] * w / w.sum()
        subs.rem[rows] += back
        np.add.at(flows.resent, subs.flow[rows], back)
