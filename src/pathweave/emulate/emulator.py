"""Bring an emulated fabric up and down: :class:`Emulator`, :func:`cleanup`, :func:`status`.

Everything is created inside namespaces named ``{prefix}-...`` (no device in
the root namespace), so deleting those namespaces removes every veth, bridge
and qdisc; nothing outside the prefix is touched. A small state file in
``/run/pathweave/{prefix}.json`` records who created an emulator: a later
:meth:`Emulator.up` removes pieces whose creator died (a crashed run) and
refuses to clobber a live one.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from pathweave._files import atomic_write
from pathweave.emulate import _ip
from pathweave.emulate._ip import EmulatorError
from pathweave.emulate.topology import NS_RE, PREFIX_RE, Layout, build_layout
from pathweave.fabric import Fabric, resolve

__all__ = ["STATE_DIR", "Emulator", "cleanup", "list_namespaces", "status"]

#: Where emulator state files live (tmpfs: gone after a reboot, as the namespaces are).
STATE_DIR = Path(os.environ.get("PATHWEAVE_EMULATE_STATE", "/run/pathweave"))


def list_namespaces(prefix: str | None = None) -> list[str]:
    """Names of existing pathweave emulator namespaces (all prefixes, or one)."""
    out = _ip.run(_ip.netns_list())
    names = []
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        m = NS_RE.match(name)
        if m and (prefix is None or m.group(1) == prefix):
            names.append(name)
    return sorted(names)


def _state_path(prefix: str) -> Path:
    return STATE_DIR / f"{prefix}.json"


def _read_state(prefix: str) -> dict[str, Any] | None:
    try:
        return json.loads(_state_path(prefix).read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup(prefix: str | None = None) -> list[str]:
    """Delete emulator namespaces (of ``prefix``, or of every pathweave prefix).

    Returns the names removed. Processes still running inside them keep
    their network until they exit; the emulator's own runs kill theirs first.
    """
    _ip.require_root()
    _ip.require_tools()
    if prefix is not None and not PREFIX_RE.match(prefix):
        raise ValueError(f"not a pathweave emulator prefix: {prefix!r}")
    names = list_namespaces(prefix)
    for ns in names:
        _ip.run(_ip.netns_del(ns), check=False)
    prefixes = {NS_RE.match(n).group(1) for n in names}  # type: ignore[union-attr]
    if prefix is not None:
        prefixes.add(prefix)
    for p in prefixes:
        _state_path(p).unlink(missing_ok=True)
    left = list_namespaces(prefix)
    if left:
        raise EmulatorError(f"could not delete namespaces {left}")
    return names


def status(prefix: str | None = None) -> list[dict[str, Any]]:
    """What is up: per namespace, its shaped interfaces and rates.

    Returns one record per namespace: ``{"ns", "prefix", "owner", "fabric",
    "scale", "ports": [{"dev", "wire_Bps", "bridge"}]}`` (``wire_Bps``: the
    tbf rate, bytes per second on the wire); ``owner`` comes from the state
    file (``None`` for stale pieces).
    """
    _ip.require_root()
    _ip.require_tools()
    recs = []
    for ns in list_namespaces(prefix):
        pfx = NS_RE.match(ns).group(1)  # type: ignore[union-attr]
        st = _read_state(pfx)
        links = json.loads(_ip.run(["ip", "-n", ns, "-j", "link", "show"]) or "[]")
        qd = json.loads(_ip.run(["tc", "-n", ns, "-j", "qdisc", "show"]) or "[]")
        rate = {q.get("dev"): q.get("options", {}).get("rate") for q in qd
                if q.get("kind") == "tbf"}
        ports = [
            {"dev": ln["ifname"], "wire_Bps": rate.get(ln["ifname"]), "bridge": ln.get("master")}
            for ln in links if ln["ifname"] in rate
        ]
        owner = None
        if st is not None:
            owner = "persistent" if st.get("persistent") else f"pid {st.get('pid')}"
            if not st.get("persistent") and not _alive(int(st.get("pid", 0))):
                owner = None
        recs.append({"ns": ns, "prefix": pfx, "owner": owner, "ports": ports,
                     "fabric": (st or {}).get("fabric"), "scale": (st or {}).get("scale")})
    return recs


class Emulator:
    """An emulated fabric: one namespace per rank, kernel-shaped links, host routes.

    Use it as a context manager (teardown always runs, also on Ctrl-C and
    SIGTERM) or call :meth:`up` and :meth:`down`.

    Parameters
    ----------
    fabric
        A :class:`~pathweave.fabric.Fabric`, a preset spec or a file.
    scale
        Capacity scale in ``(0, 1]`` (1e-4: 120 GB/s becomes 12 MB/s). Keep
        the total shaped capacity (:meth:`Layout.total_payload_Bps`) well
        under what the machine's cores can move.
    prefix
        Start of every name created (``pw`` and up to 4 of ``[a-z0-9]``).
    persistent
        Mark the emulator as meant to outlive this process (``pathweave
        emulate up``); otherwise a later ``up`` treats it as stale once this
        process is gone.
    **layout_options
        ``mtu``, ``burst_bytes``, ``latency_s``, ``routes``: see
        :func:`pathweave.emulate.topology.build_layout`.

    Examples
    --------
    >>> from pathweave.emulate import Emulator
    >>> emu = Emulator("h100-2x4", scale=1e-4)
    >>> emu.layout.rank_ns[7], emu.is_up
    ('pw-r7', False)
    """

    def __init__(
        self,
        fabric: Fabric | str,
        scale: float = 1e-4,
        *,
        prefix: str = "pw",
        persistent: bool = False,
        **layout_options: Any,
    ):
        self.fabric = resolve(fabric)
        self.layout: Layout = build_layout(self.fabric, scale, prefix=prefix, **layout_options)
        self.persistent = bool(persistent)
        self.is_up = False
        self._old_term: Any = None

    @property
    def prefix(self) -> str:
        return self.layout.prefix

    @property
    def scale(self) -> float:
        return self.layout.scale

    def __repr__(self) -> str:
        return (f"Emulator(fabric={self.fabric.name!r}, scale={self.scale:g}, "
                f"prefix={self.prefix!r}, up={self.is_up})")

    # --------------------------------------------------------------- up/down
    def up(self) -> Emulator:
        """Create everything; on any failure (or Ctrl-C) remove what was made, then raise."""
        _ip.require_root()
        _ip.require_tools()
        existing = list_namespaces(self.prefix)
        if existing:
            st = _read_state(self.prefix)
            live = st is not None and (st.get("persistent") or _alive(int(st.get("pid", 0))))
            if live and st is not None:
                who = "`pathweave emulate up`" if st.get("persistent") else f"pid {st['pid']}"
                raise EmulatorError(
                    f"an emulator with prefix {self.prefix!r} is up (made by {who}); run "
                    f"`pathweave emulate down --prefix {self.prefix}` or use another prefix"
                )
            cleanup(self.prefix)  # stale pieces of a crashed run
        try:
            STATE_DIR.mkdir(parents=True, exist_ok=True)
            atomic_write(_state_path(self.prefix), json.dumps({
                "pid": os.getpid(), "persistent": self.persistent, "fabric": self.fabric.name,
                "scale": self.scale, "created": time.time(),
            }).encode())
            self.is_up = True
            for argv in self.layout.setup_commands():
                _ip.run(argv)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> list[str]:
        """Remove every namespace of this prefix (and so every link, bridge, qdisc)."""
        self.is_up = False
        return cleanup(self.prefix)

    def __enter__(self) -> Emulator:
        if threading.current_thread() is threading.main_thread():
            # SIGTERM becomes an exception, so the with-block's teardown runs.
            self._old_term = signal.signal(signal.SIGTERM, _raise_exit)
        try:
            return self.up()
        except BaseException:
            self._restore()
            raise

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.down()
        finally:
            self._restore()

    def _restore(self) -> None:
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None

    # ---------------------------------------------------------------- helpers
    def exec_argv(self, rank: int, argv: Sequence[str]) -> list[str]:
        """``ip netns exec`` argv that runs ``argv`` inside ``rank``'s namespace."""
        if not 0 <= int(rank) < self.layout.num_ranks:
            raise ValueError(f"rank must lie in [0, {self.layout.num_ranks}), got {rank}")
        return _ip.netns_exec(self.layout.rank_ns[int(rank)], argv)

    def run_in(self, rank: int, argv: Sequence[str], *, timeout_s: float = 30.0) -> str:
        """Run ``argv`` inside ``rank``'s namespace; its stdout."""
        return _ip.run(self.exec_argv(rank, argv), timeout_s=timeout_s)


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)
