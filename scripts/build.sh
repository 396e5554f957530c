#!/usr/bin/env bash
# Materializes the whole synth_kd_v1 graph for every raw shard through the Dagster CLI, then prints
# a summary. `--smoke` caps each shard and writes data/megatron/synth_kd_v1_smoke/ instead.
# Roots: SYNTHKD_RAW_DIR (default data/sample/synth_raw) and SYNTHKD_DATA_DIR (default data).
set -euo pipefail
cd "$(dirname "$0")/.."
export DAGSTER_HOME="${DAGSTER_HOME:-$PWD/.dagster_home}"
mkdir -p "$DAGSTER_HOME"
[ -f "$DAGSTER_HOME/dagster.yaml" ] || cp dagster.yaml "$DAGSTER_HOME/dagster.yaml"

config='{}'
dataset=synth_kd_v1
if [ "${1:-}" = "--smoke" ]; then
  config='{"resources": {"paths": {"config": {"smoke": true}}}}'
  dataset=synth_kd_v1_smoke
fi
materialize() { .venv/bin/dagster asset materialize -m synthkd_assets.definitions --config-json "$config" "$@"; }

# 1. the pinned tokenizer and the raw inventory (registers one partition per raw shard)
materialize --select o200k_tokenizer,synth_raw_inventory
# 2. every shard partition: Harmony -> filtered -> sampled -> tokens/masks -> Megatron trio
for key in $(.venv/bin/python -m synthkd_assets.cli partitions); do
  materialize --select synth_harmony,synth_filtered,synth_sampled,synth_tokenized,synth_kd_v1 --partition "$key"
done
# 3. provenance over all shards
materialize --select synth_harmony_manifest,synth_kd_v1_manifest
.venv/bin/python -m synthkd_assets.cli summary --manifest "${SYNTHKD_DATA_DIR:-data}/megatron/$dataset/manifest.json"
