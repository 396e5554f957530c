"""Near-duplicate control and the validation sets (docs/near-dup.md): signatures per shard (scan pass), the
global clusters with their cap and held-out clusters (plan pass, before the sampling plan counts rows), and the
held-out KL slice and format-compliance suite. Each asset calls its core rule (core/near_dup.py,
core/validation_sets.py) and reports what it found as metadata."""

from collections import Counter

import dagster as dg

from synthkd_assets.core import manifest as mf
from synthkd_assets.core.cleanup import remove_stale_cluster_files, unpublish_pool_of_other_clusters
from synthkd_assets.core.dataset_manifest import write_sealed_manifest
from synthkd_assets.core.harmony_artifact import input_artifact_record, layout_artifact
from synthkd_assets.core.layout import DataLayout
from synthkd_assets.core.near_dup import (
    FORMAT_SET,
    KL_SET,
    cluster_shards,
    cluster_summary,
    prompt_of,
    shard_clusters_table,
    signatures_shard,
)
from synthkd_assets.core.parquet_io import write_tables_together
from synthkd_assets.core.tokenizer import load_harmony_encoding
from synthkd_assets.core.validation_sets import validation_rows, validation_table
from synthkd_assets.defs.assets import shard_step, stage_result, synth_filtered
from synthkd_assets.defs.checks import check_result, pool_unpublished_events
from synthkd_assets.defs.conventions import synthkd_asset
from synthkd_assets.defs.ingest import o200k_tokenizer
from synthkd_assets.defs.metadata import table_definition_metadata
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout
from synthkd_assets.defs.upstream import partition_records, require_upstream, shard_names, stage_files
from synthkd_contract import drops
from synthkd_contract import near_dup as nd
from synthkd_contract.manifest_seal import file_record, file_records, sha256_file
from synthkd_contract.schemas import CLUSTERS_SCHEMA, SIGNATURES_SCHEMA, VALIDATION_SCHEMA

LARGE_CLUSTER = "large_cluster"
CLUSTERS_CROSS_SPLIT = "clusters_cross_split"
NO_CLUSTER = "no cluster of more than one row"  # what the largest-cluster views say on a sample without one
CLUSTER_CHECK_SPECS = [
    dg.AssetCheckSpec(
        LARGE_CLUSTER,
        asset="synth_clusters",
        blocking=False,
        description=f"WARN when one near-duplicate cluster holds more than {nd.LARGE_CLUSTER_SHARE:.0%} of the rows "
        "(a template or a seed text repeated at scale); names the cluster and an example pair.",
    ),
    dg.AssetCheckSpec(
        CLUSTERS_CROSS_SPLIT,
        asset="synth_clusters",
        blocking=False,
        description="WARN when the rows a near-duplicate cluster keeps fall in both the train and the valid split "
        "of synth_kd_v1 (the 000 split is by synth_id and stays as it is; this says how much it leaks).",
    ),
]


@shard_step([synth_filtered], {"parquet", "rensa"}, "scan", "synth", table_definition_metadata(SIGNATURES_SCHEMA))
def synth_signatures(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    """MinHash signatures (rensa, 128 permutations) of each synth_filtered row's question and answer, normalized
    (NFKC, casefold, format characters removed, lookalikes folded to ASCII, whitespace collapsed) and shingled
    into word 3-grams, with its 16 LSH band keys and near_dup_hash.
    Per shard: a changed shard recomputes only its own signatures."""
    paths = layout.data_layout(build.smoke)
    key = context.partition_key
    require_upstream(paths, "synth_signatures", key, "synth_filtered")
    in_path, out_path = stage_files(paths, "synth_filtered", key)[0], stage_files(paths, "synth_signatures", key)[0]
    return stage_result(paths, signatures_shard(in_path, out_path, key), "synth_signatures")


@synthkd_asset(
    "plan",
    {"parquet", "scipy"},
    deps=[synth_signatures],
    group_name="synth",
    check_specs=CLUSTER_CHECK_SPECS,
    metadata=table_definition_metadata(CLUSTERS_SCHEMA),
)
def synth_clusters(context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig):
    """Near-duplicate clusters over every shard's signatures (docs/near-dup.md): LSH candidates (rows sharing a band
    key) verified at the Jaccard threshold, joined by connected components; exact duplicates included. Per row
    cluster_id / cluster_size / cluster_rank and the decision: `cluster_cap` past max_per_cluster (by a salted
    hash; clusters of one always kept), `heldout` for the clusters of the validation sets (none larger than
    heldout_cluster_limit), whose signatures clusters.json keeps for every later build. Global, like the
    sampling plan that counts rows after it: a re-cluster means rebuilding every shard from synth_sampled on. Its
    "Upstream data" / "Unsynced" in the UI after a shard is rebuilt is by design, no action needed unless you mean
    to re-cluster (synth_plan_job, then ./scripts/build.sh)."""
    paths = layout.data_layout(build.smoke)
    names = shard_names(paths)
    partition_records("synth_signatures", {n: stage_files(paths, "synth_signatures", n)[1] for n in names})
    signature_files = [stage_files(paths, "synth_signatures", n)[0] for n in names]
    settings = build.cluster_settings()
    clusters = cluster_shards(names, signature_files, settings)
    # every shard's decisions published together, then the summary the plan reads: never a mix of two clusterings
    write_tables_together(  # a shard's table at a time (a generator): never every shard's rows at once
        (stage_files(paths, "synth_clusters", name)[0], CLUSTERS_SCHEMA, shard_clusters_table(clusters, i, sig))
        for i, (name, sig) in enumerate(zip(names, signature_files))
    )
    stale = remove_stale_cluster_files(paths, names)  # shards removed since the last clustering: not in this one
    summary = {
        "settings": settings.to_dict(),
        "shards": dict(zip(names, file_records(paths.build_root(), signature_files))),
        **cluster_summary(clusters, signature_files),
    }
    example = example_pair(paths, summary)
    summary["example_pair"] = example
    digest = mf.write_manifest(paths.clusters_summary(), summary)
    yield dg.MaterializeResult(
        metadata={
            "clusters_sha256": digest,
            "path": dg.MetadataValue.path(str(paths.clusters_summary())),
            "rows": summary["rows"],
            "clusters": summary["clusters"],
            "share_in_clusters_over_1": summary["share_in_clusters_over_1"],
            "distinct_share": summary["distinct_share"],
            "largest_cluster_size": max(map(int, summary["size_histogram"]), default=0),
            "candidate_pairs": summary["candidate_pairs"],
            "verified_pairs": summary["verified_pairs"],
            **{f"dropped_{r}": summary["dropped"].get(r, 0) for r in (drops.DROP_CLUSTER_CAP, drops.DROP_HELDOUT)},
            "heldout_clusters_over_limit": summary["heldout_over_limit"].get("clusters", 0),
            "heldout_rows_over_limit": summary["heldout_over_limit"].get("rows", 0),
            "cluster_size_histogram": dg.MetadataValue.md(_histogram_markdown(summary["size_histogram"])),
            "largest_clusters": dg.MetadataValue.md(largest_markdown(summary["largest"])),
            "example_pair": dg.MetadataValue.md(_pair_markdown(example)),
            "clusters_crossing_split": summary["clusters_crossing_split"],
            "stale_cluster_files_removed": dg.MetadataValue.json([str(p) for p in stale]),
        },
        data_version=dg.DataVersion(digest),
    )
    yield large_cluster_result(summary, example)
    crossing = summary["clusters_crossing_split"]
    yield check_result(
        check_name=CLUSTERS_CROSS_SPLIT,
        passed=crossing == 0,
        severity=dg.AssetCheckSeverity.WARN,
        description=f"{crossing} near-duplicate cluster(s) keep rows in both train and valid",
        metadata={"clusters_crossing_split": crossing},
    )


def example_pair(paths: DataLayout, summary: dict) -> dict:
    """The first two rows of the largest cluster, with their user prompts (shown in the UI)."""
    if not summary["largest"]:
        return {}
    top = summary["largest"][0]
    texts = {}
    for synth_id, shard in list(zip(top["synth_id"], top["shard"]))[:2]:
        texts[synth_id] = prompt_of(stage_files(paths, "synth_filtered", shard)[0], synth_id)
    return {"cluster_id": top["cluster_id"], "cluster_size": top["cluster_size"], "prompts": texts}


def _histogram_markdown(histogram: dict[str, int]) -> str:
    rows = "\n".join(f"| {size} | {count} |" for size, count in histogram.items())
    return "| cluster size | clusters |\n|---:|---:|\n" + rows


def largest_markdown(largest: list[dict]) -> str:
    """The largest clusters as a table: ids as text (a JSON number past 2**53 is rounded by the UI, naming a
    cluster that does not exist), and the first members (rank order) said to be the first ones."""
    if not largest:
        return NO_CLUSTER
    rows = "\n".join(
        f"| `{c['cluster_id']}` | {c['cluster_size']} | "
        + ", ".join(f"`{sid}` ({shard})" for sid, shard in zip(c["synth_id"], c["shard"]))
        + " |"
        for c in largest
    )
    return "| cluster_id | rows | first members (synth_id, shard) |\n|---|---:|---|\n" + rows


def _pair_markdown(example: dict) -> str:
    if not example:
        return NO_CLUSTER
    quoted = "\n\n".join(f"**{sid}**\n\n> {text[:600]}" for sid, text in example["prompts"].items())
    return f"cluster {example['cluster_id']} ({example['cluster_size']} rows):\n\n{quoted}"


def large_cluster_result(summary: dict, example: dict) -> dg.AssetCheckResult:
    share = summary["largest_cluster_share"]
    largest = summary["largest"][0] if summary["largest"] else None
    where = f"cluster {largest['cluster_id']} holds {largest['cluster_size']} rows" if largest else "no clusters"
    return check_result(
        check_name=LARGE_CLUSTER,
        passed=share <= nd.LARGE_CLUSTER_SHARE,
        severity=dg.AssetCheckSeverity.WARN,
        description=f"{where} ({share:.2%} of {summary['rows']} rows; limit {nd.LARGE_CLUSTER_SHARE:.0%})",
        metadata={"largest_cluster_share": share, "example_pair": dg.MetadataValue.md(_pair_markdown(example))},
    )


@synthkd_asset(
    "plan",
    {"parquet", "harmony"},
    deps=[synth_clusters, o200k_tokenizer],
    group_name="validation",
    metadata=table_definition_metadata(VALIDATION_SCHEMA),
)
def synth_validation_sets(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    """The validation sets (docs/near-dup.md#validation-sets), from the clusters synth_clusters held out (every member
    of them dropped from training as `heldout`, so both are cluster-disjoint from everything trained on): the held-out
    KL slice (heldout_per_exercise Harmony prompts per exercise) and the format-compliance suite (prompts whose
    `result:` constraint makes the answer form checkable, the expectation stored beside each), as Parquet with a
    manifest."""
    paths = layout.data_layout(build.smoke)
    summary_path = paths.clusters_summary()
    if not summary_path.is_file():
        raise dg.Failure(f"no clusters at {summary_path}: materialize synth_clusters first")
    summary = mf.read_json(summary_path)
    filtered = {name: stage_files(paths, "synth_filtered", name)[0] for name in shard_names(paths)}
    for name in {entry["shard"] for entry in summary["heldout_clusters"]}:
        require_upstream(paths, "synth_validation_sets", name, "synth_filtered")
    sets = validation_rows(summary["heldout_clusters"], filtered, load_harmony_encoding(paths.tokenizer_dir()))
    clusters_sha256 = sha256_file(summary_path)
    # first: until the pool pass follows, no published pool may train on what these sets hold out
    unpublished = unpublish_pool_of_other_clusters(paths, clusters_sha256)
    why = "synth_validation_sets holds out rows of new near-duplicate clusters; the pool was made after others"
    for event in pool_unpublished_events(paths, unpublished, why):
        context.instance.report_runless_asset_event(event)
    files = {KL_SET: paths.heldout_kl(), FORMAT_SET: paths.format_suite()}
    write_tables_together([(path, VALIDATION_SCHEMA, validation_table(sets[name])) for name, path in files.items()])
    manifest = {
        **input_artifact_record(paths, layout_artifact(paths)),
        "clusters_sha256": clusters_sha256,
        "settings": summary["settings"],
        "sets": {
            name: {
                **file_record(paths.validation_root(), files[name]),
                "rows": len(rows),
                "by_exercise": _count(rows, "exercise"),
                "by_answer_form": _count(rows, "answer_form"),
            }
            for name, rows in sets.items()
        },
    }
    digest = write_sealed_manifest(paths.validation_manifest(), manifest)  # verified as the datasets are
    return dg.MaterializeResult(
        metadata={
            "manifest_sha256": digest,
            "dataset_root": dg.MetadataValue.path(str(paths.validation_root())),
            "heldout_kl_rows": len(sets[KL_SET]),
            "format_suite_rows": len(sets[FORMAT_SET]),
            "heldout_kl_by_exercise": dg.MetadataValue.json(manifest["sets"][KL_SET]["by_exercise"]),
            "format_suite_by_form": dg.MetadataValue.json(manifest["sets"][FORMAT_SET]["by_answer_form"]),
            "pool_unpublished_files": dg.MetadataValue.json([paths.recorded(p) for p in unpublished]),
        },
        data_version=dg.DataVersion(digest),
    )


def _count(rows: list[dict], key: str) -> dict[str, int]:
    return dict(sorted(Counter(str(row[key]) for row in rows).items()))
