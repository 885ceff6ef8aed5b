"""A real client with no code change: FairScale's MoE layer under torchrun on ``pathweave``.

``examples/torchrun_moe_backend.py`` runs FairScale's expert-parallel
``MOELayer`` (which calls ``torch.distributed.all_to_all_single`` itself)
for a few training steps, once on gloo and once on the ``pathweave`` backend
with multi-path forced on a 2 x 2 fabric; outputs, losses and trained
weights must be bitwise the same, and some bytes must have gone through a
forwarding rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pathweave.fabric.paths import ROLES

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


def test_fairscale_moe_on_pathweave_is_bitwise_gloo(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PATHWEAVE_MULTIPATH="on",
               PATHWEAVE_FABRIC="cluster:nodes=2,gpus_per_node=2,node_kind=nvlink-mesh")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH"))
                                        if p)
    gloo = _torchrun("gloo", tmp_path / "gloo", env)
    assert sorted(r["rank"] for r in gloo) == [0, 1, 2, 3]
    pw = _torchrun("pathweave", tmp_path / "pw", env, "--compare", str(tmp_path / "gloo"))
    assert sorted(r["rank"] for r in pw) == [0, 1, 2, 3]
    for r in pw:
        assert r["backend"] == "pathweave"
        assert r["differs"] == [], r
        s = r["stats"]
        assert s["calls"] > 0 and s["multipath_calls"] == s["calls"]
        assert sum(s["bytes_per_path_kind"].get(k, 0) for k in ROLES if k != "direct") > 0
