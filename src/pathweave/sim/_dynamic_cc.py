"""Congestion control of a dynamic run: each epoch's sending rates and what they send.

See the *Congestion control* part of :mod:`pathweave.sim.dynamic`'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pathweave.sim._dynamic_state import Network, Subflows
from pathweave.sim._maxmin import maxmin_into

#: Effective capacity never drops below this share of a link's capacity, so a
#: sender on a link with a long queue still crawls instead of stopping.
MIN_RATE_SHARE = 0.01


@dataclass(frozen=True)
class Control:
    """The controller's constants: target queue ``K`` (bytes), time constant ``tau`` (s)."""

    queue_target_bytes: float
    tau_s: float

    def effective_capacity(self, net: Network) -> np.ndarray:
        """``max(0.01 c, c - background + (K - q) / tau)`` per link; see the module docstring."""
        cap = net.cap
        eff = cap - net.bg + (self.queue_target_bytes - net.queue) / self.tau_s
        eff = np.maximum(eff, MIN_RATE_SHARE * cap)
        eff[cap <= 0] = 1.0  # unused: no sender crosses a failed link
        return eff


@dataclass(frozen=True)
class Sending:
    """What every subflow does in one epoch (arrays over the subflows)."""

    active: np.ndarray  # sends this epoch
    starts: np.ndarray  # from this time on
    rate: np.ndarray  # at this rate, B/s
    sent: np.ndarray  # bytes sent
    fin: np.ndarray  # sent its last byte
    fin_time: np.ndarray  # when (NaN where not fin)
    end_send: np.ndarray  # when it stopped sending this epoch


def rates(ctl: Control, net: Network, subs: Subflows, t: float,
          t_end: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rate, active, starts)``: senders with feedback take their max-min share
    of the effective capacity; fresh ones keep the rate they were given."""
    S = len(subs)
    rate = np.zeros(S)
    alive = net.path_alive[subs.path]
    starts = np.maximum(t, subs.ready)
    active = alive & (starts < t_end) & (subs.rem > 0)
    fb = active & ~subs.fresh
    if fb.any():
        sp = subs.path[fb]
        ln = net.plen[sp].astype(np.int64)
        ptr = np.zeros(sp.size + 1, dtype=np.int64)
        np.cumsum(ln, out=ptr[1:])
        rows = net.links2d[sp]
        flat = rows[rows >= 0].astype(np.int64)
        out = np.empty(sp.size)
        maxmin_into(ptr, flat, ctl.effective_capacity(net), np.full(sp.size, np.inf),
                    np.ones(sp.size), out)
        rate[fb] = out
    fr = active & subs.fresh
    rate[fr] = subs.rate[fr]
    return rate, active, starts


def send(ctl: Control, net: Network, subs: Subflows, t: float, t_end: float) -> Sending:
    """Each subflow sends at its rate from its start until its bytes or the epoch run out."""
    rate, active, starts = rates(ctl, net, subs, t, t_end)
    span = np.where(active, t_end - starts, 0.0)
    can = rate * span
    fin = active & (can >= subs.rem) & (rate > 0)
    snt = np.where(fin, subs.rem, np.minimum(can, subs.rem))
    snt[~active] = 0.0
    fin_time = np.where(
        fin, starts + np.divide(subs.rem, rate, where=rate > 0, out=np.zeros(len(subs))), np.nan
    )
    end_send = np.where(fin, fin_time, t_end)
    return Sending(active, starts, rate, snt, fin, fin_time, end_send)


def advance(subs: Subflows, s: Sending) -> None:
    """The subflows after sending: fewer bytes left, the rate they sent at, feedback had."""
    subs.rem = subs.rem - s.sent
    subs.rem[s.fin] = 0.0
    subs.rate = np.where(s.active, s.rate, subs.rate)
    subs.fresh = subs.fresh & ~s.active
