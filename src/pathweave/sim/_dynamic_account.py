"""Accounting of a dynamic run: exposure, last-byte delays, completions, link counters."""

from __future__ import annotations

import numpy as np

from pathweave.sim._dynamic_cc import Sending
from pathweave.sim._dynamic_state import FlowStats, LinkStats, Network, Subflows
from pathweave.sim._queue import link_in_bytes, queue_step
from pathweave.traffic.trace import FlowTrace

#: Two one-way delays closer than this count as equal (no reordering).
OOO_TOLERANCE_S = 1e-9


def exposure(net: Network, subs: Subflows, s: Sending) -> np.ndarray:
    """Out-of-order bytes of each subflow this epoch (queues as at the epoch's start)."""
    # bytes sent before ooo_until after a move ...
    win = np.clip(np.minimum(s.end_send, subs.ooo_until) - s.starts, 0.0, None)
    ooo_b = np.where(s.active, np.minimum(s.rate * win, s.sent), 0.0)
    # ... and, for a flow sending on several paths, bytes on paths faster than
    # its slowest one
    idx = np.flatnonzero(s.sent > 0)
    if idx.size > 1:
        _, grp, cnt = np.unique(subs.flow[idx], return_inverse=True, return_counts=True)
        many = cnt[grp] > 1
        if many.any():
            idx, grp = idx[many], grp[many]
            d = net.owd(subs.path[idx])
            dmax = np.full(cnt.size, -np.inf)
            np.maximum.at(dmax, grp, d)
            faster = idx[d < dmax[grp] - OOO_TOLERANCE_S]
            ooo_b[faster] = s.sent[faster]
    return ooo_b


def last_bytes(net: Network, subs: Subflows, s: Sending, flows: FlowStats, t: float,
               q0: np.ndarray, in_b: np.ndarray) -> None:
    """Keep, per flow, its latest-finishing subflow and the one-way delay its last byte sees.

    Each queue is taken at the byte's finish time, grown at the epoch's
    starting rates (at most what the link held plus all it received this
    epoch); ``q0`` is the queues at the epoch's start, ``in_b`` what they got.
    """
    if not s.fin.any():
        return
    links2d, cap = net.links2d, net.cap
    fi = np.flatnonzero(s.fin)
    fi = fi[np.argsort(s.fin_time[fi], kind="stable")]
    rows = links2d[subs.path[fi]].astype(np.int64)
    m = rows >= 0
    r0 = np.where(m, rows, 0)
    grow = link_in_bytes(links2d, net.plen, subs.path, np.where(s.active, s.rate, 0.0),
                         net.num_links)
    grow += net.bg - cap
    qf = q0[r0] + grow[r0] * (s.fin_time[fi] - t)[:, None]
    qf = np.clip(qf, 0.0, (q0 + in_b)[r0])
    qd = np.divide(qf, cap[r0], out=np.zeros(qf.shape), where=m & (cap[r0] > 0))
    f_owd = net.base_owd[subs.path[fi]] + qd.sum(axis=1)
    for j, i in enumerate(fi.tolist()):
        f = int(subs.flow[i])
        if s.fin_time[i] >= flows.last_send[f]:
            flows.last_send[f] = s.fin_time[i]
            flows.last_owd[f] = f_owd[j]


def complete(subs: Subflows, flows: FlowStats, trace: FlowTrace) -> int:
    """Drop finished subflows; record the flows that have none left. Returns how many."""
    gone = subs.rem <= 0
    if not gone.any():
        return 0
    fl_gone = np.unique(subs.flow[gone])
    subs.keep(~gone)
    still = np.isin(fl_gone, subs.flow)
    doneflows = fl_gone[~still]
    if doneflows.size:
        fin_s = flows.last_send[doneflows] + flows.last_owd[doneflows]
        flows.finish[doneflows] = fin_s
        flows.fct[doneflows] = fin_s - trace.start_s[doneflows]
    return int(doneflows.size)


def idle(net: Network, links: LinkStats, gap_s: float) -> None:
    """Nothing sends for ``gap_s``: background traffic flows and the queues drain."""
    g_in = net.bg * gap_s
    g_out = queue_step(net.queue, g_in, net.cap, gap_s)
    links.count(g_in, g_out, net.cap * gap_s)
    net.link_load = net.bg.copy()
