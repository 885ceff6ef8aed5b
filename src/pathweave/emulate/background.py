"""A co-tenant in the emulator: real competing traffic over one emulated link.

``--background rail0:0.6`` picks the rank pair whose kernel route is the
shortest one over ``rail0`` (ranks 0 and 4 on ``h100-2x4``) and, inside
those ranks' namespaces, runs a paced UDP sender to the other rank's
identity address in each direction taking 60 % of the link's emulated wire
rate. The processes are the emulator's own (recorded, killed by its
cleanup), talk only to emulator addresses, and stop by themselves after
``duration_s``.

UDP, because a paced sender must not back off for pathweave's traffic (a
TCP co-tenant measured here yielded most of its rate to gloo's many
connections once the link was full): it is the
simulator's :class:`~pathweave.sim.dynamic.BackgroundEvent` (a fixed rate
taken off the links it crosses), so predictions and bounds use
:func:`residual_fabric`, the fabric with that rate taken off every link of
both routes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pathweave.emulate import _cotenant
from pathweave.emulate.topology import framing_factor
from pathweave.errors import InputError
from pathweave.fabric import Fabric

__all__ = ["Background", "CoTenant", "parse_background", "residual_fabric"]

_PORT = 29701
#: The processes' script, run by path (``_cotenant``'s docstring says why).
_SCRIPT = Path(_cotenant.__file__)
#: Least capacity a link keeps in the residual fabric (as the simulator's background).
_FLOOR = 0.01


@dataclass(frozen=True)
class CoTenant:
    """One co-tenant: ``fraction`` of ``link``'s capacity between ranks ``a`` and ``b``.

    ``links``: the directed fabric links both routes cross; ``rate_Bps``
    (unscaled fabric units) is what it sends each way.
    """

    spec: str
    fraction: float
    a: int
    b: int
    links: tuple[int, ...]
    rate_Bps: float


def _named_links(fabric: Fabric, name: str) -> np.ndarray:
    if "->" in name:
        src, dst = (x.strip() for x in name.split("->", 1))
        try:
            return np.array([fabric.link_id(src, dst)])
        except Exception as exc:
            raise InputError(f"--background: no link {name!r} in {fabric.name}") from exc
    try:
        v = fabric.vertex_id(name)
    except Exception as exc:
        raise InputError(f"--background: no vertex {name!r} in {fabric.name} (try a rail "
                         "like rail0, or a link 'SRC->DST')") from exc
    return np.flatnonzero((fabric.link_src == v) | (fabric.link_dst == v))


def parse_background(spec: str | Sequence[str], fabric: Fabric) -> list[CoTenant]:
    """``LINK:FRACTION[,LINK:FRACTION...]`` -> co-tenants on ``fabric``.

    ``LINK`` is a vertex (``rail0``: every link touching it) or ``SRC->DST``;
    ``FRACTION`` in ``(0, 1)`` of that link's capacity.

    Examples
    --------
    >>> import pathweave as pw
    >>> fab = pw.fabric.preset("h100-2x4")
    >>> [(c.a, c.b, c.fraction, c.rate_Bps / 1e9) for c in parse_background("rail0:0.6", fab)]
    [(0, 4, 0.6, 30.0)]
    >>> parse_background("rail9:0.5", fab)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    pathweave.errors.InputError: --background: no vertex 'rail9' in h100-2x4 ...
    """
    from pathweave.fabric import candidate_paths

    items = [spec] if isinstance(spec, str) else list(spec)
    items = [p.strip() for s in items for p in str(s).split(",") if p.strip()]
    ps = candidate_paths(fabric)
    n = fabric.num_ranks
    out = []
    for item in items:
        name, sep, frac = item.rpartition(":")
        try:
            f = float(frac)
        except ValueError:
            f = float("nan")
        if not sep or not name or not 0.0 < f < 1.0:
            raise InputError(f"--background {item!r}: expected LINK:FRACTION with FRACTION in "
                             "(0, 1), e.g. rail0:0.6")
        named = _named_links(fabric, name)
        best = None
        for a in range(n):
            for b in range(a + 1, n):
                there, back = (ps.links[ps.pair_ptr[s * n + d]] for s, d in ((a, b), (b, a)))
                there, back = there[there >= 0], back[back >= 0]
                if np.isin(named, np.concatenate([there, back])).any():
                    cand = (there.size + back.size, a, b, there, back)
                    best = cand if best is None or cand[0] < best[0] else best
        if best is None:
            raise InputError(f"--background {item!r}: no rank pair's route crosses {name!r}")
        _, a, b, there, back = best
        rate = f * float(fabric.capacity_Bps[named].min())
        out.append(CoTenant(item, f, a, b, tuple(sorted({*there.tolist(), *back.tolist()})),
                            rate))
    return out


def residual_fabric(fabric: Fabric, tenants: Sequence[CoTenant], scale: float = 1.0) -> Fabric:
    """``fabric`` (already scaled by ``scale``) less every co-tenant's rate on its links."""
    taken = np.zeros(fabric.num_links)
    for t in tenants:
        taken[list(t.links)] += t.rate_Bps * scale
    if not taken.any():
        return fabric
    cap = fabric.capacity_Bps
    left = np.maximum(cap - taken, _FLOOR * cap)
    factors = {int(i): float(left[i] / cap[i]) for i in np.flatnonzero(taken)}
    return fabric.with_links(factors, name=f"{fabric.name}-residual")


class Background:
    """The co-tenants' processes in an emulator (a context manager).

    Parameters
    ----------
    emu
        A running :class:`~pathweave.emulate.Emulator`.
    tenants
        From :func:`parse_background` on the emulator's (unscaled) fabric.
    duration_s
        Every process exits by itself after this long: a sender from its
        start, a receiver from its first datagram (or
        :data:`~pathweave.emulate._cotenant.START_GRACE_S` later if none came).

    Attributes
    ----------
    rates_Bps : list[float]
        Each tenant's datagram payload rate per direction, in the emulator's units.
    bytes_moved : list[tuple[int, str, int]]
        After exit: ``(tenant, "sent" | "received", bytes)`` of every process
        that ended by itself (one killed at exit reports nothing). A sender
        never sends more than its rate allows: ``sent <= rate * duration +
        one datagram``.
    """

    def __init__(self, emu: Any, tenants: Sequence[CoTenant], duration_s: float):
        self.emu = emu
        self.tenants = list(tenants)
        self.duration_s = float(duration_s)
        self.rates_Bps: list[float] = []
        self.bytes_moved: list[tuple[int, str, int]] = []
        self._procs: list[subprocess.Popen] = []
        self._tenant_of: list[int] = []

    def _start(self, rank: int, argv: list[str], tenant: int) -> subprocess.Popen:
        p = subprocess.Popen(
            self.emu.exec_argv(rank, [sys.executable, str(_SCRIPT), *argv]),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.emu.record_process(p.pid)
        self._procs.append(p)
        self._tenant_of.append(tenant)
        return p

    def __enter__(self) -> Background:
        lay = self.emu.layout
        scale = float(self.emu.scale)
        try:
            for k, t in enumerate(self.tenants):
                # The same share of the wire as TCP payload at rate_Bps would take:
                # datagram fragments carry mtu - 20 bytes, TCP segments mtu - 52.
                mtu = int(lay.mtu)
                rate = t.rate_Bps * scale * framing_factor(mtu) * (mtu - 20) / (mtu + 14)
                self.rates_Bps.append(rate)
                for src, dst in ((t.a, t.b), (t.b, t.a)):
                    port = str(_PORT + 2 * k + (src > dst))
                    addr = lay.rank_address[dst]
                    _ready(self._start(dst, ["recv", addr, port,
                                             str(self.duration_s)], k), "listening", "receiver")
                    # NOTE: wait for the sender itself, not a fixed time: starting its
                    # interpreter took over the 0.5 s once slept here on a busy 2-core
                    # host, and a probe then ran before the co-tenant did.
                    _ready(self._start(src, ["send", addr, port, repr(rate),
                                             str(self.duration_s)], k), "sending", "sender")
            time.sleep(0.1)  # its first datagrams reach the links
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p, k in zip(self._procs, self._tenant_of, strict=True):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            if p.stdout:
                last = (p.stdout.read() if p.returncode == 0 else b"").split()[-2:]
                if len(last) == 2 and last[0] in (b"sent", b"received") and last[1].isdigit():
                    self.bytes_moved.append((k, last[0].decode(), int(last[1])))
                p.stdout.close()
        self._procs, self._tenant_of = [], []


def _ready(proc: subprocess.Popen, word: str, what: str) -> None:
    """Wait until ``proc`` prints the line ``word`` (lines before it, e.g. warnings, are
    skipped); raise naming what it printed if it exits first."""
    seen = []
    for line in iter(proc.stdout.readline if proc.stdout else (lambda: b""), b""):
        if line.strip() == word.encode():
            return
        seen.append(line)
    raise InputError(f"co-tenant {what} did not start: {b''.join(seen)[-300:]!r}")
