"""The blocking check `pool_mix_within_tolerance` on synth_pool_manifest: the pool's achieved SYNTH skill shares
against the quota plan's targets. A miss beyond a point fails it, naming the rows the plan excluded, and the pool
manifest then does not verify (the failure is recorded beside its seal). The miss is injected in the plan the check
reads (a target the pool's rows cannot meet, and the excluded row that would have filled it)."""

from __future__ import annotations

import json
import shutil

import dagster as dg
import pytest

from synthkd_assets.defs.resources import SynthKDLayout
from synthkd_contract.manifest_seal import ManifestError, verify_manifest
from tests.helpers import SAMPLE_RAW_DIR, check_evaluation

CHECK = dg.AssetCheckKey(dg.AssetKey("synth_pool_manifest"), "pool_mix_within_tolerance")


def test_a_share_missed_by_more_than_a_point_fails_naming_the_rows(built_sample, own_instance, tmp_path):
    copy = tmp_path / "data"
    shutil.copytree(built_sample[2], copy)
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(copy))
    paths = layout.data_layout()
    passed = check_evaluation(own_instance, layout, CHECK)
    assert passed.passed, passed.description

    plan = json.loads(paths.quota_plan().read_text())
    plan["skill_tokens"]["target_share"] = {"B1": 0.8, "B2": 0.1, "B3": 0.0, "B4": 0.1}
    plan["excluded"] = [{"synth_id": "rag_long_1", "skill": "B1", "ctx": "C4", "tokens": 500_000, "why": "oversized"}]
    paths.quota_plan().write_text(json.dumps(plan))
    failed = check_evaluation(own_instance, layout, CHECK)
    assert not failed.passed
    assert "B1: 60.59% of the kept tokens, target 80.00%" in failed.description
    assert "rows that cause it: rag_long_1 (500000 tokens)" in failed.description
    with pytest.raises(ManifestError, match="pool_mix_within_tolerance"):
        verify_manifest(paths.pool_root())
