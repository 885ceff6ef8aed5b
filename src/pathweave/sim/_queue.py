"""Numba kernels of the dynamic simulator's link model: arrays in, arrays out.

The queue model (see :mod:`pathweave.sim.dynamic`): during an epoch of
``dt_s`` seconds link ``e`` receives ``in_bytes[e]`` (what the senders crossing
it sent, plus background) and serves up to ``capacity_Bps[e] * dt_s``; the
queue holds the rest::

    queue' = max(0, queue + in_bytes - capacity * dt)
    out    = queue + in_bytes - queue'

so a queue fed above capacity grows at the excess rate and an unfed queue
drains at the capacity. A path's queueing delay is the sum of
``queue_e / capacity_e`` over its links.

Shaping. A link that cannot serve all it receives passes on only its
output: the bytes of the subflows crossing it continue downstream scaled by
``out / in`` for that link (its output shared in proportion to what each
subflow brought; above 1 while it drains an old queue). :func:`propagate`
finds these per-link scales by sweeping along the paths until they stop
changing (one sweep per hop suffices on loop-free paths), so a standing
queue forms only at a bottleneck and the links after it see its output.

The public simulator validates once; these kernels trust their inputs. Each
has a slow, obvious twin (``*_reference``) that the tests compare with.
"""

from __future__ import annotations

import graphlib

import numpy as np
from numba import njit

__all__ = [
    "link_in_bytes",
    "link_in_bytes_reference",
    "path_sums",
    "path_sums_reference",
    "propagate",
    "propagate_reference",
    "queue_step",
    "queue_step_reference",
]


@njit(cache=True)
def _add_arrivals(path_links, path_len, sub_path, sent_bytes, scale, arrive):
    # Every subflow's bytes into each link of its path, in order; a link
    # passes on scale[e] of what entered it (all ones: no shaping).
    for i in range(sub_path.shape[0]):
        b = sent_bytes[i]
        if b == 0.0:
            continue
        p = sub_path[i]
        for h in range(path_len[p]):
            e = path_links[p, h]
            arrive[e] += b
            b *= scale[e]


@njit(cache=True)
def link_in_bytes(path_links, path_len, sub_path, sent_bytes, num_links):
    """Bytes entering each link: every subflow's ``sent_bytes`` on each link of its path."""
    out = np.zeros(num_links, dtype=np.float64)
    _add_arrivals(path_links, path_len, sub_path, sent_bytes, np.ones(num_links), out)
    return out


def link_in_bytes_reference(path_links, path_len, sub_path, sent_bytes, num_links):
    """Slow twin of :func:`link_in_bytes`."""
    out = [0.0] * int(num_links)
    for p, b in zip(sub_path.tolist(), sent_bytes.tolist(), strict=True):
        for e in path_links[p, : path_len[p]].tolist():
            out[e] += b
    return np.array(out, dtype=np.float64)


@njit(cache=True)
def queue_step(queue_bytes, in_bytes, capacity_Bps, dt_s):
    """Advance every queue by one epoch in place; return the bytes each link served."""
    out = np.empty_like(queue_bytes)
    for e in range(queue_bytes.shape[0]):
        have = queue_bytes[e] + in_bytes[e]
        serve = capacity_Bps[e] * dt_s
        if have > serve:
            queue_bytes[e] = have - serve
            out[e] = serve
        else:
            queue_bytes[e] = 0.0
            out[e] = have
    return out


def queue_step_reference(queue_bytes, in_bytes, capacity_Bps, dt_s):
    """Slow twin of :func:`queue_step` (same in-place contract)."""
    out = np.empty_like(queue_bytes)
    for e in range(queue_bytes.size):
        new = max(0.0, float(queue_bytes[e]) + float(in_bytes[e]) - float(capacity_Bps[e]) * dt_s)
        out[e] = float(queue_bytes[e]) + float(in_bytes[e]) - new
        queue_bytes[e] = new
    return out


@njit(cache=True)
def path_sums(path_links, path_len, pids, per_link):
    """``sum(per_link[e] for e in path)`` for each path id in ``pids``."""
    out = np.zeros(pids.shape[0], dtype=np.float64)
    for i in range(pids.shape[0]):
        p = pids[i]
        s = 0.0
        for h in range(path_len[p]):
            s += per_link[path_links[p, h]]
        out[i] = s
    return out


def path_sums_reference(path_links, path_len, pids, per_link):
    """Slow twin of :func:`path_sums`."""
    return np.array(
        [sum(float(per_link[e]) for e in path_links[p, : path_len[p]]) for p in pids.tolist()],
        dtype=np.float64,
    )


@njit(cache=True)
def propagate(
    path_links, path_len, sub_path, sent_bytes, bg_bytes, queue_bytes, capacity_Bps, dt_s
):
    """One epoch of every link, with shaping; updates ``queue_bytes`` in place.

    Returns ``(in_bytes, out_bytes)`` per link: what arrived (subflows after
    their upstream links' scaling, plus ``bg_bytes``) and what was served.
    """
    nl = queue_bytes.shape[0]
    width = 0
    for i in range(sub_path.shape[0]):
        if path_len[sub_path[i]] > width:
            width = path_len[sub_path[i]]
    scale = np.ones(nl, dtype=np.float64)
    arrive = np.empty(nl, dtype=np.float64)
    out = np.empty(nl, dtype=np.float64)
    for _ in range(width + 2):
        for e in range(nl):
            arrive[e] = bg_bytes[e]
        _add_arrivals(path_links, path_len, sub_path, sent_bytes, scale, arrive)
        changed = False
        for e in range(nl):
            have = queue_bytes[e] + arrive[e]
            serve = capacity_Bps[e] * dt_s
            o = serve if have > serve else have
            out[e] = o
            s = o / arrive[e] if arrive[e] > 0.0 else 1.0
            if s != scale[e]:
                changed = True
                scale[e] = s
        if not changed:
            break
    for e in range(nl):
        queue_bytes[e] = queue_bytes[e] + arrive[e] - out[e]
        if queue_bytes[e] < 0.0:
            queue_bytes[e] = 0.0
    return arrive, out


def propagate_reference(
    path_links, path_len, sub_path, sent_bytes, bg_bytes, queue_bytes, capacity_Bps, dt_s
):
    """Slow twin of :func:`propagate`: links settled once each, in topological order.

    A link comes after every link that precedes it on some subflow's path,
    so its arrivals are final before its output is split (the subflows'
    paths must not order two links both ways).
    """
    nl = queue_bytes.size
    paths = [path_links[p, : path_len[p]].tolist() for p in sub_path.tolist()]
    before: dict[int, set[int]] = {}
    for lk in paths:
        for h, e in enumerate(lk):
            before.setdefault(e, set()).update(lk[:h])
    order = list(graphlib.TopologicalSorter(before).static_order())
    level = set(order)
    scale = {}
    arrive = [float(b) for b in bg_bytes]
    out = [0.0] * nl
    for e in order:
        a = float(bg_bytes[e])
        for lk, b in zip(paths, sent_bytes.tolist(), strict=True):
            if e in lk:
                for u in lk[: lk.index(e)]:
                    b *= scale[u]
                a += b
        arrive[e] = a
        o = min(float(queue_bytes[e]) + a, float(capacity_Bps[e]) * dt_s)
        out[e] = o
        scale[e] = o / a if a > 0 else 1.0
    for e in range(nl):
        if e not in level:
            o = min(float(queue_bytes[e]) + arrive[e], float(capacity_Bps[e]) * dt_s)
            out[e] = o
        queue_bytes[e] = max(0.0, float(queue_bytes[e]) + arrive[e] - out[e])
    return np.array(arrive), np.array(out)
