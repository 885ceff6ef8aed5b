"""Faults: dead and hung peers, failing ranks, timeouts, interrupts. Nothing may hang.

Each job here is expected to fail; the tests check *how*: which rank is
blamed, that every surviving rank raised (and within the orchestrator's
timeout), and that no process outlives ``run_local``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import textwrap
import time
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import pathweave as pw
import pathweave.distributed as pwd
from pathweave.errors import CommError, LaunchTimeoutError, RankError
from pathweave.runtime.launch import run_local

TIMEOUT_S = 3.0


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _wait_gone(pids, within_s=5.0):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def _record_pid(piddir: str, rank: int) -> None:
    # Written whole, then renamed: a reader polling the folder never sees an empty file.
    tmp = Path(piddir, f"{rank}.pid.tmp")
    tmp.write_text(str(os.getpid()))
    tmp.replace(Path(piddir, f"{rank}.pid"))


def _pids(piddir) -> list[int]:
    return [int(p.read_text()) for p in Path(piddir).glob("*.pid")]


# ------------------------------------------------------------- data plane
FAULTS = [
    # (mode, enabled): enabled=False is torch's own collective behind the same checks
    ("die-mid-transfer", True),
    ("die-before-call", True),
    ("die-before-call", False),
    ("raise-before-call", True),
    ("kill-while-relaying", True),
    ("hang", True),
    ("hang", False),
]


class _SendHook:
    """The process group the executor posts through (``Transport.process_group``), ``send``
    replaced; the group held weakly, as the transport holds it."""

    def __init__(self, pg, send):
        self._pg, self.send = weakref.proxy(pg), send

    def __getattr__(self, name):
        return getattr(self._pg, name)


def _hook_send(orch, send):
    tr = orch._state(None).transport
    tr.process_group = _SendHook(tr.process_group, send)
    return tr.process_group._pg.send


def _kill_while_relaying(orch):
    """SIGKILL this process on its second forward of a relayed chunk (on a forwarding thread)."""
    import threading

    forwards = []

    def send(*args):
        if threading.current_thread().name.startswith("pathweave-forward"):
            forwards.append(1)
            if len(forwards) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        return real_send(*args)

    real_send = _hook_send(orch, send)


def _victim(mode):
    # On relay paths of h100-2x4 rank 0 forwards for 30 streams; rank 3 for none.
    return 0 if mode == "kill-while-relaying" else 3


def job_peer_fault(rank, ws, mode, enabled, piddir):
    """One rank dies, raises or hangs around an exchange; the others' outputs stay untouched."""
    _record_pid(piddir, rank)
    # relay paths only: ranks forward chunks between other ranks of their node
    policy = functools.partial(pw.plan.pinned, roles=("relay",)) if enabled else "mwu"
    orch = pw.Orchestrator(fabric="h100-2x4", policy=policy, enabled=enabled, chunk_bytes=4096,
                           window=2, min_split_bytes=0, timeout_s=60)
    inp = torch.arange(ws * 40000, dtype=torch.float32)
    out = torch.empty_like(inp)
    # A good call first: all connected, the plan made. Its own deadline is
    # long: on a loaded host a cold first call (planning, connecting) took
    # more than TIMEOUT_S, and the test times the faulty call, not this one.
    pwd.all_to_all_single(out, inp, orchestrator=orch)
    # A rank returns once its own bytes are in, while it may still relay for
    # others: the victim must not act before every rank is out of that call.
    dist.barrier()
    orch.timeout_s = TIMEOUT_S
    out.fill_(-1.0)
    if rank == _victim(mode):
        if mode == "die-mid-transfer":
            def die_on_send(*args):
                # its receives are posted and the peers' bytes are in flight
                os._exit(17)

            _hook_send(orch, die_on_send)
        elif mode == "die-before-call":
            os._exit(17)
        elif mode == "raise-before-call":
            raise KeyError("rank 3 gave up before the call")
        elif mode == "kill-while-relaying":
            _kill_while_relaying(orch)
        else:  # hang: alive, never joins the call
            time.sleep(60)
    t0 = time.perf_counter()
    try:
        pwd.all_to_all_single(out, inp, orchestrator=orch)
    except CommError as exc:
        # Re-raise with the time it took, for the parent to check.
        untouched = bool((out == -1.0).all())
        raise RuntimeError(f"CommError after {time.perf_counter() - t0:.3f} s "
                           f"(output untouched: {untouched}): {exc}") from exc
    if mode == "kill-while-relaying":
        # A rank whose bytes had all moved before the relay died may finish;
        # its output must then be right (every rank sends the same input).
        mine = inp.reshape(ws, -1)[rank]
        correct = bool(torch.equal(out.reshape(ws, -1), mine.expand(ws, -1)))
        raise RuntimeError(f"finished (output correct: {correct})")
    return "finished"


@pytest.mark.parametrize(("mode", "enabled"), FAULTS)
def test_every_survivor_raises_within_the_timeout(mode, enabled, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        # A dead peer's survivors fail within TIMEOUT_S of each other; a hung
        # peer's all time out together and the hung one is killed after grace.
        grace_s = 2.0 if mode == "hang" else TIMEOUT_S + 3
        run_local(job_peer_fault, 8, (mode, enabled, str(tmp_path)), timeout_s=90,
                  grace_s=grace_s)
    err = info.value
    victim = _victim(mode)
    survivors = [r for r in range(8) if r != victim]
    for r in survivors:
        text = err.failures[r]
        if mode == "kill-while-relaying" and "finished" in text:
            # its bytes had all moved before the relay died; never the ranks
            # whose streams it relayed (1 <-> 2 inside node 0)
            assert "(output correct: True)" in text and r not in (1, 2), (r, text)
            continue
        assert "CommError after" in text, (r, text)
        took = float(text.rsplit("CommError after ", 1)[1].split(" s")[0])
        assert took <= TIMEOUT_S + 1.0, (r, took)
        if enabled is True:  # multi-path stages; torch's path writes a dense output itself
            assert "(output untouched: True)" in text, (r, text)
        if mode == "hang":
            assert took >= TIMEOUT_S * 0.9, (r, took)  # waited for the peer, then gave up
    if mode == "hang":
        assert err.rank != 3 and err.failures[3].startswith("rank 3 was killed after rank")
    elif mode == "raise-before-call":
        assert err.rank == 3 and err.exc_type == "KeyError"
    elif mode == "kill-while-relaying":
        assert err.rank == victim and "exited with code -9" in err.traceback, err.traceback
    else:
        assert err.rank == 3 and "exited with code 17" in err.traceback
    assert err.others_failed
    assert _wait_gone(_pids(tmp_path)), "a rank outlived run_local"
    assert time.monotonic() - t0 < 60


# ---------------------------------------------------------------- launcher
def job_raise_on_one(rank, ws, piddir):
    _record_pid(piddir, rank)
    if rank == 2:
        raise KeyError("no such expert")
    dist.barrier()  # the others wait for rank 2, which never comes
    return rank


def job_sleep(rank, ws, piddir):
    _record_pid(piddir, rank)
    time.sleep(60)


def job_value(rank, ws, base):
    t = torch.tensor([rank + base])
    dist.all_reduce(t)
    return {"rank": rank, "sum": int(t), "env": os.environ["LOCAL_WORLD_SIZE"]}


def test_run_local_returns_values_in_rank_order():
    got = run_local(job_value, 4, (10,), env={"LOCAL_WORLD_SIZE": "2"})
    assert got == [{"rank": r, "sum": 46, "env": "2"} for r in range(4)]


def job_last_alive(rank, ws, piddir):
    """Every rank but 0 returns at once; rank 0, later, sees which of them are still up."""
    _record_pid(piddir, rank)
    if rank:
        return True
    time.sleep(1.0)
    alive = []
    for r in range(1, ws):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(Path(piddir, f"{r}.pid").read_text()), 0)
            alive.append(r)
    return alive


def test_no_rank_leaves_before_every_rank_is_done(tmp_path):
    # A rank that exited early broke a slow one's gloo connections, still
    # being set up ("Connection closed by peer"): each waits for all.
    got = run_local(job_last_alive, 3, (str(tmp_path),), timeout_s=60)
    assert got == [[1, 2], True, True]


def test_a_raising_rank_is_reported_with_its_traceback(tmp_path):
    with pytest.raises(RankError) as info:
        run_local(job_raise_on_one, 4, (str(tmp_path),), timeout_s=60, grace_s=2)
    err = info.value
    assert err.rank == 2 and err.exc_type == "KeyError"
    assert "no such expert" in err.traceback and "job_raise_on_one" in err.traceback
    assert "rank 2 failed: KeyError: 'no such expert'" in str(err)
    assert set(err.failures) == {0, 1, 2, 3} and err.others_failed
    assert _wait_gone(_pids(tmp_path))


def test_timeout_kills_every_process(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(LaunchTimeoutError) as info:
        run_local(job_sleep, 3, (str(tmp_path),), timeout_s=4)
    assert time.monotonic() - t0 < 15
    assert sorted(info.value.failures) == [0, 1, 2]
    assert "ran past 4" in str(info.value)
    for r in range(3):  # where each rank was: its main thread in job_sleep's sleep
        text = info.value.failures[r]
        assert text.startswith(f"rank {r} did not finish within 4 s; where its threads were:")
        assert "in job_sleep" in text and "_watch_parent" in text, text
    assert len(_pids(tmp_path)) == 3 and _wait_gone(_pids(tmp_path))


def test_bad_launch_arguments():
    with pytest.raises(ValueError, match="world_size must be >= 1, got 0"):
        run_local(job_value, 0)
    with pytest.raises(TypeError, match="fn must be callable"):
        run_local("job", 2)
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        run_local(job_value, 2, timeout_s=0)


class _PickleOnce:
    """An argument that pickles once, then refuses: the second ``p.start()`` raises."""

    times = 0

    def __reduce__(self):
        type(self).times += 1
        if type(self).times > 1:
            raise RuntimeError("refusing to pickle twice")
        return (_PickleOnce, ())


def test_failed_process_start_reports_the_real_error():
    import multiprocessing as mp

    # rank 0 starts (and waits in the rendezvous), rank 1's start() raises
    _PickleOnce.times = 0
    with pytest.raises(RuntimeError, match="refusing to pickle twice"):
        run_local(job_value, 2, (_PickleOnce(),), timeout_s=30)
    # a function the fork server cannot load raises its own error, no AssertionError
    with pytest.raises(Exception) as info:
        run_local(lambda rank, ws: rank, 2, timeout_s=30)
    assert not isinstance(info.value, AssertionError)
    assert "lambda" in str(info.value)
    deadline = time.monotonic() + 10
    while mp.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in mp.active_children() if p.name.startswith("pathweave-rank")]


def _wait_for_pids(piddir, count, within_s=60.0):
    deadline = time.monotonic() + within_s
    while len(_pids(piddir)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return _pids(piddir)


def test_interrupted_or_killed_caller_leaves_no_process(tmp_path):
    """SIGINT the caller while its ranks run, then SIGKILL it during a second job.

    After SIGINT the ``finally`` path must have killed the ranks; SIGKILL runs
    no clean-up at all, so there the ranks must notice their caller is gone.
    """
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    script = tmp_path / "caller.py"
    # The caller raises KeyboardInterrupt on SIGINT even when started from a
    # shell's background job, which hands its children SIGINT ignored.
    script.write_text(textwrap.dedent(f"""
        import signal, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_distributed_faults import job_sleep
        from pathweave.runtime.launch import run_local
        if __name__ == "__main__":
            try:
                run_local(job_sleep, 3, ({str(first)!r},), timeout_s=100)
            except KeyboardInterrupt:
                print("interrupted", flush=True)
            run_local(job_sleep, 2, ({str(second)!r},), timeout_s=100)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = _wait_for_pids(first, 3)
        assert len(pids) == 3, "ranks did not start"
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline().strip() == "interrupted"
        assert _wait_gone(pids), "a rank outlived the interrupted call"
        pids = _wait_for_pids(second, 2)
        assert len(pids) == 2, "second job did not start"
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _wait_gone(pids, within_s=10), "a rank outlived its killed caller"
