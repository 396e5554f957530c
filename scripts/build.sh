#!/usr/bin/env bash
# Materializes the whole graph (synth_kd_v1, the DistillKit dataset, the pool) for every input shard, each pass
# launched through the Dagster instance of $DAGSTER_HOME (default: the repository root, whose dagster.yaml keeps
# the instance's storage in .dagster_home/) as runs of its job
# (synthkd_assets/launch.py; the passes' order: synthkd_assets/defs/passes.py), then prints summaries.
# `--smoke` reads only the first rows of each shard and writes data/megatron/synth_kd_v1_smoke/ and
# data/distill/synth_distill_smoke/ instead (intermediates in data/smoke/).
# Roots: SYNTHKD_RAW_DIR (default data/sample/synth_raw), SYNTHKD_HARMONY_DIR (a synth_harmony_v1 artifact; unset:
# none) and SYNTHKD_DATA_DIR (default data). Where the runs execute is the instance's business: this machine
# (its run queue admits a run per core) or a cluster (SYNTHKD_EXECUTOR=celery|k8s, docs/cluster.md).
# Prints one line per pass and shard; Dagster's log lines go to <the instance's storage>/build_logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
smoke=()
if [ "${1:-}" = "--smoke" ]; then
  smoke=(--smoke)
fi
.venv/bin/python -m synthkd_assets.cli run-config "${smoke[@]}" >/dev/null || exit 2  # a bad $SYNTHKD_BUILD_CONFIG
.venv/bin/python -m synthkd_assets.cli path raw-root build-lock "${smoke[@]}" >/dev/null || exit 2  # bad roots
export DAGSTER_HOME="${DAGSTER_HOME:-$PWD}"
logs="$DAGSTER_HOME/build_logs"  # not logs/: Dagster moves what is there (its telemetry queue)
repository=; if [ "$(cd "$DAGSTER_HOME" 2>/dev/null && pwd -P)" = "$(pwd -P)" ]; then repository=1; fi
case "${SYNTHKD_EXECUTOR:-}" in
  celery | k8s) if [ -n "$repository" ] || [ ! -f "$DAGSTER_HOME/dagster.yaml" ]; then
      echo "SYNTHKD_EXECUTOR=$SYNTHKD_EXECUTOR needs the cluster's instance: export DAGSTER_HOME as a directory holding deploy/cluster/dagster.yaml (PostgreSQL, not this repository's sqlite)" >&2
      exit 2
    fi ;;
esac
if [ -n "$repository" ]; then logs=$PWD/.dagster_home/build_logs; fi
mkdir -p "$logs"
if [ ! -f "$DAGSTER_HOME/dagster.yaml" ]; then  # the repository's dagster.yaml, storing in $DAGSTER_HOME itself
  .venv/bin/python -m synthkd_assets.cli instance-yaml > "$DAGSTER_HOME/dagster.yaml.partial"
  mv "$DAGSTER_HOME/dagster.yaml.partial" "$DAGSTER_HOME/dagster.yaml"
fi
log="$logs/build-$(date +%Y%m%d-%H%M%S)-$$.log"
echo "build from $(.venv/bin/python -m synthkd_assets.cli path raw-root)${SYNTHKD_HARMONY_DIR:+ and the synth_harmony_v1 artifact in $SYNTHKD_HARMONY_DIR}${SYNTHKD_SOURCES_DIR:+ and the anchor sources in $SYNTHKD_SOURCES_DIR}; full log: $log"
exec .venv/bin/python -m synthkd_assets.cli build --log "$log" "${smoke[@]}"
