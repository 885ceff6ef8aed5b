"""``pathweave emulate up|down|status|run`` and ``pathweave bench emulate``.

The emulator needs root; without it every command says so in one red line
(exit code 2). ``run`` and ``bench emulate`` bring their own emulator up and
always take it down again, also on Ctrl-C.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from pathweave.cli._common import (
    BENCHES,
    add_columns,
    console,
    fail,
    fmt_bytes,
    fmt_duration,
    handles_user_errors,
    human_console,
    json_option,
    load_fabric,
    out_dir_option,
    parse_bytes,
    parse_policies,
    quick_option,
    write_json,
    wrote,
)

emulate_app = typer.Typer(
    help="Emulate a fabric on this machine (network namespaces + tc; needs root) and run "
    "the data plane over it.",
    no_args_is_help=True,
)

FabricOpt = Annotated[str, typer.Option("--fabric", metavar="PRESET|FILE",
                                        help="Preset spec or topology file (fabric "
                                        "YAML/JSON, nvidia-smi topo -m text, NCCL XML).")]

def _scale(value: float) -> float:
    if not (0 < value <= 1):  # also refuses nan
        raise typer.BadParameter(f"{value!r} is not in (0, 1]")
    return value


ScaleOpt = Annotated[float, typer.Option(
    "--scale", callback=_scale,
    help="Capacity scale in (0, 1]: 1e-4 turns 120 GB/s into 12 MB/s. Keep the total well "
    "under what the machine's cores move (about 1 GB/s on 2 cores).")]
def _shaping(value: str | None) -> str | None:
    from pathweave.emulate.topology import SHAPINGS

    if value is not None and value not in SHAPINGS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(SHAPINGS)}")
    return value


ShapingOpt = Annotated[str | None, typer.Option(
    "--shaping", callback=_shaping, metavar="tbf|ackfirst",
    help="How each directed link is shaped: tbf (one token bucket, one queue; the default) or "
    "ackfirst (the same rate and bucket in an htb that sends pure TCP acknowledgements "
    "before queued data).")]
PrefixOpt = Annotated[str, typer.Option(
    "--prefix",
    help="Name prefix of everything created (pw and up to 4 lowercase letters or digits).")]


def _policies(text: str) -> list[str]:
    """Registered policies (``all``: those the data plane runs) plus ``torch``, in the order
    given.

    ``NAME+adapt`` runs NAME with live adaptation (plain names run blind).
    """
    from pathweave.emulate.run import ADAPT_SUFFIX
    from pathweave.plan import policy_info

    out: list[str] = []
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        tail = ADAPT_SUFFIX if item.endswith(ADAPT_SUFFIX) else ""
        item = item.removesuffix(tail)
        for name in ["torch"] if item == "torch" and not tail else [
                n + tail for n in parse_policies(item)
                if item != "all" or policy_info(n).executable]:
            if name not in out:
                out.append(name)
    if not out:
        fail(f"--policy {text!r} names no policy")
    return out


@emulate_app.command("up")
@handles_user_errors
def up_cmd(
    fabric: FabricOpt = "h100-2x4",
    scale: ScaleOpt = 1e-4,
    prefix: PrefixOpt = "pw",
    shaping: ShapingOpt = None,
) -> None:
    """Create the emulated fabric and leave it up (take it down with `emulate down`)."""
    from pathweave.emulate import Emulator
    from pathweave.emulate.topology import DEFAULT_SHAPING

    emu = Emulator(load_fabric(fabric), scale, prefix=prefix, persistent=True,
                   shaping=shaping or DEFAULT_SHAPING)
    emu.up()
    lay = emu.layout
    out = console()
    out.print(
        f"[green]up:[/] {emu.fabric.name} x {scale:g}: {len(lay.namespaces)} namespaces, "
        f"{len(lay.shaped)} shaped links, {len(lay.routes)} routes; total shaped capacity "
        f"{lay.total_payload_Bps() / 1e6:.1f} MB/s"
    )
    out.print(_rank_table(emu))
    out.print(f"run a program in rank 0's namespace: ip netns exec {lay.rank_ns[0]} ...")


def _rank_table(emu: Any) -> Table:
    lay = emu.layout
    t = Table(box=box.SIMPLE_HEAD, padding=(0, 1), title="ranks", title_justify="left")
    add_columns(t, ("rank", "vertex", "namespace", "address"),
                left={"vertex", "namespace", "address"})
    for r in range(lay.num_ranks):
        t.add_row(str(r), emu.fabric.vertex_name(emu.fabric.rank_vertex[r]), lay.rank_ns[r],
                  lay.rank_address[r])
    return t


@emulate_app.command("down")
@handles_user_errors
def down_cmd(
    prefix: Annotated[str | None, typer.Option(
        "--prefix", help="Remove what pathweave recorded for this prefix.")] = None,
    all_prefixes: Annotated[bool, typer.Option(
        "--all", help="Remove what pathweave recorded for every prefix.")] = False,
) -> None:
    """Remove emulator namespaces pathweave recorded making (with every veth, bridge, qdisc).

    Namespaces that only look like an emulator's (no ledger lists them) are
    never removed. Without --prefix or --all this lists what exists and
    removes nothing.
    """
    from pathweave.emulate import cleanup, status

    if prefix is None and not all_prefixes:
        recs = status()
        if not recs:
            console().print("no pathweave emulator is up")
            return
        out = console()
        out.print(_status_table(recs))
        fail("emulate down removes nothing without --prefix PREFIX or --all")
    gone = cleanup(prefix, all_prefixes=all_prefixes)
    out = console()
    out.print(f"removed {len(gone)} namespaces" + (f": {', '.join(gone)}" if gone else ""))
    foreign = [r["ns"] for r in status(prefix) if not r["recorded"]]
    if foreign:
        out.print(f"[yellow]left alone (not recorded as pathweave's):[/] {', '.join(foreign)}")


def _status_table(recs: list[dict[str, Any]]) -> Table:
    t = Table(box=box.SIMPLE_HEAD, padding=(0, 1), title="emulator namespaces",
              title_justify="left")
    for c in ("namespace", "owner", "fabric", "shaped links", "tbf rates (Mbit/s)"):
        t.add_column(c)
    for r in recs:
        rates = sorted({round(int(p["wire_Bps"]) * 8 / 1e6, 1) for p in r["ports"]
                        if p["wire_Bps"] is not None})
        owner = (r["owner"] or "[yellow]stale[/]") if r["recorded"] else "[red]not pathweave's[/]"
        t.add_row(r["ns"], owner,
                  f"{r['fabric']} x {r['scale']:g}" if r["fabric"] else "?",
                  str(len(r["ports"])), ", ".join(f"{x:g}" for x in rates))
    return t


@emulate_app.command("status")
@handles_user_errors
def status_cmd(
    prefix: Annotated[str | None, typer.Option("--prefix", help="Only this prefix.")] = None,
) -> None:
    """List emulator namespaces, who made them, and their shaped links."""
    from pathweave.emulate import status

    recs = status(prefix)
    if not recs:
        console().print("no pathweave emulator is up")
        return
    console().print(_status_table(recs))


def result_table(res: Any) -> Table:
    """Per policy: measured median, simulated, congestion bound, their ratios, speed-ups."""
    t = Table(
        title=f"{res.fabric} emulated at x{res.scale:g}, {res.workload}, "
        f"{fmt_bytes(res.bytes_per_rank)} per rank, median of {res.repeat}"
        + (f", co-tenant {res.background}" if res.background else ""),
        title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1),
    )
    add_columns(t, ("policy", "measured", "simulated", "bound", "meas/sim", "meas/bound",
                    "speed-up meas", "speed-up sim", "bytes"),
                left={"policy", "bytes"}, no_wrap=True)
    base = res.policies[0]
    for p in res.policies:
        t.add_row(
            p.policy, fmt_duration(p.measured_s), fmt_duration(p.predicted_s),
            fmt_duration(p.bound_s), f"{p.vs_predicted:.3f}", f"{p.vs_bound:.3f}",
            f"{base.measured_s / p.measured_s:.2f}x", f"{base.predicted_s / p.predicted_s:.2f}x",
            "[green]verified[/]" if p.verified else "[red]WRONG[/]",
        )
    t.caption = ("measured: first rank's start to last rank's end; simulated: "
                 "pathweave.sim on the scaled fabric (emulator model); bound: congestion bound")
    t.caption_justify = "left"
    return t


@emulate_app.command("run")
@handles_user_errors
def run_cmd(
    fabric: FabricOpt = "h100-2x4",
    scale: ScaleOpt = 1e-4,
    workload: Annotated[str, typer.Option("--workload", help="Workload spec.")] = "hotspot:0.8",
    bytes_per_rank: Annotated[str, typer.Option(
        "--bytes", metavar="SIZE", help="Payload per rank (8M, 4MiB, ...).")] = "8M",
    policy: Annotated[str, typer.Option(
        "--policy", help="Comma-separated policies; `torch` is torch's own all_to_all_single."
    )] = "static,mwu",
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Timed calls per policy.")] = 3,
    chunk_bytes: Annotated[str, typer.Option(
        "--chunk", metavar="SIZE", help="Data-plane chunk (512K, 1M, ...).")] = "512K",
    json_out: Annotated[
        Path | None, json_option("Also write the results as JSON (- for stdout).")] = None,
    prefix: PrefixOpt = "pw",
    background: Annotated[str | None, typer.Option(
        "--background", metavar="LINK:FRACTION",
        help="A co-tenant: real TCP traffic at FRACTION of LINK's capacity (a vertex such as "
        "rail0, or SRC->DST), both ways, for the whole run.")] = None,
    shaping: ShapingOpt = None,
) -> None:
    """Run the all-to-all per policy over the emulated fabric, beside the simulator's prediction.

    Prints, per policy, the measured makespan (median), the simulator's
    prediction for the scaled fabric, the congestion bound and the speed-ups.
    With --background, predictions and bounds are on the residual capacities;
    NAME+adapt policies learn them live (one warm-up call).
    """
    from pathweave.emulate import run_emulated

    out = human_console(json_out)
    res = run_emulated(
        load_fabric(fabric), scale=scale, workload=workload,
        bytes_per_rank=parse_bytes(bytes_per_rank),
        policies=_policies(policy), repeat=repeat,
        chunk_bytes=parse_bytes(chunk_bytes, "--chunk"), prefix=prefix,
        log=lambda s: out.print(f"[dim]{s}[/]"), background=background, shaping=shaping,
    )
    out.print(result_table(res))
    if json_out is not None:
        wrote(out, write_json(json_out, res.to_dict()))


@BENCHES.register("emulate")
@handles_user_errors
def bench_emulate(
    fabric: FabricOpt = "h100-2x4",
    scale: ScaleOpt = 1e-4,
    bytes_per_rank: Annotated[str, typer.Option(
        "--bytes", metavar="SIZE", help="Payload per rank (4M, 4MiB, ...).")] = "4M",
    policy: Annotated[str | None, typer.Option(
        "--policy", help="Comma-separated policies (default: the baselines the data plane "
        "runs, mwu and the default policy).")] = None,
    repeat: Annotated[int | None, typer.Option(
        "--repeat", min=1, help="Timed calls per point, the policies round-robin (default 5).")
    ] = None,
    quick: Annotated[
        bool, quick_option("Ratios 0, 0.5, 0.9 and the extra workloads, once each.")
    ] = False,
    out_dir: Annotated[Path, out_dir_option("Where CSV/PNG go.")] = Path("bench-results"),
    prefix: PrefixOpt = "pw",
    background: Annotated[str | None, typer.Option(
        "--background", metavar="LINK",
        help="Instead: sweep a co-tenant's load 0..0.8 on LINK (e.g. rail0) under "
        "--workload, for static, deepep, the default policy blind and adapting; "
        "PASS/MISS lines for the co-tenant targets.")] = None,
    workload: Annotated[str, typer.Option(
        "--workload", help="Workload of the --background sweep.")] = "hotspot:0.6",
    shaping: ShapingOpt = None,
) -> None:
    """Sweep hotspot 0..0.9, many_to_few:2 and stencil:dims=2 over the emulated fabric.

    Prints measured vs simulated per workload and policy, and a PASS/MISS
    line for the default policy against the best baseline; writes CSV, PNG
    and the line (emulate_checks.txt).
    """
    from pathweave.bench import emulate as bench

    out = console()
    size = parse_bytes(bytes_per_rank)
    if background is not None:
        _bench_background(bench, fabric, background, workload, scale, size,
                          repeat or bench.BACKGROUND_REPEAT, quick,
                          out_dir, prefix, shaping)
        return
    pols = bench.sweep_policies() if policy is None else _policies(policy)
    records = bench.run(
        fabric, scale=scale, ratios=bench.QUICK_RATIOS if quick else bench.DEFAULT_RATIOS,
        bytes_per_rank=size, policies=pols, repeat=1 if quick else repeat or 5, prefix=prefix,
        log=lambda s: out.print(f"[dim]{s}[/]"), shaping=shaping,
    )
    out.print(sweep_table(records, f"bench emulate: {records[0]['fabric']} x {scale:g}, "
                          f"{fmt_bytes(size)} per rank, median of {records[0]['repeat']}"))
    for line in bench.checks(records) + bench.prediction_checks(records):
        out.print(line.replace("PASS", "[green]PASS[/]", 1).replace("MISS", "[red]MISS[/]", 1),
                  soft_wrap=True)
    for line in bench.not_emulated():
        out.print(line, soft_wrap=True, markup=False)
    files = bench.write_outputs(records, out_dir)
    out.print("wrote " + ", ".join(str(f) for f in files))


def sweep_table(records: list[dict[str, Any]], title: str) -> Table:
    """``bench emulate``'s table: one row per (workload, policy); ``vs best`` on the default's."""
    from pathweave.bench.emulate import default_vs_best
    from pathweave.plan import DEFAULT_POLICY

    vs_best = default_vs_best(records)
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1))
    add_columns(t, ("workload", "policy", "measured", "spread", "simulated", "meas/sim",
                    "speed-up", "plan", "vs best"),
                left={"workload", "policy"}, no_wrap=True)
    for r in records:
        v = vs_best.get(r["workload"]) if r["policy"] == DEFAULT_POLICY else None
        t.add_row(r["workload"], r["policy"], fmt_duration(r["measured_s"]),
                  f"{r['spread']:.1%}", fmt_duration(r["predicted_s"]),
                  f"{r['measured_vs_predicted']:.3f}", f"{r['speedup_measured']:.2f}x",
                  f"= {r['same_plan_as']}" if r.get("same_plan_as") else "",
                  f"{v[0]:.3f} {v[1]}" if v else "")
    # No bytes column: a run with any wrong byte raises (EmulatorError) before this table.
    t.caption = (f"measured: median; spread: interquartile range of the calls over it; "
                 f"speed-up: measured, over {records[0]['policy']}; plan: the same bytes on the "
                 f"same paths as that policy's; vs best: {DEFAULT_POLICY}'s measured makespan "
                 "over the best baseline's, median over rounds of the two calls of a round")
    t.caption_justify = "left"
    return t


def _bench_background(bench: Any, fabric: str, link: str, workload: str, scale: float,
                      size: int, repeat: int, quick: bool, out_dir: Path, prefix: str,
                      shaping: str | None) -> None:
    """``bench emulate --background LINK``: the co-tenant sweep, its table and its checks."""
    out = console()
    if ":" in link:
        fail(f"--background {link!r}: name only the link (e.g. rail0); the sweep sets the load")
    loads = (0.0, 0.6) if quick else bench.BACKGROUND_LOADS
    records = bench.run_background(
        fabric, link, loads=loads, workload=workload, scale=scale, bytes_per_rank=size,
        repeat=1 if quick else repeat, prefix=prefix,
        log=lambda s: out.print(f"[dim]{s}[/]"), shaping=shaping,
    )
    t = Table(title=f"bench emulate: {records[0]['fabric']} x {scale:g}, {workload}, "
              f"{fmt_bytes(size)} per rank, co-tenant on {link}", title_justify="left",
              box=box.SIMPLE_HEAD, padding=(0, 1))
    add_columns(t, ("load", "policy", "measured", "simulated", "residual bound", "meas/bound",
                    "switches", "bytes"),
                left={"policy", "bytes"}, no_wrap=True)
    for r in records:
        t.add_row(f"{r['load']:g}", r["policy"], fmt_duration(r["measured_s"]),
                  fmt_duration(r["predicted_s"]), fmt_duration(r["bound_s"]),
                  f"{r['measured_vs_bound']:.3f}", str(r.get("plan_switches", 0)),
                  "[green]verified[/]" if r["verified"] else "[red]WRONG[/]")
    out.print(t)
    for ok, line in bench.background_checks(records):
        out.print(("[green]PASS[/] " if ok else "[red]MISS[/] ") + line)
    out.print(f"wrote {bench.write_background(records, out_dir)}")
