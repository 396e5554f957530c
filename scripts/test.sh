#!/usr/bin/env bash
# The test command: install (idempotent) and run the whole suite. .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
