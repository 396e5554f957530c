"""Span-aware Megatron-Core GPT dataset (000 "Megatron integration contract").

`SpanGPTDataset` is megatron-core's `GPTDataset` plus the two sibling arrays of every shard:
Megatron builds and caches its document / sample / shuffle indices exactly as for a plain GPT run
(GPT-style slicing across document boundaries, blends, per-split paths, epochs), and every sample
reads the `…_lossmask` and `…_span` windows through the very same (document, offset, length)
pieces as the `…_tokens` window. One helper (`_read_aligned_windows`) walks the indices for all
three arrays, so they cannot drift apart.

The stored arrays are aligned to labels: for a document of n tokens, `lossmask[i]` / `span[i]`
describe token i+1, and position n-1 (the EOD) carries 0/0. A sample starting at global token
offset a with `sequence_length` L therefore takes `tokens[a:a+L]` as input, `tokens[a+1:a+L+1]`
as labels and `stored[a:a+L]` as its `loss_mask` / `span_id`, whatever documents it crosses.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.indexed_dataset import IndexedDataset
from megatron.core.datasets.utils import Split

from synthkd_contract import constants
from synthkd_contract.manifest_seal import (
    ManifestError,
    dataset_root_of,
    listed_file_problems,
    manifest_files,
    read_sealed_manifest,
    require_dataset,
    verify_manifest,
)
from synthkd_contract.trio import (
    LOSSMASK_KIND,
    SPAN_KIND,
    TOKENS_KIND,
    TOKENS_SUFFIX,
    TrioError,
    index_cache_problems,
    megatron_cache_dir,
    sibling_prefix,
    validate_trio,
)


class SpanDatasetError(ValueError):
    """A `…_tokens` / `…_lossmask` / `…_span` trio that cannot be trained on as one dataset."""


class O200kHarmonyIds:
    """The token-id facts megatron-core's GPT dataset needs about o200k_harmony; no text tokenization.

    `GPTDatasetConfig.tokenizer` is only asked for `eod` (position ids / attention masks / EOD loss
    masking), `pad` (Megatron's own padding of short samples), `vocab_size` (index dtype) and
    `unique_identifiers` (index cache key). The data is pre-tokenized, so nothing else is needed.
    """

    eod: int = constants.EOD_TOKEN_ID
    """`<|endoftext|>`, appended after every conversation."""

    pad: int = -1
    """o200k_harmony has no pad token: -1 never occurs in the data, so Megatron masks only the
    padding it adds itself (partial validation samples), and maps it to id 0 in `tokens`/`labels`."""

    vocab_size: int = constants.PADDED_VOCAB_SIZE
    """o200k_harmony defines every id in [0, 201088): mergeable ranks up to 199997, special and
    reserved tokens 199998..201087."""

    @property
    def eos(self) -> int:
        return self.eod

    @property
    def unique_identifiers(self) -> OrderedDict:
        return OrderedDict(
            {
                "class": f"{type(self).__module__}.{type(self).__qualname__}",
                "eod": self.eod,
                "vocab_size": self.vocab_size,
            }
        )


def tokens_prefixes(split_dir: str | Path) -> list[str]:
    """Every `shard_XX_tokens` prefix present in a split directory, sorted (a Megatron blend list). In a built
    dataset (a `manifest.json` above the split directory) the shards present must be exactly those the manifest
    lists: a listed file missing (a build stopped after it removed a shard and before it rewrote the manifest, a
    deleted file) or a trio it does not list is a SpanDatasetError naming them, never a dataset quietly short
    of shards, and a listed file of another size too; their sha256 is `check_trio_against_manifest`'s."""
    split_dir = Path(split_dir)
    present = sorted(str(path)[: -len(".idx")] for path in split_dir.glob(f"shard_*{TOKENS_SUFFIX}.idx"))
    root = split_dir.parent
    if not (root / constants.MANIFEST_FILENAME).is_file():
        return present  # a trio outside a built dataset (tests, hand-made data): nothing to check against
    manifest, problems = read_sealed_manifest(root / constants.MANIFEST_FILENAME)
    records = (manifest_files(manifest) if manifest is not None else None) or []
    listed = [r["path"] for r in records if Path(r["path"]).parent == Path(split_dir.name) and "shard_" in r["path"]]
    if manifest is not None:  # each listed file there (its size too; sha256 is check_trio_against_manifest's)
        problems += listed_file_problems(root, manifest, only=listed, hash_files=False)
    listed_prefixes = {str(root / path)[: -len(".idx")] for path in listed if path.endswith(f"{TOKENS_SUFFIX}.idx")}
    problems += [f"{prefix}.idx is not listed in the manifest" for prefix in present if prefix not in listed_prefixes]
    if problems:
        raise SpanDatasetError(
            f"{split_dir}: the shards present are not the ones {root / constants.MANIFEST_FILENAME} lists "
            f"(rebuild the dataset; verify_manifest names every problem): {'; '.join(problems)}"
        )
    return present


@dataclass
class SpanGPTDatasetConfig(GPTDatasetConfig):
    """`GPTDatasetConfig` for synth_kd_v1 trios. Blends and per-split paths name `…_tokens` prefixes,
    exactly as for a plain Megatron GPT run; the sibling arrays are found next to each prefix.

    Same fields as megatron-core's config, with contract-appropriate defaults for the ones it
    requires, plus `validate_mask_values`.
    """

    reset_position_ids: bool | None = False
    """As in GPTDatasetConfig: restart position ids after every EOD."""

    reset_attention_mask: bool | None = False
    """As in GPTDatasetConfig: block attention across EOD boundaries."""

    eod_mask_loss: bool | None = False
    """As in GPTDatasetConfig: zero the loss where the input token is EOD. The stored loss mask
    already does so (the EOD position carries 0), so this changes nothing for sound data."""

    tokenizer: object | None = field(default_factory=O200kHarmonyIds)
    """Anything with `eod`, `vocab_size`, `unique_identifiers` (and optionally `pad`); `eod` must
    be the contract's EOD id 199999."""

    validate_mask_values: bool = True
    """Scan, at construction, every lossmask/span value of the documents a dataset exposes and
    fail unless lossmask is in {0,1}, span in {0,1,2}, `lossmask == 0` exactly where `span == 0`,
    and each document ends with EOD at a position that is 0/0. Reads 2 bytes per token and the EOD
    of each document (chunked, bounded memory); leave on unless the trio has been validated already
    and start-up time matters."""

    verify: bool = False
    """Re-hash, at construction, the six files of every trio a dataset opens and fail unless each
    matches the sha256 that the dataset's sealed `manifest.json` records; a missing manifest is then an
    error too. Whether or not this is set, a trio inside a dataset (the nearest directory above it with a
    `manifest.json`: synth_kd_v1's root, or the pool's for a cell trio named by a curriculum stage) is checked
    against it cheaply: the manifest against its sidecar seal, every blocking check of the build passed on it,
    each file's size, and the sha256 of the small ones (the indexes; `SMALL_FILE_BYTES`)."""

    def __post_init__(self) -> None:
        if self.path_to_cache is None:  # megatron-core's default is inside the dataset, next to the .bin files
            self.path_to_cache = str(megatron_cache_dir())
        super().__post_init__()
        if self.mock:
            raise ValueError(
                "SpanGPTDatasetConfig needs real data: give `blend` or `blend_per_split` (mock data has no spans)"
            )
        if getattr(self.tokenizer, "eod", None) != constants.EOD_TOKEN_ID:
            raise ValueError(
                f"tokenizer.eod is {getattr(self.tokenizer, 'eod', None)!r}, the contract's EOD id is "
                f"{constants.EOD_TOKEN_ID}"
            )
        if self.sequence_length < 1:
            raise ValueError(f"sequence_length must be positive, got {self.sequence_length}")
        blends = [self.blend] if self.blend is not None else list(self.blend_per_split or [])
        for blend in blends:
            if blend is not None:
                for prefix in blend[0]:
                    try:
                        sibling_prefix(prefix, LOSSMASK_KIND)  # raises unless it is a `…_tokens` prefix
                    except TrioError as error:
                        raise SpanDatasetError(f"SpanGPTDataset blend: {error}") from None
        for split, blend in zip(Split, self.blend_per_split or []):
            self._refuse_sample_less_prefixes(split, blend)

    def _refuse_sample_less_prefixes(self, split: Split, blend) -> None:
        """An unweighted blend of several prefixes is weighted by each prefix's samples, and megatron-core
        asserts (a bare AssertionError) that none has 0: name the prefixes too short for one sample."""
        if blend is None or blend[1] is not None or len(blend[0]) < 2:
            return
        if split != Split.train and not self.drop_last_partial_validation_sequence:
            return  # a short prefix still gives one (padded) sample
        needed = self.sequence_length + int(self.add_extra_token_to_sequence)
        counts = [(prefix, _token_count(prefix)) for prefix in blend[0]]
        short = [(prefix, tokens) for prefix, tokens in counts if tokens is not None and tokens < needed]
        if short:
            listed = ", ".join(f"{prefix} ({tokens} tokens)" for prefix, tokens in short[:5])
            raise SpanDatasetError(
                f"{split.name} split: {len(short)} of its {len(blend[0])} prefixes hold fewer tokens than one sample "
                f"(sequence_length {self.sequence_length} + {int(self.add_extra_token_to_sequence)}): "
                f"{listed}. Megatron "
                "weights an unweighted blend by each prefix's samples and cannot use a weight of 0: drop those "
                "prefixes, give the blend weights (token_weights(prefixes): each by its tokens), or use a shorter "
                "sequence_length"
            )


class SpanGPTDataset(GPTDataset):
    """megatron-core `GPTDataset` whose items also carry the stored `loss_mask` and `span_id`.

    Items are Megatron's (`tokens`, `labels`, `loss_mask`, `position_ids`, and `attention_mask`
    when `create_attention_mask`) plus `span_id` (int64), all of length `sequence_length`:
    `loss_mask` (float) is Megatron's own mask (padding, optional EOD masking) times the stored
    label-aligned mask, and `span_id` is the stored span id, forced to 0 wherever `loss_mask` is 0.

    Construction fails fast (SpanDatasetError naming the tokens prefix) unless the trio is sound by
    `synthkd_contract.trio.validate_trio`, the check the build runs on every shard: siblings present,
    dtypes, sequences, `sequence_lengths`, `document_indices` and .bin sizes as the tokens dataset's,
    and (with `validate_mask_values`) every value within the contract. Built like GPTDataset,
    normally through `BlendedMegatronDatasetBuilder`.
    """

    def __init__(
        self,
        indexed_dataset: IndexedDataset,
        dataset_path: str | None,
        indexed_indices: np.ndarray,
        num_samples: int | None,
        index_split: Split,
        config: SpanGPTDatasetConfig,
    ) -> None:
        if dataset_path is None:
            raise SpanDatasetError("SpanGPTDataset needs a `…_tokens` dataset path (mock data is not supported)")
        # everything is checked before Megatron builds (and caches) any index for this prefix
        problems = validate_trio(
            dataset_path,
            check_values=getattr(config, "validate_mask_values", True),
            sequences=_exposed_sequences(indexed_indices, len(indexed_dataset)),
        )
        if problems:
            raise SpanDatasetError(f"{dataset_path}: " + "; ".join(problems))
        refuse_unsafe_index_cache(config.path_to_cache)  # megatron-core loads its cached indices next
        self.siblings = {
            kind: IndexedDataset(sibling_prefix(dataset_path, kind), multimodal=False, mmap=config.mmap_bin_files)
            for kind in (LOSSMASK_KIND, SPAN_KIND)
        }
        self._window = threading.local()
        super().__init__(indexed_dataset, dataset_path, indexed_indices, num_samples, index_split, config)

    @staticmethod
    def build_low_level_dataset(dataset_path: str, config: GPTDatasetConfig) -> IndexedDataset:
        """megatron-core's tokens IndexedDataset, after checking the trio against the dataset manifest
        (see `SpanGPTDatasetConfig.verify`); an unreadable index names its file."""
        check_trio_against_manifest(str(dataset_path), bool(getattr(config, "verify", False)))
        try:
            return GPTDataset.build_low_level_dataset(dataset_path, config)
        except Exception as error:  # megatron asserts / numpy ValueError on a short or foreign index
            raise SpanDatasetError(
                f"{dataset_path}.idx: tokens index not readable by megatron-core (truncated or not an "
                f"IndexedDataset index?): {type(error).__name__}: {error}"
            ) from error

    @staticmethod
    def _key_config_attributes() -> list[str]:
        # both change the sample index megatron builds, so they must key its cache too
        return GPTDataset._key_config_attributes() + [
            "add_extra_token_to_sequence",
            "drop_last_partial_validation_sequence",
        ]

    # -- one walk of the document/sample/shuffle indices for all three arrays --------------------
    def _read_aligned_windows(self, idx: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """kind -> window of sample `idx`, and the document ids it covers.

        Mirrors GPTDataset._query_document_sample_shuffle_indices (megatron-core 0.16.1) and reads
        each (document, offset, length) piece from the tokens dataset and both siblings alike; the
        tokens window is padded with Megatron's pad id, the siblings with 0 (no loss).
        """
        if self.shuffle_index is None:  # defer_npy_index_mmap: lazily memory-map the indices
            self.shuffle_index = np.load(self.path_to_shuffle_index, allow_pickle=False, mmap_mode="r")
            self.sample_index = np.load(self.path_to_sample_index, allow_pickle=False, mmap_mode="r")
            self.document_index = np.load(self.path_to_document_index, allow_pickle=False, mmap_mode="r")

        datasets = {TOKENS_KIND: self.dataset, **self.siblings}
        extra = int(self.config.add_extra_token_to_sequence)
        idx = self.shuffle_index[idx]
        doc_beg, offset_beg = self.sample_index[idx]
        doc_end, offset_end = self.sample_index[idx + 1]

        pieces: list[tuple[int, int, int | None]] = []
        if doc_beg == doc_end:
            pieces.append((doc_beg, int(offset_beg), int(offset_end - offset_beg + extra)))
        else:
            for i in range(doc_beg, doc_end + 1):
                offset = 0 if i > doc_beg else int(offset_beg)
                length = None if i < doc_end else int(offset_end + extra)
                pieces.append((i, offset, length))

        document_ids = np.array([self.document_index[i] for i, _, _ in pieces], dtype=np.int64)
        parts: dict[str, list] = {kind: [] for kind in datasets}
        for i, offset, length in pieces:
            document = self.document_index[i]
            for kind, dataset in datasets.items():
                parts[kind].append(dataset.get(document, offset=offset, length=length))

        wanted = self.config.sequence_length + extra
        windows = {}
        for kind, kind_parts in parts.items():
            missing = wanted - sum(map(len, kind_parts))
            if missing > 0:
                fill = self._pad_token_id if kind == TOKENS_KIND else 0
                kind_parts.append(np.full(missing, fill, dtype=np.int64))
            windows[kind] = np.concatenate(kind_parts, dtype=np.int64)
        return windows, document_ids

    def _query_document_sample_shuffle_indices(self, idx: int) -> tuple[np.ndarray, np.ndarray]:
        """GPTDataset's hook, served by the shared walk; the sibling windows of the same walk are
        kept (per thread) for `__getitem__`."""
        windows, document_ids = self._read_aligned_windows(idx)
        self._window.siblings = {kind: windows[kind] for kind in self.siblings}
        return windows[TOKENS_KIND], document_ids

    def __getitem__(self, idx: int | None) -> dict[str, torch.Tensor]:
        item = super().__getitem__(idx)  # calls _query_document_sample_shuffle_indices exactly once
        if self.masks_and_position_ids_are_cached:
            # megatron-core 0.16.1 caches the loss mask it then zeroes in place at a padded sample's padding
            # (`loss_mask[labels == pad] = 0` on the cached tensor itself): every later sample of this dataset
            # lost its loss at those positions. What it may cache (no resets, no EOD masking) is all ones.
            self.cached_loss_mask = torch.ones_like(self.cached_loss_mask)
        siblings = getattr(self._window, "siblings", None)
        if siblings is None:  # only if a future megatron-core stops reading through the hook
            raise RuntimeError("GPTDataset.__getitem__ did not call _query_document_sample_shuffle_indices")
        self._window.siblings = None
        length = item["tokens"].shape[0]
        # label-aligned: the first `length` stored values describe labels[0:length]
        stored_mask = torch.from_numpy(siblings[LOSSMASK_KIND][:length]).to(item["loss_mask"].dtype)
        loss_mask = item["loss_mask"] * stored_mask
        span_id = torch.from_numpy(siblings[SPAN_KIND][:length])
        item["loss_mask"] = loss_mask
        item["span_id"] = torch.where(loss_mask > 0, span_id, torch.zeros_like(span_id))
        return item

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_window", None)  # thread-local, rebuilt on unpickling (DataLoader workers)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._window = threading.local()


# -- fail-fast checks --------------------------------------------------------------------------
def check_trio_against_manifest(tokens_prefix: str, verify: bool) -> None:
    """The trio of `tokens_prefix` against its dataset's sealed manifest (`dataset_root_of`: synth_kd_v1's root
    above the split directory, the pool's above its cell directories): the seal, the blocking checks, the six
    files' sizes and the small ones' sha256 whenever a manifest is there, every sha256 and a manifest required
    when `verify`. SpanDatasetError naming every mismatching file."""
    prefix = Path(tokens_prefix)
    root = dataset_root_of(prefix)
    if root is None:
        if verify:
            raise SpanDatasetError(
                f"{tokens_prefix}: {prefix.parent.parent / constants.MANIFEST_FILENAME} is missing, and so is any "
                f"{constants.MANIFEST_FILENAME} further up: not a trio of a built dataset, nothing to verify it against"
            )
        return  # a trio outside a built dataset (tests, hand-made data): nothing to check against
    names = [
        Path(sibling_prefix(prefix.absolute(), kind)).relative_to(root).as_posix() + ext
        for kind in constants.ARRAY_KINDS
        for ext in (".bin", ".idx")
    ]
    try:
        verify_manifest(root, files=names, hash_files=verify)
    except ManifestError as error:
        raise SpanDatasetError(f"{tokens_prefix}: does not match its dataset manifest: {error}") from error


def _token_count(tokens_prefix: str) -> int | None:
    """Tokens in a prefix's documents; None when it cannot be opened (the dataset reports that, naming it)."""
    if not Path(f"{tokens_prefix}.idx").is_file():
        return None
    try:
        dataset = IndexedDataset(str(tokens_prefix))  # keep it alive while its index arrays are read
    except Exception:  # a truncated or foreign .idx: the dataset build names it (SpanDatasetError)
        return None
    return int(dataset.sequence_lengths.sum(dtype=np.int64))


def _exposed_sequences(indexed_indices: np.ndarray | None, count: int) -> tuple[int, int]:
    """(first, end) of the sequences a dataset exposes, whose values are checked: all of them when megatron
    does not say (fast_cache_load); else the hull of its split indices (a contiguous range)."""
    if indexed_indices is None:
        return 0, count
    if len(indexed_indices) == 0:
        return 0, 0
    return int(np.min(indexed_indices)), int(np.max(indexed_indices)) + 1


# -- building ---------------------------------------------------------------------------------
def build_span_datasets(
    config: SpanGPTDatasetConfig,
    sizes: Sequence[int | None],
    is_built_on_rank: Callable[[], bool] | None = None,
) -> list:
    """[train, valid, test] datasets through megatron-core's `BlendedMegatronDatasetBuilder`.

    `sizes` are the minimum numbers of samples per split (None: one epoch), as in Megatron
    (`train_iters * global_batch_size`, ...). Each entry is a `SpanGPTDataset`, a `BlendedDataset`
    of them (several prefixes), or None. `is_built_on_rank` defaults to "always"; in a
    model-parallel run pass Megatron's usual one (first/last pipeline stage, TP rank 0).
    """
    if len(sizes) != len(Split):
        raise ValueError(f"sizes must give one entry per split {[s.name for s in Split]}, got {list(sizes)}")
    blends = [config.blend] if config.blend is not None else list(config.blend_per_split or [])
    if (
        config.path_to_cache
        and not torch.distributed.is_initialized()
        and any(blend is not None and len(blend[0]) > 1 for blend in blends)
    ):
        # megatron-core 0.16.1's BlendedDataset asks torch.distributed for the rank whenever it has
        # a cache path; say so instead of failing deep inside it
        raise ValueError(
            "blending several prefixes with path_to_cache set needs torch.distributed initialized "
            "(megatron-core's BlendedDataset queries the rank); on a single process use "
            "torch.distributed.init_process_group('gloo', store=torch.distributed.HashStore(), rank=0, world_size=1)"
        )
    refuse_unsafe_index_cache(config.path_to_cache)  # the blends' cached indices are loaded from it too
    builder = BlendedMegatronDatasetBuilder(SpanGPTDataset, list(sizes), is_built_on_rank or (lambda: True), config)
    return builder.build()


def refuse_unsafe_index_cache(cache_dir: str | Path | None) -> None:
    """SpanDatasetError unless every `.npy` in megatron-core's index cache is a plain array
    (`synthkd_contract.trio.index_cache_problems`): megatron-core loads them with `allow_pickle=True`."""
    if problems := index_cache_problems(cache_dir):
        raise SpanDatasetError(
            f"megatron-core's index cache {cache_dir} holds files that are not its indices, refused unread (remove "
            f"them, or use a cache directory only you can write): {'; '.join(problems)}"
        )


KD_DATASETS = (constants.DATASET_NAME, constants.SMOKE_DATASET_NAME, constants.SYNTHETIC_DATASET_NAME)


def token_weights(prefixes: Sequence[str]) -> list[float]:
    """Each prefix's tokens, as blend weights: samples are drawn from each shard in proportion to its tokens,
    as an unweighted Megatron blend does for one epoch, but for any number of samples (an unweighted blend
    stops at one epoch), and a prefix shorter than one sample still contributes (an unweighted blend of
    several refuses it: 0 samples)."""
    counts = [_token_count(prefix) for prefix in prefixes]
    unreadable = [prefix for prefix, count in zip(prefixes, counts) if count is None]
    if unreadable:
        raise SpanDatasetError(f"cannot read the index of {', '.join(f'{p}.idx' for p in unreadable)}")
    return [float(count) for count in counts]


def train_valid_datasets(
    data_root: str | Path,
    *,
    sequence_length: int,
    seed: int,
    train_samples: int,
    valid_samples: int | None,
    cache_dir: str | Path,
    verify: bool = True,
) -> tuple[object, object | None]:
    """The train and valid datasets of a synth_kd_v1 root: train's prefixes blended by their tokens
    (`token_weights`: the build's token mix, whatever the shards' sizes), `train_samples` samples; valid's
    `valid_samples` samples the same way, or (None) one epoch: every valid document once, the last partial
    sample of each shard padded (loss mask 0); valid is None when there is no valid trio. The root must hold
    its sealed manifest: a build stopped before its manifest pass leaves trios without one, which are not
    trained on as a dataset (`tokens_prefixes` then checks the shards present are the ones it lists); a path
    that does not exist, a split directory or another dataset (synth_distill, the pool) is refused, saying
    which. The whole dataset is verified first (`verify_manifest`: its seal, its blocking checks, no unlisted
    file, every listed file's size and the sha256 of the small ones, shard records and documents tables
    included); `verify`: every file's sha256 (False: the `.bin` files of more than `SMALL_FILE_BYTES` by size
    only, for a large dataset checked before)."""
    data_root = Path(data_root)
    try:
        require_dataset(data_root, KD_DATASETS, constants.DATASET_NAME)
        verify_manifest(data_root, hash_files=verify)
    except ManifestError as error:
        raise SpanDatasetError(str(error)) from None
    train_prefixes = tokens_prefixes(data_root / "train")
    if not train_prefixes:
        raise SpanDatasetError(f"no shard_XX_tokens trio under {data_root / 'train'}: build the dataset first")
    valid_prefixes = tokens_prefixes(data_root / "valid")
    one_epoch = valid_samples is None
    # one epoch of valid: Megatron's own unweighted path, every document once, a shard shorter than one sample
    # giving one padded sample (weights would fill a sample count by repeating short shards' documents)
    valid_blend = (valid_prefixes, None if one_epoch else token_weights(valid_prefixes)) if valid_prefixes else None
    # Megatron draws ceil(weight x samples) from each prefix, up to one sample more per prefix than a prefix's
    # own share x (1 + surplus): with few samples over many prefixes its default surplus (0.5%) falls short
    asked = [(train_prefixes, train_samples)] + ([] if one_epoch else [(valid_prefixes, valid_samples)])
    surplus = max([0.005] + [len(prefixes) / max(1, samples) for prefixes, samples in asked])
    config = SpanGPTDatasetConfig(
        random_seed=seed,
        sequence_length=sequence_length,
        blend_per_split=[(train_prefixes, token_weights(train_prefixes)), valid_blend, None],
        path_to_cache=str(cache_dir),
        verify=False,  # every file was verified above, hashed with `verify`
        drop_last_partial_validation_sequence=not one_epoch,
        mid_level_dataset_surplus=surplus,
    )
    train, valid, _ = build_span_datasets(config, [train_samples, valid_samples if valid_prefixes else None, None])
    return train, valid
