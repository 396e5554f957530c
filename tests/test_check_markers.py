"""A dataset manifest is held for its blocking checks (core/dataset_manifest.py): it verifies only once each has
passed on it, a failure keeps it from verifying, and a verdict on a manifest rewritten meanwhile is dropped."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synthkd_assets.core.dataset_manifest import record_check_verdict, sealed_digest, write_sealed_manifest
from synthkd_assets.defs.checks import CheckGate
from synthkd_contract.constants import MANIFEST_FILENAME, PARTIAL_SUFFIX
from synthkd_contract.manifest_seal import ManifestError, checks_path, unpassed_checks, verify_manifest


def dataset(tmp_path: Path, version: int, held_for: list[str]) -> tuple[Path, str]:
    """A dataset root whose manifest (version `version`, no data files) is held for `held_for`; its digest."""
    manifest = tmp_path / MANIFEST_FILENAME
    digest = write_sealed_manifest(manifest, {"files": [], "version": version}, held_for)
    return manifest, digest


def refusals(manifest: Path) -> str:
    with pytest.raises(ManifestError) as refused:
        verify_manifest(manifest.parent)
    return str(refused.value)


def test_a_manifest_verifies_once_every_check_has_passed_on_it(tmp_path):
    manifest, digest = dataset(tmp_path, 1, ["schema", "rows"])
    assert sealed_digest(manifest) == digest
    message = refusals(manifest)
    assert f"blocking check rows has not passed (pending {digest}:" in message and "check schema" in message
    assert record_check_verdict(manifest, "rows", digest, None)
    assert "check rows" not in refusals(manifest) and "check schema" in refusals(manifest)
    assert record_check_verdict(manifest, "schema", digest, "FAILED, 2 problems: x; y")
    assert f"blocking check schema has not passed (failed {digest}: FAILED, 2 problems: x; y)" in refusals(manifest)
    assert record_check_verdict(manifest, "schema", digest, None)  # re-executed after a fix: passes
    assert verify_manifest(tmp_path) == {"files": [], "version": 1}
    assert not checks_path(manifest).exists()
    # a check that fails later on the same manifest (its data changed under it) holds the dataset again
    assert record_check_verdict(manifest, "rows", digest, "FAILED, 1 problem: z")
    assert "check rows has not passed (failed" in refusals(manifest)


def test_a_verdict_on_a_superseded_manifest_is_dropped(tmp_path):
    manifest, old = dataset(tmp_path, 1, ["rows"])
    assert record_check_verdict(manifest, "rows", old, None)
    # a newer manifest is held and written while a check of the old one is still reading it
    _, new = dataset(tmp_path, 2, ["rows"])
    assert not record_check_verdict(manifest, "rows", old, None)  # the old check's pass clears nothing
    assert f"(pending {new}:" in refusals(manifest)
    assert record_check_verdict(manifest, "rows", new, "FAILED, 1 problem: duplicated")
    assert not record_check_verdict(manifest, "rows", old, None)  # nor a failure of the new one
    assert f"(failed {new}: FAILED, 1 problem: duplicated)" in refusals(manifest)


def test_markers_written_before_the_new_manifest_are_not_cleared_by_the_old_manifests_checks(tmp_path):
    """The asset writes its markers, then its manifest: in between, the old manifest is still sealed, and a check
    of it that ends then must not remove the marker held for the manifest about to be written."""
    manifest, old = dataset(tmp_path, 1, [])
    newer = "f" * 64
    (checks_path(manifest)).mkdir()
    (checks_path(manifest) / "rows").write_text(f"pending {newer}: the manifest was rewritten\n")
    assert not record_check_verdict(manifest, "rows", old, None)
    assert (checks_path(manifest) / "rows").is_file()


def test_a_manifest_held_for_no_check_leaves_no_markers(tmp_path):
    manifest, _ = dataset(tmp_path, 1, ["rows"])
    dataset(tmp_path, 2, [])  # rewritten by a writer that holds it for nothing
    assert not checks_path(manifest).exists() and verify_manifest(tmp_path)["version"] == 2


def test_markers_being_written_or_gone_are_not_reported(tmp_path):
    manifest, digest = dataset(tmp_path, 1, [])
    assert unpassed_checks(manifest) == [] and verify_manifest(tmp_path)["version"] == 1
    checks_path(manifest).mkdir()
    (checks_path(manifest) / f"rows.x1y2{PARTIAL_SUFFIX}").write_text("pend")  # a marker half written
    assert unpassed_checks(manifest) == [] and verify_manifest(tmp_path)["version"] == 1


def test_a_gated_check_that_raises_holds_the_dataset(tmp_path):
    """An exception escaping a check (re-executed alone on a manifest that had passed) is recorded as its
    failure, and still raised for Dagster to report."""
    manifest, digest = dataset(tmp_path, 1, [])
    with pytest.raises(FileNotFoundError), CheckGate(manifest, "rows"):
        raise FileNotFoundError("shard_02_documents.parquet")
    assert f"check rows has not passed (failed {digest}: error: FileNotFoundError: shard_02" in refusals(manifest)
    with CheckGate(manifest, "rows") as record:
        record(dg.AssetCheckResult(check_name="rows", passed=True))
    assert verify_manifest(tmp_path)["version"] == 1


@pytest.mark.parametrize("verdict", ["never ran", "failed"])
def test_a_dataset_copied_without_its_markers_does_not_verify_unless_its_checks_passed(tmp_path, verdict):
    """The checks' outcome is in the seal: a dataset copied by its file list (the manifest, its seal and the files
    it lists, not `manifest.json.checks/`) whose blocking check failed, or never ran, still does not verify."""
    import shutil

    manifest, digest = dataset(tmp_path, 1, ["rows", "schema"])
    assert record_check_verdict(manifest, "schema", digest, None)
    if verdict == "failed":
        assert record_check_verdict(manifest, "rows", digest, "FAILED, 1 problem: a synth_id in two shards")
    shutil.rmtree(checks_path(manifest))  # the copy leaves the unlisted directory behind
    assert "is sealed held: a blocking check of the build has not passed" in refusals(manifest)
    assert (manifest.parent / f"{MANIFEST_FILENAME}.sha256").read_text().startswith(f"held {digest}  ")


def test_the_seal_is_plain_sha256sum_once_every_check_passed(tmp_path):
    import subprocess

    manifest, digest = dataset(tmp_path, 1, ["rows", "schema"])
    sidecar = manifest.parent / f"{MANIFEST_FILENAME}.sha256"
    checked = subprocess.run(["sha256sum", "-c", sidecar.name], cwd=tmp_path, capture_output=True)
    assert checked.returncode != 0  # held: not a checksum line
    for name in ("rows", "schema"):
        assert record_check_verdict(manifest, name, digest, None)
    assert sidecar.read_text() == f"{digest}  {MANIFEST_FILENAME}\n"
    assert subprocess.run(["sha256sum", "-c", sidecar.name], cwd=tmp_path, capture_output=True).returncode == 0
    assert verify_manifest(tmp_path)["version"] == 1
    # failing later (its data changed under it) holds the seal again
    assert record_check_verdict(manifest, "rows", digest, "FAILED, 1 problem: z")
    assert sidecar.read_text().startswith("held ")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    held=st.sets(st.sampled_from(["rows", "schema", "leak", "trio"]), min_size=1),
    verdicts=st.lists(st.tuples(st.sampled_from(["rows", "schema", "leak", "trio"]), st.booleans()), max_size=8),
    drop_markers=st.booleans(),
)
def test_a_dataset_verifies_exactly_when_every_held_check_last_passed(tmp_path_factory, held, verdicts, drop_markers):
    """For any checks held and any order of verdicts: the dataset verifies iff each held check's last verdict was a
    pass (the oracle: that rule, computed here from the verdicts), with its markers' directory or without it (a
    copy by file list); the seal is plain sha256sum exactly then."""
    import shutil

    root = tmp_path_factory.mktemp("dataset")
    manifest, digest = dataset(root, 1, sorted(held))
    last: dict[str, bool] = {}
    for name, passed in verdicts:
        assert record_check_verdict(manifest, name, digest, None if passed else f"FAILED: {name}")
        last[name] = passed
    all_passed = all(last.get(name) is True for name in held) and all(last.values())
    if drop_markers:
        shutil.rmtree(checks_path(manifest), ignore_errors=True)
    sidecar = (root / f"{MANIFEST_FILENAME}.sha256").read_text()
    assert (sidecar == f"{digest}  {MANIFEST_FILENAME}\n") == all_passed
    if all_passed:
        assert verify_manifest(root)["version"] == 1
    else:
        with pytest.raises(ManifestError):
            verify_manifest(root)
