"""Subprocess body for the SIGKILL test: build the whole graph for one raw directory, in-process."""

import sys

import dagster as dg

from synthkd_assets.defs.resources import SynthKDLayout
from tests.helpers import build_everything

if __name__ == "__main__":
    raw_dir, data_dir = sys.argv[1:3]
    with dg.DagsterInstance.ephemeral() as instance:
        build_everything(instance, SynthKDLayout(raw_dir=raw_dir, data_dir=data_dir))
    print("done", flush=True)
