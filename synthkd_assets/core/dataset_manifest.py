"""Writing a dataset manifest and its seal (what `synthkd_contract.manifest_seal` verifies).

`manifest.json` lists every file under the dataset root in `files` (path relative to the root, bytes,
sha256); `manifest.json.sha256` seals the manifest's bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from synthkd_assets.core.atomic import atomic_write_text
from synthkd_assets.core.manifest import write_manifest
from synthkd_contract.manifest_seal import ManifestError, checks_path, seal_text, sha256_file, sidecar_path

PENDING = "pending: the manifest was rewritten and this check has not passed on it since"


def file_record(root: Path, path: Path) -> dict[str, Any]:
    """{path (relative to root), bytes, sha256} of a file as it is now."""
    return {"path": str(path.relative_to(root)), "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def files_section(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The manifest's `files`: one {path, bytes, sha256} per file, sorted by path (a path listed twice
    must have one record)."""
    by_path: dict[str, dict[str, Any]] = {}
    for record in records:
        entry = {"path": record["path"], "bytes": record["bytes"], "sha256": record["sha256"]}
        if by_path.setdefault(entry["path"], entry) != entry:
            raise ManifestError(f"{entry['path']} is recorded twice with different bytes or sha256")
    return [by_path[path] for path in sorted(by_path)]


def write_sealed_manifest(path: Path, manifest: dict[str, Any]) -> str:
    """Write the manifest, then its sidecar; return the manifest's sha256. A crash in between leaves a
    sidecar that does not match, which the checks report until the manifest is rewritten."""
    digest = write_manifest(path, manifest)
    atomic_write_text(sidecar_path(path), seal_text(path, digest))
    return digest


def hold_for_checks(manifest_path: Path, check_names: Iterable[str]) -> None:
    """Before a manifest is (re)written: a `pending` marker per blocking check that must pass on it (any older
    marker dropped), so the dataset does not verify until each has passed (`record_check_verdict`)."""
    directory = checks_path(manifest_path)
    directory.mkdir(parents=True, exist_ok=True)
    names = set(check_names)
    for marker in directory.iterdir():
        if marker.name not in names:
            marker.unlink(missing_ok=True)
    for name in sorted(names):
        atomic_write_text(directory / name, PENDING + "\n")


def record_check_verdict(manifest_path: Path, check_name: str, failure: str | None) -> None:
    """A blocking check's verdict on the manifest: its marker removed when it passed (`failure` None), else
    replaced by the failure; the markers' directory goes with the last marker."""
    directory = checks_path(manifest_path)
    marker = directory / check_name
    if failure is not None:
        for _ in range(3):  # a passing check may remove the (empty) directory between the two calls
            directory.mkdir(parents=True, exist_ok=True)
            try:
                return atomic_write_text(marker, f"failed: {failure}\n")
            except FileNotFoundError:
                continue
        raise OSError(f"could not record the failure of {check_name} in {directory}")
    marker.unlink(missing_ok=True)
    try:
        directory.rmdir()
    except OSError:  # other checks' markers are still there, or another check removed it first
        pass
