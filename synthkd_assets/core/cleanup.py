"""Outputs of shards that no longer exist: found by name across every stage and both datasets, and removed if
the build wrote them.

A shard's outputs are named after its partition key (stage Parquet and reports, DistillKit records, error
logs) or after its shard number (Megatron trio, documents table and shard record, DistillKit parts, the pool's
parts, per-cell trios and shard records, the valuation features' parts). When a raw file disappears, everything
named after it would otherwise stay on disk, and the dataset directories (what `tokens_prefixes` globs, what a
DistillKit loader reads) would hold data the manifest does not list. `orphaned_outputs` lists exactly those files
given the shards present, so a lost Dagster instance (partitions never registered as deleted) cannot hide them
either; removal deletes those the build's written ledger records (core/ownership.py: a file of the user's, or
one reached through a directory link, is never removed, whatever its name). A shard's near-duplicate
decisions (synth_clusters) are the global plan's, not the shard's: they stay until the next clustering replaces
them, so a shard removed and put back is sampled under the same cap and held-out decisions (its held-out rows never
reach training); synth_clusters removes the files of shards it no longer clusters.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from synthkd_assets.core.atomic import PARTIAL_SUFFIX
from synthkd_assets.core.curriculum import stage_files
from synthkd_assets.core.inventory import shard_index_from_name
from synthkd_assets.core.layout import (
    CLUSTERS_STAGE,
    ERROR_LOG_SUFFIX,
    HARMONY_DIR_ENV,
    HARMONY_STAGE,
    MEGATRON_SHARDS_SUBDIR,
    POOL_PARTS_SUBDIR,
    POOL_TRIOS_SUBDIR,
    RECORD_SUFFIX,
    REPORT_SUFFIX,
    ROWS_SUFFIX,
    SOURCES_DIR_ENV,
    STAGE_SUFFIX,
    DataLayout,
)
from synthkd_assets.core.ownership import remove_replaced_output, remove_written, written_by_build
from synthkd_contract import constants, sources
from synthkd_contract.harmony_artifact import ARTIFACT_FILE_STEM, is_artifact_key
from synthkd_contract.manifest_seal import sidecar_path

_MEGATRON_NAME = re.compile(
    r"^shard_(\d+)(?:_(?:" + "|".join(constants.ARRAY_KINDS) + r")\.(?:bin|idx)|\.json|_documents\.parquet)$"
)
_DISTILL_NAME = re.compile(r"^part-(\d+)\.parquet$")


def _final_name(name: str) -> str:
    """The name a partial file (`<name>.<random>.partial`, core/atomic.py) will be published under."""
    return name[: -len(PARTIAL_SUFFIX)].rsplit(".", 1)[0] if name.endswith(PARTIAL_SUFFIX) else name


def _key_of(name: str, suffixes: Iterable[str]) -> str | None:
    name = _final_name(name)
    for suffix in suffixes:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return None


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() or p.is_symlink()) if directory.is_dir() else []


def _files_below(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() or p.is_symlink()) if directory.is_dir() else []


def _dirs(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_dir()) if directory.is_dir() else []


def _keyed_files(directory: Path, suffixes: tuple[str, ...]) -> list[tuple[Path, str]]:
    """Every file below `directory` named after a partition key (an anchor shard's `<source>/<stem>` is a path
    below), final or partial, with that key."""
    found = []
    for path in _files_below(directory):
        key = _key_of(path.relative_to(directory).as_posix(), suffixes)
        if key is not None:
            found.append((path, key))
    return found


def orphaned_outputs(layout: DataLayout, present: Collection[str]) -> list[Path]:
    """Every per-shard output file (final or `.partial`) of the full and the smoke build on `layout`'s data
    root that belongs to no shard in `present` and that the build wrote.

    Args:
        layout: the build's layout (both builds on its data root are looked at).
        present: the partition keys of the shards there now.

    Returns:
        A key-named file of another key, or a number-named file of a shard number no present shard has, that the
        build's written ledger records (core/ownership.py), sorted.
    """
    present_keys = set(present)
    present_numbers = {shard_index_from_name(key) for key in present_keys}
    not_orphans = present_keys | {"manifest"}  # a stage's manifest.json is named like a key, and is no shard's
    found: list[Path] = []
    # not the clusters: the plan's decisions for every shard it clustered, in force until the next re-plan
    # (`stale_cluster_files`), so a shard that comes back gets its rows' cap and held-out decisions again
    stage_dirs = [d for d in layout.all_stage_dirs() if d.name != CLUSTERS_STAGE]
    key_dirs = [(d, (REPORT_SUFFIX, ROWS_SUFFIX, STAGE_SUFFIX)) for d in stage_dirs]  # the longest suffix first
    key_dirs += [(d, (RECORD_SUFFIX,)) for d in layout.all_distill_records_dirs()]
    for errors_dir in layout.all_errors_dirs():
        if errors_dir.is_dir():
            key_dirs += [(d, (ERROR_LOG_SUFFIX,)) for d in sorted(errors_dir.iterdir()) if d.is_dir()]
    for directory, suffixes in key_dirs:
        found += [path for path, key in _keyed_files(directory, suffixes) if key not in not_orphans]
    megatron_dirs = (*constants.SPLITS, MEGATRON_SHARDS_SUBDIR)
    numbered = [(root / sub, _MEGATRON_NAME) for root in layout.all_megatron_roots() for sub in megatron_dirs]
    numbered += [(root / sub, _DISTILL_NAME) for root in layout.all_distill_roots() for sub in constants.DISTILL_SPLITS]
    for root in layout.all_pool_roots():
        numbered += [(root / POOL_PARTS_SUBDIR, _DISTILL_NAME), (root / MEGATRON_SHARDS_SUBDIR, _MEGATRON_NAME)]
        cells = [cell for split in constants.SPLITS for cell in _dirs(root / POOL_TRIOS_SUBDIR / split)]
        numbered += [(cell, _MEGATRON_NAME) for cell in cells]
    numbered += [(root, _DISTILL_NAME) for root in layout.all_valuation_roots()]
    for directory, pattern in numbered:
        for path in _files(directory):
            match = pattern.match(_final_name(path.name))
            if match and int(match.group(1)) not in present_numbers:
                found.append(path)
    return written_by_build(sorted(set(found)))


@dataclass(frozen=True)
class SourcesNotConfigured:
    """A data root built with anchor sources (or a synth_harmony_v1 artifact), looked at from a process without
    their directory."""

    shards: list[str]  # the anchor shards' (artifact ranges') keys with a synth_harmony output on disk
    sources_dirs: list[str]  # the directories synth_harmony read them from (its manifest), to export again
    variable: str = SOURCES_DIR_ENV
    what: str = "anchor-source"

    def message(self, data_root: Path) -> str:
        where = " or ".join(self.sources_dirs) or "the directory they were built from"
        return (
            f"{self.variable} is not set in this process, but {data_root} holds {len(self.shards)} {self.what} "
            f"shards ({', '.join(self.shards[:4])}{', ...' if len(self.shards) > 4 else ''}): nothing was changed. "
            f"Export {self.variable}={where} before `dg dev`; to remove them from the build instead, "
            "run ./scripts/build.sh without it."
        )


def sources_not_configured(layout: DataLayout) -> SourcesNotConfigured | None:
    """When no sources directory is configured (`layout.sources_root` None) but either build on the data root holds
    anchor-source shards' synth_harmony outputs, or no artifact is (`layout.harmony_root` None) but it holds artifact
    ranges' outputs: what an automatic pass must not take for removed shards (an unset variable in the shell that
    started the daemon would otherwise delete a whole build). None otherwise."""
    keys = [
        key
        for build in layout.both_builds()
        for _, key in _keyed_files(build.stage_dir(HARMONY_STAGE), (STAGE_SUFFIX,))
    ]
    if layout.harmony_root is None and (ranges := sorted({key for key in keys if is_artifact_key(key)})):
        dirs = set()
        for build in layout.both_builds():
            manifest = build.harmony_manifest()
            if manifest.is_file() and (artifact := json.loads(manifest.read_text()).get("input_artifact")):
                dirs.add(str(build.resolve_recorded(artifact["path"]).parent))
        return SourcesNotConfigured(ranges, sorted(dirs), HARMONY_DIR_ENV, "synth_harmony_v1 artifact")
    if layout.sources_root is not None:
        return None
    shards = {key for key in keys if sources.partition_source(key) != sources.SYNTH_SOURCE}
    dirs: set[str] = set()
    if not shards:
        return None
    for build in layout.both_builds():
        manifest = build.harmony_manifest()
        if manifest.is_file():
            for shard in json.loads(manifest.read_text()).get("shards", []):
                source = sources.partition_source(shard["name"])
                parts = Path(shard.get("source", {}).get("path", "")).parts
                if source != sources.SYNTH_SOURCE and source in parts:
                    dirs.add(str(Path(*parts[: len(parts) - 1 - parts[::-1].index(source)])))
    return SourcesNotConfigured(sorted(shards), sorted(dirs))


def stale_cluster_files(build: DataLayout, clustered: Collection[str]) -> list[Path]:
    """The per-shard decision files in `build`'s synth_clusters directory of shards not in `clustered` (final or
    partial): a shard removed since an earlier clustering, whose decisions the new one replaces."""
    keep = set(clustered)
    return [path for path, key in _keyed_files(build.stage_dir(CLUSTERS_STAGE), (STAGE_SUFFIX,)) if key not in keep]


def unlisted_pool_files(layout: DataLayout, orphaned: Collection[Path]) -> list[Path]:
    """The sealed manifest (and its seal) and the curriculum stage files of every pool (full, smoke) that loses a
    file in `orphaned`. No automation rebuilds the pool (its quota plan is global), so they would go on listing,
    and blending, the removed shard's files: the pool is left without a manifest, visibly unpublished, until
    `build.sh` or the pool launches rebuild it. Its plans stay."""
    found: list[Path] = []
    for build in layout.both_builds():
        root = build.pool_root()
        if any(root in path.parents for path in orphaned):
            found += pool_publication_files(build)
    return found


def pool_publication_files(build: DataLayout) -> list[Path]:
    """What publishes one pool (full or smoke, as `build` says): its sealed manifest, the seal, the curriculum
    stage files (the blends a Megatron-LM run is pointed at) and the valuation features' sealed manifest and seal
    (the scorer's input, written with the pool's). Not its plans, parts, trios or feature parts."""
    manifests = [build.pool_manifest(), build.valuation_manifest()]
    sealed = [path for manifest in manifests for path in (manifest, sidecar_path(manifest)) if path.is_file()]
    return sealed + stage_files(build.curriculum_dir())


def unpublish_pool(build: DataLayout) -> list[Path]:
    """Take one pool's publication back: before a pool shard's part is rewritten, so that no manifest or blend
    describes a pool whose rows changed (or mixes two quota plans' rows) until synth_curriculum and
    synth_pool_manifest run over every shard again.

    Args:
        build: the full or smoke build (as `build.smoke` says).

    Returns:
        The files removed (`pool_publication_files`).

    Raises:
        OutputPathError: one of them is not the build's (core/ownership.py `remove_replaced_output`).
    """
    return remove_replaced_output(pool_publication_files(build))


def unpublish_pool_of_other_clusters(build: DataLayout, clusters_sha256: str) -> list[Path]:
    """Unpublish the pool (`unpublish_pool`) when its sealed manifest was made after other near-duplicate clusters
    than `clusters_sha256` (the ones new validation sets are being held out of): a build stopped between its plan
    pass and its pool pass must not leave the old pool and its curriculum blends published beside validation sets
    that may hold rows the old pool trains on. One plan's pool, curriculum and validation sets, or no pool.

    Args:
        build: the full or smoke build (as `build.smoke` says).
        clusters_sha256: the sha256 of the clusters.json the new validation sets come from.

    Returns:
        The files removed (none when the pool is unpublished already, or made after these clusters).
    """
    try:
        manifest = json.loads(build.pool_manifest().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []  # none published (or not a manifest: it does not verify, nothing to take back)
    planned = (manifest.get("sampling", {}).get("near_dup") or {}).get("clusters_sha256")
    return [] if planned == clusters_sha256 else unpublish_pool(build)


def remove_orphaned_outputs(layout: DataLayout, present: Collection[str]) -> list[Path]:
    """Delete `orphaned_outputs(layout, present)` and the pool files that would list them
    (`unlisted_pool_files`), and an anchor source's directory of key-named files (`<stage>/<source>/`) once it
    holds nothing; returns the files removed (for metadata and logs)."""
    orphaned = orphaned_outputs(layout, present)
    return _remove(sorted({*orphaned, *unlisted_pool_files(layout, orphaned)}), layout.all_errors_dirs())


def remove_stale_cluster_files(build: DataLayout, clustered: Collection[str]) -> list[Path]:
    """Delete `stale_cluster_files(build, clustered)` that the build wrote (and an anchor source's emptied
    directory); returns them."""
    return _remove(stale_cluster_files(build, clustered))


def _keyed_directory(name: str) -> bool:
    """Whether a directory of that name holds key-named files of one input: an anchor source's (`<stage>/oasst1/`)
    or an artifact file's ranges (`<stage>/synth_harmony_shard_01/`)."""
    return name in sources.SOURCE_DATASETS or ARTIFACT_FILE_STEM.fullmatch(name) is not None


def _remove(paths: list[Path], errors_dirs: Collection[Path] = ()) -> list[Path]:
    """Delete the files the build wrote (core/ownership.py), then every directory of an anchor source or an artifact
    file they leave empty: `<stage>/<source>/` and the config directories below it (`<stage>/deepcoder/derived/`),
    `<stage>/synth_harmony_shard_<NN>/`, and a step's
    directory of error logs (`errors/<step>/`, under one of `errors_dirs`): a build without those shards would
    not have made them."""
    paths = remove_written(paths)
    directories: set[Path] = set()
    for path in paths:
        below = list(path.parents)
        source = next((i for i, d in enumerate(below) if _keyed_directory(d.name)), None)
        if source is not None:
            directories.update(below[: source + 1])
        directories.update(d for d in below if d.parent in errors_dirs)
    for directory in sorted(directories, key=lambda d: len(d.parts), reverse=True):
        with contextlib.suppress(OSError):  # not empty: another shard of the source is still there
            directory.rmdir()
    return paths
