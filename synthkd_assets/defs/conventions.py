"""Dagster conventions every asset follows: its owners, a tag naming the build pass it belongs
to (scripts/build.sh's order, defs/passes.py), so `--select 'tag:synthkd/pass=scan'` selects a pass, and its
docstring as its description. Code versions are set per asset by defs/code_versions.py."""

import functools
import inspect
from collections.abc import Callable
from typing import Any

import dagster as dg

from synthkd_assets.defs.metadata import readable_metadata

OWNERS = ["team:synthkd"]


def pass_tags(build_pass: str) -> dict[str, str]:
    return {"synthkd/pass": build_pass}


# on every run of a smoke build (`smoke: true`): its runs materialize the same assets as a full build's, and the
# Runs list (filter by tag) tells them apart by it
SMOKE_RUN_TAGS = {"synthkd/smoke": "true"}


def readable_result(result: Any) -> Any:
    """A materialization with its metadata as a person reads it in the UI (defs/metadata.py `readable_metadata`:
    floats rounded, flat JSON as tables); anything else unchanged (check results: defs/checks.py
    `check_result`)."""
    if isinstance(result, (dg.MaterializeResult, dg.AssetMaterialization)):
        return result._replace(metadata=readable_metadata(result.metadata))
    return result


def with_readable_metadata(fn: Callable) -> Callable:
    """`fn` (an asset's or a check's body, returning or yielding its results) with `readable_result` applied to
    each result; Dagster still sees `fn`'s parameters (functools.wraps)."""
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def each(*args, **kwargs):
            for result in fn(*args, **kwargs):
                yield readable_result(result)

        return each

    @functools.wraps(fn)
    def one(*args, **kwargs):
        return readable_result(fn(*args, **kwargs))

    return one


def synthkd_asset(build_pass: str, kinds: set[str], **kwargs) -> Callable[[Callable], dg.AssetsDefinition]:
    """`dg.asset` with the conventions, described by the function's docstring (as one paragraph), its
    metadata made readable (`with_readable_metadata`)."""

    def decorate(fn: Callable) -> dg.AssetsDefinition:
        return dg.asset(
            description=" ".join(fn.__doc__.split()),
            kinds={"python", *kinds},
            owners=OWNERS,
            tags=pass_tags(build_pass),
            **kwargs,
        )(with_readable_metadata(fn))

    return decorate
