"""Each asset's code_version hashes its own rule version and contract slice: a changed rule constant moves the
code version of exactly the asset whose bytes it shapes, and Dagster's staleness (asked as the UI asks it,
over the webserver's GraphQL) then marks that asset stale, and its descendants once it is rebuilt with other
bytes (a step's data version is a hash of what it wrote), nothing else."""

import os
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from synthkd_assets.definitions import build_definitions
from synthkd_assets.defs import code_versions
from synthkd_assets.defs.build import build_all
from synthkd_assets.defs.resources import SynthKDLayout
from synthkd_contract import buckets, constants
from tests.daemon import dagster_home, open_instance
from tests.helpers import SAMPLE_RAW_DIR, run
from tests.webserver import graphql, running_webserver

CHANGED_MARKER = "result:Failed after every attempt"  # the filter rule's constant, changed
SHARDS = ["synth_001", "synth_002"]
FAILED_ROW = 596  # synth_001's first row whose constraints hold the released marker (its only one)


def asset_code_versions() -> dict[str, str]:
    definitions = build_definitions({})
    return {
        key.to_user_string(): version
        for asset in definitions.assets
        for key, version in getattr(asset, "code_versions_by_key", {}).items()
    }


def test_every_asset_has_its_own_code_version():
    versions = asset_code_versions()
    assert set(versions) == set(code_versions.RULE_VERSIONS)
    assert len(set(versions.values())) == len(versions)  # no two assets share one


@pytest.mark.parametrize(
    ("constant", "value", "changed"),
    [
        ("FAILED_RESULT_MARKER", CHANGED_MARKER, {"synth_filtered"}),
        ("MAX_SEQ_LEN", 4096, {"synth_distill"}),
        ("SPLIT_SALT", "synth_kd_v2/split", {"synth_kd_v1", "synth_pool", "synth_signatures"}),
        ("USER_TEMPLATE", "{query}\n\nSource:\n{query_seed_text}", {"synth_harmony", "synth_harmony_manifest"}),
        ("TOKENIZER_SHA256", "0" * 64, {"o200k_tokenizer", "synth_tokenized"}),
    ],
)
def test_a_changed_constant_moves_only_the_code_versions_of_the_assets_it_shapes(monkeypatch, constant, value, changed):
    before = asset_code_versions()
    monkeypatch.setattr(constants, constant, value)
    after = asset_code_versions()
    assert {name for name in before if before[name] != after[name]} == changed


def test_a_changed_pool_rule_moves_only_the_pool_assets_it_shapes(monkeypatch):
    before = asset_code_versions()
    monkeypatch.setattr(buckets, "QUOTA_SALT", "synthkd/pool/quota-v2")
    after = asset_code_versions()
    assert {name for name in before if before[name] != after[name]} == {"synth_quota_plan", "synth_pool"}
    monkeypatch.setitem(buckets.EXERCISE_SKILL_BUCKET, "code_review", "B3")
    changed = {name for name in before if before[name] != asset_code_versions()[name]}
    # the table decides the scan's refusal, the token grid, the plan and the pool
    assert changed == {"synth_harmony", "synth_tokenized", "synth_quota_plan", "synth_pool"}


def test_a_bumped_rule_version_moves_only_its_asset(monkeypatch):
    before = asset_code_versions()
    bumped = str(int(code_versions.RULE_VERSIONS["synth_sampled"]) + 1)
    monkeypatch.setitem(code_versions.RULE_VERSIONS, "synth_sampled", bumped)
    after = asset_code_versions()
    assert {name for name in before if before[name] != after[name]} == {"synth_sampled"}
    assert after["synth_sampled"].startswith(f"{bumped}-")


# the code location as it loads after the filter rule's constant changed (a new release of the rule)
CHANGED_LOCATION = textwrap.dedent(
    f"""
    import os

    import dagster as dg

    from synthkd_contract import constants
    from synthkd_assets.definitions import build_definitions

    constants.FAILED_RESULT_MARKER = {CHANGED_MARKER!r}


    @dg.definitions
    def defs() -> dg.Definitions:
        return build_definitions(os.environ)
    """
)


def stale_statuses(port: int) -> dict[tuple[str, str | None], str]:
    """(asset, partition or None) -> FRESH / STALE / MISSING for every materializable asset, as the UI shows it."""
    query = "{ assetNodes { assetKey { path } isPartitioned isMaterializable partitionKeys } }"
    nodes = graphql(port, query)["assetNodes"]
    statuses = {}
    for node in nodes:
        if not node["isMaterializable"]:
            continue
        name = "/".join(node["assetKey"]["path"])
        partitions = node["partitionKeys"] if node["isPartitioned"] else [None]
        for partition in partitions:
            argument = f'(partition: "{partition}")' if partition else ""
            query = f'{{ assetNodes(assetKeys: [{{path: ["{name}"]}}]) {{ staleStatus{argument} }} }}'
            statuses[(name, partition)] = graphql(port, query)["assetNodes"][0]["staleStatus"]
    return statuses


def stale(statuses: dict) -> set:
    assert set(statuses.values()) <= {"FRESH", "STALE"}, statuses
    return {key for key, status in statuses.items() if status == "STALE"}


def test_a_changed_filter_rule_marks_only_synth_filtered_then_its_descendants_stale(tmp_path, monkeypatch):
    raw = tmp_path / "raw"
    raw.mkdir()
    for key in SHARDS:  # two small shards of the sample: every asset built, in a minute
        table = pq.read_table(SAMPLE_RAW_DIR / f"{key}.parquet")
        rows = [table.slice(0, 40)]
        if key == "synth_001":  # + a row the filter drops under the released marker and keeps under the changed one
            rows.append(table.slice(FAILED_ROW, 1))
            assert constants.FAILED_RESULT_MARKER.lower() in rows[-1]["constraints"][0].as_py().lower()
        pq.write_table(pa.concat_tables(rows), raw / f"{key}.parquet")
    layout = SynthKDLayout(raw_dir=str(raw), data_dir=str(tmp_path / "data"))
    home = dagster_home(tmp_path / "home")
    with open_instance(home) as instance:
        build_all(instance, layout)
    location = tmp_path / "changed_rule_location.py"
    location.write_text(CHANGED_LOCATION)
    env = {**os.environ, "DAGSTER_HOME": str(home), "SYNTHKD_RAW_DIR": str(raw), "SYNTHKD_DATA_DIR": layout.data_dir}

    with running_webserver(env, "-f", str(location)) as port:
        # the new code version: synth_filtered (every partition) and nothing else
        assert stale(stale_statuses(port)) == {("synth_filtered", key) for key in SHARDS}
        query = (
            '{ assetNodes(assetKeys: [{path: ["synth_filtered"]}]) '
            '{ staleCauses(partition: "synth_001") { category reason } } }'
        )
        causes = graphql(port, query)["assetNodes"][0]["staleCauses"]
        assert causes == [{"category": "CODE", "reason": "has a new code version"}]

        # synth_001 rebuilt under the changed rule keeps one more row: a new data version (its bytes'), so its own
        # descendants go stale in turn
        monkeypatch.setattr(constants, "FAILED_RESULT_MARKER", CHANGED_MARKER)
        with open_instance(home) as instance:
            run(instance, layout, ["synth_filtered"], "synth_001")
        assert stale(stale_statuses(port)) == {
            ("synth_filtered", "synth_002"),  # not rebuilt yet
            ("synth_sampled", "synth_001"),
            ("synth_signatures", "synth_001"),
            ("synth_sampling_plan", None),  # computed from every shard's filtered counts
        }
        # synth_002 rebuilt under it writes the same bytes: the same data version, nothing below it goes stale
        with open_instance(home) as instance:
            run(instance, layout, ["synth_filtered"], "synth_002")
        assert stale(stale_statuses(port)) == {
            ("synth_sampled", "synth_001"),
            ("synth_signatures", "synth_001"),
            ("synth_sampling_plan", None),
        }
