"""A shard whose steps write no row says why: its input's rows and each step's drops by reason, in step order."""

from __future__ import annotations

from synthkd_assets.core.report import why_shard_is_empty


def _report(rows_in: int, rows_out: int, **dropped: int) -> dict:
    return {"rows_in": rows_in, "rows_out": rows_out, "dropped": dropped}


def test_a_shard_that_wrote_rows_is_not_empty():
    assert why_shard_is_empty({"synth_harmony": _report(6, 6), "synth_kd_v1": _report(6, 1)}) is None
    assert why_shard_is_empty({}) is None


def test_every_step_that_dropped_rows_is_named_with_its_reasons_in_order():
    reports = {
        "synth_harmony": _report(6, 4, no_reference_answer=2),
        "synth_filtered": _report(4, 1, result_failed_after_max_attempts=2, empty_answer=1),
        "synth_sampled": _report(1, 0, sampled_out_memorization=1, heldout=0),
        "synth_tokenized": _report(0, 0),
    }
    assert why_shard_is_empty(reports) == (
        "all 6 input rows were dropped: synth_harmony dropped 2 (no_reference_answer 2); synth_filtered dropped 3 "
        "(empty_answer 1, result_failed_after_max_attempts 2); synth_sampled dropped 1 (sampled_out_memorization 1)"
    )


def test_an_input_without_rows_says_so():
    assert why_shard_is_empty({"synth_harmony": _report(0, 0), "synth_kd_v1": _report(0, 0)}) == (
        "its input has no rows (synth_harmony read 0)"
    )
