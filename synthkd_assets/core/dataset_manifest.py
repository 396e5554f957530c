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
from synthkd_contract.manifest_seal import ManifestError, seal_text, sha256_file, sidecar_path


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
