#!/usr/bin/env bash
# Creates .venv and installs exactly the versions of requirements.lock (sha256-checked), then synthkd itself
# without resolving anything. torch goes first, from its own line: the CPU build pip finds through its
# find-links, held to the lock's pin (2.13.0+cpu) so that nothing can pull a multi-GB CUDA build.
# How to change a pin: docs/development.md, "Dependencies and the lock file".
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-$(command -v python3.11 || command -v python3)}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0" --constraint requirements.lock
.venv/bin/python -m pip install --quiet --require-hashes --requirement requirements.lock
# -qq: setuptools' notice about editable installs is a warning to no one here; errors still print
.venv/bin/python -m pip install -qq --no-deps --no-build-isolation --editable .
# the packages' bytecode, written once here: a process that may not write it (PYTHONDONTWRITEBYTECODE, a read-only
# checkout) would otherwise compile every module again each time it starts, and a build starts a process per run
.venv/bin/python -m compileall -q -j 0 synthkd_assets synthkd_contract synthkd_training synthkd_dev >/dev/null
