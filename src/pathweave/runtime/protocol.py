"""The data plane's metadata protocol, public for the layers built on it.

Every pathweave exchange starts with one metadata row per rank. Layers above
the runtime that exchange rows of their own (the MoE layer's guardrails,
:mod:`pathweave.moe`) and the benchmarks that count the row's bytes use these
names, the same objects the runtime's own ops use (implemented in
``runtime/_validate.py``, whose other helpers stay private):

- the one table of rank-consistent errors: :data:`PROBLEMS` (code -> exception
  type, op, message), filled by each op with :func:`register_problems` in a
  code range of its own (:data:`PROBLEM_RANGES`), :class:`ArgProblem` (a
  rank's own problem, encoded in :data:`PROBLEM_WORDS` words of its row),
  :func:`raise_problem` (the same exception on every rank);
- the value numbering: :func:`dtype_code` / :func:`dtype_name` (torch dtypes),
  :func:`type_code` / :func:`type_name` (Python types of arguments);
- the configuration fingerprint: :func:`fingerprint` (a call's settings as
  :data:`FP_WORDS` words) and :func:`check_fingerprints` (every rank's
  words compared, the first difference named);
- :func:`meta_width`: the length of one ``all_to_all_single`` row.

An op of another layer registers problem codes of its own (the MoE layer's
dispatch 101 to 119, combine 120 to 129), so every rank-consistent error
stays in one table and no two ops share a code.

Examples
--------
>>> from pathweave.runtime import protocol
>>> p = protocol.ArgProblem(1, 3)
>>> p.words()[:2].tolist(), len(p.words()) == protocol.PROBLEM_WORDS
([1, 3], True)
>>> protocol.meta_width(8) > protocol.FP_WORDS
True
"""

from __future__ import annotations

from pathweave.runtime._validate import (
    FP_WORDS,
    PROBLEM_RANGES,
    PROBLEM_WORDS,
    PROBLEMS,
    ArgProblem,
    check_fingerprints,
    dtype_code,
    dtype_name,
    fingerprint,
    meta_width,
    raise_problem,
    register_problems,
    type_code,
    type_name,
)

__all__ = [
    "FP_WORDS",
    "PROBLEMS",
    "PROBLEM_RANGES",
    "PROBLEM_WORDS",
    "ArgProblem",
    "check_fingerprints",
    "dtype_code",
    "dtype_name",
    "fingerprint",
    "meta_width",
    "raise_problem",
    "register_problems",
    "type_code",
    "type_name",
]
