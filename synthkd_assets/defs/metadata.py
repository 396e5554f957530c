"""Shard reports -> Dagster metadata: flat numbers the UI plots over time, tables for mixes, and the
standard table keys (`dagster/row_count`, `dagster/column_schema`, `dagster/uri`) the UI knows."""

from __future__ import annotations

import os
import urllib.parse
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq

from synthkd_assets.core.buckets import grid_from_nested, nested_grid
from synthkd_assets.core.build_summary import drops_by_exercise, drops_by_exercise_markdown
from synthkd_assets.core.manifest import config_hash
from synthkd_assets.core.sampling import mix_table_markdown
from synthkd_contract import constants, drops
from synthkd_contract.buckets import CTX_BUCKETS, SKILL_BUCKETS
from synthkd_contract.manifest_seal import HashedFile, file_stat, sha256_file, sha256_files
from synthkd_contract.schemas import TRIO_COLUMN_DESCRIPTIONS, TRIO_SCHEMA

ROW_COUNT = "dagster/row_count"
PARTITION_ROW_COUNT = "dagster/partition_row_count"
COLUMN_SCHEMA = "dagster/column_schema"
URI = "dagster/uri"
FILES_SHA256 = "files_sha256"  # {path under dagster/uri: sha256} of the files a step wrote
FILES_STAT = "files_stat"  # {path under dagster/uri: file_stat} of each file when it was hashed (files_sha256)
TRIO_ALIGNED = "trio_aligned"  # synth_kd_v1: True when its trio_alignment check passed on the files it wrote
HELDOUT_MATCHED = "heldout_matched"  # synth_sampled: the rows it found with a held-out prompt, and under what
ROWS_VALID_FOR = "rows_valid_for"  # synth_distill: the settings its parts' row check passed under

# keys a step reports even when nothing happened (0), beside its drop reasons
STEP_SPLITS = {
    "synth_kd_v1": constants.SPLITS,
    "synth_distill": constants.DISTILL_SPLITS,
    "synth_pool": constants.SPLITS,
}
STEP_SPANS = ("synth_tokenized", "synth_kd_v1", "synth_distill")
SELECTION_STEPS = ("synth_filtered", "synth_sampled")  # they count their drops per exercise too


def column_schema(schema: pa.Schema, descriptions: dict[str, str] | None = None) -> dg.TableSchema:
    """An Arrow schema as the TableSchema the UI's Columns tab shows (nested types written out)."""
    descriptions = descriptions or {}
    return dg.TableSchema(
        columns=[dg.TableColumn(f.name, str(f.type), description=descriptions.get(f.name)) for f in schema]
    )


def table_definition_metadata(schema: pa.Schema, descriptions: dict[str, str] | None = None) -> dict[str, Any]:
    """Definition metadata of a table asset: its column schema, known before anything is built."""
    return {COLUMN_SCHEMA: column_schema(schema, descriptions)}


def mix_table(counts: dict[str, int], label: str) -> dg.MetadataValue:
    total = sum(counts.values()) or 1
    rows = [f"| {name} | {n} | {100 * n / total:.1f}% |" for name, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return dg.MetadataValue.md("\n".join([f"| {label} | rows | share |", "|---|---:|---:|", *rows]))


def zero_filled(counts: dict[str, int], keys) -> dict[str, int]:
    """`counts` with every expected key present (0 when absent), expected keys first, then any others."""
    return {**dict.fromkeys(keys, 0), **counts}


def drops_table(dropped: dict[str, int], rows_in: int) -> dg.MetadataValue:
    """The reasons that dropped rows, largest first, each with its rows, its share of the rows in and what it
    means (synthkd_contract/drops.py, docs/bad-input.md), under a caption saying what the table covers."""
    counted = sorted(((reason, n) for reason, n in dropped.items() if n), key=lambda item: (-item[1], item[0]))
    caption = f"**Rows dropped by reason, of {rows_in:,} rows in**"
    if not counted:
        return dg.MetadataValue.md(f"{caption}: none")
    meaning = {reason: drops.DROP_DESCRIPTIONS.get(reason, "").replace("|", "\\|") for reason, _ in counted}
    rows = [f"| `{reason}` | {n:,} | {100 * n / max(rows_in, 1):.2f}% | {meaning[reason]} |" for reason, n in counted]
    return dg.MetadataValue.md(
        "\n".join([caption, "", "| reason | rows | share of rows in | why |", "|---|---:|---:|---|", *rows])
    )


def drop_metadata(dropped: dict[str, int], rows_in: int) -> dict[str, Any]:
    """rows_dropped (a number the UI plots) and drops_by_reason (`drops_table`): one table, not a key per reason."""
    return {"rows_dropped": sum(dropped.values()), "drops_by_reason": drops_table(dropped, rows_in)}


def report_metadata(report: dict[str, Any], step: str | None = None) -> dict[str, Any]:
    """rows in/out (also as `dagster/row_count`), drops and sanitizations by reason, tokens per span,
    sequences per split, mixes. With `step`, every key that step can report is there, 0 when nothing happened."""
    metadata: dict[str, Any] = {
        "rows_in": report["rows_in"],
        "rows_out": report["rows_out"],
        ROW_COUNT: dg.MetadataValue.int(report["rows_out"]),
        PARTITION_ROW_COUNT: dg.MetadataValue.int(report["rows_out"]),
    }
    metadata.update(drop_metadata(report["dropped"], report["rows_in"]))
    sanitized_keys = {
        "synth_harmony": drops.SANITIZED_KEYS,
        "source_harmony": drops.SOURCE_SANITIZED_KEYS,
        "artifact_harmony": drops.ARTIFACT_SANITIZED_KEYS,
    }.get(step or "", ())
    metadata.update({f"sanitized_{what}": n for what, n in zero_filled(report["sanitized"], sanitized_keys).items()})
    span_keys = constants.SPAN_NAMES.values() if step in STEP_SPANS else ()
    metadata.update({f"tokens_{span}": n for span, n in zero_filled(report["span_tokens"], span_keys).items()})
    split_keys = STEP_SPLITS.get(step or "", ())
    metadata.update({f"sequences_{split}": n for split, n in zero_filled(report["sequences"], split_keys).items()})
    metadata.update({f"rendered_{path}": n for path, n in report.get("render_path", {}).items()})
    if report["language"]:
        metadata["language_mix"] = mix_table(report["language"], "language")
    if report["exercise"]:
        metadata["exercise_mix"] = mix_table(report["exercise"], "exercise")
    if step in SELECTION_STEPS:
        metadata["drops_by_exercise"] = drops_by_exercise_table([report], step)
    return metadata


def drops_by_exercise_table(reports: Iterable[dict[str, Any]], step: str) -> dg.MetadataValue:
    """Rows in and drops by each of `step`'s reasons per exercise, summed over `reports` (core/build_summary.py)."""
    summed = drops_by_exercise(reports, drops.DROP_REASONS_BY_STEP[step])
    return dg.MetadataValue.md(drops_by_exercise_markdown(summed))


def files_metadata(
    paths: list[Path], root: Path | None = None, records: Sequence[Path] = (), hashed: Mapping[Path, str] | None = None
) -> dict[str, Any]:
    """bytes written and the sha256 of every file (taken from `hashed` when the step hashed it as it wrote it), so
    a later edit is visible against the UI, with each file's stat when it was hashed (`files_stat`: a later check
    need not read a file whose stat is unchanged, `hashed_files_of`); where they are
    (`dagster/uri`: `root`, a dataset's root, whatever splits a shard wrote; else the file, or the directory
    holding all of them) and the column schema of what was written (read back from the Parquet footer; the trio's
    for Megatron .bin/.idx files; not from `records`, the shard's record and documents table beside its data,
    listed and counted too). Each sha256 is keyed by the file's path under that directory
    (`train/shard_00_tokens.bin`): splits and pool cells reuse file names."""
    data = [p.resolve() for p in paths if p.is_file()]
    existing = [*data, *(p.resolve() for p in records if p.is_file())]
    metadata: dict[str, Any] = {"bytes_written": sum(p.stat().st_size for p in existing)}
    if root is not None:
        where = base = root.resolve()
    elif not existing:
        return {**metadata, FILES_SHA256: dg.MetadataValue.json({})}
    else:
        where = existing[0] if len(existing) == 1 else Path(os.path.commonpath([p.parent for p in existing]))
        base = where.parent if where == existing[0] else where
    known = {Path(path).resolve(): digest for path, digest in (hashed or {}).items()}
    stats = {path: file_stat(path) for path in existing}
    digests = {path: known.get(path) or sha256_file(path) for path in existing}
    metadata[FILES_SHA256] = dg.MetadataValue.json({p.relative_to(base).as_posix(): digests[p] for p in existing})
    # a file changed while it was hashed has no stat here: a later check reads it
    unchanged = [path for path in existing if file_stat(path) == stats[path]]
    metadata[FILES_STAT] = dg.MetadataValue.json({p.relative_to(base).as_posix(): stats[p] for p in unchanged})
    metadata[URI] = where.as_uri()
    parquet = [p for p in data if p.suffix == ".parquet"]
    if parquet:
        metadata[COLUMN_SCHEMA] = column_schema(pq.read_schema(parquet[0]))
    elif any(p.suffix in (".bin", ".idx") for p in data):
        metadata[COLUMN_SCHEMA] = column_schema(TRIO_SCHEMA, TRIO_COLUMN_DESCRIPTIONS)
    return metadata


def content_version(metadata: Mapping[str, Any], *records: Path) -> dg.DataVersion:
    """A step's data version from what it wrote: the sha256 of its files (`files_metadata`'s) and of the records
    beside them that later steps and manifests read (its report, its shard record). A rebuild that writes the same
    bytes keeps the version, so its descendants stay fresh in the UI; any changed byte marks them stale. (Dagster's
    default, a hash of code version and input versions, changes whenever an input's does, even when this step's
    output does not: one edited raw row marked the global clusters and plan stale.)"""
    hashes = {**metadata[FILES_SHA256].value, **{f"record/{p.name}": sha256_file(p) for p in records}}
    return dg.DataVersion(config_hash(hashes))


def manifest_rows_metadata(rows_in: int, rows_out: int, dropped: dict[str, int]) -> dict[str, Any]:
    """A manifest's row accounting over all shards: rows in/out, rows dropped and the drops by reason."""
    return {"rows_in": rows_in, "rows_out": rows_out, **drop_metadata(dropped, rows_in)}


def mix_metadata(columns: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A before/after table of mix summaries (plan, expected, achieved) and each one's two shares, to plot."""
    return {
        "mix_before_after": dg.MetadataValue.md(mix_table_markdown(columns)),
        **{f"memorization_share_{name.replace(' ', '_')}": s["memorization_share"] for name, s in columns.items()},
        **{f"non_english_share_{name.replace(' ', '_')}": s["non_english_share"] for name, s in columns.items()},
    }


def dataset_manifest_metadata(
    manifest: dict[str, Any], digest: str, root: Path, achieved: str = "achieved"
) -> dict[str, Any]:
    """What the dataset manifests show: where the dataset is (`root`), their sha256, config hash and the commit
    that built them (`git_sha`, "(dirty)" with uncommitted changes), row accounting over all shards, and the
    001 mix (by rows) before sampling, expected by the plan and achieved by it. `achieved` names that last
    column: the pool's is "sampled", the rows its quota then draws from, not the pool's own mix
    (`skill_share_metadata`)."""
    totals, sampling = manifest["totals"], manifest["sampling"]
    mixes = {"before": sampling["before"], "expected after": sampling["expected_after"]}
    mixes[achieved] = sampling["achieved_after"]
    return {
        "dataset_root": dg.MetadataValue.path(str(root)),
        "manifest_sha256": digest,
        "config_hash": manifest["config_hash"],
        "git_sha": manifest["git_sha"] + (" (dirty)" if manifest.get("git_dirty") else ""),
        **manifest_rows_metadata(totals["rows_in"], totals["rows_out"], totals["dropped"]),
        **mix_metadata(mixes),
    }


def skill_share_metadata(quota: dict[str, Any]) -> dict[str, Any]:
    """The pool's skill mix on tokens: per bucket the configured `skill_mix`, the target share it becomes once
    infeasible buckets are renormalized away, and the share achieved (`skill_share_target_B1`,
    `skill_share_achieved_B1`, to plot), and as a table."""
    targets, achieved = quota["targets"], quota["achieved_skill_share"]
    # the quota plan's skill_mix and target are SYNTH's buckets; achieved counts every source's tokens, so with
    # anchor sources a bucket SYNTH lacks (B3, code) is infeasible for SYNTH's target yet holds tokens
    lines = [
        "| skill bucket | skill_mix (SYNTH's) | target share (SYNTH's tokens) | achieved share (the pool's tokens, "
        "all sources) |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {b} | {targets['skill_mix'].get(b, 0.0):.1%} | {targets['shares'].get(b, 0.0):.1%} "
        f"| {achieved.get(b, 0.0):.1%} |"
        for b in SKILL_BUCKETS
    ]
    return {
        **{f"skill_share_target_{b}": targets["shares"].get(b, 0.0) for b in SKILL_BUCKETS},
        **{f"skill_share_achieved_{b}": achieved.get(b, 0.0) for b in SKILL_BUCKETS},
        "skill_mix_target_achieved": dg.MetadataValue.md("\n".join(lines)),
        "skill_mix_feasible": quota["feasible"],
        "skill_mix_infeasible": dg.MetadataValue.json(
            [{**entry, "reason": f"SYNTH's rows: {entry['reason']}"} for entry in quota["infeasible"]]
        ),
    }


def bucket_grid_metadata(grid: dict[str, dict[str, float]], label: str) -> dict[str, Any]:
    """Tokens of a (skill, ctx) grid {B: {C: n}} as plottable numbers (`tokens_<label>_skill_B1`,
    `tokens_<label>_ctx_C1`, every bucket present) and as a B x C table."""
    full = nested_grid(grid_from_nested(grid))
    skill = {b: sum(full[b].values()) for b in SKILL_BUCKETS}
    ctx = {c: sum(full[b][c] for b in SKILL_BUCKETS) for c in CTX_BUCKETS}
    header = [
        f"| tokens ({label}) | " + " | ".join(CTX_BUCKETS) + " | all |",
        "|---|" + "---:|" * (len(CTX_BUCKETS) + 1),
    ]
    rows = [
        f"| {b} | " + " | ".join(f"{full[b][c]:,.0f}" for c in CTX_BUCKETS) + f" | {skill[b]:,.0f} |"
        for b in SKILL_BUCKETS
    ]
    return {
        **{f"tokens_{label}_skill_{b}": n for b, n in skill.items()},
        **{f"tokens_{label}_ctx_{c}": n for c, n in ctx.items()},
        f"bucket_tokens_{label}": dg.MetadataValue.md("\n".join([*header, *rows])),
    }


def bucket_report_metadata(report: dict[str, Any]) -> dict[str, Any]:
    """Tokens and rows per skill bucket, ctx bucket, language and exercise of a step that counts sequences
    (`ShardReport.count_sequence`), for plots over time: every skill and ctx bucket present, 0 when empty."""
    tokens, rows = nested_grid(grid_from_nested(report.get("bucket_tokens", {}))), report.get("bucket_rows", {})
    row_grid = nested_grid(grid_from_nested(rows))
    return {
        **bucket_grid_metadata(tokens, "kept"),
        **{f"rows_skill_{b}": sum(row_grid[b].values()) for b in SKILL_BUCKETS},
        **{f"rows_ctx_{c}": sum(row_grid[b][c] for b in SKILL_BUCKETS) for c in CTX_BUCKETS},
        **language_exercise_metadata([report]),
    }


def language_exercise_metadata(reports: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Tokens per language and per exercise summed over shard reports (`tokens_language_en`,
    `tokens_exercise_rag`, ...), in the order first seen."""
    language, exercise = Counter(), Counter()
    for report in reports:
        language.update(report.get("language_tokens", {}))
        exercise.update(report.get("exercise_tokens", {}))
    return {
        **{f"tokens_language_{lang}": n for lang, n in language.items()},
        **{f"tokens_exercise_{ex}": n for ex, n in exercise.items()},
    }


def source_mix_metadata(mix: dict[str, Any], label: str = "expected") -> dict[str, Any]:
    """The source mix (a quota plan's `source_mix`, or a pool manifest's with `label` "achieved") as plottable
    shares per group (`source_share_target_<group>`, `source_share_<label>_<group>`) and a table per source."""
    share = f"{label}_share"
    metadata: dict[str, Any] = {}
    for group, entry in mix["groups"].items():
        metadata[f"source_share_target_{group}"] = entry["target_share"]
        metadata[f"source_share_{label}_{group}"] = entry[share]
    lines = [f"| source | group | cap | target share | {label} share |", "|---|---|---:|---:|---:|"]
    for source, entry in mix["sources"].items():
        cap = "" if entry["cap"] is None else f"{entry['cap']:.2%}"
        lines.append(f"| {source} | {entry['group']} | {cap} | {entry['target_share']:.2%} | {entry[share]:.2%} |")
    for group, entry in mix["groups"].items():
        lines.append(f"| **{group}** | | | {entry['target_share']:.2%} | {entry[share]:.2%} |")
    metadata[f"source_mix_{label}"] = dg.MetadataValue.md("\n".join(lines))
    metadata["source_mix_feasible"] = mix["feasible"]
    metadata["source_mix_infeasible"] = dg.MetadataValue.json(mix["infeasible"])
    metadata["source_mix_notes"] = dg.MetadataValue.json(mix["notes"])
    return metadata


SIGNIFICANT_DIGITS = 4  # a float as the UI shows it: 0.7042, 981.7, 1137 (the files keep full precision)
# the columns a {key: value} metadata dict becomes, by metadata key (others: key / value)
DICT_TABLE_COLUMNS = {
    FILES_SHA256: ("file", "sha256"),
    FILES_STAT: ("file", "stat"),
    "exercise_rows": ("exercise", "rows"),
    "heldout_kl_by_exercise": ("exercise", "rows"),
}
_SCALARS = (str, int, float, bool, type(None))
# what each markdown table of the metadata covers, said above it (a table shown without it is labelled only by its key)
TABLE_CAPTIONS = {
    "language_mix": "Rows written, by language",
    "exercise_mix": "Rows written, by exercise",
    "drops_by_exercise": "Rows in and dropped per exercise, by this step's reasons",
    "filter_drops_by_exercise": "The quality filters' drops per exercise, over every shard",
    "mix_before_after": "Memorization and non-English shares of the rows: before sampling, expected after it, and "
    "in the dataset",
    "span_lengths": "Analysis and final tokens per conversation, by language and exercise, over every shard",
    "cluster_size_histogram": "Near-duplicate clusters, by size",
    "largest_clusters": "The largest near-duplicate clusters",
    "bucket_tokens_kept": "Tokens this shard keeps in the pool, by skill bucket (rows) and ctx bucket (columns)",
    "bucket_tokens_achieved": "Tokens in the pool, by skill bucket (rows) and ctx bucket (columns)",
    "bucket_tokens_available": "Tokens the quota plan could draw from, by skill bucket (rows) and ctx bucket (columns)",
    "skill_mix_target_achieved": "The pool's skill mix on tokens: the target against what it holds",
}


def rounded(value: float) -> float:
    """`value` to SIGNIFICANT_DIGITS significant digits (integral floats and non-finite ones unchanged)."""
    if value != value or value in (float("inf"), float("-inf")) or value == int(value):
        return value
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def _table(columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> dg.MetadataValue:
    def kind(column: str) -> str:
        values = [row.get(column) for row in rows if row.get(column) is not None]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return "int"
        return "float" if values and all(isinstance(v, (int, float)) for v in values) else "string"

    schema = dg.TableSchema(columns=[dg.TableColumn(column, kind(column)) for column in columns])
    records = [
        dg.TableRecord({c: rounded(v) if isinstance(v, float) else v for c, v in row.items() if c in columns})
        for row in rows
    ]
    return dg.MetadataValue.table(records, schema)


def readable_value(key: str, value: Any) -> Any:
    """One metadata value as a person reads it in the UI: a markdown table under its caption (`TABLE_CAPTIONS`);
    floats to SIGNIFICANT_DIGITS digits; JSON that is a flat {key: value} dict or a list of flat records as a table
    (columns: `DICT_TABLE_COLUMNS`, or the records' keys). Anything else is returned as it is (lists of plain values
    stay JSON: the build's console reads some)."""
    raw = value.value if isinstance(value, dg.JsonMetadataValue) else value
    if isinstance(value, dg.MarkdownMetadataValue) and key in TABLE_CAPTIONS and value.value.startswith("|"):
        return dg.MetadataValue.md(f"**{TABLE_CAPTIONS[key]}**\n\n{value.value}")
    if isinstance(value, dg.FloatMetadataValue) and value.value is not None:
        return dg.MetadataValue.float(rounded(value.value))
    if isinstance(raw, float):
        return rounded(raw)
    if isinstance(raw, dict) and raw and all(isinstance(v, _SCALARS) for v in raw.values()):
        name, column = DICT_TABLE_COLUMNS.get(key, ("key", "value"))
        return _table((name, column), [{name: str(k), column: v} for k, v in raw.items()])
    if isinstance(raw, list) and raw and all(isinstance(item, dict) for item in raw):
        if all(isinstance(v, _SCALARS) for item in raw for v in item.values()):
            columns = list(dict.fromkeys(column for item in raw for column in item))
            return _table(columns, raw)
    return value


def readable_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`readable_value` of every entry of `metadata` (None stays None)."""
    return None if metadata is None else {key: readable_value(key, value) for key, value in metadata.items()}


def latest_partition_materialization(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, partition: str, before: int | None = None
) -> dg.AssetMaterialization | None:
    """The latest materialization of `asset_key`'s `partition` (before the storage id `before` when given), or None."""
    where = dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[partition], before_storage_id=before)
    records = instance.fetch_materializations(where, limit=1).records
    return records[0].asset_materialization if records else None


MATERIALIZATIONS_PER_FETCH = 1000  # records one event-log query returns when the latest of many partitions is asked


def latest_partition_materializations(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, partitions: Iterable[str]
) -> dict[str, dg.AssetMaterialization]:
    """The latest materialization of each of `partitions` of `asset_key` (a partition never materialized is left
    out), newest records first a thousand a query: a check over every shard asks the event log a few times, not
    once per shard."""
    wanted = set(partitions)
    latest: dict[str, dg.AssetMaterialization] = {}
    cursor = None
    while wanted - set(latest):
        where = dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=sorted(wanted))
        found = instance.fetch_materializations(where, limit=MATERIALIZATIONS_PER_FETCH, cursor=cursor)
        for record in found.records:
            materialization = record.asset_materialization
            if materialization is not None and materialization.partition not in latest:
                latest[materialization.partition] = materialization
        if not found.has_more:
            break
        cursor = found.cursor
    return latest


def files_sha256_of(metadata: Mapping[str, Any], key: str = FILES_SHA256) -> dict[str, str]:
    """The {file: sha256} a materialization's `files_sha256` entry lists (a table in the UI, `readable_value`), or
    the {file: stat} of its `files_stat` with `key`; {} without the entry."""
    value = metadata.get(key)
    if value is None:
        return {}
    if isinstance(value, dg.TableMetadataValue):
        file_column, value_column = DICT_TABLE_COLUMNS[key]
        return {record.data[file_column]: record.data[value_column] for record in value.records}
    return dict(value.value)


def heldout_matched_record(clusters_sha256: str, signatures_sha256: str, synth_ids: Iterable[str]) -> dict[str, Any]:
    """synth_sampled's metadata entry of the rows whose prompt is a held-out one (`heldout_matches`): a function
    of the clusters summary and the shard's signatures alone, so a later check under the same two (by sha256)
    takes them from here (`heldout_matched_of`)."""
    record = {"clusters_sha256": clusters_sha256, "signatures_sha256": signatures_sha256}
    return {HELDOUT_MATCHED: dg.MetadataValue.json({**record, "synth_ids": sorted(synth_ids)})}


def heldout_matched_of(metadata: Mapping[str, Any], clusters_sha256: str, signatures_sha256: str) -> list[str] | None:
    """The synth_ids a synth_sampled materialization matched under these clusters and signatures; None when it
    recorded none, or matched under others."""
    entry = metadata.get(HELDOUT_MATCHED)
    record = entry.value if entry is not None else None
    if not isinstance(record, dict):
        return None
    if record.get("clusters_sha256") != clusters_sha256 or record.get("signatures_sha256") != signatures_sha256:
        return None
    return list(record["synth_ids"])


def current_sha256(materialization: dg.AssetMaterialization | None, path: Path) -> str:
    """The sha256 of the one file `path` a step wrote: as its materialization recorded it when the file's stat is
    still the recorded one (`unchanged_since_hashed`), else (no materialization, or another stat) hashed now."""
    hashed = hashed_files_written(materialization.metadata) if materialization is not None else None
    return sha256_files([path.resolve()], hashed)[0]


def hashed_files_written(metadata: Mapping[str, Any]) -> dict[Path, HashedFile]:
    """What a step hashed when it wrote its files (`hashed_files_of`), by absolute path: under its `dagster/uri`,
    the directory holding them, or the one file's directory when it wrote one (`files_metadata`)."""
    uri = metadata.get(URI)
    if uri is None:
        return {}
    where = Path(urllib.parse.unquote(urllib.parse.urlparse(uri.value).path))
    return hashed_files_of(metadata, where if where.is_dir() else where.parent)


def partitions_hashed_files(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, partitions: Iterable[str]
) -> dict[Path, HashedFile]:
    """What the latest materializations of `partitions` of `asset_key` hashed as they wrote their files
    (`hashed_files_written`), by absolute path: a global step that reads those files takes their sha256 from here
    while their stat is unchanged (`sha256_files`)."""
    latest = latest_partition_materializations(instance, asset_key, partitions)
    return {path: record for m in latest.values() for path, record in hashed_files_written(m.metadata).items()}


def hashed_files_of(metadata: Mapping[str, Any], base: Path) -> dict[Path, HashedFile]:
    """What a step hashed when it wrote its files (`files_sha256` with `files_stat`), by path under `base` (its
    `dagster/uri`): a file with no stat recorded (changed while hashed, or an older materialization) is left out."""
    digests, stats = files_sha256_of(metadata), files_sha256_of(metadata, FILES_STAT)
    return {base / name: HashedFile(digest, stats[name]) for name, digest in digests.items() if name in stats}
