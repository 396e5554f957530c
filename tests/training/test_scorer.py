"""The scorer (002 §8.2-§8.3): heads learn a planted per-bucket relation, rank targets against scipy, nulls never
invented, bit-for-bit artifacts with a refused tamper, and the sampler's caps, quotas, ε tail and weighting."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys

import numpy as np
import polars as pl
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import rankdata, spearmanr

from synthkd_contract.buckets import SKILL_BUCKETS
from synthkd_contract.manifest_seal import ManifestError
from synthkd_dev import REPO_ROOT
from synthkd_training.scorer import (
    FEATURE_CONFIG_FILE,
    WEIGHTS_FILE,
    FeatureError,
    Normalization,
    ScorerConfig,
    UnknownSkillBucket,
    feature_matrix,
    load_scorer,
    lp_targets,
    sampling_weights,
    save_scorer,
    train_scorer,
)

FAST = {"hidden_size": 8, "epochs": 150, "learning_rate": 0.03}


def planted_table(rows: int, seed: int) -> tuple[pl.DataFrame, np.ndarray]:
    """Features and lp_value where B1's value grows with f1 and B2's falls with f2 (through exp: another scale
    and a non-linear link), the other features noise; teacher_entropy is null on a third of the rows."""
    rng = np.random.default_rng(seed)
    bucket = np.array(["B1", "B2"])[rng.integers(0, 2, rows)]
    f1, f2, f3 = rng.normal(size=(3, rows))
    entropy = [None if missing else float(v) for missing, v in zip(rng.random(rows) < 0.3, rng.normal(size=rows))]
    noise = 0.3 * rng.normal(size=rows)
    lp = np.where(bucket == "B1", 5.0 * (f1 + noise), 0.01 * np.exp(-2.0 * f2 + noise))
    features = pl.DataFrame(
        {
            "id": [f"row-{seed}-{i:05d}" for i in range(rows)],
            "skill_bucket": bucket,
            "ctx_bucket": np.array(["C1", "C2"])[rng.integers(0, 2, rows)],
            "f1": f1,
            "f2": f2,
            "f3": f3,
            "teacher_entropy": pl.Series(entropy, dtype=pl.Float64),
        }
    )
    return features, lp


def labels_of(features: pl.DataFrame, lp: np.ndarray) -> pl.DataFrame:
    return pl.DataFrame({"id": features["id"], "lp_value": lp})


@pytest.fixture(scope="module")
def planted():
    """A scorer trained on 600 planted rows, and 400 held-out rows of the same relation."""
    train, train_lp = planted_table(600, seed=1)
    held, held_lp = planted_table(400, seed=2)
    return train_scorer(train, labels_of(train, train_lp), seed=7, **FAST), train, train_lp, held, held_lp


# --- heads and labels --------------------------------------------------------------------------------------
def test_each_bucket_head_learns_its_own_planted_relation(planted):
    scorer, _, _, held, held_lp = planted
    utility = scorer.predict(held)
    assert utility.dtype == np.float32 and ((utility >= 0) & (utility <= 1)).all()
    for bucket, driver, other in (("B1", "f1", "f2"), ("B2", "f2", "f1")):
        rows = held["skill_bucket"].to_numpy() == bucket
        assert spearmanr(utility[rows], held_lp[rows]).statistic > 0.85, bucket
        # the head follows its own bucket's feature, not the other bucket's
        assert abs(spearmanr(utility[rows], held[other].to_numpy()[rows]).statistic) < 0.2, bucket
        assert abs(spearmanr(utility[rows], held[driver].to_numpy()[rows]).statistic) > 0.85, bucket


def test_labels_that_are_noise_teach_nothing(planted):
    """The control for the planted relation: with permuted labels (what tiny models give on the sample) the
    heads fit a random function of the features, whose held-out rank correlation stays loose (|rho| < 0.4,
    against > 0.85 with the planted labels)."""
    _, train, train_lp, held, held_lp = planted
    scorer = train_scorer(train, labels_of(train, np.random.default_rng(3).permutation(train_lp)), seed=7, **FAST)
    utility = scorer.predict(held)
    for bucket in ("B1", "B2"):
        rows = held["skill_bucket"].to_numpy() == bucket
        assert abs(spearmanr(utility[rows], held_lp[rows]).statistic) < 0.4, bucket


@given(
    st.lists(
        st.tuples(st.sampled_from(SKILL_BUCKETS), st.integers(-5, 5).map(float) | st.floats(-1e6, 1e6)),
        min_size=1,
        max_size=40,
    ),
    st.floats(0.001, 1000.0),
    st.floats(-1000.0, 1000.0),
)
@settings(deadline=None)
def test_lp_targets_are_per_bucket_ranks_on_any_scale(pairs, scale, shift):
    labelled = pl.DataFrame(pairs, schema=["skill_bucket", "lp_value"], orient="row")
    targets = lp_targets(labelled)
    buckets, values = labelled["skill_bucket"].to_numpy(), labelled["lp_value"].to_numpy()
    for bucket in set(buckets):
        rows = buckets == bucket
        n = rows.sum()
        expected = (rankdata(values[rows]) - 1) / (n - 1) if n > 1 else np.full(1, 0.5)
        np.testing.assert_allclose(targets[rows], expected, atol=1e-12)
    # a positive affine map of the labels changes no target (ties stay ties unless the map merges them)
    mapped = labelled.with_columns(lp_value=pl.col("lp_value") * scale + shift)
    if mapped["lp_value"].n_unique() == labelled["lp_value"].n_unique():
        np.testing.assert_allclose(lp_targets(mapped), targets, atol=1e-12)


def test_nullable_features_get_an_indicator_and_are_never_invented(planted):
    scorer, train, *_ = planted
    assert scorer.config.nullable_columns == ("teacher_entropy",)
    assert scorer.config.categorical_columns == {"ctx_bucket": ("C1", "C2", "C3", "C4")}
    present = train["teacher_entropy"].drop_nulls().to_numpy()
    assert scorer.normalization.mean["teacher_entropy"] == pytest.approx(present.mean(), abs=1e-12)
    assert scorer.normalization.std["f1"] == pytest.approx(train["f1"].to_numpy().std(), abs=1e-12)
    matrix = feature_matrix(train, scorer.config, scorer.normalization)
    nulls = train["teacher_entropy"].is_null().to_numpy()
    columns = [*scorer.config.feature_columns, "teacher_entropy is null", "C1", "C2", "C3", "C4"]
    assert matrix.shape == (train.height, len(columns))
    entropy, indicator = columns.index("teacher_entropy"), columns.index("teacher_entropy is null")
    assert (matrix[nulls, entropy] == 0).all() and (matrix[nulls, indicator] == 1).all()
    assert (matrix[~nulls, indicator] == 0).all()
    expected = (present - present.mean()) / present.std()
    np.testing.assert_allclose(matrix[~nulls, entropy], expected.astype(np.float32), rtol=1e-6)
    np.testing.assert_array_equal(matrix[:, columns.index("C2")], (train["ctx_bucket"] == "C2").to_numpy())
    # a null is only accepted where declared
    with pytest.raises(FeatureError, match="'f3'.*not in nullable_columns"):
        scorer.predict(train.with_columns(f3=pl.when(pl.col("f1") > 0).then(None).otherwise(pl.col("f3"))))
    with pytest.raises(FeatureError, match="'f1'.*NaN"):
        scorer.predict(train.with_columns(f1=pl.lit(float("nan"))))
    with pytest.raises(FeatureError, match="'ctx_bucket' holds \\['C9'\\]"):
        scorer.predict(train.with_columns(ctx_bucket=pl.lit("C9")))


def test_unknown_and_untrained_buckets_are_errors_naming_the_bucket(planted):
    scorer, train, train_lp, *_ = planted
    assert scorer.buckets == ("B1", "B2")
    assert scorer.training_rows == {bucket: int((train["skill_bucket"] == bucket).sum()) for bucket in ("B1", "B2")}
    stray = train.with_columns(skill_bucket=pl.when(pl.col("f1") > 1).then(pl.lit("B9")).otherwise("skill_bucket"))
    with pytest.raises(UnknownSkillBucket, match="'B9'.*SKILL_BUCKETS"):
        train_scorer(stray, labels_of(train, train_lp), **FAST)
    with pytest.raises(UnknownSkillBucket, match="'B9'"):
        scorer.predict(stray)
    with pytest.raises(UnknownSkillBucket, match="'B3' has no trained scorer head"):
        scorer.predict(train.with_columns(skill_bucket=pl.lit("B3")))


def test_training_is_deterministic_with_a_seed_in_any_row_order(planted):
    scorer, train, train_lp, *_ = planted
    labels = labels_of(train, train_lp)
    again = train_scorer(train.reverse(), labels.sample(fraction=1.0, shuffle=True, seed=5), seed=7, **FAST)
    other_seed = train_scorer(train, labels, seed=8, **FAST)
    for bucket, head in scorer.heads.items():
        first, second, third = (
            head.state_dict(),
            again.heads[bucket].state_dict(),
            other_seed.heads[bucket].state_dict(),
        )
        assert all(torch.equal(first[name], second[name]) for name in first)
        assert not all(torch.equal(first[name], third[name]) for name in first)


# --- weights and artifacts ---------------------------------------------------------------------------------
@given(st.lists(st.floats(0.0, 1.0), max_size=20), st.floats(-10.0, 10.0))
def test_sampling_weight_is_exp_tau_utility(utility, tau):
    assert sampling_weights(utility, tau).tolist() == pytest.approx([math.exp(tau * u) for u in utility], rel=1e-12)


def test_score_adds_utility_and_the_weight_of_the_configured_tau(planted):
    scorer, _, _, held, _ = planted
    scored = scorer.score(held)
    np.testing.assert_array_equal(scored["utility_score"].to_numpy(), scorer.predict(held).astype(np.float64))
    expected = np.exp(scorer.config.tau * scored["utility_score"].to_numpy())
    np.testing.assert_array_equal(scored["sampling_weight"].to_numpy(), expected)


def test_save_and_load_restore_predictions_bit_for_bit(planted, tmp_path):
    scorer, _, _, held, _ = planted
    directory = save_scorer(scorer, tmp_path / "scorer")
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["version"] == scorer.config.version and manifest["buckets"] == ["B1", "B2"]
    for record in manifest["files"]:
        payload = (directory / record["path"]).read_bytes()
        assert record["sha256"] == hashlib.sha256(payload).hexdigest() and record["bytes"] == len(payload)
    assert {record["path"] for record in manifest["files"]} == {WEIGHTS_FILE, FEATURE_CONFIG_FILE}
    loaded = load_scorer(directory)
    assert loaded.config == scorer.config and loaded.normalization == scorer.normalization
    assert loaded.predict(held).tobytes() == scorer.predict(held).tobytes()
    # saving again replaces the directory with identical bytes
    save_scorer(loaded, directory)
    assert json.loads((directory / "manifest.json").read_text()) == manifest


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (WEIGHTS_FILE, "heads.pt differs from the manifest"),
        (FEATURE_CONFIG_FILE, "feature_config.json differs from the manifest"),
        ("manifest.json", "manifest.json does not match its seal"),
    ],
)
def test_a_tampered_file_is_refused_by_name(planted, tmp_path, target, message):
    directory = save_scorer(planted[0], tmp_path / "scorer")
    path = directory / target
    payload = bytearray(path.read_bytes())
    payload[len(payload) // 2] ^= 0x01  # same size: only the sha256 can tell
    path.write_bytes(bytes(payload))
    with pytest.raises(ManifestError, match=message):
        load_scorer(directory)


def test_a_file_the_manifest_does_not_list_is_refused(planted, tmp_path):
    directory = save_scorer(planted[0], tmp_path / "scorer")
    (directory / "extra.pt").write_bytes(b"x")
    with pytest.raises(ManifestError, match="extra.pt is not listed"):
        load_scorer(directory)


def test_config_rejects_what_it_cannot_read():
    with pytest.raises(ValueError, match="not among the numeric"):
        ScorerConfig(("f1",), nullable_columns=("f2",))
    with pytest.raises(ValueError, match="cannot be features"):
        ScorerConfig(("lp_value",))
    with pytest.raises(FeatureError, match="name"):
        ScorerConfig.for_table(pl.DataFrame({"id": ["a"], "skill_bucket": ["B1"], "f": [1.0], "name": ["x"]}))
    config = ScorerConfig.for_table(
        pl.DataFrame({"id": ["a"], "skill_bucket": ["B1"], "f": [1.0], "name": ["x"]}), exclude=("name",)
    )
    assert config.feature_columns == ("f",) and config.nullable_columns == ()
    assert Normalization.fit(pl.DataFrame({"f": [2.0, 2.0]}), config) == Normalization({"f": 2.0}, {"f": 1.0})
    table = pl.DataFrame({"id": ["a", "b"], "skill_bucket": ["B1", "B1"], "f": [1.0, 2.0]})
    with pytest.raises(ValueError, match="not both"):
        train_scorer(table, pl.DataFrame({"id": ["a"], "lp_value": [1.0]}), config, seed=1)
    with pytest.raises(FeatureError, match="without features"):
        train_scorer(table, pl.DataFrame({"id": ["z"], "lp_value": [1.0]}), config)


def test_the_scorer_imports_neither_dagster_nor_synthkd_assets():
    """A training node scores and samples without the Dagster side."""
    probe = (
        "import sys, json, synthkd_training.scorer; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'synthkd_assets'))))"
    )
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
