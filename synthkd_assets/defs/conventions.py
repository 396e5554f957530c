"""Dagster conventions every asset follows: its owners, a tag naming the build pass it belongs
to (scripts/build.sh's order, defs/passes.py), so `--select 'tag:synthkd/pass=scan'` selects a pass, and its
docstring as its description. Code versions are set per asset by defs/code_versions.py."""

from collections.abc import Callable

import dagster as dg

OWNERS = ["team:synthkd"]


def pass_tags(build_pass: str) -> dict[str, str]:
    return {"synthkd/pass": build_pass}


# on every run of a smoke build (`smoke: true`): its runs materialize the same assets as a full build's, and the
# Runs list (filter by tag) tells them apart by it
SMOKE_RUN_TAGS = {"synthkd/smoke": "true"}


def synthkd_asset(build_pass: str, kinds: set[str], **kwargs) -> Callable[[Callable], dg.AssetsDefinition]:
    """`dg.asset` with the conventions, described by the function's docstring (as one paragraph)."""

    def decorate(fn: Callable) -> dg.AssetsDefinition:
        return dg.asset(
            description=" ".join(fn.__doc__.split()),
            kinds={"python", *kinds},
            owners=OWNERS,
            tags=pass_tags(build_pass),
            **kwargs,
        )(fn)

    return decorate
