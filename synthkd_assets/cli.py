"""scripts/build.sh's commands. `build` is the build on this machine: every pass of defs/passes.py through
`build_all`, the shard passes' runs in worker processes on every core, every run recorded in $DAGSTER_HOME's
instance; one console line per pass and shard, Dagster's own lines in the build log, on a failure what failed
and why, then the datasets' summaries. The helpers list registered shard partitions, print one progress line
per shard step, print build summaries, take the data root's build lock, say why a build failed, say where files
of the build live (the script asks the layout instead of spelling paths out) and write the local instance's
dagster.yaml."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

import dagster as dg

from synthkd_assets.core.build_summary import PlanKeeps, StepDrops, read_plan_keeps, read_step_drops
from synthkd_assets.core.buildlock import BuildLockHeld, build_lock, checked_lock_path
from synthkd_assets.core.inventory import shard_index_from_name
from synthkd_assets.core.layout import DataLayout
from synthkd_assets.core.ownership import OutputPathError
from synthkd_assets.core.parallel import watch_stop_signals
from synthkd_assets.core.valuation import checkpoint_problem
from synthkd_assets.defs.build import BuildProgress
from synthkd_assets.defs.instances import build_logs_dir, ensure_instance_yaml, instance_home, is_repository_home
from synthkd_assets.defs.jobs import PASS_JOBS, smoke_run_tags
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.passes import Pass, build_passes
from synthkd_assets.defs.resources import (
    BUILD_KEY,
    STUDENT_CHECKPOINT_ENV,
    TEACHER_CHECKPOINT_ENV,
    SynthKDBuildConfig,
    SynthKDLayout,
    ValuationModelsResource,
    resources_run_config,
    synthkd_resources,
)
from synthkd_assets.launch import (
    BUILD_TAG,
    DEAD_BUILD_GRACE_SECONDS,
    STOP_GRACE_SECONDS,
    LaunchFailed,
    PassFailed,
    launch_build,
    launch_services,
    new_build_tags,
    stop_runs,
    stoppable_runs_of_build,
    stoppable_runs_of_dead_builds,
)
from synthkd_contract import constants
from synthkd_contract.settings import CLUSTER_EXECUTORS, SettingError, Settings

PASS_JOB_NAMES = {name: job.name for name, job in PASS_JOBS.items()}
STOPPED_BUILD = "its queued runs canceled, its running ones stopped; run build.sh again"

NO_PARTITIONS_HINT = (
    "no synth_shards partitions are registered in this Dagster instance (DAGSTER_HOME={home}): register one per "
    "raw file with `dg launch --job synth_inventory_job` (or start `dg dev`: its sensor registers them)"
)
NO_DAGSTER_HOME_HINT = (
    "DAGSTER_HOME is not an instance directory ({home}): partitions live in a Dagster instance; export "
    "DAGSTER_HOME as for `dg launch` (build.sh's default: the repository root)"
)
NOT_A_CLUSTER_INSTANCE = (
    "SYNTHKD_EXECUTOR={executor} needs the cluster's instance: export DAGSTER_HOME as a directory holding "
    "deploy/cluster/dagster.yaml (PostgreSQL, not this repository's sqlite)"
)
SMOKE_ON_A_CLUSTER = (
    "SYNTHKD_EXECUTOR={executor}: a smoke build runs on this machine, in the smoke builds' own instance "
    "(docs/design.md, Smoke build); unset SYNTHKD_EXECUTOR for it"
)


def list_partitions() -> list[str]:
    with dg.DagsterInstance.get() as instance:
        return list(instance.get_dynamic_partitions(SYNTH_SHARDS.name))


def step_report(layout: DataLayout, step: str, partition: str) -> dict | None:
    """The report a shard step published for `partition` (None if it has not been built)."""
    if step == "synth_kd_v1":
        path = layout.shard_record(shard_index_from_name(partition))
    elif step == "synth_distill":
        path = layout.distill_record(partition)
    elif step == "synth_pool":
        path = layout.pool_record(shard_index_from_name(partition))
    else:
        path = layout.stage_report(step, partition)
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    return record.get("report", record)


def progress_line(layout: DataLayout, steps: list[str], partition: str) -> str:
    """What the steps did to one shard: rows into the first, then rows out of each step with its drops, e.g.
    `726 rows in -> synth_sampled 573 (153 dropped), synth_tokenized 573, synth_kd_v1 573, synth_distill 573`."""
    reports = {step: step_report(layout, step, partition) for step in steps}
    built = {step: r for step, r in reports.items() if r is not None}
    if not built:
        return "no report written"
    first = next(iter(built.values()))
    outs = []
    for step, report in built.items():
        dropped = sum(report["dropped"].values())
        outs.append(f"{step} {report['rows_out']}" + (f" ({dropped} dropped)" if dropped else ""))
    return f"{first['rows_in']} rows in -> " + ", ".join(outs)


def drops_line(totals: dict) -> str:
    """Every drop reason of a dataset's steps with its count (the rows in minus the rows written, explained)."""
    return "drops by reason: " + (", ".join(f"{k}={v}" for k, v in totals["dropped"].items()) or "none")


def summary_lines(manifest: dict) -> list[str]:
    if manifest.get("dataset") == constants.DISTILL_DATASET_NAME:
        return distill_summary_lines(manifest)
    if "quota" in manifest:
        return pool_summary_lines(manifest)
    totals = manifest["totals"]
    lines = [
        f"{manifest['dataset']}: {len(manifest['shards'])} shards, config {manifest['config_hash'][:12]}, git "
        f"{manifest['git_sha'][:12]}",
        f"rows in: {totals['rows_in']}   rows written: {totals['rows_out']}",
        "sequences per split: " + ", ".join(f"{s}={totals['sequences'].get(s, 0)}" for s in constants.SPLITS),
        "tokens per span: "
        + ", ".join(f"{n}={totals['span_tokens'].get(n, 0)}" for n in constants.SPAN_NAMES.values()),
        drops_line(totals),
        "sanitized: " + (", ".join(f"{k}={v}" for k, v in totals["sanitized"].items()) or "none"),
        *source_lines(manifest),
        f"bytes: {totals['bytes']} (the trio files)",
    ]
    return lines


def source_lines(manifest: dict) -> list[str]:
    """`tokens per source: synth=... (81.2%), oasst1=...` when the dataset holds anchor sources, else nothing."""
    if "sources" not in manifest:
        return []
    entries = manifest["sources"].items()
    return ["tokens per source: " + ", ".join(f"{s}={e['tokens']} ({100 * e['token_share']:.1f}%)" for s, e in entries)]


def split_lengths_line(split: str, lengths: dict) -> str:
    """A split's token-length percentiles; a split with no rows (a small build's validation split can get none of
    its 1% share) says so instead of listing None five times."""
    if lengths.get("max") is None:
        return f"{split} tokens: no rows"
    return f"{split} tokens: " + " ".join(f"{k}={lengths[k]}" for k in ("min", "p50", "p90", "p99", "max"))


def distill_summary_lines(manifest: dict) -> list[str]:
    totals, sampling = manifest["totals"], manifest["sampling"]
    before, achieved = sampling["before"], sampling["achieved_after"]
    lengths = manifest["token_lengths"]
    return [
        f"{manifest['name']}: {len(manifest['shards'])} shards, config {manifest['config_hash'][:12]}, git "
        f"{manifest['git_sha'][:12]}",
        f"rows in: {totals['rows_in']}   rows written: {totals['rows_out']} ("
        + ", ".join(f"{s}={totals['rows_per_split'].get(s, 0)}" for s in constants.DISTILL_SPLITS)
        + ")",
        "sampling rates: "
        + ", ".join(f"{rule}={rate:.4g}" for rule, rate in sampling["rates"].items())
        + (
            " (targets met in expectation)"
            if sampling["feasible"]
            else f" (targets NOT reachable: {sampling['notes']})"
        ),
        f"mix before -> after: memorization {100 * before['memorization_share']:.1f}% -> "
        f"{100 * achieved['memorization_share']:.1f}%, "
        f"non-English {100 * before['non_english_share']:.1f}% -> {100 * achieved['non_english_share']:.1f}%",
        *(split_lengths_line(split, lengths[split]) for split in constants.DISTILL_SPLITS),
        drops_line(totals),
        *source_lines(manifest),
        f"render failures logged: {manifest['encoding_errors_log']['records']} "
        f"({manifest['encoding_errors_log']['path']})",
        f"bytes: {totals['bytes']}",
    ]


def pool_summary_lines(manifest: dict) -> list[str]:
    """The pool: rows, tokens per skill bucket (target share vs achieved), per ctx bucket, what the quota could not
    meet, and each curriculum stage (written, or why not; epochs needed)."""
    totals, quota = manifest["totals"], manifest["quota"]
    grid = quota["achieved"]["tokens"]
    skill = {b: sum(cells.values()) for b, cells in grid.items()}
    ctx: dict[str, int] = {}
    for cells in grid.values():
        for c, n in cells.items():
            ctx[c] = ctx.get(c, 0) + n
    shares = quota["targets"]["shares"]
    mix = manifest.get("source_mix")
    # with anchor sources the skill quota is SYNTH's, while the achieved shares count every source's tokens
    skill_label = "SYNTH's quota target -> achieved, all sources" if mix else "target share -> achieved"
    lines = [
        f"{manifest['dataset']}: {len(manifest['shards'])} shards, config {manifest['config_hash'][:12]}, git "
        f"{manifest['git_sha'][:12]}",
        f"rows in: {totals['rows_in']}   rows written: {totals['rows_out']} ("
        + ", ".join(f"{s}={totals['sequences'].get(s, 0)}" for s in constants.SPLITS)
        + ")",
        f"tokens per skill bucket ({skill_label}): "
        + ", ".join(
            f"{b}={n} ({100 * shares.get(b, 0):.1f}% -> {100 * quota['achieved_skill_share'][b]:.1f}%)"
            for b, n in skill.items()
        ),
        "tokens per ctx bucket: " + ", ".join(f"{c}={n}" for c, n in ctx.items()),
        ("SYNTH's quota: " if mix else "quota: ")
        + ("every target met" if quota["feasible"] else "; ".join(i["reason"] for i in quota["infeasible"])),
        drops_line(totals),
    ]
    if mix:
        lines.append(
            "tokens per source group (target share -> achieved): "
            + ", ".join(
                f"{g}={e['achieved_tokens']:.0f} ({100 * e['target_share']:.1f}% -> {100 * e['achieved_share']:.1f}%)"
                for g, e in mix["groups"].items()
            )
        )
        capped = [(s, e) for s, e in mix["sources"].items() if e["cap"] is not None and e["achieved_tokens"]]
        if capped:
            shares = (
                f"{s}={e['achieved_tokens']:.0f} ({e['achieved_share']:.2%} "
                f"{'<=' if e['achieved_share'] <= e['cap'] else '>'} cap {e['cap']:.2%})"
                for s, e in capped
            )
            lines.append("capped sources (achieved share of the pool's tokens): " + ", ".join(shares))
        why = "; ".join(i["reason"] for i in mix["infeasible"])
        lines.append("source mix: " + ("every target met" if mix["feasible"] else why))
    for stage in manifest["curriculum"]:
        epochs = ", ".join(
            f"{c} {entry['epochs_needed']:.0f} epochs" for c, entry in stage["ctx"].items() if entry["epochs_needed"]
        )
        state = f"written ({epochs})" if stage["per_split_data_args"] else f"not written: {stage['reason']}"
        lines.append(f"curriculum {stage['stage']} (seq {stage['seq_length']}, {stage['tokens']:,} tokens): {state}")
    return [*lines, f"bytes: {totals['bytes']}"]


def share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def filter_lines(step: StepDrops) -> list[str]:
    """The 001 quality filters over every shard: rows in and dropped, then per exercise (most rows first) its rows
    in and drops by each filter reason."""
    lines = [
        f"quality filters (synth_filtered): {step.rows_in} rows in, {step.rows_dropped} dropped "
        f"({share(step.rows_dropped, step.rows_in)}); per exercise:"
    ]
    if step.unattributed:  # an exercise's rows in would miss its drops
        lines[0] = lines[0].removesuffix("; per exercise:")
        lines.append(
            f"  per exercise: not recorded for {step.unattributed} dropped rows (reports written before drops were "
            "counted per exercise: rebuild to see them)"
        )
    for entry in [] if step.unattributed else step.exercises:
        lines.append(
            f"  {entry.exercise}: {entry.rows_in} in, {entry.rows_dropped} dropped "
            f"({share(entry.rows_dropped, entry.rows_in)}): " + ", ".join(f"{k}={v}" for k, v in entry.dropped.items())
        )
    if step.missing:
        lines.append("  no synth_filtered report for: " + ", ".join(step.missing))
    return lines


def plan_lines(plan: PlanKeeps | None) -> list[str]:
    """What the sampling plan keeps, as written in its plan.json: the memorization keep rate (and any other rate
    under 1), the rows it keeps of those it saw (expected: after the filters and the near-duplicate clusters), the
    memorization and non-English shares before -> after sampling, and why the targets are not met when not."""
    if plan is None:
        return ["sampling plan (synth_sampling_plan): none written"]
    others = [f"{rule}={rate:.4g}" for rule, rate in plan.rates.items() if rule != "memorization" and rate < 1]
    lines = [
        f"sampling plan (synth_sampling_plan): memorization keep rate {plan.memorization_keep_rate:.4g}"
        + (f" ({', '.join(others)})" if others else "")
        + f", rows kept {plan.rows_kept:.0f} / {plan.rows_seen:.0f} ({share(plan.rows_kept, plan.rows_seen)}, "
        "expected)",
        f"  mix before -> after sampling: memorization {100 * plan.memorization_share[0]:.1f}% -> "
        f"{100 * plan.memorization_share[1]:.1f}%, non-English {100 * plan.non_english_share[0]:.1f}% -> "
        f"{100 * plan.non_english_share[1]:.1f}%",
    ]
    if not plan.feasible:
        lines.append("  targets NOT met in expectation: " + "; ".join(plan.notes))
    return lines


def manifest_partitions(manifests: list[dict]) -> list[str]:
    """The shard partitions the manifests list, in their order."""
    return list(dict.fromkeys(record["partition"] for manifest in manifests for record in manifest["shards"]))


def print_summaries(manifests: list[Path], out: TextIO = sys.stdout, build: DataLayout | None = None) -> None:
    """Each manifest's summary; with `build` (the layout the build wrote under), first the quality filters' drops
    per exercise over the manifests' shards and what the sampling plan keeps."""
    loaded = [json.loads(manifest.read_text()) for manifest in manifests]
    if build is not None:
        lines = filter_lines(read_step_drops(build, manifest_partitions(loaded))) + plan_lines(read_plan_keeps(build))
        print("\n".join(lines), file=out, flush=True)
    for manifest in loaded:
        print("\n".join(summary_lines(manifest)), file=out, flush=True)


class ConsoleProgress(BuildProgress):
    """The build's lines on the console: `<pass>: <steps> (Ns)` for a pass over every shard; for a shard pass
    `<pass> pass over N shards: <steps>`, `  <pass> <shard> (i/N): <progress line> (Ns)` per shard as each
    finishes, then `<pass> pass done (Ns)`. Each pass is also marked in the log (`=== <pass>`)."""

    def __init__(self, out: TextIO, layout: DataLayout):
        self.out, self.layout = out, layout
        self.current: Pass | None = None
        self.created = time.monotonic()  # what a failure before any pass counts from
        self.started: dict[str, float] = {}  # by pass name: when it began
        self.index: dict[str, int] = {}

    def pass_started(self, build_pass: Pass, keys) -> None:
        self.current, self.started[build_pass.name] = build_pass, time.monotonic()
        if build_pass.per_shard:
            self.index = {key: i for i, key in enumerate(keys, 1)}
        print(f"=== {build_pass.name}: {','.join(build_pass.steps)}", file=sys.stderr, flush=True)
        if build_pass.per_shard:
            self.say(f"{build_pass.name} pass over {len(keys)} shards: {','.join(build_pass.steps)}")

    def shard_done(self, build_pass: Pass, key: str, seconds: float) -> None:
        line = progress_line(self.layout, list(build_pass.steps), key)
        self.say(f"  {build_pass.name} {key} ({self.index[key]}/{len(self.index)}): {line} ({seconds:.0f}s)")

    def warned(self, build_pass: Pass, warnings: Sequence[str]) -> None:
        for warning in warnings:
            self.say(f"  warning: {warning}")

    def pass_done(self, build_pass: Pass, seconds: float) -> None:
        if build_pass.per_shard:
            self.say(f"{build_pass.name} pass done ({seconds:.0f}s)")
        else:
            self.say(f"{build_pass.name}: {','.join(build_pass.steps)} ({seconds:.0f}s)")

    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def failing(self, partition: str | None, build_pass: Pass | None = None) -> str:
        """`<pass> [<shard>] (after Ns)`: what failed (`build_pass`, when known), else the pass started last."""
        failed = build_pass or self.current
        name = failed.name if failed else "build"
        started = self.started.get(name, self.created)
        return f"{name}{f' {partition}' if partition else ''} (after {time.monotonic() - started:.0f}s)"


LOW_DISK_BYTES = 256 * 2**20  # free space under which a failed build says the disk is (nearly) full


def low_disk_lines(places: dict[str, Path], minimum: int = LOW_DISK_BYTES) -> list[str]:
    """For a failed build: each of `places` (what it is -> a path) whose filesystem has under `minimum` bytes
    free, said plainly: a full disk shows up as SQLite's "disk I/O error" or an ENOSPC far from its cause."""
    lines = []
    for what, path in places.items():
        existing = next((p for p in (path, *path.parents) if p.exists()), None)
        if existing is None:
            continue
        free = shutil.disk_usage(existing).free
        if free < minimum:
            lines.append(f"disk nearly full: {free / 2**20:.0f} MiB free on the filesystem of {path} ({what})")
    return lines


def run_build(smoke: bool, log: Path | None) -> int:
    """Every pass of the build on $SYNTHKD_RAW_DIR / $SYNTHKD_DATA_DIR, launched through $DAGSTER_HOME's instance
    (synthkd_assets/launch.py). The console gets the pass and shard lines, then each dataset's summary; when a
    run or a blocking check fails, what failed and why (exit 1); with `log`, every other line (Dagster's, the
    daemon's, warnings) is appended there instead. One build per data root (75 when another holds it). SIGINT,
    SIGTERM and SIGHUP stop its runs through the instance and exit 128 + the signal."""
    out, err = os.fdopen(os.dup(1), "w"), os.fdopen(os.dup(2), "w")
    if log is not None:
        appended = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(appended, 1)
        os.dup2(appended, 2)
        os.close(appended)
    stopped = watch_stop_signals(signal.default_int_handler)
    settings = Settings.read()
    layout = SynthKDLayout.from_settings_now(settings)
    build = SynthKDBuildConfig.from_settings(settings, smoke=smoke)
    progress = ConsoleProgress(out, DataLayout.from_settings(settings, smoke))
    tail = [f"full log: {log}"] if log is not None else []
    disk = {"the data root": progress.layout.data_root}
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        print(NO_DAGSTER_HOME_HINT.format(home=home), file=err)
        err.flush()
        return 2
    disk["$DAGSTER_HOME, the Dagster instance"] = Path(home)
    models = ValuationModelsResource.from_settings_now(settings)
    problem = checkpoint_problem(models.teacher_checkpoint, models.student_checkpoint)
    if problem is not None:  # found now, not after every shard's scan and build, in the pool pass
        variables = f"${TEACHER_CHECKPOINT_ENV}, ${STUDENT_CHECKPOINT_ENV}"
        print(f"FAILED before the build started ({variables}): {problem}", file=err)
        err.flush()
        return 1
    resources = synthkd_resources(layout, build)
    run_config = {"resources": resources_run_config(resources)}
    tags = new_build_tags(progress.layout.data_root, smoke_run_tags(run_config))
    instance = dg.DagsterInstance.get()
    sys.stdout.flush()
    logfile = sys.stdout if log is not None else None
    try:
        with instance, build_lock(layout.data_layout().build_lock()):
            try:
                stop_runs(instance, stoppable_runs_of_dead_builds(instance, tags), DEAD_BUILD_GRACE_SECONDS)
                with launch_services(instance, logfile) as (server, daemon):
                    try:
                        passes = build_passes()
                        launch_build(instance, run_config, tags, passes, PASS_JOB_NAMES, progress, server, daemon)
                    except BaseException:
                        server.close()  # a launch still in flight lands first: its run is then stopped too
                        stop_runs(instance, stoppable_runs_of_build(instance, tags[BUILD_TAG]), STOP_GRACE_SECONDS)
                        raise
            except (PassFailed, LaunchFailed) as error:
                if isinstance(error, PassFailed):
                    failing, lines = progress.failing(error.partition, error.build_pass), error.lines
                else:
                    failing, lines = progress.failing(None), [f"Dagster refused the launch: {error}"]
                failed = [f"FAILED: {failing}", *lines, *low_disk_lines(disk), *tail]
                print("\n".join(failed), file=err)
                return 1
            built = progress.layout
            print(file=out)
            print_summaries([built.megatron_manifest(), built.distill_manifest(), built.pool_manifest()], out, built)
    except BuildLockHeld as error:
        print(error, file=err)
        return 75
    except BaseException as error:
        signum = stopped()
        if signum or isinstance(error, KeyboardInterrupt):
            name = signal.Signals(signum or signal.SIGINT).name
            print(f"build stopped by {name}: {STOPPED_BUILD}", file=err)
            return 128 + (signum or signal.SIGINT)
        traceback.print_exc()  # to the log
        failed = [f"FAILED: {progress.failing(None)}: {type(error).__name__}: {error}", *low_disk_lines(disk), *tail]
        print("\n".join(failed), file=err)
        return 1
    finally:
        out.flush()
        err.flush()
    return 0


# what `path <name>` prints: the files scripts/build.sh needs, from the layout of this environment's roots
def build_run_config(settings: Settings, smoke: bool) -> dict:
    """`dg launch --config-json` of a build: the build resource's fields set by $SYNTHKD_BUILD_CONFIG (validated)
    and `smoke`, as one resource config (Dagster replaces a resource's whole config); {} when none is set."""
    SynthKDBuildConfig.from_settings(settings, smoke=smoke)  # refuses a bad variable, naming it
    fields = json.loads(settings.build_config or "{}")
    if smoke:
        fields["smoke"] = True
    return {"resources": {BUILD_KEY: {"config": fields}}} if fields else {}


def prepare_build(environ: Mapping[str, str], smoke: bool) -> tuple[Path, Path, Path]:
    """What build.sh checks before anything is written, in one process: the build resource's config
    ($SYNTHKD_BUILD_CONFIG), the roots (overlapping, a linked lock), an executor that needs the cluster's
    instance; then the instance directory the build records into (a smoke build's own), its dagster.yaml
    written when missing, and its build logs' directory (created).

    Returns:
        The DAGSTER_HOME to export, the build logs' directory and the raw root.

    Raises:
        ValueError: a setting or a root is refused (SettingError, OutputPathError), or the executor needs
            another instance; the message says which and why.
    """
    settings = Settings.read(environ)
    build_run_config(settings, smoke)
    layout = DataLayout.from_settings(settings, smoke)
    checked_lock_path(layout.build_lock())
    home = instance_home(environ.get("DAGSTER_HOME"), smoke)
    if settings.executor in CLUSTER_EXECUTORS:
        if smoke:
            raise SettingError(SMOKE_ON_A_CLUSTER.format(executor=settings.executor))
        if is_repository_home(home) or not (home / "dagster.yaml").is_file():
            raise SettingError(NOT_A_CLUSTER_INSTANCE.format(executor=settings.executor))
    ensure_instance_yaml(home, smoke)
    logs = build_logs_dir(home)
    logs.mkdir(parents=True, exist_ok=True)
    return home, logs, layout.raw_root


PATHS = {
    "raw-root": lambda layout: layout.raw_root,
    "build-lock": lambda layout: checked_lock_path(layout.build_lock()),
    "megatron-manifest": DataLayout.megatron_manifest,
    "distill-manifest": DataLayout.distill_manifest,
    "pool-manifest": DataLayout.pool_manifest,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m synthkd_assets.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    partitions = sub.add_parser("partitions", help="registered synth_shards partition keys, one per line")
    partitions.add_argument("--null", action="store_true", help="end each key with NUL instead (for xargs -0)")
    summary = sub.add_parser("summary", help="print the summary of a built dataset manifest")
    summary.add_argument(
        "--manifest",
        type=Path,
        action="append",
        help="repeatable; default: the synth_kd_v1 manifest of $SYNTHKD_DATA_DIR",
    )
    summary.add_argument(
        "--build",
        action="store_true",
        help="first the quality filters' drops per exercise and the sampling plan of the build under "
        "$SYNTHKD_DATA_DIR (as the build prints them)",
    )
    summary.add_argument("--smoke", action="store_true", help="with --build: the smoke build's")
    path = sub.add_parser("path", help="where files of the build on $SYNTHKD_RAW_DIR / $SYNTHKD_DATA_DIR live")
    path.add_argument("names", nargs="+", choices=sorted(PATHS), metavar="name", help=", ".join(sorted(PATHS)))
    path.add_argument("--smoke", action="store_true")
    run = sub.add_parser("build", help="build every pass, shard runs on every core (what scripts/build.sh runs)")
    run.add_argument("--smoke", action="store_true")
    run.add_argument("--log", type=Path, help="append Dagster's log lines and every other output line here")
    run_config = sub.add_parser("run-config", help="the build resource's run config of $SYNTHKD_BUILD_CONFIG, as JSON")
    run_config.add_argument("--smoke", action="store_true")
    prepare = sub.add_parser(
        "prepare",
        help="what scripts/build.sh checks before it builds; prints the DAGSTER_HOME the build records into "
        "(its dagster.yaml written when missing) and the raw root",
    )
    prepare.add_argument("--smoke", action="store_true", help="the smoke build's (its own instance)")
    home = sub.add_parser(
        "instance-home",
        help="the DAGSTER_HOME of the build's instance ($DAGSTER_HOME, default the repository root), its "
        "dagster.yaml written when missing (what scripts/ui.sh serves)",
    )
    home.add_argument("--smoke", action="store_true", help="the smoke builds' own instance")
    args = parser.parse_args(argv)
    if args.command == "partitions":
        home = os.environ.get("DAGSTER_HOME")
        if not home or not Path(home).is_dir():
            print(NO_DAGSTER_HOME_HINT.format(home=home), file=sys.stderr)
            return 2
        keys = list_partitions()
        if not keys:
            print(NO_PARTITIONS_HINT.format(home=os.environ.get("DAGSTER_HOME")), file=sys.stderr)
            return 1
        sys.stdout.write("".join(f"{key}\0" for key in keys) if args.null else "\n".join(keys) + "\n")
    elif args.command == "path":
        try:  # the roots overlap, or the lock is a link: build.sh stops here, before it writes anything
            layout = DataLayout.from_environ(os.environ, args.smoke)
            print("\n".join(str(PATHS[name](layout)) for name in args.names))
        except (SettingError, OutputPathError) as error:
            print(error, file=sys.stderr)
            return 2
    elif args.command == "run-config":
        try:
            print(json.dumps(build_run_config(Settings.read(), args.smoke)))
        except ValueError as error:  # it names the variable, the setting and why
            print(error, file=sys.stderr)
            return 2
    elif args.command == "prepare":
        try:
            prepared = prepare_build(os.environ, args.smoke)
        except (ValueError, OutputPathError) as error:  # it names the variable or the path, and why
            print(error, file=sys.stderr)
            return 2
        print("\n".join(map(str, prepared)))
    elif args.command == "instance-home":
        home = instance_home(os.environ.get("DAGSTER_HOME"), args.smoke)
        ensure_instance_yaml(home, args.smoke)
        print(home)
    elif args.command == "build":
        return run_build(args.smoke, args.log)
    else:
        layout = DataLayout.from_environ(os.environ, args.smoke)
        print_summaries(args.manifest or [layout.megatron_manifest()], build=layout if args.build else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
