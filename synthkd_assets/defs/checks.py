"""Asset checks: in-asset ones for partitioned steps (results built here), standalone ones on the
tokenizer and the dataset manifest. All blocking: downstream never runs on data that failed one."""

from pathlib import Path

import dagster as dg

from synthkd_assets import contracts
from synthkd_assets.core import manifest as mf
from synthkd_assets.core.checks import dataset_rows_problems, input_drift, manifest_problems, split_leakage, unreadable_shards
from synthkd_assets.core.inventory import built_from_sha256, scan_raw_dir, shard_index_from_name
from synthkd_assets.core.layout import DataLayout
from synthkd_assets.core.validation import cross_shard_duplicates
from synthkd_assets.core.distill_io import distill_part_problems
from synthkd_assets.core.distill_io import split_leakage as distill_split_leakage
from synthkd_assets.core.megatron_io import ShardSplitInventory, trio_alignment_problems
from synthkd_assets.core.stages import ShardReport
from synthkd_assets.core.tokenizer import TokenizerPinError, verify_tokenizer
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout

ROWS_ACCOUNTED = "rows_accounted"
TRIO_ALIGNMENT = "trio_alignment"
DISTILL_ROWS_VALID = "distill_rows_valid"
# the in-asset (per-shard) checks: what each verifies, shown in the UI next to every result
SHARD_CHECK_DESCRIPTIONS = {
    ROWS_ACCOUNTED: "Every input row of this shard is accounted for: rows in == rows out + rows dropped "
    "(each drop counted under its reason).",
    TRIO_ALIGNMENT: "The Megatron trio just written for this shard (tokens int32 / lossmask uint8 / span uint8, "
    "train and valid): equal sequence_lengths and document_indices, dtypes, loss_mask in {0,1}, span in {0,1,2}, "
    "loss_mask==0 iff span==0, every document ending with EOD carrying 0/0, readable by megatron-core.",
    DISTILL_ROWS_VALID: "The DistillKit parts just written for this shard, re-read: schema, labels == input_ids "
    "where labels != -100, -100 exactly before assistant_token_start, span counts, max_seq_len, split rule, ids.",
}
PROBLEMS_IN_TEXT = 5  # problems quoted in a result's description (all of them, up to 50, are in its metadata)


def shard_check_spec(name: str, asset: str) -> dg.AssetCheckSpec:
    """The spec of a per-shard check evaluated inside `asset`'s step (blocking, with its description)."""
    return dg.AssetCheckSpec(name, asset=asset, blocking=True, description=SHARD_CHECK_DESCRIPTIONS[name])


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
    quoted = "; ".join(problems[:PROBLEMS_IN_TEXT])
    more = f" (and {len(problems) - PROBLEMS_IN_TEXT} more, see metadata 'problems')" if len(problems) > PROBLEMS_IN_TEXT else ""
    return f"{where}FAILED, {len(problems)} problem{'s' if len(problems) != 1 else ''}: {quoted}{more}"


def _result(
    problems: list[str], check_name: str | None = None, passed_summary: str = "", partition: str | None = None, **metadata
) -> dg.AssetCheckResult:
    partition = partition or current_partition()
    where = {"partition": partition} if partition else {}
    return dg.AssetCheckResult(
        check_name=check_name,
        passed=not problems,
        severity=dg.AssetCheckSeverity.ERROR,
        description=verdict_text(problems, passed_summary, partition),
        metadata={**where, "problems": dg.MetadataValue.json(problems[:50]), "problem_count": len(problems), **metadata},
    )


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


def trio_alignment_result(root: Path, inventories: list[ShardSplitInventory]) -> dg.AssetCheckResult:
    """The written trio: equal lengths/boundaries, dtypes, mask domains, EOD 0/0 at every document end."""
    problems = [
        problem
        for inventory in inventories
        if inventory.sequences
        for problem in trio_alignment_problems(root / inventory.split, inventory.shard_index)
    ]
    sequences = sum(i.sequences for i in inventories)
    checked = ", ".join(f"{i.split}/shard_{i.shard_index:02d} ({i.sequences} documents)" for i in inventories if i.sequences)
    return _result(problems, TRIO_ALIGNMENT, f"{checked or 'no documents written'} aligned", sequences=sequences)


def distill_rows_result(root: Path, files: list[dict], build: SynthKDBuildConfig) -> dg.AssetCheckResult:
    """The parts just written, re-read: labels, spans, max length, split rule and ids (all kinds)."""
    problems = [
        problem
        for record in files
        for kind_problems in distill_part_problems(
            root / record["path"], record["split"], build.max_seq_len, build.distill_valid_fraction
        ).values()
        for problem in kind_problems
    ]
    rows = sum(record["rows"] for record in files)
    checked = ", ".join(f"{record['path']} ({record['rows']} rows)" for record in files)
    return _result(problems, DISTILL_ROWS_VALID, f"{checked or 'no parts written'} valid", rows=rows)


@dg.asset_check(asset="o200k_tokenizer", blocking=True, description="The file on disk has the pinned sha256.")
def tokenizer_sha256_pin(layout: SynthKDLayout) -> dg.AssetCheckResult:
    try:
        digest = verify_tokenizer(layout.data_layout().tokenizer_file())
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
    current = {s.name: s.sha256 for s in scan_raw_dir(paths.raw_root, paths.raw_hash_cache())}
    built_from = built_from_sha256(paths, [entry["name"] for entry in manifest["shards"]])
    read_time = [{"name": name, "source": {"sha256": sha256}} for name, sha256 in built_from.items()]
    return _result(
        input_drift(read_time, current), passed_summary=f"{len(current)} raw shards match the hashes read at build time", shards=len(current)
    )


def _file_count(manifest: dict) -> int:
    return sum(len(split["files"]) for shard in manifest.get("shards", []) for split in shard.get("splits", []))


def _dataset_manifest(paths: DataLayout) -> tuple[Path, dict]:
    return paths.megatron_root(), mf.read_json(paths.megatron_manifest())


@dg.asset_check(
    asset="synth_kd_v1_manifest",
    blocking=True,
    description="Provenance complete; the manifest matches its seal (manifest.json.sha256); every file's bytes and "
    "sha256, the tokenizer and the input manifest still match what the manifest records; no file under the dataset "
    "root is unlisted; the config hash is the current config's.",
)
def manifest_provenance(layout: SynthKDLayout, build: SynthKDBuildConfig) -> dg.AssetCheckResult:
    paths = layout.data_layout(build.smoke)
    root, manifest = _dataset_manifest(paths)
    return _result(
        manifest_problems(root, manifest, mf.config_hash(build.kd_config()), paths),
        passed_summary=f"{_file_count(manifest)} files, tokenizer, input manifest and config hash match "
        f"{paths.megatron_manifest()}",
    )


@dg.asset_check(
    asset="synth_kd_v1_manifest",
    blocking=True,
    description="Over all shards: rows in = rows out + rows dropped (every step), and no shard listed twice.",
)
def dataset_rows_accounted(layout: SynthKDLayout, build: SynthKDBuildConfig) -> dg.AssetCheckResult:
    return _dataset_rows_result(_dataset_manifest(layout.data_layout(build.smoke))[1])


def _dataset_rows_result(manifest: dict) -> dg.AssetCheckResult:
    """rows in = rows out + dropped over all shards of a dataset manifest (either dataset)."""
    totals = manifest.get("totals", {})
    summary = (
        f"{totals.get('rows_in')} rows in = {totals.get('rows_out')} out + {sum(totals.get('dropped', {}).values())} "
        f"dropped over {len(manifest.get('shards', []))} shards"
    )
    return _result(dataset_rows_problems(manifest), passed_summary=summary)


def _document_tables(paths: DataLayout, manifest: dict) -> list[Path]:
    tables = [paths.documents_table(shard_index_from_name(s["partition"])) for s in manifest["shards"]]
    return [t for t in tables if t.is_file()]


@dg.asset_check(asset="synth_kd_v1_manifest", blocking=True, description="No synth_id is in both train and valid.")
def no_split_leakage(layout: SynthKDLayout, build: SynthKDBuildConfig) -> dg.AssetCheckResult:
    paths = layout.data_layout(build.smoke)
    tables = _document_tables(paths, _dataset_manifest(paths)[1])
    return _result(split_leakage(tables), passed_summary=f"no synth_id in both splits ({len(tables)} document tables)")


@dg.asset_check(
    asset="synth_kd_v1_manifest",
    blocking=True,
    description="No synth_id is in two shards (within a shard, later duplicates are dropped as duplicate_synth_id).",
)
def no_duplicate_synth_ids(layout: SynthKDLayout, build: SynthKDBuildConfig) -> dg.AssetCheckResult:
    paths = layout.data_layout(build.smoke)
    tables = _document_tables(paths, _dataset_manifest(paths)[1])
    return _result(cross_shard_duplicates(tables), passed_summary=f"no synth_id in two shards ({len(tables)} document tables)")


@dg.asset_check(
    asset="synth_kd_v1_manifest",
    blocking=True,
    description="Every shard and split the manifest lists opens with megatron-core's IndexedDataset and is an aligned trio.",
)
def shards_readable_by_megatron(layout: SynthKDLayout, build: SynthKDBuildConfig) -> dg.AssetCheckResult:
    root, manifest = _dataset_manifest(layout.data_layout(build.smoke))
    return _result(unreadable_shards(root, manifest), passed_summary=f"{len(manifest.get('shards', []))} shards open with IndexedDataset and are aligned")


def _distill_manifest(paths: DataLayout) -> tuple[Path, dict]:
    return paths.distill_root(), mf.read_json(paths.distill_manifest())


def _distill_parts(root: Path, manifest: dict) -> list[tuple[Path, str]]:
    return [(root / f["path"], f["split"]) for shard in manifest["shards"] for f in shard["files"]]


def _distill_row_check(layout: SynthKDLayout, build: SynthKDBuildConfig, kind: str) -> dg.AssetCheckResult:
    root, manifest = _distill_manifest(layout.data_layout(build.smoke))
    problems: list[str] = []
    for path, split in _distill_parts(root, manifest):
        found = distill_part_problems(path, split, build.max_seq_len, build.distill_valid_fraction, (kind, "schema"))
        problems += found["schema"] + found[kind]
    parts = len(_distill_parts(root, manifest))
    return _result(problems, passed_summary=f"{parts} parts checked", parts=parts)


@dg.asset_check(
    asset="synth_distill_manifest",
    blocking=True,
    description="Every DistillKit part the manifest lists: labels == input_ids wherever labels != -100, and "
    "labels / attention_mask (all 1) as long as input_ids.",
)
def distill_labels_match_input_ids(layout: SynthKDLayout, build: SynthKDBuildConfig) -> dg.AssetCheckResult:
    return _distill_row_check(layout, build, "labels")


@dg.asset_check(
    asset="synth_distill_manifest",
    blocking=True,
    description="Every row: labels are -100 exactly before spans.assistant_token_start, and "
    "analysis_token_count + final_token_count == len(input_ids) - assistant_token_start.",
)
def distill_spans_consistent(layout: SynthKDLayout, build: SynthKDBuildConfig) -> dg.AssetCheckResult:
    return _distill_row_check(layout, build, "spans")


@dg.asset_check(asset="synth_distill_manifest", blocking=True, description="No row is longer than max_seq_len.")
def distill_max_length_respected(layout: SynthKDLayout, build: SynthKDBuildConfig) -> dg.AssetCheckResult:
    return _distill_row_check(layout, build, "max_length")


@dg.asset_check(
    asset="synth_distill_manifest",
    blocking=True,
    description="No id is in both train and validation (or twice anywhere), every row is in the split its "
    "synth_id hashes to, and id == 'pleias_synth:' + synth_id.",
)
def distill_no_split_leakage(layout: SynthKDLayout, build: SynthKDBuildConfig) -> dg.AssetCheckResult:
    root, manifest = _distill_manifest(layout.data_layout(build.smoke))
    parts: dict[str, list[Path]] = {split: [] for split in contracts.DISTILL_SPLITS}
    for path, split in _distill_parts(root, manifest):
        parts.setdefault(split, []).append(path)
    problems = distill_split_leakage({split: [p for p in paths_ if p.is_file()] for split, paths_ in parts.items()})
    for path, split in _distill_parts(root, manifest):
        found = distill_part_problems(path, split, build.max_seq_len, build.distill_valid_fraction, ("split", "schema"))
        problems += found["schema"] + found["split"]
    return _result(problems, passed_summary=f"{len(_distill_parts(root, manifest))} parts: no id in two splits or twice")


@dg.asset_check(
    asset="synth_distill_manifest",
    blocking=True,
    description="Provenance complete; the manifest matches its seal (manifest.json.sha256); every part's bytes and "
    "sha256, the tokenizer and the input manifest still match the manifest; no file under the dataset root is "
    "unlisted; the config hash is the current config's.",
)
def distill_manifest_provenance(layout: SynthKDLayout, build: SynthKDBuildConfig) -> dg.AssetCheckResult:
    paths = layout.data_layout(build.smoke)
    root, manifest = _distill_manifest(paths)
    as_kd = {**manifest, "shards": [{"splits": [{"files": shard["files"]}]} for shard in manifest.get("shards", [])]}
    return _result(
        manifest_problems(root, as_kd, mf.config_hash(build.distill_config()), paths),
        passed_summary=f"{_file_count(as_kd)} parts, tokenizer, input manifest and config hash match "
        f"{paths.distill_manifest()}",
    )


@dg.asset_check(
    asset="synth_distill_manifest",
    blocking=True,
    description="Over all shards: rows in = rows out + rows dropped (every step), and no shard listed twice.",
)
def distill_dataset_rows_accounted(layout: SynthKDLayout, build: SynthKDBuildConfig) -> dg.AssetCheckResult:
    return _dataset_rows_result(_distill_manifest(layout.data_layout(build.smoke))[1])


DISTILL_CHECKS = [
    distill_labels_match_input_ids,
    distill_spans_consistent,
    distill_max_length_respected,
    distill_no_split_leakage,
    distill_manifest_provenance,
    distill_dataset_rows_accounted,
]
STANDALONE_CHECKS = [tokenizer_sha256_pin, raw_inputs_unchanged, manifest_provenance, dataset_rows_accounted, no_split_leakage, no_duplicate_synth_ids, shards_readable_by_megatron, *DISTILL_CHECKS]
