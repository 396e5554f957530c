"""The valuation features of the pool (docs/distillation.md#valuation-features), per shard: the prompt-only features
always, the teacher / student features when the `valuation` resource names checkpoints (core/valuation.py; the models
run in synthkd_training.valuation)."""

from functools import partial

import dagster as dg

from synthkd_assets.core.inventory import shard_index_from_name
from synthkd_assets.core.valuation import ModelFeatures, checkpoint_problem, checkpoint_sha256, write_valuation_shard
from synthkd_assets.defs.assets import shard_step, synth_tokenized
from synthkd_assets.defs.checks import rows_accounted_result
from synthkd_assets.defs.jobs import launch_sequence
from synthkd_assets.defs.metadata import content_version, files_metadata, report_metadata, table_definition_metadata
from synthkd_assets.defs.pool import synth_pool
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout, ValuationModelsResource
from synthkd_assets.defs.upstream import require_upstream, stage_files
from synthkd_contract.schemas import VALUATION_SCHEMA


def model_features(valuation: ValuationModelsResource) -> ModelFeatures | None:
    """The model feature function of the configured checkpoints, or None when no teacher is configured."""
    problem = checkpoint_problem(valuation.teacher_checkpoint, valuation.student_checkpoint)
    if problem is not None:
        raise dg.Failure(problem)
    if valuation.teacher_checkpoint is None:
        return None
    # deferred: synthkd_training imports torch and megatron-core, which a build process without models never
    # loads (tests/test_imports.py lists this import as the one deliberate exception)
    from synthkd_training.valuation import checkpoint_window_features

    return partial(
        checkpoint_window_features,
        valuation.teacher_checkpoint,
        valuation.student_checkpoint,
        window=valuation.window,
        batch_size=valuation.batch_size,
        device=valuation.device,
    )


@shard_step(
    [synth_pool, synth_tokenized],
    {"parquet", "polars", "pytorch"},
    "pool",
    "pool",
    table_definition_metadata(VALUATION_SCHEMA),
)
def synth_valuation_features(
    context: dg.AssetExecutionContext,
    layout: SynthKDLayout,
    build: SynthKDBuildConfig,
    valuation: ValuationModelsResource,
) -> dg.MaterializeResult:
    """Valuation features (docs/distillation.md#valuation-features) of this shard's pool rows, keyed by pool `id`:
    prompt tokens, skill / ctx bucket tags, counts of lexical markers in the user prompt (constraints, enumerations,
    code fences, equations), and over the first `window` tokens after the prompt the teacher's entropy and top-1 - top-2
    margin and the student-teacher KL, null unless the valuation resource names a teacher (and student)
    checkpoint."""
    paths = layout.data_layout(build.smoke)
    key = context.partition_key
    shard_index = shard_index_from_name(key)
    part = paths.pool_part(shard_index)
    if not part.is_file():
        raise dg.Failure(
            f"synth_valuation_features partition {key!r} needs synth_pool first ({part} missing). Materialize "
            "the graph in order:\n  " + "\n  ".join(launch_sequence(key)) + "\nor build with ./scripts/build.sh"
        )
    model = model_features(valuation)
    if model is not None:
        require_upstream(paths, "synth_valuation_features", key, "synth_tokenized")
    tokenized = stage_files(paths, "synth_tokenized", key)[0]
    out = paths.valuation_part(shard_index)
    result = write_valuation_shard(part, tokenized, out, key, model)
    checkpoints = {
        f"{role}_checkpoint_sha256": checkpoint_sha256(path)
        for role, path in (("teacher", valuation.teacher_checkpoint), ("student", valuation.student_checkpoint))
        if path is not None
    }
    metadata = {
        **report_metadata(result.report.to_dict(), "synth_valuation_features"),
        **files_metadata([out]),
        **result.summary,
        "model_features": result.model_features,
        "window": valuation.window,
        **checkpoints,
    }
    return dg.MaterializeResult(
        metadata=metadata,
        data_version=content_version(metadata),
        check_results=[rows_accounted_result(result.report)],
    )
