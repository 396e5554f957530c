"""Near-duplicate control (docs/near-dup.md) as data: prompt normalization, MinHash and LSH parameters, the
cluster cap and the held-out validation sets.

They decide which rows every dataset keeps (a capped or held-out row leaves synth_kd_v1, synth_distill
and the pool alike), so they live with the other contract constants and the manifests hash them.
The rules that use them: synthkd_assets/core/near_dup.py (signatures, clusters, caps) and
core/validation_sets.py (the held-out slice and the format-compliance suite).
"""

from __future__ import annotations

from typing import Final

# --- what is compared: the question and the final answer, without the shared reference text, normalized
# (docs/near-dup.md "What is compared"): SYNTH asks many different questions about one article section ---------
UNICODE_FORM: Final = "NFKC"  # full-width / compatibility characters fold to their plain forms
REMOVED_CATEGORY: Final = "Cf"  # format characters (zero-width spaces and joiners, soft hyphens, bidi marks) removed
# lookalikes fold to the ASCII character the Unicode confusables table (TR39 data, as this package ships it) names
# for them (docs/near-dup.md "Normalization"); its version is hashed with the other settings
CONFUSABLES_TABLE: Final = "confusable_homoglyphs"
# word 3-grams of the normalized text (a text of fewer words is one shingle). Character 5-grams were measured
# too: on the templated sample text they put random pairs up to Jaccard 0.79 (word 3-grams: 0.48), while a
# one-word edit of a prompt keeps 0.98 under either (docs/near-dup.md "Normalization")
SHINGLE_WORDS: Final = 3

# --- MinHash (rensa RMinHash) and LSH banding ----------------------------------------------------------------
NUM_PERM: Final = 128
MINHASH_SEED: Final = 1802  # fixed: signatures are comparable across shards, runs and machines
LSH_BANDS: Final = 16  # 16 bands x 8 rows: a pair at Jaccard 0.8 is a candidate with p = 0.947, at 0.9 p > 0.9999
LSH_ROWS: Final = NUM_PERM // LSH_BANDS
JACCARD_THRESHOLD: Final = 0.8  # a candidate pair is a near-duplicate when its estimated Jaccard is >= this

# --- caps (docs/near-dup.md) ------------------------------------------------------------------------------------------
MAX_PER_CLUSTER: Final = 4  # rows kept per cluster (per epoch); a cluster of one is always kept: the rare tail
CLUSTER_SALT: Final = "synthkd/near_dup/rank"  # cluster_rank orders a cluster's rows by this salted hash
LARGE_CLUSTER_SHARE: Final = 0.01  # the WARN check: one cluster holds more than this share of the rows

# --- validation sets (docs/near-dup.md#validation-sets) ---------------------------------------------------------------
HELDOUT_SALT: Final = "synthkd/near_dup/heldout"
HELDOUT_PER_EXERCISE: Final = 4  # prompts per exercise in the held-out KL slice
# a cluster of more rows than this is never chosen for the validation sets (docs/near-dup.md "Validation sets"):
# holding it out would keep as many rows from training for one validation prompt; 4 x MAX_PER_CLUSTER
HELDOUT_CLUSTER_LIMIT: Final = 16
FORMAT_SUITE_PER_FORM: Final = 8  # prompts per checkable answer form in the format-compliance suite
