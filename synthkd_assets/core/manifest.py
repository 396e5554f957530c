"""Provenance helpers: git SHA, config hashes, file hashes, and writing a manifest with stable bytes."""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from synthkd_assets.core.atomic import atomic_write_text


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of everything that can change the output bytes."""
    return hashlib.sha256(canonical_json(config).encode("utf-8")).hexdigest()


def inputs_fingerprint(files: Iterable[Path], config: dict[str, Any]) -> str:
    """sha256 of what identifies a computation's inputs without reading them: each file's path, size, modification
    time (ns) and inode, and the configuration it applies. Outputs are published by an atomic rename, never
    rewritten in place, so a file rebuilt since has another inode or time.

    Args:
        files: the files the computation reads.
        config: the settings it applies (JSON-serializable).

    Returns:
        A hex digest: equal for the same files, unchanged, and the same settings.

    Raises:
        FileNotFoundError: a file is missing.
    """
    stats = [(str(path), st.st_size, st.st_mtime_ns, st.st_ino) for path in files for st in [path.stat()]]
    return config_hash({"files": stats, "config": config})


@functools.cache
def git_state(repo_dir: str | None = None) -> dict[str, Any]:
    """HEAD commit and whether the work tree has uncommitted changes; 'unknown' outside a git checkout."""
    cwd = repo_dir or str(Path(__file__).resolve().parents[2])
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=cwd,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        return {"git_sha": "unknown", "git_dirty": None}
    return {"git_sha": sha, "git_dirty": dirty}


def manifest_text(manifest: dict[str, Any]) -> tuple[str, str]:
    """A manifest's text as written (sorted keys, stable bytes) and its sha256."""
    text = json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return text, hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_manifest(path: Path, manifest: dict[str, Any]) -> str:
    """Write a manifest atomically; return its sha256."""
    text, digest = manifest_text(manifest)
    atomic_write_text(path, text)
    return digest


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def sum_reports(reports: list[dict[str, Any]], key: str) -> dict[str, int]:
    """Add up one counter field (`dropped`, `span_tokens`, ...) over shard reports."""
    total: dict[str, int] = {}
    for report in reports:
        for name, count in report.get(key, {}).items():
            total[name] = total.get(name, 0) + int(count)
    return dict(sorted(total.items()))
