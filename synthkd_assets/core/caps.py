"""The smoke build's per-shard caps, applied by one rule in every step that writes a dataset.

A smoke build runs the same steps as a full build: the first step reads only the first
`max_input_rows` raw rows of a shard (so no later step sees more), and each dataset writer
(synth_kd_v1, synth_distill) keeps the conversations it writes, in order, until the next one would
pass `max_rows` conversations or `max_tokens` tokens. A conversation's tokens are its tokenized
length as synth_tokenized holds it (the trailing EOD included), the same number in both datasets, so
both keep the same first conversations of a shard. From the first conversation over a cap on, every
later one is counted as `smoke_cap` too: the dataset holds a prefix of the shard, never a selection.
"""

from __future__ import annotations

from dataclasses import dataclass

from synthkd_assets.core.report import ShardReport
from synthkd_contract import drops


@dataclass(frozen=True)
class BuildCaps:
    """Smoke-build limits per shard; `None` means no limit (the full build)."""

    max_rows: int | None = None
    max_tokens: int | None = None
    max_input_rows: int | None = None

    def __post_init__(self) -> None:
        """A cap below 1 would write an empty smoke dataset while every run succeeds: refused, named by its
        setting in the `build` resource."""
        for cap, setting in SMOKE_CAP_SETTINGS.items():
            value = getattr(self, cap)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"build config {setting} = {value!r} is not a whole number >= 1 (a smoke cap)")


SMOKE_CAP_SETTINGS = {
    "max_rows": "smoke_max_rows",
    "max_tokens": "smoke_max_tokens",
    "max_input_rows": "smoke_input_rows",
}

NO_CAPS = BuildCaps()  # a full build


class SmokeBudget:
    """What a dataset writer may still write of one shard under `caps`."""

    def __init__(self, caps: BuildCaps) -> None:
        self.caps = caps
        self.rows = 0
        self.tokens = 0
        self.exhausted = False

    def admits(self, tokens: int, report: ShardReport) -> bool:
        """Whether the next conversation (`tokens` long, EOD included) fits; a refused one is counted in
        `report` as `smoke_cap`, and so is every one after it."""
        caps = self.caps
        if not self.exhausted:
            over_rows = caps.max_rows is not None and self.rows >= caps.max_rows
            over_tokens = caps.max_tokens is not None and self.tokens + tokens > caps.max_tokens
            self.exhausted = over_rows or over_tokens
        if self.exhausted:
            report.dropped[drops.DROP_SMOKE_CAP] += 1
        return not self.exhausted

    def spend(self, tokens: int) -> None:
        """Record a conversation written (rows an admitted one is dropped for otherwise are not spent)."""
        self.rows += 1
        self.tokens += tokens
