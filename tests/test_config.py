"""pathweave.runtime.Config: one checked settings object, from the environment in one place."""

from __future__ import annotations

import dataclasses
import json

import pytest

import pathweave as pw
from pathweave.errors import FabricError, PlanError
from pathweave.plan import DEFAULT_POLICY
from pathweave.runtime import Config, Orchestrator
from pathweave.runtime.config import ADAPT_ENV, FABRIC_ENV, MODEL_ENV, MULTIPATH_ENV, POLICY_ENV


@pytest.mark.parametrize("field, value, message", [
    ("chunk_bytes", 3, "chunk_bytes must be >= 4096, got 3"),
    ("window", 1, "window must be >= 2, got 1"),
    ("window", 65, "window must be <= 64"),
    ("hysteresis", 1.0, "hysteresis must be < 1, got 1.0"),
    ("enabled", "sometimes", "enabled must be 'auto', True or False, got 'sometimes'"),
    ("timeout_s", 0, "timeout_s"),
    ("min_gain", -1.0, "min_gain"),
    ("cache_size", 0, "cache_size"),
    ("adapt", "maybe", "adapt must be True, False, 'auto' or None, got 'maybe'"),
    ("min_split_bytes", -5, "min_split_bytes"),
])
def test_a_bad_setting_is_refused_naming_it_and_its_value(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Config(**{field: value})
    # The orchestrator takes the same settings and refuses them the same way.
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Orchestrator(**{field: value})


def test_policy_and_fabric_are_checked_when_the_config_is_made():
    with pytest.raises(PlanError, match="unknown policy 'fastest'"):
        Config(policy="fastest")
    with pytest.raises(PlanError, match="refine"):
        Config(policy="mwu", policy_options={"refine": -1})
    with pytest.raises(PlanError, match="unknown option"):
        Config(policy="static", policy_options={"fraction": 0.5})
    with pytest.raises(FabricError):
        Config(fabric="nosuchfabric")
    with pytest.raises(TypeError, match="model must be"):
        Config(model="fast")
    assert Config().policy == DEFAULT_POLICY
    assert Config(fabric="h100-2x4").fabric.num_ranks == 8


def test_the_environment_is_read_in_one_place_with_overrides_on_top(tmp_path):
    from pathweave.sim.modelfile import save_model

    path = tmp_path / "model.json"
    save_model(pw.sim.SimModel(setup_s=7e-6), path)
    env = {FABRIC_ENV: "h100-2x4", POLICY_ENV: "hscore", MULTIPATH_ENV: "on",
           ADAPT_ENV: "0", MODEL_ENV: str(path)}
    cfg = Config.from_env(env)
    assert (cfg.fabric.name, cfg.policy, cfg.enabled, cfg.adapt) == ("h100-2x4", "hscore",
                                                                      True, False)
    assert cfg.model.setup_s == 7e-6
    assert Config.from_env(env, policy="static", window=8).policy == "static"
    # Unset variables: the same defaults as Config() (adapt's "auto" made explicit).
    assert Config.from_env({}) == Config(adapt="auto")


@pytest.mark.parametrize("env, message", [
    ({MULTIPATH_ENV: "always"}, "PATHWEAVE_MULTIPATH='always' is not one of auto, on, off"),
    ({ADAPT_ENV: "sometimes"}, "PATHWEAVE_ADAPT='sometimes' is not one of"),
    ({POLICY_ENV: "fastest"}, "PATHWEAVE_POLICY='fastest': unknown policy 'fastest'"),
    ({FABRIC_ENV: "nosuchfabric"}, "PATHWEAVE_FABRIC='nosuchfabric'"),
])
def test_a_bad_variable_is_named_with_its_value(env, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        Config.from_env(env)


def test_orchestrator_defaults_come_from_the_environment_only_where_left_unset():
    env = {ADAPT_ENV: "1"}
    assert Config().with_env_defaults(env).adapt is True
    assert Config(adapt=False).with_env_defaults(env).adapt is False
    assert Config().with_env_defaults({}).adapt == "auto"
    assert Config().with_env_defaults({}).model is None  # SimModel() applies


def test_data_round_trip_keeps_every_setting():
    cfg = Config(fabric="h100-2x4", policy="mwu", chunk_bytes=1 << 19, window=8,
                 hysteresis=0.2, enabled=True, timeout_s=60.0, min_gain=1.5, cache_size=8,
                 adapt=False, model=pw.sim.SimModel(setup_s=5e-6),
                 policy_options={"refine": 2})
    data = json.loads(json.dumps(cfg.to_dict()))  # through JSON, as to a rank worker
    back = Config.from_dict(data)
    for f in dataclasses.fields(Config):
        if f.name == "fabric":
            assert pw.fabric.to_dict(back.fabric) == pw.fabric.to_dict(cfg.fabric)
        else:
            assert getattr(back, f.name) == getattr(cfg, f.name), f.name
    assert back.fingerprint() == cfg.fingerprint()
    with pytest.raises(ValueError, match="unknown config fields"):
        Config.from_dict({"windw": 4})


def test_fingerprint_moves_with_every_setting():
    base = Config(fabric="h100-2x4")
    changes = {"policy": "static", "min_split_bytes": 1, "chunk_bytes": 8192, "window": 5,
               "hysteresis": 0.3, "enabled": False, "timeout_s": 9.0, "min_gain": 2.0,
               "cache_size": 3, "adapt": True, "model": pw.sim.SimModel(setup_s=1e-6),
               "fabric": "dgx-h100"}
    assert {f.name for f in dataclasses.fields(Config)} - set(changes) == {"policy_options"}
    prints = {base.replace(**{k: v}).fingerprint() for k, v in changes.items()}
    assert len(prints) == len(changes) and base.fingerprint() not in prints
    assert base.replace(policy="mwu", policy_options={"refine": 2}).fingerprint() != \
        base.replace(policy="mwu").fingerprint()


def test_every_config_field_is_an_orchestrator_setting_and_none_replaces_a_method():
    from pathweave.runtime.orchestrator import _with_settings

    orch = Orchestrator(config=Config(fabric="h100-2x4", window=8))
    for f in dataclasses.fields(Config):
        assert getattr(orch, f.name) == getattr(orch.config, f.name), f.name

    class Clash:
        def window(self) -> int:
            return 0

    with pytest.raises(TypeError, match=r"Clash\.window is defined"):
        _with_settings(Clash)


def test_orchestrator_takes_a_config_whole_or_its_settings_not_both():
    cfg = Config(fabric="h100-2x4", chunk_bytes=1 << 19, window=8, enabled=True, adapt=False)
    orch = Orchestrator(config=cfg)
    same = Orchestrator("h100-2x4", chunk_bytes=1 << 19, window=8, enabled=True, adapt=False)
    assert orch.config == same.config
    assert (orch.chunk_bytes, orch.window, orch.enabled, orch.adapt) == (1 << 19, 8, True, False)
    with pytest.raises(TypeError, match="either as config= or as arguments"):
        Orchestrator(config=cfg, window=6)
    with pytest.raises(TypeError, match="config must be"):
        Orchestrator(config={"window": 4})
