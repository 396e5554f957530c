"""Every consumer of the pool verifies what it reads against the pool's sealed manifest, on the built sample, with
each failure injected as a user would: a byte of a cell trio, a pool id or a valuation feature edited, a quota plan
edited by hand, validation sets of a newer plan beside the pool; and the curriculum's index cache is not in the
shared data root."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from examples import train_online_kd as online_kd_example
from examples import train_scorer as scorer_example
from synthkd_assets.core.cleanup import pool_publication_files
from synthkd_assets.defs import pool as pool_defs
from synthkd_assets.defs.passes import PLAN_STEPS, POOL_MANIFEST_STEPS, POOL_STEPS, QUOTA_STEPS
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout
from synthkd_contract.manifest_seal import verify_manifest, write_sealed
from synthkd_training.dataset import SpanDatasetError, SpanGPTDatasetConfig, build_span_datasets
from synthkd_training.pool import PoolError, stage_blends, valuation_parts, verify_pool
from tests.helpers import SAMPLE_RAW_DIR, pool_published, run


@pytest.fixture
def copied(built_sample, tmp_path):
    """A copy of the built sample's data root (the shared build stays untouched): its layout."""
    copy = tmp_path / "data"
    shutil.copytree(built_sample[2], copy)
    return SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(copy)).data_layout()


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def rewrite_parquet(path: Path, column: str, edit) -> None:
    """The file rewritten with one value of `column` changed (real Parquet, as a user's script would)."""
    table = pq.read_table(path)
    values = table.column(column).to_pylist()
    values[0] = edit(values[0])
    index = table.schema.get_field_index(column)
    pq.write_table(
        table.set_column(index, table.schema.field(index), pa.array(values, table.schema.field(index).type)), path
    )


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_curriculum_stage_loads_verified_with_verify_on(built_sample, tmp_path, gloo_world):
    """The stage file of the build, through `stage_blends`, into the loader with `verify=True`: every trio of the
    pool is checked against the pool's manifest (four directories above it), not refused for want of a
    `megatron/train/manifest.json`."""
    paths = built_sample[1].data_layout()
    blends = stage_blends(paths.curriculum_dir() / "P1.json")
    assert blends[0] is not None and all(str(p).startswith(str(paths.pool_trio_root())) for p in blends[0][0])
    config = SpanGPTDatasetConfig(
        random_seed=1, sequence_length=64, blend_per_split=blends, path_to_cache=str(tmp_path / "cache"), verify=True
    )
    train, _, _ = build_span_datasets(config, [4, None, None])
    assert len(train) >= 4 and train[0]["tokens"].shape[0] == 64


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_tampered_pool_trio_named_by_the_stage_file_is_refused(copied, tmp_path, gloo_world):
    """A byte of a cell trio's index edited in place: the loader's default check (seal, sizes, the small files'
    sha256) against the pool's manifest refuses it, whether the blend came from `stage_blends` or by hand."""
    root = copied.pool_root()
    stage = json.loads((copied.curriculum_dir() / "P1.json").read_text())
    original_root = str(stage["train"][1]).split("/megatron/")[0]
    prefixes = [str(p).replace(original_root, str(root)) for p in stage["train"][1::2]]
    flip_byte(Path(f"{prefixes[0]}.idx"))
    config = SpanGPTDatasetConfig(
        random_seed=1,
        sequence_length=64,
        blend_per_split=[(prefixes, stage["train"][0::2]), None, None],
        path_to_cache=str(tmp_path / "cache"),
    )
    with pytest.raises(SpanDatasetError, match=re.escape(f"{prefixes[0]}.idx differs from the manifest")):
        build_span_datasets(config, [4, None, None])


def test_an_edited_stage_file_or_one_of_another_pool_is_refused(copied):
    stage = copied.curriculum_dir() / "P1.json"
    with pytest.raises(PoolError, match="outside the pool"):  # the copy's stage file names the built pool's trios
        stage_blends(stage)
    blends = json.loads(stage.read_text())
    blends["train"][0] = blends["train"][0] * 2
    stage.write_text(json.dumps(blends))
    with pytest.raises(PoolError, match=re.escape(f"{stage} has")):
        stage_blends(stage)


def test_edited_pool_ids_are_refused_by_train_online_kd(copied):
    part = sorted((copied.pool_root() / "parts").glob("*.parquet"))[0]
    assert online_kd_example.pool_ids(copied.pool_root())  # the copy verifies
    rewrite_parquet(part, "id", lambda value: value[::-1])
    with pytest.raises(SystemExit, match=re.escape(f"{part} ")):
        online_kd_example.pool_ids(copied.pool_root())
    with pytest.raises(SystemExit, match="differs from the manifest|bytes, the manifest records"):
        online_kd_example.pool_ids(copied.pool_root(), hash_files=False)


def test_the_valuation_features_are_sealed_and_edited_ones_refused_by_the_scorer(copied):
    root = copied.valuation_root()
    manifest = verify_manifest(root)
    parts = valuation_parts(root)
    assert [p.name for p in parts] == sorted(p.name for p in root.glob("*.parquet")) and parts
    pool_files = {f["path"]: f["sha256"] for f in verify_manifest(copied.pool_root())["files"]}
    assert all(pool_files[entry["path"]] == entry["sha256"] for entry in manifest["pool_parts"].values())
    rewrite_parquet(parts[0], "prompt_tokens", lambda value: value + 1000)
    with pytest.raises(SystemExit, match=re.escape(f"the valuation features {root} do not verify")):
        scorer_example.read_features(root)
    parts[0].unlink()  # a part gone: refused too, never a scorer trained on fewer rows
    with pytest.raises(SystemExit, match=re.escape(f"{parts[0]} is listed in the manifest but missing")):
        scorer_example.read_features(root)


def test_validation_sets_of_a_newer_plan_beside_the_pool_are_refused(copied):
    """A build stopped between its plan pass (new clusters, new validation sets) and its pool pass leaves the old
    pool and curriculum published beside the new sets: neither the stage loader nor the pool's ids take it."""
    validation = copied.validation_manifest()
    recorded = verify_pool(copied.pool_root())["validation_sets"]
    assert recorded["validation_root"] == "../../validation/synth_validation_v1"
    manifest = json.loads(validation.read_text())
    write_sealed(validation, {**manifest, "clusters_sha256": "0" * 64})  # as the plan pass writes new sets
    verify_manifest(validation.parent)  # they verify alone
    with pytest.raises(PoolError, match="come from different plans: .* was held out of other clusters"):
        verify_pool(copied.pool_root())
    with pytest.raises(SystemExit, match="come from different plans"):
        online_kd_example.pool_ids(copied.pool_root())


def test_the_pool_manifest_refuses_validation_sets_of_another_plan(built_sample, own_instance, copied):
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(copied.data_root))
    manifest = json.loads(copied.validation_manifest().read_text())
    write_sealed(copied.validation_manifest(), {**manifest, "clusters_sha256": "0" * 64})
    failed = run(own_instance, layout, POOL_MANIFEST_STEPS, raise_on_error=False)
    assert not failed.success
    [failure] = [e for e in failed.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "were held out of clusters 000000000000, the pool's plan counted after" in str(
        failure.step_failure_data.error
    )


def refusals_of_the_quota_plan(instance, layout: SynthKDLayout, plan_path: Path) -> list[str]:
    """The failure message of each step of the pool-manifest pass, run one at a time."""
    messages = []
    for step in POOL_MANIFEST_STEPS:
        failed = run(instance, layout, [step], raise_on_error=False)
        assert not failed.success
        [failure] = [e for e in failed.all_events if e.event_type_value == "STEP_FAILURE"]
        messages.append(str(failure.step_failure_data.error))
    assert all(f"the quota plan {plan_path} is not the one the configured targets give" in m for m in messages)
    return messages


def test_a_recorded_quota_plan_is_verified_without_reading_the_shards(built_sample, own_instance, copied, monkeypatch):
    """synth_quota_plan records what its plan was made from: while the plan's bytes and the shards' synth_tokenized
    files are those, the curriculum and the pool manifest take it as current without computing it again."""
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(copied.data_root))
    before = copied.quota_plan().read_bytes()
    run(own_instance, layout, QUOTA_STEPS)
    assert copied.quota_plan().read_bytes() == before  # the same plan, now recorded in this instance

    def not_again(*args):
        raise AssertionError("the quota plan was computed again")

    monkeypatch.setattr(pool_defs, "quota_plan_of", not_again)
    assert run(own_instance, layout, POOL_MANIFEST_STEPS).success


def test_a_shard_rebuilt_after_the_recorded_quota_plan_is_refused(built_sample, own_instance, copied):
    """A shard's synth_tokenized file replaced after synth_quota_plan recorded its inputs (one row fewer): the
    plan is computed again, differs, and the pass refuses."""
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(copied.data_root))
    run(own_instance, layout, QUOTA_STEPS)
    tokenized = copied.stage_output("synth_tokenized", "synth_002")
    table = pq.read_table(tokenized)
    pq.write_table(table.slice(1), tokenized)
    refusals_of_the_quota_plan(own_instance, layout, copied.quota_plan())


@pytest.mark.parametrize("recorded", [False, True], ids=["never-recorded", "recorded-then-edited"])
def test_a_hand_edited_quota_plan_is_not_built_into_a_verifying_pool(built_sample, own_instance, copied, recorded):
    """The plan's targets left as configured, its rates edited, and every shard's pool rebuilt under it (as the
    attack did): the curriculum and the pool manifest refuse, naming the rates; nothing is published. Whether or
    not this instance recorded the plan synth_quota_plan wrote before the edit."""
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(copied.data_root))
    if recorded:
        run(own_instance, layout, QUOTA_STEPS)
    plan = json.loads(copied.quota_plan().read_text())
    plan["rates"]["B1"] = {ctx: rate / 2 for ctx, rate in plan["rates"]["B1"].items()}
    copied.quota_plan().write_text(json.dumps(plan, indent=2))
    for shard in [f"synth_{i:03d}" for i in range(1, 7)]:  # every shard of the sample
        run(own_instance, layout, POOL_STEPS, shard)
    # neither the curriculum's blends nor the manifest are written from it
    for message in refusals_of_the_quota_plan(own_instance, layout, copied.quota_plan()):
        assert "(its rates differ)" in message


def test_the_curriculum_caches_megatron_indices_outside_the_data_root(built_sample):
    paths = built_sample[1].data_layout()
    lines = (paths.curriculum_dir() / "P1.args").read_text().splitlines()
    args = shlex.split(" ".join(line for line in lines if not line.startswith("#")))  # $(grep -v '^#' P1.args)
    cache = Path(args[args.index("--data-cache-path") + 1])
    assert cache.is_absolute() and cache.name == paths.pool_name()
    assert not cache.is_relative_to(paths.data_root.absolute()) and not cache.is_relative_to(paths.data_root.resolve())


def test_the_built_pool_verifies_for_its_consumers(built_sample):
    paths = built_sample[1].data_layout()
    manifest = verify_pool(paths.pool_root())
    assert manifest["quota"]["plan_sha256"] and manifest["validation_sets"]["clusters_sha256"]


def test_a_build_stopped_between_its_plan_pass_and_its_pool_pass_is_refused(built_sample, own_instance, copied):
    """The attack as run: the plan pass of a new build (other held-out clusters, so new validation sets), then the
    build stops before its pool pass. The plan pass unpublishes the old pool (manifest, seal, curriculum blends: a
    stock Megatron-LM run of P1.args finds nothing) and the UI shows it unpublished; a copy of the old pool kept
    elsewhere beside the new sets is refused by the pool's readers, and so is a pool manifest pass."""
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(copied.data_root))
    replan = SynthKDBuildConfig(heldout_per_exercise=SynthKDBuildConfig().heldout_per_exercise + 1)
    before = json.loads(copied.validation_manifest().read_text())["clusters_sha256"]
    published = {path: path.read_bytes() for path in pool_publication_files(copied)}
    assert copied.pool_manifest() in published and copied.curriculum_dir() / "P1.args" in published
    result = run(own_instance, layout, PLAN_STEPS, build=replan)
    assert json.loads(copied.validation_manifest().read_text())["clusters_sha256"] != before
    verify_manifest(copied.validation_root())  # the new sets verify alone
    assert pool_publication_files(copied) == []
    assert not pool_published(own_instance).passed
    [sets] = [e for e in result.get_asset_materialization_events() if e.asset_key.path == ["synth_validation_sets"]]
    assert len(sets.materialization.metadata["pool_unpublished_files"].value) == len(published)
    for path, payload in published.items():  # the old pool's publication, as copied elsewhere before
        path.write_bytes(payload)
    with pytest.raises(PoolError, match="come from different plans"):
        verify_pool(copied.pool_root())
    with pytest.raises(SystemExit, match="come from different plans"):
        online_kd_example.pool_ids(copied.pool_root())
    failed = run(own_instance, layout, ["synth_pool_manifest"], build=replan, raise_on_error=False)
    assert not failed.success


def test_the_quota_inputs_have_no_fingerprint_while_a_shard_is_missing(built_sample, copied):
    """A shard's synth_tokenized file gone: no fingerprint (a plan is then computed, and fails naming the file),
    rather than an error of the fingerprint's own before it."""
    build = SynthKDBuildConfig()
    assert pool_defs.quota_inputs_fingerprint(copied, build) is not None
    copied.stage_output("synth_tokenized", "synth_003").unlink()
    assert pool_defs.quota_inputs_fingerprint(copied, build) is None
