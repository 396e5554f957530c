#!/usr/bin/env bash
# The test command: install (idempotent), lint, check the formatting, run the whole suite. .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "$@"
