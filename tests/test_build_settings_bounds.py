"""Every numeric build setting is refused where it is declared (defs/resources.py `build`), with the setting named,
whichever route sets it: $SYNTHKD_BUILD_CONFIG (build.sh, `dg launch`, the sensors) or a run's resource config.

The oracle is the settings' meaning (a length, a fraction, a count), written out here; before the bounds,
`max_seq_len -1` and `distill_valid_fraction 1.5` built, and every DistillKit row was dropped or sent to validation.
The smoke caps are refused by the smoke build that reads them (tests/test_smoke.py): a full build ignores them.
"""

from __future__ import annotations

import json

import dagster as dg
import pytest

from synthkd_assets.defs.resources import BUILD_CONFIG_ENV, SynthKDBuildConfig, ValuationModelsResource
from synthkd_contract.settings import Settings

# (setting, a value its meaning rules out, a value on the edge it allows)
BOUNDS = [
    ("max_seq_len", -1, 1),
    ("max_seq_len", 0, 1),
    ("distill_valid_fraction", 1.5, 0.0),
    ("distill_valid_fraction", 1.0, 0.999),
    ("distill_valid_fraction", -0.01, 0.0),
    ("encode_threads", 0, 1),
    ("memorization_cap", 0.0, 1.0),
    ("memorization_cap", 1.2, 1.0),
    ("non_english_min", -0.1, 0.0),
    ("non_english_max", 1.5, 1.0),
    ("global_keep", 0.0, 1.0),
    ("global_keep", 2.0, 1.0),
    ("near_dup_threshold", 0.0, 1.0),
    ("near_dup_threshold", 1.1, 1.0),
    ("max_per_cluster", 0, 1),
    ("heldout_per_exercise", -1, 0),
    ("format_suite_per_form", -1, 0),
    ("synth_share", -0.5, 0.0),
]


@pytest.mark.parametrize(("setting", "bad", "edge"), BOUNDS)
def test_an_out_of_range_setting_is_refused_naming_it(setting, bad, edge):
    with pytest.raises(ValueError, match=setting):
        SynthKDBuildConfig.from_settings(Settings.read({BUILD_CONFIG_ENV: json.dumps({setting: bad})}))
    with pytest.raises(ValueError, match=setting):
        SynthKDBuildConfig(**{setting: bad})
    assert getattr(SynthKDBuildConfig(**{setting: edge}), setting) == edge


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"non_english_min": 0.5, "non_english_max": 0.2}, "non_english_min 0.5 > non_english_max 0.2"),
        ({"skill_mix": {"B1": -1.0}}, "skill_mix"),
        ({"skill_mix": {"B1": 0.0}}, "skill_mix shares sum to 0"),
        ({"anchor_shares": {"math": -0.1}}, "anchor_shares"),
        ({"source_caps": {"deepcoder": 1.5}}, "source_caps"),
        (
            {"curriculum": [{"stage": "P1", "ctx_mix": {"C1": 1.0}, "tokens": -1, "seq_length": 2048}]},
            "tokens",
        ),
        (
            {"curriculum": [{"stage": "P1", "ctx_mix": {"C1": 1.0}, "tokens": 10, "seq_length": 0}]},
            "seq_length",
        ),
    ],
)
def test_settings_that_only_a_later_rule_refused_are_refused_where_declared(settings, named):
    with pytest.raises(ValueError, match=named):
        SynthKDBuildConfig.from_settings(Settings.read({BUILD_CONFIG_ENV: json.dumps(settings)}))


def test_a_run_config_with_a_negative_max_seq_len_fails_before_any_step_runs(tmp_path):
    """The `dg launch --config-json` route: the resource's run config is validated as the run starts."""

    @dg.asset
    def probe(build: SynthKDBuildConfig) -> int:
        return build.max_seq_len

    result = dg.materialize(
        [probe],
        resources={"build": SynthKDBuildConfig()},
        run_config={"resources": {"build": {"config": {"max_seq_len": -1}}}},
        raise_on_error=False,
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.is_failure)
    assert "max_seq_len" in str(failure.event_specific_data)


@pytest.mark.parametrize(("setting", "bad"), [("window", 0), ("window", -3), ("batch_size", 0)])
def test_the_valuation_resources_counts_are_bounded_too(setting, bad):
    with pytest.raises(ValueError, match=setting):
        ValuationModelsResource(**{setting: bad})
    assert getattr(ValuationModelsResource(**{setting: 1}), setting) == 1
