"""Plain TCP between two namespaces: a check of the shaped links without the data plane.

:func:`probe_transfer` starts ``probe-recv`` in the receiver's namespace and
``probe-send`` in the sender's (both through :mod:`pathweave.emulate._worker`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pathweave.emulate._ip import EmulatorError
from pathweave.emulate.emulator import Emulator
from pathweave.traffic.pattern import pattern_bytes

__all__ = ["probe_transfer"]


def probe_transfer(emu: Emulator, src: int, dst: int, nbytes: int = 3 << 20,
                   *, skip_bytes: int = 256 * 1024, timeout_s: float = 60.0) -> dict[str, Any]:
    """Send ``nbytes`` over plain TCP from rank ``src`` to rank ``dst`` along the kernel routes.

    Returns ``{"rate_Bps", "bytes", "ok"}``: the payload rate after the first
    ``skip_bytes`` (the token bucket's initial burst) and whether the bytes
    received equal :func:`pattern_bytes` ``(src, dst, nbytes)``.
    """
    lay = emu.layout
    with tempfile.TemporaryDirectory(prefix="pathweave-probe-") as tmp:
        out = Path(tmp) / "recv.json"
        addr = lay.rank_address[dst]
        recv = subprocess.Popen(
            emu.exec_argv(dst, [sys.executable, "-m", "pathweave.emulate._worker", "probe-recv",
                                addr, str(src), str(dst), str(nbytes), str(skip_bytes),
                                str(out)]),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            # The receiver prints one line once it listens.
            line = recv.stdout.readline() if recv.stdout else b""
            if b"listening" not in line:
                raise EmulatorError(f"probe receiver did not start: {line!r}")
            emu.run_in(src, [sys.executable, "-m", "pathweave.emulate._worker", "probe-send", addr,
                             str(src), str(dst), str(nbytes)], timeout_s=timeout_s)
            recv.wait(timeout=timeout_s)
            if recv.returncode != 0:
                rest = recv.stdout.read().decode(errors="replace") if recv.stdout else ""
                raise EmulatorError(f"probe receiver failed: {rest}")
            return json.loads(out.read_text())
        finally:
            if recv.poll() is None:
                os.killpg(recv.pid, signal.SIGKILL)
                recv.wait()


_PROBE_PORT = 29611
#: Linux's SO_TIMESTAMPNS (= SCM_TIMESTAMPNS); Python's socket module does not export it.
_SO_TIMESTAMPNS = 35


def _probe_recv(addr: str, src: int, dst: int, nbytes: int, skip: int, out: str) -> None:
    import socket
    import struct

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # A receive buffer that holds the whole transfer and kernel arrival times
    # (SO_TIMESTAMPNS): the rate measured is the link's, even when this
    # process is scheduled late on a busy machine.
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, max(nbytes, 1 << 20))
    srv.bind((addr, _PROBE_PORT))
    srv.listen(1)
    print("listening", flush=True)
    conn, _ = srv.accept()
    conn.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    buf = bytearray(nbytes)
    view = memoryview(buf)
    got, t_skip, at_skip, t_end = 0, None, 0, None
    anc_size = socket.CMSG_SPACE(16)
    while got < nbytes:
        k, anc, _, _ = conn.recvmsg_into([view[got:]], anc_size)
        if k == 0:
            break
        got += k
        stamp = None
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= 16:
                sec, nsec = struct.unpack("qq", data[:16])
                stamp = sec + nsec * 1e-9
        if stamp is None:
            stamp = time.time()
        if t_skip is None and got >= skip:
            t_skip, at_skip = stamp, got
        t_end = stamp
    conn.close()
    srv.close()
    ok = got == nbytes and bytes(buf) == pattern_bytes(src, dst, nbytes).tobytes()
    rate = 0.0
    if t_skip is not None and t_end is not None and t_end > t_skip:
        rate = (got - at_skip) / (t_end - t_skip)
    Path(out).write_text(json.dumps({"rate_Bps": rate, "bytes": got, "ok": ok}))


def _probe_send(addr: str, src: int, dst: int, nbytes: int) -> None:
    import socket

    data = pattern_bytes(src, dst, nbytes).tobytes()
    for _ in range(100):
        try:
            conn = socket.create_connection((addr, _PROBE_PORT), timeout=30)
            break
        except OSError:
            time.sleep(0.05)
    else:
        raise EmulatorError(f"cannot connect to {addr}:{_PROBE_PORT}")
    conn.sendall(data)
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)  # wait for the receiver to close: all bytes are in
    conn.close()
