"""Writes pipeline stages onto small tmpfs file systems that fill up (tests/test_bad_input.py).

Run as `unshare --user --map-root-user --mount python -m tests.full_disk_child SPEC_JSON`: inside its
own user and mount namespace it may mount tmpfs without privileges on the host, and every mount goes
away with it. For each scenario it mounts a tmpfs of the given size, runs one step onto it, and
prints (JSON) the error it raised and the files left on the file system.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from synthkd_assets.core.distill_io import write_distill_shard
from synthkd_assets.core.stages import harmonize_shard, write_megatron_shard
from synthkd_assets.core.synth import system_message_dict
from synthkd_assets.core.tokenizer import load_harmony_encoding


def run_step(step: str, root: Path, spec: dict) -> None:
    if step == "harmony":
        harmonize_shard(
            Path(spec["raw"]), root / "synth_harmony" / "synth_002.parquet", system_message_dict(), "synth_002"
        )
    elif step == "megatron":
        write_megatron_shard(Path(spec["tokenized"]), root / "synth_kd_v1", 1, "synth_002")
    elif step == "distill":
        encoding = load_harmony_encoding(Path(spec["tokenizer_dir"]))
        write_distill_shard(
            Path(spec["tokenized"]), Path(spec["sampled"]), root / "synth_distill", 1, "synth_002", encoding
        )
    else:
        raise ValueError(step)


def main() -> None:
    spec = json.loads(sys.argv[1])
    results = []
    for i, scenario in enumerate(spec["scenarios"]):
        mount = Path(spec["mount_dir"]) / f"fs{i}"
        mount.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={scenario['size']}", "tmpfs", str(mount)], check=True)
        error = None
        try:
            run_step(scenario["step"], mount, spec)
        except Exception as caught:  # what the step raised is the result
            error = {"type": type(caught).__name__, "message": str(caught)}
        files = sorted(str(p.relative_to(mount)) for p in mount.rglob("*") if not p.is_dir())
        results.append({**scenario, "mount": str(mount), "error": error, "files": files})
    print(json.dumps(results))


if __name__ == "__main__":
    main()
