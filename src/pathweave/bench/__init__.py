"""Benchmarks of pathweave's own parts; each module is one benchmark.

* :mod:`pathweave.bench.planner`: congestion and planning time of every
  policy on fabrics from 8 to 1024 GPUs (``pathweave bench planner``).
* :mod:`pathweave.bench.dataplane`: pathweave's ``all_to_all_single``
  against torch's on local gloo ranks, every output checked bitwise
  (``pathweave bench dataplane``).

Benchmarks return plain JSON-ready records, so the CLI, CI and notebooks
share them; rendering (tables, plots) is the caller's business.
"""
