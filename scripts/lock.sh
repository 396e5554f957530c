#!/usr/bin/env bash
# Rewrites requirements.lock (every package scripts/setup.sh installs, pinned with sha256 hashes) from
# pyproject.toml's dependencies and its test, cluster, lint and bench extras. Pins already in the lock are kept
# unless pyproject.toml no longer allows them; arguments go to pip-compile:
#   ./scripts/lock.sh                               # after editing pyproject.toml's dependencies
#   ./scripts/lock.sh --upgrade-package polars      # move one package (and what it needs) to its newest release
#   ./scripts/lock.sh --upgrade                     # move everything
# pip-tools runs from a throwaway venv: it is a tool for this file, not a dependency of the project.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-$(command -v python3.11 || command -v python3)}"
tools="$(mktemp -d)"
trap 'rm -rf "$tools"' EXIT
"$python" -m venv "$tools"
"$tools/bin/python" -m pip install --quiet "pip-tools==7.6.2"
CUSTOM_COMPILE_COMMAND="./scripts/lock.sh" "$tools/bin/pip-compile" --quiet \
  --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links \
  --extra test --extra cluster --extra lint --extra bench \
  --output-file requirements.lock "$@" pyproject.toml
