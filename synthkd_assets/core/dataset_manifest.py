"""Writing a dataset manifest and its seal (what `synthkd_contract.manifest_seal` verifies).

`manifest.json` lists every file under the dataset root in `files` (path relative to the root, bytes,
sha256); `manifest.json.sha256` seals the manifest's bytes, `held` while a blocking check held for it has not
passed on it (docs/contract.md, "A sealed manifest is also a checked one").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from synthkd_assets.core.atomic import atomic_write_text
from synthkd_assets.core.manifest import manifest_text
from synthkd_assets.core.ownership import remove_replaced_output
from synthkd_contract.manifest_seal import ManifestError, checks_path, read_seal, seal_text, sidecar_path

PENDING = "pending"  # a marker's first word, then the sha256 of the manifest it holds
PENDING_WHY = "the manifest was rewritten and this check has not passed on it since"


def files_section(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The manifest's `files`: one {path, bytes, sha256} per file, sorted by path (a path listed twice
    must have one record)."""
    by_path: dict[str, dict[str, Any]] = {}
    for record in records:
        entry = {"path": record["path"], "bytes": record["bytes"], "sha256": record["sha256"]}
        if by_path.setdefault(entry["path"], entry) != entry:
            raise ManifestError(f"{entry['path']} is recorded twice with different bytes or sha256")
    return [by_path[path] for path in sorted(by_path)]


def write_sealed_manifest(path: Path, manifest: dict[str, Any], held_for: Iterable[str] = ()) -> str:
    """Write the manifest, then its sidecar; return the manifest's sha256. A crash in between leaves a
    sidecar that does not match, which the checks report until the manifest is rewritten. `held_for`: the
    blocking checks that must pass on it before the dataset verifies, each held by a marker written first
    (no moment in which the new manifest verifies unchecked), and the seal written `held` until the last of
    them passes (`record_check_verdict`): the seal itself, not only the markers beside it, says the dataset
    is unchecked."""
    held_for = sorted(set(held_for))
    text, digest = manifest_text(manifest)
    hold_for_checks(path, held_for, digest)
    atomic_write_text(path, text)
    atomic_write_text(sidecar_path(path), seal_text(path, digest, held=bool(held_for)))
    return digest


def sealed_digest(manifest_path: Path) -> str | None:
    """The digest the manifest's sidecar seals, held or not (None without one): which manifest a check is about
    to read."""
    return read_seal(manifest_path)[0]


def hold_for_checks(manifest_path: Path, check_names: Iterable[str], digest: str) -> None:
    """A `pending` marker per blocking check that must pass on the manifest of sha256 `digest` (any older marker
    dropped), so the dataset does not verify until each has passed (`record_check_verdict`)."""
    directory = checks_path(manifest_path)
    names = set(check_names)
    if directory.is_dir():
        remove_replaced_output(marker for marker in directory.iterdir() if marker.name not in names)
    for name in sorted(names):
        atomic_write_text(directory / name, f"{PENDING} {digest}: {PENDING_WHY}\n")
    if not names:
        with contextlib.suppress(OSError):  # none held: no directory left behind (absent, or a marker being written)
            directory.rmdir()


def _marker_digest(marker: Path) -> str | None:
    try:
        words = marker.read_text(encoding="utf-8").split(maxsplit=2)
    except FileNotFoundError:
        return None
    return words[1].rstrip(":") if len(words) > 1 else None


def record_check_verdict(manifest_path: Path, check_name: str, checked_digest: str | None, failure: str | None) -> bool:
    """A blocking check's verdict on the manifest it read (sealed as `checked_digest` when it started): its marker
    removed when it passed (`failure` None), else replaced by the failure; the markers' directory goes with the
    last marker. A verdict on a superseded manifest (rewritten since, or held for a newer one) is dropped: False.

    No lock: the manifest's asset writes its markers before its manifest, so a newer manifest's marker can only
    be overwritten by an older check in the instant between that check's two reads and its write.

    The seal follows: a failure seals the manifest `held` (a dataset that failed never verifies, even copied
    without its markers), and the pass that removes the last marker seals it plainly."""
    marker = checks_path(manifest_path) / check_name
    held_for = _marker_digest(marker)
    if sealed_digest(manifest_path) != checked_digest or held_for not in (None, checked_digest):
        return False
    if failure is not None:
        atomic_write_text(marker, f"failed {checked_digest}: {failure}\n")
        atomic_write_text(sidecar_path(manifest_path), seal_text(manifest_path, checked_digest, held=True))
        return True
    remove_replaced_output([marker])
    try:
        marker.parent.rmdir()
    except OSError:  # other checks' markers are still there, or it is gone already
        return True
    # the last marker gone: every held check has passed on this manifest, unless it was rewritten meanwhile
    if sealed_digest(manifest_path) == checked_digest:
        atomic_write_text(sidecar_path(manifest_path), seal_text(manifest_path, checked_digest))
    return True
