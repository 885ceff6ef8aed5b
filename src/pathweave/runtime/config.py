"""One configuration object for the data plane: :class:`Config`.

Every setting of an :class:`~pathweave.runtime.Orchestrator` (the fabric, the
policy and its options, chunk, window, threshold, hysteresis, when to use
several paths, adaptation, the time limit, the time model) lives in one
frozen :class:`Config`, checked once when it is made, read from the
environment in one place (:meth:`Config.from_env`), fingerprinted as one
object (:meth:`Config.fingerprint`) and carried whole: the registered
``pathweave`` backend builds its orchestrators from ``Config.from_env()``,
and :meth:`Config.to_dict` / :meth:`Config.from_dict` carry it to processes
(the emulator's rank workers) as JSON.

Environment variables (all optional; a bad value raises naming the variable):

=====================  ====================================================
``PATHWEAVE_FABRIC``   a preset spec or a fabric file (``fabric``)
``PATHWEAVE_POLICY``   a registered policy name (``policy``)
``PATHWEAVE_MULTIPATH`` ``auto``, ``on`` or ``off`` (``enabled``)
``PATHWEAVE_ADAPT``    ``auto``, ``1``/``on``..., ``0``/``off``... (``adapt``)
``PATHWEAVE_MODEL``    a model file from ``pathweave calibrate`` (``model``)
=====================  ====================================================

Examples
--------
>>> from pathweave.runtime.config import Config
>>> cfg = Config(fabric="h100-2x4", chunk_bytes=1 << 19)
>>> cfg.policy, cfg.chunk_bytes, cfg.window
('mintime', 524288, 4)
>>> cfg.replace(window=8).window
8
>>> Config(window=1)
Traceback (most recent call last):
...
ValueError: window must be >= 2, got 1
>>> Config.from_env({"PATHWEAVE_MULTIPATH": "on", "PATHWEAVE_POLICY": "hscore"}).enabled
True
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pathweave.fabric import Fabric, resolve
from pathweave.runtime import _validate as V
from pathweave.sim.modelfile import MODEL_ENV

__all__ = ["ADAPT_ENV", "FABRIC_ENV", "MAX_WINDOW", "MIN_CHUNK_BYTES", "MODEL_ENV",
           "MULTIPATH_ENV", "POLICY_ENV", "Config"]

#: Environment variable naming the fabric (a preset spec or a fabric file).
FABRIC_ENV = "PATHWEAVE_FABRIC"
#: Environment variable naming the planning policy.
POLICY_ENV = "PATHWEAVE_POLICY"
#: Environment variable choosing when several paths are used (``enabled``).
MULTIPATH_ENV = "PATHWEAVE_MULTIPATH"
#: Environment variable turning live adaptation on or off (``adapt``).
ADAPT_ENV = "PATHWEAVE_ADAPT"

#: Smallest forwarding chunk: smaller ones cost more in per-message overhead
#: than they gain in pipelining.
MIN_CHUNK_BYTES = 4096
#: Most staging slots per forwarded stream (each holds one chunk at a relay).
MAX_WINDOW = 64

_MULTIPATH = {"auto": "auto", "on": True, "off": False}
_ADAPT_WORDS = {"auto": "auto", "1": True, "true": True, "yes": True, "on": True,
                "0": False, "false": False, "no": False, "off": False}


@dataclass(frozen=True)
class Config:
    """Every setting of the data plane, checked once (see the module docstring).

    Parameters
    ----------
    fabric
        A :class:`~pathweave.fabric.Fabric`, a preset spec or a file; None:
        found at a group's first call (:func:`~pathweave.runtime.orchestrator.default_fabric`).
    policy
        A registered policy name, or a callable ``(fabric, demand) -> Plan``;
        None: :data:`pathweave.plan.DEFAULT_POLICY`.
    min_split_bytes, chunk_bytes, window, hysteresis, enabled, timeout_s, min_gain, cache_size
        As :class:`~pathweave.runtime.Orchestrator` documents them.
    adapt
        ``True``, ``False`` or ``"auto"``; None: ``PATHWEAVE_ADAPT`` when the
        orchestrator is made (:meth:`with_env_defaults`), else ``"auto"``.
    model
        A :class:`~pathweave.sim.SimModel`; None: the ``PATHWEAVE_MODEL``
        file when the orchestrator is made, else ``SimModel()``.
    policy_options
        Options of a registered policy (checked against it here).
    """

    fabric: Fabric | str | None = None
    policy: str | Callable[..., Any] | None = None
    min_split_bytes: int = 1 << 20
    chunk_bytes: int = 1 << 20
    window: int = 4
    hysteresis: float = 0.1
    enabled: bool | Literal["auto"] = "auto"
    timeout_s: float = 300.0
    min_gain: float = 1.2
    cache_size: int = 64
    adapt: bool | Literal["auto"] | None = None
    model: Any = None
    policy_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: normalised values are set once, here
        if self.fabric is not None:
            put(self, "fabric", resolve(self.fabric))
        put(self, "policy", _checked_policy(self.policy, dict(self.policy_options)))
        put(self, "policy_options", dict(self.policy_options))
        put(self, "min_split_bytes", V.positive_int("min_split_bytes", self.min_split_bytes, 0))
        put(self, "chunk_bytes", V.positive_int("chunk_bytes", self.chunk_bytes,
                                                MIN_CHUNK_BYTES))
        put(self, "window", V.positive_int("window", self.window, 2))
        if self.window > MAX_WINDOW:
            raise ValueError(f"window must be <= {MAX_WINDOW} (staging slots per forwarded "
                             f"stream), got {self.window}")
        put(self, "hysteresis", V.nonnegative_float("hysteresis", self.hysteresis))
        if self.hysteresis >= 1:
            raise ValueError(f"hysteresis must be < 1, got {self.hysteresis}")
        if self.enabled not in ("auto", True, False):
            raise ValueError(f"enabled must be 'auto', True or False, got {self.enabled!r}")
        put(self, "timeout_s", V.nonnegative_float("timeout_s", self.timeout_s, positive=True))
        put(self, "min_gain", V.nonnegative_float("min_gain", self.min_gain, positive=True))
        put(self, "cache_size", V.positive_int("cache_size", self.cache_size))
        if not (self.adapt is None or self.adapt is True or self.adapt is False
                or self.adapt == "auto"):
            raise ValueError(f"adapt must be True, False, 'auto' or None, got {self.adapt!r}")
        from pathweave.plan.model import SimModel

        if self.model is not None and not isinstance(self.model, SimModel):
            raise TypeError(f"model must be a pathweave.sim.SimModel or None, got "
                            f"{type(self.model).__name__}")

    # ------------------------------------------------------------ building
    def replace(self, **changes: Any) -> Config:
        """A copy with ``changes`` (checked as a new config)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
        """The config the environment describes, with ``overrides`` on top.

        The one place the data plane reads its environment variables (see
        the module docstring). A bad value raises naming the variable.

        >>> Config.from_env({"PATHWEAVE_ADAPT": "off"}, window=8).adapt
        False
        >>> Config.from_env({"PATHWEAVE_POLICY": "fastest"})
        Traceback (most recent call last):
        ...
        pathweave.errors.PlanError: PATHWEAVE_POLICY='fastest': unknown policy 'fastest'; ...
        """
        from pathweave._check import env_choice

        env = os.environ if environ is None else environ
        found: dict[str, Any] = {
            "enabled": env_choice(env, MULTIPATH_ENV, _MULTIPATH, "auto"),
            "adapt": env_choice(env, ADAPT_ENV, _ADAPT_WORDS, "auto",
                                choices="auto, 1/true/yes/on, 0/false/no/off"),
        }
        for var, key in ((POLICY_ENV, "policy"), (FABRIC_ENV, "fabric")):
            value = env.get(var, "").strip()
            if value:
                try:  # checked here to name the variable; the fabric built once
                    found[key] = (_checked_policy(value, {}) if key == "policy"
                                  else resolve(value))
                except ValueError as exc:
                    raise type(exc)(f"{var}={value!r}: {exc}") from None
        path = env.get(MODEL_ENV, "").strip()
        if path:
            from pathweave.sim.modelfile import load_model

            found["model"] = load_model(path)
        return cls(**{**found, **overrides})

    def with_env_defaults(self, environ: Mapping[str, str] | None = None) -> Config:
        """``adapt`` and ``model`` left None filled from ``PATHWEAVE_ADAPT`` and
        ``PATHWEAVE_MODEL`` (as an orchestrator does when it is made); ``model``
        stays None where no file is named (``SimModel()`` applies).

        >>> Config().with_env_defaults({"PATHWEAVE_ADAPT": "1"}).adapt
        True
        """
        if self.adapt is not None and self.model is not None:
            return self
        env = os.environ if environ is None else environ
        found = Config.from_env({k: env[k] for k in (ADAPT_ENV, MODEL_ENV) if k in env})
        return self.replace(adapt=found.adapt if self.adapt is None else self.adapt,
                            model=found.model if self.model is None else self.model)

    # ------------------------------------------------------------ identity
    def to_dict(self) -> dict[str, Any]:
        """The config as JSON-able data (:meth:`from_dict` reads it back).

        >>> Config.from_dict(Config(fabric="h100-2x4", window=8).to_dict()).window
        8
        """
        if callable(self.policy):
            raise TypeError("a config with a policy callable cannot be written as data")
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if isinstance(self.fabric, Fabric):
            from pathweave.fabric import to_dict

            out["fabric"] = to_dict(self.fabric)
        if self.model is not None:
            out["model"] = dataclasses.asdict(self.model)
        out["policy_options"] = dict(self.policy_options)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Config:
        """A config from :meth:`to_dict`'s data (checked as any other)."""
        d = dict(data)
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown config fields {unknown}")
        if isinstance(d.get("fabric"), Mapping):
            from pathweave.fabric import from_dict

            d["fabric"] = from_dict(d["fabric"])
        if isinstance(d.get("model"), Mapping):
            from pathweave.plan.model import SimModel

            d["model"] = SimModel(**d["model"])
        return cls(**d)

    def fingerprint(self) -> str:
        """A short hash of every setting: equal configs, equal prints, in any process.

        >>> Config(window=4).fingerprint() == Config().fingerprint()
        True
        >>> Config(window=8).fingerprint() == Config().fingerprint()
        False
        """
        data = self.to_dict() if not callable(self.policy) else {
            **self.replace(policy=None).to_dict(), "policy": _callable_name(self.policy)}
        text = json.dumps(data, sort_keys=True, default=str)
        return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _checked_policy(policy: Any, options: dict[str, Any]) -> Any:
    """The policy (None: the default), with ``options`` checked against it."""
    if policy is None:
        from pathweave.plan import DEFAULT_POLICY

        policy = DEFAULT_POLICY
    if not (callable(policy) or isinstance(policy, str)):
        raise TypeError(f"policy must be a policy name or a callable, got {policy!r}")
    if isinstance(policy, str):
        from pathweave.plan.registry import check_options

        check_options(policy, options)  # unknown names and options fail here
        return policy
    extra = sorted(set(options) - {"kinds", "max_hops"})
    if extra:
        raise TypeError(f"policy options ({', '.join(extra)}) apply to registered policies "
                        "only, not to a policy callable")
    return policy


def _callable_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"

