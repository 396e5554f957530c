#!/usr/bin/env bash
# The test command: install (idempotent), lint, check the formatting, run the whole suite. .ci/run calls exactly this.
# The suite runs on every core (pytest-xdist, at most 4 workers: each builds the session's sample once), a test
# file's tests together in one worker so that its module fixtures are built once; `-n 0` runs it in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest -n auto --maxprocesses=4 --dist loadfile --no-loadscope-reorder "$@"
