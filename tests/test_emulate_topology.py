"""The emulator as data: layout, shaping, routes, argv lists, predictions. No root needed.

Routes are checked by an independent packet walker: it follows the layout's
route entries hop by hop (veth peers, bridges, next-hop addresses) and must
arrive at every destination over exactly the fabric links of the path the
``static`` policy gives that pair.
"""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from typer.testing import CliRunner

import pathweave as pw
from pathweave.emulate import _ip
from pathweave.emulate.topology import build_layout, framing_factor, scale_fabric
from pathweave.errors import FabricError
from pathweave.fabric import LinkKind, VertexKind
from pathweave.fabric.builders import FabricBuilder

FABRICS = [
    "h100-2x4",
    "cluster:nodes=2,gpus_per_node=2,node_kind=nvlink-mesh",
    "cluster:nodes=2,gpus_per_node=4,node_kind=nvswitch",
    "cluster:nodes=2,gpus_per_node=4,node_kind=pcie,rails=2",  # NICs shared: bridges
    "cluster:nodes=2,gpus_per_node=4,node_kind=nvlink-mesh,spines=2",
]


def walk(lay, a: int, b: int) -> list[int]:
    """Fabric links a packet from rank ``a`` to rank ``b`` crosses, following the routes."""
    addr_ns = {lay.router_address[v]: lay.router_ns[v] for v in lay.routers}
    table = {(r.ns, r.dst): r for r in lay.routes}
    peer = {}
    for cable in lay.veths:
        peer[(cable.a.ns, cable.a.dev)] = cable.b
        peer[(cable.b.ns, cable.b.dev)] = cable.a
    ports_of_bridge: dict[str, list] = {}
    for p in lay.shaped:
        if p.bridge is not None:
            ports_of_bridge.setdefault(p.bridge, []).append(p)
    dst_addr = lay.rank_address[b]
    ns, crossed = lay.rank_ns[a], []
    for _ in range(20):
        if ns == lay.rank_ns[b]:
            return crossed
        r = table[(ns, dst_addr)]
        assert r.src == {v: k for k, v in addr_ns.items()}[ns]
        target_ns = addr_ns[r.via if r.via is not None else r.dst]
        out = next(p for p in lay.shaped if p.ns == ns and p.dev == r.dev)
        crossed += list(out.links)
        far = peer[(ns, r.dev)]
        seen_bridges = set()
        while far.bridge is not None:  # cross the switch to the port of the next hop
            seen_bridges.add(far.bridge)
            cands = [p for p in ports_of_bridge[far.bridge] if p is not far
                     and (peer[(p.ns, p.dev)].ns == target_ns or peer[(p.ns, p.dev)].bridge)]
            direct = [p for p in cands if peer[(p.ns, p.dev)].ns == target_ns]
            nxt = direct[0] if direct else next(
                p for p in cands if peer[(p.ns, p.dev)].bridge not in seen_bridges)
            crossed += list(nxt.links)
            far = peer[(nxt.ns, nxt.dev)]
        assert far.ns == target_ns, (a, b, ns, r)
        ns = far.ns
    raise AssertionError(f"no arrival from {a} to {b}")


def static_links(fab, a: int, b: int) -> list[int]:
    D = np.zeros((fab.num_ranks, fab.num_ranks), dtype=np.int64)
    D[a, b] = 1 << 20
    plan = pw.plan.make(fab, D, "static")
    (pid,) = plan.flow_path.tolist()
    row = plan.paths.links[pid]
    return row[row >= 0].tolist()


@pytest.mark.parametrize("spec", FABRICS)
def test_every_pair_arrives_over_the_static_path(spec):
    fab = pw.fabric.preset(spec)
    lay = build_layout(fab, 1e-4)
    n = fab.num_ranks
    for a in range(n):
        for b in range(n):
            if a != b:
                got = walk(lay, a, b)
                assert sorted(got) == sorted(static_links(fab, a, b)), (a, b)
                # The stops recorded are the routers the packet visits.
                assert lay.pair_stops[a][b][0] == fab.rank_vertex[a]
                assert lay.pair_stops[a][b][-1] == fab.rank_vertex[b]


@pytest.mark.parametrize("spec", FABRICS)
def test_each_directed_link_shaped_once_at_min_of_folded_capacities(spec):
    fab = pw.fabric.preset(spec)
    scale = 2e-4
    lay = build_layout(fab, scale)
    shaped = [lid for p in lay.shaped for lid in p.links]
    # every link exactly once, but for the root complexes' links of NVLink nodes
    host = fab.vertex_kind == int(pw.fabric.VertexKind.HOST)
    above = np.flatnonzero(host[fab.link_src] | host[fab.link_dst]).tolist()
    assert list(lay.unmodelled) == (above if fab.nvlink_kind != "pcie" else [])
    assert sorted(shaped + list(lay.unmodelled)) == list(range(fab.num_links))
    names = [(p.ns, p.dev) for p in lay.shaped]
    assert len(set(names)) == len(names)
    for p in lay.shaped:
        assert p.payload_Bps == pytest.approx(min(fab.capacity_Bps[list(p.links)]) * scale)
        assert p.dev in {f"l{lid}" for lid in p.links}
        assert len(p.links) in (1, 2, 3, 4, 5)
        if len(p.links) > 1:  # a folded NIC (and switch): PCIe and network in series
            kinds = {int(fab.link_kind[lid]) for lid in p.links}
            assert kinds == {int(LinkKind.PCIE), int(LinkKind.NETWORK)}
            for x, y in zip(p.links, p.links[1:], strict=False):
                assert fab.link_dst[x] == fab.link_src[y]


def test_h100_2x4_by_hand():
    fab = pw.fabric.preset("h100-2x4")
    lay = build_layout(fab, 1e-4)
    assert lay.namespaces == (*tuple(f"pw-r{r}" for r in range(8)), "pw-sw")
    assert len(lay.bridges) == 4  # one per rail; NICs and switches folded into their GPUs
    assert len(lay.veths) == 12 + 8
    assert len(lay.routes) == 8 * 7  # one per (rank, destination)
    nv = fab.link_id("n0.gpu0", "n0.gpu1")
    net = fab.link_id("n0.nic1", "rail1")
    assert lay.payload_Bps(nv) == pytest.approx(12e6)
    assert lay.payload_Bps(net) == pytest.approx(5e6)  # min(6.30 PCIe, 5.0 rail)
    assert lay.payload_Bps(fab.link_id("n0.gpu1", "n0.pcie1")) == pytest.approx(5e6)
    assert lay.payload_Bps(fab.link_id("n0.pcie1", "n0.nic1")) == pytest.approx(5e6)
    # the root complexes: 2 sockets x 2 uplinks x 2 directions + 2 inter-socket, per node
    assert len(lay.unmodelled) == 2 * (8 + 2)
    port = next(p for p in lay.shaped if net in p.links)
    assert port.ns == "pw-r1" and port.bridge is None
    # 5 MB/s of payload: 5e6 * 8 * 1514 / 1448 bits/s on the wire.
    assert lay.wire_rate_bps(port) == round(5e6 * 8 * 1514 / 1448)
    assert lay.burst_for(port) == 128 * 1024
    assert lay.total_payload_Bps() == pytest.approx(24 * 12e6 + 16 * 5e6)
    # PXN: rank 0 -> rank 6 leaves over NVLink to GPU 2, then GPU 2's rail.
    assert [lay.ns_name(v) for v in lay.pair_stops[0][6]] == ["pw-r0", "pw-r2", "pw-r6"]
    r = next(x for x in lay.routes if x.ns == "pw-r0" and x.dst == "10.211.0.7")
    assert (r.dev, r.via, r.src) == (f"l{fab.link_id('n0.gpu0', 'n0.gpu2')}", "10.211.0.3",
                                     "10.211.0.1")


def test_framing_factor():
    assert framing_factor(1500) == pytest.approx(1514 / 1448)
    assert framing_factor(9000) == pytest.approx(9014 / 8948)
    with pytest.raises(ValueError, match="mtu"):
        framing_factor(100)


def test_setup_commands_are_argv_lists_inside_prefixed_namespaces():
    fab = pw.fabric.preset("h100-2x4")
    lay = build_layout(fab, 1e-4, prefix="pwt", shaping="tbf")  # one tc command a port
    cmds = lay.setup_commands()
    assert all(isinstance(c, list) and all(isinstance(a, str) for a in c) for c in cmds)
    for c in cmds:
        assert c[0] in ("ip", "tc")
        # Every command names a pwt- namespace: nothing happens in the root namespace.
        ns = c[c.index("-n") + 1] if "-n" in c else c[3]
        assert ns.startswith("pwt-"), c
    tbfs = [c for c in cmds if c[0] == "tc"]
    assert len(tbfs) == len(lay.shaped) == 40
    assert all("latency" in c and c[c.index("latency") + 1] == "5000us" for c in tbfs)
    veths = [c for c in cmds if "veth" in c]
    assert len(veths) == len(lay.veths) + 8  # cables + one identity veth per rank
    adds = [c for c in cmds if c[:3] == ["ip", "netns", "add"]]
    assert [c[3] for c in adds] == list(lay.namespaces)
    # Every rank's sockets hold at most 128 KiB unsent (26 ms of a 5 MB/s rail).
    lowat = [c[3] for c in cmds if "net.ipv4.tcp_notsent_lowat=131072" in c]
    assert lowat == [f"pwt-r{r}" for r in range(8)]
    # ... and keep at most the smallest link queue over the 7 other ranks
    # below them: a 5 MB/s rail queues 5 ms on the wire (26_140 bytes with
    # Ethernet/IP/TCP framing of a 1500-byte MTU) plus its 128 KiB bucket.
    assert lay.output_limit_bytes() == (26_140 + 131_072) // 7
    assert all(lay.queue_bytes(p) >= 7 * lay.output_limit_bytes() for p in lay.shaped)
    limited = [c[3] for c in cmds if "net.ipv4.tcp_limit_output_bytes=22458" in c]
    assert limited == [f"pwt-r{r}" for r in range(8)]


def test_custom_routes_follow_the_given_paths():
    fab = pw.fabric.preset("cluster:nodes=2,gpus_per_node=2,node_kind=nvlink-mesh")
    ps = pw.fabric.candidate_paths(fab)
    n = fab.num_ranks
    # Every pair on its last candidate path (remote rail across nodes).
    routes = [[int(ps.pair_paths(a, b)[-1]) if a != b else -1 for b in range(n)]
              for a in range(n)]
    lay = build_layout(fab, 1e-4, routes=routes)
    # 0 -> 3: last path is via rail 1 (0 -> 1 -> rail1 -> 3)
    row = ps.links[routes[0][3]]
    assert sorted(walk(lay, 0, 3)) == sorted(row[row >= 0].tolist())
    bad = [r[:] for r in routes]
    bad[0][3] = int(ps.pair_paths(1, 2)[0])
    with pytest.raises(FabricError, match=r"routes\[0\]\[3\]"):
        build_layout(fab, 1e-4, routes=bad)


@pytest.mark.parametrize("scale", [0, -1e-4, 1.5, math.nan])
def test_bad_scale(scale):
    with pytest.raises(ValueError, match="scale"):
        build_layout(pw.fabric.preset("h100-2x4"), scale)


@pytest.mark.parametrize("prefix", ["xx", "pw-", "PW", "pwtoolong", ""])
def test_bad_prefix(prefix):
    with pytest.raises(ValueError, match="prefix"):
        build_layout(pw.fabric.preset("h100-2x4"), 1e-4, prefix=prefix)


def test_bad_burst_and_latency():
    fab = pw.fabric.preset("h100-2x4")
    with pytest.raises(ValueError, match="burst_bytes"):
        build_layout(fab, 1e-4, burst_bytes=64 * 1024)
    with pytest.raises(ValueError, match="latency_s"):
        build_layout(fab, 1e-4, latency_s=0)


def _two_gpu_builder(name: str) -> FabricBuilder:
    b = FabricBuilder(name)
    b.vertex("n0.gpu0", VertexKind.GPU, node=0)
    b.vertex("n0.gpu1", VertexKind.GPU, node=0)
    return b


def test_one_way_link_is_refused():
    b = _two_gpu_builder("oneway")
    b.link("n0.gpu0", "n0.gpu1", 1e9, LinkKind.NVLINK)
    b.link("n0.gpu1", "n0.gpu0", 1e9, LinkKind.NVLINK)
    b.vertex("n0.host", VertexKind.HOST, node=0)
    b.link("n0.gpu0", "n0.host", 1e9, LinkKind.PCIE)
    with pytest.raises(FabricError, match="no reverse link"):
        build_layout(b.build(), 1e-4)


def test_loop_of_bridges_is_refused():
    b = _two_gpu_builder("loop")
    for s in ("rail0", "rail1", "rail2"):
        b.vertex(s, VertexKind.RAIL)
    b.duplex("rail0", "rail1", 1e9, LinkKind.NETWORK)
    b.duplex("rail1", "rail2", 1e9, LinkKind.NETWORK)
    b.duplex("rail2", "rail0", 1e9, LinkKind.NETWORK)
    b.vertex("n0.nic0", VertexKind.NIC, node=0)
    b.vertex("n0.nic1", VertexKind.NIC, node=0)
    b.duplex("n0.gpu0", "n0.nic0", 1e9, LinkKind.PCIE)
    b.duplex("n0.gpu1", "n0.nic1", 1e9, LinkKind.PCIE)
    b.duplex("n0.nic0", "rail0", 1e9, LinkKind.NETWORK)
    b.duplex("n0.nic1", "rail2", 1e9, LinkKind.NETWORK)
    with pytest.raises(FabricError, match="loop of bridges"):
        build_layout(b.build(), 1e-4)


# ------------------------------------------------------------------- _ip
def test_argv_builders_refuse_odd_names():
    for bad in ("a b", "x;rm", "toolonginterface0", "", "-n"):
        with pytest.raises(ValueError, match="name"):
            _ip.link_up("pw-r0", bad)
        with pytest.raises(ValueError, match="name"):
            _ip.netns_add(bad)
    with pytest.raises(ValueError, match="tbf"):
        _ip.tbf("pw-r0", "l0", 0, 131072, 0.005)
    with pytest.raises(ValueError, match="sysctl"):
        _ip.sysctl("pw-r0", {"net.ipv4 ip_forward": 1})


def test_without_root_every_entry_point_says_so(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    from pathweave.emulate import Emulator, cleanup, status

    with pytest.raises(_ip.EmulatorError, match="needs root"):
        Emulator("h100-2x4", 1e-4).up()
    with pytest.raises(_ip.EmulatorError, match="needs root"):
        cleanup()
    with pytest.raises(_ip.EmulatorError, match="needs root"):
        status()
    from pathweave.cli.main import app

    res = CliRunner().invoke(app, ["emulate", "up", "--fabric", "h100-2x4"])
    assert res.exit_code == 2
    assert "needs root" in res.output
    from pathweave.cli._demo_emulate import skip_reason

    assert "needs root" in skip_reason()


def test_missing_tools_are_named(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda t: None if t == "tc" else "/usr/sbin/" + t)
    with pytest.raises(_ip.EmulatorError, match="tc"):
        _ip.require_tools()


# ------------------------------------------------------------ predictions
def test_predict_by_hand():
    from pathweave.emulate import predict

    fab = scale_fabric(pw.fabric.preset("h100-2x4"), 1e-4)
    n = 8
    D = np.zeros((n, n), dtype=np.int64)
    D[0, 1] = 6_000_000  # direct NVLink, 12 MB/s: 0.5 s
    D[2, 1] = 6_000_000  # another NVLink into rank 1: parallel
    pred, bound, _ = predict(fab, D, "static")
    assert bound == pytest.approx(0.5)
    assert pred == pytest.approx(0.5)
    # One sender over PXN (0 -> 1 -> rail 1 -> 5): the rail starts once the first
    # message has crossed the 12 MB/s NVLink to the forwarding rank, which forwards
    # a message once all of it has arrived. 5 MB in 256 KiB chunks is 20 chunks;
    # the largest fragment enters window // 2 chunks a round, one message each.
    D[:] = 0
    D[0, 5] = 5_000_000
    for window in (2, 4, 8):
        pred, bound, _ = predict(fab, D, "static", chunk_bytes=1 << 18, window=window)
        assert bound == pytest.approx(1.0)
        assert pred == pytest.approx(1.0 + (window // 2) * (1 << 18) / 12e6)
    # 1 MiB chunks: 5 chunks in 3 rounds, the first message 2 of them.
    pred, _, _ = predict(fab, D, "static", chunk_bytes=1 << 20)
    assert pred == pytest.approx(1.0 + 2 * (1 << 20) / 12e6)
    # 0 -> 4 goes straight onto rail 0 and keeps it busy while 1 -> 4 (PXN through
    # rank 0) fills its pipeline: the fill is hidden, the rail's 5 MB take 1 s.
    D[:] = 0
    D[0, 4] = 2_500_000
    D[1, 4] = 2_500_000
    pred, bound, _ = predict(fab, D, "static", chunk_bytes=1 << 18)
    assert bound == pytest.approx(1.0)
    assert pred == pytest.approx(1.0)
    # torch: the kernel forwards packets, no pipeline fill.
    D[:] = 0
    D[0, 5] = 5_000_000
    pred, bound, _ = predict(fab, D, "torch")
    assert pred == pytest.approx(1.0) and bound == pytest.approx(1.0)


def _hand_plan(fab, demand, routes):
    """A plan of whole fragments on the paths whose ranks are ``routes`` (one per fragment)."""
    from pathweave.plan.rounds import route_ranks

    ps = pw.fabric.candidate_paths(fab)
    rr = route_ranks(ps)
    path = [next(p for p in ps.pair_paths(r[0], r[-1]) if rr[p][rr[p] >= 0].tolist() == r)
            for r, _ in routes]
    return pw.plan.Plan(fabric=fab, paths=ps, demand=demand, policy="hand",
                        flow_path=np.array(path), flow_bytes=np.array([b for _, b in routes]))


def test_pipeline_fill_by_hand():
    # h100-2x4 at 1e-4: 12 MB/s NVLinks, 5 MB/s rails; 256 KiB chunks, window 4.
    from pathweave.emulate import pipeline_fill_s
    from pathweave.plan.timemodel import predict_time
    from pathweave.sim import SimModel, simulate

    fab = scale_fabric(pw.fabric.preset("h100-2x4"), 1e-4)
    chunk, nvlink, rail = 1 << 18, 12e6, 5e6
    D = np.zeros((8, 8), dtype=np.int64)

    decide = SimModel.ideal(chunk_bytes=chunk, window=4, message_fill=True)

    def makespan(plan):
        fill = pipeline_fill_s(plan, chunk, 4)
        t = simulate(fab, plan, SimModel.ideal(), fill_s=fill).makespan_s
        # What the emulated ranks decide with charges the same fill, in closed
        # form (the time model) and in the simulator.
        assert predict_time(plan, decide) == pytest.approx(t, rel=1e-9)
        assert simulate(fab, plan, decide).makespan_s == pytest.approx(t, rel=1e-9)
        return t, fill

    # DeepEP's way, 0 -> rail 0 -> 4 -> NVLink -> 5: 5 MB is 20 chunks in 10 rounds,
    # 2 a message; rank 4 sends the last message (chunks 18 and 19, 281 408 bytes)
    # on once the rail has delivered all of it.
    D[0, 5] = 5_000_000
    t, (before, after) = makespan(_hand_plan(fab, D, [([0, 4, 5], 5_000_000)]))
    last = 5_000_000 - 18 * chunk
    assert before.tolist() == [0.0]
    assert after[0] == pytest.approx(last / nvlink)
    assert t == pytest.approx(5_000_000 / rail + last / nvlink)
    # PXN, 0 -> NVLink -> 1 -> rail 1 -> 5: the first message before the rail.
    t, (before, after) = makespan(_hand_plan(fab, D, [([0, 1, 5], 5_000_000)]))
    assert before[0] == pytest.approx(2 * chunk / nvlink) and after.tolist() == [0.0]
    assert t == pytest.approx(2 * chunk / nvlink + 5_000_000 / rail)
    # Rank 0 posts its own messages to rank 4 at the start; 1 MB that rank 0
    # forwards for rank 1 (1 -> 0 -> rail 0 -> 4) is posted as it arrives and
    # crosses the rail after them, 0.2 s in which rank 4 drains 0 -> 5's last
    # message: the rail's 6 MB decide (the largest fragment is the same, so the
    # messages are too).
    D[1, 4] = 1_000_000
    plan = _hand_plan(fab, D, [([0, 4, 5], 5_000_000), ([1, 0, 4], 1_000_000)])
    t, (before, after) = makespan(plan)
    assert after.tolist() == [0.0, 0.0]
    assert before[1] == pytest.approx(chunk / nvlink)  # 4 chunks in 10 rounds: 1 a message
    assert t == pytest.approx(6_000_000 / rail)
    # The model's own share of the bound: never below the congestion bound.
    assert t >= plan.congestion_s - 1e-12


def test_pipeline_fill_a_short_last_message_waits_for_the_one_before():
    # DeepEP's way, 5 -> rail 1 -> 1 -> NVLink -> 0, 3 355 444 bytes in 512 KiB
    # chunks: 7 chunks in 4 rounds (window 4), messages of 2, 2, 2 chunks and the
    # 209 716-byte remainder. The remainder crosses the 5 MB/s rail in 42 ms, less
    # than the 87 ms rank 1 takes to pass the 1 MiB before it on over the 12 MB/s
    # NVLink, so the drain after the rail is both messages less those 42 ms (the
    # emulator measured 60 ms there on hotspot 0.8), not the remainder's 17 ms.
    from pathweave.emulate import pipeline_fill_s
    from pathweave.sim import SimModel, simulate

    fab = scale_fabric(pw.fabric.preset("h100-2x4"), 1e-4)
    chunk, nvlink, rail = 1 << 19, 12e6, 5e6
    size, last = 3_355_444, 3_355_444 - 6 * (1 << 19)
    D = np.zeros((8, 8), dtype=np.int64)
    D[5, 0] = size
    plan = _hand_plan(fab, D, [([5, 1, 0], size)])
    before, after = pipeline_fill_s(plan, chunk, 4)
    drain = (2 * chunk + last) / nvlink - last / rail
    assert before.tolist() == [0.0] and drain > last / nvlink
    assert after[0] == pytest.approx(drain)
    model = SimModel.ideal(chunk_bytes=chunk, window=4, message_fill=True)
    assert simulate(fab, plan, model).makespan_s == pytest.approx(size / rail + drain)


def test_pipeline_fill_one_connection_is_first_in_first_out():
    # Rank 6 sends four whole messages (one round: the largest fragment is 2
    # chunks of 512 KiB, window 4) on its one connection to rank 2, in
    # fragment order: to 0 (via 2), 1 (via 2), 2 and 3 (via 2). gloo sends
    # them one after another on rail 2, so only the last (to 3) drains its
    # NVLink hop after the rail: the earlier ones have the later ones behind.
    from pathweave.emulate import pipeline_fill_s
    from pathweave.sim import SimModel, simulate

    fab = scale_fabric(pw.fabric.preset("h100-2x4"), 1e-4)
    chunk, nvlink, rail = 1 << 19, 12e6, 5e6
    sizes = {0: 838_861, 1: 559_241, 2: 559_241, 3: 559_241}
    D = np.zeros((8, 8), dtype=np.int64)
    for d, b in sizes.items():
        D[6, d] = b
    plan = _hand_plan(fab, D, [([6, 2, d] if d != 2 else [6, 2], b) for d, b in sizes.items()])
    before, after = pipeline_fill_s(plan, chunk, 4)
    assert before.tolist() == [0.0] * 4
    np.testing.assert_allclose(after, [0.0, 0.0, 0.0, sizes[3] / nvlink])
    model = SimModel.ideal(chunk_bytes=chunk, window=4, message_fill=True)
    t = simulate(fab, plan, model).makespan_s
    assert t == pytest.approx(sum(sizes.values()) / rail + sizes[3] / nvlink)


def test_pipeline_fill_forwards_that_go_on_are_posted_first():
    # Rank 6 forwards two streams to rank 2 in the same round: 4 -> 6 -> 2 (100 kB,
    # ends at 2) and 5 -> 6 -> 2 -> 1 (419,431 B, one message, goes on to 1). Rank 6
    # posts the one that goes on first (executor._forward_sequence), though its
    # fragment comes second: the 100 kB behind it on the 5 MB/s rail (20 ms) hide
    # 20 ms of its 35 ms on the 12 MB/s NVLink from 2 to 1.
    from pathweave.emulate import pipeline_fill_s

    fab = scale_fabric(pw.fabric.preset("h100-2x4"), 1e-4)
    chunk, nvlink, rail = 1 << 19, 12e6, 5e6
    D = np.zeros((8, 8), dtype=np.int64)
    D[4, 2], D[5, 1] = 100_000, 419_431
    plan = _hand_plan(fab, D, [([4, 6, 2], 100_000), ([5, 6, 2, 1], 419_431)])
    before, after = pipeline_fill_s(plan, chunk, 4)
    np.testing.assert_allclose(before, [100_000 / nvlink, 419_431 / nvlink])
    np.testing.assert_allclose(after, [0.0, 419_431 / nvlink - 100_000 / rail])


def test_simulate_refuses_bad_fill_by_value():
    from pathweave.errors import PlanError
    from pathweave.sim import SimModel, simulate

    fab = scale_fabric(pw.fabric.preset("h100-2x4"), 1e-4)
    D = np.zeros((8, 8), dtype=np.int64)
    D[0, 5] = 1_000_000
    plan = _hand_plan(fab, D, [([0, 4, 5], 1_000_000)])
    for bad in ((np.zeros(2), np.zeros(1)), (np.zeros(1), np.array([-1.0])),
                (np.array([np.nan]), np.zeros(1))):
        with pytest.raises(PlanError, match="fill_s"):
            simulate(fab, plan, SimModel.ideal(), fill_s=bad)


def test_ranks_decide_with_the_model_predict_simulates():
    from pathweave.emulate.run import emulator_model, rank_config
    from pathweave.sim import SimModel

    fab = scale_fabric(pw.fabric.preset("h100-2x4"), 1e-4)
    cfg = rank_config(fab, chunk_bytes=1 << 18, window=8, min_split_bytes=1 << 16,
                      timeout_s=60.0)
    assert cfg.model == SimModel.ideal(chunk_bytes=1 << 18, window=8, message_fill=True)
    assert cfg.model == emulator_model(1 << 18, 8)
    # torch's packets are forwarded by the kernel: the fluid model alone.
    assert emulator_model() == SimModel.ideal()


def test_predict_applies_the_size_threshold_like_the_data_plane():
    from pathweave.emulate import predict

    fab = scale_fabric(pw.fabric.preset("h100-2x4"), 1e-4)
    D = pw.traffic.parse_workload("hotspot:0.8", 8, bytes_per_rank=16 << 20).astype(np.int64)
    _, _, small = predict(fab, D, "mwu", min_split_bytes=1 << 30)
    # Above every pair: each pair goes whole on one path.
    pairs = plan_pairs(small)
    assert len(pairs) == len(set(pairs))
    _, _, split = predict(fab, D, "mwu", min_split_bytes=0)
    assert len(plan_pairs(split)) > len(pairs)
    for p in (small, split):
        assert np.array_equal(p.pair_bytes(), D)


def plan_pairs(plan) -> list[int]:
    ps = plan.paths
    fp = plan.flow_path[plan.flow_bytes > 0]
    return (ps.src[fp].astype(np.int64) * ps.num_ranks + ps.dst[fp]).tolist()


def test_result_records_and_bench_outputs(tmp_path):
    from pathweave.bench.emulate import write_outputs
    from pathweave.emulate import EmulationResult, PolicyResult

    res = EmulationResult(
        fabric="f", scale=1e-4, workload="hotspot:0.8", bytes_per_rank=100, total_bytes=700,
        repeat=3, chunk_bytes=10, window=4, min_split_bytes=0,
        policies=(PolicyResult("static", (4.0, 3.0, 5.0), 4.0, 5.0, 3.2, True),
                  PolicyResult("mwu", (1.0, 2.0, 1.5), 1.5, 1.25, 1.0, True)),
        wall_s=1.0,
    )
    assert res.speedup("mwu") == pytest.approx((4.0 / 1.5, 5.0 / 1.25))
    recs = res.records()
    assert recs[1]["measured_vs_predicted"] == pytest.approx(1.2)
    assert recs[1]["measured_vs_bound"] == pytest.approx(1.5)
    with pytest.raises(KeyError, match="optimal"):
        res.policy("optimal")
    for r in recs:
        r["ratio"] = 0.8
    csv_path, png_path = write_outputs(recs, tmp_path)
    rows = list(csv.DictReader(csv_path.open()))
    assert [r["policy"] for r in rows] == ["static", "mwu"]
    assert float(rows[1]["speedup_measured"]) == pytest.approx(4.0 / 1.5)
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_policy_list():
    from pathweave.cli.emulate import _policies
    from pathweave.cli.main import app
    from pathweave.errors import PlanError

    assert _policies("static, mwu,torch,mwu") == ["static", "mwu", "torch"]
    assert _policies("torch,all")[:2] == ["torch", "static"]
    with pytest.raises(PlanError, match="bogus"):
        _policies("static,bogus")
    res = CliRunner().invoke(app, ["emulate", "run", "--policy", "bogus"])
    assert res.exit_code == 2 and "bogus" in res.output
    # `all` is every policy the data plane runs; a baseline that only models a
    # peer's routing (UCX) is refused by name, in one line, before anything is built.
    from pathweave.plan import policies, policy_info

    models = [p for p in policies() if not policy_info(p).executable]
    assert models and not set(models) & set(_policies("all"))
    for m in models:
        res = CliRunner().invoke(app, ["emulate", "run", "--policy", f"static,{m}"])
        assert res.exit_code == 2, res.output
        assert f"policy {m!r} models a peer's routing" in res.output
        assert "Traceback" not in res.output


# ------------------------------------------------------------- link shaping
def test_ackfirst_commands_for_a_hand_given_port():
    # 5 MB/s of wire bytes, a 128 KiB bucket, 5 ms of queue: tbf's limit is
    # rate * latency + burst = 25000 + 131072 bytes (tc(8), tc-tbf(8)).
    tc = ["tc", "-n", "pw-r0"]
    share = ["ceil", "40000000bit", "burst", "131072", "cburst", "131072", "quantum", "1514"]
    assert _ip.htb_ackfirst("pw-r0", "l0", 40_000_000, 131072, 0.005) == [
        [*tc, "qdisc", "replace", "dev", "l0", "root", "handle", "1:", "htb", "default", "20"],
        [*tc, "class", "add", "dev", "l0", "parent", "1:", "classid", "1:1", "htb",
         "rate", "40000000bit", *share],
        [*tc, "class", "add", "dev", "l0", "parent", "1:1", "classid", "1:10", "htb",
         "rate", "800000bit", *share, "prio", "0"],
        [*tc, "class", "add", "dev", "l0", "parent", "1:1", "classid", "1:20", "htb",
         "rate", "39200000bit", *share, "prio", "1"],
        [*tc, "qdisc", "add", "dev", "l0", "parent", "1:10", "handle", "10:", "bfifo",
         "limit", "156072"],
        [*tc, "qdisc", "add", "dev", "l0", "parent", "1:20", "handle", "20:", "bfifo",
         "limit", "156072"],
        [*tc, "filter", "add", "dev", "l0", "parent", "1:", "protocol", "ip", "prio", "1",
         "u32", "match", "ip", "protocol", "6", "0xff", "match", "u16", "0x0000", "0xff80",
         "at", "2", "flowid", "1:10"],
    ]
    assert _ip.shape("tbf", "pw-r0", "l0", 40_000_000, 131072, 0.005) == [
        _ip.tbf("pw-r0", "l0", 40_000_000, 131072, 0.005)]
    with pytest.raises(ValueError, match="ackfirst"):
        _ip.htb_ackfirst("pw-r0", "l0", 40_000_000, 0, 0.005)
    with pytest.raises(ValueError, match="'prio'"):
        _ip.shape("prio", "pw-r0", "l0", 40_000_000, 131072, 0.005)


def _ipv4(total_len: int, proto: int) -> bytes:
    """An IPv4 header (RFC 791) of a packet ``total_len`` bytes long."""
    import struct

    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, total_len, 0, 0x4000, 64, proto, 0,
                       bytes([10, 211, 0, 1]), bytes([10, 211, 0, 5]))


def _u32_matches(argv: list[str], header: bytes) -> bool:
    """Evaluate the ``u32`` matches of a filter argv on an IP header, as tc-u32(8) defines
    them (``ip protocol V M``: byte 9; ``u16 V M at O``: the 16 bits at offset O)."""
    i, ok = argv.index("u32") + 1, True
    while argv[i] == "match":
        if argv[i + 1:i + 3] == ["ip", "protocol"]:
            value, mask, i = int(argv[i + 3], 0), int(argv[i + 4], 0), i + 5
            ok &= header[9] & mask == value
        else:
            assert argv[i + 1] == "u16" and argv[i + 4] == "at"
            value, mask, off = int(argv[i + 2], 0), int(argv[i + 3], 0), int(argv[i + 5])
            ok &= int.from_bytes(header[off:off + 2], "big") & mask == value
            i += 6
    return ok


def test_ackfirst_filter_takes_pure_acks_and_nothing_large():
    filt = _ip.htb_ackfirst("pw-r0", "l0", 40_000_000, 131072, 0.005)[-1]
    assert filt[-2:] == ["flowid", "1:10"]
    tcp, udp = 6, 17
    # IP 20 + TCP 20 + options: timestamps 12; each SACK block 8 (+ 2 kind/len, 2 NOPs).
    pure_acks = [40, 52, 52 + 12, 52 + 20, 52 + 28]
    for length in pure_acks:
        assert _u32_matches(filt, _ipv4(length, tcp)), length
    for length in (128, 576, 1024, 1500):  # segments that carry data
        assert not _u32_matches(filt, _ipv4(length, tcp)), length
    assert not _u32_matches(filt, _ipv4(60, udp))  # a co-tenant's datagram is data


@pytest.mark.parametrize("shaping", _ip.SHAPINGS)
def test_every_shaping_shapes_each_port_once_at_its_wire_rate(shaping):
    lay = build_layout(pw.fabric.preset("h100-2x4"), 1e-4, shaping=shaping)
    tcs = [c for c in lay.setup_commands() if c[0] == "tc"]
    for p in lay.shaped:
        mine = [c for c in tcs if c[2] == p.ns and c[c.index("dev") + 1] == p.dev]
        roots = [c for c in mine if "root" in c]
        assert len(roots) == 1, (p, roots)
        # The link's rate: tbf's own, or the root class's of an htb.
        rated = [c for c in mine if "tbf" in c
                 or ("classid" in c and c[c.index("classid") + 1] == "1:1")]
        assert len(rated) == 1
        rate = rated[0][rated[0].index("rate") + 1]
        assert rate == f"{round(p.payload_Bps * 8 * 1514 / 1448)}bit"
        assert rated[0][rated[0].index("burst") + 1] == str(lay.burst_for(p))


def test_bad_shaping_is_refused_by_value():
    with pytest.raises(ValueError, match="'fq'"):
        build_layout(pw.fabric.preset("h100-2x4"), 1e-4, shaping="fq")
    from pathweave.cli.main import app

    res = CliRunner().invoke(app, ["emulate", "run", "--shaping", "fq"])
    assert res.exit_code == 2 and "'fq'" in res.output and "Traceback" not in res.output


# tc -s -j qdisc show of a namespace with an ackfirst port (l4), a tbf port (l5) and the
# loopback, as iproute2 6.1 printed it (counters edited to distinct values).
TC_QDISC_JSON = """[
 {"kind":"noqueue","handle":"0:","dev":"lo","root":true,"refcnt":2,"options":{},
  "bytes":0,"packets":0,"drops":0,"overlimits":0,"requeues":0,"backlog":0,"qlen":0},
 {"kind":"htb","handle":"1:","dev":"l4","root":true,"refcnt":3,"options":{"r2q":10,
  "default":"0x20","direct_packets_stat":1,"direct_qlen":1000},"bytes":8801234,
  "packets":5987,"drops":31,"overlimits":4402,"requeues":0,"backlog":0,"qlen":0},
 {"kind":"bfifo","handle":"10:","dev":"l4","parent":"1:10","options":{"limit":156072},
  "bytes":20540,"packets":395,"drops":0,"overlimits":0,"requeues":0,"backlog":0,"qlen":0},
 {"kind":"bfifo","handle":"20:","dev":"l4","parent":"1:20","options":{"limit":156072},
  "bytes":8780604,"packets":5591,"drops":31,"overlimits":0,"requeues":0,"backlog":0,
  "qlen":0},
 {"kind":"tbf","handle":"8df4:","dev":"l5","root":true,"refcnt":3,"options":{
  "rate":5000000,"burst":131070,"lat":5000},"bytes":4400000,"packets":3000,"drops":2,
  "overlimits":0,"requeues":0,"backlog":0,"qlen":0}
]"""


def test_port_counters_from_tc_json():
    import json

    got = _ip.port_counters(json.loads(TC_QDISC_JSON))
    assert got == {
        "l4": {"kind": "htb", "bytes": 8801234, "packets": 5987, "drops": 31},
        "l5": {"kind": "tbf", "bytes": 4400000, "packets": 3000, "drops": 2},
    }


def test_htb_rate_from_class_text():
    # tc class show dev l4, iproute2 6.1 (it has no JSON for htb classes).
    text = ("class htb 1:10 parent 1:1 leaf 10: prio 0 rate 836Kbit ceil 41834Kbit burst 128Kb "
            "cburst 128Kb \n"
            "class htb 1:1 root rate 41834Kbit ceil 41834Kbit burst 128Kb cburst 128Kb \n"
            "class htb 1:20 parent 1:1 leaf 20: prio 1 rate 40998Kbit ceil 41834Kbit\n")
    assert _ip.htb_rate_Bps(text) == 41834e3 / 8
    assert _ip.htb_rate_Bps("class htb 1:1 root prio 0 rate 5Gbit ceil 5Gbit") == 5e9 / 8
    assert _ip.htb_rate_Bps("class htb 1:1 root rate 800bit ceil 800bit") == 100.0
    assert _ip.htb_rate_Bps("") is None
