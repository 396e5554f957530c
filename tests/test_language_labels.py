"""A row's language label is normalized once (synthkd_contract/labels.py) before English / non-English is decided.

A hand-converted shard spells English `EN`, `en-US`, ` en` or `en_GB`; counted as non-English, such rows were capped
by the non-English share and sampled under the wrong rule. The oracle is the label's meaning written out here:
the BCP 47 primary subtag, case and surrounding blanks aside.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from synthkd_assets.core.sampling import is_english, mix_summary, sampling_drop_reason
from synthkd_contract.labels import normalize_language

RATES = {"memorization": 1.0, "non_english": 0.0, "english": 1.0, "global": 1.0}  # non-English: all dropped


def test_the_attack_spellings_of_english_are_english():
    for label in ("EN", "en-US", " en", "en_GB", "En", "en\t", "\u200ben", "EN-gb"):
        assert is_english(label), label
        assert sampling_drop_reason("row", "rag", label, RATES) is None, label
    for label in ("fr", "ENG", "de-EN", "", "unknown", None):
        assert not is_english(label), label
        assert sampling_drop_reason("row", "rag", label, RATES) == "sampled_out_non_english", label


def test_the_mix_counts_spelled_english_as_english():
    summary = mix_summary({("rag", "EN"): 3.0, ("rag", "en-US"): 2.0, ("rag", " en"): 1.0, ("rag", "fr"): 4.0})
    assert summary["non_english_share"] == 0.4


blanks = st.text(alphabet=" \t\n\u00a0\u2003", max_size=3)
case = st.sampled_from(["en", "EN", "En", "eN"])
regions = st.one_of(st.just(""), st.tuples(st.sampled_from("-_"), st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ", max_size=4)))


@given(blanks, case, regions, blanks)
def test_any_spelling_of_en_with_a_region_is_english(before, code, region, after):
    tag = "".join(region) if region else ""
    assert normalize_language(f"{before}{code}{tag}{after}") == "en"
    assert is_english(f"{before}{code}{tag}{after}")


@given(st.text("abcdefghijklmnopqrstuvwxyz", min_size=2, max_size=3).filter(lambda code: code != "en"), regions)
def test_any_other_primary_subtag_is_not_english(code, region):
    tag = "".join(region) if region else ""
    assert not is_english(code.upper() + tag) and not is_english(code + tag)
