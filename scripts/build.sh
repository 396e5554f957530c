#!/usr/bin/env bash
# Materializes the whole graph (synth_kd_v1, the DistillKit dataset, the pool) for every input shard, each pass
# launched through the Dagster instance of $DAGSTER_HOME (default: the repository root, whose dagster.yaml keeps
# the instance's storage in .dagster_home/) as runs of its job
# (synthkd_assets/launch.py; the passes' order: synthkd_assets/defs/passes.py), then prints summaries.
# `--smoke` reads only the first rows of each shard and writes data/megatron/synth_kd_v1_smoke/ and
# data/distill/synth_distill_smoke/ instead (intermediates in data/smoke/), recording its runs in the smoke builds'
# own instance (.dagster_home/smoke/, or $DAGSTER_HOME/smoke/; `./scripts/ui.sh --smoke` shows it).
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
export DAGSTER_HOME="${DAGSTER_HOME:-$PWD}"
# config, roots and executor checked before anything is written; then the instance (a smoke build's is its own:
# docs/design.md, "Smoke build", its dagster.yaml written when missing), its build logs' directory, the raw root
prepared="$(.venv/bin/python -m synthkd_assets.cli prepare "${smoke[@]}")" || exit 2
{ read -r DAGSTER_HOME; read -r logs; read -r raw_root; } <<<"$prepared"
log="$logs/build-$(date +%Y%m%d-%H%M%S)-$$.log"
echo "build from $raw_root${SYNTHKD_HARMONY_DIR:+ and the synth_harmony_v1 artifact in $SYNTHKD_HARMONY_DIR}${SYNTHKD_SOURCES_DIR:+ and the anchor sources in $SYNTHKD_SOURCES_DIR}; full log: $log"
exec .venv/bin/python -m synthkd_assets.cli build --log "$log" "${smoke[@]}"
