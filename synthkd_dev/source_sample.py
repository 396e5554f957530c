"""A generated sample of every anchor source, laid out as a user downloads it: the second bundled sample.

    python -m synthkd_dev.source_sample data/sample/sources     # rewrites the committed sample byte for byte
    python -m synthkd_dev.source_sample OUT_DIR --seed 7         # another draw of the same shape

Writes `OUT_DIR/<source key>/<file>` for every key of synthkd_contract/sources.py `SOURCE_DATASETS`, each shard in
its dataset's published schema, file format and file naming, with synthkd_dev/source_fixtures.py's schemas, row
builders and writers: `nemotron_math_v2/{high.part_00,medium,low}.jsonl`,
`opencodeinstruct/train-0000N-of-00002.parquet`, `deepcoder/{derived,primeintellect}/train-00000-of-00001.parquet`
(config subdirectories: the pipeline reads every file under `<key>/`),
`ultrachat_200k/train_sft-00000-of-00001.parquet` and `<key>/train-00000-of-00001.parquet` for the others.

Unlike the fixtures (a few rows per case, each fate written by hand), the sample is sized for a build: next to the
bundled SYNTH sample (data/sample/synth_raw) each anchor category gets a few hundred conversations (`DEFAULT_ROWS`).
Rows are English, built from synthkd_dev/word_banks.json: its titles, fields, places and sentences (through
make_sample_data's slot and answer helpers) and its `anchor_sources` banks (prompts, follow-ups, personas, reasoning
asides, code prose). Math answers are computed (20 problem families, MATH types and levels); code solutions are run
here, so the samples, unit tests and stdin / stdout tests agree with the code. Conversations spread from ~50 to
~1500 o200k tokens, a few (`LONG_ROW_SHARE`) to ~2.5k; Hendrycks-Math, which publishes only short answers, stays
short. Multi-turn rows: ultrachat (1-4 exchanges, a few with a leading system turn), oasst1 message trees (ranked
branches, follow-ups, one conversation per tree by the adapter's best-path policy), anthropic ChatML histories (most
with a system turn). Reasoning rows: Nemotron's `reasoning_content` (longest in `high`), some Nemotron and ultrachat
rows as `<think>` blocks.

About 2% of each source's rows are hostile (`HOSTILE_SHARE`), so every source's report shows drops: a tool-using
trajectory, a truncated JSON line, a number where a string belongs, blank answers, missing or repeated ids, an
unknown role, a turn order that ends on the user, DeepCoder rows without a usable solution, and in oasst1 a deleted
favourite reply (its follow-ups become orphans), a failed review, a tree not ready for export, a blank reply and a
reply to an absent parent. DeepCoder's published config has no solution column, so its rows all drop as
`no_reference_answer` (the adapter's policy, docs/sources.md). `SampleShard.drops` names each dropped row and its
reason and `SampleShard.conversations` counts the rest (oasst1: one per exported tree; the tree's other messages
are the quiet `folded_into_conversation` / `off_best_path`): the oracle of tests/test_source_sample.py.

Every first user prompt (what near-duplicate control compares) is distinct, and two prompts of a category share
under `MAX_PROMPT_JACCARD` of their word 3-grams (synthkd_assets/core/near_dup.py's normalization), well below the
0.8 at which the pipeline clusters: the build keeps them all.

Determinism: row `i` of a source is drawn from its own `random.Random` (seed, source, i); a prompt too close to an
earlier one is redrawn from the row's next stream. No clock, no `hash()`, no set order; Parquet is written with
fixed options and no pandas metadata, JSONL with a fixed key order: a seed gives byte-identical files for a given
pyarrow version, which tests/test_source_sample.py checks against the committed data/sample/sources.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
import random
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any

import pyarrow as pa

from synthkd_assets.core.near_dup import normalize_prompt, shingles
from synthkd_contract import drops
from synthkd_contract.sources import SOURCE_CATEGORY, SOURCE_DATASETS
from synthkd_dev.make_sample_data import EN, PLACES, SEED_SENTENCES, TITLES, WORD_BANKS_FILE, _markdown_answer, _slots
from synthkd_dev.source_fixtures import (
    COMPETITION_SCHEMA,
    DEEPCODER_DERIVED_SCHEMA,
    DEEPCODER_SCHEMA,
    HELPFULNESS_SCHEMA,
    HENDRYCKS_SCHEMA,
    OASST_SCHEMA,
    OPENCODE_SCHEMA,
    ULTRACHAT_SCHEMA,
    chatml,
    competition_row,
    hendrycks_row,
    nemotron_message,
    nemotron_row,
    oasst_row,
    opencode_row,
    ultrachat_row,
    write_jsonl,
    write_parquet,
)

DEFAULT_SEED = 0
# rows per source (oasst1: message trees; deepcoder: rows of the derived config with `solutions`, and a tenth as
# many published rows without): with the SYNTH sample, a few hundred conversations per anchor category
DEFAULT_ROWS: dict[str, int] = {
    "nemotron_math_v2": 300,
    "hendrycks_math": 150,
    "competition_math": 150,
    "opencodeinstruct": 400,
    "deepcoder": 60,
    "ultrachat_200k": 200,
    "oasst1": 60,
    "anthropic_helpfulness": 120,
}
HOSTILE_SHARE = 0.02  # of a source's rows (oasst1: of its trees, times 4: a tree is ~4 messages)
MAX_PROMPT_JACCARD = 0.6  # between any two first prompts of a category (near-duplicate control merges at 0.8)
NEMOTRON_FILES = (("high.part_00", 0.5), ("medium", 0.3), ("low", 0.2))  # level (file stem), share of the rows
OPENCODE_ROWS_PER_SHARD = 200
LONG_ROW_SHARE = 0.03  # rows drawn past the usual range (a few thousand tokens)

_BANKS = json.loads(WORD_BANKS_FILE.read_text(encoding="utf-8"))["anchor_sources"]


@dataclass
class SampleShard:
    """One file of the sample: its rows (dicts; JSONL: the lines), the rows that must drop (source_row -> reason,
    oasst1's quiet policy drops left out) and how many conversations it must give."""

    source: str
    relative: Path  # <source key>/<file>, as written under the output directory
    rows: list[Any]
    schema: pa.Schema | None  # None: JSONL, `rows` are the lines
    drops: dict[int, str] = field(default_factory=dict)
    conversations: int = 0

    def write(self, out_dir: Path) -> Path:
        path = out_dir / self.relative
        if self.schema is None:
            write_jsonl(path, self.rows)
        else:
            write_parquet(path, self.rows, self.schema)
        return path


# --- draws ---------------------------------------------------------------------------------------------------
def _rng(seed: int, *parts: object) -> random.Random:
    """The row's own stream: a str seed is hashed by sha512 in random.seed, the same on every machine and run."""
    return random.Random("synthkd_dev/source_sample/" + "/".join(str(p) for p in (seed, *parts)))


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _words(text: str) -> int:
    return len(text.split())


def _size(rng: random.Random, low: int, high: int, long_high: int | None = None) -> int:
    """A length drawn log-uniformly in [low, high]; LONG_ROW_SHARE of the draws in [high, long_high]."""
    if long_high is not None and rng.random() < LONG_ROW_SHARE:
        low, high = high, long_high
    return round(math.exp(rng.uniform(math.log(low), math.log(high))))


def _slots_for(rng: random.Random) -> dict[str, Any]:
    """make_sample_data's slot values (title, field, place, people, years, ...) plus a second title and a name."""
    title, title2 = rng.sample(TITLES, 2)
    slots = _slots(rng, title)
    slots.update(title2=title2, name=rng.choice(_BANKS["names"]), persona=rng.choice(_BANKS["personas"]))
    slots["persona"] = slots["persona"].format(**slots)
    return slots


def _sentences(
    rng: random.Random, bank: list[str], slots: dict[str, Any], target_words: int, repeat: bool = True
) -> list[str]:
    """Sentences of `bank` (slots filled), drawn without repeats until the bank is exhausted (then reshuffled,
    unless not `repeat`), up to `target_words` words."""
    out: list[str] = []
    pool: list[str] = []
    total = 0
    while total < target_words:
        if not pool:
            if out and not repeat:
                break
            pool = bank[:]
            rng.shuffle(pool)
        sentence = pool.pop().format(**slots)
        out.append(sentence)
        total += _words(sentence)
    return out


def _prose(rng: random.Random, bank: list[str], slots: dict[str, Any], target_words: int) -> str:
    """Paragraphs of 2-5 sentences of `bank`, about `target_words` words."""
    sentences = _sentences(rng, bank, slots, target_words)
    paragraphs, i = [], 0
    while i < len(sentences):
        k = rng.randint(2, 5)
        paragraphs.append(" ".join(sentences[i : i + k]))
        i += k
    return "\n\n".join(paragraphs)


class PromptRegistry:
    """The first prompts drawn so far per category: a new one must differ from every earlier one by word 3-gram
    Jaccard below MAX_PROMPT_JACCARD (synthkd_assets/core/near_dup.py's normalization and shingles)."""

    def __init__(self) -> None:
        self.seen: dict[str, list[set[str]]] = {}

    def accept(self, category: str, prompt: str) -> bool:
        grams = set(shingles(normalize_prompt(prompt)))
        earlier = self.seen.setdefault(category, [])
        for other in earlier:
            if len(grams & other) >= MAX_PROMPT_JACCARD * len(grams | other):
                return False
        earlier.append(grams)
        return True


def _distinct(registry: PromptRegistry, category: str, draw: Callable[[int], Any], prompt_of: Callable[[Any], str]):
    """draw(attempt) until its prompt is accepted (attempt 0, 1, ...: the row's streams in turn)."""
    for attempt in range(100):
        item = draw(attempt)
        if registry.accept(category, prompt_of(item)):
            return item
    raise RuntimeError(f"no distinct {category} prompt in 100 draws")  # the banks are far larger than the sample


# --- math: problems whose answers are computed --------------------------------------------------------------
@dataclass(frozen=True)
class MathProblem:
    statement: str
    steps: list[str]  # the worked solution, one sentence or display each
    answer: str  # LaTeX, as it goes into \boxed{}
    kind: str  # the MATH `type`
    level: int


def _frac(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def _signed(value: int) -> str:
    return f"+ {value}" if value >= 0 else f"- {-value}"


def _factor(n: int) -> dict[int, int]:
    factors: dict[int, int] = {}
    p = 2
    while p * p <= n:
        while n % p == 0:
            factors[p] = factors.get(p, 0) + 1
            n //= p
        p += 1
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return factors


def _factor_tex(n: int) -> str:
    return " \\cdot ".join(f"{p}^{{{e}}}" if e > 1 else str(p) for p, e in sorted(_factor(n).items()))


def _archive(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    a, b, n = rng.randint(120, 4800), rng.randint(12, 380), rng.randint(3, 25)
    statement = EN["arith_int"].format(title=s["title"], a=a, b=b, n=n)
    steps = [
        f"Each year adds ${b}$ documents, so over ${n}$ years the archive gains ${b} \\times {n} = {b * n}$.",
        f"Adding the initial holdings gives ${a} + {b * n} = {a + b * n}$.",
    ]
    return MathProblem(statement, steps, str(a + b * n), "Prealgebra", rng.randint(1, 2))


def _crates(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    n, per = rng.randint(3, 12), rng.randint(15, 400) + rng.choice((0, 0.5, 0.25))
    total = per * n
    text = EN["arith_dec"].format(title=s["title"], total=f"{total:g}", n=n)
    steps = [f"Dividing equally means computing ${total:g} \\div {n}$.", f"${total:g} \\div {n} = {per:g}$."]
    return MathProblem(text, steps, f"{per:g}", "Prealgebra", 1)


def _linear(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    a, x, b = rng.randint(2, 15), rng.randint(-20, 30), rng.choice([v for v in range(-60, 61) if v])
    c = a * x + b
    equation = f"{a}x {_signed(b)} = {c}"
    statement = rng.choice(
        (
            f"Solve for $x$: ${equation}$.",
            f"If ${equation}$, what is the value of $x$?",
            f"A student of {s['field']} in {s['place']} writes ${equation}$ on the board. Which $x$ satisfies it?",
            f"Find the real number $x$ such that ${equation}$.",
        )
    )
    steps = [
        f"{'Subtract' if b > 0 else 'Add'} ${abs(b)}$ {'from' if b > 0 else 'to'} both sides: ${a}x = {c - b}$.",
        f"Divide both sides by ${a}$: $x = {x}$.",
    ]
    return MathProblem(statement, steps, str(x), "Algebra", rng.randint(1, 2))


def _quadratic(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    r1, r2 = rng.sample([v for v in range(-12, 16) if v], 2)
    total, product = r1 + r2, r1 * r2
    poly = f"x^2 {_signed(-total)}x {_signed(product)} = 0".replace("+ 1x", "+ x").replace("- 1x", "- x")
    ask, answer, last = rng.choice(
        (
            (
                "the sum of the squares of the roots",
                r1 * r1 + r2 * r2,
                f"By Vieta, $r_1^2 + r_2^2 = (r_1 + r_2)^2 - 2r_1r_2 = {total}^2 - 2({product})"
                f" = {r1 * r1 + r2 * r2}$.",
            ),
            (
                "the positive difference between the roots",
                abs(r1 - r2),
                f"The positive difference is $|{r1} - ({r2})| = {abs(r1 - r2)}$.",
            ),
            ("the larger root", max(r1, r2), f"The larger of the two is ${max(r1, r2)}$."),
        )
    )
    statement = f"Find {ask} of the equation ${poly}$."
    steps = [
        f"The roots $r_1, r_2$ satisfy $r_1 + r_2 = {total}$ and $r_1 r_2 = {product}$.",
        f"The equation factors as $(x {_signed(-r1)})(x {_signed(-r2)}) = 0$, so the roots are ${r1}$ and ${r2}$.",
        last,
    ]
    return MathProblem(statement, steps, str(answer), "Algebra", rng.randint(2, 4))


def _series(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    a, d, n = rng.randint(5, 60), rng.randint(2, 15), rng.randint(5, 40)
    last, total = a + (n - 1) * d, n * (2 * a + (n - 1) * d) // 2
    statement = (
        f"A reading group studying {s['title']} reads {a} pages on the first day and, on each following day, {d} "
        f"pages more than on the day before. How many pages has the group read after {n} days?"
    )
    steps = [
        f"The daily page counts form an arithmetic sequence with first term ${a}$ and common difference ${d}$.",
        f"On day ${n}$ the group reads $a_{{{n}}} = {a} + ({n} - 1) \\cdot {d} = {last}$ pages.",
        f"The total is $\\frac{{{n}({a} + {last})}}{{2}} = {total}$.",
    ]
    return MathProblem(statement, steps, str(total), "Algebra", 2)


def _draw_two(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    r, b = rng.randint(3, 9), rng.randint(2, 9)
    n = r + b
    same, pairs = r * (r - 1) // 2 + b * (b - 1) // 2, n * (n - 1) // 2
    p = Fraction(same, pairs)
    statement = (
        f"A display case at a {s['title']} exhibition in {s['place']} holds {r} bronze coins and {b} silver coins. "
        "Two coins are chosen at random without replacement. What is the probability that both are made of the "
        "same metal? Express your answer as a common fraction."
    )
    steps = [
        f"There are $\\binom{{{n}}}{{2}} = {pairs}$ ways to choose two coins.",
        f"Both bronze: $\\binom{{{r}}}{{2}} = {r * (r - 1) // 2}$; "
        f"both silver: $\\binom{{{b}}}{{2}} = {b * (b - 1) // 2}$.",
        f"So the probability is $\\frac{{{same}}}{{{pairs}}}"
        + ("$." if p.denominator == pairs else f" = {_frac(p)}$."),
    ]
    return MathProblem(statement, steps, _frac(p), "Counting & Probability", rng.randint(2, 4))


def _committee(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    n, k = rng.randint(7, 16), rng.randint(2, 5)
    variant = rng.randrange(3)
    head = f"A society of {n} members interested in {s['title']} must choose a committee of {k}."
    if variant == 0:
        answer = math.comb(n, k)
        statement = f"{head} In how many ways can this be done?"
        steps = [f"The order of selection does not matter, so the count is $\\binom{{{n}}}{{{k}}} = {answer}$."]
    elif variant == 1:
        answer = math.comb(n - 1, k - 1)
        statement = f"{head} The society's founder must be on it. How many committees are possible?"
        steps = [
            "With the founder fixed, the remaining members are chosen from the others.",
            f"That gives $\\binom{{{n - 1}}}{{{k - 1}}} = {answer}$ committees.",
        ]
    else:
        answer = n * math.comb(n - 1, k - 1)
        statement = f"{head} One committee member is named chair. How many different committees with a chair exist?"
        steps = [
            f"Choose the chair in ${n}$ ways, then the other ${k - 1}$ members from the remaining ${n - 1}$.",
            f"The count is ${n} \\cdot \\binom{{{n - 1}}}{{{k - 1}}} = {n} \\cdot {math.comb(n - 1, k - 1)}"
            f" = {answer}$.",
        ]
    return MathProblem(statement, steps, str(answer), "Counting & Probability", rng.randint(2, 3))


def _power_mod(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    m = rng.randint(5, 13)
    a = rng.choice([v for v in range(2, 20) if v % m])
    k = rng.randint(20, 200)
    powers, value = [], a % m
    while value not in powers:
        powers.append(value)
        value = value * a % m
    start = powers.index(value)
    cycle = powers[start:]
    index = k - 1
    answer = powers[index] if index < start else cycle[(index - start) % len(cycle)]
    shown = ", ".join(f"{a}^{{{i + 1}}} \\equiv {v}" for i, v in enumerate(powers))
    statement = f"What is the remainder when ${a}^{{{k}}}$ is divided by ${m}$?"
    steps = [
        f"Compute successive powers modulo ${m}$: ${shown} \\pmod{{{m}}}$.",
        f"From there the residues repeat with period ${len(cycle)}$.",
        f"Reducing the exponent along the cycle, ${a}^{{{k}}} \\equiv {answer} \\pmod{{{m}}}$.",
    ]
    return MathProblem(statement, steps, str(answer), "Number Theory", rng.randint(3, 5))


def _bells(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    g = rng.randint(2, 30)
    u, v = rng.sample([w for w in range(2, 21)], 2)
    while math.gcd(u, v) != 1:
        v += 1
    x, y = g * u, g * v
    if rng.random() < 0.5:
        answer = math.lcm(x, y)
        statement = (
            f"Two bell towers in {s['place']} ring every {x} and every {y} minutes. They have just rung together. "
            "After how many minutes will they next ring together?"
        )
        steps = [
            f"Factor: ${x} = {_factor_tex(x)}$ and ${y} = {_factor_tex(y)}$.",
            f"The next common ringing is after $\\operatorname{{lcm}}({x}, {y}) = {answer}$ minutes.",
        ]
    else:
        answer = math.gcd(x, y)
        statement = f"What is the greatest common divisor of ${x}$ and ${y}$?"
        steps = [
            f"Factor: ${x} = {_factor_tex(x)}$ and ${y} = {_factor_tex(y)}$.",
            f"Taking the common prime powers gives $\\gcd({x}, {y}) = {answer}$.",
        ]
    return MathProblem(statement, steps, str(answer), "Number Theory", rng.randint(1, 3))


def _divisors(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    primes = sorted(rng.sample((2, 3, 5, 7, 11, 13), rng.randint(2, 3)))
    exponents = [rng.randint(1, 4) for _ in primes]
    n = math.prod(p**e for p, e in zip(primes, exponents))
    while n > 200000:
        exponents[exponents.index(max(exponents))] -= 1
        n = math.prod(p**e for p, e in zip(primes, exponents))
    answer = math.prod(e + 1 for e in exponents)
    product = " \\cdot ".join(f"({e} + 1)" for e in exponents)
    statement = f"How many positive divisors does ${n}$ have?"
    steps = [
        f"The prime factorization is ${n} = {_factor_tex(n)}$.",
        "A divisor picks each prime's exponent independently, from zero up to its exponent in the factorization.",
        f"So the count is ${product} = {answer}$.",
    ]
    return MathProblem(statement, steps, str(answer), "Number Theory", rng.randint(2, 3))


def _growth(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    a, p, n = rng.randint(20, 500) * 100, s["pct"], rng.randint(2, 5)
    exact = Fraction(a) * Fraction(100 + p, 100) ** n
    answer = math.floor(exact + Fraction(1, 2))
    statement = (
        f"A collection related to {s['title']} held {a} items in {s['year']}, and it grows by {p} percent every "
        f"decade. To the nearest whole number, how many items does it hold {n} decades later?"
    )
    steps = [
        f"Each decade multiplies the size by $1 + \\frac{{{p}}}{{100}} = {(100 + p) / 100:g}$.",
        f"After ${n}$ decades: ${a} \\cdot {(100 + p) / 100:g}^{{{n}}} \\approx {float(exact):.2f}$.",
        f"Rounded to the nearest whole number, that is ${answer}$.",
    ]
    return MathProblem(statement, steps, str(answer), "Algebra", 2)


def _courtyard(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    if rng.random() < 0.5:
        length, width = rng.randint(12, 80), rng.randint(5, 40)
        perimeter = 2 * (length + width)
        statement = (
            f"A rectangular courtyard of a museum in {s['place']} has a perimeter of {perimeter} meters and a "
            f"length of {length} meters. What is its area, in square meters?"
        )
        steps = [
            f"Half the perimeter is ${perimeter // 2} = \\ell + w$, so $w = {perimeter // 2} - {length} = {width}$.",
            f"The area is ${length} \\cdot {width} = {length * width}$.",
        ]
        return MathProblem(statement, steps, str(length * width), "Geometry", rng.randint(1, 2))
    a, b, c = rng.choice(((3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25), (20, 21, 29), (9, 40, 41)))
    k = rng.randint(1, 6)
    statement = (
        f"A surveyor mapping a site connected to {s['title']} walks {a * k} meters east and then {b * k} meters "
        "north. How far, in meters, is she from her starting point in a straight line?"
    )
    steps = [
        "The two legs of the walk are perpendicular, so the distance is the hypotenuse of a right triangle.",
        f"$\\sqrt{{{a * k}^2 + {b * k}^2}} = \\sqrt{{{(a * k) ** 2 + (b * k) ** 2}}} = {c * k}$.",
    ]
    return MathProblem(statement, steps, str(c * k), "Geometry", rng.randint(1, 2))


def _sector(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    r, angle = rng.randint(2, 15), rng.choice((30, 40, 45, 60, 72, 90, 120, 135, 150, 216, 240, 270))
    area = Fraction(angle * r * r, 360)
    answer = ("" if area == 1 else _frac(area)) + "\\pi"
    statement = (
        f"A fan-shaped flower bed in {s['place']} is a sector of a circle with radius {r} meters and central angle "
        f"${angle}^\\circ$. What is its area in square meters? Express your answer in terms of $\\pi$."
    )
    steps = [
        f"A sector with central angle ${angle}^\\circ$ is $\\frac{{{angle}}}{{360}}$ of the whole disk.",
        f"The disk's area is ${r * r}\\pi$, so the sector's is "
        f"$\\frac{{{angle}}}{{360}} \\cdot {r * r}\\pi = {answer}$.",
    ]
    return MathProblem(statement, steps, answer, "Geometry", rng.randint(2, 3))


def _tickets(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    adult = rng.randint(8, 25)
    child = rng.randint(3, adult - 2)
    x, y = rng.randint(20, 200), rng.randint(10, 200)
    total, revenue = x + y, adult * x + child * y
    statement = (
        f"An exhibition on {s['title']} sold {total} tickets in one day: adult tickets at {adult} euros and "
        f"reduced tickets at {child} euros. The day's takings were {revenue} euros. How many adult tickets were sold?"
    )
    steps = [
        f"Let $a$ be the adult tickets and $c$ the reduced ones: $a + c = {total}$ and "
        f"${adult}a + {child}c = {revenue}$.",
        f"Substituting $c = {total} - a$: ${adult}a + {child}({total} - a) = {revenue}$, so ${adult - child}a = "
        f"{revenue - child * total}$.",
        f"Hence $a = {x}$.",
    ]
    return MathProblem(statement, steps, str(x), "Algebra", rng.randint(2, 3))


def _couriers(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    hours, v1, v2 = rng.randint(2, 9), rng.randint(8, 24) * 5, rng.randint(8, 24) * 5
    distance = (v1 + v2) * hours
    statement = (
        f"Two couriers carrying documents about {s['title']} leave two towns {distance} km apart at the same time "
        f"and drive towards each other at {v1} km/h and {v2} km/h. After how many hours do they meet?"
    )
    steps = [
        f"The distance between them shrinks by ${v1} + {v2} = {v1 + v2}$ km every hour.",
        f"They meet after $\\frac{{{distance}}}{{{v1 + v2}}} = {hours}$ hours.",
    ]
    return MathProblem(statement, steps, str(hours), "Prealgebra", 2)


def _recurrence(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    a1, a2, k = rng.randint(1, 9), rng.randint(1, 9), rng.randint(8, 15)
    terms = [a1, a2]
    while len(terms) < k:
        terms.append(terms[-1] + terms[-2])
    statement = (
        f"A sequence satisfies $a_1 = {a1}$, $a_2 = {a2}$ and $a_n = a_{{n-1}} + a_{{n-2}}$ for $n \\ge 3$. "
        f"Find $a_{{{k}}}$."
    )
    steps = [
        "Each term is the sum of the two before it, so list the terms in order.",
        f"The sequence begins ${', '.join(map(str, terms))}$.",
        f"So $a_{{{k}}} = {terms[-1]}$.",
    ]
    return MathProblem(statement, steps, str(terms[-1]), "Intermediate Algebra", 2)


def _remainder(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    degree, r = rng.randint(3, 4), rng.choice([v for v in range(-4, 5) if v])
    coeffs = [rng.randint(1, 5)] + [rng.randint(-9, 9) for _ in range(degree)]  # highest power first
    powers = range(degree, -1, -1)
    poly = ""
    for power, coeff in zip(powers, coeffs):
        if coeff:
            body = ("" if abs(coeff) == 1 and power else str(abs(coeff))) + ("x" * (power > 0))
            body += f"^{power}" if power > 1 else ""
            poly += (" - " if coeff < 0 else " + ") + body if poly else body
    values = [c * r**p for p, c in zip(powers, coeffs) if c]
    value = sum(values)
    statement = f"Find the remainder when $p(x) = {poly}$ is divided by $x {_signed(-r)}$."
    steps = [
        f"By the remainder theorem, the remainder is $p({r})$.",
        f"Term by term, $p({r}) = " + " + ".join(f"({v})" for v in values) + f" = {value}$.",
    ]
    return MathProblem(statement, steps, str(value), "Intermediate Algebra", rng.randint(3, 4))


def _determinant(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    n = rng.choice((2, 3))
    m = [[rng.randint(-9, 9) for _ in range(n)] for _ in range(n)]
    if n == 2:
        det = m[0][0] * m[1][1] - m[0][1] * m[1][0]
        expansion = f"({m[0][0]})({m[1][1]}) - ({m[0][1]})({m[1][0]}) = {det}"
    else:
        minors = [
            m[1][1] * m[2][2] - m[1][2] * m[2][1],
            m[1][0] * m[2][2] - m[1][2] * m[2][0],
            m[1][0] * m[2][1] - m[1][1] * m[2][0],
        ]
        det = m[0][0] * minors[0] - m[0][1] * minors[1] + m[0][2] * minors[2]
        expansion = f"{m[0][0]}({minors[0]}) - ({m[0][1]})({minors[1]}) + ({m[0][2]})({minors[2]}) = {det}"
    rows = " \\\\ ".join(" & ".join(map(str, row)) for row in m)
    statement = f"Compute $\\begin{{vmatrix}} {rows} \\end{{vmatrix}}$."
    steps = ["Expand along the first row." if n == 3 else "Use $ad - bc$.", f"${expansion}$."]
    return MathProblem(statement, steps, str(det), "Precalculus", rng.randint(1, 3))


def _triangle_angle(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    a, b, angle = rng.randint(4, 30), rng.randint(4, 30), rng.choice((30, 150, 90, 60, 120))
    half = Fraction(a * b, 2)
    if angle in (30, 150):
        answer, sine = _frac(half / 2), "\\frac{1}{2}"
    elif angle == 90:
        answer, sine = _frac(half), "1"
    else:
        coeff = half / 2
        answer = (
            f"\\frac{{{coeff.numerator}\\sqrt{{3}}}}{{{coeff.denominator}}}"
            if coeff.denominator > 1
            else f"{coeff.numerator}\\sqrt{{3}}"
        )
        sine = "\\frac{\\sqrt{3}}{2}"
    statement = (
        f"In triangle $ABC$, $AB = {a}$, $AC = {b}$ and $\\angle BAC = {angle}^\\circ$. Find the area of the triangle."
    )
    steps = [
        "The area of a triangle with two sides and the included angle is $\\frac{1}{2}ab\\sin C$.",
        f"Here $\\sin {angle}^\\circ = {sine}$, so the area is "
        f"$\\frac{{1}}{{2}} \\cdot {a} \\cdot {b} \\cdot {sine} = {answer}$.",
    ]
    return MathProblem(statement, steps, answer, "Precalculus", rng.randint(2, 3))


def _digit_sum(rng: random.Random, s: dict[str, Any]) -> MathProblem:
    base, k = rng.choice((2, 3, 7)), rng.randint(10, 40)
    value = base**k
    answer = sum(map(int, str(value)))
    statement = f"What is the sum of the digits of ${base}^{{{k}}}$?"
    steps = [f"${base}^{{{k}}} = {value}$.", f"Its digits add up to ${' + '.join(str(value))} = {answer}$."]
    return MathProblem(statement, steps, str(answer), "Number Theory", 2)


MATH_FAMILIES: tuple[Callable[[random.Random, dict[str, Any]], MathProblem], ...] = (
    _archive,
    _crates,
    _linear,
    _quadratic,
    _series,
    _draw_two,
    _committee,
    _power_mod,
    _bells,
    _divisors,
    _growth,
    _courtyard,
    _sector,
    _tickets,
    _couriers,
    _recurrence,
    _remainder,
    _determinant,
    _triangle_angle,
    _digit_sum,
)


def _math_problem(rng: random.Random) -> tuple[MathProblem, dict[str, Any]]:
    slots = _slots_for(rng)
    problem = rng.choice(MATH_FAMILIES)(rng, slots)
    if rng.random() < 0.25:  # a setting sentence in front: more varied prompts, as in story-style sets
        setting = rng.choice(_BANKS["math_settings"]).format(**slots)
        problem = MathProblem(
            f"{setting} {problem.statement}", problem.steps, problem.answer, problem.kind, problem.level
        )
    return problem, slots


def _worked_solution(rng: random.Random, problem: MathProblem, slots: dict[str, Any], target_words: int) -> str:
    """A MATH-style solution: the steps as prose, explanations up to the length, the boxed answer last."""
    text = " ".join(problem.steps)
    extra = target_words - _words(text)
    if extra > 0:
        text += "\n\n" + " ".join(_sentences(rng, _BANKS["math_explain"], slots, extra, repeat=False))
    return f"{text}\n\nTherefore, the answer is $\\boxed{{{problem.answer}}}$."


def _reasoning(rng: random.Random, problem: MathProblem, slots: dict[str, Any], target_words: int) -> str:
    """A long-form trajectory: the setup, the steps, checks that redo them, asides, up to `target_words`."""
    parts = [f"We need to solve: {problem.statement}", "Let me work through it.", *problem.steps]
    checks = ("Let me double-check.", "Let me verify that once more.", "Recomputing to be safe:", "Checking again:")
    asides = _sentences(rng, _BANKS["math_reasoning"], slots, target_words)  # one deck: few repeats
    while _words("\n\n".join(parts)) < target_words and asides:
        take = rng.randint(2, 4)
        parts.append(" ".join(asides[:take]))
        del asides[:take]
        if rng.random() < 0.5:
            parts.append(rng.choice(checks) + " " + " ".join(problem.steps))
    parts.append(f"So the answer is ${problem.answer}$.")
    return "\n\n".join(parts)


# --- code: OpenCodeInstruct-style tasks; the solution is run here to compute the samples and unit tests ---------
@dataclass(frozen=True)
class CodeFamily:
    names: tuple[str, ...]  # function (or class) names to draw from
    params: tuple[str, ...]  # names of the main parameter
    input_phrase: str  # "{param}": the main parameter
    task: str
    input_desc: str
    output_desc: str
    code: str  # NAME and PARAM are replaced
    args: Callable[[random.Random, dict[str, Any]], tuple[Any, ...]]  # one call's arguments
    notes: tuple[str, ...]  # what the explanation says about this code


def _ints(rng: random.Random, low: int, high: int, n_low: int, n_high: int) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(n_low, n_high))]


def _phrase(rng: random.Random, s: dict[str, Any]) -> str:
    return rng.choice(SEED_SENTENCES).format(**s)


CODE_FAMILIES: tuple[CodeFamily, ...] = (
    CodeFamily(
        ("find_mode", "most_frequent", "most_common_value", "modal_value"),
        ("numbers", "readings", "scores", "years", "counts", "values"),
        "a list of integers `{param}`",
        "returns the most frequent element; if several elements are equally frequent, it returns the smallest one",
        "A list of integers `{param}` (0 <= len({param}) <= 10^5).",
        "The most frequent integer, or `None` if the list is empty.",
        '''from collections import Counter


def NAME(PARAM):
    """
    Return the most frequent value in PARAM; ties go to the smallest value.

    :param PARAM: A list of integers.
    :return: The most frequent integer, or None if the list is empty.
    """
    if not PARAM:
        return None
    counts = Counter(PARAM)
    best = max(counts.values())
    return min(value for value, count in counts.items() if count == best)
''',
        lambda rng, s: (_ints(rng, 1, 9, 5, 14),),
        (
            "`Counter` counts every value in one pass over the list.",
            "Among the values with the highest count, `min` picks the smallest, which settles ties deterministically.",
            "An empty list returns `None` instead of raising an exception.",
        ),
    ),
    CodeFamily(
        ("moving_average", "rolling_mean", "sliding_averages", "window_means"),
        ("values", "temperatures", "prices", "measurements", "daily_visits"),
        "a list of numbers `{param}` and a window size `window`",
        "returns the average of every full window of consecutive elements, rounded to two decimals",
        "A list of numbers `{param}` and an integer `window` (1 <= window <= len({param})).",
        "A list of floats, one per full window, each rounded to two decimal places.",
        '''def NAME(PARAM, window):
    """
    Compute the moving averages of PARAM over a sliding window.

    :param PARAM: A list of numbers.
    :param window: The window size, a positive integer.
    :return: A list of averages rounded to two decimals, one per full window.
    """
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    total = 0
    for i, value in enumerate(PARAM):
        total += value
        if i >= window:
            total -= PARAM[i - window]
        if i >= window - 1:
            averages.append(round(total / window, 2))
    return averages
''',
        lambda rng, s: (_ints(rng, 0, 120, 5, 12), rng.randint(2, 4)),
        (
            "A running total is updated as the window slides, so each step costs constant time.",
            "The element leaving the window is subtracted once the window is full.",
            "A non-positive window size raises a `ValueError` early.",
        ),
    ),
    CodeFamily(
        ("run_length_encode", "compress_runs", "rle_encode", "encode_runs"),
        ("text", "sequence", "signal", "message"),
        "a string `{param}`",
        "returns its run-length encoding, where each maximal run of a character becomes the character followed by "
        "the length of the run",
        "A string `{param}` of lowercase letters (0 <= len({param}) <= 10^4).",
        "The encoded string, for example `aaab` becomes `a3b1`.",
        '''def NAME(PARAM):
    """
    Encode PARAM with run-length encoding: each run of a repeated character becomes the character and its count.

    :param PARAM: A string.
    :return: The encoded string, e.g. 'aaab' -> 'a3b1'.
    """
    if not PARAM:
        return ""
    parts = []
    current, count = PARAM[0], 1
    for char in PARAM[1:]:
        if char == current:
            count += 1
        else:
            parts.append(f"{current}{count}")
            current, count = char, 1
    parts.append(f"{current}{count}")
    return "".join(parts)
''',
        lambda rng, s: ("".join(rng.choice("abc") * rng.randint(1, 4) for _ in range(rng.randint(3, 7))),),
        (
            "The loop keeps the current character and the length of its run.",
            "When the character changes, the finished run is appended to the output.",
            "The last run is appended after the loop, and an empty string encodes to an empty string.",
        ),
    ),
    CodeFamily(
        ("is_balanced", "brackets_match", "check_brackets", "valid_nesting"),
        ("expression", "formula", "source", "markup"),
        "a string `{param}` containing the characters `()[]{{}}` and possibly others",
        "returns `True` if every bracket is closed by the matching bracket in the correct order and `False` otherwise",
        "A string `{param}` (0 <= len({param}) <= 10^4).",
        "`True` if the brackets are balanced, `False` otherwise.",
        '''def NAME(PARAM):
    """
    Check whether the brackets in PARAM are balanced.

    :param PARAM: A string that may contain (), [] and {} among other characters.
    :return: True if every opening bracket is closed in the right order, False otherwise.
    """
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for char in PARAM:
        if char in "([{":
            stack.append(char)
        elif char in pairs:
            if not stack or stack.pop() != pairs[char]:
                return False
    return not stack
''',
        lambda rng, s: (
            _brackets(rng, rng.randint(2, 6))
            if rng.random() < 0.5
            else "".join(rng.choice("()[]{}xy") for _ in range(rng.randint(4, 12))),
        ),
        (
            "Opening brackets are pushed on a stack.",
            "A closing bracket must match the most recent unmatched opening bracket.",
            "Characters that are not brackets are ignored, and a non-empty stack at the end means an unclosed bracket.",
        ),
    ),
    CodeFamily(
        ("merge_intervals", "merge_ranges", "combine_periods", "union_of_intervals"),
        ("intervals", "periods", "bookings", "ranges"),
        "a list of closed intervals `{param}`, each a pair `[start, end]`",
        "merges all overlapping intervals and returns the result sorted by start",
        "A list `{param}` of pairs of integers `[start, end]` with start <= end.",
        "A list of merged, non-overlapping intervals sorted by their start.",
        '''def NAME(PARAM):
    """
    Merge overlapping closed intervals.

    :param PARAM: A list of [start, end] pairs.
    :return: The merged intervals, sorted by start.
    """
    merged = []
    for start, end in sorted(PARAM):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
''',
        lambda rng, s: ([sorted([rng.randint(0, 30), rng.randint(0, 30)]) for _ in range(rng.randint(3, 7))],),
        (
            "Sorting by start means overlapping intervals become neighbours.",
            "Each interval either extends the last merged interval or starts a new one.",
            "The work is dominated by the sort, O(n log n).",
        ),
    ),
    CodeFamily(
        ("top_words", "most_common_words", "word_frequencies", "frequent_terms"),
        ("text", "document", "passage", "transcript"),
        "a string `{param}` and an integer `k`",
        "returns the `k` most frequent words (case-insensitive) with their counts, most frequent first and ties in "
        "alphabetical order",
        "A string `{param}` and an integer `k` (1 <= k <= 100).",
        "A list of `(word, count)` tuples of length at most `k`.",
        '''import re
from collections import Counter


def NAME(PARAM, k):
    """
    Find the k most frequent words of PARAM.

    :param PARAM: The text to analyse.
    :param k: How many words to return.
    :return: A list of (word, count) tuples, by decreasing count, ties alphabetical.
    """
    words = re.findall(r"[a-z']+", PARAM.lower())
    counts = Counter(words)
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:k]
''',
        lambda rng, s: (" ".join(_phrase(rng, s) for _ in range(rng.randint(2, 3))), rng.randint(2, 4)),
        (
            "A regular expression extracts the words after lowercasing the text.",
            "`Counter` tallies the words, and the sort key orders by count and then alphabetically.",
            "Slicing the sorted list returns at most `k` pairs.",
        ),
    ),
    CodeFamily(
        ("flatten", "flatten_nested", "deep_flatten", "flatten_list"),
        ("nested", "tree", "items", "groups"),
        "an arbitrarily nested list `{param}`",
        "returns a flat list of all its non-list elements in their original order",
        "A list `{param}` whose elements are integers or lists of the same kind.",
        "A flat list of integers.",
        '''def NAME(PARAM):
    """
    Flatten an arbitrarily nested list.

    :param PARAM: A list whose elements are values or further lists.
    :return: A flat list of the values, in order.
    """
    flat = []
    for element in PARAM:
        if isinstance(element, list):
            flat.extend(NAME(element))
        else:
            flat.append(element)
    return flat
''',
        lambda rng, s: (
            [
                rng.randint(1, 9),
                [rng.randint(1, 9), [rng.randint(1, 9)]],
                rng.randint(1, 9),
                [[rng.randint(1, 9)], rng.randint(1, 9)],
            ][: rng.randint(2, 4)],
        ),
        (
            "The function calls itself on every element that is a list.",
            "Other elements are appended in order, so the original order is preserved.",
            "The recursion depth equals the nesting depth of the input.",
        ),
    ),
    CodeFamily(
        ("roman_to_int", "parse_roman", "roman_value", "from_roman"),
        ("numeral", "roman", "label", "year_numeral"),
        "a string `{param}` holding a Roman numeral",
        "returns its integer value",
        "A valid Roman numeral `{param}` between I and MMMCMXCIX.",
        "The integer value of the numeral.",
        '''def NAME(PARAM):
    """
    Convert a Roman numeral to an integer.

    :param PARAM: A valid Roman numeral, e.g. 'MCMXCIV'.
    :return: Its value as an int.
    """
    values = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
    total = 0
    for i, char in enumerate(PARAM):
        value = values[char]
        if i + 1 < len(PARAM) and values[PARAM[i + 1]] > value:
            total -= value
        else:
            total += value
    return total
''',
        lambda rng, s: (_to_roman(rng.randint(1, 3999)),),
        (
            "Each symbol's value is added, unless a larger symbol follows it.",
            "In that case the value is subtracted, which handles IV, IX, XL and the like.",
            "A single left-to-right pass is enough.",
        ),
    ),
    CodeFamily(
        ("caesar_cipher", "shift_letters", "rotate_text", "encrypt_caesar"),
        ("text", "message", "note", "inscription"),
        "a string `{param}` and an integer `shift`",
        "returns the text with every letter shifted by `shift` positions in the alphabet, keeping case and leaving "
        "other characters unchanged",
        "A string `{param}` and an integer `shift` (-1000 <= shift <= 1000).",
        "The encrypted string.",
        '''def NAME(PARAM, shift):
    """
    Apply a Caesar shift to the letters of PARAM.

    :param PARAM: The text to encrypt.
    :param shift: How many positions to shift each letter (may be negative).
    :return: The shifted text; case is kept, other characters are unchanged.
    """
    result = []
    for char in PARAM:
        if char.isascii() and char.isalpha():
            base = ord("A") if char.isupper() else ord("a")
            result.append(chr((ord(char) - base + shift) % 26 + base))
        else:
            result.append(char)
    return "".join(result)
''',
        lambda rng, s: (f"{rng.choice(TITLES)} in {rng.choice(PLACES)}", rng.randint(-30, 30)),
        (
            "Only ASCII letters are shifted; digits, spaces and accented letters are left as they are.",
            "The modulo keeps the shifted letter inside the alphabet, also for negative shifts.",
            "Upper- and lower-case letters use their own base code point, so case is preserved.",
        ),
    ),
    CodeFamily(
        ("primes_up_to", "sieve", "list_primes", "prime_numbers"),
        ("limit", "n", "upper_bound", "maximum"),
        "an integer `{param}`",
        "returns all prime numbers less than or equal to it, using the sieve of Eratosthenes",
        "An integer `{param}` (0 <= {param} <= 10^6).",
        "A list of the primes up to `{param}`, in increasing order.",
        '''def NAME(PARAM):
    """
    Return all primes <= PARAM (sieve of Eratosthenes).

    :param PARAM: The upper bound, an integer.
    :return: A sorted list of primes.
    """
    if PARAM < 2:
        return []
    is_prime = [True] * (PARAM + 1)
    is_prime[0] = is_prime[1] = False
    for p in range(2, int(PARAM**0.5) + 1):
        if is_prime[p]:
            for multiple in range(p * p, PARAM + 1, p):
                is_prime[multiple] = False
    return [p for p, prime in enumerate(is_prime) if prime]
''',
        lambda rng, s: (rng.randint(10, 60),),
        (
            "The sieve marks the multiples of each prime as composite.",
            "Marking starts at p * p, because smaller multiples were already marked by smaller primes.",
            "The overall cost is O(n log log n).",
        ),
    ),
    CodeFamily(
        ("group_by_century", "bucket_by_century", "centuries_index", "split_by_century"),
        ("records", "events", "entries", "documents"),
        "a list `{param}` of `(name, year)` tuples",
        "returns a dictionary mapping each century (the year 1801 is in the 19th) to the sorted list of names from it",
        "A list `{param}` of tuples `(name, year)` with 1 <= year <= 2100.",
        "A dictionary `{{century: [names]}}` with the names sorted alphabetically.",
        '''def NAME(PARAM):
    """
    Group names by the century of their year.

    :param PARAM: A list of (name, year) tuples.
    :return: A dict mapping century number to the alphabetically sorted names of that century.
    """
    groups = {}
    for name, year in PARAM:
        century = (year - 1) // 100 + 1
        groups.setdefault(century, []).append(name)
    return {century: sorted(names) for century, names in sorted(groups.items())}
''',
        lambda rng, s: ([(t, rng.randint(800, 2000)) for t in rng.sample(TITLES, rng.randint(3, 5))],),
        (
            "The century of a year is `(year - 1) // 100 + 1`, so 1800 is in the 18th century and 1801 in the 19th.",
            "`setdefault` creates each century's list on first use.",
            "The names of each century are sorted, and the dictionary is built in century order.",
        ),
    ),
    CodeFamily(
        ("longest_common_prefix", "common_prefix", "shared_prefix", "prefix_of_all"),
        ("words", "paths", "identifiers", "names"),
        "a list of strings `{param}`",
        "returns the longest string that is a prefix of every element",
        "A list of strings `{param}` (0 <= len({param}) <= 10^4).",
        "The longest common prefix, or an empty string if there is none.",
        '''def NAME(PARAM):
    """
    Return the longest common prefix of the strings in PARAM.

    :param PARAM: A list of strings.
    :return: The longest common prefix ('' for an empty list).
    """
    if not PARAM:
        return ""
    shortest, longest = min(PARAM), max(PARAM)
    i = 0
    while i < len(shortest) and shortest[i] == longest[i]:
        i += 1
    return shortest[:i]
''',
        lambda rng, s: (
            [
                rng.choice(("arch", "archive", "arc")) + w
                for w in rng.sample(("ive", "al", "s", "er", "", "ives", "ed"), 3)
            ],
        ),
        (
            "The common prefix of all the strings is the common prefix of the lexicographically smallest and largest.",
            "So only two strings need to be compared character by character.",
            "An empty list has the empty string as its prefix.",
        ),
    ),
    CodeFamily(
        ("binary_search", "find_index", "search_sorted", "locate"),
        ("sorted_values", "sorted_years", "ordered_ids", "timeline"),
        "a sorted list of integers `{param}` and an integer `target`",
        "returns the index of `target` in the list, or -1 if it is absent, in logarithmic time",
        "A list `{param}` sorted in increasing order without duplicates, and an integer `target`.",
        "The index of `target`, or -1.",
        '''def NAME(PARAM, target):
    """
    Binary search for target in the sorted list PARAM.

    :param PARAM: A list of integers in increasing order.
    :param target: The value to find.
    :return: Its index, or -1 if it is not present.
    """
    low, high = 0, len(PARAM) - 1
    while low <= high:
        middle = (low + high) // 2
        if PARAM[middle] == target:
            return middle
        if PARAM[middle] < target:
            low = middle + 1
        else:
            high = middle - 1
    return -1
''',
        lambda rng, s: (sorted(rng.sample(range(1, 200), 8)), rng.randint(1, 199)),
        (
            "The search keeps an interval `[low, high]` that must contain the target if it is present.",
            "Each comparison halves the interval, which gives O(log n) steps.",
            "When the interval becomes empty, the target is absent and -1 is returned.",
        ),
    ),
    CodeFamily(
        ("invert_mapping", "reverse_index", "group_keys_by_value", "invert_dict"),
        ("mapping", "assignments", "owners", "locations"),
        "a dictionary `{param}`",
        "returns a new dictionary that maps each value to the sorted list of keys that had it",
        "A dictionary `{param}` with string keys and hashable values.",
        "A dictionary mapping each value to a sorted list of keys.",
        '''def NAME(PARAM):
    """
    Invert a mapping, grouping keys that share a value.

    :param PARAM: A dict.
    :return: A dict mapping each value of PARAM to the sorted list of its keys.
    """
    inverted = {}
    for key, value in PARAM.items():
        inverted.setdefault(value, []).append(key)
    return {value: sorted(keys) for value, keys in inverted.items()}
''',
        lambda rng, s: ({t: rng.choice(("Europe", "Asia", "Americas")) for t in rng.sample(TITLES, 4)},),
        (
            "Each key is appended to the list of its value.",
            "`setdefault` creates the list the first time a value is seen.",
            "The key lists are sorted so that the result does not depend on insertion order.",
        ),
    ),
)


def _brackets(rng: random.Random, pairs: int) -> str:
    """A balanced bracket string of `pairs` pairs, with a letter here and there."""
    if pairs == 0:
        return rng.choice(("", "", "x", "y"))
    inside = rng.randint(0, pairs - 1)
    opening, closing = rng.choice((("(", ")"), ("[", "]"), ("{", "}")))
    return opening + _brackets(rng, inside) + closing + _brackets(rng, pairs - 1 - inside)


def _to_roman(value: int) -> str:
    numerals = (
        (1000, "M"),
        (900, "CM"),
        (500, "D"),
        (400, "CD"),
        (100, "C"),
        (90, "XC"),
        (50, "L"),
        (40, "XL"),
        (10, "X"),
        (9, "IX"),
        (5, "V"),
        (4, "IV"),
        (1, "I"),
    )
    out = ""
    for amount, numeral in numerals:
        while value >= amount:
            out += numeral
            value -= amount
    return out


@dataclass(frozen=True)
class CodeTask:
    prompt: str
    response: str
    unit_tests: list[str]
    name: str


def _call(name: str, args: tuple[Any, ...]) -> str:
    return f"{name}({', '.join(map(repr, args))})"


def _code_task(rng: random.Random, target_words: int) -> CodeTask:
    """An OpenCodeInstruct row's input and output: the family's code is executed here on drawn arguments, so the
    sample, the unit tests and the usage block show what the code really returns. Longer rows add sections
    (explanation, usage, a unittest class) and more calls, in a drawn order, until about `target_words`."""
    s = _slots_for(rng)
    family = rng.choice(CODE_FAMILIES)
    name, param = rng.choice(family.names), rng.choice(family.params)
    code = family.code.replace("NAME", name).replace("PARAM", param)
    namespace: dict[str, Any] = {}
    exec(code, namespace)  # the code is this module's own template
    calls = [family.args(rng, s) for _ in range(min(14, max(3, target_words // 45)))]
    results = [namespace[name](*args) for args in calls]
    fmt = {"param": param, "name": name}
    intro = rng.choice(_BANKS["code_intros"]).format(
        input_phrase=family.input_phrase.format(**fmt), name=name, task=family.task
    )
    parts = [intro]
    if rng.random() < 0.7:
        parts.append(rng.choice(_BANKS["code_contexts"]).format(**s))
    requirements = rng.sample(_BANKS["code_requirements"], rng.randint(0, 3))
    if requirements:
        parts.append(" ".join(requirements))
    sample_in = "\n".join(repr(a) for a in calls[0])
    parts.append(
        f"**Input:**\n- {family.input_desc.format(**fmt)}\n\n**Output:**\n- {family.output_desc.format(**fmt)}\n\n"
        f"**Sample Input:**\n```\n{sample_in}\n```\n\n**Sample Output:**\n```\n{results[0]!r}\n```"
    )
    pairs = list(zip(calls, results))
    explanation = list(family.notes) + rng.sample(_BANKS["code_explanations"], rng.randint(1, 3))
    test_class = "Test" + "".join(w.title() for w in name.split("_"))
    test_methods = "\n".join(
        f"    def test_case_{i}(self):\n        self.assertEqual({_call(name, args)}, {result!r})\n"
        for i, (args, result) in enumerate(pairs)
    )
    sections = [
        "### Explanation\n\n" + "\n".join(f"- {sentence}" for sentence in explanation),
        "### Example usage\n\n```python\n"
        + "\n".join(f"print({_call(name, args)})  # {result!r}" for args, result in pairs[:4])
        + "\n```",
        f"### Tests\n\n```python\nimport unittest\n\n\nclass {test_class}(unittest.TestCase):\n{test_methods}\n\n"
        'if __name__ == "__main__":\n    unittest.main()\n```',
    ]
    rng.shuffle(sections)
    response = f"```python\n{code}```"
    for section in sections:
        if _words(response) >= target_words:
            break
        response += "\n\n" + section
    tests = [f"assert {_call(name, args)} == {result!r}" for args, result in pairs]
    return CodeTask(prompt="\n\n".join(parts), response=response, unit_tests=tests, name=name)


# --- DeepCoder: stdin / stdout problems; the first solution is run here to compute the tests ------------------
@dataclass(frozen=True)
class StdinProblem:
    stories: tuple[str, ...]  # slots: name, title, place, field, ...
    input_spec: str
    output_spec: str
    make_input: Callable[[random.Random], str]
    solutions: tuple[str, ...]  # Python programs reading stdin


def _lines(*rows: Any) -> str:
    return "\n".join(" ".join(map(str, row)) if isinstance(row, list | tuple) else str(row) for row in rows) + "\n"


def _range_sums_input(rng: random.Random) -> str:
    n, q = rng.randint(3, 8), rng.randint(2, 5)
    queries = [sorted((rng.randint(1, n), rng.randint(1, n))) for _ in range(q)]
    return _lines([n, q], [rng.randint(0, 50) for _ in range(n)], *queries)


def _pairs_input(rng: random.Random) -> str:
    n, k = rng.randint(4, 9), rng.randint(2, 7)
    return _lines([n, k], [rng.randint(1, 30) for _ in range(n)])


def _kadane_input(rng: random.Random) -> str:
    n = rng.randint(4, 10)
    return _lines(n, [rng.randint(-20, 20) for _ in range(n)])


def _halls_input(rng: random.Random) -> str:
    n = rng.randint(3, 7)
    lectures = [(start, start + rng.randint(1, 5)) for start in (rng.randint(0, 12) for _ in range(n))]
    return _lines(n, *lectures)


def _palindrome_input(rng: random.Random) -> str:
    t = rng.randint(2, 5)
    words = ["".join(rng.choice("abcd") for _ in range(rng.randint(1, 7))) for _ in range(t)]
    return _lines(t, *words)


def _grid_input(rng: random.Random) -> str:
    n, m = rng.randint(2, 5), rng.randint(2, 5)
    grid = [["#" if rng.random() < 0.2 else "." for _ in range(m)] for _ in range(n)]
    grid[0][0] = grid[n - 1][m - 1] = "."
    return _lines([n, m], *("".join(row) for row in grid))


STDIN_PROBLEMS: tuple[StdinProblem, ...] = (
    StdinProblem(
        (
            "{name} is arranging the rooms of an exhibition about {title} in {place}. Room $i$ holds $a_i$ exhibits. "
            "Visitors keep asking how many exhibits there are in rooms $l$ through $r$, and {name} wants to answer "
            "every question instantly.",
            "An archive devoted to {title} stores its documents on $n$ shelves; shelf $i$ holds $a_i$ boxes. For each "
            "of $q$ requests, {name} must report the total number of boxes on shelves $l, l+1, \\ldots, r$.",
        ),
        "The first line contains two integers $n$ and $q$ ($1 \\le n, q \\le {big}$). The second line contains $n$ "
        "integers $a_1, \\ldots, a_n$ ($0 \\le a_i \\le 10^9$). Each of the next $q$ lines contains two integers $l$ "
        "and $r$ ($1 \\le l \\le r \\le n$).",
        "For each request print the answer on its own line.",
        _range_sums_input,
        (
            """n, q = map(int, input().split())
a = list(map(int, input().split()))
prefix = [0]
for value in a:
    prefix.append(prefix[-1] + value)
out = []
for _ in range(q):
    l, r = map(int, input().split())
    out.append(prefix[r] - prefix[l - 1])
print("\\n".join(map(str, out)))
""",
            """import sys
from itertools import accumulate

data = sys.stdin.read().split()
n, q = int(data[0]), int(data[1])
prefix = [0, *accumulate(map(int, data[2 : 2 + n]))]
rest = data[2 + n :]
for i in range(q):
    l, r = int(rest[2 * i]), int(rest[2 * i + 1])
    print(prefix[r] - prefix[l - 1])
""",
        ),
    ),
    StdinProblem(
        (
            "{name} found $n$ cards from an old board game about {title}; the $i$-th card shows the number $a_i$. "
            "A pair of cards is lucky if the sum of their numbers is divisible by $k$. Count the lucky pairs "
            "$(i, j)$ with $i < j$.",
            "Tickets for a festival on {title} in {place} carry numbers $a_1, \\ldots, a_n$. Two tickets form a "
            "matching pair when the sum of their numbers is a multiple of $k$. How many unordered pairs of distinct "
            "tickets match?",
        ),
        "The first line contains two integers $n$ and $k$ ($1 \\le n \\le {big}$, $1 \\le k \\le 10^9$). The second "
        "line contains $n$ integers $a_i$ ($1 \\le a_i \\le 10^9$).",
        "Print one integer: the number of pairs.",
        _pairs_input,
        (
            """n, k = map(int, input().split())
a = list(map(int, input().split()))
count = {}
pairs = 0
for value in a:
    r = value % k
    pairs += count.get((k - r) % k, 0)
    count[r] = count.get(r, 0) + 1
print(pairs)
""",
        ),
    ),
    StdinProblem(
        (
            "A shop selling souvenirs of {title} in {place} recorded its profit for $n$ consecutive days; the profit "
            "$a_i$ of day $i$ may be negative. {name} wants the largest total profit over a non-empty run of "
            "consecutive days.",
            "{name} tracks the daily change $a_i$ of the number of visitors to a museum of {field} over $n$ days. "
            "Find the maximum sum of a non-empty contiguous block of days.",
        ),
        "The first line contains an integer $n$ ($1 \\le n \\le {big}$). The second line contains $n$ integers $a_i$ "
        "($-10^9 \\le a_i \\le 10^9$).",
        "Print the maximum sum.",
        _kadane_input,
        (
            """n = int(input())
a = list(map(int, input().split()))
best = current = a[0]
for value in a[1:]:
    current = max(value, current + value)
    best = max(best, current)
print(best)
""",
        ),
    ),
    StdinProblem(
        (
            "{name} is organising $n$ lectures about {title}; lecture $i$ occupies the time interval $[s_i, e_i)$. "
            "Two lectures that overlap need different halls. What is the minimum number of halls needed?",
            "During a conference on {field} in {place}, $n$ workshops are planned, the $i$-th from time $s_i$ "
            "(inclusive) to $e_i$ (exclusive). Find the smallest number of rooms in which all workshops fit.",
        ),
        "The first line contains an integer $n$ ($1 \\le n \\le {big}$). Each of the next $n$ lines contains two "
        "integers $s_i$ and $e_i$ ($0 \\le s_i < e_i \\le 10^9$).",
        "Print the minimum number of halls.",
        _halls_input,
        (
            """n = int(input())
events = []
for _ in range(n):
    s, e = map(int, input().split())
    events.append((s, 1))
    events.append((e, -1))
events.sort()
current = best = 0
for _, delta in events:
    current += delta
    best = max(best, current)
print(best)
""",
        ),
    ),
    StdinProblem(
        (
            "{name} collects short inscriptions found near {place}. For each inscription (a string of lowercase "
            "letters) decide whether its letters can be rearranged to form a palindrome.",
            "A puzzle book about {title} lists $t$ words. For each word, answer whether some permutation of its "
            "letters reads the same forwards and backwards.",
        ),
        "The first line contains an integer $t$ ($1 \\le t \\le {big}$). Each of the next $t$ lines contains a "
        "non-empty string of lowercase Latin letters.",
        "For each string print YES if it can be rearranged into a palindrome and NO otherwise.",
        _palindrome_input,
        (
            """from collections import Counter

t = int(input())
for _ in range(t):
    word = input().strip()
    odd = sum(count % 2 for count in Counter(word).values())
    print("YES" if odd <= 1 else "NO")
""",
        ),
    ),
    StdinProblem(
        (
            "A museum of {title} is laid out as an $n \\times m$ grid of halls, and some halls are closed ('#'). "
            "{name} enters at the top-left hall and leaves at the bottom-right one, moving only right or down through "
            "open halls ('.'). Count the possible routes modulo $10^9 + 7$.",
            "The old town of {place} is a grid of $n$ rows and $m$ columns; '#' marks a blocked square. Starting in "
            "the upper-left corner and moving only down or right, how many routes lead to the lower-right corner? "
            "Print the count modulo $10^9 + 7$.",
        ),
        "The first line contains two integers $n$ and $m$ ($1 \\le n, m \\le {grid}$). Each of the next $n$ lines "
        "contains $m$ characters '.' or '#'. The first and the last cell are open.",
        "Print the number of routes modulo $10^9 + 7$.",
        _grid_input,
        (
            """MOD = 10**9 + 7
n, m = map(int, input().split())
grid = [input().strip() for _ in range(n)]
ways = [0] * m
ways[0] = 1
for i in range(n):
    for j in range(m):
        if grid[i][j] == "#":
            ways[j] = 0
        elif j > 0:
            ways[j] = (ways[j] + ways[j - 1]) % MOD
print(ways[m - 1])
""",
        ),
    ),
)


def _run_stdin(program: str, stdin: str) -> str:
    """The program's standard output for `stdin` (this module's own solutions, run in-process)."""
    out = io.StringIO()
    saved = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out):
            exec(program, {"__name__": "__main__"})
    finally:
        sys.stdin = saved
    return out.getvalue()


@dataclass(frozen=True)
class StdinTask:
    problem: str
    tests: str  # JSON text, as the dataset stores it
    solutions: list[str]


def _stdin_task(rng: random.Random) -> StdinTask:
    s = _slots_for(rng)
    spec = rng.choice(STDIN_PROBLEMS)
    bounds = {
        "big": rng.choice(("10^5", "2 \\cdot 10^5", "3 \\cdot 10^5", "5 \\cdot 10^5")),
        "grid": rng.choice(("500", "1000", "2000")),
    }
    story = rng.choice(spec.stories).format(**s)
    if rng.random() < 0.6:
        story += " (A bit of background: " + _phrase(rng, s)[:-1] + ".)"
    cases = []
    for _ in range(rng.randint(2, 4)):
        stdin = spec.make_input(rng)
        cases.append({"input": stdin, "output": _run_stdin(spec.solutions[0], stdin), "testtype": "stdin"})
    examples = "\n\n".join(f"Input\n{c['input']}\nOutput\n{c['output']}" for c in cases[: rng.randint(1, 2)])
    input_spec = spec.input_spec.replace("{big}", bounds["big"]).replace("{grid}", bounds["grid"])
    problem = (
        f"{story}\n\n-----Input-----\n\n{input_spec}"
        f"\n\n-----Output-----\n\n{spec.output_spec}\n\n-----Examples-----\n{examples}"
    )
    return StdinTask(problem, json.dumps(cases), list(spec.solutions))


# --- chat -------------------------------------------------------------------------------------------------------
CHAT_DETAILS = (
    "Please keep it under {n} words.",
    "I'd like to focus on {place} if possible.",
    "Use plain language, please.",
    "A structured answer with headings would be ideal.",
    "I only need the main points.",
    "Feel free to mention what {people} thought about it.",
)


def _opener(rng: random.Random, s: dict[str, Any]) -> str:
    """A first user turn: a bank template, sometimes after a persona sentence or before a detail."""
    text = rng.choice(_BANKS["chat_openers"]).format(**s)
    if rng.random() < 0.35:
        text = f"{s['persona']} {text}"
    if rng.random() < 0.3:
        text += " " + rng.choice(CHAT_DETAILS).format(n=rng.choice((100, 150, 200, 300)), **s)
    return text


def _reply(rng: random.Random, s: dict[str, Any], target_words: int) -> str:
    """An assistant turn of about `target_words` words: a markdown answer (make_sample_data's), prose with advice,
    or a numbered list."""
    style = rng.random()
    if style < 0.45 or target_words < 25:
        return _markdown_answer(rng, EN, s, target_words)
    bank = EN["answer"] + _BANKS["chat_advice"] + SEED_SENTENCES
    opening = rng.choice(_BANKS["chat_short_replies"])
    if style < 0.8:
        return f"{opening} {_prose(rng, bank, s, target_words)}"
    items = _sentences(rng, bank, s, target_words)
    return f"{opening} Here are the main points:\n\n" + "\n".join(f"{i}. {x}" for i, x in enumerate(items, 1))


def _think(rng: random.Random, s: dict[str, Any], answer: str) -> str:
    return f"<think>\n{_prose(rng, EN['reasoning'], s, rng.randint(30, 150))}\n</think>\n\n{answer}"


def _split_words(rng: random.Random, total: int, parts: int) -> list[int]:
    """`total` words over `parts` turns, the first turn the largest share."""
    weights = [rng.uniform(0.6, 1.0) * (1.6 if i == 0 else 1.0) for i in range(parts)]
    return [max(20, round(total * w / sum(weights))) for w in weights]


def _chat(rng: random.Random, s: dict[str, Any], exchanges: int, total_words: int) -> list[tuple[str, str]]:
    """(role, text) turns: an opener, then follow-ups, each answered."""
    turns: list[tuple[str, str]] = []
    followups = rng.sample(_BANKS["chat_followups"], exchanges - 1)
    for i, words in enumerate(_split_words(rng, total_words, exchanges)):
        user = _opener(rng, s) if i == 0 else followups[i - 1].format(**s)
        turns += [("user", user), ("assistant", _reply(rng, s, words))]
    return turns


# --- the shards, source by source ----------------------------------------------------------------------------
def _hostile(
    seed: int, source: str, n: int, kinds: tuple[str, ...], share: float = HOSTILE_SHARE, starts: tuple[int, ...] = (0,)
) -> dict[int, str]:
    """Row index -> hostile kind: round(share * n) rows (at least one), kinds in turn, never the first row of a file
    (`starts`): a duplicate copies an earlier good row of its own file, and the file's first row always is one."""
    candidates = [i for i in range(n) if i not in starts]
    if not candidates:
        return {}
    count = min(len(candidates), max(1, round(n * share)))
    positions = sorted(_rng(seed, source, "hostile").sample(candidates, count))
    return {p: kinds[i % len(kinds)] for i, p in enumerate(positions)}


def _earlier_good(index: int, hostile: dict[int, str], start: int = 0) -> int:
    """The last row before `index`, in its file (from `start`), that is not hostile: what a duplicate copies."""
    return max(i for i in range(start, index) if i not in hostile)


def _content_sha(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()


def _nemotron_good(rng: random.Random, level: str) -> dict[str, Any]:
    problem, s = _math_problem(rng)
    instruction = rng.choice(_BANKS["math_instructions"])
    user = f"{instruction}\n\n{problem.statement}" if rng.random() < 0.8 else f"{problem.statement}\n\n{instruction}"
    low, high, long_high = {"high.part_00": (250, 900, 2400), "medium": (120, 450, None), "low": (40, 180, None)}[level]
    reasoning = _reasoning(rng, problem, s, _size(rng, low, high, long_high))
    if rng.random() < 0.5:
        final = "\n\n".join(problem.steps) + f"\n\n\\[\n\\boxed{{{problem.answer}}}\n\\]"
    else:
        numbered = "\n".join(f"{i}. {step}" for i, step in enumerate(problem.steps, 1))
        final = f"**Solution.**\n\n{numbered}\n\nHence the answer is $\\boxed{{{problem.answer}}}$."
    if rng.random() < 0.08:  # reasoning inline, as some trajectories carry it
        assistant = nemotron_message("assistant", f"<think>\n{reasoning}\n</think>\n\n{final}")
    else:
        assistant = nemotron_message("assistant", final, reasoning)
    tried = rng.choice((8, 16, 32))
    passed = rng.randint(tried // 4, tried)
    on_aops = rng.random() < 0.7
    thread = rng.randint(10**5, 10**7)
    user_id = rng.randint(1000, 900000)
    return nemotron_row(
        _uuid(rng),
        [nemotron_message("user", user), assistant],
        problem=problem.statement,
        expected_answer=problem.answer,
        data_source="aops" if on_aops else "stackexchange",
        metadata={
            f"reason_{level.split('.')[0]}_no_tool": {
                "count": tried,
                "pass": passed,
                "accuracy": round(passed / tried, 4),
            }
        },
        license="cc-by-4.0" if on_aops else "cc-by-sa-4.0",
        used_in=rng.choice((["nano_v3"], [], ["nano_v3", "super_v3"])),
        url=f"https://artofproblemsolving.com/community/c6h{thread}"
        if on_aops
        else f"https://math.stackexchange.com/questions/{thread}",
        user_url=f"https://artofproblemsolving.com/community/user/{user_id}"
        if on_aops
        else f"https://math.stackexchange.com/users/{user_id}",
        user_name=f"{s['adj']}_{s['field'].split()[0]}{user_id % 1000}",
    )


def _nemotron(n: int, seed: int, registry: PromptRegistry) -> list[SampleShard]:
    key = "nemotron_math_v2"
    bounds, start = [], 0
    for i, (stem, share) in enumerate(NEMOTRON_FILES):
        end = n if i == len(NEMOTRON_FILES) - 1 else start + round(n * share)
        bounds.append((stem, start, end))
        start = end
    rows = []
    for stem, lo, hi in bounds:
        for i in range(lo, hi):
            rows.append(
                _distinct(
                    registry,
                    "math",
                    lambda a, i=i, stem=stem: _nemotron_good(_rng(seed, key, i, a), stem),
                    lambda row: row["messages"][0]["content"],
                )
            )
    kinds = ("tool_call", "truncated_line", "number_answer", "blank_answer", "no_uuid", "duplicate")
    hostile = _hostile(seed, key, n, kinds, starts=tuple(lo for _, lo, _ in bounds))
    lines, fates = [], {}
    for i, row in enumerate(rows):
        kind = hostile.get(i)
        if kind == "tool_call":
            user, assistant = row["messages"]
            call = nemotron_message("assistant", "", "Let me check this numerically with the Python tool.")
            result = nemotron_message("tool", row["expected_answer"])
            row = {
                **row,
                "messages": [user, call, result, assistant],
                "tools": [{"type": "function", "function": {"name": "stateful_python_code_exec"}}],
            }
            fates[i] = drops.DROP_UNSUPPORTED_ROLE
        elif kind == "number_answer":
            row = {**row, "expected_answer": len(row["expected_answer"])}
            fates[i] = drops.DROP_WRONG_TYPE
        elif kind == "blank_answer":
            user, assistant = row["messages"]
            row = {**row, "messages": [user, {**assistant, "content": "\n"}]}
            fates[i] = drops.DROP_EMPTY_TURN
        elif kind == "no_uuid":
            row = {**row, "uuid": None}
            fates[i] = drops.DROP_MISSING_SOURCE_ID
        elif kind == "duplicate":
            row = rows[_earlier_good(i, hostile, start=max(lo for _, lo, _ in bounds if lo <= i))]
            fates[i] = drops.DROP_DUPLICATE_SYNTH_ID
        line = json.dumps(row, ensure_ascii=False)
        if kind == "truncated_line":  # an interrupted download
            line = line[: len(line) // 2]
            fates[i] = drops.DROP_INVALID_JSON_LINE
        lines.append(line)
    shards = []
    for stem, lo, hi in bounds:
        if hi > lo:
            local = {i - lo: reason for i, reason in fates.items() if lo <= i < hi}
            shards.append(SampleShard(key, Path(key, f"{stem}.jsonl"), lines[lo:hi], None, local, hi - lo - len(local)))
    return shards


def _hendrycks(n: int, seed: int, registry: PromptRegistry) -> list[SampleShard]:
    key = "hendrycks_math"

    def good(i: int, rng: random.Random) -> dict[str, Any]:
        problem, _ = _math_problem(rng)
        return hendrycks_row(
            problem.statement, problem.answer, f"hendrycks_math_{i}", difficulty=round(rng.uniform(0.05, 0.95), 4)
        )

    rows = [
        _distinct(registry, "math", lambda a, i=i: good(i, _rng(seed, key, i, a)), lambda r: r["question"])
        for i in range(n)
    ]
    hostile = _hostile(seed, key, n, ("no_answer", "no_info", "duplicate_id"))
    fates = {}
    for i, kind in hostile.items():
        if kind == "no_answer":
            rows[i], fates[i] = {**rows[i], "answer": None}, drops.DROP_EMPTY_TURN
        elif kind == "no_info":
            rows[i], fates[i] = {**rows[i], "info": None}, drops.DROP_MISSING_SOURCE_ID
        else:
            rows[i] = {**rows[i], "info": rows[_earlier_good(i, hostile)]["info"]}
            fates[i] = drops.DROP_DUPLICATE_SYNTH_ID
    path = Path(key, "train-00000-of-00001.parquet")
    return [SampleShard(key, path, rows, HENDRYCKS_SCHEMA, fates, n - len(fates))]


def _competition(n: int, seed: int, registry: PromptRegistry) -> list[SampleShard]:
    key = "competition_math"

    def good(rng: random.Random) -> dict[str, Any]:
        problem, s = _math_problem(rng)
        solution = _worked_solution(rng, problem, s, _size(rng, 30, 300, 800))
        return competition_row(problem.statement, solution, f"Level {problem.level}", problem.kind)

    rows = [
        _distinct(registry, "math", lambda a, i=i: good(_rng(seed, key, i, a)), lambda r: r["problem"])
        for i in range(n)
    ]
    hostile = _hostile(seed, key, n, ("no_solution", "blank_problem", "duplicate"))
    fates = {}
    for i, kind in hostile.items():
        if kind == "no_solution":
            rows[i], fates[i] = {**rows[i], "solution": None}, drops.DROP_EMPTY_TURN
        elif kind == "blank_problem":
            rows[i], fates[i] = {**rows[i], "problem": " \n"}, drops.DROP_EMPTY_TURN
        else:
            rows[i], fates[i] = dict(rows[_earlier_good(i, hostile)]), drops.DROP_DUPLICATE_SYNTH_ID
    path = Path(key, "train-00000-of-00001.parquet")
    return [SampleShard(key, path, rows, COMPETITION_SCHEMA, fates, n - len(fates))]


def _opencode(n: int, seed: int, registry: PromptRegistry) -> list[SampleShard]:
    key = "opencodeinstruct"

    def good(rng: random.Random) -> dict[str, Any]:
        task = _code_task(rng, _size(rng, 60, 600, 1300))
        judgement = {
            aspect: {"score": rng.choice((4, 5, 5, 5)), "justification": f"The function `{task.name}` {remark}."}
            for aspect, remark in (
                ("requirement_conformance", "meets the stated requirements"),
                ("logical_correctness", "is logically correct"),
                ("edge_case_consideration", "handles the edge cases named in the task"),
            )
        }
        return opencode_row(
            f"{rng.getrandbits(128):032x}",
            task.prompt,
            task.response,
            domain=rng.choice(("generic", "generic", "algorithmic")),
            generation_algorithm=rng.choice(("self-instruct", "evol-instruct")),
            llm_judgement=json.dumps(judgement),
            unit_tests=json.dumps(task.unit_tests),
            tests_execution_status=json.dumps(["pass"] * len(task.unit_tests)),
            average_test_score="1",
        )

    rows = [
        _distinct(registry, "code", lambda a, i=i: good(_rng(seed, key, i, a)), lambda r: r["input"]) for i in range(n)
    ]
    per_shard = OPENCODE_ROWS_PER_SHARD
    hostile = _hostile(seed, key, n, ("blank_id", "no_output", "duplicate_id"), starts=tuple(range(0, n, per_shard)))
    fates = {}
    for i, kind in hostile.items():
        if kind == "blank_id":
            rows[i], fates[i] = {**rows[i], "id": " "}, drops.DROP_MISSING_SOURCE_ID
        elif kind == "no_output":
            rows[i], fates[i] = {**rows[i], "output": None}, drops.DROP_EMPTY_TURN
        else:
            rows[i] = {**rows[i], "id": rows[_earlier_good(i, hostile, start=i - i % per_shard)]["id"]}
            fates[i] = drops.DROP_DUPLICATE_SYNTH_ID
    shards = []
    count = math.ceil(n / per_shard)
    for k in range(count):
        lo, hi = k * per_shard, min(n, (k + 1) * per_shard)
        local = {i - lo: reason for i, reason in fates.items() if lo <= i < hi}
        path = Path(key, f"train-{k:05d}-of-{count:05d}.parquet")
        shards.append(SampleShard(key, path, rows[lo:hi], OPENCODE_SCHEMA, local, hi - lo - len(local)))
    return shards


def _deepcoder(n: int, seed: int, registry: PromptRegistry) -> list[SampleShard]:
    """`n` rows of a derived release with `solutions`, and n // 10 (at least one) published rows without."""
    key = "deepcoder"

    def good(rng: random.Random) -> dict[str, Any]:
        task = _stdin_task(rng)
        metadata = {"source": rng.choice(("codeforces", "taco", "primeintellect")), "rating": rng.randint(8, 22) * 100}
        return {
            "problem": task.problem,
            "tests": task.tests,
            "metadata": json.dumps(metadata),
            "solutions": task.solutions,
        }

    published_n = max(1, n // 10)
    draws = [
        _distinct(registry, "code", lambda a, i=i: good(_rng(seed, key, i, a)), lambda r: r["problem"])
        for i in range(n + published_n)
    ]
    derived, published = draws[:n], [{k: v for k, v in r.items() if k != "solutions"} for r in draws[n:]]
    hostile = _hostile(seed, key, n, ("no_solutions", "blank_solution"))
    fates = {}
    for i, kind in hostile.items():
        if kind == "no_solutions":
            derived[i], fates[i] = {**derived[i], "solutions": []}, drops.DROP_NO_REFERENCE_ANSWER
        else:
            derived[i], fates[i] = {**derived[i], "solutions": ["  "]}, drops.DROP_EMPTY_TURN
    published_fates = dict.fromkeys(range(published_n), drops.DROP_NO_REFERENCE_ANSWER)
    return [
        SampleShard(
            key,
            Path(key, "derived", "train-00000-of-00001.parquet"),
            derived,
            DEEPCODER_DERIVED_SCHEMA,
            fates,
            n - len(fates),
        ),
        SampleShard(
            key,
            Path(key, "primeintellect", "train-00000-of-00001.parquet"),
            published,
            DEEPCODER_SCHEMA,
            published_fates,
            0,
        ),
    ]


def _ultrachat(n: int, seed: int, registry: PromptRegistry) -> list[SampleShard]:
    key = "ultrachat_200k"

    def good(rng: random.Random) -> dict[str, Any]:
        s = _slots_for(rng)
        exchanges = rng.choices((1, 2, 3, 4), weights=(20, 35, 30, 15))[0]
        turns = _chat(rng, s, exchanges, _size(rng, 100, 900, 2200))
        if rng.random() < 0.06:  # `<think>` blocks: the last turn's becomes the analysis, earlier ones are dropped
            turns = [(role, _think(rng, s, text) if role == "assistant" else text) for role, text in turns]
        if rng.random() < 0.04:
            turns.insert(0, ("system", "You are a helpful, knowledgeable assistant."))
        prompt = next(text for role, text in turns if role == "user")
        return ultrachat_row(_content_sha(prompt), *turns)

    rows = [
        _distinct(registry, "chat", lambda a, i=i: good(_rng(seed, key, i, a)), lambda r: r["prompt"]) for i in range(n)
    ]
    hostile = _hostile(seed, key, n, ("ends_on_user", "system_inside", "blank_reply", "duplicate_id", "no_id"))
    fates = {}
    for i, kind in hostile.items():
        row = rows[i]
        if kind == "ends_on_user":
            row = {**row, "messages": [*row["messages"], {"content": "And what about today?", "role": "user"}]}
            fates[i] = drops.DROP_BAD_TURN_ORDER
        elif kind == "system_inside":
            note = {"content": "The conversation continues below.", "role": "system"}
            row = {**row, "messages": [*row["messages"][:-1], note, row["messages"][-1]]}
            fates[i] = drops.DROP_UNSUPPORTED_ROLE
        elif kind == "blank_reply":
            row = {**row, "messages": [*row["messages"][:-1], {"content": "", "role": "assistant"}]}
            fates[i] = drops.DROP_EMPTY_TURN
        elif kind == "duplicate_id":
            row = {**row, "prompt_id": rows[_earlier_good(i, hostile)]["prompt_id"]}
            fates[i] = drops.DROP_DUPLICATE_SYNTH_ID
        else:
            row = {**row, "prompt_id": None}
            fates[i] = drops.DROP_MISSING_SOURCE_ID
        rows[i] = row
    path = Path(key, "train_sft-00000-of-00001.parquet")
    return [SampleShard(key, path, rows, ULTRACHAT_SCHEMA, fates, n - len(fates))]


OASST_EPOCH = datetime(2023, 2, 5, 14, 0, tzinfo=UTC)


def _oasst_tree(rng: random.Random, s: dict[str, Any], root_text: str, kind: str | None) -> tuple[list[dict], dict]:
    """One message tree in pre-order (root first) and its rows' planted fates (local index -> reason).

    Shape: 1-3 ranked replies to the root; a reply may get a prompter follow-up with 1-2 ranked replies, the best
    of which may get another follow-up (answered or not). Planted faults (`kind`): the favourite reply deleted
    (with a follow-up under it, which becomes orphans), an extra reply that failed review, a blank extra reply, a
    tree not ready for export (root and one reply), a reply to a parent absent from the file."""
    tree_id = _uuid(rng)
    clock = [OASST_EPOCH + timedelta(minutes=rng.randint(0, 500000))]
    rows: list[dict] = []
    fates: dict[int, str] = {}
    state = "growing" if kind == "not_ready" else "ready_for_export"

    def add(parent: str | None, role: str, text: str, rank: int | None = None, **fields: Any) -> str:
        message_id = tree_id if parent is None else _uuid(rng)
        clock[0] += timedelta(
            minutes=rng.randint(3, 900), seconds=rng.randint(0, 59), microseconds=rng.randint(0, 999999)
        )
        row = oasst_row(message_id, parent, role, text, tree_id, rank=rank, tree_state=state, **fields)
        row.update(
            user_id=_uuid(rng), created_date=clock[0].isoformat(timespec="microseconds"), review_count=rng.randint(3, 5)
        )
        rows.append(row)
        return message_id

    def replies(parent: str, count: int, words: tuple[int, int], depth: int, favourite_subtree: bool) -> None:
        ranks = list(range(count)) if count > 1 else [None]
        rng.shuffle(ranks)
        for rank in ranks:
            best = rank in (0, None)
            deleted = kind == "deleted" and depth == 0 and rank == 0
            reply = add(parent, "assistant", _reply(rng, s, rng.randint(*words)), rank, deleted=deleted)
            if deleted:
                fates[len(rows) - 1] = drops.DROP_DELETED_MESSAGE
            if depth < 2 and rng.random() < (0.55 if best else 0.2) or (deleted and favourite_subtree):
                first_orphan = len(rows)
                follow = add(reply, "prompter", rng.choice(_BANKS["chat_followups"]).format(**s))
                if depth == 0 or rng.random() < 0.7:
                    replies(follow, rng.choice((1, 2)), (25, 160), depth + 1, False)
                if deleted:
                    fates.update(dict.fromkeys(range(first_orphan, len(rows)), drops.DROP_ORPHAN_MESSAGE))

    root = add(None, "prompter", root_text)
    if kind == "not_ready":
        add(root, "assistant", _reply(rng, s, rng.randint(30, 120)))
        return rows, dict.fromkeys(range(len(rows)), drops.DROP_TREE_NOT_READY)
    count = rng.choice((2, 3)) if kind == "deleted" else rng.choices((1, 2, 3), weights=(30, 40, 30))[0]
    replies(root, count, (40, 320), 0, True)
    if kind == "failed_review":
        add(root, "assistant", _reply(rng, s, rng.randint(20, 60)), review_result=False)
        fates[len(rows) - 1] = drops.DROP_FAILED_REVIEW
    elif kind == "blank_reply":
        add(root, "assistant", " ")
        fates[len(rows) - 1] = drops.DROP_EMPTY_TURN
    elif kind == "orphan":
        add(_uuid(rng), "assistant", _reply(rng, s, rng.randint(20, 60)))
        fates[len(rows) - 1] = drops.DROP_ORPHAN_MESSAGE
    return rows, fates


def _oasst1(n: int, seed: int, registry: PromptRegistry) -> list[SampleShard]:
    """`n` message trees, one conversation each except a tree not ready for export."""
    key = "oasst1"
    hostile = _hostile(
        seed, key, n, ("deleted", "failed_review", "not_ready", "blank_reply", "orphan"), share=HOSTILE_SHARE * 4
    )
    rows: list[dict] = []
    fates: dict[int, str] = {}
    for t in range(n):
        kind = hostile.get(t)

        def draw(attempt: int, t: int = t) -> tuple[random.Random, dict[str, Any], str]:
            rng = _rng(seed, key, t, attempt)
            s = _slots_for(rng)
            return rng, s, _opener(rng, s)

        rng, s, root_text = _distinct(registry, "chat", draw, lambda d: d[2])
        tree, tree_fates = _oasst_tree(rng, s, root_text, kind)
        fates.update({len(rows) + i: reason for i, reason in tree_fates.items()})
        rows += tree
    conversations = n - sum(kind == "not_ready" for kind in hostile.values())
    return [SampleShard(key, Path(key, "train-00000-of-00001.parquet"), rows, OASST_SCHEMA, fates, conversations)]


def _anthropic(n: int, seed: int, registry: PromptRegistry) -> list[SampleShard]:
    key = "anthropic_helpfulness"

    def good(rng: random.Random) -> tuple[dict[str, Any], str]:
        s = _slots_for(rng)
        exchanges = rng.choices((1, 2, 3), weights=(50, 35, 15))[0]
        turns = _chat(rng, s, exchanges, _size(rng, 40, 500, 1200))
        *history, (_, response) = turns
        first = history[0][1]
        if exchanges == 1 and rng.random() < 0.15:
            return {"prompt": first, "response": response}, first  # a plain prompt: one user turn
        if rng.random() < 0.8:
            history.insert(0, ("system", rng.choice(_BANKS["system_prompts"])))
        return {"prompt": chatml(*history), "response": response}, first

    rows = [
        _distinct(registry, "chat", lambda a, i=i: good(_rng(seed, key, i, a)), lambda d: d[1])[0] for i in range(n)
    ]
    hostile = _hostile(seed, key, n, ("no_response", "human_role", "duplicate"))
    fates = {}
    for i, kind in hostile.items():
        if kind == "no_response":
            rows[i], fates[i] = {**rows[i], "response": None}, drops.DROP_EMPTY_TURN
        elif kind == "human_role":  # the HH "Human:" convention leaking into ChatML
            prompt = rows[i]["prompt"]
            prompt = (
                prompt.replace("<|im_start|>user\n", "<|im_start|>human\n")
                if "<|im_start|>" in prompt
                else chatml(("human", prompt))
            )
            rows[i], fates[i] = {**rows[i], "prompt": prompt}, drops.DROP_UNSUPPORTED_ROLE
        else:
            rows[i], fates[i] = dict(rows[_earlier_good(i, hostile)]), drops.DROP_DUPLICATE_SYNTH_ID
    path = Path(key, "train-00000-of-00001.parquet")
    return [SampleShard(key, path, rows, HELPFULNESS_SCHEMA, fates, n - len(fates))]


BUILDERS: dict[str, Callable[[int, int, PromptRegistry], list[SampleShard]]] = {
    "nemotron_math_v2": _nemotron,
    "hendrycks_math": _hendrycks,
    "competition_math": _competition,
    "opencodeinstruct": _opencode,
    "deepcoder": _deepcoder,
    "ultrachat_200k": _ultrachat,
    "oasst1": _oasst1,
    "anthropic_helpfulness": _anthropic,
}


def sample_shards(rows: dict[str, int] | None = None, seed: int = DEFAULT_SEED) -> list[SampleShard]:
    """Every shard of the sample with its planted drops, in SOURCE_DATASETS order (nothing written)."""
    counts = {**DEFAULT_ROWS, **(rows or {})}
    unknown = sorted(set(counts) - set(SOURCE_DATASETS))
    if unknown:
        raise ValueError(f"unknown sources {unknown}; synthkd_contract/sources.py declares {sorted(SOURCE_DATASETS)}")
    if set(BUILDERS) != set(SOURCE_DATASETS):
        raise ValueError(f"no sample builder for {sorted(set(SOURCE_DATASETS) - set(BUILDERS))}")
    registry = PromptRegistry()
    shards: list[SampleShard] = []
    for source in SOURCE_DATASETS:
        if counts[source] > 0:
            shards += BUILDERS[source](counts[source], seed, registry)
    return shards


def write_source_sample(
    out_dir: Path, rows: dict[str, int] | None = None, seed: int = DEFAULT_SEED
) -> dict[str, list[Path]]:
    """Write the sample under `out_dir/<source key>/` (rows: source -> rows, DEFAULT_ROWS where not given; 0
    writes none of that source); returns source -> the paths written. Files already there with other names are
    left alone: regenerate into an empty directory."""
    written: dict[str, list[Path]] = {}
    for shard in sample_shards(rows, seed):
        written.setdefault(shard.source, []).append(shard.write(Path(out_dir)))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args(argv)
    for source, paths in write_source_sample(args.output_dir, seed=args.seed).items():
        for path in paths:
            print(f"{path}  {path.stat().st_size:,} bytes  ({SOURCE_CATEGORY[source]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
