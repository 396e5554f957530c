"""What every manifest says, built from its inputs: the shard reports and records, the sampling plan, the
hashes and the config the caller gathered. The assets only gather those, call a builder, write the
result atomically and attach metadata; the same inputs always give the same manifest.

- `harmony_manifest`: data/synth_harmony/manifest.json (per shard: source hash as read, output, report);
- `sampling_plan`: the 001 sampling plan, from every shard's exercise x language counts after the filters;
- `kd_manifest` / `distill_manifest`: the two datasets' manifests, each with `provenance` (git, config and
  its hash, tokenizer, input manifest), the plan with the mix it achieved (`sampling_section`), every
  shard's record, every file, and totals over all steps (`row_totals`);
- `kd_build_config` / `distill_build_config`: everything that can change a dataset's bytes (its config hash).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from synthkd_assets.core.buckets import grids_from_reports, nested_grid
from synthkd_assets.core.dataset_manifest import files_section
from synthkd_assets.core.distill_io import DISTILL_SCHEMA
from synthkd_assets.core.inventory import shard_index_from_name
from synthkd_assets.core.layout import CURRICULUM_SUBDIR, documents_path, shard_record_path
from synthkd_assets.core.manifest import config_hash, sum_reports
from synthkd_assets.core.megatron_io import ShardSplitInventory
from synthkd_assets.core.near_dup import removed_by_clusters
from synthkd_assets.core.report import ShardReport
from synthkd_assets.core.sampling import (
    Cell,
    MixTargets,
    cells_from_nested,
    mix_meets_targets,
    mix_summary,
    nested_from_cells,
    plan_keep_rates,
)
from synthkd_assets.core.source_mix import achieved_vs_target, reports_by_source
from synthkd_contract import constants, sources
from synthkd_contract.harmony_artifact import parse_range_key
from synthkd_contract.manifest_seal import file_record
from synthkd_contract.schemas import POOL_SCHEMA

PERCENTILES = (50, 90, 99)  # of the DistillKit token lengths, per split


class ManifestInputError(ValueError):
    """Inputs no consistent manifest can be built from (shards sampled with another plan, written elsewhere)."""


def summed_cells(reports: Iterable[Mapping[str, Any]]) -> dict[Cell, int]:
    """Rows per (exercise, language) summed over shard reports (their `exercise_language`)."""
    cells: dict[Cell, int] = {}
    for report in reports:
        for cell, n in cells_from_nested(report.get("exercise_language", {})).items():
            cells[cell] = cells.get(cell, 0) + n
    return cells


def harmony_shard_entry(name: str, source_path: str, report: dict[str, Any], output: dict[str, Any]) -> dict[str, Any]:
    """One shard of the synth_harmony manifest; the source hash is the one of the bytes the step read (its
    report), not of the file as it is now."""
    source = {"path": source_path, "bytes": report.get("source_bytes"), "sha256": report.get("source_sha256")}
    if (artifact_range := parse_range_key(name)) is not None:  # an artifact range: its row groups, both included
        source["row_groups"] = list(artifact_range[1:])
    return {"name": name, "source": source, "output": output, "report": report}


def harmony_manifest(
    system: dict[str, Any], entries: list[dict[str, Any]], input_artifact: dict[str, Any] | None = None
) -> dict[str, Any]:
    """data/synth_harmony/manifest.json: schema, system message, and per-shard source/output hashes and counts;
    with a synth_harmony_v1 artifact as input, its manifest's path and sha256 (`input_artifact`)."""
    reports = [entry["report"] for entry in entries]
    artifact = {} if input_artifact is None else {"input_artifact": input_artifact}
    return {
        **artifact,
        "schema": constants.HARMONY_SCHEMA_NAME,
        "source_dataset": constants.SOURCE_DATASET,
        "system_message": system,
        "user_template": constants.USER_TEMPLATE,
        "shards": entries,
        "rows_in": sum(report["rows_in"] for report in reports),
        "rows_out": sum(report["rows_out"] for report in reports),
        "dropped": sum_reports(reports, "dropped"),
        "sanitized": sum_reports(reports, "sanitized"),
    }


def sampling_plan(
    filtered_reports: Mapping[str, dict[str, Any]],
    targets: MixTargets,
    clusters: Mapping[str, Any] | None = None,
    clusters_sha256: str | None = None,
) -> dict[str, Any]:
    """The plan (core/sampling.py `plan_keep_rates`) for every shard's counts after the filters and after the
    rows the near-duplicate clusters remove (cap, held out: `clusters`, synth_clusters' summary), and the rows
    each shard contributed."""
    removed = removed_by_clusters(clusters or {}, set(filtered_reports))
    plan = plan_keep_rates(counts_after_clusters(filtered_reports, removed), targets)
    near_dup = {"clusters_sha256": clusters_sha256, "removed": nested_from_cells(removed)}
    return {**plan, "near_dup": near_dup, "shards": {name: r["rows_out"] for name, r in filtered_reports.items()}}


def counts_after_clusters(
    filtered_reports: Mapping[str, dict[str, Any]], removed: Mapping[Cell, int]
) -> dict[Cell, int]:
    """Rows per (exercise, language) after the filters, less the rows the clusters remove."""
    cells = summed_cells(filtered_reports.values())
    return {cell: n - removed.get(cell, 0) for cell, n in cells.items() if n - removed.get(cell, 0) > 0}


def source_totals(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """{"sources": {source: {rows, tokens, shards, dataset}}} of a dataset's shard records when some shard is an
    anchor source's (tokens: label positions, the sum of span_tokens), else {}: a SYNTH-only manifest keeps its
    bytes."""
    by_source: dict[str, dict[str, Any]] = {}
    for record in records:
        source = sources.partition_source(record["partition"])
        entry = by_source.setdefault(
            source, {"dataset": sources.source_dataset(source), "shards": 0, "rows": 0, "tokens": 0}
        )
        entry["shards"] += 1
        entry["rows"] += record["report"]["rows_out"]
        entry["tokens"] += sum(record["report"].get("span_tokens", {}).values())
    if set(by_source) <= {sources.SYNTH_SOURCE}:
        return {}
    total = sum(entry["tokens"] for entry in by_source.values())
    return {
        "sources": {
            source: {**entry, "token_share": entry["tokens"] / total if total else 0.0}
            for source, entry in sorted(by_source.items())
        }
    }


def sampling_section(
    plan: dict[str, Any],
    plan_sha256: str,
    filtered_reports: Mapping[str, dict[str, Any]],
    sampled_reports: Mapping[str, dict[str, Any]],
) -> dict[str, Any]:
    """The plan, and the mix it achieved: before (after the filters) / expected / achieved (synth_sampled).
    ManifestInputError if a shard was sampled with another plan (a re-plan means rebuilding every shard)."""
    for name, sampled in sampled_reports.items():
        if sampled.get("plan_sha256") != plan_sha256:
            raise ManifestInputError(
                f"synth_sampled partition {name!r} was made with plan {str(sampled.get('plan_sha256'))[:12]}, the "
                f"current plan is {plan_sha256[:12]}: re-materialize every shard after a new plan"
            )
    # the 001 mixture is SYNTH's (anchor shards are not sampled by it): its counts and achieved mix are SYNTH's
    filtered_reports = reports_by_source(filtered_reports).get(sources.SYNTH_SOURCE, {})
    sampled_reports = reports_by_source(sampled_reports).get(sources.SYNTH_SOURCE, {})
    achieved = mix_summary(summed_cells(sampled_reports.values()))
    return {
        "plan_sha256": plan_sha256,
        **{key: plan[key] for key in ("targets", "salts", "rule", "rates", "feasible", "notes")},
        "near_dup": plan.get("near_dup"),  # the clusters the plan counted after, and the rows they removed
        "plan_counts_current": cells_from_nested(plan["counts"])
        == counts_after_clusters(filtered_reports, cells_from_nested(plan.get("near_dup", {}).get("removed", {}))),
        "before": plan["before"],
        "expected_after": plan["expected_after"],
        "achieved_after": achieved,
        "achieved_meets_targets": mix_meets_targets(achieved, MixTargets(**plan["targets"])),
    }


def provenance(
    git: dict[str, Any],
    config: dict[str, Any],
    tokenizer: dict[str, str],
    input_manifest: dict[str, str],
    input_artifact: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What every dataset manifest records about where its bytes came from (seed 000 "Provenance"):
    `tokenizer` and `input_manifest` as {path, sha256}; with a synth_harmony_v1 artifact as input, its manifest as
    `input_artifact` ({path, sha256, ...}: core/harmony_artifact.py)."""
    hashed = {"config": config, "config_hash": config_hash(config)}
    artifact = {} if input_artifact is None else {"input_artifact": input_artifact}
    return {**git, **hashed, "tokenizer": tokenizer, "input_manifest": input_manifest, **artifact}


def row_totals(stage_reports: Mapping[str, Mapping[str, dict]], output_reports: Sequence[dict]) -> dict[str, Any]:
    """Rows in (raw rows, from synth_harmony) and out, drops of every step, sanitizations and tokens per span;
    `stage_reports`: {stage: {shard: report}} of the four stage steps."""
    harmony = list(stage_reports["synth_harmony"].values())
    steps = [r for stage, reports in stage_reports.items() if stage != "synth_harmony" for r in reports.values()]
    return {
        "rows_in": sum(report["rows_in"] for report in harmony),
        "rows_out": sum(report["rows_out"] for report in output_reports),
        "span_tokens": sum_reports(list(output_reports), "span_tokens"),
        "dropped": sum_reports([*harmony, *steps, *output_reports], "dropped"),
        "sanitized": sum_reports(harmony, "sanitized"),
    }


def kd_shard_record(partition: str, report: ShardReport, inventories: list[ShardSplitInventory]) -> dict[str, Any]:
    """shards/shard_XX.json of synth_kd_v1: the shard's report and what it wrote into each split."""
    splits = [inventory.to_dict() for inventory in inventories]
    return {"partition": partition, "report": report.to_dict(), "splits": splits}


def kd_dataset_files(dataset_root: Path, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every file of synth_kd_v1 for its manifest's `files`: each shard's trio files (hashed when they
    were written, from its record), its record and its documents table (hashed now)."""
    listed = [f for record in records for split in record["splits"] for f in split["files"]]
    for record in records:
        shard_index = shard_index_from_name(record["partition"])
        for path in (shard_record_path(dataset_root, shard_index), documents_path(dataset_root, shard_index)):
            listed.append(file_record(dataset_root, path))
    return files_section(listed)


def kd_manifest(
    name: str,
    provenance: dict[str, Any],
    sampling: dict[str, Any],
    stage_reports: Mapping[str, Mapping[str, dict]],
    records: list[dict[str, Any]],
    files: list[dict[str, Any]],
) -> dict[str, Any]:
    """<megatron root>/manifest.json: provenance, split rule, sampling plan and achieved mix, every shard's
    record with bytes/sha256/counts, every file, tokens per span and drops by reason."""
    reports = [record["report"] for record in records]
    return {
        "dataset": name,
        **provenance,
        "split": {
            "rule": constants.SPLIT_RULE,
            "salt": constants.SPLIT_SALT,
            "valid_fraction": constants.VALID_FRACTION,
        },
        "sampling": sampling,
        **source_totals(records),
        "shards": records,
        "files": files,
        "totals": {
            **row_totals(stage_reports, reports),
            "sequences": sum_reports(reports, "sequences"),
            "bytes": sum(split["bytes"] for record in records for split in record["splits"]),
        },
    }


def distill_manifest(
    name: str,
    dataset_root: str,
    provenance: dict[str, Any],
    sampling: dict[str, Any],
    stage_reports: Mapping[str, Mapping[str, dict]],
    records: list[dict[str, Any]],
    max_seq_len: int,
    valid_fraction: float,
    encoding_errors_log: dict[str, Any],
) -> dict[str, Any]:
    """<distill root>/manifest.json: provenance, split rule, sampling plan and achieved mix, token-length stats
    per split, drops by reason, every part's bytes and sha256; `dataset_root` as the records must name it
    (ManifestInputError for a shard written to another root)."""
    for record in records:
        if record["dataset_root"] != dataset_root:
            raise ManifestInputError(
                f"synth_distill partition {record['partition']!r} was written to {record['dataset_root']}, "
                f"not {dataset_root}"
            )
    reports = [record["report"] for record in records]
    lengths = {
        split: length_stats(merge_histograms([record["length_histogram"].get(split, {}) for record in records]))
        for split in constants.DISTILL_SPLITS
    }
    return {
        "dataset": constants.DISTILL_DATASET_NAME,
        "name": name,
        **provenance,
        "split": {
            "rule": constants.SPLIT_RULE,
            "salt": constants.DISTILL_SPLIT_SALT,
            "valid_fraction": valid_fraction,
            "names": list(constants.DISTILL_SPLITS),
        },
        "max_seq_len": max_seq_len,
        "sampling": sampling,
        **source_totals(records),
        "token_lengths": lengths,
        "encoding_errors_log": encoding_errors_log,
        "shards": [{key: record[key] for key in ("partition", "shard_index", "report", "files")} for record in records],
        "files": files_section(f for record in records for f in record["files"]),
        "totals": {
            **row_totals(stage_reports, reports),
            "rows_per_split": sum_reports(reports, "sequences"),
            "bytes": sum(f["bytes"] for record in records for f in record["files"]),
        },
    }


def merge_histograms(histograms: list[Mapping[str, int]]) -> Counter:
    total: Counter = Counter()
    for histogram in histograms:
        for length, n in histogram.items():
            total[int(length)] += int(n)
    return total


def length_stats(histogram: Mapping[int, int]) -> dict[str, int | None]:
    """rows, tokens, min / p50 / p90 / p99 / max of len(input_ids); pXX is the nearest-rank percentile
    (the smallest length with at least XX% of the rows at or below it)."""
    rows = sum(histogram.values())
    stats: dict[str, int | None] = {"rows": rows, "tokens": sum(length * n for length, n in histogram.items())}
    if not rows:
        return {**stats, "min": None, **{f"p{p}": None for p in PERCENTILES}, "max": None}
    lengths = sorted(histogram)
    cumulative = np.cumsum([histogram[length] for length in lengths])
    stats["min"] = lengths[0]
    for p in PERCENTILES:
        rank = -(-p * rows // 100)  # ceil(p/100 * rows), integer arithmetic
        stats[f"p{p}"] = lengths[int(np.searchsorted(cumulative, rank))]
    stats["max"] = lengths[-1]
    return stats


def _caps_config(max_rows: int | None, max_tokens: int | None, max_input_rows: int | None) -> dict[str, int | None]:
    return {
        "max_input_rows_per_shard": max_input_rows,
        "max_rows_per_shard": max_rows,
        "max_tokens_per_shard": max_tokens,
    }


def kd_build_config(
    system: dict[str, Any],
    max_rows: int | None,
    max_tokens: int | None,
    selection: dict[str, Any] | None = None,
    max_input_rows: int | None = None,
) -> dict[str, Any]:
    """Everything that can change the bytes of synth_kd_v1, hashed into the manifest's config_hash
    (`selection`: the 001 filter and sampling settings the rows went through)."""
    return {
        "dataset": constants.DATASET_NAME,
        "harmony_schema": constants.HARMONY_SCHEMA_NAME,
        "user_template": constants.USER_TEMPLATE,
        "system_message": system,
        "render": {"auto_drop_analysis": False, "training_style_return": True, "eod_token_id": constants.EOD_TOKEN_ID},
        "dtypes": {k: str(v.__name__) for k, v in constants.ARRAY_DTYPES.items()},
        "split": {"salt": constants.SPLIT_SALT, "valid_fraction": constants.VALID_FRACTION},
        "tokenizer_sha256": constants.TOKENIZER_SHA256,
        "caps": _caps_config(max_rows, max_tokens, max_input_rows),
        "selection": selection,
        "versions": {pkg: version(pkg) for pkg in ("openai-harmony", "megatron-core", "synthkd")},
    }


def distill_build_config(
    system: dict[str, Any],
    selection: dict[str, Any],
    max_seq_len: int,
    valid_fraction: float,
    max_rows: int | None,
    max_tokens: int | None,
    max_input_rows: int | None = None,
) -> dict[str, Any]:
    """Everything that can change the bytes of the DistillKit dataset, hashed into its manifest."""
    return {
        "dataset": constants.DISTILL_DATASET_NAME,
        "format": "DistillKit/TRL unpacked examples (Parquet)",
        "harmony_schema": constants.HARMONY_SCHEMA_NAME,
        "user_template": constants.USER_TEMPLATE,
        "system_message": system,
        "render": {
            "training": "render_conversation_for_training(auto_drop_analysis=False), trailing EOD removed",
            "assistant_token_start": "len(render_conversation_for_completion(system + user, Role.ASSISTANT))",
        },
        "schema": DISTILL_SCHEMA.to_string(show_schema_metadata=False),
        "label_ignore_id": constants.LABEL_IGNORE_ID,
        "max_seq_len": max_seq_len,
        "split": {
            "salt": constants.DISTILL_SPLIT_SALT,
            "valid_fraction": valid_fraction,
            "names": list(constants.DISTILL_SPLITS),
        },
        "selection": selection,
        "tokenizer_sha256": constants.TOKENIZER_SHA256,
        "caps": _caps_config(max_rows, max_tokens, max_input_rows),
        "versions": {pkg: version(pkg) for pkg in ("openai-harmony", "synthkd")},
    }


def pool_dataset_files(pool_root: Path, trio_root: Path, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every file of the pool for its manifest: each shard's part and trios (hashed when written, from its
    record), its record and the curriculum files (hashed now)."""
    trio_prefix = trio_root.relative_to(pool_root).as_posix()
    listed = [record["part"] for record in records]
    listed += [
        {**f, "path": f"{trio_prefix}/{f['path']}"}
        for record in records
        for trio in record["trios"]
        for f in trio["files"]
    ]
    listed += [file_record(pool_root, shard_record_path(pool_root, record["shard_index"])) for record in records]
    curriculum = pool_root / CURRICULUM_SUBDIR
    if curriculum.is_dir():
        listed += [file_record(pool_root, path) for path in sorted(curriculum.iterdir()) if path.is_file()]
    return files_section(listed)


def quota_achieved(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Tokens and rows per (skill, ctx) cell the pool holds, summed over its shard reports, on the full grid."""
    tokens, rows = grids_from_reports(reports)
    return {"tokens": nested_grid(tokens), "rows": nested_grid(rows)}


def pool_source_mix(quota_plan: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """{"source_mix": targets, rates, expected and achieved tokens and shares per source and category} when the
    quota plan has a source mix (anchor sources are present), else {}."""
    if "source_mix" not in quota_plan:
        return {}
    achieved: dict[str, int] = {}
    for record in records:
        source = sources.partition_source(record["partition"])
        tokens = record["report"].get("bucket_tokens", {})
        achieved[source] = achieved.get(source, 0) + sum(n for cells in tokens.values() for n in cells.values())
    plan = quota_plan["source_mix"]
    keys = ("targets", "salt", "rule", "rates", "feasible", "infeasible", "notes", "kept_total")
    return {"source_mix": {**{key: plan[key] for key in keys}, **achieved_vs_target(plan, achieved)}}


def require_one_quota_plan(records: Iterable[Mapping[str, Any]], quota_plan_sha256: str) -> None:
    """ManifestInputError naming the first synth_pool shard record made under another quota plan than the current
    one: a pool's manifest and its curriculum blends describe one plan's rows, never a mix of two."""
    for record in records:
        made_with = record["report"].get("plan_sha256")
        if made_with != quota_plan_sha256:
            raise ManifestInputError(
                f"synth_pool partition {record['partition']!r} was made with quota plan {str(made_with)[:12]}, the "
                f"current one is {quota_plan_sha256[:12]}: re-materialize every synth_pool shard after a new plan"
            )


def require_quota_plan(in_force: Mapping[str, Any], expected: Mapping[str, Any], path: Path) -> None:
    """ManifestInputError unless the quota plan in force (read from `path`) is the one its targets give over the
    current shards (`expected`, computed afresh): a plan edited by hand (its rates, its grids, its targets' shares)
    would otherwise be built into a pool whose manifest shows the configured targets beside other rates.

    Args:
        in_force: the plan as read from its file.
        expected: the plan the configured targets give now.
        path: the plan's file, for the message.

    Raises:
        ManifestInputError: naming the sections that differ.
    """
    expected = json.loads(json.dumps(expected))  # as written: tuples are lists, keys strings
    differ = sorted(key for key in set(in_force) | set(expected) if in_force.get(key) != expected.get(key))
    if differ:
        raise ManifestInputError(
            f"the quota plan {path} is not the one the configured targets give over the current shards (its "
            f"{', '.join(differ)} differ): edited by hand, or made before a shard changed; re-materialize "
            "synth_quota_plan, then every synth_pool shard"
        )


def heldout_section(
    pool_root: Path, validation_root: Path, validation_manifest: Mapping[str, Any] | None, sampling: Mapping[str, Any]
) -> dict[str, Any]:
    """The pool manifest's `validation_sets`: where its build's validation sets are (relative to the pool root, as
    `synthkd_training.pool.verify_pool` looks for them) and the near-duplicate clusters they were held out of.

    Args:
        pool_root: the pool's root.
        validation_root: the validation sets' root of the same build.
        validation_manifest: their manifest, None when there is none.
        sampling: the pool manifest's sampling section (`near_dup.clusters_sha256`: the clusters the plan counted
            after).

    Returns:
        {"validation_root", "clusters_sha256"}.

    Raises:
        ManifestInputError: the validation sets were held out of other clusters than the pool's plan counted after
            (a plan pass ran after the pool's, and the pool pass has not run since): one plan's pool, curriculum
            and validation sets, or none published.
    """
    planned = (sampling.get("near_dup") or {}).get("clusters_sha256")
    held_out = (validation_manifest or {}).get("clusters_sha256")
    if planned is not None and held_out is not None and planned != held_out:
        raise ManifestInputError(
            f"the validation sets {validation_root} were held out of clusters {held_out[:12]}, the pool's plan counted "
            f"after clusters {planned[:12]}: build again (./scripts/build.sh) so that the pool, its curriculum and "
            "the validation sets come from one plan"
        )
    relative = Path(os.path.relpath(validation_root, pool_root)).as_posix()
    return {"validation_root": relative, "clusters_sha256": held_out}


def pool_manifest(
    name: str,
    provenance: dict[str, Any],
    sampling: dict[str, Any],
    stage_reports: Mapping[str, Mapping[str, dict]],
    records: list[dict[str, Any]],
    quota_plan: dict[str, Any],
    quota_plan_sha256: str,
    curriculum: dict[str, Any],
    files: list[dict[str, Any]],
    validation_sets: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """<pool root>/manifest.json, the sampling manifest (docs/pool.md#reports): provenance and config hash, the 001 plan
    with its achieved mix, the quota grid (targets, rates, expected and achieved tokens and rows per cell, what was
    infeasible), the curriculum schedule with the epochs each stage needs, the validation sets of its build
    (`heldout_section`), every shard and file, totals. ManifestInputError for a shard made under another quota
    plan."""
    require_one_quota_plan(records, quota_plan_sha256)
    reports = [record["report"] for record in records]
    achieved = quota_achieved(reports)
    achieved_skill = {b: math.fsum(cells.values()) for b, cells in achieved["tokens"].items()}
    total = math.fsum(achieved_skill.values())
    return {
        "dataset": name,
        "schema": POOL_SCHEMA.to_string(show_schema_metadata=False),
        **provenance,
        "split": {
            "rule": constants.SPLIT_RULE,
            "salt": constants.SPLIT_SALT,
            "valid_fraction": constants.VALID_FRACTION,
        },
        "sampling": sampling,
        "quota": {
            "plan_sha256": quota_plan_sha256,
            **{key: quota_plan[key] for key in ("targets", "salt", "rule", "rates", "feasible", "infeasible", "notes")},
            "available": quota_plan["available"],
            "expected": quota_plan["expected"],
            "achieved": achieved,
            "achieved_skill_share": {b: (n / total if total else 0.0) for b, n in achieved_skill.items()},
        },
        **pool_source_mix(quota_plan, records),
        "curriculum": curriculum["stages"],
        **({"validation_sets": validation_sets} if validation_sets is not None else {}),
        "shards": records,
        "files": files,
        "totals": {
            **row_totals(stage_reports, reports),
            "sequences": sum_reports(reports, "sequences"),
            "bytes": sum(f["bytes"] for f in files),
        },
    }
