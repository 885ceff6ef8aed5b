#!/usr/bin/env bash
# Create or refresh the project's virtual environment in <repo>/.venv.
#
# Idempotent: a stamp file records the hash of pyproject.toml, and nothing
# is reinstalled while it matches. Run it (`bash scripts/setup.sh`) or source
# it from another script (`source scripts/setup.sh`); sourcing leaves the
# caller's shell options untouched, sets PATHWEAVE_VENV and unsets
# PYTHONDONTWRITEBYTECODE (the venv's bytecode is written as it is imported).
#
# Steps: pick python3 (>= 3.10, python3.11 preferred), create .venv, install
# uv into it with pip, then with uv torch==2.13.0 (the CPU wheel, from where
# pip finds it; the data plane, MoE layer and emulator need torch, the
# planner and simulator do not), `-e '.[test,models]'` (models: transformers,
# for the MoE training example) and pip.

_pathweave_setup() (
    set -euo pipefail
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    venv="$root/.venv"
    stamp="$venv/.pathweave-setup"
    want="$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1)"

    if [[ -x "$venv/bin/python" && -f "$stamp" && "$(head -n1 "$stamp")" == "$want" ]]; then
        echo "setup: .venv is up to date"
        return 0
    fi

    python=""
    for candidate in python3.11 python3 python3.12 python3.13 python3.10; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
            python="$candidate"
            break
        fi
    done
    if [[ -z "$python" ]]; then
        echo "setup: need Python >= 3.10 (tried python3.11, python3, python3.12, python3.13, python3.10)" >&2
        return 1
    fi

    if [[ ! -x "$venv/bin/python" ]]; then
        echo "setup: creating .venv with $("$python" --version 2>&1)"
        "$python" -m venv --without-pip "$venv"
    fi
    # pip installs uv, and says where it would take torch from: it reads
    # this machine's configuration (local wheel folders, indexes, caps),
    # which uv does not (it gets pip's sources below, not its caps: torch is
    # pinned to pip's pick). uv installs the rest: its downloads and unpacking
    # run in parallel (~10 s for all here, against ~35 s with pip). Nothing
    # is byte-compiled now (uv's default): a process writes the bytecode of
    # what it imports (see PYTHONDONTWRITEBYTECODE below), a seventh of the
    # files.
    pip=("$python" -m pip --python "$venv/bin/python")
    if ! "${pip[@]}" --version >/dev/null 2>&1; then
        # No pip beside $python, or one older than 22.3 (no --python): the
        # venv gets its own.
        "$python" -m venv "$venv"
        pip=("$venv/bin/python" -m pip)
    fi
    if ! "${pip[@]}" install --quiet uv; then
        echo "setup: could not install uv (from PyPI) with $("${pip[@]}" --version)" >&2
        return 1
    fi
    # Pinned: an unpinned torch would pull several GB of CUDA packages.
    torch_url="$("${pip[@]}" install --quiet --dry-run --no-deps --ignore-installed \
        --report - "torch==2.13.0" | "$venv/bin/python" -c \
        'import json, sys; print(json.load(sys.stdin)["install"][0]["download_info"]["url"])')" ||
        torch_url=""
    if [[ -z "$torch_url" ]]; then
        echo "setup: pip found no torch==2.13.0, which the data plane, the MoE layer" \
            "and the emulator (and their tests) need" >&2
        return 1
    fi
    # The sources pip is configured with (a mirror, local wheel folders), for uv.
    mapfile -t sources < <("${pip[@]}" config list | "$venv/bin/python" "$root/scripts/pip_sources.py")
    echo "setup: installing torch 2.13.0 and pathweave (editable) with test and models extras"
    if ! "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" "${sources[@]}" \
        "torch @ $torch_url" -e "$root[test,models]" pip; then
        echo "setup: uv could not install torch and pathweave's extras (above: why)" >&2
        return 1
    fi
    torch="torch 2.13.0"

    printf '%s\n%s\n' "$want" "$torch" >"$stamp"
    echo "setup: done ($torch)"
)

if _pathweave_setup; then
    PATHWEAVE_VENV="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv"
    export PATHWEAVE_VENV
    # Nothing is byte-compiled at install (above): with
    # PYTHONDONTWRITEBYTECODE set (as on some CI machines) every interpreter
    # the caller starts (the tests' torchrun ranks, CLI runs) would compile
    # torch and pathweave again, ~2.5 s of CPU each. The first import writes it.
    unset PYTHONDONTWRITEBYTECODE
    unset -f _pathweave_setup
else
    unset -f _pathweave_setup
    # `return` when sourced, `exit` when run as a script.
    return 1 2>/dev/null || exit 1
fi
