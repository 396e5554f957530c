#!/usr/bin/env bash
# Materializes the whole graph (synth_kd_v1 and the DistillKit dataset) for every raw shard through the
# Dagster CLI, then prints summaries. `--smoke` caps each shard and writes data/megatron/synth_kd_v1_smoke/
# and data/distill/synth_distill_smoke/ instead.
# Roots: SYNTHKD_RAW_DIR (default data/sample/synth_raw) and SYNTHKD_DATA_DIR (default data).
# SYNTHKD_PARALLEL_RUNS (default 1): shard runs submitted at once. Raise it with a PostgreSQL instance and
# SYNTHKD_EXECUTOR=celery (README, "Running on a cluster"), where each run's steps go to the Celery workers.
set -euo pipefail
cd "$(dirname "$0")/.."
build_started=$(date +%s)

# One build per data root: a second one stops here ("another build holds <lock>"). The lock is on fd 9,
# which every child inherits, so it holds until the last of them exits (the kernel drops it, even on SIGKILL).
data_root="${SYNTHKD_DATA_DIR:-data}"
mkdir -p "$data_root"
exec 9<>"$data_root/.build.lock"
.venv/bin/python -m synthkd_assets.cli lock --fd 9 "$data_root/.build.lock" || exit 75

# Each command runs as a job in its own process group (set -m); INT / TERM / HUP stop the running one and
# every process under it (dagster runs, step processes) before the script exits.
set -m
running=
stop() { trap - INT TERM HUP; if [ -n "$running" ]; then kill -TERM -- "-$running" 2>/dev/null || true; fi; wait; exit "$1"; }
trap 'stop 130' INT
trap 'stop 143' TERM
trap 'stop 129' HUP
job() { "$@" & running=$!; if wait "$running"; then running=; else local rc=$?; running=; return "$rc"; fi; }
# a failed step: print each failing check's problems and each failed step's error, then stop
failed() { local rc=$?; .venv/bin/python -m synthkd_assets.cli failures --since "$build_started" || true; exit "$rc"; }
export DAGSTER_HOME="${DAGSTER_HOME:-$PWD/.dagster_home}"
mkdir -p "$DAGSTER_HOME"
if [ ! -f "$DAGSTER_HOME/dagster.yaml" ]; then
  if [ -n "${SYNTHKD_EXECUTOR:-}" ] && [ "$SYNTHKD_EXECUTOR" != multiprocess ]; then
    echo "SYNTHKD_EXECUTOR=$SYNTHKD_EXECUTOR but $DAGSTER_HOME/dagster.yaml is missing: copy deploy/cluster/dagster.yaml there (a cluster needs the shared PostgreSQL instance, not sqlite)" >&2
    exit 2
  fi
  cp dagster.yaml "$DAGSTER_HOME/dagster.yaml"
fi

config='{}'
dataset=synth_kd_v1
distill=synth_distill
if [ "${1:-}" = "--smoke" ]; then
  config='{"resources": {"paths": {"config": {"smoke": true}}}}'
  dataset=synth_kd_v1_smoke
  distill=synth_distill_smoke
fi
dagster_materialize=(.venv/bin/dagster asset materialize -m synthkd_assets.definitions --config-json "$config")
materialize() { job "${dagster_materialize[@]}" "$@" || failed; }
# one run per shard partition, SYNTHKD_PARALLEL_RUNS at a time; fails if any run fails (keys NUL-separated:
# any file name is passed as one argument)
each_shard() { job xargs -0 -r -P "${SYNTHKD_PARALLEL_RUNS:-1}" -I%KEY% "${dagster_materialize[@]}" "$@" --partition %KEY% < "$keys" || failed; }

# 1. the pinned tokenizer and the raw inventory (registers one partition per raw shard)
materialize --select o200k_tokenizer,synth_raw_inventory
keys=$(mktemp)
trap 'rm -f "$keys"' EXIT
.venv/bin/python -m synthkd_assets.cli partitions --null > "$keys"
# 2. the scan pass, every shard partition: Harmony -> 001 quality filters (exercise x language counts)
each_shard --select synth_harmony,synth_filtered
# 3. the sampling plan, from every shard's counts
materialize --select synth_sampling_plan
# 4. the build pass, every shard partition: sampled -> tokens/masks -> Megatron trio + DistillKit parts
each_shard --select synth_sampled,synth_tokenized,synth_kd_v1,synth_distill
# 5. provenance over all shards
materialize --select synth_harmony_manifest,synth_kd_v1_manifest,synth_distill_manifest
.venv/bin/python -m synthkd_assets.cli summary --manifest "${SYNTHKD_DATA_DIR:-data}/megatron/$dataset/manifest.json"
.venv/bin/python -m synthkd_assets.cli summary --manifest "${SYNTHKD_DATA_DIR:-data}/distill/$distill/manifest.json"
