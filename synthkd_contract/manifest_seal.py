"""A dataset directory is exactly what its manifest lists, and the manifest is sealed by a sidecar.

Standard library only, so the asset checks and the training loader (`synthkd_training`) verify a
dataset with the same code:

- `manifest.json` lists every file under the dataset root in `files` (path relative to the root,
  bytes, sha256): data files, per-shard records and documents tables alike (the validation sets' manifest
  records its files in `sets`, one per set: `manifest_files`);
- `manifest.json.sha256` (the `sha256sum` format) holds the sha256 of the manifest's bytes, so an
  edit anywhere in the manifest (totals included) is detected;
- a file under the root that the manifest does not list (other than the manifest and its sidecar) is
  a problem: the dataset on disk is exactly what its manifest says;
- `manifest.json.checks/` holds one file per blocking check of the build that has not passed on this
  manifest ("pending" from before the manifest is written, then the failure, removed when it passes): a
  dataset whose checks failed, or never ran, does not verify although its seal matches;
- the seal itself says whether those checks passed: a manifest held for blocking checks is sealed `held`
  (`held <sha256>  manifest.json`, which `sha256sum -c` refuses) until the last of them passes, and again as
  soon as one fails, so a dataset copied without its `manifest.json.checks/` directory still does not verify.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from synthkd_contract.constants import MANIFEST_FILENAME, PARTIAL_SUFFIX

SIDECAR_SUFFIX = ".sha256"
# a listed file this small is hashed by every verification, even one by size only (`hash_files=False`): indexes,
# shard records and documents tables cost little to hash and are read whole by the consumers
SMALL_FILE_BYTES = 16 << 20
CHECKS_SUFFIX = ".checks"  # the directory of blocking checks not passed on the manifest
HELD = "held"  # a seal's first word while blocking checks have not passed on the manifest it seals


class ManifestError(ValueError):
    """A dataset that does not match its manifest, or a manifest that does not match its seal."""


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    """The sha256 of a file's bytes, read in chunks (bounded memory on any file size)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def file_stat(path: Path) -> str:
    """What tells a file's bytes apart without reading them: its inode, size, mtime and ctime (nanoseconds).

    Writing a file changes its mtime and ctime, user space cannot set a ctime back, and replacing a file changes
    its inode. So a file whose stat is the one it had when it was hashed still holds the bytes that were hashed:
    the rule of git's index and of Bazel's digest cache (docs/contract.md "Checks").

    Args:
        path: the file.

    Returns:
        `<inode>:<bytes>:<mtime_ns>:<ctime_ns>`.

    Raises:
        OSError: the file cannot be stat'ed (missing, say).
    """
    stat = path.stat()
    return f"{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ctime_ns}"


class HashedFile(NamedTuple):
    """A file's sha256 and its `file_stat` when it was hashed: the hash holds while the stat does."""

    sha256: str
    stat: str


def unchanged_since_hashed(path: Path, sha256: str, hashed: Mapping[Path, HashedFile]) -> bool:
    """Whether `path` holds bytes of the sha256 `sha256` without reading it: `hashed` records that sha256 for it,
    with the stat it still has.

    Args:
        path: the file.
        sha256: the sha256 it should have (a manifest's record of it, say).
        hashed: what was hashed before, by path.

    Returns:
        True when the file is there with the recorded stat and sha256; False otherwise (then it must be read).
    """
    record = hashed.get(path)
    if record is None or record.sha256 != sha256:
        return False
    try:
        return file_stat(path) == record.stat
    except OSError:
        return False


def sidecar_path(manifest_path: Path) -> Path:
    return manifest_path.with_name(manifest_path.name + SIDECAR_SUFFIX)


def checks_path(manifest_path: Path) -> Path:
    return manifest_path.with_name(manifest_path.name + CHECKS_SUFFIX)


def read_seal(manifest_path: Path) -> tuple[str | None, bool]:
    """What the manifest's sidecar seals.

    Args:
        manifest_path: the manifest (`<root>/manifest.json`).

    Returns:
        (the digest it seals, whether the seal is `held` for blocking checks); (None, False) without a sidecar.
    """
    try:
        words = sidecar_path(manifest_path).read_text(encoding="utf-8").split()
    except FileNotFoundError:
        return None, False
    if words[:1] == [HELD]:
        return (words[1] if len(words) > 1 else None), True
    return (words[0] if words else None), False


def unpassed_checks(manifest_path: Path) -> list[str]:
    """A problem per blocking check that has not passed on the manifest (pending or failed), naming it and why;
    and one when the seal is `held` although no marker says why (the markers' directory was left behind).

    Args:
        manifest_path: the manifest (`<root>/manifest.json`).

    Returns:
        The problems, none when every blocking check held for it has passed.
    """
    try:
        markers = sorted(checks_path(manifest_path).iterdir())
    except (FileNotFoundError, NotADirectoryError):
        markers = []
    problems = []
    for marker in markers:
        if marker.name.endswith(PARTIAL_SUFFIX):  # a marker being written, before its manifest is
            continue
        try:
            why = marker.read_text(encoding="utf-8").strip()
        except FileNotFoundError:  # its check passed meanwhile
            continue
        problems.append(f"{manifest_path}: blocking check {marker.name} has not passed ({why})")
    if not problems and read_seal(manifest_path)[1]:
        problems.append(
            f"{manifest_path} is sealed {HELD}: a blocking check of the build has not passed on it (failed, or never "
            f"ran), and its {checks_path(manifest_path).name}/ directory, which names it, is missing; build again"
        )
    return problems


def seal_text(manifest_path: Path, digest: str, held: bool = False) -> str:
    """The sidecar's content for a manifest whose bytes hash to `digest` (`sha256sum` output), or with `held` the
    seal of a manifest whose blocking checks have not all passed (`held <digest>  <name>`)."""
    return f"{HELD} {digest}  {manifest_path.name}\n" if held else f"{digest}  {manifest_path.name}\n"


def file_record(root: Path, path: Path) -> dict[str, Any]:
    """{path (relative to root), bytes, sha256} of a file as it is now: a manifest's record of it."""
    return file_records(root, [path])[0]


def file_records(root: Path, paths: list[Path]) -> list[dict[str, Any]]:
    """`file_record` of each path, in order, the files hashed on a thread a core (`sha256_files`)."""
    digests = sha256_files(paths)
    return [
        {"path": str(path.relative_to(root)), "bytes": path.stat().st_size, "sha256": digest}
        for path, digest in zip(paths, digests)
    ]


def write_sealed(manifest_path: Path, manifest: dict[str, Any]) -> str:
    """Write a manifest (sorted keys) and its sidecar, for what synthkd_training writes itself (a scorer, a
    synthetic dataset); return its sha256. Not atomic: callers write into a directory nothing reads yet. The
    build's datasets use synthkd_assets' atomic writer, which also holds them for their checks."""
    payload = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    digest = hashlib.sha256(payload).hexdigest()
    manifest_path.write_bytes(payload)
    sidecar_path(manifest_path).write_text(seal_text(manifest_path, digest), encoding="utf-8")
    return digest


def read_sealed_manifest(manifest_path: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """(manifest, problems with its seal): the manifest's bytes are hashed as read, then parsed."""
    if not manifest_path.is_file():
        return None, [f"{manifest_path} is missing"]
    payload = manifest_path.read_bytes()
    digest = hashlib.sha256(payload).hexdigest()
    problems = []
    sidecar = sidecar_path(manifest_path)
    if not sidecar.is_file():
        problems.append(f"{sidecar} is missing: {manifest_path} is not sealed")
    else:
        recorded = read_seal(manifest_path)[0]
        if recorded != digest:
            problems.append(
                f"{manifest_path} does not match its seal {sidecar.name} (sha256 {digest[:12]}, sealed "
                f"{(recorded or 'nothing')[:12]}): the manifest was edited or not completely written"
            )
    try:
        return json.loads(payload), problems
    except json.JSONDecodeError as error:
        return None, problems + [f"{manifest_path} is not valid JSON: {error}"]


def manifest_files(manifest: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The manifest's file records ({path, bytes, sha256}): its `files`, or for the validation sets'
    (synth_validation_v1) the file of each of its `sets`; None when it has neither."""
    if "files" in manifest:
        return manifest["files"]
    if isinstance(manifest.get("sets"), dict):
        return [{key: record[key] for key in ("path", "bytes", "sha256")} for record in manifest["sets"].values()]
    return None


def listed_file_problems(
    root: Path,
    manifest: dict[str, Any],
    only: Iterable[str] | None = None,
    hash_files: bool = True,
    hashed: Mapping[Path, HashedFile] | None = None,
) -> list[str]:
    """Each listed file (or the `only` paths, which must be listed) exists with the recorded bytes and the
    recorded sha256: every file with `hash_files`, else only those of at most `SMALL_FILE_BYTES`. A file of
    `hashed` whose stat is still the one recorded there keeps the sha256 recorded with it (`sha256_files`)."""
    listed = {record["path"]: record for record in manifest_files(manifest) or []}
    wanted = sorted(listed) if only is None else list(only)
    problems, to_hash = [], []
    for name in wanted:
        record = listed.get(name)
        path = root / name
        if record is None:
            problems.append(f"{path} is not listed in {root / MANIFEST_FILENAME}")
        elif not path.is_file():
            problems.append(f"{path} is listed in the manifest but missing")
        elif path.stat().st_size != record["bytes"]:
            problems.append(f"{path} has {path.stat().st_size} bytes, the manifest records {record['bytes']}")
        elif hash_files or record["bytes"] <= SMALL_FILE_BYTES:
            to_hash.append((path, record["sha256"]))
    for (path, recorded), digest in zip(to_hash, sha256_files([path for path, _ in to_hash], hashed)):
        if digest != recorded:
            problems.append(f"{path} differs from the manifest (sha256 {digest[:12]}, recorded {recorded[:12]})")
    return problems


def sha256_files(paths: list[Path], hashed: Mapping[Path, HashedFile] | None = None) -> list[str]:
    """The sha256 of each path, in order.

    A file `hashed` lists with its current stat (`file_stat`) keeps the sha256 recorded there: the step that wrote
    it hashed those bytes. Every other file is read, on as many threads as there are cores (hashlib and file
    reads release the GIL): a manifest check of a large dataset is bound by hashing every byte once.

    Args:
        paths: the files.
        hashed: what was hashed before, by path (as `paths` name them).

    Returns:
        Their sha256, in order.

    Raises:
        OSError: a file cannot be read.
    """
    known = hashed or {}
    digests = [""] * len(paths)
    unread = []
    for index, path in enumerate(paths):
        record = known.get(path)
        if record is not None and file_stat(path) == record.stat:
            digests[index] = record.sha256
        else:
            unread.append(index)
    if len(unread) < 2:
        found = [sha256_file(paths[index]) for index in unread]
    else:
        with ThreadPoolExecutor(max_workers=min(len(unread), os.cpu_count() or 1)) as pool:
            found = list(pool.map(sha256_file, [paths[index] for index in unread]))
    for index, digest in zip(unread, found):
        digests[index] = digest
    return digests


def unlisted_files(root: Path, manifest: dict[str, Any]) -> list[str]:
    """Everything under `root` that is not a listed file (nor the manifest, its sidecar or its checks'
    markers): stray files, leftovers of removed shards, partial files, symlinks."""
    listed = {record["path"] for record in manifest_files(manifest) or []}
    own = {MANIFEST_FILENAME, MANIFEST_FILENAME + SIDECAR_SUFFIX}
    markers = Path(MANIFEST_FILENAME + CHECKS_SUFFIX)
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            continue
        name = str(path.relative_to(root))
        if name not in listed and name not in own and Path(name).parent != markers:
            found.append(name)
    return found


def dataset_problems(root: Path, hash_files: bool = True, hashed: Mapping[Path, HashedFile] | None = None) -> list[str]:
    """Everything that makes the dataset at `root` differ from its sealed manifest (`hashed`: as for
    `listed_file_problems`)."""
    manifest, problems = read_sealed_manifest(root / MANIFEST_FILENAME)
    if manifest is None:
        return problems
    if manifest_files(manifest) is None:
        return problems + [f"{root / MANIFEST_FILENAME} has no `files` list"]
    problems += listed_file_problems(root, manifest, hash_files=hash_files, hashed=hashed)
    problems += [f"{root / name} is not listed in the manifest" for name in unlisted_files(root, manifest)]
    return problems


def require_dataset(root: Path | str, names: Iterable[str], what: str) -> None:
    """ManifestError unless `root` is a dataset root whose manifest names one of `names` (`what`: the dataset's
    name, as said to the user): said plainly for a path that does not exist, a directory inside a dataset given
    instead of its root, and a finished dataset of another kind (synth_kd_v1, synth_distill, the pool), which
    would otherwise fail later on files it does not have. Only the manifest's `dataset` is read here:
    `verify_manifest` checks the rest."""
    root = Path(root)
    manifest_path = root / MANIFEST_FILENAME
    if not root.is_dir():
        raise ManifestError(f"{root} does not exist or is not a directory: pass the {what} dataset's root")
    if not manifest_path.is_file():
        if (root.parent / MANIFEST_FILENAME).is_file():
            raise ManifestError(f"{root} is a directory inside a dataset: pass the dataset's root, {root.parent}")
        raise ManifestError(
            f"no {MANIFEST_FILENAME} in {root}: not a finished {what} build (a build stopped before its manifest "
            "pass leaves its files without one); run the build again"
        )
    try:
        name = json.loads(manifest_path.read_bytes()).get("dataset")
    except (json.JSONDecodeError, AttributeError):
        return  # verify_manifest says what is wrong with it
    if name not in set(names):
        raise ManifestError(f"{root} holds the dataset {name!r}, not {what}")


def heldout_mismatch(dataset_root: Path | str, validation_root: Path | str) -> str | None:
    """Why the validation sets at `validation_root` are not the ones held out of the dataset at `dataset_root`
    (synth_kd_v1, synth_distill or the pool), or None. Both record the near-duplicate clusters they were made
    from (`clusters_sha256`; the dataset's under `sampling.near_dup`): a build stopped between its plan pass
    (which rewrites the validation sets) and its manifest pass leaves new sets beside the last build's datasets,
    each verifying alone, and the new sets may hold rows those datasets trained on."""
    dataset_manifest = read_sealed_manifest(Path(dataset_root) / MANIFEST_FILENAME)[0] or {}
    validation_manifest = read_sealed_manifest(Path(validation_root) / MANIFEST_FILENAME)[0] or {}
    trained = dataset_manifest.get("sampling", {}).get("near_dup", {}).get("clusters_sha256")
    held_out = validation_manifest.get("clusters_sha256")
    if trained is None or held_out is None:
        return None  # not recorded (no near-duplicate control, a synthetic dataset): nothing to compare
    if trained != held_out:
        return (
            f"{validation_root} was held out of other clusters ({held_out[:12]}) than {dataset_root} was built "
            f"from ({trained[:12]}): not its held-out set (a build stopped after its plan pass?); build again"
        )
    return None


def dataset_root_of(path: Path | str, levels: int = 4) -> Path | None:
    """The dataset root a file or prefix inside a dataset belongs to: the nearest of its `levels` parent
    directories holding a `manifest.json` (a synth_kd_v1 trio's is two up, a pool cell trio's four up), or None.

    Args:
        path: a file or IndexedDataset prefix inside a dataset.
        levels: how many parent directories to look in.

    Returns:
        The directory, or None when none of them holds a manifest.
    """
    for parent in list(Path(path).absolute().parents)[:levels]:
        if (parent / MANIFEST_FILENAME).is_file():
            return parent
    return None


def verify_manifest(root: Path | str, files: Iterable[str] | None = None, hash_files: bool = True) -> dict[str, Any]:
    """The dataset's manifest, after checking its seal, that every blocking check of the build passed on it, and
    the listed files (all of them, or only `files`, paths relative to `root`): sizes always, sha256 with
    `hash_files` (without it, of the files of at most `SMALL_FILE_BYTES` only). ManifestError naming every problem
    otherwise. Unlisted files are only looked for when checking the whole dataset."""
    root = Path(root)
    if files is None:
        problems = dataset_problems(root, hash_files)
        manifest = read_sealed_manifest(root / MANIFEST_FILENAME)[0]
    else:
        manifest, problems = read_sealed_manifest(root / MANIFEST_FILENAME)
        if manifest is not None:
            problems += listed_file_problems(root, manifest, files, hash_files)
    problems += unpassed_checks(root / MANIFEST_FILENAME)
    if problems:
        raise ManifestError("; ".join(problems))
    return manifest
