"""The raw-directory sensor, the manifests' automation sensor and the nightly schedule: what rebuilds
what, and when."""

import json
import os

import dagster as dg

from synthkd_assets.core import manifest as mf
from synthkd_assets.core.buildlock import build_in_progress
from synthkd_assets.core.cleanup import orphaned_outputs, sources_not_configured
from synthkd_assets.core.inventory import (
    InputManifestError,
    built_from_sha256,
    input_manifest_disagreements,
    partition_changes,
    read_input_manifest,
    scan_inputs,
    shards_to_rebuild,
)
from synthkd_assets.core.layout import DataLayout
from synthkd_assets.defs.assets import (
    synth_filtered,
    synth_harmony,
)
from synthkd_assets.defs.conditions import manifests_decision, runs_in_flight
from synthkd_assets.defs.ingest import raw_reports, synth_raw_inventory
from synthkd_assets.defs.jobs import (
    synth_build_job,
    synth_inventory_job,
    synth_manifests_job,
    synth_scan_job,
    synth_shard_job,
)
from synthkd_assets.defs.manifests import synth_harmony_manifest, synth_kd_v1_manifest
from synthkd_assets.defs.near_dup import synth_signatures
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.passes import MANIFEST_STEPS
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout
from synthkd_assets.defs.tags import ACTIVE_RUN_STATUSES, PARTITION_TAG, RUN_KEY_TAG, may_be_retried
from synthkd_contract import constants
from synthkd_contract import settings as env
from synthkd_contract.manifest_seal import sha256_file


def shard_run_key(key: str, sha256: str, after: int | None) -> str:
    """`<shard>:<sha256>:after-<id>`: one run key per (shard, content, its synth_harmony output when asked),
    shared by the sensor and the schedule so each sees the other's runs. Dagster never runs a sensor's run key
    twice: keyed by content alone, bytes built before (A -> B -> A -> B, or a shard removed and put back twice)
    would never be rebuilt; `after` (`latest_materializations`) makes each change a new key, and while nothing
    new is materialized (a run in flight, or a failed one) the same content is still asked for once."""
    return f"{key}:{sha256}:{after_suffix(after)}"


def shard_run_keys(instance: dg.DagsterInstance, keys: list[str], sha: dict[str, str]) -> dict[str, str]:
    """`shard_run_key` of each shard in `keys` with its content `sha[key]`, after its latest synth_harmony
    materialization: the one rule by which the sensor and the schedule key their shard runs."""
    built = latest_materializations(instance, synth_harmony.key, set(keys)) if keys else {}
    return {key: shard_run_key(key, sha[key], built.get(key)) for key in keys}


def after_suffix(storage_id: int | None) -> str:
    """`after-<storage id>` (`after-none`: never materialized), the part of a run key that changes with every
    materialization of what the run rewrites."""
    return f"after-{storage_id if storage_id is not None else 'none'}"


def latest_materializations(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, partitions: set[str] | None = None
) -> dict[str | None, int]:
    """The storage id of the latest materialization of `asset_key` per partition in `partitions` (one query), or
    of the unpartitioned asset under the key None; absent when never materialized."""
    if partitions is None:
        records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset_key), limit=1).records
        return {None: records[0].storage_id} if records else {}
    return dict(
        instance.get_latest_storage_id_by_partition(asset_key, dg.DagsterEventType.ASSET_MATERIALIZATION, partitions)
    )


# the jobs whose runs build a shard's scan and build steps, which a synth_shard_job run builds again
SHARD_BUILDING_JOBS = (synth_scan_job.name, synth_build_job.name, synth_shard_job.name)


def last_shard_run_failed(instance: dg.DagsterInstance, partition: str) -> bool:
    """Whether the newest run building `partition`'s shard steps (a run of SHARD_BUILDING_JOBS: the sensor's,
    the schedule's, a build's, a launch) failed for good: not one of another pass (a rebuild of the shard would
    not redo it), nor one that Dagster's run retries are about to launch again."""
    records = [
        record
        for job_name in SHARD_BUILDING_JOBS
        for record in instance.get_run_records(
            dg.RunsFilter(job_name=job_name, tags={PARTITION_TAG: partition}), limit=1
        )
    ]
    if not records:
        return False
    newest = max(records, key=lambda record: record.create_timestamp)
    failed = newest.dagster_run.status == dg.DagsterRunStatus.FAILURE
    return failed and not may_be_retried(newest, instance.run_retries_enabled)


def _wait_for_build(paths: DataLayout) -> dg.SkipReason | None:
    """A skip while a build (scripts/build.sh, build_all) holds the data root's lock: requested runs would race
    its writes, and what it builds is what the next tick compares against."""
    if build_in_progress(paths.build_lock()):
        return dg.SkipReason(f"a build holds {paths.build_lock()}: waiting for it to finish")
    return None


@dg.sensor(
    jobs=[synth_scan_job, synth_shard_job, synth_manifests_job, synth_inventory_job],
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Keeps one partition per raw shard file, and requests synth_shard_job for exactly the shards whose "
    "bytes changed (or appeared), sampled with the current plan (the plan is not recomputed: that is "
    "synth_plan_job, then a full rebuild); before any plan exists it requests only their scan pass "
    "(synth_scan_job). Requests synth_manifests_job when data/synth_harmony/manifest.json changes. Deletes no "
    "file: when a shard is gone it requests synth_inventory_job, whose synth_raw_inventory removes that shard's "
    "outputs, then synth_manifests_job.",
)
def synth_raw_sensor(
    context: dg.SensorEvaluationContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.SensorResult | dg.SkipReason:
    paths = layout.data_layout(build.smoke)
    if waiting := _wait_for_build(paths):
        return waiting
    if unconfigured := sources_not_configured(paths):  # not a removal: the daemon's shell lacks the variable
        return dg.SkipReason(unconfigured.message(paths.data_root))
    cursor = json.loads(context.cursor) if context.cursor else {"shards": {}, "harmony_manifest": None}
    shards = scan_inputs(paths)
    add, remove = partition_changes(context.instance.get_dynamic_partitions(SYNTH_SHARDS.name), shards)
    built_from = built_from_sha256(paths, [s.name for s in shards])
    rebuild = shards_to_rebuild(cursor["shards"], shards, built_from)
    sha = {s.name: s.sha256 for s in shards}
    # bytes changed since the last tick back to what the outputs were built from (after a failed rebuild, say):
    # nothing to rebuild, but synth_raw's version must be the bytes on disk again, or the UI shows the shard stale
    # for ever and synth_harmony refuses to read it; and when the shard's last run failed (it read the bytes in
    # between), it is rebuilt once from the same bytes, or the UI shows its partitions failed for ever
    returned = {s.name for s in shards if cursor["shards"].get(s.name, s.sha256) != s.sha256} - set(rebuild)
    rebuild += [name for name in sorted(returned) if last_shard_run_failed(context.instance, name)]
    # a global plan: a changed shard is rebuilt with the plan in force (its rates are global numbers, so
    # the other shards stay valid and untouched); without a plan only the scan pass can run
    job = synth_shard_job if paths.sampling_plan().is_file() else synth_scan_job
    run_keys = shard_run_keys(context.instance, rebuild, sha)
    # a rebuild asked for at an earlier tick whose run ended without building the shard (canceled while the sensor
    # was off, failed for good): Dagster never launches a run key twice, so it is said, with what finishes it
    asked = [s.name for s in shards if cursor["shards"].get(s.name) == s.sha256 != built_from.get(s.name)]
    ended = ended_rebuilds(context.instance, shard_run_keys(context.instance, asked, sha))
    run_requests = [dg.RunRequest(job_name=job.name, partition_key=key, run_key=run_keys[key]) for key in rebuild]
    if ended and run_requests:
        context.log.warning(ended_rebuilds_reason(ended))
    manifest_path = paths.harmony_manifest()
    manifest_sha = sha256_file(manifest_path) if manifest_path.is_file() else None
    changed = cursor["harmony_manifest"] is not None and manifest_sha != cursor["harmony_manifest"]
    # a rewrite by a materialization is followed by synth_manifests_automation; only another change is this sensor's
    if changed and not rebuild and manifest_sha != _last_written_harmony_manifest(context.instance):
        written = latest_materializations(context.instance, synth_harmony_manifest.key).get(None)
        run_requests.append(
            dg.RunRequest(
                job_name=synth_manifests_job.name, run_key=f"harmony_manifest:{manifest_sha}:{after_suffix(written)}"
            )
        )
    requests = []
    if add:
        requests.append(SYNTH_SHARDS.build_add_request(add))
    # a key with a queued or running run stays until that run ends: deleted under it, the run would fail with
    # Dagster's "not a valid range" trace instead of synth_harmony's "names no input file" (a key added by hand)
    remove = [key for key in remove if not _has_active_run(context.instance, {PARTITION_TAG: key})]
    if remove:
        requests.append(SYNTH_SHARDS.build_delete_request(remove))
    # outputs of shards no longer in the raw directory (found on disk, so a fresh instance finds them too): the
    # sensor deletes nothing; it asks for synth_inventory_job, whose synth_raw_inventory removes them in a run of
    # its own (its metadata lists them), then, once they are gone, for the manifests to list what is left
    orphaned = [str(p) for p in orphaned_outputs(paths, list(sha))]
    events = list(raw_reports(shards, set(rebuild) | returned))
    removal = cursor.get("removed")
    if orphaned:
        removal = mf.config_hash(orphaned)
        tidied = latest_materializations(context.instance, synth_raw_inventory.key).get(None)
        context.log.warning(
            f"raw shards gone ({remove or 'not registered here'}): their {len(orphaned)} output files are removed by "
            f"a run of {synth_inventory_job.name}"
        )
        run_key = f"removed:{removal}:{after_suffix(tidied)}"  # the same files may be orphaned again later
        run_requests.append(dg.RunRequest(job_name=synth_inventory_job.name, run_key=run_key))
    elif removal is not None:
        writing = runs_in_flight(context.instance, frozenset(MANIFEST_STEPS))  # two runs would write the same manifests
        if writing:
            context.log.info(f"the manifests' run {writing[0].run_id[:8]} is in flight: they follow the removal after")
        elif not rebuild and paths.sampling_plan().is_file():  # a rebuild is followed by synth_manifests_automation
            written = latest_materializations(context.instance, synth_kd_v1_manifest.key).get(None)
            run_key = f"removed:{removal}:manifests:{after_suffix(written)}"
            run_requests.append(dg.RunRequest(job_name=synth_manifests_job.name, run_key=run_key))
        removal = removal if writing else None
    return dg.SensorResult(
        run_requests=run_requests,
        # what the tick history shows for a tick that launched nothing, instead of only its cursor
        skip_reason=None if run_requests else idle_tick_reason(len(shards), add, remove, ended),
        dynamic_partitions_requests=requests,
        asset_events=events,
        cursor=json.dumps({"shards": sha, "harmony_manifest": manifest_sha, "removed": removal}, sort_keys=True),
    )


def ended_rebuilds(instance: dg.DagsterInstance, run_keys: dict[str, str]) -> dict[str, dg.DagsterRun]:
    """The shards of `run_keys` (shard -> the run key the sensor would request) whose run under that key has
    ended without succeeding (canceled, or failed with no retry to come): asking again would launch nothing."""
    ended = {}
    for shard, run_key in run_keys.items():
        records = instance.get_run_records(dg.RunsFilter(tags={RUN_KEY_TAG: run_key}), limit=1)
        run = records[0].dagster_run if records else None
        if run is not None and run.is_finished and run.status != dg.DagsterRunStatus.SUCCESS:
            if not may_be_retried(records[0], instance.run_retries_enabled):
                ended[shard] = run
    return ended


def ended_rebuilds_reason(ended: dict[str, dg.DagsterRun]) -> str:
    """What the tick history says of rebuilds whose runs ended unbuilt: each run, how it ended, and what to do."""
    runs = "; ".join(
        f"{shard}: run {run.run_id[:8]} {run.status.value.lower()}" for shard, run in sorted(ended.items())
    )
    return (
        f"not rebuilt, their rebuild ended without building them ({runs}): re-execute the run from its page "
        "(Runs) once its cause is fixed, or run ./scripts/build.sh"
    )


def idle_tick_reason(
    shards: int, added: list[str], removed: list[str], ended: dict[str, dg.DagsterRun] | None = None
) -> str:
    """Why a tick of synth_raw_sensor requested no run, in the words the sensor's tick history shows."""
    said = [ended_rebuilds_reason(ended)] if ended else []
    other = f"other {shards - len(ended)}" if ended else str(shards)
    said.append(
        f"nothing {'else ' if ended else ''}to rebuild: the bytes of the {other} input shards are those their "
        "outputs were built from (or their rebuild is already queued), and synth_harmony's manifest is the one written"
    )
    if added:
        said.append(f"registered {len(added)} new partitions: {', '.join(added[:3])}" + (", ..." if added[3:] else ""))
    if removed:
        said.append(f"removed {len(removed)} partitions of input files gone: {', '.join(removed[:3])}")
    return "; ".join(said)


def _last_written_harmony_manifest(instance: dg.DagsterInstance) -> str | None:
    """sha256 of the manifest.json the latest synth_harmony_manifest materialization wrote."""
    event = instance.get_latest_materialization_event(synth_harmony_manifest.key)
    written = (
        event.asset_materialization.metadata.get("manifest_sha256") if event and event.asset_materialization else None
    )
    return written.value if written is not None else None


@dg.sensor(
    job=synth_manifests_job,
    name="synth_manifests_automation",
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="After the shards the manifests list are rebuilt (by the raw sensor, the schedule, a backfill or by "
    "hand), requests one run of synth_manifests_job rewriting the due manifests, with their checks: once no run "
    "or backfill writing what they read is queued or in progress, no failed run awaits its retry, no build holds "
    "the data root and every shard is built in the code location's layout (not only by a smoke build). Each tick "
    "says which manifests are due and what they wait for.",
)
def synth_manifests_automation(context: dg.SensorEvaluationContext) -> dg.RunRequest | dg.SkipReason:
    decision = manifests_decision(context.instance, DataLayout.from_environ(os.environ))
    if not decision.due:
        return dg.SkipReason(decision.reason)
    context.log.info(decision.reason)
    return dg.RunRequest(run_key=decision.run_key, asset_selection=[dg.AssetKey(m) for m in decision.due])


REBUILD_CRON_ENV = env.REBUILD_CRON.name


def evaluate_nightly_rebuild(
    context: dg.ScheduleEvaluationContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.SkipReason | list[dg.RunRequest]:
    """Compares each raw shard's sha256 (checked against the input manifest when it exists) with the source
    sha256 its current synth_harmony output was built from; requests exactly the shards that differ or are new,
    reporting their new synth_raw versions first, and the shards whose newest run failed."""
    paths = layout.data_layout(build.smoke)
    if waiting := _wait_for_build(paths):
        return waiting
    shards = scan_inputs(paths)
    manifest_path = paths.input_manifest()
    listed = read_input_manifest(manifest_path)
    if listed is not None:
        problems = input_manifest_disagreements(listed, shards)
        if problems:  # a half-copied input directory is not built piecemeal
            raise InputManifestError(
                f"{manifest_path} disagrees with the raw files, nothing requested:\n" + "\n".join(problems)
            )
    # the sensor's rule; no cursor: what each shard's outputs on disk were built from is the reference
    rebuild = shards_to_rebuild({}, shards, built_from_sha256(paths, [s.name for s in shards]))
    # built from the bytes on disk, but its newest run failed (a rebuild of the same bytes, or of bytes put back
    # since): asked for again, or the UI shows its partitions failed for ever
    rebuild += [s.name for s in shards if s.name not in rebuild and last_shard_run_failed(context.instance, s.name)]
    against = f"the input manifest {manifest_path}" if listed is not None else "the raw files"
    if not rebuild:
        return dg.SkipReason(
            f"nothing changed: all {len(shards)} shards are built from {against}, and no shard's newest run failed"
        )
    sha = {s.name: s.sha256 for s in shards}
    run_keys = shard_run_keys(context.instance, rebuild, sha)  # the sensor's: an in-flight run of either is found
    in_flight = [key for key in rebuild if _has_active_run(context.instance, {RUN_KEY_TAG: run_keys[key]})]
    rebuild = [key for key in rebuild if key not in in_flight]
    if not rebuild:
        return dg.SkipReason(
            f"changed shards already queued or running (sensor or earlier tick): {', '.join(in_flight)}"
        )
    add, _ = partition_changes(context.instance.get_dynamic_partitions(SYNTH_SHARDS.name), shards)
    if add:  # new files the sensor has not registered yet (it may be stopped)
        context.instance.add_dynamic_partitions(SYNTH_SHARDS.name, add)
    # synth_raw's new versions, as the sensor reports them (a schedule returns no asset events): synth_harmony
    # builds exactly the version reported, and the UI's lineage and staleness follow
    for event in raw_reports(shards, set(rebuild)):
        context.instance.report_runless_asset_event(event)
    # without a sampling plan only the scan pass can run (synth_scan_job's assets, as a subset of this job)
    scan_only = (
        None if paths.sampling_plan().is_file() else [synth_harmony.key, synth_filtered.key, synth_signatures.key]
    )
    return [dg.RunRequest(partition_key=key, run_key=run_keys[key], asset_selection=scan_only) for key in rebuild]


def nightly_rebuild_schedule(cron: str) -> dg.ScheduleDefinition:
    """synth_nightly_rebuild on `cron`: built when the code location loads (definitions.py), with
    $SYNTHKD_REBUILD_CRON (`Settings.rebuild_cron`), so importing this module reads no environment."""
    return dg.schedule(
        job=synth_shard_job,
        cron_schedule=cron,
        name="synth_nightly_rebuild",
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description="Nightly (03:00, or $SYNTHKD_REBUILD_CRON): compares each raw shard's sha256 (checked against "
        f"<raw dir>/{constants.INPUT_MANIFEST_FILENAME} when that file exists) with the source sha256 its current "
        "synth_harmony output was built from, and requests synth_shard_job for exactly the shards that differ or "
        "are new, or whose newest run failed (only their scan pass while no sampling plan exists). Skips when "
        "nothing changed; fails, naming "
        "each file, when the input manifest and the raw files disagree.",
    )(evaluate_nightly_rebuild)


def _has_active_run(instance: dg.DagsterInstance, tags: dict[str, str]) -> bool:
    """Whether a run with `tags` is queued or running."""
    return bool(instance.get_runs(dg.RunsFilter(tags=tags, statuses=list(ACTIVE_RUN_STATUSES)), limit=1))
