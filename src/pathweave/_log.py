"""pathweave's logging: the stdlib ``pathweave.*`` logger tree, set up from ``PATHWEAVE_DEBUG``.

Every module logs to ``logging.getLogger(__name__)``; nothing is printed
unless the application configures logging itself or ``PATHWEAVE_DEBUG``
names a level, as ``NCCL_DEBUG`` does for NCCL:

=========  =====================================================================
``WARN``   problems only: a subgroup that runs torch's collective, a bad setting
``INFO``   the fabric and where it came from (once per group), every change of
           decision (multi-path plan or torch's collective, and why), plan
           switches, re-planning on learned capacities
``DEBUG``  plans made, hysteresis keeping the current plan
``TRACE``  every call's timings (metadata, planning, transfer)
=========  =====================================================================

Lines go to stderr as ``host:pid:rank pathweave LEVEL logger: message``.
:func:`configure` is the one place that reads the variable; ``import
pathweave`` calls it, and so does each rank :func:`~pathweave.runtime.launch.run_local`
starts (its environment is set after the fork).

Examples
--------
>>> import logging
>>> configure({"PATHWEAVE_DEBUG": "trace"})
5
>>> logging.getLogger("pathweave.runtime").isEnabledFor(TRACE)
True
>>> configure({}) is None
True
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

__all__ = ["DEBUG_ENV", "TRACE", "configure"]

#: Below ``logging.DEBUG``: per-call detail, as ``NCCL_DEBUG=TRACE``.
TRACE = 5
logging.addLevelName(TRACE, "TRACE")
#: The environment variable that turns pathweave's log lines on.
DEBUG_ENV = "PATHWEAVE_DEBUG"
LEVELS = {"warn": logging.WARNING, "warning": logging.WARNING, "info": logging.INFO,
          "debug": logging.DEBUG, "trace": TRACE}
_ROOT = "pathweave"
_FORMAT = "%(hostname)s:%(process)d:%(rank)s pathweave %(levelname)s %(name)s: %(message)s"


class _Where(logging.Filter):
    """Stamps each record with the host name and the rank."""

    hostname = socket.gethostname()

    def filter(self, record: logging.LogRecord) -> bool:
        record.hostname = self.hostname
        # NOTE: read at emit time, not at configure time: ranks forked from a
        # fork server get RANK after this module was imported.
        record.rank = os.environ.get("RANK", "-")
        return True


class _Handler(logging.StreamHandler):
    """The handler :func:`configure` installs (so a second call replaces it)."""


def configure(environ: Mapping[str, str] | None = None) -> int | None:
    """Set the ``pathweave`` logger's level and stderr handler from ``PATHWEAVE_DEBUG``.

    Unset or empty: pathweave adds no handler (the application's logging
    configuration, if any, applies) and the level is left alone. A value
    that is not a level is reported once at WARN and logging stays at WARN.
    Returns the level set, or None.
    """
    env = os.environ if environ is None else environ
    log = logging.getLogger(_ROOT)
    mine = [h for h in log.handlers if isinstance(h, _Handler)]
    for h in mine:
        log.removeHandler(h)
    raw = env.get(DEBUG_ENV, "")
    if not raw.strip():
        if mine:  # undo only what an earlier call set
            log.setLevel(logging.NOTSET)
        return None
    level = LEVELS.get(raw.strip().lower())
    handler = _Handler()
    handler.addFilter(_Where())
    handler.setFormatter(logging.Formatter(_FORMAT))
    log.addHandler(handler)
    log.setLevel(logging.WARNING if level is None else level)
    if level is None:
        log.warning("%s=%r is not one of WARN, INFO, DEBUG, TRACE; logging at WARN",
                    DEBUG_ENV, raw)
        return logging.WARNING
    return level
