"""The emulator removes only what it recorded making (needs root and iproute2).

Foreign namespaces with emulator-like names survive every kind of cleanup;
an interrupted ``up`` (Ctrl-C, SIGTERM) rolls back; a run killed with
SIGKILL leaves a ledger from which the next run with the same prefix cleans
up (namespaces, rank processes, temporary directories) and then succeeds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pathweave.cli.main import app

pytestmark = [
    pytest.mark.emulator,  # brings it up: scripts/test.sh runs these one at a time
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
        reason="the emulator needs root and iproute2 (ip, tc); CI runs as root",
    ),
]

FABRIC = "cluster:nodes=2,gpus_per_node=2,node_kind=nvlink-mesh"
runner = CliRunner()


def netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.split()}


@pytest.fixture
def prefix():
    """A prefix no other test or engineer uses; everything under it is removed afterwards."""
    p = "pw" + uuid.uuid4().hex[:4]
    yield p
    for ns in netns():
        if ns.startswith(f"{p}-"):
            subprocess.run(["ip", "netns", "delete", ns], check=False)
    from pathweave.emulate.emulator import _state_path

    _state_path(p).unlink(missing_ok=True)


@pytest.fixture
def foreign(prefix):
    """A namespace someone else made whose name matches the prefix's pattern."""
    name = f"{prefix}-r9"
    subprocess.run(["ip", "netns", "add", name], check=True)
    yield name
    subprocess.run(["ip", "netns", "delete", name], check=False)


def test_foreign_namespace_survives_up_down_and_every_cleanup(prefix, foreign):
    from pathweave.emulate import Emulator, cleanup, status

    emu = Emulator(FABRIC, 1e-4, prefix=prefix)
    with emu:
        assert set(emu.layout.namespaces) <= netns()
        recs = {r["ns"]: r for r in status(prefix)}
        assert recs[foreign]["recorded"] is False and recs[f"{prefix}-r0"]["recorded"]
    assert foreign in netns()
    assert not set(emu.layout.namespaces) & netns()
    # (--all is not exercised: it would take down other live emulators on this machine.)
    assert cleanup(prefix) == []
    assert foreign in netns()
    # `down` without a prefix lists and removes nothing; with one it removes nothing foreign.
    res = runner.invoke(app, ["emulate", "down"])
    assert res.exit_code == 2 and "--all" in res.output and foreign in res.output
    res = runner.invoke(app, ["emulate", "down", "--prefix", prefix])
    assert res.exit_code == 0, res.output
    assert "removed 0 namespaces" in res.output and foreign in res.output
    assert foreign in netns()


def test_up_refuses_an_unrecorded_namespace_of_its_plan(prefix):
    from pathweave.emulate import Emulator, EmulatorError

    taken = f"{prefix}-r1"
    subprocess.run(["ip", "netns", "add", taken], check=True)
    with pytest.raises(EmulatorError, match=f"{taken} exist but pathweave did not record"):
        Emulator(FABRIC, 1e-4, prefix=prefix).up()
    assert taken in netns()
    assert not any(n.startswith(f"{prefix}-") and n != taken for n in netns())


@pytest.mark.parametrize("interrupt", ["sigint", "sigterm"])
def test_interrupted_up_rolls_back(prefix, monkeypatch, interrupt):
    from pathweave.emulate import Emulator, _ip
    from pathweave.emulate.emulator import _state_path

    real_run = _ip.run
    calls = {"n": 0}

    def run(argv, **kw):
        calls["n"] += 1
        if calls["n"] == 12:  # some namespaces made, the links not yet
            if interrupt == "sigint":
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)
        return real_run(argv, **kw)

    monkeypatch.setattr(_ip, "run", run)
    emu = Emulator(FABRIC, 1e-4, prefix=prefix, persistent=True)
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        emu.up()
    monkeypatch.setattr(_ip, "run", real_run)
    assert not any(n.startswith(f"{prefix}-") for n in netns())
    assert not _state_path(prefix).exists()
    # Nothing blocks the next `up`.
    with Emulator(FABRIC, 1e-4, prefix=prefix):
        pass


def _ledger(prefix: str) -> dict:
    from pathweave.emulate.emulator import _state_path

    try:
        return json.loads(_state_path(prefix).read_text())
    except (OSError, ValueError):
        return {}


def test_run_killed_with_sigkill_is_cleaned_up_by_the_next_run(prefix, foreign, tmp_path):
    args = ["emulate", "run", "--fabric", FABRIC, "--prefix", prefix, "--bytes", "256K",
            "--repeat", "1", "--policy", "static", "--chunk", "64K"]
    code = "from pathweave.cli.main import app; app()"
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(_ledger(prefix).get("procs", [])) < 4:
        time.sleep(0.05)
    ledger = _ledger(prefix)
    assert len(ledger.get("procs", [])) == 4, "the run never started its ranks"
    proc.kill()  # SIGKILL mid-run: no teardown runs
    proc.wait()
    assert {f"{prefix}-r0", foreign} <= netns()
    leftovers = [Path(d) for d in ledger["tmp_dirs"]]
    assert leftovers and all(d.exists() for d in leftovers)

    out = tmp_path / "run.json"
    res = runner.invoke(app, [*args, "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["policies"][0]["verified"] is True
    assert not any(d.exists() for d in leftovers)
    for pid, _ in ledger["procs"]:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(
            f"/proc/{pid}/status").read_text().lower()
    assert not any(n.startswith(f"{prefix}-") for n in netns() - {foreign})
    assert foreign in netns()
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob(f"pathweave-emu-{prefix}-*"))
