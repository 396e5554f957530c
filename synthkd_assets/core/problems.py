"""A check's problems: the lines it lists (bounded, for the UI and the metadata) and how many it found in all."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence


def one_line(text: str) -> str:
    """`text` with every control character (a newline or tab in a file name, say) written as its escape: an error
    naming a file stays one line, whatever the name holds.

    Args:
        text: a message.

    Returns:
        The message with each Unicode Cc character replaced by its Python escape (`\\n`, `\\x07`).
    """
    return "".join(repr(c)[1:-1] if unicodedata.category(c) == "Cc" else c for c in text)


class Problems(list[str]):
    """Problem lines as listed, plus `unlisted`: problems found but not listed (a finder that stops listing at a
    bound keeps counting). `total` = listed + unlisted, so a check's `problem_count` is the real number; adding
    lines (append, extend, +=, +) keeps it right."""

    def __init__(self, listed: Iterable[str] = (), total: int | None = None) -> None:
        super().__init__(listed)
        self.unlisted = 0 if total is None else total - len(self)

    @property
    def total(self) -> int:
        return len(self) + self.unlisted

    def add(self, problem: str, limit: int | None = None) -> None:
        """List `problem`, or only count it once `limit` lines are listed."""
        if limit is None or len(self) < limit:
            self.append(problem)
        else:
            self.unlisted += 1

    def merge(self, other: Sequence[str]) -> None:
        """Take in another finder's problems: its lines and its unlisted count."""
        self.extend(other)
        self.unlisted += other.unlisted if isinstance(other, Problems) else 0

    def __iadd__(self, other: Iterable[str]) -> Problems:
        self.merge(list(other) if not isinstance(other, Sequence) else other)
        return self

    def __add__(self, other: Sequence[str]) -> Problems:  # type: ignore[override]
        merged = Problems(self, self.total)
        merged.merge(other)
        return merged


def problem_total(problems: Sequence[str]) -> int:
    """How many problems `problems` stands for: its `total` when it is a Problems, else its length."""
    return problems.total if isinstance(problems, Problems) else len(problems)
