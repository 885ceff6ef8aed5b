"""Bring an emulated fabric up and down: :class:`Emulator`, :func:`cleanup`, :func:`status`.

Everything is created inside namespaces named ``{prefix}-...`` (no device in
the root namespace), so deleting those namespaces removes every veth, bridge
and qdisc. The emulator removes only what it recorded: a ledger,
``/run/pathweave/{prefix}.json``, names its owner (pid and the process's
start time, so a reused pid is not mistaken for the owner), every namespace
(written before the namespace is made), the links and qdiscs inside them,
the rank processes it started and its temporary directories. A namespace
that merely looks like pathweave's (``pwa-r9`` made by someone else) is
never touched. A later :meth:`Emulator.up` removes the recorded pieces of an
owner that died (a crashed or killed run) and refuses to clobber a live one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from pathweave._files import atomic_write
from pathweave.emulate import _ip
from pathweave.emulate._ip import EmulatorError
from pathweave.emulate.topology import NS_RE, PREFIX_RE, Layout, build_layout
from pathweave.errors import InputError
from pathweave.fabric import Fabric, resolve

__all__ = ["STATE_DIR", "Emulator", "cleanup", "ledgers", "list_namespaces", "status"]

#: Where emulator ledgers live (tmpfs: gone after a reboot, as the namespaces are).
STATE_DIR = Path(os.environ.get("PATHWEAVE_EMULATE_STATE", "/run/pathweave"))
#: Start of the emulator's temporary directories (``/tmp/pathweave-emu-PREFIX-...``).
TMP_PREFIX = "pathweave-emu-"


def list_namespaces(prefix: str | None = None) -> list[str]:
    """Existing namespaces whose names look like an emulator's (all prefixes, or one).

    A name alone proves nothing about who made it; :func:`ledgers` says what
    pathweave recorded.
    """
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
        st = json.loads(_state_path(prefix).read_text())
    except (OSError, ValueError):
        return None
    return st if isinstance(st, dict) else None


def ledgers() -> dict[str, dict[str, Any]]:
    """Every recorded emulator: prefix -> its ledger."""
    out = {}
    for f in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else []:
        if PREFIX_RE.match(f.stem):
            st = _read_state(f.stem)
            if st is not None:
                out[f.stem] = st
    return out


def _start_time(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22)."""
    try:
        text = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) may hold spaces and parentheses; fields after it are plain.
    return int(text.rsplit(")", 1)[1].split()[19])


def _alive(pid: int, start: int | None = None) -> bool:
    """Process ``pid`` runs, and (if ``start`` is given) is the one that started then."""
    now = _start_time(pid)
    return now is not None and (start is None or now == start)


def _owner_alive(st: dict[str, Any]) -> bool:
    return _alive(int(st.get("pid", 0) or 0), st.get("start"))


def _remove_recorded(prefix: str, st: dict[str, Any]) -> list[str]:
    """Kill the recorded processes, delete the recorded namespaces and directories."""
    for pid, start in st.get("procs", []):
        if _alive(pid, start):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(pid), signal.SIGKILL)
    existing = set(_ip.run(_ip.netns_list()).split())
    gone = []
    for ns in st.get("namespaces", []):
        if ns in existing:
            _ip.run(_ip.netns_del(ns), check=False)
            gone.append(ns)
    for d in st.get("tmp_dirs", []):
        if Path(d).name.startswith(TMP_PREFIX):
            shutil.rmtree(d, ignore_errors=True)
    left = sorted(set(gone) & set(_ip.run(_ip.netns_list()).split()))
    if left:
        raise EmulatorError(f"could not delete namespaces {left}")
    _state_path(prefix).unlink(missing_ok=True)
    return gone


def cleanup(prefix: str | None = None, *, all_prefixes: bool = False) -> list[str]:
    """Delete what pathweave recorded for ``prefix`` (or, with ``all_prefixes``, for every prefix).

    Only recorded objects are removed: namespaces with a matching name that
    no ledger lists are left alone. Returns the namespaces deleted.

    Raises
    ------
    InputError
        Neither ``prefix`` nor ``all_prefixes`` given, or a malformed prefix.
    """
    _ip.require_root()
    _ip.require_tools()
    if prefix is None and not all_prefixes:
        raise InputError("name a prefix, or ask for every prefix (all_prefixes=True / --all)")
    if prefix is not None and not PREFIX_RE.match(prefix):
        raise InputError(f"not a pathweave emulator prefix: {prefix!r}")
    books = ledgers()
    chosen = [prefix] if prefix is not None else list(books)
    gone: list[str] = []
    for p in chosen:
        if p in books:
            gone += _remove_recorded(p, books[p])
    return gone


def _port_rates(ns: str) -> dict[str, float | None]:
    """Wire rate (bytes/s) of every shaped interface of ``ns``, whichever its shaping."""
    qd = json.loads(_ip.run(["tc", "-n", ns, "-j", "qdisc", "show"]) or "[]")
    rate: dict[str, float | None] = {}
    for q in qd:
        if q.get("root") and q.get("kind") == "tbf":
            rate[q["dev"]] = q.get("options", {}).get("rate")
        elif q.get("root") and q.get("kind") == "htb":
            rate[q["dev"]] = _ip.htb_rate_Bps(_ip.run(
                ["tc", "-n", ns, "class", "show", "dev", q["dev"], "classid", "1:1"]))
    return rate


def status(prefix: str | None = None) -> list[dict[str, Any]]:
    """What is up: per namespace, its owner and its shaped interfaces and rates.

    Returns one record per emulator-like namespace: ``{"ns", "prefix",
    "owner", "recorded", "fabric", "scale", "ports": [{"dev", "wire_Bps",
    "bridge"}]}`` (``wire_Bps``: the shaped rate, tbf's or the htb root class's, bytes
    per second on the wire);
    ``owner`` is ``"persistent"``, ``"pid N"`` or ``None`` (its owner died:
    stale); ``recorded`` is false for a namespace no ledger lists (not
    pathweave's; never removed by it).
    """
    _ip.require_root()
    _ip.require_tools()
    books = ledgers()
    recs = []
    for ns in list_namespaces(prefix):
        pfx = NS_RE.match(ns).group(1)  # type: ignore[union-attr]
        st = books.get(pfx)
        recorded = st is not None and ns in st.get("namespaces", [])
        links = json.loads(_ip.run(["ip", "-n", ns, "-j", "link", "show"]) or "[]")
        rate = _port_rates(ns)
        ports = [
            {"dev": ln["ifname"], "wire_Bps": rate.get(ln["ifname"]), "bridge": ln.get("master")}
            for ln in links if ln["ifname"] in rate
        ]
        owner = None
        if recorded and st is not None:
            if st.get("persistent"):
                owner = "persistent"
            elif _owner_alive(st):
                owner = f"pid {st.get('pid')}"
        recs.append({"ns": ns, "prefix": pfx, "owner": owner, "recorded": recorded,
                     "ports": ports, "fabric": (st or {}).get("fabric") if recorded else None,
                     "scale": (st or {}).get("scale") if recorded else None})
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
        self._state: dict[str, Any] = {}

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
        """Create everything; on any failure, Ctrl-C or SIGTERM remove what was made, then raise.

        Raises
        ------
        EmulatorError
            Not root, tools missing, an emulator of this prefix is up (its
            owner lives), a namespace of the plan exists but is not recorded
            as pathweave's, or a command failed.
        """
        _ip.require_root()
        _ip.require_tools()
        st = _read_state(self.prefix)
        if st is not None:
            if st.get("persistent") or _owner_alive(st):
                who = "`pathweave emulate up`" if st.get("persistent") else f"pid {st['pid']}"
                raise EmulatorError(
                    f"an emulator with prefix {self.prefix!r} is up (made by {who}); run "
                    f"`pathweave emulate down --prefix {self.prefix}` or use another prefix"
                )
            _remove_recorded(self.prefix, st)  # the recorded pieces of a dead owner
        foreign = sorted(set(self.layout.namespaces) & set(_ip.run(_ip.netns_list()).split()))
        if foreign:
            raise EmulatorError(
                f"namespaces {', '.join(foreign)} exist but pathweave did not record making "
                f"them; remove them (ip netns delete NAME) or use another prefix"
            )
        with _signals_raise():
            try:
                self._state = {
                    "pid": os.getpid(), "start": _start_time(os.getpid()), "persistent": False,
                    "fabric": self.fabric.name, "scale": self.scale, "created": time.time(),
                    "namespaces": [], "links": [], "qdiscs": [], "procs": [], "tmp_dirs": [],
                }
                self.is_up = True
                self._build()
                # Only a complete emulator outlives its maker (`emulate up`).
                self._record(persistent=self.persistent)
            except BaseException:
                self.down()
                raise
        return self

    def _build(self) -> None:
        lay = self.layout
        # Recorded before each is made: a kill between the two leaves a
        # ledger entry for a missing namespace (harmless), never the reverse.
        self._record(namespaces=list(lay.namespaces),
                     links=[[c.a.ns, c.a.dev] for c in lay.veths] + [[c.b.ns, c.b.dev]
                                                                   for c in lay.veths],
                     qdiscs=[[p.ns, p.dev] for p in lay.shaped])
        for argv in lay.setup_commands():
            try:
                _ip.run(argv)
            except EmulatorError:
                if argv[:3] == ["ip", "netns", "add"]:
                    # Someone else made it in the meantime: not ours to delete.
                    self._state["namespaces"].remove(argv[3])
                    self._record()
                raise

    def port_counters(self) -> dict[tuple[str, str], dict[str, int | str]]:
        """``{(namespace, interface): {"kind", "bytes", "packets", "drops"}}`` of every shaped port.

        What each port's egress sent since it was made, on the wire (see
        :func:`._ip.port_counters`); the difference of two readings is what a
        run between them moved over each directed link.
        """
        shaped = {(p.ns, p.dev) for p in self.layout.shaped}
        out: dict[tuple[str, str], dict[str, int | str]] = {}
        for ns in sorted({ns for ns, _ in shaped}):
            qd = json.loads(_ip.run(["tc", "-n", ns, "-s", "-j", "qdisc", "show"]) or "[]")
            out.update({(ns, dev): c for dev, c in _ip.port_counters(qd).items()
                        if (ns, dev) in shaped})
        return out

    def _record(self, **changes: Any) -> None:
        self._state.update(changes)
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        atomic_write(_state_path(self.prefix), json.dumps(self._state).encode())

    def record_process(self, pid: int) -> None:
        """Record a process this emulator's run started (killed with its group on cleanup)."""
        if self.is_up:
            self._record(procs=[*self._state["procs"], [int(pid), _start_time(pid)]])

    @contextlib.contextmanager
    def temp_dir(self) -> Iterator[Path]:
        """A recorded temporary directory, removed on exit or by a later cleanup."""
        path = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{self.prefix}-"))
        if self.is_up:
            self._record(tmp_dirs=[*self._state["tmp_dirs"], str(path)])
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
            if self.is_up and str(path) in self._state["tmp_dirs"]:
                self._state["tmp_dirs"].remove(str(path))
                self._record()

    def down(self) -> list[str]:
        """Remove every object this emulator recorded (namespaces, and with them every link)."""
        self.is_up = False
        st = _read_state(self.prefix)
        if st is None or (st.get("pid") != os.getpid() and not st.get("persistent")):
            return []  # nothing recorded by this process
        return _remove_recorded(self.prefix, st)

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


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """While building, SIGTERM raises (as Ctrl-C does), so a killed ``up`` rolls back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
