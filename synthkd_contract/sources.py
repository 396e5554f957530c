"""The source mix of seed 002 ("Global source mix", docs/sources.md#the-source-mix-on-tokens) as data: which anchor
datasets feed the 20% stream, which category each belongs to, each category's target share of the whole mix's tokens,
and strict caps.

SYNTH stays the default stream (80%); the anchor stream adds math / code / chat / personality conversations,
each mapped to Harmony by an adapter of synthkd_assets/core/sources/ (docs/sources.md). A row of an anchor source
gets the exercise of its category (`CATEGORY_EXERCISE`), which synthkd_contract/buckets.py maps to a skill bucket
(`ANCHOR_EXERCISE_SKILL_BUCKET`). The shares are targets for the token mix (the plan that enforces them is the
graph's, issue #21 item 3); they live here so that the plan, the reports and the docs read one table.
"""

from __future__ import annotations

import hashlib
from typing import Final

from synthkd_contract import constants
from synthkd_contract.harmony_artifact import is_artifact_key

SYNTH_SOURCE: Final = "synth"
SYNTH_DATASET: Final = constants.SOURCE_DATASET
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
# the source mix's groups (SYNTH, then each anchor category), in the order every plan and report lists them
SOURCE_GROUPS: Final = (SYNTH_SOURCE, *ANCHOR_CATEGORIES)
_DATASET_SOURCE: Final = {dataset: source for source, dataset in SOURCE_DATASETS.items()}

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


def dataset_group(dataset: str) -> str:
    """The source mix's group of a pool row by its `source_dataset`.

    Args:
        dataset: the published dataset (`PleIAs/SYNTH`, an anchor source's Hugging Face name).

    Returns:
        `synth`, or the anchor source's category.

    Raises:
        KeyError: a dataset no source reads.
    """
    if dataset == SYNTH_DATASET:
        return SYNTH_SOURCE
    try:
        return source_category(_DATASET_SOURCE[dataset])
    except KeyError:
        raise KeyError(f"dataset {dataset!r} is no source's in synthkd_contract/sources.py SOURCE_DATASETS") from None


def source_exercise(source: str) -> str:
    """The exercise every row of an anchor source gets."""
    return CATEGORY_EXERCISE[source_category(source)]


# --- partitions of anchor shards (issue #21 item 2) -------------------------------------------------------
# A shard of an anchor source is the partition `<source key>/<file stem>` (a file directly in
# $SYNTHKD_SOURCES_DIR/<source key>/); SYNTH's partitions keep their keys (`synth_00`), which hold no separator.
SOURCE_PARTITION_SEPARATOR: Final = "/"
# an anchor shard's number in the outputs named by shard number (Megatron trio `shard_<n>_*`, DistillKit and pool
# parts `part-<n>`): (source ordinal + 1) * ANCHOR_SHARD_INDEX_BASE + sha256(file stem) mod ANCHOR_SHARD_INDEX_BASE,
# so it never meets a SYNTH shard number (< ANCHOR_SHARD_INDEX_BASE), does not depend on which other files exist,
# and tells the source at a glance (its leading digit(s)); two stems of one source on one number are refused
ANCHOR_SHARD_INDEX_BASE: Final = 10_000_000


def source_dataset(source: str) -> str:
    """The published dataset a source's rows come from (`PleIAs/SYNTH` for synth): the DistillKit rows'
    `source.dataset`, the pool rows' `source_dataset`."""
    return SYNTH_DATASET if source == SYNTH_SOURCE else SOURCE_DATASETS[source]


def distill_row_id(dataset: str, synth_id: str) -> str:
    """A DistillKit row's `id`: `pleias_synth:<synth_id>` for SYNTH's rows; an anchor row's synth_id as it is, already
    `<source key>:<id>` (no source key is `pleias_synth`, so ids never collide across sources)."""
    return constants.DISTILL_ID_PREFIX + synth_id if dataset == SYNTH_DATASET else synth_id


def partition_source(partition_key: str) -> str:
    """The source a partition's rows come from: `synth` for SYNTH's keys (raw files, artifact ranges), `<source>`
    for `<source>/<stem>`."""
    if is_artifact_key(partition_key):  # a row-group range of the synth_harmony_v1 artifact: SYNTH's rows
        return SYNTH_SOURCE
    source, separator, _ = partition_key.partition(SOURCE_PARTITION_SEPARATOR)
    return source if separator else SYNTH_SOURCE


def anchor_partition_key(source: str, stem: str) -> str:
    return f"{source}{SOURCE_PARTITION_SEPARATOR}{stem}"


def anchor_shard_index(partition_key: str) -> int:
    """The shard number of an anchor partition `<source>/<stem>` (see ANCHOR_SHARD_INDEX_BASE)."""
    source, _, stem = partition_key.partition(SOURCE_PARTITION_SEPARATOR)
    ordinal = list(SOURCE_DATASETS).index(source) if source in SOURCE_DATASETS else None
    if ordinal is None:
        raise KeyError(f"source {source!r} is not declared in synthkd_contract/sources.py SOURCE_DATASETS")
    digest = int.from_bytes(hashlib.sha256(stem.encode()).digest()[:8], "big")
    return (ordinal + 1) * ANCHOR_SHARD_INDEX_BASE + digest % ANCHOR_SHARD_INDEX_BASE
