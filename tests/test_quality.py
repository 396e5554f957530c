"""Analysis / final length stats against a brute-force oracle (numpy, row by row), on generated files and on the
built sample, and as plotted metadata of synth_kd_v1_manifest."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synthkd_assets.core.layout import rows_summary_path
from synthkd_assets.core.manifest_builders import PERCENTILES
from synthkd_assets.core.quality import STAT_COLUMNS, length_stats, markdown_table
from synthkd_assets.core.row_sizes import current_row_sizes
from synthkd_contract import constants
from synthkd_contract.schemas import TOKENIZED_ROWS_SCHEMA
from tests.helpers import SAMPLE_RAW_DIR, quota_rows_of

ALL = ("all", "all")


def oracle(rows: list[tuple[str, str, np.ndarray]]) -> dict[tuple[str, str], dict[str, int]]:
    """Per (language, exercise) and ALL: rows, and min / nearest-rank pXX / max of the per-row span counts."""
    lengths: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(lambda: {"analysis": [], "final": []})
    for language, exercise, span_id in rows:
        for key in ((language, exercise), ALL):
            lengths[key]["analysis"].append(int(np.count_nonzero(span_id == 1)))
            lengths[key]["final"].append(int(np.count_nonzero(span_id == 2)))
    expected = {}
    for key, spans in lengths.items():
        stats: dict[str, int] = {"rows": len(spans["final"])}
        for name, values in spans.items():
            array = np.array(values)
            stats[f"{name}_tokens_min"] = int(array.min())
            for p in PERCENTILES:  # inverted_cdf: the smallest value whose empirical CDF reaches p%
                stats[f"{name}_tokens_p{p}"] = int(np.percentile(array, p, method="inverted_cdf"))
            stats[f"{name}_tokens_max"] = int(array.max())
        expected[key] = stats
    return expected


def computed(paths) -> dict[tuple[str, str], dict[str, int]]:
    stats = length_stats(paths)
    found = {(row.pop("language"), row.pop("exercise")): row for row in stats.groups.iter_rows(named=True)}
    return {**found, ALL: stats.overall}


def write_rows(path, rows: list[tuple[str, str, np.ndarray]]) -> None:
    table = pa.table(
        {
            "language": pa.array([r[0] for r in rows], pa.string()),
            "exercise": pa.array([r[1] for r in rows], pa.string()),
            "span_id": pa.array([r[2].tolist() for r in rows], pa.list_(pa.uint8())),
        }
    )
    pq.write_table(table, path)


conversation_rows = st.lists(
    st.tuples(
        st.sampled_from(["en", "fr", "de"]),
        st.sampled_from(["rag", "mcq", "memorization"]),
        st.lists(st.sampled_from([0, 1, 2]), max_size=60).map(lambda v: np.array(v, dtype=np.uint8)),
    ),
    min_size=1,
    max_size=120,
)


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=conversation_rows, files=st.integers(1, 3))
def test_stats_equal_the_row_by_row_oracle(tmp_path_factory, rows, files):
    directory = tmp_path_factory.mktemp("tokenized")
    paths = []
    for i in range(files):  # several shards, some maybe empty
        paths.append(directory / f"synth_{i:02d}.parquet")
        write_rows(paths[-1], rows[i::files])
    assert computed(paths) == oracle(rows)


def test_no_rows_gives_empty_stats(tmp_path):
    write_rows(tmp_path / "empty.parquet", [])
    for paths in ([], [tmp_path / "empty.parquet"]):
        stats = length_stats(paths)
        assert stats.groups.height == 0 and stats.overall == {"rows": 0, **dict.fromkeys(STAT_COLUMNS)}
        assert markdown_table(stats).splitlines()[-1].startswith("| all | all | 0 | - |")


def test_the_sample_against_the_oracle_and_the_manifest(built_sample):
    instance, layout, _ = built_sample
    paths = layout.data_layout()
    files = [paths.stage_output("synth_tokenized", p.stem) for p in sorted(SAMPLE_RAW_DIR.glob("*.parquet"))]
    rows = []
    for path in files:
        table = pq.read_table(path, columns=["language", "exercise", "span_id"])
        spans = [np.array(v, dtype=np.uint8) for v in table.column("span_id").to_pylist()]
        rows.extend(zip(table.column("language").to_pylist(), table.column("exercise").to_pylist(), spans))
    found = computed(files)  # from the row sizes written with each file
    assert all(rows_summary_path(path).is_file() for path in files)
    assert found == oracle(rows) and found[ALL]["rows"] == 1153
    # every analysis / final label position of the written dataset is one conversation's
    totals = json.loads(paths.megatron_manifest().read_text())["totals"]["span_tokens"]
    assert sum(int(np.count_nonzero(s == constants.SPAN_ANALYSIS)) for *_, s in rows) == totals["analysis"]
    metadata = instance.get_latest_materialization_event(
        dg.AssetKey("synth_kd_v1_manifest")
    ).asset_materialization.metadata
    assert {k: metadata[k].value for k in STAT_COLUMNS} == {k: found[ALL][k] for k in STAT_COLUMNS}
    table = metadata["span_lengths"].value
    assert table.splitlines()[-1].startswith("| all | all | 1153 |") and "| en | memorization |" in table


def test_the_row_sizes_written_with_synth_tokenized_are_its_rows(built_sample, tmp_path):
    """Each synth_tokenized shard's row sizes (`<key>.rows.parquet`, written with it) are, row for row, its
    synth_id, language, exercise, token count and analysis / final label positions; the quota plan's rows and the
    length statistics read from them are those the token lists give (the same files copied without them); once
    the shard's bytes change, its row sizes are no longer read."""
    _, layout, _ = built_sample
    paths = layout.data_layout()
    files = [paths.stage_output("synth_tokenized", p.stem) for p in sorted(SAMPLE_RAW_DIR.glob("*.parquet"))]
    copies = []
    for path in files:
        sizes = pq.read_table(rows_summary_path(path))
        assert sizes.schema == TOKENIZED_ROWS_SCHEMA and sizes.num_rows > 0
        table = pq.read_table(path)
        for column in ("synth_id", "language", "exercise"):
            assert sizes[column].to_pylist() == table[column].to_pylist()
        assert sizes["tokens"].to_pylist() == [len(tokens) for tokens in table["tokens"].to_pylist()]
        spans = [np.array(v, dtype=np.uint8) for v in table["span_id"].to_pylist()]
        assert sizes["analysis_tokens"].to_pylist() == [int((s == constants.SPAN_ANALYSIS).sum()) for s in spans]
        assert sizes["final_tokens"].to_pylist() == [int((s == constants.SPAN_FINAL).sum()) for s in spans]
        copies.append(tmp_path / path.name)
        shutil.copy(path, copies[-1])
    assert not any(rows_summary_path(copy).exists() for copy in copies)
    assert all(current_row_sizes(path) == rows_summary_path(path) for path in files)
    assert quota_rows_of(files) == quota_rows_of(copies)
    assert computed(files) == computed(copies)
    # a shard replaced after its row sizes were written (one row fewer): they no longer describe it, and are not read
    edited = tmp_path / "edited" / files[0].name
    edited.parent.mkdir()
    shutil.copy(rows_summary_path(files[0]), rows_summary_path(edited))
    pq.write_table(pq.read_table(files[0]).slice(1), edited)
    assert current_row_sizes(edited) is None
    assert quota_rows_of([edited]) == quota_rows_of(files[:1])[1:]
