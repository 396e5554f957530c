#!/usr/bin/env bash
# Dagster's UI and daemon on the instance of $DAGSTER_HOME (default: the repository root, whose dagster.yaml keeps
# the storage in .dagster_home/): `dg dev "$@"`, e.g. ./scripts/ui.sh -h 127.0.0.1 -p 3000.
# It stops, with its webserver, daemon and code servers, on Ctrl-C and on SIGTERM, also when started in the
# background or by a service manager: Dagster handles SIGTERM as it handles SIGINT, and a command a script starts
# with `&` inherits SIGINT ignored, so a plain `dg dev &` ignores both; SIGINT is given back its default first.
set -euo pipefail
cd "$(dirname "$0")/.."
export DAGSTER_HOME="${DAGSTER_HOME:-$PWD}"
if [ ! -f "$DAGSTER_HOME/dagster.yaml" ]; then  # the repository's settings, storing in $DAGSTER_HOME itself
  .venv/bin/python -m synthkd_assets.cli instance-yaml > "$DAGSTER_HOME/dagster.yaml.partial"
  mv "$DAGSTER_HOME/dagster.yaml.partial" "$DAGSTER_HOME/dagster.yaml"
fi
exec .venv/bin/python -c '
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)  # kept across exec: dg then installs its KeyboardInterrupt handler
os.execv(sys.argv[1], sys.argv[1:])' "$PWD/.venv/bin/dg" dev "$@"
