"""Model files: a :class:`~pathweave.sim.SimModel` on disk, and ``PATHWEAVE_MODEL``.

``pathweave calibrate`` writes one (JSON)::

    {"format": "pathweave-model", "version": 1,
     "model": {"setup_s": 0.00041, "relay_setup_s": 0.00012, "round_s": 4.8e-05, ...},
     "calibration": {...}}

``model`` holds :class:`SimModel` fields (any subset; the rest keep their
defaults, so a file written before a field existed, e.g. ``round_s``, loads
with its default: 0); ``calibration`` is free-form (what was measured, the
fit, its residuals) and is not read back. :func:`load_model` is the one reader; the
file ``PATHWEAVE_MODEL`` names is read by :meth:`pathweave.runtime.Config.from_env`.

Examples
--------
>>> import tempfile, pathlib
>>> from pathweave.sim import SimModel
>>> with tempfile.TemporaryDirectory() as tmp:
...     p = save_model(SimModel(setup_s=4e-4), pathlib.Path(tmp) / "m.json")
...     load_model(p).setup_s
0.0004
"""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from pathweave.errors import InputError
from pathweave.sim.model import SimModel

__all__ = ["MODEL_ENV", "load_model", "save_model"]

#: Environment variable naming a model file the Orchestrator plans and decides with.
MODEL_ENV = "PATHWEAVE_MODEL"
_FORMAT = "pathweave-model"
_VERSION = 1


def save_model(model: SimModel, path: str | os.PathLike[str],
               calibration: dict[str, Any] | None = None) -> Path:
    """Write ``model`` (and what it was fitted from) to the JSON file ``path`` atomically."""
    from pathweave._files import atomic_write

    doc = {"format": _FORMAT, "version": _VERSION, "model": model.to_dict(),
           "calibration": calibration or {}}
    return atomic_write(path, (json.dumps(doc, indent=2) + "\n").encode())


def load_model(path: str | os.PathLike[str]) -> SimModel:
    """The :class:`SimModel` of a model file.

    Raises
    ------
    InputError
        The file cannot be read or parsed, is not a model file, or holds an
        unknown field or a bad value (the message names the file, the field
        and the value).
    """
    from pathweave._files import read_input

    where = f"model file {os.fspath(path)}"
    try:
        doc = json.loads(read_input(path, "model file"))
    except OSError as exc:
        raise InputError(f"{where}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # JSON and UnicodeDecodeError
        raise InputError(f"{where}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise InputError(f"{where}: not a pathweave model file (format must be {_FORMAT!r})")
    if doc.get("version") != _VERSION:
        raise InputError(f"{where}: version {doc.get('version')!r} is not {_VERSION}")
    values = doc.get("model")
    if not isinstance(values, dict):
        raise InputError(f"{where}: 'model' must be a mapping of SimModel fields")
    known = {f.name for f in fields(SimModel)}
    for key, value in values.items():
        if key not in known:
            raise InputError(f"{where}: unknown field model.{key}; known: "
                             f"{', '.join(sorted(known))}")
        if key == "message_fill":  # the one switch among numbers
            if not isinstance(value, bool):
                raise InputError(f"{where}: model.{key} = {value!r} is not true or false")
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (number or (value is None and key == "hop_latency_s")):
            raise InputError(f"{where}: model.{key} = {value!r} is not a number")
    try:
        return SimModel(**values)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: {exc}") from None
