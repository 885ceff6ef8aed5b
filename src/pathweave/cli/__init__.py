"""The ``pathweave`` command line (typer).

The entry point is :data:`pathweave.cli.main.app`; ``pathweave --help`` lists
the commands. Each command is a thin wrapper over the library: it parses
its arguments, calls :mod:`pathweave.fabric`, :mod:`pathweave.traffic`,
:mod:`pathweave.plan` or :mod:`pathweave.bench`, and renders the result
with rich. Errors pathweave raises on purpose are printed as one red line
(exit code 2, or 1 for ``topo validate``), never as a traceback.
"""
