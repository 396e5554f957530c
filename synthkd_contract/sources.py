"""The source mix of seed 002 ("Global source mix", §5) as data: which anchor datasets feed the 20% stream,
which category each belongs to, each category's target share of the whole mix's tokens, and strict caps.

SYNTH stays the default stream (80%); the anchor stream adds math / code / chat / personality conversations,
each mapped to Harmony by an adapter of synthkd_assets/core/sources/ (docs/sources.md). A row of an anchor source
gets the exercise of its category (`CATEGORY_EXERCISE`), which synthkd_contract/buckets.py maps to a skill bucket
(`ANCHOR_EXERCISE_SKILL_BUCKET`). The shares are targets for the token mix (the plan that enforces them is the
graph's, issue #21 item 3); they live here so that the plan, the reports and the docs read one table.
"""

from __future__ import annotations

from typing import Final

SYNTH_SOURCE: Final = "synth"
SYNTH_SHARE: Final = 0.80  # of the whole mix's tokens

# category -> target share of the whole mix's tokens (002: 8% math-hard, 6% code, 4% chat, 2% personality)
ANCHOR_CATEGORY_SHARES: Final = {"math": 0.08, "code": 0.06, "chat": 0.04, "personality": 0.02}
ANCHOR_CATEGORIES: Final = tuple(ANCHOR_CATEGORY_SHARES)

# category -> the exercise every row of its sources gets (the skill bucket follows from buckets.py)
CATEGORY_EXERCISE: Final = {category: f"anchor_{category}" for category in ANCHOR_CATEGORIES}

# source key -> (Hugging Face dataset, category); the key is the directory name of the source's shards and the
# prefix of its synth_ids ("<key>:<source_example_id>")
SOURCE_DATASETS: Final = {
    "nemotron_math_v2": "nvidia/Nemotron-Math-v2",
    "hendrycks_math": "PrimeIntellect/Hendrycks-Math",
    "competition_math": "qwedsacf/competition_math",
    "opencodeinstruct": "nvidia/OpenCodeInstruct",
    "deepcoder": "agentica-org/DeepCoder-Preview-Dataset",
    "ultrachat_200k": "HuggingFaceH4/ultrachat_200k",
    "oasst1": "OpenAssistant/oasst1",
    "anthropic_helpfulness": "bcui19/chat-v2-anthropic-helpfulness",
}
SOURCE_CATEGORY: Final = {
    "nemotron_math_v2": "math",
    "hendrycks_math": "math",
    "competition_math": "math",
    "opencodeinstruct": "code",
    "deepcoder": "code",
    "ultrachat_200k": "chat",
    "oasst1": "chat",
    "anthropic_helpfulness": "chat",
}
# personality: "TBD: curated personality pool" (002); the category and its share are declared, no source yet
CATEGORY_SOURCES: Final = {
    category: tuple(key for key, c in SOURCE_CATEGORY.items() if c == category) for category in ANCHOR_CATEGORIES
}

# strictly capped sources (002: DeepCoder "tiny slice; strictly capped"): the most a source may hold of the whole
# mix's tokens, whatever the category's share leaves free (here 1/12 of the code share)
SOURCE_TOKEN_CAPS: Final = {"deepcoder": 0.005}

# the mix plan keeps a row of source s iff stable_unit_interval(SOURCE_MIX_SALT, synth_id) < its rate
# (synthkd_assets/core/source_mix.py): the pool's hash with its own salt, independent of the quota's and the split's
SOURCE_MIX_SALT: Final = "synthkd/pool/source_mix"


def source_category(source: str) -> str:
    """The anchor category of a source key; KeyError naming the table for an unknown source."""
    try:
        return SOURCE_CATEGORY[source]
    except KeyError:
        raise KeyError(f"source {source!r} has no category in synthkd_contract/sources.py SOURCE_CATEGORY") from None


def source_exercise(source: str) -> str:
    """The exercise every row of an anchor source gets."""
    return CATEGORY_EXERCISE[source_category(source)]
