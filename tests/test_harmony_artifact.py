"""The synth_harmony_v1 artifact as input (issue #44): its manifest verified against its files, row-group range
partitions, bad rows counted, and build.sh building every dataset from it alone, each document exactly
openai-harmony's render of the artifact's own messages (system and developer included) plus EOD."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import dagster as dg
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from openai_harmony import Conversation, Message, RenderConversationConfig

from synthkd_assets.core.cleanup import sources_not_configured
from synthkd_assets.core.harmony_artifact import (
    artifact_ranges,
    harmonize_artifact_range,
    messages_problem,
    range_digest,
    read_artifact,
)
from synthkd_assets.core.inventory import shard_index_from_name
from synthkd_assets.core.layout import DataLayout
from synthkd_assets.core.parquet_io import InputFileError
from synthkd_assets.defs.resources import SynthKDLayout
from synthkd_contract import constants, drops
from synthkd_contract.harmony_artifact import ARTIFACT_SHARD_INDEX_BASE, parse_range_key
from synthkd_contract.manifest_seal import verify_manifest
from synthkd_contract.settings import SettingError
from synthkd_contract.sources import SYNTH_SOURCE, partition_source
from synthkd_contract.trio import open_trio
from synthkd_dev.make_harmony_artifact import (
    DEVELOPER_MESSAGE,
    converted_rows,
    text_message,
    write_artifact,
)
from tests.helpers import REPO_ROOT, SAMPLE_RAW_DIR, build_everything, check_evaluations

ROW_GROUP_ROWS = 8


@pytest.fixture(scope="module")
def artifact_rows() -> list[dict]:
    return converted_rows(sorted(SAMPLE_RAW_DIR.glob("*.parquet")))


def make_artifact(root: Path, rows: list[dict], shards: int = 2) -> Path:
    write_artifact(rows, root, shards, ROW_GROUP_ROWS)
    return root


def rewrite_manifest(root: Path, edit) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    edit(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest))


# --- the manifest and the ranges -----------------------------------------------------------------------------


def test_the_manifest_is_verified_against_the_files_naming_the_file(tmp_path, artifact_rows):
    root = make_artifact(tmp_path / "artifact", artifact_rows[:400])
    assert [f.rows for f in read_artifact(root).files] == [200, 200]
    shard = root / "synth_harmony_shard_01.parquet"

    def refused(match: str) -> None:
        with pytest.raises(InputFileError, match=match):
            read_artifact(root)

    rewrite_manifest(root, lambda m: m["storage"]["shards"][1].update(rows=199))
    refused(f"{shard} is not the file it lists: rows 199 listed, 200 in the file")
    rewrite_manifest(root, lambda m: m["storage"]["shards"][1].update(rows=200, bytes=5))
    refused(f"{shard} is not the file it lists: bytes 5 listed")
    rewrite_manifest(root, lambda m: m["storage"]["shards"][1].update(bytes=shard.stat().st_size))
    read_artifact(root)
    extra = root / "synth_harmony_shard_02.parquet"
    shutil.copy(shard, extra)
    refused(f"{extra} is in the directory but not listed")
    extra.unlink()
    other = root / "notes.parquet"
    shutil.copy(shard, other)
    refused(f"{other}: not an artifact shard name")
    other.unlink()
    moved = "x/synth_harmony_shard_07.parquet"
    rewrite_manifest(root, lambda m: m["storage"]["shards"].append({**m["storage"]["shards"][1], "path": moved}))
    refused("synth_harmony_shard_07.parquet is listed in storage.shards but .* does not exist")
    rewrite_manifest(root, lambda m: (m["storage"]["shards"].pop(), m.update(conversion=["x"])))
    refused("conversion is not an object")
    rewrite_manifest(root, lambda m: m.update(conversion={}, schema_version="v0"))
    refused("schema_version is 'v0', not 'synth_harmony_v1'")
    (root / "manifest.json").unlink()
    refused("the required manifest cannot be read")


def test_a_file_of_another_schema_is_refused_naming_the_column(tmp_path, artifact_rows):
    root = make_artifact(tmp_path / "artifact", artifact_rows[:40], shards=1)
    path = root / "synth_harmony_shard_00.parquet"
    table = pq.read_table(path)
    pq.write_table(
        table.set_column(2, "synth_id", pa.array(range(40), pa.int64())), path, row_group_size=ROW_GROUP_ROWS
    )
    rewrite_manifest(root, lambda m: m["storage"]["shards"][0].update(bytes=path.stat().st_size))
    with pytest.raises(InputFileError, match=f"{path}: column 'synth_id' has type int64, expected string"):
        read_artifact(root)


def test_ranges_come_from_the_footer_and_number_their_outputs_apart(tmp_path, artifact_rows):
    root = make_artifact(tmp_path / "artifact", artifact_rows[:1000])  # 63 row groups a file
    ranges = artifact_ranges(read_artifact(root), row_groups_per_partition=20)
    assert [r.key for r in ranges[:4]] == [
        "synth_harmony_shard_00/rg_0000-0019",
        "synth_harmony_shard_00/rg_0020-0039",
        "synth_harmony_shard_00/rg_0040-0059",
        "synth_harmony_shard_00/rg_0060-0062",
    ]
    assert sum(r.rows for r in ranges) == 1000 and [r.first_row for r in ranges[:4]] == [0, 160, 320, 480]
    numbers = [shard_index_from_name(r.key) for r in ranges]
    assert len(set(numbers)) == len(numbers) and min(numbers) >= ARTIFACT_SHARD_INDEX_BASE
    assert all(partition_source(r.key) == SYNTH_SOURCE for r in ranges)  # the 001 rules apply: SYNTH's rows
    assert parse_range_key("synth_harmony_shard_01/rg_0020-0039") == ("synth_harmony_shard_01", 20, 39)
    assert parse_range_key("oasst1/train-00000-of-00001") is None


def test_a_changed_file_changes_only_its_own_ranges(tmp_path, artifact_rows):
    root = make_artifact(tmp_path / "artifact", artifact_rows[:1000])
    before = {r.key: range_digest(r) for r in artifact_ranges(read_artifact(root), 20)}
    rows = [dict(r) for r in artifact_rows[:1000]]
    rows[700]["model"] = "edited"  # file 01, row 200: its fourth range (rows 160-319) and the ranges after
    write_artifact(rows, root, 2, ROW_GROUP_ROWS)
    after = {r.key: range_digest(r) for r in artifact_ranges(read_artifact(root), 20)}
    changed = {key for key in before if before[key] != after[key]}
    assert changed and all(key.startswith("synth_harmony_shard_01/") for key in changed)
    assert "synth_harmony_shard_01/rg_0000-0019" not in changed


# --- rows -------------------------------------------------------------------------------------------------------

BAD_SHAPES = {
    "not JSON": ("{", "not JSON"),
    "unknown content type": (
        json.dumps({"messages": [{"role": "user", "content": [{"type": "image", "url": "x"}]}]}),
        "unknown content type 'image'",
    ),
    "unknown role": (json.dumps({"messages": [{"role": "tool", "content": []}]}), "role 'tool'"),
    "no final": (json.dumps({"messages": [text_message("user", "q")]}), "not the assistant's final answer"),
    "a role that is a list": (json.dumps({"messages": [{"role": ["user"], "content": []}]}), "role ['user']"),
    "nesting past the stack": ("[" * 100_000, "cannot be read (RecursionError"),
    "an integer past the digit limit": ('{"messages": [' + "9" * 5000 + "]}", "cannot be read (ValueError"),
    "NUL": (
        json.dumps({"messages": [text_message("user", "q\x00"), text_message("assistant", "a", "final")]}),
        "text holds NUL",
    ),
}


@pytest.mark.parametrize("shape", BAD_SHAPES)
def test_messages_not_of_the_artifacts_shape_are_named(shape):
    text, reason = BAD_SHAPES[shape]
    problem, _ = messages_problem(text)
    assert problem is not None and reason in problem


def test_bad_rows_are_dropped_counted_and_named_with_file_and_row(tmp_path, artifact_rows):
    rows = [dict(r) for r in artifact_rows[:24]]
    rows[3]["messages_json"] = BAD_SHAPES["unknown content type"][0]
    rows[9]["synth_id"] = " "
    rows[17]["synth_id"] = rows[16]["synth_id"]
    root = make_artifact(tmp_path / "artifact", rows, shards=1)
    [whole] = artifact_ranges(read_artifact(root))
    errors = tmp_path / "errors.jsonl"
    report = harmonize_artifact_range(whole, tmp_path / "out.parquet", errors_log=errors)
    assert report.rows_in == 24 and report.rows_out == 21
    assert report.dropped[drops.DROP_ARTIFACT_MESSAGES] == 1
    assert report.dropped[drops.DROP_MISSING["synth_id"]] == 1 and report.dropped[drops.DROP_DUPLICATE_SYNTH_ID] == 1
    logged = [json.loads(line) for line in errors.read_text().splitlines()]
    assert {(e["source_row"], e["reason"]) for e in logged} == {
        (3, "artifact_messages_invalid"),
        (9, "missing_synth_id"),
        (17, "duplicate_synth_id"),
    }
    out = pl.read_parquet(tmp_path / "out.parquet")
    kept = [r for i, r in enumerate(rows) if i not in (3, 9, 17)]
    assert out["messages_json"].to_list() == [r["messages_json"] for r in kept]  # as the artifact wrote them
    assert out["source_row"].to_list() == [i for i in range(24) if i not in (3, 9, 17)]


# --- build.sh on an artifact alone ------------------------------------------------------------------------------


def build_from_artifact(root: Path, artifact: Path) -> subprocess.CompletedProcess:
    (root / "empty").mkdir(parents=True)
    environment = {
        **os.environ,
        "DAGSTER_HOME": str(root / "home"),
        "SYNTHKD_RAW_DIR": str(root / "empty"),
        "SYNTHKD_DATA_DIR": str(root / "data"),
        "SYNTHKD_HARMONY_DIR": str(artifact),
    }
    return subprocess.run(
        ["bash", "scripts/build.sh"], cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=900
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory, artifact_rows):
    """The sample converted into an artifact (2 files of 190 row groups), built by build.sh in ranges of 100 row
    groups (4 partitions) and, for comparison, as whole files (2 partitions) by the same passes in process."""
    root = tmp_path_factory.mktemp("artifact_build")
    artifact = make_artifact(root / "artifact", artifact_rows)
    ranged = build_from_artifact(root / "ranged", artifact)
    assert ranged.returncode == 0, ranged.stdout[-3000:] + ranged.stderr[-3000:]
    build_in_process(layout_of(root / "whole", artifact, harmony_range_row_groups=1000))
    return artifact, root / "ranged", root / "whole", ranged.stdout


def layout_of(root: Path, artifact: Path, **fields) -> SynthKDLayout:
    return SynthKDLayout(raw_dir=str(root / "empty"), data_dir=str(root / "data"), harmony_dir=str(artifact), **fields)


def build_in_process(layout: SynthKDLayout) -> None:
    """Every pass of build.sh's build, in this process (tests/helpers.py), on a fresh instance."""
    Path(layout.raw_dir).mkdir(parents=True, exist_ok=True)
    with dg.DagsterInstance.ephemeral() as instance:
        build_everything(instance, layout)


def test_build_sh_builds_every_dataset_from_the_artifact_every_row_accounted(built):
    artifact, ranged, _, stdout = built
    paths = layout_of(ranged, artifact).data_layout()
    harmony = json.loads(paths.harmony_manifest().read_text())
    assert [s["name"] for s in harmony["shards"]] == [
        "synth_harmony_shard_00/rg_0000-0099",
        "synth_harmony_shard_00/rg_0100-0189",
        "synth_harmony_shard_01/rg_0000-0099",
        "synth_harmony_shard_01/rg_0100-0189",
    ]
    total = read_artifact(artifact).manifest["storage"]["total_rows"]
    assert harmony["rows_in"] == total == harmony["rows_out"] + sum(harmony["dropped"].values())
    manifest_sha = read_artifact(artifact).manifest_sha256
    assert harmony["input_artifact"]["sha256"] == manifest_sha
    for manifest_path in (paths.megatron_root(), paths.distill_root(), paths.pool_root()):
        manifest = verify_manifest(manifest_path)  # sealed, every file as listed
        assert manifest["input_artifact"]["sha256"] == manifest_sha, manifest_path
        assert manifest["input_artifact"]["path"] == str((artifact / "manifest.json").resolve())
        assert manifest["config"]["input_artifact"]["conversion"]["developer_message"] == DEVELOPER_MESSAGE
        dropped = manifest["totals"]["dropped"] if "totals" in manifest else manifest["dropped"]
        rows_out = manifest["totals"]["rows_out"] if "totals" in manifest else manifest["rows_out"]
        assert rows_out + sum(dropped.values()) == total, manifest_path
    validation = verify_manifest(paths.validation_root())
    assert validation["input_artifact"]["sha256"] == manifest_sha
    layout = layout_of(ranged, artifact)
    for asset in ("synth_kd_v1_manifest", "synth_distill_manifest"):  # the pool's blocking checks gate build.sh
        with dg.DagsterInstance.ephemeral() as instance:
            evaluations = check_evaluations(instance, layout, asset)
        assert evaluations and {n: e.passed for n, e in evaluations.items()} == dict.fromkeys(evaluations, True), asset
    assert "synth_kd_v1: 4 shards" in stdout


def reference_document(encoding, messages: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokens (+ EOD), loss_mask and span_id of one conversation, the independent way: openai-harmony's training
    render for the tokens; each message rendered alone for the boundaries (they must tile the render exactly)."""
    parsed = [Message.from_dict(m) for m in messages]
    config = RenderConversationConfig(auto_drop_analysis=False)
    rendered = encoding.render_conversation_for_training(Conversation.from_messages(parsed), config)
    pieces = [encoding.render(m) for m in parsed]
    pieces[-1] = pieces[-1][:-1] + encoding.encode("<|return|>", allowed_special="all")
    assert [t for piece in pieces for t in piece] == rendered
    span_of = {"analysis": 1, "final": 2}
    token_spans = [span_of.get(m.get("channel"), 0) if m["role"] == "assistant" else 0 for m in messages]
    spans = np.concatenate([np.full(len(p), s) for p, s in zip(pieces, token_spans)] + [np.zeros(1)])
    tokens = np.array([*rendered, constants.EOD_TOKEN_ID])
    span_id = np.append(spans[1:], 0)  # label-aligned: position i describes token i + 1
    return tokens, (span_id > 0).astype(np.uint8), span_id.astype(np.uint8)


def test_every_document_is_harmonys_render_of_the_artifacts_own_messages(built, encoding):
    artifact, ranged, _, _ = built
    paths = layout_of(ranged, artifact).data_layout()
    messages = {}
    for file in read_artifact(artifact).files:
        for row in pq.read_table(file.path, columns=["synth_id", "messages_json"]).to_pylist():
            messages[row["synth_id"]] = json.loads(row["messages_json"])["messages"]
    checked = 0
    root = paths.megatron_root()
    for documents in sorted((root / "shards").glob("shard_*_documents.parquet")):
        table = pl.read_parquet(documents)
        shard = int(documents.name.split("_")[1])
        for split in constants.SPLITS:
            ids = table.filter(pl.col("split") == split).sort("document_index")["synth_id"].to_list()
            if not ids:
                continue
            trio = open_trio(root / split / f"shard_{shard:02d}_tokens")
            for i, synth_id in enumerate(ids):
                assert messages[synth_id][0]["role"] == "system" and messages[synth_id][1]["role"] == "developer"
                tokens, loss_mask, span_id = reference_document(encoding, messages[synth_id])
                assert np.array_equal(trio["tokens"][i], tokens), synth_id
                assert np.array_equal(trio["lossmask"][i], loss_mask), synth_id
                assert np.array_equal(trio["span"][i], span_id), synth_id
                checked += 1
    assert checked == json.loads((root / constants.MANIFEST_FILENAME).read_text())["totals"]["rows_out"]
    rendered = [json.loads(p.read_text()) for p in sorted(paths.stage_dir("synth_tokenized").rglob("*.report.json"))]
    assert sum(r.get("render_path", {}).get("reference", 0) for r in rendered) == 0  # all by the fast renderer


def test_range_partitions_give_the_bytes_of_the_file_built_whole(built):
    """Per-shard files differ in name and cut, so the comparison is of what they hold, in order: every document's
    tokens, masks and spans per split, the DistillKit rows and the pool rows."""
    artifact, ranged, whole, _ = built
    outputs = {}
    for name, root in (("ranged", ranged), ("whole", whole)):
        paths = layout_of(root, artifact).data_layout()
        megatron = paths.megatron_root()
        arrays = {}
        for split in constants.SPLITS:
            for kind in constants.ARRAY_KINDS:
                docs = []
                for prefix in sorted((megatron / split).glob("shard_*_tokens.idx")):
                    trio = open_trio(str(prefix)[: -len(".idx")])
                    docs += [bytes(np.asarray(trio[kind][i]).tobytes()) for i in range(len(trio[kind]))]
                arrays[(split, kind)] = docs
        distill = pl.concat([pl.read_parquet(p) for p in sorted(paths.distill_root().rglob("part-*.parquet"))])
        pool = pl.concat([pl.read_parquet(p) for p in sorted((paths.pool_root() / "parts").glob("part-*.parquet"))])
        outputs[name] = (arrays, distill.sort("id"), pool.sort("id"))
    assert outputs["ranged"][0] == outputs["whole"][0]
    assert outputs["ranged"][1].equals(outputs["whole"][1])
    assert outputs["ranged"][2].equals(outputs["whole"][2])


def test_the_inventory_lists_ranges_beside_raw_shards_and_hashes_each_once(tmp_path, artifact_rows, monkeypatch):
    from synthkd_assets.core import inventory

    artifact = make_artifact(tmp_path / "artifact", artifact_rows[:1000])
    layout = DataLayout(SAMPLE_RAW_DIR, tmp_path / "data", harmony_root=artifact, harmony_range_row_groups=40)
    first = inventory.scan_inputs(layout)
    assert [s.name for s in first][:6] == [f"synth_00{i}" for i in range(1, 7)]  # a build of raw shards and ranges
    assert [s.name for s in first][6:] == [
        "synth_harmony_shard_00/rg_0000-0039",
        "synth_harmony_shard_00/rg_0040-0062",
        "synth_harmony_shard_01/rg_0000-0039",
        "synth_harmony_shard_01/rg_0040-0062",
    ]
    hashed = []
    monkeypatch.setattr(inventory, "range_digest", lambda r: hashed.append(r.key) or "x")
    assert inventory.scan_inputs(layout) == first and hashed == []  # unchanged files: from the cache
    with pytest.raises(InputFileError, match="no raw shards"):
        inventory.scan_inputs(DataLayout(tmp_path / "empty_raw", tmp_path / "data"))


def test_an_unset_artifact_variable_is_not_a_removal(built):
    """The daemon started without SYNTHKD_HARMONY_DIR over a build from an artifact changes nothing and says what
    to export (an inventory run by build.sh without it removes the ranges, as for removed raw shards)."""
    artifact, ranged, _, _ = built
    without = DataLayout(ranged / "empty", ranged / "data")
    unconfigured = sources_not_configured(without)
    assert unconfigured is not None and len(unconfigured.shards) == 4
    message = unconfigured.message(without.data_root)
    assert "SYNTHKD_HARMONY_DIR is not set" in message and f"SYNTHKD_HARMONY_DIR={artifact.resolve()}" in message
    assert sources_not_configured(DataLayout(ranged / "empty", ranged / "data", harmony_root=artifact)) is None


def test_the_near_duplicate_question_is_the_user_message_after_system_and_developer(artifact_rows):
    from synthkd_assets.core.near_dup import question_expr
    from synthkd_assets.core.valuation import prompt_text

    rows = artifact_rows[:5]
    queries = [json.loads(r["messages_json"])["messages"][2]["content"][0]["text"] for r in rows]
    frame = pl.DataFrame({"messages_json": [r["messages_json"] for r in rows]})
    assert frame.select(question_expr().alias("q"))["q"].to_list() == queries
    pool_rows = pl.DataFrame({"messages": [r["messages_json"] for r in rows]})
    assert pool_rows.select(prompt_text().alias("q"))["q"].to_list() == queries


def test_a_raw_shard_and_artifact_ranges_build_together(tmp_path, artifact_rows):
    """Raw SYNTH beside the artifact: one build, one sampling plan over both (their rows are SYNTH's). Built in
    process: build.sh's own route from an artifact is test_build_sh_builds_every_dataset_from_the_artifact_..."""
    rows = [dict(r) for r in artifact_rows[-300:]]
    for row in rows:  # other conversations than the raw shard's (a row in both would be a cross-shard duplicate)
        row["synth_id"] = "artifact_" + row["synth_id"]
    artifact = make_artifact(tmp_path / "artifact", rows)
    raw = tmp_path / "raw"
    raw.mkdir()
    pq.write_table(pq.read_table(SAMPLE_RAW_DIR / "synth_001.parquet").slice(0, 200), raw / "synth_001.parquet")
    build_in_process(SynthKDLayout(raw_dir=str(raw), data_dir=str(tmp_path / "data"), harmony_dir=str(artifact)))
    paths = DataLayout(raw, tmp_path / "data", harmony_root=artifact)
    manifest = verify_manifest(paths.megatron_root())
    assert [s["partition"] for s in manifest["shards"]] == [
        "synth_001",
        "synth_harmony_shard_00/rg_0000-0018",
        "synth_harmony_shard_01/rg_0000-0018",
    ]
    plan = json.loads(paths.sampling_plan().read_text())
    assert set(plan["shards"]) == {s["partition"] for s in manifest["shards"]}
    assert manifest["totals"]["rows_in"] == 200 + 300


def test_a_removed_files_ranges_leave_no_directory_behind(tmp_path):
    from synthkd_assets.core.cleanup import remove_orphaned_outputs
    from tests.helpers import write_as_build

    layout = DataLayout(tmp_path / "raw", tmp_path / "data", harmony_root=tmp_path / "artifact")
    kept = write_as_build(layout.stage_output("synth_harmony", "synth_harmony_shard_00/rg_0000-0099"))
    gone = [
        write_as_build(layout.stage_output(stage, "synth_harmony_shard_01/rg_0000-0099"))
        for stage in ("synth_harmony", "synth_filtered")
    ]
    assert remove_orphaned_outputs(layout, ["synth_harmony_shard_00/rg_0000-0099"]) == sorted(gone)
    assert kept.is_file() and not gone[0].parent.exists() and not gone[1].parent.exists()


@pytest.mark.parametrize("value", ["0", "-3", "abc", "1.5"])
def test_a_bad_range_size_is_refused_naming_the_variable(value):
    with pytest.raises(SettingError, match=f"SYNTHKD_HARMONY_RANGE_ROW_GROUPS='{re.escape(value)}': expected a whole"):
        DataLayout.from_environ({"SYNTHKD_HARMONY_RANGE_ROW_GROUPS": value})
