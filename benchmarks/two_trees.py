"""What the benchmarks that measure this tree against a baseline tree share (`quota_plan.py`, `clustering.py`,
`candidate_pairs.py`): each measurement a child process running the benchmark's own `--child` with one tree's
code, its peak memory read from the kernel, the figures as min / median."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path


def status_bytes(field: str) -> int:
    """A byte count of this process's /proc/self/status (`VmRSS:`, `VmHWM:`)."""
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(field))


def start_peak_window() -> int:
    """Reset this process's high-water mark; returns its resident bytes now (what `peak_mib_since` subtracts)."""
    Path("/proc/self/clear_refs").write_text("5")
    return status_bytes("VmRSS:")


def peak_mib_since(start_bytes: int) -> float:
    """This process's peak resident MiB above `start_bytes` (`start_peak_window`)."""
    return (status_bytes("VmHWM:") - start_bytes) / 2**20


def measure_child(script: str, tree: Path, directory: Path, *extra: str) -> dict:
    """Run `script --child TREE DIR [extra]` in a new process; returns the JSON of its last line."""
    command = [sys.executable, script, "--child", str(tree), str(directory), *extra]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def min_median(values: list[float], digits: int = 2) -> str:
    """`min / median` of repeated measurements."""
    return f"{min(values):.{digits}f} / {statistics.median(values):.{digits}f}"


REPEATS = 3  # measurements of each tree, alternately


def two_tree_arguments(description: str, rows: int, files: int) -> argparse.ArgumentParser:
    """The options every two-tree benchmark takes: --rows, --files, --repeats, --baseline-tree, --quick (200,000
    rows, one repeat), and the hidden --child TREE DIR."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=rows)
    parser.add_argument("--files", type=int, default=files)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--baseline-tree", type=Path, help="another checkout, measured alternately with this one")
    parser.add_argument("--quick", action="store_true", help="200,000 rows, one repeat")
    parser.add_argument("--child", nargs=2, metavar=("TREE", "DIR"), help=argparse.SUPPRESS)
    return parser
