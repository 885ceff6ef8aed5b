"""Entry point of the processes the emulator starts inside namespaces.

``worker SPEC RANK`` runs one rank (:mod:`pathweave.emulate._rankworker`; the rank
processes are forked into their namespaces and call :func:`_main`, see
:mod:`pathweave.emulate._forked`); ``python -m pathweave.emulate._worker
probe-recv``/``probe-send`` move plain TCP
bytes (:mod:`pathweave.emulate._probe`, see :func:`pathweave.emulate.run.probe_transfer`).
The co-tenant's processes run :mod:`pathweave.emulate._cotenant` as a script instead.
A module of its own, so that ``-m`` does not re-run a module the package already imported.
"""

import sys
from collections.abc import Sequence

from pathweave.emulate._probe import _probe_recv, _probe_send
from pathweave.emulate._rankworker import _worker


def _main(argv: Sequence[str]) -> None:
    cmd, *args = argv
    if cmd == "worker":
        _worker(args[0], int(args[1]))
    elif cmd == "probe-recv":
        _probe_recv(args[0], int(args[1]), int(args[2]), int(args[3]), int(args[4]), args[5])
    elif cmd == "probe-send":
        _probe_send(args[0], int(args[1]), int(args[2]), int(args[3]))
    else:
        raise SystemExit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    _main(sys.argv[1:])
