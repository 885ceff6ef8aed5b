"""Argv builders for ``ip``/``tc``/``sysctl`` and the one place that runs them.

Every command is an argv list handed to :func:`subprocess.run` without a
shell, so no name or address is ever parsed by one. Builders are pure (they
return lists) and unit-testable without root; :func:`run` executes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence

from pathweave.errors import EmulatorError

__all__ = [
    "SHAPINGS",
    "EmulatorError",
    "addr_add",
    "bridge_add",
    "htb_ackfirst",
    "htb_rate_Bps",
    "link_master",
    "link_up",
    "netns_add",
    "netns_del",
    "netns_exec",
    "netns_list",
    "port_counters",
    "queue_bytes",
    "require_root",
    "require_tools",
    "route_add",
    "run",
    "shape",
    "sysctl",
    "tbf",
    "veth_add",
]


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")


def _name(kind: str, value: str) -> str:
    # Interface names are at most 15 bytes (IFNAMSIZ - 1); namespace names
    # become file names under /run/netns. Refuse anything odd early.
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError(f"bad {kind} name {value!r}: 1-15 characters of [A-Za-z0-9_.-]")
    return value


def netns_add(ns: str) -> list[str]:
    """``ip netns add NS``."""
    return ["ip", "netns", "add", _name("namespace", ns)]


def netns_del(ns: str) -> list[str]:
    """``ip netns delete NS``: removes the namespace and every interface in it."""
    return ["ip", "netns", "delete", _name("namespace", ns)]


def netns_list() -> list[str]:
    """``ip netns list``."""
    return ["ip", "netns", "list"]


def netns_exec(ns: str, argv: Sequence[str]) -> list[str]:
    """``ip netns exec NS ARGV...``: run a program inside a namespace.

    Examples
    --------
    >>> netns_exec("pw-r0", ["python", "-c", "pass"])
    ['ip', 'netns', 'exec', 'pw-r0', 'python', '-c', 'pass']
    """
    return ["ip", "netns", "exec", _name("namespace", ns), *[str(a) for a in argv]]


def veth_add(ns_a: str, dev_a: str, ns_b: str, dev_b: str, *, mtu: int = 1500) -> list[str]:
    """A veth pair created directly inside its two namespaces (nothing in the root one).

    Examples
    --------
    >>> veth_add("pw-r0", "l0", "pw-r1", "l3")  # doctest: +NORMALIZE_WHITESPACE
    ['ip', '-n', 'pw-r0', 'link', 'add', 'l0', 'mtu', '1500', 'type', 'veth',
     'peer', 'name', 'l3', 'netns', 'pw-r1']
    """
    return [
        "ip", "-n", _name("namespace", ns_a), "link", "add", _name("interface", dev_a),
        "mtu", str(int(mtu)), "type", "veth",
        "peer", "name", _name("interface", dev_b), "netns", _name("namespace", ns_b),
    ]


def bridge_add(ns: str, dev: str) -> list[str]:
    """A bridge device (a switch of the fabric)."""
    return ["ip", "-n", _name("namespace", ns), "link", "add", _name("interface", dev),
            "type", "bridge"]


def link_master(ns: str, dev: str, bridge: str) -> list[str]:
    """Enslave ``dev`` to ``bridge``."""
    return ["ip", "-n", _name("namespace", ns), "link", "set", _name("interface", dev),
            "master", _name("interface", bridge)]


def link_up(ns: str, dev: str) -> list[str]:
    """Bring ``dev`` up."""
    return ["ip", "-n", _name("namespace", ns), "link", "set", _name("interface", dev), "up"]


def addr_add(ns: str, dev: str, cidr: str) -> list[str]:
    """Add an address (``10.211.0.1/32``) to ``dev``."""
    return ["ip", "-n", _name("namespace", ns), "addr", "add", str(cidr), "dev",
            _name("interface", dev)]


def route_add(ns: str, dst: str, dev: str, *, via: str | None = None,
              src: str | None = None) -> list[str]:
    """A host route: ``dst`` leaves on ``dev`` (through next hop ``via``, on-link).

    The next hop is a neighbour's identity address; ``onlink`` tells the
    kernel it is reachable on ``dev`` without a subnet route, and the
    neighbour answers ARP for it on any of its interfaces.

    Examples
    --------
    >>> route_add("pw-r0", "10.211.0.6", "l0", via="10.211.0.2", src="10.211.0.1")
    ... # doctest: +NORMALIZE_WHITESPACE
    ['ip', '-n', 'pw-r0', 'route', 'add', '10.211.0.6/32', 'dev', 'l0',
     'via', '10.211.0.2', 'onlink', 'src', '10.211.0.1']
    """
    argv = ["ip", "-n", _name("namespace", ns), "route", "add", f"{dst}/32", "dev",
            _name("interface", dev)]
    if via is not None:
        argv += ["via", str(via), "onlink"]
    if src is not None:
        argv += ["src", str(src)]
    return argv


#: Ways to shape a directed link (:func:`shape`): ``tbf``, one token bucket
#: and one FIFO; ``ackfirst``, the same bucket in an htb whose pure
#: acknowledgements pass the data queued before them.
SHAPINGS = ("tbf", "ackfirst")

#: ackfirst's ACK class: IPv4 total length under 128 bytes. A TCP segment
#: without payload is 52 bytes with timestamps and up to 84 with three SACK
#: blocks (the acknowledgements that matter most, after a drop).
_ACK_MATCH = ["match", "ip", "protocol", "6", "0xff", "match", "u16", "0x0000", "0xff80", "at", "2"]


def _check_shape(kind: str, rate_bps: int, burst_bytes: int, latency_s: float) -> None:
    if rate_bps <= 0 or burst_bytes <= 0 or latency_s <= 0:
        raise ValueError(
            f"{kind} shaping needs positive rate, burst and latency; got rate_bps={rate_bps}, "
            f"burst_bytes={burst_bytes}, latency_s={latency_s}"
        )


def shape(kind: str, ns: str, dev: str, rate_bps: int, burst_bytes: int, latency_s: float,
          *, mtu: int = 1500) -> list[list[str]]:
    """The argv lists that shape ``dev``'s egress as ``kind`` (one of :data:`SHAPINGS`).

    Examples
    --------
    >>> [a[3] for a in shape("ackfirst", "pw-r0", "l0", 40_000_000, 131072, 0.005)]
    ['qdisc', 'class', 'class', 'class', 'qdisc', 'qdisc', 'filter']
    """
    if kind == "tbf":
        return [tbf(ns, dev, rate_bps, burst_bytes, latency_s)]
    if kind == "ackfirst":
        return htb_ackfirst(ns, dev, rate_bps, burst_bytes, latency_s, mtu=mtu)
    raise ValueError(f"unknown link shaping {kind!r}; known: {', '.join(SHAPINGS)}")


def tbf(ns: str, dev: str, rate_bps: int, burst_bytes: int, latency_s: float) -> list[str]:
    """Shape ``dev``'s egress with a token bucket: ``rate_bps`` bits per second on the wire.

    Examples
    --------
    >>> tbf("pw-r0", "l0", 40_000_000, 131072, 0.005)  # doctest: +NORMALIZE_WHITESPACE
    ['tc', '-n', 'pw-r0', 'qdisc', 'replace', 'dev', 'l0', 'root', 'tbf',
     'rate', '40000000bit', 'burst', '131072', 'latency', '5000us']
    """
    _check_shape("tbf", rate_bps, burst_bytes, latency_s)
    return [
        "tc", "-n", _name("namespace", ns), "qdisc", "replace", "dev", _name("interface", dev),
        "root", "tbf", "rate", f"{int(rate_bps)}bit", "burst", str(int(burst_bytes)),
        "latency", f"{max(1, round(latency_s * 1e6))}us",
    ]


def queue_bytes(rate_bps: int, burst_bytes: int, latency_s: float) -> int:
    """Bytes a shaped port queues before it drops: ``rate * latency + burst``.

    tbf derives its limit from ``latency`` this way; :func:`htb_ackfirst`
    sizes each ``bfifo`` the same.

    >>> queue_bytes(40_000_000, 131072, 0.005)   # 5 ms of 5 MB/s plus a 128 KiB bucket
    156072
    """
    return round(int(rate_bps) / 8 * latency_s) + int(burst_bytes)


def htb_ackfirst(ns: str, dev: str, rate_bps: int, burst_bytes: int, latency_s: float,
                 *, mtu: int = 1500) -> list[list[str]]:
    """Shape ``dev`` at ``rate_bps`` like :func:`tbf`, pure TCP acknowledgements first.

    An htb root class holds the link's rate and bucket; under it class
    ``1:10`` (priority 0, 1/50 of the rate guaranteed, all of it borrowable)
    takes TCP segments under 128 bytes, class ``1:20`` (priority 1) the rest.
    Each queues at most what tbf's ``latency`` allows, ``rate * latency +
    burst`` bytes (a ``bfifo``). On a link loaded both ways, the
    acknowledgements of one direction then no longer wait behind the other
    direction's data (a stall of a TCP-over-veth emulation that link-level
    acknowledgements of RDMA or NVLink do not have).

    Examples
    --------
    >>> cmds = htb_ackfirst("pw-r0", "l0", 40_000_000, 131072, 0.005)
    >>> cmds[1][5:]  # doctest: +NORMALIZE_WHITESPACE
    ['dev', 'l0', 'parent', '1:', 'classid', '1:1', 'htb', 'rate', '40000000bit',
     'ceil', '40000000bit', 'burst', '131072', 'cburst', '131072', 'quantum', '1514']
    >>> cmds[5][5:]   # the data queue: 5 ms of 5 MB/s plus the 128 KiB bucket
    ['dev', 'l0', 'parent', '1:20', 'handle', '20:', 'bfifo', 'limit', '156072']
    """
    _check_shape("ackfirst", rate_bps, burst_bytes, latency_s)
    tc = ["tc", "-n", _name("namespace", ns)]
    dev = _name("interface", dev)
    rate, burst = int(rate_bps), str(int(burst_bytes))
    ack_rate = max(8, rate // 50)
    limit = str(queue_bytes(rate, burst_bytes, latency_s))
    share = ["ceil", f"{rate}bit", "burst", burst, "cburst", burst, "quantum", str(int(mtu) + 14)]
    return [
        [*tc, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "20"],
        [*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
         "rate", f"{rate}bit", *share],
        [*tc, "class", "add", "dev", dev, "parent", "1:1", "classid", "1:10", "htb",
         "rate", f"{ack_rate}bit", *share, "prio", "0"],
        [*tc, "class", "add", "dev", dev, "parent", "1:1", "classid", "1:20", "htb",
         "rate", f"{rate - ack_rate}bit", *share, "prio", "1"],
        [*tc, "qdisc", "add", "dev", dev, "parent", "1:10", "handle", "10:", "bfifo",
         "limit", limit],
        [*tc, "qdisc", "add", "dev", dev, "parent", "1:20", "handle", "20:", "bfifo",
         "limit", limit],
        [*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1",
         "u32", *_ACK_MATCH, "flowid", "1:10"],
    ]


def port_counters(qdiscs: Sequence[dict]) -> dict[str, dict[str, int | str]]:
    """Per shaped interface, what its egress sent: from ``tc -s -j qdisc show`` (parsed).

    The root qdisc of a port, ``tbf`` or ``htb``, counts every byte that left
    it, on the wire (Ethernet header included), and every packet it dropped;
    an htb's own counters are the sum of its classes' (this is read, not the
    class counters: iproute2 6.1 prints classes only as text, even with ``-j``).

    Examples
    --------
    >>> port_counters([{"kind": "htb", "dev": "l0", "root": True, "bytes": 9000,
    ...                 "packets": 6, "drops": 1},
    ...                {"kind": "bfifo", "dev": "l0", "parent": "1:20", "bytes": 8800}])
    {'l0': {'kind': 'htb', 'bytes': 9000, 'packets': 6, 'drops': 1}}
    """
    return {q["dev"]: {"kind": q["kind"], "bytes": int(q.get("bytes", 0)),
                       "packets": int(q.get("packets", 0)), "drops": int(q.get("drops", 0))}
            for q in qdiscs if q.get("root") and q.get("kind") in ("tbf", "htb")}


_HTB_RATE = re.compile(r"^class htb 1:1 root .*?\brate (\d+)([KMGT]?)bit\b", re.MULTILINE)


def htb_rate_Bps(class_text: str) -> float | None:
    """The root class's rate in bytes per second, from ``tc class show dev DEV`` text.

    Examples
    --------
    >>> htb_rate_Bps("class htb 1:1 root rate 41834Kbit ceil 41834Kbit burst 128Kb")
    5229250.0
    """
    m = _HTB_RATE.search(class_text)
    if m is None:
        return None
    return int(m.group(1)) * 10 ** (3 * " KMGT".index(m.group(2) or " ")) / 8


def sysctl(ns: str, settings: dict[str, str | int]) -> list[str]:
    """Set kernel parameters inside a namespace.

    Examples
    --------
    >>> sysctl("pw-r0", {"net.ipv4.ip_forward": 1})
    ['ip', 'netns', 'exec', 'pw-r0', 'sysctl', '-q', '-w', 'net.ipv4.ip_forward=1']
    """
    pairs = []
    for key, value in settings.items():
        if not re.match(r"^[a-z0-9_.]+$", key):
            raise ValueError(f"bad sysctl key {key!r}")
        pairs.append(f"{key}={value}")
    return netns_exec(ns, ["sysctl", "-q", "-w", *pairs])


# ------------------------------------------------------------------ running
def require_root() -> None:
    """Raise :class:`EmulatorError` unless this process may create namespaces."""
    if os.geteuid() != 0:
        raise EmulatorError(
            "the emulator needs root (it creates network namespaces, veth pairs and tc "
            f"qdiscs); this process runs as uid {os.geteuid()}: run it with sudo or as root"
        )


def require_tools() -> None:
    """Raise :class:`EmulatorError` if ``ip``, ``tc`` or ``sysctl`` is missing."""
    missing = [t for t in ("ip", "tc", "sysctl") if shutil.which(t) is None]
    if missing:
        raise EmulatorError(
            f"the emulator needs {', '.join(missing)} (package iproute2 / procps); "
            "install them, e.g. apt-get install -y iproute2 procps"
        )


def run(argv: Sequence[str], *, check: bool = True, timeout_s: float = 30.0) -> str:
    """Run one argv list (no shell); return stdout, raise :class:`EmulatorError` on failure."""
    argv = [str(a) for a in argv]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except FileNotFoundError:
        raise EmulatorError(
            f"command not found: {argv[0]!r} (needed for {' '.join(argv)})"
        ) from None
    except subprocess.TimeoutExpired:
        raise EmulatorError(f"command timed out after {timeout_s} s: {' '.join(argv)}") from None
    if check and proc.returncode != 0:
        raise EmulatorError(
            f"command failed (exit {proc.returncode}): {' '.join(argv)}: "
            f"{(proc.stderr or proc.stdout).strip()}"
        )
    return proc.stdout
