"""Why a build failed, in words for the console: each failing check's first problems, each failed step's error.

Every check records its problems (file names, rows, reasons) in its `problems` metadata; Dagster's own
console line only names the checks ("1 blocking asset check failed … manifest_provenance"). The launched
build (synthkd_assets/launch.py, what build.sh runs) and the in-process build (`BuildFailed`) print these.
"""

from __future__ import annotations

from collections.abc import Iterable

import dagster as dg

PROBLEM_LINES = 5  # problems printed per failing check; the rest are in its metadata (UI)


def check_failure_lines(evaluation: dg.AssetCheckEvaluation, limit: int = PROBLEM_LINES) -> list[str]:
    """`check <asset>:<name> [<partition>] failed: N problems` and the first `limit` of them."""
    problems = evaluation.metadata.get("problems")
    listed = list(problems.value) if problems is not None and isinstance(problems.value, list) else []
    count_value = evaluation.metadata.get("problem_count")
    count = int(count_value.value) if count_value is not None else len(listed)
    where = f" [{evaluation.partition}]" if evaluation.partition else ""
    lines = [f"check {evaluation.asset_key.to_user_string()}:{evaluation.check_name}{where} failed: {count} problem(s)"]
    lines += [f"  {problem}" for problem in listed[:limit]]
    if count > min(limit, len(listed)):
        lines.append(f"  … {count - min(limit, len(listed))} more in the check's `problems` metadata (Dagster UI)")
    return lines


def failed_check_lines(evaluations: Iterable[dg.AssetCheckEvaluation]) -> list[str]:
    """The problems of every failed ERROR check; a WARN check (bucket_balance) reports, it does not fail a build."""
    return [
        line
        for evaluation in evaluations
        if not evaluation.passed and evaluation.severity != dg.AssetCheckSeverity.WARN
        for line in check_failure_lines(evaluation)
    ]


def error_message(error) -> str:
    """The first line of the error a step raised, below Dagster's own wrappers ("Error occurred while executing
    op …"): e.g. `synthkd_assets.core.parquet_io.InputFileError: <file>: not a readable Parquet file (…)`. What
    caused it is left out: the project's errors name their cause (`ArrowInvalid: …`) in their own message, and
    the cause alone would not name the file."""
    while error.cause is not None and (error.cls_name or "").startswith("Dagster"):
        error = error.cause
    text = error.message.strip()
    return text.splitlines()[0] if text else error.cls_name or "unknown error"


def check_evaluations(instance: dg.DagsterInstance, run_id: str) -> list[dg.AssetCheckEvaluation]:
    """Every asset check evaluation a run recorded."""
    return [
        entry.dagster_event.event_specific_data
        for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
        if entry.dagster_event is not None
    ]


def run_failure_lines(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    """The failing checks' problems and the failed steps' errors of one run."""
    lines = failed_check_lines(check_evaluations(instance, run_id))
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
        error = entry.dagster_event.event_specific_data.error if entry.dagster_event else None
        if error is not None and "blocking asset check" not in error.message:  # those are listed above
            lines.append(f"step {entry.step_key} failed: {error_message(error)}")
    if not lines:  # failed from outside its steps (its worker died, the build stopped): why the run was failed
        lines += [entry.message for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE)]
    return lines
