"""Entry point of the processes the emulator starts inside namespaces.

``python -m pathweave.emulate._worker worker SPEC RANK`` runs one rank;
``probe-recv``/``probe-send`` move plain TCP bytes (see
:func:`pathweave.emulate.run.probe_transfer`). A module of its own, so that
``-m`` does not re-run a module the package already imported.
"""

import sys

from pathweave.emulate.run import _main

if __name__ == "__main__":
    _main(sys.argv[1:])
