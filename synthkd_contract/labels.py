"""Where a token's mask comes from: per-token spans, shifted once to the labels they supervise.

The renderer knows the span of every token (prompt / analysis / final, the EOD a prompt token). A
model at position i predicts token i+1, so the stored arrays are label-aligned: position i carries
what is known about token i+1, and the last position (the EOD, after which nothing is predicted)
carries 0/0. `loss_mask` is 1 exactly where that span is not the prompt.

Also the one rule that reads a row's `language` label (`normalize_language`).
"""

from __future__ import annotations

import re
import unicodedata

import numpy as np

from synthkd_contract.constants import LOSSMASK_DTYPE, SPAN_DTYPE, SPAN_PROMPT
from synthkd_contract.near_dup import REMOVED_CATEGORY


def label_align(per_token: np.ndarray) -> np.ndarray:
    """Per-token values -> label-aligned: `out[i] = per_token[i + 1]`, the last position 0 (same dtype)."""
    aligned = np.zeros_like(per_token)
    aligned[:-1] = per_token[1:]
    return aligned


def token_align(label_aligned: np.ndarray) -> np.ndarray:
    """The inverse of `label_align`: `out[i + 1] = label_aligned[i]`, token 0 (never a label) 0 (same dtype)."""
    per_token = np.zeros_like(label_aligned)
    per_token[1:] = label_aligned[:-1]
    return per_token


def supervision_arrays(token_spans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-token spans of a conversation (EOD last, 0) -> the stored `(loss_mask, span_id)`, label-aligned."""
    span_id = label_align(np.asarray(token_spans, dtype=SPAN_DTYPE))
    loss_mask = (span_id != SPAN_PROMPT).astype(LOSSMASK_DTYPE)
    return loss_mask, span_id


def normalize_language(language: object) -> str:
    """The language code a row's `language` label means, the one form every English / non-English rule compares.

    SYNTH spells codes in lower case (`en`, `fr`); a hand-made or converted shard may not (`EN`, `en-US`, ` en`,
    `en_GB`). The code is the label's primary subtag (BCP 47: what comes before the first `-` or `_`), without
    surrounding whitespace or format characters (Unicode Cf), case-folded (docs/bad-input.md).

    Args:
        language: the row's label (a str; anything else, null included, names no language).

    Returns:
        The primary subtag, case-folded; "" for a label that names no language.
    """
    if not isinstance(language, str):
        return ""
    visible = "".join(ch for ch in language if unicodedata.category(ch) != REMOVED_CATEGORY).strip()
    return re.split(r"[-_]", visible, maxsplit=1)[0].strip().casefold()
