"""Rank processes forked into a namespace: a failure is the rank's, with its reason in its log.

That forked ranks do run inside their namespaces is what the emulator's own
tests show (tests/test_emulate.py: their gloo binds to ``id0``, an interface
only the rank namespaces have, and every byte arrives checked).
"""

from __future__ import annotations

import os

from pathweave.emulate._forked import NETNS_DIR, ForkedProcess, start_in_netns


def test_a_rank_forked_into_a_missing_namespace_fails_naming_it(tmp_path):
    ns = "pw-test-no-such-namespace"
    assert not (NETNS_DIR / ns).exists()
    log = tmp_path / "rank0.log"
    proc = start_in_netns(ns, ["worker", str(tmp_path / "spec.json"), "0"], log_path=log,
                          env={"PATH": os.environ.get("PATH", "")})
    assert isinstance(proc, ForkedProcess) and proc.pid > 0
    assert proc.wait(timeout=120) == 1
    assert proc.poll() == 1
    text = log.read_text()
    assert f"no network namespace {ns!r}" in text, text

