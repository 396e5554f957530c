"""synthkd_contract: the one home of the contract's rules, shared by the build and the training loader.

- importing the training side (and every contract module) pulls in neither dagster nor synthkd_assets;
- every drop / sanitization reason is registered with a description, and no package module spells one;
- `label_align` is the plain one-position shift, checked against a brute-force loop;
- `validate_trio` finds each corruption of a trio, and only the sequences it is asked about.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from synthkd_assets.core.megatron_io import MegatronShardWriter
from synthkd_contract import constants, drops
from synthkd_contract.labels import label_align, supervision_arrays, token_align
from synthkd_contract.trio import shard_tokens_prefix, sibling_prefix, trio_files, validate_trio
from synthkd_training.synthetic import Document, synthetic_document, write_documents
from tests.helpers import REPO_ROOT

CONTRACT_MODULES = ("constants", "schemas", "drops", "labels", "trio", "manifest_seal", "buckets", "sources")


def test_training_and_contract_import_neither_dagster_nor_synthkd_assets():
    """A fresh interpreter, as on a training node: the loader, the losses, the synthetic writer and the contract."""
    imports = "; ".join(
        ["import synthkd_training", "import synthkd_training.synthetic"]
        + [f"import synthkd_contract.{name}" for name in CONTRACT_MODULES]
    )
    probe = (
        f"{imports}; import sys, json; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'synthkd_assets'))))"
    )
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_the_contract_package_imports_no_megatron_until_a_trio_is_opened():
    """The Dagster code location imports synthkd_contract.trio; megatron-core (and torch) cost seconds to load."""
    imports = "; ".join(f"import synthkd_contract.{name}" for name in CONTRACT_MODULES)
    probe = f"{imports}; import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in ('megatron', 'torch')))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# -- the drop-reason registry -------------------------------------------------------------------
def test_every_reason_is_registered_once_with_a_description():
    by_step = [reason for reasons in drops.DROP_REASONS_BY_STEP.values() for reason in reasons]
    assert set(by_step) == set(drops.DROP_DESCRIPTIONS)
    assert set(drops.SANITIZED_KEYS) | set(drops.SOURCE_SANITIZED_KEYS) == set(drops.SANITIZED_DESCRIPTIONS)
    assert len(drops.SANITIZED_KEYS) == len(set(drops.SANITIZED_KEYS))
    for reasons in drops.DROP_REASONS_BY_STEP.values():
        assert len(reasons) == len(set(reasons))
    for description in (*drops.DROP_DESCRIPTIONS.values(), *drops.SANITIZED_DESCRIPTIONS.values()):
        assert description and "\n" not in description


def _string_constants(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every string literal, and of the literal head of every f-string."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            head = node.values[0] if node.values else None
            if isinstance(head, ast.Constant) and isinstance(head.value, str):
                found.append((node.lineno, head.value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))
    return found


def test_no_package_module_spells_a_reason():
    """Code counts a reason through its constant in synthkd_contract/drops.py, never by its text."""
    reasons = set(drops.DROP_DESCRIPTIONS) | set(drops.SANITIZED_DESCRIPTIONS)
    families = {"missing_", "invalid_utf8_", "sampled_out_", "nul_in_", "null_"}  # the per-column / per-rule reasons
    spelled = []
    for package in ("synthkd_assets", "synthkd_training", "synthkd_contract"):
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            if path == REPO_ROOT / "synthkd_contract" / "drops.py":
                continue
            for line, text in _string_constants(ast.parse(path.read_text(encoding="utf-8"))):
                if text in reasons or text in families:
                    spelled.append(f"{path.relative_to(REPO_ROOT)}:{line}: {text!r}")
    assert spelled == []


# -- label_align ----------------------------------------------------------------------------------
int_arrays = st.sampled_from([np.uint8, np.int32, np.int64]).flatmap(
    lambda dtype: st.lists(st.integers(0, 127), max_size=40).map(lambda values: np.array(values, dtype=dtype))
)


@settings(max_examples=200, deadline=None)
@given(int_arrays)
def test_label_align_is_a_one_position_shift(per_token):
    n = len(per_token)
    brute_force = [int(per_token[i + 1]) if i + 1 < n else 0 for i in range(n)]
    aligned = label_align(per_token)
    assert aligned.dtype == per_token.dtype and aligned.tolist() == brute_force
    back = token_align(aligned)
    assert back.dtype == per_token.dtype
    assert back.tolist() == [0 if i == 0 else int(per_token[i]) for i in range(n)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([constants.SPAN_PROMPT, constants.SPAN_ANALYSIS, constants.SPAN_FINAL]), max_size=40))
def test_supervision_arrays_mask_exactly_the_non_prompt_labels(spans):
    token_spans = np.array([*spans, constants.SPAN_PROMPT], dtype=np.int64)  # the EOD closes every conversation
    loss_mask, span_id = supervision_arrays(token_spans)
    assert span_id.dtype == constants.SPAN_DTYPE and loss_mask.dtype == constants.LOSSMASK_DTYPE
    # token i+1's span at position i: the EOD's span (0) at the one before last, nothing after the EOD (0)
    assert span_id.tolist() == (spans[1:] + [0, 0] if spans else [0])
    assert loss_mask.tolist() == [int(s != constants.SPAN_PROMPT) for s in span_id.tolist()]
    assert span_id[-1] == 0 and loss_mask[-1] == 0


# -- validate_trio --------------------------------------------------------------------------------
def _documents(seed: int, count: int = 12) -> list[Document]:
    rng = np.random.default_rng(seed)
    return [synthetic_document(rng, min_tokens=5, max_tokens=30) for _ in range(count)]


def _trio(split_dir: Path, documents: list[Document]) -> str:
    return write_documents(split_dir, 0, documents)


def _rewrite(prefix: str, kind: str, documents: list[Document], dtype=None, group: int = 1) -> None:
    """Overwrite one array of the trio with megatron's builder (`group` sequences per document)."""
    array_of = {"tokens": "tokens", "lossmask": "loss_mask", "span": "span_id"}[kind]
    builder = IndexedDatasetBuilder(f"{sibling_prefix(prefix, kind)}.bin", dtype=dtype or constants.ARRAY_DTYPES[kind])
    for start in range(0, len(documents), group):
        arrays = [getattr(d, array_of) for d in documents[start : start + group]]
        builder.add_document(np.concatenate(arrays), [len(a) for a in arrays])
    builder.finalize(f"{sibling_prefix(prefix, kind)}.idx")


def _shift_pointer(prefix: str, kind: str, sequence: int, by: int) -> None:
    """Move one sequence pointer of an index (header 34 bytes, int32 lengths, then int64 pointers)."""
    path = Path(f"{sibling_prefix(prefix, kind)}.idx")
    payload = bytearray(path.read_bytes())
    count = int(np.frombuffer(payload, dtype="<u8", count=1, offset=18)[0])
    at = 34 + 4 * count + 8 * sequence
    pointer = int(np.frombuffer(payload, dtype="<i8", count=1, offset=at)[0])
    payload[at : at + 8] = np.array([pointer + by], dtype="<i8").tobytes()
    path.write_bytes(bytes(payload))


def _one_problem(prefix: str, **kwargs) -> str:
    problems = validate_trio(prefix, **kwargs)
    assert len(problems) == 1, problems
    return problems[0]


def test_a_sound_trio_has_no_problem(tmp_path):
    prefix = _trio(tmp_path / "train", _documents(1))
    assert prefix == str(shard_tokens_prefix(tmp_path / "train", 0))
    assert validate_trio(prefix) == []
    written = sorted(p.name for p in (tmp_path / "train").iterdir())
    assert written == sorted(p.name for p in trio_files(tmp_path / "train", 0))


@pytest.mark.parametrize("kind", constants.ARRAY_KINDS)
@pytest.mark.parametrize("change", [-1, +1])
def test_a_bin_of_another_size_than_its_index(tmp_path, kind, change):
    prefix = _trio(tmp_path / "train", _documents(1))
    path = Path(f"{sibling_prefix(prefix, kind)}.bin")
    payload = path.read_bytes()
    path.write_bytes(payload[:-1] if change < 0 else payload + b"\0")
    needed, held = len(payload), len(payload) + change
    assert _one_problem(prefix) == f"{kind} data file {path} holds {held} bytes, its index describes {needed}"


@pytest.mark.parametrize("sequence", [4, 11])
def test_an_index_whose_sequences_are_not_contiguous(tmp_path, sequence):
    """A middle pointer moved (the .bin size still matches the lengths), or the last one moved with the .bin
    grown to match it: either way megatron-core would read the wrong bytes."""
    prefix = _trio(tmp_path / "train", _documents(1))
    _shift_pointer(prefix, "span", sequence, 1)
    if sequence == 11:
        with open(f"{sibling_prefix(prefix, 'span')}.bin", "ab") as handle:
            handle.write(b"\0")
    assert "span index" in (problem := _one_problem(prefix)) and "does not describe contiguous sequences" in problem
    assert f"(sequence {sequence} starts at byte" in problem


def test_three_arrays_of_different_lengths(tmp_path):
    documents = _documents(1)
    prefix = _trio(tmp_path / "train", documents)
    _rewrite(prefix, "span", _documents(2))  # as many documents, of other lengths
    assert _one_problem(prefix).startswith("span sequence_lengths differ from tokens (first at sequence ")
    _rewrite(prefix, "span", documents[:-1])
    assert _one_problem(prefix) == "span has 11 sequences, tokens has 12"
    _rewrite(prefix, "span", documents)
    _rewrite(prefix, "lossmask", documents, group=2)  # same sequences, grouped into other documents
    assert _one_problem(prefix) == "lossmask document_indices differ from tokens"


@pytest.mark.parametrize("kind, dtype", [("tokens", np.int64), ("lossmask", np.int32), ("span", np.int32)])
def test_a_wrong_dtype(tmp_path, kind, dtype):
    documents = _documents(1)
    prefix = _trio(tmp_path / "train", documents)
    _rewrite(prefix, kind, documents, dtype=dtype)
    expected = np.dtype(constants.ARRAY_DTYPES[kind])
    assert _one_problem(prefix) == f"{kind} dtype is {np.dtype(dtype)}, the contract says {expected}"


def test_missing_and_unreadable_files(tmp_path):
    prefix = _trio(tmp_path / "train", _documents(1))
    idx = Path(f"{sibling_prefix(prefix, 'lossmask')}.idx")
    idx.write_bytes(idx.read_bytes()[:20])
    assert "lossmask dataset" in (problem := _one_problem(prefix)) and "not readable by megatron-core" in problem
    idx.unlink()
    assert _one_problem(prefix) == f"{idx} is missing"


def _with(documents: list[Document], index: int, **arrays) -> list[Document]:
    document = documents[index]
    changed = {"tokens": document.tokens, "loss_mask": document.loss_mask, "span_id": document.span_id}
    changed.update({name: value(changed[name].copy()) for name, value in arrays.items()})
    return [*documents[:index], Document(**changed), *documents[index + 1 :]]


def _set(position: int, value: int):
    def apply(array: np.ndarray) -> np.ndarray:
        array[position] = value
        return array

    return apply


@pytest.mark.parametrize(
    "arrays, expected",
    [
        ({"span_id": _set(-1, 3), "loss_mask": _set(-1, 1)}, "span value 3 outside [0, 2] at 1 positions"),
        ({"loss_mask": _set(0, 2)}, "lossmask value 2 outside [0, 1] at 1 positions, first at sequence 5, position 0"),
        ({"loss_mask": _set(0, 1), "span_id": _set(0, 0)}, "lossmask == 0 and span == 0 disagree at 1 positions"),
        ({"tokens": _set(-1, 7)}, "1 documents do not end with EOD"),
        ({"tokens": _set(1, constants.PADDED_VOCAB_SIZE)}, "tokens value 201088 outside [0, 201087] at 1 positions"),
        (
            {"tokens": _set(2, -5)},
            "tokens value -5 outside [0, 201087] at 1 positions, first at sequence 5, position 2",
        ),
        (
            {"loss_mask": _set(-1, 1), "span_id": _set(-1, constants.SPAN_FINAL)},
            "the last (EOD) position of 1 documents is not 0/0",
        ),
    ],
)
@pytest.mark.parametrize("chunk", [3, 1 << 22])
def test_values_outside_the_contract(tmp_path, monkeypatch, arrays, expected, chunk):
    monkeypatch.setattr("synthkd_contract.trio.CHECK_CHUNK_TOKENS", chunk)
    documents = _with(_documents(1), 5, **arrays)
    prefix = _trio(tmp_path / "train", documents)
    problems = validate_trio(prefix)
    assert any(expected in problem for problem in problems), problems
    assert all("sequence 5, position" in problem for problem in problems), problems
    assert validate_trio(prefix, check_values=False) == []
    # only the sequences asked about are scanned
    assert validate_trio(prefix, sequences=(0, 5)) == validate_trio(prefix, sequences=(6, 12)) == []
    assert validate_trio(prefix, sequences=(5, 6)) == problems


def test_the_synthetic_writer_and_the_build_writer_write_the_same_bytes(tmp_path):
    """synthkd_training's test-data writer uses megatron-core's builder directly; the build's
    MegatronShardWriter adds atomic publishing around the same builder: the files must not differ."""
    documents = _documents(3)
    write_documents(tmp_path / "synthetic", 0, documents)
    with MegatronShardWriter(tmp_path / "build", 0, "train") as writer:
        for document in documents:
            writer.add(document.tokens, document.loss_mask, document.span_id)
        writer.commit()
    for synthetic, built in zip(trio_files(tmp_path / "synthetic", 0), trio_files(tmp_path / "build", 0)):
        assert synthetic.read_bytes() == built.read_bytes(), synthetic.name
