"""Calibration: the fit, model files, PATHWEAVE_MODEL, NCCL_TOPO_FILE, topo show --save."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from typer.testing import CliRunner

import pathweave as pw
import pathweave.distributed as pwd
from pathweave.calibrate import FEATURES, features, fit_costs, fitted_model, probes
from pathweave.cli.main import app
from pathweave.errors import FabricError, InputError
from pathweave.fabric import from_nccl_xml
from pathweave.runtime import orchestrator as orch_mod
from pathweave.sim import SimModel
from pathweave.sim.modelfile import MODEL_ENV, load_model, save_model

FIXTURES = Path("/work/shared/fixtures/topology")
AZURE = FIXTURES / "azure_ndv5_h100_nccl-topo.xml"


def test_fit_recovers_known_costs_from_noisy_timings():
    # Hand-made timings: 300 us a call, 20 us a round, 150 us a relay, 5 GB/s
    # direct, 2 GB/s relayed; every probe of a 3-rank run, with the rounds of
    # the schedule it runs at the Orchestrator's default window (4).
    from pathweave.calibrate import _probe_schedule

    truth = np.array([300e-6, 20e-6, 150e-6, 1 / 5e9, 1 / 2e9])
    rng = np.random.default_rng(7)
    rows = []
    for p in probes(3):
        rounds = _probe_schedule(p, 0, 3, pw.Orchestrator().window).num_rounds
        rows.append(features(rounds, p.relays, p.nbytes))
    X = np.array(rows)
    t = X @ truth * (1 + rng.normal(0, 0.02, len(rows)))  # 2 % noise
    fit = fit_costs(X, t)
    got = [fit.call_s, fit.round_s, fit.relay_s, 1 / fit.direct_Bps, 1 / fit.relayed_Bps]
    assert np.allclose(got, truth, rtol=0.15), dict(zip(FEATURES, got, strict=True))
    assert fit.rms_residual < 0.05
    assert np.allclose(fit.residual, (X @ np.array(got) - t) / t)


def test_fit_without_relayed_probes_leaves_relays_unmeasured():
    X = np.array([features(1, 0, 1024), features(64, 0, 1 << 18), features(2, 0, 16 << 20)])
    fit = fit_costs(X, X @ [1e-3, 5e-5, 0, 1e-9, 0])
    assert fit.relayed_Bps == float("inf") and fit.relay_s == 0
    m = fitted_model(fit, pw.fabric.preset("dgx-h100", nodes=1, gpus_per_node=2), relayed=False)
    # One node of NVSwitch: the direct path's slowest link is NVLink (450 GB/s
    # on dgx-h100), so 1 GB/s measured is an injection efficiency of 1/450.
    fab = pw.fabric.preset("dgx-h100", nodes=1, gpus_per_node=2)
    nv = fab.capacity_Bps[fab.link_kind == pw.fabric.LinkKind.NVLINK].min()
    assert m.setup_s == pytest.approx(1e-3)
    assert m.nvlink_inject_efficiency == pytest.approx(1e9 / nv)
    assert m.relay_setup_s == SimModel().relay_setup_s
    with pytest.raises(ValueError, match="> 0"):
        fit_costs(X, np.array([1.0, 0.0, 1.0]))


def test_fitted_model_carries_the_round_cost_in_the_data_planes_unit(tmp_path):
    X = np.array([features(1, 0, 1024), features(64, 0, 1 << 18), features(2, 0, 16 << 20)])
    fit = fit_costs(X, X @ [1e-3, 5e-5, 0, 1e-9, 0])
    fab = pw.fabric.preset("dgx-h100", nodes=1, gpus_per_node=2)
    m = fitted_model(fit, fab, relayed=False, chunk_bytes=1 << 20, window=8)
    assert m.round_s == pytest.approx(5e-5) and (m.chunk_bytes, m.window) == (1 << 20, 8)
    # Written into the model, not only the calibration block, and read back.
    p = save_model(m, tmp_path / "m.json", {"round_s": fit.round_s})
    assert json.loads(p.read_text())["model"]["round_s"] == pytest.approx(5e-5)
    assert load_model(p) == m
    # A file written before round_s existed loads with none (NIMBLE's runtime).
    doc = {"format": "pathweave-model", "version": 1, "model": {"setup_s": 4e-4}}
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old = load_model(tmp_path / "old.json")
    assert old == SimModel(setup_s=4e-4) and old.round_s == 0.0


def test_model_file_round_trip_and_errors(tmp_path):
    m = SimModel(setup_s=4e-4, relay_setup_s=1e-4, relay_efficiency=0.5, hop_latency_s=None)
    p = save_model(m, tmp_path / "m.json", {"note": "hand-made"})
    assert load_model(p) == m
    doc = json.loads(p.read_text())

    def bad(change, match):
        d = json.loads(json.dumps(doc))
        change(d)
        q = tmp_path / "bad.json"
        q.write_text(json.dumps(d))
        with pytest.raises(InputError, match=match):
            load_model(q)

    bad(lambda d: d["model"].update(relay_efficency=0.5), "unknown field model.relay_efficency")
    bad(lambda d: d["model"].update(relay_efficiency=1.5), r"relay_efficiency = 1.5")
    bad(lambda d: d["model"].update(setup_s="fast"), r"model.setup_s = 'fast' is not a number")
    bad(lambda d: d["model"].update(message_fill=1), r"model.message_fill = 1 is not true or false")
    bad(lambda d: d["model"].update(setup_s=True), r"model.setup_s = True")
    bad(lambda d: d["model"].update(round_s=-1e-5), r"round_s = -1e-05")
    bad(lambda d: d["model"].update(window=1), r"window = 1")
    bad(lambda d: d.update(format="pathweave-fabric"), "not a pathweave model file")
    bad(lambda d: d.update(version=2), "version 2")
    (tmp_path / "x.json").write_text("{")
    with pytest.raises(InputError, match="not JSON"):
        load_model(tmp_path / "x.json")
    with pytest.raises(InputError, match="cannot read"):
        load_model(tmp_path / "missing.json")


@pytest.fixture
def fake_group():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    yield
    dist.destroy_process_group()


def _decision(caplog) -> str:
    rows = np.zeros((8, 8), dtype=np.int64)
    rows[0, 1] = 64 << 20  # one hot pair: multi-path pays on the default model
    send, recv = rows[0].tolist(), rows[:, 0].tolist()
    inp = torch.zeros(sum(send), dtype=torch.uint8)
    out = torch.zeros(sum(recv), dtype=torch.uint8)
    orch = pw.Orchestrator(fabric="h100-2x4", adapt=False)
    digests = np.full(8, orch.config_digest(), dtype=np.int64)
    caplog.clear()
    pwd.all_to_all_single(out, inp, recv, send, orchestrator=orch, split_matrix=rows,
                          config_digests=digests)
    return next(m for m in (r.getMessage() for r in caplog.records)
                if m.startswith("all_to_all_single: "))


def test_orchestrator_decides_with_the_model_file(fake_group, caplog, monkeypatch, tmp_path):
    caplog.set_level(logging.INFO, logger="pathweave")
    monkeypatch.delenv(MODEL_ENV, raising=False)
    assert pw.Orchestrator().model is None
    assert "multi-path plan" in _decision(caplog)
    # A relay costing a second: every relayed fragment starts after 1 s, so a
    # plan using any relay is predicted >= 1 s, one using none no faster than
    # static: "auto" must fall back to torch's collective.
    p = save_model(SimModel(relay_setup_s=1.0), tmp_path / "slow-relay.json")
    monkeypatch.setenv(MODEL_ENV, str(p))
    assert pw.Orchestrator().model == SimModel(relay_setup_s=1.0)
    why = _decision(caplog)
    assert "torch's collective (no gain" in why, why
    monkeypatch.setenv(MODEL_ENV, str(tmp_path / "missing.json"))
    with pytest.raises(InputError, match=r"missing\.json"):
        pw.Orchestrator()


def test_a_per_round_cost_is_pathweaves_own_not_the_fallbacks(fake_group, caplog,
                                                              monkeypatch, tmp_path):
    """The fallback is torch's collective, which pays none of pathweave's per-round host
    cost: a round costing half a second makes every multi-path plan lose to it. The
    rounds are counted at the orchestrator's own chunk and window."""
    caplog.set_level(logging.INFO, logger="pathweave")
    p = save_model(SimModel(round_s=0.5, chunk_bytes=1 << 18, window=2), tmp_path / "r.json")
    monkeypatch.setenv(MODEL_ENV, str(p))
    orch = pw.Orchestrator(chunk_bytes=1 << 20, window=8)
    assert (orch.model.round_s, orch.model.chunk_bytes, orch.model.window) == (0.5, 1 << 20, 8)
    why = _decision(caplog)
    assert "torch's collective (no gain" in why, why
    monkeypatch.setenv(MODEL_ENV, str(save_model(SimModel(), tmp_path / "zero.json")))
    assert "multi-path plan" in _decision(caplog)


def test_nccl_topo_file_is_the_default_fabric(monkeypatch):
    monkeypatch.delenv("PATHWEAVE_FABRIC", raising=False)
    monkeypatch.setenv("NCCL_TOPO_FILE", str(AZURE))
    assert orch_mod.default_fabric(8, hosts=[3] * 8) == from_nccl_xml(AZURE, nodes=1)
    assert orch_mod.default_fabric(16, hosts=[3] * 8 + [4] * 8) == from_nccl_xml(AZURE, nodes=2)
    with pytest.raises(FabricError, match=r"NCCL_TOPO_FILE=.* has 8 ranks but the process "
                       r"group has 4"):
        orch_mod.default_fabric(4, hosts=[3] * 4)
    monkeypatch.setenv("PATHWEAVE_FABRIC", "h100-2x4")  # a named fabric wins
    assert orch_mod.default_fabric(8, hosts=[3] * 8).name == "h100-2x4"


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_topo_show_save_round_trip(tmp_path, suffix):
    out = tmp_path / f"azure{suffix}"
    res = CliRunner().invoke(app, ["topo", "show", str(AZURE), "--save", str(out)])
    assert res.exit_code == 0, res.output
    assert pw.fabric.load(out) == from_nccl_xml(AZURE)
    res = CliRunner().invoke(app, ["topo", "show", "h100-2x4", "--save", str(tmp_path / "x.txt")])
    assert res.exit_code == 2 and "unknown fabric file suffix '.txt'" in res.output
