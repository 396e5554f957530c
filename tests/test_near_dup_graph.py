"""Near-duplicate control in the built graph (the bundled sample): what synth_clusters decided reaches every
dataset, the sampling plan counts rows after it, the validation sets are cluster-disjoint from training, and
the UI gets the metadata and the WARN checks."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import dagster as dg
import polars as pl
import pyarrow.parquet as pq

from synthkd_assets.core import manifest as mf
from synthkd_assets.core.manifest_builders import counts_after_clusters
from synthkd_assets.core.near_dup import removed_by_clusters
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout
from synthkd_assets.defs.upstream import shard_names, stage_files
from synthkd_contract import drops
from synthkd_contract.manifest_seal import sha256_file
from synthkd_contract.schemas import CLUSTERS_SCHEMA, VALIDATION_SCHEMA
from tests.helpers import SAMPLE_RAW_DIR, rows_after_clusters, run


def clusters_table(paths) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(stage_files(paths, "synth_clusters", n)[0]) for n in shard_names(paths)])


def trained_ids(paths) -> set[str]:
    """Every synth_id any dataset writes: synth_kd_v1's documents tables (both splits), the DistillKit parts,
    the pool's parts."""
    root = paths.megatron_root()
    ids = set()
    for table in (root / "shards").glob("*_documents.parquet"):
        ids |= set(pq.read_table(table, columns=["synth_id"]).column("synth_id").to_pylist())
    for part in paths.pool_root().glob("parts/*.parquet"):
        ids |= set(pq.read_table(part, columns=["source_example_id"]).column(0).to_pylist())
    for part in paths.distill_root().glob("*/*.parquet"):
        ids |= {i.split(":", 1)[-1] for i in pq.read_table(part, columns=["id"]).column("id").to_pylist()}
    return ids


def test_held_out_clusters_share_no_member_with_any_dataset(built_sample):
    _, layout, _ = built_sample
    paths = layout.data_layout()
    clusters = clusters_table(paths)
    kl = pl.read_parquet(paths.heldout_kl())
    fmt = pl.read_parquet(paths.format_suite())
    assert kl.height and fmt.height
    assert pq.read_schema(paths.heldout_kl()).equals(VALIDATION_SCHEMA, check_metadata=False)
    held = set(kl["cluster_id"]) | set(fmt["cluster_id"])
    members = clusters.filter(pl.col("cluster_id").is_in(list(held)))
    assert set(members["decision"]) == {drops.DROP_HELDOUT}
    assert not set(members["synth_id"]) & trained_ids(paths)
    # the KL slice: the configured number per exercise, as far as the sample has clusters
    per_exercise = Counter(kl["exercise"])
    assert set(per_exercise.values()) == {4}
    assert set(fmt["answer_form"]) <= {"number", "mcq_letter"} and fmt["expected_answer"].null_count() == 0
    assert all(t[-1] != 0 for t in kl["prompt_tokens"])  # rendered prompts, not empty lists
    manifest = mf.read_json(paths.validation_manifest())
    assert manifest["sets"]["kl"]["rows"] == kl.height


def test_every_cluster_decision_is_a_counted_drop_of_synth_sampled_and_the_plan_counts_after_them(built_sample):
    _, layout, _ = built_sample
    paths = layout.data_layout()
    clusters = clusters_table(paths)
    assert pq.read_schema(stage_files(paths, "synth_clusters", "synth_001")[0]).equals(
        CLUSTERS_SCHEMA, check_metadata=False
    )
    decided = Counter(d for d in clusters["decision"] if d is not None)
    sampled = Counter()
    for name in shard_names(paths):
        report = mf.read_json(stage_files(paths, "synth_sampled", name)[1])
        sampled.update(
            {r: n for r, n in report["dropped"].items() if r in (drops.DROP_CLUSTER_CAP, drops.DROP_HELDOUT)}
        )
        logged = [json.loads(line) for line in paths.error_log("synth_sampled", name).read_text().splitlines()]
        for reason in (drops.DROP_CLUSTER_CAP, drops.DROP_HELDOUT):  # every such drop named in the error log
            assert sum(e["reason"] == reason for e in logged) == report["dropped"].get(reason, 0)
    assert sampled == decided and decided[drops.DROP_HELDOUT] > 0 and decided[drops.DROP_CLUSTER_CAP] > 0
    summary = mf.read_json(paths.clusters_summary())
    plan = mf.read_json(paths.sampling_plan())
    filtered = {n: mf.read_json(stage_files(paths, "synth_filtered", n)[1]) for n in shard_names(paths)}
    kept = rows_after_clusters(paths, ["exercise", "language"]).group_by("exercise", "language").len()
    counts = {(e, lang): n for e, lang, n in kept.iter_rows()}  # from the rows the clusters keep, not the summary
    assert counts == counts_after_clusters(filtered, removed_by_clusters(summary))
    assert {(e, lang): n for e, by in plan["counts"].items() for lang, n in by.items()} == counts
    assert plan["near_dup"]["clusters_sha256"] == sha256_file(paths.clusters_summary())


def test_the_pool_carries_each_rows_cluster(built_sample):
    _, layout, _ = built_sample
    paths = layout.data_layout()
    clusters = clusters_table(paths).select("synth_id", "cluster_id", "near_dup_hash")
    pool = pl.concat([pl.read_parquet(p) for p in sorted(paths.pool_root().glob("parts/*.parquet"))])
    joined = pool.join(clusters, left_on="source_example_id", right_on="synth_id", how="left", suffix="_c")
    assert joined["cluster_id"].null_count() == 0
    assert (joined["cluster_id"] == joined["cluster_id_c"]).all()
    assert (joined["near_dup_hash"] == joined["near_dup_hash_c"]).all()


def test_clusters_report_metadata_and_warn_checks_in_the_ui(built_sample):
    instance, _, _ = built_sample
    event = instance.get_latest_materialization_event(dg.AssetKey("synth_clusters"))
    metadata = event.asset_materialization.metadata
    for key in ("rows", "clusters", "share_in_clusters_over_1", "distinct_share", "largest_cluster_size"):
        assert isinstance(metadata[key].value, (int, float)), key  # plotted over materializations
    assert "cluster size" in metadata["cluster_size_histogram"].value
    assert "example_pair" in metadata
    # cluster ids are 64-bit: shown as text, exactly as synth_clusters stores them (a JSON number would be rounded)
    summary = json.loads(built_sample[1].data_layout().clusters_summary().read_text())
    largest = metadata["largest_clusters"].value
    assert all(f"| `{c['cluster_id']}` | {c['cluster_size']} |" in largest for c in summary["largest"])
    assert max(c["cluster_id"] for c in summary["largest"]) > 2**53  # the sample has such ids to show
    for name in ("large_cluster", "clusters_cross_split"):
        key = dg.AssetCheckKey(dg.AssetKey("synth_clusters"), name)
        record = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
        evaluation = record.event.dagster_event.event_specific_data
        # the sample's largest cluster is far under 1% of the rows, and none crosses the split
        assert evaluation.severity == dg.AssetCheckSeverity.WARN and evaluation.passed, evaluation.description


def test_a_reclustering_without_a_new_plan_stops_synth_sampled(built_sample, own_instance, tmp_path):
    instance, (_, _, data_dir) = own_instance, built_sample
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(copy))
    run(instance, layout, ["synth_clusters"], build=SynthKDBuildConfig(max_per_cluster=2))
    result = run(instance, layout, ["synth_sampled"], "synth_006", raise_on_error=False)
    assert not result.success
    [failure] = result.get_step_failure_events()
    assert "re-materialize synth_clusters and synth_sampling_plan" in str(failure.step_failure_data.error)
    run(instance, layout, ["synth_sampling_plan"], build=SynthKDBuildConfig(max_per_cluster=2))
    run(instance, layout, ["synth_sampled"], "synth_006", build=SynthKDBuildConfig(max_per_cluster=2))
    report = mf.read_json(stage_files(layout.data_layout(), "synth_sampled", "synth_006")[1])
    assert report["dropped"][drops.DROP_CLUSTER_CAP] > 20  # clusters of 3..7 now keep 2 rows each
