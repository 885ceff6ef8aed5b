"""Rank processes forked into a namespace from a fork server that has imported torch.

``ip netns exec NS python -m pathweave.emulate._worker ...`` starts a fresh
interpreter per rank, and each one imports torch and loads the planners'
kernels again: about 3 s of CPU a rank, most of what an emulated run of 8
ranks costs on a small machine. Here each rank is instead forked from the
fork server of :func:`pathweave.runtime.launch.fork_context` (torch and the
data plane imported once per caller process) and moves itself into its
rank's network namespace with ``setns(2)`` before it opens a socket. It is
still a process of its own on the kernel's shaped links; what ``ip netns
exec`` adds beside the network namespace (a private mount namespace with
``/sys`` and ``/etc/netns`` files for the namespace) nothing the rank does
reads: gloo finds its interface through netlink, which answers per namespace.

The co-tenants' and probes' processes import neither torch nor the planners
and still run under ``ip netns exec``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: ``CLONE_NEWNET`` of ``<sched.h>``: setns(2) joins a network namespace.
_CLONE_NEWNET = 0x40000000
#: Where ``ip netns add`` keeps the namespaces it names.
NETNS_DIR = Path("/run/netns")


def _enter_netns(ns: str) -> None:
    """Move this (single-threaded) process into network namespace ``ns``."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    try:
        fd = os.open(NETNS_DIR / ns, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(f"no network namespace {ns!r} ({NETNS_DIR / ns} is missing): "
                                "is the emulator up?") from None
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into namespace {ns!r}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _child(ns: str, log_path: str, env: dict[str, str], nice: int, argv: list[str]) -> None:
    # A session of its own, as Popen(start_new_session=True) gave: the
    # ledger's clean-up and _launch kill the rank by its process group.
    os.setsid()
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    # Fresh line-buffered streams over the log (the inherited ones may be None
    # where the caller had no console): a timed-out rank's log shows how far it got.
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    # The fork server's environment is a snapshot of its caller's at start.
    os.environ.clear()
    os.environ.update(env)
    if nice:
        os.nice(nice)
    _enter_netns(ns)
    from pathweave.emulate._worker import _main

    _main(argv)


class ForkedProcess:
    """The part of :class:`subprocess.Popen`'s interface ``_launch`` uses, over a forked rank."""

    def __init__(self, proc: Any):
        self._proc = proc
        self.pid: int = proc.pid

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal), ``None`` while it runs."""
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit; :class:`subprocess.TimeoutExpired` past ``timeout``."""
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(f"rank process {self.pid}", timeout or 0.0)
        return self._proc.exitcode


def start_in_netns(ns: str, argv: Sequence[str], *, log_path: Path, env: Mapping[str, str],
                   nice: int = 0) -> ForkedProcess:
    """Fork ``pathweave.emulate._worker``'s ``argv`` into namespace ``ns``.

    Its output goes to ``log_path``; ``env`` replaces its environment and
    ``nice`` (-20..19) its priority, as ``nice -n`` did.
    """
    from pathweave.runtime.launch import fork_context

    proc = fork_context().Process(
        target=_child, args=(ns, str(log_path), dict(env), int(nice), [str(a) for a in argv]),
        name=f"pathweave-emulated-{ns}", daemon=True,
    )
    proc.start()
    return ForkedProcess(proc)
