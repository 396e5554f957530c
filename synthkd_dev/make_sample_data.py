"""Deterministic generator of bundled sample input shaped like PleIAs/SYNTH as published.

    python -m synthkd_dev.make_sample_data            # rewrites data/sample/synth_raw byte for byte

Writes ``--shards`` Parquet files ``synth_001.parquet`` ... (SYNTH's own names) into ``--output-dir`` (default
``data/sample/synth_raw``), ``--rows-per-shard`` rows each, one row group per file as SYNTH's files are, with
exactly the upstream columns (``synthkd_contract.schemas.RAW_SCHEMA``): every column ``string`` except ``words``
(``int64``).

The rows follow the published figures of the corpus (its dataset card and exploratory statistics; the constants
below name each): the nine exercise labels as spelled (``math exercise``, ``constrained writing``, ...) in the
corpus's proportions (memorization ~90%), one generator ``model`` per exercise, SYNTH's ``synth_id`` shapes, its
language mix, its per-exercise empty-reasoning rates, its ``constraints`` and answer shapes (``result:15`` with
``**Answer: 15 systems**``, ``result:-74.5`` with ``A. 74.5%``, the MCQ key:value items, rag's ``<source_1>``
sources, ...), log-normal lengths fitted to the corpus's percentiles, reasoning in SYNTH's own notation, and its
structure: each seed text is an article section opening with its heading, shared (whole or its first paragraphs)
by many rows asking different questions. A few deliberately planted cases keep the bad-input rules exercised:
failed and inconsistent ``result:`` rows, blank answers and reasoning, CJK, emoji (ZWJ sequences included),
literal Harmony marker text and NUL characters. The text it draws from (titles, sentence templates, per-language
banks, snippets) is ``word_banks.json`` beside this module; how often each case occurs is set here.

Determinism: every row ``i`` (global index) is drawn from its own ``random.Random((seed << 40) | i)`` (an article
section from a ``Random`` of its own, shared by every row about it), so a row does not depend on how rows are
split into shards, nothing reads the clock or ``hash()``, and the Parquet files are written with fixed options
(zstd, one row group, no pandas metadata): two runs give byte-identical files for a given pyarrow version.

``--long`` makes every text 1.3x longer for benchmarks; it is off for the committed sample.

The bucket shard: after the ``--shards`` regular files, ``--bucket-rows`` rows (default 54; 0 writes no
such file) go into one more file, ``synth_005.parquet`` for the defaults. The regular shards draw their exercise
from the corpus's mix, so the small ones are rare and almost every conversation fits in 2048 tokens; the bucket
shard exists so the sample reaches every skill bucket and context bucket the pool maps
(``synthkd_contract/buckets.py``): its rows cycle through the exercises in ``EXERCISES`` order, and the
first ``BUCKET_LONG_PER_EXERCISE`` rows of each exercise are drawn at the ``XL`` size, whose rendered Harmony
sequence (user + seed text, analysis, final) is ~2.5k-6k o200k tokens: over the 2048 of C1, under the
8192 of C2 and of the DistillKit ``max_seq_len``. Everything else is drawn as for any row.

The near-duplicate shard: after the bucket shard, one more file (``synth_006.parquet`` for the
defaults; ``--near-dup-sources 0`` writes none) holds planted near-copies of regular rows, so the tests of the
near-duplicate clusters know the true pairs. ``--near-dup-sources`` (default 25) source rows are chosen
deterministically: slot ``s`` takes a row of regular shard ``s % shards`` with exercise ``EXERCISES[s % 9]``
that passes the 001 quality filters (non-blank answer, no failed or inconsistent ``result:``) and holds no
NUL or Harmony marker. Source ``s`` gets ``1 + s % 6`` copies (clusters of 2..7 rows counting the source:
with the defaults 85 copies, 12 clusters over the cap of 4, 8 of them over 5), copy ``k`` with synth_id
``<source>-nd<k>`` and one edit of ``NEAR_DUP_EDITS`` (in turn): case, whitespace, full-width characters
(NFKC folds all three back: Jaccard 1.0), a query word substituted, a phrase appended to or the last words
removed from the answer, a punctuation change (Jaccard >= 0.85 to the source and to the sibling copies).
Every other column is the source's. Then ``--hard-negatives`` (default 10) rows ``<source>-neg``: the query
of one of the shortest regular rows that pass the same test, asked of a row that is never written (indices from
``NEGATIVE_DONOR_BASE``; its seed text, reasoning and answer), the least similar of a few, its Jaccard to the
source under ``NEGATIVE_MAX_JACCARD``: same question about another section, not a near-duplicate. The text
compared is the question and the answer (synthkd_assets/core/near_dup.py ``signature_text``), normalized as
synthkd_contract/near_dup.py says. ``planted_near_duplicates()`` and ``planted_negatives()``
return the ground truth. Appending this shard leaves the rows and bytes of the earlier files unchanged.

Public API: ``generate_rows(n_rows, seed, start_index=0, long=False)``,
``generate_bucket_rows(n_rows, seed, start_index)``, ``planted_near_duplicates(...)``,
``planted_negatives(...)`` and
``write_shards(output_dir, shards, rows_per_shard, seed, long=False, bucket_rows=0, near_dup_sources=0,
hard_negatives=0)``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from synthkd_assets.core.filters import result_is_inconsistent
from synthkd_assets.core.near_dup import normalize_prompt, shingles, signature_text
from synthkd_contract import constants
from synthkd_contract.constants import RAW_COLUMNS
from synthkd_contract.schemas import RAW_SCHEMA
from synthkd_dev import SAMPLE_RAW_DIR

DEFAULT_OUTPUT_DIR = SAMPLE_RAW_DIR
DEFAULT_SHARDS = 4
DEFAULT_ROWS_PER_SHARD = 750
DEFAULT_SEED = 1234
DEFAULT_BUCKET_ROWS = 54  # 6 rows for each of the 9 exercises
DEFAULT_NEAR_DUP_SOURCES = 25  # source rows of planted near-copies (the near-duplicate shard)
DEFAULT_HARD_NEGATIVES = 10  # same query as a source, another seed text: not near-duplicates
COMPRESSION = "zstd"
COMPRESSION_LEVEL = 3


def shard_filename(position: int) -> str:
    """The name of the file at `position` (0, 1, ...): SYNTH's own `synth_001.parquet`, `synth_002.parquet`, ..."""
    return f"synth_{position + 1:03d}.parquet"


# ---------------------------------------------------------------------------------------------
# how often each kind of row occurs (the text itself is word_banks.json)
# ---------------------------------------------------------------------------------------------

WORD_BANKS_FILE = Path(__file__).with_name("word_banks.json")
_BANKS = json.loads(WORD_BANKS_FILE.read_text(encoding="utf-8"))

TITLES = _BANKS["titles"]
FIELDS = _BANKS["fields"]
PLACES = _BANKS["places"]
PEOPLE = _BANKS["people"]
ADJECTIVES = _BANKS["adjectives"]
SCRIPTS = _BANKS["scripts"]  # per exercise
SEED_SENTENCES = _BANKS["seed_sentences"]
EN = _BANKS["english"]
LANG = _BANKS["other_languages"]  # one small bank per non-English language (text really in that language)
MCQ_OPTIONS = _BANKS["mcq_options"]
ADDITIONAL_LINKS = _BANKS["additional_links"]
CJK_SNIPPETS = _BANKS["cjk_snippets"]
EMOJI = _BANKS["emoji"]
HARMONY_SNIPPETS = _BANKS["harmony_snippets"]
WHITESPACE_ONLY = _BANKS["whitespace_only"]

# Figures of PleIAs/SYNTH as published (its dataset card, published exploratory statistics): imitated, not
# tuned to. tests/test_sample_data.py states the proportions the bundled sample keeps.
# languages (200k-row sample: en ~80.7%, fr/de/es/it/pl ~3.2% each, nl/la ~1.6% each, ~0.15% null)
LANGUAGES = (
    ("en", 0.807),
    ("fr", 0.032),
    ("de", 0.032),
    ("es", 0.032),
    ("it", 0.031),
    ("pl", 0.031),
    ("nl", 0.016),
    ("la", 0.016),
    (None, 0.0015),
)
NON_ENGLISH = ("fr", "de", "es", "it", "pl", "nl", "la")
LANGUAGE_NAMES = {
    "fr": "french",
    "de": "german",
    "es": "spanish",
    "it": "italian",
    "pl": "polish",
    "nl": "dutch",
    "la": "latin",
}

# exercise labels as spelled, rows in a 20k-row sample of 5 files
EXERCISES = (
    ("memorization", 18152),
    ("mcq", 414),
    ("math exercise", 333),
    ("constrained writing", 316),
    ("rag", 206),
    ("math mcq", 177),
    ("editing", 159),
    ("creative writing", 148),
    ("cooking", 95),
)
# the generator `model` of each exercise
MODELS = {
    "memorization": "qwen-3-8b-memorization",
    "mcq": "qwen-3-8b-mcq",
    "math exercise": "deepseek-prover-drafter+deepseek-prover-solving",
    "constrained writing": "qwen-3-8b-constrained-writing",
    "rag": "qwen-3-8b-rag",
    "math mcq": "qwen-3-8b-mcq-math+deepseek-prover-8b-solving",
    "editing": "qwen-3-8b-editing",
    "creative writing": "qwen-3-8b-creative-writing",
    "cooking": "qwen-3-8b-memorization+seed rewriting with Qwen3",
}
# synth_id prefix of each exercise (memorization rows in another language: memorization_<language>_...)
SYNTH_ID_PREFIX = {
    "memorization": "memorization",
    "mcq": "synth_memory_mcq",
    "math exercise": "synth_math",
    "constrained writing": "synth_dataset_writing",
    "rag": "rag",
    "math mcq": "mcq_math",
    "editing": "synth_dataset_editing",
    "creative writing": "creative_writing",
    "cooking": "cooking",
}
# share of rows with an empty synthetic_reasoning, per exercise (the others: 0)
EMPTY_REASONING = {
    "constrained writing": 1.0,
    "editing": 1.0,
    "math mcq": 0.096,
    "creative writing": 0.068,
    "memorization": 0.0001,
}
# the word bank whose queries an exercise's rows draw (word_banks.json has no bank of its own for the others)
QUERY_BANK = {
    "memorization": "memorization",
    "cooking": "memorization",
    "rag": "rag",
    "constrained writing": "constrained_writing",
    "editing": "editing",
    "creative writing": "creative_writing",
}
MCQ_CONSTRAINT_VALUES = {
    "domain": ("history", "geography", "science", "arts", "politics"),
    "exercise": ("fact recall", "inference", "comparison", "chronology"),
    "answer_shape": ("standard", "negative", "all_of_the_above"),
    "exercise_pattern": ("sentence_following", "question_stem", "fill_in_the_blank"),
}
CONSTRAINED_WRITING = ("combination:repeat_prompt", "combination:word_count", "combination:no_commas, format:bullets")
EDITING = (
    "quality:corruption, stylistic:tone, structural:expansion",
    "quality:grammar, stylistic:register, structural:condensation",
)
CREATIVE_WRITING = (
    "form:Narrative, temporal:diegetic_time, stylistic:genre, character:protagonist",
    "form:Poem, temporal:present, stylistic:imagery, character:narrator",
)
UNITS = ("systems", "km", "people", "years", "metres", "documents", "hours", "books")
# section headings of the seed texts: each is an article section opening with its heading
SECTION_HEADINGS = ("History", "Geography", "Climate", "Economy", "Culture", "Etymology", "Legacy", "Overview")
SELF_KNOWLEDGE_URL = "Pleias self-knowledge"
LICENSE = "CC-By-SA (4.0)"

# probabilities of the special cases (per row)
P_EMPTY_ANSWER = 0.003
P_FAILED = 0.04  # among math exercise / math mcq rows: the generator's failure marker in constraints
P_INCONSISTENT = 0.04  # among math exercise / math mcq / mcq rows: the answer states another result
P_SHORT_SEED = 0.3  # the row's seed text is only the first paragraphs of its section ("most of it")
P_SELF_KNOWLEDGE = 0.005
P_HARMONY = 0.004  # robustness plants (the corpus's text can hold any of these): Harmony marker text,
P_NUL = 0.002  # NULs,
P_CJK = 0.01  # CJK and
P_EMOJI = 0.01  # emoji (ZWJ sequences included)
P_BLANK_REASONING = 0.1  # and, among the rows without a reasoning, one of whitespace only

# characters, (median, sigma of the log) of a log-normal, clipped to (min, max): the corpus's p50 and p90
# (query 159 / 433, seed text 702 / 2,470, reasoning 2,252 / 3,256, answer 1,417 / 1,902) give the sigmas
QUERY_CHARS = (159, 0.78, 25, 8279)
SEED_CHARS = (702, 0.98, 160, 14211)
REASONING_CHARS = (2252, 0.29, 300, 10058)
ANSWER_CHARS = (1417, 0.23, 120, 15320)
# row sizes: NORMAL draws the corpus's lengths; LONG (benchmarks) 1.3x; XL (bucket shard only) puts the whole
# rendered sequence in C2 (2048, 8192] tokens
NORMAL, LONG, XL = 0, 1, 2
SIZE_SCALE = (1.0, 1.3, 1.0)
XL_CHARS = {"seed": 6500, "reasoning": 6500, "answer": 5000}
# rows per exercise drawn at the XL size in the bucket shard (2 x 9 exercises: a few drops leave >= 6 in C2)
BUCKET_LONG_PER_EXERCISE = 2


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _weighted(rng: random.Random, pairs) -> str:
    return rng.choices([p[0] for p in pairs], weights=[p[1] for p in pairs], k=1)[0]


def _slots(rng: random.Random, title: str) -> dict:
    year = rng.randint(800, 1950)
    f1, f2 = rng.sample(FIELDS, 2)
    p1, p2 = rng.sample(PLACES, 2)
    return {
        "title": title,
        "field": f1,
        "field2": f2,
        "place": p1,
        "place2": p2,
        "people": rng.choice(PEOPLE),
        "adj": rng.choice(ADJECTIVES),
        "year": year,
        "year2": min(year + rng.randint(10, 300), 2023),
        "century": rng.choice(("twelfth", "fifteenth", "seventeenth", "eighteenth", "nineteenth", "twentieth")),
        "num": f"{rng.randint(1, 900) * 100:,}",
        "small": rng.randint(2, 9),
        "pct": rng.randint(2, 40),
    }


def _fill(rng: random.Random, template: str, slots: dict) -> str:
    # re-draw a few slots per sentence so long texts do not repeat verbatim
    local = dict(slots)
    local["adj"] = rng.choice(ADJECTIVES)
    local["people"] = rng.choice(PEOPLE)
    return template.format(**local)


def _n_words(text: str) -> int:
    return len(text.split())


class _Deck:
    """Draws from a bank without replacement, reshuffling when exhausted (fewer repeats)."""

    def __init__(self, rng: random.Random, bank) -> None:
        self.rng = rng
        self.bank = list(bank)
        self.pool: list[str] = []

    def draw(self) -> str:
        if not self.pool:
            self.pool = self.bank[:]
            self.rng.shuffle(self.pool)
        return self.pool.pop()


def _paragraphs(rng: random.Random, bank, slots: dict, target_words: int, per_par=(2, 5)) -> str:
    deck = _Deck(rng, bank)
    pars: list[str] = []
    total = 0
    while total < target_words:
        k = rng.randint(*per_par)
        sents = [_fill(rng, deck.draw(), slots) for _ in range(k)]
        par = " ".join(sents)
        pars.append(par)
        total += _n_words(par)
    return "\n\n".join(pars)


def _slug(title: str) -> str:
    return title.replace(" ", "_")


def _fmt_int(value: int, commas: bool) -> str:
    return f"{value:,}" if commas else str(value)


def _fmt_tenths(tenths: int, trailing_zero: bool = False) -> str:
    whole, frac = divmod(tenths, 10)
    if frac == 0 and not trailing_zero:
        return str(whole)
    s = f"{whole}.{frac}"
    return s + "0" if trailing_zero else s


def _markdown_answer(rng: random.Random, bank: dict, slots: dict, target_words: int, code_bias: float = 0.0) -> str:
    deck = _Deck(rng, bank["answer"])
    parts: list[str] = []
    if rng.random() < 0.75:
        level = rng.choice(("##", "###", "#"))
        parts.append(f"{level} {rng.choice(bank['headings'])}: {slots['title']}")
    intro = " ".join(_fill(rng, deck.draw(), slots) for _ in range(rng.randint(1, 3)))
    intro = intro.replace(slots["title"], f"**{slots['title']}**", 1)
    parts.append(intro)
    bullets = []
    for _ in range(rng.randint(3, 6)):
        s = _fill(rng, deck.draw(), slots)
        if rng.random() < 0.5:
            if slots["title"] in s:
                s = s.replace(slots["title"], f"**{slots['title']}**", 1)
            else:
                s = f"**{s.rstrip('.')}**."
        bullets.append(("- " if rng.random() < 0.8 else "* ") + s)
    parts.append(f"{bank['answer_intro']}\n\n" + "\n".join(bullets))
    if rng.random() < 0.15:
        h1, h2 = bank["table_head"]
        r = bank["table_rows"]
        rows = [
            f"| {h1} | {h2} |",
            "|---|---|",
            f"| {r[0]} | {slots['year']} |",
            f"| {r[1]} | {slots['place']} |",
            f"| {r[2]} | {slots['field']} |",
            f"| {r[3]} | {slots['adj']} |",
        ]
        parts.append("\n".join(rows))
    if rng.random() < 0.06 + code_bias:
        parts.append(
            "```python\n"
            f"events = {{'{_slug(slots['title'])}': {slots['year']}}}\n"
            "for name, year in sorted(events.items()):\n"
            '    print(f"{name}: {year}")\n'
            "```"
        )
    text = "\n\n".join(parts)
    while _n_words(text) < target_words:
        par = " ".join(_fill(rng, deck.draw(), slots) for _ in range(rng.randint(2, 4)))
        text += "\n\n" + par
    return text


def _insert_at_word(rng: random.Random, text: str, snippet: str) -> str:
    words = text.split(" ")
    pos = rng.randint(0, len(words))
    words.insert(pos, snippet)
    return " ".join(words)


# ---------------------------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------------------------


def _chars(rng: random.Random, spec: tuple[float, float, int, int], scale: float = 1.0) -> int:
    """A text length in characters: log-normal around the corpus's median, clipped to its range."""
    median, sigma, low, high = spec
    return int(min(high, max(low, rng.lognormvariate(math.log(median * scale), sigma))))


def _grow(rng: random.Random, sentences, slots: dict, target_chars: int, per_par=(2, 5)) -> str:
    """Paragraphs of `sentences` (filled with `slots`) until the text holds `target_chars` characters."""
    deck = _Deck(rng, sentences)
    pars: list[str] = []
    total = 0
    while total < target_chars:
        par = " ".join(_fill(rng, deck.draw(), slots) for _ in range(rng.randint(*per_par)))
        pars.append(par)
        total += len(par) + 2
    return "\n\n".join(pars)


@functools.lru_cache(maxsize=256)
def _section(seed: int, title_index: int, scale: float) -> tuple[str, tuple[tuple[str, object], ...], str]:
    """(heading, slots, body) of one article section: every row about it shares its slots and seed text."""
    rng = random.Random(f"synthkd_dev/section/{seed}/{title_index}/{scale}")
    title = TITLES[title_index]
    slots = _slots(rng, title)
    heading = rng.choice(SECTION_HEADINGS)
    body = _grow(rng, SEED_SENTENCES, slots, _chars(rng, SEED_CHARS, scale), per_par=(3, 6))
    return heading, tuple(slots.items()), body


def _reasoning(rng: random.Random, bank: dict, slots: dict, target_chars: int) -> str:
    """A reasoning trace in SYNTH's own notation: Markdown headings, arrows, confidence marks, ∴ and ✓."""
    deck = _Deck(rng, bank["reasoning"])
    parts = [f"### 1. {rng.choice(('Query analysis', 'Parsing the question', 'Initial assessment'))}"]
    step = 1
    while sum(len(p) + 2 for p in parts) < target_chars:
        sentence = _fill(rng, deck.draw(), slots)
        kind = rng.random()
        if kind < 0.15:
            step += 1
            parts.append(f"### {step}. {rng.choice(('Key facts', 'Verification', 'Synthesis', 'Constraints'))}")
        elif kind < 0.35:
            parts.append(f"{rng.choice(('●', '◐'))} {sentence}")
        elif kind < 0.5:
            parts.append(f"{sentence} → {_fill(rng, deck.draw(), slots)}")
        else:
            parts.append(sentence)
    parts.append(f"∴ {_fill(rng, deck.draw(), slots)} ✓")
    return "\n\n".join(parts)


def _answer_body(rng: random.Random, bank: dict, slots: dict, target_chars: int) -> str:
    return _markdown_answer(rng, bank, slots, max(20, target_chars // 7))


def _long_query(rng: random.Random, query: str, bank: dict, slots: dict, target_chars: int) -> str:
    """A query grown towards `target_chars` with context sentences (SYNTH's long queries give context first)."""
    deck = _Deck(rng, bank["reasoning"])
    context: list[str] = []
    while True:
        sentence = _fill(rng, deck.draw(), slots)
        if len(query) + sum(len(c) + 1 for c in context) + len(sentence) > target_chars:
            break
        context.append(sentence)
    return " ".join([*context, query]) if context else query


def _math_value(rng: random.Random) -> tuple[str, str]:
    """(result value as the constraints write it, the number as the answer states it): an integer, a decimal
    or a fraction (`result:0.25` answered `1/4`)."""
    kind = rng.random()
    if kind < 0.6:
        value = rng.randint(2, 40000)
        return str(value), f"{value:,}" if value >= 1000 and rng.random() < 0.5 else str(value)
    if kind < 0.85:
        value = rng.randint(11, 9999) / 10
        return f"{value:g}", f"{value:g}"
    numerator, denominator = rng.choice(((1, 4), (3, 4), (1, 2), (2, 5), (1, 8)))
    return f"{numerator / denominator:g}", f"{numerator}/{denominator}"


def _make_row(seed: int, index: int, size: int, exercise: str | None = None) -> dict:
    """Row ``index``; ``exercise`` given (bucket shard) replaces the drawn one after the draw, so the
    random stream, and with it every regular row, is the same whichever way the exercise is chosen."""
    rng = random.Random((seed << 40) | index)
    scale = SIZE_SCALE[size]

    language = _weighted(rng, LANGUAGES)
    drawn = _weighted(rng, EXERCISES)
    exercise = drawn if exercise is None else exercise
    title_index = rng.randrange(len(TITLES))
    heading, section_slots, section_body = _section(seed, title_index, scale)
    slots = dict(section_slots)
    title = slots["title"]
    bank = LANG[language] if language in LANG else EN

    # --- seed: the article section (or its first paragraphs), opening with its heading -----------------------
    body = section_body
    if size == XL:
        body = _grow(rng, SEED_SENTENCES, slots, XL_CHARS["seed"], per_par=(3, 6))
    elif rng.random() < P_SHORT_SEED and "\n\n" in body:
        paragraphs = body.split("\n\n")
        body = "\n\n".join(paragraphs[: rng.randint(1, len(paragraphs) - 1)])
    query_seed_text = f"{heading}\n\n{body}"
    if rng.random() < P_SELF_KNOWLEDGE:
        query_seed_url = SELF_KNOWLEDGE_URL
    else:
        wiki = language if language in NON_ENGLISH and language != "la" and rng.random() < 0.3 else "en"
        query_seed_url = f"https://{wiki}.wikipedia.org/wiki/{_slug(title)}"
    additional_seed_url = (
        "" if rng.random() < 0.7 else rng.choice(ADDITIONAL_LINKS).format(slug=_slug(rng.choice(TITLES)))
    )

    # --- query, constraints, answer head by exercise ------------------------------------------------------------
    query_chars = _chars(rng, QUERY_CHARS, scale)
    answer_head, constraints = "", ""
    if exercise == "mcq":
        options = [_fill(rng, o, slots) for o in rng.sample(MCQ_OPTIONS, 4)]
        correct = rng.randrange(4)
        query = (
            EN["mcq_stem"].format(title=title) + "\n\n" + "\n".join(f"{'ABCD'[i]}. {o}" for i, o in enumerate(options))
        )
        given = correct if rng.random() >= P_INCONSISTENT else (correct + 1) % 4  # no result: never checked
        answer_head = f"{'ABCD'[given]}. {options[given]}"
        constraints = ", ".join(f"{key}:{rng.choice(values)}" for key, values in MCQ_CONSTRAINT_VALUES.items())
    elif exercise == "math exercise":
        result, stated = _math_value(rng)
        n, b = rng.randint(2, 12), rng.randint(5, 900)
        query = EN["arith_int"].format(title=title, a=rng.randint(50, 20000), b=b, n=n)
        if rng.random() < P_INCONSISTENT:
            stated = str(int(float(result)) + rng.randint(1, 50))
        answer_head = f"**Answer: {stated} {rng.choice(UNITS)}**"
        constraints = f"result:{result}"
    elif exercise == "math mcq":
        change = rng.randint(-995, 995) / 10 or 12.5
        options = sorted(
            {
                abs(change),
                round(abs(change) + rng.randint(3, 40) / 2, 1),
                round(abs(change) / 2, 1),
                round(abs(change) * 1.5 + 1, 1),
            }
        )
        letters = "ABCD"[: len(options)]
        start = rng.randint(100, 9000)
        query = (
            f"A fund linked to {title} held {start:,} units and ended the period at "
            f"{start * (1 + change / 100):,.1f}. What is the net percentage change?\n\n"
            + "\n".join(f"{letters[i]}. {o:g}%" for i, o in enumerate(options))
        )
        given = options.index(abs(change))
        if rng.random() < P_INCONSISTENT:
            given = (given + 1) % len(options)
        answer_head = f"{letters[given]}. {options[given]:g}%"
        constraints = f"result:{change:g}"
    else:
        templates = bank["queries"][QUERY_BANK[exercise]] if bank is EN else bank["queries"]
        query = rng.choice(templates).format(**slots)
        if exercise == "rag":
            constraints = f"<source_1>\n{query_seed_text}\n</source_1>"
        elif exercise == "constrained writing":
            constraints = rng.choice(CONSTRAINED_WRITING)
        elif exercise == "editing":
            constraints = rng.choice(EDITING)
        elif exercise == "creative writing":
            constraints = rng.choice(CREATIVE_WRITING)
    query = _long_query(rng, query, bank, slots, query_chars)
    if exercise in ("math exercise", "math mcq") and rng.random() < P_FAILED:
        constraints = constants.FAILED_RESULT_MARKER

    # --- reasoning / answer ------------------------------------------------------------------------------------
    reasoning_chars = XL_CHARS["reasoning"] if size == XL else _chars(rng, REASONING_CHARS, scale)
    answer_chars = XL_CHARS["answer"] if size == XL else _chars(rng, ANSWER_CHARS, scale)
    reasoning = _reasoning(rng, bank, slots, reasoning_chars)
    if rng.random() < EMPTY_REASONING.get(exercise, 0.0):  # a robustness plant: some blank, not empty
        reasoning = "" if rng.random() >= P_BLANK_REASONING else rng.choice(WHITESPACE_ONLY)
    body = _answer_body(rng, bank, slots, answer_chars)
    answer = f"{answer_head}\n\n{body}" if answer_head else body
    if rng.random() < P_EMPTY_ANSWER:
        answer = "" if rng.random() < 0.5 else rng.choice(WHITESPACE_ONLY)

    # --- robustness plants ---------------------------------------------------------------------------------------
    fields = {"query": query, "synthetic_reasoning": reasoning, "synthetic_answer": answer}
    nonblank = [k for k, v in fields.items() if v.strip()]
    if rng.random() < P_CJK:
        k = rng.choice(nonblank)
        fields[k] = _insert_at_word(rng, fields[k], rng.choice(CJK_SNIPPETS))
    if rng.random() < P_EMOJI:
        k = rng.choice(nonblank)
        fields[k] = _insert_at_word(rng, fields[k], rng.choice(EMOJI))
    if rng.random() < P_HARMONY:
        k = rng.choice(nonblank)
        fields[k] = _insert_at_word(rng, fields[k], rng.choice(HARMONY_SNIPPETS))
    if rng.random() < P_NUL:
        k = rng.choice([k for k in ("query", "synthetic_answer") if k in nonblank])
        text = fields[k]
        pos = rng.randint(0, len(text))
        fields[k] = text[:pos] + "\x00" + text[pos:]

    prefix = SYNTH_ID_PREFIX[exercise]
    if exercise == "memorization" and language in LANGUAGE_NAMES:
        prefix = f"{prefix}_{LANGUAGE_NAMES[language]}"
    reasoning, answer = fields["synthetic_reasoning"], fields["synthetic_answer"]
    return {
        "synth_id": f"{prefix}_{rng.randint(1, 120)}_{index}",
        "language": language,
        "exercise": exercise,
        "model": MODELS[exercise],
        "query": fields["query"],
        "query_seed_url": query_seed_url,
        "query_seed_text": query_seed_text,
        "additional_seed_url": additional_seed_url,
        "seed_license": LICENSE,
        "constraints": constraints,
        "script": rng.choice(SCRIPTS.get(QUERY_BANK.get(exercise, "mcq"), SCRIPTS["mcq"])),
        "synthetic_reasoning": reasoning,
        "synthetic_answer": answer,
        "words": len(f"{reasoning} {answer}".split()),
    }


def generate_rows(n_rows: int, seed: int, start_index: int = 0, long: bool = False) -> list[dict]:
    """Rows ``start_index`` .. ``start_index + n_rows - 1`` of the sample corpus for ``seed``.

    Each row depends only on (seed, global index, long), so any split into shards yields the
    same rows. Keys are exactly ``RAW_COLUMNS`` in order.
    """
    if n_rows < 0 or start_index < 0 or start_index + n_rows > (1 << 40):
        raise ValueError("row range out of bounds")
    return [_make_row(seed, start_index + i, LONG if long else NORMAL) for i in range(n_rows)]


def bucket_row_plan(position: int) -> tuple[str, int]:
    """(exercise, size) of the row at ``position`` in the bucket shard: exercises in turn, each one's first
    ``BUCKET_LONG_PER_EXERCISE`` rows at the XL size."""
    names = [name for name, _ in EXERCISES]
    exercise = names[position % len(names)]
    size = XL if position // len(names) < BUCKET_LONG_PER_EXERCISE else NORMAL
    return exercise, size


def generate_bucket_rows(n_rows: int, seed: int, start_index: int) -> list[dict]:
    """The bucket shard's rows: global indices ``start_index`` .. (after the regular shards, so synth_ids stay
    unique), exercise and size by position (``bucket_row_plan``), everything else drawn like any row."""
    if n_rows < 0 or start_index < 0 or start_index + n_rows > (1 << 40):
        raise ValueError("row range out of bounds")
    rows = []
    for position in range(n_rows):
        exercise, size = bucket_row_plan(position)
        rows.append(_make_row(seed, start_index + position, size, exercise))
    return rows


# ---------------------------------------------------------------------------------------------
# the near-duplicate shard: planted copies with known edits, and hard negatives
# ---------------------------------------------------------------------------------------------

MAX_COPIES = 6  # source s gets 1 + s % MAX_COPIES copies: clusters of 2..7 rows, several over the cap of 4
NEGATIVE_DONOR_BASE = 1 << 39  # hard negatives' seed texts come from rows at these indices, never written
NEGATIVE_DONOR_CANDIDATES = 40  # donors tried per negative; the least similar one is taken
NEGATIVE_MAX_JACCARD = 0.45  # a negative's Jaccard to its source stays below this (the tests ask < 0.5)
APPENDED_PHRASES = ("(citation needed)", "See also the main article.", "Retrieved in 2023.")
SUBSTITUTE_WORD = "topic"


@dataclass(frozen=True)
class PlantedCopy:
    """A planted near-duplicate: ``copy_id``'s prompt is ``source_id``'s with the one edit described."""

    source_id: str
    copy_id: str
    edit: str


@dataclass(frozen=True)
class PlantedNegative:
    """``negative_id`` has ``source_id``'s query over the seed text of the unwritten row ``donor_index``."""

    source_id: str
    negative_id: str
    donor_index: int
    jaccard: float


# each edit: (query, answer, copy number) -> (query, answer, description); one per copy. The signatures compare the
# question and the answer (synthkd_assets/core/near_dup.py signature_text), so the edits change those
Edited = tuple[str, str, str]


def _edit_case(query: str, text: str, k: int) -> Edited:
    return query.upper(), text.lower(), "case: query upper-cased, answer lower-cased"


def _edit_whitespace(query: str, text: str, k: int) -> Edited:
    edited = "  " + query.replace(" ", "   ") + "\n", text.replace("\n\n", " \n\n\t") + "\n\n"
    return *edited, "whitespace: runs of spaces, new lines and a tab added"


def _edit_fullwidth(query: str, text: str, k: int) -> Edited:
    """ASCII letters and digits of the query as their full-width forms, which NFKC folds back."""
    wide = "".join(chr(ord(c) + 0xFEE0) if c.isascii() and c.isalnum() else c for c in query)
    return wide, text, "full-width letters and digits in the query"


def _edit_word(query: str, text: str, k: int) -> Edited:
    words = re.findall(r"[^\W\d_]{4,}", query)
    old = max(words, key=len) if words else query.split()[0]
    return query.replace(old, SUBSTITUTE_WORD, 1), text, f"query word {old!r} -> {SUBSTITUTE_WORD!r}"


def _edit_append(query: str, text: str, k: int) -> Edited:
    phrase = APPENDED_PHRASES[k % len(APPENDED_PHRASES)]
    return query, f"{text} {phrase}", f"answer + {phrase!r}"


def _edit_remove(query: str, text: str, k: int) -> Edited:
    return query, text.rsplit(" ", 3)[0], "answer's last 3 words removed"


def _edit_punctuation(query: str, text: str, k: int) -> Edited:
    stripped = query.rstrip()
    if stripped.endswith("?"):
        return stripped[:-1] + ".", text, "query's final '?' -> '.'"
    if stripped.endswith("."):
        return stripped[:-1] + "!", text, "query's final '.' -> '!'"
    return stripped + "?", text, "'?' appended to the query"


NEAR_DUP_EDITS: tuple[Callable[[str, str, int], Edited], ...] = (
    _edit_case,
    _edit_whitespace,
    _edit_fullwidth,
    _edit_word,
    _edit_append,
    _edit_remove,
    _edit_punctuation,
)


def signature_shingles(query: str, answer: str) -> set[str]:
    """The shingle set the pipeline compares (synthkd_assets/core/near_dup.py: the question and the answer,
    normalized, as word 3-grams), used here only to pick the hard negatives' donors."""
    return set(shingles(normalize_prompt(signature_text(query, answer))))


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b)


def _can_be_source(row: dict) -> bool:
    """Kept by the 001 quality filters, and no NUL or Harmony marker that later steps would rewrite."""
    texts = (row["query"], row["query_seed_text"], row["synthetic_answer"])
    return (
        bool(row["synthetic_answer"].strip())
        and constants.FAILED_RESULT_MARKER.lower() not in row["constraints"].lower()
        and not result_is_inconsistent(row["constraints"], row["synthetic_answer"])
        and not any("\x00" in t or "<|" in t for t in texts)
    )


def _choose_sources(regular: list[list[dict]], n_sources: int, seed: int) -> list[dict]:
    """Slot s: a row of shard s % shards with exercise EXERCISES[s % 7] (any shard / exercise when none is
    left), drawn from a Random of its own so the regular rows' streams are untouched."""
    rng = random.Random(f"synthkd_dev/near_dup/{seed}")
    names = [name for name, _ in EXERCISES]
    eligible = [[row for row in shard if _can_be_source(row)] for shard in regular]
    chosen: list[dict] = []
    taken: set[str] = set()
    for s in range(n_sources):
        shard = eligible[s % len(eligible)]
        pool = [r for r in shard if r["exercise"] == names[s % len(names)] and r["synth_id"] not in taken]
        pool = pool or [r for rows in eligible for r in rows if r["synth_id"] not in taken]
        if not pool:
            break
        row = rng.choice(pool)
        chosen.append(row)
        taken.add(row["synth_id"])
    return chosen


def _hard_negative(source: dict, donors_from: int, seed: int) -> tuple[dict, PlantedNegative]:
    """The source's query asked of the least similar of NEGATIVE_DONOR_CANDIDATES unwritten rows: its seed text,
    reasoning and answer (the same question about another article section is another example)."""
    own = signature_shingles(source["query"], source["synthetic_answer"])
    best: tuple[float, int, dict] | None = None
    for index in range(donors_from, donors_from + NEGATIVE_DONOR_CANDIDATES):
        donor = _make_row(seed, index, NORMAL)
        if not donor["synthetic_answer"].strip():
            continue
        jaccard = _jaccard(own, signature_shingles(source["query"], donor["synthetic_answer"]))
        if best is None or jaccard < best[0]:
            best = (jaccard, index, donor)
    assert best is not None
    jaccard, index, donor = best
    negative_id = f"{source['synth_id']}-neg"
    taken = ("query_seed_text", "synthetic_reasoning", "synthetic_answer", "words")
    row = {**source, "synth_id": negative_id, **{column: donor[column] for column in taken}}
    return row, PlantedNegative(source["synth_id"], negative_id, index, round(jaccard, 4))


@dataclass(frozen=True)
class NearDupPlan:
    rows: tuple[dict, ...]
    copies: tuple[PlantedCopy, ...]
    negatives: tuple[PlantedNegative, ...]


def near_dup_plan(regular: list[list[dict]], seed: int, n_sources: int, n_negatives: int) -> NearDupPlan:
    """The near-duplicate shard's rows and ground truth, from the regular shards' rows (one list per shard):
    copies source by source, then the hard negatives on the eligible regular rows with the fewest shingles (a
    short prompt is the one another seed text moves furthest; SYNTH-like seed texts share most of their
    5-grams, two random sample prompts have a median Jaccard near 0.6)."""
    sources = _choose_sources(regular, n_sources, seed)
    rows: list[dict] = []
    copies: list[PlantedCopy] = []
    for s, source in enumerate(sources):
        for k in range(1, 1 + s % MAX_COPIES + 1):
            edit = NEAR_DUP_EDITS[(s + k - 1) % len(NEAR_DUP_EDITS)]
            query, answer, description = edit(source["query"], source["synthetic_answer"], k)
            copy_id = f"{source['synth_id']}-nd{k}"
            rows.append({**source, "synth_id": copy_id, "query": query, "synthetic_answer": answer})
            copies.append(PlantedCopy(source["synth_id"], copy_id, description))
    eligible = [row for shard in regular for row in shard if _can_be_source(row)]
    by_size = sorted(
        eligible, key=lambda r: (len(signature_shingles(r["query"], r["synthetic_answer"])), r["synth_id"])
    )
    negatives: list[PlantedNegative] = []
    for j, source in enumerate(by_size):
        if len(negatives) == n_negatives:
            break
        row, negative = _hard_negative(source, NEGATIVE_DONOR_BASE + j * NEGATIVE_DONOR_CANDIDATES, seed)
        if negative.jaccard < NEGATIVE_MAX_JACCARD:  # else the next shortest prompt (tiny layouts may run out)
            rows.append(row)
            negatives.append(negative)
    return NearDupPlan(tuple(rows), tuple(copies), tuple(negatives))


@functools.lru_cache(maxsize=4)
def _default_layout_plan(seed: int, shards: int, rows_per_shard: int, n_sources: int, n_negatives: int) -> NearDupPlan:
    regular = [generate_rows(rows_per_shard, seed, start_index=s * rows_per_shard) for s in range(shards)]
    return near_dup_plan(regular, seed, n_sources, n_negatives)


def planted_near_duplicates(
    seed: int = DEFAULT_SEED,
    shards: int = DEFAULT_SHARDS,
    rows_per_shard: int = DEFAULT_ROWS_PER_SHARD,
    sources: int = DEFAULT_NEAR_DUP_SOURCES,
) -> list[PlantedCopy]:
    """Ground truth of the near-duplicate shard: every planted copy, its source and its edit."""
    return list(_default_layout_plan(seed, shards, rows_per_shard, sources, DEFAULT_HARD_NEGATIVES).copies)


def planted_negatives(
    seed: int = DEFAULT_SEED,
    shards: int = DEFAULT_SHARDS,
    rows_per_shard: int = DEFAULT_ROWS_PER_SHARD,
    sources: int = DEFAULT_NEAR_DUP_SOURCES,
    negatives: int = DEFAULT_HARD_NEGATIVES,
) -> list[PlantedNegative]:
    """Ground truth of the hard negatives: rows sharing a source's query that are not its near-duplicates."""
    return list(_default_layout_plan(seed, shards, rows_per_shard, sources, negatives).negatives)


def rows_to_table(rows: list[dict]) -> pa.Table:
    columns = {name: [row[name] for row in rows] for name in RAW_COLUMNS}
    return pa.Table.from_pydict(columns, schema=RAW_SCHEMA)


def _write_table(table: pa.Table, path: Path) -> Path:
    """Fixed Parquet options (the bytes depend on nothing else), written to a temporary name and renamed."""
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(
        table,
        tmp,
        row_group_size=max(1, table.num_rows),  # one row group per file, as SYNTH's files are
        compression=COMPRESSION,
        compression_level=COMPRESSION_LEVEL,
        use_dictionary=True,
        write_statistics=True,
        data_page_version="1.0",
        version="2.6",
    )
    tmp.replace(path)
    return path


def write_shards(
    output_dir,
    shards: int,
    rows_per_shard: int,
    seed: int,
    long: bool = False,
    bucket_rows: int = 0,
    near_dup_sources: int = 0,
    hard_negatives: int = 0,
) -> list[Path]:
    """Write ``shards`` files ``synth_NN.parquet`` of ``rows_per_shard`` rows, then, when ``bucket_rows`` > 0,
    the bucket shard (the next file name, rows numbered after the regular ones), then, when
    ``near_dup_sources`` > 0, the near-duplicate shard (the next file name); returns paths."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    regular: list[list[dict]] = []
    for s in range(shards):
        regular.append(generate_rows(rows_per_shard, seed, start_index=s * rows_per_shard, long=long))
        paths.append(_write_table(rows_to_table(regular[-1]), out / shard_filename(s)))
    if bucket_rows > 0:
        rows = generate_bucket_rows(bucket_rows, seed, start_index=shards * rows_per_shard)
        paths.append(_write_table(rows_to_table(rows), out / shard_filename(len(paths))))
    if near_dup_sources > 0:
        plan = near_dup_plan(regular, seed, near_dup_sources, hard_negatives)
        paths.append(_write_table(rows_to_table(list(plan.rows)), out / shard_filename(len(paths))))
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR)
    ap.add_argument("--shards", type=int, default=DEFAULT_SHARDS)
    ap.add_argument("--rows-per-shard", type=int, default=DEFAULT_ROWS_PER_SHARD)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument(
        "--bucket-rows",
        type=int,
        default=DEFAULT_BUCKET_ROWS,
        help="rows of the bucket shard written after the regular ones (every exercise, some in C2); 0: none",
    )
    ap.add_argument(
        "--near-dup-sources",
        type=int,
        default=DEFAULT_NEAR_DUP_SOURCES,
        help="source rows of the near-duplicate shard (1..6 planted copies each, then the hard negatives); 0: none",
    )
    ap.add_argument(
        "--hard-negatives",
        type=int,
        default=DEFAULT_HARD_NEGATIVES,
        help="rows of the near-duplicate shard sharing a source's query over another seed text",
    )
    ap.add_argument(
        "--long", action="store_true", help="longer seed text / reasoning / answer (~1.3k o200k tokens per row)"
    )
    args = ap.parse_args(argv)
    counts = (args.seed, args.bucket_rows, args.near_dup_sources, args.hard_negatives)
    if args.shards < 1 or args.rows_per_shard < 1 or min(counts) < 0:
        ap.error("--shards and --rows-per-shard must be >= 1, --seed and the other row counts >= 0")
    paths = write_shards(
        args.output_dir,
        args.shards,
        args.rows_per_shard,
        args.seed,
        long=args.long,
        bucket_rows=args.bucket_rows,
        near_dup_sources=args.near_dup_sources,
        hard_negatives=args.hard_negatives,
    )
    for p in paths:
        print(f"{p}  {p.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
