"""Asset checks: in-asset ones for partitioned steps (results built here), standalone ones on the
tokenizer and the dataset manifests. Blocking but the WARNs: downstream never runs on data that failed one, and a
dataset manifest verifies only once each of its blocking checks has passed on it."""

import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg

from synthkd_assets.core import manifest as mf
from synthkd_assets.core.checks import (
    dataset_rows_problems,
    input_drift,
    manifest_problems,
    output_tables,
    pool_tables,
    schema_problems,
    split_leakage,
    unreadable_shards,
    validation_rows_trained,
)
from synthkd_assets.core.dataset_manifest import record_check_verdict, sealed_digest, write_sealed_manifest
from synthkd_assets.core.distill_io import (
    DistillShardResult,
    distill_part_problems,
    parts_checked_when_written,
    rows_valid_for,
)
from synthkd_assets.core.distill_io import split_leakage as distill_split_leakage
from synthkd_assets.core.harmony_artifact import dataset_config, layout_artifact
from synthkd_assets.core.inventory import built_from_sha256, scan_inputs, shard_index_from_name
from synthkd_assets.core.layout import DataLayout
from synthkd_assets.core.megatron_io import ShardSplitInventory, trio_alignment_problems
from synthkd_assets.core.near_dup import heldout_prompts_trained
from synthkd_assets.core.parallel import thread_map
from synthkd_assets.core.problems import Problems, problem_total
from synthkd_assets.core.quota import QUOTA_SHARE_TOLERANCE, bucket_balance, share_miss_problems
from synthkd_assets.core.report import ShardReport, why_shard_is_empty
from synthkd_assets.core.round_trip import RoundTrip
from synthkd_assets.core.stages import documents_path
from synthkd_assets.core.tokenizer import TokenizerPinError, verify_tokenizer
from synthkd_assets.core.validation import cross_shard_duplicates
from synthkd_assets.defs.jobs import repair_action
from synthkd_assets.defs.metadata import (
    FILES_SHA256,
    HELDOUT_MATCHED,
    ROWS_VALID_FOR,
    TRIO_ALIGNED,
    URI,
    current_sha256,
    files_sha256_of,
    hashed_files_of,
    heldout_matched_of,
    latest_partition_materialization,
    latest_partition_materializations,
    readable_metadata,
)
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout
from synthkd_assets.defs.tags import DATA_VERSION_TAG
from synthkd_assets.defs.upstream import shard_names
from synthkd_contract import constants
from synthkd_contract.buckets import BUCKET_IMBALANCE_RATIO
from synthkd_contract.manifest_seal import (
    HashedFile,
    manifest_files,
    sha256_file,
    sha256_files,
    unchanged_since_hashed,
)
from synthkd_contract.sources import SYNTH_SOURCE, partition_source

ROWS_ACCOUNTED = "rows_accounted"
TRIO_ALIGNMENT = "trio_alignment"
DISTILL_ROWS_VALID = "distill_rows_valid"
POOL_TRIO_ALIGNMENT = "pool_trio_alignment"
BUCKET_BALANCE = "bucket_balance"
HARMONY_ROUND_TRIP = "harmony_round_trip"
# the in-asset (per-shard) checks: what each verifies, shown in the UI next to every result
SHARD_CHECK_DESCRIPTIONS = {
    ROWS_ACCOUNTED: "Every input row of this shard is accounted for: rows in == rows out + rows dropped "
    "(each drop counted under its reason).",
    TRIO_ALIGNMENT: "The Megatron trio just written for this shard (tokens int32 / lossmask uint8 / span uint8, "
    "train and valid): equal sequence_lengths and document_indices, dtypes, loss_mask in {0,1}, span in {0,1,2}, "
    "loss_mask==0 iff span==0, every document ending with EOD carrying 0/0, readable by megatron-core.",
    POOL_TRIO_ALIGNMENT: "Every per-cell trio of the pool just written for this shard (split/B_C/shard_XX): the "
    "same alignment rules as trio_alignment, readable by megatron-core.",
    HARMONY_ROUND_TRIP: "Every conversation just written, parsed back by openai-harmony "
    "(parse_messages_from_completion_tokens, after its EOD), gives exactly its synth_harmony messages: role, name, "
    "channel, recipient, content_type and text; the system message as harmony renders it; <|return|> before the EOD.",
    DISTILL_ROWS_VALID: "The DistillKit parts just written for this shard, their rows checked as they were handed "
    "to Parquet and their schema read back from each footer: schema, labels == input_ids where labels != -100, -100 "
    "exactly before assistant_token_start, span counts, max_seq_len, split rule, ids.",
}
PROBLEMS_IN_TEXT = 5  # problems quoted in a result's description
PROBLEMS_IN_METADATA = 50  # problems listed in a result's metadata ('problems'); problem_count counts them all
MISMATCHES_IN_METADATA = 10  # round-trip mismatches shown field by field in a result's metadata


def shard_check_spec(name: str, asset: str) -> dg.AssetCheckSpec:
    """The spec of a per-shard check evaluated inside `asset`'s step (blocking, with its description),
    partitioned like the asset: the UI shows its result per shard."""
    return per_shard_check(name, asset=asset, blocking=True, description=SHARD_CHECK_DESCRIPTIONS[name])


def per_shard_check(name: str, **kwargs) -> dg.AssetCheckSpec:
    """An AssetCheckSpec partitioned by shard (a preview feature in Dagster 1.13, said here once, not on every
    load): its results are recorded per partition, so the UI shows each shard's verdict and the latest one of
    every partition, rather than comparing the last execution with the last materialization of any shard."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return dg.AssetCheckSpec(name, partitions_def=SYNTH_SHARDS, **kwargs)


def current_partition() -> str | None:
    """The partition of the asset step being executed, if any (None in a standalone check or outside a run)."""
    try:
        context = dg.AssetExecutionContext.get()
    except Exception:  # no step in scope, or a standalone check's context
        return None
    return context.partition_key if context.has_partition_key else None


def verdict_text(problems: list[str], passed_summary: str = "", partition: str | None = None) -> str:
    """The check's verdict as one readable line: what failed and where (shard, file), or what passed."""
    where = f"partition {partition}: " if partition else ""
    if not problems:
        return f"{where}passed" + (f": {passed_summary}" if passed_summary else "")
    total = problem_total(problems)
    quoted = "; ".join(problems[:PROBLEMS_IN_TEXT])
    more = f" (and {total - PROBLEMS_IN_TEXT} more; up to {PROBLEMS_IN_METADATA} in metadata 'problems')"
    more = more if total > PROBLEMS_IN_TEXT else ""
    return f"{where}FAILED, {total} problem{'s' if total != 1 else ''}: {quoted}{more}"


CHECK_SUMMARY = "summary"  # a check's verdict, first in its metadata: what the run's page shows of a check


def check_result(*, description: str, metadata: Mapping[str, Any] | None = None, **fields: Any) -> dg.AssetCheckResult:
    """`dg.AssetCheckResult` whose verdict (`description`) also leads its metadata (CHECK_SUMMARY): a run's page
    shows a check's metadata, not its description; the metadata as a person reads it (`readable_metadata`)."""
    readable = readable_metadata(metadata or {})
    return dg.AssetCheckResult(
        description=description,
        metadata={CHECK_SUMMARY: dg.MetadataValue.text(description), **readable},
        **fields,
    )


def _result(
    problems: list[str],
    check_name: str | None = None,
    passed_summary: str = "",
    partition: str | None = None,
    **metadata,
) -> dg.AssetCheckResult:
    partition = partition or current_partition()
    where = {"partition": partition} if partition else {}
    return check_result(
        check_name=check_name,
        passed=not problems,
        severity=dg.AssetCheckSeverity.ERROR,
        description=verdict_text(problems, passed_summary, partition),
        metadata={
            **where,
            "problems": dg.MetadataValue.json(problems[:PROBLEMS_IN_METADATA]),
            "problem_count": problem_total(problems),
            **metadata,
        },
    )


# the dataset manifests that verify only once every blocking check on their asset has passed on them
GATED_MANIFESTS: dict[str, Callable[[DataLayout], Path]] = {
    "synth_kd_v1_manifest": DataLayout.megatron_manifest,
    "synth_distill_manifest": DataLayout.distill_manifest,
    "synth_pool_manifest": DataLayout.pool_manifest,
}


def gating_checks(asset: str) -> list[str]:
    """The blocking standalone checks of a gated manifest's asset: the markers its asset writes before the
    manifest, each removed when that check passes on it."""
    key = dg.AssetKey(asset)
    specs = (spec for check in STANDALONE_CHECKS for spec in check.check_specs)
    return sorted(spec.name for spec in specs if spec.asset_key == key and spec.blocking)


def write_gated_manifest(context: dg.AssetExecutionContext, paths: DataLayout, manifest: dict) -> str:
    """Write the manifest of the asset being materialized, sealed and held for every blocking check on that
    asset (core/dataset_manifest.py); returns its sha256."""
    asset = context.asset_key.to_user_string()
    return write_sealed_manifest(GATED_MANIFESTS[asset](paths), manifest, gating_checks(asset))


class CheckGate:
    """A gated check's verdict recorder, opened as the check starts (it notes which manifest is sealed now): called
    with the check's result, it records it beside that manifest and returns it; used as a context manager, it also
    records an exception escaping the check as its failure. A failure recorded there keeps the dataset from
    verifying (synthkd_contract.manifest_seal.verify_manifest), a pass removes the check's marker; a verdict on a
    manifest rewritten meanwhile is dropped."""

    def __init__(self, manifest: Path, name: str) -> None:
        self.manifest, self.name = manifest, name
        self.checked = sealed_digest(manifest)

    def __call__(self, result: dg.AssetCheckResult) -> dg.AssetCheckResult:
        record_check_verdict(self.manifest, self.name, self.checked, None if result.passed else result.description)
        return result

    def __enter__(self) -> "CheckGate":
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, traceback: object) -> bool:
        if isinstance(error, Exception):
            with contextlib.suppress(OSError):  # the check's own error is the one to report
                record_check_verdict(self.manifest, self.name, self.checked, f"error: {type(error).__name__}: {error}")
        return False


def gate(paths: DataLayout, asset: str, name: str) -> CheckGate:
    """The verdict recorder of check `name` on the gated manifest of `asset`: `with gate(...) as record:`."""
    return CheckGate(GATED_MANIFESTS[asset](paths), name)


def rows_accounted_result(report: ShardReport) -> dg.AssetCheckResult:
    """rows in == rows out + rows dropped: no row disappears without a counted reason."""
    dropped = sum(report.dropped.values())
    problems = (
        []
        if report.rows_in == report.rows_out + dropped
        else [f"{report.shard}: {report.rows_in} rows in but {report.rows_out} out + {dropped} dropped"]
    )
    return _result(
        problems,
        ROWS_ACCOUNTED,
        f"{report.rows_in} rows in = {report.rows_out} out + {dropped} dropped",
        report.shard,
        rows_in=report.rows_in,
        rows_out=report.rows_out,
        rows_dropped=dropped,
    )


def harmony_round_trip_result(round_trip: RoundTrip) -> dg.AssetCheckResult:
    """The written tokens parse back to their synth_harmony messages; mismatches named by synth_id."""
    first = [dataclasses.asdict(m) for m in round_trip.mismatches[:MISMATCHES_IN_METADATA]]
    return _result(
        [str(m) for m in round_trip.mismatches],
        HARMONY_ROUND_TRIP,
        f"{round_trip.conversations} conversations parse back to their synth_harmony messages",
        conversations_checked=round_trip.conversations,
        mismatches=len(round_trip.mismatches),
        first_mismatches=dg.MetadataValue.json(first),
    )


def trio_alignment_result(root: Path, inventories: list[ShardSplitInventory]) -> dg.AssetCheckResult:
    """The written trio: equal lengths/boundaries, dtypes, mask domains, EOD 0/0 at every document end."""
    problems = [
        problem
        for inventory in inventories
        if inventory.sequences
        for problem in trio_alignment_problems(root / inventory.split, inventory.shard_index)
    ]
    sequences = sum(i.sequences for i in inventories)
    checked = ", ".join(
        f"{i.split}/shard_{i.shard_index:02d} ({i.sequences} documents)" for i in inventories if i.sequences
    )
    return _result(problems, TRIO_ALIGNMENT, f"{checked or 'no documents written'} aligned", sequences=sequences)


def pool_trio_alignment_result(
    trio_root: Path, inventories: dict[tuple[str, str], ShardSplitInventory]
) -> dg.AssetCheckResult:
    """The pool's per-cell trios just written: the trio_alignment rules for every cell that got documents."""
    written = {(split, cell): i for (split, cell), i in sorted(inventories.items()) if i.sequences}
    problems = [
        f"{cell}: {problem}"
        for (split, cell), i in written.items()
        for problem in trio_alignment_problems(trio_root / split / cell, i.shard_index)
    ]
    sequences = sum(i.sequences for i in written.values())
    summary = f"{len(written)} cell trios ({sequences} documents) aligned" if written else "no documents written"
    return _result(problems, POOL_TRIO_ALIGNMENT, summary, sequences=sequences)


BUCKET_BALANCE_SPEC = dg.AssetCheckSpec(
    BUCKET_BALANCE,
    asset="synth_pool_manifest",
    blocking=False,
    description=f"WARN when one skill bucket of the pool holds more than {BUCKET_IMBALANCE_RATIO}x the tokens of "
    "another (004 balance reporting); names the smallest bucket and says whether the quota plan means it "
    "(expected, no action: the skill_mix targets or buckets the corpus cannot fill) or not (needs action: "
    "rebuild the pool). balance_tokens truncates to the smallest bucket.",
)


POOL_PUBLISHED = "pool_published"
POOL_PUBLISHED_SPEC = dg.AssetCheckSpec(
    POOL_PUBLISHED,
    asset="synth_pool_manifest",
    blocking=False,
    description="Whether the pool is published: passes when this asset writes the sealed manifest; fails, reported "
    "by what removed them, once the pool's manifest and curriculum stage files are removed because a pool shard "
    "was rewritten or its raw shard removed (they would list or blend other rows), until ./scripts/build.sh or "
    "the pool launches (docs/pool.md) publish it again.",
)


POOL_CURRENT = "pool_current"
POOL_CURRENT_SPEC = dg.AssetCheckSpec(
    POOL_CURRENT,
    asset="synth_pool_manifest",
    blocking=False,
    description="Whether every shard's pool part is built from the shard as it is now (its synth_tokenized): "
    "evaluated when this asset is written, and reported failed by the run that rebuilds a shard's synth_tokenized "
    "with other bytes after its pool part (the raw sensor's rebuild of a changed shard, a launch from the UI), "
    "naming the shards and the launch that brings the pool up to date. A warning: the published pool stays "
    "consistent with itself, built from the shards as they were.",
)


def stale_pool_shards(instance: dg.DagsterInstance, shards: Sequence[str]) -> list[str]:
    """The shards of `shards` whose latest synth_tokenized has other bytes (data version) than the one their
    latest synth_pool part was built from, or that have a synth_tokenized and no pool part."""
    materialized = dg.DagsterEventType.ASSET_MATERIALIZATION
    wanted = set(shards)
    tokenized_key, pool_key = dg.AssetKey("synth_tokenized"), dg.AssetKey("synth_pool")
    tokenized = instance.get_latest_storage_id_by_partition(tokenized_key, materialized, wanted)
    pool = instance.get_latest_storage_id_by_partition(pool_key, materialized, wanted)

    def version(shard: str, before: int | None = None) -> str | None:
        materialization = latest_partition_materialization(instance, tokenized_key, shard, before)
        return materialization.tags.get(DATA_VERSION_TAG) if materialization else None

    stale = []
    for shard in shards:
        built, part = tokenized.get(shard), pool.get(shard)
        if built is None or (part is not None and part > built):
            continue
        if part is None or version(shard) != version(shard, before=part):
            stale.append(shard)
    return stale


def pool_current_result(stale: Sequence[str], pool: str) -> dg.AssetCheckResult:
    """`pool_current`'s verdict over every shard: the stale ones named, with the launch that rebuilds them."""
    if not stale:
        return check_result(
            check_name=POOL_CURRENT,
            passed=True,
            severity=dg.AssetCheckSeverity.WARN,
            description="every shard's pool part is built from its current synth_tokenized",
        )
    named = ", ".join(stale[:5]) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
    return check_result(
        check_name=POOL_CURRENT,
        passed=False,
        severity=dg.AssetCheckSeverity.WARN,
        description=f"needs action: the pool {pool} predates the rebuild of {len(stale)} shard(s): {named}. "
        f"Rebuild their parts ({repair_action('synth_pool', stale[0])}"
        f"{', and so for each' if len(stale) > 1 else ''}), then the manifest "
        f"({repair_action('synth_pool_manifest', stale[0])}), or run ./scripts/build.sh",
        metadata={"stale_shards": list(stale)},
    )


def runless_evaluation(result: dg.AssetCheckResult, asset_key: dg.AssetKey) -> dg.AssetCheckEvaluation:
    """`result` as an evaluation a run logs for another asset's check (`context.log_event`), or a sensor reports."""
    return dg.AssetCheckEvaluation(
        asset_key=asset_key,
        check_name=result.check_name,
        passed=result.passed,
        severity=result.severity,
        description=result.description,
        metadata=result.metadata,
    )


def pool_current_event(instance: dg.DagsterInstance, shard: str, pool: str) -> dg.AssetCheckEvaluation | None:
    """The failed `pool_current` evaluation a run that rebuilt `shard` reports (runless, on synth_pool_manifest)
    when that left the shard's pool part older than the shard, naming it with the shards the previous failed
    evaluation named (each shard's step checks its own shard only: a whole rebuild of N shards asks N small
    questions, not N x N; synth_pool_manifest's own evaluation checks every shard); None when the part is current.
    """
    if not stale_pool_shards(instance, [shard]):
        return None
    key = dg.AssetCheckKey(dg.AssetKey("synth_pool_manifest"), POOL_CURRENT)
    history = instance.event_log_storage.get_asset_check_execution_history(key, limit=1)
    previous = history[0].event.dagster_event.event_specific_data if history and history[0].event else None
    named = previous.metadata.get("stale_shards") if previous is not None and not previous.passed else None
    stale = sorted({shard, *(named.value if named is not None else [])})
    return runless_evaluation(pool_current_result(stale, pool), key.asset_key)


def pool_published_result(digest: str) -> dg.AssetCheckResult:
    return check_result(
        check_name=POOL_PUBLISHED, passed=True, description=f"published: sealed manifest sha256 {digest[:12]}"
    )


def pool_unpublished_events(paths: DataLayout, removed: list[Path], why: str) -> list[dg.AssetCheckEvaluation]:
    """The failed `pool_published` evaluation to report (runless) when `removed` took the pool's sealed manifest
    (none otherwise): so the UI shows the pool unpublished, not the last manifest's green materialization."""
    if paths.pool_manifest() not in removed:
        return []
    unpublished = check_result(
        asset_key=dg.AssetKey("synth_pool_manifest"),
        check_name=POOL_PUBLISHED,
        passed=False,
        description=f"unpublished: {why}; its manifest and curriculum stage files were removed. Publish it again "
        "with ./scripts/build.sh or the pool launches (docs/pool.md)",
        metadata={"removed_files": sorted(str(paths.recorded(p)) for p in removed)},
    )
    return [runless_evaluation(unpublished, unpublished.asset_key)]


NEAR_DUP_CONTROLLED = "near_dup_controlled"
NEAR_DUP_CONTROLLED_SPEC = per_shard_check(
    NEAR_DUP_CONTROLLED,
    asset="synth_sampled",
    blocking=False,
    description="WARN when rows of this shard were sampled without the near-duplicate clusters' decisions (rows the "
    "clusters in force never saw: a shard added, or changed under new synth_ids, after them: kept without a cluster "
    "cap until synth_plan_job or build.sh re-plans), or when rows outside the held-out clusters have a held-out "
    "prompt (its MinHash signature matched at the near-duplicate threshold, whatever the synth_id): those are held "
    "out all the same, and counted (heldout_copies).",
)


def near_dup_controlled_result(partition: str, unseen: int, rows: int, copies: int = 0) -> dg.AssetCheckResult:
    """WARN (non-blocking) when `unseen` of the shard's `rows` had no decision from the clusters in force, or
    `copies` rows outside the held-out clusters had a held-out prompt (held out all the same)."""
    if unseen == 0 and copies == 0:
        verdict = f"passed: all {rows} rows sampled under the clusters' decisions (cap, held-out clusters)"
    else:
        verdict = (
            f"WARN: {unseen} of {rows} rows are not in the clusters in force (the shard was added or changed after "
            f"them) and {copies} rows outside the held-out clusters have a held-out prompt (an exact or near copy, "
            "whatever the synth_id): those were held out; the unseen rest is kept without a cluster cap; re-plan "
            "(synth_plan_job, or build.sh) to fix it"
        )
    return check_result(
        check_name=NEAR_DUP_CONTROLLED,
        passed=unseen == 0 and copies == 0,
        severity=dg.AssetCheckSeverity.WARN,
        description=f"partition {partition}: {verdict}",
        metadata={"partition": partition, "rows_unseen_by_clusters": unseen, "heldout_copies": copies},
    )


SHARD_NOT_EMPTY = "shard_not_empty"
SHARD_NOT_EMPTY_SPEC = per_shard_check(
    SHARD_NOT_EMPTY,
    asset="synth_kd_v1",
    blocking=False,
    description="WARN when the shard writes no document: its input file has no rows, or every row was dropped on "
    "the way (each step's drops by reason are named). The shard's steps succeed and its files are valid but empty: "
    "expected for a shard of rows the build refuses or samples out (e.g. a small anchor file under the source "
    "mix), else look at the reasons and the error logs.",
)


def shard_not_empty_result(partition: str, reports: Mapping[str, Mapping[str, Any]]) -> dg.AssetCheckResult:
    """WARN (non-blocking) when the shard's steps (`reports`, in step order) wrote no row (`why_shard_is_empty`)."""
    why = why_shard_is_empty(reports)
    last = next(reversed(reports.values()), {})
    return check_result(
        check_name=SHARD_NOT_EMPTY,
        passed=why is None,
        severity=dg.AssetCheckSeverity.WARN,
        description=f"partition {partition}: "
        + (f"passed: {last.get('rows_out', 0)} rows written" if why is None else f"WARN: no row written, {why}"),
        metadata={"partition": partition, "rows_written": last.get("rows_out", 0)},
    )


def bucket_balance_result(
    achieved_tokens: Mapping[str, Mapping[str, float]],
    expected_tokens: Mapping[str, float],
    infeasible: Sequence[Mapping[str, Any]],
) -> dg.AssetCheckResult:
    """WARN (non-blocking) when the skill buckets that hold tokens differ by more than BUCKET_IMBALANCE_RATIO,
    saying whether the quota plan means it (no action needed) or not (`core/quota.py` bucket_balance)."""
    tokens = {b: sum(cells.values()) for b, cells in achieved_tokens.items()}
    balance = bucket_balance(tokens, expected_tokens, infeasible, BUCKET_IMBALANCE_RATIO)
    metadata: dict[str, Any] = {f"tokens_{b}": n for b, n in tokens.items()}
    if balance.smallest is not None:
        metadata.update(ratio=round(balance.ratio, 3), smallest_bucket=balance.smallest)
    verdict = "balanced" if balance.balanced else "expected" if balance.planned else "needs action"
    return check_result(
        check_name=BUCKET_BALANCE,
        passed=balance.balanced,
        severity=dg.AssetCheckSeverity.WARN,
        description=balance.sentence,
        metadata={**metadata, "verdict": verdict},
    )


def distill_rows_result(result: DistillShardResult) -> dg.AssetCheckResult:
    """The parts just written: labels, spans, max length, split rule and ids (all kinds), on the rows as they were
    written, and each part's schema in its footer (`DistillStep.written_rows_problems`)."""
    rows = sum(record["rows"] for record in result.files)
    checked = ", ".join(f"{record['path']} ({record['rows']} rows)" for record in result.files)
    return _result(result.row_problems, DISTILL_ROWS_VALID, f"{checked or 'no parts written'} valid", rows=rows)


@dg.asset_check(asset="o200k_tokenizer", blocking=True, description="The file on disk has the pinned sha256.")
def tokenizer_sha256_pin(layout: SynthKDLayout, build: SynthKDBuildConfig) -> dg.AssetCheckResult:
    paths = layout.data_layout(build.smoke)
    try:
        digest = verify_tokenizer(paths.tokenizer_file())
    except TokenizerPinError as error:
        return _result([str(error)])
    return _result([], passed_summary=f"sha256 {digest[:12]}… is the pinned one", sha256=digest)


@dg.asset_check(
    asset="synth_harmony_manifest",
    blocking=True,
    description="Every raw shard still has the sha256 that synth_harmony computed from the bytes it read (its "
    "report; current hashes cached by size and mtime), and no shard appeared or vanished since the manifest.",
)
def raw_inputs_unchanged(layout: SynthKDLayout, build: SynthKDBuildConfig) -> dg.AssetCheckResult:
    paths = layout.data_layout(build.smoke)
    manifest = mf.read_json(paths.harmony_manifest())
    current = {s.name: s.sha256 for s in scan_inputs(paths)}
    built_from = built_from_sha256(paths, [entry["name"] for entry in manifest["shards"]])
    read_time = [{"name": name, "source": {"sha256": sha256}} for name, sha256 in built_from.items()]
    return _result(
        input_drift(read_time, current),
        passed_summary=f"{len(current)} raw shards match the hashes read at build time",
        shards=len(current),
    )


def table_schema_check(asset: str, name: str, tables: Callable[[DataLayout, list[str]], list]):
    """A blocking check that every Parquet table `tables` lists has its contract schema (docs/contract.md#checks)."""

    @dg.asset_check(
        asset=asset,
        name=name,
        blocking=True,
        description="Schema validity (docs/contract.md#checks): every Parquet table the build wrote so far (listed in "
        "core/checks.py) has exactly its contract schema's columns, in order, with their types.",
    )
    def check(layout: SynthKDLayout, build: SynthKDBuildConfig) -> dg.AssetCheckResult:
        paths = layout.data_layout(build.smoke)
        with gate(paths, asset, name) as record:
            listed = tables(paths, [s.name for s in scan_inputs(paths)])
            problems = [problem for path, schema in listed for problem in schema_problems(path, schema)]
            passed = f"{len(listed)} tables match their schemas"
            return record(_result(problems, passed_summary=passed, tables=len(listed)))

    return check


output_table_schemas = table_schema_check("synth_kd_v1_manifest", "output_table_schemas", output_tables)
pool_table_schemas = table_schema_check(
    "synth_pool_manifest", "pool_table_schemas", lambda paths, _: pool_tables(paths)
)


POOL_MIX_WITHIN_TOLERANCE = "pool_mix_within_tolerance"


@dg.asset_check(
    asset="synth_pool_manifest",
    name=POOL_MIX_WITHIN_TOLERANCE,
    blocking=True,
    description=f"The pool's SYNTH skill shares and, with anchor sources, its source-mix group shares are within "
    f"{QUOTA_SHARE_TOLERANCE:.0%} of the quota plan's targets (renormalized over what is feasible; in a pool so small "
    "that one typical row is more, within one typical row); a miss names the "
    'rows that cause it (the plan\'s excluded rows: synth_id and tokens). docs/pool.md "How the quota selects rows".',
)
def pool_mix_within_tolerance(layout: SynthKDLayout, build: SynthKDBuildConfig) -> dg.AssetCheckResult:
    paths = layout.data_layout(build.smoke)
    with gate(paths, "synth_pool_manifest", POOL_MIX_WITHIN_TOLERANCE) as record:
        manifest, plan = mf.read_json(paths.pool_manifest()), mf.read_json(paths.quota_plan())
        synth = [r for r in manifest["shards"] if partition_source(r["partition"]) == SYNTH_SOURCE]
        skill = {b: 0.0 for b in plan["skill_tokens"]["target_share"]}
        for shard in synth:
            for b, cells in shard["report"].get("bucket_tokens", {}).items():
                skill[b] = skill.get(b, 0.0) + sum(cells.values())
        targets = plan["skill_tokens"]["target_share"]
        problems = share_miss_problems(skill, targets, plan.get("excluded", []), plan.get("granularity"))
        if "source_mix" in manifest:
            groups = manifest["source_mix"]["groups"]
            achieved = {g: entry["achieved_tokens"] for g, entry in groups.items()}
            targets = {g: entry["target_share"] for g, entry in groups.items()}
            mix = plan.get("source_mix", {})
            problems += share_miss_problems(achieved, targets, mix.get("excluded", []), mix.get("granularity"))
        passed = f"every kept share within {QUOTA_SHARE_TOLERANCE:.0%} of its target"
        return record(_result(problems, passed_summary=passed))


def _file_count(manifest: dict) -> int:
    return sum(len(split["files"]) for shard in manifest.get("shards", []) for split in shard.get("splits", []))


def _dataset_manifest(paths: DataLayout) -> tuple[Path, dict]:
    root = paths.megatron_root()
    return root, mf.read_json(root / constants.MANIFEST_FILENAME)


def dataset_manifest_checks(
    asset: str,
    prefix: str,
    load: Callable[[DataLayout], tuple[Path, dict]],
    config: Callable[[SynthKDBuildConfig], dict],
    noun: str,
    shard_asset: str,
    shards_as_splits: Callable[[dict], dict] = lambda manifest: manifest,
) -> list[dg.AssetChecksDefinition]:
    """The two checks of a dataset manifest (`load` reads it, `config` is the config it must hash to): its
    provenance (`<prefix>manifest_provenance`) and its rows (`<prefix>dataset_rows_accounted`). Shard files
    are checked as synth_kd_v1 lists them, per split (`shards_as_splits` lists another layout that way); a file
    `shard_asset`'s step hashed as it wrote it, with its stat unchanged since, is not read again
    (`hashed_when_written`)."""

    @dg.asset_check(
        asset=asset,
        name=f"{prefix}manifest_provenance",
        blocking=True,
        description=f"Provenance complete; the manifest matches its seal (manifest.json.sha256); every {noun}'s bytes "
        "and sha256, the tokenizer and the input manifest still match what the manifest records (a file whose "
        "inode, size, mtime and ctime are those it had when its shard's step hashed it keeps that sha256 unread); "
        "no file under the dataset root is unlisted; the config hash is the current config's.",
    )
    def provenance(
        context: dg.AssetCheckExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
    ) -> dg.AssetCheckResult:
        paths = layout.data_layout(build.smoke)
        with gate(paths, asset, f"{prefix}manifest_provenance") as record:
            root, manifest = load(paths)
            listed = shards_as_splits(manifest)
            hashed = hashed_when_written(context.instance, shard_asset, manifest, root).files
            expected = mf.config_hash(dataset_config(config(build), layout_artifact(paths)))
            records = manifest_files(manifest) or []
            unread = sum(unchanged_since_hashed(root / r["path"], r["sha256"], hashed) for r in records)
            result = _result(
                manifest_problems(root, listed, expected, paths, hashed),
                passed_summary=f"{_file_count(listed)} {noun}s, tokenizer, input manifest and config hash match "
                f"{root / constants.MANIFEST_FILENAME}",
                files_read=len(records) - unread,  # the others: their shard's step hashed them, stat unchanged since
            )
            return record(result)

    @dg.asset_check(
        asset=asset,
        name=f"{prefix}dataset_rows_accounted",
        blocking=True,
        description="Over all shards: rows in = rows out + rows dropped (every step), and no shard listed twice.",
    )
    def rows_accounted(layout: SynthKDLayout, build: SynthKDBuildConfig) -> dg.AssetCheckResult:
        paths = layout.data_layout(build.smoke)
        with gate(paths, asset, f"{prefix}dataset_rows_accounted") as record:
            return record(_dataset_rows_result(load(paths)[1]))

    return [provenance, rows_accounted]


def _dataset_rows_result(manifest: dict) -> dg.AssetCheckResult:
    """rows in = rows out + dropped over all shards of a dataset manifest (either dataset)."""
    totals = manifest.get("totals", {})
    summary = (
        f"{totals.get('rows_in')} rows in = {totals.get('rows_out')} out + {sum(totals.get('dropped', {}).values())} "
        f"dropped over {len(manifest.get('shards', []))} shards"
    )
    return _result(dataset_rows_problems(manifest), passed_summary=summary)


def documents_check(
    name: str,
    find: Callable[[list[Path], DataLayout, dg.DagsterInstance], list[str]],
    passed: str,
    description: str,
) -> dg.AssetChecksDefinition:
    """A check of `find`'s problems over the documents tables of every shard the synth_kd_v1 manifest lists (and
    the build's layout and instance, for what they are checked against)."""

    @dg.asset_check(asset="synth_kd_v1_manifest", name=name, blocking=True, description=description)
    def check(
        context: dg.AssetCheckExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
    ) -> dg.AssetCheckResult:
        paths = layout.data_layout(build.smoke)
        with gate(paths, "synth_kd_v1_manifest", name) as record:
            root, manifest = _dataset_manifest(paths)
            tables = [documents_path(root, shard_index_from_name(s["partition"])) for s in manifest["shards"]]
            tables = [table for table in tables if table.is_file()]
            problems = find(tables, paths, context.instance)
            result = _result(problems, passed_summary=f"{passed} ({len(tables)} document tables)")
            return record(result)

    return check


no_split_leakage = documents_check(
    "no_split_leakage",
    lambda tables, *_: split_leakage(tables),
    "no synth_id in both splits",
    "No synth_id is in both train and valid.",
)
no_duplicate_synth_ids = documents_check(
    "no_duplicate_synth_ids",
    lambda tables, *_: cross_shard_duplicates(tables),
    "no synth_id in two shards",
    "No synth_id is in two shards (within a shard, later duplicates are dropped as duplicate_synth_id).",
)


def _validation_rows_trained(tables: list[Path], paths: DataLayout, instance: dg.DagsterInstance) -> Problems:
    """The validation sets' rows by synth_id, and the held-out prompts by content whatever the synth_id: a
    shard's matches as its synth_sampled recorded them under the same clusters and signatures, else found now."""
    problems = validation_rows_trained(tables, [paths.heldout_kl(), paths.format_suite()])
    if not paths.clusters_summary().is_file():  # no near-duplicate control in this build: nothing held out
        return problems
    summary = mf.read_json(paths.clusters_summary())
    clusters_sha256 = sha256_file(paths.clusters_summary())
    names = shard_names(paths)
    sampled_of = latest_partition_materializations(instance, dg.AssetKey("synth_sampled"), names)
    signed_of = latest_partition_materializations(instance, dg.AssetKey("synth_signatures"), names)
    matched: set[str] = set()
    unmatched: list[Path] = []
    for name in names:
        signatures = paths.stage_output("synth_signatures", name)
        sampled = sampled_of.get(name)
        recorded = None
        if sampled is not None and HELDOUT_MATCHED in sampled.metadata and signatures.is_file():
            signatures_sha256 = current_sha256(signed_of.get(name), signatures)
            recorded = heldout_matched_of(sampled.metadata, clusters_sha256, signatures_sha256)
        if recorded is None:
            unmatched.append(signatures)
        else:
            matched.update(recorded)
    return problems + heldout_prompts_trained(tables, unmatched, summary, paths.clusters_summary(), matched)


validation_sets_not_trained = documents_check(
    "validation_sets_not_trained",
    _validation_rows_trained,
    "no row of the validation sets and no copy of a held-out prompt",
    "No synth_id of the validation sets (heldout_kl, format_suite: rows of held-out clusters) is in the dataset, "
    "and no row whose prompt is a held-out one (its MinHash signature, as the clusters kept it, matched at the "
    "near-duplicate threshold), whatever its synth_id. A shard's matches are those its synth_sampled recorded when "
    "the clusters summary and its signatures are still the ones it matched (by sha256); else matched again.",
)


@dg.asset_check(
    asset="synth_kd_v1_manifest",
    blocking=True,
    description=(
        "Every shard and split the manifest lists is readable by megatron-core's IndexedDataset (read_index: what it "
        "opens, without importing it) and is an aligned trio, every value of its three .bin files read: token ids "
        "within the padded vocabulary, masks and spans in their ranges, each document ending with EOD. A split whose "
        "files are those its shard's trio_alignment passed on (the sha256 and stat recorded then) is not read again."
    ),
)
def shards_readable_by_megatron(
    context: dg.AssetCheckExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.AssetCheckResult:
    paths = layout.data_layout(build.smoke)
    with gate(paths, "synth_kd_v1_manifest", "shards_readable_by_megatron") as record:
        root, manifest = _dataset_manifest(paths)
        hashed = hashed_when_written(context.instance, "synth_kd_v1", manifest, root)
        problems, read = unreadable_shards(root, manifest, hashed.files_flagged(TRIO_ALIGNED))
        result = _result(
            problems,
            passed_summary=f"{len(manifest.get('shards', []))} shards readable as IndexedDatasets and aligned",
            splits_read=read,  # the others: their bytes are those their shard's trio_alignment passed on
        )
        return record(result)


def _distill_manifest(paths: DataLayout) -> tuple[Path, dict]:
    root = paths.distill_root()
    return root, mf.read_json(root / constants.MANIFEST_FILENAME)


def _distill_parts(root: Path, manifest: dict) -> list[tuple[Path, str]]:
    return [(root / f["path"], f["split"]) for shard in manifest["shards"] for f in shard["files"]]


def _leakage_across_parts(parts: list[tuple[Path, str]]) -> list[str]:
    by_split: dict[str, list[Path]] = {split: [] for split in constants.DISTILL_SPLITS}
    for path, split in parts:
        by_split.setdefault(split, []).append(path)
    return distill_split_leakage({split: [p for p in paths if p.is_file()] for split, paths in by_split.items()})


# the DistillKit row checks: name -> (kind of `distill_part_problems`, description, summary when it passes)
DISTILL_ROW_CHECKS: dict[str, tuple[str, str, str]] = {
    "distill_labels_match_input_ids": (
        "labels",
        "Every DistillKit part the manifest lists: labels == input_ids wherever labels != -100, and "
        "labels / attention_mask (all 1) as long as input_ids.",
        " checked",
    ),
    "distill_spans_consistent": (
        "spans",
        "Every row: labels are -100 exactly before spans.assistant_token_start, and "
        "analysis_token_count + final_token_count == len(input_ids) - assistant_token_start.",
        " checked",
    ),
    "distill_max_length_respected": ("max_length", "No row is longer than max_seq_len.", " checked"),
    "distill_no_split_leakage": (
        "split",
        "No id is in both train and validation (or twice anywhere), every row is in the split its "
        "synth_id hashes to, and id == 'pleias_synth:' + synth_id (an anchor row's: its synth_id).",
        ": no id in two splits or twice",
    ),
}


@dg.multi_asset_check(
    specs=[
        dg.AssetCheckSpec(name, asset="synth_distill_manifest", blocking=True, description=description)
        for name, (_, description, _) in DISTILL_ROW_CHECKS.items()
    ],
    can_subset=True,
)
def distill_row_checks(
    context: dg.AssetCheckExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> Iterator[dg.AssetCheckResult]:
    """The DistillKit row checks over every part the manifest lists, each part read once for all of them
    (`distill_part_problems` finds every kind of problem in one pass; parts on one thread per core): four separate
    reads were most of the manifests pass. A part is not read at all when its bytes are those its shard's
    distill_rows_valid passed on, under the same settings (`_distill_parts_checked_when_written`; docs/contract.md
    "Checks"). Each check reports the schema problems and its own kind, part by part."""
    paths = layout.data_layout(build.smoke)
    wanted = {key.name for key in context.selected_asset_check_keys}
    checks = {name: spec for name, spec in DISTILL_ROW_CHECKS.items() if name in wanted}
    with contextlib.ExitStack() as opened:
        records = {name: opened.enter_context(gate(paths, "synth_distill_manifest", name)) for name in checks}
        root, manifest = _distill_manifest(paths)
        parts = _distill_parts(root, manifest)
        problems = {name: Problems() for name in checks}
        if "distill_no_split_leakage" in problems:
            problems["distill_no_split_leakage"].merge(_leakage_across_parts(parts))
        kinds = tuple(dict.fromkeys(["schema", *(kind for kind, _, _ in checks.values())]))
        verified = _distill_parts_checked_when_written(context.instance, root, manifest, build)
        unread = [part for part in parts if part[0] not in verified]

        def part_problems(part: tuple[Path, str]) -> dict[str, list[str]]:
            return distill_part_problems(*part, build.max_seq_len, build.distill_valid_fraction, kinds)

        for found in thread_map(part_problems, unread):
            for name, (kind, _, _) in checks.items():
                problems[name].merge(found["schema"])
                problems[name].merge(found[kind])
        for name, (_, _, passed) in checks.items():
            result = _result(
                problems[name],
                check_name=name,
                passed_summary=f"{len(parts)} parts{passed}",
                parts=len(parts),
                parts_read=len(unread),  # the others: their bytes are those their shard's check passed on
            )
            yield records[name](result)


def _distill_parts_checked_when_written(
    instance: dg.DagsterInstance, root: Path, manifest: dict, build: SynthKDBuildConfig
) -> set[Path]:
    """The parts the manifest lists whose rows need no reading again (`parts_checked_when_written`): each shard's
    latest synth_distill materialization records the sha256 of what it wrote and, when its distill_rows_valid check
    passed, the settings it passed under; a file on disk is hashed (every byte once, not decoded) unless its stat
    is the one recorded when the step hashed it (`hashed_when_written`)."""
    settings = rows_valid_for(build.max_seq_len, build.distill_valid_fraction)
    listed = {shard["partition"]: {f["path"]: f["sha256"] for f in shard["files"]} for shard in manifest["shards"]}
    hashed = hashed_when_written(instance, "synth_distill", manifest, root)
    on_disk_paths = [root / path for files in listed.values() for path in files if (root / path).is_file()]
    digests = sha256_files(on_disk_paths, hashed.files)
    on_disk = {p.relative_to(root).as_posix(): sha for p, sha in zip(on_disk_paths, digests)}
    verified: set[Path] = set()
    for partition, files in listed.items():
        metadata = hashed.metadata.get(partition, {})
        if FILES_SHA256 not in metadata or ROWS_VALID_FOR not in metadata:
            continue
        valid_for = metadata[ROWS_VALID_FOR].value
        checked = parts_checked_when_written(files, on_disk, files_sha256_of(metadata), valid_for, settings)
        verified.update(root / path for path in checked)
    return verified


@dataclasses.dataclass(frozen=True)
class HashedWhenWritten:
    """What the latest materialization of each shard a dataset manifest lists hashed as it wrote its files."""

    metadata: dict[str, Mapping[str, Any]]  # by partition: its materialization's metadata
    by_partition: dict[str, dict[Path, HashedFile]]  # by partition: its files, by path under the dataset root

    @property
    def files(self) -> dict[Path, HashedFile]:
        """Every shard's files."""
        return {path: digest for files in self.by_partition.values() for path, digest in files.items()}

    def files_flagged(self, flag: str) -> dict[Path, HashedFile]:
        """The files of the shards whose materialization records `flag` (a check that passed on what it wrote)."""
        flagged = [files for partition, files in self.by_partition.items() if flag in self.metadata[partition]]
        return {path: digest for files in flagged for path, digest in files.items()}


def hashed_when_written(instance: dg.DagsterInstance, asset: str, manifest: dict, root: Path) -> HashedWhenWritten:
    """The files the shards of `manifest` wrote into the dataset `root`, as their latest `asset` materializations
    hashed them (`files_sha256` with `files_stat`, `hashed_files_of`): a materialization of another root (an
    instance that built elsewhere) gives none."""
    metadata: dict[str, Mapping[str, Any]] = {}
    by_partition: dict[str, dict[Path, HashedFile]] = {}
    partitions = [shard["partition"] for shard in manifest.get("shards", []) if shard.get("partition")]
    latest = latest_partition_materializations(instance, dg.AssetKey(asset), partitions)
    for partition, materialization in latest.items():
        metadata[partition] = materialization.metadata
        uri = materialization.metadata.get(URI)
        if uri is not None and uri.value == root.resolve().as_uri():
            by_partition[partition] = hashed_files_of(materialization.metadata, root)
    return HashedWhenWritten(metadata, by_partition)


def _distill_parts_as_splits(manifest: dict) -> dict:
    return {**manifest, "shards": [{"splits": [{"files": shard["files"]}]} for shard in manifest.get("shards", [])]}


KD_MANIFEST_CHECKS = dataset_manifest_checks(
    "synth_kd_v1_manifest", "", _dataset_manifest, SynthKDBuildConfig.kd_config, "file", "synth_kd_v1"
)
DISTILL_MANIFEST_CHECKS = dataset_manifest_checks(
    "synth_distill_manifest",
    "distill_",
    _distill_manifest,
    SynthKDBuildConfig.distill_config,
    "part",
    "synth_distill",
    _distill_parts_as_splits,
)
DISTILL_CHECKS = [
    distill_row_checks,
    *DISTILL_MANIFEST_CHECKS,
]
STANDALONE_CHECKS = [
    tokenizer_sha256_pin,
    raw_inputs_unchanged,
    *KD_MANIFEST_CHECKS,
    no_split_leakage,
    no_duplicate_synth_ids,
    validation_sets_not_trained,
    shards_readable_by_megatron,
    output_table_schemas,
    pool_table_schemas,
    pool_mix_within_tolerance,
    *DISTILL_CHECKS,
]
