#!/usr/bin/env bash
# Creates .venv and installs synthkd with its pins. torch goes first, from its own line, so that no
# later requirement can resolve an unpinned torch (which would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-$(command -v python3.11 || command -v python3)}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[test,cluster]"
