"""A check's problems: the lines it lists (bounded, for the UI and the metadata) and how many it found in all."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class Problems(list[str]):
    """Problem lines as listed, plus `total`: how many problems were found, listed or not. A finder that stops
    listing at a bound keeps counting, so a check's `problem_count` is the real number."""

    def __init__(self, listed: Iterable[str] = (), total: int | None = None) -> None:
        super().__init__(listed)
        self.total = len(self) if total is None else total

    def add(self, problem: str, limit: int | None = None) -> None:
        """Count `problem`; list it unless `limit` lines are listed already."""
        self.total += 1
        if limit is None or len(self) < limit:
            self.append(problem)

    def merge(self, other: Sequence[str]) -> None:
        """Take in another finder's problems: its lines and its total."""
        self.extend(other)
        self.total += problem_total(other)


def problem_total(problems: Sequence[str]) -> int:
    """How many problems `problems` stands for: its `total` when it is a Problems, else its length."""
    return problems.total if isinstance(problems, Problems) else len(problems)
