"""One rank of the tensor-parallel loss check (driven by test_tensor_parallel.py, not collected).

usage: python tp_worker.py RANK WORLD STORE_FILE INPUTS.pt OUT_DIR
Each rank keeps its vocab slice of the logits, computes every case through megatron-core's
tensor-parallel path and saves the loss and the gradient of its slice.
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def run_rank(rank: int, world: int, store_file: str, inputs_path: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", store=dist.FileStore(store_file, world), rank=rank, world_size=world, timeout=timedelta(seconds=90)
    )
    from megatron.core import parallel_state

    try:
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=world, distributed_timeout_minutes=2)
        from synthkd_training.losses import SpanLossConfig, span_ce_loss, span_kd_loss

        inputs = torch.load(inputs_path)
        part = inputs["logits"].shape[-1] // world
        columns = slice(rank * part, (rank + 1) * part)
        results = {}
        for name, case in inputs["cases"].items():
            config = SpanLossConfig(**case["config"])
            student = inputs["logits"][..., columns].clone().requires_grad_()
            before = student.detach().clone()
            if case["kind"] == "ce":
                result = span_ce_loss(student, inputs["labels"], inputs["span_id"], config)
            else:
                teacher = inputs["teacher"][..., columns]
                result = span_kd_loss(student, teacher, inputs["span_id"], config)
            result.loss.backward()
            results[name] = {
                "loss": result.loss.detach(),
                "grad": student.grad,
                "unchanged": torch.equal(student.detach(), before),
                "counts": {k: int(v) for k, v in result.token_counts.items()},
            }
        # this process started bare: record whether importing all of synthkd_training pulled in dagster
        import synthkd_training.synthetic  # noqa: F401  (the dataset and losses modules are loaded)

        results["dagster_modules"] = sorted(m for m in sys.modules if m.split(".")[0] == "dagster")
        results["synthkd_training_modules"] = sorted(m for m in sys.modules if m.startswith("synthkd_training"))
        torch.save(results, f"{out_dir}/rank{rank}.pt")
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


if __name__ == "__main__":
    run_rank(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:6])
