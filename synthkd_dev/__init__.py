"""Tools for developing and testing synthkd, run from the repository root and never shipped in the wheel:
a local cluster, the sensor-tick emulator, the partition-scale scenario and the sample-data generators."""

from pathlib import Path

from synthkd_assets.core.layout import DEFAULT_RAW_DIR

REPO_ROOT = Path(__file__).resolve().parents[1]  # the checkout these tools run from
SAMPLE_RAW_DIR = REPO_ROOT / DEFAULT_RAW_DIR  # the bundled sample, wherever the command is run
SAMPLE_SOURCES_DIR = REPO_ROOT / "data" / "sample" / "sources"  # the bundled anchor-source sample (source_sample.py)
