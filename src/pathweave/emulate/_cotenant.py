"""The co-tenant's processes: a paced UDP sender and a receiver that counts (stdlib only).

:class:`pathweave.emulate.background.Background` runs this file as a script
(``python .../_cotenant.py send ADDR PORT RATE_BPS DURATION_S`` or ``recv
ADDR PORT DURATION_S``) inside a rank's namespace. As a script it imports
nothing of pathweave: a process that imported the package (numba, SciPy,
the rank worker) took over a second to start on a 2-core host, four such
starts per co-tenant. Each prints a ready line (``listening``/``sending``)
and, when it ends by itself, what it moved (``received N``/``sent N``).
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Sequence

#: Datagram size: IP fragments of it fill full frames; few sends per second.
BLOCK = 16 * 1024
#: How much longer than its duration a receiver waits for its sender's first datagram.
START_GRACE_S = 10.0


def recv(addr: str, port: int, duration_s: float) -> None:
    """Count the datagrams that arrive at ``addr:port`` (module docstring)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((addr, port))
    sock.settimeout(1.0)
    print("listening", flush=True)
    # NOTE: the sender starts after this process, so the duration counts from
    # the first datagram, awaited for up to START_GRACE_S more: counted from
    # this process's start, a receiver of a short co-tenant ended before its
    # sender began.
    end = time.monotonic() + duration_s + START_GRACE_S
    received = 0
    while time.monotonic() < end:
        try:
            n = len(sock.recv(1 << 16))
        except TimeoutError:
            continue
        except OSError:
            break
        if not received:
            end = time.monotonic() + duration_s + 0.1
        received += n
    sock.close()
    print("received", received, flush=True)


def send(addr: str, port: int, rate_Bps: float, duration_s: float) -> None:
    """Datagrams at ``rate_Bps`` of payload, whatever else the link carries (no back-off)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    end = time.monotonic() + duration_s
    block = bytes(BLOCK)
    t0, paced, sent = time.monotonic(), 0, 0
    print("sending", flush=True)
    while (now := time.monotonic()) < end:
        due = t0 + paced / rate_Bps
        if due > now:
            time.sleep(min(due - now, end - now))
            continue
        try:
            sent += sock.sendto(block, (addr, port))
        except OSError:  # a full queue drops, as on a wire
            time.sleep(0.001)
        paced += BLOCK
    sock.close()
    print("sent", sent, flush=True)


def main(argv: Sequence[str]) -> None:
    cmd, *args = argv
    if cmd == "recv":
        recv(args[0], int(args[1]), float(args[2]))
    elif cmd == "send":
        send(args[0], int(args[1]), float(args[2]), float(args[3]))
    else:
        raise SystemExit(f"unknown co-tenant command {cmd!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
