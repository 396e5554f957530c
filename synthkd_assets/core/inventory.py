"""The raw input inventory: which SYNTH shards exist, and a content hash for each.

The raw shards are the regular files directly in the raw directory whose names end in `.parquet`
(lower case); each name's trailing number is its shard number (`synth_07.parquet` -> shard 07). A
directory that holds none, two names with the same shard number, a name without one, or an entry that
is not a readable regular file (a directory named `x.parquet`, a dangling symlink) is refused as a
whole with an `InputFileError` naming the files. Data-looking files the rule skips (in a subdirectory,
`.PARQUET`, `synth_07.parquet.gz`, `synth_08.csv`) are listed by `ignored_raw_files` so the inventory can warn
about them.

Hashing 500 shards of ~1 GB is minutes of I/O, so hashes are cached by (size, mtime_ns): an
unchanged file is never re-read, a touched or rewritten one is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from synthkd_assets.core.atomic import atomic_write_text
from synthkd_assets.core.harmony_artifact import ArtifactRange, artifact_ranges, range_digest, read_artifact
from synthkd_assets.core.layout import HARMONY_STAGE, SOURCES_DIR_ENV, DataLayout
from synthkd_assets.core.parquet_io import InputFileError
from synthkd_assets.core.sources import ADAPTERS
from synthkd_contract import constants, harmony_artifact, sources
from synthkd_contract.manifest_seal import sha256_file

RAW_GLOB = "*.parquet"
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class InputManifestError(ValueError):
    """The user's input manifest is malformed, or disagrees with the raw files; the message says where."""


def shard_index_from_name(name: str) -> int:
    """`synth_07.parquet` (or its partition key `synth_07`) -> 7: the trailing number of the name without
    `.parquet` is the shard index of the contract. Only that suffix is removed, so a file name and its
    key always give the same number (`x_1.5.parquet` and `x_1.5` are both shard 5)."""
    if harmony_artifact.is_artifact_key(name):  # a row-group range of the synth_harmony_v1 artifact
        return harmony_artifact.artifact_shard_index(name)
    if sources.SOURCE_PARTITION_SEPARATOR in name:  # an anchor source's partition `<source>/<stem>`
        return sources.anchor_shard_index(name)
    match = re.search(r"(\d+)$", name.removesuffix(RAW_GLOB.removeprefix("*")))
    if match is None:
        raise ValueError(f"shard file {name!r} has no trailing shard number (expected e.g. synth_07.parquet)")
    return int(match.group(1))


@dataclass(frozen=True)
class RawShard:
    """One raw SYNTH Parquet file; `name` (the file stem) is its Dagster partition key."""

    name: str
    path: str
    bytes: int
    mtime_ns: int
    sha256: str


def partition_key_for(path: Path) -> str:
    return path.name.removesuffix(RAW_GLOB.removeprefix("*"))


# what Dagster refuses in a partition key (dagster/_core/definitions/partitions/utils/base.py)
_BAD_KEY_SUBSTRINGS = ("...", "\a", "\b", "\f", "\n", "\r", "\t", "\v", "\0")


def raw_shard_paths(raw_dir: Path, may_be_empty: bool = False) -> list[Path]:
    """The raw shard files of `raw_dir`, sorted; refuses (InputFileError) a directory without any (unless
    `may_be_empty`: a build from the synth_harmony_v1 artifact alone), a name without a shard number (or one in
    the anchor sources' range) or unusable as a partition key, two names with one shard number, and an entry that
    is not a regular file."""
    if not raw_dir.is_dir():
        raise InputFileError(f"no raw shards in {raw_dir}: the directory does not exist")
    paths = sorted(raw_dir.glob(RAW_GLOB))
    if not paths and not may_be_empty:
        raise InputFileError(f"no raw shards in {raw_dir}: no *.parquet file directly in it")
    by_index: dict[int, list[Path]] = {}
    for path in paths:
        if not path.is_file():
            what = "a dangling symlink" if path.is_symlink() and not path.exists() else "not a regular file"
            raise InputFileError(f"{path}: not a readable Parquet file ({what})")
        bad = [s for s in _BAD_KEY_SUBSTRINGS if s in path.stem]
        if bad:
            raise InputFileError(f"{path}: the name holds {bad}, which a partition key cannot: rename the file")
        try:
            index = shard_index_from_name(path.name)
        except ValueError as error:
            raise InputFileError(f"{path}: {error}") from None
        if index >= sources.ANCHOR_SHARD_INDEX_BASE:
            raise InputFileError(
                f"{path}: shard number {index} is not below {sources.ANCHOR_SHARD_INDEX_BASE:,}: the numbers from "
                "there on are the anchor sources' shards, whose outputs it would overwrite; rename the file"
            )
        by_index.setdefault(index, []).append(path)
    collisions = [names for names in by_index.values() if len(names) > 1]
    if collisions:
        raise InputFileError(
            "raw shards with the same shard number would overwrite each other's output: "
            + "; ".join(
                " and ".join(str(p) for p in names) + f" (shard {shard_index_from_name(names[0].name):02d})"
                for names in collisions
            )
            + ": rename or remove one of each"
        )
    return paths


# suffixes of files that look like a shard in another format (compressed, CSV, JSON Lines, Arrow)
RAW_LOOKING_SUFFIXES = (".csv", ".tsv", ".jsonl", ".json", ".arrow", ".gz", ".zst", ".bz2", ".xz", ".zip", ".tar")


def ignored_raw_files(raw_dir: Path) -> list[str]:
    """Data-looking files under `raw_dir` that are not raw shards: Parquet in a subdirectory or with a suffix in
    another case (`.PARQUET`), a name holding `.parquet` followed by more (`synth_07.parquet.gz`), or a shard in
    another format (`RAW_LOOKING_SUFFIXES`: `synth_08.csv`); the inventory warns about them. Not the input
    manifest, nor hidden files and directories (`.cache/` of a download)."""
    if not raw_dir.is_dir():
        return []
    shards = set(raw_dir.glob(RAW_GLOB))

    def looks_like_data(path: Path) -> bool:
        name = path.name.lower()
        return ".parquet" in name or path.suffix.lower() in RAW_LOOKING_SUFFIXES

    return sorted(
        str(path)
        for path in raw_dir.rglob("*")
        if looks_like_data(path)
        and path not in shards
        and path.name != constants.INPUT_MANIFEST_FILENAME
        and not any(part.startswith(".") for part in path.relative_to(raw_dir).parts)
        and not any(p in shards for p in path.parents)
    )


DATA_LOOKING_SUFFIXES = (".parquet", ".jsonl", ".json")  # a file so named in a source's directory looks like data


def ignored_input_files(layout: DataLayout) -> list[str]:
    """`ignored_raw_files` of the raw directory, and in each declared source's directory the data-looking files
    that are not its shards (a `.jsonl` where the source publishes Parquet, `.PARQUET`, `.json`): the inventory
    warns about them rather than building them or dropping them silently."""
    ignored = ignored_raw_files(layout.raw_root)
    root = layout.sources_root
    if root is None or not root.is_dir():
        return ignored
    for directory in sorted(p for p in root.iterdir() if p.is_dir() and p.name in ADAPTERS):
        suffix = ADAPTERS[directory.name].spec.file_suffix
        ignored += sorted(
            str(path)
            for path in directory.rglob("*")
            if path.suffix.lower() in DATA_LOOKING_SUFFIXES and not path.name.endswith(suffix) and path.is_file()
        )
    return ignored


def scan_raw_dir(raw_dir: Path, cache_path: Path | None = None) -> list[RawShard]:
    """Every raw shard of `raw_dir` (`raw_shard_paths`), hashed, reusing cached hashes of unchanged files."""
    return _hashed([(partition_key_for(path), path) for path in raw_shard_paths(raw_dir)], cache_path)


def scan_inputs(layout: DataLayout) -> list[RawShard]:
    """Every input shard of a build: SYNTH's raw shards, the synth_harmony_v1 artifact's row-group ranges when
    `layout.harmony_root` is set, then the anchor sources' shards of `layout.sources_root` when one is set
    (`source_shard_paths`), each hashed (one cache for all: a range's version is its row groups' digest)."""
    ranges = {r.key: r for r in layout_artifact_ranges(layout)}
    return _hashed(_input_shard_paths(layout, ranges), layout.raw_hash_cache(), ranges)


def input_shard_paths(layout: DataLayout) -> list[tuple[str, Path]]:
    """(partition key, path) of every input shard of a build, in partition order, unhashed: SYNTH's raw shards,
    the artifact's ranges (their file), then the anchor sources'. Refuses what listing them refuses
    (`raw_shard_paths`, `read_artifact`, `source_shard_paths`); an unreadable file only `scan_inputs` refuses, when
    it hashes it."""
    return _input_shard_paths(layout, {r.key: r for r in layout_artifact_ranges(layout)})


def layout_artifact_ranges(layout: DataLayout) -> list[ArtifactRange]:
    """The row-group ranges of the layout's synth_harmony_v1 artifact (its manifest verified), none without one."""
    if layout.harmony_root is None:
        return []
    return artifact_ranges(read_artifact(layout.harmony_root), layout.harmony_range_row_groups)


def _input_shard_paths(layout: DataLayout, ranges: dict[str, ArtifactRange]) -> list[tuple[str, Path]]:
    raw = raw_shard_paths(layout.raw_root, may_be_empty=layout.harmony_root is not None)
    synth = [(partition_key_for(path), path) for path in raw]
    artifact = [(key, r.path) for key, r in ranges.items()]
    anchors = source_shard_paths(layout.sources_root) if layout.sources_root is not None else []
    return synth + artifact + anchors


def source_shard_paths(sources_root: Path) -> list[tuple[str, Path]]:
    """(partition key `<source>/<stem>`, path) of every anchor shard: the files under `<sources_root>/<source>/`
    named `*.parquet` or `*.jsonl` as the source publishes, `<stem>` their path there without the suffix
    (`deepcoder/primeintellect/train-00000-of-00001`: a config's directory is kept). Refuses (InputFileError)
    a missing root, one that holds no shard at all (a build would take every anchor output for a removed shard's),
    a directory that names no declared source, an entry that is not a regular file, a stem unusable as a partition
    key and two stems of one source on one shard number."""
    if not sources_root.is_dir():
        raise InputFileError(f"no anchor sources in {sources_root}: the directory does not exist")
    found: list[tuple[str, Path]] = []
    for directory in sorted(p for p in sources_root.iterdir() if p.is_dir()):
        source = directory.name
        if source not in sources.SOURCE_DATASETS:
            raise InputFileError(
                f"{directory}: {source!r} is not a declared source (one of {sorted(sources.SOURCE_DATASETS)}; "
                "a new one is added as docs/sources.md says)"
            )
        suffix = ADAPTERS[source].spec.file_suffix
        by_index: dict[int, list[Path]] = {}
        for path in sorted(directory.rglob(f"*{suffix}")):
            if not path.is_file():
                what = "a dangling symlink" if path.is_symlink() and not path.exists() else "not a regular file"
                raise InputFileError(f"{path}: not a readable {source} shard ({what})")
            stem = path.relative_to(directory).as_posix().removesuffix(suffix)  # a config's subdirectory stays
            if bad := [s for s in _BAD_KEY_SUBSTRINGS if s in stem]:
                raise InputFileError(f"{path}: the name holds {bad}, which a partition key cannot: rename the file")
            key = sources.anchor_partition_key(source, stem)
            by_index.setdefault(shard_index_from_name(key), []).append(path)
            found.append((key, path))
        if collisions := [names for names in by_index.values() if len(names) > 1]:
            raise InputFileError(
                "anchor shards on the same shard number would overwrite each other's output: "
                + "; ".join(" and ".join(str(p) for p in names) for names in collisions)
                + ": rename one of each"
            )
    if not found:
        raise InputFileError(
            f"no anchor sources in {sources_root}: the directory holds no shard of a declared source "
            f"(<source>/<shard>.parquet or .jsonl, docs/sources.md); nothing was changed. To build without the "
            f"anchor sources (their outputs are then removed), unset {SOURCES_DIR_ENV}"
        )
    return found


def _kind(path: Path) -> str:
    return "JSONL" if path.suffix == ".jsonl" else "Parquet"


def _hashed(
    shards: list[tuple[str, Path]], cache_path: Path | None, ranges: Mapping[str, ArtifactRange] | None = None
) -> list[RawShard]:
    cache = _load_cache(cache_path)
    ranges = ranges or {}
    hashed = []
    for key, path in shards:
        artifact_range = ranges.get(key)
        cache_key = str(path.resolve()) + (f"#{key}" if artifact_range is not None else "")
        try:
            stat = path.stat()
        except OSError as error:
            what = f"{type(error).__name__}: {error}"
            raise InputFileError(f"{path}: not a readable {_kind(path)} file ({what})") from error
        cached = cache.get(cache_key)
        if cached and cached["bytes"] == stat.st_size and cached["mtime_ns"] == stat.st_mtime_ns:
            digest = cached["sha256"]
        else:
            try:
                digest = sha256_file(path) if artifact_range is None else range_digest(artifact_range)
            except OSError as error:
                raise InputFileError(
                    f"{path}: not a readable {_kind(path)} file ({type(error).__name__}: {error})"
                ) from error
        hashed.append(RawShard(key, str(path), stat.st_size, stat.st_mtime_ns, digest))
    updated = {str(Path(s.path).resolve()) + (f"#{s.name}" if s.name in ranges else ""): asdict(s) for s in hashed}
    if cache_path is not None and updated != cache:  # steps of one run may scan at the same time
        atomic_write_text(cache_path, json.dumps(updated, indent=1, sort_keys=True), shared=True)
    return hashed


def _load_cache(cache_path: Path | None) -> dict[str, dict]:
    if cache_path is None or not cache_path.is_file():
        return {}
    try:
        return json.loads(cache_path.read_text())
    except json.JSONDecodeError:
        return {}  # a damaged cache only costs a re-hash


def partition_changes(registered: list[str], shards: list[RawShard]) -> tuple[list[str], list[str]]:
    """(to add, to remove) so that the registered partitions are exactly the files present."""
    present = {s.name for s in shards}
    return sorted(present - set(registered)), sorted(set(registered) - present)


def shards_to_rebuild(
    last_seen: dict[str, str], shards: list[RawShard], built_from: dict[str, str | None]
) -> list[str]:
    """Shards whose bytes differ from what their current synth_harmony output was built from.

    `last_seen` (the sensor cursor) suppresses asking twice for the same content while a run is in
    flight; `built_from` (source hashes recorded in the step reports on disk) means a fresh cursor
    does not rebuild shards that are already up to date.
    """
    return sorted(s.name for s in shards if last_seen.get(s.name) != s.sha256 and built_from.get(s.name) != s.sha256)


def built_from_sha256(layout: DataLayout, keys: Iterable[str]) -> dict[str, str | None]:
    """The raw sha256 synth_harmony read when it last built each shard (its report), None if never built:
    what the sensor, the schedule and raw_inputs_unchanged compare the raw files with."""
    reports = {key: layout.stage_report(HARMONY_STAGE, key) for key in keys}
    return {key: json.loads(p.read_text()).get("source_sha256") if p.is_file() else None for key, p in reports.items()}


def read_input_manifest(path: Path) -> dict[str, str] | None:
    """`{file name: sha256}` listed by a user-provided input manifest, or None when `path` does not exist.

    Format: `{"shards": [{"file": "synth_00.parquet", "sha256": "<64 hex>"}, ...]}`, file names relative to the
    raw directory (docs/design.md, "Sensors, automation and the schedule").
    """
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputManifestError(f"{path}: not a JSON input manifest ({exc})") from exc
    entries = data.get("shards") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise InputManifestError(
            f'{path}: expected {{"shards": [{{"file": "<name>.parquet", "sha256": "<hex>"}}, ...]}}'
        )
    listed: dict[str, str] = {}
    for i, entry in enumerate(entries):
        file, sha = (entry.get("file"), entry.get("sha256")) if isinstance(entry, dict) else (None, None)
        if not isinstance(file, str) or Path(file).name != file or not Path(file).match(RAW_GLOB):
            raise InputManifestError(
                f"{path}: shards[{i}]: 'file' must name a *.parquet file in the raw directory, got {file!r}"
            )
        if not isinstance(sha, str) or not SHA256_HEX.fullmatch(sha):
            raise InputManifestError(
                f"{path}: shards[{i}] ({file}): 'sha256' must be 64 lowercase hex digits, got {sha!r}"
            )
        if file in listed:
            raise InputManifestError(f"{path}: shards[{i}]: {file} is listed twice")
        listed[file] = sha
    return listed


def input_manifest_disagreements(listed: dict[str, str], shards: list[RawShard]) -> list[str]:
    """Where the raw directory is not what the input manifest lists: one line per file, sorted. The manifest
    lists SYNTH's raw shards: anchor sources' shards and the artifact's ranges (its own manifest) are not compared."""
    synth = [
        s
        for s in shards
        if sources.partition_source(s.name) == sources.SYNTH_SOURCE and not harmony_artifact.is_artifact_key(s.name)
    ]
    on_disk = {Path(s.path).name: s.sha256 for s in synth}
    problems = []
    for file in sorted(set(listed) | set(on_disk)):
        if file not in on_disk:
            problems.append(f"{file}: listed (sha256 {listed[file]}) but not in the raw directory")
        elif file not in listed:
            problems.append(f"{file}: in the raw directory but not listed")
        elif listed[file] != on_disk[file]:
            problems.append(f"{file}: listed sha256 {listed[file]}, the file's is {on_disk[file]}")
    return problems


def no_input_file_message(layout: DataLayout, key: str) -> str:
    """Why a step of partition `key` has nothing to read: the key names no input file of `layout`.

    Args:
        layout: the build's layout (its input roots).
        key: the partition key.

    Returns:
        A message naming where the file would be and where partition keys come from.
    """
    roots = [f"{layout.raw_shard(key).name} in {layout.raw_root}"]
    if layout.sources_root is not None:
        roots.append(f"<source>/<file> in {layout.sources_root}")
    if layout.harmony_root is not None:
        roots.append(f"a row-group range of the artifact in {layout.harmony_root}")
    return (
        f"partition {key!r} names no input file (looked for {'; '.join(roots)}). Partitions come from the input "
        "files: synth_raw_inventory and the raw sensor add one per file and remove those of files gone, so a key "
        'added by hand (the launch dialog\'s "Add partition") is removed once its runs end. Put the file in the '
        "input directory, or launch one of the listed partitions."
    )
