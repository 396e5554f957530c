"""Reading the sequence pool (`data/pool/synth_pool_v1/`) as a consumer: always against its sealed manifest.

- `verify_pool`: the pool's seal, its blocking checks, the files a consumer reads (sizes, sha256 of the small ones
  always, of every one with `hash_files`), and that the validation sets beside it were held out of the same
  near-duplicate clusters it was built from (docs/contract.md, "What each consumer verifies");
- `stage_blends`: a curriculum stage's `<stage>.json` (the `--per-split-data-args-path` of a Megatron-LM run) as
  `SpanGPTDatasetConfig.blend_per_split`, after `verify_pool` on the stage file and every trio it names;
- `pool_parts`: the pool's Parquet parts, each verified (the rows, their `id`s).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from synthkd_contract import constants
from synthkd_contract.buckets import POOL_DATASET_NAME, POOL_SMOKE_DATASET_NAME
from synthkd_contract.manifest_seal import (
    ManifestError,
    dataset_root_of,
    heldout_mismatch,
    manifest_files,
    require_dataset,
    verify_manifest,
)
from synthkd_contract.trio import sibling_prefix

POOL_DATASETS = (POOL_DATASET_NAME, POOL_SMOKE_DATASET_NAME)
PARTS_PREFIX = "parts/"  # the pool's Parquet rows, relative to its root
STAGE_SPLITS = ("train", "valid", "test")  # the keys of a stage file, in megatron-core's Split order


class PoolError(ManifestError):
    """A pool that does not match its sealed manifest, or that is not the one its validation sets were held out of."""


def verify_pool(root: Path | str, files: list[str] | None = None, hash_files: bool = True) -> dict[str, Any]:
    """The pool's manifest, after `verify_manifest(root, files, hash_files)` and the held-out check: the pool's
    manifest names the validation sets of its build (`validation_sets.validation_root`), and those must record the
    clusters the pool was sampled after (`heldout_mismatch`): a build stopped between its plan pass and its pool
    pass leaves new validation sets beside the old pool, which may hold rows the pool trains on.

    Args:
        root: the pool's root (`data/pool/synth_pool_v1`).
        files: the files to check (paths relative to the root), None for every file (and no unlisted one).
        hash_files: hash every checked file; False hashes only the small ones (`SMALL_FILE_BYTES`).

    Returns:
        The pool's manifest.

    Raises:
        PoolError: naming every problem.
    """
    root = Path(root)
    try:
        require_dataset(root, POOL_DATASETS, POOL_DATASET_NAME)
        manifest = verify_manifest(root, files, hash_files)
    except ManifestError as error:
        raise PoolError(f"the pool {root} does not verify: {error}") from None
    validation_sets = manifest.get("validation_sets")
    if validation_sets is None:
        raise PoolError(f"{root / constants.MANIFEST_FILENAME} names no validation sets: build it again")
    if mismatch := heldout_mismatch(root, root / validation_sets["validation_root"]):
        raise PoolError(f"the pool {root} and its validation sets come from different plans: {mismatch}")
    return manifest


def stage_blends(stage_file: Path | str, hash_files: bool = True) -> list[tuple[list[str], list[float]] | None]:
    """A curriculum stage file (`<pool>/curriculum/<stage>.json`) as `SpanGPTDatasetConfig.blend_per_split`:
    [(prefixes, weights) or None] for train, valid, test, after `verify_pool` on the stage file and the six files
    of every trio it names. The loader checks each trio against the pool again as it opens it.

    Args:
        stage_file: the stage's `.json`, inside a built pool.
        hash_files: hash every trio file (False: the small ones only, the `.bin` files by size).

    Returns:
        The three splits' blends.

    Raises:
        PoolError: the stage file is not inside a pool, or the pool does not verify.
    """
    stage_file = Path(stage_file).absolute()
    root = dataset_root_of(stage_file)
    if root is None:
        raise PoolError(f"{stage_file}: not inside a built pool (no {constants.MANIFEST_FILENAME} above it)")
    stage = stage_file.relative_to(root).as_posix()
    verify_pool(root, [stage])  # the stage file itself first: what it names is read from it
    blends = json.loads(stage_file.read_text(encoding="utf-8"))
    per_split: list[tuple[list[str], list[float]] | None] = []
    for split in STAGE_SPLITS:
        blend = blends.get(split)
        per_split.append(None if blend is None else ([str(p) for p in blend[1::2]], [float(w) for w in blend[0::2]]))
    names = []
    for blend in per_split:
        for prefix in blend[0] if blend else []:
            if not Path(prefix).is_relative_to(root):
                raise PoolError(
                    f"{stage_file} names {prefix}, outside the pool {root} it is sealed in (a pool moved since it was "
                    "built names its old location: build it where it is used)"
                )
            for kind in constants.ARRAY_KINDS:
                relative = Path(sibling_prefix(prefix, kind)).relative_to(root).as_posix()
                names += [f"{relative}.bin", f"{relative}.idx"]
    verify_pool(root, names, hash_files)
    return per_split


def pool_parts(root: Path | str, hash_files: bool = True) -> list[Path]:
    """The pool's Parquet parts, each verified (`verify_pool` on every part; `hash_files` as there).

    Args:
        root: the pool's root.
        hash_files: hash every part (False: the small ones only).

    Returns:
        The parts' paths, sorted.

    Raises:
        PoolError: the pool does not verify.
    """
    root = Path(root)
    try:
        require_dataset(root, POOL_DATASETS, POOL_DATASET_NAME)
    except ManifestError as error:
        raise PoolError(str(error)) from None
    manifest = verify_pool(root, [], hash_files)  # the seal and checks first: its list of parts is then trusted
    parts = sorted(r["path"] for r in manifest_files(manifest) or [] if r["path"].startswith(PARTS_PREFIX))
    verify_pool(root, parts, hash_files)
    present = sorted(p.relative_to(root).as_posix() for p in (root / PARTS_PREFIX).glob("*.parquet"))
    if unlisted := sorted(set(present) - set(parts)):
        raise PoolError(f"the pool {root} holds parts its manifest does not list: {', '.join(unlisted)}")
    return [root / part for part in parts]


def valuation_parts(root: Path | str, hash_files: bool = True) -> list[Path]:
    """The valuation features' parts (`data/pool/synth_pool_v1_valuation/`), after verifying the directory against
    its sealed manifest (written with the pool's: every part's bytes and sha256, and the pool part it was computed
    from): an edited, added or missing part is refused, never trained on.

    Args:
        root: the features' directory.
        hash_files: hash every part (False: the small ones only).

    Returns:
        The parts' paths, sorted.

    Raises:
        PoolError: no manifest, or the directory does not match it.
    """
    root = Path(root)
    if not (root / constants.MANIFEST_FILENAME).is_file():
        raise PoolError(
            f"no {constants.MANIFEST_FILENAME} in {root}: not the valuation features of a built pool "
            "(synth_pool_manifest seals them after synth_valuation_features); build again (./scripts/build.sh)"
        )
    try:
        manifest = verify_manifest(root, hash_files=hash_files)
    except ManifestError as error:
        raise PoolError(f"the valuation features {root} do not verify: {error}") from None
    if "pool_parts" not in manifest:
        raise PoolError(f"{root / constants.MANIFEST_FILENAME} is not a valuation features manifest (no `pool_parts`)")
    return [root / record["path"] for record in sorted(manifest_files(manifest) or [], key=lambda r: r["path"])]
