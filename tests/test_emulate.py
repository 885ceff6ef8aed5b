"""The emulator for real: 4 ranks in namespaces over kernel-shaped links (needs root).

A 2 x 2 NVLink-mesh fabric at 1e-4 of its capacities (NVLink 12 MB/s, rails
5 MB/s): plain TCP over one link arrives at the configured payload rate; a
transfer the kernel forwards through another rank's namespace (PXN) arrives
intact at its rail's rate; the data plane's all-to-all, forwarded by rank
processes, delivers every byte; teardown leaves no namespace, link or bridge.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

import pathweave as pw
from pathweave.emulate._ip import SHAPINGS

pytestmark = [
    pytest.mark.emulator,  # brings it up: scripts/test.sh runs these one at a time
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
        reason="the emulator needs root and iproute2 (ip, tc); CI runs as root",
    ),
]

FABRIC = "cluster:nodes=2,gpus_per_node=2,node_kind=nvlink-mesh"
PREFIX = "pwt"


def root_links() -> set[str]:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True,
                         check=True).stdout
    return {ln["ifname"] for ln in json.loads(out)}


def assert_nothing_left() -> None:
    from pathweave.emulate import list_namespaces

    assert list_namespaces(PREFIX) == []
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                           check=True).stdout
    assert f"{PREFIX}-" not in names


def best_rate(emu, src: int, dst: int, nbytes: int, want_Bps: float) -> float:
    """Highest payload rate of up to 3 transfers, each checked byte for byte.

    A token bucket only ever slows a flow down, so the best of a few tries
    is the link's rate: a shaping error shows in every try (too fast or too
    slow), a TCP loss recovery or a stalled process on a busy machine in one.
    """
    from pathweave.emulate import probe_transfer

    rates = []
    for _ in range(3):
        got = probe_transfer(emu, src, dst, nbytes)
        assert got["ok"] and got["bytes"] == nbytes
        rates.append(got["rate_Bps"])
        if abs(got["rate_Bps"] / want_Bps - 1) < 0.15:
            break
    return max(rates)


def test_shaped_rate_forwarding_and_teardown():
    from pathweave.emulate import Emulator

    before = root_links()
    fab = pw.fabric.preset(FABRIC)
    emu = Emulator(fab, 1e-4, prefix=PREFIX)
    lay = emu.layout
    with emu:
        assert sorted(lay.namespaces) == sorted(
            n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                      check=True).stdout.split() if n.startswith(f"{PREFIX}-")
        )
        # One NVLink: 0 -> 1 at 12 MB/s of payload.
        direct = best_rate(emu, 0, 1, 3 << 20, 12e6)
        assert direct == pytest.approx(12e6, rel=0.15)
        # 0 -> 3 crosses nodes: the kernel forwards it in rank 1's namespace, then rail 1.
        assert [lay.ns_name(v) for v in lay.pair_stops[0][3]] == [
            f"{PREFIX}-r0", f"{PREFIX}-r1", f"{PREFIX}-r3"]
        relayed = best_rate(emu, 0, 3, 2 << 20, 5e6)
        assert relayed == pytest.approx(5e6, rel=0.15)
        # The kernel holds each rank's socket limit in that rank's namespace:
        # the smallest queue (a 5 MB/s rail: 5 ms on the wire + 128 KiB) over
        # the 3 other ranks' sockets, (26_140 + 131_072) // 3.
        for r in range(4):
            got = emu.run_in(r, ["sysctl", "-n", "net.ipv4.tcp_limit_output_bytes"])
            assert int(got) == 52_404
    assert_nothing_left()
    # Nothing of ours was ever created in the root namespace (other jobs may add links).
    ours = re.compile(r"^(l\d+|b\d+|id[01])$")
    assert not {n for n in root_links() - before if ours.match(n)}


def test_data_plane_forwards_correct_bytes():
    from pathweave.emulate import run_emulated

    res = run_emulated(FABRIC, scale=1e-4, workload="hotspot:0.8", bytes_per_rank=3 << 20,
                       policies=("mwu", "torch"), repeat=1, prefix=PREFIX, timeout_s=240)
    mwu = res.policy("mwu")
    assert mwu.verified and res.policy("torch").verified
    # Bytes really went through forwarding ranks (remote-rail / PXN paths of the plan).
    forwarded = sum(v for k, v in mwu.path_kind_bytes.items() if k in ("rd", "dr", "drd"))
    assert forwarded > 0
    assert sum(mwu.path_kind_bytes.values()) == res.total_bytes
    # The fluid model never beats the congestion bound (up to rounding of its events).
    assert mwu.measured_s > 0 and mwu.predicted_s >= mwu.bound_s * (1 - 1e-9) > 0
    assert_nothing_left()


def test_teardown_on_error_and_stale_cleanup(tmp_path):
    from pathweave.emulate import Emulator, EmulatorError, list_namespaces
    from pathweave.emulate.emulator import _state_path

    with pytest.raises(RuntimeError, match="boom"), Emulator(FABRIC, 1e-4, prefix=PREFIX):
        assert len(list_namespaces(PREFIX)) == 5
        raise RuntimeError("boom")
    assert_nothing_left()

    first = Emulator(FABRIC, 1e-4, prefix=PREFIX).up()
    try:
        # A live emulator is not clobbered...
        with pytest.raises(EmulatorError, match="is up"):
            Emulator(FABRIC, 1e-4, prefix=PREFIX).up()
        # ...but one whose creator died is stale and is replaced.
        dead = subprocess.Popen(["true"])
        dead.wait()
        state = json.loads(_state_path(PREFIX).read_text())
        _state_path(PREFIX).write_text(json.dumps({**state, "pid": dead.pid}))
        second = Emulator(FABRIC, 2e-4, prefix=PREFIX, shaping="tbf").up()
        out = subprocess.run(["tc", "-n", f"{PREFIX}-r0", "-j", "qdisc", "show"],
                             capture_output=True, text=True, check=True).stdout
        rates = {q["dev"]: q["options"]["rate"] for q in json.loads(out) if q["kind"] == "tbf"}
        nv = f"l{second.fabric.link_id('n0.gpu0', 'n0.gpu1')}"
        # tc reports bytes/s on the wire: 24 MB/s payload plus framing.
        assert rates[nv] == pytest.approx(24e6 * 1514 / 1448, rel=0.01)
        second.down()
    finally:
        first.down()
    assert_nothing_left()


def test_cli_up_status_down():
    from typer.testing import CliRunner

    from pathweave.cli.main import app

    runner = CliRunner()
    res = runner.invoke(app, ["emulate", "up", "--fabric", FABRIC, "--prefix", PREFIX])
    try:
        assert res.exit_code == 0, res.output
        assert f"{PREFIX}-r3" in res.output and "10.211.0.4" in res.output
        res = runner.invoke(app, ["emulate", "status", "--prefix", PREFIX])
        assert res.exit_code == 0, res.output
        assert "persistent" in res.output
        # NVLink 12 MB/s and rail 5 MB/s of payload: 100.4 and 41.8 Mbit/s on the wire.
        assert "100.4" in res.output and "41.8" in res.output
    finally:
        res = runner.invoke(app, ["emulate", "down", "--prefix", PREFIX])
    assert res.exit_code == 0 and "removed 5 namespaces" in res.output
    assert_nothing_left()


@pytest.mark.parametrize("shaping", SHAPINGS)
def test_every_shaping_rate_counters_and_status(shaping):
    """One NVLink under each shaping: the payload rate, the wire bytes its port counts, the
    rate ``status`` reads back."""
    from pathweave.emulate import Emulator, status
    from pathweave.emulate.topology import framing_factor

    with Emulator(FABRIC, 1e-4, prefix=PREFIX, shaping=shaping) as emu:
        port = emu.layout.link_dev[emu.fabric.link_id("n0.gpu0", "n0.gpu1")]
        before = emu.port_counters()[port]
        nbytes = 3 << 20
        assert best_rate(emu, 0, 1, nbytes, 12e6) == pytest.approx(12e6, rel=0.15)
        sent = emu.port_counters()[port]["bytes"] - before["bytes"]
        assert emu.port_counters()[port]["kind"] == ("tbf" if shaping == "tbf" else "htb")
        # At least one probe's payload in full segments (plus framing); at most three tries
        # plus their acknowledgements of the other direction's nothing.
        assert nbytes * framing_factor(1500) <= sent <= 3.05 * nbytes * framing_factor(1500)
        ports = {p["dev"]: p["wire_Bps"] for r in status(PREFIX) if r["ns"] == port[0]
                 for p in r["ports"]}
        assert ports[port[1]] == pytest.approx(12e6 * 1514 / 1448, rel=0.01)
    assert_nothing_left()
