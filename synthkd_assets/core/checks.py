"""Dataset-level verifications behind the blocking asset checks; each returns readable problems."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from synthkd_assets.core.layout import (
    CLUSTERS_STAGE,
    MEGATRON_SHARDS_SUBDIR,
    POOL_PARTS_SUBDIR,
    SIGNATURES_STAGE,
    DataLayout,
)
from synthkd_assets.core.megatron_io import trio_alignment_problems
from synthkd_assets.core.parquet_io import InputFileError, read_arrow_schema
from synthkd_assets.core.problems import Problems
from synthkd_contract import constants
from synthkd_contract.manifest_seal import HashedFile, dataset_problems, sha256_file, unchanged_since_hashed
from synthkd_contract.schemas import (
    CLUSTERS_SCHEMA,
    DISTILL_SCHEMA,
    DOCUMENTS_SCHEMA,
    HARMONY_SCHEMA,
    POOL_SCHEMA,
    SIGNATURES_SCHEMA,
    TOKENIZED_SCHEMA,
    VALIDATION_SCHEMA,
)

HARMONY_STAGES = ("synth_harmony", "synth_filtered", "synth_sampled")  # synth_harmony_v1 rows, then subsets

REQUIRED_MANIFEST_KEYS = (
    "git_sha",
    "config",
    "config_hash",
    "tokenizer",
    "input_manifest",
    "split",
    "shards",
    "files",
    "totals",
)


def manifest_problems(
    root: Path,
    manifest: dict[str, Any],
    expected_config_hash: str,
    layout: DataLayout,
    hashed: Mapping[Path, HashedFile] | None = None,
) -> list[str]:
    """Provenance complete, the manifest matching its sealed sha256, every recorded hash and size still
    matching the bytes on disk, and no file under `root` that the manifest does not list.

    Dataset files are recorded relative to the dataset `root`; the tokenizer and input manifest as
    `layout.recorded` wrote them (relative to the data root, or absolute when they live outside it). A file of
    `hashed` (what the shards' steps hashed as they wrote them) whose stat is unchanged keeps its recorded sha256
    without being read (`sha256_files`)."""
    problems = [f"manifest lacks {key!r}" for key in REQUIRED_MANIFEST_KEYS if key not in manifest]
    if problems:
        return problems
    if manifest["config_hash"] != expected_config_hash:
        problems.append(
            f"config_hash {manifest['config_hash'][:12]} is not the current config's {expected_config_hash[:12]}"
        )
    if manifest["tokenizer"]["sha256"] != constants.TOKENIZER_SHA256:
        problems.append(f"tokenizer sha256 {manifest['tokenizer']['sha256']} is not the pinned one")
    for label in ("tokenizer", "input_manifest", "input_artifact"):
        if label not in manifest:  # input_artifact: only a build from a synth_harmony_v1 artifact has one
            continue
        path = layout.resolve_recorded(manifest[label]["path"])
        if not path.is_file() or sha256_file(path) != manifest[label]["sha256"]:
            problems.append(f"{label} {path} no longer has the recorded sha256")
    listed = {record["path"] for record in manifest["files"]}
    for shard in manifest["shards"]:
        for split in shard["splits"]:
            for record in split["files"]:
                path = root / record["path"]
                if record["path"] in listed:
                    continue  # checked once, with the `files` list
                if not path.is_file():
                    problems.append(f"{record['path']} is missing")
                elif path.stat().st_size != record["bytes"] or sha256_file(path) != record["sha256"]:
                    problems.append(f"{record['path']} differs from the manifest (bytes or sha256)")
    if any(f"{r['path']}" not in listed for s in manifest["shards"] for sp in s["splits"] for r in sp["files"]):
        problems.append("the manifest's `files` does not list every shard file")
    # the seal, every listed file's bytes and sha256, and no file under the root that is not listed
    return problems + dataset_problems(root, hashed=hashed)


def split_leakage(document_tables: list[Path]) -> Problems:
    """synth_ids present in both train and valid, across all shards."""
    documents = pl.concat([pl.read_parquet(path) for path in document_tables]) if document_tables else None
    if documents is None or documents.is_empty():
        return []
    leaked = documents.group_by("synth_id").agg(pl.col("split").n_unique().alias("splits")).filter(pl.col("splits") > 1)
    listed = [f"synth_id {sid!r} is in both splits" for sid in leaked["synth_id"].sort().head(20)]
    return Problems(listed, total=leaked.height)


def validation_rows_trained(document_tables: list[Path], validation_sets: list[Path]) -> Problems:
    """synth_ids of the validation sets (rows of held-out clusters: never trained on, docs/near-dup.md) found in the
    documents tables, each named with its set and table. A validation set not on disk holds nothing."""
    held = [
        pl.read_parquet(path, columns=["synth_id"]).with_columns(set=pl.lit(path.name))
        for path in validation_sets
        if path.is_file()
    ]
    trained = [
        pl.read_parquet(path, columns=["synth_id"]).with_columns(table=pl.lit(path.name)) for path in document_tables
    ]
    if not held or not trained:
        return Problems()
    found = pl.concat(held).join(pl.concat(trained), on="synth_id").sort("synth_id", "set", "table")
    listed = [
        f"synth_id {i!r} of {s} is in {t}" for i, s, t in found.head(20).select("synth_id", "set", "table").iter_rows()
    ]
    return Problems(listed, total=found.height)


def unreadable_shards(
    root: Path, manifest: dict[str, Any], aligned_when_written: Mapping[Path, HashedFile] | None = None
) -> tuple[list[str], int]:
    """Every shard/split the manifest lists, validated as a trio (`validate_trio`: readable by megatron-core too),
    but those whose files are all in `aligned_when_written` (what the shards' steps hashed as they wrote trios
    their trio_alignment check passed on) with the manifest's sha256 and an unchanged stat: the same bytes.

    Args:
        root: the dataset root.
        manifest: its manifest.
        aligned_when_written: the files of trios validated when they were written, by path.

    Returns:
        (the problems, how many shard/splits were read).
    """
    aligned = aligned_when_written or {}
    problems: list[str] = []
    read = 0
    for shard in manifest.get("shards", []):
        for split in shard["splits"]:
            if not split["sequences"]:
                continue
            if all(unchanged_since_hashed(root / f["path"], f["sha256"], aligned) for f in split["files"]):
                continue
            read += 1
            problems.extend(trio_alignment_problems(root / split["split"], split["shard_index"]))
    return problems, read


def input_drift(recorded_shards: list[dict[str, Any]], current_sha256: dict[str, str]) -> list[str]:
    """Raw shards whose bytes differ from (or are missing / new against) the recorded ones: the hashes
    synth_harmony computed from the bytes it read."""
    recorded = {entry["name"]: entry["source"]["sha256"] for entry in recorded_shards}
    problems = [
        f"raw shard {name} changed since synth_harmony read it (sha256 {str(sha)[:12]} -> {current_sha256[name][:12]})"
        for name, sha in sorted(recorded.items())
        if name in current_sha256 and current_sha256[name] != sha
    ]
    problems += [
        f"raw shard {name} recorded in the manifest is gone" for name in sorted(set(recorded) - set(current_sha256))
    ]
    problems += [f"raw shard {name} is not in the manifest" for name in sorted(set(current_sha256) - set(recorded))]
    return problems


def dataset_rows_problems(manifest: dict[str, Any]) -> list[str]:
    """Over the whole dataset: rows in == rows out + rows dropped (every step's drops), and each shard listed once."""
    problems = []
    partitions = [shard.get("partition") for shard in manifest.get("shards", [])]
    for name in sorted({p for p in partitions if partitions.count(p) > 1}, key=str):
        problems.append(f"shard {name!r} is listed {partitions.count(name)} times: two shards wrote one shard's files")
    totals = manifest.get("totals", {})
    rows_in, rows_out, dropped = totals.get("rows_in"), totals.get("rows_out"), sum(totals.get("dropped", {}).values())
    if rows_in is None or rows_out is None:
        problems.append("manifest totals lack rows_in / rows_out")
    elif rows_in != rows_out + dropped:
        problems.append(
            f"{rows_in} rows in over {len(partitions)} shards but {rows_out} out + {dropped} dropped "
            f"({rows_in - rows_out - dropped:+d} unaccounted)"
        )
    return problems


def schema_problems(path: Path, expected: pa.Schema) -> list[str]:
    """How a written Parquet table differs from its contract schema (column names, order and types; schema
    metadata aside), or that it cannot be read."""
    try:
        found = read_arrow_schema(path)
    except InputFileError as error:
        return [str(error)]
    if found.names != expected.names:
        return [f"{path}: columns {found.names}, the contract says {expected.names}"]
    return [
        f"{path}: column {field.name!r} is {field.type}, the contract says {want.type}"
        for field, want in zip(found, expected)
        if not field.type.equals(want.type)
    ]


def output_tables(paths: DataLayout, shards: list[str]) -> list[tuple[Path, pa.Schema]]:
    """Every Parquet table of a build before the pool, with its contract schema (docs/contract.md#checks "schema
    validity"): each shard's stage outputs, signatures and clusters, synth_kd_v1's documents tables, the DistillKit
    parts and the validation sets; files not built (yet) are left out."""
    stages = {**{stage: HARMONY_SCHEMA for stage in HARMONY_STAGES}, "synth_tokenized": TOKENIZED_SCHEMA}
    stages |= {SIGNATURES_STAGE: SIGNATURES_SCHEMA, CLUSTERS_STAGE: CLUSTERS_SCHEMA}
    tables = [(paths.stage_output(stage, key), schema) for key in shards for stage, schema in stages.items()]
    tables += [
        (p, DOCUMENTS_SCHEMA)
        for p in sorted((paths.megatron_root() / MEGATRON_SHARDS_SUBDIR).glob("*_documents.parquet"))
    ]
    tables += [(p, DISTILL_SCHEMA) for split in constants.DISTILL_SPLITS for p in _parts(paths.distill_root() / split)]
    tables += [(paths.heldout_kl(), VALIDATION_SCHEMA), (paths.format_suite(), VALIDATION_SCHEMA)]
    return [(path, schema) for path, schema in tables if path.is_file()]


def pool_tables(paths: DataLayout) -> list[tuple[Path, pa.Schema]]:
    """The pool's Parquet parts (docs/pool.md#what-the-pool-holds) with their contract schema."""
    return [(p, POOL_SCHEMA) for p in _parts(paths.pool_root() / POOL_PARTS_SUBDIR)]


def _parts(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.parquet")) if directory.is_dir() else []
