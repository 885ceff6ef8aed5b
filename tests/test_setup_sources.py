"""scripts/pip_sources.py: pip's package sources as uv arguments (hand-written cases)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "pip_sources.py"


def _uv_args(config: str) -> list[str]:
    out = subprocess.run([sys.executable, str(SCRIPT)], input=config, capture_output=True,
                         text=True, check=True)
    return out.stdout.splitlines()


def test_every_wheel_folder_and_extra_index_once_and_the_first_mirror():
    config = (":env:.find-links='/opt/wheels'\n"
              ":env:.index-url='https://proxy.example/simple'\n"
              "global.cert='/etc/ssl/certs/ca-certificates.crt'\n"
              "global.extra-index-url='file:///a/simple file:///b/simple'\n"
              "global.find-links='/opt/wheels /more/wheels'\n"
              "global.index-url='https://other.example/simple'\n")
    assert _uv_args(config) == [
        "--find-links", "/opt/wheels",
        "--index-url", "https://proxy.example/simple",
        "--extra-index-url", "file:///a/simple", "--extra-index-url", "file:///b/simple",
        "--find-links", "/more/wheels",
    ]


def test_no_sources_configured():
    assert _uv_args("global.cert='/x'\n:env:.default-timeout='180'\n") == []
