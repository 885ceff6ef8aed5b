"""Entry point of the processes the emulator starts inside namespaces.

``python -m pathweave.emulate._worker worker SPEC RANK`` runs one rank;
``probe-recv``/``probe-send`` move plain TCP bytes (see
:func:`pathweave.emulate.run.probe_transfer`); ``background-recv``/``background-send``
are a co-tenant (:mod:`pathweave.emulate.background`). A module of its own, so that
``-m`` does not re-run a module the package already imported.
"""

import sys

from pathweave.emulate.run import _main

if __name__ == "__main__":
    if sys.argv[1].startswith("background-"):
        from pathweave.emulate.background import _main as _background

        _background(sys.argv[1:])
    else:
        _main(sys.argv[1:])
