"""Dagster conventions every asset follows: its code version, its owners, a tag naming the build pass it belongs
to (scripts/build.sh's order, defs/passes.py), so `--select 'tag:synthkd/pass=scan'` selects a pass, and its
docstring as its description."""

from collections.abc import Callable

import dagster as dg

# bump when a rule changes the bytes a step writes: Dagster then marks downstream partitions stale
# (1.1: 001 quality filters, mixture sampling plan, DistillKit output;
#  1.2: one-sided language rule, smoke reads a prefix)
CODE_VERSION = "synth_kd_v1.2"
OWNERS = ["team:synthkd"]


def pass_tags(build_pass: str) -> dict[str, str]:
    return {"synthkd/pass": build_pass}


def synthkd_asset(build_pass: str, kinds: set[str], **kwargs) -> Callable[[Callable], dg.AssetsDefinition]:
    """`dg.asset` with the conventions, described by the function's docstring (as one paragraph)."""

    def decorate(fn: Callable) -> dg.AssetsDefinition:
        return dg.asset(
            description=" ".join(fn.__doc__.split()),
            kinds={"python", *kinds},
            code_version=CODE_VERSION,
            owners=OWNERS,
            tags=pass_tags(build_pass),
            **kwargs,
        )(fn)

    return decorate
