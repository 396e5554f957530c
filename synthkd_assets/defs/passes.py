"""The build order of the graph, defined once: which assets each pass materializes, in what order.

The build (defs/build.py: `build_passes`, which scripts/build.sh runs through `python -m synthkd_assets.cli
build`), each pass's job (defs/jobs.py), build.sh's `dg launch --job` route for a cluster executor
(tests/test_jobs.py holds its order to `build_passes`), the manifests' automation sensor and the hint an
asset gives when its upstream is missing all follow these lists.
"""

from collections.abc import Iterable
from dataclasses import dataclass

INVENTORY_STEPS = ["o200k_tokenizer", "synth_raw_inventory"]
SCAN_STEPS = ["synth_harmony", "synth_filtered", "synth_signatures"]  # per shard, before the global plan pass
# the near-duplicate clusters (their cap and held-out clusters remove rows before the plan counts them), the
# sampling plan, and the validation sets of the held-out clusters
PLAN_STEPS = ["synth_clusters", "synth_sampling_plan", "synth_validation_sets"]
BUILD_STEPS = ["synth_sampled", "synth_tokenized", "synth_kd_v1", "synth_distill"]  # per shard, under the plan
SHARD_STEPS = SCAN_STEPS + BUILD_STEPS  # rebuilding one shard under the plan in force
HARMONY_MANIFEST = "synth_harmony_manifest"  # raw provenance over every shard; the other two are OUTPUTS'
MANIFEST_STEPS = [HARMONY_MANIFEST, "synth_kd_v1_manifest", "synth_distill_manifest"]
# the sequence pool (002), after the datasets: its quota plan over every shard's tokens, the pool per shard
# under it, then its curriculum and sampling manifest. Run by the build, never by the automation: like the
# sampling plan, a new quota plan means rebuilding every shard's pool
QUOTA_STEPS = ["synth_quota_plan"]
POOL_STEPS = ["synth_pool", "synth_valuation_features"]  # each shard's pool, then its valuation features
POOL_MANIFEST_STEPS = ["synth_curriculum", "synth_pool_manifest"]
OUTPUTS = {
    "synth_kd_v1": "synth_kd_v1_manifest",
    "synth_distill": "synth_distill_manifest",
    "synth_pool": "synth_pool_manifest",
}


@dataclass(frozen=True)
class Pass:
    """One pass of a build: its name (what the build prints), the assets it materializes (with their checks),
    whether it is one run per shard partition (`per_shard`) or one run over every shard, and the passes whose
    runs must all have finished before its own are launched (`after`: earlier passes of the build's list)."""

    name: str
    steps: tuple[str, ...]
    per_shard: bool = False
    after: tuple[str, ...] = ()


def build_passes(outputs: Iterable[str] = tuple(OUTPUTS)) -> list[Pass]:
    """The passes of a build of `outputs` (synth_kd_v1, synth_distill, synth_pool), in an order that runs each
    after the passes it needs: the tokenizer and inventory, the scan pass, the plan, the build pass, the
    manifests, then with synth_pool its quota plan, the pool pass and its curriculum and manifest.

    Each pass needs the one before it, except that the quota plan needs only the build pass: the manifests (which
    read the build pass's outputs, and nothing the quota plan or the pool writes) run beside the quota plan and
    the pool pass, and the pool's manifest (which seals synth_harmony_manifest's record with it) waits for both.
    A launched build (synthkd_assets/launch.py) starts a pass as soon as its `after` passes are through; the
    in-process build (defs/build.py) runs the list in order."""
    wanted = set(outputs)
    build_steps = [s for s in BUILD_STEPS if s not in OUTPUTS or s in wanted]
    manifests = [m for m in MANIFEST_STEPS if m not in OUTPUTS.values() or any(OUTPUTS[o] == m for o in wanted)]
    passes = [
        Pass("inventory", tuple(INVENTORY_STEPS)),
        Pass("scan", tuple(SCAN_STEPS), per_shard=True, after=("inventory",)),
        Pass("plan", tuple(PLAN_STEPS), after=("scan",)),
        Pass("build", tuple(build_steps), per_shard=True, after=("plan",)),
        Pass("manifest", tuple(manifests), after=("build",)),
    ]
    if "synth_pool" in wanted:
        passes += [
            Pass("quota", tuple(QUOTA_STEPS), after=("build",)),
            Pass("pool", tuple(POOL_STEPS), per_shard=True, after=("quota",)),
            Pass("pool_manifest", tuple(POOL_MANIFEST_STEPS), after=("pool", "manifest")),
        ]
    return passes
