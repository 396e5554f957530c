#!/usr/bin/env bash
# Materializes the whole graph (synth_kd_v1, the DistillKit dataset, the pool) for every input shard, each pass
# launched through the Dagster instance of $DAGSTER_HOME (default <repo>/.dagster_home) as runs of its job
# (synthkd_assets/launch.py; the passes' order: synthkd_assets/defs/passes.py), then prints summaries.
# `--smoke` reads only the first rows of each shard and writes data/megatron/synth_kd_v1_smoke/ and
# data/distill/synth_distill_smoke/ instead (intermediates in data/smoke/).
# Roots: SYNTHKD_RAW_DIR (default data/sample/synth_raw), SYNTHKD_HARMONY_DIR (a synth_harmony_v1 artifact; unset:
# none) and SYNTHKD_DATA_DIR (default data). Where the runs execute is the instance's business: this machine
# (its run queue admits a run per core) or a cluster (SYNTHKD_EXECUTOR=celery|k8s, docs/cluster.md).
# Prints one line per pass and shard; Dagster's log lines go to $DAGSTER_HOME/build_logs/build-<time>-<pid>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
smoke=()
if [ "${1:-}" = "--smoke" ]; then
  smoke=(--smoke)
fi
.venv/bin/python -m synthkd_assets.cli run-config "${smoke[@]}" >/dev/null || exit 2  # a bad $SYNTHKD_BUILD_CONFIG
.venv/bin/python -m synthkd_assets.cli path raw-root build-lock "${smoke[@]}" >/dev/null || exit 2  # bad roots
export DAGSTER_HOME="${DAGSTER_HOME:-$PWD/.dagster_home}"
mkdir -p "$DAGSTER_HOME/build_logs"  # not logs/: Dagster moves what is there (its telemetry queue)
if [ ! -f "$DAGSTER_HOME/dagster.yaml" ]; then
  case "${SYNTHKD_EXECUTOR:-}" in
    celery | k8s)
      echo "SYNTHKD_EXECUTOR=$SYNTHKD_EXECUTOR but $DAGSTER_HOME/dagster.yaml is missing: copy deploy/cluster/dagster.yaml there (a cluster needs the shared PostgreSQL instance, not sqlite)" >&2
      exit 2 ;;
  esac
  # deploy/local/dagster.yaml, its run queue sized to this machine's cores
  .venv/bin/python -m synthkd_assets.cli instance-yaml > "$DAGSTER_HOME/dagster.yaml.partial"
  mv "$DAGSTER_HOME/dagster.yaml.partial" "$DAGSTER_HOME/dagster.yaml"
fi
log="$DAGSTER_HOME/build_logs/build-$(date +%Y%m%d-%H%M%S)-$$.log"
echo "build from $(.venv/bin/python -m synthkd_assets.cli path raw-root)${SYNTHKD_HARMONY_DIR:+ and the synth_harmony_v1 artifact in $SYNTHKD_HARMONY_DIR}${SYNTHKD_SOURCES_DIR:+ and the anchor sources in $SYNTHKD_SOURCES_DIR}; full log: $log"
exec .venv/bin/python -m synthkd_assets.cli build --log "$log" "${smoke[@]}"
