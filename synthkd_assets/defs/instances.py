"""The Dagster instances a build records into: the full builds' (the repository root's dagster.yaml, or the one in
$DAGSTER_HOME) and, apart from it, the smoke builds' own, so that what the UI shows as the latest state of the
assets is always the full build's (docs/design.md, "Smoke build").

A smoke build's instance lives in the full one's storage directory, under `smoke/`: `.dagster_home/smoke/` for the
repository's instance, `$DAGSTER_HOME/smoke/` for one elsewhere. Its dagster.yaml is the repository's settings
without the storage section (it stores in itself), with the run queue told that it holds smoke builds: each
instance's queue refuses the other kind's runs (defs/run_queue.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTANCE_YAML = REPO_ROOT / "dagster.yaml"  # the repository's own instance (DAGSTER_HOME = the repository root)
# where its storage section starts: what an instance elsewhere leaves out (it stores in its own DAGSTER_HOME)
REPOSITORY_STORAGE_MARKER = "# --- storage of the repository's own instance"
REPOSITORY_STORAGE_DIR = ".dagster_home"  # the storage section's base_dir, relative to the repository root
SMOKE_INSTANCE_DIR = "smoke"  # the smoke builds' instance, inside the full one's storage directory
# the run queue's `builds` setting: which kind of build's runs an instance takes
FULL_BUILDS = "full"
SMOKE_BUILDS = "smoke"
SMOKE_INSTANCE_HEADER = (
    "# The smoke builds' Dagster instance (`./scripts/build.sh --smoke`; browse it with `./scripts/ui.sh --smoke`),\n"
    "# written by `python -m synthkd_assets.cli instance-home --smoke`: the repository's dagster.yaml without its\n"
    "# storage section (it stores here), whose run queue takes smoke builds' runs only.\n"
)


def local_instance_yaml() -> str:
    """The repository's dagster.yaml without its storage section: the instance settings for a DAGSTER_HOME
    elsewhere (scripts/build.sh writes them into one that has no dagster.yaml), which then stores in itself.

    Returns:
        The YAML text, comments kept.

    Raises:
        ValueError: dagster.yaml has no storage section marker.
    """
    text = INSTANCE_YAML.read_text()
    if REPOSITORY_STORAGE_MARKER not in text:
        raise ValueError(f"{INSTANCE_YAML}: expected a line starting {REPOSITORY_STORAGE_MARKER!r}")
    return text.split(REPOSITORY_STORAGE_MARKER, 1)[0]


def smoke_instance_yaml() -> str:
    """`local_instance_yaml` for the smoke builds' instance: its run queue's `builds` is `smoke`.

    Returns:
        The YAML text, under a header saying what it is.
    """
    config = yaml.safe_load(local_instance_yaml())
    config["run_coordinator"].setdefault("config", {})["builds"] = SMOKE_BUILDS
    return SMOKE_INSTANCE_HEADER + yaml.safe_dump(config, sort_keys=False)


def is_repository_home(home: Path) -> bool:
    """Whether `home` is the repository root, whose dagster.yaml stores under `.dagster_home/`."""
    return home.resolve() == REPO_ROOT.resolve()


def storage_dir(home: Path) -> Path:
    """Where the instance of `home` keeps its storage: `.dagster_home/` for the repository's, else `home`."""
    return home / REPOSITORY_STORAGE_DIR if is_repository_home(home) else home


def instance_home(dagster_home: str | None, smoke: bool = False) -> Path:
    """The DAGSTER_HOME of a build's instance.

    Args:
        dagster_home: $DAGSTER_HOME; unset or empty: the repository root.
        smoke: the smoke builds' instance, inside the full one's storage directory.

    Returns:
        The directory (absolute), not necessarily existing.
    """
    home = Path(dagster_home).absolute() if dagster_home else REPO_ROOT
    if not smoke:
        return home
    return storage_dir(home) / SMOKE_INSTANCE_DIR


def build_logs_dir(home: Path) -> Path:
    """Where scripts/build.sh appends Dagster's log lines: `build_logs/` in the instance's storage directory (not
    `logs/`: Dagster moves what is there, its telemetry queue)."""
    return storage_dir(home) / "build_logs"


def ensure_instance_yaml(home: Path, smoke: bool = False) -> Path:
    """Write `home`'s dagster.yaml when it has none (atomically: a stopped write leaves none); one there is kept.

    Args:
        home: an instance directory (`instance_home`); created when missing.
        smoke: write the smoke builds' settings (`smoke_instance_yaml`), else `local_instance_yaml`.

    Returns:
        The dagster.yaml path.
    """
    path = home / "dagster.yaml"
    if not path.exists():
        home.mkdir(parents=True, exist_ok=True)
        partial = home / f"dagster.yaml.partial-{os.getpid()}"
        partial.write_text(smoke_instance_yaml() if smoke else local_instance_yaml())
        partial.replace(path)
    return path
