"""A real client with no code change: FairScale's MoE layer under torchrun on ``pathweave``.

``examples/torchrun_moe_backend.py`` runs FairScale's expert-parallel
``MOELayer`` (which calls ``torch.distributed.all_to_all_single`` itself)
for a few training steps on the ``pathweave`` backend under torchrun, with
multi-path forced on a 2 x 2 fabric, and compares with the same script's run
on gloo: outputs, losses and trained weights must be bitwise the same, and
some bytes must have gone through a forwarding rank.

The gloo reference runs the example's ``main`` on 4 ranks forked by
``run_local`` (torch and pathweave already imported) rather than under a
second torchrun: that job's 5 fresh Pythons, each importing torch and
FairScale, were about a third of this test's CPU time; the client under test
still starts the torchrun way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pathweave.fabric.paths import ROLES
from pathweave.runtime.launch import run_local

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "torchrun_moe_backend.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _torchrun(backend: str, out: Path, env: dict[str, str], *extra: str) -> list[dict]:
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "4", str(SCRIPT),
           "--backend", backend, "--out", str(out), *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return [json.loads(f.read_text()) for f in sorted(out.glob("report*.json"))]


def _gloo_reference(rank: int, world_size: int, out: str) -> int:
    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))
    import torchrun_moe_backend as example

    return example.main(["--backend", "gloo", "--out", out])


def test_fairscale_moe_on_pathweave_is_bitwise_gloo(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PATHWEAVE_MULTIPATH="on",
               PATHWEAVE_FABRIC="cluster:nodes=2,gpus_per_node=2,node_kind=nvlink-mesh")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH"))
                                        if p)
    assert run_local(_gloo_reference, 4, (str(tmp_path / "gloo"),), timeout_s=300) == [0] * 4
    gloo = [json.loads(f.read_text()) for f in sorted((tmp_path / "gloo").glob("report*.json"))]
    assert sorted(r["rank"] for r in gloo) == [0, 1, 2, 3]
    assert {r["backend"] for r in gloo} == {"gloo"}
    pw = _torchrun("pathweave", tmp_path / "pw", env, "--compare", str(tmp_path / "gloo"))
    assert sorted(r["rank"] for r in pw) == [0, 1, 2, 3]
    for r in pw:
        assert r["backend"] == "pathweave"
        assert r["differs"] == [], r
        s = r["stats"]
        assert s["calls"] > 0 and s["multipath_calls"] == s["calls"]
        assert sum(s["bytes_per_path_kind"].get(k, 0) for k in ROLES if k != "direct") > 0
