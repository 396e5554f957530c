#!/usr/bin/env bash
# Materializes the whole graph (synth_kd_v1, the DistillKit dataset, the pool) for every raw shard into the
# Dagster instance of $DAGSTER_HOME, then prints summaries. `--smoke` reads only the first rows of each shard and
# writes data/megatron/synth_kd_v1_smoke/ and data/distill/synth_distill_smoke/ instead (intermediates in data/smoke/).
# Roots: SYNTHKD_RAW_DIR (default data/sample/synth_raw), SYNTHKD_HARMONY_DIR (a synth_harmony_v1 artifact; unset:
# none) and SYNTHKD_DATA_DIR (default data).
# Two routes, chosen by SYNTHKD_EXECUTOR:
# - unset, multiprocess or in_process (this machine): one driver process (`python -m synthkd_assets.cli build`)
#   runs the passes, each shard pass's runs in SYNTHKD_PARALLEL_RUNS worker processes at once (default: every
#   core; never more than there are shards);
# - celery or k8s (a cluster, docs/cluster.md): one stock `dg launch --job <the pass's job>` call per pass and shard,
#   SYNTHKD_PARALLEL_RUNS (default 1) shard runs submitted at once, each run's steps on the cluster's workers.
# Prints one line per pass and shard; every Dagster log line goes to $DAGSTER_HOME/logs/build-<time>-<pid>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
build_started=$(date +%s)

# Every path comes from the layout (synthkd_assets/core/layout.py), asked through the CLI.
where() { .venv/bin/python -m synthkd_assets.cli path "$@"; }
case "${SYNTHKD_EXECUTOR:-}" in
  "" | multiprocess | in_process) cluster= ;;
  celery | k8s) cluster=$SYNTHKD_EXECUTOR ;;
  *) echo "SYNTHKD_EXECUTOR=$SYNTHKD_EXECUTOR: expected multiprocess, in_process, celery or k8s" >&2; exit 2 ;;
esac
smoke=()
if [ "${1:-}" = "--smoke" ]; then
  smoke=(--smoke)
fi
# the build resource's settings: $SYNTHKD_BUILD_CONFIG (a JSON object of its fields, docs/design.md) and --smoke
config=$(.venv/bin/python -m synthkd_assets.cli run-config "${smoke[@]}") || exit 2
paths=$(where build-lock megatron-manifest distill-manifest pool-manifest raw-root "${smoke[@]}")
{ read -r lock; read -r megatron_manifest; read -r distill_manifest; read -r pool_manifest; read -r raw_root; } <<<"$paths"
# One build per data root: a second one stops here ("another build holds <lock>"). The lock is on fd 9,
# which every child inherits, so it holds until the last of them exits (the kernel drops it, even on SIGKILL;
# the driver's workers are spawned without it and end with the driver).
mkdir -p "$(dirname "$lock")"
exec 9<>"$lock"
.venv/bin/python -m synthkd_assets.cli lock --fd 9 "$lock" || exit $?  # 75: held

# Each command runs as a job in its own process group (set -m); INT / TERM / HUP stop the running one and
# every process under it (dagster runs, step processes) before the script exits.
set -m
running=
# a step that has not stopped STOP_GRACE seconds after TERM (e.g. a native call holding the interpreter) is killed
STOP_GRACE=${SYNTHKD_STOP_GRACE:-45}
stop() {
  trap - INT TERM HUP
  if [ -n "$running" ]; then
    kill -TERM -- "-$running" 2>/dev/null || true
    # the reaper closes fd 9 (the build lock): the lock is free once the script exits
    (exec 9>&-; sleep "$STOP_GRACE"; kill -KILL -- "-$running" 2>/dev/null) &
    local reaper=$!
    wait "$running" 2>/dev/null || true  # its status is not the script's (and would stop it under set -e)
    kill -- "-$reaper" 2>/dev/null || true  # its own process group (set -m): the subshell and its sleep
    wait "$reaper" 2>/dev/null || true  # reaped here, quietly (job control would report it "Terminated")
  fi
  wait || true
  echo "build stopped by $2: a run it had in progress is marked failed; run build.sh again to build" >&2
  exit "$1"
}
trap 'stop 130 SIGINT' INT
trap 'stop 143 SIGTERM' TERM
trap 'stop 129 SIGHUP' HUP
job() { "$@" & running=$!; if wait "$running"; then running=; else local rc=$?; running=; return "$rc"; fi; }
# a failed step: print each failing check's problems and each failed step's error, then stop
failed() { local rc=$?; .venv/bin/python -m synthkd_assets.cli failures --since "$build_started" || true; exit "$rc"; }
export DAGSTER_HOME="${DAGSTER_HOME:-$PWD/.dagster_home}"
mkdir -p "$DAGSTER_HOME"
if [ ! -f "$DAGSTER_HOME/dagster.yaml" ]; then
  if [ -n "$cluster" ]; then
    echo "SYNTHKD_EXECUTOR=$SYNTHKD_EXECUTOR but $DAGSTER_HOME/dagster.yaml is missing: copy deploy/cluster/dagster.yaml there (a cluster needs the shared PostgreSQL instance, not sqlite)" >&2
    exit 2
  fi
  # deploy/local/dagster.yaml, its run queue sized to this machine's cores
  .venv/bin/python -m synthkd_assets.cli instance-yaml > "$DAGSTER_HOME/dagster.yaml.partial"
  mv "$DAGSTER_HOME/dagster.yaml.partial" "$DAGSTER_HOME/dagster.yaml"
fi

mkdir -p "$DAGSTER_HOME/logs"
export BUILD_LOG="$DAGSTER_HOME/logs/build-$(date +%Y%m%d-%H%M%S)-$$.log"
export BUILD_CONFIG="$config" BUILD_SMOKE="${smoke[*]}"
datasets="$(basename "$(dirname "$megatron_manifest")") + $(basename "$(dirname "$distill_manifest")") + $(basename "$(dirname "$pool_manifest")")"
sources="${SYNTHKD_HARMONY_DIR:+, the synth_harmony_v1 artifact in $SYNTHKD_HARMONY_DIR}${SYNTHKD_SOURCES_DIR:+ and the anchor sources in $SYNTHKD_SOURCES_DIR}"
echo "build of $datasets from $raw_root$sources; full log: $BUILD_LOG"

export ERROR_LINES='
/ - ERROR - / { print substr($0, 1, 300); next }
/^[A-Za-z_][A-Za-z0-9_.]*: / { if (!seen[$0]++) { print; grab = 1 }; next }
/^$|^  File |^Stack Trace|^The above exception/ { grab = 0; next }
grab { print }'
# one stock CLI call (`dg launch --job <job> [--partition <key>]`), its output appended to the log;
# on failure: the failing step, Dagster's error lines and the log path, and exit status 1
launch() {  # label, then dg launch arguments
  local label=$1 out rc=0 start=$SECONDS
  shift
  out=$(mktemp)
  .venv/bin/dg launch --config-json "$BUILD_CONFIG" "$@" >"$out" 2>&1 || rc=$?
  { echo "=== $label: dg launch $*"; cat "$out"; } >>"$BUILD_LOG"
  # the run it ran (found in its output) gets the code location's origin, so the UI re-executes it (a failed
  # shard run above all); a launch that ran no run says so in the log
  .venv/bin/python -m synthkd_assets.cli adopt-run --launch-output "$out" >>"$BUILD_LOG" 2>&1 || true
  if [ "$rc" != 0 ]; then
    local why
    why=$(awk "$ERROR_LINES" "$out")  # Dagster's ERROR lines and each error message, without tracebacks
    { echo "FAILED: $label (exit $rc after $((SECONDS - start))s): dg launch $*"
      if [ -n "$why" ]; then echo "$why"; else tail -n 25 "$out"; fi
      echo "full log: $BUILD_LOG"; } >&2
    rm -f "$out"
    return 1
  fi
  rm -f "$out"
}
# a shard pass: one run per shard partition, a line per shard; keys arrive NUL-separated, so any file
# name is one argument
shard_run() {  # pass, its job, its steps, key
  local pass=$1 job=$2 select=$3 key=$4 start=$SECONDS index
  index=$(grep -zxnF -- "$key" "$BUILD_KEYS" | tr '\0' '\n' | head -n 1 | cut -d: -f1)
  launch "$pass $key" --job "$job" --partition "$key" || exit 255  # 255: xargs starts no further shard
  # shellcheck disable=SC2086
  echo "  $pass $key ($index/$BUILD_SHARDS): $(.venv/bin/python -m synthkd_assets.cli progress --partition "$key" --steps "$select" $BUILD_SMOKE) ($((SECONDS - start))s)"
}
export -f launch shard_run
each_shard() {  # pass name, its job, its steps: SYNTHKD_PARALLEL_RUNS shard runs at a time; stops at the first failure
  local start=$SECONDS
  echo "$1 pass over $BUILD_SHARDS shards: $3"
  job xargs -0 -r -P "${SYNTHKD_PARALLEL_RUNS:-1}" -I{} bash -c 'shard_run "$@"' _ "$1" "$2" "$3" {} < "$BUILD_KEYS" || (exit 1) || failed
  echo "$1 pass done ($((SECONDS - start))s)"
}
step() {  # label, its job, its steps: one unpartitioned run
  local start=$SECONDS
  job launch "$1" --job "$2" || failed
  echo "$1: $3 ($((SECONDS - start))s)"
}

if [ -z "$cluster" ]; then
  # this machine: every pass of synthkd_assets/defs/passes.py in one driver process, the shard runs of each shard
  # pass in SYNTHKD_PARALLEL_RUNS worker processes (default: every core), every run recorded in $DAGSTER_HOME's
  # instance; Dagster's lines go to the log, a failure prints the failing step, its errors and the log path; then
  # the summaries
  job .venv/bin/python -m synthkd_assets.cli build --log "$BUILD_LOG" --lock-fd 9 --parent-pid $$ "${smoke[@]}" || exit $?
else
  # 1. the pinned tokenizer and the raw inventory (registers one partition per raw shard)
  step inventory synth_inventory_job o200k_tokenizer,synth_raw_inventory
  export BUILD_KEYS BUILD_SHARDS
  BUILD_KEYS=$(mktemp)
  trap 'rm -f "$BUILD_KEYS"' EXIT
  .venv/bin/python -m synthkd_assets.cli partitions --null > "$BUILD_KEYS"
  BUILD_SHARDS=$(tr -cd '\0' < "$BUILD_KEYS" | wc -c)
  # 2. the scan pass, every shard partition: Harmony -> 001 quality filters (exercise x language counts) ->
  #    MinHash signatures of the user prompts
  each_shard scan synth_scan_job synth_harmony,synth_filtered,synth_signatures
  # 3. the near-duplicate clusters (cap, held-out clusters), the sampling plan from every shard's counts after them,
  #    the validation sets
  step plan synth_plan_job synth_clusters,synth_sampling_plan,synth_validation_sets
  # 4. the build pass, every shard partition: sampled -> tokens/masks -> Megatron trio + DistillKit parts
  each_shard build synth_build_job synth_sampled,synth_tokenized,synth_kd_v1,synth_distill
  # 5. provenance over all shards
  step manifest synth_manifests_job synth_harmony_manifest,synth_kd_v1_manifest,synth_distill_manifest
  # 6. the sequence pool: the B x C quota plan over every shard's tokens, the pool and its valuation features per
  #    shard, curriculum + manifest
  step quota synth_quota_job synth_quota_plan
  each_shard pool synth_pool_job synth_pool,synth_valuation_features
  step pool_manifest synth_pool_manifest_job synth_curriculum,synth_pool_manifest
  echo
  .venv/bin/python -m synthkd_assets.cli summary --build "${smoke[@]}" --manifest "$megatron_manifest" \
    --manifest "$distill_manifest" --manifest "$pool_manifest"
fi
