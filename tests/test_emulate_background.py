"""The emulator's co-tenant: spec parsing and residual capacities (pure), real traffic (root)."""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest

import pathweave as pw
from pathweave.emulate.background import Background, parse_background, residual_fabric
from pathweave.errors import InputError
from pathweave.fabric.presets import PRESETS


def _two_nodes(name: str) -> pw.fabric.Fabric:
    """``name`` at two nodes; a rack-sized node (gb200-nvl72: 72 GPUs) cut to 8 GPUs, the
    same layout, so the pair scan below stays at seconds."""
    fab = pw.fabric.preset(name, nodes=2)
    return fab if fab.gpus_per_node <= 8 else pw.fabric.preset(name, nodes=2, gpus_per_node=8)


# Every preset, two nodes where it takes a node count (``cluster`` needs one).
MULTI_NODE = {name: _two_nodes(name) for name in PRESETS}
MULTI_NODE = {k: f for k, f in MULTI_NODE.items() if f.rails and f.num_nodes > 1}


@pytest.mark.parametrize("name", sorted(MULTI_NODE))
def test_every_rail_of_every_preset_gets_a_pair_across_it(name):
    from pathweave.fabric import candidate_paths

    fab = MULTI_NODE[name]
    ps = candidate_paths(fab)
    n = fab.num_ranks
    pairs = [s * n + d for s in range(n) for d in range(n) if s != d]
    static = ps.links[ps.pair_ptr[pairs]]                 # each pair's first path: its route
    for rail in fab.rails:
        v = fab.vertex_id(rail)
        on_rail = np.flatnonzero((fab.link_src == v) | (fab.link_dst == v))
        if not np.isin(static, on_rail).any():            # no route uses it: said so
            with pytest.raises(InputError, match=f"no rank pair's route crosses '{rail}'"):
                parse_background(f"{rail}:0.25", fab)
            continue
        (t,) = parse_background(f"{rail}:0.25", fab)
        links = np.array(t.links)
        assert t.a != t.b and fab.node_of_rank(t.a) != fab.node_of_rank(t.b)
        assert ((fab.link_src[links] == v) | (fab.link_dst[links] == v)).sum() >= 2
        assert t.rate_Bps == pytest.approx(0.25 * fab.capacity_Bps[
            (fab.link_src == v) | (fab.link_dst == v)].min())
        res = residual_fabric(fab, [t], scale=1.0)
        taken = fab.capacity_Bps - res.capacity_Bps
        # The rate comes off every link of both routes, and off nothing else.
        assert np.allclose(taken[links], np.minimum(t.rate_Bps, 0.99 * fab.capacity_Bps[links]))
        assert (np.delete(taken, links) == 0).all()


@pytest.mark.parametrize("spec", ["rail0", "rail0:1.5", "rail0:0", "rail0:x", "nope:0.5",
                                  "n0.gpu0->nope:0.5", ":0.5"])
def test_bad_specs_name_the_value(spec):
    with pytest.raises(InputError, match="background"):
        parse_background(spec, pw.fabric.preset("h100-2x4"))


def test_residual_fabric_scales_the_rate():
    fab = pw.fabric.preset("h100-2x4")
    (t,) = parse_background("rail0:0.6", fab)
    res = residual_fabric(fab, [t], scale=1e-4)          # an already-scaled fabric's units
    lid = fab.link_id("n0.nic0", "rail0")
    assert fab.capacity_Bps[lid] - res.capacity_Bps[lid] == pytest.approx(30e9 * 1e-4)
    assert residual_fabric(fab, []) is fab


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="the emulator needs root and iproute2 (ip, tc); CI runs as root",
)


@pytest.mark.emulator  # brings it up: scripts/test.sh runs these one at a time
@needs_root
def test_co_tenant_paces_its_datagrams_and_stops_by_itself():
    """The co-tenant's datagrams cross the emulated network beside a transfer; its
    processes stop at exit and by themselves. Counted in bytes, not timed: the share
    it takes of a loaded rail is measured by ``pathweave bench emulate --background``."""
    from pathweave.emulate import Emulator, probe_transfer
    from pathweave.emulate._cotenant import BLOCK

    fab = pw.fabric.preset("cluster:nodes=2,gpus_per_node=2,node_kind=nvlink-mesh")
    (t,) = parse_background("rail0:0.6", fab)
    with Emulator(fab, 1e-4, prefix="pwtb") as emu:
        rail_Bps = emu.layout.payload_Bps(fab.link_id(fab.vertex_name(
            fab.rank_vertex[t.a]).replace("gpu", "nic"), "rail0"))   # TCP payload rate
        with Background(emu, [t], duration_s=6.0) as bg:
            got = probe_transfer(emu, t.a, t.b, 1 << 20)
            procs = list(bg._procs)
        assert got["ok"]
        assert len(procs) == 4 and all(p.poll() is not None for p in procs)  # exit stops them
        with Background(emu, [t], duration_s=1.0) as bg:
            time.sleep(3.0)
            assert all(p.poll() is not None for p in bg._procs)   # ... and so does time
    (rate,) = bg.rates_Bps
    # 60 % of the wire: datagram fragments carry 32 bytes more payload per frame than TCP.
    assert rate == pytest.approx(0.6 * rail_Bps, rel=0.05)
    moved = {role: [b for _, r, b in bg.bytes_moved if r == role] for role in ("sent", "received")}
    assert len(moved["sent"]) == 2 and len(moved["received"]) == 2, bg.bytes_moved  # both ways
    # Every datagram that arrived was sent, none beyond the pacing; some arrived each way.
    assert all(0 < b <= rate * 1.0 + BLOCK for b in moved["sent"]), (moved, rate)
    assert all(0 < b for b in moved["received"]), moved
    assert sum(moved["received"]) <= sum(moved["sent"]), moved


@pytest.mark.emulator
@needs_root
def test_interleaved_policies_each_keep_their_own_orchestrator():
    from pathweave.emulate import run_workloads

    fab = pw.fabric.preset("cluster:nodes=2,gpus_per_node=2,node_kind=nvlink-mesh")
    (res,) = run_workloads(fab, ["hotspot:0.6"], scale=1e-4, bytes_per_rank=1 << 20,
                           policies=("mwu", "mwu+adapt", "torch"), repeat=2, prefix="pwtb",
                           background="rail0:0.6", timeout_s=240)
    for p in res.policies:                       # every byte of every call checked
        assert p.verified and len(p.makespans_s) == 2
    assert res.policy("mwu").plan_switches == 0 and res.policy("torch").plan_switches == 0


def test_background_checks_hand_computed():
    from pathweave.bench.emulate import background_checks, background_policies

    static, multirail, default, adaptive = background_policies()

    def rec(load, policy, spans, bound=1.0, switches=0):
        return {"load": load, "policy": policy, "makespans_s": spans,
                "measured_s": float(np.median(spans)), "bound_s": bound, "verified": True,
                "plan_switches": switches}

    # Load 0: the blind plan's calls drift (1.0, 1.3, 1.1), the adaptive one 1 % over
    # each: medians are 1.1 and 1.111 (1.01x), paired ratios all 1.01.
    blind = [1.0, 1.3, 1.1]
    records = [rec(0.0, static, [3.0] * 3), rec(0.0, multirail, [1.2] * 3),
               rec(0.0, default, blind), rec(0.0, adaptive, [1.01 * x for x in blind]),
               rec(0.6, static, [5.0] * 3), rec(0.6, multirail, [1.5] * 3),
               rec(0.6, default, [1.4] * 3),
               rec(0.6, adaptive, [0.9] * 3, bound=0.8, switches=1)]
    lines = background_checks(records)
    assert [ok for ok, _ in lines] == [True, True, True]
    assert "1.010x (median of per-call ratios), 0 plan switches" in lines[0][1]
    assert f"0.643x the best blind ({default}, 1.400 s)" in lines[1][1]
    assert "= 1.125x its residual-capacity bound" in lines[2][1]
    # Out of step: adapting 3 % slower on every call, or one switch at load 0.
    records[3] = rec(0.0, adaptive, [1.03 * x for x in blind])
    assert not background_checks(records)[0][0]
    records[3] = rec(0.0, adaptive, blind, switches=1)
    assert not background_checks(records)[0][0]


def test_co_tenant_processes_are_waited_for_by_their_ready_line():
    import subprocess
    import sys

    from pathweave.emulate.background import _ready

    def proc(code):
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)

    good = proc("print('a warning first'); print('sending', flush=True)")
    _ready(good, "sending", "sender")           # the line before it is skipped
    good.wait()
    bad = proc("print('boom')")
    with pytest.raises(InputError, match=r"co-tenant sender did not start: b'boom\\n'"):
        _ready(bad, "sending", "sender")
    bad.wait()
    for p in (good, bad):
        p.stdout.close()
