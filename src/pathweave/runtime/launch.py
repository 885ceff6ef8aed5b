"""Run a function on ``world_size`` local processes joined in a process group.

:func:`run_local` is what tests, benchmarks and the demo use to start a small
``torch.distributed`` job on one machine without ``torchrun``: it spawns the
processes, joins them in a process group, calls the function in each, and
returns every rank's return value in rank order. Any failure becomes one
:class:`~pathweave.errors.RankError` raised in the caller, and no process
outlives the call.

Rendezvous goes through a ``TCPStore`` that the caller's process serves on a
port the kernel picks, so there is no window in which another job can take
the port between choosing it and binding it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import faulthandler
import multiprocessing as mp
import os
import queue as queue_mod
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from pathweave.errors import InputError, LaunchTimeoutError, RankError

__all__ = ["ToolParser", "fork_context", "run_local", "run_tool"]

_HOST = "127.0.0.1"
#: What the fork server imports before it forks anyone.
_FORKSERVER_PRELOAD = ("torch", "torch.distributed", "pathweave.runtime.launch",
                       "pathweave.runtime._preload")
#: Test frameworks the server also imports where the caller has them loaded: a
#: job function defined in a test module imports its module, and with it
#: these, in every process as it is unpickled (~0.12 s of CPU each; the test
#: suite forks ~300 such processes).
_TEST_FRAMEWORKS = ("pytest", "hypothesis")

#: How often the parent polls its children, and a child its parent, in seconds.
_POLL_S = 0.05
_ORPHAN_POLL_S = 0.5
#: How long a finished rank waits for the others before it leaves anyway.
_LEAVE_WAIT_S = 20.0


def _watch_parent(caller_pid: int) -> None:
    # A child whose caller died (even by SIGKILL, which runs no clean-up)
    # would sit in a collective forever; this thread ends it instead. The
    # direct parent is the fork server, not the caller, so watch both.
    parent = os.getppid()
    while True:
        time.sleep(_ORPHAN_POLL_S)
        if os.getppid() != parent:
            os._exit(3)
        try:
            os.kill(caller_pid, 0)
        except ProcessLookupError:
            os._exit(3)
        except PermissionError:
            pass


def _child(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    timeout_s: float,
    env: dict[str, str],
    caller_env: dict[str, str],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
    parent_pid: int,
    stack_dir: str,
) -> None:
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    if hasattr(signal, "SIGUSR1"):
        # The caller asks a rank that ran past the time limit where it is
        # (every thread's Python stack) before killing it. The file stays
        # open for the process's life.
        stacks = open(os.path.join(stack_dir, f"{rank}.txt"), "w")
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    # The fork server's environment is a snapshot from when it started; give
    # each child the caller's environment of now, as spawn would.
    os.environ.clear()
    os.environ.update(caller_env)
    os.environ.update(
        {
            "MASTER_ADDR": _HOST,
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size),
            "GROUP_RANK": "0",
        }
    )
    os.environ.update(env)
    from pathweave import _log

    _log.configure()  # the fork server configured logging from its own environment
    dist = None
    try:
        import torch
        import torch.distributed as dist

        if "OMP_NUM_THREADS" not in os.environ:
            # As torchrun does: several ranks per host each with a full
            # thread pool oversubscribe the cores.
            os.environ["OMP_NUM_THREADS"] = "1"
            torch.set_num_threads(1)

        if "nccl" in backend and torch.cuda.is_available():
            torch.cuda.set_device(rank % torch.cuda.device_count())
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(_HOST, port, world_size, is_master=False, timeout=timeout)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timeout
        )
        report = (rank, True, fn(rank, world_size, *args), "", 0.0)
        # No rank tears its group down before every rank is done: a rank
        # that needs none of the others (outside every subgroup) would exit
        # while a slower one still connects its gloo mesh to it ("Connection
        # closed by peer", seen on a loaded machine). The wait is bounded: a
        # rank that failed or hangs never arrives, and must not keep the
        # others from reporting (its own report, or its absence, decides).
        store.set(f"pathweave/done/{rank}", b"1")
        with contextlib.suppress(Exception):
            store.wait([f"pathweave/done/{r}" for r in range(world_size)],
                       datetime.timedelta(seconds=min(timeout_s, _LEAVE_WAIT_S)))
    except BaseException as exc:
        # Stamp and report before the group is torn down: tearing it down
        # breaks the peers' connections, and their errors must not be taken
        # for the first failure.
        report = (rank, False, traceback.format_exc(), type(exc).__name__, time.time())
    if not report[1]:
        results.put(report)
    if dist is not None and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    if report[1]:
        results.put(report)


def fork_context() -> Any:
    """The multiprocessing context children start from (also the emulator's ranks').

    A fork server where the platform has one: a fresh process (none of the
    caller's threads, CUDA state or locks, as with ``spawn``) that imports
    torch once, then forks each child, so a job starts in a fraction of a
    second instead of every child importing torch again (about 1.5 s of CPU
    each). ``spawn`` elsewhere.
    """
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    # NOTE: the preload list belongs to the process-wide fork server and only
    # matters before it starts; later calls change nothing.
    ctx.set_forkserver_preload(
        [*_FORKSERVER_PRELOAD, *(m for m in _TEST_FRAMEWORKS if m in sys.modules)]
    )
    return ctx


def _stop(procs: Sequence[Any], patience_s: float = 0.0) -> None:
    """Terminate, then kill, every process still alive; reap all of them.

    ``patience_s``: how long processes that already reported may take to exit
    on their own first.
    """
    # Processes that never started (``start()`` raised for an earlier one)
    # cannot be joined; joining them would raise and hide the real error.
    procs = [p for p in procs if p.pid is not None]
    deadline = time.monotonic() + patience_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 2.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5.0)


def run_local(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    *,
    backend: str = "gloo",
    timeout_s: float = 120.0,
    env: Mapping[str, str] | None = None,
    grace_s: float = 5.0,
) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` local processes.

    Each process starts clean, as with the ``spawn`` method (forked from a
    fork server that has imported torch, where the platform has one), has the
    caller's environment (with ``OMP_NUM_THREADS=1`` unless set, as
    ``torchrun`` does) and the usual
    ``torchrun`` variables set (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), then ``env``, and
    joins the default process group before ``fn`` runs; the group is
    destroyed once ``fn`` has returned on every rank, or 20 s after this
    rank's returned (an early exit would break a slower rank's connections
    still being set up; a rank that never returns must not hold the rest).

    Parameters
    ----------
    fn
        A picklable (module-level) function ``fn(rank, world_size, *args)``.
    world_size
        Number of processes, >= 1.
    args
        Extra picklable arguments passed to every rank.
    backend
        ``torch.distributed`` backend: ``"gloo"`` (CPU) or ``"nccl"`` (CUDA;
        rank ``r`` uses device ``r % device_count``).
    timeout_s
        Wall-time limit of the whole job, also the process group's timeout.
        Past it every process is killed and :class:`LaunchTimeoutError` raised.
    env
        Environment variables set in every child before the group is joined
        (they override the ``torchrun`` variables above, e.g.
        ``{"LOCAL_WORLD_SIZE": "4"}`` to look like two nodes of four).
    grace_s
        After the first rank fails, how long the others may still finish or
        report their own failure before they are killed.

    Returns
    -------
    list
        ``fn``'s return value on each rank, in rank order (values must pickle).

    Raises
    ------
    RankError
        A rank raised or exited without a result. ``rank`` and ``traceback``
        describe the first failure seen; ``failures`` holds every failed rank's
        text and ``others_failed`` says whether there was more than one.
    LaunchTimeoutError
        The job ran past ``timeout_s``; ``failures`` names the unfinished ranks,
        each with its threads' Python stacks where the platform can dump them
        (SIGUSR1 and :mod:`faulthandler`, just before the processes are killed).

    Examples
    --------
    >>> from pathweave.runtime.launch import run_local
    >>> run_local(print, 0)
    Traceback (most recent call last):
    ...
    ValueError: world_size must be >= 1, got 0
    """
    _check_launch(fn, world_size, timeout_s)
    child_env = {str(k): str(v) for k, v in (env or {}).items()}

    import torch.distributed as dist

    ctx = fork_context()
    store = dist.TCPStore(_HOST, 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    results = ctx.Queue()
    stack_dir = tempfile.mkdtemp(prefix="pathweave-stacks-")
    procs = [
        ctx.Process(
            target=_child,
            args=(r, world_size, store.port, backend, float(timeout_s), child_env,
                  dict(os.environ), fn, tuple(args), results, os.getpid(), stack_dir),
            name=f"pathweave-rank{r}",
            daemon=True,
        )
        for r in range(world_size)
    ]
    patience_s = 0.0
    try:
        for p in procs:
            p.start()
        values, failed = _collect(procs, results, timeout_s, grace_s)
        stacks = {} if failed else _stacks(procs, values, stack_dir)
        _raise_failures(world_size, values, failed, timeout_s, stacks)
        out = [values[r] for r in range(world_size)]
        patience_s = 5.0
        return out
    finally:
        # Also reached on KeyboardInterrupt: no child outlives the call.
        _stop(procs, patience_s)
        results.close()
        results.join_thread()
        shutil.rmtree(stack_dir, ignore_errors=True)
        del store


def _check_launch(fn: Any, world_size: Any, timeout_s: Any) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")


#: A failed rank: (text, exception type name, crashed without a report, time stamp).
_Failure = tuple[str, str, bool, float]


def _collect(procs: list[Any], results: Any, timeout_s: float, grace_s: float
             ) -> tuple[dict[int, Any], dict[int, _Failure]]:
    """Every rank's report until all are in, the time is up, or the others' grace ends."""
    world_size = len(procs)
    values: dict[int, Any] = {}
    failed: dict[int, _Failure] = {}

    def take(report: tuple[Any, ...]) -> None:
        rank, ok, payload, exc_type, stamp = report
        if ok:
            values[rank] = payload
        else:
            failed[rank] = (payload, exc_type, False, stamp)

    stop_at = time.time() + timeout_s
    while len(values) + len(failed) < world_size and time.time() < stop_at:
        try:
            take(results.get(timeout=_POLL_S))
        except queue_mod.Empty:
            # A process gone without a report crashed (os._exit, a
            # signal, the OOM killer); drain the pipe once more before
            # saying so, as its report may still be in flight.
            for r, p in enumerate(procs):
                if r in values or r in failed or p.exitcode is None:
                    continue
                with contextlib.suppress(queue_mod.Empty):
                    while True:
                        take(results.get(timeout=0.2))
                if r not in values and r not in failed:
                    text = f"rank {r} exited with code {p.exitcode} without a result"
                    failed[r] = (text, "", True, time.time())
        if failed:
            stop_at = min(stop_at, min(f[3] for f in failed.values()) + grace_s)
    return values, failed


def _stacks(procs: list[Any], values: dict[int, Any], stack_dir: str) -> dict[int, str]:
    """The Python stacks of the ranks still running without a result (SIGUSR1 ->
    faulthandler), read back within a second; empty where the platform has no SIGUSR1."""
    late = [r for r, p in enumerate(procs) if r not in values and p.exitcode is None]
    if not late or not hasattr(signal, "SIGUSR1"):
        return {}
    for r in late:
        with contextlib.suppress(ProcessLookupError):
            os.kill(procs[r].pid, signal.SIGUSR1)
    out: dict[int, str] = {}
    stop_at = time.time() + 1.0
    while len(out) < len(late) and time.time() < stop_at:
        time.sleep(_POLL_S)
        for r in late:
            with contextlib.suppress(OSError):
                text = Path(stack_dir, f"{r}.txt").read_text()
                if "most recent call first" in text:
                    out[r] = text.strip()
    return out


def _raise_failures(world_size: int, values: dict[int, Any], failed: dict[int, _Failure],
                    timeout_s: float, stacks: dict[int, str] | None = None) -> None:
    """Raise :class:`RankError` for the root failure, or :class:`LaunchTimeoutError`
    (each unfinished rank's text with its threads' stacks from ``stacks``, where read)."""
    failures = {r: f[0] for r, f in sorted(failed.items())}
    if not failed:
        if len(values) == world_size:
            return
        stacks = stacks or {}
        missing = {r: f"rank {r} did not finish within {timeout_s} s"
                   + (f"; where its threads were:\n{stacks[r]}" if r in stacks else "")
                   for r in range(world_size) if r not in values}
        r0 = min(missing)
        raise LaunchTimeoutError(
            f"job of {world_size} ranks ran past {timeout_s} s; unfinished ranks: "
            f"{sorted(missing)}; all processes were killed",
            rank=r0, traceback=missing[r0], failures=missing,
        )
    # The root cause: a crash if there was one (the others' errors follow
    # from it), else the earliest exception.
    rank = min(failed, key=lambda r: (not failed[r][2], failed[r][3], r))
    text, exc_type = failed[rank][:2]
    for r in range(world_size):
        if r not in values and r not in failures:
            failures[r] = f"rank {r} was killed after rank {rank} failed"
    others = sorted(r for r in failures if r != rank)
    tail = text.strip().splitlines()[-1] if text.strip() else text
    raise RankError(
        f"rank {rank} failed: {tail}"
        + (f" (ranks {others} failed too)" if others else "")
        + f"\n--- remote traceback of rank {rank} ---\n{text}",
        rank=rank, traceback=text, failures=failures, exc_type=exc_type,
    )


#: What ``torchrun`` sets and ``init_process_group``'s ``env://`` reads.
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _check_torchrun_env() -> None:
    """Refuse, with what to do instead, a tool started outside ``torchrun`` without ``--ranks``
    (torch's own error names one variable and no remedy)."""
    missing = [v for v in _TORCHRUN_ENV if not os.environ.get(v)]
    if len(missing) == len(_TORCHRUN_ENV):
        raise InputError("not inside a torchrun job (RANK, WORLD_SIZE, MASTER_ADDR and "
                         "MASTER_PORT are unset): pass --ranks N to start N local ranks, or "
                         "start it with torchrun --nproc-per-node=N")
    if missing:
        raise InputError(f"a torchrun job sets {', '.join(_TORCHRUN_ENV)}; "
                         f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} unset")


class ToolParser(argparse.ArgumentParser):
    """The flags of a tool :func:`run_tool` starts (``pathweave perf``, ``pathweave
    calibrate``), in the style of nccl-tests: every error is one line,
    ``PROG: error: ...``, exit code 2, as with the rest of pathweave's command line.

    >>> p = ToolParser(prog="tool")
    >>> _ = p.add_argument("-n", type=int)
    >>> p.parse_args(["-n", "x"])
    Traceback (most recent call last):
    ...
    SystemExit: 2
    """

    def error(self, message: str) -> NoReturn:
        """A bad command line: one line that points at ``--help`` (argparse prints the
        usage first, several lines)."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def fail(self, exc: BaseException) -> NoReturn:
        """A run refused or failed with ``exc``: its first line."""
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self.exit(2, f"{self.prog}: error: {text}\n")


def run_tool(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    *,
    ranks: int | None = None,
    backend: str | None = None,
) -> tuple[int, Any]:
    """A command-line tool's ranks: ``(this rank, rank 0's or this rank's result)``.

    With ``ranks``, :func:`run_local` starts that many local ranks on
    ``backend`` (gloo when ``None``) and rank 0's value comes back (this
    process is rank 0). Without it the tool runs inside a ``torchrun`` job: it
    joins the job's process group unless one is joined already (``backend``
    ``None``: NCCL when every local rank has a GPU, else gloo; each NCCL rank
    on ``LOCAL_RANK``'s device), calls ``fn(rank, world_size, *args)`` and
    leaves the group it joined. Used by ``pathweave perf`` and
    ``pathweave calibrate``.
    """
    if ranks is not None:
        return 0, run_local(fn, ranks, args, backend=backend or "gloo", timeout_s=3600)[0]
    import torch
    import torch.distributed as dist

    joined = dist.is_initialized()
    if not joined:
        _check_torchrun_env()
        if backend is None:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            gpus = torch.cuda.is_available() and torch.cuda.device_count() >= local
            backend = "nccl" if gpus else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    try:
        rank = dist.get_rank()
        return rank, fn(rank, dist.get_world_size(), *args)
    finally:
        if not joined:
            dist.destroy_process_group()
