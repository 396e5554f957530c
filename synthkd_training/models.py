"""Megatron-Core GPT models for the training side: one place that builds them, runs them and checkpoints them.

The examples and the distillation pieces (online KD, valuation features, learning-progress labels) all take a
plain `torch.nn.Module` that maps `(tokens, position_ids, attention_mask)` to `[b, s, V]` logits, as megatron-core's
`GPTModel` does when called without labels; what is here builds the small ones the tests and examples create from
a config (`GPTSpec`) and reads and writes checkpoints:

- `save_checkpoint(model, spec, directory)` writes `gpt_spec.json` (the architecture) and `model.pt` (the weights);
- `load_checkpoint(directory, device, micro_batch_size)` builds the model from `gpt_spec.json` and loads `model.pt`.
  (megatron-core's `torch_dist` checkpoint writer needs CUDA, so it is not the format of these CPU-made checkpoints.)
- `load_model(directory, ...)` opens either that or a Hugging Face causal-LM checkpoint (`config.json` +
  safetensors, e.g. openai/gpt-oss-20b as published: `GptOssForCausalLM`, MoE, attention sinks, YaRN), the
  latter behind `CausalLMAdapter`, so the teacher of every distillation function can be a real GPT-OSS checkpoint
  path. Any other model (a Megatron-Bridge GPT-OSS, say) is passed to the functions directly: they need nothing of
  it but the call above.

On CPU two megatron-core code paths that assume CUDA are sidestepped: the RNG tracker is the no-op one (no CUDA
RNG; dropout is 0 in these specs) and DotProductAttention's global scratch buffer is pre-allocated on the CPU;
positions are learned (megatron's RoPE moves its frequencies to CUDA). On a GPU none of this applies.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from synthkd_contract import constants
from synthkd_training.losses import HeadedLogits

SPEC_FILE = "gpt_spec.json"
"""The architecture of a checkpoint, beside megatron-core's distributed checkpoint files."""


@dataclass(frozen=True)
class GPTSpec:
    """A GPTModel built from megatron-core's local layer spec (what runs on a CPU)."""

    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    seq_length: int = 64
    vocab_size: int = constants.PADDED_VOCAB_SIZE
    ffn_hidden_size: int | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> GPTSpec:
        return cls(**json.loads(text))


class NoCudaError(RuntimeError):
    """CUDA was asked for where torch has none (a CPU build, or no visible GPU)."""


def pick_device(name: str = "auto") -> torch.device:
    """ "auto": CUDA when there is one, else CPU. "cuda" without one is refused here, naming why, rather than
    later by NCCL ("Distributed package doesn't have NCCL built in")."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        why = "a CPU build" if torch.version.cuda is None else "no visible CUDA device"
        raise NoCudaError(f"device {name!r} asked for, but torch {torch.__version__} has no CUDA here ({why})")
    return device


@contextmanager
def megatron_world(device: torch.device, seed: int) -> Iterator[None]:
    """World size 1, TP = PP = 1, seeded; tears down only what it created (a caller's world stays)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as tp_random

    created_world = not dist.is_initialized()
    if created_world:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    created_state = not parallel_state.model_parallel_is_initialized()
    if created_state:
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.set_device(0)
        tp_random.model_parallel_cuda_manual_seed(seed)
    else:
        # no CUDA RNG to fork on CPU: megatron's no-op ("inference") tracker, a nullcontext fork
        tp_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    try:
        yield
    finally:
        if created_state:
            parallel_state.destroy_model_parallel()
            tp_random.initialize_rng_tracker(force_reset=True)
        if created_world:
            dist.destroy_process_group()


CPU_HUGE_PAGES_VARIABLE = "THP_MEM_ALLOC_ENABLE"
"""PyTorch's switch that backs its large CPU tensors with transparent huge pages (2 MiB, `madvise`)."""


def cpu_tensors_on_huge_pages() -> None:
    """Back large CPU tensors with transparent huge pages (CPU_HUGE_PAGES_VARIABLE=1, unless it is set already).

    The losses' chunk tensors on a CPU are ~200 MB each (docs/distillation.md#long-windows). malloc maps every
    block that large afresh, and on 4 KiB pages the kernel faults and zeroes each one page by page, which takes
    longer than the arithmetic. PyTorch reads the variable once, at the process's first CPU tensor, so this is
    called before any tensor exists: by `training_session` on a CPU, and by tests/conftest.py for the test workers.
    It changes no value, only where the bytes live; with huge pages off in the kernel
    (/sys/kernel/mm/transparent_hugepage/enabled: never) it does nothing.
    """
    os.environ.setdefault(CPU_HUGE_PAGES_VARIABLE, "1")


@contextmanager
def training_session(
    device_name: str, seed: int, work_dir: Path | None, prefix: str
) -> Iterator[tuple[torch.device, Path]]:
    """What an example's run needs around it: the device (`pick_device`, so NoCudaError comes before anything is
    written; on a CPU, `cpu_tensors_on_huge_pages`), its work directory (a temporary one named `prefix...`,
    removed afterwards, when none is given) and `megatron_world`."""
    device = pick_device(device_name)
    if device.type == "cpu":
        cpu_tensors_on_huge_pages()
    with contextlib.ExitStack() as stack:
        if work_dir is None:
            work_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
        stack.enter_context(megatron_world(device, seed))
        yield device, work_dir


def reserve_cpu_attention_scratch(micro_batch_size: int, spec: GPTSpec) -> None:
    """DotProductAttention takes its [b*heads, s, s] scratch from a global buffer it allocates on
    torch.cuda.current_device(); on CPU, give it one at least as large as any model here will ask for."""
    from megatron.core import parallel_state

    numel = micro_batch_size * spec.num_attention_heads * spec.seq_length * spec.seq_length
    buffers = parallel_state.get_global_memory_buffer().buffer
    current = buffers.get(("mpu", torch.float32))
    if current is None or current.numel() < numel:
        buffers[("mpu", torch.float32)] = torch.empty(numel)


def build_gpt(spec: GPTSpec, device: torch.device, micro_batch_size: int) -> torch.nn.Module:
    """A randomly initialised GPTModel (seeded by `megatron_world`), on `device`, in float32."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads,
        ffn_hidden_size=spec.ffn_hidden_size,
        use_cpu_initialization=device.type == "cpu",
        attention_dropout=0.0,
        hidden_dropout=0.0,
        pipeline_dtype=torch.float32,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=spec.vocab_size,
        max_sequence_length=spec.seq_length,
        position_embedding_type="learned_absolute",
    )
    if device.type == "cpu":
        reserve_cpu_attention_scratch(micro_batch_size, spec)
    return model.to(device)


def forward_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[b, s, V] logits of a SpanGPTDataset batch (tokens / position_ids / attention_mask)."""
    return model(batch["tokens"], batch["position_ids"], batch["attention_mask"])


def forward_headed(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> HeadedLogits:
    """The logits of `forward_logits` as `HeadedLogits`: for megatron-core's GPTModel, the decoder's hidden states
    `[b, s, h]` (after its final layer norm) and the model's output layer, which the losses apply chunk by chunk;
    for any other model (or a GPTModel with multi-token prediction or sequence parallelism, whose output layer
    takes more than a slice of positions), its whole logits.

    GPTModel's forward returns the decoder's hidden states when its `post_process` is off (a pipeline stage
    without the output layer); the flag is off for this one call only."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    if (
        not isinstance(model, GPTModel)
        or not model.post_process
        or model.config.mtp_num_layers is not None
        or model.config.sequence_parallel
    ):
        return HeadedLogits(forward_logits(model, batch))
    model.post_process = False
    try:
        hidden = forward_logits(model, batch)  # [s, b, h]
    finally:
        model.post_process = True
    weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None

    def output_layer(states: torch.Tensor) -> torch.Tensor:
        return model.output_layer(states, weight=weight)[0]

    return HeadedLogits(hidden.transpose(0, 1), output_layer)


WEIGHTS_FILE = "model.pt"
"""The model's parameters: `torch.save` of its state dict without megatron's `_extra_state` entries."""


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {key: value for key, value in model.state_dict().items() if not key.endswith("_extra_state")}


def save_checkpoint(model: torch.nn.Module, spec: GPTSpec, directory: str | Path) -> Path:
    """Writes `gpt_spec.json` and `model.pt` into `directory`.

    Written into a sibling temporary directory first and renamed into place, so a crash never leaves a
    directory that looks like a complete checkpoint."""
    directory = Path(directory)
    partial = directory.with_name(f".{directory.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    torch.save({key: value.detach().cpu() for key, value in _weights(model).items()}, partial / WEIGHTS_FILE)
    (partial / SPEC_FILE).write_text(spec.to_json())
    if directory.exists():
        shutil.rmtree(directory)
    partial.rename(directory)
    return directory


def read_spec(directory: str | Path) -> GPTSpec:
    path = Path(directory) / SPEC_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: no {SPEC_FILE} (the checkpoint's architecture)")
    return GPTSpec.from_json(path.read_text())


def load_checkpoint(
    directory: str | Path, device: torch.device, micro_batch_size: int
) -> tuple[torch.nn.Module, GPTSpec]:
    """The model `save_checkpoint` wrote, on `device`, in eval mode; every parameter must be in the file."""
    spec = read_spec(directory)
    weights_path = Path(directory) / WEIGHTS_FILE
    if not weights_path.is_file():
        raise FileNotFoundError(f"{directory}: no {WEIGHTS_FILE}")
    model = build_gpt(spec, device, micro_batch_size)
    weights = torch.load(weights_path, map_location=device, weights_only=True)
    expected = set(_weights(model))
    if set(weights) != expected:
        raise ValueError(
            f"{weights_path}: parameters differ from {SPEC_FILE}'s model: "
            f"missing {sorted(expected - set(weights))[:5]}, unexpected {sorted(set(weights) - expected)[:5]}"
        )
    model.load_state_dict(weights, strict=False)
    model.eval()
    return model, spec


HF_CONFIG_FILE = "config.json"
"""What marks a Hugging Face checkpoint directory."""


class CausalLMAdapter(torch.nn.Module):
    """A Hugging Face causal LM behind GPTModel's call convention: `(tokens, position_ids, attention_mask)` ->
    `[b, s, V]` logits. The model builds its own mask from `position_ids`, which is what megatron's mask says for
    every batch here: causal, and, where the position ids restart (the stream's packed conversations,
    docs/pool.md#the-stream), nothing across conversations. `attention_mask` is not passed on.

    Models with per-layer attention kinds (`config.layer_types`: GPT-OSS's sliding-window and full layers) build
    their masks without the position ids, so the adapter builds them with transformers' own mask functions
    (packed sequences detected from the position ids) and hands the model that mapping; others (Llama, ...) detect
    packed sequences themselves."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        config = self.model.config
        layer_types = getattr(config, "layer_types", None)
        if not layer_types:
            return self.model(input_ids=tokens, position_ids=position_ids, use_cache=False).logits
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        embeds = self.model.get_input_embeddings()(tokens)
        arguments = {
            "config": config,
            "inputs_embeds": embeds,
            "attention_mask": None,
            "past_key_values": None,
            "position_ids": position_ids,
        }
        masks = {"full_attention": create_causal_mask(**arguments)}
        if "sliding_attention" in layer_types:
            masks["sliding_attention"] = create_sliding_window_causal_mask(**arguments)
        return self.model(inputs_embeds=embeds, attention_mask=masks, position_ids=position_ids, use_cache=False).logits


@dataclass(frozen=True)
class LoadedModel:
    """A model from a checkpoint directory, with what its callers must respect."""

    model: torch.nn.Module
    vocab_size: int
    """Width of its logits: teacher and student must agree."""
    max_positions: int
    """Longest sequence it takes (GPTSpec.seq_length, or the Hugging Face config's max_position_embeddings)."""
    kind: str
    """"gpt_spec" (save_checkpoint's format) or "huggingface"."""


def load_model(
    directory: str | Path, device: torch.device, micro_batch_size: int, dtype: torch.dtype | None = None
) -> LoadedModel:
    """The model of a `save_checkpoint` directory or of a Hugging Face causal-LM checkpoint, in eval mode.

    Hugging Face weights load in `dtype` (default: bfloat16 on CUDA, float32 on CPU); transformers is imported only
    for such a directory."""
    directory = Path(directory)
    if (directory / SPEC_FILE).is_file():
        model, spec = load_checkpoint(directory, device, micro_batch_size)
        return LoadedModel(model, spec.vocab_size, spec.seq_length, "gpt_spec")
    if (directory / HF_CONFIG_FILE).is_file():
        from transformers import AutoModelForCausalLM

        dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).to(device).eval()
        config = model.config
        return LoadedModel(CausalLMAdapter(model), config.vocab_size, config.max_position_embeddings, "huggingface")
    raise FileNotFoundError(
        f"{directory}: not a model checkpoint: neither {SPEC_FILE} + {WEIGHTS_FILE} (synthkd_training.models) "
        f"nor {HF_CONFIG_FILE} (a Hugging Face causal LM)"
    )


def to_device(batch: dict, device: torch.device) -> dict[str, torch.Tensor]:
    """The tensors of a batch on `device` (a DataLoader batch also carries non-tensor entries)."""
    return {key: value.to(device) for key, value in batch.items() if isinstance(value, torch.Tensor)}
