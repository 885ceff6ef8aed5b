"""``pathweave perf``: nccl-tests' ``alltoall_perf`` for skewed all-to-all, under torchrun.

Run it on a cluster as nccl-tests are run, one process per GPU::

    torchrun --nproc-per-node 8 --nnodes 2 ... -m pathweave.perf -b 1K -e 1G -f 2 -w hotspot:0.8

or on one machine with local gloo ranks (``--ranks``; also ``pathweave perf``)::

    python -m pathweave.perf --ranks 4 -b 1K -e 4M -f 4 -w zipf:1.2

For every size from ``-b`` to ``-e`` (times ``-f``) every rank builds the
same demand matrix (the workload's shape, scaled so that ranks send ``size``
bytes on average), and each implementation runs ``-W`` warm-up calls, one
checked call and ``-n`` timed calls, on the same ranks and buffers:

``pathweave``
    pathweave's default ``all_to_all_single``, called as torch's is: every
    call exchanges a metadata row first (the split sizes), so a small call
    pays for one more collective than torch's;
``pw-matrix``
    the same call given ``split_matrix=`` and ``config_digests=`` (gathered
    once per size, untimed), as a caller that knows every rank's splits
    passes them (the MoE layer): no exchange, the decision alone;
``torch``
    torch's own ``all_to_all_single``.

One line per size and implementation, nccl-tests' columns:

``size``
    bytes a rank sends on average (the workload's ``bytes_per_rank``);
    ``count`` is ``size`` in elements of ``type``.
``time``
    microseconds: per call the slowest rank's (each call starts after a
    barrier), the median over the ``-n`` calls.
``algbw``
    ``B / time``, where ``B`` is the most bytes any rank sends or receives
    (its own share included), in GB/s (1e9).
``busbw``
    ``B_bus / time``, where ``B_bus`` is the most bytes any rank sends to or
    receives from *other* ranks: the traffic its link must carry. For
    nccl-tests' uniform all-to-all (``size / N`` to every rank, itself
    included) this is nccl-tests' ``algbw * (N - 1) / N``; pathweave's
    workloads send nothing to the sender itself, so there ``busbw`` equals
    ``algbw`` unless a demand file says otherwise.
``#wrong``
    elements, summed over ranks, whose bytes differ from what the senders'
    inputs (a known pattern per rank) say must arrive: checked independently
    of both implementations, so torch's own line is checked too.

Only out-of-place: torch's ``all_to_all_single`` has no in-place form for
uneven splits. NCCL on GPUs when every local rank has one (``--backend``
overrides), gloo on CPU otherwise.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pathweave.errors import PathweaveError, WorkloadError
from pathweave.runtime.launch import ToolParser
from pathweave.traffic import WorkloadSpec, load_demand, parse_size, validate_demand
from pathweave.traffic.pattern import pattern_bytes

__all__ = ["COLUMNS", "DTYPES", "IMPLS", "PerfOptions", "demand_bytes", "format_table",
           "main", "run", "sizes", "split_bytes"]

#: nccl-tests' ``-d`` names (and torch's) -> torch dtype name, element bytes.
DTYPES: dict[str, tuple[str, int]] = {
    "int8": ("int8", 1), "uint8": ("uint8", 1), "int32": ("int32", 4), "int": ("int32", 4),
    "int64": ("int64", 8), "half": ("float16", 2), "float16": ("float16", 2),
    "bfloat16": ("bfloat16", 2), "float": ("float32", 4), "float32": ("float32", 4),
    "double": ("float64", 8), "float64": ("float64", 8),
}
#: The implementations every line compares, in table order.
IMPLS = ("pathweave", "pw-matrix", "torch")
#: Row keys of CSV/JSON output, in order.
COLUMNS = ("size", "count", "type", "impl", "time_us", "algbw_GBps", "busbw_GBps", "wrong",
           "workload", "ranks", "backend")


@dataclass(frozen=True)
class PerfOptions:
    """One perf run's settings (the command line's flags)."""

    min_bytes: int = 1 << 10
    max_bytes: int = 1 << 22
    step_factor: float = 4.0
    dtype: str = "float"
    workload: str = "uniform"
    iters: int = 20
    warmup: int = 5
    impls: tuple[str, ...] = IMPLS
    backend: str | None = None


def sizes(min_bytes: int, max_bytes: int, step_factor: float) -> list[int]:
    """nccl-tests' sweep: ``min_bytes`` times ``step_factor`` while at most ``max_bytes``.

    >>> sizes(1024, 65536, 4)
    [1024, 4096, 16384, 65536]
    """
    if not (min_bytes >= 1 and max_bytes >= min_bytes):
        raise ValueError(f"-b/-e: need 1 <= minbytes <= maxbytes, got {min_bytes}, {max_bytes}")
    if not step_factor > 1:
        raise ValueError(f"-f: the step factor must be > 1, got {step_factor}")
    out, s = [], float(min_bytes)
    while s <= max_bytes:
        out.append(int(s))
        s *= step_factor
    return out


def demand_bytes(workload: str, num_ranks: int, size: int) -> np.ndarray:
    """The workload's demand (bytes per pair) scaled so that ranks send ``size`` bytes on average.

    ``workload``: a spec (:class:`~pathweave.traffic.WorkloadSpec`) or a demand
    file (:func:`~pathweave.traffic.load_demand`) of ``num_ranks`` ranks.

    >>> demand_bytes("many_to_few:sinks=1", 3, 100).tolist()
    [[0.0, 0.0, 0.0], [150.0, 0.0, 0.0], [150.0, 0.0, 0.0]]
    """
    path = Path(workload)
    if path.suffix.lower() in (".npz", ".json") and path.is_file():
        D = validate_demand(load_demand(path), num_ranks)
    else:
        D = WorkloadSpec.parse(workload).build(num_ranks, size, seed=0)
    total = float(D.sum())
    if total <= 0:
        raise WorkloadError(f"workload {workload!r} moves no bytes on {num_ranks} ranks")
    return D * (size * num_ranks / total)


def split_bytes(D: np.ndarray, element_bytes: int) -> np.ndarray:
    """Elements per pair (whole elements, rounded down) of demand ``D``."""
    return np.floor(D / element_bytes).astype(np.int64)


def _bw_bytes(elems: np.ndarray, element_bytes: int) -> tuple[int, int]:
    """``(B, B_bus)`` of the module docstring for elements per pair ``elems``."""
    b = elems * element_bytes
    off = b - np.diag(np.diag(b))
    most = max(int(b.sum(1).max()), int(b.sum(0).max()))
    bus = max(int(off.sum(1).max()), int(off.sum(0).max()))
    return most, bus


def _expected(torch: Any, elems: np.ndarray, rank: int, element_bytes: int) -> Any:
    """What rank ``rank`` must receive: each sender's slice of its pattern input."""
    parts = []
    for s in range(elems.shape[0]):
        start = int(elems[s, :rank].sum()) * element_bytes
        period = pattern_bytes(s, 0, 251)
        nbytes = int(elems[s, rank]) * element_bytes
        parts.append(np.resize(np.roll(period, -(start % 251)), nbytes))
    return torch.from_numpy(np.ascontiguousarray(np.concatenate(parts), dtype=np.uint8))


def _torch_a2a(output: Any, input: Any, out_splits: list[int], in_splits: list[int]) -> None:
    import torch.distributed as dist

    dist.all_to_all_single(output, input, out_splits, in_splits)


def _pathweave_a2a(output: Any, input: Any, out_splits: list[int], in_splits: list[int],
                   **known: Any) -> None:
    import pathweave.distributed as pwd

    pwd.all_to_all_single(output, input, out_splits, in_splits, **known)


def _known(torch: Any, dev: Any, elems: np.ndarray) -> dict[str, Any]:
    """``pw-matrix``'s keywords: the split matrix every rank built, every rank's config digest.

    Gathered once per size, outside the timed calls, as a caller that knows
    the matrix (the MoE layer) gathers them in a collective of its own.
    """
    import torch.distributed as dist

    import pathweave.distributed as pwd

    mine = torch.tensor([pwd.config_digest(device=dev)], dtype=torch.int64, device=dev)
    every = torch.empty(dist.get_world_size(), dtype=torch.int64, device=dev)
    dist.all_gather_into_tensor(every, mine)
    return {"split_matrix": elems, "config_digests": every.cpu().numpy()}


_CALLS: dict[str, Callable[..., None]] = {
    "pathweave": _pathweave_a2a, "pw-matrix": _pathweave_a2a, "torch": _torch_a2a}


def run(
    rank: int, world_size: int, options: PerfOptions,
    extra: Mapping[str, Callable[..., None]] | None = None,
) -> list[dict[str, Any]]:
    """One rank's part of a perf run (the process group is up); every rank returns the rows.

    ``extra``: more implementations ``f(output, input, output_split_sizes,
    input_split_sizes)`` by name, after :data:`IMPLS` (tests use one that
    damages a byte to see ``#wrong`` count it).
    """
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend()).lower()
    nccl = "nccl" in backend
    dev = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    tname, esize = DTYPES[options.dtype]
    dtype = getattr(torch, tname)
    calls = {k: _CALLS[k] for k in options.impls} | dict(extra or {})
    rows = []
    for size in sizes(options.min_bytes, options.max_bytes, options.step_factor):
        elems = split_bytes(demand_bytes(options.workload, world_size, size), esize)
        send, recv = elems[rank].tolist(), elems[:, rank].tolist()
        mine = pattern_bytes(rank, 0, sum(send) * esize)
        inp = (torch.from_numpy(mine).to(dev).view(dtype) if mine.size
               else torch.empty(0, dtype=dtype, device=dev))
        want = _expected(torch, elems, rank, esize).to(dev)
        most, bus = _bw_bytes(elems, esize)
        for name, call in calls.items():
            known = _known(torch, dev, elems) if name == "pw-matrix" else {}
            fn = functools.partial(call, **known)
            out = torch.empty(sum(recv), dtype=dtype, device=dev)
            for _ in range(options.warmup):
                fn(out, inp, recv, send)
            out.view(torch.uint8).fill_(0xA5)
            fn(out, inp, recv, send)
            got = out.view(torch.uint8).view(-1, esize)
            wrong = torch.tensor([int((got != want.view(-1, esize)).any(1).sum())], device=dev)
            took = torch.zeros(options.iters, dtype=torch.float64, device=dev)
            for i in range(options.iters):
                dist.barrier()
                if nccl:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn(out, inp, recv, send)
                if nccl:
                    torch.cuda.synchronize()
                took[i] = time.perf_counter() - t0
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            dist.all_reduce(wrong)
            t = statistics.median(took.cpu().tolist())
            rows.append({
                "size": size, "count": size // esize, "type": options.dtype, "impl": name,
                "time_us": t * 1e6, "algbw_GBps": most / t / 1e9, "busbw_GBps": bus / t / 1e9,
                "wrong": int(wrong.item()), "workload": options.workload,
                "ranks": world_size, "backend": backend,
            })
    return rows


def format_table(rows: Sequence[dict[str, Any]], options: PerfOptions) -> str:
    """nccl-tests' table: a header, a line per size and implementation, the mean busbw."""
    head = rows[0] if rows else {"ranks": "?", "backend": "?"}
    lines = [
        f"# pathweave perf: {head['ranks']} ranks, {head['backend']}, workload "
        f"{options.workload}, {options.dtype}, {options.iters} iters ({options.warmup} warm-up)",
        f"#{'out-of-place':>74}",
        f"#{'size':>11} {'count':>12} {'type':>8} {'impl':>10} {'time':>10} {'algbw':>8} "
        f"{'busbw':>8} {'#wrong':>7}",
        f"#{'(B)':>11} {'(elements)':>12} {'':>8} {'':>10} {'(us)':>10} {'(GB/s)':>8} "
        f"{'(GB/s)':>8}",
    ]
    for r in rows:
        lines.append(f" {r['size']:>11} {r['count']:>12} {r['type']:>8} {r['impl']:>10} "
                     f"{r['time_us']:>10.1f} {r['algbw_GBps']:>8.3f} {r['busbw_GBps']:>8.3f} "
                     f"{r['wrong']:>7}")
    for impl in dict.fromkeys(r["impl"] for r in rows):
        bus = [r["busbw_GBps"] for r in rows if r["impl"] == impl]
        lines.append(f"# Avg bus bandwidth ({impl}): {sum(bus) / len(bus):.4f} GB/s")
    return "\n".join(lines)


def _parser() -> ToolParser:
    p = ToolParser(
        prog="pathweave perf", description=__doc__.splitlines()[0],
        epilog="Sizes take units (1K, 4M, 1G: powers of 1024; 1KB: 1000).")
    p.add_argument("-b", "--minbytes", default="1K", help="smallest size (default 1K)")
    p.add_argument("-e", "--maxbytes", default="4M", help="largest size (default 4M)")
    p.add_argument("-f", "--stepfactor", type=float, default=4.0,
                   help="size multiplier between lines (default 4)")
    p.add_argument("-d", "--datatype", default="float", choices=sorted(DTYPES),
                   help="element type (default float)")
    p.add_argument("-w", "--workload", default="uniform",
                   help="workload spec (uniform, hotspot:0.8, many_to_few, zipf:1.2, "
                   "moe:..., ...) or a demand file (.npz/.json); default uniform")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed calls (default 20)")
    p.add_argument("-W", "--warmup-iters", type=int, default=5,
                   help="warm-up calls (default 5)")
    p.add_argument("--impl", action="append", choices=IMPLS,
                   help="implementation to run (repeatable; default all)")
    p.add_argument("--backend", choices=("gloo", "nccl"),
                   help="default: nccl where every local rank has a GPU, else gloo")
    p.add_argument("--ranks", type=int,
                   help="start this many local ranks (not under torchrun)")
    p.add_argument("--csv", help="also write the rows as CSV to this file ('-': stdout)")
    p.add_argument("--json", help="also write the rows as JSON to this file ('-': stdout)")
    return p


def options_from(args: argparse.Namespace) -> PerfOptions:
    """Check the parsed flags (before any rank starts) and make the options."""
    for flag, value in (("-n", args.iters), ("--ranks", args.ranks)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.warmup_iters < 0:
        raise ValueError(f"-W must be >= 0, got {args.warmup_iters}")
    opts = PerfOptions(
        min_bytes=int(parse_size(args.minbytes, "-b")), max_bytes=int(parse_size(args.maxbytes,
                                                                              "-e")),
        step_factor=args.stepfactor, dtype=args.datatype, workload=args.workload,
        iters=args.iters, warmup=args.warmup_iters, impls=tuple(args.impl or IMPLS),
        backend=args.backend)
    sizes(opts.min_bytes, opts.max_bytes, opts.step_factor)
    if args.ranks is not None:
        demand_bytes(opts.workload, args.ranks, opts.min_bytes)  # a bad workload fails here
    return opts


def _write(rows: list[dict[str, Any]], where: str | None, as_json: bool) -> bool:
    """Write ``rows`` to ``where`` ('-': stdout); whether stdout was used."""
    if where is None:
        return False
    if as_json:
        text = json.dumps([{k: r[k] for k in COLUMNS} for r in rows], indent=2) + "\n"
    else:
        text = ",".join(COLUMNS) + "\n" + "".join(
            ",".join(str(r[k]) for k in COLUMNS) + "\n" for r in rows)
    if where == "-":
        sys.stdout.write(text)
        return True
    from pathweave._files import atomic_write

    atomic_write(Path(where), text.encode())
    return False


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (``python -m pathweave.perf``, ``pathweave perf``); the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        options = options_from(args)
        from pathweave.runtime.launch import run_tool

        rank, rows = run_tool(run, (options,), ranks=args.ranks, backend=options.backend)
    except (PathweaveError, ValueError, OSError) as exc:
        parser.fail(exc)
    if rank != 0:
        return 0
    used = _write(rows, args.csv, as_json=False)
    used = _write(rows, args.json, as_json=True) or used
    if not used:
        print(format_table(rows, options), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
