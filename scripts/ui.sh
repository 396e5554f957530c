#!/usr/bin/env bash
# Dagster's UI and daemon on the instance of $DAGSTER_HOME (default: the repository root, whose dagster.yaml keeps
# the storage in .dagster_home/): `dg dev "$@"`, e.g. ./scripts/ui.sh -h 127.0.0.1 -p 3000.
# `--smoke` first: the smoke builds' own instance instead, read-only and without a daemon (its runs are
# `build.sh --smoke`'s; nothing else launches there): `dagster-webserver --read-only "$@"`.
# It stops, with its webserver, daemon and code servers, on Ctrl-C and on SIGTERM, also when started in the
# background or by a service manager: Dagster handles SIGTERM as it handles SIGINT, and a command a script starts
# with `&` inherits SIGINT ignored, so a plain `dg dev &` ignores both; SIGINT is given back its default first.
set -euo pipefail
cd "$(dirname "$0")/.."
serve=("$PWD/.venv/bin/dg" dev)
smoke=()
if [ "${1:-}" = "--smoke" ]; then
  shift
  smoke=(--smoke)
  serve=("$PWD/.venv/bin/dagster-webserver" -w workspace.yaml --read-only)
fi
# the instance directory (its dagster.yaml written when missing: the repository's settings, storing in it)
DAGSTER_HOME="$(.venv/bin/python -m synthkd_assets.cli instance-home "${smoke[@]}")"
export DAGSTER_HOME
exec .venv/bin/python -c '
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)  # kept across exec: dg then installs its KeyboardInterrupt handler
os.execv(sys.argv[1], sys.argv[1:])' "${serve[@]}" "$@"
